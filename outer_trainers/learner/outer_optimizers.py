"""Outer optimizers that gin can express: a chain of optax transforms given as one list.

`optax.chain(*transforms)` takes varargs, which gin cannot bind, so a gin file cannot clip the
meta-gradient before the outer Adam with it. `chained(transforms)` is the same chain with the
transforms in one list argument:

    train.outer_opt = @chained()
    chained.transforms = [@optax.clip_by_global_norm(), @optax.adam()]
    optax.clip_by_global_norm.max_norm = 3.0
    optax.adam.learning_rate = 1e-3

The update is that of `optax.chain`: each transform in order, e.g. with clipping
g ← g · min(1, max_norm / ‖g‖₂) (‖·‖₂ the global norm over every leaf), then Adam's update of g.
"""
from __future__ import annotations

from typing import Sequence

import optax


def chained(transforms: Sequence[optax.GradientTransformation]) -> optax.GradientTransformationExtraArgs:
    """`optax.chain` of a list of transforms, applied in list order (for gin, which cannot bind varargs).

    Args:
      transforms: the optax transforms, first applied first (e.g. `[optax.clip_by_global_norm(3.0),
        optax.adam(1e-3)]`).

    Returns:
      `optax.chain(*transforms)`: its state is the tuple of the transforms' states.

    Raises:
      ValueError: the list is empty.
      TypeError: an entry is not an optax transform (naming its position and type; in gin, a
        reference without `()` such as `@optax.adam` passes the function instead of calling it).
    """
    if isinstance(transforms, optax.GradientTransformation):
        raise TypeError("chained takes a list of optax transforms, got a single transform: write [transform]")
    transforms = list(transforms)
    if not transforms:
        raise ValueError("chained needs at least one optax transform, got an empty list")
    for i, tx in enumerate(transforms):
        if not isinstance(tx, optax.GradientTransformation):
            hint = (" (in gin, write @name() with parentheses to call it, e.g. @optax.adam())"
                    if callable(tx) else "")
            raise TypeError(f"chained: transforms[{i}] is a {type(tx).__name__}, not an optax "
                            f"GradientTransformation{hint}")
    return optax.chain(*transforms)
