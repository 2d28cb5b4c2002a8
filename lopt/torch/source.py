"""Where a torch optimizer's architecture and theta come from: a shipped name, a theta file, or a pair.

    resolve("normmlp_v3")                    # lopt.pretrained, as `load` builds it (deploy options applied)
    resolve("celo_adam")                     # lopt.published: another authors' released weights
    resolve("run/theta_final.msgpack")       # a lopt.save_theta file
    resolve((learned_opt, theta))            # e.g. MLPLOpt(), MLPLOpt().init(key)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import os
import warnings
from typing import Any, Optional, Sequence

import numpy as np

import lopt
import lopt.published
from lopt.base import LearnedOptimizer
from lopt.torch.user_line import user_stacklevel

__all__ = ["Source", "resolve", "check_horizon", "theta_fingerprint"]


@dataclasses.dataclass
class Source:
    """A resolved source.

    Attributes:
      learned_opt: the architecture (a `lopt.LearnedOptimizer`).
      theta: its meta-parameters (numpy arrays).
      label: how the user named it (the pretrained name, the file path, or "LearnedOptimizer pair").
      pretrained: the shipped name, or None.
      horizons: the shipped optimizer's meta-training horizons [min, max] (or None).
    """
    learned_opt: LearnedOptimizer
    theta: Any
    label: str
    pretrained: Optional[str] = None
    horizons: Optional[Sequence[int]] = None

    @property
    def needs_horizon(self) -> bool:
        """A shipped optimizer meta-trained with progress features needs num_steps (as `lopt.pretrained.load`)."""
        return self.pretrained is not None and bool(getattr(self.learned_opt, "use_num_steps", False))


def resolve(source: Any) -> Source:
    """The architecture and theta `source` names.

    Args:
      source: a shipped name (`lopt.pretrained.names()`), a published one (`lopt.published.names()`,
        e.g. "celo"), the path of a theta file (`lopt.save_theta`), or a `(learned_opt, theta)` pair.

    Returns:
      A `Source`.

    Raises:
      ValueError: an unknown name (the message lists the shipped ones), a damaged file, or a theta
        that does not match its architecture.
      TypeError: a source of another kind.
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text in lopt.pretrained.names():
            learned_opt, theta = lopt.pretrained.deployed_learned_optimizer(text)  # as lopt.pretrained.load
            info = lopt.pretrained.info(text)
            return Source(learned_opt, _numpy(theta), text, text, info.get("meta_training_horizons"))
        if text in lopt.published.names():  # another authors' optimizer, from their released weights
            learned_opt, theta = lopt.published.learned_optimizer(text)
            return Source(learned_opt, _numpy(theta), text)
        if os.path.exists(text):
            learned_opt, theta = lopt.load_learned_optimizer(text)
            return _unwrapped(Source(learned_opt, _numpy(theta), text))
        known = ", ".join(repr(n) for n in lopt.pretrained.names() + lopt.published.names()) or "none"
        raise ValueError(f"unknown pretrained optimizer {text!r} (and no theta file at that path); shipped: {known}. "
                         f"Pass a shipped name, the path of a lopt.save_theta file, or a (learned_opt, theta) pair")
    if isinstance(source, (tuple, list)) and len(source) == 2 and isinstance(source[0], LearnedOptimizer):
        learned_opt, theta = source
        learned_opt.check_theta(theta, "lopt.torch.optimizer")
        return _unwrapped(Source(learned_opt, _numpy(theta), f"{learned_opt.name} pair"))
    raise TypeError(f"lopt.torch.optimizer: source must be a shipped name ({lopt.pretrained.names()}), a theta file "
                    f"path or a (learned_opt, theta) pair, got {type(source).__name__}")


def _unwrapped(src: Source) -> Source:
    """A `lopt.rules.learned.RuledLOpt` source as its inner architecture with the chain as fields
    (`lopt.torch.rules.learned.deployed`); any other source unchanged."""
    from lopt.rules.learned import RuledLOpt
    if not isinstance(src.learned_opt, RuledLOpt):
        return src
    from lopt.torch.rules.learned import deployed
    learned_opt, theta = deployed(src.learned_opt, src.theta)
    return dataclasses.replace(src, learned_opt=learned_opt, theta=theta)


def check_horizon(src: Source, num_steps: Any, where: str = "num_steps") -> Optional[int]:
    """num_steps checked: a positive int or None, required by shipped optimizers that schedule by
    progress, with a warning past their longest meta-training horizon (as `lopt.pretrained.load`).

    Args:
      src: the resolved source.
      num_steps: the value given.
      where: what it was given as, for messages (e.g. "num_steps of parameter group 1").

    Returns:
      num_steps as an int, or None.
    """
    if num_steps is None:
        if src.needs_horizon:
            raise ValueError(f"pretrained optimizer {src.pretrained!r} schedules its step size by training progress: "
                             f"pass {where}=<the number of optimizer steps you will take>, e.g. "
                             f"lopt.torch.optimizer({src.pretrained!r}, model.parameters(), num_steps=1000)")
        return None
    if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Integral) or num_steps < 1:
        raise ValueError(f"{where} must be a positive int (the training horizon), got {num_steps!r}")
    if src.horizons and num_steps > src.horizons[1]:
        warnings.warn(f"pretrained optimizer {src.pretrained!r} was meta-trained on horizons of {src.horizons[0]}-"
                      f"{src.horizons[1]} steps; at {where}={num_steps} it is outside them (docs/pretrained.md)",
                      stacklevel=user_stacklevel())
    return int(num_steps)


def theta_fingerprint(src: Source) -> str:
    """SHA-256 of the architecture, its config and theta's values (identifies the optimizer a
    state_dict was written by)."""
    h = hashlib.sha256(src.learned_opt.name.encode())
    h.update(json.dumps(src.learned_opt.config(), sort_keys=True).encode())
    _feed(h, src.theta)
    return h.hexdigest()


def _feed(h, tree: Any) -> None:
    if isinstance(tree, dict):
        for k in sorted(tree):
            h.update(str(k).encode())
            _feed(h, tree[k])
    else:
        h.update(np.ascontiguousarray(tree, np.float32).tobytes())


def _numpy(theta: Any) -> Any:
    if hasattr(theta, "items"):
        return {k: _numpy(v) for k, v in theta.items()}
    return np.asarray(theta)
