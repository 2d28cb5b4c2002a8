"""Validation selection (`ValidationSelector`, `outer_train(validation=...)`, `Validation.*`): the scores
against hand-computed values from the cached baseline; the cache reused, and recomputed when its key changes;
no recompilation; theta_best written only on improvement, the theta of the best-scoring step; a diverging theta
never best; an interrupted run resumed keeps its best; bad input refused, naming the cause."""
import importlib
import json
import math
import os

import chex
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.evaluation import final_loss, lr_grid, run_fixed, run_settings, run_task, task_draws
from outer_trainers.learner import gin_run, validation_selection as vs
from outer_trainers.learner.run_settings import Validation
from tests.fixtures import TINY_RUN_GIN, lopt_step, metrics_lines

theta_best_module = importlib.import_module("outer_trainers.learner.theta_best")  # the package's name is the function
STEPS, SEEDS = 20, 3
# the same quadratics with 10x the curvature: a learning rate good on one is 10x too small or large on the other
FAMILIES = (tasks.QuadraticFamily(dim=4), tasks.QuadraticFamily(dim=4, min_curvature=1.0, max_curvature=100.0))


def _theta(lr):
    return {"log_lr": jnp.asarray(np.log(lr), jnp.float32)}


def _selector(**kw):
    return ot.ValidationSelector(lopt.LearnableSGD(0.01), list(FAMILIES), num_steps=STEPS, num_seeds=SEEDS, **kw)


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """A selector whose baseline was tuned once and cached: (selector, cache path)."""
    path = str(tmp_path_factory.mktemp("cache") / "baseline.json")
    sel = _selector(cache_path=path)
    sel.baselines()
    return sel, path


def _by_hand(lr, doc):
    """wins, IQM ratio and score of LearnableSGD(lr) from the cache document, computed here."""
    lo, ratios, wins, diverged = lopt.LearnableSGD(0.01), [], 0, 0
    for family, name in zip(FAMILIES, ["quadratic_dim4", "quadratic_dim4_1"]):
        cfgs, keys = task_draws(family, range(SEEDS))
        run = run_fixed(family, "l", lambda th: lo.opt_fn(th, num_steps=STEPS), _theta(lr), cfgs, keys, STEPS)
        f_l = run["losses"][:, -2:].mean(axis=1)  # the last 10% of 20 steps
        f_b = np.asarray(doc["tasks"][name]["losses"])[:, -2:].mean(axis=1)
        finite = np.isfinite(run["losses"]).all(axis=1) & np.isfinite(run["evals"])
        diverged += int(not finite.all())
        wins += int(finite.all() and np.median(f_l) < np.median(f_b))
        ratios += [r if ok else math.inf for r, ok in zip(f_l / f_b, finite)]
    s = sorted(ratios)  # 6 values: drop one at each end
    iqm = float(np.mean(s[1:5]))
    return wins, iqm, diverged, (wins + 0.5 / (1 + iqm) if not diverged else -math.inf)


@pytest.mark.parametrize("lr, wins, diverged", [(0.03, 1, 0), (0.1, 2, 0), (1.0, 1, 1)])
def test_scores_are_the_hand_computed_wins_and_iqm_against_the_cached_baseline(cached, lr, wins, diverged):
    sel, path = cached
    doc = json.load(open(path))
    m = sel(_theta(lr))
    h_wins, h_iqm, h_div, h_score = _by_hand(lr, doc)
    assert (m["valid/wins"], m["valid/diverged"]) == (h_wins, h_div) == (wins, diverged)
    assert m["valid/num_tasks"] == 2
    np.testing.assert_allclose(m["valid/iqm_ratio"], h_iqm, rtol=1e-6)
    if diverged:  # a diverged run counts as a loss on its task, and its theta is never selectable
        assert m["valid/score"] == -math.inf and math.isinf(m["valid/quadratic_dim4_1/ratio"])
        assert not vs.improves(m["valid/score"], None)
    else:
        np.testing.assert_allclose(m["valid/score"], h_score, rtol=1e-6)
        assert vs.improves(m["valid/score"], m["valid/score"] - 0.01) and not vs.improves(m["valid/score"],
                                                                                            m["valid/score"])


def test_the_cached_baseline_is_the_protocols_tuned_adam(cached):
    """The cached best run is Adam at the rate with the lowest median final loss over the grid tried, the
    grid extended past an edge holding the best rate (computed here by run_settings, one rate at a time)."""
    sel, path = cached
    doc = json.load(open(path))
    assert doc["key"] == sel.cache_key() and doc["key"]["lrs"] == list(ot.protocol.default_lrs("adam"))
    for family, (name, entry) in zip(FAMILIES, doc["tasks"].items()):
        tried = entry["lrs_tried"]
        assert len(tried) >= 7 and set(sel.lrs) <= set(tried)
        cfgs, keys = task_draws(family, range(SEEDS))
        runs = run_settings(family, [("adam", optax.adam, lr_grid(tried))], cfgs, keys, STEPS)
        medians = [np.median(final_loss(r["losses"])) if np.isfinite(r["losses"]).all() else np.inf for r in runs]
        best = int(np.argmin(medians))
        assert 0 < best < len(tried) - 1 and entry["grid_edge"] is None  # not on an edge after the extensions
        assert entry["best_lr"] == tried[best]
        np.testing.assert_allclose(entry["losses"], runs[best]["losses"], rtol=1e-5)


def test_the_cache_is_reused_and_recomputed_when_its_key_changes(cached, tmp_path, monkeypatch):
    sel, path = cached
    calls = []
    real = vs.run_task
    monkeypatch.setattr(vs, "run_task", lambda *a, **k: calls.append(a[0].name) or real(*a, **k))
    copy = str(tmp_path / "baseline.json")
    open(copy, "w").write(open(path).read())
    again = _selector(cache_path=copy)  # a new selector (a resumed run): reads the cache, trains nothing
    m, m0 = again(_theta(0.1)), sel(_theta(0.1))
    assert calls == [] and again.baseline_computations == 0
    assert {k: v for k, v in m.items() if k != "valid/seconds"} == {k: v for k, v in m0.items() if k != "valid/seconds"}
    # another grid: another key, so the baseline is trained again (with a warning naming what differs)
    wider = _selector(cache_path=copy, lrs=np.logspace(-5, -1, 9))
    with pytest.warns(RuntimeWarning, match=r"its key differs \(lrs\)"):
        wider.baselines()
    assert calls == ["quadratic_dim4", "quadratic_dim4"] and wider.baseline_computations == 1
    assert json.load(open(copy))["key"] == wider.cache_key() != sel.cache_key()
    # a cache edited by hand to another key (another step count) is not reused either
    doc = json.load(open(path))
    doc["key"]["tasks"][0]["num_steps"] = 30
    open(copy, "w").write(json.dumps(doc))
    with pytest.warns(RuntimeWarning, match=r"its key differs \(tasks\[0\]\.num_steps\)"):
        _selector(cache_path=copy).baselines()
    assert len(calls) == 4
    # the key holds each family's settings and a digest of its data
    assert sel.cache_key()["tasks"][1]["family"]["max_curvature"] == 100.0
    regression = vs.describe(tasks.LinearRegressionFamily(8, batch_size=16, condition=10.0))
    other = vs.describe(tasks.LinearRegressionFamily(8, batch_size=16, condition=100.0))
    assert regression["data"]["sha256"] != other["data"]["sha256"]


def test_no_recompilation_across_calls(cached, compile_counter):
    sel, _ = cached
    sel(_theta(0.05))
    with compile_counter() as c:
        sel(_theta(0.02))
        sel(_theta(0.2))
    assert c.count == 0


@pytest.mark.parametrize("make, match", [
    (lambda lo: ot.ValidationSelector(lo, "no-such-suite"), "unknown suite 'no-such-suite'"),
    (lambda lo: ot.ValidationSelector(lo, FAMILIES[0], lrs=[1e-3, 1e-2, 1e-1]), "lrs has 3 distinct rates.*at least 7"),
    (lambda lo: ot.ValidationSelector(lo, FAMILIES[0], baseline="adagrad"), "unknown baseline 'adagrad'"),
    (lambda lo: ot.ValidationSelector(lo, []), "no validation task"),
    (lambda lo: ot.ValidationSelector(lo, FAMILIES[0], num_steps=0), "num_steps must be >= 1"),
])
def test_bad_selector_arguments_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make(lopt.LearnableSGD(0.01))


@pytest.fixture(scope="module")
def tiny():
    lo = lopt.LearnableSGD(1e-2)
    return lo, ot.TruncatedPES(lopt_step(FAMILIES[0], lo, 12), num_tasks=2, trunc_length=4, std=0.05)


def _train(tiny, num_steps, output_dir, validation, every=1, callback=None, **kw):
    lo, est = tiny
    learner = ot.GradientLearner(lo, optax.adam(0.05), theta_ema=kw.pop("theta_ema", None))
    policy = ot.CheckpointPolicy(every_steps=kw.pop("checkpoint_every", 1), every_seconds=None, keep=20)
    return ot.outer_train(learner, [est], num_steps, output_dir=output_dir,
                          reporting=ot.Reporting(progress=False, tensorboard=False), seed=3,
                          checkpoint_policy=policy, callback=callback, validation=validation, validation_every=every,
                          **kw)


def test_bad_loop_arguments_are_refused(tiny, tmp_path):
    with pytest.raises(ValueError, match="validation_every=2 needs a validation selector"):
        _train(tiny, 1, str(tmp_path), None, every=2)
    with pytest.raises(ValueError, match="validation_every=0, so it would never run"):
        _train(tiny, 1, str(tmp_path), _selector(), every=0)
    other = ot.ValidationSelector(lopt.LearnableSGD(0.5), FAMILIES[0], num_steps=STEPS)
    with pytest.raises(ValueError, match="build the ValidationSelector with the learner's learned optimizer"):
        _train(tiny, 1, str(tmp_path), other)
    assert not os.listdir(tmp_path)


class Scripted(vs.ValidationSelector):
    """A selector whose score of theta is looked up in a table (keyed by theta's log_lr): the loop's
    bookkeeping, a pure function of theta as the real scores are, without training validation tasks."""

    def __init__(self, table):
        super().__init__(lopt.LearnableSGD(1e-2), FAMILIES[0], num_steps=5)
        self.table = table  # {log_lr of theta (rounded): score}

    def __call__(self, theta, *, cache_path=None):
        score = self.table[round(float(theta["log_lr"]), 6)]
        return {"valid/wins": int(score) if math.isfinite(score) else 0, "valid/diverged": int(score == -math.inf),
                "valid/score": score}


def _thetas(tiny, num_steps):
    """log_lr of the run's theta after each step (the run is deterministic)."""
    seen = {}
    _train(tiny, num_steps, None, None, every=0, callback=lambda i, s, m: seen.__setitem__(i, s.final_theta))
    return seen


def _counting(monkeypatch):
    saved = []
    real = theta_best_module.save_theta_best  # what both meta-training loops' ThetaBest writes with
    monkeypatch.setattr(theta_best_module, "save_theta_best",
                        lambda *a, **k: saved.append(k["step"]) or real(*a, **k))
    return saved


def test_theta_best_is_written_only_on_improvement_and_a_diverging_theta_is_never_best(tiny, tmp_path, monkeypatch):
    thetas = _thetas(tiny, 6)
    scores = [1.0, -math.inf, 0.5, 2.0, 2.0, 1.5]  # step 2 diverged; step 5 only ties step 4
    table = {round(float(thetas[i + 1]["log_lr"]), 6): s for i, s in enumerate(scores)}
    saved = _counting(monkeypatch)
    _train(tiny, 6, str(tmp_path), Scripted(table))
    assert saved == [1, 4]
    record = json.load(open(tmp_path / "theta_best.json"))
    assert (record["step"], record["score"]) == (4, 2.0)
    chex.assert_trees_all_equal(lopt.load_theta(str(tmp_path / "theta_best.msgpack")), thetas[4])
    lines = {r["step"]: r for r in metrics_lines(tmp_path)}
    assert [lines[s]["valid/best_score"] for s in range(1, 7)] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert lines[2]["valid/score"] == -math.inf
    # every step diverged: no theta_best at all
    saved.clear()
    _train(tiny, 3, str(tmp_path / "all_diverged"), Scripted({k: -math.inf for k in table}))
    assert saved == [] and not os.path.exists(tmp_path / "all_diverged" / "theta_best.json")


def test_a_resumed_run_keeps_its_best(tiny, tmp_path, monkeypatch):
    thetas = _thetas(tiny, 8)
    scores = [1.0, 3.0, 2.0, 2.5, 2.9, 1.0, 3.5, 0.0]
    table = {round(float(thetas[i + 1]["log_lr"]), 6): s for i, s in enumerate(scores)}
    whole = _train(tiny, 8, str(tmp_path / "whole"), Scripted(table), checkpoint_every=3)
    saved = _counting(monkeypatch)

    def interrupt(step, state, metrics):
        if step == 5:  # theta_best of step 2 is on disk; the newest checkpoint is step 3's
            raise KeyboardInterrupt

    cut = str(tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        _train(tiny, 8, cut, Scripted(table), checkpoint_every=3, callback=interrupt)
    assert saved == [1, 2] and json.load(open(os.path.join(cut, "theta_best.json")))["step"] == 2
    saved.clear()
    resumed = _train(tiny, 8, cut, Scripted(table), checkpoint_every=3)  # resumes from step 3
    assert saved == [7]  # steps 4-6 (2.5, 2.9, 1.0) never replace step 2's 3.0
    chex.assert_trees_all_equal(resumed.learner_state, whole.learner_state)
    for run in ("whole", "cut"):
        record = json.load(open(tmp_path / run / "theta_best.json"))
        assert (record["step"], record["score"]) == (7, 3.5)
        chex.assert_trees_all_equal(lopt.load_theta(str(tmp_path / run / "theta_best.msgpack")), thetas[7])
    # resumed with other validation settings, the record's score is not comparable: refused, nothing changed
    before = sorted(os.listdir(cut))
    other = Scripted(table)
    other.plan = [t._replace(num_steps=6) for t in other.plan]
    with pytest.raises(ValueError, match=r"\(its cache key differs from this run's in tasks\[0\]\.num_steps\)"):
        _train(tiny, 9, cut, other)
    assert sorted(os.listdir(cut)) == before


def test_a_run_validates_its_averaged_theta_and_saves_the_best_scoring_one(tiny, tmp_path, cached, monkeypatch):
    sel, path = cached
    copy = str(tmp_path / "cache.json")
    open(copy, "w").write(open(path).read())
    selector, seen = _selector(cache_path=copy), {}
    saved = _counting(monkeypatch)
    _train(tiny, 4, str(tmp_path / "run"), selector, every=2, theta_ema=0.5,
           callback=lambda i, s, m: seen.__setitem__(i, (s.final_theta, m.get("valid/score"))))
    assert selector.baseline_computations == 0  # the cache named by the selector
    scores = {i: sc for i, (_, sc) in seen.items() if sc is not None}
    assert sorted(scores) == [2, 4]
    assert scores[2] == selector(seen[2][0])["valid/score"]  # the average (final_theta) is what was scored
    best = max(scores, key=lambda i: (scores[i], -i))
    assert saved == [2] + ([4] if scores[4] > scores[2] else [])
    record = json.load(open(tmp_path / "run" / "theta_best.json"))
    assert record["step"] == best and record["score"] == scores[best] and "moving average" in record["theta"]
    assert record["cache_key_sha256"] == selector.key_digest() and record["validation"]["lrs"] == list(selector.lrs)
    chex.assert_trees_all_equal(lopt.load_theta(str(tmp_path / "run" / "theta_best.msgpack")), seen[best][0])


def _gin_train(output_dir, *bindings):
    gin.clear_config()
    try:
        gin.parse_config(TINY_RUN_GIN + "\n".join(("Reporting.progress = False", "Reporting.tensorboard = False") + bindings))
        return gin_run.train(output_dir, config_text="\n".join(bindings))
    finally:
        gin.clear_config()


def test_gin_train_validates_on_tasks_and_caches_the_baseline_in_the_run(tmp_path):
    validation = ("Validation.every = 2", "Validation.tasks = [@QuadraticFamily()]", "Validation.num_seeds = 2")
    _gin_train(str(tmp_path), "train.num_steps = 2", "Validation.num_steps = 10", *validation)
    record = json.load(open(tmp_path / "theta_best.json"))
    assert record["step"] == 2 and record["validation"]["tasks"] == [
        {"name": "quadratic_dim4", "num_steps": 10, "seeds": [0, 1], "eval_split": "test"}]
    assert json.load(open(tmp_path / "validation_baseline.json"))["key"] == record["cache_key"]
    assert metrics_lines(tmp_path)[-1]["valid/score"] == record["score"]
    chex.assert_trees_all_equal(lopt.load_theta(str(tmp_path / "theta_best.msgpack")),
                                lopt.load_theta(str(tmp_path / "theta_final.msgpack")))
    # validation settings may change on resume, but not under a record selected with others: refused, nothing written
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match=r"differs from this run's in tasks\[0\]\.num_steps"):
        _gin_train(str(tmp_path), "train.num_steps = 4", "Validation.num_steps = 12", *validation)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("kw, match", [
    (dict(every=2), "needs validation tasks: set Validation.suite"),
    (dict(suite="smoke"), "Validation.suite is set but Validation.every = 0"),
    (dict(every=1, suite="nope"), "Validation.suite = 'nope' is not a suite"),
    (dict(every=1, suite="smoke", tasks=[FAMILIES[0]]), "not both"),
    (dict(every=1, suite="smoke", objective="test"), "Validation.objective = 'test'; use 'train'"),
])
def test_gin_validation_bindings_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        Validation(**kw)


def test_baselines_handed_in_are_used_and_another_keys_refused(cached, monkeypatch):
    """A Ray evaluation actor's selector: the learner hands it the cached document; it trains nothing."""
    sel, path = cached
    monkeypatch.setattr(vs, "run_task", lambda *a, **k: pytest.fail("the baseline was trained again"))
    actor = _selector()
    assert actor.baseline_document() is None
    actor.use_baselines(sel.read_cache(path))
    m, m0 = actor(_theta(0.1)), sel(_theta(0.1))
    assert actor.baseline_computations == 0 and actor.baseline_document()["key"] == sel.cache_key()
    assert {k: v for k, v in m.items() if k != "valid/seconds"} == {k: v for k, v in m0.items() if k != "valid/seconds"}
    with pytest.raises(ValueError, match=r"another cache key.*lrs"):
        _selector(lrs=np.logspace(-5, -1, 9)).use_baselines(sel.baseline_document())


def test_a_suite_brings_its_budgets_and_seeds_and_keys_its_static_configs():
    sel = ot.ValidationSelector(lopt.LearnableSGD(0.01), "smoke")
    assert [(t["num_steps"], t["seeds"]) for t in sel.config()["tasks"]] == [(60, [0, 1]), (40, [0, 1]), (30, [0, 1])]
    key = sel.cache_key()["tasks"][1]
    assert key["suite_task"]["options"] == [["condition", 10.0], ["data_seed", 17], ["noise_std", 0.1]]
    assert dict(map(tuple, key["suite_task"]["static_config"]))["kind"] == "linear_regression"
    short = ot.ValidationSelector(lopt.LearnableSGD(0.01), "smoke", num_steps=8, num_seeds=1)
    assert [(t["num_steps"], t["seeds"]) for t in short.config()["tasks"]] == [(8, [0])] * 3
    assert short.key_digest() != sel.key_digest()


@pytest.mark.slow
def test_a_suite_validates_a_learned_optimizer(tmp_path):
    """The smoke suite at its own budgets: theta scored against tuned Adam, the scores consistent."""
    lo = lopt.LearnableSGD(0.01)
    sel = ot.ValidationSelector(lo, "smoke", cache_path=str(tmp_path / "cache.json"))
    m = sel(lo.init(jax.random.key(0)))
    assert m["valid/num_tasks"] == 3 and m["valid/wins"] == sum(m[f"valid/{t.name}/ratio"] < 1 for t in sel.plan)
    assert m["valid/score"] == vs.selection_score(m["valid/wins"], m["valid/iqm_ratio"], m["valid/diverged"])
    assert set(json.load(open(tmp_path / "cache.json"))["tasks"]) == {t.name for t in sel.plan}


@pytest.mark.slow
def test_the_held_out_objective_tunes_on_validation_and_scores_held_out_loss(monkeypatch):
    """objective="held_out": the baseline's rate is the protocol's (`best_runs` on final validation loss, as
    scripts/evaluate.py tunes), theta is scored on the held-out loss after training (wins, ratios and IQM
    computed here from the runs), and the key names the objective while a "train" key stays as it was."""
    family = tasks.suites.get("smoke")[0].build()
    sel = ot.ValidationSelector(lopt.LearnableSGD(0.01), family, num_steps=12, num_seeds=2, objective="held_out")
    assert sel.cache_key()["objective"] == "held_out"
    assert "objective" not in ot.ValidationSelector(lopt.LearnableSGD(0.01), family, num_steps=12).cache_key()
    with pytest.raises(ValueError, match="unknown objective 'valid'"):
        ot.ValidationSelector(lopt.LearnableSGD(0.01), family, objective="valid")
    tuned = []  # the selector's own tuning runs (every rate it tried)
    monkeypatch.setattr(vs, "run_task", lambda *a, **k: tuned.append((k, run_task(*a, **k))) or tuned[-1][1])
    (name, entry), = sel.baselines().items()
    (kwargs, (runs, _)), = tuned
    assert kwargs["select_by"] == "valid" and kwargs["valid_points"] == 1
    best = ot.evaluation.best_runs(runs, by="valid")["adam"]
    valid_medians = {r["learning_rate"]: np.median(r["valids"]) for r in runs}
    assert entry["best_lr"] == best["learning_rate"] == min(valid_medians, key=valid_medians.get)
    np.testing.assert_allclose(entry["evals"], best["evals"], rtol=1e-6)
    for lr in (0.01, 0.3):
        m, learned = sel(_theta(lr)), sel.runs(_theta(lr))[name]
        ratio = np.median(learned["evals"]) / np.median(entry["evals"])
        assert m["valid/wins"] == int(ratio < 1) and m["valid/diverged"] == 0
        np.testing.assert_allclose(m[f"valid/{name}/ratio"], ratio, rtol=1e-6)
        per_seed = np.sort(np.asarray(learned["evals"]) / np.asarray(entry["evals"]))
        np.testing.assert_allclose(m["valid/iqm_ratio"], per_seed.mean(), rtol=1e-6)  # 2 values: IQM keeps both
