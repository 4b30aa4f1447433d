"""pldjax: privacy loss distributions as fixed-grid JAX arrays."""

from pldjax import accountant, filters, io, optax, plot  # matplotlib: imported when drawing
from pldjax.adversary import (
    natural_filter_bounds,
    natural_filter_cost,
    natural_filter_free,
    totally_ordered,
)
from pldjax.calibrate import calibrate_noise_multiplier, calibrate_sampling_prob, calibrate_steps
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
    "accountant",
    "calibrate_noise_multiplier",
    "calibrate_sampling_prob",
    "calibrate_steps",
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
    "optax",
    "plot",
    "profile_from_tradeoff",
    "randomized_response",
    "sup",
    "totally_ordered",
    "tradeoff_from_profile",
]


def __getattr__(name: str):
    """``pj.dp_accounting`` is imported on first use (it needs the dp-accounting package)."""
    if name == "dp_accounting":
        import importlib

        return importlib.import_module("pldjax.dp_accounting")
    raise AttributeError(f"module 'pldjax' has no attribute {name!r}")
