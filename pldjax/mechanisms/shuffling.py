"""A lower bound on the privacy of DP-SGD with shuffled batches (Chua, Ghazi, Kamath, Kumar,
Manurangsi, Sinha, Zhang, "How Private are DP-SGD Implementations?", ICML 2024).

Training usually shuffles the dataset each epoch and cuts it into batches, yet is accounted as if
every batch were Poisson-sampled. No tight PLD of shuffled DP-SGD is known, but a lower bound is
easy to state: one input on which the guarantee cannot be better. Chua et al.'s input is a
one-dimensional model with clip norm 1, every record's clipped gradient -1 but one record's, which
is +1 in one dataset. In its neighbour that record's gradient is -1 (replace-one: batch sizes stay,
the batch holding it moves by 2) or 0 (zero-out, dp-accounting's REPLACE_SPECIAL: it moves by 1).
Each epoch the record falls in one of the epoch's T batches, uniformly, and step t releases its
batch's gradient sum plus N(0, sigma^2). Less the known sums, one epoch's output is P = the
uniform mixture over t of N(a e_t, sigma^2 I_T) against Q = N(0, sigma^2 I_T), with a = 2 or 1.
The epochs' shuffles and noise are independent, so E epochs release E independent copies.

What is computed: any function of the output is a post-processing, so its pair is dominated by
(P, Q) and its privacy curve lies below theirs. Here that function is which of K + 1 intervals,
cut at thresholds tau_1 < ... < tau_K, holds the largest coordinate M = max_t y_t (the test of
Chua et al. is a single threshold on M). M's distribution has a closed form under both,
F_Q(m) = Phi(m / sigma)^T and F_P(m) = Phi((m - a) / sigma) Phi(m / sigma)^(T - 1), so each
interval's masses under P and Q, and its privacy loss log(P-mass / Q-mass), are exact up to
round-off. The intervals' losses are rounded down onto the grid (every delta(eps) of a PLD only
falls when a loss falls, also after composition), and the E-fold composition is the optimistic
(lower-bound) one. Round-off is put on the same side: each loss is lowered by a margin
(_LOSS_MARGIN) before the rounding, each mass scaled down by (_MASS_MARGIN). The result is a PLD
with ``pessimistic=False``: its delta(eps) is at or below the truth for this input, and so below
shuffled DP-SGD's, and its epsilon(delta) at or below shuffled DP-SGD's epsilon. Both directions
are kept (PLD(P || Q) and PLD(Q || P)); each is a lower bound.
"""

from __future__ import annotations

import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.grid import Grid
from pldjax.core.namespace import public_dir
from pldjax.core.pld import PLD, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.validation import check_count, check_noise_multiplier, check_single
from pldjax.kernels.compose import CompositionTooWide
from pldjax.mechanisms.neighboring import Neighboring

#: The shift a of the record's batch (module docstring) under each relation.
_SHIFTS = {Neighboring.REPLACE_ONE: 2.0, Neighboring.REPLACE_SPECIAL: 1.0}
#: Thresholds on the largest coordinate (K): more are tighter, at a host cost linear in K.
_THRESHOLDS = 1 << 16
#: Mass (under P and under Q) the thresholds leave below the first and above the last, each
#: as its own interval: nothing is dropped, the end intervals are only coarser.
_END_MASS = 1e-30
#: Default grid step (nats) of the losses.
_STEP = 2.0**-10
#: Most grid points of the PLD; a wider range of losses gets a coarser step (a power of two).
_MAX_POINTS = 1 << 18
#: Each loss is lowered by this much (nats) before it is rounded down, so that its round-off
#: (about 1e-13 nats from the logs of the masses) never moves it up a grid point.
_LOSS_MARGIN = 1e-9
#: Each mass is scaled by (1 - this), far above its round-off (about 1e-12, relative, where
#: the thresholds are densest against the CDF's change): a mass can only be lower than the truth.
_MASS_MARGIN = 2.0**-30


def _log_masses(log_cdf: np.ndarray) -> np.ndarray:
    """log of the masses of the intervals (-inf, tau_1), [tau_1, tau_2), ..., [tau_K, inf) from
    log CDF values at tau_1..tau_K (non-decreasing): differences of CDF values where the CDF is
    at most 1/2, of survival values above, each as a * (1 - b / a) in logs (no cancellation
    beyond the one the difference itself has)."""
    with np.errstate(divide="ignore", invalid="ignore"):  # log 0 = -inf: an empty interval
        log_sf = np.log(-np.expm1(np.minimum(log_cdf, 0.0)))
        lower, upper = log_cdf[:-1], log_cdf[1:]
        from_cdf = upper + np.log(-np.expm1(lower - upper))
        from_sf = log_sf[:-1] + np.log(-np.expm1(log_sf[1:] - log_sf[:-1]))
    inner = np.where(upper <= np.log(0.5), from_cdf, from_sf)
    inner = np.where(lower == upper, -np.inf, inner)  # both ends rounded to one value
    return np.concatenate([log_cdf[:1], inner, log_sf[-1:]])


def _interval_losses(sigma: float, batches: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """log P-mass and log Q-mass of each interval of the largest coordinate when one
    coordinate's mean is ``shift`` under P (see the module docstring)."""
    from scipy.special import log_ndtr, ndtri

    low = sigma * float(ndtri(np.exp(np.log(_END_MASS) / batches)))
    high = shift + sigma * float(-ndtri(_END_MASS / batches))
    thresholds = np.linspace(min(low, high - shift), high, _THRESHOLDS)
    log_phi = log_ndtr(thresholds / sigma)
    log_q = _log_masses(batches * log_phi)
    log_p = _log_masses(log_ndtr((thresholds - shift) / sigma) + (batches - 1) * log_phi)
    return log_p, log_q


def _loss(log_mass, log_other) -> np.ndarray:
    """log(mass / other mass) of each interval; where the other mass is 0 in floating point (an
    underflow, or an interval narrower than its CDF's round-off), 1 stands for it: a loss at or
    below the true one."""
    return log_mass - np.where(np.isneginf(log_other), 0.0, log_other)


def _rounded_down(losses: np.ndarray, step: float) -> np.ndarray:
    """Grid indices of ``losses`` (nats), rounded down past their round-off."""
    return np.floor((losses - _LOSS_MARGIN) / step).astype(np.int64)


@float64
def shuffling_lower_bound(noise_multiplier: float, steps_per_epoch: int, epochs: int = 1, *,
                          neighboring: Neighboring | str = "replace_one",
                          grid: Grid | None = None) -> PLD:
    """An optimistic PLD (a lower bound) of DP-SGD with shuffled batches: no implementation
    that shuffles its dataset each epoch into ``steps_per_epoch`` batches, with Gaussian noise of
    standard deviation ``noise_multiplier`` times the clip norm, is more private over ``epochs``
    epochs under ``neighboring`` ("replace_one", or "replace_special" for zero-out; add/remove
    changes the batch sizes, which this input does not cover). Read ``.epsilon(delta)``: a lower
    bound on the true epsilon. Compare it with Poisson accounting at sampling probability
    1 / steps_per_epoch over steps_per_epoch * epochs steps (:func:`pldjax.dpsgd_epsilon` under
    the same relation), often reported for such training but not a bound on it.

    Chua et al.'s (ICML 2024) input, with the largest coordinate of each epoch's output cut into
    2^16 intervals; the derivation is in the module docstring. ``grid``: its ``step`` (nats)
    rounds the losses (default 2^-10; coarser, a power of two, where the losses span more than
    2^18 points); its other fields are not used.

    Args:
      noise_multiplier: finite and at least 1e-100, a scalar: the noise's standard deviation
        over the clip norm (below, its losses overflow float64; see
        :data:`pldjax.core.validation.SMALLEST_NOISE_MULTIPLIER`).
      steps_per_epoch: batches per epoch T, a whole number >= 1.
      epochs: number of epochs E, a whole number >= 1; 1 by default.
      neighboring: "replace_one" (default) or "replace_special" (zero-out), or the matching
        :class:`~pldjax.mechanisms.neighboring.Neighboring`; anything else is a ValueError.
      grid: optional :class:`Grid` whose ``step`` (nats) rounds the losses; None (default) or a
        step of None: 2^-10.

    Returns:
      An unbatched :class:`PLD` with ``pessimistic=False`` and both directions, each an
      optimistic estimate (a lower bound on delta(eps) and on epsilon(delta) of shuffled
      DP-SGD). Epochs beyond the first are composed by self-composition, which raises
      :class:`~pldjax.kernels.compose.CompositionTooWide` (a ValueError) when its window does not
      fit; a coarser ``grid`` step helps there.
    """
    check_single("shuffling_lower_bound", "noise_multiplier", noise_multiplier)
    check_noise_multiplier(noise_multiplier)
    sigma = float(noise_multiplier)
    batches = check_count("steps_per_epoch", steps_per_epoch, minimum=1)
    epochs = check_count("epochs", epochs, minimum=1)
    shift = _SHIFTS.get(Neighboring.parse(neighboring))
    if shift is None:
        raise ValueError(f"neighboring must be one of {tuple(_SHIFTS)} for shuffled batches (they "
                         f"keep their sizes only when a record is replaced), got {neighboring!r}")
    step = (grid or Grid()).step or _STEP
    log_p, log_q = _interval_losses(sigma, batches, shift)
    directions = [(_loss(log_p, log_q), np.exp(log_p)), (_loss(log_q, log_p), np.exp(log_q))]
    directions = [(losses[mass > 0], mass[mass > 0]) for losses, mass in directions]
    span = (max(np.max(losses) for losses, _ in directions)
            - min(np.min(losses) for losses, _ in directions))
    if span / step >= _MAX_POINTS - 2:
        step = 2.0 ** np.ceil(np.log2(span / (_MAX_POINTS - 2)))
    directions = [(_rounded_down(losses, step), mass * (1.0 - _MASS_MARGIN))
                  for losses, mass in directions]
    lowest = min(int(np.min(index)) for index, _ in directions)
    highest = max(int(np.max(index)) for index, _ in directions)
    size = grid_lib.next_pow2(highest - lowest + 1)
    plds = []
    for index, mass in directions:
        probs = np.zeros(size)
        np.add.at(probs, index - lowest, mass)
        plds.append(unchecked_pld(probs, np.float64(0.0), np.int64(lowest), np.float64(step),
                                  pessimistic=False))
    pld = PLD.from_directions(*plds)
    if epochs == 1:
        return pld
    try:
        return pld.self_compose(epochs)
    except CompositionTooWide as error:
        raise CompositionTooWide(f"epochs = {epochs}: {error}; here pass "
                                 f"grid=pj.Grid(step=...) coarser than {step}") from error


__all__ = ["shuffling_lower_bound"]
__dir__ = public_dir(__all__)
