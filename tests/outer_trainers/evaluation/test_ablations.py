"""Ablation specs build the transforms they document: a shipped optimizer with parts of its rule chain left out
(pretrained:NAME-PART, pretrained:NAME-rules), with an untrained theta (untrained:NAME#SEED), and its rules on a
baseline (rules:NAME@adamw), each compared update by update with the same chain built by hand from lopt.rules'
parts over a few steps. The chain is read from the record at run time, so the hand-built references map each
part name to its lopt.rules function here, independently of the code under test. Fast tests use a stand-in
record (LearnableAdamW, or a small MLPLOpt where the seed matters, inside three parts that wrap any
transform); the shipped names' learned updates compile slowly on a CPU and are in the slow tier."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt
import lopt.pretrained
import tasks
import lopt.rules
from lopt.rules import overshoot_brake
from outer_trainers.evaluation import ablations, baselines, optimizer_labels, resolve_optimizer
from outer_trainers.evaluation.optimizer_specs import is_untuned_baseline, learned_tx
from outer_trainers.evaluation.task_plan import check_arguments

STEPS = 4
HORIZON = 40
FAKE = "fake_v1"
FAKE_CHAIN = [{"part": "growth_limited", "free": 0.5}, {"part": "conv_step_scaled", "scale": 3.0},
              {"part": "overshoot_brake", "gain": 0.2, "threshold": 0.15}]


def convnet():
    k1, k2 = jax.random.split(jax.random.key(1))
    return {"Conv_0": {"kernel": jax.random.normal(k1, (3, 3, 1, 4)) / 3.0, "bias": jnp.zeros(4)},
            "Dense_0": {"kernel": jax.random.normal(k2, (4, 5)) / 3.0, "bias": jnp.zeros(5)}}


def hand_chain(tx, chain, num_steps, *, learned, learning_rate=None):
    """`tx` inside `chain` built from lopt.rules' functions, one call per part as each one's docstring gives it
    (on a baseline: the decay innermost with the baseline's rate, the horizon factor without its residual fade)."""
    if not learned:
        for r in [r for r in chain if r["part"] == "loss_aware_decay"]:
            tx = lopt.rules.loss_aware_decay(tx, learning_rate, r["rate"], loss_power=r.get("loss_power", 1.0),
                                             loss_max=r.get("loss_max", 10.0), loss_free=r.get("loss_free", 1.0))
        chain = [r for r in chain if r["part"] != "loss_aware_decay"]
    for r in chain:
        part = r["part"]
        if part == "scheduled":
            tx = lopt.rules.scheduled(tx, num_steps, r.get("name", "cosine"))
        elif part == "horizon_scaled":
            fade = {"residual_power": r["residual_power"]} if learned and "residual_power" in r else {}
            tx = lopt.rules.horizon_scaled(tx, num_steps, r["reference"], r.get("power", 1.0), **fade)
        elif part == "depth_scaled":
            tx = lopt.rules.depth_scaled(tx, r["reference"], r.get("power", 1.0))
        elif part == "loss_aware_decay":
            tx = lopt.rules.loss_aware_decay(tx, None, r["rate"], loss_power=r.get("loss_power", 1.0),
                                             loss_max=r.get("loss_max", 10.0), loss_free=r.get("loss_free", 1.0))
        elif part == "growth_limited":
            tx = lopt.rules.growth_limited(tx, r["free"])
        elif part == "conv_step_scaled":
            tx = lopt.rules.conv_step_scaled(tx, r["scale"])
        elif part == "overshoot_brake":
            tx = overshoot_brake.overshoot_brake(tx, r["gain"], r.get("threshold", 0.15))
        else:
            raise AssertionError(f"the test knows no part {part!r}: add its lopt.rules call above")
    return tx


def assert_same_updates(got, want, params, *, rtol=0.0):
    """Both transforms at the same params with the same gradients and losses for STEPS steps, in one program."""
    def step(carry, i):
        p, sa, sb = carry
        g = jax.tree_util.tree_map(lambda x: jnp.cos(3.0 * x + i) - 0.3 * x, p)
        loss = 2.0 / (1.0 + i.astype(jnp.float32))
        ua, sa = want.update(g, sa, p, loss=loss)
        ub, sb = got.update(g, sb, p, loss=loss)
        return (jax.tree_util.tree_map(jnp.add, p, ua), sa, sb), (ua, ub)

    carry = (params, want.init(params), got.init(params))
    _, (ua, ub) = jax.jit(lambda c: jax.lax.scan(step, c, jnp.arange(STEPS)))(carry)
    for a, b in zip(jax.tree_util.tree_leaves(ua), jax.tree_util.tree_leaves(ub)):
        assert np.any(np.asarray(a) != 0)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=rtol, atol=0.0 if rtol == 0 else 1e-9)


def install_fake(monkeypatch, learned_opt, theta):
    """A shipped name FAKE: `learned_opt` with `theta` inside FAKE_CHAIN, as lopt.pretrained presents it."""
    real_info, real_names, real_load = (lopt.pretrained.info, lopt.pretrained.names,
                                        lopt.pretrained.load_learned_optimizer_by_name)
    record = {"name": FAKE, "architecture": learned_opt.name, "config": learned_opt.config(), "deploy_options": {}}
    monkeypatch.setattr(lopt.pretrained, "names", lambda: real_names() + [FAKE])
    monkeypatch.setattr(lopt.pretrained, "info", lambda n: {**record, "rules": [dict(r) for r in FAKE_CHAIN]}
                        if n == FAKE else real_info(n))
    monkeypatch.setattr(lopt.pretrained, "load_learned_optimizer_by_name",
                        lambda n: (learned_opt, theta) if n == FAKE else real_load(n))
    return learned_opt, theta


@pytest.fixture
def fake_record(monkeypatch):
    """FAKE as a LearnableAdamW (cheap to compile) whose shipped theta is not its init."""
    learned_opt = lopt.LearnableAdamW(learning_rate=1e-3)
    theta = {"log_lr": jnp.float32(np.log(2e-2)), "weight_decay": jnp.float32(0.1)}
    return install_fake(monkeypatch, learned_opt, theta)


@pytest.fixture
def fake_seeded_record(monkeypatch):
    """FAKE as a small MLPLOpt, whose init depends on its key."""
    learned_opt = lopt.MLPLOpt(hidden_size=2, hidden_layers=1)
    return install_fake(monkeypatch, learned_opt, learned_opt.init(jax.random.key(42)))


def test_the_chain_is_the_records_rules_read_now(fake_record):
    assert baselines.record_chain(FAKE) == FAKE_CHAIN
    assert baselines.record_chain("celo2_v9") == lopt.pretrained.info("celo2_v9")["rules"]
    assert baselines.chain_without(FAKE_CHAIN, ("conv_step_scaled",)) == [FAKE_CHAIN[0], FAKE_CHAIN[2]]
    assert baselines.chain_without(FAKE_CHAIN, ("rules",)) == []
    parts = [r["part"] for r in lopt.pretrained.info("celo2_v9")["rules"]]
    assert ablations.ablation_specs("celo2_v9") == (
        ["pretrained:celo2_v9", "pretrained:celo2_v9-rules"] + [f"pretrained:celo2_v9-{p}" for p in parts]
        + ["rules:celo2_v9@adamw", "untrained:celo2_v9"])


@pytest.mark.parametrize("left_out", [(), ("growth_limited",), ("conv_step_scaled", "overshoot_brake"), ("rules",)])
def test_a_learned_optimizer_without_parts_of_its_chain_is_the_rest_of_the_chain(fake_record, left_out):
    learned_opt, theta = fake_record
    spec = "pretrained:" + "-".join((FAKE,) + left_out) if left_out else None
    ab = ablations.parse_ablation(spec) if spec else ablations.Ablation(FAKE, FAKE, (), True)
    assert ab.name == FAKE and ab.without == left_out and ab.trained
    kept = [] if left_out == ("rules",) else [r for r in FAKE_CHAIN if r["part"] not in left_out]
    want = hand_chain(learned_opt.opt_fn(theta, num_steps=HORIZON), kept, HORIZON, learned=True)
    assert_same_updates(ablations.ablation_tx(ab, HORIZON), want, convnet())


def test_an_untrained_theta_is_the_architectures_init_at_the_seed(fake_seeded_record):
    learned_opt, shipped = fake_seeded_record
    opt = resolve_optimizer(f"untrained:{FAKE}-overshoot_brake#3", "u")
    assert opt["kind"] == "ablation" and opt["ablation"].seed == 3 and not opt["ablation"].trained
    equal = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                                  jax.tree_util.tree_leaves(b)))
    assert equal(opt["theta"], learned_opt.init(jax.random.key(3)))
    assert not equal(opt["theta"], shipped) and not equal(opt["theta"], learned_opt.init(jax.random.key(0)))
    assert equal(resolve_optimizer(f"untrained:{FAKE}", "u")["theta"], learned_opt.init(jax.random.key(0)))


def test_the_evaluation_runs_an_ablation_with_its_theta_as_the_argument(fake_record):
    learned_opt, shipped = fake_record
    opt = resolve_optimizer(f"untrained:{FAKE}-overshoot_brake", "u")
    make_tx, tx_args = learned_tx(opt, HORIZON)  # the transform the evaluation runs, theta traced
    want = hand_chain(learned_opt.opt_fn(learned_opt.init(jax.random.key(0)), num_steps=HORIZON), FAKE_CHAIN[:2],
                      HORIZON, learned=True)
    assert_same_updates(make_tx(tx_args), want, convnet())


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_rules_on_adamw_are_the_records_chain_around_optax_adamw(schedule):
    """rules:celo2_v9@adamw[:SCHEDULE] as tuning builds it: AdamW at the rate (and schedule) of the grid point, its
    own decay 0 where the chain decays, inside celo2_v9's chain read now, the decay's step size AdamW's rate."""
    spec = "rules:celo2_v9@adamw" + ("" if schedule == "constant" else f":{schedule}")
    chain = lopt.pretrained.info("celo2_v9")["rules"]
    if schedule != "constant" and any(r["part"] == "scheduled" for r in chain):
        pytest.skip("celo2_v9's chain schedules the step itself: a second schedule is refused (tested below)")
    make_tx, decays, schedules = baselines.baseline_setup(spec, baselines.BaselineTuning(), HORIZON)
    assert schedules == (schedule,)
    assert decays == ((0.0,) if any(r["part"] == "loss_aware_decay" for r in chain)
                      else baselines.BaselineTuning().weight_decays("adamw"))
    lr = 3e-3
    got = make_tx({"learning_rate": jnp.float32(lr), "weight_decay": jnp.float32(decays[0]),
                   "schedule": jnp.int32(baselines.schedule_index(schedule))})
    rate = baselines.lr_schedule(schedule, lr, HORIZON)
    want = hand_chain(optax.adamw(rate, weight_decay=decays[0]), chain, HORIZON, learned=False, learning_rate=rate)
    assert_same_updates(got, want, convnet(), rtol=1e-6)


def test_a_synthetic_chain_on_adamw_takes_every_part_and_decays_at_adamws_scheduled_rate():
    """Every part a chain may name, on AdamW: the horizon factor without its residual fade, the decay innermost
    at AdamW's rate, so that the chain's step-size factors scale AdamW's step and its decay alike."""
    chain = [{"part": "growth_limited", "free": 0.5},
             {"part": "loss_aware_decay", "rate": 0.5, "loss_power": 1.0, "loss_max": 10.0, "loss_free": 1.0},
             {"part": "conv_step_scaled", "scale": 3.0}, {"part": "overshoot_brake", "gain": 0.2, "threshold": 0.15}]
    make_tx = baselines.rules_baseline(chain, "adamw", HORIZON)
    lr = 1e-2
    got = make_tx({"learning_rate": jnp.float32(lr), "weight_decay": jnp.float32(0.0),
                   "schedule": jnp.int32(baselines.schedule_index("cosine"))})
    rate = baselines.lr_schedule("cosine", lr, HORIZON)
    want = overshoot_brake.overshoot_brake(lopt.rules.conv_step_scaled(lopt.rules.growth_limited(
        lopt.rules.loss_aware_decay(optax.adamw(rate, weight_decay=0.0), rate, 0.5, loss_free=1.0), 0.5), 3.0), 0.2)
    assert_same_updates(got, want, convnet(), rtol=1e-6)


@pytest.mark.parametrize("spec, message", [
    ("pretrained:celo2_v9-no_such_part", r"'no_such_part' is not a rule of celo2_v9's chain.*celo2_v9-rules"),
    ("pretrained:celo2_v9-growth_limited-growth_limited", r"left out twice"),
    ("pretrained:celo2_v9-rules-growth_limited", r"'rules' is not a rule"),
    ("untrained:celo2_v9#x", r"seed after '#' must be an integer >= 0, got 'x'"),
    ("untrained:no_such_name", r"no pretrained optimizer named 'no_such_name'"),
])
def test_a_wrong_ablation_spec_names_its_cause(spec, message):
    assert ablations.is_ablation(spec) and is_untuned_baseline(spec)
    with pytest.raises(ValueError, match=message):
        resolve_optimizer(spec, spec)


@pytest.mark.parametrize("spec, message", [
    ("rules:celo2_v9", r"a rules spec is rules:NAME\[-PART...\]@BASELINE"),
    ("rules:celo2_v9@adamx", r"its baseline: unknown baseline 'adamx'"),
    ("rules:no_such_name@adamw", r"no pretrained optimizer named 'no_such_name'"),
    ("rules:celo2_v9-rules@adamw", r"leaves out every rule of celo2_v9: that is the baseline 'adamw' alone"),
    ("rules:celo2_v9@adamw:weekly", r"unknown schedule 'weekly'"),
])
def test_a_wrong_rules_spec_names_its_cause(spec, message):
    assert baselines.is_tuned_baseline(spec)
    with pytest.raises(ValueError, match=message):
        baselines.parse_baseline(spec)
    with pytest.raises(ValueError, match=message):
        resolve_optimizer(spec, spec)


def test_a_second_schedule_on_a_chain_that_schedules_is_refused(monkeypatch):
    chain = [{"part": "scheduled", "name": "cosine"}, {"part": "growth_limited", "free": 4.0}]
    real = lopt.pretrained.info
    monkeypatch.setattr(lopt.pretrained, "info", lambda n: {**real(n), "rules": chain} if n == "celo2_v9" else real(n))
    with pytest.raises(ValueError, match=r"chain schedules the step over the horizon \('scheduled'\); a second "
                                         r"schedule would multiply it: write rules:celo2_v9@adamw"):
        baselines.parse_baseline("rules:celo2_v9@adamw:tuned")
    assert baselines.parse_baseline("rules:celo2_v9@adamw") == ("adamw", "constant")


def test_the_specs_are_accepted_where_evaluate_takes_them(tmp_path):
    specs = ["pretrained:celo2_v9-rules", "untrained:celo2_v9", "rules:celo2_v9@adamw"]
    assert optimizer_labels(specs) == specs
    assert [resolve_optimizer(s, s)["kind"] for s in specs] == ["ablation", "ablation", "baseline"]
    task = [tasks.QuadraticFamily(dim=2)]
    plan = check_arguments(str(tmp_path), specs, None, task, 10, 1,
                           ["adamw:tuned", "rules:celo2_v9-growth_limited@adamw", "pretrained:celo2_v9-rules"],
                           {}, 0.9, "test")
    assert len(plan) == 1
    with pytest.raises(ValueError, match=r"unknown baselines \['pretrained:celo2_v9-nope'\]"):
        check_arguments(str(tmp_path), specs, None, task, 10, 1, ["pretrained:celo2_v9-nope"], {}, 0.9, "test")


@pytest.mark.slow  # five Celo2LOpt updates compiled
@pytest.mark.parametrize("name", [lopt.pretrained.RECOMMENDED])
def test_a_shipped_names_ablations_are_its_architecture_inside_the_rest_of_its_chain(name):
    chain = lopt.pretrained.info(name)["rules"]
    learned_opt, theta = ablations.preset_architecture(name)
    # nothing left out is lopt.pretrained.load's transform, bit for bit: the architecture is load's
    full = ablations.ablation_tx(ablations.Ablation(name, name, (), True), HORIZON)
    assert_same_updates(full, lopt.pretrained.load(name, num_steps=HORIZON), convnet())
    for part in dict.fromkeys(r["part"] for r in chain):
        want = hand_chain(learned_opt.opt_fn(theta, num_steps=HORIZON), [r for r in chain if r["part"] != part],
                          HORIZON, learned=True)
        assert_same_updates(ablations.ablation_tx(ablations.parse_ablation(f"pretrained:{name}-{part}"), HORIZON),
                            want, convnet())
    assert_same_updates(ablations.ablation_tx(ablations.parse_ablation(f"pretrained:{name}-rules"), HORIZON),
                        learned_opt.opt_fn(theta, num_steps=HORIZON), convnet())


def test_rules_baselines_run_with_another_chain_are_not_reused(tmp_path, monkeypatch):
    """A finished task keeps the chains its ablation and rules specs ran with (`rule_chains`): an evaluation that
    reuses its baselines (--baselines_from) takes a rules baseline only where its chain is the same."""
    from outer_trainers.evaluation.task_store import TaskStore
    spec, other = "rules:celo2_v9-growth_limited@adamw", "adamw:tuned"
    chains = ablations.rule_chains(["pretrained:celo2_v9-rules", spec, other, "untrained:celo2_v9-conv_step_scaled"])
    chain = lopt.pretrained.info("celo2_v9")["rules"]
    assert chains == {"pretrained:celo2_v9-rules": [], spec: [r for r in chain if r["part"] != "growth_limited"],
                      "untrained:celo2_v9-conv_step_scaled": [r for r in chain if r["part"] != "conv_step_scaled"]}
    task = {"name": "t", "num_steps": 10}
    runs = {"runs": [{"optimizer": spec, "x": 1}, {"optimizer": other, "x": 2}]}
    TaskStore(str(tmp_path), {"grids": [1], "rule_chains": {spec: chains[spec]}}).save("t", task, runs)
    earlier = lambda settings: TaskStore(str(tmp_path), settings)
    same, why = earlier({"grids": [1], "rule_chains": {spec: chains[spec]}}).baseline_runs("t", task, [spec, other])
    assert set(same) == {spec, other} and why == ""
    changed = {spec: chains[spec] + [{"part": "growth_limited", "free": 1.0}]}
    reused, why = earlier({"grids": [1], "rule_chains": changed}).baseline_runs("t", task, [spec, other])
    assert set(reused) == {other} and why == f"{spec} ran with another rule chain (the record changed since)"
    with pytest.raises(ValueError, match=r"other settings \(evaluation.rule_chains\)"):
        earlier({"grids": [1], "rule_chains": changed}).load("t", task)  # nor is the finished task resumed
