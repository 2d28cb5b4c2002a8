"""outer_trainers.evaluation.protocol: grid tuning with edge extension, time to reach, speedups, IQM, wins."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tasks
from outer_trainers.evaluation import protocol
from outer_trainers.evaluation.task_trainer import make_task_trainer, sample_cfgs


def _run(name, losses, evals=None, lr=float("nan"), valids=None):
    """A run dict; its validation losses are its final train losses unless given."""
    losses = np.asarray(losses, np.float64)
    return {"optimizer": name, "learning_rate": lr, "losses": losses,
            "evals": np.ones(losses.shape[0]) if evals is None else np.asarray(evals, np.float64),
            "valids": protocol.final_loss(losses) if valids is None else np.asarray(valids, np.float64)}


def test_smoothed_is_the_trailing_mean_of_final_loss():
    losses = np.arange(1.0, 21.0)[None]  # T = 20 -> window 2
    c = protocol.smoothed(losses)
    assert np.isnan(c[0, 0]) and c[0, 1] == 1.5 and c[0, -1] == 19.5
    np.testing.assert_allclose(protocol.smoothed(losses, 5)[0, 4:6], [3.0, 4.0])


def test_time_to_reach_and_speedup_both_ways():
    t = np.arange(1, 101, dtype=np.float64)
    fast = np.stack([1.0 / t, 1.0 / t])                 # reaches 0.1 early
    slow = np.stack([10.0 / t, 10.0 / t])               # final ~ 0.105
    # window 10: smoothed 1/t at step s is mean(1/(s-9..s)); it is <= slow's final loss first at step 18
    target = float(np.mean(10.0 / t[-10:]))
    step = protocol.steps_to_reach(fast, target)
    assert step == 1 + int(np.argmax(protocol.smoothed(fast)[0] <= target)) and 10 <= step < 30
    c = protocol.compare_runs(_run("l", fast), _run("b", slow))
    assert c["steps_to_reach"] == step and c["speedup"] == pytest.approx(100 / step)
    assert c["ratio_train"] == pytest.approx(0.1) and c["win_train"] and c["win_speed"] and not c["win_eval"]
    # the other way round: never reached; the speedup is the baseline's step to reach ours over T (< 1)
    c = protocol.compare_runs(_run("l", slow, evals=[0.5, 0.5]), _run("b", fast))
    assert c["steps_to_reach"] is None and c["baseline_steps_to_reach"] == step
    assert c["speedup"] == pytest.approx(step / 100) and not c["win_speed"] and c["ratio_eval"] == 0.5 and c["win_eval"]
    assert c["below_initial"] and c["initial_train"] == 10.0


def test_a_diverged_run_is_reported_as_diverged_and_a_diverged_baseline_loses():
    ok = np.ones((2, 10))
    bad = ok.copy()
    bad[1, 5:] = np.nan
    c = protocol.compare_runs(_run("l", bad), _run("b", ok))
    assert c["diverged"] and c["ratio_train"] == math.inf and c["speedup"] == 0.0
    assert not (c["win_train"] or c["win_eval"] or c["win_speed"])
    c = protocol.compare_runs(_run("l", ok * 0.5), {**_run("b", bad), "diverged": True})
    assert c["baseline_diverged"] and c["ratio_train"] == 0.0 and c["speedup"] == math.inf and c["win_train"]
    c = protocol.compare_runs(_run("l", ok), _run("b", ok, evals=[np.inf, 1.0]))  # a non-finite held-out loss too
    assert c["baseline_diverged"]


def test_iqm_drops_a_quarter_at_each_end():
    assert protocol.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5                # mean of 3..6
    assert protocol.iqm([1.0, 2.0, 4.0]) == pytest.approx(7 / 3)        # n < 4: plain mean
    assert protocol.iqm([0.0, 1.0, 2.0, 3.0, math.inf]) == 2.0          # one inf of 5 is trimmed
    assert protocol.iqm([1.0, math.inf, math.inf, math.inf]) == math.inf
    with pytest.raises(ValueError, match="no NaN"):
        protocol.iqm([1.0, float("nan")])


def test_summarize_counts_wins_and_lists_diverged_tasks():
    comps = {"a": {"win_train": True, "win_eval": False, "win_speed": True, "ratio_train": 0.5, "ratio_eval": 1.2,
                   "speedup": 2.0, "velodrome_ratio": math.inf, "diverged": False, "below_initial": True,
                   "collapsed": False},
             "b": {"win_train": False, "win_eval": False, "win_speed": False, "ratio_train": math.inf,
                   "ratio_eval": math.inf, "speedup": 0.0, "velodrome_ratio": 0.0, "diverged": True,
                   "below_initial": False, "collapsed": False}}
    s = protocol.summarize(comps)
    assert (s["num_tasks"], s["wins_train"], s["wins_eval"], s["wins_speed"]) == (2, 1, 0, 1)
    assert s["iqm_ratio_train"] == math.inf and s["iqm_speedup"] == 1.0 and s["iqm_velodrome"] == math.inf
    assert s["diverged"] == ["b"] and s["not_below_initial"] == ["b"] and s["collapsed"] == []
    assert s["velodrome_beyond_budget"] == ["a"]


def test_batched_learning_rates_equal_separate_runs():
    fam = tasks.QuadraticFamily(dim=4)
    cfgs = sample_cfgs(fam, jax.random.key(0), 2)
    keys = jax.random.split(jax.random.key(1), 2)
    batched = make_task_trainer(fam, optax.sgd, 15, batched_args=True)
    losses, evals = batched(jnp.asarray([0.01, 0.1]), cfgs, keys, fam.data)
    assert losses.shape == (2, 2, 15) and evals.shape == (2, 2)
    single = make_task_trainer(fam, optax.sgd, 15)
    for i, lr in enumerate((0.01, 0.1)):
        np.testing.assert_allclose(losses[i], single(jnp.float32(lr), cfgs, keys, fam.data)[0], rtol=1e-5)


def test_the_grid_is_extended_past_an_edge_holding_the_best_rate(compile_counter):
    """SGD on quadratics (loss 0.5 mean_i h_i x_i^2, h up to 10): 1 is best in 30 steps, 10 diverges; the grid
    starts at 1e-3, 1e-2."""
    fam = tasks.QuadraticFamily(dim=4, min_curvature=0.1, max_curvature=10.0)
    cfgs = sample_cfgs(fam, jax.random.key(0), 3)
    keys = jax.random.split(jax.random.key(1), 3)
    with compile_counter() as c:
        runs = protocol.tune_learning_rate(fam, "sgd", optax.sgd, [1e-2, 1e-3], cfgs, keys, 30, extend_by=1)
    lrs = [r["learning_rate"] for r in runs]
    np.testing.assert_allclose(lrs, [1e-3, 1e-2, 1e-1, 1.0, 10.0], rtol=1e-6)  # extended upward 3 times, then stopped
    assert c.count == 2  # the starting grid and the extension size: one program each
    best = protocol.best_runs(runs)["sgd"]
    assert best["learning_rate"] == pytest.approx(1.0) and protocol.grid_edge(runs, "sgd") is None
    assert not np.all(np.isfinite(runs[-1]["losses"]))  # 10 diverged on some seed, so it lost
    assert protocol.final_loss(best["losses"]).max() < 0.01 < protocol.final_loss(runs[2]["losses"]).max()
    assert runs[0]["losses"].shape == (3, 30) and runs[0]["evals"].shape == (3,)
    capped = protocol.tune_learning_rate(fam, "sgd", optax.sgd, [1e-4, 1e-3], cfgs, keys, 30, max_extensions=1)
    assert len(capped) == 4 and protocol.grid_edge(capped, "sgd") == "high"  # still on the edge: reported


def test_baselines_and_default_grids():
    assert protocol.baseline_names() == ["adam", "adamw", "muon", "sgdm"]
    np.testing.assert_allclose(protocol.default_lrs("adam"), np.logspace(-4, -1, 7))
    np.testing.assert_allclose(protocol.default_lrs("sgdm"), np.logspace(-3, 0, 7))
    np.testing.assert_allclose(protocol.default_lrs("muon"), np.logspace(-3, 0, 7))
    with pytest.raises(ValueError, match=r"unknown baseline 'rmsprop'; the baselines are \['adam', 'adamw', 'muon', "
                                         r"'sgdm'\]"):
        protocol.baseline("rmsprop")
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.full(3, 2.0)}
    sgdm = protocol.baseline("sgdm")(0.1)
    u, s = sgdm.update(grads, sgdm.init(params), params)
    u, _ = sgdm.update(grads, s, params)
    np.testing.assert_allclose(u["w"], -0.1 * 2.0 * 1.9)  # momentum 0.9: second step 2 + 0.9 * 2
    adamw = protocol.baseline("adamw", weight_decay=0.5)(0.1)
    u, _ = adamw.update({"w": jnp.zeros(3)}, adamw.init(params), params)
    np.testing.assert_allclose(u["w"], -0.1 * 0.5 * 1.0, rtol=1e-6)  # zero gradient: only the decoupled decay


def test_stability_passes_a_seed_that_stays_finite_and_ends_below_its_start():
    t = 200
    down = np.linspace(2.0, 0.5, t)
    spike_back = np.concatenate([np.linspace(2.0, 0.5, t // 2), np.full(t // 2, 3.0)])  # ends above its start
    nan_mid = down.copy()
    nan_mid[50] = np.nan
    run = {"losses": np.stack([down, spike_back, nan_mid]), "evals": np.asarray([0.6, 0.7, 0.6])}
    st = protocol.stability(run)
    assert st["ok"] == [True, False, False] and not st["all_ok"]
    np.testing.assert_allclose(st["initial"][0], np.mean(down[:2]))  # the first 1% (2 steps)
    np.testing.assert_allclose(st["final"][0], np.mean(down[-20:]))  # the last 10%
    assert st["max"][1] == 3.0 and st["max"][2] == 2.0  # NaNs are skipped in the peak
    run["evals"] = np.asarray([np.inf, 0.7, 0.6])  # a non-finite held-out loss fails the seed too
    assert protocol.stability({"losses": run["losses"][:1], "evals": run["evals"][:1]})["ok"] == [False]
