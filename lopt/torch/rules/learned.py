"""A learned optimizer inside a rule chain (`lopt.rules.learned.RuledLOpt`) in torch.

Its torch update is the inner architecture's torch rule with the chain held as that architecture's
fields (`lopt.pretrained.rule_chain.to_fields`, the form `lopt.torch`'s Celo2LOpt and NormMLPLOpt
rules read), each learnable constant at its value under theta, c₀ · exp(R · tanh(s))
(`RuledLOpt.fixed_chain`). So a theta meta-trained with learnable rule constants runs in torch as
its JAX transform does (tests/lopt/torch/test_parity.py).
"""
from __future__ import annotations

from typing import Any

from lopt.pretrained import rule_chain
from lopt.rules.learned import RuledLOpt
from lopt.torch.rule import Rule, rule_for

__all__ = ["deployed", "RuledLOptRule"]


def deployed(learned_opt: RuledLOpt, theta: Any) -> tuple:
    """The inner architecture with the chain as its fields, and its theta.

    Args:
      learned_opt: a `RuledLOpt`.
      theta: its theta (concrete arrays).

    Returns:
      (the inner `LearnedOptimizer` with the chain's fields set, the inner theta).

    Raises:
      ValueError: a part the inner architecture has no field for (`rule_chain.to_fields`).
    """
    inner = learned_opt.learned_opt
    fields = rule_chain.to_fields(inner.name, learned_opt.fixed_chain(theta)) if learned_opt.rules else {}
    if fields:
        inner = type(inner)(**{**inner.config(), **fields, **({"layout": inner.layout} if hasattr(inner, "layout")
                                                                  else {})})
    return inner, learned_opt.inner_theta(theta)


class RuledLOptRule(Rule):
    """The torch rule of a `RuledLOpt`: constructing it gives its inner architecture's rule (`deployed`).

    Args:
      learned_opt: the `RuledLOpt`.
      theta: its theta (numpy arrays).
    """

    reads_loss = True
    reads_roles = True

    def __new__(cls, learned_opt: RuledLOpt, theta: Any) -> Rule:
        return rule_for(*deployed(learned_opt, theta))
