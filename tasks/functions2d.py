"""Classic 2-D optimisation test functions, for debugging optimizers by eye.

    rosenbrock(x, y) = (a − x)² + b (y − x²)²        a = 1, b = 100; minimum 0 at (a, a²)
    himmelblau(x, y) = (x² + y − 11)² + (x + y² − 7)²     four minima of value 0
    beale(x, y)      = (1.5 − x + xy)² + (2.25 − x + xy²)² + (2.625 − x + xy³)²; minimum 0 at (3, 0.5)

Params {"xy": [2]} start at the function's classic start point plus `init_noise`·N(0, I); the
normaliser divides by the value at the classic start point, so a fresh task scores ~1.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from tasks.base import Task, TaskFamily, scaled_normalizer


def rosenbrock(xy: jax.Array, a: Any = 1.0, b: Any = 100.0) -> jax.Array:
    """(a − x)² + b (y − x²)² at xy = (x, y) [2]: a scalar."""
    x, y = xy[0], xy[1]
    return jnp.square(a - x) + b * jnp.square(y - x * x)


def himmelblau(xy: jax.Array) -> jax.Array:
    """(x² + y − 11)² + (x + y² − 7)² at xy = (x, y) [2]: a scalar."""
    x, y = xy[0], xy[1]
    return jnp.square(x * x + y - 11) + jnp.square(x + y * y - 7)


def beale(xy: jax.Array) -> jax.Array:
    """(1.5 − x + xy)² + (2.25 − x + xy²)² + (2.625 − x + xy³)² at xy = (x, y) [2]: a scalar."""
    x, y = xy[0], xy[1]
    return jnp.square(1.5 - x + x * y) + jnp.square(2.25 - x + x * y ** 2) + jnp.square(2.625 - x + x * y ** 3)


# name -> (function, classic start point)
FUNCTIONS = {
    "rosenbrock": (rosenbrock, (-1.2, 1.0)),
    "himmelblau": (himmelblau, (0.0, 0.0)),
    "beale": (beale, (1.0, 1.0)),
}


class Function2DTask(Task):
    """Minimise FUNCTIONS[function] over params {"xy": [2]} (no data); the loss is the function's
    value, the normaliser divides it by the value at the classic start point (clipped at 100).

    Args:
      function: "rosenbrock", "himmelblau" or "beale" (a key of FUNCTIONS).
      offset: [2] added to the classic start point (may be traced).
      init_noise: std of the Gaussian noise added to the start point by `init`.
    """

    def __init__(self, function: str = "rosenbrock", *, offset: Any = (0.0, 0.0), init_noise: float = 0.0):
        if function not in FUNCTIONS:
            raise ValueError(f"unknown function {function!r}; choose from {sorted(FUNCTIONS)}")
        self.fn, start = FUNCTIONS[function]
        self.start = jnp.asarray(start, jnp.float32)
        self.offset = jnp.asarray(offset, jnp.float32)
        self.init_noise = float(init_noise)
        self.name = function
        self.data = None
        self.normalizer = scaled_normalizer(self.fn(self.start), max_value=100.0)

    def init(self, key: jax.Array) -> dict:
        return {"xy": self.start + self.offset + self.init_noise * jax.random.normal(key, (2,), jnp.float32)}

    def loss(self, params: dict, key: jax.Array, batch: Any = None) -> jax.Array:
        del key, batch
        return self.fn(params["xy"])


class RosenbrockTask(Function2DTask):
    """The Rosenbrock banana from (−1.2, 1): Function2DTask("rosenbrock").

    Args:
      offset: [2] added to the start point (may be traced).
      init_noise: std of the Gaussian noise added to the start point by `init`.
    """

    def __init__(self, *, offset: Any = (0.0, 0.0), init_noise: float = 0.0):
        super().__init__("rosenbrock", offset=offset, init_noise=init_noise)


class Function2DFamily(TaskFamily):
    """One 2-D function with the start point jittered per task: `sample(key)` -> {"offset": float32 [2]}
    with offset ~ U(−spread, spread)².

    Args:
      function: "rosenbrock", "himmelblau" or "beale" (a key of FUNCTIONS).
      spread: half-width of the uniform offset of the start point.
    """

    def __init__(self, function: str = "rosenbrock", *, spread: float = 0.1):
        if function not in FUNCTIONS:
            raise ValueError(f"unknown function {function!r}; choose from {sorted(FUNCTIONS)}")
        self.function, self.spread = function, float(spread)
        self.name = f"{function}_family"
        self.data = None

    def sample(self, key: jax.Array) -> dict:
        return {"offset": jax.random.uniform(key, (2,), jnp.float32, -self.spread, self.spread)}

    def task_fn(self, cfg: dict) -> Function2DTask:
        return Function2DTask(self.function, offset=cfg["offset"])
