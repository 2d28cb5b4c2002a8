"""Training a run further: what a resume with `extend=True` may change, and the run's config history.

    entry = check_resume(path, saved_meta, expect_meta, step, extend=True, horizon_keys=("eval_steps",))
    # None: a plain resume; else {"from_steps", "to_steps", "at_step", "time", "changed"}

A run records its length as "num_steps" in its checkpoints' metadata. A plain resume must match
that metadata exactly, the length included (a different one is refused, naming `extend=True` /
`--extend`), unless the loop declares its length free (`fixed_length=False`: meta-training, whose
state and schedules do not depend on its length, has always resumed to any `num_steps`; a
changed length is then recorded like an extension). With `extend=True` a finished or interrupted
run continues to another length, and the *horizon* of the metadata may differ from the checkpoint's:

- "num_steps" itself;
- the keys the caller derives from it (`horizon_keys`, e.g. the training loop's "eval_steps");
- in the caller's config, the gin bindings of a horizon (`is_horizon_binding`): those whose
  parameter, the name after the last dot (case-insensitive, so a macro `NUM_STEPS` counts), is one
  of HORIZON_PARAMETERS: a length (`fit.num_steps`, `learned_optimizer.num_steps`) or an optax
  schedule's (`optax.cosine_decay_schedule.decay_steps`, `optax.linear_schedule.transition_steps`).

Everything else must still match, and the new length must be at least the steps the run has
taken. An extension is recorded: {"from_steps": the checkpoint's num_steps, "to_steps": the new
one, "at_step": the checkpoint's step, "time": UTC ISO 8601, "changed": the other horizon
differences, in words} is appended to the run's config history (HISTORY_KEY of every later
checkpoint's metadata; `run_checkpoints.config_history` reads it). A resume that changes nothing
appends nothing, so re-running an interrupted extension with the same arguments just resumes it.

What an extension means for the state is the loop's to say (`outer_train`, `train_loop`): the
checkpointed state continues as it is, and what is computed from num_steps is computed from the
new value for the steps still to come. A checkpoint that records no "num_steps" (written before
runs recorded their length) resumes to any length, as it did then, and records nothing.
"""
from __future__ import annotations

import datetime
from typing import Optional, Sequence

from outer_trainers.runs.checkpoint_files import check_meta, meta_differences

HISTORY_KEY = "config_history"
LENGTH_KEY = "num_steps"
HORIZON_PARAMETERS = ("num_steps", "decay_steps", "transition_steps")
EXTEND_ADVICE = ("pass extend=True (train_model, train_loop, outer_train, ray_outer_train; fit.extend / "
                 "train.extend in gin) or --extend (scripts/train.py, scripts/outer_train.py)")


def is_horizon_binding(binding: str) -> bool:
    """Whether a gin binding sets a horizon, which an extension may change.

    Args:
        binding: one binding as the scripts' configs record them ("name = value").

    Returns:
        True when the parameter name (after the last "." or "/", case-insensitive) is in HORIZON_PARAMETERS.
    """
    name = binding.split("=", 1)[0].strip()
    return name.rsplit("/", 1)[-1].rsplit(".", 1)[-1].lower() in HORIZON_PARAMETERS


def without_horizon(meta: dict, horizon_keys: Sequence[str] = ()) -> dict:
    """`meta` without what an extension may change.

    Args:
        meta: a run's metadata.
        horizon_keys: further keys derived from num_steps.

    Returns:
        A copy without LENGTH_KEY and `horizon_keys`, and without the horizon bindings
        (`is_horizon_binding`) of `meta["config"]["gin_bindings"]` when there is such a list.
    """
    out = {k: v for k, v in meta.items() if k != LENGTH_KEY and k not in horizon_keys}
    config = out.get("config")
    if isinstance(config, dict) and isinstance(config.get("gin_bindings"), list):
        kept = [b for b in config["gin_bindings"] if not (isinstance(b, str) and is_horizon_binding(b))]
        out["config"] = dict(config, gin_bindings=kept)
    return out


def check_resume(path: str, saved: dict, expect: dict, step: int, *, extend: bool = False,
                 horizon_keys: Sequence[str] = (), fixed_length: bool = True) -> Optional[dict]:
    """Checks that a run may resume from a checkpoint, and what extension it would record.

    Args:
        path: the checkpoint's path (for messages).
        saved: its metadata.
        expect: the metadata of the run resuming it.
        step: its step (steps the run has taken).
        extend: whether the run may continue to another length (see the module docstring).
        horizon_keys: metadata keys derived from num_steps, which may change with it.
        fixed_length: without `extend`, the length must match too (False: any length resumes; a changed
            one is recorded).

    Returns:
        None for a plain resume (nothing of the horizon changes); else the config-history entry the
        extension appends.

    Raises:
        ValueError: the metadata differs (without `extend`: anywhere but a free length, the message naming
            `extend=True` when only the horizon differs; with it: outside the horizon), or `extend` asks for
            fewer steps than the run has taken.
    """
    without_length = {k: v for k, v in expect.items() if k != LENGTH_KEY}
    if LENGTH_KEY not in saved or LENGTH_KEY not in expect:  # a run that records no length
        check_meta(path, saved, without_length)
        return None
    from_steps, to_steps = saved[LENGTH_KEY], expect[LENGTH_KEY]
    if not extend:
        try:
            check_meta(path, saved, expect if fixed_length else without_length)
        except ValueError as e:
            if meta_differences(without_horizon(saved, horizon_keys), without_horizon(expect, horizon_keys)):
                raise  # more than the horizon differs: extending would be refused too
            raise ValueError(f"{e} To train this run further, to num_steps={to_steps}, {EXTEND_ADVICE}: then only "
                             f"the length and the settings computed from it may change.") from None
        if from_steps == to_steps or to_steps < step:  # a free length below the steps taken trains nothing
            return None
        return _entry(from_steps, to_steps, step, [])
    if to_steps < step:
        raise ValueError(f"cannot extend the run of checkpoint {path} to num_steps={to_steps}: it has already "
                         f"taken {step} steps (it was a run of {from_steps}). extend=True trains a run further, "
                         f"never back: pass num_steps >= {step}, or use a new output_dir. Nothing was changed "
                         f"on disk.")
    check_meta(path, without_horizon(saved, horizon_keys), without_horizon(expect, horizon_keys))
    changed = [d for d in meta_differences(saved, expect) if not d.startswith(f"{LENGTH_KEY} (")]
    if from_steps == to_steps and not changed:
        return None
    return _entry(from_steps, to_steps, step, changed)


def _entry(from_steps: int, to_steps: int, step: int, changed: list[str]) -> dict:
    """A config-history entry, stamped with the time now (UTC)."""
    return {"from_steps": from_steps, "to_steps": to_steps, "at_step": int(step),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "changed": changed}
