"""tasks.suites: fixed held-out task lists, their static configs, and the check that no shipped
optimizer's meta-training family can draw a suite task."""
import glob
import os

import gin
import pytest

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
    assert {"heldout-cpu", "heldout-cpu-mnist", "smoke", "validation-cpu"} <= set(suites.names())
    with pytest.raises(ValueError, match=r"unknown suite 'nope'; the suites are \[.*'heldout-cpu'"):
        suites.get("nope")


def test_heldout_cpu_spans_datasets_architectures_and_horizons():
    suite = suites.get("heldout-cpu")
    assert len(suite) >= 10 and len({t.name for t in suite}) == len(suite)
    assert all(300 <= t.num_steps <= 2000 and len(t.seeds) >= 3 and t.eval_split == "test" for t in suite)
    assert min(t.num_steps for t in suite) == 300 and max(t.num_steps for t in suite) == 2000
    assert {"digits", "signals1d", "fashion_mnist_14", "grammar_text"} <= {t.dataset for t in suite}
    assert {t.kind for t in suite} == {"image_mlp", "conv", "byte_lm", "linear_regression"}
    assert {dict(t.arch)["model"] for t in suite if t.kind == "byte_lm"} == {"transformer", "lstm"}
    mlps = {dict(t.arch)["hidden_sizes"] for t in suite if t.kind == "image_mlp"}
    assert len({len(h) for h in mlps}) >= 3 and len({max(h) for h in mlps}) >= 4  # depths 1-3, several widths
    assert len({t.static_config() for t in suite}) == len(suite)  # no task twice
    smoke = suites.get("smoke")
    assert 2 <= len(smoke) <= 3 and all(t.num_steps <= 100 for t in smoke)


def test_built_families_report_exactly_the_declared_static_config(reads_no_dataset_file):
    """What the overlap check compares is what `build` trains; it is read without the data."""
    for t in suites.get("heldout-cpu-mnist") + suites.get("validation-cpu") + suites.get("smoke"):
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
        load_config([path], [])
        with pytest.raises(_Built):
            outer_train.train(str(tmp_path / os.path.basename(path)), tensorboard=False, progress=False)
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
    assert suites.held_out_report(suite, families) is None
    assert suites.held_out_report(suites.get("validation-cpu"), families) is None
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
    with pytest.raises(TypeError, match="cannot tell the static configs of Opaque"):
        suites.static_configs(type("Opaque", (tasks.TaskFamily,), {})())


def test_validation_suite_is_disjoint_from_the_test_suite(reads_no_dataset_file):
    """validation-cpu picks checkpoints; none of its tasks may be (or draw) a heldout-cpu task."""
    test = {t.static_config() for t in suites.get("heldout-cpu-mnist")}
    val = suites.get("validation-cpu")
    assert len(val) >= 5 and not test & {t.static_config() for t in val}
    for t in val:
        assert suites.overlaps(suites.get("heldout-cpu-mnist"), t.build(load_data=False)) == [], t.name
