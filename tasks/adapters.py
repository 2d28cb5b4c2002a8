"""Turn a user's model + loss + DataSource into a Task: haiku functions, flax linen and nnx modules.

    task = task_from_haiku(forward, loss_fn, data)              # forward(inputs) -> outputs
    task = task_from_flax(linen_module, loss_fn, data)           # module.apply(vars, inputs)
    task = task_from_flax(lambda rngs: MyNNX(rngs=rngs), loss_fn, data)   # nnx constructor

`loss_fn(outputs, batch) -> scalar`; the model reads `batch[input_key]` (the whole batch when
`input_key` is None). Params are plain nested dicts; mutable model state (haiku state, linen
collections other than "params", nnx non-Param variables such as BatchNorm statistics) is the
Task's `model_state`, threaded by `loss_with_state`. The loss key feeds dropout-style rngs.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import haiku as hk
import jax
import jax.numpy as jnp

from tasks.base import Task, classification_normalizer
from tasks.datasets.data_source import DataSource

LossFn = Callable[[Any, Any], jax.Array]


def _default_normalizer(data: DataSource):
    if data.num_classes:
        return classification_normalizer(data.num_classes)
    return lambda loss: loss


def _example_inputs(data: DataSource, input_key: Optional[str]):
    spec = data.element_spec("train")
    if input_key is not None:
        if input_key not in spec:
            raise KeyError(f"input_key {input_key!r} is not in the batch of {data.name!r}; it has {sorted(spec)}")
        spec = spec[input_key]
    return jax.tree_util.tree_map(lambda s: jnp.zeros((1,) + tuple(s.shape[1:]), s.dtype), spec)


class _AdaptedTask(Task):
    def __init__(self, data: DataSource, loss_fn: LossFn, input_key: Optional[str], normalizer, name: str):
        if not isinstance(data, DataSource):
            raise TypeError(f"data must be a tasks.DataSource, got {type(data).__name__}")
        self.data, self.loss_fn, self.input_key, self.name = data, loss_fn, input_key, name
        self.normalizer = normalizer or _default_normalizer(data)

    def _inputs(self, batch):
        return batch if self.input_key is None else batch[self.input_key]

    _stateful = False

    def loss(self, params, key, batch):
        if self._stateful:
            raise NotImplementedError(f"{self.name} has model state: use init_with_state / loss_with_state")
        return self.loss_with_state(params, {}, key, batch)[0]


class HaikuTask(_AdaptedTask):
    """A haiku model + loss as a Task (built by `task_from_haiku`, which documents it); haiku
    state is the model_state, the loss key is the apply rng.

    Args:
      model_fn: a forward function `model_fn(inputs, **apply_kwargs) -> outputs`, or one already
        transformed (hk.Transformed or hk.TransformedWithState).
      loss_fn: `loss_fn(outputs, batch) -> scalar`.
      data: the DataSource the task trains on.
      input_key: the batch entry the model reads (None: the whole batch).
      apply_kwargs: keyword arguments of `model_fn` at init and in the loss.
      normalizer: loss -> normalised loss (default: loss / log(num_classes) with classes, else identity).
      name: the task's name.
    """

    def __init__(self, model_fn, loss_fn, data, *, input_key="image", apply_kwargs=None, normalizer=None,
                 name="haiku_task"):
        super().__init__(data, loss_fn, input_key, normalizer, name)
        if isinstance(model_fn, hk.TransformedWithState):
            self._net = model_fn
        elif isinstance(model_fn, hk.Transformed):
            self._net = hk.with_empty_state(model_fn)
        else:
            self._net = hk.transform_with_state(model_fn)
        self.apply_kwargs = dict(apply_kwargs or {})
        self._example = _example_inputs(data, input_key)
        state_shape = jax.eval_shape(lambda: self._net.init(jax.random.key(0), self._example, **self.apply_kwargs))[1]
        self._stateful = bool(jax.tree_util.tree_leaves(state_shape))

    def init_with_state(self, key):
        return self._net.init(key, self._example, **self.apply_kwargs)

    def loss_with_state(self, params, model_state, key, batch):
        out, model_state = self._net.apply(params, model_state, key, self._inputs(batch), **self.apply_kwargs)
        return self.loss_fn(out, batch), model_state


def task_from_haiku(model_fn: Any, loss_fn: LossFn, data: DataSource, *, input_key: Optional[str] = "image",
                    apply_kwargs: Optional[Mapping[str, Any]] = None, normalizer=None,
                    name: str = "haiku_task") -> Task:
    """A Task from a haiku forward function `model_fn(inputs, **apply_kwargs) -> outputs` (or an
    already transformed one). `apply_kwargs` (e.g. {"is_training": True}) are used for init and
    training. Default normaliser: loss / log(num_classes) if the data has classes, else identity."""
    return HaikuTask(model_fn, loss_fn, data, input_key=input_key, apply_kwargs=apply_kwargs,
                     normalizer=normalizer, name=name)


class LinenTask(_AdaptedTask):
    """A flax linen module + loss as a Task (built by `task_from_flax`, which documents it).

    Args:
      module: a linen Module instance.
      loss_fn: `loss_fn(outputs, batch) -> scalar`.
      data: the DataSource the task trains on.
      input_key: the batch entry the model reads (None: the whole batch).
      init_kwargs: keyword arguments of `module.init`.
      apply_kwargs: keyword arguments of `module.apply` in the loss.
      normalizer: loss -> normalised loss (default: loss / log(num_classes) with classes, else identity).
      name: the task's name.
    """

    def __init__(self, module, loss_fn, data, *, input_key="image", init_kwargs=None, apply_kwargs=None,
                 normalizer=None, name="flax_task"):
        super().__init__(data, loss_fn, input_key, normalizer, name)
        self.module = module
        self.init_kwargs = dict(init_kwargs or {})
        self.apply_kwargs = dict(apply_kwargs or {})
        self._example = _example_inputs(data, input_key)
        shapes = jax.eval_shape(self._init_vars, jax.random.key(0))
        if "params" not in shapes:
            raise ValueError(f"{type(module).__name__} created no 'params' collection; collections: {sorted(shapes)}")
        self._collections = tuple(sorted(k for k in shapes if k != "params"))
        self._stateful = bool(self._collections)

    def _init_vars(self, key):
        k_params, k_dropout = jax.random.split(key)
        return dict(self.module.init({"params": k_params, "dropout": k_dropout}, self._example, **self.init_kwargs))

    def init_with_state(self, key):
        variables = self._init_vars(key)
        return variables.pop("params"), variables

    def loss_with_state(self, params, model_state, key, batch):
        variables = {"params": params, **model_state}
        rngs = {"dropout": key}
        if self._stateful:
            out, model_state = self.module.apply(variables, self._inputs(batch), rngs=rngs,
                                                 mutable=list(self._collections), **self.apply_kwargs)
            model_state = dict(model_state)
        else:
            out = self.module.apply(variables, self._inputs(batch), rngs=rngs, **self.apply_kwargs)
        return self.loss_fn(out, batch), model_state


class NNXTask(_AdaptedTask):
    """A flax nnx module + loss as a Task (built by `task_from_flax`, which documents it): the
    graphdef is static, params and the other state are pure dicts.

    Args:
      make_module: a constructor `rngs -> nnx.Module`, or an nnx.Module instance (its weights are the init).
      loss_fn: `loss_fn(outputs, batch) -> scalar`.
      data: the DataSource the task trains on.
      input_key: the batch entry the model reads (None: the whole batch).
      apply_kwargs: keyword arguments of the module's call in the loss.
      normalizer: loss -> normalised loss (default: loss / log(num_classes) with classes, else identity).
      name: the task's name.
    """

    def __init__(self, make_module, loss_fn, data, *, input_key="image", apply_kwargs=None, normalizer=None,
                 name="flax_task"):
        from flax import nnx

        super().__init__(data, loss_fn, input_key, normalizer, name)
        self._nnx = nnx
        if isinstance(make_module, nnx.Module):
            instance = make_module
            self._make = None
        else:
            instance = nnx.eval_shape(lambda: make_module(nnx.Rngs(0)))
            self._make = make_module
        self.graphdef, params, rest = nnx.split(instance, nnx.Param, ...)
        self._templates = (params, rest)
        self._fixed = None if self._make is not None else (nnx.to_pure_dict(params), nnx.to_pure_dict(rest))
        self._stateful = bool(jax.tree_util.tree_leaves(rest))
        self.apply_kwargs = dict(apply_kwargs or {})

    def init_with_state(self, key):
        """Builds the module with nnx.Rngs(key); an instance given directly is its own init (key unused)."""
        if self._make is None:
            return self._fixed
        _, params, rest = self._nnx.split(self._make(self._nnx.Rngs(key)), self._nnx.Param, ...)
        return self._nnx.to_pure_dict(params), self._nnx.to_pure_dict(rest)

    def _state(self, template, pure):
        state = jax.tree_util.tree_map(lambda x: x, template)
        self._nnx.replace_by_pure_dict(state, pure)
        return state

    def loss_with_state(self, params, model_state, key, batch):
        del key  # nnx modules carry their own Rngs streams in their state
        p_tmpl, r_tmpl = self._templates
        model = self._nnx.merge(self.graphdef, self._state(p_tmpl, params), self._state(r_tmpl, model_state))
        model.train()
        out = model(self._inputs(batch), **self.apply_kwargs)
        _, _, rest = self._nnx.split(model, self._nnx.Param, ...)
        return self.loss_fn(out, batch), self._nnx.to_pure_dict(rest)


def task_from_flax(module: Any, loss_fn: LossFn, data: DataSource, *, input_key: Optional[str] = "image",
                   init_kwargs: Optional[Mapping[str, Any]] = None, apply_kwargs: Optional[Mapping[str, Any]] = None,
                   normalizer=None, name: str = "flax_task") -> Task:
    """A Task from a flax model.

    - linen: `module` is an `nn.Module` instance; params = variables["params"], model_state = the
      other collections (made mutable during the loss). `init_kwargs` / `apply_kwargs` go to
      `init` / `apply` (e.g. {"train": True}); the loss key is the "dropout" rng.
    - nnx: `module` is a constructor `rngs -> nnx.Module` (init(key) builds it with nnx.Rngs(key)),
      or an nnx.Module instance (its current weights are the init). The model runs in `.train()`
      mode; non-Param variables (BatchNorm statistics, rng counters) are the model_state.
    """
    import flax.linen as nn

    if isinstance(module, nn.Module):
        return LinenTask(module, loss_fn, data, input_key=input_key, init_kwargs=init_kwargs,
                         apply_kwargs=apply_kwargs, normalizer=normalizer, name=name)
    if init_kwargs:
        raise ValueError("init_kwargs apply to linen modules only; an nnx constructor takes its own arguments")
    if callable(module):
        return NNXTask(module, loss_fn, data, input_key=input_key, apply_kwargs=apply_kwargs,
                       normalizer=normalizer, name=name)
    raise TypeError(f"task_from_flax expects a linen Module, an nnx Module, or a constructor rngs -> nnx.Module; "
                    f"got {type(module).__name__}")
