"""The torch mirror of `lopt.rules.scaled`: a torch optimizer whose every step a rule changes.

    Δp_t = p_after − p_before          the wrapped optimizer's step, in float32
    p    ← p_before + rule(Δp_t)        cast back to p's dtype

`RuleOptimizer` holds the wrapped `torch.optim.Optimizer` and applies one rule to each step it
takes; `ScaledOptimizer` is the rule Δp ← f(t, params) · Δp that the step-size rules share
(`lopt.torch.rules.schedule.scheduled`, `horizon.horizon_scaled`, `depth.depth_scaled`,
`conv_step.conv_step_scaled`). Roles are read as `lopt.torch.optimizer` reads them: a parameter's
kind from `role` (a callable param -> "matrix" / "embedding" / "vector", e.g.
`lopt.torch.param_roles.module_roles(model).role`; default: "matrix" from 2 axes), its axes in
torch's layout ([out, in, *k]), and its `lopt.param_roles.ParamRole` from those
(`lopt.torch.param_roles.jax_role`), so weight matrices, conv kernels and fan-ins are the JAX rules'.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from lopt.parts.newton_schulz import is_orthogonalized
from lopt.torch.layout import default_axes
from lopt.torch.param_roles import jax_role, role_of

__all__ = ["RuleOptimizer", "ScaledOptimizer", "param_role"]


def param_role(param: torch.Tensor, role: Optional[Callable] = None) -> tuple:
    """(its `lopt.param_roles.ParamRole`, its JAX-layout shape, whether it is a weight matrix) of a
    torch parameter in torch's layout.

    Args:
      param: the parameter.
      role: None, or a callable param -> role kind (`lopt.torch.param_roles.ModuleRoles.role`).

    Returns:
      (ParamRole, shape tuple, bool: `lopt.parts.newton_schulz.is_orthogonalized`).
    """
    kind = role_of(param, role(param) if role is not None else None)
    shape = tuple(param.shape[a] for a in default_axes(param.ndim))
    r = jax_role(kind, shape)
    return r, shape, is_orthogonalized(r, shape)


class RuleOptimizer:
    """A torch optimizer with a rule applied to every step it takes (module docstring).

    It delegates `param_groups`, `state` and `zero_grad` to the wrapped optimizer; `step(closure)`
    or `step(loss=...)` passes the training loss to rules that read it; `state_dict()` holds the
    wrapped optimizer's and the rule's ("rule").

    Args:
      inner: the wrapped `torch.optim.Optimizer` (any).
      role: None, or a callable param -> role kind (module docstring).
    """

    def __init__(self, inner: torch.optim.Optimizer, role: Optional[Callable] = None):
        self.inner, self.role, self.count = inner, role, 0

    @property
    def param_groups(self) -> list:
        """The wrapped optimizer's parameter groups."""
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's zero_grad."""
        self.inner.zero_grad(set_to_none=set_to_none)

    def rule(self, steps: list, before: list, params: list, loss: Optional[torch.Tensor]) -> list:
        """The rule: the steps to take from the wrapped optimizer's (float32, one per parameter).

        Args:
          steps: the wrapped optimizer's Δp, float32.
          before: the parameters before the step, float32.
          params: the parameters themselves (for their roles and shapes).
          loss: this step's training loss, or None.

        Returns:
          the steps to take, float32, one per parameter.
        """
        return steps

    def rule_state(self) -> dict:
        """The rule's own state, beyond the update count (for `state_dict`)."""
        return {}

    def load_rule_state(self, state: dict) -> None:
        """Restores what `rule_state` returned."""

    def step(self, closure: Optional[Callable] = None, *, loss: Any = None) -> Any:
        """One step of the wrapped optimizer, changed by the rule.

        Args:
          closure: optional; called first (with gradients enabled) for the gradients and the loss.
          loss: the training loss, for rules that read it (the closure's when it returns one).

        Returns:
          the closure's return value, or None.
        """
        out = None
        if closure is not None:
            with torch.enable_grad():
                out = closure()
            loss = out if loss is None else loss
        params = [p for g in self.inner.param_groups for p in g["params"] if p.grad is not None]
        before = [p.detach().to(torch.float32).clone() for p in params]
        self.before_step(params)
        self.inner.step()
        with torch.no_grad():
            steps = [p.detach().to(torch.float32) - b for p, b in zip(params, before)]
            loss_t = None if loss is None else torch.as_tensor(loss, dtype=torch.float32).detach().reshape(())
            for p, b, s in zip(params, before, self.rule(steps, before, params, loss_t)):
                p.copy_((b + s).to(p.dtype))
        self.count += 1
        return out

    def before_step(self, params: list) -> None:
        """A hook run before the wrapped optimizer's step, with the parameters that have a gradient."""

    def state_dict(self) -> dict:
        """The wrapped optimizer's state dict and the rule's: {"inner", "rule": {"count", ...}}."""
        return {"inner": self.inner.state_dict(), "rule": {"count": self.count, **self.rule_state()}}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what `state_dict` returned."""
        self.inner.load_state_dict(state_dict["inner"])
        self.count = int(state_dict["rule"]["count"])
        self.load_rule_state(state_dict["rule"])


class ScaledOptimizer(RuleOptimizer):
    """Δp ← f(t, params) · Δp: the step-size rules' wrapper (`lopt.rules.scaled.scale_updates`).

    Args:
      inner: the wrapped optimizer.
      factor: (t, params, role) -> a float, or a list with one float per parameter stepped.
      role: None, or a callable param -> role kind.
    """

    def __init__(self, inner: torch.optim.Optimizer, factor: Callable, role: Optional[Callable] = None):
        super().__init__(inner, role)
        self.factor = factor

    def rule(self, steps, before, params, loss):
        f = self.factor(self.count, params, self.role)
        fs = f if isinstance(f, (list, tuple)) else [f] * len(steps)
        return [torch.as_tensor(c, dtype=torch.float32) * s for c, s in zip(fs, steps)]
