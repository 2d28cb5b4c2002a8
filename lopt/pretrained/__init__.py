"""Meta-trained optimizers shipped with lopt, as package data with their provenance.

    import lopt.pretrained
    lopt.pretrained.names()                          # the shipped names
    tx = lopt.pretrained.load(lopt.pretrained.RECOMMENDED, num_steps=1000)   # an optax transform
    lopt.pretrained.info(NAME)["command"]            # how to meta-train it again

Theta files are stored once, by content: thetas/SHA256.msgpack, a `lopt.save_theta` file
(architecture, config and theta) named by the SHA-256 of its bytes, which `load` checks. A shipped
NAME is a small record, NAME.json: "theta_sha256" (which theta file), "architecture" and "config"
(as meta-trained; rule fields it was meta-trained with included), "rules" (its whole deploy chain:
the `lopt.rules` parts `load` wraps around the architecture, innermost first, each with its
constants; `rule_chain`), "deploy_options" (what `load` sets on that config besides: architecture
settings only; {} for none) with "deploy_reason", and its provenance: "recipe" (the gin file
in scripts/configs/ it was meta-trained from, relative to the repository root; the one place the
recipe lives), "command" (the one command that re-creates it), "git_commit", "hardware",
"meta_training_steps", "meta_training_hours", "meta_training_horizons" ([min, max] steps; `load`
warns past max), "results" (what it was measured to do, where it loses included, in a few lines)
and "licence". Several names may share one theta (celo2_v5 to celo2_v9 do) and differ only in their
deploy options and rules. A record or config written when the rules were architecture fields
(e.g. Celo2LOpt's `wd_rate`, `residual_no_growth`, `conv_step_scale`; NormMLPLOpt's `overshoot_gain`)
still loads: `rule_chain.from_fields` translates those fields into the same chain.

The update layout (`lopt.parts.layout`: how the per-parameter work is cut into blocks, which
changes speed, not the function) is resolved once, when `load` is called: `layout=None` takes
the platform of jax's default backend then ("cpu" or "accelerator").

`RECOMMENDED` ("celo2_v9") is the one to use; "normmlp_v3" is the cheap one on a CPU; the others
stay loadable to reproduce earlier figures (docs/pretrained.md lists each with what differs).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import numbers
import os
import re
import warnings
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lopt.base import LearnedOptimizer
from lopt.parts import layout as layout_lib
from lopt.pretrained import rule_chain
from lopt.serialization import load_learned_optimizer

__all__ = ["RECOMMENDED", "names", "load", "info", "load_learned_optimizer_by_name", "deployed_learned_optimizer",
           "theta_path", "deploy_options"]

RECOMMENDED = "celo2_v9"
"""The one shipped optimizer every default uses (README, `lopt.torch.hf`, the benchmark scripts): the
held-out recommendation, `celo2_v5`'s theta deployed with the horizon, depth, loss-aware weight-decay,
growth-limit and conv-step rules (docs/pretrained.md)."""

_DIR = os.path.dirname(os.path.abspath(__file__))
THETA_DIR = "thetas"  # theta files, each named SHA256.msgpack after its bytes
# What every record holds (checked by `info`, so a shipped record cannot lack any of them).
REQUIRED_INFO = ("name", "architecture", "config", "theta_sha256", "recipe", "command", "git_commit", "hardware",
                 "meta_training_steps", "meta_training_hours", "results", "licence")


def names() -> list[str]:
    """The names of the shipped meta-trained optimizers, sorted.

    Returns:
      Every NAME with a record NAME.json in this package.
    """
    return sorted(f[:-len(".json")] for f in os.listdir(_DIR) if f.endswith(".json"))


def _check_name(name: str) -> None:
    if not isinstance(name, str) or name not in names():
        known = ", ".join(repr(n) for n in names()) or "none"
        raise ValueError(f"unknown pretrained optimizer {name!r}; known: {known}")


def theta_path(name: str) -> str:
    """The path of the shipped theta file of `name` (a `lopt.save_theta` file, shared by every name
    with the same theta).

    Args:
      name: one of `names()`.

    Returns:
      The absolute path of thetas/SHA256.msgpack, SHA256 the record's "theta_sha256".

    Raises:
      ValueError: `name` is not shipped (the message lists the known names), or its record is incomplete.
    """
    return os.path.join(_DIR, THETA_DIR, info(name)["theta_sha256"] + ".msgpack")


def info(name: str) -> dict:
    """The record of a shipped optimizer: its theta, architecture, deploy options and provenance.

    Args:
      name: one of `names()`.

    Returns:
      A fresh dict with at least the keys of `REQUIRED_INFO`: the "architecture" with its "config"
      (as meta-trained), "theta_sha256" (its theta file, `theta_path`), "recipe" (the gin file it was
      meta-trained from, relative to the repository root), "command" (the one command that re-creates
      it), "git_commit", "hardware", "meta_training_steps", "meta_training_hours", "results" (a few
      lines: its measured results against tuned baselines, where it loses included), "licence";
      "rules", its rule chain ([] for none; `rule_chain`); and "deploy_options", what `load` changes
      in that config ({} for none).

    Raises:
      ValueError: `name` is not shipped, or its record lacks a required entry.
    """
    _check_name(name)
    with open(os.path.join(_DIR, name + ".json"), encoding="utf-8") as f:
        record = json.load(f)
    missing = [k for k in REQUIRED_INFO if k not in record]
    if missing:
        raise ValueError(f"the record of pretrained optimizer {name!r} lacks {missing}")
    if not (isinstance(record["theta_sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", record["theta_sha256"])):
        raise ValueError(f"the record of pretrained optimizer {name!r} has theta_sha256 {record['theta_sha256']!r}: "
                         f"expected 64 lower-case hex digits")
    record = copy.deepcopy(record)
    options = record.setdefault("deploy_options", {})
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ValueError(f"the record of pretrained optimizer {name!r} has deploy_options {options!r}: "
                         f"expected an object of hyper-parameter names to values")
    rules = record.setdefault("rules", [])
    if not isinstance(rules, list) or not all(isinstance(r, dict) and r.get("part") in rule_chain.PARTS for r in rules):
        raise ValueError(f"the record of pretrained optimizer {name!r} has rules {rules!r}: expected a list of "
                         f"objects, each with a \"part\" in {rule_chain.PARTS} and its constants")
    return record


def deploy_options(name: str) -> dict:
    """What a shipped optimizer deploys on its saved config, as architecture fields: the record's
    "deploy_options" and its rule chain in the fields that held it inside the architecture
    (`rule_chain.to_fields`; the form `lopt.torch` reads).

    Args:
      name: one of `names()`.

    Returns:
      A fresh dict {hyper-parameter: value} ({} when it deploys the config as meta-trained).
    """
    record = info(name)
    return {**record["deploy_options"], **rule_chain.to_fields(record["architecture"], record["rules"])}


def load_learned_optimizer_by_name(name: str) -> tuple[LearnedOptimizer, Any]:
    """The shipped optimizer's architecture and theta, its file checked against the recorded SHA-256.

    The architecture is the saved config as meta-trained; `load` applies `deploy_options` on top
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
    path = os.path.join(_DIR, THETA_DIR, record["theta_sha256"] + ".msgpack")
    if not os.path.exists(path):
        raise ValueError(f"pretrained optimizer {name!r}: its theta file {path} is missing; reinstall lopt")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != record["theta_sha256"]:
        raise ValueError(f"the theta file of pretrained optimizer {name!r} ({path}) has SHA-256 {digest}, but "
                         f"{record['theta_sha256']} is recorded: the file is damaged or was replaced; reinstall lopt")
    learned_opt, theta = load_learned_optimizer(path)
    if learned_opt.name != record["architecture"] or learned_opt.config() != record["config"]:
        raise ValueError(f"pretrained optimizer {name!r}: its theta file holds {learned_opt.name} with config "
                         f"{learned_opt.config()}, but its record holds {record['architecture']} with {record['config']}")
    return record, learned_opt, theta


def deployed_learned_optimizer(name: str) -> tuple[LearnedOptimizer, Any]:
    """The architecture and theta of what `load` builds, its rules held as architecture fields: the
    saved config with `deploy_options(name)` applied (none: exactly `load_learned_optimizer_by_name`).
    `load` builds the same optimizer from the architecture without them and the parts of its chain.

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
    options = {**(record.get("deploy_options") or {}), **rule_chain.to_fields(record["architecture"], record["rules"])}
    if not options:
        return learned_opt
    try:
        return type(learned_opt)(**{**learned_opt.config(), **options})
    except (TypeError, ValueError) as e:
        raise ValueError(f"pretrained optimizer {name!r}: its deploy_options {options} do not build "
                         f"{learned_opt.name}: {e}") from None


def load(name: str, num_steps: Optional[int] = None, *, weight_dimension_numbers: Any = None,
         strict_roles: bool = False, layout: Any = None) -> optax.GradientTransformationExtraArgs:
    """A shipped meta-trained optimizer as an optax transform.

    Use it as any optax optimizer; it reads the params, so pass them (and, optionally, the loss):
    `updates, state = tx.update(grads, state, params, loss=loss)`. It is the saved architecture
    with the record's "deploy_options" applied and without rule fields (the rules its config was
    meta-trained with are translated out, `rule_chain.from_fields`), inside the `lopt.rules` parts of
    the record's chain, "rules", the whole deploy chain (`rule_chain.apply`).

    Args:
      name: one of `names()`.
      num_steps: the training horizon (the number of updates you will make): a positive int, or a
        scalar jax array that may be traced (e.g. under `optax.inject_hyperparams`, or sampled per
        particle in meta-training; its value is then not checked). Required by optimizers
        meta-trained with progress features (their learned step-size schedule depends on the
        fraction of training done); others ignore it.
      weight_dimension_numbers: which axes of each weight are its inputs, where inference from
        the parameter's path and shape should not decide (`lopt.param_roles`; the fan-in rule of
        `NormMLPLOpt`): a pytree of `lopt.param_roles.ParamRole` / `optax.contrib.MuonDimensionNumbers`
        / None, or a callable (path, shape) -> one of them. None: infer every role.
      strict_roles: raise on a parameter whose input axes cannot be inferred, instead of warning.
      layout: the update layout ("cpu", "accelerator", "sharded" or a `lopt.parts.layout.UpdateLayout`);
        None: the platform of `jax.default_backend()`, read once, now (`lopt.parts.layout.for_platform`).
        It changes speed and float32 rounding, not the update. Parameters sharded over an explicit
        mesh are computed in their own shape with any layout; under automatic sharding pass
        "sharded" so that updates and state keep each parameter's sharding.

    Returns:
      An `optax.GradientTransformationExtraArgs`.

    Raises:
      ValueError: `name` is not shipped, its files are damaged, or `num_steps` is missing or neither
        a positive integer nor a scalar array where the optimizer needs it; `weight_dimension_numbers` or `strict_roles`
        for an architecture without the fan-in rule.

    Warns (UserWarning) when `num_steps` exceeds the longest meta-training horizon the record
    holds ("meta_training_horizons").
    """
    record, learned_opt, theta = _load(name)
    config, _ = rule_chain.from_fields(learned_opt.name, learned_opt.config())  # its rules: in record["rules"]
    options, moved = rule_chain.from_fields(learned_opt.name, record["deploy_options"])
    if moved:
        raise ValueError(f"pretrained optimizer {name!r}: its deploy_options {record['deploy_options']} hold rule "
                         f"fields; a record lists its rules as parts under \"rules\" ({moved})")
    try:
        learned_opt = type(learned_opt)(**{**config, **options})
    except (TypeError, ValueError) as e:
        raise ValueError(f"pretrained optimizer {name!r}: its deploy_options {record['deploy_options']} do not build "
                         f"{learned_opt.name}: {e}") from None
    rules = record["rules"]
    if hasattr(learned_opt, "layout"):
        chosen = layout_lib.for_platform(jax.default_backend()) if layout is None else layout
        learned_opt = dataclasses.replace(learned_opt, layout=chosen)
    needs_horizon = bool(getattr(learned_opt, "use_num_steps", False))
    if num_steps is None and needs_horizon:
        raise ValueError(f"pretrained optimizer {name!r} schedules its step size by training progress: pass "
                         f"num_steps=<the number of updates you will make>, e.g. "
                         f"lopt.pretrained.load({name!r}, num_steps=1000)")
    as_array = isinstance(num_steps, (jax.Array, np.ndarray, np.generic))  # maybe traced: its value is not read
    if as_array and not (np.ndim(num_steps) == 0 and jnp.issubdtype(num_steps.dtype, jnp.number)
                         and not jnp.issubdtype(num_steps.dtype, jnp.bool_)):
        raise ValueError(f"num_steps must be a positive int or a scalar array (the training horizon), got {num_steps!r}")
    if num_steps is not None and not as_array and (
            isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1):
        raise ValueError(f"num_steps must be a positive int (the training horizon), got {num_steps!r}")
    horizons = record.get("meta_training_horizons")
    if num_steps is not None and not as_array and horizons and num_steps > horizons[1]:
        warnings.warn(f"pretrained optimizer {name!r} was meta-trained on horizons of {horizons[0]}-{horizons[1]} steps; "
                      f"at num_steps={num_steps} it is outside them (docs/pretrained.md measures it at 4x: finite, but "
                      f"often ending at a higher loss than with a shorter horizon)", stacklevel=2)
    roles = {}
    if weight_dimension_numbers is not None or strict_roles:
        if not hasattr(learned_opt, "step_scale"):
            raise ValueError(f"pretrained optimizer {name!r} ({learned_opt.name}) has no fan-in rule: "
                             f"weight_dimension_numbers and strict_roles do not apply to it")
        roles = dict(weight_dimension_numbers=weight_dimension_numbers, strict_roles=strict_roles)
    return rule_chain.apply(learned_opt.opt_fn(theta, num_steps=num_steps, **roles), rules, num_steps=num_steps,
                            weight_dimension_numbers=weight_dimension_numbers)
