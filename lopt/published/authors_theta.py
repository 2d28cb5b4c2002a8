"""The authors' released theta files, read into lopt's theta layout.

The Celo authors save theta as a flax msgpack of haiku parameters. What each entry is, and where
lopt keeps it (`lopt.parts.learned_scheduler`, `lopt.archs.celo`):

    lstm_init_state/{hidden, cell} [1, H]          -> scheduler/initial_state/{h, c} [H]
    rnn_params/linear_1/{w, b}  [18, H]            -> scheduler/mix (the max-pooled ReLU branch)
    rnn_params/linear_2/{w, b}  [18, H]            -> scheduler/embed
    rnn_params/rnn/linear/{w [2H, 4H], b [4H]}     -> scheduler/lstm/{wx, wh, b}: w split into
                                                      its input and hidden rows, and the gate
                                                      blocks reordered from haiku's (i, g, f, o)
                                                      to `lopt.parts.nn.lstm_step`'s (i, f, g, o)
    rnn_params/step_size/{w, b}                     -> scheduler/step_size
    ff_mod_stack/~/w0__0..w0__13 [1, n_i, 4]        -> mlp/input/w [30, 4] (the 14 feature groups' rows, in order)
    ff_mod_stack/~/b0, w1, b1, w2, b2               -> mlp/input/b, mlp/hidden_1, mlp/output

Not read, because the update never uses them: rnn_params/linear (a dense layer whose output the
authors' forward pass computes and discards) and Celo's rnn_params/rnn_to_controls (it mixes a
stack of one per-parameter MLP, whose softmax weight is always 1). The leading axis of size 1 of
the ff_mod_stack entries is that stack.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import serialization

FF_GROUPS = 14  # Celo's per-parameter MLP reads its 30 features as 14 groups, each with its own w0__i


def read(data: bytes) -> dict:
    """The raw nested dict of an authors' theta file (`flax.serialization.msgpack_restore`)."""
    return serialization.msgpack_restore(data)


def _dense(layer: dict) -> dict:
    return {"w": jnp.asarray(layer["w"], jnp.float32), "b": jnp.asarray(layer["b"], jnp.float32)}


def _lstm(layer: dict) -> dict:
    w, b = np.asarray(layer["w"], np.float32), np.asarray(layer["b"], np.float32)
    hidden = w.shape[1] // 4
    num_inputs = w.shape[0] - hidden  # the rows of [z, h]: z comes first
    order = lambda x: np.concatenate([x[..., i * hidden:(i + 1) * hidden] for i in (0, 2, 1, 3)], axis=-1)
    w, b = order(w), order(b)
    return {"wx": jnp.asarray(w[:num_inputs]), "wh": jnp.asarray(w[num_inputs:]), "b": jnp.asarray(b)}


def scheduler_theta(raw: dict) -> dict:
    """The learned scheduler's theta from an authors' file (`lopt.parts.learned_scheduler`).

    Args:
      raw: the file's nested dict (`read`).

    Returns:
      {"mix", "embed", "lstm", "initial_state", "step_size"}.

    Raises:
      KeyError: the file lacks an entry (not a Celo or Celo-Adam theta).
    """
    rnn, init = raw["rnn_params"], raw["lstm_init_state"]
    return {"mix": _dense(rnn["linear_1"]), "embed": _dense(rnn["linear_2"]),
            "lstm": _lstm(rnn["rnn/linear"]),
            "initial_state": {"h": jnp.asarray(init["hidden"], jnp.float32)[0],
                              "c": jnp.asarray(init["cell"], jnp.float32)[0]},
            "step_size": _dense(rnn["step_size"])}


def celo_theta(raw: dict) -> dict:
    """`lopt.archs.celo.Celo`'s theta from the authors' Celo file.

    Args:
      raw: the file's nested dict (`read`).

    Returns:
      {"scheduler": ..., "mlp": {"input", "hidden_1", "output"}}.
    """
    ff = raw["ff_mod_stack"]["~"]
    first = lambda name: np.asarray(ff[name], np.float32)[0]  # the stack of one MLP
    w0 = np.concatenate([first(f"w0__{i}") for i in range(FF_GROUPS)], axis=0)
    mlp = {"input": {"w": jnp.asarray(w0), "b": jnp.asarray(first("b0"))},
           "hidden_1": {"w": jnp.asarray(first("w1")), "b": jnp.asarray(first("b1"))},
           "output": {"w": jnp.asarray(first("w2")), "b": jnp.asarray(first("b2"))}}
    return {"scheduler": scheduler_theta(raw), "mlp": mlp}


def celo_adam_theta(raw: dict) -> dict:
    """`lopt.archs.celo_adam.CeloAdam`'s theta from the authors' Celo-Adam file.

    Args:
      raw: the file's nested dict (`read`).

    Returns:
      {"scheduler": ...}.
    """
    return {"scheduler": scheduler_theta(raw)}


CONVERTERS = {"Celo": celo_theta, "CeloAdam": celo_adam_theta}
