"""Two-level sampled task families, as the field meta-trains on.

Level 1 (host, Python): `sample_image_mlp(rng)` etc. draw a *static* config (architecture,
dataset, batch size) from a numpy Generator and build a TaskFamily; different static configs
compile separately. Level 2 (device, jittable): that family's `sample(key)` draws per-task values
(init scale, activation, noise, …) that never trigger recompilation.

`sample_task_family(seed)` draws a sampler, then a family (optionally augmented).
`FamilySchedule(every, seed)` is the outer loop's hook: `schedule(outer_step)` returns the
family to train on, re-sampled every `every` outer steps, deterministic in the seed.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import jax
import numpy as np

from tasks import augment
from tasks.base import TaskFamily
from tasks.conv import ConvFamily
from tasks.functions2d import Function2DFamily
from tasks.image_mlp import ImageMLPFamily
from tasks.language import ByteLMFamily
from tasks.quadratics import QuadraticFamily
from tasks.regression import LinearRegressionFamily

Seed = Union[int, np.random.Generator, jax.Array]
OFFLINE_IMAGE_DATASETS = ("digits", "signals1d")  # need no files


def host_rng(seed: Seed) -> np.random.Generator:
    """A numpy Generator from an int, a Generator (returned as is) or a jax PRNG key."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, jax.Array):
        if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
            seed = jax.random.key_data(seed)
        return np.random.default_rng([int(v) for v in np.asarray(seed).ravel()])
    return np.random.default_rng(int(seed))


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def sample_image_mlp(seed: Seed, *, datasets: Sequence[str] = OFFLINE_IMAGE_DATASETS) -> ImageMLPFamily:
    """Depth 1–3, widths in {16, 32, 64, 128}, batch in {32, 64, 128}, norm in {none, layer, batch},
    3 of 4 activations; dataset from `datasets` (add "mnist", "fashion_mnist", … when present)."""
    rng = host_rng(seed)
    depth = int(rng.integers(1, 4))
    widths = tuple(int(w) for w in rng.choice([16, 32, 64, 128], depth))
    acts = tuple(str(a) for a in rng.choice(["relu", "tanh", "gelu", "swish"], 3, replace=False))
    return ImageMLPFamily(_pick(rng, datasets), widths, batch_size=_pick(rng, (32, 64, 128)),
                          activations=acts, norm=_pick(rng, (None, None, "layer", "batch")))


def sample_conv(seed: Seed, *, datasets: Sequence[str] = OFFLINE_IMAGE_DATASETS) -> ConvFamily:
    """1–3 strided conv layers of {8, 16, 32} channels, kernel 3 or 5, batch in {32, 64}."""
    rng = host_rng(seed)
    depth = int(rng.integers(1, 4))
    channels = tuple(int(c) for c in rng.choice([8, 16, 32], depth))
    return ConvFamily(_pick(rng, datasets), channels, kernel_size=_pick(rng, (3, 5)),
                      batch_size=_pick(rng, (32, 64)))


def sample_quadratic(seed: Seed) -> QuadraticFamily:
    """dim in {2, 10, 50, 100}, max curvature in {1, 10, 100}, gradient noise in {0, 0.1, 1}."""
    rng = host_rng(seed)
    return QuadraticFamily(_pick(rng, (2, 10, 50, 100)), min_curvature=0.1,
                           max_curvature=_pick(rng, (1.0, 10.0, 100.0)), noise_std=_pick(rng, (0.0, 0.1, 1.0)),
                           normalize=True)


def sample_linear_regression(seed: Seed) -> LinearRegressionFamily:
    """dim in {5, 20, 50}, batch in {16, 64}, condition number in {1, 10, 100}."""
    rng = host_rng(seed)
    return LinearRegressionFamily(_pick(rng, (5, 20, 50)), batch_size=_pick(rng, (16, 64)),
                                  condition=_pick(rng, (1.0, 10.0, 100.0)), seed=int(rng.integers(2 ** 31)))


def sample_function2d(seed: Seed) -> Function2DFamily:
    """Rosenbrock, Himmelblau or Beale with jittered starts (debugging only; not in the default mix)."""
    return Function2DFamily(_pick(host_rng(seed), ("rosenbrock", "himmelblau", "beale")))


def sample_byte_lm(seed: Seed, *, dataset: Union[str, Any]) -> ByteLMFamily:
    """Transformer (d_model {16, 32}, 1–2 layers) or LSTM (hidden {32, 64}) on a text dataset
    ("text:PATH" or a DataSource from `byte_sequences`), batch in {8, 16}."""
    rng = host_rng(seed)
    bs = _pick(rng, (8, 16))
    if rng.random() < 0.5:
        return ByteLMFamily(dataset, "transformer", batch_size=bs, d_model=_pick(rng, (16, 32)), num_heads=2,
                            num_layers=int(rng.integers(1, 3)))
    return ByteLMFamily(dataset, "lstm", batch_size=bs, hidden_size=_pick(rng, (32, 64)))


def sample_augmentation(seed: Seed, family: TaskFamily) -> TaskFamily:
    """Wraps `family` in 0–2 random augmentations (see tasks.augment)."""
    rng = host_rng(seed)
    options: list[Callable[[TaskFamily], TaskFamily]] = [
        lambda f: augment.ScaleReparam(f, (0.1, 10.0)),
        lambda f: augment.GradientNoise(f, (0.01, 0.3)),
        augment.NormalizeByInitialLoss,
    ]
    if family.data is not None and family.data.batch_size >= 16:
        options.append(lambda f: augment.ReducedBatchSize(f, f.data.batch_size // 4))
    for i in rng.permutation(len(options))[: int(rng.integers(0, 3))]:
        family = options[int(i)](family)
    return family


DEFAULT_SAMPLERS: tuple[Callable[[Seed], TaskFamily], ...] = (
    sample_image_mlp, sample_conv, sample_quadratic, sample_linear_regression)


def sample_task_family(seed: Seed, samplers: Sequence[Callable[[Seed], TaskFamily]] = DEFAULT_SAMPLERS, *,
                       augment_prob: float = 0.0) -> TaskFamily:
    """One TaskFamily from a uniformly chosen sampler; augmented with probability `augment_prob`."""
    if not samplers:
        raise ValueError("sample_task_family needs at least one sampler")
    rng = host_rng(seed)
    family = samplers[int(rng.integers(len(samplers)))](rng)
    if rng.random() < augment_prob:
        family = sample_augmentation(rng, family)
    return family


class FamilySchedule:
    """Outer-loop hook: `schedule(outer_step)` is the family for that step, re-drawn with
    `sampler(seed_k)` at k = outer_step // every (cached; same seed, same sequence)."""

    def __init__(self, every: int, seed: int = 0, sampler: Callable[[Seed], TaskFamily] = sample_task_family):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every, self.seed, self.sampler = int(every), int(seed), sampler
        self._cache: dict[int, TaskFamily] = {}

    def index(self, outer_step: int) -> int:
        return int(outer_step) // self.every

    def changed(self, outer_step: int) -> bool:
        """True when `outer_step` starts a new family (rebuild estimators then)."""
        return int(outer_step) % self.every == 0

    def __call__(self, outer_step: int) -> TaskFamily:
        k = self.index(outer_step)
        if k not in self._cache:
            self._cache = {k: self.sampler(np.random.default_rng([self.seed, k]))}
        return self._cache[k]
