"""LearnedOptimizer's configs from declared fields: config(), equality and hashing by value, one jit
compilation per value, conversions, errors, save/load round trips, and the plain-class path."""
from __future__ import annotations

import dataclasses
import json
import pickle
from typing import Optional

import chex
import jax
import jax.numpy as jnp
import pytest

import lopt
from lopt.base import LearnedOptimizer, added_option, speed_option

# every architecture with a non-default value for each of its config fields
CHANGED = {
    "MLPLOpt": dict(hidden_size=8, hidden_layers=1, decays=(0.5, 0.9), rms_decay=0.99, step_mult=1e-2,
                    exp_mult=1e-2, timescales=(1.0, 10.0), use_num_steps=True),
    "NormMLPLOpt": dict(hidden_size=8, hidden_layers=2, decays=(0.9,), rms_decay=0.99, base_lr=1e-2,
                        log_lr_range=2.0, clip_value=3.0, residual_init=0.5, lr_hidden_size=8, timescales=(1.0,),
                        use_num_steps=False, orthogonalize=True, vector_rule="adam", normalize_update=False,
                        residual_bound=1.0, schedule="cosine", relative_step=True, relative_floor=1e-2,
                        fan_in_ref=16.0, overshoot_gain=0.2, overshoot_threshold=0.3),
    "Celo2LOpt": dict(hidden_size=4, hidden_layers=1, decays=(0.9,), rms_decay=0.99, matrix_lr=0.05, adam_lr=1e-2,
                      log_lr_range=2.0, residual_init=0.5, weight_decay=1e-4, lr_hidden_size=8, timescales=(1.0,),
                      use_num_steps=False, overshoot_gain=0.2, overshoot_threshold=0.3, schedule="cosine",
                      horizon_reference=1000, horizon_power=0.7, residual_horizon_power=1.5,
                      depth_reference=4, depth_power=0.5, conv_step_scale=1.5, wd_rate=0.1, wd_learned=True, wd_log_range=2.0,
                      wd_roles=("matrix", "vector"), wd_loss_power=0.25, wd_loss_max=5.0,
                      wd_loss_free=3.0, wd_conv_loss_free=8.0, residual_no_growth=True, residual_growth_free=2.0),
    "RNNMLPLOpt": dict(lstm_hidden=8, mlp_hidden=4, mlp_layers=1, decays=(0.9,), rms_decay=0.99, step_mult=1e-2,
                       exp_mult=1e-2, timescales=(1.0, 10.0)),
    "AdafacMLPLOpt": dict(hidden_size=2, hidden_layers=1, momentum_decays=(0.9,), rms_decay=0.99,
                          adafactor_decays=(0.9, 0.99), step_mult=1e-2, exp_mult=1e-2, timescales=(1.0,),
                          use_num_steps=True),
    "HyperLOpt": dict(lstm_hidden=8, mlp_hidden=2, mlp_layers=2, momentum_decays=(0.9,), rms_decay=0.99,
                      adafactor_decays=(0.9,), gen_scale=0.5, step_mult=1e-2, exp_mult=1e-2, timescales=(1.0,)),
    "NNAdam": dict(lstm_hidden=8, learning_rate=1e-2, b1=0.8, b2=0.99, eps=1e-6, output_scale=0.1,
                   timescales=(1.0,)),
    "LearnableSGD": dict(learning_rate=0.1),
    "LearnableSGDM": dict(learning_rate=0.1, momentum=0.5),
    "LearnableAdam": dict(learning_rate=1e-2, b1=0.8, b2=0.99, eps=1e-6),
}


def test_the_table_covers_every_field_of_every_shipped_architecture():
    for name, changed in CHANGED.items():
        fields = {f.name for f in dataclasses.fields(lopt.architecture(name)) if f.compare}
        assert set(changed) == fields, name


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_config_round_trips_and_equal_configs_are_equal_with_equal_hashes(name):
    cls = lopt.architecture(name)
    lo = cls(**CHANGED[name])
    config = lo.config()
    assert json.loads(json.dumps(config)) == config  # JSON-able as it is: tuples are lists
    again = cls(**json.loads(json.dumps(config)))
    assert again == lo and hash(again) == hash(lo) and again.config() == config
    assert pickle.loads(pickle.dumps(lo)) == lo
    for key, value in CHANGED[name].items():
        got = getattr(lo, key)
        assert got == value and type(got) is type(value), (key, got)  # converted to the declared type


# fields that are only allowed together with another one
REQUIRES = {("NormMLPLOpt", "fan_in_ref"): {"relative_step": True}, ("Celo2LOpt", "wd_learned"): {"wd_rate": 0.1},
            ("Celo2LOpt", "wd_loss_power"): {"wd_rate": 0.1},
            ("Celo2LOpt", "wd_conv_loss_free"): {"wd_rate": 0.1, "wd_loss_power": 1.0},
            ("Celo2LOpt", "residual_growth_free"): {"residual_no_growth": True}}


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_save_and_load_round_trip_the_architecture_config_and_theta(name, tmp_path):
    lo = lopt.architecture(name)(**CHANGED[name])
    theta = jax.tree_util.tree_map(lambda x: x + 0.25, lo.init(jax.random.key(1)))
    path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(path, lo, theta)
    loaded, got = lopt.load_learned_optimizer(path)
    assert loaded == lo and loaded.config() == lo.config()
    chex.assert_trees_all_equal(got, theta)
    chex.assert_trees_all_equal(lopt.load_theta(path, lo), theta)


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_each_field_changes_equality(name):
    cls = lopt.architecture(name)
    for key, value in CHANGED[name].items():
        base = REQUIRES.get((name, key), {})
        default, other = cls(**base), cls(**base, **{key: value})
        assert other != default, key
        assert other.config()[key] != default.config().get(key), key


def test_equal_optimizers_share_one_jit_compilation_and_different_ones_do_not():
    traces = []

    def update(lo, theta, g, p):
        traces.append(lo)
        tx = lo.opt_fn(theta)
        return tx.update(g, tx.init(p), p)[0]

    step = jax.jit(update, static_argnums=0)
    params = {"w": jnp.ones((3, 2))}
    grads = {"w": jnp.full((3, 2), 0.5)}
    a, b = lopt.MLPLOpt(hidden_size=4, decays=[0.5, 0.9]), lopt.MLPLOpt(hidden_size=4.0, decays=(0.5, 0.9))
    assert a is not b and a == b and hash(a) == hash(b)
    theta = a.init(jax.random.key(0))
    first = step(a, theta, grads, params)
    second = step(b, theta, grads, params)
    assert len(traces) == 1
    assert bool(jnp.all(first["w"] == second["w"]))
    step(lopt.MLPLOpt(hidden_size=4, decays=[0.5, 0.9], rms_decay=0.9), theta, grads, params)
    assert len(traces) == 2


def test_speed_options_are_not_in_config_nor_compared():
    chunked, whole = lopt.MLPLOpt(chunk_size=64, column_min_size=10), lopt.MLPLOpt()
    assert chunked == whole and hash(chunked) == hash(whole)
    assert "chunk_size" not in chunked.config() and "column_min_size" not in chunked.config()
    assert (chunked.chunk_size, chunked.column_min_size) == (64, 10)


def test_optimizers_are_immutable():
    lo = lopt.MLPLOpt()
    with pytest.raises(dataclasses.FrozenInstanceError):
        lo.hidden_size = 8


def test_signatures_keep_the_constructor_arguments_in_order():
    lo = lopt.MLPLOpt(8, 1, [0.9])
    assert (lo.hidden_size, lo.hidden_layers, lo.decays) == (8, 1, (0.9,))
    assert lopt.LearnableAdam(1e-2, 0.8).b1 == 0.8


@pytest.mark.parametrize("make, message", [
    (lambda: lopt.MLPLOpt(hidden_layers=0), "MLPLOpt needs hidden_layers >= 1 and hidden_size >= 1, got 0, 32"),
    (lambda: lopt.MLPLOpt(chunk_size=0), "MLPLOpt needs chunk_size >= 1"),
    (lambda: lopt.NormMLPLOpt(decays=()), "NormMLPLOpt needs at least one momentum decay"),
    (lambda: lopt.NormMLPLOpt(rms_decay=1.0), r"decays and rms_decay must lie in \[0, 1\)"),
    (lambda: lopt.NormMLPLOpt(vector_rule="sgd"), "unknown vector_rule 'sgd'"),
    (lambda: lopt.NormMLPLOpt(schedule="linear"), "unknown schedule 'linear'"),
    (lambda: lopt.NormMLPLOpt(fan_in_ref=8.0), "fan_in_ref scales the relative step"),
    (lambda: lopt.Celo2LOpt(hidden_layers=0), "Celo2LOpt needs hidden_layers, hidden_size, lr_hidden_size >= 1"),
    (lambda: lopt.Celo2LOpt(decays=()), r"Celo2LOpt needs decays and rms_decay in \[0, 1\)"),
    (lambda: lopt.Celo2LOpt(matrix_lr=0.0), "matrix_lr, adam_lr and log_lr_range must be > 0"),
    (lambda: lopt.Celo2LOpt(weight_decay=-1.0), "weight_decay must be >= 0"),
    (lambda: lopt.Celo2LOpt(schedule="linear"), "unknown schedule 'linear'"),
    (lambda: lopt.RNNMLPLOpt(mlp_layers=0), "RNNMLPLOpt needs positive sizes"),
    (lambda: lopt.AdafacMLPLOpt(momentum_decays=[]), "AdafacMLPLOpt needs hidden_layers"),
    (lambda: lopt.HyperLOpt(lstm_hidden=0), "HyperLOpt needs positive sizes"),
])
def test_bad_hyper_parameters_are_refused_with_the_same_messages(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_or_unconvertible_arguments_are_type_errors():
    with pytest.raises(TypeError, match="unexpected keyword argument 'hidden'"):
        lopt.MLPLOpt(hidden=3)
    with pytest.raises(TypeError):
        lopt.MLPLOpt(decays=None)


def test_added_option_is_in_config_only_when_set():
    kw = dict(relative_step=True)
    assert "fan_in_ref" not in lopt.NormMLPLOpt(**kw).config()
    set_ = lopt.NormMLPLOpt(fan_in_ref=16, **kw)
    assert set_.config()["fan_in_ref"] == 16.0 and set_ != lopt.NormMLPLOpt(**kw)
    assert lopt.NormMLPLOpt(**set_.config()) == set_


class _Toy(LearnedOptimizer):
    """A declared-fields architecture defined here, with every kind of field."""
    width: int = 2
    scales: tuple[float, ...] = (1.0,)
    mode: str = "a"
    cap: Optional[int] = None
    fast: bool = speed_option(False)
    extra: float = added_option(0.0)

    def check_config(self):
        if self.width < 1:
            raise ValueError(f"_Toy needs width >= 1, got {self.width}")

    def init(self, key):
        del key
        return {"w": jnp.zeros((self.width,), jnp.float32)}


def test_fields_of_every_kind_convert_and_round_trip(tmp_path):
    toy = _Toy(width=3.0, scales=[2, 3], cap=4.0, fast=1, extra=0.5)
    assert (toy.width, toy.scales, toy.cap, toy.fast, toy.extra) == (3, (2.0, 3.0), 4, True, 0.5)
    assert toy.config() == {"width": 3, "scales": [2.0, 3.0], "mode": "a", "cap": 4, "extra": 0.5}
    assert repr(toy) == "_Toy(width=3, scales=[2.0, 3.0], mode='a', cap=4, extra=0.5)"
    path = str(tmp_path / "toy.msgpack")
    lopt.save_theta(path, toy, toy.init(None))
    loaded, theta = lopt.load_learned_optimizer(path)
    assert loaded == toy and type(loaded) is _Toy and theta["w"].shape == (3,)
    with pytest.raises(ValueError, match="_Toy needs width >= 1, got 0"):
        _Toy(width=0)


def test_an_unhashable_field_value_is_refused():
    class Listy(LearnedOptimizer):
        values: list = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"values=\[1\] is not hashable"):
        Listy([1])


def test_a_subclass_with_its_own_init_stays_a_plain_class_compared_by_config():
    class Plain(LearnedOptimizer):
        def __init__(self, lr: float = 0.1):
            self.lr = float(lr)

        def config(self):
            return {"lr": self.lr}

    a, b = Plain(0.1), Plain(0.1)
    assert a == b and hash(a) == hash(b) and a != Plain(0.2)
    assert not dataclasses.is_dataclass(Plain) and repr(Plain()) == "Plain(lr=0.1)"
    a.lr = 0.3  # its own attributes: not a frozen dataclass
    assert a.config() == {"lr": 0.3}


def test_different_architectures_are_never_equal():
    assert lopt.LearnableSGD(0.1) != lopt.LearnableSGDM(0.1)
    assert lopt.LearnableSGD() != object()


def test_gin_wrappers_do_not_replace_the_registered_architecture():
    import outer_trainers.gin_registry  # noqa: F401  (registers every lopt class with gin)

    for name in CHANGED:
        cls = lopt.architecture(name)
        assert cls is getattr(lopt, name) and cls.__module__.startswith("lopt.")
