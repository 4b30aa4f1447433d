"""pldjax: privacy loss distributions as fixed-grid JAX arrays."""

from pldjax import filters, io, plot  # matplotlib is imported only when a figure is drawn
from pldjax.adversary import (
    natural_filter_bounds,
    natural_filter_cost,
    natural_filter_free,
    totally_ordered,
)
from pldjax.compilation import enable_compilation_cache
from pldjax.compose import compose
from pldjax.dpsgd import compose_schedule, dpsgd_delta, dpsgd_epsilon
from pldjax.gaussian_dp import gdp_mu, gdp_residue
from pldjax.grid import Grid
from pldjax.mechanisms import (
    approx_dp_composition,
    discrete_gaussian,
    discrete_laplace,
    from_privacy_curve,
    gaussian,
    gdp,
    identity,
    laplace,
    randomized_response,
)
from pldjax.order import profile_from_tradeoff, sup, tradeoff_from_profile
from pldjax.pld import PLD

__all__ = [
    "PLD",
    "Grid",
    "approx_dp_composition",
    "compose",
    "compose_schedule",
    "discrete_gaussian",
    "discrete_laplace",
    "dpsgd_delta",
    "dpsgd_epsilon",
    "enable_compilation_cache",
    "filters",
    "from_privacy_curve",
    "gaussian",
    "gdp",
    "gdp_mu",
    "gdp_residue",
    "identity",
    "io",
    "laplace",
    "natural_filter_bounds",
    "natural_filter_cost",
    "natural_filter_free",
    "plot",
    "profile_from_tradeoff",
    "randomized_response",
    "sup",
    "totally_ordered",
    "tradeoff_from_profile",
]
