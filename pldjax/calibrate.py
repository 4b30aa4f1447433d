"""Calibrating DP-SGD: the noise multiplier, number of steps or sampling probability that meets a
target (epsilon, delta), vectorized over arrays of targets.

Each is a bisection in which every iteration evaluates all configurations in one call of
:func:`pldjax.dpsgd_epsilon` (pessimistic: an upper bound on the true epsilon). The answer is the
conservative end of the final bracket, so its computed epsilon is <= the target, and the bracket
is narrower than ``rtol`` (relative) so a value 0.1% worse exceeds the target.
"""

from __future__ import annotations

import numpy as np

from pldjax.dpsgd import dpsgd_epsilon
from pldjax.precision import float64
from pldjax.validate import check_range

#: Relative width of the final bracket.
RTOL = 1e-4


def _epsilons(sigma, q, steps, delta, neighboring):
    return np.asarray(dpsgd_epsilon(sigma, q, steps, delta, neighboring=neighboring), np.float64)


def _fail(name: str, bad, targets, reason: str) -> None:
    if np.any(bad):
        shown = np.asarray(targets)[bad].ravel()[:3]
        raise ValueError(f"no {name} reaches target_epsilon {shown.tolist()}: {reason}")


@float64
def calibrate_noise_multiplier(target_epsilon, delta, sampling_prob, steps, *,
                               neighboring: str = "add_remove", sigma_min: float = 0.05,
                               sigma_max: float = 1e3, rtol: float = RTOL) -> np.ndarray:
    """Smallest noise multiplier (to ``rtol``) with epsilon(sigma) <= ``target_epsilon``.

    All arguments broadcast. The returned sigma meets the target (computed epsilon <= target);
    sigma * (1 - rtol) does not. Raises when even ``sigma_max`` does not reach a target;
    returns ``sigma_min`` where that already does.
    """
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    target, delta, q, steps = np.broadcast_arrays(*(np.asarray(a, np.float64) for a in (
        target_epsilon, delta, sampling_prob, steps)))

    def meets(sigma):
        return _epsilons(sigma, q, steps, delta, neighboring) <= target

    # bracket by doubling from 1 (few distinct grids to compile), then bisect geometrically
    high = np.ones(target.shape)
    ok = meets(high)
    while not np.all(ok):
        if np.any(high[~ok] >= sigma_max):
            _fail("noise multiplier <= sigma_max", ~ok & (high >= sigma_max), target,
                  f"raise sigma_max (now {sigma_max}) or lower steps / sampling_prob")
        high = np.where(ok, high, np.minimum(2 * high, sigma_max))
        ok = meets(high)
    low = high / 2
    low_ok = meets(low)
    while np.any(low_ok & (low > sigma_min)):
        high = np.where(low_ok, low, high)
        low = np.where(low_ok, np.maximum(low / 2, sigma_min), low)
        low_ok = np.where(low_ok, meets(low), False)
    high = np.where(low_ok, low, high)  # sigma_min already meets the target
    while np.any(high / low > 1 + rtol):
        mid = np.sqrt(low * high)
        ok = meets(mid)
        high, low = np.where(ok, mid, high), np.where(ok, low, mid)
    return high[()] if high.ndim == 0 else high


@float64
def calibrate_steps(target_epsilon, delta, noise_multiplier, sampling_prob, *,
                    neighboring: str = "add_remove", max_steps: int = 10**7) -> np.ndarray:
    """Largest number of steps with epsilon <= ``target_epsilon`` (at most ``max_steps``).

    All arguments broadcast. Raises where even one step exceeds a target.
    """
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    target, delta, sigma, q = np.broadcast_arrays(*(np.asarray(a, np.float64) for a in (
        target_epsilon, delta, noise_multiplier, sampling_prob)))
    ones = np.ones(target.shape)
    _fail("number of steps", _epsilons(sigma, q, ones, delta, neighboring) > target, target,
          "one step already exceeds it; raise noise_multiplier or lower sampling_prob")
    low = ones.astype(np.int64)  # meets the target
    high = np.full(target.shape, 2, np.int64)
    while True:  # double until high exceeds the target (or max_steps)
        over = _epsilons(sigma, q, high, delta, neighboring) > target
        grow = ~over & (high < max_steps)
        if not np.any(grow):
            break
        low = np.where(grow, high, low)
        high = np.where(grow, np.minimum(2 * high, max_steps), high)
    low = np.where(~over, high, low)  # reached max_steps within the target
    high = np.where(~over, high + 1, high)
    while np.any(high - low > 1):
        mid = (low + high) // 2
        ok = _epsilons(sigma, q, mid, delta, neighboring) <= target
        low, high = np.where(ok, mid, low), np.where(ok, high, mid)
    return low[()] if low.ndim == 0 else low


@float64
def calibrate_sampling_prob(target_epsilon, delta, noise_multiplier, steps, *,
                            neighboring: str = "add_remove", q_min: float = 1e-8,
                            rtol: float = RTOL) -> np.ndarray:
    """Largest sampling probability (to ``rtol``) with epsilon <= ``target_epsilon`` (1 if q = 1
    meets it). All arguments broadcast. Raises where even ``q_min`` exceeds a target."""
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    target, delta, sigma, steps = np.broadcast_arrays(*(np.asarray(a, np.float64) for a in (
        target_epsilon, delta, noise_multiplier, steps)))
    check_range("q_min", q_min, 0.0, 1.0, low_open=True)

    def meets(q):
        return _epsilons(sigma, q, steps, delta, neighboring) <= target

    # bracket downwards from q = 1 by factors of 10: a tiny q needs a very fine (large) grid, so
    # q_min is only evaluated where nothing larger meets the target
    low = np.ones(target.shape)
    high = low.copy()
    low_ok = meets(low)
    while not np.all(low_ok):
        _fail("sampling probability >= q_min", ~low_ok & (low <= q_min), target,
              "raise noise_multiplier or lower steps")
        high = np.where(low_ok, high, low)
        low = np.where(low_ok, low, np.maximum(low / 10, q_min))
        low_ok = low_ok | meets(low)
    while np.any(high / low > 1 + rtol):
        mid = np.sqrt(low * high)
        ok = meets(mid)
        low, high = np.where(ok, mid, low), np.where(ok, high, mid)
    return low[()] if low.ndim == 0 else low
