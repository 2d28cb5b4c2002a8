"""run_settings / compare_optimizers: every setting trains the same task draws; one compile per optimizer;
best_runs: the one learning-rate tuning rule."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import outer_trainers as ot
import tasks
from outer_trainers.evaluation import comparison
from outer_trainers.evaluation.task_trainer import sample_cfgs


def test_run_settings_order_shapes_and_same_draws(compile_counter):
    fam = tasks.QuadraticFamily(dim=4)
    cfgs = sample_cfgs(fam, jax.random.key(0), 3)
    keys = jax.random.split(jax.random.key(1), 3)
    settings = [("adam", optax.adam, ot.lr_grid([0.01, 0.1])), ("sgd", optax.sgd, ot.lr_grid([0.1]))]
    with compile_counter() as c:
        runs = ot.run_settings(fam, settings, cfgs, keys, 20)
    assert c.count == 2  # one program per optimizer, the lr traced
    assert [(r["optimizer"], r["learning_rate"]) for r in runs] == [("adam", 0.01), ("adam", 0.1), ("sgd", 0.1)]
    assert runs[0]["losses"].shape == (3, 20) and runs[0]["evals"].shape == (3,)
    direct = ot.make_task_trainer(fam, optax.sgd, 20)(jnp.float32(0.1), cfgs, keys, fam.data)
    np.testing.assert_allclose(runs[2]["losses"], np.asarray(direct[0]), rtol=1e-6)
    # the same draws and initial points for every setting: equal first losses
    np.testing.assert_allclose(runs[0]["losses"][:, 0], runs[2]["losses"][:, 0], rtol=1e-6)
    assert np.all(runs[1]["losses"][:, -1] < runs[1]["losses"][:, 0])


def test_compare_optimizers_picks_the_best_adam_by_the_protocol():
    fam = tasks.QuadraticFamily(dim=4)
    lo = lopt.LearnableAdam()
    res = ot.compare_optimizers(fam, lo.opt_fn, lo.init(jax.random.key(0)), num_tasks=3, num_steps=15,
                                key=jax.random.key(2), adam_lrs=(1e-4, 1e-1))
    adam = [k for k in res if k.startswith("adam(")]
    assert len(adam) >= 7  # a 2-point grid is first spread to 7 log-spaced rates, 1e-4 .. 1e-1
    assert {"adam(lr=0.0001)", "adam(lr=0.1)", "learned", "best_adam", "protocol"} <= set(res)
    best = min(adam, key=lambda k: res[k]["valid_median"])  # the rate of lowest median validation loss
    assert res["best_adam"] == best and res["protocol"]["grid_edge"] is None  # extended until the best is inside
    assert len(res["learned"]["curve"]) == 15
    c = res["protocol"]["compare"]
    assert c["ratio_train"] == pytest.approx(res["learned"]["final_train_median"] / res[best]["final_train_median"])
    table = ot.format_comparison(res, 15)
    assert "| learned |" in table and f"| {best} (best Adam) |" in table and "speedup" in table
    learned = res["learned"]
    assert (f"| learned | {learned['final_train_median']:.3g} | {learned['final_train']:.3g} | "
            f"{learned['valid_median']:.3g} | {learned['eval']:.3g} |") in table
    tiny = {**res, "learned": {**learned, "final_train_median": 1.234e-6}}
    assert "| learned | 1.23e-06 |" in ot.format_comparison(tiny, 15)  # small losses keep their digits


def test_best_runs_takes_the_lowest_median_final_validation_loss_and_a_diverged_run_loses():
    curve = lambda *finals: np.asarray(finals, np.float64)[:, None] * np.ones((1, 10))
    run = lambda name, train, valid: {"optimizer": name, "losses": curve(*train), "valids": np.asarray(valid, float)}
    runs = [run("learned", (5.0, 5.0, 5.0), (5.0, 5.0, 5.0)),
            run("adam", (0.1, 0.1, 0.1), (3.0, 3.0, 3.0)),          # lowest train loss: over-fits
            run("adam", (1.0, 1.0, 1.0), (1.0, 1.0, 100.0)),        # lowest median validation loss (1)
            run("adam", (1.0, 1.0, 1.0), (2.0, 2.0, 2.0)),          # lowest mean validation loss (2)
            run("adam", (1.0, 1.0, 1.0), (0.1, 0.1, np.nan)),       # validation diverged on one seed: loses
            run("adam", (0.01, 0.01, np.nan), (0.1, 0.1, 0.1)),     # train diverged on one seed: loses
            run("sgd", (1.0, 1.0, 1.0), (np.inf, 1.0, 1.0)),
            run("sgd", (1.0, 1.0, 1.0), (np.nan, 1.0, 1.0))]        # all diverged: the first, marked
    best = ot.best_runs(runs)
    assert list(best) == ["learned", "adam", "sgd"]
    assert best["learned"] is runs[0] and best["adam"] is runs[2]
    assert best["sgd"] == {**runs[6], "diverged": True} and "diverged" not in runs[6]  # a marked copy
    assert not any("diverged" in best[k] for k in ("learned", "adam"))
    assert ot.best_runs(runs, by="train")["adam"] is runs[1]   # the old rule picks the over-fitting rate
    with pytest.raises(ValueError, match="no validation losses"):
        ot.best_runs([{"optimizer": "adam", "losses": curve(1.0)}])
    with pytest.raises(ValueError, match="by must be one of"):
        ot.best_runs(runs, by="test")


def _fake(monkeypatch, adam_finals):
    """compare_optimizers on fake runs: a learned optimizer and one Adam run per final loss (2 tasks, 10 steps)."""
    curve = lambda final: np.full((2, 10), final)
    learned = {"optimizer": "learned", "learning_rate": float("nan"), "losses": curve(1.0), "evals": np.ones(2),
               "valids": np.ones(2)}
    adam = [{"optimizer": "adam", "learning_rate": lr, "losses": curve(f), "evals": np.ones(2), "valids": np.full(2, f)}
            for lr, f in zip((1e-3, 1e-2), adam_finals)]
    monkeypatch.setattr(comparison, "run_fixed", lambda *a, **k: learned)
    monkeypatch.setattr(comparison, "tune_learning_rate", lambda *a, **k: adam)
    return ot.compare_optimizers(tasks.QuadraticFamily(dim=2), optax.sgd, 0.1, num_tasks=2, num_steps=10,
                                 key=jax.random.key(0), adam_lrs=(1e-3, 1e-2))


def test_compare_optimizers_names_no_best_adam_when_every_lr_diverged(monkeypatch):
    """It used to name the first lr "best Adam"; outer_train's table now says that none is."""
    res = _fake(monkeypatch, (np.nan, np.inf))
    assert res["best_adam"] is None and res["protocol"]["compare"] is None
    table = ot.format_comparison(res, 10)
    assert "(best Adam)" not in table and "No best Adam: every learning rate of the grid diverged" in table
    res = _fake(monkeypatch, (np.nan, 0.5))
    assert res["best_adam"] == "adam(lr=0.01)" and "| adam(lr=0.01) (best Adam) |" in ot.format_comparison(res, 10)
    assert "does not reach the best Adam's final train loss within 10 steps" in ot.format_comparison(res, 10)
    assert "still on the high edge" in ot.format_comparison(res, 10)  # the fake grid was not extended


def test_compare_optimizers_schedules_adam_over_the_budget_and_says_so(monkeypatch):
    """Adam's step at count t is the peak rate times optax's warm-up + cosine schedule over num_steps."""
    num_steps, captured = 20, {}
    learned = {"optimizer": "learned", "learning_rate": float("nan"), "losses": np.ones((2, num_steps)),
               "evals": np.ones(2), "valids": np.ones(2)}

    def tune(family, name, make_tx, lrs, *args, **kwargs):
        captured["make_tx"] = make_tx
        return [{"optimizer": "adam", "learning_rate": lr, "losses": np.full((2, num_steps), v), "evals": np.ones(2),
                 "valids": np.full(2, v)} for lr, v in zip(lrs, (3.0, 1.0, 2.0))]
    monkeypatch.setattr(comparison, "run_fixed", lambda *a, **k: learned)
    monkeypatch.setattr(comparison, "tune_learning_rate", tune)
    res = ot.compare_optimizers(tasks.QuadraticFamily(dim=2), optax.sgd, 0.1, num_tasks=2, num_steps=num_steps,
                                key=jax.random.key(0), adam_lrs=(1e-3, 1e-2, 1e-1), min_grid_points=3,
                                adam_schedule="cosine")
    assert res["best_adam"] == "adam:cosine(lr=0.01)" and "adam:cosine(lr=0.001)" in res
    assert res["protocol"]["adam_schedule"] == "cosine" and res["protocol"]["warmup_steps"] == 1  # round(5% of 20)
    # a constant gradient of 1: Adam's direction is 1, so each update is minus the scheduled rate
    tx, params = captured["make_tx"](jnp.float32(0.1)), jnp.zeros(3)
    state, steps = tx.init(params), []
    for _ in range(num_steps):
        updates, state = tx.update(jnp.ones(3), state, params)
        steps.append(float(-updates[0]))
    expected = optax.warmup_cosine_decay_schedule(0.0, 0.1, 1, num_steps, end_value=0.0)
    np.testing.assert_allclose(steps, [float(expected(t)) for t in range(num_steps)], rtol=1e-4, atol=1e-9)
    assert steps[0] == 0.0 and steps[1] == pytest.approx(0.1, rel=1e-4) and steps[-1] < 1e-3
    table = ot.format_comparison(res, num_steps)
    assert table.startswith("Adam: a linear warm-up from 0 over 1 steps, then cosine decay to 0 at step 20;")
    assert "| adam:cosine(lr=0.01) (best Adam) |" in table
    constant = _fake(monkeypatch, (0.5, 0.2))  # the default: a constant rate, the rows named as before
    assert constant["best_adam"] == "adam(lr=0.01)" and constant["protocol"]["warmup_steps"] == 0
    assert ot.format_comparison(constant, 10).startswith("Adam: a constant rate over the 10 steps;")
    with pytest.raises(ValueError, match="compare_optimizers: adam_schedule: unknown schedule 'cosin'"):
        ot.compare_optimizers(tasks.QuadraticFamily(dim=2), optax.sgd, 0.1, num_tasks=2, num_steps=10,
                              key=jax.random.key(0), adam_schedule="cosin")


def test_the_comparison_setting_schedules_adam_by_default_and_checks_the_schedule():
    from outer_trainers.learner.run_settings import Comparison
    assert Comparison().adam_schedule == "cosine"
    assert Comparison(num_tasks=2, adam_schedule="constant").adam_schedule == "constant"
    with pytest.raises(ValueError, match="Comparison.adam_schedule: unknown schedule 'warmup'"):
        Comparison(num_tasks=2, adam_schedule="warmup")


@pytest.mark.parametrize("kwargs, what", [
    (dict(num_steps=0), "compare_optimizers: num_steps must be an integer >= 1, got 0"),
    (dict(num_tasks=0), "compare_optimizers: num_tasks must be an integer >= 1, got 0"),
    (dict(adam_lrs=()), "compare_optimizers: adam_lrs must hold at least one learning rate"),
    (dict(adam_lrs=(1e-3, -1.0)), "compare_optimizers: adam_lrs must hold .* each finite and > 0"),
])
def test_compare_optimizers_refuses_empty_runs_before_training(monkeypatch, kwargs, what):
    """num_steps=0 / num_tasks=0 used to give NaN tables with an arbitrary best Adam."""
    for fn in ("run_fixed", "tune_learning_rate"):
        monkeypatch.setattr(comparison, fn, lambda *a, **k: pytest.fail("trained despite a bad argument"))
    args = {**dict(num_tasks=2, num_steps=10, key=jax.random.key(0), adam_lrs=(1e-3,)), **kwargs}
    with pytest.raises(ValueError, match=what):
        ot.compare_optimizers(tasks.QuadraticFamily(dim=2), optax.sgd, 0.1, **args)


def test_trainer_and_sampling_refuse_zero_steps_tasks_and_empty_grids():
    fam = tasks.QuadraticFamily(dim=2)
    with pytest.raises(ValueError, match="make_task_trainer: num_steps must be an integer >= 1"):
        ot.make_task_trainer(fam, optax.sgd, 0)
    with pytest.raises(ValueError, match="sample_cfgs: num_tasks must be an integer >= 1"):
        sample_cfgs(fam, jax.random.key(0), 0)
    with pytest.raises(ValueError, match="grid of setting 'adam' is empty"):
        ot.run_settings(fam, [("adam", optax.adam, [])], sample_cfgs(fam, jax.random.key(0), 1),
                        jax.random.split(jax.random.key(1), 1), 5)
    with pytest.raises(ValueError, match="lr_grid must hold at least one learning rate"):
        ot.lr_grid([])


def test_sequential_runs_equal_vmapped_runs():
    """sequential=True (lax.map, for convnets on CPU) trains the same runs as the vmap."""
    fam = tasks.QuadraticFamily(dim=3)
    cfgs = sample_cfgs(fam, jax.random.key(0), 2)
    keys = jax.random.split(jax.random.key(1), 2)
    lrs = np.asarray([0.01, 0.1], np.float32)
    for batched, args in ((True, lrs), (False, lrs[1])):
        vm = ot.make_task_trainer(fam, optax.adam, 12, batched_args=batched)(args, cfgs, keys, fam.data)
        sq = ot.make_task_trainer(fam, optax.adam, 12, batched_args=batched, sequential=True)(args, cfgs, keys, fam.data)
        for a, b in zip(vm, sq):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5)
    assert vm[0].shape == (2, 12) and not np.allclose(vm[0][0], vm[0][1])


def test_vmapped_learned_optimizer_runs_equal_the_sequential_ones():
    """make_task_trainer gives each vmapped task its own copy of tx_args (a learned optimizer's
    theta here, so its products are batched like its activations): the same losses as running the
    tasks one after another."""
    lo = lopt.MLPLOpt(hidden_size=4)
    theta = lo.init(jax.random.key(0))
    fam = tasks.QuadraticFamily(dim=300)  # a 300-parameter vector: MLPLOpt's blocked column-major path
    cfgs, keys = sample_cfgs(fam, jax.random.key(0), 2), jax.random.split(jax.random.key(1), 2)
    runs = [ot.make_task_trainer(fam, lambda th: lo.opt_fn(th), 4, sequential=sequential)(theta, cfgs, keys, fam.data)
            for sequential in (False, True)]
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert not np.allclose(runs[0][0][:, 0], runs[0][0][:, -1])  # the optimizer moved the params
