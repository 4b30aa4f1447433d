"""pldjax: privacy loss distributions as fixed-grid JAX arrays."""

from pldjax.compose import compose
from pldjax.grid import Grid
from pldjax.mechanisms import gaussian, gdp, identity, laplace, randomized_response
from pldjax.pld import PLD

__all__ = [
    "PLD",
    "Grid",
    "compose",
    "gaussian",
    "gdp",
    "identity",
    "laplace",
    "randomized_response",
]
