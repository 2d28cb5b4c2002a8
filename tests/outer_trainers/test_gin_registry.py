"""gin_registry: every public configuration class and function of lopt, tasks and outer_trainers is bound in
gin (under its own name and package.name); what is skipped is a state container or a module; load_config."""
from __future__ import annotations

import dataclasses
import inspect
import types

import gin
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers import gin_registry


@gin.configurable("gin_registry_probe")
def probe(x=None):
    """Returns its gin-bound argument."""
    return x


def _public(package):
    return [(package.__name__, name, getattr(package, name)) for name in package.__all__]


PUBLIC = [entry for package in (lopt, tasks, ot) for entry in _public(package)]


def _evaluate(value: str, *bindings: str):
    """`value` (gin syntax, with `bindings` parsed first) as gin evaluates it when passed to a configurable."""
    gin.clear_config()
    try:
        gin.parse_config([*bindings, f"gin_registry_probe.x = {value}"])
        return probe()
    finally:
        gin.clear_config()


def _bound_to(reference: str):
    """The object a gin reference such as `@outer_trainers.TruncatedPES` is registered for, or None."""
    gin.clear_config()
    try:
        gin.parse_config(f"gin_registry_probe.x = {reference}")
        return gin.query_parameter("gin_registry_probe.x").configurable.wrapped
    except ValueError:
        return None
    finally:
        gin.clear_config()


def _is_state(obj) -> bool:
    """A pytree that carries values, written here independently of gin_registry's rule."""
    flax_struct = dataclasses.is_dataclass(obj) and vars(obj).get("_flax_dataclass", False)
    named_tuple = issubclass(obj, tuple) and hasattr(obj, "_fields")
    return bool(flax_struct or named_tuple)


@pytest.mark.parametrize("package,name,obj", PUBLIC, ids=[f"{p}.{n}" for p, n, _ in PUBLIC])
def test_public_name_is_bound_or_is_a_state_container(package, name, obj):
    if isinstance(obj, types.ModuleType):
        assert _bound_to(f"@{package}.{name}") is None
    elif inspect.isclass(obj) and _is_state(obj):
        assert _bound_to(f"@{package}.{name}") is None, f"state container {name} is registered with gin"
    else:  # configuration classes and functions
        assert inspect.isclass(obj) or inspect.isfunction(obj), f"{package}.{name} is neither: cannot register it"
        assert _bound_to(f"@{package}.{name}") is obj
        assert _bound_to(f"@{name}") is obj


def test_the_rule_registers_frozen_dataclass_configs_and_skips_states():
    for config in (ot.NeverEndingTruncationSchedule, ot.ConstantTruncationSchedule, ot.CheckpointPolicy):
        assert gin_registry.is_configurable(config)
    for state in (ot.LearnerState, ot.StepOut, ot.TruncationState, lopt.MLPLOptState, ot.TrainResult):
        assert gin_registry.is_state_container(state) and not gin_registry.is_configurable(state)


def test_configured_objects_evaluate_to_the_right_instances():
    assert isinstance(_evaluate("@NeverEndingTruncationSchedule()"), ot.NeverEndingTruncationSchedule)
    constant = _evaluate("@outer_trainers.ConstantTruncationSchedule()",
                         "outer_trainers.ConstantTruncationSchedule.length = 7")
    assert isinstance(constant, ot.ConstantTruncationSchedule) and constant.length == 7
    assert isinstance(_evaluate("@QuadraticFamily()"), tasks.QuadraticFamily)
    assert isinstance(_evaluate("@lopt.MLPLOpt()"), lopt.MLPLOpt)
    assert isinstance(_evaluate("@optax.adam()", "optax.adam.learning_rate = 0.1"), optax.GradientTransformation)


@pytest.mark.parametrize("name", [n for n in gin_registry.OPTAX_NAMES if hasattr(optax, n)])
def test_optax_names_are_bound(name):
    assert _bound_to(f"@optax.{name}") is getattr(optax, name)


def test_load_config_parses_and_reports_errors(tmp_path, capsys):
    cfg = tmp_path / "ok.gin"
    cfg.write_text("gin_registry_probe.x = 3\n")
    bad = tmp_path / "bad.gin"
    bad.write_text("gin_registry_probe.x = = 3\n")
    try:
        gin_registry.load_config([str(cfg)], ["gin_registry_probe.x = 4"])
        assert probe() == 4  # bindings after files
        gin.clear_config()
        with pytest.raises(SystemExit, match="nope.gin"):
            gin_registry.load_config([str(tmp_path / "nope.gin")], [])
        for files, param, blamed in [([cfg, bad], "gin_registry_probe.x = 4", "in " + str(bad)),
                                     ([cfg], "gin_registry_probe.y = 1", "--gin_param 'gin_registry_probe.y = 1'"),
                                     ([cfg], "gin_registry_probe.x = = 1", "--gin_param 'gin_registry_probe.x = = 1'")]:
            gin.clear_config()
            capsys.readouterr()
            with pytest.raises(SystemExit) as exit_info:
                gin_registry.load_config([str(f) for f in files], [param])
            assert exit_info.value.code == 2
            err = capsys.readouterr().err
            assert blamed in err, err  # the failing file, or the failing --gin_param quoted
            if "--gin_param" in blamed:
                assert "ok.gin" not in err  # a bad binding is not blamed on a good file
    finally:
        gin.clear_config()
