"""The known-answer case of held-out meta-training (docs/heldout_meta_training.md), shared by its tests.

Inner problem: `tasks.SmallDataMLPFamily` — 200 digits, 20 % of them relabelled at random, a 64-wide
tanh MLP, batches of 32 — trained for episodes of T = 160 steps by `lopt.LearnableAdamW`
(θ = {log_lr, weight_decay}), from lr 2e-2 and λ = 0. In 160 steps the net memorises the noisy
labels: its training loss falls while its held-out loss rises, so the held-out meta-loss wants λ > 0
and the training loss wants λ < 0 (the exact gradients, `episode_gradients`, say so).

tanh, not ReLU: with ReLU, a hidden unit dead on a whole batch has gradient exactly 0, and Adam's
m / (√v + ε) jumps from 0 to ±1 when it revives — a jump over a width of ε in θ that `jax.grad`
cannot see. Its pathwise gradient is then biased (at lr 3e-2 it has the wrong sign for log_lr, where
finite differences and ES agree with each other); with tanh no gradient is exactly 0, and the exact
gradient matches finite differences to 3 digits. `eps_root` > 0 keeps √(v + ε_root) differentiable.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lopt
import outer_trainers as ot
import tasks

T = 160  # inner steps per episode
LR = 2e-2  # the initial (and, when only the decay trains, fixed) inner learning rate


def family() -> tasks.SmallDataMLPFamily:
    """The over-fitting family (the module docstring)."""
    return tasks.SmallDataMLPFamily("digits", 200, 0.2, hidden_sizes=(64,), batch_size=32, activations=("tanh",))


def learned_opt(lr: float = LR) -> lopt.LearnableAdamW:
    """AdamW with learned lr and signed decay, starting at lr and λ = 0."""
    return lopt.LearnableAdamW(lr, 0.0, eps_root=1e-12)


def truncated_step(split, end_power: float = 0.0, lr: float = LR) -> ot.LOptTruncatedStep:
    """Episodes of T steps; meta-loss on `split` ("outer_valid") or the train loss (None)."""
    return ot.LOptTruncatedStep(family(), learned_opt(lr), ot.ConstantTruncationSchedule(T), meta_loss_split=split,
                                meta_loss_end_power=end_power)


def flat(tree) -> np.ndarray:
    """θ's leaves in tree order (log_lr, weight_decay) as one float64 vector."""
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree_util.tree_leaves(tree)])


def episode_gradients(ts: ot.LOptTruncatedStep, theta, key, num: int) -> np.ndarray:
    """`jax.grad` of two mean meta-losses of `num` whole episodes, each a fresh particle of `ts`: [num, 2, |θ|].

    Episode m: state = ts.init(θ, fold_in(k_m, 0)), step t with key fold_in(k_m, t + 1) — the same
    distribution of tasks, inits and batches as an estimator's particles. Row 0 is the gradient of
    (1/T) Σ_t ℓ_t, `ts`'s own meta-loss; row 1 that of (1/T) Σ_t normalizer(training loss of step t),
    the training meta-loss (`meta_loss_split=None`) of the same episode (one compilation for both).
    """
    normalizer = tasks.classification_normalizer(10)

    def episode_losses(th, k):
        s = ts.init(th, jax.random.fold_in(k, 0))
        def body(s, t):
            s, out = ts.step(th, s, jax.random.fold_in(k, t + 1))
            return s, (out.loss, normalizer(out.metrics["inner_loss"]))
        own, train = jax.lax.scan(body, s, jnp.arange(T))[1]
        return jnp.stack([own.mean(), train.mean()])

    jac = jax.jit(jax.vmap(jax.jacrev(episode_losses), in_axes=(None, 0)))(theta, jax.random.split(key, num))
    leaves = [np.asarray(x, np.float64).reshape(num, 2, -1) for x in jax.tree_util.tree_leaves(jac)]
    return np.concatenate(leaves, axis=-1)


def final_test_loss(theta, lr_opt: lopt.LearnableAdamW, num_tasks: int = 16, seed: int = 12345) -> float:
    """The mean over `num_tasks` fresh tasks of the loss on the whole test split after T steps at θ."""
    keys = jax.random.split(jax.random.key(seed), num_tasks)
    return float(_final_test_losses(lr_opt, theta, keys).mean())


@functools.partial(jax.jit, static_argnums=0)
def _final_test_losses(lr_opt, theta, keys):
    """Test losses after T steps at θ of one fresh task per key (compiled once per optimizer config)."""
    fam = family()

    def one(key):
        task = fam.task_fn(fam.sample(jax.random.fold_in(key, 0)))
        tx = lr_opt.opt_fn(theta)
        params = task.init(jax.random.fold_in(key, 1))

        def body(carry, k):
            p, s = carry
            g = jax.grad(task.loss)(p, k, fam.data.batch(k, "train"))
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), None

        (params, _), _ = jax.lax.scan(body, (params, tx.init(params)), jax.random.split(jax.random.fold_in(key, 2), T))
        return task.loss(params, key, fam.data.splits["test"])

    return jax.vmap(one)(keys)
