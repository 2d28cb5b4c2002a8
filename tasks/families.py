"""Two-level sampled task families, as the field meta-trains on.

Level 1 (host, Python): `sample_image_mlp(rng)` etc. draw a *static* config (architecture,
dataset, batch size) from a numpy Generator and build a TaskFamily; different static configs
compile separately. Level 2 (device, jittable): that family's `sample(key)` draws per-task values
(init scale, activation, noise, …) that never trigger recompilation.

`sample_task_family(seed)` draws a sampler, then a family (optionally augmented).
`sample_family_for_period(seed, period)` is the same draw made deterministic per period of an
`outer_trainers.EstimatorSchedule`: its `make(period)` calls it to train on a new family every
`every` outer steps, and a resumed run draws the same family again.
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
    """The numpy Generator a host-side sampler draws from.

    Args:
        seed: an int, a numpy Generator (returned as is, so samplers can share one) or a jax PRNG key
            (typed or raw uint32 key data).

    Returns:
        A numpy Generator, deterministic in `seed`.
    """
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
    """An MLP image-classification family: depth 1–3, widths in {16, 32, 64, 128}, batch in
    {32, 64, 128}, norm in {none, layer, batch}, 3 of 4 activations.

    Args:
        seed: the draw's seed (see `host_rng`).
        datasets: the datasets to choose from (add "mnist", "fashion_mnist", … when present).

    Returns:
        An ImageMLPFamily.
    """
    rng = host_rng(seed)
    depth = int(rng.integers(1, 4))
    widths = tuple(int(w) for w in rng.choice([16, 32, 64, 128], depth))
    acts = tuple(str(a) for a in rng.choice(["relu", "tanh", "gelu", "swish"], 3, replace=False))
    return ImageMLPFamily(_pick(rng, datasets), widths, batch_size=_pick(rng, (32, 64, 128)),
                          activations=acts, norm=_pick(rng, (None, None, "layer", "batch")))


def sample_conv(seed: Seed, *, datasets: Sequence[str] = OFFLINE_IMAGE_DATASETS) -> ConvFamily:
    """A conv-net image-classification family: 1–3 strided conv layers of {8, 16, 32} channels,
    kernel 3 or 5, batch in {32, 64}.

    Args:
        seed: the draw's seed (see `host_rng`).
        datasets: the datasets to choose from.

    Returns:
        A ConvFamily.
    """
    rng = host_rng(seed)
    depth = int(rng.integers(1, 4))
    channels = tuple(int(c) for c in rng.choice([8, 16, 32], depth))
    return ConvFamily(_pick(rng, datasets), channels, kernel_size=_pick(rng, (3, 5)),
                      batch_size=_pick(rng, (32, 64)))


def sample_quadratic(seed: Seed) -> QuadraticFamily:
    """A normalised quadratic family: dim in {2, 10, 50, 100}, max curvature in {1, 10, 100},
    gradient noise in {0, 0.1, 1}.

    Args:
        seed: the draw's seed (see `host_rng`).

    Returns:
        A QuadraticFamily.
    """
    rng = host_rng(seed)
    return QuadraticFamily(_pick(rng, (2, 10, 50, 100)), min_curvature=0.1,
                           max_curvature=_pick(rng, (1.0, 10.0, 100.0)), noise_std=_pick(rng, (0.0, 0.1, 1.0)),
                           normalize=True)


def sample_linear_regression(seed: Seed) -> LinearRegressionFamily:
    """A linear-regression family: dim in {5, 20, 50}, batch in {16, 64}, condition number in {1, 10, 100}.

    Args:
        seed: the draw's seed (see `host_rng`).

    Returns:
        A LinearRegressionFamily (its data seed drawn too).
    """
    rng = host_rng(seed)
    return LinearRegressionFamily(_pick(rng, (5, 20, 50)), batch_size=_pick(rng, (16, 64)),
                                  condition=_pick(rng, (1.0, 10.0, 100.0)), seed=int(rng.integers(2 ** 31)))


def sample_function2d(seed: Seed) -> Function2DFamily:
    """Rosenbrock, Himmelblau or Beale with jittered starts (debugging only; not in the default mix).

    Args:
        seed: the draw's seed (see `host_rng`).

    Returns:
        A Function2DFamily.
    """
    return Function2DFamily(_pick(host_rng(seed), ("rosenbrock", "himmelblau", "beale")))


def sample_byte_lm(seed: Seed, *, dataset: Union[str, Any]) -> ByteLMFamily:
    """A byte-level language-model family: a transformer (d_model {16, 32}, 1–2 layers) or an LSTM
    (hidden {32, 64}), batch in {8, 16}.

    Args:
        seed: the draw's seed (see `host_rng`).
        dataset: the text dataset: "text:PATH" or a DataSource from `byte_sequences`.

    Returns:
        A ByteLMFamily.
    """
    rng = host_rng(seed)
    bs = _pick(rng, (8, 16))
    if rng.random() < 0.5:
        return ByteLMFamily(dataset, "transformer", batch_size=bs, d_model=_pick(rng, (16, 32)), num_heads=2,
                            num_layers=int(rng.integers(1, 3)))
    return ByteLMFamily(dataset, "lstm", batch_size=bs, hidden_size=_pick(rng, (32, 64)))


def sample_augmentation(seed: Seed, family: TaskFamily) -> TaskFamily:
    """`family` wrapped in 0–2 random augmentations (see tasks.augment): parameter rescaling, gradient
    noise, normalisation by the initial loss, and (for batch sizes >= 16) a quarter batch size.

    Args:
        seed: the draw's seed (see `host_rng`).
        family: the TaskFamily to augment.

    Returns:
        The augmented TaskFamily (`family` itself when 0 augmentations are drawn).
    """
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
    """One TaskFamily from a uniformly chosen sampler, augmented with probability `augment_prob`.

    Args:
        seed: the draw's seed (see `host_rng`); the sampler and augmentation draw from the same Generator.
        samplers: `sampler(rng) -> TaskFamily` functions to choose from (default: image MLP, conv,
            quadratic, linear regression).
        augment_prob: probability of wrapping the family with `sample_augmentation`.

    Returns:
        A TaskFamily.
    """
    if not samplers:
        raise ValueError("sample_task_family needs at least one sampler")
    rng = host_rng(seed)
    family = samplers[int(rng.integers(len(samplers)))](rng)
    if rng.random() < augment_prob:
        family = sample_augmentation(rng, family)
    return family


def sample_family_for_period(seed: int, period: int,
                             sampler: Callable[[Seed], TaskFamily] = sample_task_family) -> TaskFamily:
    """The task family of period `period` of a run seeded `seed`: `sampler` given the numpy Generator
    seeded with the pair [seed, period].

    Deterministic in (seed, period), so an `EstimatorSchedule`'s `make(period)` can call it and a
    resumed run rebuilds the family it was training on; different periods draw independently.

    Args:
        seed: the run's family seed (an int).
        period: the schedule period (an int >= 0), e.g. `EstimatorSchedule.period(outer_step)`.
        sampler: `sampler(rng) -> TaskFamily`, e.g. `sample_task_family` (default) or `sample_quadratic`.

    Returns:
        The TaskFamily `sampler` draws.
    """
    return sampler(np.random.default_rng([int(seed), int(period)]))

