"""Calibrating DP-SGD: the noise multiplier, number of steps or sampling probability that meets a
target (epsilon, delta), vectorized over arrays of targets.

Each is a bisection in which every iteration evaluates all configurations in one call of
:func:`pldjax.dpsgd_epsilon` (pessimistic: an upper bound on the true epsilon). The answer is the
conservative end of the final bracket, so its computed epsilon is <= the target, and the bracket
is narrower than ``rtol`` (relative) so a value 0.1% worse exceeds the target.

One predicate decides everywhere whether a configuration meets its target (:func:`_meets`): a
computed epsilon that is NaN or +inf never does, so a numerical failure can only make an answer
more conservative (or raise), never accept a configuration. Every loop is bounded by a count that
follows from the validated limits and tolerance (:func:`_iterations`); running past it raises
RuntimeError instead of hanging.
"""

from __future__ import annotations

import math

import numpy as np

from pldjax.dpsgd import dpsgd_epsilon
from pldjax.neighboring import Neighboring
from pldjax.precision import float64
from pldjax.validate import check_count, check_range

#: Relative width of the final bracket.
RTOL = 1e-4
#: Narrowest relative bracket a caller may ask for: well above float64's relative spacing (2.2e-16),
#: so the geometric midpoint of a bracket always lies strictly inside it.
MIN_RTOL = 1e-12
#: Largest max_steps of :func:`calibrate_steps`: step counts stay exact in float64.
MAX_STEPS = 2**53


def _epsilons(sigma, q, steps, delta, neighboring):
    try:
        eps = dpsgd_epsilon(sigma, q, steps, delta, neighboring=neighboring)
    except ValueError as err:
        def span(values):
            values = np.asarray(values)
            return f"{values.min():.6g}" if values.min() == values.max() else (
                f"{values.min():.6g} to {values.max():.6g}")
        raise ValueError(f"calibration could not evaluate epsilon at noise_multiplier "
                         f"{span(sigma)}, sampling_prob {span(q)}, steps {span(steps)} (narrow "
                         f"the search: sigma_min / sigma_max, q_min or max_steps): {err}") from err
    return np.asarray(eps, np.float64)


def _meets(epsilons, target) -> np.ndarray:
    """Where a computed epsilon is finite and <= its target (NaN and +inf never meet one)."""
    return np.isfinite(epsilons) & (epsilons <= target)


def _fail(name: str, bad, targets, epsilons, reason: str) -> None:
    if np.any(bad):
        shown = np.asarray(targets)[bad].ravel()[:3].tolist()
        costs = np.broadcast_to(epsilons, np.shape(bad))[bad].ravel()[:3].tolist()
        raise ValueError(f"no {name} reaches target_epsilon {shown} (epsilon there: {costs}): "
                         f"{reason}")


def _iterations(limit: int, what: str):
    """range(limit), then RuntimeError: the loop it drives cannot hang."""
    yield from range(limit)
    raise RuntimeError(f"{what} did not converge in {limit} iterations (a bug: please report it)")


def _bisection_limit(low: float, high: float, rtol: float) -> int:
    """Geometric bisections that shrink the ratio high / low to 1 + rtol, plus slack."""
    spread = max(math.log(high) - math.log(low), 1e-300)
    return math.ceil(math.log2(spread / math.log1p(rtol))) + 4


def _check_rtol(rtol: float) -> None:
    check_range("rtol", rtol, MIN_RTOL, 1.0, high_open=True)


@float64
def calibrate_noise_multiplier(target_epsilon, delta, sampling_prob, steps, *,
                               neighboring: str = "add_remove", sigma_min: float = 0.05,
                               sigma_max: float = 1e3, rtol: float = RTOL) -> np.ndarray:
    """Smallest noise multiplier (to ``rtol``) with epsilon(sigma) <= ``target_epsilon``.

    All arguments broadcast. The returned sigma lies in [``sigma_min``, ``sigma_max``] and meets
    the target (computed epsilon finite and <= target); sigma / (1 + rtol) does not. Raises when
    even ``sigma_max`` does not reach a target; returns ``sigma_min`` where that already does.
    ``rtol`` must lie in [MIN_RTOL, 1), and 0 < ``sigma_min`` < ``sigma_max`` < inf.
    """
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    Neighboring.parse(neighboring)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    check_range("sigma_min", sigma_min, 0.0, low_open=True)
    check_range("sigma_max", sigma_max, float(sigma_min), low_open=True)
    _check_rtol(rtol)
    target, delta, q, steps = np.broadcast_arrays(*(np.asarray(a, np.float64) for a in (
        target_epsilon, delta, sampling_prob, steps)))

    def epsilons(sigma):
        return _epsilons(sigma, q, steps, delta, neighboring)

    # bracket by doubling from 1 (few distinct grids to compile), then bisect geometrically
    doublings = math.ceil(math.log2(sigma_max) - math.log2(sigma_min)) + 2
    high = np.full(target.shape, min(max(1.0, sigma_min), sigma_max))
    eps = epsilons(high)
    ok = _meets(eps, target)
    for _ in _iterations(doublings, "calibrate_noise_multiplier (bracket upwards)"):
        if np.all(ok):
            break
        _fail("noise multiplier <= sigma_max", ~ok & (high >= sigma_max), target, eps,
              f"raise sigma_max (now {sigma_max}) or lower steps / sampling_prob")
        high = np.where(ok, high, np.minimum(2 * high, sigma_max))
        eps = epsilons(high)
        ok = _meets(eps, target)
    low = np.maximum(high / 2, sigma_min)
    low_ok = _meets(epsilons(low), target) & (low < high)
    for _ in _iterations(doublings, "calibrate_noise_multiplier (bracket downwards)"):
        if not np.any(low_ok & (low > sigma_min)):
            break
        high = np.where(low_ok, low, high)
        low = np.where(low_ok, np.maximum(low / 2, sigma_min), low)
        low_ok = np.where(low_ok, _meets(epsilons(low), target), False)
    high = np.where(low_ok, low, high)  # sigma_min already meets the target
    for _ in _iterations(_bisection_limit(sigma_min, sigma_max, rtol),
                         "calibrate_noise_multiplier (bisection)"):
        if not np.any(high / low > 1 + rtol):
            break
        mid = np.sqrt(low) * np.sqrt(high)
        ok = _meets(epsilons(mid), target)
        high, low = np.where(ok, mid, high), np.where(ok, low, mid)
    return high[()] if high.ndim == 0 else high


@float64
def calibrate_steps(target_epsilon, delta, noise_multiplier, sampling_prob, *,
                    neighboring: str = "add_remove", max_steps: int = 10**7) -> np.ndarray:
    """Largest number of steps T <= ``max_steps`` with epsilon(T) <= ``target_epsilon``.

    All arguments broadcast. The answer T meets the target (computed epsilon finite and <= target)
    and T + 1 does not, unless T = ``max_steps`` (epsilon is non-decreasing in T, so this is the
    largest such T). ``max_steps`` is an integer in [1, MAX_STEPS]. Raises where even one step
    exceeds a target.
    """
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    Neighboring.parse(neighboring)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    max_steps = check_count("max_steps", max_steps, minimum=1)
    if max_steps > MAX_STEPS:
        raise ValueError(f"max_steps must be an integer in [1, {MAX_STEPS}], got {max_steps}")
    target, delta, sigma, q = np.broadcast_arrays(*(np.asarray(a, np.float64) for a in (
        target_epsilon, delta, noise_multiplier, sampling_prob)))

    def meets(steps):
        return _meets(_epsilons(sigma, q, steps, delta, neighboring), target)

    low = np.ones(target.shape, np.int64)  # meets the target
    one_step = _epsilons(sigma, q, low, delta, neighboring)
    _fail("number of steps", ~_meets(one_step, target), target, one_step,
          "one step already exceeds it; raise noise_multiplier or lower sampling_prob")
    limit = max_steps.bit_length() + 2
    high = np.full(target.shape, min(2, max_steps), np.int64)
    for _ in _iterations(limit, "calibrate_steps (doubling)"):
        high_ok = meets(high)  # double until high exceeds the target (or reaches max_steps)
        grow = high_ok & (high < max_steps)
        if not np.any(grow):
            break
        low = np.where(grow, high, low)
        high = np.where(grow, np.minimum(2 * high, max_steps), high)
    low = np.where(high_ok, high, low)  # max_steps within the target
    high = np.where(high_ok, high + 1, high)
    for _ in _iterations(limit, "calibrate_steps (bisection)"):
        if not np.any(high - low > 1):
            break
        mid = (low + high) // 2
        ok = meets(mid)
        low, high = np.where(ok, mid, low), np.where(ok, high, mid)
    return low[()] if low.ndim == 0 else low


@float64
def calibrate_sampling_prob(target_epsilon, delta, noise_multiplier, steps, *,
                            neighboring: str = "add_remove", q_min: float = 1e-8,
                            rtol: float = RTOL) -> np.ndarray:
    """Largest sampling probability (to ``rtol``) with epsilon <= ``target_epsilon`` (1 if q = 1
    meets it). All arguments broadcast. The answer lies in [``q_min``, 1] and meets the target
    (computed epsilon finite and <= target); q (1 + rtol) does not. Raises where even ``q_min``
    exceeds a target. ``q_min`` in (0, 1], ``rtol`` in [MIN_RTOL, 1)."""
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    Neighboring.parse(neighboring)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    target, delta, sigma, steps = np.broadcast_arrays(*(np.asarray(a, np.float64) for a in (
        target_epsilon, delta, noise_multiplier, steps)))
    check_range("q_min", q_min, 0.0, 1.0, low_open=True)
    _check_rtol(rtol)

    def epsilons(q):
        return _epsilons(sigma, q, steps, delta, neighboring)

    # bracket downwards from q = 1 by factors of 10: a tiny q needs a very fine (large) grid, so
    # q_min is only evaluated where nothing larger meets the target
    low = np.ones(target.shape)
    high = low.copy()
    eps = epsilons(low)
    low_ok = _meets(eps, target)
    for _ in _iterations(math.ceil(-math.log10(q_min)) + 2,
                         "calibrate_sampling_prob (bracket downwards)"):
        if np.all(low_ok):
            break
        _fail("sampling probability >= q_min", ~low_ok & (low <= q_min), target, eps,
              "raise noise_multiplier or lower steps")
        high = np.where(low_ok, high, low)
        low = np.where(low_ok, low, np.maximum(low / 10, q_min))
        eps = epsilons(low)
        low_ok = low_ok | _meets(eps, target)
    for _ in _iterations(_bisection_limit(q_min, 1.0, rtol), "calibrate_sampling_prob (bisection)"):
        if not np.any(high / low > 1 + rtol):
            break
        mid = np.sqrt(low) * np.sqrt(high)
        ok = _meets(epsilons(mid), target)
        low, high = np.where(ok, mid, low), np.where(ok, high, mid)
    return low[()] if low.ndim == 0 else low
