"""optax's own parametrised test classes, run over lopt's shipped optimizers and every architecture.

The classes come from the installed optax, which ships its tests in the wheel:
`optax/contrib/_common_test.py` (ContribTest), `optax/_src/alias_test.py` (AliasTest) and
`optax/_src/sharding_test.py` (ShardingTest). Each test method is absl-parameterized over optax's
own optimizer list; here the undecorated method (`__wrapped__` of any generated case) is called
with lopt's optimizers instead: ContribTest and AliasTest look optimizers up by name through
module functions (`_get_opt_factory`, `_get_opt`), which are patched to know lopt's names as well;
ShardingTest takes the optimizer object itself. Nothing of optax's code is copied.

Optimizers: one shipped name per distinct theta file (`lopt.pretrained.RECOMMENDED` for its own theta;
names that share a theta differ only in deploy rules, tested in tests/lopt/rules and test_pretrained.py) as
`lopt.pretrained.load(name, num_steps=N)`, and every architecture lopt defines
(`tests.fixtures.builtin_architectures()`) at its default config with a fresh theta. Their factory takes
`num_steps`, which the inject_hyperparams tests inject (so it is traced).

Which optimizer meets which method (each case compiles a learned update): in the fast tier every
optimizer runs the extra-args contract (with its no-recompilation check) and abstract init; the
recommended shipped optimizers (`lopt.pretrained.RECOMMENDED` and the cheap-on-CPU normmlp_v3) also run
inject_hyperparams (num_steps injected, so traced), dtype preservation, MultiSteps and dtype stability
for float16 and float64. The slow tier (`python -m pytest -m "slow and not multidevice"
tests/lopt/test_optax_conformance.py`) runs the listed methods on every optimizer, every dtype.
ShardingTest's mesh cases need several devices:
`XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m pytest -m multidevice`.

Inapplicable (not run; the reason each):
"""
from __future__ import annotations

import functools
import os
import unittest

import jax
import jax.numpy as jnp
import pytest

import lopt
import lopt.pretrained
from tests.fixtures import builtin_architectures

from optax.contrib import _common_test as common_test  # noqa: E402
from optax._src import alias_test  # noqa: E402

_FLAGS = os.environ.get("XLA_FLAGS")
from optax._src import sharding_test  # noqa: E402  (it sets XLA_FLAGS at import; restored below)
if _FLAGS is None:
    os.environ.pop("XLA_FLAGS", None)
else:
    os.environ["XLA_FLAGS"] = _FLAGS

NUM_STEPS = 10


def _one_name_per_theta() -> tuple:
    """One shipped name per distinct theta file: RECOMMENDED for its own, else the latest name holding it.
    Names that share a theta differ only in deploy rules, which tests/lopt/rules and test_pretrained check."""
    by_theta = {}
    for n in lopt.pretrained.names():
        by_theta.setdefault(lopt.pretrained.info(n)["theta_sha256"], []).append(n)
    return tuple(sorted(lopt.pretrained.RECOMMENDED if lopt.pretrained.RECOMMENDED in ns else max(ns)
                        for ns in by_theta.values()))


SHIPPED = _one_name_per_theta()
ARCHITECTURES = tuple(builtin_architectures())
ALL = tuple(f"pretrained:{n}" for n in SHIPPED) + tuple(f"arch:{a}" for a in ARCHITECTURES)
RECOMMENDED = (f"pretrained:{lopt.pretrained.RECOMMENDED}", "pretrained:normmlp_v3")

INAPPLICABLE = {
    ("ContribTest", "test_optimizers"): "fixed-budget convergence on toy functions (30k steps of a parabola / "
    "Rosenbrock to 3e-2): a learned optimizer's travel is bounded by its schedule over num_steps; its no-op "
    "map_params subtest is covered by test_map_params_specs here",
    ("AliasTest", "test_optimization"): "fixed-budget convergence (10k steps, as above) and complex targets "
    "(lopt refuses complex parameters, see below)",
    ("AliasTest", "test_explicit_dtype"): "parametrised over sgd/adam/adamw's mu_dtype argument only",
    ("AliasTest", "complex64/complex128 dtypes"): "learned optimizers refuse complex parameters with a TypeError "
    "naming the leaf (wrap in optax.contrib.split_real_and_imaginary), as optax's own fromage, lion, sm3, "
    "... skip them; test_complex_refused_or_split checks both",
    ("ContribTest", "test_optimizers_accept_learning_rate_schedule_if_type_annotated_as_such"): "no learning_rate "
    "argument: the step size is learned (optax's test skips itself for such factories)",
    ("ShardingTest", "test_microbatch_with_explicit_sharding"): "tests optax.microbatching, no optimizer",
    ("ContribTest/AliasTest", "architectures that need loss="): "optax's tests pass a loss value only to the "
    "optimizers they name (momo, polyak_sgd); an architecture whose update requires loss= (NEEDS_LOSS) is "
    "run by the ShardingTest abstract-init case only",
}
NEEDS_LOSS = {"arch:Celo", "arch:CeloAdam"}
__doc__ += "".join(f"\n    {cls}.{method}: {why}" for (cls, method), why in INAPPLICABLE.items()) + "\n"


@functools.cache
def _learned(arch: str):
    lo = lopt.architecture(arch)()
    return lo, lo.init(jax.random.key(0))


def factory(name: str):
    """The optimizer factory optax's tests call as `factory(**opt_kwargs)`."""
    kind, _, short = name.partition(":")

    def make(num_steps=NUM_STEPS):
        if kind == "pretrained":
            return lopt.pretrained.load(short, num_steps=num_steps)
        lo, theta = _learned(short)
        return lo.opt_fn(theta, num_steps=num_steps)

    make.__name__ = short
    return make


@pytest.fixture
def known_to_optax_tests(monkeypatch, request):
    """optax's ContribTest and AliasTest look optimizers up by name: teach them lopt's names."""
    if request.node.callspec.params.get("name") in NEEDS_LOSS:
        pytest.skip("its update requires loss=, which optax's tests do not pass (INAPPLICABLE)")
    by_contrib, by_alias = common_test._get_opt_factory, alias_test._get_opt
    monkeypatch.setattr(common_test, "_get_opt_factory", lambda n: factory(n) if n in ALL else by_contrib(n))
    monkeypatch.setattr(alias_test, "_get_opt", lambda self, n: factory(n) if n in ALL else by_alias(self, n))


def run_optax_test(cls: type, method: str, **params) -> None:
    """Calls optax's undecorated test `cls.method` with `params` in place of its own parameters."""
    generated = [k for k, v in vars(cls).items() if getattr(getattr(v, "__wrapped__", None), "__name__", None) == method]
    assert generated, f"the installed optax has no parametrised {cls.__name__}.{method}"
    case = cls(methodName=generated[0])
    try:
        getattr(cls, generated[0]).__wrapped__(case, **params)
    except unittest.SkipTest as e:
        pytest.skip(f"optax's {cls.__name__}.{method} skipped itself: {e}")


CONTRIB = [  # (method, parameters); the first runs on every optimizer, the rest on the recommended ones
    ("test_optimizers_accept_extra_args", dict(wrap=False)),
    ("test_optimizers_can_be_wrapped_in_inject_hyperparams", {}),
    ("test_preserve_dtype", dict(dtype="bfloat16")),
    ("test_gradient_accumulation", dict(dtype="float32")),
    ("test_state_shape_dtype_shard_stability", dict(dtype=jnp.float16)),
    ("test_state_shape_dtype_shard_stability", dict(dtype=jnp.float64)),
]
CONTRIB_SLOW = [
    ("test_preserve_dtype", dict(dtype="float32")),
    ("test_gradient_accumulation", dict(dtype="bfloat16")),
    ("test_state_shape_dtype_shard_stability", dict(dtype=jnp.bfloat16)),
    ("test_state_shape_dtype_shard_stability", dict(dtype=jnp.float32)),
]
ALIAS = [("test_preserve_dtype", dict(dtype="bfloat16"))]  # on the recommended optimizers
ALIAS_SLOW = [
    ("test_optimizers_accept_extra_args", {}),
    ("test_optimizers_can_be_wrapped_in_inject_hyperparams", {}),
    ("test_preserve_dtype", dict(dtype="float32")),
    ("test_gradient_accumulation", dict(dtype="float32")),
    ("test_state_shape_dtype_shard_stability", dict(dtype=jnp.float32)),
    ("test_state_shape_dtype_shard_stability", dict(dtype=jnp.float64)),
]


def _cases(fast_every, fast_recommended, slow):
    """pytest params (name, (method, parameters)): `fast_every` on every optimizer, `fast_recommended`
    on the recommended ones, the rest of the product marked slow."""
    out = []
    for n in ALL:
        for m in fast_every + fast_recommended + slow:
            fast = m in fast_every or (n in RECOMMENDED and m in fast_recommended)
            dtype = m[1].get("dtype", "")
            out.append(pytest.param(n, m, id=f"{n}-{m[0]}-{getattr(dtype, '__name__', dtype)}",
                                    marks=() if fast else (pytest.mark.slow,)))
    return out


@pytest.mark.parametrize("name,method", _cases(CONTRIB[:1], CONTRIB[1:], CONTRIB_SLOW))
def test_contrib_suite(known_to_optax_tests, name, method):
    test_name, params = method
    run_optax_test(common_test.ContribTest, test_name, opt_name=name, opt_kwargs={"num_steps": NUM_STEPS},
                   wrapper_name=None, wrapper_kwargs=None, **params)


@pytest.mark.parametrize("name,method", _cases([], ALIAS, ALIAS_SLOW))
def test_alias_suite(known_to_optax_tests, name, method):
    test_name, params = method
    run_optax_test(alias_test.AliasTest, test_name, opt_name=name, opt_kwargs={"num_steps": NUM_STEPS}, **params)


@pytest.mark.parametrize("name", ALL)
def test_sharding_suite_abstract_init(name):
    run_optax_test(sharding_test.ShardingTest, "test_init_with_abstract_input", optimizer=factory(name)())


def _version_gate_passes() -> bool:
    """optax 0.2.8's ShardingTest skips itself when `jax.__version__ < '0.7.2'` compares as strings,
    which holds for jax 0.10 ('1' < '7')."""
    return not jax.__version__ < "0.7.2"


@pytest.mark.multidevice
@pytest.mark.parametrize("method", ["test_state_sharding_type_init_match_update",
                                    "test_state_sharding_type_preserved_with_jit"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in RECOMMENDED else (pytest.mark.slow,))
                                  for n in RECOMMENDED + tuple(f"pretrained:{n}" for n in SHIPPED
                                                               if f"pretrained:{n}" not in RECOMMENDED)])
def test_sharding_suite_explicit_mesh(monkeypatch, name, method):
    """ShardingTest's mesh cases, on the 4 simulated devices of the multidevice run (their (8,) mesh
    becomes (4,); the sharded axis, 8, divides by both) or on 8.
    Their version gate compares version strings; where it misreads the installed jax as older
    than 0.7.2, jax.__version__ is shown to them as "0.7.2" for the call."""
    if jax.device_count() not in (4, 8):
        pytest.skip(f"optax's ShardingTest shards an axis of 8 over its mesh: needs 4 or 8 devices, "
                    f"{jax.device_count()} here")
    if jax.device_count() == 4:  # its mesh is (8,): the same test on the 4 devices of the multidevice run
        make_mesh = jax.make_mesh
        monkeypatch.setattr(jax, "make_mesh", lambda shape, *a, **k: make_mesh((4,) if shape == (8,) else shape, *a, **k))
    if not _version_gate_passes():
        monkeypatch.setattr(jax, "__version__", "0.7.2")
    run_optax_test(sharding_test.ShardingTest, method, optimizer=factory(name)())
