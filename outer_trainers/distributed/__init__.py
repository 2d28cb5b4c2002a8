"""Meta-training on many machines with Ray: one learner, worker actors, evaluation actors, PBT with Ray Tune.

    from outer_trainers.distributed import RayWorkers, ray_outer_train
    state = ray_outer_train(make_run, num_steps=1000, num_workers=8, output_dir="runs/dist",
                            workers=RayWorkers(max_staleness=1))

Modules: `cluster` (connecting to Ray, the actors' thread limits), `worker` (EstimatorWorker: the
estimators and particle states one worker owns), `learner_state` (the learner's
state and the particles' keys), `worker_pool` (the learner's view of its worker
actors: calls in flight, failures, restarts), `eval_worker` (the evaluation actor and its
schedule), `learner` (`ray_outer_train` and `RayWorkers`, its settings and the Ray path of the
gin-configured run), `learner_loop` (the learner's synchronous and asynchronous loops), `pbt`
(`pbt_outer_train`: population-based training of outer hyper-parameters with Ray Tune). Ray is
imported only when these run: `import outer_trainers` works without the "ray" extra.
"""
from outer_trainers.distributed.cluster import RayConnectionError, connect_ray, ray_connection, worker_runtime_env
from outer_trainers.distributed.eval_worker import EvalActor, EvalClient, EvalWorker
from outer_trainers.distributed.learner import RayWorkers, ray_outer_train
from outer_trainers.distributed.learner_state import init_learner_state, particle_keys
from outer_trainers.distributed.pbt import pbt_outer_train, pbt_reports
from outer_trainers.distributed.worker import EstimatorWorker
from outer_trainers.distributed.worker_pool import WorkerPool, assign_estimators

__all__ = [
    "ray_outer_train", "RayWorkers", "pbt_outer_train", "pbt_reports", "connect_ray", "ray_connection", "worker_runtime_env",
    "RayConnectionError",
    "EstimatorWorker", "WorkerPool", "assign_estimators", "EvalActor", "EvalWorker", "EvalClient",
    "init_learner_state",
    "particle_keys",
]
