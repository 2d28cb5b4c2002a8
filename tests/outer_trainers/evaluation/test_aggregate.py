"""outer_trainers.evaluation.aggregate and the scores it builds on: IQM intervals (stratified bootstrap),
VeLOdrome, performance profiles, the collapse flag."""
import math

import numpy as np
import pytest

from outer_trainers.evaluation import aggregate, protocol, scores


def _run(losses, evals=None, name="x", lr=float("nan"), valids=None):
    """A run dict; its validation losses are its test losses unless given."""
    losses = np.asarray(losses, np.float64)
    evals = np.ones(losses.shape[0]) if evals is None else np.asarray(evals, np.float64)
    return {"optimizer": name, "learning_rate": lr, "losses": losses, "evals": evals,
            "valids": evals if valids is None else np.asarray(valids, np.float64)}


def _ratio_strata(rng, num_tasks, num_seeds, spread=0.2):
    """Per task: seeds' final losses of an optimizer (~0.8 x the task's scale, noisy) and a baseline (~1 x)."""
    out = []
    for i in range(num_tasks):
        scale = 1.0 + 0.1 * i
        f = np.stack([0.8 * scale * np.exp(spread * rng.standard_normal(num_seeds)),
                      scale * np.exp(spread * rng.standard_normal(num_seeds))], axis=-1)
        out.append((f, lambda x: np.median(x[..., 0], axis=1) / np.median(x[..., 1], axis=1)))
    return out


def test_iqm_interval_contains_the_estimate_and_shrinks_with_more_seeds():
    rng = np.random.default_rng(0)
    few, many = _ratio_strata(rng, 8, 3), _ratio_strata(rng, 8, 30)
    a, b = aggregate.iqm_interval(few), aggregate.iqm_interval(many)
    for res, strata in ((a, few), (b, many)):
        point = [s[1](s[0][None])[0] for s in strata]
        assert res["iqm"] == pytest.approx(aggregate.iqm(point))  # the estimate is the IQM on every seed
        assert res["ci_low"] < res["iqm"] < res["ci_high"]
    assert b["ci_high"] - b["ci_low"] < 0.5 * (a["ci_high"] - a["ci_low"])  # 10x the seeds: a much tighter interval
    assert 0.7 < b["ci_low"] and b["ci_high"] < 0.9  # around the true ratio 0.8
    assert aggregate.iqm_interval(few) == a  # a fixed resampling seed: the same interval
    assert aggregate.iqm_interval(few, seed=1) != a


def test_iqm_interval_resamples_seeds_within_tasks_not_tasks():
    # every seed of a task scores the same: resampling seeds within tasks changes nothing (resampling the
    # tasks themselves would give a wide interval here)
    strata = [(np.full((3, 1), v), lambda x: x[:, 0, 0]) for v in (1.0, 2.0, 3.0, 10.0, 20.0)]
    res = aggregate.iqm_interval(strata)
    assert res == {"iqm": 5.0, "ci_low": pytest.approx(5.0), "ci_high": pytest.approx(5.0)}  # mean of 2, 3, 10
    # fixed scores (a diverged task, a task with one seed) stay put; the interval's coverage is honoured
    mixed = _ratio_strata(np.random.default_rng(1), 5, 4) + [math.inf, (np.ones((1, 2)), lambda x: x[:, 0, 0])]
    wide, narrow = aggregate.iqm_interval(mixed), aggregate.iqm_interval(mixed, confidence_level=0.5)
    assert wide["ci_low"] <= narrow["ci_low"] <= narrow["ci_high"] <= wide["ci_high"]
    assert aggregate.iqm_interval([1.0, 2.0, 3.0]) == {"iqm": 2.0, "ci_low": 2.0, "ci_high": 2.0}


def test_an_infinite_iqm_is_an_interval_bound_too():
    strata = _ratio_strata(np.random.default_rng(2), 4, 3) + [math.inf] * 3  # 3 of 7 diverged: > floor(7/4)
    res = aggregate.iqm_interval(strata)
    assert res["iqm"] == math.inf and res["ci_high"] == math.inf and res["ci_low"] == math.inf
    one = _ratio_strata(np.random.default_rng(2), 4, 3) + [math.inf]  # one of 5 is trimmed
    res = aggregate.iqm_interval(one)
    assert math.isfinite(res["ci_low"]) and math.isfinite(res["ci_high"]) and res["ci_low"] <= res["iqm"]


def test_velodrome_is_the_baselines_steps_to_the_optimizers_final_loss():
    t = np.arange(1, 101, dtype=np.float64)
    adam = np.stack([1.0 / t, 1.0 / t])                   # final (mean of the last 10 steps) ~0.0105
    worse = np.stack([2.0 / np.sqrt(t)] * 2)              # final ~0.205: Adam's trailing mean gets there early
    c = scores.compare_runs(_run(worse), _run(adam))
    f_l = float(np.mean(2.0 / np.sqrt(t[-10:])))
    by_hand = 1 + int(np.argmax(scores.smoothed(adam)[0] <= f_l))
    assert c["velodrome_steps"] == by_hand == scores.steps_to_reach(adam, f_l) and 10 <= by_hand < 20
    assert c["velodrome_ratio"] == pytest.approx(by_hand / 100)
    assert c["baseline_steps_to_reach"] == by_hand  # the speedup's t_B is the same statistic
    better = np.stack([0.5 / t, 0.5 / t])                  # ends below Adam's final loss: Adam never gets there
    c = scores.compare_runs(_run(better), _run(adam))
    assert c["velodrome_steps"] is None and c["velodrome_ratio"] == math.inf
    nan = worse.copy()
    nan[0, 3] = np.nan
    assert scores.compare_runs(_run(nan), _run(adam))["velodrome_ratio"] == 0.0  # diverged: nothing to reach
    assert scores.compare_runs(_run(worse), {**_run(nan), "diverged": True})["velodrome_ratio"] == math.inf
    # across tasks: the IQM, and the tasks beyond the budget named
    comps = {"a": scores.compare_runs(_run(worse), _run(adam)), "b": scores.compare_runs(_run(better), _run(adam))}
    s = aggregate.summarize(comps, {"a": (_run(worse), _run(adam)), "b": (_run(better), _run(adam))})
    assert s["iqm_velodrome"] == math.inf and s["velodrome_beyond_budget"] == ["b"]  # n < 4: the plain mean
    assert s["intervals"]["velodrome_ratio"]["iqm"] == math.inf


def test_resampled_scores_equal_compare_runs_on_the_drawn_seeds():
    rng = np.random.default_rng(3)
    t = np.arange(1, 61, dtype=np.float64)
    run = _run(np.stack([(1 + 0.3 * rng.random()) / t + 0.01 * rng.random(60) for _ in range(3)]), rng.random(3) + 1)
    base = _run(np.stack([(1 + 0.3 * rng.random()) / np.sqrt(t) for _ in range(3)]), rng.random(3) + 1)
    strata = aggregate.pair_strata(run, base, scores.compare_runs(run, base))
    for draw in ([0, 1, 2], [0, 0, 2], [1, 1, 1], [2, 0, 2]):
        picked = lambda r: {**r, "losses": r["losses"][draw], "evals": r["evals"][draw]}
        c = scores.compare_runs(picked(run), picked(base))
        for metric, (data, score) in strata.items():
            assert score(data[np.asarray([draw])])[0] == pytest.approx(c[metric]), metric


def test_summarize_reports_iqm_and_interval_of_every_metric():
    rng = np.random.default_rng(4)
    t = np.arange(1, 41, dtype=np.float64)
    pairs = {f"t{i}": (_run(np.stack([(0.5 + 0.1 * rng.random()) / t for _ in range(3)])),
                       _run(np.stack([(1.0 + 0.1 * rng.random()) / t for _ in range(3)]))) for i in range(6)}
    comps = {k: scores.compare_runs(*p) for k, p in pairs.items()}
    s = aggregate.summarize(comps, pairs, n_resamples=500)
    assert set(s["intervals"]) == set(aggregate.METRICS)
    for metric, key in zip(aggregate.METRICS, ("iqm_ratio_train", "iqm_ratio_eval", "iqm_speedup", "iqm_velodrome")):
        iv = s["intervals"][metric]
        assert iv["iqm"] == s[key] and iv["ci_low"] <= iv["ci_high"]
    assert 0.45 < s["intervals"]["ratio_train"]["ci_low"] and s["intervals"]["ratio_train"]["ci_high"] < 0.65
    assert s["intervals"]["ratio_eval"] == {"iqm": 1.0, "ci_low": 1.0, "ci_high": 1.0}  # every held-out loss 1
    assert "intervals" not in aggregate.summarize(comps)  # without the runs: no intervals


def test_performance_profile_ratios_to_the_best_optimizer_per_task():
    """On test loss, each baseline at its validation-selected rate; by="train" profiles the final train loss."""
    def flat(train, name, lr=float("nan"), test=None, valid=None):
        test = train if test is None else test
        return _run(np.full((2, 10), train), evals=[test] * 2, name=name, lr=lr,
                    valids=[test if valid is None else valid] * 2)
    # task a: Adam's train-best rate (0.01) is not its validation-best (0.1); the learned optimizer wins on train only
    results = {"a": [flat(1.0, "learned", test=3.0), flat(2.0, "adam", 0.1), flat(0.5, "adam", 0.01, test=4.0)],
               "b": [flat(3.0, "learned"), flat(1.5, "adam", 0.1), flat(np.nan, "adam", 1.0)],
               "c": [flat(np.inf, "learned"), flat(0.5, "adam", 0.1)]}
    p = aggregate.performance_profile(results)
    assert p["tasks"] == ["a", "b", "c"]
    assert p["ratios"] == {"learned": [1.5, 2.0, math.inf], "adam": [1.0, 1.0, 1.0]}
    assert p["taus"] == [1.0, 1.5, 2.0]
    assert p["fractions"] == {"learned": [0.0, 1 / 3, 2 / 3], "adam": [1.0, 1.0, 1.0]}
    train = aggregate.performance_profile(results, by="train")
    assert train["ratios"] == {"learned": [1.0, 2.0, math.inf], "adam": [2.0, 1.0, 1.0]}
    assert scores.loss_ratio(0.0, 0.0) == 1.0 and scores.loss_ratio(1.0, 0.0) == math.inf


def _collapsing_curve(t, trivial):
    """Drops from the trivial loss to 0.2 x it by mid-run, then climbs back to the mean predictor's loss."""
    s = np.arange(t, dtype=np.float64)
    down = trivial * (0.2 + 0.8 * np.exp(-s / 10.0))
    return np.where(s < t // 2, down, trivial * (1.0 - 0.8 * np.exp(-(s - t // 2) / 10.0)))


def test_a_run_that_climbs_back_to_the_trivial_loss_is_collapsed():
    t, trivial = 200, 1.0
    healthy = 1.5 * np.exp(-np.arange(t) / 40.0) + 0.1  # starts above the trivial loss (a random init), learns
    flat = _collapsing_curve(t, trivial) * 1.0
    flat[:3] = 1.5                                       # started at 1.5 too: ends below where it started
    run = {"losses": np.stack([healthy, flat]), "evals": np.asarray([0.2, 1.0])}
    st = protocol.stability(run, trivial_loss=trivial)
    assert st["final"][1] < st["initial"][1]             # the old check alone would pass it
    assert st["collapsed"] == [False, True] and st["ok"] == [True, False] and not st["all_ok"]
    assert st["trivial_loss"] == [1.0, 1.0]
    assert protocol.stability(run)["ok"] == [True, True]  # no trivial loss known: the initial loss is the reference
    per_seed = protocol.stability(run, trivial_loss=[None, trivial])
    assert per_seed["collapsed"] == [False, True] and per_seed["trivial_loss"] == [None, 1.0]
    # the margin: within 5% of the trivial loss counts as collapsed, 10% below it does not
    final = np.asarray([0.96, 0.9, 0.5])
    assert protocol.collapsed(final, 2.0, 1.0).tolist() == [True, False, False]
    assert protocol.collapsed(final, np.asarray([0.9, 0.9, 0.9]), None).tolist() == [True, True, False]
    assert protocol.collapsed([np.nan, np.inf], 1.0, 1.0).tolist() == [False, False]  # diverged, not collapsed
    # compare_runs and summarize name the collapsed task
    c = protocol.compare_runs(_run(flat[None]), _run(healthy[None]), trivial_loss=trivial)
    assert c["collapsed"] and c["trivial_loss"] == 1.0
    assert not protocol.compare_runs(_run(healthy[None]), _run(flat[None]), trivial_loss=trivial)["collapsed"]
    assert aggregate.summarize({"x": c})["collapsed"] == ["x"]


def test_trivial_loss_is_read_from_the_task_when_it_declares_one():
    class Plain:
        pass

    class Attr:
        trivial_loss = 0.25

    class Method:
        def trivial_loss(self):
            return np.float32(2.5)

    class Split:  # as tasks.AutoencoderTask and tasks.LinearRegressionTask: scored on a split, "test" by default
        def trivial_loss(self, split="test"):
            return {"train": 1.0, "test": 3.0}[split]

    class Bad:
        trivial_loss = float("nan")

    assert scores.trivial_loss_of(Plain()) is None and scores.trivial_loss_of(Bad()) is None
    assert scores.trivial_loss_of(Attr()) == 0.25 and scores.trivial_loss_of(Method()) == 2.5
    assert scores.trivial_loss_of(Split()) == 1.0  # compared with train losses: the train split's


def test_a_linear_regression_declares_the_mean_predictors_loss_and_a_flat_run_collapses_to_it():
    import jax
    import optax

    import tasks
    from outer_trainers.evaluation import run_fixed, suite_runs, task_draws
    fam = tasks.LinearRegressionFamily(dim=4, batch_size=128, num_examples=1024)
    trivial = suite_runs.trivial_losses(fam, [0, 1])
    cfgs, keys = task_draws(fam, [0, 1])
    for i, value in enumerate(trivial):
        task = fam.task_fn(jax.tree_util.tree_map(lambda x: x[i], cfgs))
        assert value == pytest.approx(task.trivial_loss(split="train")) and value > 0
    # a "run" that jumps to w = 0 and stays there: it predicts 0, about the mean target, so it ends near the
    # trivial loss (within 0.5% and 0.2% here: 20 final batches of 128 keep the minibatch noise well inside the
    # 5% margin), below where its random init started (the old check passes it), and is collapsed
    to_zero = optax.GradientTransformation(lambda p: optax.EmptyState(),
                                           lambda g, s, p: (jax.tree_util.tree_map(lambda x: -x, p), s))
    flat = run_fixed(fam, "flat", lambda _: to_zero, 0.0, cfgs, keys, 200)
    trained = run_fixed(fam, "adam", optax.adam, 0.05, cfgs, keys, 200)
    st = protocol.stability(flat, trivial)
    assert all(f < i for f, i in zip(st["final"], st["initial"])) and protocol.stability(flat)["all_ok"]
    assert st["collapsed"] == [True, True] and not st["all_ok"]
    assert protocol.stability(trained, trivial)["collapsed"] == [False, False]


def test_an_exploded_held_out_loss_is_flagged_per_seed_and_named_in_the_report():
    """A finite held-out loss far above the untrained model's loss (weights blown up on unseen inputs)
    is flagged, while the train loss looks healthy; the wins and ratios are unchanged by the flag."""
    from outer_trainers.evaluation import report, scores
    losses = np.tile(np.linspace(2.0, 0.01, 50), (3, 1))
    fine = _run(losses, evals=[0.5, 0.6, 19.9])         # 19.9 < 10 x 2.0: over-fitting, not an explosion
    blown = _run(losses, evals=[0.5, 2.9e9, 0.6])
    assert scores.held_out_exploded(fine).tolist() == [False, False, False]
    assert scores.held_out_exploded(blown).tolist() == [False, True, False]
    assert scores.held_out_exploded(_run(losses, evals=[np.nan, np.inf, 0.1])).tolist() == [False, False, False]
    assert scores.held_out_exploded(blown, factor=1e10).tolist() == [False, False, False]
    base = _run(np.tile(np.linspace(2.0, 0.1, 50), (3, 1)), evals=[0.4, 0.4, 0.4])
    c_blown, c_fine = protocol.compare_runs(blown, base), protocol.compare_runs(fine, base)
    assert c_blown["eval_exploded"] and not c_fine["eval_exploded"] and not c_blown["diverged"]
    assert c_blown["win_train"] and c_blown["ratio_eval"] == pytest.approx(0.6 / 0.4)  # medians: flag only
    summary = {"learned vs adam": aggregate.summarize({"a": c_blown, "b": c_fine})}
    assert summary["learned vs adam"]["eval_exploded"] == ["a"]
    table = report.comparison_tables({"learned vs adam": {"a": c_blown, "b": c_fine}}, summary)
    title, _, header, _, row = table.splitlines()[:5]
    assert title.startswith("**Test loss at the end of training**")
    assert header.endswith("| collapsed on | held-out exploded on |") and row.endswith("| none | a |")
    assert "| a | " in table and " (exploded) |" in table.split("| a | ")[1].splitlines()[0]
    assert " (exploded)" not in table.split("| b | ")[1].splitlines()[0]
