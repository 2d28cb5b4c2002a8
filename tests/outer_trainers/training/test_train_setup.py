"""train_setup: a run's arguments are checked and resolved at the train_loop call, before any file is
touched; the grouped options normalise and refuse bad values."""
import os

import jax
import optax
import pytest

import tasks
from outer_trainers.runs.checkpoint_policy import CheckpointPolicy
from outer_trainers.training.train_eval import EvalPlan
from outer_trainers.training.train_loop import run_to_end, train_loop
from outer_trainers.training.train_setup import LoopOptions, RunFiles, prepare_training

QUAD = tasks.QuadraticFamily(dim=4).task_fn(tasks.QuadraticFamily(dim=4).sample(jax.random.key(0)))


def test_loop_options_normalise_progress_and_refuse_bad_values():
    assert LoopOptions(progress=True).progress == "bar" and LoopOptions(progress=False).progress == "none"
    assert LoopOptions(progress="log", callbacks=[print]).callbacks == (print,)
    with pytest.raises(ValueError, match="log_every must be >= 1"):
        LoopOptions(log_every=0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        LoopOptions(chunk_size=0)
    with pytest.raises(ValueError, match="progress must be True, False or one of"):
        LoopOptions(progress="verbose")
    with pytest.raises(TypeError, match="callbacks must be callables"):
        LoopOptions(callbacks=[3])
    assert RunFiles().policy == CheckpointPolicy()


def test_prepare_training_resolves_evaluations_and_checkpoint_metadata():
    setup = prepare_training(QUAD, optax.adam(0.1), 10, key=jax.random.key(0), evaluation=EvalPlan(every=4),
                             ema_decay=0.5, files=RunFiles(config={"lr": 0.1}))
    assert setup.eval_steps == (4, 8, 10) and setup.num_devices == 1 and setup.data is None
    assert setup.eval_names == ("eval/test/loss", "eval_ema/test/loss")
    assert setup.checkpoint_meta() == {"kind": "train_model", "task": QUAD.name, "num_steps": 10, "ema": True,
                                       "eval_metrics": ["eval/test/loss", "eval_ema/test/loss"],
                                       "eval_steps": [4, 8, 10], "config": {"lr": 0.1}}
    none = prepare_training(QUAD, optax.adam(0.1), 10, key=jax.random.key(0), evaluation=EvalPlan(evals=[], every=4))
    assert none.evaluator is None and none.eval_steps == () and none.eval_names == ()
    with pytest.raises(ValueError, match="num_steps must be >= 0"):
        prepare_training(QUAD, optax.adam(0.1), -1, key=jax.random.key(0))
    with pytest.raises(ValueError, match="ema_warmup_steps must be >= 0"):
        prepare_training(QUAD, optax.adam(0.1), 4, key=jax.random.key(0), ema_warmup_steps=-1)


def test_train_loop_checks_at_the_call_and_touches_no_file_before_the_first_step(tmp_path):
    out = str(tmp_path / "run")
    with pytest.raises(ValueError, match="log_every must be >= 1"):
        train_loop(QUAD, optax.adam(0.1), 4, output_dir=out, options=LoopOptions(log_every=0))
    loop = train_loop(QUAD, optax.adam(0.1), 4, output_dir=out, options=LoopOptions(tensorboard=False))
    assert not os.path.exists(out)  # nothing read or written yet
    loop.close()
    assert not os.path.exists(out)
    result = run_to_end(train_loop(QUAD, optax.adam(0.1), 4, output_dir=out, options=LoopOptions(tensorboard=False)))
    assert result.losses.shape == (4,) and os.path.exists(os.path.join(out, "metrics.jsonl"))
