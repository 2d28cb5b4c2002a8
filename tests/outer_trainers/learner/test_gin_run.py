"""learner.gin_run: `train` under its gin name, and GinRun rebuilt from gin text in a process that
has nothing from scripts/ (as a Ray worker is), or from the parsed config in the driver."""
import os
import pickle
import re
import subprocess
import sys

import gin
import jax
import pytest

import lopt
import outer_trainers as ot
from outer_trainers import gin_registry
from outer_trainers.distributed import RayWorkers
from outer_trainers.gin_registry import RENAMED_BINDINGS
from outer_trainers.learner import gin_run
from tests.fixtures import TINY_RUN_GIN

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                       "scripts", "configs")

TINY = TINY_RUN_GIN + "MetaEval.tasks = [@QuadraticFamily()]\n"


@pytest.fixture
def parsed():
    gin.clear_config()
    gin.parse_config(TINY)
    yield
    gin.clear_config()


def test_train_is_bound_by_its_gin_name(parsed):
    gin.parse_config("train.num_steps = 3")
    assert gin.query_parameter("train.num_steps") == 3
    assert "train.num_steps = 3" in gin.config_str()


def test_the_driver_builds_from_its_parsed_config(parsed):
    learner, ests = gin_run.GinRun("not gin text: never parsed where train is bound", copies=2)()
    assert isinstance(learner, ot.GradientLearner)
    assert [e.name for e in ests] == ["TruncatedPES(n=2,K=4)"] * 2
    assert ests[0].truncated_step is ests[1].truncated_step  # one step, copies of the estimator list


def test_workers_build_their_estimators_without_reading_theta_init(parsed, monkeypatch, tmp_path):
    """The learner's process reads theta_init once (`GinRun(..., built=...)`); a worker builds only estimators."""
    from outer_trainers.learner import meta_training_run
    lo = gin_run.GinRun(TINY)()[0].learned_opt
    path = str(tmp_path / "start.msgpack")
    lopt.save_theta(path, lo, lo.init(jax.random.key(1)))
    gin.parse_config(f"train.theta_init = '{path}'\ntrain.theta_ema = 0.9")
    built = gin_run.GinRun(TINY)()
    assert built[0].theta_init is not None and built[0].theta_ema == 0.9
    monkeypatch.setattr(meta_training_run, "load_theta_init", lambda *a, **k: pytest.fail("theta_init was read"))
    run = pickle.loads(pickle.dumps(gin_run.GinRun(TINY, copies=2, built=built)))
    assert run.built is None  # only the text travels
    assert [e.name for e in run.worker_estimators()] == ["TruncatedPES(n=2,K=4)"] * 2
    assert gin_run.GinRun(TINY, built=built)() is built


def test_the_evaluator_factory_reads_the_run_config(parsed):
    gin.parse_config("MetaEval.num_tasks = 2\nMetaEval.num_steps = 5\nMetaEval.seed = 3")
    evaluator = gin_run.GinEvaluator(gin_run.GinRun(TINY))()
    assert isinstance(evaluator, ot.learner.MetaEvaluator)
    assert evaluator.num_tasks == 2 and evaluator.num_steps == 5 and len(evaluator.families) == 1


def test_a_fresh_process_without_scripts_rebuilds_the_run_from_its_text(tmp_path):
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(gin_run.GinRun(TINY, copies=3)))
    code = ("import pickle, sys\n"
            "learner, ests = pickle.load(open(sys.argv[1], 'rb'))()\n"
            "print(type(learner).__name__, [e.name for e in ests], 'outer_train' in sys.modules,\n"
            "      any(p.rstrip('/').endswith('scripts') for p in sys.path))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[0] == f"GradientLearner {['TruncatedPES(n=2,K=4)'] * 3} False False"


# what runs started before the settings groups left out of their recorded config (their RESUME_SAFE)
OLD_RESUME_SAFE = ("train.num_steps", "train.max_consecutive_dropped", "train.progress", "train.log_every",
                   "train.tensorboard", "train.resume", "train.overwrite", "train.extend", "train.eval_",
                   "train.meta_eval_", "train.checkpoint", "train.keep_", "train.permanent_", "train.best_",
                   "train.num_workers", "train.max_staleness", "train.num_estimates_per_step", "train.validation_",
                   "Validation.", "Comparison.")  # settings only the groups have (Validation.objective,
# Comparison.adam_schedule) stay as written


@pytest.mark.parametrize("name", sorted(n[:-4] for n in os.listdir(CONFIGS) if n.endswith(".gin")))
def test_a_run_started_with_the_old_binding_names_resumes(name):
    """The bindings a checkpoint records (and a resume compares) are the same for a config written with the
    old `train.*` names as for the same config with the settings groups: every renamed binding is resume-safe."""
    new = open(os.path.join(CONFIGS, name + ".gin"), encoding="utf-8").read()
    old = new
    for before, after in RENAMED_BINDINGS.items():
        old = re.sub(r"^" + re.escape(after.split(" ")[0]) + r"(?=\s*=)", before, old, flags=re.MULTILINE)
    assert old != new or not gin_registry.renamed_bindings(new)
    assert gin_registry.renamed_bindings(old) or old == new
    assert gin_registry.gin_bindings(old, ignore=OLD_RESUME_SAFE) == gin_registry.gin_bindings(
        new, ignore=gin_run.RESUME_SAFE)


def test_every_settings_group_is_bound_by_its_name_and_left_out_of_resume_checks():
    gin.clear_config()
    try:
        gin.parse_config("MetaEval.every = 3\nComparison.num_tasks = 2\nReporting.progress = 'log'\n"
                         "CheckpointPolicy.keep = 5\nRayWorkers.max_staleness = 1\nValidation.every = 4\n"
                         "Validation.suite = 'smoke'")
        assert gin_run.configured(ot.learner.MetaEval) == ot.learner.MetaEval(every=3)
        assert gin_run.configured(ot.CheckpointPolicy).keep == 5
        assert gin_run.configured(ot.learner.Reporting).progress == "log"
        assert gin_run.configured(RayWorkers) == RayWorkers(max_staleness=1)
        assert gin_registry.gin_bindings(gin.config_str(), ignore=gin_run.RESUME_SAFE) == []
    finally:
        gin.clear_config()
