"""Meta-trained optimizers shipped with lopt, as package data with their provenance.

    import lopt.pretrained
    lopt.pretrained.names()                          # the shipped names
    tx = lopt.pretrained.load(NAME, num_steps=1000)  # an optax transform
    lopt.pretrained.info(NAME)["command"]            # how to meta-train it again

Each shipped optimizer NAME is two files in this package: NAME.msgpack, its theta as
`lopt.save_theta` writes it (architecture, config and theta), and NAME.json, its provenance:
the gin config it was meta-trained from, the command that re-creates it, the git commit, the
meta-training steps, hours and hardware, what it was measured to do on held-out tasks against
tuned Adam (including where it loses), the licence and the SHA-256 of the theta file, which
`load` checks, and optionally the range of meta-training horizons ("meta_training_horizons", [min,
max] steps; `load` warns past max). `DEPLOY_OPTIONS` holds the hyper-parameters `load` changes from
a meta-trained config (`info` reports them as "deploy_options"): options that leave theta as it
is, each measured on every suite it changes; the provenance's figures are the deployed
optimizer's (normmlp_v3: the overshoot brake, `NormMLPLOpt.overshoot_gain`; celo2_v4 and
celo2_v5: the horizon rule for runs longer than 2000 steps, `Celo2LOpt.horizon_reference`, and
for celo2_v5 the depth rule for models of more than 3 weight matrices,
`Celo2LOpt.depth_reference`; docs/pretrained.md has the measurements).
This version ships "celo2_v5", "celo2_v4", "celo2_v2" and "celo2_v1" (Celo2LOpt: learned,
Muon-orthogonalized matrix updates; celo2_v5 the best measured), "normmlp_v3" and "normmlp_v2";
docs/pretrained.md has their measurements and where they lose.
"""
from __future__ import annotations

import copy
import hashlib
import json
import numbers
import os
import warnings
from typing import Any, Optional

import optax

from lopt.base import LearnedOptimizer
from lopt.serialization import load_learned_optimizer

__all__ = ["names", "load", "info", "load_learned_optimizer_by_name", "deployed_learned_optimizer", "theta_path",
           "DEPLOY_OPTIONS"]

_DIR = os.path.dirname(os.path.abspath(__file__))
# What every provenance file records (checked by `info`, so a shipped file cannot lack any of them).
REQUIRED_INFO = ("name", "architecture", "gin_config", "command", "git_commit", "meta_training_steps",
                 "meta_training_hours", "hardware", "suite_summary", "licence", "theta_sha256")
#: The hyper-parameters `load` sets on a shipped optimizer's saved config, by name. For normmlp_v3
#: the overshoot brake, which ends the digits autoencoder's collapse; on heldout-cpu no win or loss
#: against tuned Adam changed and final train losses moved by -10% to +16%. Not for normmlp_v2, whose
#: held-out figures it moved materially (digits_conv_8x16_relu 4.7x higher, text_lstm_h48 +42%).
#: docs/pretrained.md has both measurements. For celo2_v4 the horizon rule (`Celo2LOpt.horizon_reference`):
#: past 2000 steps both step sizes times 2000/N and the learned residual of the matrix direction times
#: (2000/N)^2. It is 1 on every run of at most 2000 steps (every heldout-cpu, lm-cpu and scaling-cpu
#: budget: those results are unchanged, bit for bit); the exponents were chosen on validation-long-cpu.
#: For celo2_v5 the same horizon rule (its step-size part was in place while it was meta-trained) and
#: the depth rule (`Celo2LOpt.depth_reference`): in a model of D > 3 orthogonalized tensors the matrix
#: step size times 3/D, chosen on validation-scaling-cpu; 1 on every model of at most 3 weight matrices.
DEPLOY_OPTIONS = {"normmlp_v3": {"overshoot_gain": 0.2},
                  "celo2_v4": {"horizon_reference": 2000, "horizon_power": 1.0, "residual_horizon_power": 2.0},
                  "celo2_v5": {"horizon_reference": 2000, "horizon_power": 1.0, "residual_horizon_power": 2.0,
                               "depth_reference": 3, "depth_power": 1.0}}


def names() -> list[str]:
    """The names of the shipped meta-trained optimizers, sorted.

    Returns:
      Every NAME with both NAME.msgpack and NAME.json in this package.
    """
    files = set(os.listdir(_DIR))
    return sorted(f[:-len(".json")] for f in files if f.endswith(".json") and f[:-len(".json")] + ".msgpack" in files)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or name not in names():
        known = ", ".join(repr(n) for n in names()) or "none"
        raise ValueError(f"unknown pretrained optimizer {name!r}; known: {known}")


def theta_path(name: str) -> str:
    """The path of the shipped theta file of `name` (a `lopt.save_theta` file).

    Args:
      name: one of `names()`.

    Returns:
      The absolute path of NAME.msgpack.

    Raises:
      ValueError: `name` is not shipped (the message lists the known names).
    """
    _check_name(name)
    return os.path.join(_DIR, name + ".msgpack")


def info(name: str) -> dict:
    """The provenance of a shipped optimizer.

    Args:
      name: one of `names()`.

    Returns:
      A fresh dict with at least the keys of `REQUIRED_INFO`: "gin_config" (the config text it was
      meta-trained from), "command" (the one command that re-creates it), "git_commit",
      "meta_training_steps", "meta_training_hours", "hardware", "suite_summary" (its measured
      results against tuned Adam on held-out tasks, where it loses included), "licence",
      "theta_sha256"; the "architecture" with its "config" (as meta-trained); and "deploy_options",
      what `load` changes in that config (`DEPLOY_OPTIONS`; {} for none).

    Raises:
      ValueError: `name` is not shipped, or its provenance file lacks a required entry.
    """
    _check_name(name)
    with open(os.path.join(_DIR, name + ".json"), encoding="utf-8") as f:
        record = json.load(f)
    missing = [k for k in REQUIRED_INFO if k not in record]
    if missing:
        raise ValueError(f"the provenance file of pretrained optimizer {name!r} lacks {missing}")
    record = copy.deepcopy(record)
    record["deploy_options"] = dict(DEPLOY_OPTIONS.get(name, {}))
    return record


def load_learned_optimizer_by_name(name: str) -> tuple[LearnedOptimizer, Any]:
    """The shipped optimizer's architecture and theta, its file checked against the recorded SHA-256.

    The architecture is the saved config as meta-trained; `load` applies `DEPLOY_OPTIONS` on top
    (`deployed_learned_optimizer`).

    Args:
      name: one of `names()`.

    Returns:
      (the LearnedOptimizer built from the saved config, theta as jax arrays).

    Raises:
      ValueError: `name` is not shipped, or its theta file does not have the recorded checksum or
        architecture (a damaged or replaced file).
    """
    return _load(name)[1:]


def _load(name: str) -> tuple[dict, LearnedOptimizer, Any]:
    """(provenance, architecture, theta) of a shipped optimizer, the theta file checked (see above)."""
    record = info(name)
    path = theta_path(name)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != record["theta_sha256"]:
        raise ValueError(f"the theta file of pretrained optimizer {name!r} ({path}) has SHA-256 {digest}, but "
                         f"{record['theta_sha256']} is recorded: the file is damaged or was replaced; reinstall lopt")
    learned_opt, theta = load_learned_optimizer(path)
    if learned_opt.name != record["architecture"]:
        raise ValueError(f"pretrained optimizer {name!r}: its theta file holds {learned_opt.name}, but its provenance "
                         f"records {record['architecture']}")
    return record, learned_opt, theta


def deployed_learned_optimizer(name: str) -> tuple[LearnedOptimizer, Any]:
    """The architecture and theta `load` uses: the saved config with its `DEPLOY_OPTIONS` applied
    (none: exactly `load_learned_optimizer_by_name`).

    Args:
      name: one of `names()`.

    Returns:
      (the LearnedOptimizer, theta as jax arrays).

    Raises:
      ValueError: as `load_learned_optimizer_by_name`, or deploy options the architecture does not take.
    """
    record, learned_opt, theta = _load(name)
    return _deployed(name, record, learned_opt), theta


def _deployed(name: str, record: dict, learned_opt: LearnedOptimizer) -> LearnedOptimizer:
    options = record.get("deploy_options") or {}
    if not options:
        return learned_opt
    try:
        return type(learned_opt)(**{**learned_opt.config(), **options})
    except (TypeError, ValueError) as e:
        raise ValueError(f"pretrained optimizer {name!r}: its deploy_options {options} do not build "
                         f"{learned_opt.name}: {e}") from None


def load(name: str, num_steps: Optional[int] = None, *, weight_dimension_numbers: Any = None,
         strict_roles: bool = False) -> optax.GradientTransformationExtraArgs:
    """A shipped meta-trained optimizer as an optax transform.

    Use it as any optax optimizer; it reads the params, so pass them (and, optionally, the loss):
    `updates, state = tx.update(grads, state, params, loss=loss)`. The architecture is the saved
    one with its `DEPLOY_OPTIONS` applied (`deployed_learned_optimizer`).

    Args:
      name: one of `names()`.
      num_steps: the training horizon (the number of updates you will make). Required by
        optimizers meta-trained with progress features (their learned step-size schedule depends
        on the fraction of training done); others ignore it.
      weight_dimension_numbers: which axes of each weight are its inputs, where inference from
        the parameter's path and shape should not decide (`lopt.param_roles`; the fan-in rule of
        `NormMLPLOpt`): a pytree of `lopt.param_roles.ParamRole` / `optax.contrib.MuonDimensionNumbers`
        / None, or a callable (path, shape) -> one of them. None: infer every role.
      strict_roles: raise on a parameter whose input axes cannot be inferred, instead of warning.

    Returns:
      An `optax.GradientTransformationExtraArgs`.

    Raises:
      ValueError: `name` is not shipped, its files are damaged, or `num_steps` is missing or not a
        positive integer where the optimizer needs it; `weight_dimension_numbers` or `strict_roles`
        for an architecture without the fan-in rule.

    Warns (UserWarning) when `num_steps` exceeds the longest meta-training horizon the provenance
    records ("meta_training_horizons").
    """
    record, learned_opt, theta = _load(name)
    learned_opt = _deployed(name, record, learned_opt)
    needs_horizon = bool(getattr(learned_opt, "use_num_steps", False))
    if num_steps is None and needs_horizon:
        raise ValueError(f"pretrained optimizer {name!r} schedules its step size by training progress: pass "
                         f"num_steps=<the number of updates you will make>, e.g. "
                         f"lopt.pretrained.load({name!r}, num_steps=1000)")
    if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1):
        raise ValueError(f"num_steps must be a positive int (the training horizon), got {num_steps!r}")
    horizons = record.get("meta_training_horizons")
    if num_steps is not None and horizons and num_steps > horizons[1]:
        warnings.warn(f"pretrained optimizer {name!r} was meta-trained on horizons of {horizons[0]}-{horizons[1]} steps; "
                      f"at num_steps={num_steps} it is outside them (docs/pretrained.md measures it at 4x: finite, but "
                      f"often ending at a higher loss than with a shorter horizon)", stacklevel=2)
    roles = {}
    if weight_dimension_numbers is not None or strict_roles:
        if not hasattr(learned_opt, "step_scale"):
            raise ValueError(f"pretrained optimizer {name!r} ({learned_opt.name}) has no fan-in rule: "
                             f"weight_dimension_numbers and strict_roles do not apply to it")
        roles = dict(weight_dimension_numbers=weight_dimension_numbers, strict_roles=strict_roles)
    return learned_opt.opt_fn(theta, num_steps=num_steps, **roles)
