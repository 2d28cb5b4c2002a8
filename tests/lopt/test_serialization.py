"""save_theta / load_theta: config stored, mismatches refused with a message naming both sides."""
import jax
import pytest

import lopt


def test_config_mismatch_lists_differing_keys(tmp_path):
    path = str(tmp_path / "t.msgpack")
    saved = lopt.MLPLOpt(hidden_size=8)
    lopt.save_theta(path, saved, saved.init(jax.random.key(0)))
    with pytest.raises(ValueError) as e:
        lopt.load_theta(path, lopt.MLPLOpt(hidden_size=16))
    msg = str(e.value)
    assert "hidden_size (saved 8, here 16)" in msg
    assert "MLPLOpt(" in msg and path in msg


def test_architecture_mismatch_names_both_architectures(tmp_path):
    path = str(tmp_path / "t.msgpack")
    saved = lopt.AdafacMLPLOpt()
    lopt.save_theta(path, saved, saved.init(jax.random.key(0)))
    with pytest.raises(ValueError, match=r"architecture \(saved AdafacMLPLOpt, here HyperLOpt\)"):
        lopt.load_theta(path, lopt.HyperLOpt())


def test_save_rejects_theta_of_another_structure(tmp_path):
    with pytest.raises(ValueError, match="structure"):
        lopt.save_theta(str(tmp_path / "t.msgpack"), lopt.NNAdam(), lopt.LearnableAdam().init(jax.random.key(0)))


def test_every_architecture_is_registered_and_rebuilds_from_config():
    for name in ["MLPLOpt", "NormMLPLOpt", "AdafacMLPLOpt", "RNNMLPLOpt", "NNAdam", "HyperLOpt",
                 "LearnableAdam", "LearnableSGD", "LearnableSGDM"]:
        cls = lopt.architecture(name)
        lo = cls()
        assert cls(**lo.config()) == lo


def test_speed_only_options_do_not_block_loading(tmp_path):
    path = str(tmp_path / "t.msgpack")
    saver = lopt.MLPLOpt(hidden_size=4, chunk_size=8)
    theta = saver.init(jax.random.key(0))
    lopt.save_theta(path, saver, theta)
    loaded = lopt.load_theta(path, lopt.MLPLOpt(hidden_size=4))
    jax.tree_util.tree_map(lambda a, b: None if bool((a == b).all()) else pytest.fail("theta changed"), loaded, theta)


def test_file_from_before_a_new_option_still_loads(tmp_path):
    """A config written before an option existed is read with that option's default."""
    import json

    from flax import serialization

    path = tmp_path / "old.msgpack"
    lo = lopt.MLPLOpt(hidden_size=4)
    lopt.save_theta(str(path), lo, lo.init(jax.random.key(0)))
    payload = serialization.msgpack_restore(path.read_bytes())
    cfg = json.loads(payload["config"])
    del cfg["use_num_steps"]  # as written by a version without that option
    payload["config"] = json.dumps(cfg)
    path.write_bytes(serialization.msgpack_serialize(payload))
    lopt.load_theta(str(path), lo)
    with pytest.raises(ValueError, match="use_num_steps"):
        lopt.load_theta(str(path), lopt.MLPLOpt(hidden_size=4, use_num_steps=True))


def _crafted(tmp_path, edit, lo=None):
    """A valid theta file of `lo` (default MLPLOpt(hidden_size=4)) with its msgpack map edited by `edit`."""
    import numpy as np
    from flax import serialization

    lo = lo or lopt.MLPLOpt(hidden_size=4)
    path = tmp_path / "crafted.msgpack"
    lopt.save_theta(str(path), lo, lo.init(jax.random.key(0)))
    payload = serialization.msgpack_restore(path.read_bytes())
    edit(payload, np)
    path.write_bytes(serialization.msgpack_serialize(payload))
    return str(path)


@pytest.mark.parametrize("edit, what", [
    (lambda d, np: d.update(version=2), r"unknown version 2 \(this lopt reads 1\)"),
    (lambda d, np: d.pop("version"), 'missing entry "version"'),
    (lambda d, np: d.pop("config"), 'missing or malformed entry "config".*KeyError'),
    (lambda d, np: d.update(config="{not json"), 'missing or malformed entry "config".*JSONDecodeError'),
    (lambda d, np: d.update(config="[1, 2]"), 'malformed entry "config".*not an object'),
    (lambda d, np: d.update(config='{"hidden_size": -1}'), 'entry "config" does not build MLPLOpt'),
    (lambda d, np: d.update(config='{"no_such_option": 1}'), 'entry "config" does not build MLPLOpt.*no_such_option'),
    (lambda d, np: d.pop("architecture"), 'missing or malformed entry "architecture"'),
    (lambda d, np: d.update(architecture="NoSuchLOpt"), "unknown architecture 'NoSuchLOpt'"),
    (lambda d, np: d.pop("theta"), 'missing or malformed entry "theta"'),
    (lambda d, np: d["theta"]["input"].update(w=np.full((11, 4), np.nan, np.float32)),
     r"non-finite values in leaf \['input'\]\['w'\]"),
    (lambda d, np: d["theta"]["output"].update(b=np.asarray([np.inf, 0.0], np.float32)),
     r"non-finite values in leaf \['output'\]\['b'\]"),
    (lambda d, np: d["theta"]["output"].update(b="text"), r"leaf \['output'\]\['b'\] .* is not a numeric array"),
    (lambda d, np: d["theta"]["output"].update(b=np.zeros(3, np.float32)),
     r"entry \"theta\" does not match .*leaf \['output'\]\['b'\] has shape \(3,\), but \(2,\)"),
    (lambda d, np: d["theta"].pop("hidden_1"), r"entry \"theta\" does not match .*missing leaf \['hidden_1'\]"),
])
def test_invalid_theta_file_is_refused_naming_the_file_and_the_problem(tmp_path, edit, what):
    """Every way in: load_theta with and without the architecture, load_learned_optimizer."""
    path = _crafted(tmp_path, edit)
    loads = [lambda: lopt.load_learned_optimizer(path), lambda: lopt.load_theta(path, lopt.MLPLOpt(hidden_size=4))]
    if "architecture" not in what:  # without an architecture an unknown one is not an error: theta is still read
        loads.append(lambda: lopt.load_theta(path))
    for load in loads:
        with pytest.raises(ValueError, match=what) as e:
            load()
        assert str(e.value).startswith(f"{path} is not a valid lopt theta file: ")


def test_theta_of_an_unregistered_architecture_still_loads_without_one(tmp_path):
    path = _crafted(tmp_path, lambda d, np: d.update(architecture="DefinedElsewhere"))
    theta = lopt.load_theta(path)
    assert theta["output"]["b"].shape == (2,)


def test_theta_loaded_without_an_architecture_check_is_refused_by_another_architecture(tmp_path):
    """load_theta(path) then opt_fn of another depth, width or architecture: refused, naming the leaf
    (another depth used to compute another function silently; another architecture raised KeyError)."""
    path = str(tmp_path / "t.msgpack")
    saved = lopt.MLPLOpt(hidden_size=8, hidden_layers=2)
    lopt.save_theta(path, saved, saved.init(jax.random.key(0)))
    theta = lopt.load_theta(path)
    saved.opt_fn(theta)  # its own architecture takes it
    for other, what in [(lopt.MLPLOpt(hidden_size=8, hidden_layers=1), r"unexpected leaf \['hidden_1'\]"),
                        (lopt.MLPLOpt(hidden_size=8, hidden_layers=3), r"missing leaf \['hidden_2'\]"),
                        (lopt.MLPLOpt(hidden_size=16), r"leaf \['hidden_1'\]\['b'\] has shape \(8,\), but \(16,\)"),
                        (lopt.AdafacMLPLOpt(hidden_size=8), r"missing leaf \['decays'\]")]:
        with pytest.raises(ValueError, match=what) as e:
            other.opt_fn(theta)
        assert "another architecture or config" in str(e.value) and "load_learned_optimizer" in str(e.value)
