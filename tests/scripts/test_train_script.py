"""scripts/train.py: one model trained from a gin config (Adam, or a learned optimizer), resume, errors."""
import json
import os
import subprocess
import sys

import gin
import jax
import numpy as np
import optax
import pytest

import lopt
import tasks
from outer_trainers.runs.summaries import read_event_scalars
from tests.fixtures import metrics_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "train.py")
CONFIGS = {name: os.path.join(ROOT, "scripts", "configs", f"train_digits_{name}.gin") for name in ("adam", "mlplopt")}
SMALL = ["ImageMLPTask.hidden_sizes = (8,)", "ImageMLPTask.batch_size = 32", "fit.num_steps = 6",
         "EvalPlan.every = 3", "fit.log_every = 2", "CheckpointPolicy.every_steps = 2",
         "CheckpointPolicy.checkpoints_at = (3,)",
         "fit.ema_warmup_steps = 2", "fit.progress = False"]


@pytest.fixture
def main():
    import train  # scripts/ is on sys.path (tests/conftest.py)
    gin.clear_config()
    yield lambda config, out, *params: train.main(["--gin_file", config, "--output_dir", str(out)] +
                                                 [a for p in SMALL + list(params) for a in ("--gin_param", p)])
    gin.clear_config()


def test_help_lists_the_flags():
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "--gin_file" in r.stdout and "--output_dir" in r.stdout and "fit." in r.stdout


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_configs_bind_a_task_and_an_optimizer(name):
    import train
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings([CONFIGS[name]], [])
        build = lambda p: gin.query_parameter(p).scoped_configurable_fn()
        assert isinstance(build("fit.task"), tasks.ImageMLPTask)
        tx = build("fit.optimizer")
        assert isinstance(tx, optax.GradientTransformationExtraArgs if name == "mlplopt" else
                          optax.GradientTransformation)
    finally:
        gin.clear_config()


@pytest.mark.slow
def test_adam_run_writes_metrics_tensorboard_checkpoints_and_result_and_resumes(main, tmp_path):
    out = tmp_path / "run"
    result = main(CONFIGS["adam"], out)
    lines = metrics_lines(out)
    assert [line["step"] for line in lines] == [0, 2, 3, 4, 6]
    assert {"eval/test/accuracy", "eval_ema/outer_valid/loss"} <= set(lines[2])
    assert "train/examples_per_s_per_device" in lines[1]
    assert {"train/loss", "eval/outer_valid/loss"} <= set(read_event_scalars(str(out / "tb")))
    ck = out / "checkpoints"
    assert sorted(os.listdir(ck / "permanent")) == ["ckpt_00000003.msgpack"]
    assert sorted(p for p in os.listdir(ck) if p.endswith(".msgpack")) == ["ckpt_00000004.msgpack",
                                                                          "ckpt_00000006.msgpack"]
    assert os.listdir(ck / "best")  # by eval/outer_valid/loss
    summary = json.loads((out / "result.json").read_text())
    assert summary["eval/test/loss"] == pytest.approx(result.eval_loss) and summary["num_steps"] == 6
    assert "fit.num_steps = 6" in (out / "config.gin").read_text()
    gin.clear_config()
    again = main(CONFIGS["adam"], out, "fit.log_every = 3")  # a finished run: resumes at its end, logging may change
    np.testing.assert_array_equal(again.losses, result.losses)
    gin.clear_config()
    config_gin = (out / "config.gin").read_text()
    with pytest.raises(ValueError, match=r"only here: \['adam.learning_rate = 0.1'\]"):
        main(CONFIGS["adam"], out, "optax.adam.learning_rate = 0.1")
    assert (out / "config.gin").read_text() == config_gin  # a refused resume does not write its config


@pytest.mark.slow
def test_a_fresh_learned_optimizer_trains_through_the_script(main, tmp_path):
    result = main(CONFIGS["mlplopt"], tmp_path / "run", "learned_optimizer.num_steps = 6")
    assert np.all(np.isfinite(result.losses)) and result.state.opt_state is not None
    assert json.loads((tmp_path / "run" / "result.json").read_text())["eval/test/accuracy"] >= 0.0


def test_learned_optimizer_loads_a_theta_file_or_inits(tmp_path):
    import train
    lo = lopt.LearnableSGD(0.1)
    theta = jax.tree_util.tree_map(lambda x: x * 3.0, lo.init(jax.random.key(0)))
    path = str(tmp_path / "theta.msgpack")
    lopt.save_theta(path, lo, theta)
    grads = {"w": np.ones(3, np.float32)}
    update = lambda tx: tx.update(grads, tx.init(grads), grads, loss=0.0)[0]["w"]
    np.testing.assert_allclose(update(train.learned_optimizer(lo, theta_path=path)), update(lo.opt_fn(theta)))
    np.testing.assert_allclose(update(train.learned_optimizer(lo)), update(lo.opt_fn(lo.init(jax.random.key(0)))))
    with pytest.raises(ValueError, match="holds theta of LearnableSGD"):
        train.learned_optimizer(lopt.LearnableAdam(), theta_path=path)


def test_an_unknown_binding_exits_with_status_2(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "--gin_file", CONFIGS["adam"], "--output_dir", str(tmp_path / "o"),
                        "--gin_param", "fit.eval_everyy = 3"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "eval_everyy" in r.stderr
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_extend_trains_a_run_further_with_the_new_horizon(main, tmp_path):
    """A 6-step run of a (fresh) learned optimizer told its horizon, extended to 8 steps with the horizon
    rebound: refused without --extend (changing nothing, config.gin included), recorded with it."""
    from outer_trainers.runs.run_checkpoints import config_history
    out = tmp_path / "run"
    first = main(CONFIGS["mlplopt"], out, "learned_optimizer.num_steps = 6")
    files = lambda: {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    before = files()
    longer = ("fit.num_steps = 8", "learned_optimizer.num_steps = 8")
    gin.clear_config()
    with pytest.raises(ValueError, match=r"num_steps \(saved 6, here 8\).*--extend"):
        main(CONFIGS["mlplopt"], out, *longer)
    assert files() == before
    gin.clear_config()
    import train
    result = train.main(["--gin_file", CONFIGS["mlplopt"], "--output_dir", str(out), "--extend"] +
                        [a for p in SMALL + list(longer) for a in ("--gin_param", p)])
    assert result.losses.shape == (8,) and np.all(np.isfinite(result.losses))
    np.testing.assert_array_equal(result.losses[:6], first.losses)
    [entry] = config_history(str(out))
    assert (entry["from_steps"], entry["to_steps"], entry["at_step"]) == (6, 8, 6)
    assert "learned_optimizer.num_steps = 8" in " ".join(entry["changed"])
    assert json.loads((out / "result.json").read_text())["num_steps"] == 8
    assert "fit.num_steps = 8" in (out / "config.gin").read_text()
