"""GradientEstimator: turns unrolls of a TruncatedStep into meta-gradient estimates.

    est_state = est.init_state(theta, key)
    est_state, estimate = est.estimate(theta, est_state, key)     # Estimate(grad, loss, metrics, ...)

Every estimate says how many of its inner steps counted (`num_valid` of `num_steps`; an inner
step is left out when its `StepOut.mask` is False, e.g. a non-finite loss): one with no counted
step carries no information and `GradientLearner` drops it. Estimators build it with
`counted_estimate`.

Each estimator jits its `init_state` and `estimate` once, at construction: a second call with
the same shapes reuses the compiled program.

Compile options: on CPU the estimators' programs are compiled with LLVM at -O1
(`xla_backend_optimization_level=1`, see `default_compiler_options`). Their code is many small
fusions inside a scan, where -O3 buys no step time but costs about a third more compile time
(docs/benchmarks.md). Pass `compiler_options=` to an estimator to override ({} restores XLA's
defaults).

Compile options belong to a compiled program, so they apply where the estimator's function is
one: a call from Python with concrete arrays (and `.lower`). Called inside a JAX transformation
or trace (`jax.jit`, `jax.eval_shape`, `jax.grad`, `jax.vmap`, `lax.scan`, ...), the function is
traced into the caller's computation and compiled, if at all, with the caller's options; JAX
refuses options on a nested jit, so the estimator then uses a jit without them. Nothing else
changes: the same function computes the same estimate.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import struct

from outer_trainers.steps import unroll as U
from outer_trainers.validation import check_int, check_positive_float
from outer_trainers.steps.truncated_step import TruncatedStep


@struct.dataclass
class Estimate:
    """One meta-gradient estimate, with how many of the inner steps behind it counted.

    An estimate with `num_valid == 0` rests on no inner step at all (every step was masked out,
    e.g. non-finite): its gradient is a meaningless 0 and its loss NaN, and `GradientLearner`
    drops it like a non-finite one. The built-in estimators always fill in both counts.

    Attributes:
        grad: the θ-shaped meta-gradient estimate.
        loss: float32 [], the mean meta-loss of the unroll(s) behind the estimate (NaN when `num_valid == 0`).
        metrics: dict of scalars, e.g. "nonfinite" (non-finite steps seen) and "resets" (episodes ended).
        num_valid: int32 [], the inner steps (over all particles) whose meta-loss entered the estimate;
            for antithetic pairs, both halves of a step where neither half was masked out. None: not
            reported (only finiteness is checked).
        num_steps: int32 [], the inner steps that could have entered it (for FullES/FullGrad, the steps of
            the particles' first episodes), so 1 − num_valid / num_steps is the fraction masked out.
            None: not reported.
    """

    grad: Any
    loss: jax.Array
    metrics: dict = struct.field(default_factory=dict)
    num_valid: Optional[jax.Array] = None
    num_steps: Optional[jax.Array] = None


def counted_estimate(grad: Any, loss: jax.Array, num_valid: jax.Array, num_steps: Any,
                     metrics: dict) -> Estimate:
    """The Estimate of an unroll in which `num_valid` of `num_steps` inner steps counted.

    Its loss is NaN when no step counted (an average over no steps), so nothing downstream
    mistakes an all-masked unroll for a meta-loss of 0.

    Args:
        grad: the θ-shaped estimate.
        loss: float [], the mean meta-loss over the counted steps.
        num_valid: the number of counted inner steps (any numeric dtype, e.g. a float32 sum).
        num_steps: the number of inner steps that could have counted (an int or array).
        metrics: the estimator's metrics.

    Returns:
        Estimate with int32 [] `num_valid` and `num_steps`.
    """
    num_valid = jnp.asarray(num_valid).astype(jnp.int32)
    loss = jnp.where(num_valid > 0, loss, jnp.nan)
    return Estimate(grad, loss, metrics, num_valid, jnp.asarray(num_steps).astype(jnp.int32))


CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


def default_compiler_options() -> dict:
    """XLA options the estimators compile with: `CPU_COMPILER_OPTIONS` on the CPU backend, none elsewhere.

    Returns:
        A new dict (safe to modify).
    """
    return dict(CPU_COMPILER_OPTIONS) if jax.default_backend() == "cpu" else {}


class _OptionsJit:
    """`jax.jit(fn, compiler_options=...)` for top-level calls, `jax.jit(fn)` inside a trace.

    A call whose arguments hold a `jax.core.Tracer` is inside a JAX transformation or trace;
    JAX refuses compiler options on a jit nested in one (their program is the caller's), so
    that call goes through the plain jit and is compiled with the caller's options (see the
    module docstring). `lower` always uses the options: it lowers a top-level program.
    """

    def __init__(self, fn, compiler_options: dict):
        self.plain = jax.jit(fn)
        self.top = jax.jit(fn, compiler_options=compiler_options) if compiler_options else self.plain

    def __call__(self, *args):
        traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args))
        return (self.plain if traced else self.top)(*args)

    def lower(self, *args):
        return self.top.lower(*args)


class GradientEstimator:
    """Base class of gradient estimators: jits a subclass's `_init_state` and `_estimate` once.

    Subclasses implement `_init_state(theta, key, outer_state, data)` and
    `_estimate(theta, state, key, outer_state, data)`, pure functions that this class compiles
    (with `compiler_options`) the first time `init_state` / `estimate` are called.

    Args:
        truncated_step: the TruncatedStep whose unrolls are differentiated.
        compiler_options: XLA compile options of the jitted functions; None for
            `default_compiler_options()`, {} for XLA's defaults. They apply to calls from
            Python with concrete arrays; inside `jax.jit`, `eval_shape`, `grad`, `vmap` or
            `scan` the caller's compilation decides (see the module docstring).

    Attributes:
        name: the estimator's label in logs and checkpoint metadata, e.g. "TruncatedPES(n=8,K=20)";
            also its repr.
    """

    truncated_step: TruncatedStep
    name: str = "estimator"

    def __init__(self, truncated_step: TruncatedStep, compiler_options: Optional[dict] = None):
        if not isinstance(truncated_step, TruncatedStep):
            raise TypeError(f"estimators need a outer_trainers.TruncatedStep, got {type(truncated_step).__name__}")
        self.truncated_step = truncated_step
        self.compiler_options = default_compiler_options() if compiler_options is None else dict(compiler_options)
        self._jit_init = _OptionsJit(self._init_state, self.compiler_options)
        self._jit_estimate = _OptionsJit(self._estimate, self.compiler_options)

    @property
    def inner_steps_per_estimate(self) -> int:
        """Inner steps (over all particles) one `estimate` call takes, for throughput reports."""
        return 0

    def init_state(self, theta: Any, key: jax.Array, *, outer_state: Optional[Any] = None) -> Any:
        """The estimator's state before its first estimate (e.g. fresh particles).

        Args:
            theta: the meta-parameters.
            key: PRNG key.
            outer_state: the outer iteration (an int or traced int32 []) or None; passed to the
                truncated step (e.g. for curricula).

        Returns:
            The estimator's state, a pytree (a flax.struct dataclass).
        """
        return self._jit_init(theta, key, _outer(outer_state), self.truncated_step.data_args())

    def estimate(self, theta: Any, state: Any, key: jax.Array, *,
                 outer_state: Optional[Any] = None) -> tuple[Any, Estimate]:
        """One meta-gradient estimate at θ, carrying the estimator's state on.

        Args:
            theta: the meta-parameters.
            state: the estimator's state (from `init_state` or the previous `estimate`).
            key: PRNG key of this estimate.
            outer_state: the outer iteration (an int or traced int32 []) or None.

        Returns:
            (state, Estimate): the new state and the estimate.
        """
        return self._jit_estimate(self.place_theta(theta, state), state, key, _outer(outer_state),
                                  self.truncated_step.data_args())

    def place_theta(self, theta: Any, state: Any) -> Any:
        """theta placed where this estimator's compiled estimate takes it (here: unchanged).

        An estimator that shards its particles over a device mesh puts theta on the mesh, replicated,
        so a theta fresh from the host (the first step, a resume) and one a jitted update returned
        (already on the mesh) reach the same compiled program instead of compiling it twice.

        Args:
            theta: the meta-parameters.
            state: the estimator's state (its particles tell whether they are sharded).

        Returns:
            theta, placed.
        """
        return theta

    def _init_state(self, theta, key, outer_state, data):
        raise NotImplementedError

    def _estimate(self, theta, state, key, outer_state, data):
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class TruncatedEstimator(GradientEstimator):
    """Base of estimators that carry `num_tasks` particles across truncations of `trunc_length` steps.

    Args:
        truncated_step: the TruncatedStep whose unrolls are differentiated.
        num_tasks: N, the number of particles (of ± pairs for antithetic estimators), >= 1.
        trunc_length: K, inner steps per truncation (per `estimate`), >= 1.
        random_initial_iteration_offset: if > 0, each particle starts a uniform-random number of
            steps in [0, random_initial_iteration_offset] into its first episode, which staggers
            the particles' resets (see `unroll.init_particles`).
        compiler_options: XLA compile options; see `GradientEstimator`.
    """

    particles_per_task: int = 1

    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, trunc_length: int, *,
                 random_initial_iteration_offset: int = 0, compiler_options: Optional[dict] = None):
        self.num_tasks = check_int("num_tasks", num_tasks, minimum=1)
        self.trunc_length = check_int("trunc_length", trunc_length, minimum=1)
        self.random_initial_iteration_offset = check_int("random_initial_iteration_offset",
                                                         random_initial_iteration_offset, minimum=0)
        self.name = f"{type(self).__name__}(n={self.num_tasks},K={self.trunc_length})"
        super().__init__(truncated_step, compiler_options)

    @property
    def inner_steps_per_estimate(self) -> int:
        return self.particles_per_task * self.num_tasks * self.trunc_length

    def _init_particles(self, theta, key, outer_state, data):
        """`num_tasks` fresh (staggered) particles: states with a leading [num_tasks] axis."""
        return U.init_particles(self.truncated_step, theta, key, self.num_tasks, outer_state=outer_state, data=data,
                                max_offset=self.random_initial_iteration_offset)


class AntitheticTruncatedEstimator(TruncatedEstimator):
    """Base of truncated ES estimators: N antithetic pairs θ ± ε_i, ε_i ~ N(0, σ²I) (2N particles).

    Args:
        truncated_step: the TruncatedStep whose unrolls are differentiated.
        num_tasks: N, the number of ± particle pairs, >= 1.
        trunc_length: K, inner steps per truncation (per `estimate`), >= 1.
        std: σ, the standard deviation of the perturbations, > 0.
        random_initial_iteration_offset: staggers the first episodes; see `TruncatedEstimator`.
        compiler_options: XLA compile options; see `GradientEstimator`.
    """

    particles_per_task = 2

    def __init__(self, truncated_step: TruncatedStep, num_tasks: int, trunc_length: int, std: float = 0.01, *,
                 random_initial_iteration_offset: int = 0, compiler_options: Optional[dict] = None):
        self.std = check_positive_float("std", std)
        super().__init__(truncated_step, num_tasks, trunc_length,
                         random_initial_iteration_offset=random_initial_iteration_offset,
                         compiler_options=compiler_options)


def _outer(outer_state: Optional[Any]) -> Optional[Any]:
    """Outer iteration as a traced int32 so a new value never recompiles."""
    if outer_state is None or isinstance(outer_state, (int, float)):
        return None if outer_state is None else jnp.asarray(outer_state, jnp.int32)
    return outer_state
