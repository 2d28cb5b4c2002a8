"""Ablations of a shipped learned optimizer as optimizer specs: what its theta and its deploy rules each add.

    opt = resolve_ablation("pretrained:celo2_v9-growth_limited")
    tx = ablation_tx(opt, num_steps=1000)                    # an optax transform, as lopt.pretrained.load's

A shipped name (`lopt.pretrained`) is a theta, an architecture and a rule chain (its record's
"rules", `baselines.preset_rules.record_chain`, read when the spec is built). The specs:

    pretrained:NAME-PART[-PART...]   NAME's theta and architecture inside its chain without the parts
                                     PART (e.g. pretrained:celo2_v9-growth_limited): the rules switched
                                     off one at a time
    pretrained:NAME-rules            the theta alone: its architecture with no rule around it
    untrained:NAME[-PART...]         the same architecture and chain (all of it by default) with an
                                     untrained theta, `learned_opt.init(jax.random.key(SEED))`, SEED 0
    untrained:NAME[-PART...]#SEED    ... with another seed
    rules:NAME@BASELINE              the chain on a hand-designed baseline, tuned like one
                                     (`baselines.specs`, `baselines.preset_rules`)

The architecture is the one `lopt.pretrained.load(NAME)` builds (`preset_architecture`): the record's
config without rule fields (`lopt.pretrained.rule_chain.from_fields`) with its "deploy_options", on
the platform's update layout, so that `pretrained:NAME` with nothing left out is `load(NAME)`'s
transform. A learned ablation is told each task's step budget as its horizon and is not tuned, as
`pretrained:NAME` is.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax

from lopt import pretrained
from lopt.base import LearnedOptimizer
from lopt.parts import layout as layout_lib
from lopt.pretrained import rule_chain
from outer_trainers.evaluation.baselines.preset_rules import apply_chain, chain_without, parse_preset, record_chain
from outer_trainers.evaluation.baselines.specs import RULES, parse_rules_baseline

__all__ = ["PRETRAINED", "UNTRAINED", "Ablation", "is_ablation", "parse_ablation", "preset_architecture",
           "ablated_theta", "ablation_tx", "ablation_specs", "rule_chains"]

PRETRAINED = "pretrained:"
UNTRAINED = "untrained:"
SEED_MARK = "#"


class Ablation(NamedTuple):
    """A learned ablation spec, parsed (module docstring).

    Attributes:
      spec: the spec as written.
      name: the shipped name.
      without: the parts of its chain left out (`preset_rules.ALL_RULES` alone: all of them).
      trained: whether theta is the shipped one (else `learned_opt.init(jax.random.key(seed))`).
      seed: the untrained theta's seed.
    """
    spec: str
    name: str
    without: tuple
    trained: bool
    seed: int = 0


def is_ablation(spec: Any) -> bool:
    """Whether `spec` names a learned ablation: "untrained:..." or "pretrained:NAME-..."."""
    return isinstance(spec, str) and (spec.startswith(UNTRAINED) or (spec.startswith(PRETRAINED) and "-" in spec))


def parse_ablation(spec: str) -> Ablation:
    """A learned ablation spec (module docstring) parsed and checked against the record read now.

    Args:
      spec: e.g. "pretrained:celo2_v9-growth_limited", "pretrained:celo2_v9-rules", "untrained:celo2_v9#3".

    Returns:
      the `Ablation`.

    Raises:
      ValueError: not an ablation spec, an unknown name or part (the message lists the name's chain), or
        a seed that is not an integer >= 0.
    """
    if not is_ablation(spec):
        raise ValueError(f"{spec!r} is not an ablation spec: write pretrained:NAME-PART, pretrained:NAME-rules or "
                         f"untrained:NAME[-PART...][{SEED_MARK}SEED] (NAME of {pretrained.names()})")
    trained = spec.startswith(PRETRAINED)
    body = spec[len(PRETRAINED if trained else UNTRAINED):]
    seed = 0
    if not trained and SEED_MARK in body:
        body, _, text = body.partition(SEED_MARK)
        if not text.isdigit():
            raise ValueError(f"{spec!r}: the untrained theta's seed after {SEED_MARK!r} must be an integer >= 0, "
                             f"got {text!r}")
        seed = int(text)
    name, without = parse_preset(body, spec)
    return Ablation(spec, name, without, trained, seed)


def preset_architecture(name: str) -> tuple[LearnedOptimizer, Any]:
    """The architecture and theta that `lopt.pretrained.load(name)` wraps in its chain (module docstring).

    Args:
      name: one of `lopt.pretrained.names()`.

    Returns:
      (the LearnedOptimizer, the shipped theta).

    Raises:
      ValueError: as `lopt.pretrained.load_learned_optimizer_by_name`, or deploy options that do not build it.
    """
    record = pretrained.info(name)
    learned_opt, theta = pretrained.load_learned_optimizer_by_name(name)
    config, _ = rule_chain.from_fields(learned_opt.name, {**learned_opt.config(), **record["deploy_options"]})
    try:
        learned_opt = type(learned_opt)(**config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"pretrained optimizer {name!r}: its config and deploy_options do not build "
                         f"{learned_opt.name}: {e}") from None
    if hasattr(learned_opt, "layout"):
        learned_opt = dataclasses.replace(learned_opt, layout=layout_lib.for_platform(jax.default_backend()))
    return learned_opt, theta


def ablated_theta(ablation: Ablation) -> tuple[LearnedOptimizer, Any]:
    """The ablation's architecture and theta: the shipped one, or `learned_opt.init(jax.random.key(seed))`."""
    learned_opt, theta = preset_architecture(ablation.name)
    return learned_opt, (theta if ablation.trained else learned_opt.init(jax.random.key(ablation.seed)))


def ablation_tx(ablation: Ablation, num_steps: Any, *, learned_opt: Any = None, theta: Any = None):
    """The ablation's optax transform, told the horizon `num_steps`.

        apply_chain(learned_opt.opt_fn(theta, num_steps=N), chain_without(record_chain(NAME), without), N)

    Args:
      ablation: a `parse_ablation` result.
      num_steps: the horizon N (an int or a scalar array that may be traced).
      learned_opt: the architecture (default: `ablated_theta`'s).
      theta: its theta (may be traced; default: `ablated_theta`'s).

    Returns:
      an `optax.GradientTransformationExtraArgs`; pass params (and `loss=`) to its update.
    """
    if learned_opt is None or theta is None:
        built, built_theta = ablated_theta(ablation)
        learned_opt = built if learned_opt is None else learned_opt
        theta = built_theta if theta is None else theta
    chain = chain_without(record_chain(ablation.name), ablation.without)
    return apply_chain(learned_opt.opt_fn(theta, num_steps=num_steps), chain, num_steps)


def ablation_specs(name: str, baseline: str = "adamw") -> list[str]:
    """The ablation table of a shipped name: the name itself, its theta alone, each rule switched off, its rules
    on `baseline` (tuned), and its rules with an untrained theta.

    Args:
      name: one of `lopt.pretrained.names()`.
      baseline: the baseline spec the rules go on.

    Returns:
      the specs, e.g. for celo2_v9: pretrained:celo2_v9, pretrained:celo2_v9-rules,
      pretrained:celo2_v9-PART for each PART of its chain, rules:celo2_v9@adamw, untrained:celo2_v9.
    """
    parts = [r["part"] for r in record_chain(name)]
    out = [f"{PRETRAINED}{name}"]
    if parts:
        out += [f"{PRETRAINED}{name}-rules"] + [f"{PRETRAINED}{name}-{p}" for p in dict.fromkeys(parts)]
        out.append(f"rules:{name}@{baseline}")
    return out + [f"{UNTRAINED}{name}"]


def rule_chains(specs: Sequence[str]) -> dict:
    """The rule chain each ablation and rules spec among `specs` runs, read from the records now.

    An evaluation's finished tasks are kept with these (`task_store`), so that runs made with another
    chain (a record changed since) are neither resumed nor reused as baselines.

    Args:
      specs: optimizer and baseline specs (others are skipped).

    Returns:
      {spec: [rule dicts]} for each learned ablation (`is_ablation`) and "rules:" spec; {} for none.
    """
    out = {}
    for spec in specs:
        if is_ablation(spec):
            ablation = parse_ablation(spec)
            out[spec] = chain_without(record_chain(ablation.name), ablation.without)
        elif isinstance(spec, str) and spec.startswith(RULES):
            name, without, _, _ = parse_rules_baseline(spec)
            out[spec] = chain_without(record_chain(name), without)
    return out
