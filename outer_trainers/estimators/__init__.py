"""Gradient estimators: one per module, all behind the `GradientEstimator` interface.

Each turns unrolls of a `TruncatedStep` into meta-gradient estimates:
`init_state(theta, key) -> state`, `estimate(theta, state, key) -> (state, Estimate)`.
Constructors share one order: `truncated_step, num_tasks`, then the length (`trunc_length` for
the truncated estimators, `unroll_length` for the whole-episode FullES and FullGrad), then `std`
for the ES estimators; every other option is keyword-only.

Shared pieces: `antithetic` (± pairs of the ES estimators), `full_episode` (the whole-episode
meta-loss of FullES and FullGrad), `gradient_estimator` (the base classes and their compile
options), `estimator_schedule` (which estimator at which outer step), `multi_family` (one
estimator per task family); the constructors' argument checks are `outer_trainers.validation`.
"""
from outer_trainers.estimators.full_es import FullES
from outer_trainers.estimators.full_grad import FullGrad
from outer_trainers.estimators.gradient_estimator import (AntitheticTruncatedEstimator, Estimate, GradientEstimator,
                                                          TruncatedEstimator, default_compiler_options)
from outer_trainers.estimators.noise_reuse_es import NoiseReuseES
from outer_trainers.estimators.truncated_es import TruncatedES
from outer_trainers.estimators.truncated_grad import TruncatedGrad
from outer_trainers.estimators.truncated_pes import TruncatedPES
from outer_trainers.estimators.sharded_truncated_pes import ShardedTruncatedPES, TruncatedPESPMAP
from outer_trainers.estimators.estimator_schedule import EstimatorSchedule
from outer_trainers.estimators.multi_family import estimator_on_family

__all__ = ["Estimate", "GradientEstimator", "TruncatedEstimator", "AntitheticTruncatedEstimator",
           "default_compiler_options", "FullES", "FullGrad", "NoiseReuseES", "TruncatedES", "TruncatedGrad",
           "TruncatedPES", "ShardedTruncatedPES", "TruncatedPESPMAP", "EstimatorSchedule",
           "estimator_on_family"]
