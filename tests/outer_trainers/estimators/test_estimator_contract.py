"""The contract every gradient estimator meets, one row of ESTIMATORS per estimator.

A new estimator gets the whole contract by adding a row:
- its constructor reads `truncated_step, num_tasks, <length>[, std]`, options keyword-only, and
  its repr is its name;
- its gradient relates to the exact one as its `horizon` says, on the deterministic problem of
  estimator_checks (exactly for backprop, within 3 standard errors for ES);
- a second `estimate` does not recompile;
- particles whose loss is NaN are masked, reset and counted, and estimates stay finite;
- an estimate reports how many of its inner steps counted (`num_valid` of `num_steps`): all on a
  finite problem, none — with a NaN loss, so the learner drops it — when every step is non-finite;
- its state survives a checkpoint round trip: the next estimate is bit-identical.
Estimator-specific behaviour (PES's staggering, FullES's sign/clip, ...) is tested in its own file.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import pytest

import outer_trainers as ot
from tests.outer_trainers.estimators import estimator_checks as C


@dataclasses.dataclass(frozen=True)
class Row:
    """How to build one estimator and what its gradient estimates.

    make(truncated_step, num_tasks, **options): the estimator, with truncations of C.TRUNC steps
    (online estimators) or whole episodes (FullES, FullGrad).
    horizon: "online" (unbiased for every truncation's loss), "truncation" (unbiased for the first
    truncation of a fresh episode only: it ignores θ's effect on the carried state) or "episode"
    (the whole episode's meta-loss).
    stochastic: an ES estimator (its mean is tested) rather than backprop (every sample is).
    num_tasks: the particles of the gradient check; an ES row's replicates are computed from a pilot's spread
      (`estimator_checks.sample_size`: the replicates that detect a 25% bias with 99% power, the test's
      false-alarm probability ≤ 1e-3).
    variants: options for `make` in the gradient check, one check each.
    """

    make: Callable[..., ot.GradientEstimator]
    horizon: str
    stochastic: bool
    num_tasks: int
    variants: tuple = ({},)


ESTIMATORS = {
    "TruncatedES": Row(lambda ts, n, **kw: ot.TruncatedES(ts, n, C.TRUNC, std=0.01, **kw), "truncation",
                       True, 64),
    "TruncatedPES": Row(lambda ts, n, **kw: ot.TruncatedPES(ts, n, C.TRUNC, std=0.01, **kw), "online", True, 64),
    "TruncatedPESPMAP": Row(lambda ts, n, **kw: ot.TruncatedPESPMAP(ts, n, C.TRUNC, std=0.01, num_devices=1, **kw),
                            "online", True, 64),
    "NoiseReuseES": Row(lambda ts, n, **kw: ot.NoiseReuseES(ts, n, C.TRUNC, std=0.01, **kw), "online", True, 64),
    "TruncatedGrad": Row(lambda ts, n, **kw: ot.TruncatedGrad(ts, n, C.TRUNC, **kw), "truncation", False, 1),
    # 7-step episodes: chunks of 3 + 3 + 1
    "FullES": Row(lambda ts, n, **kw: ot.FullES(ts, n, std=0.01, **kw), "episode", True, 256,
                  variants=({"loss_type": "avg", "chunk_length": 3}, {"loss_type": "last", "chunk_length": 3})),
    # unroll_length 9 runs past the 7-step episode, whose end must stop the meta-loss
    "FullGrad": Row(lambda ts, n, **kw: ot.FullGrad(ts, n, **kw), "episode", False, 2,
                    variants=({"unroll_length": 9}, {"unroll_length": 9, "loss_type": "last", "chunk_length": 2})),
}
NAMES = list(ESTIMATORS)
# The ES rows' statistical checks (replicates computed, `estimator_checks.sample_size`) are the slow tier; the backprop rows' exact checks are fast.
GRADIENT_CASES = [pytest.param(name, options, id=f"{name}-{i}", marks=(pytest.mark.slow,) if row.stochastic else ())
                  for name, row in ESTIMATORS.items() for i, options in enumerate(row.variants)]


@pytest.fixture(scope="module")
def exact():
    """(truncated step, θ, per-step Jacobian [EPISODE, |θ|]) of the deterministic quadratic problem."""
    ts, theta = C.quadratic_step(), C.theta0()
    return ts, theta, C.episode_jacobian(ts, theta)


@pytest.fixture(scope="module")
def small():
    """name -> a 4-task estimator of each row on the quadratic problem, built (and compiled) once."""
    ts, cache = C.quadratic_step(), {}

    def get(name):
        if name not in cache:
            cache[name] = ESTIMATORS[name].make(ts, 4)
        return cache[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_constructor_order_and_repr(name, small):
    est = small(name)
    params = list(inspect.signature(type(est).__init__).parameters.values())[1:]
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    length = "unroll_length" if ESTIMATORS[name].horizon == "episode" else "trunc_length"
    assert positional == ["truncated_step", "num_tasks", length] + (["std"] if ESTIMATORS[name].stochastic else [])
    assert all(p.kind == p.KEYWORD_ONLY for p in params[len(positional):])
    assert repr(est) == est.name and est.name.startswith(f"{type(est).__name__}(") and est.name.count("(") == 1


@pytest.mark.parametrize("name,options", GRADIENT_CASES)
def test_gradient_against_exact(name, options, exact):
    row = ESTIMATORS[name]
    ts, theta, jac = exact
    if row.horizon == "episode":
        ref = (jac[-1] if options.get("loss_type") == "last" else jac.mean(0))[None]
    else:
        ref = C.truncation_references(jac, C.TRUNC, C.NUM_TRUNCS)
    est = row.make(ts, row.num_tasks, **options)
    first_only = row.horizon == "truncation"
    if row.stochastic:
        samples, max_z = C.collect_for_test(est, theta, ref, first_only=first_only)
    else:
        samples, max_z = C.collect(est, theta, len(ref), replicates=1), None
    if first_only:
        C.assert_matches(samples[:, :1], ref[:1], row.stochastic, max_z)
        C.assert_biased_after_first(samples, ref, row.stochastic)
    else:
        C.assert_matches(samples, ref, row.stochastic, max_z)


@pytest.mark.parametrize("name", NAMES)
def test_no_recompile(name, small, compile_counter):
    C.assert_no_recompile(small(name), C.theta0(), compile_counter)


@pytest.mark.parametrize("name", NAMES)
def test_nonfinite_steps_are_masked_reset_and_counted(name):
    est = ESTIMATORS[name].make(C.nan_step(), 8)
    C.assert_nonfinite_handled(est, C.theta0())
    C.assert_all_masked_estimate_is_empty(est, C.diverged_theta(C.theta0()))


@pytest.mark.parametrize("name", NAMES)
def test_estimates_count_their_valid_steps(name, small):
    C.assert_counts_every_step(small(name), C.theta0())


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip(name, small, tmp_path):
    C.assert_checkpoint_round_trip(small(name), C.theta0(), tmp_path / "state.msgpack")
