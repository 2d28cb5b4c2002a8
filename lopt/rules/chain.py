"""A rule chain: deploy rules given as data, wrapped around a transform innermost first.

A chain is a list of objects, each naming a part of `lopt.rules` and its constants (the form a
shipped optimizer's record holds, `lopt.pretrained.rule_chain`):

    [{"part": "scheduled", "name": "cosine"},
     {"part": "horizon_scaled", "reference": 2000, "power": 1.0, "residual_power": 2.0},
     {"part": "depth_scaled", "reference": 3, "power": 1.0},
     {"part": "loss_aware_decay", "rate": 0.03, "loss_power": 1.0, "loss_max": 10.0, "loss_free": 3.0},
     {"part": "growth_limited", "free": 4.0},
     {"part": "conv_step_scaled", "scale": 3.0},
     {"part": "overshoot_brake", "gain": 0.2, "threshold": 0.15}]

    tx = lopt.rules.chain.apply(inner, chain, num_steps=N)
    = overshoot_brake(conv_step_scaled(growth_limited(loss_aware_decay(depth_scaled(horizon_scaled(
          scheduled(inner, N, "cosine"), N, 2000, 1.0, 2.0), 3, 1.0), None, 0.03, ...), 4.0), 3.0), 0.2, 0.15)

Around a learned update that takes `lopt.rules.per_tensor`'s interface the first five parts act
inside it (each tensor's step size η, its decay, its learned residual; innermost first), the last
two on its whole step. `loss_aware_decay` in a chain always takes each tensor's own η
(`learning_rate=None`), so a chain needs such an update where it holds that part.
"""
from __future__ import annotations

from typing import Any, Sequence

import optax

from lopt.rules import conv_step, depth, horizon, overshoot_brake, radial, schedule, weight_decay

__all__ = ["PARTS", "BRAKE_THRESHOLD", "apply"]

PARTS = ("scheduled", "horizon_scaled", "depth_scaled", "loss_aware_decay", "growth_limited", "conv_step_scaled",
         "overshoot_brake")
"""The parts a chain may name, in the order older configs' fields translate to (innermost first)."""

BRAKE_THRESHOLD = 0.15
"""The overshoot brake's threshold where a chain leaves it out."""


def apply(tx: optax.GradientTransformationExtraArgs, rules: Sequence[dict], *, num_steps: Any = None,
          weight_dimension_numbers: Any = None) -> optax.GradientTransformationExtraArgs:
    """`tx` inside the chain's parts, innermost first (module docstring).

    Args:
      tx: the transform to wrap (e.g. a `LearnedOptimizer.opt_fn`'s).
      rules: the chain: a sequence of dicts, each {"part": one of `PARTS`, its constants by argument name}.
        A constant may be a jax scalar (e.g. a meta-parameter, `lopt.rules.learned`).
      num_steps: the horizon N the schedule and horizon parts read (an int or a scalar array that may be
        traced; None: unknown, their factors are 1).
      weight_dimension_numbers: roles where inference should not decide, for the parts that read roles.

    Returns:
      the wrapped transform.

    Raises:
      ValueError: a part not in `PARTS`, or constants it refuses.
    """
    for rule in rules:
        part, args = rule.get("part"), {k: v for k, v in rule.items() if k != "part"}
        if part == "scheduled":
            tx = schedule.scheduled(tx, num_steps, **args)
        elif part == "horizon_scaled":
            tx = horizon.horizon_scaled(tx, num_steps, **args)
        elif part == "depth_scaled":
            tx = depth.depth_scaled(tx, weight_dimension_numbers=weight_dimension_numbers, **args)
        elif part == "loss_aware_decay":
            args["roles"] = tuple(args.get("roles", weight_decay.DEFAULT_ROLES))
            tx = weight_decay.loss_aware_decay(tx, None, weight_dimension_numbers=weight_dimension_numbers, **args)
        elif part == "growth_limited":
            tx = radial.growth_limited(tx, weight_dimension_numbers=weight_dimension_numbers, **args)
        elif part == "conv_step_scaled":
            tx = conv_step.conv_step_scaled(tx, weight_dimension_numbers=weight_dimension_numbers, **args)
        elif part == "overshoot_brake":
            tx = overshoot_brake.overshoot_brake(tx, args["gain"], args.get("threshold", BRAKE_THRESHOLD))
        else:
            raise ValueError(f"unknown rule part {part!r} in a rule chain; known: {', '.join(PARTS)}")
    return tx
