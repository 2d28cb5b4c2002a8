"""A shipped optimizer's deploy rules, read from its record, with parts left out, and on a baseline.

    chain = record_chain("celo2_v9")                 # what lopt.pretrained.load wraps, read now
    name, without = parse_preset("celo2_v9-growth_limited", "evaluate")
    make_tx = rules_baseline(chain_without(chain, without), "adamw", num_steps)   # tuned like a baseline

A shipped name's rule chain is its record's "rules" (`lopt.pretrained.info(name)["rules"]`, the
chain `lopt.pretrained.load` wraps around its architecture, innermost first; `lopt.pretrained.rule_chain`),
read when a spec is built, never copied: a rule moved from the architecture into the chain (the
schedule, the horizon and depth factors) shows here without a change.

`NAME[-PART...]` names a preset with the parts PART of its chain left out (each must be in it, at
most once); `NAME-rules` leaves out every part.

On a hand-designed baseline (`rules_baseline`) each part wraps the baseline's transform with the
record's constants, as `rule_chain.apply` wraps a learned update, except where a part reads a
quantity inside a learned update. Inside one, the loss-aware weight decay enters each tensor's
bracket, Δp = −η (d + λ p), η the tensor's step size with every step-size factor of the chain in it;
on a baseline it is therefore added to the baseline's own step first (innermost, whatever its place
in the chain; `lopt.rules.loss_aware_decay` with the baseline's rate schedule η_t as its step size),
and the chain's step-size parts then scale both,

    Δp = σ_t h d · (u_t − η_t · λ₀ · φ_t · p)      (AdamW's decoupled decay, λ₀ φ_t in place of its wd)

(σ_t h d the chain's schedule, horizon and depth factors, where it holds them). The growth limit
(`lopt.rules.growth_limited`) acts on the baseline's whole step, and the horizon factor multiplies it
without its residual fade (a baseline has no learned residual: `RESIDUAL_ONLY`). With a weight-decay
part in the chain the baseline's own decay is 0 (the rule is its decay); without one, AdamW and
Muon tune theirs as `spec_tuning` does.
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

import optax

import lopt.rules
from lopt import pretrained
from lopt.pretrained import rule_chain
from outer_trainers.evaluation.baselines.schedules import baseline_transform, scheduled_rate
from outer_trainers.evaluation.task_trainer import MakeTx
from outer_trainers.evaluation.tuning import baseline, baseline_names

__all__ = ["ALL_RULES", "DECAY_PART", "record_chain", "parse_preset", "chain_without", "has_decay_rule",
           "apply_chain", "apply_to_baseline", "rules_baseline"]

ALL_RULES = "rules"
"""`NAME-rules`: every part of the chain left out (the theta alone)."""
DECAY_PART = "loss_aware_decay"
SCHEDULE_PART = "scheduled"  # the part that schedules the step over the horizon
RESIDUAL_ONLY = ("residual_power",)
"""Constants of a part that act on a learned update's residual alone, left out on a baseline."""


def record_chain(name: str) -> list[dict]:
    """The rule chain `lopt.pretrained.load(name)` applies, read from its record now (module docstring).

    Args:
      name: one of `lopt.pretrained.names()`.

    Returns:
      a fresh list of {"part": ..., constants...}, innermost first.

    Raises:
      ValueError: an unknown name (the message lists the shipped ones).
    """
    return [dict(r) for r in pretrained.info(name)["rules"]]


def parse_preset(text: str, what: str) -> tuple[str, tuple[str, ...]]:
    """`NAME[-PART...]` split into a shipped name and the parts of its chain to leave out.

    Args:
      text: e.g. "celo2_v9", "celo2_v9-growth_limited", "celo2_v9-rules".
      what: the spec, for the messages.

    Returns:
      (NAME, the parts left out: () for none, `ALL_RULES` alone for every one).

    Raises:
      ValueError: an unknown name, a part not in the name's chain, a part named twice, or "rules" with
        another part; each message lists what is valid.
    """
    name, *without = text.split("-")
    if name not in pretrained.names():
        raise ValueError(f"{what}: no pretrained optimizer named {name!r}; lopt.pretrained.names() = "
                         f"{pretrained.names()}")
    parts = [r["part"] for r in record_chain(name)]
    for part in without:
        if part == ALL_RULES and len(without) == 1:
            continue
        if part == ALL_RULES or part not in parts:
            raise ValueError(f"{what}: {part!r} is not a rule of {name}'s chain to leave out; its chain (read now "
                             f"from lopt.pretrained.info({name!r})) is {parts or 'empty'}: write {name}-PART with "
                             f"PART one of {parts}, or {name}-{ALL_RULES} for none of them")
        if without.count(part) > 1:
            raise ValueError(f"{what}: {part!r} is left out twice")
    return name, tuple(without)


def chain_without(chain: Sequence[dict], without: Sequence[str]) -> list[dict]:
    """`chain` without the parts named in `without` (`ALL_RULES`: without any), in its order."""
    if ALL_RULES in without:
        return []
    return [dict(r) for r in chain if r["part"] not in without]


def has_decay_rule(chain: Sequence[dict]) -> bool:
    """Whether `chain` holds the loss-aware weight-decay part."""
    return any(r["part"] == DECAY_PART for r in chain)


def _apply_options(num_steps: Any) -> dict:
    """The keyword arguments `rule_chain.apply` takes of ours: `num_steps` where it takes a horizon."""
    return {"num_steps": num_steps} if "num_steps" in inspect.signature(rule_chain.apply).parameters else {}


def apply_chain(tx: optax.GradientTransformation, chain: Sequence[dict], num_steps: Any = None,
                ) -> optax.GradientTransformationExtraArgs:
    """`lopt.pretrained.rule_chain.apply(tx, chain)`, told the horizon where it takes one.

    Args:
      tx: a learned update (`LearnedOptimizer.opt_fn`).
      chain: rule dicts, innermost first.
      num_steps: the horizon (for parts that read it).

    Returns:
      the wrapped transform (`tx` itself, as an extra-args transform, for an empty chain).
    """
    if not chain:
        return optax.with_extra_args_support(tx)
    return rule_chain.apply(tx, list(chain), **_apply_options(num_steps))


def apply_to_baseline(tx: optax.GradientTransformation, chain: Sequence[dict], learning_rate: Any,
                      num_steps: Any = None) -> optax.GradientTransformationExtraArgs:
    """A hand-designed transform inside `chain`'s parts (module docstring).

        loss_aware_decay   first, around tx: lopt.rules.loss_aware_decay(tx, learning_rate, rate, ...), η_t the
                           baseline's rate
        every other part   then, innermost first: lopt.pretrained.rule_chain.apply(tx, [part], num_steps=...), on
                           the whole step, without the constants that act on a learned residual alone
                           (`RESIDUAL_ONLY`: the horizon rule's residual fade)

    Args:
      tx: the baseline's transform.
      chain: rule dicts, innermost first.
      learning_rate: the baseline's rate, a float or an optax schedule of the update count.
      num_steps: the horizon (for parts that read it).

    Returns:
      the wrapped transform. Pass `params` (and the loss: `loss=`) to its update.
    """
    tx = optax.with_extra_args_support(tx)
    decays_first = [r for r in chain if r["part"] == DECAY_PART] + [r for r in chain if r["part"] != DECAY_PART]
    for rule in decays_first:
        args = {k: v for k, v in rule.items() if k != "part"}
        if rule["part"] == DECAY_PART:
            if "roles" in args:
                args["roles"] = tuple(args["roles"])
            tx = lopt.rules.loss_aware_decay(tx, learning_rate, **args)
        else:
            tx = apply_chain(tx, [{k: v for k, v in rule.items() if k not in RESIDUAL_ONLY}], num_steps)
    return tx


def rules_baseline(chain: Sequence[dict], name: str, num_steps: int, *, momentum: float = 0.9,
                   warmup_fraction: float = 0.05) -> MakeTx:
    """A baseline inside a rule chain, its rate, decay and schedule traced arguments (tuned as a baseline).

    The baseline's step is `schedules.scheduled_baseline`'s (`baseline_transform` at the rate
    `scheduled_rate(schedule, learning_rate, num_steps)`), wrapped by `apply_to_baseline` with that
    same rate schedule as the weight-decay part's η_t.

    Args:
      chain: rule dicts, innermost first (`record_chain`, `chain_without`).
      name: a baseline name ("adam", "adamw", "muon", "sgdm").
      num_steps: T, the schedules' budget and the parts' horizon.
      momentum: SGD's momentum.
      warmup_fraction: the warm-up fraction of the warm-up schedules.

    Returns:
      `{"learning_rate", "weight_decay", "schedule"} -> optax transform`, every entry may be traced.
    """
    if name not in baseline_names():
        raise ValueError(f"unknown baseline {name!r}; the baselines are {baseline_names()}")
    if name == "muon":
        baseline("muon")  # the optax version check
    chain = [dict(r) for r in chain]

    def make_tx(args):
        rate = scheduled_rate(args["schedule"], args["learning_rate"], num_steps, warmup_fraction)
        return apply_to_baseline(baseline_transform(name, rate, args["weight_decay"], momentum=momentum), chain,
                                 rate, num_steps)
    return make_tx
