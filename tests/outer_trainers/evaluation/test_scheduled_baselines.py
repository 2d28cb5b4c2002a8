"""Scheduled baselines: optax's schedules over the step budget, the NAME[:SCHEDULE] spec syntax, and the
two-stage tuning of rate x weight decay x schedule with its grid extensions."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tasks
from outer_trainers.evaluation import baselines, best_runs, grid_edge, resolve_optimizer, task_draws
from outer_trainers.evaluation.baselines import grid_search
from outer_trainers.evaluation.task_plan import check_arguments


def test_warmup_steps_are_the_fraction_of_the_budget():
    assert baselines.warmup_steps(100) == 5 and baselines.warmup_steps(1000, 0.1) == 100
    assert baselines.warmup_steps(10, 0.0) == 0 and baselines.warmup_steps(1) == 0
    with pytest.raises(ValueError, match=r"warmup_fraction must be in \[0, 1\)"):
        baselines.warmup_steps(100, 1.0)


@pytest.mark.parametrize("num_steps, fraction", [(100, 0.05), (40, 0.1), (7, 0.0)])
def test_each_schedule_is_optaxs_for_that_budget(num_steps, fraction):
    lr, w = 0.3, baselines.warmup_steps(num_steps, fraction)
    ref = {"constant": optax.constant_schedule(lr),
           "cosine": optax.warmup_cosine_decay_schedule(0.0, lr, w, num_steps, end_value=0.0),
           "linear": optax.join_schedules([optax.linear_schedule(0.0, lr, w),
                                           optax.linear_schedule(lr, 0.0, num_steps - w)], [w])}
    counts = jnp.arange(num_steps + 1)
    # the schedule a traced index, as a grid over schedules runs it: one program for all three
    traced = jax.jit(jax.vmap(lambda i: baselines.scheduled_rate(i, lr, num_steps, fraction)(counts)))(jnp.arange(3))
    for name in baselines.SCHEDULES:
        got = baselines.lr_schedule(name, lr, num_steps, fraction)(counts)
        np.testing.assert_allclose(got, ref[name](counts), rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(traced[baselines.schedule_index(name)], got, rtol=1e-6, atol=1e-7, err_msg=name)


def test_the_schedules_in_numbers():
    cos, lin = (baselines.lr_schedule(n, 2.0, 100) for n in ("cosine", "linear"))  # W = 5
    assert float(cos(0)) == 0.0 and float(lin(0)) == 0.0  # the warm-up starts at 0
    np.testing.assert_allclose([cos(1), cos(5), cos(52.5), cos(100)], [0.4, 2.0, 1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose([lin(3), lin(5), lin(24), lin(100)], [1.2, 2.0, 2.0 * (1 - 19 / 95), 0.0], atol=1e-6)
    np.testing.assert_allclose(baselines.lr_schedule("constant", 2.0, 100)(77), 2.0)


@pytest.mark.parametrize("name", ["adam", "adamw", "sgdm"])
@pytest.mark.parametrize("schedule", baselines.SCHEDULES)
def test_a_scheduled_baselines_step_at_count_t_is_the_schedules_rate(name, schedule):
    """A constant gradient g: Adam's step is -lr_t sign(g), AdamW's -lr_t (sign(g) + wd p), SGD with momentum
    0.9's -lr_t g (1 - 0.9^(t+1)) / 0.1, lr_t optax's schedule at count t for the 20-step budget."""
    num_steps, lr, wd = 20, 0.1, 0.1
    tx = baselines.scheduled_baseline(name, num_steps)({"learning_rate": jnp.float32(lr), "weight_decay": jnp.float32(wd),
                                                        "schedule": jnp.int32(baselines.schedule_index(schedule))})
    ref = baselines.lr_schedule(schedule, lr, num_steps)
    params, g = {"w": jnp.asarray([1.0, -3.0])}, {"w": jnp.asarray([0.5, 0.25])}
    state = tx.init(params)
    for t in range(num_steps):
        updates, state = tx.update(g, state, params)
        rate = float(ref(t))
        if name == "sgdm":
            want = -rate * g["w"] * (1 - 0.9 ** (t + 1)) / 0.1
        else:
            want = -rate * (jnp.sign(g["w"]) + (wd * params["w"] if name == "adamw" else 0.0))
        np.testing.assert_allclose(updates["w"], want, rtol=1e-4, atol=1e-7, err_msg=f"{name} {schedule} t={t}")
        params = optax.apply_updates(params, updates)


def test_specs_name_a_baseline_and_its_schedule():
    assert baselines.parse_baseline("adam") == ("adam", "constant")  # a bare name: a constant rate, as before
    assert baselines.parse_baseline("adam:constant") == ("adam", "constant")
    assert baselines.parse_baseline("adamw:cosine") == ("adamw", "cosine")
    assert baselines.parse_baseline("sgdm:linear") == ("sgdm", "linear")
    assert baselines.parse_baseline("muon:tuned") == ("muon", "tuned")
    assert "adamw:cosine" in baselines.baseline_specs() and "adam" in baselines.baseline_specs()
    with pytest.raises(ValueError, match=r"unknown schedule 'cosin' .*'constant', 'cosine', 'linear', 'tuned'"):
        baselines.parse_baseline("adamw:cosin")
    with pytest.raises(ValueError, match=r"unknown baseline 'adamx' .*\['adam', 'adamw', 'muon', 'sgdm'\]"):
        baselines.parse_baseline("adamx:cosine")
    with pytest.raises(ValueError, match=r"unknown schedule '' "):
        baselines.parse_baseline("adam:")
    assert resolve_optimizer("adamw:cosine", "adamw:cosine")["kind"] == "baseline"
    with pytest.raises(ValueError, match=r"--optimizer unknown schedule 'warm'.*the schedules are"):
        resolve_optimizer("adamw:warm", "x")


def test_an_evaluation_with_an_unknown_schedule_stops_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"unknown baselines \['sgdm:warm'\] \(--baselines\): unknown schedule 'warm' in "
                                         r"baseline 'sgdm:warm'.*'constant', 'cosine', 'linear', 'tuned'"):
        check_arguments(str(tmp_path), ["adam"], None, [tasks.QuadraticFamily(dim=2)], 5, 1, ["adam", "sgdm:warm"],
                        {}, 0.9, "test")


_NO_DATA = types.SimpleNamespace(data=None)


def _fake_trainer(calls):
    """A make_task_trainer stand-in: the validation loss of (lr, wd) is (log10 lr + 1)^2 + (log10 wd - 1)^2 / 4
    (best lr 0.1, best decay 10; 3 for no decay), plus 0.01 x the seed index, plus 0.5 for the cosine schedule."""
    def make(family, make_tx, num_steps, **kwargs):
        def trainer(args, cfgs, keys, data):
            lr, wd = np.asarray(args["learning_rate"], np.float64), np.asarray(args["weight_decay"], np.float64)
            calls.append((len(lr), keys.shape[0]))
            score = (np.log10(lr) + 1) ** 2 + np.where(wd > 0, (np.log10(np.maximum(wd, 1e-30)) - 1) ** 2 / 4, 3.0)
            score = score + 0.5 * (np.asarray(args["schedule"]) == baselines.schedule_index("cosine"))
            valids = score[:, None] + 0.01 * np.arange(keys.shape[0])[None, :]
            return {"losses": np.repeat(valids[..., None], num_steps, -1), "evals": valids, "valids": valids,
                    "valid_curve": valids[..., None]}
        return trainer
    return make


def test_the_grid_is_extended_on_the_rate_and_the_decay_axes_through_the_best_point(monkeypatch):
    calls = []
    monkeypatch.setattr(grid_search, "make_task_trainer", _fake_trainer(calls))
    keys = jax.random.split(jax.random.key(0), 3)
    runs = grid_search.tune_baseline(_NO_DATA, "adamw:tuned", None, 4, {"c": jnp.zeros(3)}, keys,
                                     lrs=[1e-3, 1e-2], weight_decays=[0.0, 1e-2, 1e-1, 1.0],
                                     schedules=("constant", "cosine"), top_k=2, stage1_seeds=1)
    # stage 1: one seed at 2 x 4 x 2 points; the best (0.01, 1, constant) on the high edges of both axes: 2 rates
    # (0.1, 1) and 2 decays (10, 100) more, the grid a product again (4 x 6 x 2 = 48 points, 32 new); stage 2:
    # every seed at the 2 best points
    assert calls == [(16, 1), (32, 1), (2, 3)]
    best = best_runs(runs)["adamw:tuned"]
    assert (best["learning_rate"], best["weight_decay"], best["schedule"]) == pytest.approx((0.1, 10.0, "constant"))
    assert best["grid_edge"] is None and grid_edge(runs, "adamw:tuned") is None
    assert len(runs) == 2 and all(r["losses"].shape == (3, 4) for r in runs)
    # capped: one extension round leaves the best on both edges, and says so
    runs = grid_search.tune_baseline(_NO_DATA, "adamw", None, 4, {"c": jnp.zeros(3)}, keys, lrs=[1e-3, 1e-2],
                                     weight_decays=[0.0, 1e-2, 1e-1], max_extensions=1, extend_by=1, top_k=1)
    best = best_runs(runs)["adamw"]
    assert (best["learning_rate"], best["weight_decay"]) == pytest.approx((0.1, 1.0))
    assert grid_edge(runs, "adamw") == "high, decay high"


def test_no_decay_grid_and_a_decay_line_through_0_have_no_low_decay_edge(monkeypatch):
    calls = []
    monkeypatch.setattr(grid_search, "make_task_trainer", _fake_trainer(calls))
    keys = jax.random.split(jax.random.key(0), 2)
    runs = grid_search.tune_baseline(_NO_DATA, "adam", None, 4, {"c": jnp.zeros(2)}, keys, lrs=[1e-2, 1e-1, 1.0],
                                     top_k=None)  # the full grid: every seed, no second stage
    assert calls == [(3, 2)] and len(runs) == 3 and best_runs(runs)["adam"]["grid_edge"] is None
    assert grid_search._edges((0.1, 0.0), [[0.1, 1.0], [0.0, 1e-3]]) == [(0, "low")]  # 0: no decay, not an edge
    assert grid_search._edges((0.1, 1e-3), [[0.1], [1e-3, 1e-2]]) == [(1, "low")]  # one rate: no rate edge


def test_two_stage_tuning_picks_the_full_grids_best_on_a_small_task():
    fam = tasks.QuadraticFamily(dim=4)
    cfgs, keys = task_draws(fam, (0, 1, 2))
    make_tx = baselines.scheduled_baseline("adamw", 30)
    kw = dict(lrs=[0.1, 0.3, 1.0], weight_decays=[0.0, 0.3], schedules=("constant", "cosine"), max_extensions=0)
    full = grid_search.tune_baseline(fam, "adamw", make_tx, 30, cfgs, keys, top_k=None, **kw)
    two = grid_search.tune_baseline(fam, "adamw", make_tx, 30, cfgs, keys, top_k=3, **kw)
    assert len(full) == 12 and len(two) == 3
    setting = lambda r: (r["learning_rate"], r["weight_decay"], r["schedule"])
    assert setting(best_runs(two)["adamw"]) == setting(best_runs(full)["adamw"])
