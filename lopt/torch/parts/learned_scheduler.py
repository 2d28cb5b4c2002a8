"""Celo's learned scheduler in torch (`lopt.parts.learned_scheduler`): one step-size multiplier per step.

The scheduler's inputs are the same for every tensor, so the JAX optimizer keeps one state for
the model. Torch's convention is a state per parameter (a parameter without a gradient is
skipped), so each parameter holds a copy ("loss_means", "loss_min", "scheduler_h",
"scheduler_c"; the count of losses seen is its "step"); `advance` runs the network once per
distinct state (once per step when every parameter steps together) and writes the result into
every copy. The loss EMAs' decays δ_i follow from the group's horizon N (`loss_decays`).

Parity. The loss features divide differences of nearly equal averages ((ℓ̂_j − μ_j) /
(ℓ̂_{j+1} − μ_j), and the bias correction ℓ̄ / (1 − δ^n) with δ within 5e-4 of 1 at N = 2000), so
they amplify an ulp of the averages up to ~1e-1 in a feature: computing them in float64 does
not help, because float64's value is not the JAX optimizer's either (0.02 apart after 25 steps
of the authors' reference run at N = 2000). What matches is XLA's own float32 arithmetic, op for
op: the fused EMA update rounds once, as a fused multiply-add (ℓ̄ δ + ℓ(1 − δ), emulated here in
float64 and rounded once), δ^n is the correctly rounded power (within an ulp of XLA's), and δ_i
are the JAX function's own float32 values (XLA's log, pow and exp round differently from
torch's in the last bit, and one ulp of δ is 1e-4 of 1 − δ). With float64 parameters the
scheduler computes in float64.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import torch

from lopt.parts import learned_scheduler as jax_scheduler
from lopt.torch.parts.nn import lstm_step

__all__ = ["loss_decays", "advance", "KEYS"]

#: a torch parameter's scheduler entries: the loss EMAs, their running minimum, the LSTM's h and c
KEYS = ("loss_means", "loss_min", "scheduler_h", "scheduler_c")


@functools.lru_cache(maxsize=64)
def _decays_f32(num_steps: int) -> np.ndarray:
    # the JAX function's float32 values (module docstring): computed once per horizon, read-only
    import jax
    decays = np.asarray(jax.jit(jax_scheduler.init_loss_buffer)(np.int32(num_steps)).decays, np.float32)
    decays.setflags(write=False)
    return decays


def loss_decays(num_steps: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """δ_i = exp(−1/h_i), h = logspace(1, log10 N, 10): [10], as `init_loss_buffer(N).decays`.

    Args:
      num_steps: the horizon N (a positive int).
      dtype: the compute dtype (float64: δ_i in float64, not rounded to float32).
      device: where.

    Returns:
      The decays.
    """
    if dtype == torch.float64:
        half_lives = np.logspace(1, np.log10(num_steps), jax_scheduler.NUM_LOSS_EMAS)
        return torch.tensor(np.exp(-1.0 / half_lives), dtype=dtype, device=device)
    return torch.tensor(_decays_f32(int(num_steps)), dtype=dtype, device=device)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a·b + c rounded once (XLA's fused multiply-add in float32; plain in float64)."""
    if a.dtype == torch.float64:
        return a * b + c
    return (a.double() * b.double() + c.double()).to(a.dtype)


def _pow(decays: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """δ^n, correctly rounded to the dtype of δ: [U, 10] from δ [U, 10] and n [U]."""
    return torch.pow(decays.double(), n.double()[:, None]).to(decays.dtype)


def _loss_step(means, running_min, decays, count, loss):
    """`update_loss_buffer` then `loss_buffer_features` for U buffers: (means, running_min, features [U, 9])."""
    bias = 1.0 - _pow(decays, count + 1)  # the same power before and after the update, as in JAX
    approx_max = torch.where(count == 0, loss, torch.amax(means / bias, dim=1))
    loss = torch.minimum(torch.abs(approx_max) * 2, loss)
    means = _fma(means, decays, loss[:, None] * (1.0 - decays))
    corrected = means / bias
    running_min = torch.minimum(running_min, corrected)
    low = running_min[:, :-1]
    scale = torch.clamp(corrected[:, 1:] - low, min=1e-8)
    feats = torch.clamp((corrected[:, :-1] - low) / scale - 1.0, -1.0, 1.0)
    feats = torch.where((count + 1 <= 2)[:, None], feats * 0, feats)
    return means, running_min, feats


def _network(theta: dict, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
    """The scheduler's network on inputs x [U, 18]: (s [U], h, c)."""
    mixed = torch.relu(x @ theta["mix"]["w"] + theta["mix"]["b"])
    z = x @ theta["embed"]["w"] + theta["embed"]["b"] + mixed
    h, c = lstm_step(theta["lstm"], z, h, c)
    return torch.exp((h @ theta["step_size"]["w"] + theta["step_size"]["b"])[:, 0]) * 0.1, h, c


def advance(theta: dict, states: Sequence[dict], steps: torch.Tensor, horizons: Sequence[int],
            loss: torch.Tensor) -> torch.Tensor:
    """One scheduler step for each parameter: its copy of the state advanced in place, its multiplier s.

    Args:
      theta: the scheduler's theta as tensors of the compute dtype (`Rule.theta_on(...)["scheduler"]`).
      states: the parameters' state dicts (each holding `KEYS`).
      steps: t per parameter, the updates it made before this one, [L] in the compute dtype.
      horizons: N per parameter.
      loss: this step's training loss, 0-d in the compute dtype.

    Returns:
      s per parameter, [L].
    """
    dtype, device = steps.dtype, steps.device
    horizon = torch.tensor([float(n) for n in horizons], dtype=dtype, device=device)
    rows = torch.cat([torch.stack([torch.as_tensor(st[k]).reshape(-1) for st in states]) for k in KEYS]
                     + [steps[:, None], horizon[:, None]], dim=1)
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)  # one network step per distinct state
    first = [int((inverse == u).nonzero()[0]) for u in range(unique.shape[0])]
    n_emas, hidden = jax_scheduler.NUM_LOSS_EMAS, theta["initial_state"]["h"].shape[0]
    means, running_min = unique[:, :n_emas], unique[:, n_emas:2 * n_emas]
    h, c = unique[:, 2 * n_emas:2 * n_emas + hidden], unique[:, 2 * n_emas + hidden:2 * n_emas + 2 * hidden]
    t, n = unique[:, -2], unique[:, -1]
    decays = torch.stack([loss_decays(int(horizons[i]), dtype, device) for i in first])
    means, running_min, loss_feats = _loss_step(means, running_min, decays, t, loss.expand(t.shape))
    centres = torch.tensor(jax_scheduler.FRACTION_CENTRES, dtype=dtype, device=device)
    progress = torch.tanh(((t / n)[:, None] - centres) * 10)  # `progress_embedding`
    s, h, c = _network(theta, torch.cat([progress, loss_feats], dim=1), h, c)
    for i, st in enumerate(states):
        u = int(inverse[i])
        st["loss_means"], st["loss_min"] = means[u].clone(), running_min[u].clone()
        st["scheduler_h"], st["scheduler_c"] = h[u:u + 1].clone(), c[u:u + 1].clone()
    return s[inverse]


def init_state(state: dict, theta: dict) -> dict:
    """A parameter's scheduler copies before its first update: h and c from theta's learned initial state.

    Args:
      state: the parameter's state from its spec (`lopt.torch.parts.spec.param_state`), changed in place.
      theta: the scheduler's theta (numpy arrays).

    Returns:
      `state`.
    """
    for key, name in (("scheduler_h", "h"), ("scheduler_c", "c")):
        init = np.asarray(theta["initial_state"][name], np.float64)
        state[key] = torch.tensor(init, dtype=state[key].dtype, device=state[key].device).reshape(state[key].shape)
    return state


def multipliers(name: str, items, ctx) -> torch.Tensor:
    """s for every item of a step (`advance`), after checking that the step has a loss and every item a horizon.

    Args:
      name: the architecture's name, for the messages.
      items: the step's `lopt.torch.rule.Item`s.
      ctx: their `lopt.torch.rule.Context`.

    Returns:
      s per item, [L].

    Raises:
      ValueError: no loss (the scheduler reads it), or a parameter group without num_steps.
    """
    if ctx.loss is None:
        raise ValueError(f"{name}'s scheduler reads the training loss: step the optimizer with a closure that "
                         f"returns the loss, with loss=, or after set_loss(loss) (require_loss=False does not apply)")
    if any(it.horizon is None for it in items):
        raise ValueError(f"{name} schedules its steps by training progress: give every parameter group num_steps=<the "
                         f"number of optimizer steps you will take>")
    return advance(ctx.theta["scheduler"], [it.state for it in items], ctx.steps, [it.horizon for it in items],
                   ctx.loss)
