"""Checks of the meta-training core's constructor and call arguments, in one place.

    num_tasks = check_int("num_tasks", num_tasks, minimum=1)      # 8, np.int64(8) and 8.0 -> 8
    std = check_positive_float("std", std)                          # finite and > 0
    weights = check_weights(weights, num=len(estimates))            # finite, >= 0, not all 0

Each returns the value as a plain Python number (so names and checkpoint metadata never read
"n=8.0" or "n=np.int64(8)") or raises, naming the argument, what was wrong and what to pass.
Bools are refused where a number is meant: `num_tasks=True` is a mistake, not 1.
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Optional, Sequence

import numpy as np


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == np.bool_


def check_int(name: str, value: Any, *, minimum: Optional[int] = None) -> int:
    """`value` as a Python int, refusing what would otherwise be silently truncated.

    Python ints, numpy integers (and 0-d integer arrays) and floats with an integral value (8.0)
    are accepted; a non-integral float (2.5), a non-finite one, a bool or a non-number is refused.

    Args:
        name: the argument's name, for the error message.
        value: the value passed.
        minimum: the smallest value allowed, or None for no bound.

    Returns:
        int(value).

    Raises:
        TypeError: `value` is a bool or not a number.
        ValueError: `value` is a non-integral or non-finite float, or below `minimum`.
    """
    if _is_bool(value):
        raise TypeError(f"{name} must be an int, got the bool {value!r}")
    try:
        result = operator.index(value)
    except TypeError:
        if not isinstance(value, numbers.Real) and not (np.ndim(value) == 0 and
                                                        np.issubdtype(np.asarray(value).dtype, np.floating)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
        as_float = float(value)
        if not (math.isfinite(as_float) and as_float.is_integer()):
            raise ValueError(f"{name} must be a whole number, got {value!r}; pass an int "
                             f"(it is not rounded for you)") from None
        result = int(as_float)
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    return result


def check_optional_int(name: str, value: Any, *, minimum: Optional[int] = None) -> Optional[int]:
    """`check_int(name, value, minimum=minimum)`, or None when `value` is None.

    Args:
        name: the argument's name, for the error message.
        value: the value passed, or None.
        minimum: the smallest value allowed, or None for no bound.

    Returns:
        None or an int.
    """
    return None if value is None else check_int(name, value, minimum=minimum)


def check_positive_float(name: str, value: Any) -> float:
    """`value` as a Python float that is finite and > 0 (e.g. an ES perturbation's std).

    Args:
        name: the argument's name, for the error message.
        value: the value passed (a Python or numpy number).

    Returns:
        float(value).

    Raises:
        TypeError: `value` is a bool or not a real number.
        ValueError: `value` is NaN, infinite, zero or negative.
    """
    if _is_bool(value) or not (isinstance(value, numbers.Real) or
                               (np.ndim(value) == 0 and np.issubdtype(np.asarray(value).dtype, np.number))):
        raise TypeError(f"{name} must be a positive float, got {type(value).__name__} {value!r}")
    result = float(value)
    if not (math.isfinite(result) and result > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return result


def check_weights(weights: Optional[Sequence[Any]], num: Optional[int]) -> list[float]:
    """Estimator weights for an average Σ_i w_i ĝ_i / Σ_i w_i: one per estimate, finite, >= 0, not all 0.

    Args:
        weights: one weight per estimate, or None for all 1.
        num: the number of estimates, or None when it is not known yet (only the values are checked).

    Returns:
        The weights as a list of Python floats (`num` ones for None).

    Raises:
        ValueError: the count differs from `num`, a weight is negative, NaN or infinite, or all are 0.
    """
    if weights is None:
        return [1.0] * (num or 0)
    values = np.asarray(weights, dtype=np.float64).reshape(-1).tolist() if np.ndim(weights) else None
    if values is None:
        raise ValueError(f"weights must hold one weight per estimator, got the scalar {weights!r}")
    if num is not None and len(values) != num:
        raise ValueError(f"{len(values)} weights for {num} estimates; pass one weight per estimator "
                         f"(or None for equal weights)")
    for i, w in enumerate(values):
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"weights[{i}] = {w!r}: estimator weights must be finite and >= 0; got {values}")
    if not any(values):
        raise ValueError(f"all estimator weights are 0 ({values}): theta would never be updated; "
                         f"give at least one estimator a weight > 0")
    return values
