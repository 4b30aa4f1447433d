"""Sampling with replacement of the Gaussian mechanism (jax-privacy's
``FixedBatchSampling(replace=True)``, dp_accounting's ``SampledWithReplacementDpEvent``): the PLD of
one step. The user-facing scheme is :class:`pldjax.mechanisms.sampling.WithReplacement`; this module
is its kernel.

The mechanism. A batch is ``batch_size`` = B draws, each uniform over the ``dataset_size`` = n
records and independent of the others; the sum of the drawn records' clipped contributions (norm
<= C, a record drawn twice counts twice) gets Gaussian noise of standard deviation sigma. In units
of sigma / C (mu = C / sigma) the neighbouring record x has norm <= 1. Zero-out (REPLACE_SPECIAL)
replaces it by a record contributing 0; replace-one by another record x' (|x - x'| <= 2). Both keep
n, so the draws have one law under both datasets; under add/remove n changes, and every draw's law
with it: no pair here.

Why the copies alone do not make the pair. The record is drawn K ~ Binomial(B, 1/n) times, but the
other B - K draws depend on K: with the other records at -1 and x at +1 (zero-out), the sum is
2K - B against K - B, the pair sum_k b(k) N(2k) against sum_k b(k) N(k) (b(k) = P(K = k)), which
is far from the shift of K against none (sum_k b(k) N(k) against N(0), user-level accounting's
pair): at 10 draws from 1,000 records over 1,000 steps at sigma 1, epsilon(1e-5) is at least
12.04, where that pair reads 1.88.

The coupling. Draw B records O_1..O_B from the other n - 1 and, independently, the set J of draw
positions that pick the differing record (each position with probability 1/n, |J| = K). The sum is
t - G_J + K x under one dataset and t - G_J + K x' under the other (x' = 0 under zero-out), with
t = sum_j g(O_j) and G_J = sum_{j in J} g(O_j); with J empty both are t (law R). Given the O's and
J, with |J| = k, the two outputs and R's are Gaussians whose means lie |kx - kx'| <= k d apart,
|kx - G_J| <= 2k from R's, and |kx' - G_J| <= k d' from R's: (d, d') = (1, 1) under zero-out,
(2, 2) under replace-one.

Upper bound 1 (the copies revealed). Hockey-stick divergences are jointly convex, so revealing
(O, J) bounds delta(eps) by sum_{k >= 1} b(k) delta_G(k d mu, eps), delta_G the Gaussian
mechanism's curve: sum_k b(k) PLD(N(k d mu), N(0)), a PLD of a mixture. It gives up the
amplification of a record that is rarely drawn (K = 0 is revealed).

Upper bound 2 (advanced joint convexity; Balle, Barthe and Gaboardi, "Privacy amplification by
subsampling: tight analyses via couplings and divergences", 2018, Thm. 2). With eta = P(K >= 1),
P = (1 - eta) R + sum_{k >= 1} b(k) P_k and Q likewise with Q_k. Split P, for any weights
w(k) >= b(k) adding up to 1, as sum_k w(k) [(1 - g_k) R + g_k P_k] with rates g_k = b(k) / w(k)
(then sum_k w(k) (1 - g_k) = 1 - eta), and Q with the same weights. By joint convexity over k and
the theorem within each part, for eps' >= 0, with e^eps_k = 1 + (e^eps' - 1) / g_k and
beta_k = e^(eps' - eps_k):
delta_{P||Q}(eps') <= sum_k w(k) g_k delta_{P_k||(1 - beta_k) R + beta_k Q_k}(eps_k)
                   <= sum_k b(k) [(1 - beta_k) delta_G(2k mu, eps_k) + beta_k delta_G(k d mu, eps_k)],
the last step by joint convexity over (O, J) as in bound 1; the swap (Q || P) reads d' in place of
2. Weights w(k) proportional to b(k) (every rate eta) amplify every component as one draw of the
record; weights proportional to b(k)^(1/2) or equal ones amplify the rarer copies more: the bound
takes the least over SPLITS of these, and of bound 1, at each eps'. It keeps the amplification,
and is the tighter at small eps'; bound 1 can be at large eps'.

The PLD. Each direction's curve is bounded at eps >= 0 by that least bound, and at eps < 0 through
the other direction's (delta_{P||Q}(eps) = 1 - e^eps + e^eps delta_{Q||P}(-eps)), so it dominates
the pair at every eps; the PLD is the lower convex envelope of the bound at its grid points
(:mod:`pldjax.kernels.envelope`), joined by chords. Under replace-one the bounds of the two
directions are one. Components less likely than NEGLIGIBLE_COMPONENT count as delta = their
probability at every eps. The window ends where bound 1 falls to WINDOW_TAIL, or WINDOW_SPAN
nats above its start (the envelope works in e^eps), and the curve there becomes the +inf atom
(tiny noise: epsilon = inf, a sound reading).

The lower bound (optimistic PLD). The dataset with the other records at -1 and x at +1 (x' = 0
under zero-out, -1 under replace-one) exists, so any post-processing of its pair is a lower bound:
its output rounded into bins (narrow near each component's mean, wide elsewhere), each bin's loss
lowered by the neglected components' mass, merged onto the grid
(:func:`pldjax.mechanisms.atoms.pld_from_atoms`); the identity where the record's shift is too
small for the bins' round-off to leave its losses (RESOLVED_DELTA). At 10 draws from 1,000
records, sigma 1, 1,000 steps, zero-out: epsilon(1e-5) between 12.04 and 14.65.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from pldjax.core import grid as grid_lib
from pldjax.core.grid import Grid
from pldjax.core.pld import PLD, from_rows
from pldjax.core.precision import float64
from pldjax.kernels.envelope import curve_envelope_kernel, envelope_on_host
from pldjax.kernels.gaussian_dp import gdp_delta_upper
from pldjax.mechanisms import subsampling
from pldjax.mechanisms.atoms import MOVED_MASS, pld_from_atoms
from pldjax.mechanisms.named import identity
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import Gaussian
from pldjax.mechanisms.subsampling import NEGLIGIBLE_COMPONENT

#: The window of the upper bound ends where bound 1 falls to this (the +inf atom of each step),
#: and starts at most WINDOW_BELOW nats below 0 (P's mass at lower losses, at most e^-64, is
#: moved up into it).
WINDOW_TAIL = grid_lib.TAIL_MASS
WINDOW_BELOW = 64.0
#: The widest window (nats), a power of two within the envelope's 2 HULL_REACH.
WINDOW_SPAN = 1024.0
#: Bins of the lower bound's output: this many a noise standard deviation near each component's
#: mean, out to BIN_REACH standard deviations either side.
BINS_PER_SIGMA = 256
BIN_REACH = 12.0
#: The lower bound is the identity (delta 0) where its dataset's delta(0) is about this or less
#: (phi(0) times the mean shift of the differing record's sum, mu E[K] or 2 mu E[K]): the bins'
#: masses carry round-off of about u each, which left their losses noise that read delta(0) as
#: 3e-14 whatever the noise (9.5x the truth at sigma 1e13, 10 draws from 100 records).
RESOLVED_DELTA = 1e-11
#: Bound 2's splits of the mixture: component k (of probability b(k)) is amplified at rate
#: b(k) / w(k), with weights w(k) proportional to b(k)^power (power 1: every component at rate
#: eta, as a record's draw; smaller powers amplify the rarer copies more).
SPLITS = (1.0, 0.5, 0.0)
#: The bound is evaluated at every STRIDE-th grid point, joined by chords in between (4x faster
#: than at every point; epsilon 5e-5 relative higher at 10 draws from 1,000 records, 1,000 steps).
STRIDE = 4
#: Most copies kept as components (a guard on the host work: each is a Gaussian curve over the
#: window); a batch whose likely copies span more is refused.
MAX_COPIES = 256


def _copies(dataset_size: int, batch_size: int):
    """(k, b(k)) for the numbers of copies k >= 1 with b(k) = P(K = k) >= NEGLIGIBLE_COMPONENT,
    the probability of the other k >= 1 (``rare``), and eta = P(K >= 1)."""
    law = stats.binom(batch_size, 1.0 / dataset_size)
    eta = -math.expm1(batch_size * math.log1p(-1.0 / dataset_size)) if dataset_size > 1 else 1.0
    low = max(1, int(law.ppf(NEGLIGIBLE_COMPONENT)) - 1)
    high = min(batch_size, int(law.isf(NEGLIGIBLE_COMPONENT)) + 1)
    k = np.arange(low, high + 1)
    probs = law.pmf(k)
    kept = probs >= NEGLIGIBLE_COMPONENT
    k, probs = k[kept], probs[kept]
    if len(k) > MAX_COPIES:
        raise ValueError(f"sampling with replacement of {batch_size} draws from {dataset_size} "
                         f"records holds a record between {k[0]} and {k[-1]} times with "
                         f"probability >= {NEGLIGIBLE_COMPONENT}: more than {MAX_COPIES} numbers "
                         "of copies (a guard on the host work); draw fewer, or from more records")
    # the numbers of copies left out, each end's tail summed as such (not as eta less the kept
    # ones, whose round-off exceeds them)
    below = float(law.cdf(k[0] - 1) - law.pmf(0)) if k[0] > 1 else 0.0
    rare = float(law.sf(k[-1])) + max(below, 0.0)
    return k.astype(np.float64), probs, rare, eta


class _Bounds:
    """The upper bounds of the module docstring, for one configuration (mu = C / sigma)."""

    def __init__(self, mu: float, dataset_size: int, batch_size: int, replace_one: bool):
        self.k, self.probs, self.rare, self.eta = _copies(dataset_size, batch_size)
        self.mu = mu
        self.d = 2.0 if replace_one else 1.0

    def revealed(self, eps):
        """Bound 1 at eps >= 0 (both directions)."""
        e = np.asarray(eps, np.float64)[..., None]
        return np.sum(self.probs * gdp_delta_upper(self.k * self.d * self.mu, e), -1) + self.rare

    def at(self, eps, swapped: bool):
        """The smallest bound at eps >= 0 for P || Q (``swapped``: Q || P): bound 1, or bound 2
        with each split of SPLITS."""
        e = np.asarray(eps, np.float64)[..., None]
        far = self.d if swapped else 2.0
        least = self.revealed(eps)
        for power in SPLITS:
            weights = self.probs**power
            weights *= (1.0 - self.rare) / math.fsum(weights)
            rates = self.probs / weights
            if np.any(rates > 1.0):
                continue
            # e^inner = 1 + (e^e - 1) / rate and beta = e^(e - inner), without overflow or
            # cancellation
            with np.errstate(divide="ignore"):  # rate 1: spared 1, inner e, beta 1
                spared = -np.expm1(np.log1p(-rates) - e)  # 1 - (1 - rate) e^-e
            inner = e - np.log(rates) + np.log(spared)
            beta = rates / spared
            bound = np.sum(self.probs * ((1.0 - beta) * gdp_delta_upper(self.k * far * self.mu, inner)
                                         + beta * gdp_delta_upper(self.k * self.d * self.mu, inner)),
                           -1) + self.rare
            least = np.minimum(least, bound)
        return np.minimum(least, 1.0)

    def reach(self) -> float:
        """The loss (nats) where bound 1 falls to WINDOW_TAIL (by bisection)."""
        low, high = 0.0, 1.0
        while self.revealed(high) - self.rare > WINDOW_TAIL and high < 1e12:
            low, high = high, 2.0 * high
        for _ in range(60):
            middle = 0.5 * (low + high)
            low, high = (middle, high) if self.revealed(middle) - self.rare > WINDOW_TAIL else (low, middle)
        return high


def _automatic_step(noise: Gaussian, eta: float) -> float:
    """The grid step (nats): the accuracy step (:func:`pldjax.core.grid.fine_step` of the loss's
    spread) of the Poisson-subsampled Gaussian at rate eta, one copy's shift from R's (2 mu)."""
    base, (shift,) = Gaussian(float(noise.sigma), 2.0 * float(noise.sensitivity)).pair(
        Neighboring.ADD_REMOVE, True)
    mechanism = subsampling.poisson(base)
    with np.errstate(all="ignore"):
        spread = mechanism.spread((np.full(2, shift), np.full(2, eta),
                                   np.array([subsampling.REMOVE, subsampling.ADD])))
    return float(np.min(grid_lib.fine_step(np.asarray(spread))))


def _upper(bounds: _Bounds, step: float, replace_one: bool) -> PLD:
    """The pessimistic PLD: the envelope of the smaller bound (one direction under replace-one,
    both under zero-out); its window ends where bound 1 falls to WINDOW_TAIL, or WINDOW_SPAN
    nats above its start, and the curve there is the +inf atom."""
    # windows are powers of two in points and in step: the span stays within WINDOW_SPAN
    top = min(bounds.reach(), WINDOW_SPAN - WINDOW_BELOW - 8.0)
    step = max(step, float(grid_lib.cover_step((top + WINDOW_BELOW) / 2.0,
                                               grid_lib.MAX_MECHANISM_SIZE, np)))
    offset = -math.ceil(min(top, WINDOW_BELOW) / step)
    size = grid_lib.next_pow2(math.ceil(top / step) - offset + 2)
    z = (offset + np.arange(size)) * step
    above, below = z >= 0, np.exp(np.minimum(z, 0.0))
    forward = _chords(bounds, np.abs(z), step, False)
    if replace_one:
        pairs = [(forward, forward)]
    else:
        backward = _chords(bounds, np.abs(z), step, True)
        pairs = [(forward, backward), (backward, forward)]
    directions = []
    for own, other in pairs:
        with np.errstate(over="ignore"):
            excess = np.where(above, own + np.expm1(z), below * other)
        curve = np.where(above, own, -np.expm1(np.minimum(z, 0.0)) + below * other)
        envelope = curve_envelope_kernel
        if envelope_on_host(size, ("curve envelope", size)):
            envelope = np.errstate(all="ignore")(curve_envelope_kernel.__wrapped__)
        probs, inf_mass = envelope(curve, excess, np.int64(offset), np.float64(step), size=size)
        directions.append(from_rows(np.asarray(probs), np.float64(inf_mass), np.int64(offset),
                                    np.float64(step), (), True))
    return PLD.from_directions(*directions)


def _chords(bounds: _Bounds, eps, step: float, swapped: bool):
    """The smaller bound (:meth:`_Bounds.at`) at every STRIDE-th multiple of ``step``,
    joined by chords in e^eps, at ``eps`` (multiples of ``step``, >= 0): still above the true
    curve, which is convex in e^eps and below the bound at the chords' ends."""
    span = STRIDE * step
    index = np.floor(eps / span + 1e-9)
    ends = bounds.at(span * np.arange(int(np.max(index)) + 2), swapped)
    left = index.astype(np.int64)
    into = eps - span * index  # (e^into - 1) / (e^span - 1), without overflow
    share = np.exp(into - span) * np.expm1(-into) / math.expm1(-span)
    return ends[left] + share * (ends[left + 1] - ends[left])


def _log_bin_masses(edges, means):
    """log of N(mean, 1)'s mass in each bin [edges[i], edges[i + 1]), for each mean (rows), from
    the tail on the bin's far side from the mean: no cancellation."""
    lo, hi = edges[None, :-1] - means[:, None], edges[None, 1:] - means[:, None]
    right = lo >= 0  # the bin lies above the mean: upper tails
    near, far = np.where(right, -lo, hi), np.where(right, -hi, lo)
    log_near, log_far = special.log_ndtr(near), special.log_ndtr(far)
    with np.errstate(divide="ignore"):
        straddles = (lo < 0) & (hi > 0)
        inside = np.log(np.maximum(special.ndtr(hi) - special.ndtr(lo), 0.0))
        tail = log_near + np.log(-np.expm1(np.minimum(log_far - log_near, 0.0)))
    return np.where(straddles, inside, tail)


def _lower(noise: Gaussian, dataset_size: int, batch_size: int, replace_one: bool,
           step: float) -> PLD:
    """The optimistic PLD: the binned pair of the module docstring, both directions."""
    mu = float(noise.sensitivity) / float(noise.sigma)
    k, weights, neglected, eta = _copies(dataset_size, batch_size)
    shift = (2.0 if replace_one else 1.0) * mu * math.fsum(k * weights)
    if shift / math.sqrt(2.0 * math.pi) <= RESOLVED_DELTA:
        return identity(pessimistic=False)
    if 1.0 - eta >= NEGLIGIBLE_COMPONENT:  # no copy drawn
        k, weights = np.concatenate([[0.0], k]), np.concatenate([[1.0 - eta], weights])
    else:
        neglected += 1.0 - eta
    p_means, q_means = 2.0 * k * mu, (0.0 if replace_one else 1.0) * k * mu
    offsets = np.arange(-BIN_REACH * BINS_PER_SIGMA, BIN_REACH * BINS_PER_SIGMA + 1) / BINS_PER_SIGMA
    edges = np.unique(np.concatenate([(np.concatenate([p_means, q_means])[:, None]
                                       + offsets).ravel(), [-np.inf, np.inf]]))
    log_p = special.logsumexp(_log_bin_masses(edges, p_means), axis=0, b=weights[:, None])
    log_q = special.logsumexp(_log_bin_masses(edges, q_means), axis=0, b=weights[:, None])
    # a neglected component adds at most `neglected` to a bin: the loss is at least this
    log_neglected = math.log(neglected) if neglected > 0 else -np.inf
    directions = []
    for log_a, log_b in ((log_p, log_q), (log_q, log_p)):
        present = np.isfinite(log_a)
        losses = log_a[present] - np.logaddexp(log_b[present], log_neglected)
        masses = np.exp(log_a[present])
        # Q-mass that underflowed: a loss past the others, taken at the highest (lowered)
        losses = np.where(np.isfinite(losses), losses, np.max(losses, where=np.isfinite(losses),
                                                              initial=0.0))
        pld = pld_from_atoms(losses, masses, 0.0, _fitting_step(losses, masses, step), False)
        directions.append(identity(pessimistic=False) if pld is None else pld)
    return PLD.from_directions(*directions)


def _fitting_step(losses, masses, step: float) -> float:
    """``step``, or the power of two times it on which a window of MAX_MECHANISM_SIZE points
    reaches from the highest loss down to where all but MOVED_MASS of the mass lies above."""
    order = np.argsort(losses)
    below = np.cumsum(masses[order])
    bottom = losses[order][min(int(np.searchsorted(below, MOVED_MASS)), len(losses) - 1)]
    needed = (np.max(losses) - bottom) / (grid_lib.MAX_MECHANISM_SIZE - 8)
    return step if needed <= step else step * 2.0 ** math.ceil(math.log2(needed / step))


@float64
def with_replacement_pld(noise: Gaussian, dataset_size: int, batch_size: int,
                         neighboring: Neighboring, *, pessimistic: bool, grid: Grid | None) -> PLD:
    """The PLD (both directions under zero-out, one under replace-one) of one step of sampling
    ``batch_size`` draws with replacement from ``dataset_size`` records, with Gaussian ``noise``
    (concrete scalars, checked by :class:`pldjax.mechanisms.sampling.WithReplacement`);
    pessimistic (an upper bound) or optimistic (a lower bound), see the module docstring.
    ``grid``: its ``step`` (nats; default: the accuracy step of a comparable Poisson-subsampled
    Gaussian); its other fields are not used."""
    replace_one = neighboring == Neighboring.REPLACE_ONE
    if batch_size == 0 or float(noise.sigma) == math.inf or float(noise.sensitivity) == 0.0:
        return identity(pessimistic=pessimistic)
    mu = float(noise.sensitivity) / float(noise.sigma)
    bounds = _Bounds(mu, dataset_size, batch_size, replace_one)
    step = (grid or Grid()).step or _automatic_step(noise, bounds.eta)
    if pessimistic:
        return _upper(bounds, float(step), replace_one)
    return _lower(noise, dataset_size, batch_size, replace_one, float(step))


__all__ = ["with_replacement_pld"]
