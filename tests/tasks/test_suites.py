"""tasks.suites: fixed held-out task lists, their static configs, and the check that no shipped
optimizer's meta-training family can draw a suite task."""
import glob
import os
import re

import gin
import jax
import numpy as np
import pytest

import lopt.pretrained
import tasks
from tasks import registry, suites
from tasks.datasets import DatasetNotFoundError, image_files, locate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def reads_no_dataset_file(monkeypatch):
    """Fails the test if a dataset file is looked for: static configs and overlaps must come from
    the families' static description, never from loading their data (so they run without it)."""
    def refuse(name, *args, **kwargs):
        raise AssertionError(f"dataset {name!r} was loaded: a static check must not need its files")
    monkeypatch.setattr(registry, "_CACHE", {})
    monkeypatch.setattr(image_files, "find_files", refuse)


def test_suites_by_name_and_an_unknown_name_lists_them():
    assert {"heldout-cpu", "heldout-cpu-mnist", "smoke", "validation-cpu", "long-horizon-cpu", "lm-cpu",
            "scaling-cpu"} <= set(suites.names())
    with pytest.raises(ValueError, match=r"unknown suite 'nope'; the suites are \[.*'heldout-cpu'"):
        suites.get("nope")


def test_heldout_cpu_spans_datasets_architectures_and_horizons():
    suite = suites.get("heldout-cpu")
    assert len(suite) >= 10 and len({t.name for t in suite}) == len(suite)
    assert all(300 <= t.num_steps <= 2000 and len(t.seeds) >= 3 and t.eval_split == "test" for t in suite)
    assert min(t.num_steps for t in suite) == 300 and max(t.num_steps for t in suite) == 2000
    assert {"digits", "signals1d", "fashion_mnist_14", "grammar_text"} <= {t.dataset for t in suite}
    assert {t.kind for t in suite} == {"image_mlp", "conv", "conv_bn", "byte_lm", "linear_regression"}
    bn = [dict(t.arch) for t in suite if t.kind == "conv_bn"]  # BatchNorm + dropout convnets of two depths
    assert len(bn) == 2 and len({len(a["channels"]) for a in bn}) == 2 and all(a["dropout"] > 0 for a in bn)
    assert {dict(t.arch)["model"] for t in suite if t.kind == "byte_lm"} == {"transformer", "lstm"}
    mlps = {dict(t.arch)["hidden_sizes"] for t in suite if t.kind == "image_mlp"}
    assert len({len(h) for h in mlps}) >= 3 and len({max(h) for h in mlps}) >= 4  # depths 1-3, several widths
    assert len({t.static_config() for t in suite}) == len(suite)  # no task twice
    smoke = suites.get("smoke")
    assert 2 <= len(smoke) <= 3 and all(t.num_steps <= 100 for t in smoke)


def test_built_families_report_exactly_the_declared_static_config(reads_no_dataset_file):
    """What the overlap check compares is what `build` trains; it is read without the data."""
    for t in [t for name in suites.names() for t in suites.get(name)]:
        family = t.build(load_data=False)
        assert suites.static_configs(family) == [t.static_config()], t.name
        assert len(family.activations if hasattr(family, "activations") else [None]) == 1


def test_a_missing_dataset_gives_an_error_naming_it(monkeypatch, tmp_path):
    """`build` loads the data (evaluation needs it), so a missing dataset is reported there, by name."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LOPT_DATA_DIR", raising=False)
    monkeypatch.setattr(locate, "SYSTEM_DIRS", {})  # missing here even where a distribution package installed it
    monkeypatch.setattr(registry, "_CACHE", {})
    mnist = [t for t in suites.get("heldout-cpu-mnist") if t.dataset.startswith("mnist")]
    assert len(mnist) == 2
    with pytest.raises(DatasetNotFoundError, match=r"dataset 'mnist': looked for .* To get them"):
        mnist[0].build()
    fmnist = next(t for t in suites.get("heldout-cpu") if t.dataset.startswith("fashion_mnist"))
    family = fmnist.build(load_data=False)  # the static description needs no file
    with pytest.raises(DatasetNotFoundError, match=r"dataset 'fashion_mnist': .*apt-get install dataset-fashion-mnist"):
        family.data
    with pytest.raises(DatasetNotFoundError, match=r"dataset 'fashion_mnist': .*apt-get install dataset-fashion-mnist"):
        fmnist.build()


def test_grammar_text_is_fixed_ascii_sentences():
    text = suites.grammar_text(5000)
    assert text == suites.grammar_text(5000) and len(text) == 5000 and text != suites.grammar_text(5000, seed=1)
    words = text.decode("ascii").replace(",", " ").replace(".", " ").lower().split()
    assert text[:1].isupper() and text.count(b". ") > 50
    assert set(words[:-1]) <= set(suites._NOUNS + suites._VERBS + suites._ADJECTIVES + suites._ADVERBS
                                  + suites._PREPOSITIONS + ("the", "a", "every", "one", "and"))


@pytest.mark.parametrize("name", ["grammar_text", "arithmetic_text"])
def test_the_procedural_texts_are_registered_datasets_a_byte_lm_family_reads_by_name(name):
    from tasks import ByteLMFamily, registry
    data = registry.get_dataset(name, 8)
    tokens = np.asarray(data.batch(jax.random.key(0), "train")["tokens"])
    assert data.name == name and tokens.shape == (8, 32) and tokens.dtype == np.uint8
    corpus = suites.TEXTS[name]()
    assert bytes(tokens[0]) in corpus  # windows of the corpus itself
    family = ByteLMFamily(name, "lstm", batch_size=8, embed_dim=8, hidden_size=8)
    assert family.data is data and not suites.overlaps(suites.get("lm-cpu"), family)


class _Built(Exception):
    """Carries the estimators scripts/outer_train.py's train() built, instead of meta-training with them."""


def _meta_training_families(path, tmp_path, monkeypatch):
    """Every task family a meta-training gin config trains on: the family of each estimator that
    scripts/outer_train.py's train() builds (train.task_family, or each estimator's own family)."""
    import outer_train  # scripts/ is on sys.path via conftest
    from outer_trainers.gin_registry import load_config

    captured = []

    def capture(learner, estimators, *args, **kwargs):
        captured.extend(estimators)
        raise _Built()

    monkeypatch.setattr(outer_train.ot, "outer_train", capture)
    gin.clear_config()
    try:
        # validation during the run (Validation.*) trains suite tasks on purpose: not a
        # meta-training family, and it loads their data, so it is switched off here; a recipe that
        # starts from an earlier stage's run (train.theta_init = a file) is checked without that file
        load_config([path], ["Validation.every = 0", "Validation.suite = None", "train.theta_init = None",
                             "Reporting.tensorboard = False", "Reporting.progress = False"])
        with pytest.raises(_Built):
            outer_train.train(str(tmp_path / ("run_" + os.path.basename(path))))  # a new directory
    finally:
        gin.clear_config()
    return [est.truncated_step.task_family for est in captured]


def test_no_suite_task_is_in_a_shipped_optimizers_meta_training_family(tmp_path, monkeypatch, reads_no_dataset_file):
    suite = suites.get("heldout-cpu-mnist")  # a superset of heldout-cpu
    configs = sorted(glob.glob(os.path.join(ROOT, "scripts", "configs", "pretrained_*.gin")))
    configs.append(os.path.join(ROOT, "scripts", "configs", "quickstart.gin"))
    families = {}
    for path in configs:
        for i, family in enumerate(_meta_training_families(path, tmp_path, monkeypatch)):
            families[f"{os.path.basename(path)}[estimator {i}]"] = family
            assert suites.static_configs(family), path  # the checker saw what the family draws
    assert any(label.startswith("quickstart.gin") for label in families)
    for name in suites.names():  # heldout-cpu(-mnist), validation-cpu, long-horizon-cpu, lm-cpu, scaling-cpu, smoke
        assert suites.held_out_report(suites.get(name), families) is None, name
    # The checker catches a family that does draw suite tasks, through augmentations and mixtures.
    overlapping = tasks.ImageMLPFamily("digits", (64, 64), batch_size=64, activations=("relu", "tanh"))
    assert suites.overlaps(suite, overlapping) == ["digits_mlp_64x64_tanh"]
    assert suites.overlaps(suite, tasks.ScaleReparam(overlapping, (0.5, 2.0))) == ["digits_mlp_64x64_tanh"]
    big_batch = tasks.ImageMLPFamily("digits", (64, 64), batch_size=128, activations=("tanh",))
    assert suites.overlaps(suite, big_batch) == []  # another batch size is another static config
    assert suites.overlaps(suite, tasks.ReducedBatchSize(big_batch, 64)) == ["digits_mlp_64x64_tanh"]
    lm = tasks.ByteLMFamily(suites._grammar_source(16, 32), "lstm", embed_dim=16, hidden_size=48)

    class Mixture(tasks.TaskFamily):
        def __init__(self, families):
            self.families = families

    report = suites.held_out_report(suite, {"mix.gin": Mixture([big_batch, lm])})
    assert report == "suite tasks drawn by meta-training families: mix.gin: text_lstm_h48"
    # ... and the new kinds and suites: an autoencoder family, an LM on the arithmetic text, a wide MLP
    ae = tasks.ScaleReparam(tasks.AutoencoderFamily("digits", (32, 8, 32), batch_size=64, activations=("relu", "tanh")),
                            (0.5, 2.0))
    assert suites.overlaps(suites.get("long-horizon-cpu"), ae) == ["long_digits_autoencoder_32x8x32_relu"]
    assert suites.overlaps(suites.get("long-horizon-cpu"), tasks.ReducedBatchSize(ae, 32)) == []
    arith = tasks.ByteLMFamily(suites._text_source("arithmetic_text", 16, 32), "lstm", embed_dim=16, hidden_size=64)
    assert suites.overlaps(suites.get("lm-cpu"), arith) == ["lm_arith_lstm_h64"]
    wide = tasks.ImageMLPFamily("digits", (256, 256), batch_size=64, activations=("tanh",))
    assert suites.overlaps(suites.get("scaling-cpu"), wide) == ["digits_mlp_64x64_tanh_x4wide"]
    with pytest.raises(TypeError, match="cannot tell the static configs of Opaque"):
        suites.static_configs(type("Opaque", (tasks.TaskFamily,), {})())


def test_validation_suite_is_disjoint_from_the_test_suite(reads_no_dataset_file):
    """validation-cpu picks checkpoints; none of its tasks may be (or draw) a heldout-cpu task."""
    test = {t.static_config() for t in suites.get("heldout-cpu-mnist")}
    val = suites.get("validation-cpu")
    assert len(val) >= 5 and not test & {t.static_config() for t in val}
    for t in val:
        assert suites.overlaps(suites.get("heldout-cpu-mnist"), t.build(load_data=False)) == [], t.name


def _static(suite_name):
    return {t.static_config() for t in suites.get(suite_name)}


def test_new_suites_are_disjoint_from_the_test_and_validation_suites_and_name_each_task_once(reads_no_dataset_file):
    existing = _static("heldout-cpu-mnist") | _static("validation-cpu") | _static("smoke")
    for name in ("long-horizon-cpu", "lm-cpu", "scaling-cpu"):
        suite = suites.get(name)
        assert len({t.name for t in suite}) == len(suite) == len(_static(name)), name
        assert not _static(name) & existing, name
        assert all(len(t.seeds) >= 3 and t.eval_split == "test" for t in suite), name
    assert not _static("long-horizon-cpu") & _static("lm-cpu") and not _static("lm-cpu") & _static("scaling-cpu")
    assert _static("long-horizon-50k-cpu") == _static("long-horizon-cpu")  # the same tasks, longer
    assert not _static("long-horizon-cpu") & _static("scaling-cpu")
    # validation-cpu's tasks at 10 000 steps: nothing of a test suite
    assert _static("validation-long-cpu") == _static("validation-cpu")
    assert {t.num_steps for t in suites.get("validation-long-cpu")} == {10_000}
    # validation-cpu's MLPs wider and deeper: none of them is a scaling-cpu (or other test suite) task
    tests = _static("heldout-cpu-mnist") | _static("scaling-cpu") | _static("long-horizon-cpu") | _static("lm-cpu")
    assert not _static("validation-scaling-cpu") & tests
    # signals1d GELU and swish-LayerNorm MLPs, 4x wider and 3x deeper: none of a test or validation suite
    signals = suites.get("validation-signals-cpu")
    assert not _static("validation-signals-cpu") & (tests | existing | _static("validation-scaling-cpu"))
    assert {t.dataset for t in signals} == {"signals1d"} and {t.kind for t in signals} == {"image_mlp"}
    assert {dict(t.arch)["activation"] for t in signals} == {"gelu", "swish"}
    assert {dict(t.arch)["norm"] for t in signals} == {None, "layer"}
    assert {t.name[-7:] for t in signals} == {"_x4wide", "_x3deep"}
    assert all(len(t.seeds) == 3 and t.eval_split == "test" for t in signals)
    # convnets on three datasets: none of a test or validation suite
    conv = suites.get("validation-conv-cpu")
    others = _static("validation-scaling-cpu") | _static("validation-signals-cpu")
    assert not _static("validation-conv-cpu") & (tests | existing | others)
    assert {t.kind for t in conv} == {"conv", "conv_bn"}
    assert {t.dataset for t in conv} == {"digits", "fashion_mnist_7", "signals1d"}
    # its BatchNorm + dropout convnets: datasets, widths and depths that heldout-cpu's do not have
    val_bn = [t for t in conv if t.kind == "conv_bn"]
    test_bn = [t for t in suites.get("heldout-cpu") if t.kind == "conv_bn"]
    assert len(val_bn) == 2 and not {t.dataset for t in val_bn} & {t.dataset for t in test_bn}
    assert not {dict(t.arch)["channels"] for t in val_bn} & {dict(t.arch)["channels"] for t in test_bn}
    assert all(len(t.seeds) == 3 and t.eval_split == "test" for t in conv)


def _longest_meta_training_horizon():
    """The largest unroll length of the shipped recipes' truncation schedules, read from their gin files.

    Shipped: the recipe of a name `lopt.pretrained` ships (a recipe whose run is under way does not count
    until its optimizer ships, with a long-horizon suite to match)."""
    lengths = []
    for name in lopt.pretrained.names():
        path = os.path.join(ROOT, "scripts", "configs", f"pretrained_{name}.gin")
        text = open(path).read()
        lengths += [int(v) for v in re.findall(r"^\s*\S*TruncationSchedule\.(?:max_length|length)\s*=\s*(\d+)", text,
                                                re.M)]
    assert len(lengths) >= 3
    return max(lengths)


def test_long_horizon_suite_budgets_are_at_least_5x_the_longest_meta_training_horizon():
    suite = suites.get("long-horizon-cpu")
    horizon = _longest_meta_training_horizon()
    # a shipped recipe meta-trained past 10 000 steps needs a suite longer than long-horizon-50k-cpu
    assert 2000 <= horizon <= 10_000
    assert all(t.num_steps >= 10_000 for t in suite), [(t.name, t.num_steps) for t in suite]
    long50k = suites.get("long-horizon-50k-cpu")
    assert all(t.num_steps >= max(50_000, 5 * horizon) for t in long50k), [(t.name, t.num_steps) for t in long50k]
    # the same tasks at 5x the budgets
    assert [(t.static_config(), 5 * t.num_steps, t.seeds) for t in suite] == [
        (t.static_config(), t.num_steps, t.seeds) for t in long50k]
    assert all(t.name.startswith("long50k_") for t in long50k) and len({t.name for t in long50k}) == len(long50k)
    kinds = {(t.kind, t.dataset) for t in suite}
    assert {("autoencoder", "digits"), ("image_mlp", "digits"), ("conv", "digits"),
            ("linear_regression", "regression_dim200")} <= kinds
    issue_ae = next(t for t in suite if t.kind == "autoencoder" and t.dataset == "digits")
    assert dict(issue_ae.arch) == {"activation": "relu", "hidden_sizes": (32, 8, 32)} and issue_ae.batch_size == 64
    assert len([t for t in suite if t.kind == "image_mlp" and t.dataset == "digits"]) >= 2


def test_long_horizon_and_lm_suites_build_from_built_in_data_and_state_their_trivial_losses():
    """Both suites need no file: every task builds with its data into a task with a scalar loss
    (traced only: the families' numbers are checked in their own tests)."""
    for t in suites.get("long-horizon-cpu") + suites.get("lm-cpu"):
        family = t.build()
        task = family.task_fn(family.sample(jax.random.key(0)))

        def initial_loss(key):
            return task.loss(task.init(key), key, family.data.batch(key, "train"))

        out = jax.eval_shape(initial_loss, jax.random.key(1))
        assert out.shape == () and out.dtype == np.float32, t.name
        if t.kind in ("autoencoder", "linear_regression"):
            assert 0 < task.trivial_loss(t.eval_split) < float("inf"), t.name
    ae = next(t for t in suites.get("long-horizon-cpu") if t.name == "long_digits_autoencoder_32x8x32_relu").build()
    assert ae.task_fn(ae.sample(jax.random.key(0))).trivial_loss() == pytest.approx(0.0742, abs=5e-4)


def test_lm_suite_spans_models_sizes_and_two_offline_texts():
    suite = suites.get("lm-cpu")
    assert {t.kind for t in suite} == {"byte_lm"} and {t.dataset for t in suite} == {"grammar_text", "arithmetic_text"}
    arch = [dict(t.arch) for t in suite]
    assert len({a["d_model"] for a in arch if a["model"] == "transformer"}) >= 3
    assert len({a["num_layers"] for a in arch if a["model"] == "transformer"}) >= 2
    assert len({a["hidden_size"] for a in arch if a["model"] == "lstm"}) >= 2
    assert all(500 <= t.num_steps <= 2000 for t in suite)


def test_arithmetic_text_is_fixed_and_every_line_is_right():
    text = suites.arithmetic_text(20_000)
    assert text == suites.arithmetic_text(20_000) and len(text) == 20_000
    assert text != suites.arithmetic_text(20_000, seed=1)
    lines = text.decode("ascii").split("\n")[:-1]  # the last line may be cut
    assert len(lines) > 1000
    for line in lines:
        m = re.fullmatch(r"(\d{1,3})([+-])(\d{1,3})=(-?\d+)", line)
        assert m, line
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        assert c == (a + b if op == "+" else a - b), line
    assert {"+", "-"} <= {m for line in lines for m in "+-" if m in line.split("=")[0]}
    with pytest.raises(ValueError, match="unknown suite text 'nope'"):
        suites._text_source("nope", 4, 8)


@pytest.mark.parametrize("base_suite, scaled_suite", [("heldout-cpu", "scaling-cpu"),
                                                       ("validation-cpu", "validation-scaling-cpu")])
def test_scaling_suites_are_their_base_suites_mlps_4x_wider_and_3x_deeper(base_suite, scaled_suite,
                                                                          reads_no_dataset_file):
    base_mlps = {t.name: t for t in suites.get(base_suite) if t.kind == "image_mlp"}
    scaled = {t.name: t for t in suites.get(scaled_suite)}
    assert len(base_mlps) >= 3
    assert set(scaled) == {f"{n}_x4wide" for n in base_mlps} | {f"{n}_x3deep" for n in base_mlps}
    for name, base in base_mlps.items():
        hidden = dict(base.arch)["hidden_sizes"]
        wide, deep = scaled[f"{name}_x4wide"], scaled[f"{name}_x3deep"]
        assert dict(wide.arch)["hidden_sizes"] == tuple(4 * h for h in hidden)
        assert len(dict(deep.arch)["hidden_sizes"]) == 3 * len(hidden)
        assert sorted(set(dict(deep.arch)["hidden_sizes"])) == sorted(set(hidden))
        for t in (wide, deep):
            same = ("kind", "dataset", "batch_size", "num_steps", "seeds", "eval_split")
            assert [getattr(t, k) for k in same] == [getattr(base, k) for k in same], t.name
            assert {k: v for k, v in t.arch if k != "hidden_sizes"} == {k: v for k, v in base.arch if k != "hidden_sizes"}


def test_a_meta_training_recipe_can_train_on_a_byte_lm_family(tmp_path, monkeypatch):
    """ByteLMFamily is bound in gin (it is in tasks.__all__): a recipe names it and its text file, and
    the overlap checker reads what it draws."""
    text = tmp_path / "corpus.txt"
    text.write_bytes(suites.grammar_text(20_000, seed=7))
    recipe = tmp_path / "lm_recipe.gin"
    quickstart = open(os.path.join(ROOT, "scripts", "configs", "quickstart.gin")).read()
    recipe.write_text(quickstart + f"""
train.task_family = @ByteLMFamily()
ByteLMFamily.dataset = "text:{text}"
ByteLMFamily.model = "lstm"
ByteLMFamily.batch_size = 8
ByteLMFamily.embed_dim = 16
ByteLMFamily.hidden_size = 24
Comparison.num_tasks = 0
""")
    (family,) = _meta_training_families(str(recipe), tmp_path, monkeypatch)
    assert isinstance(family, tasks.ByteLMFamily) and family.model_kwargs == {"embed_dim": 16, "hidden_size": 24}
    assert suites.static_configs(family) == [(("batch_size", 8), ("dataset", "text_corpus"), ("embed_dim", 16),
                                              ("hidden_size", 24), ("kind", "byte_lm"), ("model", "lstm"),
                                              ("seq_len", 64))]
    assert suites.held_out_report(suites.get("lm-cpu"), {"lm_recipe.gin": family}) is None
