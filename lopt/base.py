"""LearnedOptimizer: meta-parameters theta -> an optax transform.

    theta = lo.init(key)                          # a pytree of arrays (dicts of arrays)
    tx = lo.opt_fn(theta, num_steps=None)         # optax.GradientTransformationExtraArgs
    opt_state = tx.init(params)
    updates, opt_state = tx.update(grads, opt_state, params, loss=loss)
    params = optax.apply_updates(params, updates)

`opt_fn` is pure in theta, so `jax.grad`/`jax.vmap` over theta work through whole unrolls.
Learned optimizers compare and hash by value (their class and `config()`), so they are safe
as static jit arguments and as cache keys.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import jax
import optax

Theta = Any

_ARCHITECTURES: dict[str, type] = {}


class LearnedOptimizer:
    """Base class of learned optimizers (see the module docstring for the protocol).

    Subclasses implement `init`, `opt_fn` and `config`; each subclass is registered by its class
    name (`architecture`), so saved thetas can rebuild it.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _ARCHITECTURES[cls.__name__] = cls

    def init(self, key: jax.Array) -> Theta:
        """Initial meta-parameters.

        Args:
          key: PRNG key.

        Returns:
          theta, a pytree of float32 arrays.
        """
        raise NotImplementedError

    def opt_fn(self, theta: Theta, *, num_steps: Optional[Any] = None,
               is_training: bool = False) -> optax.GradientTransformationExtraArgs:
        """The optimizer theta defines, as an optax transform.

        Call it as `update(grads, state, params, loss=loss)`: the learned architectures read
        `params` (and refuse to run without them); `loss=` is optional everywhere. Pure in theta:
        jax.grad and jax.vmap over theta work through whole unrolls.

        Args:
          theta: meta-parameters, as from `init`.
          num_steps: the training horizon N for progress features (may be traced; None: unknown,
            progress features are zero; architectures without them ignore it).
          is_training: True while meta-training (no architecture here changes behaviour with it).

        Returns:
          An `optax.GradientTransformationExtraArgs`.
        """
        raise NotImplementedError

    def config(self) -> dict:
        """JSON-serialisable constructor arguments: `type(self)(**self.config())` rebuilds self."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The class name, e.g. "MLPLOpt"."""
        return type(self).__name__

    def _key(self) -> tuple:
        return (type(self).__name__, json.dumps(self.config(), sort_keys=True))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LearnedOptimizer) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


def architecture(name: str) -> type:
    """The LearnedOptimizer subclass called `name` (for loading saved thetas)."""
    if name not in _ARCHITECTURES:
        raise ValueError(f"unknown learned-optimizer architecture {name!r}; known: {sorted(_ARCHITECTURES)}")
    return _ARCHITECTURES[name]


def architectures() -> list[str]:
    """The names of all registered LearnedOptimizer subclasses, sorted."""
    return sorted(_ARCHITECTURES)
