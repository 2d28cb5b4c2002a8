"""gin_registry: every public configuration class and function of lopt, tasks and outer_trainers is bound in
gin (under its own name and package.name); what is skipped is a state container or a module; load_config."""
from __future__ import annotations

import dataclasses
import inspect
import types

import gin
import jax.numpy as jnp
import numpy as np
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


def test_gin_file_with_a_clipped_outer_optimizer_clips_numerically(tmp_path):
    """gin cannot bind optax.chain's varargs; `chained` takes the list. Parsed from a gin file, the
    outer optimizer clips the global norm before SGD: g = (3, 4) (norm 5) clipped to norm 1 is
    (0.6, 0.8), and SGD at 0.5 steps by −(0.3, 0.4); a gradient inside the norm is left alone."""
    cfg = tmp_path / "outer.gin"
    cfg.write_text("gin_registry_probe.x = @chained()\n"
                   "chained.transforms = [@optax.clip_by_global_norm(), @optax.sgd()]\n"
                   "optax.clip_by_global_norm.max_norm = 1.0\n"
                   "optax.sgd.learning_rate = 0.5\n")
    try:
        gin_registry.load_config([str(cfg)], [])
        tx = probe()
    finally:
        gin.clear_config()
    params = {"a": jnp.zeros(1), "b": jnp.zeros(1)}
    state = tx.init(params)
    updates, state = tx.update({"a": jnp.asarray([3.0]), "b": jnp.asarray([4.0])}, state, params)
    np.testing.assert_allclose([updates["a"][0], updates["b"][0]], [-0.3, -0.4], rtol=1e-6)
    updates, _ = tx.update({"a": jnp.asarray([0.3]), "b": jnp.asarray([0.4])}, state, params)
    np.testing.assert_allclose([updates["a"][0], updates["b"][0]], [-0.15, -0.2], rtol=1e-6)


def test_chained_refuses_what_is_not_a_list_of_transforms():
    with pytest.raises(ValueError, match="empty list"):
        ot.chained([])
    with pytest.raises(TypeError, match=r"transforms\[1\] is a function.*@optax.adam\(\)"):
        ot.chained([optax.clip_by_global_norm(1.0), optax.adam])
    with pytest.raises(TypeError, match="single transform"):
        ot.chained(optax.adam(1e-3))


def test_gin_scoped_estimators_on_several_families():
    """A mix of families in gin: one `estimator_on_family` per scope, each on its own family with
    the run's learned optimizer, truncation schedule, meta-loss split and end power (nothing is compiled)."""
    gin.clear_config()
    try:
        gin.parse_config([
            "gin_registry_probe.x = [@a/estimator_on_family, @b/estimator_on_family]",
            "estimator_on_family.estimator = @TruncatedPES",
            "TruncatedPES.num_tasks = 2", "TruncatedPES.trunc_length = 5",
            "a/estimator_on_family.task_family = @a/QuadraticFamily()", "a/QuadraticFamily.dim = 3",
            "b/estimator_on_family.task_family = @b/QuadraticFamily()", "b/QuadraticFamily.dim = 7",
        ])
        makers = probe()
        base = ot.LOptTruncatedStep(tasks.QuadraticFamily(dim=5), lopt.LearnableSGD(), ot.ConstantTruncationSchedule(10),
                                    meta_loss_end_power=3)
        ests = [make(base) for make in makers]
    finally:
        gin.clear_config()
    assert [e.truncated_step.task_family.dim for e in ests] == [3, 7]
    for e in ests:
        assert isinstance(e, ot.TruncatedPES) and e.num_tasks == 2 and e.trunc_length == 5
        assert e.truncated_step.learned_opt is base.learned_opt and e.truncated_step.trunc_sched is base.trunc_sched
        assert e.truncated_step.meta_loss_split is None  # the run's
        assert e.truncated_step.meta_loss_end_power == 3.0  # the run's
    with pytest.raises(TypeError, match="task_family must be a tasks.TaskFamily"):
        ot.estimator_on_family(base, task_family="digits", estimator=ot.TruncatedPES)
    # an estimator's own meta-loss split reaches its truncated step (a family without data refuses one)
    with pytest.raises(ValueError, match="meta_loss_split='outer_valid' needs a task family with data"):
        ot.estimator_on_family(base, task_family=tasks.QuadraticFamily(dim=3), estimator=ot.TruncatedPES,
                               meta_loss_split="outer_valid")


def test_a_renamed_train_binding_is_refused_naming_its_new_name():
    from outer_trainers.gin_registry import RENAMED_BINDINGS, check_renamed_bindings, renamed_bindings
    text = ("train.num_steps = 5\ntrain.log_every = 10\n  train.eval_num_tasks = 2\n"
            "# train.progress = 'log' (a comment)\nouter_trainers.learner.gin_run.train.keep_checkpoints = 4\n")
    assert renamed_bindings(text) == ["train.log_every is now Reporting.log_every",
                                      "train.eval_num_tasks is now Comparison.num_tasks",
                                      "train.keep_checkpoints is now CheckpointPolicy.keep"]
    with pytest.raises(ValueError, match=r"old.gin binds .*train.log_every is now Reporting.log_every"):
        check_renamed_bindings(text, "old.gin")
    check_renamed_bindings("train.num_steps = 5\nReporting.log_every = 10\n")  # the new names pass
    # every new name is a field of its settings group
    groups = dict(gin_registry.GROUP_CLASSES, CheckpointPolicy=ot.CheckpointPolicy)
    for new in RENAMED_BINDINGS.values():
        group, _, field = new.split(" ")[0].partition(".")
        if group in groups:
            assert field in {f.name for f in dataclasses.fields(groups[group])}, new
