"""Every private pldjax name the suite uses, in this one place (the rest uses ``import pldjax as pj``).

When pldjax's modules move, update the paths in ``PATHS``; the names each module must still
have are listed beside it. ``internals.NAME`` imports the module on first use. The benchmarks use
these only for informative columns and degrade to an empty cell where a name is gone (except the
GDP-residue filter's throughput, which needs the check window and the state encoding); the tools
in bench/tools/ need them.
"""

from __future__ import annotations

import importlib

#: key -> module path. The names used from each:
#:
#: * calibrate: ``_epsilons`` (the batched epsilon of calibrate_noise_multiplier's bisection,
#:   wrapped to count evaluations: bench/calibration.py)
#: * gaussian_dp: ``residue_plan``, ``_coarse_points``, ``_fft_length``, ``residue_batch_size``
#:   (the check window pj.gdp_residue picks: bench/gdp_residue.py)
#: * precision: ``pack`` (the filter state's bit pairs: bench/gdp_residue.py)
#: * adversary: ``_family``, ``_window`` (the natural filter's recursion window: bench/natural_filter.py)
#: * engine: ``_placement``, ``_placement_rows``, ``_compose_and_evaluate``, ``direction_arrays``,
#:   ``wrap_rows``, ``_gather_rows``, ``_gather_tiled_rows``, ``_keeps_chunks_on_device``
#:   (bench/tools/profile_dpsgd.py, bench/tools/profile_sweep.py,
#:   bench/tools/accelerator_programs.py)
#: * planner: ``mechanism_tail``, ``composition_tail``, ``accuracy_steps``
#:   (bench/tools/profile_dpsgd.py)
#: * mechanisms: ``direction_arrays``, ``Directions`` (bench/tools/profile_dpsgd.py)
#: * compose: ``PMFSummary``, ``window_widths``, ``wrap_rows``, ``chernoff_exponents``,
#:   ``_spectrum``, ``_powered``, ``settle``, ``fft_roundoff`` (bench/tools/profile_dpsgd.py)
#: * profile: ``epsilon_kernel`` (bench/tools/profile_dpsgd.py)
#: * discretize: ``MECHANISM_KERNELS`` (bench/tools/profile_sweep.py)
PATHS = {
    "calibrate": "pldjax.accounting.calibration",
    "gaussian_dp": "pldjax.kernels.gaussian_dp",
    "precision": "pldjax.core.precision",
    "adversary": "pldjax.adaptive.natural_cost",
    "engine": "pldjax.accounting.engine",
    "planner": "pldjax.accounting.planner",
    "mechanisms": "pldjax.mechanisms.events",
    "compose": "pldjax.kernels.compose",
    "profile": "pldjax.kernels.hockey_stick",
    "discretize": "pldjax.kernels.discretize",
}


def __getattr__(key: str):
    if key not in PATHS:
        raise AttributeError(f"bench.internals has no module {key!r}")
    return importlib.import_module(PATHS[key])


def available(key: str, *names: str) -> bool:
    """Whether module ``key`` imports and has every one of ``names``."""
    try:
        module = importlib.import_module(PATHS[key])
    except ImportError:
        return False
    return all(hasattr(module, name) for name in names)
