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
