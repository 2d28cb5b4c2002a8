"""Warnings that point at the user's line: the stacklevel of the first frame outside lopt.torch and
the libraries that call a torch optimizer for the user (torch, transformers, accelerate).

    warnings.warn(message, stacklevel=user_stacklevel())
"""
from __future__ import annotations

import os
import sys

__all__ = ["user_stacklevel"]

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARIES = ("torch", "transformers", "accelerate")


def _library_dirs() -> tuple:
    dirs = [_HERE]
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return tuple(dirs)


def user_stacklevel() -> int:
    """The `stacklevel` that makes a `warnings.warn` in the calling function name the first frame
    outside lopt.torch, torch, transformers and accelerate (the user's line).

    Returns:
      An int ≥ 1 for `warnings.warn(..., stacklevel=...)` called by the caller of this function.
    """
    skip = _library_dirs()
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skip):
        frame, level = frame.f_back, level + 1
    return level
