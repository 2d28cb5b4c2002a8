"""A small train_loop run for the SIGKILL resume test, run as a subprocess:

    python train_job.py OUTPUT_DIR NUM_STEPS [KILL_AT] [--extend]

Digits MLP with Adam, EMA with warm-up, evaluation every 4 steps on two splits, rolling checkpoints
every 5 steps (last 2 kept) and a permanent one at step 8. With KILL_AT, the process SIGKILLs
itself in the callback of step KILL_AT (an evaluation or checkpoint step). With --extend it trains
the run in OUTPUT_DIR further, to NUM_STEPS (`train_loop(..., extend=True)`). At the end it writes
OUTPUT_DIR/result.npz: every leaf of the final TrainState, the per-step losses and grad norms and
the evaluation history.
"""
import os
import signal
import sys

import jax
import numpy as np
import optax

import tasks
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.training.train_eval import EvalPlan
from outer_trainers.training.train_loop import run_to_end, train_loop
from outer_trainers.training.train_setup import LoopOptions


def main(out, num_steps, kill_at=None, extend=False):
    def callback(step, state, metrics):
        if kill_at is not None and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    task = tasks.ImageMLPTask("digits", (8,), batch_size=16)
    policy = CheckpointPolicy(every_steps=5, every_seconds=None, keep=2, checkpoints_at=(8,))
    loop = train_loop(task, optax.adam(1e-2), num_steps, seed=3, ema_decay=0.9, ema_warmup_steps=6,
                      evaluation=EvalPlan(evals=["test", "outer_valid"], every=4, batches=2), output_dir=out,
                      options=LoopOptions(log_every=3, callbacks=[callback], chunk_size=4), checkpoint_policy=policy,
                      extend=extend)
    result = run_to_end(loop)
    state = jax.tree_util.tree_map(lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key) else x, result.state)
    leaves = {f"state_{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(state))}
    evals = {f"eval_{name}": v for name, v in result.evals.items()}
    np.savez(os.path.join(out, "result.npz"), losses=result.losses, grad_norms=result.grad_norms, **leaves, **evals)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--extend"]
    main(args[0], int(args[1]), int(args[2]) if len(args) > 2 else None, extend="--extend" in sys.argv[1:])
