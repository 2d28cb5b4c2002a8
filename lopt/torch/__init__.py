"""Use a meta-trained lopt optimizer from PyTorch: `lopt.torch.optimizer(source, params, num_steps=N)`.

    import lopt.torch
    opt = lopt.torch.optimizer("celo2_v9", model, num_steps=1000)   # roles read from model's modules
    opt.step(closure)                       # the closure returns the loss (the shipped ones read it)

    optimizer, scheduler = lopt.torch.hf.optimizers(model, args, source="celo2_v9")   # a HF Trainer

`lr` is a multiplier of the learned step (1: as meta-trained, with its own schedule over
num_steps), not a learning rate (`lopt.torch.schedules`). `lopt.torch.hf` (import it; it needs
transformers) gives a Hugging Face Trainer its optimizer, a constant scheduler and the loss.

`source` is a shipped name (`lopt.pretrained.names()`), a published one (`lopt.published.names()`:
"celo", "celo_adam", other authors' released weights), a theta file (`lopt.save_theta`), or a
`(learned_opt, theta)` pair; every architecture of `lopt.architectures()` has a torch rule.

The update is each architecture's own, re-implemented in torch ops reading theta and the
architecture's public configuration, so it runs torch-native on any device, CPU or CUDA, with no
JAX call per step. The modules mirror the JAX ones by name: `lopt.torch.archs.<module>` (one rule
per architecture of `lopt.archs.<module>`; no architecture module imports another),
`lopt.torch.parts.<module>` (the torch versions of the `lopt.parts` they share),
`lopt.torch.rules.<module>` (of `lopt.rules`) and `lopt.torch.param_roles` (roles read from
modules: `module_roles`). tests/lopt/torch checks
that each matches the JAX transform `learned_opt.opt_fn(theta, num_steps=N)`, fed the same
gradients and losses.

Layouts: torch's nn.Linear weight is [out, in] and nn.ConvNd's [out, in, *k], where flax's kernels
are [in, out] and [*k, in, out]. The rules that depend on axes (factored row/column statistics,
fan-in) read each parameter in the JAX layout; the default assumes the torch convention, and a
parameter group's `layout` option overrides it (`lopt.torch.layout`).

This subpackage needs PyTorch (`pip install "lopt[torch]"`); `import lopt` does not import it.
"""
try:
    import torch as _torch  # noqa: F401  (the subpackage's only third-party requirement beyond lopt's)
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError('lopt.torch needs PyTorch: pip install "lopt[torch]" (or pip install torch)') from e

from lopt.torch import archs  # noqa: F401  (registers every architecture's rule)
from lopt.torch.layout import default_axes, from_jax, resolve_axes, to_jax
from lopt.torch.optimizer import TorchLearnedOptimizer, default_chunk, optimizer
from lopt.torch.rule import RULES, Rule, rule_for, supported_architectures
from lopt.torch.param_roles import ModuleRoles, module_roles
from lopt.torch.schedules import ScheduleWarning, constant_schedule, num_steps_from_epochs
from lopt.torch.source import resolve

__all__ = ["optimizer", "TorchLearnedOptimizer", "supported_architectures", "rule_for", "Rule", "RULES",
           "resolve", "default_axes", "resolve_axes", "to_jax", "from_jax", "default_chunk", "module_roles",
           "ModuleRoles", "constant_schedule", "num_steps_from_epochs", "ScheduleWarning"]
