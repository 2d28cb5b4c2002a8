"""LearnedOptimizer: meta-parameters theta -> an optax transform.

    theta = lo.init(key)                          # a pytree of arrays (dicts of arrays)
    tx = lo.opt_fn(theta, num_steps=None)         # optax.GradientTransformationExtraArgs
    opt_state = tx.init(params)
    updates, opt_state = tx.update(grads, opt_state, params, loss=loss)
    params = optax.apply_updates(params, updates)

`opt_fn` is pure in theta, so `jax.grad`/`jax.vmap` over theta work through whole unrolls.
Every `opt_fn` first checks theta against `theta_spec()` (tree structure and leaf shapes, at
trace time), so theta of another architecture or config is refused with the leaf that differs;
every `update` checks that the gradients have the params' tree and leaf shapes, naming the first
leaf that differs. Params: float32 or bfloat16 arrays (state float32, updates in each parameter's
dtype, also inside `lax.scan`); a plain Python float leaf is read as a float32 0-d array, as
`optax.apply_updates` does, and gets a float32 [] update.
Learned optimizers compare and hash by value (their class and `config()`), so they are safe
as static jit arguments and as cache keys.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import jax
import optax

from lopt.features import tree_mismatch

Theta = Any

_ARCHITECTURES: dict[str, type] = {}
_THETA_SPECS: dict[tuple, Any] = {}  # (class, config JSON) -> theta's ShapeDtypeStructs


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

    def theta_spec(self) -> Theta:
        """The shapes and dtypes of theta, `jax.eval_shape` of `init` (computed once per class and config).

        Returns:
          theta's pytree with `jax.ShapeDtypeStruct` leaves.
        """
        key = (type(self), json.dumps(self.config(), sort_keys=True))
        if key not in _THETA_SPECS:
            _THETA_SPECS[key] = jax.eval_shape(lambda: self.init(jax.random.key(0)))
        return _THETA_SPECS[key]

    def check_theta(self, theta: Theta, where: str = "opt_fn", *, check_dtypes: bool = False) -> None:
        """A clear error unless theta has this optimizer's tree structure and leaf shapes.

        Only shapes are compared, so it is free inside jit / vmap / grad (theta may be traced;
        under vmap each leaf has its unbatched shape).

        Args:
          theta: the meta-parameters to check.
          where: the caller, for the message (e.g. "MLPLOpt.opt_fn", "load_theta(PATH)").
          check_dtypes: also require `init`'s leaf dtypes (e.g. for a theta the outer optimizer will
            update; `opt_fn` leaves dtypes to the caller).

        Raises:
          ValueError: naming the first leaf that is missing, unexpected or of another shape.
        """
        mismatch = tree_mismatch(theta, self.theta_spec(), f"{self!r}'s theta", check_dtypes=check_dtypes)
        if mismatch is not None:
            raise ValueError(f"{where}: theta does not match the structure of {self!r}: {mismatch}. Was this "
                             f"theta saved from another architecture or config? lopt.load_learned_optimizer(path) "
                             f"rebuilds the architecture a theta file was saved from")

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
