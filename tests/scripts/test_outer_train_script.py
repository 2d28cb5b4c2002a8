"""The gin-configured entry point: quickstart end to end (short), and its error paths."""
import math
import os
import subprocess
import sys

import gin
import jax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.runs.run_checkpoints import config_history
from tests.fixtures import metrics_lines, TINY_RUN_GIN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "outer_train.py")
QUICKSTART = os.path.join(ROOT, "scripts", "configs", "quickstart.gin")


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.slow
def test_quickstart_runs_with_overridden_steps(tmp_path):
    out = tmp_path / "run"
    r = _run("--gin_file", QUICKSTART, "--output_dir", str(out),
             "--gin_param", "train.num_steps = 3", "--gin_param", "Comparison.num_steps = 20",
             "--gin_param", "Comparison.num_tasks = 2")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = metrics_lines(out)
    assert [l["step"] for l in lines] == [1, 2, 3]
    lo, theta = lopt.load_learned_optimizer(str(out / "theta_final.msgpack"))
    assert isinstance(lo, lopt.NormMLPLOpt) and lo.schedule == "cosine" and lo.relative_step
    # the quickstart averages theta (train.theta_ema): theta_final is the average, theta_last the last theta
    assert "train.theta_ema = 0.995" in (out / "config.gin").read_text()
    _, last = lopt.load_learned_optimizer(str(out / "theta_last.msgpack"))
    assert jax.tree_util.tree_structure(last) == jax.tree_util.tree_structure(theta)
    # README's quickstart: meta-trained for the held-out loss at the end of training, Adam on warm-up + cosine
    config = (out / "config.gin").read_text()
    assert "train.meta_loss_split = 'outer_valid'" in config and "train.meta_loss_end_power = 3.0" in config
    table = (out / "comparison.md").read_text()
    assert "| learned |" in table and "(best Adam)" in table
    assert "Adam: a linear warm-up from 0 over 1 steps, then cosine decay to 0 at step 20;" in table
    assert "| adam:cosine(lr=" in table and "| adam(lr=" not in table
    assert "| learned |" in r.stdout
    assert "train.num_steps = 3" in (out / "config.gin").read_text()
    # piped, not a terminal: plain progress lines (at least the last step's), no carriage-return bar redraws
    assert "\r" not in r.stderr and "step 3/3 " in r.stderr


def test_unknown_gin_binding_fails_before_compiling(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text(open(QUICKSTART).read() + "\nTruncatedPES.stdd = 0.1\n")
    r = _run("--gin_file", str(bad), "--output_dir", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "stdd" in r.stderr and "bad.gin" in r.stderr
    assert not (tmp_path / "o").exists() or not os.listdir(tmp_path / "o")  # nothing written


def test_unknown_configurable_name(tmp_path):
    r = _run("--gin_file", QUICKSTART, "--output_dir", str(tmp_path / "o"),
             "--gin_param", "train.learned_opt = @NoSuchLOpt()")
    assert r.returncode == 2
    assert "NoSuchLOpt" in r.stderr


def test_a_renamed_binding_is_refused_naming_its_new_name(tmp_path):
    """A gin file written before the settings groups (e.g. an old run's config.gin) fails at once, before
    anything is built, naming each binding's new name."""
    old = tmp_path / "config.gin"
    old.write_text(open(QUICKSTART).read() + "\ntrain.checkpoint_every_steps = 10\ntrain.progress = 'log'\n")
    r = _run("--gin_file", str(old), "--output_dir", str(tmp_path / "o"), "--gin_param", "train.meta_eval_every = 5")
    assert r.returncode == 2
    assert "train.checkpoint_every_steps is now CheckpointPolicy.every_steps" in r.stderr
    assert "train.progress is now Reporting.progress" in r.stderr
    assert "train.meta_eval_every is now MetaEval.every" in r.stderr and "--gin_param" in r.stderr
    assert not (tmp_path / "o").exists()


def test_missing_gin_file(tmp_path):
    r = _run("--gin_file", str(tmp_path / "nope.gin"), "--output_dir", str(tmp_path / "o"))
    assert r.returncode != 0 and "nope.gin" in r.stderr


# ---- configs, resume through the script ------------------------------------------------------------

CONFIGS = ["quickstart", "pes_mlplopt_image_mlp", "adafac_fashion_mnist", "nres"]


@pytest.mark.parametrize("name", CONFIGS)
def test_config_parses_and_binds(name):
    import outer_train  # noqa: F401  (scripts/ is on sys.path via conftest; registers train)
    gin.clear_config()
    try:
        gin.parse_config_files_and_bindings([os.path.join(ROOT, "scripts", "configs", f"{name}.gin")], [])
        build = lambda p: gin.query_parameter(p).scoped_configurable_fn()
        assert isinstance(build("train.learned_opt"), lopt.LearnedOptimizer)
        assert isinstance(build("train.trunc_sched"), ot.TruncationSchedule)
        assert hasattr(build("train.outer_opt"), "update")
        for ref in gin.query_parameter("train.estimators"):
            assert issubclass(ref.configurable.wrapped, ot.GradientEstimator)
        family = build("train.task_family")  # reads no dataset file: runs without Fashion-MNIST too
        assert isinstance(family, tasks.TaskFamily)
        assert family.dataset == gin.query_parameter("ImageMLPFamily.dataset")
    finally:
        gin.clear_config()


TINY = TINY_RUN_GIN + """TruncatedPES.std = 0.05
Reporting.progress = False
CheckpointPolicy.every_steps = 1
"""


def test_rerun_resumes_and_a_changed_config_is_refused(tmp_path):
    import outer_train
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY)
    out = str(tmp_path / "run")
    run = lambda *params: outer_train.main(["--gin_file", str(cfg), "--output_dir", out] +
                                           [a for p in params for a in ("--gin_param", p)])
    try:
        gin.clear_config()
        assert run("train.num_steps = 2").step == 2
        gin.clear_config()
        assert run("train.num_steps = 4").step == 4  # run length may change: resumes at 2
        assert [l["step"] for l in metrics_lines(out)] == [1, 2, 3, 4]
        assert os.path.exists(os.path.join(out, "tb"))
        gin.clear_config()
        config_gin = open(os.path.join(out, "config.gin")).read()
        assert "train.num_steps = 4" in config_gin
        with pytest.raises(ValueError, match=r"only in checkpoint: \['TruncatedPES.std = 0.05'\]"):
            run("train.num_steps = 5", "TruncatedPES.std = 0.1")
        assert open(os.path.join(out, "config.gin")).read() == config_gin  # the refused config is not written
    finally:
        gin.clear_config()


def _old_run(out):
    """A directory with an earlier run's results in it (as lopt names them) and a file of the user's."""
    (out / "tb").mkdir(parents=True)
    for name in ("metrics.jsonl", "config.gin", "comparison.md", "theta_final.msgpack", "tb/events", "notes.txt"):
        (out / name).write_text(f"old {name}")
    return {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_a_new_run_over_results_is_refused(tmp_path):
    import outer_train
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    before = _old_run(out)
    try:
        for resume in ("True", "False"):  # no checkpoint to resume from, or a new run asked for
            gin.clear_config()
            with pytest.raises(ot.ExistingRunError,
                               match=r"\(comparison.md, config.gin, metrics.jsonl, tb, theta_final.msgpack\).*"
                                     r"--overwrite"):
                outer_train.main(["--gin_file", str(cfg), "--output_dir", str(out), "--gin_param",
                                  f"train.resume = {resume}"])
            assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    finally:
        gin.clear_config()


@pytest.mark.slow
def test_overwrite_starts_a_new_run_over_results(tmp_path):
    import outer_train
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    _old_run(out)
    try:
        gin.clear_config()
        state = outer_train.main(["--gin_file", str(cfg), "--output_dir", str(out), "--overwrite",
                                  "--gin_param", "train.num_steps = 1"])
        assert state.step == 1
        assert [l["step"] for l in metrics_lines(out)] == [1]
        assert "train.num_steps = 1" in (out / "config.gin").read_text()
        assert not (out / "comparison.md").exists() and (out / "notes.txt").read_text() == "old notes.txt"
        lopt.load_theta(str(out / "theta_final.msgpack"))
    finally:
        gin.clear_config()


def test_a_comparison_needs_inner_steps(tmp_path):
    import outer_train
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY)
    out = tmp_path / "run"
    try:
        gin.clear_config()
        with pytest.raises(ValueError, match=r"Comparison.num_steps >= 1.*got num_steps=0"):
            outer_train.main(["--gin_file", str(cfg), "--output_dir", str(out), "--gin_param", "train.num_steps = 1",
                              "--gin_param", "Comparison.num_tasks = 2", "--gin_param", "Comparison.num_steps = 0"])
        assert not out.exists()  # refused before anything was trained or written
    finally:
        gin.clear_config()


# ---- many machines: Ray workers through the script ---------------------------------------------------

RAY_ENV = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # a loopback-only local Ray instance


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # with the other Ray runs, never beside a Ray cluster of theirs
def test_ray_workers_give_the_local_runs_theta(tmp_path):
    """`train.num_workers = 2` with one estimator: each worker gets a copy; synchronous mode equals the local
    run of the same config with the estimator listed twice."""
    import outer_train
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY)
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, SCRIPT, "--gin_file", str(cfg), "--output_dir", str(dist),
                        "--gin_param", "train.num_steps = 3", "--gin_param", "train.num_workers = 2"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=RAY_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = metrics_lines(dist)
    assert [l["step"] for l in lines] == [1, 2, 3]
    assert lines[-1]["lost_estimates_total"] == 0 and "staleness/max" in lines[-1]
    assert "train.num_workers = 2" in (dist / "config.gin").read_text()
    try:
        gin.clear_config()
        local = outer_train.main(["--gin_file", str(cfg), "--output_dir", str(tmp_path / "local"),
                                  "--gin_param", "train.num_steps = 3",
                                  "--gin_param", "train.estimators = [@TruncatedPES, @TruncatedPES]"])
    finally:
        gin.clear_config()
    _, theta = lopt.load_learned_optimizer(str(dist / "theta_final.msgpack"))
    assert abs(float(theta["log_lr"]) - float(local.theta["log_lr"])) < 1e-5
    assert abs(float(theta["log_lr"]) - math.log(0.01)) > 1e-3  # theta moved


def test_bad_ray_address_fails_fast_naming_it(tmp_path):
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY)
    r = subprocess.run([sys.executable, SCRIPT, "--gin_file", str(cfg), "--output_dir", str(tmp_path / "o"),
                        "--ray_address", "127.0.0.1:9", "--gin_param", "train.num_workers = 2"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=RAY_ENV)
    assert r.returncode != 0
    assert "cannot reach a Ray cluster at --ray_address '127.0.0.1:9'" in r.stderr
    assert not (tmp_path / "o").exists() or not os.listdir(tmp_path / "o")  # nothing written


# ---- training a run further (--extend) -----------------------------------------------------------------

def test_extend_trains_a_run_further_and_its_outer_schedule_may_follow(tmp_path):
    """A 2-step run with an outer cosine decay over 2 steps, extended to 4 (its decay_steps rebound to 4): a
    changed horizon binding needs --extend, fewer steps than taken are refused, refusals change nothing."""
    import outer_train
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY.replace("optax.adam.learning_rate = 0.05",
                                "optax.adam.learning_rate = @optax.cosine_decay_schedule()\n"
                                "optax.cosine_decay_schedule.init_value = 0.05"))
    out = tmp_path / "run"
    files = lambda: {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def run(steps, decay, *flags):
        gin.clear_config()
        return outer_train.main(["--gin_file", str(cfg), "--output_dir", str(out), *flags,
                                 "--gin_param", f"train.num_steps = {steps}",
                                 "--gin_param", f"optax.cosine_decay_schedule.decay_steps = {decay}"])
    try:
        assert run(2, 2).step == 2
        before = files()
        with pytest.raises(ValueError, match=r"only here: \['cosine_decay_schedule.decay_steps = 4'\].*"
                                             r"--extend"):
            run(4, 4)
        with pytest.raises(ValueError, match="to num_steps=1: it has already taken 2 steps"):
            run(1, 2, "--extend")
        assert files() == before  # config.gin included
        assert run(4, 4, "--extend").step == 4
        [entry] = config_history(str(out))
        assert (entry["from_steps"], entry["to_steps"], entry["at_step"]) == (2, 4, 2)
        assert "decay_steps = 4" in entry["changed"][0]
        assert [l["step"] for l in metrics_lines(out)] == [1, 2, 3, 4]
        assert "train.num_steps = 4" in (out / "config.gin").read_text()
    finally:
        gin.clear_config()


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # with the other Ray runs, never beside a Ray cluster of theirs
def test_ray_workers_extend_a_run(tmp_path):
    cfg = tmp_path / "tiny.gin"
    cfg.write_text(TINY)
    out = tmp_path / "dist"
    run = lambda steps, *flags: subprocess.run(
        [sys.executable, SCRIPT, "--gin_file", str(cfg), "--output_dir", str(out), *flags, "--gin_param",
         f"train.num_steps = {steps}", "--gin_param", "train.num_workers = 1"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=RAY_ENV)
    for steps, flags in ((2, ()), (4, ("--extend",))):
        r = run(steps, *flags)
        assert r.returncode == 0, r.stderr[-3000:]
    assert [l["step"] for l in metrics_lines(out)] == [1, 2, 3, 4]
    assert [(e["from_steps"], e["to_steps"], e["at_step"]) for e in config_history(str(out))] == [(2, 4, 2)]
