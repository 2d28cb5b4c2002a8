"""Learned optimizers whose weight-matrix updates are orthogonalized (as Muon's), and the shared
Newton–Schulz helpers (`newton_schulz`: optax's orthogonalization, μP width scale)."""
from lopt.orthogonal.celo2_lopt import Celo2LOpt, Celo2LOptState

__all__ = ["Celo2LOpt", "Celo2LOptState"]
