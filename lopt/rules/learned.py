"""Rule constants as meta-parameters: a learned optimizer inside a rule chain, some constants in theta.

    lo = lopt.rules.learned.with_rules(lopt.Celo2LOpt(), chain, learnable=("loss_aware_decay.rate",
                                                                            "horizon_scaled.power"))
    theta = lo.init(key)        # Celo2LOpt's theta plus theta["rules"]["loss_aware_decay"]["rate"] = 0, ...
    tx = lo.opt_fn(theta, num_steps=N)

`opt_fn` builds the inner optimizer's transform from its part of theta and wraps it in the chain
(`lopt.rules.chain.apply`), each learnable constant c of the chain replaced by

    c(s) = c₀ · exp(R · tanh(s))          s = theta["rules"][part][name], float32 [], 0 in `init`

c₀ the constant the chain gives and R = `log_range` > 0: bounded and log-parametrised as the
learned step sizes are (`lopt.parts.step_size`), so a fresh theta applies the chain exactly as
given (c(0) = c₀ · 1) and no theta moves a constant by more than a factor e^R either way, nor
changes its sign. jax.grad of a meta-loss reaches s through the chain, so meta-training learns the
rules' constants with the rest of theta (the constants the rules were given by hand start it).

A constant with a traced value is not range-checked by its part (its parametrisation bounds it);
the chain is checked once with c₀ when the optimizer is built. A power law x^c with a traced
exponent rounds as `jnp.power` does, so there a fresh theta matches the fixed chain to float32
rounding, not bit for bit; the multiplicative constants (rates, scales, ρ_free) match exactly.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from lopt.base import LearnedOptimizer, architecture
from lopt.rules import chain as chain_lib
from lopt.rules import per_tensor

__all__ = ["DEFAULT_INNER", "THETA_KEY", "LEARNABLE", "RuledLOpt", "with_rules", "constant_value"]

DEFAULT_INNER = "LearnableAdam"
"""The architecture a RuledLOpt built without one wraps (`lopt.archs.learnable_hparams.LearnableAdam`)."""

THETA_KEY = "rules"
"""theta's entry of the rules' meta-parameters: {part: {constant: s}}."""

LEARNABLE = {"horizon_scaled": ("power", "residual_power"), "depth_scaled": ("power",),
             "loss_aware_decay": ("rate", "loss_free"), "conv_step_scaled": ("scale",)}
"""The constants that may be meta-parameters, per part: those its update reads as jax values
(the others choose code paths or are compared while the update is built)."""


def constant_value(base: float, s: jax.Array, log_range: float) -> jax.Array:
    """c₀ · exp(R · tanh(s)) (module docstring).

    Args:
      base: c₀ ≠ 0, the constant the chain gives.
      s: float32 [], the meta-parameter.
      log_range: R > 0.

    Returns:
      float32 [].
    """
    return jnp.float32(base) * jnp.exp(log_range * jnp.tanh(jnp.asarray(s, jnp.float32)))


def _frozen(value: Any) -> Any:
    """A chain value as a hashable tuple form (lists become tuples)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _thawed(value: Any) -> Any:
    return [_thawed(v) for v in value] if isinstance(value, tuple) else value


class RuledLOpt(LearnedOptimizer):
    """A learned optimizer inside a rule chain whose `learnable` constants are meta-parameters.

    Build it with `with_rules`. Theta: the inner optimizer's theta (a dict) plus, when a constant is
    learnable, {"rules": {part: {constant: s float32 []}}}. Its config is JSON
    ({"learned_opt": {"architecture", "config"}, "rules", "learnable", "log_range"}), so `lopt.save_theta`
    files rebuild it.

    Args:
      learned_opt: the inner `LearnedOptimizer` (or {"architecture": name, "config": {...}}); None:
        `DEFAULT_INNER`'s default (a cheap stand-in: build a RuledLOpt with `with_rules`).
      rules: the chain (`lopt.rules.chain`), innermost first.
      learnable: "part.constant" names, each in `LEARNABLE` and of a part the chain holds once.
      log_range: R > 0 of every learnable constant.
    """

    learned_opt: Any = None
    rules: Any = ()
    learnable: tuple[str, ...] = ()
    log_range: float = 3.0

    def __post_init__(self) -> None:
        inner = self.learned_opt
        if inner is None:
            inner = architecture(DEFAULT_INNER)()
        if isinstance(inner, dict):
            inner = architecture(inner["architecture"])(**inner["config"])
        if not isinstance(inner, LearnedOptimizer):
            raise TypeError(f"RuledLOpt needs a LearnedOptimizer, got {type(inner).__name__}")
        rules = tuple(tuple(sorted((k, _frozen(v)) for k, v in dict(r).items())) for r in self.rules)
        object.__setattr__(self, "learned_opt", inner)
        object.__setattr__(self, "rules", rules)
        super().__post_init__()

    def check_config(self) -> None:
        """Refuses an unknown part, log_range ≤ 0, a constant that cannot be learnable or that the chain
        holds at 0 or in two parts, and constants a part refuses (each part built once around a probe).

        Raises:
          ValueError: naming the part or constant.
        """
        parts = [r["part"] for r in self.chain]
        unknown = [p for p in parts if p not in chain_lib.PARTS]
        if unknown:
            raise ValueError(f"unknown rule part {unknown[0]!r} in a rule chain; known: {', '.join(chain_lib.PARTS)}")
        if not self.log_range > 0:
            raise ValueError(f"RuledLOpt needs log_range > 0, got {self.log_range!r}")
        for name in self.learnable:
            part, _, const = name.partition(".")
            if const not in LEARNABLE.get(part, ()):
                raise ValueError(f"{name!r} cannot be learnable; learnable constants: "
                                 f"{', '.join(f'{p}.{c}' for p, cs in LEARNABLE.items() for c in cs)}")
            held = [r for r in self.chain if r["part"] == part]
            if len(held) != 1:
                raise ValueError(f"learnable {name!r} needs exactly one {part!r} in the chain, got {len(held)}")
            if not held[0].get(const, _DEFAULTS.get(name, 0.0)):
                raise ValueError(f"learnable {name!r} needs a nonzero value in the chain (c = c0 · exp(R tanh s)), "
                                 f"got {held[0].get(const)!r}")
        chain_lib.apply(_PROBE, self.chain)  # each part checks its constants as it is built

    @property
    def chain(self) -> list:
        """The chain as dicts (lists where the JSON form has lists), innermost first."""
        return [{k: _thawed(v) for k, v in r} for r in self.rules]

    def config(self) -> dict:
        """{"learned_opt": {"architecture", "config"}, "rules", "learnable", "log_range"} (JSON)."""
        return {"learned_opt": {"architecture": self.learned_opt.name, "config": self.learned_opt.config()},
                "rules": self.chain, "learnable": list(self.learnable), "log_range": self.log_range}

    def __repr__(self) -> str:
        return f"RuledLOpt({json.dumps(self.config(), sort_keys=True)})"

    def init(self, key: jax.Array) -> dict:
        """The inner optimizer's theta plus every learnable constant's s = 0 (the chain as given).

        Args:
          key: PRNG key (the inner optimizer's).

        Returns:
          a dict: the inner theta's entries and, with learnable constants, `THETA_KEY`.
        """
        theta = self.learned_opt.init(key)
        if not self.learnable:
            return theta
        if not isinstance(theta, dict) or THETA_KEY in theta:
            raise ValueError(f"with_rules(learnable=...) needs an inner theta that is a dict without {THETA_KEY!r}")
        rules = {}
        for name in self.learnable:
            part, _, const = name.partition(".")
            rules.setdefault(part, {})[const] = jnp.zeros((), jnp.float32)
        return {**theta, THETA_KEY: rules}

    def constants(self, theta: dict) -> list:
        """The chain with each learnable constant c₀ replaced by c₀ · exp(R · tanh(s)) (float32 []).

        Args:
          theta: as from `init` (may be traced).

        Returns:
          the chain, a list of dicts.
        """
        out = self.chain
        for name in self.learnable:
            part, _, const = name.partition(".")
            rule = next(r for r in out if r["part"] == part)
            rule[const] = constant_value(rule.get(const, _DEFAULTS.get(name)), theta[THETA_KEY][part][const],
                                         self.log_range)
        return out

    def fixed_chain(self, theta: dict) -> list:
        """The chain with every learnable constant at its value under `theta`, as Python floats (for a
        consumer that takes constants, not jax values: e.g. `lopt.torch`).

        Args:
          theta: as from `init` (concrete, not traced).

        Returns:
          the chain, a list of dicts.
        """
        return [{k: float(v) if isinstance(v, jax.Array) else v for k, v in rule.items()}
                for rule in self.constants(theta)]

    def inner_theta(self, theta: dict) -> Any:
        """The inner optimizer's part of `theta` (theta without `THETA_KEY` where constants are learnable)."""
        return {k: v for k, v in theta.items() if k != THETA_KEY} if self.learnable else theta

    def opt_fn(self, theta: dict, *, num_steps: Optional[Any] = None, is_training: bool = False,
               weight_dimension_numbers: Any = None, **kwargs) -> optax.GradientTransformationExtraArgs:
        """The inner optimizer's transform inside the chain, learnable constants from theta.

        Args:
          theta: as from `init`.
          num_steps: the horizon N (the inner optimizer's and the schedule and horizon parts'; may be traced).
          is_training: passed to the inner optimizer.
          weight_dimension_numbers: roles where inference should not decide, for the inner optimizer
            (where given) and the parts that read roles.
          **kwargs: more keyword arguments of the inner `opt_fn` (e.g. `strict_roles`).

        Returns:
          An `optax.GradientTransformationExtraArgs`.
        """
        self.check_theta(theta, "RuledLOpt.opt_fn")
        inner_theta = self.inner_theta(theta)
        if weight_dimension_numbers is not None:
            kwargs["weight_dimension_numbers"] = weight_dimension_numbers
        tx = self.learned_opt.opt_fn(inner_theta, num_steps=num_steps, is_training=is_training, **kwargs)
        return chain_lib.apply(tx, self.constants(theta), num_steps=num_steps,
                               weight_dimension_numbers=weight_dimension_numbers)


_DEFAULTS = {"horizon_scaled.power": 1.0, "horizon_scaled.residual_power": 0.0, "depth_scaled.power": 1.0,
             "loss_aware_decay.loss_free": 1.0}  # the parts' defaults where a chain leaves a constant out
# a transform with `lopt.rules.per_tensor`'s interface (it does nothing), to build a chain around for its checks
_PROBE = per_tensor.PerTensorTransform(lambda params: optax.EmptyState(), lambda u, s, params=None, **kw: (u, s))


def with_rules(learned_opt: LearnedOptimizer, rules: Sequence[dict], learnable: Sequence[str] = (),
               log_range: float = 3.0) -> RuledLOpt:
    """`learned_opt` inside the rule chain `rules`, the `learnable` constants meta-parameters (module docstring).

    Example: `with_rules(lopt.Celo2LOpt(), [{"part": "loss_aware_decay", "rate": 0.03, "loss_free": 3.0}],
    learnable=("loss_aware_decay.rate",))` meta-trains the decay rate from 0.03, within [0.03/e³, 0.03·e³].

    Args:
      learned_opt: any `LearnedOptimizer` (a dict theta where constants are learnable).
      rules: the chain (`lopt.rules.chain`), innermost first.
      learnable: "part.constant" names (`LEARNABLE`); () for none (a fixed chain).
      log_range: R > 0, the bound of every learned log(c / c₀).

    Returns:
      a `RuledLOpt`.

    Raises:
      ValueError: an unknown part or constant, a learnable constant the chain holds at 0 or in two parts.
    """
    return RuledLOpt(learned_opt=learned_opt, rules=tuple(rules), learnable=tuple(learnable), log_range=log_range)
