"""Composition of PLDs: FFT convolution, T-fold self-composition in one FFT power, truncation.

Kernels (pure, jit-able; unbatched, vmapped over batch axes by the API, except the ``*_rows``
ones, which take a leading axis of rows and decide some things for the batch as a whole):

* :func:`convolve_kernel` -- the exact linear convolution of two PMFs (zero-padded real FFT).
* :func:`self_compose_rows` -- the count-fold convolution as one pointwise power of a real FFT of
  the window's size: the result is the true distribution folded modulo the window, so the window is
  placed by Chernoff bounds on the sum and the mass that may have been folded in from outside is
  bounded by the same Chernoff bounds. The power is taken only on the frequencies up to the
  batch's last one whose power is not negligible (below 1e-304: at large counts, a small
  fraction); :func:`compose_wrapped_rows` does the same from PMFs already wrapped to the window.
  A row of count 1 is its PMF itself, with no FFT round-off to charge.
* :func:`truncate_kernel` -- back to a fixed number of points.
* :func:`swapped_delta_bound` -- from a composition of the pair (P, Q), an upper bound on delta of
  the pair (Q, P): for Poisson subsampling, whose add pair is the remove pair swapped, one
  composition bounds both directions.

Where mass goes: in a pessimistic PLD, mass above the window goes to the +inf atom and
mass below it into the lowest bin; mass that may be misplaced (Chernoff-bounded folding, FFT
round-off) is added to the +inf atom and the total restored to 1 by taking the surplus from the
lowest bins -- each step can only raise delta(eps). In an optimistic PLD the same slack is taken from
the highest bins and moved to the lowest -- each step can only lower delta(eps) for eps above the
window's bottom. A self-composition first scales the finite masses to 1 - inf_mass where their
total is off by round-off alone (:func:`_restored_log_mass`): the power would grow that error
count-fold. A pessimistic one scales a deficit up, an optimistic one a surplus down (left to the
power, it would be taken from the highest bins, where delta at small delta lives).

FFT round-off: every result is clipped at zero and round-off is charged on the safe side, bin by
bin. An optimistic result loses a level E in every bin: E is a safety factor times the larger of the
largest negative tap observed and the rms error of the inverse FFT (u log2(N) ||c||_2 / sqrt(N)).
A pessimistic result gains, in the r-th bin from the top of its support, what raises the charge on
its r highest bins from min((r - 1) E, S sqrt(r - 1)) to min(r E, S sqrt r), with S the same safety
factor times the larger of the error's norm u log2(N) ||c||_2 and the norm of the negative taps
(doubled, for the errors above zero): the errors on any r bins add up to at most sqrt(r) times
their norm, and delta(eps) weighs the bins above eps by weights that grow with the loss, so this
charge bounds the error of delta(eps) as long as S bounds the norm. It matters where the error is
concentrated: next to a tiny sampling probability's large atom it comes in spikes hundreds of times
the rms, so E (from the largest spike) charged to every bin of a 2^21-point window put 8e-11 on
delta where the errors on the bins above eps add up to 2e-13. This is an estimate, not a proof;
tests check pessimistic results against closed forms down to delta = 1e-12, and against
compositions in extended precision. For large counts the frequencies where P_k is close to the
total mass are computed without cancellation (:func:`_spectrum`), since the FFT's absolute error
would be multiplied by the count.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

from pldjax.core import grid as grid_lib
from pldjax.core.align import align
from pldjax.core.compilation import (
    array_module,
    cumulative_sum,
    early_exit_on_cpu,
    kernel_jit,
    map_rows,
    matmul,
    quotient,
    remainder,
)
from pldjax.core.mass import settle
from pldjax.core.pld import PLD, broadcast_rows, check_same_kind, computed_on_host, from_rows, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.special import log1p, log1p_parts
from pldjax.core.validation import check_broadcast, check_count, is_traced
from pldjax.kernels.rows import TILE, Row, TiledRows, row_of

UNIT_ROUNDOFF = 2.0**-53
#: Grid indices of a self-composition (count times an index of the PLD) must stay below this, so
#: that they and the window's placement are exact in float64.
MAX_INDEX = 2.0**53
#: Largest count of self_compose (int64; larger counts cannot even be converted to float64 safely).
MAX_COUNT = 2**63 - 1
_ROUNDOFF_SAFETY = 2.0
#: Most Newton iterates of :func:`chernoff_exponents`'s search per side, and the relative error
#: of the tangency condition at which it stops (the bound is flat in t there: the window then is
#: within about 1e-4 of the converged one's, measured; any t is sound); the search runs on a
#: coarse copy of the PMF, of about _CHERNOFF_COARSE_POINTS blocks.
_CHERNOFF_STEPS = 10
_CHERNOFF_TOLERANCE = 1e-2
_CHERNOFF_COARSE_POINTS = TILE  # a row in tiles: its blocks are of a point per tile
#: The fewest points of a block of the coarse copy (see :func:`_coarse_block`; a PMF of
#: n < 16 x 2048 points has n / 16 blocks): rows in tiles search TILE / _SMALLEST_BLOCK blocks a
#: tile whatever their size, so this sets the search's cost (a sweep's masses and window
#: placement took 25-29 ns a point with blocks of at least 4 points, 20-22 ns with 16, against
#: 22-24 ns in one program per size; 2-core CPU).
_SMALLEST_BLOCK = 16
#: PMFs of at least this many points are searched in blocks, smaller ones point by point (rows in
#: tiles must be this long).
BLOCKED_POINTS = _SMALLEST_BLOCK * _SMALLEST_BLOCK
#: Low frequencies computed without cancellation (see :func:`_spectrum`).
_ACCURATE_FREQS = 256


def fft_roundoff(raw, error_norm=None):
    """Round-off level of an inverse-FFT result ``raw``: the charge E of each of its bins (see the
    module docstring); ``error_norm``: its :func:`_error_norm` where the caller has it."""
    xp = array_module(raw)
    error_norm = _error_norm(raw) if error_norm is None else error_norm
    return _ROUNDOFF_SAFETY * xp.maximum(error_norm / math.sqrt(raw.shape[0]), -xp.min(raw))


def _error_norm(raw):
    """The modelled norm of an inverse-FFT result's error, u log2(N) ||raw||_2."""
    xp = array_module(raw)
    # the norm as a sum: NumPy's linalg.norm is a BLAS call (see pldjax.core.compilation.matmul)
    return UNIT_ROUNDOFF * math.log2(raw.shape[0]) * xp.sqrt(xp.sum(raw * raw))


def roundoff_charges(raw, first, last, pessimistic):
    """The round-off charged to each bin of an inverse-FFT result ``raw`` (one row) whose true
    mass lies on its indices ``first`` to ``last``, zero elsewhere (see the module docstring),
    and the level E: E everywhere for an optimistic result, and for a ``pessimistic`` one (a
    bool, or data) a charge that grows as the square root of the number of bins counted from the
    top of the support in the window, and never faster than E a bin."""
    xp = array_module(raw)
    size = raw.shape[0]
    error_norm = _error_norm(raw)
    level = fft_roundoff(raw, error_norm)
    negative = xp.minimum(raw, 0.0)
    norm = _ROUNDOFF_SAFETY * xp.maximum(error_norm, xp.sqrt(2.0 * xp.sum(negative * negative)))
    if xp is np:
        return _roundoff_charges_on_host(size, first, last, pessimistic, level, norm), level
    # each bin's rank from the top of the support, and one past the window (rank 0): a bin's
    # next rank down is the next bin's
    index = xp.arange(size + 1)
    rank = xp.maximum(xp.minimum(last, size - 1) - index + 1, 0).astype(xp.float64)
    charged = xp.minimum(rank * level, norm * xp.sqrt(rank))  # on the rank highest bins
    per_bin = xp.where(pessimistic, charged[:-1] - charged[1:], level)
    index = index[:-1]
    return xp.where((index >= first) & (index <= last), per_bin, 0.0), level


def _roundoff_charges_on_host(size: int, first, last, pessimistic: bool, level, norm):
    """:func:`roundoff_charges`'s charges in NumPy: the same values, computed on the bins of
    positive rank alone and written into the support's bins (no pass over index arrays)."""
    per_bin = np.zeros(size)
    lo, hi = _support_span(first, last, size)
    if lo >= hi:
        return per_bin
    if not pessimistic:
        per_bin[lo:hi] = level
        return per_bin
    ranked = int(np.clip(min(last, size - 1) + 1, 0, size))  # bins 0 .. ranked - 1
    rank = np.arange(ranked, -1, -1, dtype=np.float64)  # theirs, and 0 after them
    charged = np.minimum(rank * level, norm * np.sqrt(rank))
    np.subtract(charged[:-1], charged[1:], out=per_bin[:ranked])
    per_bin[:lo] = 0.0
    per_bin[hi:] = 0.0
    return per_bin


# -- tail bounds ----------------------------------------------------------------------------------
def chernoff_exponents(probs, offset, step, count, tail=grid_lib.TAIL_MASS,
                       rows: Row | TiledRows | None = None):
    """Chernoff exponents of the count-fold sum S of the PMF's loss Z (finite part only):
    ``(t_up, up, t_down, down)`` with ``up = count log E[e^{t Z}]`` at t = ``t_up`` and
    ``down = count log E[e^{-t Z}]`` at t = ``t_down`` (arrays of one t > 0 each, exact for this
    PMF).

    Any t > 0 gives a valid bound P(S >= a) <= e^{up - t a}; the t here aim at the bound that
    reaches ``tail`` / 2 closest to the mean: the tangency condition count (t K'(t) - K(t)) =
    log(2 / tail), whose left side increases in t (K: the cumulant generating function). A
    Newton search in log t, safeguarded by bisection, finds it (to _CHERNOFF_TOLERANCE relative,
    at most _CHERNOFF_STEPS iterates) on a coarse copy of the PMF (:func:`_coarse`: blocks of
    points, each a normal of the block's mass, mean and variance), starting at the Gaussian answer
    sqrt(2 log(2 / tail) / count) / sd; then K is evaluated on the PMF itself at the t found (one
    pass). The bound is flat in t near the tangency, so the coarse copy's t costs little.
    NumPy masses are searched in NumPy. ``rows``: the layout of ``probs`` (see
    :mod:`pldjax.kernels.rows`; None: one row); ``offset``, ``step``, ``count`` and ``tail`` are
    then row scalars, and so is each exponent (after its leading axis of one).
    """
    xp = array_module(probs)
    rows = rows or row_of(probs)
    over = rows.over_points
    z = (over(offset) + rows.position()) * over(step)
    mass = xp.maximum(rows.sum(probs), 1e-300)
    mean = rows.sum(probs * z) / mass
    sd = xp.sqrt(rows.sum(probs * (z - over(mean)) ** 2) / mass) + step
    target = xp.log(2.0 / tail)
    sides = xp.array([1.0, -1.0]).reshape((2,) + (1,) * xp.ndim(mean))
    start = xp.broadcast_to(xp.log(xp.sqrt(2.0 * target / count) / sd), sides.shape[:1] + xp.shape(sd))
    coarse_probs, coarse_z, coarse_variance, coarse = _coarse(probs, z, offset, step, rows)

    def to_coarse(values):
        return _moved(values, rows, coarse)

    t = xp.exp(_moved(_tangency_search(
        coarse_probs, coarse_z - coarse.over_points(to_coarse(mean)), coarse_variance,
        to_coarse(count), to_coarse(target), to_coarse(start), coarse), coarse, rows))
    k = _cumulant(_log(probs), over(sides) * (z - over(mean))[None], t, rows)
    exponents = count * (k + sides * t * mean)
    return t[:1], exponents[:1], t[1:], exponents[1:]


def _moved(values, source, target):
    """Row scalars of the layout ``source`` as those of ``target`` (the same rows)."""
    if isinstance(source, Row):
        return values
    return target.spread(source.per_row_values(values))


def _log(probs):
    """log of each mass, -inf where it is 0."""
    xp = array_module(probs)
    return xp.where(probs > 0, xp.log(xp.where(probs > 0, probs, 1.0)), -xp.inf)


def _coarse_block(n):
    """Points of a block of :func:`_coarse` for a PMF of n points: about
    _CHERNOFF_COARSE_POINTS blocks of at least _SMALLEST_BLOCK points, or single points (0)
    below BLOCKED_POINTS."""
    return 0 if n < BLOCKED_POINTS else max(n // _CHERNOFF_COARSE_POINTS, _SMALLEST_BLOCK)


def _coarse(probs, z, offset, step, rows):
    """The PMF (probs at the losses z, ``step`` apart) in blocks of consecutive points
    (:func:`_coarse_block`), each block given by its mass, mean and variance (or the points
    themselves, variance 0, where there are few); and the blocks' layout. Steers a search only:
    it is no bound. The moments are of the positions 0 .. block - 1 within each block, all three
    from one matrix product (a third of the time of sums over the reshaped losses)."""
    if isinstance(rows, TiledRows):
        return _coarse_tiles(probs, offset, step, rows)
    xp = array_module(probs)
    n = probs.shape[0]
    block = _coarse_block(n)
    if block == 0:
        return probs, z, xp.zeros_like(z), rows
    blocks = -(-n // block)
    p = xp.pad(probs, (0, blocks * block - n)).reshape(blocks, block)
    position = xp.arange(block, dtype=xp.float64)
    moments = matmul(p, xp.stack([xp.ones(block), position, position * position], axis=1))
    merged, z, variance = _block_moments(moments[:, 0], moments[:, 1], moments[:, 2],
                                         z[::block], step)
    return merged, z, variance, row_of(merged)


def _block_moments(merged, first, second, start, step):
    """(mass, mean loss, loss variance) of blocks from their moments: mass, and the first and
    second moments of the positions in the block, whose first loss is ``start``."""
    xp = array_module(merged)
    held = merged > 0
    safe = xp.where(held, merged, 1.0)
    mean = first / safe  # 0 for an empty block: its first point, variance 0
    variance = xp.maximum(second / safe - mean * mean, 0.0) * (step * step)
    return merged, start + mean * step, variance


def _coarse_tiles(probs, offset, step, rows: TiledRows):
    """:func:`_coarse` of rows in tiles (a row's blocks are of max(n / TILE, _SMALLEST_BLOCK)
    points, within its tiles), laid out in tiles of TILE / _SMALLEST_BLOCK blocks, as many tiles
    as ``rows`` has (a row's blocks follow each other). One branch of static shapes a block
    size, the row's taken: on a CPU a conditional, elsewhere every branch computed and the
    row's selected (see :func:`~pldjax.core.compilation.early_exit_on_cpu`; the moments are
    one product a point and branch)."""
    small = rows.tile // _SMALLEST_BLOCK

    def moments_of(block: int):
        def laid():
            position = jnp.arange(block, dtype=jnp.float64)
            weights = jnp.stack([jnp.ones(block), position, position * position], axis=1)
            moments = probs.reshape(rows.tiles, rows.tile // block, block) @ weights
            moments = jnp.moveaxis(moments, -1, 0).reshape(3, -1, small)
            return jnp.pad(moments, ((0, 0), (0, rows.tiles - moments.shape[1]), (0, 0)))
        return laid

    sizes = [_SMALLEST_BLOCK]  # up to a row on every tile
    while sizes[-1] < min(rows.tiles, rows.tile):
        sizes.append(2 * sizes[-1])
    block = jnp.maximum(rows.per_row, _SMALLEST_BLOCK)
    level = jnp.round(jnp.log2(block / _SMALLEST_BLOCK)).astype(jnp.int32)
    branches = [moments_of(size) for size in sizes]

    def every_branch(level):
        moments = branches[0]()
        for index, branch in enumerate(branches[1:], 1):
            moments = jnp.where(level == index, branch(), moments)
        return moments

    moments = early_exit_on_cpu((level,), cpu=lambda level: jax.lax.switch(level, branches),
                                elsewhere=every_branch)
    coarse = TiledRows(rows.tiles, rows.per_row * rows.tile // block, rows.rows, small)
    offset, step = (_moved(a, rows, coarse) for a in (offset, step))
    start = (offset + coarse.position() * block) * step  # each block's first loss
    return (*_block_moments(*moments, start, step), coarse)


def _cumulants(logp, y, variance, t, rows):
    """K(t), K'(t), K''(t) of each side's loss (t: each side's row scalar, y: each side's loss
    at the points of log-masses ``logp``), each point a normal of its ``variance`` (0: a point
    mass), in the layout ``rows``."""
    xp = array_module(logp)
    t = rows.over_points(t)
    w = logp[None] + t * y + 0.5 * (t * t) * variance
    top = rows.max(w)
    e = xp.exp(w - rows.over_points(top))
    slope = y + t * variance
    s0, s1 = rows.sum(e), rows.sum(e * slope)
    s2 = rows.sum(e * (slope * slope + variance))
    first = s1 / s0
    return top + xp.log(s0), first, xp.maximum(s2 / s0 - first**2, 0.0)


def _cumulant(logp, y, t, rows):
    """K(t) of each side's loss (as :func:`_cumulants`, of point masses), alone."""
    xp = array_module(logp)
    w = logp[None] + rows.over_points(t) * y
    top = rows.max(w)
    return top + xp.log(rows.sum(xp.exp(w - rows.over_points(top))))


def _tangency_search(probs, centred, variance, count, target, start, rows):
    """The Newton search of :func:`chernoff_exponents` for the loss ``centred`` (its mean
    subtracted) of the PMF ``probs`` (each point a normal of its ``variance``), from log t =
    ``start`` (one per side, up then down), in the layout ``rows``: returns log t of the best
    iterate, at most _CHERNOFF_STEPS of them. A row stops once both of its sides' conditions
    hold (its later iterates leave it as it was)."""
    xp = array_module(probs)
    logp = _log(probs)
    y = xp.array([1.0, -1.0]).reshape((2,) + (1,) * centred.ndim) * centred[None]  # each side's

    def newton(state):  # one iterate, then a safeguarded step in log t
        _, u, low, high, best, best_gap = state
        t = xp.exp(u)
        k, k1, k2 = _cumulants(logp, y, variance, t, rows)
        excess = t * k1 - k  # increasing in log t
        gap = count * excess - target
        better = xp.abs(gap) < best_gap
        best, best_gap = xp.where(better, u, best), xp.where(better, xp.abs(gap), best_gap)
        holds = xp.abs(gap) <= _CHERNOFF_TOLERANCE * target
        done = xp.all(holds, axis=0)
        low, high = xp.where(gap < 0, u, low), xp.where(gap < 0, high, u)
        # Newton on log(count excess): linear in log t for small t (excess ~ t^2 K'' / 2), and
        # far less curved than the excess itself where the loss's tail is heavy (the excess
        # then grows like an exponential of t, and Newton on it crept a few % an iterate)
        slope = t * t * k2 / xp.where(excess > 0, excess, 1.0)  # d log(excess) / d log t
        usable = (slope > 0) & (excess > 0)
        step = u + xp.clip(-(xp.log(xp.where(usable, count * excess, target)) - xp.log(target))
                           / xp.where(usable, slope, 1.0), -2.0, 2.0)
        step = xp.where(usable, step, xp.where(gap < 0, u + 2.0, u - 2.0))
        inside = (step > low) & (step < high) & xp.isfinite(step)
        bisect = xp.where(xp.isfinite(low) & xp.isfinite(high), (low + high) / 2,
                          xp.where(gap < 0, u + 2.0, u - 2.0))
        u_next = xp.where(inside, step, bisect)
        # no mass, or a side whose condition holds (while the other's does not): stay (its
        # gap's sign is round-off there, and a step from it left its bracket, a bisection away)
        u_next = xp.where(xp.isfinite(u_next) & ~holds, u_next, u)
        return done, u_next, low, high, best, best_gap

    def iterate(carry):  # a row that is done keeps its state
        i, state = carry
        return i + 1, tuple(xp.where(state[0], old, new) for old, new in zip(state, newton(state),
                                                                               strict=True))

    def until_done(carry):  # a CPU stops as soon as every row's conditions hold
        return jax.lax.while_loop(lambda c: (c[0] < _CHERNOFF_STEPS) & ~xp.all(c[1][0]), iterate,
                                  carry)

    def every_step(carry):
        return jax.lax.fori_loop(0, _CHERNOFF_STEPS, lambda _, c: iterate(c), carry)

    # bracket of the root in log t: (-inf, inf) to begin with; a loop (not unrolled): small to
    # compile; it stops once both sides' tangency conditions hold to _CHERNOFF_TOLERANCE (rows
    # beyond a tiled layout's real rows start done)
    infinite = xp.full(start.shape, xp.inf)
    done = xp.zeros(start.shape[1:], bool)
    if isinstance(rows, TiledRows):
        done = rows.spread(~rows.real())
    carry = (0, (done, start, -infinite, infinite, start, infinite))
    if xp is np:
        while carry[0] < _CHERNOFF_STEPS and not np.all(carry[1][0]):
            carry = iterate(carry)
        return carry[1][4]
    _, (*_, best, _) = early_exit_on_cpu([carry], cpu=until_done, elsewhere=every_step)
    return best


@functools.partial(export.register_namedtuple_serialization,
                   serialized_name="pldjax.kernels.compose.PMFSummary")  # an exported kernel returns it
class PMFSummary(NamedTuple):
    """What a self-composition reads of a PMF besides its wrapped masses (:func:`wrap_rows`),
    so that its kernel's shapes depend on the window's size only (:func:`pmf_summary`)."""

    mass: jax.Array  #: sum of the finite masses
    center: jax.Array  #: index (int64, from the first point) nearest the mean; 0 without mass
    first: jax.Array  #: first index holding mass (n - 1 without mass)
    last: jax.Array  #: last index holding mass (0 without mass)
    points: jax.Array  #: n, the PMF's number of points (float64)


def pmf_summary(probs, rows: Row | TiledRows | None = None) -> PMFSummary:
    """The :class:`PMFSummary` of one PMF ``probs`` (n,), or of each row of the layout ``rows``
    (see :mod:`pldjax.kernels.rows`: its row scalars)."""
    xp = array_module(probs)
    rows = rows or row_of(probs)
    n = rows.points
    index = rows.index()
    mass = rows.sum(probs)
    center = xp.round(rows.sum(probs * index) / xp.maximum(mass, 1e-300)).astype(xp.int64)
    held = probs > 0
    first = rows.min(xp.where(held, index, n - 1))
    last = rows.max(xp.where(held, index, 0))
    return PMFSummary(mass, center, first, last, rows.row_scalar(n))


def _support(summary: PMFSummary, offset, count):
    """Grid indices (first, last) of the count-fold sum's support: count times those of the
    finite masses (beyond them the sum has no mass at all)."""
    return count * (offset + summary.first), count * (offset + summary.last)


def tail_window(probs, offset, step, count, tail, exponents=None):
    """Grid indices (lo, hi) outside which the count-fold sum has at most ``tail`` mass (Chernoff),
    and never beyond its support, as integral float64 values (a huge count must not overflow an
    integer type); and the PMF's :func:`pmf_summary`."""
    exponents = exponents or chernoff_exponents(probs, offset, step, count, tail)
    summary = pmf_summary(probs)
    return (*summary_window(summary, offset, step, count, tail, exponents), summary)


def summary_window(summary: PMFSummary, offset, step, count, tail, exponents):
    """:func:`tail_window` from the PMF's summary and Chernoff exponents."""
    xp = array_module(summary.mass)
    t_up, up, t_down, down = exponents
    log_half = xp.log(tail / 2)
    a = xp.min((up - log_half) / t_up)
    b = xp.max((log_half - down) / t_down)
    first, last = _support(summary, offset, count)
    hi = xp.minimum(xp.ceil(a / step), last)
    lo = xp.maximum(xp.floor(b / step), first)
    # no finite mass (all at +inf: the bounds are -inf and +inf), or so little that its count-fold
    # power is below the tail (mass^count <= tail / 2, which any window leaves out at most; the
    # bounds then lost their precision: hi < lo) even where the composition restores a mass short
    # by its round-off (see _restored_log_mass): a one-point window at the composed centre
    restorable = summary.points * UNIT_ROUNDOFF
    empty = count * (xp.log(xp.maximum(summary.mass, 1e-300)) + restorable) <= log_half
    point = count * (offset + summary.center)
    hi, lo = xp.where(empty, point, hi), xp.where(empty, point, lo)
    return lo, hi


def tail_bounds(summary: PMFSummary, offset, step, count, lo, hi, exponents):
    """Chernoff bounds on the count-fold sum's mass above grid index hi and below index lo (0
    where that is outside its support)."""
    xp = array_module(summary.mass)
    t_up, up, t_down, down = exponents
    above = xp.exp(xp.minimum(xp.min(up - t_up * (hi + 1) * step), 0.0))
    below = xp.exp(xp.minimum(xp.min(down + t_down * (lo - 1) * step), 0.0))
    first, last = _support(summary, offset, count)
    above = xp.where(hi >= last, 0.0, above)
    below = xp.where(lo <= first, 0.0, below)
    return above, below


#: Relative round-off (in units of UNIT_ROUNDOFF) allowed for a composed +inf atom, computed with
#: a few roundings each at most half an ulp (log1p, a product, expm1; or a + b - ab).
_ATOM_ROUNDOFF = 16.0


def _safe_atom(value, pessimistic):
    """A composed +inf atom ``value`` rounded to the safe side of its round-off: up for a
    pessimistic PLD, down for an optimistic one (whose atom a rounding above the truth left above
    a delta asked for at the true atom: epsilon = inf there). ``pessimistic``: a bool, or data."""
    xp = array_module(value)
    slack = _ATOM_ROUNDOFF * UNIT_ROUNDOFF
    rounded = xp.clip(value * xp.where(pessimistic, 1.0 + slack, 1.0 - slack), 0.0, 1.0)
    return xp.where(value >= 1.0, 1.0, rounded)  # all of the mass at +inf stays there


# -- kernels --------------------------------------------------------------------------------------
def convolve_kernel(a_probs, a_inf, a_off, b_probs, b_inf, b_off, step, pessimistic):
    """Exact linear convolution of two single-direction PLDs on a common step (full length).
    Bins outside the sum of the two supports are exactly zero: the FFT's round-off is dropped
    there, and the per-bin round-off allowance is added inside only (added everywhere, it put
    3e-13 of mass above the losses of two randomized responses, more than a GDP curve's tail).
    ``pessimistic``: a bool, or data (one compiled program for both estimates). NumPy arrays
    (with a bool flag) are convolved in NumPy."""
    xp = array_module(a_probs)
    length = a_probs.shape[0] + b_probs.shape[0] - 1
    nfft = grid_lib.next_pow2(length)
    spectrum = xp.fft.rfft(a_probs, nfft) * xp.fft.rfft(b_probs, nfft)
    raw = xp.fft.irfft(spectrum, nfft)
    both = (a_inf > 0) & (b_inf > 0)  # else exact: one of them is 0
    inf_mass = xp.where(both, _safe_atom(a_inf + b_inf - a_inf * b_inf, pessimistic), a_inf + b_inf)
    a, b = pmf_summary(a_probs), pmf_summary(b_probs)
    index = xp.arange(length)
    inside = (index >= a.first + b.first) & (index <= a.last + b.last)
    charges = roundoff_charges(raw, a.first + b.first, a.last + b.last, pessimistic)[0][:length]
    probs, inf_mass = settle(xp.where(inside, xp.maximum(raw[:length], 0.0), 0.0), inf_mass,
                             charges, 0.0, pessimistic, xp)
    return probs, inf_mass, a_off + b_off


def wrap_rows(xp, probs, size: int, centers):
    """Each row of ``probs`` (rows, n) wrapped modulo ``size`` (summed over the indices equal
    modulo ``size``) and turned to start at its index ``centers`` (its :class:`PMFSummary`
    centre): (rows, size), the layout :func:`compose_wrapped_rows` takes. ``xp``: jax.numpy
    inside kernels, NumPy where the host wraps rows for a kernel whose shapes should not depend
    on n (there the turn costs a copy, not the kernel's passes of a dynamic roll)."""
    rows, n = probs.shape
    if xp is np and n <= size:
        out = np.zeros((rows, size), probs.dtype)
        for i, center in enumerate(np.asarray(centers) % size):
            out[i, :n - center] = probs[i, center:]
            out[i, size - center:] = probs[i, :center]
        return out
    if n <= size:  # zeros appended
        wrapped = xp.concatenate([probs, xp.zeros((rows, size - n), probs.dtype)], axis=1)
    else:
        wrapped = xp.pad(probs, ((0, 0), (0, (-n) % size))).reshape(rows, -1, size).sum(axis=1)
    if xp is np:
        return np.stack([np.roll(row, -center) for row, center in zip(wrapped, centers,
                                                                         strict=True)])
    return jax.vmap(jnp.roll)(wrapped, -centers)


def wrap_tiled_rows(masses, points, index, size: int, folds: int, centers):
    """:func:`wrap_rows` of the rows ``index`` of masses in tiles (tiles, TILE; row r on the
    r-th run of ceil(points / TILE) tiles, see :class:`~pldjax.kernels.rows.TiledRows`), each
    ``points`` points long (data) and at most ``folds`` times ``size`` (static): (rows, size),
    inside a kernel (one program a window size, whatever the rows' grid)."""
    flat = masses.reshape(-1)
    per_row = jnp.maximum((points + TILE - 1) // TILE, 1)
    start = index[:, None] * (per_row * TILE)
    # the PMF's index that each window point reads first (then every size points on)
    turned = (jnp.arange(size) + centers[:, None]) % size
    wrapped = jnp.zeros(turned.shape, masses.dtype)
    for fold in range(folds):
        at = turned + fold * size
        wrapped = wrapped + jnp.where(at < points,
                                      flat[jnp.minimum(start + at, flat.shape[0] - 1)], 0.0)
    return wrapped


def _spectrum(folded):
    """(rfft P, rfft S of its tail sums, total mass m, number of leading frequencies whose log
    is taken from the deviation P - m = (1 - e^{i theta}) S) of a PMF ``folded`` to its window
    (wrapped modulo its size and rotated to start at the PMF's centre).

    A count-fold power multiplies the relative error of each P_k by the count, and P_k is close
    to m wherever the PMF is narrow against the frequency's period: at large counts the low
    frequencies, which alone survive the power; at a tiny sampling probability nearly all of
    them (one bin holds all but a fraction of the mass). There the FFT's absolute error (about
    u log2 N, against |P_k - m|) would be multiplied by the count: with sigma 0.5, q 1e-6 and
    10^6 steps, an error spread over the whole window that read 2e-12 of mass, the round-off
    charged to delta 1e-9. The deviation comes from summation by parts instead, free of
    cancellation: with the folded PMF p_j (j in [-N/2, N/2), centre at 0) and its tail sums
    S_j = sum_{i >= j} p_i for j >= 1 and S_j = -sum_{i < j} p_i for j <= 0 (each summed from
    its outer end), p_j - m [j = 0] = S_j - S_{j+1} cyclically, so P_k - m =
    (1 - e^{i theta_k}) S_k with theta_k = 2 pi k / N and S_k the rfft of S. Its error is
    about |1 - e^{i theta_k}| u log2 N ||S||_2 against the FFT's u log2 N ||p||_2, so it is
    used on the frequencies where 2 sin(theta_k / 2) ||S||_2 <= ||p||_2 (a leading run: the
    factor grows with k), and on the first ``_ACCURATE_FREQS`` always. m is the total those tail
    sums imply (P_0 itself): a total taken elsewhere (before folding, in another order) differs
    from it by round-off, and the power raised that difference between P_0 and every other low
    frequency to the count, a constant spread over the whole window (sigma 0.3, q 1e-10, 10^9
    steps: 8.9e-16 of surplus gave epsilon(1e-5) = 8.07 for 0.55).
    """
    xp = array_module(folded)
    size = folded.shape[0]
    half = size // 2
    upper, lower = folded[:half], folded[half:]  # offsets 0 .. N/2 - 1 and -N/2 .. -1
    upper_tails = cumulative_sum(upper, reverse=True)  # sum_{i >= j}, from the top down
    lower_heads = cumulative_sum(lower) - lower  # sum_{-N/2 <= i < j}, from the bottom up
    if xp is np:  # in place, beside the PMF: no negated copy of the lower half, no concatenation
        both = np.empty((2, size))
        both[0] = folded
        tails = both[1]
        tails[0] = -np.sum(lower)
        tails[1:half] = upper_tails[1:]
        np.negative(lower_heads, out=tails[half:])
    else:
        tails = xp.concatenate([-xp.sum(lower)[None], upper_tails[1:], -lower_heads])
    mass = xp.sum(upper_tails[:1]) + xp.sum(lower)  # (a window of one point has no upper half)
    # 2 sin(pi k / N) ||S||_2 <= ||p||_2 up to this k (sin grows on k in [0, N / 2])
    norm, spread = xp.sqrt(xp.sum(folded * folded)), 2.0 * xp.sqrt(xp.sum(tails * tails))
    ratio = xp.where(norm >= spread, 1.0, norm / xp.maximum(spread, np.finfo(np.float64).tiny))
    reach = xp.floor(size / xp.pi * xp.arcsin(ratio))
    accurate = xp.maximum(reach.astype(xp.int64) + 1, _ACCURATE_FREQS)
    if xp is np:  # one call of two rows, which NumPy's FFT transforms side by side, to the same
        spectra = np.fft.rfft(both)  # values (98,304 points: 0.9 ms, one row alone 0.77 ms)
        return spectra[0], spectra[1], mass, accurate
    return xp.fft.rfft(folded), xp.fft.rfft(tails), mass, accurate


def _log_spectrum(spectrum, tail_spectrum, mass, accurate, *, width: int, size: int):
    """log P_k of each row's spectrum (rows, F) on its first ``width`` frequencies, the first
    ``accurate`` (one per row) from the deviation P_k - m = (1 - e^{i theta_k}) S_k
    (``tail_spectrum`` S_k and ``mass`` m, see :func:`_spectrum`) as log m + log(1 + z) with
    z = (P_k - m) / m, the others from P_k itself; one ``log`` and one ``arctan2`` a frequency.
    log(1 + z) is accurate to a few ulps where |z| < 1/2 (log|1 + z| = log1p(x (2 + x) + y^2) / 2
    for z = x + iy, by :func:`~pldjax.core.special.log1p_parts`): NumPy's complex log1p is
    log(1 + z), which drops what z holds below an ulp of 1 (the real part of
    log1p(1e-17 + 3e-17j) came out 0, of log1p(2e-13 - 1e-12j) 3e-4 off), and XLA's loses digits
    for |z| in 0.3-0.9 (2e-14 relative), while a count-fold power multiplies the error by the
    count. log|P| comes from |P|^2 (no cancellation), cheaper than XLA's complex log."""
    xp = array_module(spectrum)
    theta = (2.0 * np.pi / size) * xp.arange(width, dtype=xp.float64)
    # z = (1 - e^{i theta}) S / m, part by part
    factor = xp.stack([2.0 * xp.sin(theta / 2) ** 2, -xp.sin(theta)])
    if xp is not np:  # computed once: fused into the rows' loop, the sines took 40% of this
        factor = jax.lax.optimization_barrier(factor)
    factor_re, factor_im = factor[0], factor[1]
    tail_re, tail_im = xp.real(tail_spectrum[:, :width]), xp.imag(tail_spectrum[:, :width])
    inverse = (1.0 / mass)[:, None]
    x = (factor_re * tail_re - factor_im * tail_im) * inverse
    y = (factor_re * tail_im + factor_im * tail_re) * inverse
    re, im = xp.real(spectrum[:, :width]), xp.imag(spectrum[:, :width])
    near = xp.arange(width) < accurate[:, None]
    small = near & (x * x + y * y < 0.25)
    rounded, correction = log1p_parts(x * (2.0 + x) + y * y)
    with np.errstate(divide="ignore", invalid="ignore"):  # P = 0 (z = -1): log 0 = -inf
        modulus = 0.5 * xp.log(xp.where(small, rounded, xp.where(near, (1.0 + x) ** 2 + y * y,
                                                                  re * re + im * im)))
    real = modulus * xp.where(small, correction, 1.0) + xp.where(near, xp.log(mass)[:, None], 0.0)
    return _complex(real, xp.arctan2(xp.where(near, y, im), xp.where(near, 1.0 + x, re)))


def _powered(spectrum, tail_spectrum, mass, accurate, shift, count, turn, *, width: int,
             size: int):
    """exp(count (log P + shift)) of each row's spectrum ``P`` (rows, F) on its first ``width``
    frequencies (:func:`_log_spectrum`), zero beyond ``width`` (in NumPy left out: its inverse FFT
    pads them), and turned by ``turn`` points (each row's inverse FFT then reads as
    ``numpy.roll(raw, turn)`` would: the window's first bin first, with no pass over the window
    to move it)."""
    xp = array_module(spectrum)
    log_p = _log_spectrum(spectrum, tail_spectrum, mass, accurate, width=width,
                          size=size) + shift[:, None]
    k = xp.arange(width, dtype=xp.int64)
    scale = count[:, None]
    # the turn's phase from integers: k turn mod size is exact, an angle in [0, 2 pi)
    phase = (-2.0 * np.pi / size) * remainder(k * turn[:, None], size)
    # scaled part by part: a zero of the spectrum (log |P| = -inf) times a complex count is NaN
    powered = xp.exp(_complex(scale * log_p.real, scale * log_p.imag + phase))
    if xp is np:
        return powered
    return xp.pad(powered, ((0, 0), (0, spectrum.shape[1] - width)))


def _single_runs(raw, folded, restore, turn, once):
    """``raw`` (rows, size), each row of count 1 (``once``) replaced by its PMF ``folded``
    itself, scaled by e^``restore`` and turned by ``turn`` points as the power would: no FFT
    round-off to charge there (charged, it held one DP-SGD step's epsilon(1e-15) at 5.1 against
    the exact 3.0). A CPU turns rows only where the batch has such a row."""
    xp = array_module(raw)

    def replaced(raw, folded, restore, turn, once):
        exact = map_rows(lambda f, r, t: xp.roll(f * xp.exp(r), t))(folded, restore, turn)
        return xp.where(once[:, None], exact, raw)

    if xp is np:
        return replaced(raw, folded, restore, turn, once) if once.any() else raw
    return early_exit_on_cpu(
        (raw, folded, restore, turn, once),
        cpu=lambda *args: jax.lax.cond(jnp.any(args[-1]), replaced, lambda r, *_: r, *args),
        elsewhere=replaced)


def _complex(real, imag):
    """real + i imag, part by part (an infinite part times i would make the other part NaN)."""
    if array_module(real) is not np:
        return jax.lax.complex(real, imag)
    out = np.empty(np.broadcast_shapes(real.shape, imag.shape), np.complex128)
    out.real, out.imag = real, imag
    return out


def _restored_log_mass(summary: PMFSummary, inf_mass, pessimistic):
    """log of the factor that scales the finite masses to 1 - inf_mass, when their total is off
    by no more than the round-off of their sum (n u, relative): >= 1 for a ``pessimistic`` PMF
    (a deficit), <= 1 for an optimistic one (a surplus); any other error is left to the settle
    after the power.

    A PMF's finite masses add up to 1 - inf_mass only up to round-off, and a count-fold power
    raises their total to the count: one unit of round-off short, at count 1e6, is a deficit of
    1.1e-10 that the composition would charge to the +inf atom, i.e. to delta at every epsilon.
    Scaling every mass up instead raises every bin (delta never drops, the safe side) by the same
    relative amount the round-off left them short. An optimistic surplus left to the power would be
    taken from the highest bins, i.e. from delta at large epsilon (one ulp over 1 at count
    184,565 is 4e-11, 4% of delta = 1e-9); scaled down, it lowers every bin by the same relative
    amount.
    """
    xp = array_module(summary.mass)
    short = log1p(-inf_mass, xp) - xp.log(xp.maximum(summary.mass, 1e-300))
    allowed = summary.points * UNIT_ROUNDOFF
    return xp.where(pessimistic, xp.clip(short, 0.0, allowed), xp.clip(short, -allowed, 0.0))


def self_compose_rows(probs, inf_mass, offset, step, count, exponents=None, *,
                      size: int, tail, pessimistic):
    """The count-fold self-composition of each row of ``probs`` (rows, n) on a window of ``size``
    points (one FFT power); ``count`` and ``tail``: scalars or one per row; ``pessimistic``: a
    bool, or data.

    ``exponents``: the rows' :func:`chernoff_exponents` for ``count`` when the caller has them
    (computed here otherwise). NumPy rows (with a bool ``pessimistic``) are composed in NumPy.
    """
    xp = array_module(probs)
    rows = probs.shape[0]
    count, tail = (xp.broadcast_to(xp.asarray(a, xp.float64), (rows,)) for a in (count, tail))
    summary = map_rows(pmf_summary)(probs)
    if exponents is None:
        stand_in = xp.where((summary.mass > 0)[:, None], probs, xp.arange(probs.shape[1]) == 0)
        exponents = map_rows(chernoff_exponents)(stand_in, offset, step, count, tail)
    return compose_wrapped_rows(wrap_rows(xp, probs, size, summary.center), summary, inf_mass,
                                offset, step, count, exponents, tail=tail, pessimistic=pessimistic)


#: A frequency whose count-th power is below e^_NEGLIGIBLE_LOG (1e-304) moves no bin of the
#: inverse FFT by more than that: on a CPU the batch's power is taken up to the last one that is
#: not (elsewhere on every frequency, see :func:`early_exit_on_cpu`).
_NEGLIGIBLE_LOG = -700.0
#: The power's widths besides the full one on a CPU (fractions of the rfft's length): the
#: smallest width that holds every row's last non-negligible frequency is computed (at large
#: counts the composed PMF is wide and only its lowest frequencies survive the power: about 100
#: of 40,961 for sigma 1, q 0.01, T 1e4). One short width is as fast there as three (1/64, 1/16,
#: 1/4, measured) and compiles fewer branches (a fresh process's first call 3.9 s against 4.2 s);
#: at 1/64 rather than 1/16, the compositions of the 1,024-sigma sweep took 8% less time, those
#: of 256 random DP-SGD configurations (T from 100 to 10^5) 7% less, the same values.
_POWER_FRACTIONS = (64,)


def compose_wrapped_rows(wrapped, summary: PMFSummary, inf_mass, offset, step, count, exponents,
                         *, tail, pessimistic, swapped: bool = False):
    """:func:`self_compose_rows` of PMFs given as their masses wrapped modulo the window's size
    and turned to their centres (:func:`wrap_rows`, rows x size), their :func:`pmf_summary` and
    :func:`chernoff_exponents` (one per row, as every other argument): nothing here has the
    PMFs' own length (one compiled shape per (rows, window size), whatever the mechanisms'
    grids). Returns (probs, inf_mass, offset) per row, and with ``swapped`` (a bool) a fourth
    item, a :class:`SwappedParts` per row (what :func:`swapped_delta_bound` reads). NumPy rows
    (with a bool ``pessimistic``) are composed in NumPy, row by row."""
    xp = array_module(wrapped)
    rows, size = wrapped.shape
    count, tail = (xp.broadcast_to(xp.asarray(a, xp.float64), (rows,)) for a in (count, tail))

    def prepare(w, s, m, o, h, c, e, t):
        # a PLD with all its mass at +inf composes to itself; compute on a stand-in, keep the atom
        live = s.mass > 0
        if xp is np:  # (no pass over the window where it is live, as it nearly always is)
            folded = w if live else (np.arange(size) == 0).astype(np.float64)
        else:
            folded = xp.where(live, w, xp.arange(size) == 0)
        s = PMFSummary(*(xp.where(live, value, stand_in) for value, stand_in
                         in zip(s, (1.0, 0, 0, 0, s.points), strict=True)))
        lo, hi = summary_window(s, o, h, c, t, e)
        start = window_start(lo.astype(xp.int64), hi.astype(xp.int64), size, pessimistic)
        # the composed PMF wraps around from grid index c (o + centre) at folded's entry 0: its
        # window's first bin, ``start``, comes first after a turn by this many points
        turn = ((c * (o + s.center) - start) % size).astype(xp.int64)
        spectrum, tail_spectrum, mass, accurate = _spectrum(folded)
        shift = _restored_log_mass(s._replace(mass=mass), m, pessimistic)  # the powered total's
        magnitude = xp.real(spectrum) ** 2 + xp.imag(spectrum) ** 2
        # |P|^count e^(count shift) >= e^_NEGLIGIBLE_LOG
        kept = magnitude >= xp.exp(2.0 * (_NEGLIGIBLE_LOG / c - shift))
        if xp is np:  # the last frequency kept, found from the top
            last = np.int64(kept.size - 1 - np.argmax(kept[::-1]) if kept.any() else 0)
        else:
            last = xp.max(xp.where(kept, xp.arange(spectrum.shape[0]), 0))
        return live, s, start, turn, folded, spectrum, tail_spectrum, mass, accurate, shift, last

    (live, summary, start, turn, folded, spectrum, tail_spectrum, mass, accurate, shift,
     last) = map_rows(prepare)(wrapped, summary, inf_mass, offset, step, count, exponents, tail)
    frequencies = size // 2 + 1
    widths = sorted({max(frequencies // f, min(_ACCURATE_FREQS, frequencies))
                     for f in _POWER_FRACTIONS}
                    | {frequencies})
    needed = xp.max(last) + 1
    branch = xp.sum(xp.asarray(widths[:-1]) < needed)  # the first width >= needed
    powers = [functools.partial(_powered, width=w, size=size) for w in widths]
    args = (spectrum, tail_spectrum, mass, accurate, shift, count, turn)
    if xp is np:
        powered = powers[int(branch)](*args)
    else:
        powered = early_exit_on_cpu(  # elsewhere every frequency
            args, cpu=lambda *args: jax.lax.switch(branch, powers, *args), elsewhere=powers[-1])
    raw = _single_runs(xp.fft.irfft(powered, size), folded, shift, turn, count == 1)

    def finish(raw, live, s, start, m, o, h, c, e, w, restore):
        once = c == 1
        above, below = tail_bounds(s, o, h, c, start, start + size - 1, e)
        composed_inf = xp.where(c == 1, m, _safe_atom(-xp.expm1(c * log1p(-m, xp)), pessimistic))
        # bins beyond the sum's support hold no mass: what they read is round-off, or mass
        # folded in from outside the window (which above + below already charge)
        first, last = _support(s, o, c)
        if xp is np and once:  # no FFT round-off to charge
            clipped, per_bin, level = _supported_on_host(raw, first - start, last - start), 0.0, 0.0
        else:
            per_bin, level = roundoff_charges(raw, first - start, last - start, pessimistic)
            if xp is np:
                clipped = _supported_on_host(raw, first - start, last - start)
            else:
                index = start + xp.arange(size)
                clipped = xp.where((index >= first) & (index <= last), xp.maximum(raw, 0.0), 0.0)
                per_bin, level = xp.where(once, 0.0, per_bin), xp.where(once, 0.0, level)
        # lower bounds bin by bin: the level E of each
        lower = xp.maximum(clipped - level, 0.0) if swapped else None
        out, out_inf = settle(clipped, composed_inf, per_bin, above + below, pessimistic, xp)
        composed = (xp.where(live, out, 0.0), xp.where(live, out_inf, composed_inf), start)
        if not swapped:
            return composed
        return (*composed, SwappedParts(lower, above + below, _q_surplus(w, s, o, h, restore)))

    return map_rows(finish)(raw, live, summary, start, inf_mass, offset, step, count, exponents,
                            wrapped, shift)


def _supported_on_host(raw, first, last):
    """NumPy's masses of a composed row ``raw`` at window indices ``first`` to ``last`` (the
    sum's support) clipped at 0, zero elsewhere, as long as the window."""
    size = raw.shape[0]
    lo, hi = _support_span(first, last, size)
    clipped = np.zeros(size)
    np.maximum(raw[lo:hi], 0.0, out=clipped[lo:hi])
    return clipped


def _support_span(first, last, size: int) -> tuple[int, int]:
    """The window's slice [lo, hi) of the indices ``first`` to ``last`` (a sum's support), clipped
    to the window of ``size`` points (empty where they miss it)."""
    return tuple(int(np.clip(bound, 0, size)) for bound in (first, last + 1))


class SwappedParts(NamedTuple):
    """What a composed row tells of the other direction of its pair (the pair with P and Q
    swapped; see :func:`swapped_delta_bound`)."""

    lower: jax.Array  #: lower bounds on the window's composed masses (round-off taken off)
    folded: jax.Array  #: bound on the mass folded into the window from outside it (Chernoff)
    q_surplus: jax.Array  #: bound on one step's Q-mass above 1 (+inf where not known)


#: One step's masses are taken to be off by at most this many units of round-off each
#: (relative), in the Q-mass of :func:`swapped_delta_bound`'s pair.
STEP_ROUNDOFF = 4.0


def _q_surplus(wrapped, summary: PMFSummary, offset, step, restore):
    """A bound on how far one PMF's Q-mass sum_l e^-l p_l is above 1: its masses wrapped to a
    window and turned to their centre (:func:`wrap_rows`), scaled by e^``restore`` as the
    composition scales them, each taken to be off by STEP_ROUNDOFF units of round-off; +inf
    where the PMF is longer than the window (folded: its losses are not known)."""
    xp = array_module(wrapped)
    size = wrapped.shape[0]
    if xp is np and summary.points <= size:  # the PMF's own points alone, in its order
        center, points = int(summary.center), int(summary.points)
        masses = np.concatenate([wrapped[size - center:], wrapped[:points - center]])
        losses = (offset + np.arange(points)) * step
        weights = np.exp(-losses)
    else:  # the window's entry j holds grid index offset + centre + j, or j - size once turned
        masses, first = wrapped, offset + summary.center
        weights = xp.where(xp.arange(size) < size - summary.center,
                           falling_exponentials(first, step, size),
                           falling_exponentials(first - size, step, size))
    log_mass = xp.log(xp.sum(masses * weights)) + restore
    surplus = (xp.maximum(xp.expm1(log_mass), 0.0)
               + STEP_ROUNDOFF * (summary.points + 1.0) * UNIT_ROUNDOFF)
    return xp.where(summary.points <= size, surplus, xp.inf)


#: Points a block of :func:`falling_exponentials`.
_EXPONENTIAL_BLOCK = 128


def falling_exponentials(start, step, size: int):
    """e^-((start + j) step) for j in [0, size): the e^-loss of a window of ``size`` points from
    grid index ``start`` (step ``step``, nats). Where B = _EXPONENTIAL_BLOCK divides the size
    (and the size is at least B^2), each is the product e^-((start + b B) step) e^-(i step) for
    j = b B + i: size / B + B exponentials instead of size (they were a tenth of a composition's
    time), each within a few units of round-off of the exponential itself, whose argument's
    rounding already moves it by |loss| units."""
    xp = array_module(step, start)
    if size % _EXPONENTIAL_BLOCK or size < _EXPONENTIAL_BLOCK**2:
        return xp.exp(-((start + xp.arange(size)) * step))
    blocks = xp.exp(-((start + _EXPONENTIAL_BLOCK * xp.arange(size // _EXPONENTIAL_BLOCK))
                      * step))
    within = xp.exp(-(xp.arange(_EXPONENTIAL_BLOCK) * step))
    return (blocks[:, None] * within[None, :]).reshape(size)


def swapped_delta_bound(parts: SwappedParts, start, step, count, epsilon):
    """An upper bound on delta(epsilon) of the pair (Q, P) from a count-fold composition of the
    PLD of (P, Q) (one row; ``parts`` from :func:`compose_wrapped_rows` with ``swapped``, its
    window starting at grid index ``start``). 1 where it cannot say more.

    The composed PLD omega of (P, Q) determines the swapped pair's curve: delta_{Q||P}(eps) =
    sum_l omega(l) (e^-l - e^eps)_+ + Q(P = 0) = 1 - sum_l min(e^-l, e^eps) omega(l), where the
    pair is a pair of distributions (Q's mass sums to 1, the part where P = 0 included, as a
    pessimistic PLD's pair does: its +inf atom and everything outside its window are such
    parts). So a lower bound on the sum bounds delta from above: the window's masses less their
    FFT round-off, less the mass that may have been folded into the window (at most e^eps each),
    with the sum's own round-off; a surplus of one step's Q-mass over 1 (its round-off) is
    charged count-fold. The weights grow as e^eps at the bottom of the window, so the bound is
    loose where count x (round-off) x e^eps is not small against delta: a caller compares it
    with what it needs."""
    xp = array_module(parts.lower)
    size = parts.lower.shape[-1]
    # e^min(-loss, eps): e^-loss, and e^eps at losses below -eps
    weights = xp.where((start + xp.arange(size)) * step < -epsilon, xp.exp(epsilon),
                       falling_exponentials(start, step, size))
    weighted = xp.where(parts.lower > 0, weights * parts.lower, 0.0)
    total = xp.sum(weighted) * (1.0 - size * UNIT_ROUNDOFF)
    total = total - xp.where(parts.folded > 0, xp.exp(epsilon) * parts.folded, 0.0)
    surplus = xp.expm1(count * xp.log1p(parts.q_surplus))
    bound = 1.0 - total + surplus + 2.0 * UNIT_ROUNDOFF
    return xp.where((total <= 1.0) & (bound >= 0.0) & ~xp.isnan(bound),
                    xp.minimum(bound, 1.0), 1.0)


def truncate_kernel(probs, inf_mass, offset, *, size: int, tail, pessimistic):
    """Keep ``size`` points: the window holding all but ``tail`` mass, centred, top first;
    ``pessimistic``: a bool, or data. NumPy arrays (with a bool flag) are cut in NumPy."""
    xp = array_module(probs)
    length = probs.shape[0]
    if size >= length:
        return xp.pad(probs, (0, size - length)), inf_mass, offset
    lo_need, hi_need = _bulk(probs, tail)
    start = xp.clip(window_start(lo_need, hi_need, size, pessimistic), 0, length - size)
    if xp is np:
        kept = probs[int(start):int(start) + size]
    else:
        kept = jax.lax.dynamic_slice(probs, (start,), (size,))
    below = xp.sum(xp.where(xp.arange(length) < start, probs, 0.0))
    above = xp.sum(xp.where(xp.arange(length) >= start + size, probs, 0.0))
    ends = xp.arange(size)
    kept = (kept + xp.where(ends == 0, below, 0.0)
            + xp.where(ends == size - 1, xp.where(pessimistic, 0.0, above), 0.0))
    return kept, inf_mass + xp.where(pessimistic, above, 0.0), offset + start


def window_start(lo, hi, size: int, pessimistic):
    """First index of a ``size``-point window for the bulk [lo, hi]: centred when it fits;
    otherwise a pessimistic window keeps the top (the cut-off top goes to +inf) and an optimistic
    one keeps the bottom (the cut-off top moves down into the top bin)."""
    xp = array_module(lo)
    need = hi - lo + 1
    keep = xp.where(pessimistic, hi - size + 1, lo)
    return xp.where(need <= size, lo - quotient(xp.maximum(size - need, 0), 2), keep)


def _bulk(probs, tail):
    """First and last index of the window outside which each side holds at most tail/2 mass."""
    xp = array_module(probs)
    length = probs.shape[0]

    def first_above(running):  # of a non-decreasing sum, 0 where none is (argmax's answer):
        # counted, not jnp.argmax, whose lowering under a caller's jit with x64 off gives int32
        above = running > tail / 2
        return xp.where(xp.any(above), xp.sum(~above), 0)

    lo = first_above(cumulative_sum(probs))
    hi = length - 1 - first_above(cumulative_sum(probs[::-1]))
    return lo, xp.maximum(hi, lo)


def needed_size(probs, tail) -> jax.Array:
    """Number of points of the smallest window holding all but ``tail`` mass of a PMF."""
    lo, hi = _bulk(probs, tail)
    return hi - lo + 1


# -- API ------------------------------------------------------------------------------------------
# ``pessimistic`` is data in these kernels (PLD arrays rather than PLDs, whose flag is static):
# a pessimistic and an optimistic estimate of one shape share a compiled program
@kernel_jit
def _convolve_batch(a_probs, a_inf, a_off, b_probs, b_inf, b_off, step, pessimistic):
    kernel = functools.partial(convolve_kernel, pessimistic=pessimistic)
    return jax.vmap(kernel)(a_probs, a_inf, a_off, b_probs, b_inf, b_off, step)


@kernel_jit(static_argnames=("size",))
def _truncate_batch(probs, inf_mass, offset, tail, pessimistic, *, size: int):
    kernel = functools.partial(truncate_kernel, size=size, tail=tail, pessimistic=pessimistic)
    return jax.vmap(kernel)(probs, inf_mass, offset)


@kernel_jit(static_argnames=("size",))
def _self_compose_batch(probs, inf_mass, offset, step, count, tail, pessimistic, *, size: int):
    return self_compose_rows(probs, inf_mass, offset, step, count, size=size, tail=tail,
                             pessimistic=pessimistic)


_needed_size_batch = kernel_jit(jax.vmap(needed_size, in_axes=(0, None)))
_tail_window_batch = kernel_jit(jax.vmap(tail_window))


#: What a :class:`CompositionTooWide` tells a caller who chose the grid to change.
COARSER_GRID = "use a coarser Grid(step=...) for the mechanisms"


class CompositionTooWide(ValueError):
    """A composition that no window holds: more points than grid.MAX_SIZE (a memory guard), or
    losses float64 cannot place (MAX_INDEX grid steps, a Chernoff window below round-off). A
    ValueError; a caller with another sound answer (the adapters' Chernoff bound) catches this
    one alone. ``points``: the window's points where that was the reason (else None);
    ``automatic_step`` and ``fitting_step``: the mechanism grid step (nats) it was on, chosen
    automatically, and a coarser one on which the window would fit, where the raiser knows them
    (else None)."""

    points: int | None = None
    automatic_step: float | None = None
    fitting_step: float | None = None


def checked_size(size: int, what: str, argument: str,
                  remedy: str = COARSER_GRID) -> int:
    """``size`` if it fits grid.MAX_SIZE, else a :class:`CompositionTooWide` naming the
    ``argument`` that asked and the ``remedy``."""
    if size > grid_lib.MAX_SIZE:
        error = CompositionTooWide(
            f"{argument}: {what} needs a window of {size} grid points (more than grid.MAX_SIZE = "
            f"{grid_lib.MAX_SIZE}, a memory guard); {remedy}"
        )
        error.points = size
        raise error
    return size


def _compose_pair(a: PLD, b: PLD, size: int | None, tail: float) -> PLD:
    shape = jnp.broadcast_shapes(a.batch_shape, b.batch_shape)
    a, b = align([broadcast_rows(a, shape), broadcast_rows(b, shape)], "compose")
    fft = grid_lib.next_pow2(a.size + b.size - 1)
    if fft > 2 * grid_lib.MAX_SIZE:
        raise ValueError(
            f"compose needs an FFT of {fft} points for PLDs of {a.size} and {b.size} points (more "
            f"than 2 * grid.MAX_SIZE = {2 * grid_lib.MAX_SIZE}, a memory guard); use coarser grids"
        )
    if not is_traced((a.offset, b.offset)):
        reach = sum(float(np.max(np.abs(np.asarray(p.offset, np.float64)))) + p.size for p in (a, b))
        if reach >= MAX_INDEX:  # (the sum of int64 offsets wraps around beyond 2^63)
            raise CompositionTooWide(
                f"plds: compose would place losses {reach:.4g} grid steps from 0, beyond "
                f"MAX_INDEX = 2^53, where float64 cannot place them exactly; {COARSER_GRID}")
    if computed_on_host([a, b], fft):
        return _compose_pair_on_host(a, b, size, tail, shape)
    probs, inf_mass, offset = _convolve_batch(a.probs, a.inf_mass, a.offset, b.probs,
                                              b.inf_mass, b.offset, a.step, a.pessimistic)
    if size is None and not is_traced(probs):
        need = int(np.max(np.asarray(_needed_size_batch(probs, tail))))
        size = min(grid_lib.next_pow2(need), probs.shape[-1])
    if size is not None:
        probs, inf_mass, offset = _truncate_batch(
            probs, inf_mass, offset, tail, a.pessimistic,
            size=checked_size(size, "compose", "plds"),
        )
    return from_rows(probs, inf_mass, offset, a.step, shape, a.pessimistic)


def _compose_pair_on_host(a: PLD, b: PLD, size: int | None, tail: float, shape) -> PLD:
    """:func:`_compose_pair` of two aligned single-direction PLDs of flat rows in host memory,
    in NumPy row by row: the same kernels, no program to compile."""
    a_rows, b_rows = ([np.asarray(x) for x in (p.probs, p.inf_mass, p.offset)] for p in (a, b))
    step = np.asarray(a.step)
    with np.errstate(all="ignore"):  # the kernels' masked branches, as under jit
        rows = [convolve_kernel(*(x[i] for x in a_rows), *(x[i] for x in b_rows), step[i],
                                a.pessimistic) for i in range(step.shape[0])]
        if size is None:
            need = max(int(needed_size(probs, tail)) for probs, _, _ in rows)
            size = min(grid_lib.next_pow2(need), rows[0][0].shape[-1])
        size = checked_size(size, "compose", "plds")
        rows = [truncate_kernel(*row, size=size, tail=tail, pessimistic=a.pessimistic)
                for row in rows]
    probs, inf_mass, offset = (np.stack(column) for column in zip(*rows, strict=True))
    return from_rows(probs, inf_mass, offset, step, shape, a.pessimistic)


def _both_directions(fn, plds: Sequence[PLD]) -> PLD:
    forward = fn([p.forward for p in plds])
    if all(p.reverse is None for p in plds):
        return forward
    return PLD.from_directions(forward, fn([p.backward for p in plds]))


@float64
def compose(plds: Sequence[PLD], *, size: int | None = None) -> PLD:
    """The PLD of running all mechanisms in ``plds`` (independent, non-adaptive composition).

    Pairwise FFT convolutions, each followed by truncation to the window that holds all but
    ``grid.TAIL_MASS`` of the mass (pessimistically placed, see the module docstring). ``size``
    fixes the number of grid points of every intermediate result (under ``jit``, where the
    automatic choice cannot look at the values, each convolution otherwise keeps its full
    length), an integer in [1, grid.MAX_SIZE]; an
    automatic window is refused beyond grid.MAX_SIZE too, and so is a pair of PLDs whose
    convolution would need an FFT of more than 2 * grid.MAX_SIZE points (memory guards, each a
    ValueError). Batch axes broadcast; a pessimistic and an optimistic PLD cannot be composed.

    PLDs on different steps are aligned first (:func:`pldjax.core.align.align`), on the PLDs' own safe
    side: exactly onto the finest step when every step is an integer multiple of it (automatic
    grids use powers of two) and the refined PLDs fit grid.MAX_SIZE; otherwise onto the coarsest
    step, a pessimistic PLD by connect-the-dots (an upper bound), an optimistic one by rounding
    its losses down (a lower bound). Under ``jit`` (traced steps) onto the largest step.

    Args:
      plds: a non-empty sequence of :class:`PLD` objects, all pessimistic or all optimistic (else
        a ValueError); their batch shapes broadcast and their steps may differ (see above).
      size: None (default): each intermediate window chosen from the values; under ``jit``, where
        they cannot be read, None leaves every pairwise convolution at its full length
        (untruncated). Else grid points of every intermediate result, a whole number in
        [1, grid.MAX_SIZE].

    Returns:
      A :class:`PLD` whose batch shape is the broadcast of the members' (the one member itself
      when ``plds`` holds one), with two directions when any member has two (composed direction
      by direction). Pessimistic when the members are: an upper bound on the composition's
      delta(eps) and epsilon(delta) when each member dominates its mechanism; optimistic members
      give an optimistic result (a lower bound).
    """
    plds = list(plds)
    if not plds:
        raise ValueError("plds must contain at least one PLD")
    if not all(isinstance(p, PLD) for p in plds):
        raise ValueError("plds must be PLD objects")
    check_same_kind(plds)
    check_broadcast(**{f"plds[{i}] (batch)": np.broadcast_to(0.0, p.batch_shape)
                       for i, p in enumerate(plds)})
    if size is not None:
        size = grid_lib.check_size("size", size, minimum=1, maximum=grid_lib.MAX_SIZE)

    def fold(single: list[PLD]) -> PLD:
        # in pairs, then pairs of pairs: n - 1 convolutions as one after another, on windows of
        # about log2(n) sizes (each a compiled program beyond the host's sizes) rather than n
        while len(single) > 1:
            single = [_compose_pair(*single[i:i + 2], size, grid_lib.TAIL_MASS)
                      if i + 1 < len(single) else single[i] for i in range(0, len(single), 2)]
        return single[0]

    return _both_directions(fold, plds)


@float64
def self_compose(pld: PLD, count: int, *, size: int | None = None) -> PLD:
    """The ``count``-fold composition of ``pld`` with itself, in one FFT power.

    The window (``size`` points, automatic by default) is placed by Chernoff bounds on the sum so
    that at most ``grid.TAIL_MASS`` falls outside it; the cost is O(size log size) whatever the
    count. Under ``jit`` pass ``size`` explicitly, an integer in [2, grid.MAX_SIZE].

    Huge counts are refused, not rounded: a ValueError above MAX_COUNT (2^63 - 1), when the
    automatic window would need more than grid.MAX_SIZE points (a memory guard), when a loss of
    the composition in grid steps (count times the PLD's outermost index with mass) would reach
    MAX_INDEX = 2^53, beyond which float64 cannot place the window exactly, or when the Chernoff
    window has lost its precision. A coarser grid (``Grid(step=...)``) helps in the last three
    cases. (The true composition of so many runs of a non-trivial mechanism has delta(eps) near 1
    at any modest eps; an explicit, smaller ``size`` gives such a sound bound: mass outside the
    window is charged to the +inf atom.)
    """
    if not isinstance(pld, PLD):
        raise ValueError("pld must be a PLD")
    count = check_count("count", count, minimum=0)
    if count > MAX_COUNT:
        raise ValueError(f"count must be an integer in [0, {MAX_COUNT}], got {count}")
    if size is not None:
        size = grid_lib.check_size("size", size, minimum=2, maximum=grid_lib.MAX_SIZE)
    if count == 0:
        return _both_directions(lambda ps: _identity_like(ps[0]), [pld])
    if count == 1:
        return pld

    def power(single: list[PLD]) -> PLD:
        p = single[0]
        shape = p.batch_shape
        flat = broadcast_rows(p, shape)
        n = size
        if is_traced(flat):
            if n is None:
                raise ValueError("self_compose under jit needs an explicit size=")
        else:
            if computed_on_host([flat], flat.size):
                flat = unchecked_pld(*(np.asarray(a) for a in (flat.probs, flat.inf_mass,
                                                               flat.offset, flat.step)),
                                     p.pessimistic)
                window = map_rows(tail_window)
            else:
                window = _tail_window_batch
            with np.errstate(all="ignore"):  # NumPy: the kernels' masked branches, as under jit
                lo, hi, summary = window(flat.probs, flat.offset, flat.step,
                                         np.broadcast_to(float(count), flat.step.shape),
                                         np.broadcast_to(grid_lib.TAIL_MASS, flat.step.shape))
            widths = window_widths(summary, flat.offset, count, lo, hi)
            if n is None:
                n = checked_size(grid_lib.next_pow2(int(np.max(widths))), "self_compose", "count")
        if computed_on_host([flat], n):
            with np.errstate(all="ignore"):
                probs, inf_mass, offset = self_compose_rows(
                    *(np.asarray(a) for a in (flat.probs, flat.inf_mass, flat.offset, flat.step)),
                    np.float64(count), size=n, tail=grid_lib.TAIL_MASS, pessimistic=p.pessimistic)
        else:
            probs, inf_mass, offset = _self_compose_batch(
                flat.probs, flat.inf_mass, flat.offset, flat.step, np.float64(count),
                grid_lib.TAIL_MASS, p.pessimistic, size=n,
            )
        return from_rows(probs, inf_mass, offset, flat.step, shape, p.pessimistic)

    return _both_directions(power, [pld])


def window_widths(summary: PMFSummary, offset, count, lo, hi, name: str = "count",
                  remedy: str = COARSER_GRID) -> np.ndarray:
    """Host-side guards of self-compositions, and the width (grid points) of each row's window.

    ``summary`` (a :class:`PMFSummary`, each field (rows,)) and ``offset`` (rows,) describe
    single-direction PLDs, ``count`` (scalar or per row) their numbers of compositions, ``lo`` and
    ``hi`` their Chernoff windows (:func:`tail_window`). ValueError where a window has lost its
    precision (hi < lo: the Chernoff exponents of a huge count are below float64 round-off) or
    where an index of the composition (count times the outermost index with mass, or a window's
    end) reaches MAX_INDEX, beyond which float64 cannot place it exactly. Rows with no finite mass
    get width 1. Widths are capped at 2^62 (callers compare them with grid.MAX_SIZE). ``name``: the
    caller's argument for count; ``remedy``: what the error tells the caller to change. Reads
    scalars per row only (no PMF leaves the device).
    """
    first, last, offset = (np.asarray(a, np.float64) for a in (summary.first, summary.last, offset))
    count = np.broadcast_to(np.asarray(count, np.float64), offset.shape)
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    live = np.asarray(summary.mass) > 0
    if np.any(live & ~(hi >= lo)):
        raise CompositionTooWide(f"{name} = {np.max(count[live]):.6g} is too large for this PLD: "
                                 f"its tail window cannot be placed in float64; {remedy}")
    support = np.maximum(np.abs(offset + first), np.abs(offset + last))
    reach = np.where(live, np.maximum(count * support, np.maximum(np.abs(lo), np.abs(hi))), 0.0)
    if np.any(reach >= MAX_INDEX):
        raise CompositionTooWide(
            f"{name} = {np.max(count[live]):.6g} is too large for this grid: the composition's "
            f"losses reach {np.max(reach):.3g} grid steps (at most 2^53 can be placed exactly in "
            f"float64); {remedy}"
        )
    return np.where(live, np.minimum(hi - lo + 1, 2.0**62), 1.0)


def _identity_like(pld: PLD) -> PLD:
    shape = pld.batch_shape
    return unchecked_pld(
        jnp.ones(shape + (1,)),
        jnp.zeros(shape),
        jnp.zeros(shape, jnp.int64),
        jnp.asarray(pld.step),
        pld.pessimistic,
    )
