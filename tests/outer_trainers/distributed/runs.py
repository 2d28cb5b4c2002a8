"""Picklable run descriptions for the distributed tests (module-level, so Ray workers import them)."""
import optax

import lopt
import outer_trainers as ot
import tasks
from tests.fixtures import lopt_step


def quadratic_run(dim: int = 4, num_estimators: int = 2, lr: float = 0.05, std: float = 0.05, trunc_length: int = 5,
                  num_tasks: int = 4, episode: int = 20, theta_ema=None):
    """(GradientLearner, [TruncatedPES, ...]) on QuadraticFamily(dim) with LearnableAdam: a tiny, fast run."""
    lo = lopt.LearnableAdam(1e-2)
    step = lopt_step(dim, lo, episode)
    ests = [ot.TruncatedPES(step, num_tasks, trunc_length, std=std, random_initial_iteration_offset=episode // 2)
            for _ in range(num_estimators)]
    return ot.GradientLearner(lo, optax.adam(lr), theta_ema=theta_ema), ests


def quadratic_validation():
    """A ValidationSelector of `quadratic_run`'s LearnableAdam: quadratics 10x stiffer than meta-training's, 10 steps,
    1 seed, tuned Adam on 7 rates."""
    family = tasks.QuadraticFamily(dim=4, min_curvature=1.0, max_curvature=100.0)
    return ot.ValidationSelector(lopt.LearnableAdam(1e-2), [family], num_steps=10, num_seeds=1)


def pbt_run(config: dict):
    """`quadratic_run` with the trial's outer learning rate and σ."""
    return quadratic_run(lr=config["outer_lr"], std=config["std"], num_estimators=1)


def quadratic_evaluator():
    """A MetaEvaluator of LearnableAdam on 2 held-out quadratics (dim 4) for 20 steps."""
    return ot.MetaEvaluator(lopt.LearnableAdam(1e-2), tasks.QuadraticFamily(dim=4), num_tasks=2, num_steps=20, seed=3)


def fails_on_workers(driver_pid: int):
    """`quadratic_run()` in the driver's process; raises in any other (a worker that cannot build the run)."""
    import os
    if os.getpid() != driver_pid:
        raise RuntimeError("this run cannot be built here")
    return quadratic_run(num_estimators=1)
