"""A meta-trained lopt optimizer in a Hugging Face `Trainer`, in one line.

    import lopt.torch.hf
    optimizer, scheduler = lopt.torch.hf.optimizers(model, args)   # source: lopt.pretrained.RECOMMENDED
    trainer = Trainer(model=model, args=args, train_dataset=train, optimizers=(optimizer, scheduler))
    trainer.train()                       # checkpoints and resume_from_checkpoint work as for AdamW

What `optimizers` sets up, each from what the Trainer will do:

- num_steps, the horizon the learned schedule runs over: `args.max_steps`, or from
  `args.num_train_epochs` and the length of `train_dataset` (`num_training_steps`, as the Trainer
  counts its steps on one process; pass `num_steps=` for anything else).
- every parameter's role and layout from the module that holds it
  (`lopt.torch.param_roles.module_roles`: GPT-2's Conv1D weights are [in, out] matrices, its
  token and position tables embeddings, its LayerNorms and biases vectors, the tied head once).
- a constant scheduler (`lopt.torch.constant_schedule`): the learned optimizer has its own
  schedule, and the Trainer's default linear decay would multiply it. `args.learning_rate`,
  `lr_scheduler_type` and `warmup_steps` do not set the step (a warning says so when they are not
  the defaults); `lr=` multiplies the learned step (1: as meta-trained).
- the training loss, which the learned optimizer reads: `Trainer` calls `optimizer.step()` with no
  arguments, so a forward hook on the model (`LossFromForward`) hands each training forward's
  `outputs.loss` to `optimizer.set_loss` (summed over gradient-accumulation micro-batches when the
  Trainer passes `num_items_in_batch`, which makes each a share of the step's mean, else averaged).
  A Trainer whose `compute_loss` computes the loss outside the model's forward must call
  `self.optimizer.set_loss(loss)` itself; `step()` says so if no loss arrived.
- weight decay as AdamW applies it, decoupled: with `args.weight_decay` > 0, every parameter but
  biases and norm weights (the Trainer's own grouping) loses a fraction
  args.learning_rate · args.weight_decay of its value per step, on top of the learned update.

`optimizer.pt` and `scheduler.pt` are the optimizer's and scheduler's state dicts, so a run resumed
with `trainer.train(resume_from_checkpoint=...)` continues bit for bit. For `Trainer(...,
optimizer_cls_and_kwargs=...)`, `optimizer_cls_and_kwargs(model, args, source=...)` gives the
pair (the Trainer then builds its own scheduler from args: set `lr_scheduler_type="constant"`).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import torch

from lopt.pretrained import RECOMMENDED
from lopt.torch.optimizer import TorchLearnedOptimizer
from lopt.torch.param_roles import ModuleRoles, module_roles
from lopt.torch.rule import RULES
from lopt.torch.schedules import constant_schedule, num_steps_from_epochs
from lopt.torch.source import resolve
from lopt.torch.user_line import user_stacklevel

__all__ = ["optimizers", "optimizer_cls_and_kwargs", "TrainerOptimizer", "num_training_steps", "LossFromForward"]


def num_training_steps(args: Any, train_dataset: Any = None) -> int:
    """The number of optimizer steps a `Trainer` with `args` takes on one process.

    Args:
      args: the `transformers.TrainingArguments`.
      train_dataset: the training set (needed when `args.max_steps` is not set: its length and
        `args.train_batch_size` give the batches per epoch).

    Returns:
      args.max_steps if > 0, else `lopt.torch.num_steps_from_epochs(args.num_train_epochs,
      batches per epoch, args.gradient_accumulation_steps)`.

    Raises:
      ValueError: no max_steps and no dataset with a length.
    """
    if args.max_steps is not None and args.max_steps > 0:
        return int(args.max_steps)
    if train_dataset is None or not hasattr(train_dataset, "__len__"):
        raise ValueError("the learned optimizer needs its horizon num_steps: set TrainingArguments(max_steps=...), "
                         "or pass train_dataset= (with a length) to count it from num_train_epochs, or pass "
                         "num_steps= yourself")
    batch = args.train_batch_size * max(int(getattr(args, "world_size", 1)), 1)
    n = len(train_dataset)
    batches = n // batch if args.dataloader_drop_last else math.ceil(n / batch)
    return num_steps_from_epochs(args.num_train_epochs, max(batches, 1), args.gradient_accumulation_steps)


class LossFromForward:
    """Hands the loss of each training forward of `model` to `optimizer.set_loss`.

    A forward hook reads `outputs.loss` (or `outputs["loss"]`) of forwards run in training mode
    with gradients enabled (evaluation runs neither); a step hook of the optimizer starts a new
    accumulation after each step. Within one optimizer step, micro-batch losses are summed when
    the forward was given `num_items_in_batch` (each is then its share of the step's mean loss),
    else averaged.

    Args:
      model: the nn.Module whose forward returns the loss.
      optimizer: a lopt torch optimizer.

    Attributes:
      handles: the hooks' removable handles (`remove()` detaches both).
    """

    def __init__(self, model: torch.nn.Module, optimizer: TorchLearnedOptimizer):
        self.optimizer = optimizer
        self._total, self._count, self._shares = None, 0, False
        self.handles = [model.register_forward_hook(self._forward, with_kwargs=True),
                        optimizer.register_step_post_hook(self._stepped)]

    def _forward(self, module, args, kwargs, output) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        loss = loss.detach().reshape(())
        self._shares = kwargs.get("num_items_in_batch") is not None
        self._total = loss if self._total is None else self._total + loss
        self._count += 1
        self.optimizer.set_loss(self._total if self._shares else self._total / self._count)

    def _stepped(self, optimizer, args, kwargs) -> None:
        self._total, self._count = None, 0

    def remove(self) -> None:
        """Detaches the hooks."""
        for h in self.handles:
            h.remove()


def _warn_ignored(args: Any, stacklevel: int) -> None:
    ignored = []
    kind = str(getattr(getattr(args, "lr_scheduler_type", "linear"), "value", args.lr_scheduler_type))
    if kind not in ("linear", "constant"):
        ignored.append(f"lr_scheduler_type={kind!r}")
    for key in ("warmup_steps", "warmup_ratio"):
        if getattr(args, key, 0):
            ignored.append(f"{key}={getattr(args, key)!r}")
    if ignored:
        warnings.warn(f"lopt.torch.hf.optimizers ignores {', '.join(ignored)}: the learned optimizer follows its "
                      f"own meta-trained schedule over num_steps and the scheduler it returns is constant",
                      UserWarning, stacklevel=stacklevel)


class TrainerOptimizer(TorchLearnedOptimizer):
    """A lopt torch optimizer built the way a Trainer builds its optimizer: `cls(groups, **kwargs)`
    (the class of `optimizer_cls_and_kwargs`; a `TorchLearnedOptimizer` in every other respect).

    Args:
      params: parameters or groups (the Trainer's carry "weight_decay").
      source: a shipped name, a theta file or a (learned_opt, theta) pair.
      num_steps: the horizon.
      roles: each parameter's role and layout (`module_roles`), or None (from shapes).
      loss_from: the model whose forward's loss the optimizer reads (`LossFromForward`), or None.
      **options: `TorchLearnedOptimizer` options (lr, weight_decay_lr, chunk_size, ...).

    Attributes:
      loss_hook: the `LossFromForward` (None without loss_from).
    """

    def __init__(self, params: Any, *, source: Any, num_steps: Optional[int], roles: Optional[ModuleRoles] = None,
                 loss_from: Optional[torch.nn.Module] = None, **options: Any):
        src = resolve(source)
        if roles is not None:
            options.setdefault("layout", roles.layout)
            if RULES[type(src.learned_opt).__name__].reads_roles:
                options.setdefault("role", roles.role)
        super().__init__(src, params, num_steps, **options)
        self.loss_hook = LossFromForward(loss_from, self) if loss_from is not None else None


def _setup(model: torch.nn.Module, args: Any, source: Any, train_dataset: Any, num_steps: Optional[int],
           strict_roles: bool, stacklevel: int) -> tuple:
    if num_steps is None:
        num_steps = num_training_steps(args, train_dataset)
    roles = module_roles(model, strict_roles=strict_roles, stacklevel=stacklevel + 1)
    return num_steps, roles


def optimizers(model: torch.nn.Module, args: Any, source: Any = RECOMMENDED, *, train_dataset: Any = None,
               num_steps: Optional[int] = None, lr: float = 1.0, strict_roles: bool = False,
               **options: Any) -> tuple:
    """The `(optimizer, scheduler)` pair for `Trainer(..., optimizers=...)` (module docstring).

    Args:
      model: the model the Trainer trains.
      args: its `transformers.TrainingArguments`.
      source: a shipped name (`lopt.pretrained.names()`; default `lopt.pretrained.RECOMMENDED`), a theta
        file or a (learned_opt, theta) pair.
      train_dataset: the training set, to count num_steps from epochs when args.max_steps is unset.
      num_steps: the horizon, when you count it yourself.
      lr: the multiplier of the learned step (1: as meta-trained).
      strict_roles: raise, instead of warning, when a parameter's role can only be read from its shape.
      **options: further `TorchLearnedOptimizer` options (e.g. chunk_size).

    Returns:
      (a `TrainerOptimizer`, i.e. a `lopt.torch.TorchLearnedOptimizer` fed the loss by the
      model's forward, and a constant `LambdaLR`).

    Raises:
      ValueError: no way to count num_steps, an unknown source, a bad option, or (strict_roles) a
        parameter whose role comes from its shape alone.
    """
    level = user_stacklevel()
    num_steps, roles = _setup(model, args, source, train_dataset, num_steps, strict_roles, level)
    _warn_ignored(args, level)
    params = [p for p in model.parameters() if p.requires_grad]
    if args.weight_decay:
        decay = [p for p in params if roles.role(p) != "vector"]
        rest = [p for p in params if roles.role(p) == "vector"]
        params = [{"params": decay, "weight_decay": float(args.weight_decay)}, {"params": rest, "weight_decay": 0.0}]
        options.setdefault("weight_decay_lr", float(args.learning_rate))
    opt = TrainerOptimizer(params, source=source, num_steps=num_steps, roles=roles, loss_from=model, lr=lr,
                           **options)
    return opt, constant_schedule(opt)


def optimizer_cls_and_kwargs(model: torch.nn.Module, args: Any, source: Any = RECOMMENDED, *,
                             train_dataset: Any = None, num_steps: Optional[int] = None, lr: float = 1.0,
                             strict_roles: bool = False, **options: Any) -> tuple:
    """The pair for `Trainer(..., optimizer_cls_and_kwargs=...)`: `(TrainerOptimizer, kwargs)`.

    The Trainer builds the optimizer over its own parameter groups (weight decay for all but
    biases and norm weights, at args.weight_decay) and its scheduler from args: set
    `lr_scheduler_type="constant"` there (any other stacks on the learned schedule, and warns).

    Args:
      model, args, source, train_dataset, num_steps, lr, strict_roles, **options: as `optimizers`.

    Returns:
      (`TrainerOptimizer`, its keyword arguments).
    """
    level = user_stacklevel()
    num_steps, roles = _setup(model, args, source, train_dataset, num_steps, strict_roles, level)
    kind = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if kind != "constant":
        warnings.warn(f"with optimizer_cls_and_kwargs the Trainer builds its scheduler from args "
                      f"(lr_scheduler_type={kind!r}), which would multiply the learned optimizer's own schedule: "
                      f"set TrainingArguments(lr_scheduler_type='constant')", UserWarning, stacklevel=level)
    kwargs = dict(source=source, num_steps=num_steps, roles=roles, loss_from=model, lr=lr,
                  weight_decay_lr=float(args.learning_rate), **options)
    return TrainerOptimizer, kwargs
