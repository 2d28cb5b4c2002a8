"""LOptTruncatedStep: one inner training step of a sampled task by a learned optimizer.

State per particle: the task cfg, params, model_state, optimizer state, the step within the
episode and the truncation state. One step:

    batch ~ data.batch(key, "train");  (ℓ, model_state), g = value_and_grad(task.loss_with_state)
    updates, opt_state = lopt.opt_fn(θ).update(g, opt_state, params, loss=ℓ)
    params ← params + updates
    meta-loss = task.normalizer(ℓ)     (or the normalised loss on `meta_loss_split` after the update)
    meta-loss ← (p + 1) · (t / T)^p · meta-loss     with `meta_loss_end_power` p > 0 (t the step within the
                                                     episode after this one, T the episode's length)

When the truncation schedule says the episode is over — or the inner loss or the new params
are non-finite — the particle resets to a freshly sampled task. A non-finite step is masked
out of the estimate (`StepOut.mask`) and counted in `StepOut.metrics["nonfinite"]`.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from flax import struct

from lopt.base import LearnedOptimizer
from outer_trainers.tree_utils import tree_all_finite, tree_where
from outer_trainers.steps.truncated_step import StepOut, TruncatedStep, group_episode_ends, reset_where
from outer_trainers.steps.truncation_schedule import TruncationSchedule, TruncationState
from tasks.base import TaskFamily


@struct.dataclass
class LOptInnerState:
    """One particle of LOptTruncatedStep: a task being trained by the learned optimizer.

    Attributes:
        task_cfg: the sampled task's configuration (a pytree from `task_family.sample`).
        params: the task's parameters.
        model_state: the task's non-trained state (e.g. batch-norm statistics).
        opt_state: the learned optimizer's state.
        inner_step: int32 [], steps taken in this episode.
        trunc_state: the truncation schedule's TruncationState (the episode's length).
    """

    task_cfg: Any
    params: Any
    model_state: Any
    opt_state: Any
    inner_step: jax.Array
    trunc_state: TruncationState


class LOptTruncatedStep(TruncatedStep):
    """Trains tasks sampled from `task_family` with `learned_opt`, episodes set by `trunc_sched`.

    Args:
        task_family: the TaskFamily each particle samples its task from (at every reset).
        learned_opt: the LearnedOptimizer; θ are its meta-parameters.
        trunc_sched: the TruncationSchedule of episode lengths.
        meta_loss_split: None to use the normalised training loss of each step as its
            meta-loss, or a data split (e.g. "outer_valid") whose normalised loss after the
            update is used instead; needs a task family with data.
        meta_loss_end_power: p ≥ 0, how much the meta-loss weighs the end of each episode: step t
            of an episode of T steps (t = 1..T) counts (p + 1) · (t / T)^p times, a weight whose mean over
            the episode is about 1. 0 (the default) weighs every step alike, the meta-loss of the
            literature; p = 3 puts about two thirds of an episode's weight on its last quarter, so that
            the loss at the end of training, what a user reads off, counts most.
    """

    def __init__(self, task_family: TaskFamily, learned_opt: LearnedOptimizer, trunc_sched: TruncationSchedule,
                 meta_loss_split: Optional[str] = None, meta_loss_end_power: float = 0.0):
        if not isinstance(learned_opt, LearnedOptimizer):
            raise TypeError(f"learned_opt must be a lopt.LearnedOptimizer, got {type(learned_opt).__name__}")
        if not isinstance(trunc_sched, TruncationSchedule):
            raise TypeError(f"trunc_sched must be a TruncationSchedule, got {type(trunc_sched).__name__}")
        if meta_loss_split is not None and task_family.data is None:
            raise ValueError(f"meta_loss_split={meta_loss_split!r} needs a task family with data; "
                             f"{task_family.name} has none")
        self.task_family = task_family
        self.learned_opt = learned_opt
        self.trunc_sched = trunc_sched
        if not (isinstance(meta_loss_end_power, (int, float)) and 0 <= meta_loss_end_power < float("inf")):
            raise ValueError(f"meta_loss_end_power must be a finite number >= 0, got {meta_loss_end_power!r}")
        self.meta_loss_split = meta_loss_split
        self.meta_loss_end_power = float(meta_loss_end_power)

    @property
    def name(self) -> str:
        """The task family's name: per-estimator metrics are logged under it."""
        return self.task_family.name

    @property
    def max_episode_length(self) -> Optional[int]:
        """The truncation schedule's `max_length`."""
        return self.trunc_sched.max_length

    def data_args(self) -> Any:
        return self.task_family.data

    def _tx(self, theta, trunc_state):
        return self.learned_opt.opt_fn(theta, num_steps=trunc_state.length, is_training=True)

    def init(self, theta, key, *, outer_state=None, data=None, initial_offset=0) -> LOptInnerState:
        """A freshly sampled and initialised task; `initial_offset` starts its step counter there
        (clipped to the episode's length − 1), so its first episode is that much shorter."""
        k_cfg, k_init, k_trunc = jax.random.split(key, 3)
        cfg = self.task_family.sample(k_cfg)
        task = self.task_family.task_fn(cfg)
        params, model_state = task.init_with_state(k_init)
        trunc_state = self.trunc_sched.init(k_trunc, outer_state)
        opt_state = self._tx(theta, trunc_state).init(params)
        offset = jnp.minimum(jnp.asarray(initial_offset, jnp.int32), trunc_state.length - 1)
        return LOptInnerState(cfg, params, model_state, opt_state, offset, trunc_state)

    @staticmethod
    def _step_keys(key):
        """(data, loss, reset) keys of one step. Each user calls this itself: a consumer that
        doesn't need its key (no data, deterministic loss, no reset this step) lets XLA drop the
        draw, and on CPU each threefry draw is a small loop that costs more than a 10-dim step."""
        return jax.random.split(key, 3)

    def _advance(self, theta, state: LOptInnerState, key, outer_state, data):
        """One inner step without the reset: (advanced state, StepOut)."""
        k_data, k_loss, _ = self._step_keys(key)
        k_meta = jax.random.fold_in(k_loss, 1) if self.meta_loss_split is not None else None
        data = self.task_family.data if data is None else data
        task = self.task_family.task_fn(state.task_cfg)
        batch = data.batch(k_data, "train") if data is not None else None

        (loss, model_state), grads = jax.value_and_grad(task.loss_with_state, has_aux=True)(
            state.params, state.model_state, k_loss, batch)
        updates, opt_state = self._tx(theta, state.trunc_state).update(grads, state.opt_state, state.params,
                                                                       loss=loss)
        params = optax.apply_updates(state.params, updates)

        if self.meta_loss_split is None:
            meta_loss = task.normalizer(loss)
        else:
            meta_batch = data.batch(k_meta, self.meta_loss_split)
            meta_loss = task.normalizer(task.loss_with_state(params, model_state, k_meta, meta_batch)[0])

        inner_step = state.inner_step + 1
        if self.meta_loss_end_power > 0:
            p = self.meta_loss_end_power
            meta_loss = meta_loss * (p + 1) * (inner_step / state.trunc_state.length) ** p
        # A finished episode is re-initialised (fresh length included) by the reset, so only the test is needed.
        trunc_state = state.trunc_state
        is_done = self.trunc_sched.done(trunc_state, inner_step, outer_state)
        finite = jnp.isfinite(loss) & jnp.isfinite(meta_loss) & tree_all_finite(params)
        is_done = is_done | ~finite
        advanced = LOptInnerState(state.task_cfg, params, model_state, opt_state, inner_step, trunc_state)
        out = StepOut(loss=jnp.where(finite, meta_loss, 0.0), is_done=is_done, mask=finite,
                      metrics={"nonfinite": (~finite).astype(jnp.int32), "inner_loss": jnp.where(finite, loss, 0.0)})
        return advanced, out

    def step(self, theta, state: LOptInnerState, key, *, outer_state=None, data=None):
        advanced, out = self._advance(theta, state, key, outer_state, data)
        fresh = self.init(theta, self._step_keys(key)[2], outer_state=outer_state, data=data)
        return tree_where(out.is_done, fresh, advanced), out

    def batched_step(self, thetas, states, keys, *, theta_batched=True, outer_state=None, data=None,
                     reset_groups=1):
        """vmap(step), but the fresh-task init runs (under lax.cond) only on steps where some
        particle's episode ended — most steps skip it entirely. With reset_groups=g an episode
        that ends for one member of a group (see TruncatedStep.batched_step) ends for all; they
        share step keys, so they restart on the same fresh task, as a scheduled end would."""
        th_axis = 0 if theta_batched else None
        advanced, out = jax.vmap(
            lambda th, s, k: self._advance(th, s, k, outer_state, data), in_axes=(th_axis, 0, 0))(
                thetas, states, keys)
        out = out.replace(is_done=group_episode_ends(out.is_done, reset_groups)[0])
        fresh = lambda: jax.vmap(lambda th, k: self.init(th, self._step_keys(k)[2], outer_state=outer_state,
                                                         data=data), in_axes=(th_axis, 0))(thetas, keys)
        return reset_where(out.is_done, advanced, fresh), out
