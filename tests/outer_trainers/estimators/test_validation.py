"""Argument checks of the estimators (estimators/validation.py): ints are ints, std is finite and > 0,
weights are usable. Nothing here compiles: the checks run in the constructors."""
import numpy as np
import pytest

import outer_trainers as ot
from outer_trainers.validation import check_int, check_positive_float, check_weights
from tests.outer_trainers.estimators import estimator_checks as C


def test_check_int_accepts_ints_and_refuses_what_it_would_truncate():
    assert [check_int("n", v) for v in (3, np.int64(3), np.array(3), 3.0)] == [3, 3, 3, 3]
    assert all(type(check_int("n", v)) is int for v in (np.int32(3), 3.0))
    with pytest.raises(ValueError, match=r"num_tasks must be a whole number, got 2.5"):
        check_int("num_tasks", 2.5)
    with pytest.raises(ValueError, match="num_tasks must be a whole number"):
        check_int("num_tasks", float("nan"))
    with pytest.raises(TypeError, match="num_tasks must be an int, got the bool True"):
        check_int("num_tasks", True)
    with pytest.raises(TypeError, match="num_tasks must be an int, got str"):
        check_int("num_tasks", "8")
    with pytest.raises(ValueError, match="num_tasks must be >= 1, got 0"):
        check_int("num_tasks", 0, minimum=1)


def test_check_positive_float_refuses_nonfinite_and_nonpositive():
    assert check_positive_float("std", np.float32(0.5)) == 0.5
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="std must be finite and > 0"):
            check_positive_float("std", bad)
    with pytest.raises(TypeError, match="std must be a positive float"):
        check_positive_float("std", None)


def test_check_weights():
    assert check_weights(None, 2) == [1.0, 1.0]
    assert check_weights(np.array([0.0, 2.0]), 2) == [0.0, 2.0]  # one zero weight switches an estimator off
    with pytest.raises(ValueError, match="3 weights for 2 estimates"):
        check_weights([1.0, 1.0, 1.0], 2)


ESTIMATORS = {  # name -> (constructor, its length argument, whether it takes std)
    "TruncatedES": (ot.TruncatedES, "trunc_length", True),
    "TruncatedPES": (ot.TruncatedPES, "trunc_length", True),
    "TruncatedPESPMAP": (ot.TruncatedPESPMAP, "trunc_length", True),
    "NoiseReuseES": (ot.NoiseReuseES, "trunc_length", True),
    "TruncatedGrad": (ot.TruncatedGrad, "trunc_length", False),
    "FullES": (ot.FullES, "unroll_length", True),
    "FullGrad": (ot.FullGrad, "unroll_length", False),
}


@pytest.fixture(scope="module")
def ts():
    return C.quadratic_step()


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_constructors_refuse_non_integral_sizes_and_bad_std(name, ts):
    cls, length, has_std = ESTIMATORS[name]
    with pytest.raises(ValueError, match="num_tasks must be a whole number, got 2.5"):
        cls(ts, 2.5, 3)
    with pytest.raises(ValueError, match=f"{length} must be a whole number, got 5.7"):
        cls(ts, 2, 5.7)
    with pytest.raises(TypeError, match="num_tasks must be an int, got the bool"):
        cls(ts, True, 3)
    if has_std:
        for bad in (float("nan"), float("inf"), 0.0):
            with pytest.raises(ValueError, match="std must be finite and > 0"):
                cls(ts, 2, 3, bad)
    est = cls(ts, np.int64(2), 3.0)  # integral numpy ints and floats are taken as the ints they are
    assert est.num_tasks == 2 and type(est.num_tasks) is int
    assert "(n=2," in est.name and "3.0" not in est.name


@pytest.mark.parametrize("name", ["TruncatedES", "TruncatedPES", "TruncatedPESPMAP", "NoiseReuseES", "TruncatedGrad"])
def test_random_initial_iteration_offset_must_be_a_whole_number(name, ts):
    with pytest.raises(ValueError, match="random_initial_iteration_offset must be a whole number"):
        ESTIMATORS[name][0](ts, 2, 3, random_initial_iteration_offset=1.5)


@pytest.mark.parametrize("cls", [ot.FullES, ot.FullGrad])
def test_chunk_length_must_be_a_positive_whole_number(cls, ts):
    with pytest.raises(ValueError, match="chunk_length must be a whole number"):
        cls(ts, 2, chunk_length=2.5)
    with pytest.raises(ValueError, match="chunk_length must be >= 1"):
        cls(ts, 2, chunk_length=0)


def test_full_es_sign_scalar_must_be_finite_and_positive(ts):
    with pytest.raises(ValueError, match="sign_delta_loss_scalar must be finite and > 0"):
        ot.FullES(ts, 2, sign_delta_loss_scalar=float("nan"))


def test_pes_pmap_without_devices_is_a_clear_error(ts):
    with pytest.raises(ValueError, match=r"devices=\[\]: it needs at least one device"):
        ot.TruncatedPESPMAP(ts, 2, 3, devices=[])
    with pytest.raises(ValueError, match="num_devices must be a whole number"):
        ot.TruncatedPESPMAP(ts, 2, 3, num_devices=0.5)


def test_estimator_schedule_every_must_be_a_whole_number():
    with pytest.raises(ValueError, match="every must be a whole number, got 2.5"):
        ot.EstimatorSchedule(2.5, lambda k: [])
