"""pbt_outer_train: population-based training of outer hyper-parameters with Ray Tune.

    results = pbt_outer_train(make_run, param_space={"outer_lr": 0.1, "std": 0.01},
                              hyperparam_mutations={"outer_lr": [0.01, 0.03, 0.1, 0.3]},
                              num_trials=4, num_steps=1000, perturbation_interval=50,
                              storage_path="runs/pbt")

Each Tune trial meta-trains its own theta with `outer_train` on `make_run(config)` (a picklable
`make_run(config) -> (GradientLearner, [GradientEstimator, ...])`: the config's outer learning
rate, σ, truncation length, ... are whatever the factory reads). Every `perturbation_interval`
outer steps it reports its metrics ("meta_loss": the mean over the interval, or the metrics of
`make_evaluator(config)()` when given) and a `tune.Checkpoint`: a directory holding one lopt
checkpoint file (outer_trainers.runs.checkpoint_files; checksummed msgpack, never pickle) with theta, the
outer optimizer state, the key and the step. Ray Tune's `PopulationBasedTraining` scheduler does
the rest: exploit restarts a weak trial from a strong trial's checkpoint, explore perturbs the
copied hyper-parameters. A restored trial keeps theta, the outer optimizer state and the step and
starts fresh particles (the estimators' states are not part of the checkpoint, as after a worker
restart), so a new σ or truncation length takes effect at once. Each report carries
"lopt_trial_id" (the reporting trial's id), "restored_from" (the id of the trial whose checkpoint
this trial last started from; "" for none: another trial's id means an exploit)
and the config's values under "config/<name>", so exploits and explores can be read off the
results. Every report is also appended to lopt's own log, `<experiment>/lopt_reports/<trial
id>.jsonl`, which `pbt_reports` reads: Ray Tune's per-trial result.json (and hence
`ResultGrid.metrics_dataframe`) can lose the reports of a trial that PBT restarts from another
trial's checkpoint (seen with Ray 2.60), so lineage is read from lopt's log. On a multi-node
cluster `storage_path` must be a filesystem every node shares (as Ray Tune requires).
"""
from __future__ import annotations

import glob
import json
import os
import tempfile
import zlib
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from outer_trainers.runs.checkpoint_manager import CheckpointManager
from outer_trainers.distributed.cluster import connect_ray, import_ray
from outer_trainers.learner.outer_train import OuterTrainState, init_outer_state, outer_train
from outer_trainers.learner.run_settings import Reporting

PBT_CHECKPOINT_ORIGIN = "trial_id"
REPORTS_DIR = "lopt_reports"


def _learner_only(state: OuterTrainState) -> OuterTrainState:
    return state.replace(estimator_states=())


def _restore(directory: str, learner, estimators, key) -> tuple[OuterTrainState, str]:
    """The state in a PBT checkpoint directory (fresh particles), and the id of the trial that wrote it."""
    template = jax.eval_shape(lambda k: OuterTrainState(learner.init(k), (), k, jnp.zeros((), jnp.int32)), key)
    restored = CheckpointManager(directory).restore_latest(template)
    if restored is None:
        raise ValueError(f"the Tune checkpoint {directory} holds no lopt checkpoint")
    state, payload = restored
    k_est = jax.random.fold_in(key, state.step)
    keys = jax.random.split(k_est, len(estimators))
    est_states = tuple(e.init_state(state.theta, k, outer_state=state.step) for e, k in zip(estimators, keys))
    return state.replace(estimator_states=est_states), str(payload["meta"].get(PBT_CHECKPOINT_ORIGIN, ""))


def pbt_trainable(config: dict, *, make_run: Callable[[dict], tuple], num_steps: int, perturbation_interval: int,
                  seed: int = 0, make_evaluator: Optional[Callable[[dict], Callable]] = None,
                  reports_dir: Optional[str] = None) -> None:
    """The Tune function trainable of `pbt_outer_train`: one trial's outer training, reported per interval.

    Args:
        config: the trial's hyper-parameters (as Tune passes them).
        make_run: picklable `make_run(config) -> (GradientLearner, [GradientEstimator, ...])`.
        num_steps: outer steps in total.
        perturbation_interval: outer steps between reports (and checkpoints).
        seed: base seed; each trial folds its trial id in.
        make_evaluator: picklable `make_evaluator(config) -> factory`, `factory() -> evaluator`, whose
            `evaluator(theta)` metrics join each report; None: none.
        reports_dir: where each report is also appended, as one JSON line, to `<trial id>.jsonl`
            (`pbt_reports` reads them); None: nowhere.
    """
    from ray import tune
    learner, estimators = make_run(config)
    estimators = list(estimators)
    trial_id = tune.get_context().get_trial_id() or "trial"
    key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(trial_id.encode()) & 0x7FFFFFFF)
    evaluator = make_evaluator(config)() if make_evaluator is not None else None
    restored_from = ""
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state, restored_from = _restore(d, learner, estimators, key)
    else:
        state = init_outer_state(learner, estimators, key)
    while state.step < num_steps:
        losses = []
        n = min(perturbation_interval, num_steps - state.step)
        state = outer_train(learner, estimators, n, state=state,
                            reporting=Reporting(progress=False, tensorboard=False),
                            callback=lambda step, st, m: losses.append(m["meta_loss"]))
        finite = [x for x in losses if np.isfinite(x)]
        metrics = {"step": state.step, "meta_loss": float(np.mean(finite)) if finite else float("nan"),
                   "theta_norm": float(jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree_util.tree_leaves(state.theta)))),
                   "restored_from": restored_from, "lopt_trial_id": trial_id}
        metrics.update({f"config/{k}": v for k, v in config.items() if isinstance(v, (int, float, str))})
        if evaluator is not None:
            metrics.update(evaluator(state.theta))
        if reports_dir is not None:  # before Tune sees the report: PBT may stop this trial right after it
            os.makedirs(reports_dir, exist_ok=True)
            with open(os.path.join(reports_dir, f"{trial_id}.jsonl"), "a") as f:
                f.write(json.dumps({k: _json_value(v) for k, v in metrics.items()}) + "\n")
        with tempfile.TemporaryDirectory() as d:
            CheckpointManager(d).save(state.step, _learner_only(state),
                                      {PBT_CHECKPOINT_ORIGIN: trial_id, "config": _jsonable(config)})
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


def _json_value(v: Any) -> Any:
    return float(v) if isinstance(v, (np.floating, jax.Array, np.ndarray)) else (int(v) if isinstance(v, np.integer) else v)


def pbt_reports(experiment_path: str) -> list:
    """Every report of every trial of a `pbt_outer_train` experiment, from lopt's own log.

    Args:
        experiment_path: the experiment's directory, `storage_path/name` (a ResultGrid's
            `experiment_path`).

    Returns:
        list of dicts (the reported metrics: "step", "meta_loss", "lopt_trial_id", "restored_from",
        "config/<name>", ...), sorted by trial id, then step, then the order written. A report of a
        trial whose "restored_from" is another trial's id is a report after an exploit.

    Raises:
        FileNotFoundError: the directory holds no lopt report log.
    """
    files = sorted(glob.glob(os.path.join(experiment_path, REPORTS_DIR, "*.jsonl")))
    if not files:
        raise FileNotFoundError(f"no lopt PBT reports under {os.path.join(experiment_path, REPORTS_DIR)}")
    rows = []
    for path in files:
        with open(path) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return sorted(rows, key=lambda r: (str(r.get("lopt_trial_id", "")), r.get("step", 0)))  # stable: written order kept


def _jsonable(config: dict) -> dict:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in config.items()}


def pbt_outer_train(make_run: Callable[[dict], tuple], param_space: dict, hyperparam_mutations: dict, *,
                    num_trials: int, num_steps: int, perturbation_interval: int, storage_path: str,
                    name: str = "pbt", metric: str = "meta_loss", mode: str = "min", seed: int = 0,
                    quantile_fraction: float = 0.25, resample_probability: float = 0.25, synch: bool = True,
                    make_evaluator: Optional[Callable[[dict], Callable]] = None, cpus_per_trial: float = 1,
                    ray_address: Optional[str] = None, num_cpus: Optional[int] = None) -> Any:
    """Population-based training of outer hyper-parameters with Ray Tune's PopulationBasedTraining.

    Args:
        make_run: picklable `make_run(config) -> (GradientLearner, [GradientEstimator, ...])`.
        param_space: the trials' initial config (values or Tune search spaces, e.g. `tune.choice`).
        hyperparam_mutations: what explore may change: {name: list of values, or a Tune distribution}.
        num_trials: samples drawn from `param_space` (Tune's `num_samples`; a `tune.grid_search` in it
            multiplies them): the population size.
        num_steps: outer steps per trial.
        perturbation_interval: outer steps between reports, checkpoints and PBT decisions.
        storage_path: where Tune keeps results and checkpoints (a local directory).
        name: the Tune experiment's name (a subdirectory of `storage_path`).
        metric: the reported metric PBT ranks trials by ("meta_loss", or one of the evaluator's).
        mode: "min" or "max".
        seed: base seed (each trial folds in its trial id).
        quantile_fraction: the fraction of trials in the bottom (exploiting) and top (exploited) quantiles.
        resample_probability: the probability that explore resamples a value instead of perturbing it.
        synch: synchronous PBT (all trials reach an interval before any exploits: reproducible decisions).
        make_evaluator: picklable `make_evaluator(config) -> factory`, `factory() -> evaluator` (e.g. of a
            MetaEvaluator), whose metrics join each report; None: none.
        cpus_per_trial: CPUs each trial reserves.
        ray_address: the Ray cluster (see `connect_ray`); None: this process's Ray, or a local instance.
        num_cpus: CPUs of a local Ray instance started here.

    Returns:
        Tune's ResultGrid (one Result per trial: its last metrics, `metrics_dataframe`, checkpoint);
        `pbt_reports(results.experiment_path)` gives every report, exploits included.

    Raises:
        ValueError: a bad argument, or `storage_path/name` already holds a PBT run.
    """
    if num_trials < 1:
        raise ValueError(f"num_trials must be >= 1, got {num_trials}")
    if perturbation_interval < 1 or num_steps < 1:
        raise ValueError(f"num_steps and perturbation_interval must be >= 1, got {num_steps}, {perturbation_interval}")
    if not hyperparam_mutations:
        raise ValueError("hyperparam_mutations must name at least one hyper-parameter to explore")
    reports_dir = os.path.join(os.path.abspath(storage_path), name, REPORTS_DIR)
    if os.path.exists(reports_dir):
        raise ValueError(f"{os.path.dirname(reports_dir)} already holds a PBT run (its {REPORTS_DIR}/); give this run "
                         f"another name or storage_path")
    started = connect_ray(ray_address, num_cpus=num_cpus)
    ray = import_ray()
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    try:
        scheduler = PopulationBasedTraining(time_attr="step", perturbation_interval=perturbation_interval,
                                            hyperparam_mutations=hyperparam_mutations,
                                            quantile_fraction=quantile_fraction,
                                            resample_probability=resample_probability, synch=synch)
        trainable = tune.with_parameters(pbt_trainable, make_run=make_run, num_steps=num_steps,
                                         perturbation_interval=perturbation_interval, seed=seed,
                                         make_evaluator=make_evaluator,
                                         reports_dir=reports_dir)
        trainable = tune.with_resources(trainable, {"cpu": cpus_per_trial})
        tuner = tune.Tuner(trainable, param_space=param_space,
                           tune_config=tune.TuneConfig(scheduler=scheduler, num_samples=num_trials, metric=metric,
                                                       mode=mode, reuse_actors=False),
                           run_config=tune.RunConfig(name=name, storage_path=os.path.abspath(storage_path),
                                                     verbose=0,
                                                     checkpoint_config=tune.CheckpointConfig(num_to_keep=4)))
        return tuner.fit()
    finally:
        if started:
            ray.shutdown()
