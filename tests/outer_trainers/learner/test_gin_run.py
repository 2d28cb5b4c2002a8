"""learner.gin_run: `train` under its gin name, and GinRun rebuilt from gin text in a process that
has nothing from scripts/ (as a Ray worker is), or from the parsed config in the driver."""
import os
import pickle
import subprocess
import sys

import gin
import pytest

import outer_trainers as ot
from outer_trainers.learner import gin_run
from tests.fixtures import TINY_RUN_GIN

TINY = TINY_RUN_GIN + "train.meta_eval_tasks = [@QuadraticFamily()]\n"


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


def test_the_evaluator_factory_reads_the_run_config(parsed):
    evaluator = gin_run.GinEvaluator(gin_run.GinRun(TINY), num_tasks=2, num_steps=5, seed=3)()
    assert isinstance(evaluator, ot.MetaEvaluator)
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
