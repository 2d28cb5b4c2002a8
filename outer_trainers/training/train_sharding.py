"""Parameter sharding for one model's training run: each large leaf of the TrainState split over a mesh axis.

    mesh = jax.make_mesh((4,), ("fsdp",))                        # or jax.sharding.Mesh(devices, ("fsdp",))
    result = train_model(task, lopt.pretrained.load("celo2_v5", num_steps=1000, layout="sharded"), 1000,
                         sharding=ParamSharding(mesh, "fsdp"))

Fully sharded data parallelism (FSDP, ZeRO stage 3): every device holds 1/N of each large
parameter, of its optimizer state and of its EMA, and 1/N of each batch, where N is the size of
the mesh axis. The train step is one jitted SPMD program; XLA gathers a weight where the model
needs it whole and reduces the gradient back to the shards, so a step computes the same function
as on one device (up to the order of float sums).

Which axis of a leaf is split (`shard_spec`): the largest dimension that N divides (the first of
equal ones); leaves of fewer than `min_size` elements, and leaves with no such dimension, are
replicated. The rule depends on a leaf's shape only, so the EMA is split as the params are, and
an optimizer-state leaf shaped like a parameter, or shaped [K, *p.shape] (a learned optimizer's
stacked momenta), is split as that parameter is (`P(None, *spec)` for the stacked one): the
optimizer's memory per device falls to ~1/N for the large leaves.

The step runs under automatic sharding (the model's code needs no sharding annotations): a mesh
whose axes are `AxisType.Explicit` (`jax.make_mesh`'s default) is used with the same devices
and axis names as automatic. Load a shipped learned optimizer with `layout="sharded"` so that
its update is computed in each parameter's own shape and stays split (`lopt.parts.layout`);
another layout computes the same update but gathers each tensor first. Checkpoints hold whole
arrays (gathered to the host when written) and are split again when a run resumes, so a run
may resume on another mesh or on one device; the mesh therefore holds this process's devices only.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

__all__ = ["ParamSharding", "shard_spec", "addressable_bytes"]


def shard_spec(shape: tuple[int, ...], axis: str, num_shards: int, min_size: int = 0) -> P:
    """The PartitionSpec of one leaf: its largest dimension that `num_shards` divides, split over `axis`.

    Args:
        shape: the leaf's shape.
        axis: the mesh axis name.
        num_shards: N, the size of that axis.
        min_size: leaves of fewer elements are replicated.

    Returns:
        `P(None, ..., axis, ..., None)` with `axis` at dimension argmax{shape[d] : N divides shape[d]}
        (the first of equal ones), or `P()` (replicated) when the leaf has fewer than `min_size`
        elements, N is 1, or N divides no dimension (of size >= N).
    """
    size = int(np.prod(shape, dtype=np.int64))
    dims = [d for d, n in enumerate(shape) if n >= num_shards and n % num_shards == 0]
    if num_shards <= 1 or size < min_size or not dims:
        return P()
    best = max(dims, key=lambda d: (shape[d], -d))
    return P(*[axis if d == best else None for d in range(len(shape))])


@dataclasses.dataclass(frozen=True)
class ParamSharding:
    """A training run's state split over one axis of a mesh, and its batches over the same axis (FSDP).

    See the module docstring for the rule. Frozen and hashed by value.

    Attributes:
        mesh: the device mesh (`jax.sharding.Mesh` or `jax.make_mesh`); its other axes, if any, replicate.
        axis: the axis the state and the batch are split over (None: the mesh's only axis).
        min_size: leaves of fewer elements are replicated (>= 0): splitting a bias saves little and costs
            a collective.
    """
    mesh: Mesh
    axis: Optional[str] = None
    min_size: int = 1024

    def __post_init__(self):
        if not isinstance(self.mesh, Mesh):
            raise TypeError(f"ParamSharding needs a jax.sharding.Mesh (e.g. jax.make_mesh((4,), ('fsdp',))), "
                            f"got {type(self.mesh).__name__}")
        names = tuple(self.mesh.axis_names)
        if self.axis is None:
            if len(names) != 1:
                raise ValueError(f"the mesh has axes {names}: name the one to shard over (ParamSharding(mesh, axis=...))")
            object.__setattr__(self, "axis", names[0])
        elif self.axis not in names:
            raise ValueError(f"axis {self.axis!r} is not an axis of the mesh, whose axes are {names}")
        if any(d.process_index != jax.process_index() for d in self.mesh.devices.flat):
            raise ValueError("ParamSharding's mesh must hold only this process's devices (jax.local_devices()): "
                             "checkpoints gather every leaf to this host")
        if self.min_size < 0:
            raise ValueError(f"min_size must be >= 0, got {self.min_size}")
        if any(t != AxisType.Auto for t in self.mesh.axis_types):  # same devices and names, automatic axes
            auto = Mesh(self.mesh.devices, names, axis_types=(AxisType.Auto,) * len(names))
            object.__setattr__(self, "mesh", auto)

    @property
    def num_shards(self) -> int:
        """N, the size of the sharded axis.

        Returns:
            `mesh.shape[axis]`.
        """
        return int(self.mesh.shape[self.axis])

    def spec(self, shape: tuple[int, ...]) -> P:
        """The PartitionSpec of a leaf of this shape (`shard_spec` with this mesh axis and `min_size`).

        Args:
            shape: the leaf's shape.

        Returns:
            A PartitionSpec.
        """
        return shard_spec(tuple(shape), self.axis, self.num_shards, self.min_size)

    @property
    def replicated(self) -> NamedSharding:
        """The sharding of replicated values (data, scalars) over the whole mesh.

        Returns:
            `NamedSharding(mesh, P())`.
        """
        return NamedSharding(self.mesh, P())

    @property
    def batch(self) -> NamedSharding:
        """The sharding of a batch: its leading (example) axis split over the axis.

        Returns:
            `NamedSharding(mesh, P(axis))`.
        """
        return NamedSharding(self.mesh, P(self.axis))

    def check_batch_size(self, batch_size: int) -> None:
        """Refuses a batch the axis cannot split evenly.

        Args:
            batch_size: examples per batch.

        Raises:
            ValueError: `batch_size` is not a multiple of `num_shards`.
        """
        if batch_size % self.num_shards:
            raise ValueError(f"batch size {batch_size} cannot be split over mesh axis {self.axis!r} of "
                             f"{self.num_shards} devices: use a multiple of {self.num_shards}")

    def state_shardings(self, state: Any, params: Any) -> Any:
        """The NamedSharding of every leaf of a state holding `params`-shaped and [K, *p.shape] leaves.

        A leaf shaped like a parameter gets `spec(shape)`; a leaf shaped [K, *p.shape] (and not itself a
        parameter's shape) gets `P(None, *spec(p.shape))`; any other leaf `spec(shape)`.

        Args:
            state: a pytree of arrays or ShapeDtypeStructs (e.g. `jax.eval_shape` of the initial TrainState).
            params: the parameters' pytree (arrays or ShapeDtypeStructs), for the shapes they have.

        Returns:
            A pytree of NamedShardings with `state`'s structure.
        """
        param_shapes = {tuple(x.shape) for x in jax.tree_util.tree_leaves(params)}

        def one(x):
            shape = tuple(x.shape)
            if shape not in param_shapes and len(shape) >= 1 and shape[1:] in param_shapes:
                return NamedSharding(self.mesh, P(None, *self.spec(shape[1:])))
            return NamedSharding(self.mesh, self.spec(shape))

        return jax.tree_util.tree_map(one, state)


def addressable_bytes(tree: Any) -> int:
    """The bytes of a pytree's arrays held on one device (the first addressable shard of each leaf).

    Args:
        tree: a pytree of jax arrays.

    Returns:
        Σ over leaves of the first addressable shard's nbytes (a replicated leaf counts whole).
    """
    def one(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return x.addressable_shards[0].data.nbytes

    return int(sum(one(x) for x in jax.tree_util.tree_leaves(tree)))
