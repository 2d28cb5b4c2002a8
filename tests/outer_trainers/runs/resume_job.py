"""A tiny outer-training run for the resume tests, run as a subprocess:

    python resume_job.py OUTPUT_DIR NUM_STEPS [KILL_AT] [--extend]

Checkpoints every 5 steps; with KILL_AT, the process SIGKILLs itself right after outer step
KILL_AT (its checkpoints, if any, already written). With --extend it trains the run in
OUTPUT_DIR further, to NUM_STEPS (`outer_train(..., extend=True)`).
"""
import os
import signal
import sys

import optax

import lopt
import outer_trainers as ot
import tasks


def build():
    family = tasks.QuadraticFamily(dim=4)
    lo = lopt.LearnableSGD(1e-2)
    step = ot.LOptTruncatedStep(family, lo, ot.ConstantTruncationSchedule(12))
    est = ot.TruncatedPES(step, num_tasks=4, trunc_length=4, std=0.05, random_initial_iteration_offset=6)
    return ot.GradientLearner(lo, optax.adam(0.05)), [est]


def main(out, num_steps, kill_at=None, extend=False):
    learner, ests = build()

    def callback(step, state, metrics):
        if kill_at is not None and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    ot.outer_train(learner, ests, num_steps, output_dir=out, seed=3, reporting=ot.Reporting(progress=False),
                   callback=callback,
                   checkpoint_policy=ot.CheckpointPolicy(every_steps=5, every_seconds=None, keep=2), extend=extend)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--extend"]
    main(args[0], int(args[1]), int(args[2]) if len(args) > 2 else None, extend="--extend" in sys.argv[1:])
