"""A meta-trained lopt optimizer as a `torch.optim.Optimizer`.

    opt = lopt.torch.optimizer("celo2_v9", model, num_steps=1000)   # lopt.pretrained.RECOMMENDED
    for batch in data:
        def closure():
            opt.zero_grad()
            loss = loss_fn(model(batch))
            loss.backward()
            return loss
        opt.step(closure)            # or: loss.backward(); opt.step(loss=loss)

Each step computes, per parameter, the update Δp of the JAX transform
`learned_opt.opt_fn(theta, num_steps=N)` (in torch ops, `lopt.torch.rule`) and adds it:

    p ← p − lr · weight_decay_lr · weight_decay · p + lr · Δp

`lr` is a MULTIPLIER of the learned step, not a learning rate: 1 (the default) is the step the
optimizer was meta-trained to take, with its own warm-up and decay over num_steps; torch's LR
schedulers scale it. A group's `lr` below 0.1 (a learning rate's value) warns. `weight_decay` is
decoupled, as AdamW applies it (p ← p − lr_AdamW · wd · p before the update), with AdamW's learning
rate lr_AdamW = lr · weight_decay_lr: set weight_decay_lr to the learning rate an AdamW with that
weight_decay would have had (`lopt.torch.hf` sets it to `args.learning_rate`), and the same fraction
of every weight is removed per step. It adds to any decay the architecture learned or carries.

The loss: architectures that read it take it from `step(closure)`, `step(loss=loss)`, or, for
loops that call `step()` with no arguments (Hugging Face's Trainer), from `set_loss(loss)` called
before the step (`lopt.torch.hf` does that from the model's forward). Torch's conventions hold:
parameters without a gradient are skipped, options may differ per parameter group, the state is
per parameter (with its own step count "step") and round-trips through `state_dict()` /
`load_state_dict()`, so a resumed run continues bit for bit. (One entry is not per parameter: an
architecture with the overshoot brake keeps its log α in `state["overshoot_brake"]`.)
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Iterable, Optional

import torch

from lopt.torch.layout import resolve_axes
from lopt.torch.param_roles import module_roles, role_of
from lopt.torch.rule import RULES, Context, Item, rule_for
from lopt.torch.rules.overshoot_brake import BRAKE_KEY
from lopt.torch.schedules import check_schedulers, warn_if_learning_rate
from lopt.torch.source import Source, check_horizon, resolve, theta_fingerprint
from lopt.torch.user_line import user_stacklevel

__all__ = ["TorchLearnedOptimizer", "optimizer", "OPTIONS", "default_chunk"]

OPTIONS = ("num_steps", "lr", "layout", "chunk_size", "role", "weight_decay", "weight_decay_lr", "momentum_dtype")
_TORCH_KEYS = ("params", "param_names", "initial_lr")  # keys torch itself puts in parameter groups
def default_chunk(device: torch.device) -> int:
    """Elements per block of a rule's per-parameter work: 65536 on CPU (of 16384-262144, the fastest
    NormMLPLOpt step at 1M and 10M parameters on a 2-core CPU: small blocks cost more dispatches,
    big ones spill the caches), 2**20 on accelerators (fewer kernel launches)."""
    return 65536 if torch.device(device).type == "cpu" else 1 << 20


class TorchLearnedOptimizer(torch.optim.Optimizer):
    """A lopt learned optimizer stepping torch parameters (build one with `lopt.torch.optimizer`).

    The state of every parameter is computed in float32 (float64 for float64 parameters), as the
    JAX optimizer computes it; the update is cast to the parameter's dtype before it is added.

    Args:
      source: the resolved source (`lopt.torch.source.resolve`).
      params: parameters or parameter groups (dicts with "params" and any of the options).
      num_steps: the training horizon N (steps you will take); required by shipped optimizers
        that schedule by progress. Per group.
      lr: a multiplier of the update (1: the learned optimizer's own step, with its own schedule
        over num_steps), not a learning rate: a value in (0, 0.1) warns. Per group.
      layout: how a parameter's axes map to the JAX layout (`lopt.torch.layout`): "torch" (the
        default: nn.Linear / nn.ConvNd), "jax", a tuple of axes, a list of those (one per parameter
        of the group), or a callable param -> layout. Per group.
      chunk_size: elements per block of the per-parameter work (None: `default_chunk`). Per group.
      role: the parameters' role for architectures with a fan-in rule (NormMLPLOpt, Celo2LOpt;
        `lopt.param_roles`): None (the default: "matrix" from 2 axes, "vector" below), "matrix",
        "embedding" (e.g. nn.Embedding.weight: no fan-in factor; Celo2LOpt: AdamW, not
        orthogonalized) or "vector" (bias-like), a list (one per parameter of the group) or a
        callable param -> role (e.g. `lopt.torch.param_roles.module_roles(model).role`). Per group.
      weight_decay: decoupled weight decay wd ≥ 0 (module docstring; 0: none). Per group.
      weight_decay_lr: the learning rate of AdamW that weight_decay is stated for (1: wd is the
        fraction of each weight removed per step at lr 1). Per group.
      momentum_dtype: None, or e.g. torch.bfloat16 to store the momenta in (2 bytes each; computed in
        the compute dtype, rounded once per step). On a digits MLP the parameters stay within 0.4%
        (normmlp_v3) and 3% (celo2_v5) of the distance travelled from float32 momenta's after 200
        steps (1.2%, 6.6% after 500), at the same loss. Per group.
      require_loss: refuse to step an architecture that reads the loss without one (False: step it
        with zero loss features, as the JAX transform does when `loss=` is left out).

    Every group also carries "momentum" (None), which no option sets and the update does not read
    (the momenta are meta-trained): it lets OneCycleLR and CyclicLR attach with
    cycle_momentum=True, and a value they set warns once that it has no effect.
    """

    def __init__(self, source: Source, params: Iterable, num_steps: Optional[int] = None, *, lr: float = 1.0,
                 layout: Any = "torch", chunk_size: Optional[int] = None, role: Any = None,
                 weight_decay: float = 0.0, weight_decay_lr: float = 1.0, momentum_dtype: Optional[torch.dtype] = None,
                 require_loss: bool = True):
        self.source = source
        self.rule = rule_for(source.learned_opt, source.theta)
        self.require_loss = bool(require_loss)
        self._fingerprint = theta_fingerprint(source)
        self._pending_loss = None
        self._warned: set = set()
        defaults = dict(num_steps=num_steps, lr=lr, layout=layout, chunk_size=chunk_size, role=role,
                        weight_decay=weight_decay, weight_decay_lr=weight_decay_lr, momentum_dtype=momentum_dtype,
                        momentum=None)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """Adds a parameter group, its options checked (see the class docstring for the options).

        Args:
          param_group: {"params": ..., option: value, ...}; options left out take the defaults.
        """
        unknown = sorted(k for k in param_group if k not in OPTIONS + _TORCH_KEYS)
        if unknown:
            raise TypeError(f"unknown option(s) {unknown} in a parameter group of a lopt.torch optimizer; "
                            f"its options are {list(OPTIONS)}")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        where = f"parameter group {len(self.param_groups) - 1}"
        group["num_steps"] = check_horizon(self.source, group["num_steps"], f"num_steps of {where}")
        if group["num_steps"] is None and self.rule.requires_horizon:
            raise ValueError(f"{self.source.learned_opt.name} ({self.source.label}) schedules its step size by "
                             f"training progress: pass num_steps=<the number of optimizer steps you will take> "
                             f"(for {where})")
        lr = group["lr"]
        if not (isinstance(lr, torch.Tensor) or (isinstance(lr, numbers.Real) and not isinstance(lr, bool))) or lr < 0:
            raise ValueError(f"lr of {where} must be a number >= 0 (a multiplier of the learned update), got {lr!r}")
        warn_if_learning_rate(lr, where)
        for key in ("weight_decay", "weight_decay_lr"):
            value = group[key]
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
                raise ValueError(f"{key} of {where} must be a number >= 0, got {value!r}")
        momentum_dtype = group["momentum_dtype"]
        if momentum_dtype is not None:
            if not isinstance(momentum_dtype, torch.dtype) or not momentum_dtype.is_floating_point:
                raise ValueError(f"momentum_dtype of {where} must be None or a floating-point torch.dtype (e.g. "
                                 f"torch.bfloat16), got {momentum_dtype!r}")
            if not self.rule.flat_momenta:
                raise ValueError(f"momentum_dtype of {where}: {self.source.learned_opt.name} keeps no flat momenta; it "
                                 f"applies to {sorted(name for name, rule in RULES.items() if rule.flat_momenta)}")
        chunk = group["chunk_size"]
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1):
            raise ValueError(f"chunk_size of {where} must be a positive int or None, got {chunk!r}")
        group["layout"] = _per_param_layout(group["layout"], group["params"], where)
        group["role"] = _per_param_role(group["role"], group["params"], where)
        if group["role"] is not None and group["role"] != [None] * len(group["params"]):
            if not self.rule.reads_roles:
                readers = [name for name, rule in RULES.items() if rule.reads_roles]
                raise ValueError(f"role of {where}: {self.source.learned_opt.name} has no fan-in rule; role applies "
                                 f"to {', '.join(sorted(readers))}")
            for i, p in enumerate(group["params"]):
                role_of(p, group["role"][i] if isinstance(group["role"], list) else group["role"])
        for p in group["params"]:
            if not torch.is_floating_point(p):
                raise TypeError(f"lopt.torch optimizers step floating-point parameters, got a {p.dtype} tensor "
                                f"in {where}")

    def _axes(self, group: dict, index: int, p: torch.Tensor) -> tuple:
        layout = group["layout"]
        if isinstance(layout, list):
            layout = layout[index]
        return resolve_axes(layout, p)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None, *, loss: Any = None) -> Any:
        """One update of every parameter that has a gradient.

        Args:
          closure: re-evaluates the model and returns the loss (it runs with gradients enabled,
            before the update); architectures that read the loss take it from here.
          loss: the loss, when you ran forward/backward yourself (instead of a closure).

        Returns:
          The loss (the closure's value, or `loss`).

        Raises:
          ValueError: both a closure and `loss`, or neither for an architecture that reads the loss
            (unless the optimizer was made with require_loss=False).
        """
        if closure is not None:
            if loss is not None:
                raise ValueError("pass the loss either through the closure or as loss=, not both")
            with torch.enable_grad():
                loss = closure()
        pending, self._pending_loss = self._pending_loss, None
        if loss is None:
            loss = pending
        if loss is None and self.rule.reads_loss and self.require_loss:
            raise ValueError(f"{self.source.learned_opt.name} ({self.source.label}) reads the training loss: call "
                             f"optimizer.step(closure) with a closure that computes the loss, calls backward() and "
                             f"returns the loss, optimizer.step(loss=loss) after your own backward(), or "
                             f"optimizer.set_loss(loss) before a step() with no arguments (in a Hugging Face "
                             f"Trainer, build the optimizer with lopt.torch.hf.optimizers, which does this). (To run "
                             f"it without the loss, as the JAX transform does when loss= is left out, build the "
                             f"optimizer with require_loss=False.)")
        check_schedulers(self, self._warned)
        buckets: dict = {}
        for group in self.param_groups:
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("lopt.torch optimizers do not support sparse gradients")
                dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
                state = self.state[p]
                if not state:
                    axes = self._axes(group, index, p)
                    role = group["role"][index] if isinstance(group["role"], list) else group["role"]
                    roles = {"role": role} if self.rule.reads_roles else {}
                    state.update(self.rule.init_state(p, axes, dtype, **roles))
                    if group["momentum_dtype"] is not None:
                        state["momenta"] = state["momenta"].to(group["momentum_dtype"])
                    state["step"] = torch.zeros((), dtype=torch.int64)
                    state["axes"] = axes
                chunk = group["chunk_size"] or default_chunk(p.device)
                item = Item(p, p.grad, state, tuple(state["axes"]), group["num_steps"], chunk)
                buckets.setdefault((p.device, dtype), []).append((item, group))
        brake, alpha = self.rule.brake, None
        stepped = [it for entries in buckets.values() for it, _ in entries]
        if brake is not None:  # global: log α_t from every parameter's g_t and Δp_{t−1}, before any update
            alpha = brake.advance(self.state.setdefault(BRAKE_KEY, brake.init_state()),
                                  [it.grad for it in stepped], [it.state["prev_update"] for it in stepped])
        for (device, dtype), entries in buckets.items():
            items = [it for it, _ in entries]
            steps = torch.tensor([float(it.state["step"]) for it in items], dtype=dtype, device=device)
            ctx = Context(steps, _loss_tensor(loss, device, dtype), self.rule.theta_on(device, dtype), dtype, device,
                          stepped)
            for (it, group), u in zip(entries, self.rule.updates(items, ctx)):
                u = u.to(it.param.dtype)
                if alpha is not None:
                    u = brake.apply(it.state, u, alpha)
                lr = group["lr"]
                decay = group["weight_decay"] * group["weight_decay_lr"]
                if decay:
                    it.param.mul_(1 - lr * decay)
                if isinstance(lr, numbers.Real) and lr == 1:
                    it.param.add_(u)
                else:
                    it.param.add_(u * lr)
                it.state["step"] += 1
        return loss

    def set_loss(self, loss: Any) -> None:
        """The loss the next `step()` reads when it is given neither a closure nor `loss=`.

        For training loops that call `optimizer.step()` with no arguments (Hugging Face's Trainer):
        call it after the forward pass of each step (`lopt.torch.hf.LossFromForward` does, from the
        model's forward). A step consumes it; an explicit closure or `loss=` takes precedence.

        Args:
          loss: a scalar (tensor or number); it is detached.
        """
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError(f"the loss must be a scalar, got a tensor of shape {tuple(loss.shape)}")
            loss = loss.detach()
        self._pending_loss = loss

    def state_dict(self) -> dict:
        """torch's state dict (per-parameter state, parameter groups) plus "lopt": the architecture,
        its config and a fingerprint of theta, which `load_state_dict` checks."""
        sd = super().state_dict()
        lo = self.source.learned_opt
        sd["lopt"] = {"architecture": lo.name, "config": lo.config(), "theta_sha256": self._fingerprint}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a state dict of an optimizer of the same architecture, config and theta.

        Unlike torch's default, every state tensor keeps its saved dtype (float32 state of bfloat16
        parameters stays float32) and is copied, so the loaded optimizer shares no tensor with the
        dict: stepping it continues the saved run exactly.

        Args:
          state_dict: from `state_dict()` (or `torch.load` of one).

        Raises:
          ValueError: a state dict of another architecture, config or theta, or not of a lopt optimizer.
        """
        meta = state_dict.get("lopt")
        lo = self.source.learned_opt
        if not isinstance(meta, dict):
            raise ValueError("this state dict was not written by a lopt.torch optimizer (it has no 'lopt' entry)")
        if (meta.get("architecture"), meta.get("config")) != (lo.name, lo.config()):
            raise ValueError(f"this state dict was written by {meta.get('architecture')}({meta.get('config')}), "
                             f"but this optimizer is {lo!r}: build the optimizer from the same source to resume")
        if meta.get("theta_sha256") != self._fingerprint:
            raise ValueError(f"this state dict was written by a {lo.name} with another theta than "
                             f"{self.source.label}'s: build the optimizer from the same theta to resume")
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "lopt"})
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            if i in state_dict["state"]:
                self.state[p] = {k: _copy_to(v, p.device, k) for k, v in state_dict["state"][i].items()}
        if BRAKE_KEY in state_dict["state"]:  # the overshoot brake's log α (optimizer-level)
            self.state[BRAKE_KEY] = {k: _copy_to(v, "cpu", k) for k, v in state_dict["state"][BRAKE_KEY].items()}


def _copy_to(value: Any, device: torch.device, key: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu" if key == "step" else device, copy=True)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value


def _per_param_layout(layout: Any, params: list, where: str) -> Any:
    """A group's layout checked against its parameters; a callable or a per-parameter list resolved
    to a list of axes (so the group stays picklable)."""
    if isinstance(layout, list) and layout and not isinstance(layout[0], numbers.Integral):
        if len(layout) != len(params):
            raise ValueError(f"layout of {where} lists {len(layout)} layouts for {len(params)} parameters")
        return [resolve_axes(lay, p) for lay, p in zip(layout, params)]
    if callable(layout) and not isinstance(layout, str):
        return [resolve_axes(layout, p) for p in params]
    for p in params:
        resolve_axes(layout, p)
    return tuple(layout) if isinstance(layout, (list, tuple)) else layout


def _per_param_role(role: Any, params: list, where: str) -> Any:
    """A group's role: None, a kind, or (from a list or a callable) a list of kinds or None, one per parameter."""
    if callable(role) and not isinstance(role, str):
        return [role(p) for p in params]
    if isinstance(role, (list, tuple)):
        if len(role) != len(params):
            raise ValueError(f"role of {where} lists {len(role)} roles for {len(params)} parameters")
        return list(role)
    return role


def _loss_tensor(loss: Any, device: torch.device, dtype: torch.dtype) -> Optional[torch.Tensor]:
    if loss is None:
        return None
    t = loss.detach() if isinstance(loss, torch.Tensor) else torch.as_tensor(loss)
    if t.numel() != 1:
        raise ValueError(f"the loss must be a scalar, got a tensor of shape {tuple(t.shape)}")
    return t.to(device=device, dtype=dtype).reshape(())


def optimizer(source: Any, params: Any, num_steps: Optional[int] = None, *, strict_roles: bool = False,
              **options: Any) -> TorchLearnedOptimizer:
    """A lopt learned optimizer as a `torch.optim.Optimizer` over `params`.

    Given the model itself (or its `named_parameters()`), each parameter's role and layout are read
    from the module that holds it (`lopt.torch.param_roles.module_roles`: nn.Embedding an
    embedding table, HF's Conv1D a matrix stored [in, out], norms and biases vectors, tied weights
    once); a `role` or `layout` option given here overrides them.

    Args:
      source: a shipped name (`lopt.pretrained.names()`; try `lopt.pretrained.RECOMMENDED`), a published
        one (`lopt.published.names()`: "celo", "celo_adam", from their authors' weights), the path of
        a theta file (`lopt.save_theta`), or a `(learned_opt, theta)` pair (`(lopt.MLPLOpt(), theta)`).
      params: an nn.Module, its named_parameters(), or an iterable of parameters or of parameter
        groups (dicts), as for any torch optimizer.
      num_steps: the training horizon N: how many steps you will take (required by the shipped
        optimizers, whose step size follows training progress; `lopt.torch.num_steps_from_epochs`
        counts it).
      strict_roles: with a module, raise instead of warning when a parameter's role can only be read
        from its shape.
      **options: `lr`, `layout`, `chunk_size`, `role`, `weight_decay`, `weight_decay_lr`,
        `momentum_dtype`, `require_loss` (see `TorchLearnedOptimizer`).

    Returns:
      A `TorchLearnedOptimizer`.

    Raises:
      ValueError: an unknown name, a damaged theta file, a missing or invalid num_steps, a bad option.
      TypeError: an unknown option.
    """
    unknown = sorted(k for k in options if k not in OPTIONS + ("require_loss",))
    if unknown:
        raise TypeError(f"lopt.torch.optimizer got unknown option(s) {unknown}; options: "
                        f"{list(OPTIONS[1:]) + ['require_loss']} (and num_steps, strict_roles)")
    src = resolve(source)
    params, roles = _params_and_roles(params, strict_roles)
    if roles is not None:
        options.setdefault("layout", roles.layout)
        if RULES[type(src.learned_opt).__name__].reads_roles:
            options.setdefault("role", roles.role)
    return TorchLearnedOptimizer(src, params, num_steps, **options)


def _params_and_roles(params: Any, strict_roles: bool) -> tuple:
    """(the parameters to optimize, their `ModuleRoles` or None) of a module, named parameters or plain params."""
    if isinstance(params, torch.nn.Module):
        roles = module_roles(params, strict_roles=strict_roles, stacklevel=user_stacklevel())
        return [p for p in params.parameters() if p.requires_grad], roles
    if isinstance(params, (torch.Tensor, dict)):
        return params, None
    params = list(params)
    if params and all(isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str) for e in params):
        roles = module_roles(params, strict_roles=strict_roles, stacklevel=user_stacklevel())
        return [p for _, p in params], roles
    return params, None
