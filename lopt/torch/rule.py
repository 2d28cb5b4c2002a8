"""The protocol of a torch update rule: one learned-optimizer architecture's update, in torch ops, reading theta.

`lopt.torch.TorchLearnedOptimizer` keeps torch's bookkeeping (parameter groups, per-parameter
state, `state_dict`); a `Rule` holds the math of one architecture:

    rule = RULES["MLPLOpt"](learned_opt, theta)       # theta: numpy arrays
    state = rule.init_state(param, axes)              # per parameter, torch tensors
    for update in rule.updates(items, ctx): ...       # one update per item, in the parameters' layout

An `Item` is one parameter of the step (its gradient, its state dict, its JAX axis order);
a `Context` is what the items of one device and compute dtype share: their step counts (as
`TorchLearnedOptimizer` keeps them, per parameter), their horizons, the loss and theta as
tensors. Rules update the items' state in place (or replace its entries) and yield each update
Δp (the optax update, added to the parameter by the optimizer), in the compute dtype.

A rule reads only the architecture's public configuration: its config fields and properties, and
its spec (`learned_opt.spec()`, `lopt.parts.spec`: the feature order, the constants, the state
layout), which the JAX implementation reads too; it restates none of them.

Architectures register their rule with `register(name)`; `rule_for(learned_opt, theta)` builds it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from lopt.parts.features import loss_state_field
from lopt.torch.parts.features import loss_features, progress_features, step_embedding
from lopt.torch.parts.layout import Workspace
from lopt.torch.parts.spec import param_state
from lopt.torch.rules.overshoot_brake import OvershootBrake

__all__ = ["Item", "Context", "Rule", "RULES", "register", "rule_for", "supported_architectures"]


@dataclasses.dataclass
class Item:
    """One parameter of a step.

    Attributes:
      param: the torch parameter (updated by the optimizer after the rule ran).
      grad: its gradient (same shape as param).
      state: its optimizer state (a dict of tensors, updated by the rule).
      axes: the parameter's axes in JAX order: `param.permute(axes)` is the tensor as the JAX
        optimizer sees it (see `lopt.torch.layout`).
      horizon: the training horizon N of its parameter group (None: unknown).
      chunk: elements per block of the rule's per-parameter work.
    """
    param: torch.Tensor
    grad: torch.Tensor
    state: dict
    axes: tuple
    horizon: Optional[int]
    chunk: int

    @property
    def jax_shape(self) -> tuple:
        """The parameter's shape in JAX layout."""
        return tuple(self.param.shape[a] for a in self.axes)


@dataclasses.dataclass
class Context:
    """What the items of one step on one device and compute dtype share.

    Attributes:
      steps: t per item (updates made so far), [L] in the compute dtype on the device.
      loss: the loss of this step (0-d, compute dtype) or None.
      theta: the rule's theta as tensors of the compute dtype on the device.
      dtype: the compute dtype.
      device: the device.
      stepped: every item of the step, on every device and dtype (a rule that reads the whole
        model, e.g. Celo2LOpt's count of weight matrices, reads it here).
    """
    steps: torch.Tensor
    loss: Optional[torch.Tensor]
    theta: dict
    dtype: torch.dtype
    device: torch.device
    stepped: Sequence[Item] = ()

    def embedding(self, timescales: Sequence[float]) -> torch.Tensor:
        """The step embedding of every item, [L, T]."""
        return step_embedding(self.steps, timescales)

    def progress(self, items: Sequence[Item], use: bool = True) -> torch.Tensor:
        """The progress features of every item ([L, 3]; zeros unless `use`)."""
        return progress_features(self.steps, [it.horizon if use else None for it in items])

    def context_row(self, timescales: Sequence[float], items: Sequence[Item], loss_feats: torch.Tensor,
                    use_progress: bool = True) -> torch.Tensor:
        """The tensor-independent context per item that step-size heads and per-tensor LSTMs read:
        [emb(t) [L, T], progress(t, N) [L, 3] (zeros unless `use_progress`), loss_feats [L, F]] -> [L, T + 3 + F]."""
        return torch.cat([self.embedding(timescales), self.progress(items, use_progress), loss_feats], dim=1)


class Rule:
    """Base class of the torch update rules (the protocol is in the module docstring).

    Args:
      learned_opt: the architecture (a `lopt.LearnedOptimizer`) whose update this computes.
      theta: its meta-parameters, a pytree of numpy arrays.

    Attributes:
      spec: the architecture's `lopt.parts.spec.ArchSpec` (None for one without `spec()`).
    """

    #: whether the architecture reads the loss (`tx.update(..., loss=loss)`)
    reads_loss: bool = False
    #: a `lopt.torch.rules.overshoot_brake.OvershootBrake` that `TorchLearnedOptimizer.step` applies to
    #: every update, over all parameters (None: no brake); set from the architecture's
    #: `overshoot_gain` (> 0) and `overshoot_threshold`, where it has them
    brake: Any = None
    #: whether every parameter group needs num_steps (the architecture schedules by progress t/N)
    requires_horizon: bool = False
    #: whether `init_state` takes a parameter group's `role` (`lopt.param_roles` kinds) as role=
    reads_roles: bool = False
    #: whether the state's "momenta" are only read through `lopt.torch.parts.moment_features.FlatLeaf`, so
    #: that they may be stored in a lower precision (the optimizer's `momentum_dtype`)
    flat_momenta: bool = False

    def __init__(self, learned_opt: Any, theta: Any):
        self.learned_opt = learned_opt
        self.theta = theta
        self.spec = learned_opt.spec() if hasattr(learned_opt, "spec") else None
        self.ws = Workspace()
        self._tensors: dict = {}
        if getattr(learned_opt, "overshoot_gain", 0.0) > 0:
            self.brake = OvershootBrake(learned_opt.overshoot_gain, learned_opt.overshoot_threshold)

    def theta_on(self, device: torch.device, dtype: torch.dtype) -> dict:
        """theta as tensors of `dtype` on `device` (converted once per device and dtype).

        Args:
          device: the device.
          dtype: the compute dtype.

        Returns:
          theta's nested dicts with tensor leaves.
        """
        key = (str(device), dtype)
        if key not in self._tensors:
            convert = lambda x: torch.as_tensor(np.array(x, np.float64 if dtype == torch.float64 else np.float32),
                                                device=device).to(dtype)
            self._tensors[key] = _map(convert, self.theta)
        return self._tensors[key]

    def init_state(self, param: torch.Tensor, axes: tuple, dtype: torch.dtype) -> dict:
        """The state of one parameter before its first update (the JAX `init_fn`'s, for this leaf).

        Args:
          param: the parameter (its value now, before any update).
          axes: its axes in JAX order.
          dtype: the compute dtype (the state's dtype).

        Returns:
          A dict of tensors on the parameter's device: by default every field of the architecture's
          spec (`lopt.torch.parts.spec.param_state`) and, with a brake, its per-parameter state; a
          rule whose state holds more extends this.
        """
        state = param_state(self.spec, param, axes, dtype)
        if self.brake is not None:
            state.update(self.brake.init_param_state(param))
        return state

    def updates(self, items: Sequence[Item], ctx: Context) -> Iterator[torch.Tensor]:
        """One update step of every item: their states updated, their updates yielded in order.

        An update may live in the rule's workspace and be overwritten by the next one: add it to
        its parameter before asking for the next (as `TorchLearnedOptimizer.step` does).

        Args:
          items: the parameters of this device and compute dtype.
          ctx: what they share.

        Yields:
          Δp per item, shaped like its parameter, in the compute dtype.
        """
        raise NotImplementedError

    def loss_features(self, items: Sequence[Item], ctx: Context) -> torch.Tensor:
        """The items' loss features [L, 2], their "loss_state" entries advanced
        (`lopt.torch.parts.features.loss_features`)."""
        key = loss_state_field().key
        states = torch.stack([it.state[key] for it in items])
        feats, new = loss_features(ctx.loss, states)
        if ctx.loss is not None:
            for i, it in enumerate(items):
                it.state[key] = new[i]
        return feats


def _map(fn: Callable, tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _map(fn, v) for k, v in tree.items()}
    return fn(tree)


RULES: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """A class decorator: the rule of the architecture called `name` (its class name in lopt).

    Args:
      name: e.g. "MLPLOpt".

    Returns:
      The decorator.
    """
    def deco(cls: type) -> type:
        RULES[name] = cls
        return cls
    return deco


def supported_architectures() -> list[str]:
    """The architectures with a torch rule, sorted."""
    return sorted(RULES)


def rule_for(learned_opt: Any, theta: Any) -> Rule:
    """The torch rule of `learned_opt` reading `theta`.

    Args:
      learned_opt: a `lopt.LearnedOptimizer`.
      theta: its meta-parameters (jax or numpy arrays), checked against its structure.

    Returns:
      A `Rule`.

    Raises:
      NotImplementedError: the architecture has no torch rule (the message lists those that do).
      ValueError: theta does not match the architecture.
    """
    name = type(learned_opt).__name__
    if name not in RULES:
        raise NotImplementedError(f"lopt.torch has no torch update rule for the architecture {name}; supported: "
                                  f"{supported_architectures()}. Use the JAX transform (learned_opt.opt_fn) or add a "
                                  f"rule in lopt/torch/")
    learned_opt.check_theta(theta, "lopt.torch")
    theta_np = _map(np.asarray, theta)
    return RULES[name](learned_opt, theta_np)
