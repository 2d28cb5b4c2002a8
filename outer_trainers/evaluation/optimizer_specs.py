"""The optimizers under evaluation: what an optimizer spec names, loaded, labelled and run.

    opts = [resolve_optimizer(s, label) for s, label in zip(specs, optimizer_labels(specs))]
    run = run_learned(opts[0], family, num_steps, cfgs, run_keys, eval_split="test", sequential=False)

A spec is a baseline spec (tuned like a baseline: `parse_baseline`), "pretrained:NAME"
(`lopt.pretrained.load(NAME, num_steps=...)`), "published:NAME" (`lopt.published.load(NAME,
num_steps=...)`: another authors' learned optimizer, e.g. published:celo_adam), a theta file
(`lopt.save_theta`) or a checkpoint file of an `outer_train` run
(`outer_trainers.theta_from_checkpoint`). A learned optimizer is told each task's step budget as
its horizon and is never tuned. "published:NAME" is also an untuned baseline (`--baselines
adam,published:celo_adam`): it runs once per task and every optimizer is scored against it
(lopt.published.load takes no rate, so a published optimizer runs with its authors' own step sizes,
never on a schedule of ours).

A baseline spec is NAME or NAME:SCHEDULE ("adam", "adamw:cosine", "muon:tuned"), or a shipped
optimizer's rules on one ("rules:celo2_v9@adamw"): `baselines.specs` (`parse_baseline`,
`is_tuned_baseline`, `SCHEDULE_CHOICES` and `TUNED`, re-exported here) says what each names.

A learned ablation ("pretrained:NAME-PART", "pretrained:NAME-rules", "untrained:NAME[#SEED]": a
shipped optimizer with parts of its rule chain left out, or with an untrained theta; `ablations`) runs
as a learned optimizer does: told each task's step budget, never tuned. It is also an untuned
baseline (`--baselines adamw:tuned,pretrained:celo2_v9-rules`).
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from outer_trainers.evaluation.ablations import UNTRAINED, ablated_theta, ablation_tx, is_ablation, parse_ablation
from outer_trainers.evaluation.baselines.specs import SCHEDULE_CHOICES, TUNED, is_tuned_baseline, parse_baseline
from outer_trainers.evaluation.task_trainer import VALID_SPLIT, run_fixed
from outer_trainers.evaluation.tuning import baseline_names
from outer_trainers.runs import theta_from_file
from tasks.base import TaskFamily

PRETRAINED = "pretrained:"
PUBLISHED = "published:"


def is_untuned_baseline(spec: str) -> bool:
    """Whether a baseline spec is an untuned learned one ("published:NAME", or a learned ablation:
    `ablations.is_ablation`), run as it is rather than tuned."""
    return isinstance(spec, str) and (spec.startswith(PUBLISHED) or is_ablation(spec))


def untuned_baseline_names() -> list[str]:
    """The untuned baselines: "published:NAME" for every `lopt.published.names()`."""
    from lopt import published
    return [PUBLISHED + n for n in published.names()]


def resolve_optimizer(spec: str, label: str) -> dict:
    """What an optimizer spec names, loaded and checked.

    Args:
      spec: a baseline spec (`parse_baseline`), "pretrained:NAME", "published:NAME", a learned ablation
        (`ablations`: "pretrained:NAME-PART", "untrained:NAME"), a theta file path or an outer_train
        checkpoint file.
      label: the optimizer's name in the results.

    Returns:
      `{"label", "spec", "kind": "baseline" | "pretrained" | "published" | "ablation" | "theta", ...}` with
      the learned optimizer and theta for a theta file and an ablation ("learned_opt", "theta"; and
      "ablation", the `ablations.Ablation`), the name and the `lopt.pretrained` / `lopt.published`
      module for "pretrained:" / "published:" ("name", "module").

    Raises:
      ValueError: an unknown pretrained name (or lopt.pretrained without `load`), a baseline with an unknown
        schedule, an ablation of a part its name's chain lacks, or an unreadable theta file.
    """
    if is_ablation(spec):
        try:
            ablation = parse_ablation(spec)
            learned_opt, theta = ablated_theta(ablation)
        except ValueError as e:
            raise ValueError(f"evaluate: {e}") from None
        return {"label": label, "spec": spec, "kind": "ablation", "ablation": ablation, "learned_opt": learned_opt,
                "theta": theta}
    if is_tuned_baseline(spec):
        try:
            parse_baseline(spec)
        except ValueError as e:
            raise ValueError(f"evaluate: --optimizer {e}") from None
        return {"label": label, "spec": spec, "kind": "baseline"}
    if spec.startswith(PRETRAINED):
        name = spec[len(PRETRAINED):]
        try:
            from lopt import pretrained
        except ImportError as e:
            raise ValueError(f"evaluate: --optimizer {spec}: lopt.pretrained cannot be imported ({e})") from None
        if not (hasattr(pretrained, "load") and hasattr(pretrained, "names")):
            raise ValueError(f"evaluate: --optimizer {spec}: this lopt ships no pretrained optimizers yet "
                             f"(lopt.pretrained has no load/names)")
        if name not in pretrained.names():
            raise ValueError(f"evaluate: --optimizer {spec}: no pretrained optimizer named {name!r}; "
                             f"lopt.pretrained.names() = {list(pretrained.names())}")
        return {"label": label, "spec": spec, "kind": "pretrained", "name": name, "module": pretrained}
    if spec.startswith(PUBLISHED):
        from lopt import published
        name = spec[len(PUBLISHED):]
        if name not in published.names():
            raise ValueError(f"evaluate: {spec}: no published optimizer named {name!r}; "
                             f"lopt.published.names() = {published.names()}")
        return {"label": label, "spec": spec, "kind": "published", "name": name, "module": published}
    if not os.path.isfile(spec):
        raise ValueError(f"evaluate: --optimizer {spec!r} is neither a baseline ({', '.join(baseline_names())}, "
                         f"optionally NAME:SCHEDULE with SCHEDULE one of {', '.join(SCHEDULE_CHOICES)}), "
                         f"nor rules:NAME@BASELINE, nor pretrained:NAME or an ablation of it (pretrained:NAME-PART, "
                         f"pretrained:NAME-rules, untrained:NAME), nor an existing theta or checkpoint file")
    try:
        learned_opt, theta = theta_from_file(spec)
    except ValueError as e:
        raise ValueError(f"evaluate: --optimizer {e}") from None
    return {"label": label, "spec": spec, "kind": "theta", "learned_opt": learned_opt, "theta": theta}


def optimizer_labels(specs: Sequence[str]) -> list[str]:
    """The names of the optimizers in the results, one per spec.

    A baseline keeps its name, "pretrained:NAME", "published:NAME" and an ablation too; a single theta or
    checkpoint file is
    "learned", several are their file stems; a name taken already gets "_i" appended (i its index).

    Args:
      specs: the optimizer specs, in order.

    Returns:
      the labels, unique, in the order of `specs`.
    """
    files = [s for s in specs if not is_tuned_baseline(s) and not s.startswith((PRETRAINED, PUBLISHED, UNTRAINED))]
    labels = []
    for s in specs:
        if s in files:
            label = "learned" if len(files) == 1 else os.path.splitext(os.path.basename(s))[0]
        else:
            label = s
        labels.append(label if label not in labels else f"{label}_{len(labels)}")
    return labels


def learned_tx(opt: dict, num_steps: int) -> tuple[Any, Any]:
    """A learned optimizer's `(make_tx, tx_args)`, told `num_steps` (see `run_learned`).

    Args:
      opt: a `resolve_optimizer` result of kind "theta", "ablation", "pretrained" or "published".
      num_steps: the horizon it is told.

    Returns:
      (tx_args -> optax transform, tx_args): theta for a theta file and an ablation, a placeholder otherwise.
    """
    if opt["kind"] == "ablation":
        ablation, lo = opt["ablation"], opt["learned_opt"]
        return (lambda th: ablation_tx(ablation, num_steps, learned_opt=lo, theta=th)), opt["theta"]
    if opt["kind"] == "theta":
        lo = opt["learned_opt"]
        return (lambda th: lo.opt_fn(th, num_steps=num_steps)), opt["theta"]
    load = opt["module"].load
    return (lambda _: load(opt["name"], num_steps=num_steps)), jnp.zeros(())


def run_learned(opt: dict, family: TaskFamily, num_steps: int, cfgs: Any, run_keys: jax.Array, *,
                eval_split: str, sequential: bool, valid_split: str = VALID_SPLIT, valid_points: int = 1) -> dict:
    """Trains every seed with a learned optimizer (a theta file, a pretrained or a published one), told `num_steps`.

    The optimizer is `learned_opt.opt_fn(theta, num_steps=num_steps)` for a theta file, `ablations.ablation_tx`
    for an ablation, and
    `lopt.pretrained.load` / `lopt.published.load(name, num_steps=num_steps)` for a pretrained /
    published one: the horizon a user would give it for a run of `num_steps` steps.

    Args:
      opt: a `resolve_optimizer` result of kind "theta", "ablation", "pretrained" or "published".
      family: the task family `cfgs` were drawn from.
      num_steps: training steps per run, also the optimizer's horizon.
      cfgs: S task cfgs.
      run_keys: S run keys.
      eval_split: the data split of the test loss after training.
      sequential: run the seeds one after another in the program.
      valid_split: the validation split.
      valid_points: validation measurements per run.

    Returns:
      `run_fixed`'s run dict, named `opt["label"]`.
    """
    make_tx, tx_args = learned_tx(opt, num_steps)
    return run_fixed(family, opt["label"], make_tx, tx_args, cfgs, run_keys, num_steps, eval_split=eval_split,
                     sequential=sequential, valid_split=valid_split, valid_points=valid_points)
