"""Celo-Adam (Moudgil et al. 2025): Adam's direction with a learned step size, Celo's scheduler.

Every step t (t = 0 at the first update), with the horizon N and the training loss ℓ:

    s = scheduler(t, N, ℓ)                          `lopt.parts.learned_scheduler` (one scalar)
    g ← clip(g, −1000, 1000)
    m ← β1 m + (1 − β1) g,    v ← β2 v + (1 − β2) g²
    m̂ = m / (1 − β1^{t+1}),  v̂ = v / (1 − β2^{t+1})
    Δp = −m̂ · (s · step_mult) / (ε + √(v̂ + 1e-10))

So the only learned part is the step-size schedule s · step_mult (a learning rate of about 1e-4
when s = 0.1), the same for every tensor, from training progress t/N and the loss history.

Theta: {"scheduler": `learned_scheduler.scheduler_init`}. `lopt.published.load("celo_adam",
num_steps=N)` runs the authors' released theta; the update needs the loss (`update(..., loss=loss)`) and N.
"""
from __future__ import annotations

from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import optax

from lopt.base import LearnedOptimizer
from lopt.parts import learned_scheduler as sched
from lopt.parts import tree_checks
from lopt.parts.spec import PARAM, ArchSpec, StateField, iteration_field

GRAD_CLIP = 1000.0
# added to v̂ under the square root (`CeloAdam.spec().constants["sqrt_eps"]`)
SQRT_EPS = 1e-10


@flax.struct.dataclass
class CeloAdamState:
    """Celo-Adam's optimizer state.

    Attributes:
      mu: per leaf, float32 [*p.shape]: Adam's first moment m.
      nu: per leaf, float32 [*p.shape]: Adam's second moment v.
      scheduler: the learned scheduler's state, a `lopt.parts.learned_scheduler.SchedulerState` (loss
        averages and the LSTM's h and c).
      iteration: int32 []: the number of updates so far.
    """
    mu: Any
    nu: Any
    scheduler: Any  # a lopt.parts.learned_scheduler.SchedulerState
    iteration: jax.Array


@jax.jit
def leaf_update(g: Any, p: Any, mu: jax.Array, nu: jax.Array, lr: jax.Array, hparams: tuple,
                corrections: tuple) -> tuple:
    """One tensor's Celo-Adam update and new moments (the module docstring's math).

    Jitted, so that an eager update rounds as a jitted one does (inlined when the update is jitted).

    Args:
      g: the gradient (any float dtype) [*s].
      p: the parameter [*s].
      mu, nu: Adam's moments before this step, float32 [*s].
      lr: s · step_mult, float32 [].
      hparams: (β1, β2, ε), float32 [].
      corrections: (1 − β1^{t+1}, 1 − β2^{t+1}), float32 [].

    Returns:
      (Δp in p's dtype, mu, nu).
    """
    b1, b2, eps = hparams
    g32 = jnp.clip(jnp.asarray(g, jnp.float32), -GRAD_CLIP, GRAD_CLIP)
    mu = b1 * mu + (1.0 - b1) * g32
    nu = b2 * nu + (1.0 - b2) * (g32 * g32)
    step = (mu / corrections[0]) * (lr / (eps + jnp.sqrt(nu / corrections[1] + SQRT_EPS)))
    return (-step).astype(jnp.result_type(p)), mu, nu


class CeloAdam(LearnedOptimizer):
    """Adam whose learning rate is Celo's learned scheduler's output (math in the module docstring).

    Args:
      lstm_hidden: H, the scheduler LSTM's width.
      b1: Adam's β1.
      b2: Adam's β2.
      eps: Adam's ε.
      step_mult: the base step size the scheduler's multiplier scales.
    """

    lstm_hidden: int = 64
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    step_mult: float = 0.001

    def check_config(self) -> None:
        if not (0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0) or self.eps < 0 or self.lstm_hidden < 1:
            raise ValueError(f"CeloAdam: need b1, b2 in [0, 1), eps >= 0, lstm_hidden >= 1; got b1={self.b1}, "
                             f"b2={self.b2}, eps={self.eps}, lstm_hidden={self.lstm_hidden}")

    def spec(self) -> ArchSpec:
        """Its constants and state layout (`lopt.parts.spec`; read by `lopt.torch` too).

        Returns:
          no features (no per-parameter network); constants "grad_clip" and "sqrt_eps"; state "mu",
          "nu" `[*s]`, the scheduler's (`learned_scheduler.state_fields`) and "iteration".
        """
        state = (StateField("mu", PARAM, doc="Adam's first moment m"),
                 StateField("nu", PARAM, doc="Adam's second moment v"))
        return ArchSpec("CeloAdam", (), {"grad_clip": GRAD_CLIP, "sqrt_eps": SQRT_EPS},
                        state + sched.state_fields(self.lstm_hidden) + (iteration_field(),))

    def init(self, key: jax.Array) -> dict:
        return {"scheduler": sched.scheduler_init(key, self.lstm_hidden)}

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        del is_training
        self.check_theta(theta, "CeloAdam.opt_fn")
        if num_steps is None:
            raise ValueError("CeloAdam schedules its steps by training progress: pass num_steps=<the number of "
                             "updates you will make> to opt_fn")
        b1, b2, eps = (jnp.asarray(x, jnp.float32) for x in (self.b1, self.b2, self.eps))

        def init_fn(params):
            zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)
            return CeloAdamState(jax.tree_util.tree_map(zeros, params), jax.tree_util.tree_map(zeros, params),
                                 sched.init_state(theta["scheduler"], num_steps), jnp.zeros((), jnp.int32))

        def update_fn(updates, state, params=None, *, loss=None, **extra_args):
            del extra_args
            tree_checks.require_params(updates, params, "CeloAdam")
            treedef, gs, (ps, mus, nus) = tree_checks.leaves_of(updates, params, state.mu, state.nu)
            loss = sched.training_loss(loss, "CeloAdam")
            s, sched_state = sched.step(theta["scheduler"], state.scheduler, loss, state.iteration, num_steps)
            lr = s * self.step_mult
            t = state.iteration + 1
            corrections = (1 - self.b1 ** t, 1 - self.b2 ** t)
            new_u, new_mu, new_nu = [], [], []
            for g, p, mu, nu in zip(gs, ps, mus, nus):
                u, mu, nu = leaf_update(g, p, mu, nu, lr, (b1, b2, eps), corrections)
                new_u.append(u)
                new_mu.append(mu)
                new_nu.append(nu)
            unf = treedef.unflatten
            return unf(new_u), CeloAdamState(unf(new_mu), unf(new_nu), sched_state, state.iteration + 1)

        return optax.GradientTransformationExtraArgs(init_fn, update_fn)
