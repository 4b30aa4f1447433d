"""pldjax: privacy loss distributions as fixed-grid JAX arrays.

The core (PLDs, mechanisms, composition, evaluation, DP-SGD accounting) is imported with the
package; any PLD is built from its parts by ``pj.privacy_loss(noise, sampling, neighboring)``
(records of ``pj.noise`` and ``pj.sampling``, a ``pj.neighboring.Neighboring`` or its string;
``pj.Event`` holds the three). The filters, odometers, the natural-filter analysis, the
accountant, state I/O, plotting and the optax / dp_accounting / Opacus integrations are imported
on first use (they pull in scipy.stats, optax, dp_accounting or torch, which a script that only
asks for an epsilon does not need).

Docstrings cite these papers by first author and year:

* Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the Dots: Tighter Discrete
  Approximations of Privacy Loss Distributions", PETS 2022 (pessimistic and optimistic
  discretization);
* Chourasia, Javaid, Sikdar, "Laplace Transform Interpretation of Differential Privacy", 2024
  (Rényi divergences from the PLD, subsampling);
* Whitehouse, Ramdas, Rogers, Wu, "Fully Adaptive Composition in Differential Privacy", ICML 2023
  (approximate-zCDP and (epsilon, delta) filters, odometers);
* Regehr, Hu, Leeman, Manurangsi, Tholoniat, Lécuyer, "Privacy Filters are Captured by Residues: A
  Characterization of Free Natural Filters and the Cost of Adaptivity", arXiv:2602.15815, 2026
  (residue filters, the GDP residue, natural filters, V_k).

The layers, and where each kind of change goes, are described in ARCHITECTURE.md.
"""

import importlib as _importlib

from pldjax.accounting.calibration import (
    calibrate_event,
    calibrate_noise_multiplier,
    calibrate_sampling_prob,
    calibrate_steps,
)
from pldjax.accounting.dpsgd import dpsgd_delta, dpsgd_epsilon, dpsgd_event
from pldjax.accounting.engine import event_delta, event_epsilon
from pldjax.accounting.schedule import compose_schedule
from pldjax.core.compilation import enable_compilation_cache
from pldjax.core.compilation import enable_default_cache as _enable_default_cache
from pldjax.core.grid import Grid
from pldjax.core.pld import PLD
from pldjax.kernels.compose import compose
from pldjax.kernels.divergences import profile_from_tradeoff, tradeoff_from_profile
from pldjax.kernels.dominance import sup
from pldjax.kernels.gaussian_dp import gdp_mu, gdp_residue
from pldjax.mechanisms.events import Event, privacy_loss
from pldjax.mechanisms.named import (
    approx_dp_composition,
    discrete_gaussian,
    discrete_laplace,
    from_privacy_curve,
    gaussian,
    gdp,
    identity,
    laplace,
    randomized_response,
    zcdp,
)
from pldjax.mechanisms.shuffling import shuffling_lower_bound

__all__ = [
    "Event",
    "PLD",
    "accountant",
    "calibrate_event",
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
    "dpsgd_event",
    "enable_compilation_cache",
    "event_delta",
    "event_epsilon",
    "filters",
    "from_privacy_curve",
    "gaussian",
    "gdp",
    "gdp_mu",
    "gdp_residue",
    "identity",
    "io",
    "laplace",
    "monte_carlo_delta",
    "monte_carlo_epsilon",
    "natural_filter_bounds",
    "natural_filter_cost",
    "natural_filter_free",
    "neighboring",
    "noise",
    "odometers",
    "opacus",
    "optax",
    "plot",
    "privacy_loss",
    "privacy_report",
    "profile_from_tradeoff",
    "randomized_response",
    "sampling",
    "shuffling_lower_bound",
    "sup",
    "totally_ordered",
    "tradeoff_from_profile",
    "zcdp",
]


#: Names imported on first use: attribute -> (module, name in it, or None for the module itself).
#: The integrations live in modules that do not shadow the packages they wrap (``pj.optax`` is
#: :mod:`pldjax.integrations.optax_transforms`, ``pj.dp_accounting`` is
#: :mod:`pldjax.integrations.dp_accounting_adapter`).
_LAZY = {
    "accountant": ("pldjax.accounting.accountant", None),
    "dp_accounting": ("pldjax.integrations.dp_accounting_adapter", None),
    "filters": ("pldjax.adaptive.filters", None),
    "io": ("pldjax.core.serialization", None),
    "monte_carlo_delta": ("pldjax.accounting.monte_carlo", "monte_carlo_delta"),
    "monte_carlo_epsilon": ("pldjax.accounting.monte_carlo", "monte_carlo_epsilon"),
    "neighboring": ("pldjax.mechanisms.neighboring", None),
    "noise": ("pldjax.mechanisms.noise", None),
    "odometers": ("pldjax.adaptive.odometers", None),
    "opacus": ("pldjax.integrations.opacus_accountant", None),
    "optax": ("pldjax.integrations.optax_transforms", None),
    "plot": ("pldjax.plot", None),
    "privacy_report": ("pldjax.accounting.report", "privacy_report"),
    "sampling": ("pldjax.mechanisms.sampling", None),
    "natural_filter_bounds": ("pldjax.adaptive.natural_cost", "natural_filter_bounds"),
    "natural_filter_cost": ("pldjax.adaptive.natural_cost", "natural_filter_cost"),
    "natural_filter_free": ("pldjax.adaptive.natural_cost", "natural_filter_free"),
    "totally_ordered": ("pldjax.adaptive.natural_cost", "totally_ordered"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pldjax' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = _importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# the persistent compilation cache is on by default (opt out: PLDJAX_COMPILATION_CACHE=0; a cache
# directory configured for JAX wins); see pldjax.core.compilation
_enable_default_cache()
