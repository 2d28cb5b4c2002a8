"""learner.meta_training_run: the steps of one run, each on its own (the whole run: tests/scripts/test_outer_train_script.py)."""
import ast
import os

import optax
import pytest

import lopt
import outer_trainers as ot
from outer_trainers.learner import meta_training_run as M
from outer_trainers.learner.run_records import run_metadata
from tests.fixtures import lopt_step


@pytest.mark.parametrize("workers,estimators,copies", [(0, 3, 1), (1, 3, 1), (3, 3, 1), (4, 3, 2), (7, 2, 4),
                                                       (2, 0, 1)])
def test_worker_copies_give_every_worker_an_estimator(workers, estimators, copies):
    assert M.worker_copies(workers, estimators) == copies


def test_run_arguments_are_checked_naming_the_binding():
    M.check_run_arguments(num_workers=0)
    with pytest.raises(ValueError, match=r"train.num_workers must be >= 0"):
        M.check_run_arguments(num_workers=-2)
    with pytest.raises(ValueError, match=r"train.num_workers = 2 meta-trains on Ray workers.*RayWorkers"):
        M.check_run_arguments(num_workers=2)  # nothing to run the workers with


def test_the_learner_package_imports_nothing_of_distributed():
    """distributed/ builds on learner/ (RayWorkers is handed to `gin_run.train`), never the other way round."""
    root = os.path.join(os.path.dirname(ot.__file__), "learner")
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
            imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            assert not [m for m in imported if m.startswith("outer_trainers.distributed")], name
            with open(os.path.join(root, name), encoding="utf-8") as f:
                assert "ot.ray_outer_train" not in f.read(), name


def test_build_run_repeats_the_estimator_list_on_one_step():
    make = lambda step: ot.TruncatedPES(step, 2, 3)
    learner, ests = M.build_run(task_family=lopt_step(3).task_family, learned_opt=lopt.LearnableSGD(0.1),
                                trunc_sched=ot.ConstantTruncationSchedule(6), estimators=[make, make],
                                outer_opt=optax.adam(1e-3), meta_loss_end_power=2, copies=2)
    assert isinstance(learner, ot.GradientLearner) and len(ests) == 4
    assert len({id(e.truncated_step) for e in ests}) == 1
    assert ests[0].truncated_step.meta_loss_end_power == 2.0


def _old_run(out):
    out.mkdir()
    for name in ("metrics.jsonl", "config.gin", "comparison.md", "notes.txt"):
        (out / name).write_text(f"old {name}")
    return {p.name: p.read_text() for p in out.iterdir()}


def _meta():
    return run_metadata(ot.GradientLearner(lopt.LearnableSGD(0.1), optax.sgd(0.1)), ["est"])


def test_the_output_dir_check_refuses_without_writing_and_prepare_writes(tmp_path):
    out = tmp_path / "run"
    before = _old_run(out)
    with pytest.raises(ot.ExistingRunError, match="--overwrite"):
        M.check_output_dir(str(out), ot.CheckpointPolicy(), _meta(), resume=True, overwrite=False)
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    run, starts_new = M.check_output_dir(str(out), ot.CheckpointPolicy(), _meta(), resume=True, overwrite=True)
    assert starts_new and {p.name: p.read_text() for p in out.iterdir()} == before  # still nothing written
    M.prepare_output_dir(run, starts_new=starts_new, overwrite=True, config_text="train.num_steps = 1\n")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"config.gin": "train.num_steps = 1\n",
                                                              "notes.txt": "old notes.txt"}


def test_local_meta_training_calls_the_packages_outer_train(monkeypatch):
    """meta_train_locally looks `outer_train` up on the package when called (documented)."""
    seen = {}
    monkeypatch.setattr(ot, "outer_train", lambda *args, **kwargs: seen.update(args=args, kwargs=kwargs) or "state")
    assert M.meta_train_locally("learner", ["est"], 3, eval_every=2, seed=5) == "state"
    assert seen["args"] == ("learner", ["est"], 3)
    assert seen["kwargs"] == dict(weights=None, meta_evaluator=None, eval_every=2, seed=5)
