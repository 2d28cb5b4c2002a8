"""A shipped optimizer's rule chain: the deploy rules `lopt.pretrained.load` wraps around its architecture.

A record (NAME.json) lists its rules under "rules", innermost first, each an object naming a part
of `lopt.rules` and its constants:

    {"part": "scheduled", "name": "cosine"}
    {"part": "horizon_scaled", "reference": 2000, "power": 1.0, "residual_power": 2.0}
    {"part": "depth_scaled", "reference": 3, "power": 1.0}
    {"part": "loss_aware_decay", "rate": 0.03, "loss_power": 1.0, "loss_max": 10.0, "loss_free": 3.0}
    {"part": "growth_limited", "free": 4.0}
    {"part": "conv_step_scaled", "scale": 3.0}
    {"part": "overshoot_brake", "gain": 0.2, "threshold": 0.15}

`apply` (`lopt.rules.chain.apply`) wraps them around the architecture's transform in that order. Around a learned update
that takes `lopt.rules.per_tensor`'s interface the first five act inside it: scheduled,
horizon_scaled and depth_scaled (the matrix path only) multiply each tensor's own step size η,
horizon_scaled's `residual_power` fades the learned residual, loss_aware_decay (with
`learning_rate=None`) adds its rate inside each tensor's bracket and growth_limited acts on the
learned residual; conv_step_scaled and overshoot_brake act on its whole step.

Older records and configs held these rules as architecture fields (Celo2LOpt's `schedule`,
`horizon_reference`, `horizon_power`, `residual_horizon_power`, `depth_reference`, `depth_power`,
`wd_rate`, `wd_loss_*`, `wd_roles`, `residual_no_growth`, `residual_growth_free`, `conv_step_scale`,
`overshoot_gain`, `overshoot_threshold`; NormMLPLOpt's `overshoot_gain`, `overshoot_threshold`).
`from_fields` translates such a config into the architecture's own fields and the equivalent chain
(a learned weight decay, `wd_learned`, stays on the architecture: its λ is in theta); `to_fields`
is the inverse, the form `lopt.torch` still reads.
"""
from __future__ import annotations

from typing import Any, Sequence

from lopt.rules import weight_decay
from lopt.rules.chain import PARTS, apply

__all__ = ["PARTS", "from_fields", "to_fields", "apply"]

# Celo2LOpt's weight-decay fields and the part's arguments they become, with the field defaults.
_WD = {"wd_loss_power": ("loss_power", 0.0), "wd_loss_max": ("loss_max", 10.0), "wd_loss_free": ("loss_free", 1.0),
       "wd_conv_loss_free": ("conv_loss_free", 0.0), "wd_roles": ("roles", weight_decay.DEFAULT_ROLES)}
_ALWAYS = ("loss_power", "loss_max", "loss_free")  # stated in a chain even at their defaults
_BRAKE_THRESHOLD = 0.15  # lopt.rules.chain.BRAKE_THRESHOLD
# Celo2LOpt's step-size rule fields, with their defaults (the value that turns each rule off first).
_SCHEDULE = ("schedule", "constant")
_HORIZON = {"horizon_reference": ("reference", 0), "horizon_power": ("power", 0.5),
            "residual_horizon_power": ("residual_power", 0.0)}
_DEPTH = {"depth_reference": ("reference", 0), "depth_power": ("power", 1.0)}


def from_fields(architecture: str, config: dict) -> tuple[dict, list]:
    """An architecture config whose rule fields became a rule chain.

    Args:
      architecture: the architecture's name ("Celo2LOpt", "NormMLPLOpt"; others pass through).
      config: its config, rule fields included (a record's "config" with its "deploy_options").

    Returns:
      (the config without its rule fields, the chain: a list of dicts as a record's "rules").
    """
    config, rules = dict(config), []
    if architecture == "Celo2LOpt":
        name = config.pop(*_SCHEDULE)
        if name != _SCHEDULE[1]:
            rules.append({"part": "scheduled", "name": name})
        for part, fields in (("horizon_scaled", _HORIZON), ("depth_scaled", _DEPTH)):
            args = {arg: config.pop(field, default) for field, (arg, default) in fields.items()}
            if args["reference"] > 0:
                rules.append({"part": part, **args})
        rate = config.pop("wd_rate", 0.0)
        if config.get("wd_learned", False):  # λ is a meta-parameter: the rule stays inside
            config["wd_rate"] = rate
        else:
            config.pop("wd_learned", None)
            config.pop("wd_log_range", None)
            args = {arg: config.pop(field, default) for field, (arg, default) in _WD.items()}
            if rate > 0:
                args["roles"] = list(args["roles"])
                rules.append({"part": "loss_aware_decay", "rate": rate,
                              **{k: v for k, v in args.items() if k in _ALWAYS or v != _default(k)}})
        free = config.pop("residual_growth_free", 0.0)
        if config.pop("residual_no_growth", False):
            rules.append({"part": "growth_limited", "free": free})
        scale = config.pop("conv_step_scale", 1.0)
        if scale != 1.0:
            rules.append({"part": "conv_step_scaled", "scale": scale})
    if architecture in ("Celo2LOpt", "NormMLPLOpt"):
        gain, threshold = config.pop("overshoot_gain", 0.0), config.pop("overshoot_threshold", _BRAKE_THRESHOLD)
        if gain > 0:
            rules.append({"part": "overshoot_brake", "gain": gain, "threshold": threshold})
    return config, rules


def _default(arg: str) -> Any:
    value = {a: d for a, d in _WD.values()}[arg]
    return list(value) if isinstance(value, tuple) else value


def to_fields(architecture: str, rules: Sequence[dict]) -> dict:
    """The architecture fields that hold a chain inside the architecture (`from_fields`' inverse).

    Args:
      architecture: "Celo2LOpt" or "NormMLPLOpt".
      rules: the chain.

    Returns:
      {field: value} to set on the architecture's config.

    Raises:
      ValueError: a part the architecture has no field for.
    """
    fields = {}
    for rule in rules:
        part, args = rule["part"], {k: v for k, v in rule.items() if k != "part"}
        if part == "scheduled" and architecture == "Celo2LOpt":
            fields[_SCHEDULE[0]] = args.get("name", "cosine")
        elif part in ("horizon_scaled", "depth_scaled") and architecture == "Celo2LOpt":
            names = _HORIZON if part == "horizon_scaled" else _DEPTH
            fields.update({field: args.get(arg, 1.0 if arg == "power" else default)
                           for field, (arg, default) in names.items()})
        elif part == "overshoot_brake" and architecture in ("Celo2LOpt", "NormMLPLOpt"):
            fields.update(overshoot_gain=args["gain"], overshoot_threshold=args.get("threshold", _BRAKE_THRESHOLD))
        elif part == "loss_aware_decay" and architecture == "Celo2LOpt":
            fields["wd_rate"] = args["rate"]
            for field, (arg, _) in _WD.items():
                if arg in args:
                    fields[field] = tuple(args[arg]) if arg == "roles" else args[arg]
        elif part == "growth_limited" and architecture == "Celo2LOpt":
            fields.update(residual_no_growth=True, residual_growth_free=args.get("free", 4.0))
        elif part == "conv_step_scaled" and architecture == "Celo2LOpt":
            fields["conv_step_scale"] = args["scale"]
        else:
            raise ValueError(f"{architecture} has no field for the rule {rule}")
    return fields
