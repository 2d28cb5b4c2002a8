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
    for name in ["MLPLOpt", "AdafacMLPLOpt", "RNNMLPLOpt", "NNAdam", "HyperLOpt",
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
