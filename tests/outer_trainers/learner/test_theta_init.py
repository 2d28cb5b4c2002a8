"""Starting meta-training from a meta-trained theta (`train.theta_init`, `meta_training_run.load_theta_init`):
from a theta file, a run's checkpoint or a shipped optimizer, exactly; a theta of another architecture or
config, an unknown name or a missing file refused, naming the cause; a resume with another start refused."""
import gin
import jax
import numpy as np
import optax
import pytest

import lopt
import lopt.pretrained
import outer_trainers as ot
import tasks
from outer_trainers.learner import gin_run
from outer_trainers.learner.meta_training_run import build_run, load_theta_init
from outer_trainers.runs.checkpoint_manager import CheckpointManager
from tests.fixtures import TINY_RUN_GIN


def _train(output_dir, extra=""):
    gin.clear_config()
    try:
        gin.parse_config(TINY_RUN_GIN + "Reporting.progress = False\nReporting.tensorboard = False\n" + extra)
        return gin_run.train(output_dir)  # the run's config is gin's: compared on resume, as from the script
    finally:
        gin.clear_config()


def test_a_theta_file_is_where_the_run_starts(tmp_path):
    saved = lopt.LearnableSGD(0.01)
    theta = {"log_lr": np.asarray(-1.5, np.float32)}
    path = str(tmp_path / "start.msgpack")
    lopt.save_theta(path, saved, theta)
    learner, _ = build_run(task_family=tasks.QuadraticFamily(dim=4), learned_opt=lopt.LearnableSGD(0.01),
                           trunc_sched=ot.ConstantTruncationSchedule(12),
                           estimators=[], outer_opt=optax.sgd(0.1), theta_init=path)
    state = learner.init(jax.random.key(0))
    np.testing.assert_array_equal(state.theta["log_lr"], theta["log_lr"])
    # the gin run starts there too: one outer step of sgd moves it by lr * grad, not from the fresh theta
    run = _train(str(tmp_path / "run"), f"train.num_steps = 1\ntrain.theta_init = '{path}'\n")
    assert abs(float(run.theta["log_lr"]) - (-1.5)) < 0.2
    assert abs(float(run.theta["log_lr"]) - float(np.log(0.01))) > 1.0


def test_a_checkpoint_of_another_run_and_a_shipped_optimizer(tmp_path):
    first = _train(str(tmp_path / "first"), "train.num_steps = 3\nCheckpointPolicy.every_steps = 1\n")
    ckpt = CheckpointManager(str(tmp_path / "first" / "checkpoints")).newest_readable()[0]
    theta = load_theta_init(ckpt, lopt.LearnableSGD(0.01))
    np.testing.assert_array_equal(theta["log_lr"], first.final_theta["log_lr"])
    name = lopt.pretrained.names()[0]
    record = lopt.pretrained.info(name)
    learned_opt = lopt.architecture(record["architecture"])(**record["config"])
    shipped = lopt.pretrained.load_learned_optimizer_by_name(name)[1]
    for a, b in zip(jax.tree_util.tree_leaves(load_theta_init(f"pretrained:{name}", learned_opt)),
                    jax.tree_util.tree_leaves(shipped)):
        np.testing.assert_array_equal(a, b)


def test_bad_starts_are_refused_naming_the_cause(tmp_path):
    path = str(tmp_path / "start.msgpack")
    lopt.save_theta(path, lopt.LearnableSGD(0.01), {"log_lr": np.asarray(-1.5, np.float32)})
    with pytest.raises(ValueError, match=r"config differs .* learning_rate \(0.01 there, 0.02 here\)"):
        load_theta_init(path, lopt.LearnableSGD(0.02))
    with pytest.raises(ValueError, match="is a theta of LearnableSGD, but the run meta-trains LearnableAdam"):
        load_theta_init(path, lopt.LearnableAdam())
    with pytest.raises(ValueError, match="no pretrained optimizer named 'nope'"):
        load_theta_init("pretrained:nope", lopt.LearnableSGD(0.01))
    with pytest.raises(ValueError, match="no such file"):
        load_theta_init(str(tmp_path / "missing.msgpack"), lopt.LearnableSGD(0.01))
    garbage = tmp_path / "garbage.msgpack"
    garbage.write_bytes(b"not msgpack")
    with pytest.raises(ValueError, match="neither a theta file .* nor an outer_train checkpoint"):
        load_theta_init(str(garbage), lopt.LearnableSGD(0.01))


def test_named_config_changes_are_allowed_and_shapes_still_checked(tmp_path):
    path = str(tmp_path / "start.msgpack")
    lopt.save_theta(path, lopt.LearnableSGD(0.01), {"log_lr": np.asarray(-1.5, np.float32)})
    theta = load_theta_init(path, lopt.LearnableSGD(0.02), changes=("learning_rate",))
    np.testing.assert_array_equal(theta["log_lr"], -1.5)
    with pytest.raises(ValueError, match=r"theta_init_changes names \['lr'\], not config fields of LearnableSGD"):
        load_theta_init(path, lopt.LearnableSGD(0.02), changes=("lr",))
    # a change that reshapes theta is refused even when named
    small = lopt.Celo2LOpt(hidden_size=4)
    lopt.save_theta(path, small, small.init(jax.random.key(0)))
    with pytest.raises(ValueError, match=r"train.theta_init_changes = \['hidden_size'\]\): theta does not match the structure"):
        load_theta_init(path, lopt.Celo2LOpt(hidden_size=8), changes=("hidden_size",))
    # through gin: the run starts from the file's theta under its own learning_rate
    lopt.save_theta(path, lopt.LearnableSGD(0.05), {"log_lr": np.asarray(-1.5, np.float32)})
    run = _train(str(tmp_path / "run"), f"train.num_steps = 1\ntrain.theta_init = '{path}'\n"
                 "train.theta_init_changes = ['learning_rate']\n")
    assert abs(float(run.theta["log_lr"]) - (-1.5)) < 0.2


def test_a_resume_with_another_start_is_refused(tmp_path):
    one, two = str(tmp_path / "one.msgpack"), str(tmp_path / "two.msgpack")
    lopt.save_theta(one, lopt.LearnableSGD(0.01), {"log_lr": np.asarray(-1.5, np.float32)})
    lopt.save_theta(two, lopt.LearnableSGD(0.01), {"log_lr": np.asarray(-2.5, np.float32)})
    run_dir = str(tmp_path / "run")
    _train(run_dir, f"train.num_steps = 2\nCheckpointPolicy.every_steps = 1\ntrain.theta_init = '{one}'\n")
    with pytest.raises(ValueError, match="theta_init"):
        _train(run_dir, f"train.num_steps = 4\ntrain.theta_init = '{two}'\n")
