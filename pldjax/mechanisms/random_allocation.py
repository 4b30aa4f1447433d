"""Random allocation (balls-in-bins when one step is selected): each record takes part in exactly
``selected`` of ``steps`` steps, chosen uniformly at random, each step a Gaussian mechanism; the
PLD of one such epoch. The user-facing scheme is
:class:`pldjax.mechanisms.sampling.RandomAllocation`; this module is its kernel.

The pair. With Gaussian noise of standard deviation sigma and sensitivity C (mu = C / sigma),
the epoch under add/remove or zero-out is dominated by the pair P = the uniform mixture over
``selected``-subsets A of the steps of N(mu 1_A, I_steps) against Q = N(0, I_steps), also for
adaptively chosen queries (Feldman and Shenfeld, "Privacy amplification by random allocation",
2025; Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang, "Balls-and-bins sampling for
DP-SGD", arXiv:2412.16802, 2024, for one selection). The remove direction is PLD(P || Q), the add
direction PLD(Q || P). Replace-one moves the record's batches to other values rather than to
zero, which this pair does not cover: it is refused.

One selection (k = 1) of t steps. Under Q the coordinates' likelihood ratios Z_i =
exp(mu y_i - mu^2 / 2) are independent lognormals of mean 1 (log Z ~ N(-mu^2 / 2, mu^2)), and
dP/dQ = S = (Z_1 + ... + Z_t) / t. Both directions' hockey-stick divergences are expectations
under Q of convex functions of S: remove, delta(eps) = E_Q[(S - e^eps)_+]; add,
delta(eps) = E_Q[(1 - e^eps S)_+]. So the law of S under Q is all there is to compute, and it
is the t-fold convolution of the law of Z / t, computed on a lattice j h, j < N, by FFTs
(repeated squaring; sums beyond the lattice are cut off at each product, which is exact for
the mass left on it, since every term is >= 0).

* Pessimistic: each Z is spread onto the two lattice points around it, in proportions that keep
  its mean (the mass at z in [a, a + H] goes to a with weight (a + H - z) / H), a mean-preserving
  spread. Sums of independent spreads are spreads, so the lattice law of S' is larger in the
  convex order than S's, with mean 1: the pair (Q', P' = S' Q') has every hockey-stick
  divergence, in both directions, at or above (P, Q)'s, so it dominates (Blackwell) and so do
  its compositions. P' is computed as a convolution too: s q'(s) = t E[W'_1; S' = s] for the
  spread terms W'_i, so P' is the (t - 1)-fold law convolved with one size-biased term (mass at j
  times j h t), and its FFT round-off is relative to its own masses rather than multiplied by s.
  The P'-mass beyond the lattice (S' > top) goes to +inf in the remove direction. The add
  direction reads Q' on a second lattice that reaches only S's bulk: its losses -log S' beyond
  that lattice's top are below -log(top), where they are put (rounded up), and the mass at
  S' = 0 goes to +inf (the lattice is fine enough to hold at most 1e-9 there). Each atom, at
  log s_j (remove) or -log s_j (add), is then split between the two grid points around it
  keeping its Q-mass (a refinement of the pair, which dominates it; Doroshenko et al.'s
  connect-the-dots does the same to a privacy curve).
* Optimistic: the adversary looks only at T = h sum_i floor(Z_i / (t h)), a function of the
  output (the lattice version of S), so the pair of T's laws is dominated by (P, Q). Under Q it
  is the t-fold convolution of the floored untilted lognormal; under P one coordinate (k of
  them, for k selections) has the tilted law, log Z ~ N(+mu^2 / 2, mu^2). The PLD of that pair
  (loss log(p_j / q_j) at lattice point j, the mass beyond the lattice merged into its last
  point, another post-processing) is merged onto the grid: the atoms between two grid points
  are merged, and each grid point takes a share of the cell below it as large as keeps the
  merger's loss at or above the point (post-processing again, then a loss lowered), which
  loses far less than rounding each loss down (about half a grid step of epsilon). Where the
  lattice is coarse (small sigma), T on the add direction's finer lattice (its values beyond
  merged into its last point) is a second such statistic, and the two are joined
  (:func:`_join`).

Several selections (k > 1). Cut the t steps into k blocks of sizes m_1..m_k (each floor(t / k) or
one more) and allocate one step in each block: its pair is the composition of k one-selection
pairs. A uniformly random permutation of the steps turns any law on k-subsets into the uniform one,
and Q is invariant under it, so the random-allocation pair is a mixture (over permutations) of
pairs, each a relabelling of the blocked pair; hockey-stick divergences are jointly convex, so the
blocked composition dominates (the pessimistic PLD). Each block's PLD is the meet of its lattice
PLD and the Gaussian bound of one selection (:func:`_meet`: the lower convex hull of their curves'
minimum), so that where the lattice's round-off bounds outweigh the tail (blocks of 10^5 steps or
more, or a tail too heavy for any lattice) the composition over thousands of blocks stays finite.
The meet runs to the end of the longer window: ended at the shorter one, the Gaussian bound's, it
put that bound's tail beyond its window at +inf (about 1e-10 at sigma 0.36 and 3 steps, where
epsilon(1e-10) then read inf). The epoch is then held to the Gaussian bound of k selections
(sqrt(k) mu, the adversary also told which steps): where its curve lies below the composition's
somewhere, the meet of the two, or the bound itself where it is the lower one (k of the order
of t / 2, whose k-fold composition, rounded up at every fold, ended several times above it). The
optimistic PLD is a lattice statistic again, with k tilted coordinates, but not of the sum: the
pair's likelihood ratio is now the mean over k-subsets A of prod_{i in A} Z_i, close to Poisson
sampling's at rate q = k / t, prod_i (1 - q + q Z_i) = (1 - q)^t prod_i (1 + c Z_i) with
c = k / (t - k). So the statistic is G = sum_i log(1 + c Z_i) (a function of the output, so
dominated by (P, Q)), on a lattice of its own; for sigma 2 and 10 of 100 steps its epsilon at
delta 1e-6 is within 0.9% of the pessimistic one, where the sum's was 1.5% below. Where most steps
are selected, or sigma is small, G's lattice misses the tail that the sum of the outputs shows:
that sum is the Gaussian mechanism of shift k mu / sqrt(t) (the optimistic Gaussian bound). Both
curves are below the pair's, so their maximum is too, and :func:`_join` turns it into one
optimistic PLD (sigma 2, 99 of 100 steps: 25.0 alone, 35.08 joined, against the upper bound's
35.21).

Round-off. Cell masses are integrated free of cancellation (:func:`_cell_masses`: relative
round-off of order 1e-15); each FFT product is clipped at zero and its round-off bounded
(:func:`pldjax.kernels.compose.fft_roundoff`), so every lattice mass has a lower and an upper
bound, and each direction's PLD takes the side of its estimate (upper bounds for the
pessimistic masses and +inf atoms, the surplus then taken off the lowest losses; lower bounds
for the optimistic masses, upper ones for the other law in their losses' denominators).

The lattice. Its spacing h sets how far the result is from the exact pair: the spread adds
variance at most t (h / 2)^2 to S (the floor loses about as much), so h is aimed at
sqrt(t) h <= (S's standard deviation) / 64, which moves epsilon by about 1e-4 relative against a
lattice 64 times finer. Its top covers S's bulk under P and its tail, which is a tilted term's,
lognormal: to 1e-16 of mass beyond, or down to 1e-9 where that would not fit the lattice's
:data:`MAX_LATTICE` points (sigma below about 0.8 with 100 steps or fewer; the lattice is then
coarser than aimed and the bounds further apart, never unsound). There one selection's remove
direction is also read on lattices that resolve S but reach less of the tail (6 down to 4
standard deviations of a tilted term: 1e-9 to 3e-5 of P-mass beyond, at +inf; and the add
direction's), and they are met (:func:`_one_selection`): sigma 0.5, 10 of 100 steps,
epsilon(1e-5) 25.98 against 29.90 alone. Where no lattice resolves S (sigma below about 0.35,
or a spread below the lattice's resolution: 10^8 steps at sigma 1, 10^7 at sigma 10) the PLDs
are Gaussian bounds (:func:`_gaussian_bound`), sound and loose.
"""

from __future__ import annotations

import math
from concurrent.futures import Future
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import array_module, computed_once, host_work, kernel_jit, side_thread
from pldjax.core.grid import Grid
from pldjax.core.mass import exact_sum
from pldjax.core.pld import PLD, from_rows, log_q_mass, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.special import special_functions
from pldjax.kernels.compose import UNIT_ROUNDOFF, fft_roundoff
from pldjax.kernels.discretize import lower_hull_at, masses_from_curve
from pldjax.kernels.hockey_stick import delta_kernel
from pldjax.mechanisms.atoms import doubled_until, pld_from_atoms
from pldjax.mechanisms.neighboring import Neighboring

#: Most and fewest points of the lattice of S (powers of two; a product's FFT has twice as many).
MAX_LATTICE = 2**21
MIN_LATTICE = 2**12
#: The lattice's top reaches S's tail under P to the first of these standard-normal quantiles
#: of a tilted term (1e-16 of mass beyond, down to 1e-9) for which the lattice resolves S, and
#: S's bulk to _BULK_SPREADS standard deviations.
_TAIL_QUANTILES = (8.2, 7.6, 7.0, 6.5, 6.0)
#: Where that lattice is coarser than aimed, one selection's remove direction is met with a
#: finer one's (:func:`_one_selection`), which reaches the first of these quantiles at which it
#: resolves S (spacing at most twice the aimed one), or the last (3e-5 of mass beyond).
_FINE_QUANTILES = (6.0, 5.0, 4.0)
_BULK_SPREADS = 16.0
#: Most Q-mass the add direction's lattice may put at S' = 0, a loss of +inf
#: (:func:`_bulk_lattice`).
_ZERO_MASS = 1e-9
#: The lattice's spacing h aims at sqrt(t) h <= (S's standard deviation) / _RESOLUTION.
_RESOLUTION = 2.0**6
#: Largest shift mu = sensitivity / sigma the lattice takes, and the most its spacing may miss
#: the aimed one by: beyond either (S's tail outgrows any lattice, or S's spread is below its
#: resolution: sigma far from 1, or millions of steps) the PLDs are :func:`_gaussian_bound`'s.
_MAX_SHIFT = 8.0
_MAX_COARSENING = 1024.0
#: Points (as :class:`pldjax.core.compilation.HostWork` counts them: grid points, about 5 million
#: a second) of lattice laws of one size that a process computes in NumPy, while its host work
#: lasts, before it compiles that size's program (a ski rental), on an accelerator. On a CPU the
#: NumPy laws are as fast as the compiled ones (1.2 s against 1.3 s for one selection of 1,000
#: steps at sigma 1, where the program took 1.1-1.3 s to compile): they always run in NumPy
#: there, unless PLDJAX_HOST_WORK is 0.
HOST_LATTICE_POINTS = 2**24
#: Lattices of at least this many points are multiplied out in NumPy in two threads (see
#: :func:`_power_on_host`; smaller ones' FFTs, of a few ms, gained nothing).
_SIDE_THREAD_POINTS = 2**18
#: The widest window (nats) of :func:`_join`'s curves, read in e^eps.
_HULL_NATS = 700.0
#: Cells narrower than this in standardized log Z are integrated by Gauss-Legendre on _NODES.
_NARROW = 2.0**-4
_NODES = 8


def _cdf_differences(edges):
    """Phi(edges[j + 1]) - Phi(edges[j]) for each cell between increasing ``edges``, from the CDF
    where it is below 1/2 and from the survival function above (no cancellation against 1; one
    Phi an edge, of its smaller tail): accurate relative to the difference unless the interval
    is narrow where Phi is far from 0 and 1."""
    # Phi(x) for x <= 0, Phi(-x) = 1 - Phi(x) above; read through two slices each (computed once:
    # XLA's CPU fusion computed Phi at every read)
    xp = array_module(edges)
    tail = computed_once(special_functions(xp).ndtr(-xp.abs(edges)))
    lower, upper = edges[:-1], edges[1:]
    from_cdf = tail[1:] - tail[:-1]
    from_sf = xp.where(lower >= 0.0, tail[:-1], 1.0 - tail[:-1]) - tail[1:]
    return xp.maximum(xp.where(upper <= 0.0, from_cdf, from_sf), 0.0)


def _cell_masses(mu, width, size: int, *, spread: bool, tilted: bool, scale=None):
    """A lattice law (:func:`_product`) of one term on the points 0..size-1, Z a lognormal with
    log Z ~ N(-mu^2 / 2, mu^2) (``tilted``: N(+mu^2 / 2, mu^2)): the term is Z / width, or with
    a ``scale`` c the logarithmic term log(1 + c Z) / width; floored (the mass of [j, j + 1) at
    j), or ``spread`` keeping the mean (the module docstring; Z / width only). Mass beyond the
    lattice is left out.

    In x, the standardized log Z, cell j is [x_j, x_j + w_j / mu], w_j = log1p(1 / j) for Z /
    width and log1p(e^{j width} expm1(width) / expm1(j width)) for the logarithmic term. A narrow
    cell (up to _NARROW) is integrated by Gauss-Legendre, with the place of each node in the
    cell, Z / width - j = j expm1(mu (x - x_j)), free of cancellation: round-off relative to the
    cell's own mass. A wide one's mass is a difference of Phi taken on the side of its tail
    (:func:`_cdf_differences`; with Phi(x - mu), which gives E[Z] over the cell, for the
    spread)."""
    xp = array_module(mu, width)
    index = xp.arange(size, dtype=xp.float64)
    points = xp.arange(size + 1, dtype=xp.float64)  # the cells' edges
    centre = 0.5 * mu * mu if tilted else -0.5 * mu * mu
    if scale is None:
        log_edges = xp.log(points * width)  # -inf at j = 0
        log_width = xp.log1p(1.0 / index)  # inf at j = 0
        # a wide cell lies below Z / width = 1 / expm1(mu _NARROW), where Phi's differences lose
        # at most that factor
        wide_loss = 1.0 / xp.expm1(mu * _NARROW)
    else:
        log_edges = xp.log(xp.expm1(points * width)) - xp.log(scale)
        log_width = xp.log1p(xp.exp(index * width) * xp.expm1(width)
                             / xp.expm1(index * width))
        # Phi's differences over at least _NARROW lose at most 1 / (Phi(_NARROW / 2) - 1 / 2)
        wide_loss = 1.0 / (special_functions(xp).ndtr(0.5 * _NARROW) - 0.5)
    edges = (log_edges - centre) / mu
    lower = edges[:-1]
    half = 0.5 * log_width / mu
    narrow = half <= 0.5 * _NARROW
    half = xp.where(narrow, half, 0.0)
    start = xp.where(narrow, lower, 0.0)
    mass = xp.zeros_like(half)
    moment = xp.zeros_like(half)
    for node, weight in zip(*np.polynomial.legendre.leggauss(_NODES), strict=True):
        offset = half * (1.0 + node)
        x = start + offset
        density = weight * xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        mass = mass + density
        if spread:
            moment = moment + density * index * xp.expm1(mu * offset)
    probs = xp.where(narrow, half * mass, _cdf_differences(edges))
    relative = 16.0 * UNIT_ROUNDOFF * (_NODES + 4.0 + wide_loss)
    if not spread:
        return probs, relative, xp.zeros(())
    # the share a cell sends up, E[Z / width - j; cell], with E[Z; Z <= z] = Phi(x - mu)
    up = xp.where(narrow, half * moment,
                  _cdf_differences(edges - mu) / width - index * probs)
    up = computed_once(xp.clip(up, 0.0, probs))  # read twice, once shifted
    return probs - up + xp.concatenate([xp.zeros(1), up[:-1]]), relative, xp.zeros(())


def _spectrum(law):
    """The real FFT of a lattice law's masses, zero-padded to twice their length."""
    xp = array_module(law[0])
    return xp.fft.rfft(law[0], 2 * law[0].shape[0])


def _product(a, b, a_spectrum=None, b_spectrum=None):
    """The first ``size`` points of the linear convolution of two lattice laws, clipped at zero
    (their spectra, :func:`_spectrum`, may be passed when already computed). A lattice law is
    (masses, relative, absolute): each computed mass is within relative times the true one plus
    absolute of it; a product adds the factors' levels and the FFT's round-off
    (:func:`pldjax.kernels.compose.fft_roundoff`) to the absolute level."""
    a_spectrum = _spectrum(a) if a_spectrum is None else a_spectrum
    b_spectrum = _spectrum(b) if b_spectrum is None else b_spectrum
    (a, a_relative, a_absolute), (b, b_relative, b_absolute) = a, b
    xp = array_module(a)
    size = a.shape[0]
    raw = xp.fft.irfft(a_spectrum * b_spectrum, 2 * size)
    relative = a_relative + b_relative + a_relative * b_relative
    absolute = (1.0 + relative) * (a_absolute + b_absolute) + fft_roundoff(raw)
    return xp.maximum(raw[:size], 0.0), relative, absolute


def _power(law, count):
    """The ``count``-fold convolution (``count`` >= 0, traced, or in NumPy a number) of a lattice
    law, by repeated squaring (each power's spectrum computed once, for its product and its
    square; the first factor taken as it is, not multiplied into the identity)."""
    if array_module(law[0]) is np:
        return _power_on_host(law, int(count))
    identity = (jnp.zeros_like(law[0]).at[0].set(1.0), jnp.zeros(()), jnp.zeros(()))

    def step(carry):
        left, started, result, base = carry
        odd, squared = left % 2 == 1, left // 2 > 0
        spectrum = jax.lax.cond((odd & started) | squared, _spectrum,
                                lambda b: jnp.zeros(b[0].shape[0] + 1, jnp.complex128), base)
        result = jax.lax.cond(
            odd, lambda r: jax.lax.cond(started, lambda: _product(r, base, b_spectrum=spectrum),
                                        lambda: base),
            lambda r: r, result)
        base = jax.lax.cond(squared, lambda b: _product(b, b, spectrum, spectrum),
                            lambda b: b, base)
        return left // 2, started | odd, result, base

    carry = (jnp.asarray(count, jnp.int64), jnp.asarray(False), identity, law)
    return jax.lax.while_loop(lambda c: c[0] > 0, step, carry)[2]


def _power_on_host(law, count: int):
    """:func:`_power` of a NumPy law: the squarings in this thread and each product of the
    result with a power in a :func:`~pldjax.core.compilation.side_thread`, one after another, as
    soon as that power's spectrum is known (NumPy's FFTs release the GIL). The same operations
    as one after another, to the same values: 999 terms of 2^21 points, 33 FFTs of 2^22 points
    of which 19 on the squarings' path, in 3.9-4.1 s against 4.3-5.0 s on two cores (two FFTs
    at once share the memory's bandwidth)."""
    if count == 0:
        identity = np.zeros_like(law[0])
        identity[0] = 1.0
        return identity, np.float64(0.0), np.float64(0.0)
    with side_thread("pldjax-lattice", law[0].shape[0] >= _SIDE_THREAD_POINTS) as side:
        left, result = count, None  # the result: the first power taken, then a future
        while left > 0:
            odd, squared = left % 2 == 1, left // 2 > 0
            spectrum = _spectrum(law) if (odd and result is not None) or squared else None
            if odd:
                result = law if result is None else side.submit(_product_of, result, law, spectrum)
            if squared:
                law = _product(law, law, spectrum, spectrum)
            left //= 2
        return result.result() if isinstance(result, Future) else result


def _product_of(result, law, spectrum):
    """:func:`_product` of a result (a law, or a future of one) and a law of the given
    spectrum."""
    return _product(result.result() if isinstance(result, Future) else result, law,
                    b_spectrum=spectrum)


@kernel_jit(static_argnames=("size", "pessimistic", "logarithmic"))
def _lattice_laws(mu, steps, selected, width, scale, *, size: int, pessimistic: bool,
                  logarithmic: bool):
    """The lattice laws under P and under Q of the sum of ``steps`` terms Z / width (or, when
    ``logarithmic``, log(1 + scale Z) / width) of which ``selected`` have P's law: pessimistic,
    the spread terms' (S', ``selected`` = 1), P's law being S' times Q's, the convolution of the
    rest with one size-biased term (its mass at j times j width, so that the FFT's round-off is
    relative to P's own masses); optimistic, the floored terms' (T), P's ``selected`` terms
    tilted."""
    scale = scale if logarithmic else None
    plain = _cell_masses(mu, width, size, spread=pessimistic, tilted=False, scale=scale)
    if pessimistic:
        masses, relative, absolute = plain
        moved = (masses * array_module(masses).arange(size) * width, relative, absolute)
    else:
        moved = _cell_masses(mu, width, size, spread=False, tilted=True, scale=scale)
    rest = _power(plain, steps - selected)
    rest_spectrum = _spectrum(rest)
    if array_module(rest[0]) is np:  # P's and Q's laws side by side
        with side_thread("pldjax-lattice", size >= _SIDE_THREAD_POINTS) as side:
            p_law = side.submit(lambda: _product(rest, _power(moved, selected), rest_spectrum))
            q_law = _product(rest, _power(plain, selected), rest_spectrum)
            return p_law.result(), q_law
    return (_product(rest, _power(moved, selected), rest_spectrum),
            _product(rest, _power(plain, selected), rest_spectrum))


def _points(top: float, wanted: float) -> tuple[float, int]:
    """(spacing, points) of a lattice from 0 to ``top`` at about the ``wanted`` spacing (a power
    of two of points from MIN_LATTICE to MAX_LATTICE: coarser where more would be needed)."""
    size = int(np.clip(grid_lib.next_pow2(math.ceil(top / wanted)), MIN_LATTICE, MAX_LATTICE))
    return top / size, size


def _sized(top: float, wanted: float) -> tuple[float, int] | None:
    """:func:`_points`, or None where the lattice would be _MAX_COARSENING times coarser than
    ``wanted`` or more."""
    return None if top / wanted > _MAX_COARSENING * MAX_LATTICE else _points(top, wanted)


def _aimed_spacing(mu: float, steps: int) -> float:
    """The spacing h of S's lattice that _RESOLUTION aims at (S's standard deviation under Q
    over _RESOLUTION sqrt(steps))."""
    return math.sqrt(math.expm1(mu * mu) / steps) / (_RESOLUTION * math.sqrt(steps))


def _lattice(mu: float, steps: int, selected: int,
             quantiles: tuple[float, ...] = _TAIL_QUANTILES) -> tuple[float, int] | None:
    """(spacing h, number of points) of the lattice of S for ``steps`` terms of which
    ``selected`` are tilted under P; None where no lattice resolves S (see _MAX_COARSENING).
    Where S's tail is heavy (small sigma, few steps) the lattice's top reaches a lower quantile
    of it (the first of ``quantiles`` that fits): more mass beyond, which the PLDs put on their
    safe side."""
    if mu > _MAX_SHIFT:
        return None
    spread_q = math.sqrt(math.expm1(mu * mu) / steps)
    tilted_var = math.exp(2 * mu * mu) * math.expm1(mu * mu)
    spread_p = math.sqrt(selected * tilted_var + (steps - selected) * math.expm1(mu * mu)) / steps
    bulk = 1.0 + selected * math.expm1(mu * mu) / steps + _BULK_SPREADS * max(spread_p, spread_q)
    wanted = _aimed_spacing(mu, steps)
    for quantile in quantiles:
        lattice = _sized(bulk + math.exp(0.5 * mu * mu + quantile * mu) / steps, wanted)
        if lattice is not None:
            return lattice
    return None


def _log_moments(mu: float, scale: float, tilted: bool) -> tuple[float, float]:
    """Mean and variance of log(1 + scale Z), log Z ~ N(-+mu^2 / 2, mu^2), by Gauss-Hermite
    quadrature (the function is smooth and grows linearly in log Z: 64 nodes resolve it)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(64)
    values = np.log1p(scale * np.exp(mu * nodes + (0.5 if tilted else -0.5) * mu * mu))
    weights = weights / weights.sum()
    mean = float(weights @ values)
    return mean, float(weights @ (values - mean) ** 2)


def _log_lattice(mu: float, steps: int, selected: int, scale: float) -> tuple[float, int] | None:
    """(spacing h, number of points) of the lattice of G = sum_i log(1 + scale Z_i), as
    :func:`_lattice` for S: its top covers G's bulk under P and one tilted term's tail, its
    spacing is a term's standard deviation under Q over _RESOLUTION."""
    if mu > _MAX_SHIFT:
        return None
    plain_mean, plain_var = _log_moments(mu, scale, False)
    tilted_mean, tilted_var = _log_moments(mu, scale, True)
    mean_p = (steps - selected) * plain_mean + selected * tilted_mean
    spread = math.sqrt(max((steps - selected) * plain_var + selected * tilted_var,
                           steps * plain_var))
    bulk = max(mean_p, steps * plain_mean) + _BULK_SPREADS * spread
    wanted = math.sqrt(plain_var) / _RESOLUTION
    tail = math.log1p(scale * math.exp(0.5 * mu * mu + _TAIL_QUANTILES[0] * mu))
    return _sized(bulk + tail, wanted)


def _bulk_lattice(mu: float, steps: int) -> tuple[float, int]:
    """(spacing, number of points) of a lattice of S under Q that reaches only its bulk (mean 1
    plus _BULK_SPREADS standard deviations): the add direction's losses -log S of the values
    beyond are below -log(top), where they are rounded up to. Its spacing h is the aimed one,
    or finer where S' = 0 (a loss of +inf in the add direction) could otherwise hold more than
    _ZERO_MASS of Q-mass: that needs every spread term at 0, so every Z_i below t h, whose
    probability is P(Z < t h)^t; h is held where that is _ZERO_MASS. At small sigma most Z are
    far below their mean 1 (the median is e^{-mu^2 / 2}), and at the aimed spacing S' = 0 held
    0.14 of Q-mass at sigma 0.35 and 10 steps (the add direction then fell back to the Gaussian
    bound: 10 of 100 steps read 68.89 at delta 1e-5, 56.08 with this spacing)."""
    top = 2.0 + _BULK_SPREADS * math.sqrt(math.expm1(mu * mu) / steps)
    # P(Z < t h) = 1 - p: log(t h) = -mu^2 / 2 + mu Phi^-1(1 - p) = -mu^2 / 2 - mu Phi^-1(p)
    below = -math.expm1(math.log(_ZERO_MASS) / steps)
    zero_free = (math.exp(-0.5 * mu * mu - mu * NormalDist().inv_cdf(below)) / steps
                 if below > 0.0 else math.inf)
    return _points(top, min(_aimed_spacing(mu, steps), zero_free))


def _default_step(mu: float, steps: int, selected: int) -> float:
    """The grid step (nats) of the losses: the largest power of two at most the spread of one
    epoch's loss (about sqrt(selected log(1 + (e^{mu^2} - 1) / (steps / selected)))) over
    2^STEP_FRACTION_LOG2, as for the other mechanisms."""
    block = max(steps // selected, 1)
    spread = math.sqrt(selected * math.log1p(math.expm1(min(mu * mu, 700.0)) / block))
    return float(grid_lib.fine_step(np.float64(spread)))


def _q_mass_held_to_one(pld: PLD) -> PLD:
    """A pessimistic PLD whose Q mass, sum p e^-z, exceeds 1 (by the slack of a lattice's upper
    bounds and of the compositions' round-off charges: 2e-9 to 2e-7), with mass moved in each
    direction from its lowest losses up to its highest grid point at or below loss 0 until it
    does not. A move up only raises the curve, at losses below that point (delta(eps >= 0) is
    unchanged where it is loss 0), so the PLD stays an upper bound, and it becomes a pair's (a
    filter's query must be one)."""
    def held(d: PLD) -> PLD:
        probs = _held_probs(np.asarray(d.probs, np.float64), int(d.offset), float(d.step))
        return unchecked_pld(probs, np.float64(d.inf_mass), np.int64(d.offset),
                             np.float64(d.step), True)

    return pld.map_directions(held)


def _held_probs(probs: np.ndarray, offset: int, step: float) -> np.ndarray:
    """The masses of one direction of :func:`_q_mass_held_to_one`."""
    z = (offset + np.arange(len(probs))) * step
    below = np.nonzero(z <= 0)[0]
    excess = math.expm1(float(log_q_mass(probs, offset, step, np)))
    if not excess > 0 or len(below) < 2:
        return probs
    target = below[-1]
    # the Q mass each bin removes moved whole, p (e^-z - e^-z_target): 0 where p is 0, inf past
    # float64 (that bin and the ones above then stay)
    held = probs[:target] > 0
    with np.errstate(over="ignore", under="ignore", divide="ignore"):
        gain = np.where(held, np.exp(np.log(np.where(held, probs[:target], 1.0)) - z[:target]),
                        0.0) - probs[:target] * math.exp(-z[target])
    reached = np.cumsum(gain)
    whole = int(np.searchsorted(reached, excess))  # bins [0, whole) move whole
    if whole == target:
        return probs  # not enough below: left as it is
    moved = probs.copy()
    part = probs[whole] * (excess - (reached[whole - 1] if whole else 0.0)) / gain[whole]
    moved[:whole] = 0.0
    moved[whole] -= part
    moved[target] += exact_sum(probs[:whole]) + part
    return moved


def _bounds(law) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) bounds on the true masses of a lattice law (:func:`_product`)."""
    masses, relative, absolute = (np.asarray(part, np.float64) for part in law)
    return (np.maximum(masses - absolute, 0.0) / (1.0 + relative),
            (masses + absolute) / (1.0 - relative))


def _laws(mu: float, steps: int, selected: int, pessimistic: bool, lattice=None,
          scale: float | None = None):
    """((lower, upper) bounds on P's lattice law, the same for Q's, the lattice's points) for
    :func:`_lattice_laws`, on ``lattice`` (spacing, points; default :func:`_lattice`'s): of S,
    or with a ``scale`` c of G = sum_i log(1 + c Z_i) (:func:`_log_lattice`'s)."""
    spacing, size = lattice or _lattice(mu, steps, selected)
    width = steps * spacing if scale is None else spacing
    args = (np.float64(mu), np.int64(steps), np.int64(selected), np.float64(width),
            np.float64(scale or 0.0))
    options = dict(size=size, pessimistic=pessimistic, logarithmic=scale is not None)
    if jax.default_backend() == "cpu":  # NumPy as fast as the program: nothing to rent or buy
        on_host = host_work.budget > 0
    else:
        # its FFTs' points, 2 size (3 log2(steps) + 2), weighed as the host work's grid points
        # (about 5 million a second): an eighth
        work = size * (3 * int(steps).bit_length() + 2) // 4
        on_host = host_work.claim(work, ("random allocation lattice", *options.items()),
                                  HOST_LATTICE_POINTS)
    if on_host:
        with np.errstate(all="ignore"):  # log(0) = -inf at the lattice's 0, as in XLA
            laws = _lattice_laws.__wrapped__(*args, **options)
    else:
        laws = _lattice_laws(*args, **options)
    return *(_bounds(law) for law in laws), spacing * np.arange(size, dtype=np.float64)


def _twice_as_fine(lattice, than) -> bool:
    """Whether a lattice (spacing, points) is at least twice as fine as ``than``: worth
    reading one selection's bounds on it too (:func:`_one_selection`, :func:`_bulk_resolved`)."""
    return 2.0 * lattice[0] <= than[0]


def _remove_direction(mu: float, steps: int, step: float, lattice, laws=None) -> PLD | None:
    """One selection's pessimistic remove direction on ``lattice`` (spacing, points): P'-mass at
    log s, the P'-mass beyond the lattice at +inf (module docstring). ``laws``: :func:`_laws`'s
    on that lattice, where computed before. None where its losses fit no window
    (:func:`pldjax.mechanisms.atoms.pld_from_atoms`)."""
    (p_low, p_high), _, s = laws or _laws(mu, steps, 1, True, lattice)
    return pld_from_atoms(np.log(s[1:]), p_high[1:], max(1.0 - exact_sum(p_low), 0.0), step, True)


def _one_selection(mu: float, steps: int, step: float) -> PLD | None:
    """The pessimistic PLD (both directions) of one selection among ``steps`` (module
    docstring: the spread lattice law of S and the pair it defines), or None where a direction's
    losses fit no window (:func:`pldjax.mechanisms.atoms.pld_from_atoms`).

    The add direction reads Q's law on a lattice that reaches only S's bulk
    (:func:`_bulk_lattice`). The remove direction reads P's law on one that reaches S's tail
    (:func:`_lattice`). Where S's tail is heavy (sigma below about 0.7) that one reaches 1e-16
    of the tail only at a spacing hundreds of times coarser than aimed, and its spread widens
    the bulk of the curve (sigma 0.5, 1 of 10 steps: delta(2) 0.108 against a lower bound's
    0.067). There, where they are at least twice as fine, the remove direction is also read on
    a lattice that resolves S but reaches less of its tail (the first of _FINE_QUANTILES at
    which it does, or the last: 1e-9 to 3e-5 of P-mass beyond, at +inf) and on the bulk one
    (more mass at +inf, finer still). All of them dominate the pair, and so does their meet
    (:func:`_meet`, to the tail-reaching lattice's end): the finer lattices' curves below, the
    first one's in the tail."""
    bulk = _bulk_lattice(mu, steps)
    bulk_laws = _laws(mu, steps, 1, True, bulk)
    _, (q_low, q_high), s = bulk_laws
    # add: Q'-mass at -log s, the mass at s = 0 at +inf, the mass beyond the lattice at -log top
    top = s[-1] + s[1]
    beyond = max(1.0 - exact_sum(q_low), 0.0)
    add = pld_from_atoms(np.append(-np.log(s[1:]), -math.log(top)), np.append(q_high[1:], beyond),
                  q_high[0], step, True)
    coarse = _lattice(mu, steps, 1)
    remove = _remove_direction(mu, steps, step, coarse)
    if add is None or remove is None:
        return None
    pld = PLD.from_directions(remove, add)
    fine = None
    for quantile in _FINE_QUANTILES:
        fine = _lattice(mu, steps, 1, (quantile,))
        if fine is not None and fine[0] <= 2.0 * _aimed_spacing(mu, steps):
            break
    finer = []
    if fine is not None and _twice_as_fine(fine, coarse):
        finer.append((fine, None))
    if _twice_as_fine(bulk, coarse):
        finer.append((bulk, bulk_laws))
    for lattice, laws in finer:
        candidate = _remove_direction(mu, steps, step, lattice, laws)
        met = (None if candidate is None
               else _meet(pld, PLD.from_directions(candidate, add), step, to_last_end=True))
        pld = pld if met is None else met
    return pld


def _bulk_resolved(statistic: PLD, mu: float, steps: int, step: float, lattice) -> PLD:
    """One selection's optimistic PLD (:func:`_statistic` on ``lattice``, :func:`_lattice`'s)
    joined with the statistic on the add direction's lattice (:func:`_bulk_lattice`), where that
    is at least twice as fine. Where S's tail is heavy (sigma below about 0.7) the first lattice
    is hundreds of times coarser than aimed and floors most Z to 0, where both laws hold most of
    their mass: the add direction read nothing (sigma 0.5, 1 of 10 steps: epsilon(1e-5) 0.19
    against an upper bound's 3.57). Each statistic is a function of the output (the finer one's
    values beyond its lattice merged into its last point), so both curves are below the pair's,
    and so is their join (:func:`_join`)."""
    bulk = _bulk_lattice(mu, steps)
    if not _twice_as_fine(bulk, lattice):
        return statistic
    finer = _statistic(mu, steps, 1, step, bulk, None)
    return statistic if finer is None else _join(statistic, finer)


def _statistic(mu: float, steps: int, selected: int, step: float, lattice,
               scale: float | None) -> PLD | None:
    """The optimistic PLD (both directions): the pair of the lattice statistic T's laws on
    ``lattice`` (module docstring; with a ``scale``, the logarithmic statistic), T beyond the
    lattice merged into its last point. None where a direction's losses fit no window
    (:func:`pldjax.mechanisms.atoms.pld_from_atoms`)."""
    (p_low, p_high), (q_low, q_high), _ = _laws(mu, steps, selected, False, lattice, scale)
    for low, high in ((p_low, p_high), (q_low, q_high)):
        low[-1] += max(1.0 - exact_sum(high), 0.0)
        high[-1] += max(1.0 - exact_sum(low[:-1]), 0.0)
    directions = []
    for mass, other in ((p_low, q_high), (q_low, p_high)):
        kept = mass > 0
        with np.errstate(divide="ignore"):
            losses = np.log(mass[kept]) - np.log(other[kept])
        finite = np.isfinite(losses)
        directions.append(pld_from_atoms(losses[finite], mass[kept][finite],
                                  exact_sum(mass[kept][~finite]), step, False))
    return None if None in directions else PLD.from_directions(*directions)


def _gaussian_bound(mu: float, steps: int, selected: int, pessimistic: bool,
                    grid: Grid | None) -> PLD:
    """The Gaussian bounds, each exact when ``selected`` = ``steps``: pessimistic, the Gaussian
    of shift mu sqrt(selected) (the adversary also told which steps hold the record: the
    random-allocation pair is a mixture of these, so by joint convexity it is dominated);
    optimistic, the Gaussian of shift selected mu / sqrt(steps) (the adversary looks only at the
    sum of the outputs, a post-processing)."""
    from pldjax.mechanisms.events import privacy_loss
    from pldjax.mechanisms.named import identity
    from pldjax.mechanisms.noise import Gaussian

    shift = mu * math.sqrt(selected) if pessimistic else selected * mu / math.sqrt(steps)
    if shift == 0.0:
        return identity(pessimistic=pessimistic)
    return privacy_loss(Gaussian(1.0 / shift), pessimistic=pessimistic, grid=grid)


def _curve_at(pld: PLD, z: np.ndarray) -> np.ndarray:
    """delta(z) of one direction of a PLD (NumPy, on the host; z in nats, any real)."""
    return delta_kernel(*(np.asarray(part) for part in
                          (pld.probs, pld.inf_mass, pld.offset, pld.step)),
                        z, pessimistic=bool(pld.pessimistic))


def _window_start(pld: PLD) -> float:
    """The loss (nats) of one direction's first grid point."""
    return float(pld.offset) * float(pld.step)


def _window_end(pld: PLD) -> float:
    """The loss (nats) one grid step past one direction's last grid point."""
    return (float(pld.offset) + pld.probs.shape[-1]) * float(pld.step)


def _direction_pairs(lattice: PLD, gaussian: PLD) -> list[tuple[PLD, PLD]]:
    """Each direction of a two-direction PLD beside the same direction of a Gaussian bound (one
    direction, both when it is symmetric)."""
    symmetric = gaussian.directions() * (2 // len(gaussian.directions()))
    return list(zip(lattice.directions(), symmetric, strict=True))


def _meet(lattice: PLD, gaussian: PLD, step: float, *, to_last_end: bool = False) -> PLD | None:
    """A pessimistic PLD (both directions) below both of two that dominate one pair: where the
    lattice's round-off bounds (about steps times 1e-13 of mass spread over its points) outweigh
    the tail, the Gaussian bound's curve is the lower one. The pair's curve is convex in e^eps
    and below both curves, so below the lower convex hull of their minimum, taken at the grid
    points and joined by chords: connect-the-dots of that hull dominates the pair
    (:func:`pldjax.mechanisms.named.from_privacy_curve`). Its window ends where the first of the
    two ends, or ``to_last_end`` the last (beyond its window a curve is its +inf atom; the
    hull's value at the end becomes the result's), and starts where both have begun; its
    step is ``step``, or the power of two times it (at most 2^MOST_DOUBLINGS) on which that
    window holds at most MAX_MECHANISM_SIZE points (the window's bottom, raised to fit instead,
    moved the losses of a one-step allocation of 10^7 steps up by 9.8 nats, twice the Gaussian
    bound's epsilon). None where that window is empty (one PLD's window lies wholly above the
    other's end) or no such step fits it."""
    from pldjax.mechanisms.named import from_privacy_curve

    pairs = _direction_pairs(lattice, gaussian)
    end = max if to_last_end else min
    top = max(end(_window_end(a), _window_end(b)) for a, b in pairs)
    bottom = max(min(_window_start(a) for a, _ in pairs), min(_window_start(b) for _, b in pairs))
    if top <= bottom:
        return None
    step = doubled_until(step, lambda h: top - bottom <= (grid_lib.MAX_MECHANISM_SIZE - 2) * h)
    if step is None:
        return None

    def hull_of_minimum(a: PLD, b: PLD):
        def curve(z):
            # at least 1 - e^z, as every privacy curve: a lattice's masses are upper bounds,
            # whose Q mass (sum p e^-z) can exceed 1 by their round-off, and its curve then dips
            # below 1 - e^z at negative losses (by 6.5e-9 at sigma 1000, 10 of 10^4 steps)
            lower = np.maximum(np.minimum(_curve_at(a, z), _curve_at(b, z)), -np.expm1(z))
            return np.clip(lower_hull_at(np.exp(z - z[-1]), lower), 0.0, 1.0)
        return curve

    forward, backward = (hull_of_minimum(a, b) for a, b in pairs)
    return from_privacy_curve(forward, epsilon_min=bottom, epsilon_max=top, step=step,
                              reverse=backward)


def _join(statistic: PLD, gaussian: PLD) -> PLD:
    """An optimistic PLD (both directions) whose curve is at least either of two optimistic ones
    of one pair at the points of the finer grid, except where the two curves cross: on a grid
    interval where they do, both ends are held to one curve (the one whose line costs the other
    end less). One of the two where its curve is at or above the other's throughout (both
    directions), and ``statistic`` alone where the grids do not nest or their union is wider
    than MAX_MECHANISM_SIZE points. Each curve is piecewise linear in e^eps with kinks at its grid
    points, so on a common grid the interpolation of these values lies below the larger of the
    two on every interval (below one curve's line where they cross); the lower convex hull of
    the values lies below that interpolation and is a privacy curve. Its PLD's curve is thus
    below the larger of two curves that the pair's curve is above: the pair dominates it."""
    steps = [float(pld.step) for pld in (statistic, gaussian)]
    step, coarse = min(steps), max(steps)
    ratio = coarse / step
    if ratio != 2.0 ** round(math.log2(ratio)):
        return statistic
    pairs = _direction_pairs(statistic, gaussian)
    # from the lowest grid point of either (below, both curves are linear in e^eps from their
    # total mass at 0), or _HULL_NATS below the top where that is higher (P-masses at losses
    # below that are at most e^-_HULL_NATS, and e^eps would underflow), to one past the highest
    # (where both curves are their +inf atoms, constant above)
    last = max(_window_end(pld) for pair in pairs for pld in pair)
    first = max(min(_window_start(pld) for pair in pairs for pld in pair),
                last - step * math.floor(_HULL_NATS / step))
    size = round((last - first) / step) + 1
    if size > grid_lib.MAX_MECHANISM_SIZE:
        return statistic
    z = first + step * np.arange(size)
    curves = [[_curve_at(pld, z) for pld in pair] for pair in pairs]
    for index, member in enumerate((statistic, gaussian)):  # one above the other: that one
        if all(np.all(pair[index] >= pair[1 - index]) for pair in curves):
            return member
    joined = []
    for (a, b), pair in zip(curves, pairs, strict=True):
        # on an interval where the curves cross, both ends are held to one curve's line, the
        # one that costs the other end less
        sign = np.sign(a - b)
        crossing = sign[:-1] * sign[1:] < 0
        below_a = np.maximum(b - a, 0.0)
        below_b = np.maximum(a - b, 0.0)
        line = np.where(below_a[:-1] + below_a[1:] <= below_b[:-1] + below_b[1:], 0, 1)
        chosen = np.where(line == 0, a[:-1], b[:-1]), np.where(line == 0, a[1:], b[1:])
        values = np.maximum(a, b)
        values[:-1] = np.where(crossing, np.minimum(values[:-1], chosen[0]), values[:-1])
        values[1:] = np.where(crossing, np.minimum(values[1:], chosen[1]), values[1:])
        curve = np.clip(lower_hull_at(np.exp(z - z[-1]), values), 0.0, 1.0)
        total = max(float(np.sum(pld.probs) + pld.inf_mass) for pld in pair)
        probs, inf_mass = masses_from_curve(curve, step, below=max(1.0 - total, 0.0),
                                            pessimistic=False)
        joined.append(from_rows(probs, np.float64(inf_mass), np.int64(round(first / step)),
                                np.float64(step), (), False))
    return PLD.from_directions(*joined)


@float64
def random_allocation_pld(noise, steps: int, selected: int, *, pessimistic: bool,
                          grid: Grid | None) -> PLD:
    """The PLD (both directions) of one epoch of random allocation of ``selected`` out of
    ``steps`` steps, each a Gaussian mechanism ``noise`` (:class:`pldjax.mechanisms.noise.Gaussian`),
    under add/remove or zero-out (the same pair); pessimistic (an upper bound) or optimistic (a
    lower bound). ``grid``: its ``step`` (nats) rounds the losses (default: a power of two, the
    loss's spread / 64); its other fields are not used."""
    _, (mu,) = noise.pair(Neighboring.ADD_REMOVE, pessimistic)
    mu = float(mu)
    step = (grid or Grid()).step or _default_step(mu, steps, selected)
    if selected == steps or mu == 0.0:
        return _gaussian_bound(mu, steps, selected, pessimistic, grid)
    if not pessimistic:
        scale = None if selected == 1 else selected / (steps - selected)
        lattice = (_lattice(mu, steps, selected) if scale is None
                   else _log_lattice(mu, steps, selected, scale))
        if lattice is None:
            return _gaussian_bound(mu, steps, selected, pessimistic, grid)
        statistic = _statistic(mu, steps, selected, step, lattice, scale)
        if statistic is None:
            return _gaussian_bound(mu, steps, selected, pessimistic, grid)
        if scale is None:  # one selection: the statistic is the likelihood ratio, on a lattice
            return _bulk_resolved(statistic, mu, steps, step, lattice)
        return _join(statistic, _gaussian_bound(mu, steps, selected, pessimistic, grid))
    block, longer = divmod(steps, selected)
    parts = []
    for size, count in ((block, selected - longer), (block + 1, longer)):
        if count == 0:
            continue
        part = _gaussian_bound(mu, size, 1, True, grid)
        lattice = (_one_selection(mu, size, step)
                   if size > 1 and _lattice(mu, size, 1) is not None else None)
        met = None if lattice is None else _meet(lattice, part, step, to_last_end=True)
        part = part if met is None else met
        parts.append(part if count == 1 else part.self_compose(count))
    epoch = parts[0] if len(parts) == 1 else parts[0].compose(parts[1])
    if selected == 1:  # its one block has met this Gaussian bound already
        return _q_mass_held_to_one(epoch)
    # the blocks' k-fold composition, each fold rounded up on its grid, can end above the
    # Gaussian bound where k is large (sigma 1, 5 x 10^5 of 10^6 steps: epsilon 1.2e6 against
    # its 2.5e5); both dominate the pair, so the lower (or their meet) does
    gaussian = _gaussian_bound(mu, steps, selected, True, grid)
    below = _below(gaussian, epoch)
    crossing = np.any(below) and not np.all(below) and len(epoch.directions()) == 2
    met = _meet(epoch, gaussian, step) if crossing else None
    if met is not None:
        return _q_mass_held_to_one(met)
    return gaussian if np.mean(below) > 0.5 else _q_mass_held_to_one(epoch)


#: Losses at which :func:`_below` compares two curves.
_COMPARED_POINTS = 64


def _below(bound: PLD, pld: PLD) -> np.ndarray:
    """Where ``bound``'s curve (one symmetric direction) lies below ``pld``'s by more than
    round-off, at _COMPARED_POINTS losses across each direction's window of ``pld`` (directions x
    points, bools)."""
    out = []
    (b,) = bound.directions()
    for a in pld.directions():
        z = np.linspace(_window_start(a), _window_end(a), _COMPARED_POINTS)
        with np.errstate(under="ignore"):  # far out in a window the curves are 0 or 1 - e^z
            out.append(_curve_at(b, z) < _curve_at(a, z) * (1.0 - 1e-9))
    return np.array(out)
