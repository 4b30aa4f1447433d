"""Connect-the-dots discretization (Doroshenko et al. 2022, Alg. 1 and Alg. 2).

A mechanism is given by its privacy curve through the log-survival and log-CDF functions of its
loss under P and Q, evaluated on the grid z_i = (offset + i) * step.
With x = e^eps the hockey-stick curve delta(x) = P(L > eps) - x Q(L > eps) is convex and decreasing.

* Pessimistic (Alg. 1): the piecewise-linear curve (in x) through the true points
  (x_i, delta(z_i)), through (0, 1) on the left, and flat at delta(z_{n-1}) after the last point.
  Chords of a convex curve lie above it, so every hockey-stick value is an upper bound, and the
  result is the best pessimistic PLD on this grid. The +inf atom is delta at the last grid point.
* Optimistic (Alg. 2): candidate points on tangent lines (left of x = 1 from the previous point,
  right of it from the next one), their lower convex hull, then Alg. 1 on the hull's values;
  the +inf atom is the mechanism's own P(L = +inf) (``LossTails.inf_mass``; 0 if it has none),
  which is exactly representable, the estimate is built for the rest. Every hockey-stick value
  is a lower bound.

Masses come from slope differences written without large exponentials:
``p_j = (e^h d_{j-1} - d_j) / expm1(h)`` with ``d_i = delta_i - delta_{i+1}``, or for a step so
large that e^h overflows the equal ``d_{j-1} / (1 - e^-h) - d_j / expm1(h)``.

The window (where the grid sits, see :func:`safe_window`) never affects soundness: losses below
it are moved up into it (pessimistic) and losses above it into the +inf atom (pessimistic) or
nowhere (optimistic, whose curve is 0 beyond the window). So the window is kept where the
arithmetic is safe: a step of at most ``grid.MAX_STEP`` and, for the optimistic construction
(which works in x = e^z), z at most ``OPTIMISTIC_Z_MAX`` and a span of at most ``OPTIMISTIC_SPAN``.
A mechanism whose loss lies beyond (e.g. the Gaussian with sigma = 1e-5, loss about 5e9) gets a
pessimistic PLD with its tail in the +inf atom (delta = 1 up there: an upper bound) and an
optimistic one that is 0 beyond the window (a lower bound).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import (
    HOST_POINTS,
    HOST_ROWS,
    array_module,
    early_exit_on_cpu,
    exported_jit,
    map_rows,
    on_host,
)
from pldjax.core.grid import Grid
from pldjax.core.mass import take_from_bottom
from pldjax.core.validation import is_traced
from pldjax.kernels.rows import TILE, Row, TiledRows, row_of


def _difference(log_larger, log_smaller):
    """e^a - e^b from a = ``log_larger`` >= b = ``log_smaller`` (b may be -inf), as
    e^a (1 - e^{b - a}): no cancellation, and no 0 * inf where e^a underflows; 0 where a is -inf."""
    xp = array_module(log_larger, log_smaller)
    none = xp.isneginf(log_larger)
    safe = xp.where(none, 0.0, log_larger)
    with np.errstate(over="ignore"):  # e^a beyond the largest float is +inf, as it should be
        return xp.where(none, 0.0, xp.exp(safe) * -xp.expm1(xp.minimum(log_smaller - safe, 0.0)))


def hockey_stick(log_sf_p, log_sf_q, eps):
    """delta(eps) = P(L > eps) - e^eps Q(L > eps), in a cancellation-free form."""
    return _difference(log_sf_p, eps + log_sf_q)


def hockey_stick_excess(log_cdf_p, log_cdf_q, eps):
    """delta(eps) - (1 - e^eps) = e^eps Q(L <= eps) - P(L <= eps) >= 0, accurate for eps < 0."""
    return _difference(eps + log_cdf_q, log_cdf_p)


def _one_side(tails, upper):
    """(log P, log Q) of L > eps where ``upper``, of L <= eps elsewhere, from the four ``tails``
    (log P(L > eps), log Q(L > eps), log P(L <= eps), log Q(L <= eps))."""
    lsp, lsq, lcp, lcq = tails
    xp = array_module(*tails)
    return xp.where(upper, lsp, lcp), xp.where(upper, lsq, lcq)


def side_tails(mechanism: LossTails, params, eps, upper, pessimistic: bool | None = None):
    """(log P, log Q) of ``mechanism``'s loss L > eps where ``upper``, of L <= eps elsewhere:
    its ``side_tails`` where it has them (half the work of all four), else from its ``tails``.
    ``pessimistic``: as :func:`leaned_tails`."""
    if mechanism.side_tails is not None:
        return mechanism.side_tails(params, eps, upper, pessimistic)
    return _one_side(leaned_tails(mechanism, params, eps, pessimistic), upper)


def leaned_tails(mechanism: LossTails, params, eps, pessimistic: bool | None):
    """``mechanism``'s four tails at eps, leaned where its tails are computed from arguments
    whose rounding moves them by more than the curve's log margin covers (a mixture's x - a_k,
    whose shifts a_k are rounded): ``pessimistic`` True, so that the curve from them
    (:func:`curve_values`) is at or above the truth, False at or below (the tails of a pair
    slightly further apart, or closer together), None as computed. Its own ``leaned_tails``
    where it has them, else its tails as computed (their logs' error only)."""
    if mechanism.leaned_tails is not None:
        return mechanism.leaned_tails(params, eps, pessimistic)
    return mechanism.tails(params, eps)


#: The error a curve allows each log-probability it is computed from (see
#: :func:`curve_values`), in float64 epsilons times 1 + its magnitude: the mechanisms' tails
#: are accurate to a few ulps of their probabilities (an absolute error in the log), and the
#: log itself is rounded to half an ulp of its magnitude.
LOG_ERROR_ULPS = 8


def curve_values(log_p, log_q, eps, upper=None, pessimistic: bool = True):
    """The hockey-stick curve delta(eps) where ``upper`` (default eps >= 0) and its excess
    delta(eps) - (1 - e^eps) elsewhere (see :func:`hockey_stick_excess`), from the tails of
    L > eps and of L <= eps there (:func:`side_tails` with the same ``upper``): each where it
    keeps its digits, one value a point (the other follows from delta - excess = 1 - e^eps, see
    :func:`masses_from_values`).

    Both are a larger term less a smaller one (:func:`_difference`): P - e^eps Q above, as
    :func:`hockey_stick`, and e^eps Q - P below, as :func:`hockey_stick_excess`. Each log is
    moved by its possible error (:data:`LOG_ERROR_ULPS`), the larger up and the smaller down,
    so that each value is at or above the truth where the two terms nearly cancel (delta(0) of a
    Gaussian of mu = 1e-8 is Phi(mu / 2) - Phi(-mu / 2), two logs 8e-9 apart, whose round-off
    otherwise moved it by 3e-9 relative, below the truth as often as above) and where the
    larger is the whole value. Not ``pessimistic``: moved towards each other (at most onto each
    other), so that each value is at or below the truth. The term e^eps Q carries the error of
    log Q, not of eps + log Q, and the rounding of that sum: at eps = 90, log Q = -90 rounds by
    7e-15, where the sum is -0.3 (the discrete Laplace of t = 30 sat 3e-15 on the wrong side; a
    Gaussian of sigma = 1e-5, whose log Q is -5e9 at eps = 5e9, 7e-11). The logs' own error
    only: where a mechanism's tails are computed from arguments whose rounding moves them
    further, it leans those arguments (see :func:`leaned_tails`).
    """
    xp = array_module(log_p, log_q, eps)
    upper = eps >= 0 if upper is None else upper
    q_term = eps + log_q
    p_error = _log_error(xp, log_p)
    q_error = _log_error(xp, log_q) + _log_error(xp, q_term, ulps=1)
    sign = 1.0 if pessimistic else -1.0
    larger = xp.where(upper, log_p + sign * p_error, q_term + sign * q_error)
    smaller = xp.where(upper, q_term - sign * q_error, log_p - sign * p_error)
    return _difference(larger, smaller if pessimistic else xp.minimum(smaller, larger))


def _log_error(xp, log_value, ulps: float = LOG_ERROR_ULPS):
    """The error ``ulps`` (default :data:`LOG_ERROR_ULPS`) allows ``log_value``; for a term of 0
    (log -inf), which is exact, a finite one (-inf stays -inf, where inf would give NaN)."""
    return xp.minimum(ulps * np.finfo(np.float64).eps * (1.0 + xp.abs(log_value)), 1e300)


def mechanism_curve(mechanism: LossTails, params, eps, upper=None):
    """:func:`curve_values` of ``mechanism`` at ``eps`` (delta where ``upper``, default
    eps >= 0; the excess elsewhere; pessimistic): its own ``curve`` where it has one, else from
    its side tails (:func:`side_tails`)."""
    upper = eps >= 0 if upper is None else upper
    if mechanism.curve is not None:
        return mechanism.curve(params, eps, upper)
    return curve_values(*side_tails(mechanism, params, eps, upper, pessimistic=True), eps, upper)


def tails_and_curve(tails):
    """The four ``tails`` (log P(L>eps), log Q(L>eps), log P(L<=eps), log Q(L<=eps)) at eps
    followed by the curve delta(eps) and its excess, both optimistic (:func:`curve_values`), as
    a function of eps: what the estimates but the pessimistic connect-the-dots one read of a
    mechanism without an ``estimate`` of its own (see :class:`LossTails`), from its tails
    leaned down (:func:`leaned_tails`: the tails of a pair slightly closer together)."""
    def estimate(eps):
        lsp, lsq, lcp, lcq = tails(eps)
        return (lsp, lsq, lcp, lcq, curve_values(lsp, lsq, eps, True, pessimistic=False),
                curve_values(lcp, lcq, eps, False, pessimistic=False))

    return estimate


def mechanism_estimate(mechanism: LossTails, params):
    """``mechanism``'s :func:`tails_and_curve` at given params, as a function of eps: its own
    ``estimate`` where it has one."""
    if mechanism.estimate is not None:
        return functools.partial(mechanism.estimate, params)
    return tails_and_curve(lambda eps: leaned_tails(mechanism, params, eps, pessimistic=False))


def masses_from_values(values, step, z, rows: Row | TiledRows | None = None):
    """:func:`masses_from_curve` (pessimistic) of the curve given by :func:`curve_values` at
    the grid points z: the curve where z >= 0, the excess where z < 0. ``rows``: their layout
    (see :mod:`pldjax.kernels.rows`; None: one row)."""
    xp = array_module(values)
    upper = z >= 0
    # delta - excess = -expm1(z), added as a sum of two non-negative terms: 1 - e^z and e^z - 1
    # lose the digits of a loss near 0 (a loss of spread 1e-7 lost its masses to round-off); the
    # curve is 1 where the excess is e^z to a few ulps (all of P's mass at +inf: a curve a
    # rounding below 1 would leave round-off masses and an atom below 1; rounding up is safe)
    linear = xp.expm1(z)
    full = values >= (linear + 1.0) * (1.0 - 4.0 * np.finfo(np.float64).eps)
    curve = xp.where(upper, values, xp.where(full, 1.0, values - linear))
    excess = xp.where(upper, values + linear, values)
    return masses_from_curve(curve, step, excess, z, rows=rows)


#: Mass surplus of a pessimistic estimate (over 1 - inf_mass, beyond its masses at losses <= 0)
#: from which its masses are taken for round-off (see :func:`masses_from_curve`). Automatic grids
#: leave none (their surplus is taken from those masses), fine user steps up to 7e-10 (sigma =
#: 0.05, q = 0.01 at 2^-12), a step far too fine for the curve's digits 5e-3 or more (sigma = 1 at
#: 1e-8, 0.49 for sigma = 1e13, q = 0.01 at 2^-46).
_SURPLUS_TOLERANCE = 1e-6


def masses_from_curve(curve, step, excess=None, z=None, below=0.0, pessimistic: bool = True,
                      surplus_from_bottom: bool = False, rows: Row | TiledRows | None = None):
    """Alg. 1: the PLD whose hockey-stick curve interpolates ``curve`` (values at the grid points)
    and reaches 1 - ``below`` at x = 0 (``below``: mass dropped to -inf by an optimistic estimate).

    ``curve`` must be non-increasing and convex in x = e^eps; returns (probs, inf_mass). Where
    ``excess`` (the curve minus 1 - x, see :func:`hockey_stick_excess`) is given, masses at grid
    points z < 0 are taken from its differences instead: the linear part 1 - x has no second
    difference, so both give the same masses in exact arithmetic, and the excess keeps the digits
    that 1 - delta loses when delta is close to 1. Round-off can leave masses below zero (of
    order u / step each); they are set to zero. The masses telescope to 1 - inf_mass; a surplus
    left by round-off and clipping would grow T-fold into a mass defect under self-composition, so
    the total is restored on the safe side: a ``pessimistic`` estimate takes a surplus from its
    masses at losses <= 0 (delta at eps >= 0 keeps every digit) and spreads a deficit over all
    masses (raising delta); an optimistic one takes each negative mass from the masses just
    above it (:func:`_moved_down`) and is rescaled to the total. Scaling every mass down
    lowered a pessimistic curve below the truth (by 5e-11 for R_{1.95,0.05} on a 2^-10 grid).
    A surplus larger than the masses at losses <= 0 means the masses are round-off (a step far
    finer than the curve's digits allow): the pessimistic estimate is then all mass at +inf.
    ``surplus_from_bottom``: a surplus is taken from the lowest losses instead
    (:func:`~pldjax.core.mass.take_from_bottom`), which lowers the curve only below them, for a
    caller that checks the curve at every grid point (truncated Poisson's envelope, where the
    surplus of clipping, 1e-13, taken at all losses <= 0 came back as an atom at +inf).
    ``rows``: the layout of ``curve`` (see :mod:`pldjax.kernels.rows`; None: one row, a 1-D
    array); ``step`` and ``below`` are then row scalars.
    """
    xp = array_module(curve)
    rows = rows or row_of(curve)
    # in tiles, a row shorter than its tile: its last point repeated, which adds no mass
    curve, excess, z = (None if a is None else rows.held(a) for a in (curve, excess, z))
    curve = rows.cummin(xp.clip(curve, 0.0, 1.0))
    if isinstance(rows.points, int) and rows.points == 1:
        return 1.0 - curve, curve[0]
    huge = step > 700.0  # e^h overflows: divide first (1 / expm1(h) -> 0, e^h / expm1(h) -> 1)
    em1 = xp.expm1(xp.minimum(step, 700.0))
    grow = xp.exp(xp.minimum(step, 700.0))
    first_point = rows.is_first()

    def masses(values, first):
        # d_i = v_i - v_{i+1}, 0 at the last point (whose mass is then e^h d_{i-1} / expm1(h))
        d = values - rows.following(values, rows.last(values))
        before = rows.preceding(d, 0.0)
        interior = xp.where(huge, before / -xp.expm1(-step) - d / xp.expm1(step),
                            (grow * before - d) / em1)
        return xp.where(first_point, first - d / xp.expm1(step), interior)

    target = 1.0 - below - rows.last(curve)
    signed = masses(curve, 1.0 - below - rows.first(curve))
    probs = xp.maximum(signed, 0.0)
    if excess is not None:
        excess = rows.cummax(excess)
        low = masses(excess, -below - rows.first(excess))
        # used when the last point's z < 0
        low = xp.where(rows.is_last(), low + xp.exp(xp.minimum(rows.last(z), 0.0)), low)
        signed_mixed = xp.where(z < 0, low, signed)
        mixed = xp.maximum(signed_mixed, 0.0)
        # the excess keeps digits where the curve is close to 1, but where the window lies far
        # below the loss (x = e^z underflows) it has lost the masses: then the curve's own
        # masses, which telescope to the right total, are used. Where both are off by more
        # than 1e-9 (a loss of spread 1e-4 or less: round-off of order u / step each mass), the
        # one closer to the total: the curve's masses at z < 0 are then round-off alone
        mismatch = xp.abs(rows.sum(mixed) - target)
        use_mixed = mismatch <= xp.maximum(1e-9, xp.abs(rows.sum(probs) - target))
        probs = xp.where(use_mixed, mixed, probs)
        if not pessimistic:
            signed = xp.where(use_mixed, signed_mixed, signed)
    if not pessimistic:
        probs = _moved_down(signed, rows)
    total = rows.sum(probs)  # 0 only when the curve is 1 throughout (then the target is 0 too)
    ratio = target / xp.where(total > 0, total, 1.0)
    if not pessimistic:
        return probs * ratio, rows.last(curve)
    # a deficit is spread proportionally (raising delta everywhere); a surplus is taken
    # proportionally from the losses <= 0, which delta(eps) at eps >= 0 does not see
    low = xp.ones_like(probs, bool) if z is None else z <= 0
    low_mass = rows.sum(xp.where(low, probs, 0.0))
    surplus = total - target
    keep = xp.clip(1.0 - surplus / xp.where(low_mass > 0, low_mass, 1.0), 0.0, 1.0)
    if surplus_from_bottom:
        probs = take_from_bottom(probs, xp.maximum(surplus, 0.0), xp)
    else:
        probs = xp.where(low & (surplus > 0), probs * keep, probs)
    # a surplus beyond the masses at losses <= 0 is round-off, not mass: on a step so fine that
    # the values' round-off (about u / step a mass, clipped at 0) outweighs the masses, e.g.
    # Grid(step=1e-9) for the Gaussian of sigma 1, whose masses summed to 1.07. Nothing can be
    # certified from such values: all of the mass goes to the +inf atom (delta = 1, an upper bound)
    lost = surplus - low_mass > _SURPLUS_TOLERANCE
    return (xp.where(lost, 0.0, probs * xp.maximum(ratio, 1.0)),
            xp.where(lost, 1.0, rows.last(curve)))


#: Relative round-off of a running sum of masses (units of the sum): dips of a compiled running
#: sum below its running maximum up to this are round-off, not negative masses.
_SUM_ROUNDOFF = 256 * 2.0**-52


def _moved_down(signed, rows: Row | TiledRows):
    """An optimistic estimate's masses without negative round-off: ``signed`` (Alg. 1's masses,
    some below zero by round-off) with each negative mass set to 0 and as much taken from the
    masses just above it, the nearest first. Moving mass to lower losses lowers the hockey-stick
    curve at every epsilon, below the grid's window too, so the pair stays dominated under
    composition; scaling all masses to the total instead raised the curve at negative epsilon
    (the Q-mass came out 3e-14 short for R_{1e-4}, whose 1000-fold composition read delta(0)
    1.2e-8 relative above the truth). The tail sums T_i become min(T_0..T_i), computed from the
    running sums from the bottom (sums of the small masses there stay small), so that masses
    with no negative one below them are ``signed`` unchanged. Negative masses within the sums'
    round-off (_SUM_ROUNDOFF) are set to 0 alone; the caller scales that surplus away."""
    xp = array_module(signed)
    below = rows.preceding(rows.cumsum(signed), 0.0)  # the mass below each point
    most = rows.cummax(below)
    shortfall = below - most  # <= 0: what is moved down past each point
    # a compiled running sum of masses >= 0 need not be non-decreasing (its additions are
    # ordered by tiles and blocks): a dip within its round-off is none
    shortfall = xp.where(shortfall < -_SUM_ROUNDOFF * most, shortfall, 0.0)
    return xp.maximum(signed + shortfall - rows.following(shortfall, 0.0), 0.0)


#: Rounds of :func:`lower_hull_at`'s parallel peeling before the rows left unsettled go through
#: the sequential monotone chain, off the CPU and in NumPy. The candidates of Alg. 2 on DP-SGD
#: grids settle in 5-20 rounds; nearly collinear ones (sampling probability 1e-6) need many
#: more. The chain takes a loop step for each point still kept, so fewer rounds leave it more
#: work; off the CPU its loop is vmapped and slow, in NumPy a Python loop. A compiled kernel on
#: a CPU runs the chain alone (see :func:`_hull_vertices`).
_PEEL_ROUNDS = 24


def _monotone_chain(xs, ys, kept, steps):
    """Which of the ``kept`` points are vertices of their lower convex hull (xs strictly
    increasing): Andrew's monotone chain, one loop step a kept point, ``steps`` (unbatched, at
    least the kept points) steps in all. The kept points' indices are gathered to the front
    first: after the peeling rounds (off the CPU) few are left (45,028 of two rows of 2^23
    points in a truncated-Poisson envelope)."""
    m = xs.shape[0]
    count = jnp.sum(kept, dtype=jnp.int32)
    order = jnp.zeros(m, jnp.int32).at[jnp.where(kept, jnp.cumsum(kept) - 1, m)].set(
        jnp.arange(m, dtype=jnp.int32), mode="drop")

    def push(j, chain):
        # the stack holds the vertices' coordinates, not only their indices: gathering through
        # the indices at every comparison took twice as long
        hx, hy, hi, top = chain
        i, keep = order[j], j < count
        x, y = xs[i], ys[i]
        top = jax.lax.while_loop(
            lambda t: keep & (t >= 2) & _on_or_above(hx[t - 2], hy[t - 2], hx[t - 1], hy[t - 1],
                                                     x, y),
            lambda t: t - 1, top)
        slot = jnp.where(keep, top, m)  # out of range: dropped
        return (hx.at[slot].set(x, mode="drop"), hy.at[slot].set(y, mode="drop"),
                hi.at[slot].set(i, mode="drop"), top + keep)

    start = (jnp.zeros_like(xs), jnp.zeros_like(ys), jnp.zeros(m, jnp.int32), jnp.int32(0))
    _, _, stack, top = jax.lax.fori_loop(0, steps, push, start)
    return jnp.zeros(m, bool).at[jnp.where(jnp.arange(m) < top, stack, m)].set(True, mode="drop")


def _on_or_above(ax, ay, bx, by, cx, cy):
    """Whether point b lies on or above the chord from point a to point c (ax < bx < cx)."""
    return (bx - ax) * (cy - ay) - (by - ay) * (cx - ax) <= 0.0


def _take(values, index):
    """Values at per-row indices (along the last axis)."""
    return array_module(values).take_along_axis(values, index, axis=-1)


def _nearest_kept(kept):
    """The nearest kept point at or left of each point (-1 if none) and at or right of it (m if
    none), along the last axis: one cumulative max for both (XLA compiles each as a scan)."""
    m, xp = kept.shape[-1], array_module(kept)
    idx = xp.arange(m)
    scans = xp.stack([xp.where(kept, idx, -1), xp.flip(xp.where(kept, m - 1 - idx, -1), -1)])
    scans = row_of(scans).cummax(scans)
    return scans[0], m - 1 - xp.flip(scans[1], -1)


def _peel(xs, ys, kept):
    """One peeling round of :func:`_hull_vertices`: (the points still kept, whether each row
    dropped one)."""
    rows, m = xs.shape
    xp = array_module(xs, ys)
    before, after = _nearest_kept(kept)
    a = xp.concatenate([xp.full((rows, 1), -1), before[:, :-1]], axis=1)  # kept, left of i
    c = xp.concatenate([after[:, 1:], xp.full((rows, 1), m)], axis=1)
    inner = kept & (a >= 0) & (c < m)
    a, c = xp.maximum(a, 0), xp.minimum(c, m - 1)
    ax, ay, cx, cy = _take(xs, a), _take(ys, a), _take(xs, c), _take(ys, c)
    drop = inner & (_on_or_above(ax, ay, xs, ys, cx, cy)
                    | _on_or_above(xs[:, :1], ys[:, :1], xs, ys, cx, cy)
                    | _on_or_above(ax, ay, xs, ys, xs[:, -1:], ys[:, -1:]))
    return kept & ~drop, xp.any(drop, axis=1)


def _hull_vertices(xs, ys):
    """The lower hull's vertices of each row of (xs, ys) (shape rows x m).

    On a CPU, by the monotone chain, row by row: each row's loop unbatched costs a few
    nanoseconds a point (under vmap a loop step cost about 100 times as much: 5 us against 46 ns
    for 2^17 points on a convex curve), less than the peeling rounds below it would save (the
    optimistic sweep of 1,024 DP-SGD sigmas: 10.5 s warm against 11.6-12.1 s with 4 rounds
    first, and the truncated-Poisson envelope of two rows of 2^20 points 0.31-0.33 s against
    0.36-0.37 s, of 2^22 points 1.32-1.35 s against 1.54-1.60 s; the same vertices).

    Elsewhere by peeling: each round drops, in every row at once, each point that lies on or
    above a chord between two other points still kept: its kept neighbours, or one kept
    neighbour and an end point. A dropped point is no vertex of the hull of the points kept, so
    the hull never changes; when a round drops none, the points kept are the vertices. The loop
    runs all its _PEEL_ROUNDS (see :func:`~pldjax.core.compilation.early_exit_on_cpu`); rows
    still dropping points after them finish with the monotone chain on the points kept, every
    row in one vmapped loop (a branch: it is rarely needed there, and sequential)."""
    rows, m = xs.shape

    def row_by_row(xs, ys):
        every = jnp.ones(m, bool)
        return jax.lax.map(lambda row: _monotone_chain(*row, every, m), (xs, ys))

    def peeled(xs, ys):
        def peel(_, state):  # a round after all rows settled drops nothing: the same points
            return _peel(xs, ys, state[0])

        kept, dropping = jax.lax.fori_loop(
            0, _PEEL_ROUNDS, peel, (jnp.ones((rows, m), bool), jnp.ones(rows, bool)))

        def chain(kept):
            # the loop's length is not batched (a batched one carried every row through a select)
            steps = jnp.max(jnp.where(dropping, jnp.sum(kept, axis=1, dtype=jnp.int32), 0))
            return jnp.where(dropping[:, None], jax.vmap(
                _monotone_chain, in_axes=(0, 0, 0, None))(xs, ys, kept, steps), kept)

        return jax.lax.cond(jnp.any(dropping), chain, lambda kept: kept, kept)

    return early_exit_on_cpu((xs, ys), cpu=row_by_row, elsewhere=peeled)


def _hull_vertices_on_host(xs, ys):
    """The vertices of the lower hull of the points (xs, ys) (NumPy, one row: xs strictly
    increasing), as :func:`_hull_vertices` finds them: the same peeling rounds, each on the points
    still kept only (gathered after every round: a quarter or less of them are left after three
    rounds of a random-allocation curve), then the monotone chain (:func:`_chain_on_host`) once a
    round drops only a trickle of points (the ends of a long chord, which peeling moves a point
    or two a round), or where the last round still dropped points. The same vertices as peeling
    the whole row: a point's kept neighbours are its neighbours among the points gathered, and
    the ends are never dropped; and the chain of the points kept finds the hull's vertices."""
    index = np.arange(xs.shape[0])
    x, y = xs, ys
    for _ in range(_PEEL_ROUNDS):
        if x.shape[0] < 3:
            break
        drop = (_on_or_above(x[:-2], y[:-2], x[1:-1], y[1:-1], x[2:], y[2:])
                | _on_or_above(x[0], y[0], x[1:-1], y[1:-1], x[2:], y[2:])
                | _on_or_above(x[:-2], y[:-2], x[1:-1], y[1:-1], x[-1], y[-1]))
        dropped = np.count_nonzero(drop)
        if not dropped:
            break
        keep = np.concatenate([[True], ~drop, [True]])
        index, x, y = index[keep], x[keep], y[keep]
        if dropped * _TRICKLE < x.shape[0]:  # a long chord's ends, a few points a round: chain
            index = index[_chain_on_host(x, y)]
            break
    else:
        index = index[_chain_on_host(x, y)]
    kept = np.zeros(xs.shape[0], bool)
    kept[index] = True
    return kept


#: :func:`_hull_vertices_on_host` peels while a round drops at least one point in this many
#: (noisy curves: most of their points go in the first rounds), then chains.
_TRICKLE = 64


def _chain_on_host(xs, ys) -> list[int]:
    """The monotone chain's lower hull of the points (xs, ys) (NumPy, xs strictly increasing):
    the indices of its vertices. A Python loop over Python floats, except along a run of points
    that each turn left of their two predecessors while those two are the chain's top: the loop
    would append each of them without a pop, and they are appended at once (what peeling leaves
    is such runs between a few points that pop; a long chord over a dip took 0.7 s for 2.6e5
    points point by point, 0.07 s so)."""
    n = xs.shape[0]
    if n < 3:
        return list(range(n))
    turns = np.zeros(n, bool)  # point i leaves points i - 2, i - 1 below the chord: no pop
    turns[2:] = ~_on_or_above(xs[:-2], ys[:-2], xs[1:-1], ys[1:-1], xs[2:], ys[2:])
    stops = np.append(np.flatnonzero(~turns), n).tolist()  # the points that may pop
    x, y = xs.tolist(), ys.tolist()
    chain, i, s = [0, 1], 2, 0
    while i < n:
        if chain[-1] == i - 1 and chain[-2] == i - 2 and turns[i]:
            while stops[s] < i:
                s += 1
            chain.extend(range(i, stops[s]))
            i = stops[s]
            continue
        while len(chain) >= 2 and _on_or_above(x[chain[-2]], y[chain[-2]], x[chain[-1]],
                                               y[chain[-1]], x[i], y[i]):
            chain.pop()
        chain.append(i)
        i += 1
    return chain


def _interpolate(xs, ys, left, right):
    """Values at xs of the chords from point ``left`` to point ``right`` (per row), as jnp.interp
    computes them."""
    lx, ly = _take(xs, left), _take(ys, left)
    width = _take(xs, right) - lx
    return ly + ((xs - lx) / array_module(xs).where(width > 0, width, 1.0)) * (_take(ys, right) - ly)


def _hull_values(xs, ys, kept):
    """Values at xs of the chords between the ``kept`` points (the hull's vertices)."""
    xp = array_module(xs)
    left, right = _nearest_kept(kept)
    right = xp.minimum(right, xs.shape[-1] - 1)
    return xp.where(kept, ys, _interpolate(xs, ys, left, right))


@jax.custom_batching.custom_vmap
def _hull_rows(xs, ys):
    """Values at xs of the lower convex hull of each row of (xs, ys) (rows x m)."""
    return _hull_values(xs, ys, _hull_vertices(xs, ys))


@_hull_rows.def_vmap
def _hull_rows_vmap(axis_size, in_batched, xs, ys):
    # the batch becomes more rows, so that the rounds and the chain see every row
    xs, ys = (a if batched else jnp.broadcast_to(a, (axis_size,) + a.shape)
              for batched, a in zip(in_batched, (xs, ys), strict=True))
    out = _hull_rows(xs.reshape(-1, xs.shape[-1]), ys.reshape(-1, ys.shape[-1]))
    return out.reshape(ys.shape), True


def lower_hull_rows(xs, ys):
    """(values at xs, whether each point is a vertex) of the lower convex hull of each row of
    (xs, ys) (rows x m, xs strictly increasing; NumPy rows row by row on the host):
    :func:`lower_hull_at` for rows, with the vertices the chords join."""
    if array_module(xs, ys) is np:
        kept = np.stack([_hull_vertices_on_host(x, y) for x, y in zip(xs, ys, strict=True)])
    else:
        kept = _hull_vertices(xs, ys)
    return _hull_values(xs, ys, kept), kept


def masses_at_vertices(xs, curve, excess, kept, below_zero, rise):
    """The masses at the points ``xs`` (x = e^(z - centre), ``xs[0]`` = 0) of the PLD whose curve
    runs along the chords between the ``kept`` points (a lower hull's vertices, see
    :func:`lower_hull_rows`) of ``curve``, flat beyond the last point, its ``excess`` (the curve
    less the line 1 - e^z, whose slope in x is -``rise``) given too: a vertex's mass is
    x (slope right - slope left), every other point's 0 (without ``xs[0]``). JAX or NumPy arrays.

    Each chord's slope is computed once, from the excess where it starts ``below_zero`` (where
    the curve, near 1, has lost the digits the excess keeps) and from the curve elsewhere, and
    both vertices it joins use that one value: the masses then telescope, under Q too (1 - sum
    p e^-z, Q's mass at -inf, is the first chord's slope)."""
    xp = array_module(xs, curve)
    m = xs.shape[0]
    left, right = _nearest_kept(kept)
    # each point's previous and next vertex (the first point's previous one: itself)
    before = xp.concatenate([xp.zeros(1, left.dtype), left[:-1]])
    after = xp.minimum(xp.concatenate([right[1:], xp.full(1, m, right.dtype)]), m - 1)
    width = xs[after] - xs
    width = xp.where(width > 0, width, 1.0)
    from_excess = (excess[after] - excess) / width
    from_curve = (curve[after] - curve) / width
    last = xp.arange(m) == m - 1
    # each point's chord to the next vertex, in the curve's units and in the excess's
    chord_curve = xp.where(last, 0.0, xp.where(below_zero, from_excess - rise, from_curve))
    chord_excess = xp.where(last, rise, xp.where(below_zero, from_excess, from_curve + rise))
    turn = xp.where(below_zero, chord_excess - chord_excess[before],
                    chord_curve - chord_curve[before])
    return xp.maximum(xp.where(kept, xs * turn, 0.0)[1:], 0.0)


def lower_hull_at(xs, ys):
    """Values at ``xs`` of the lower convex hull of the points (xs, ys); xs strictly increasing.

    By peeling rounds over whole arrays (:func:`_hull_vertices`): the sequential monotone chain
    costs a loop step a point, 88 ms for two curves of 16,385 points on a CPU); in NumPy for
    NumPy arrays."""
    if array_module(xs, ys) is np:
        return _hull_values(xs[None], ys[None], _hull_vertices_on_host(xs, ys)[None])[0]
    return _hull_rows(xs[None], ys[None])[0]


def _tiled_lower_hull(xs, ys, at_zero, rows: TiledRows):
    """Values at ``xs`` of the lower convex hull of each row's points (xs, ys) (in tiles: xs
    (tiles, tile), each row's increasing and positive) with the point (0, ``at_zero``) (a row
    scalar) before its first; ``ys`` and ``at_zero`` may have a leading axis (hulls on one
    grid, one after the other).

    Andrew's monotone chain over every row's points in one sequential loop (as a CPU runs it
    row by row, see :func:`_hull_vertices`), its stack starting each row with the row's point
    at 0, never visiting the padding (a loop step costs about 20 ns). A point's value then lies
    on the chord from the last vertex at or left of it (a running maximum along the row) to
    that vertex's right neighbour, the vertex whose left neighbour it is."""
    if ys.ndim > 2:
        return jax.lax.map(lambda pair: _tiled_lower_hull(xs, *pair, rows), (ys, at_zero))
    tiles, tile = xs.shape
    size, n = tiles * tile, rows.points
    flat_x, flat_y = xs.reshape(-1), ys.reshape(-1)

    def push(_, chain):
        # (k, start): the point's index in its row and where the row starts (no integer
        # division: 64-bit ones took half of a loop step)
        hx, hy, hi, top, kept, k, start = chain
        i = start + k
        x, y = flat_x[i], flat_y[i]
        top = jnp.where(k == 0, 1, top)  # a row's first point: its point at 0 alone below it
        hy = hy.at[0].set(jnp.where(k == 0, at_zero[i // tile, 0], hy[0]))

        def pop(state):
            t, kept = state
            return t - 1, kept.at[hi[t - 1]].set(False)

        top, kept = jax.lax.while_loop(
            lambda state: (state[0] >= 2) & _on_or_above(
                hx[state[0] - 2], hy[state[0] - 2], hx[state[0] - 1], hy[state[0] - 1], x, y),
            pop, (top, kept))
        end = k + 1 == n
        return (hx.at[top].set(x), hy.at[top].set(y), hi.at[top].set(i), top + 1,
                kept.at[i].set(True), jnp.where(end, 0, k + 1),
                jnp.where(end, start + rows.per_row * tile, start))

    # the stack's slot 0 holds a row's point at 0 (x = 0)
    chain = (jnp.zeros(size + 1), jnp.zeros(size + 1), jnp.full(size + 1, -1), jnp.int64(0),
             jnp.zeros(size, bool), jnp.int64(0), jnp.int64(0))
    kept = jax.lax.fori_loop(0, rows.rows * n, push, chain)[4].reshape(tiles, tile)
    ids = jnp.arange(size).reshape(tiles, tile)
    left = rows.cummax(jnp.where(kept, ids, -1))  # -1: the row's point at 0
    before = rows.preceding(left, -1)  # a vertex's left neighbour
    neighbour = jnp.full(size + 1, -1).at[jnp.where(kept & (before >= 0), before, size)].set(ids)
    after_zero = rows.max(jnp.where(kept & (before < 0), ids, -1))
    # past a row's last point (a row shorter than its tile, padding rows): any point will do
    right = jnp.maximum(jnp.where(left < 0, after_zero, neighbour[jnp.maximum(left, 0)]), 0)
    lx = jnp.where(left < 0, 0.0, flat_x[jnp.maximum(left, 0)])
    ly = jnp.where(left < 0, at_zero, flat_y[jnp.maximum(left, 0)])
    width = flat_x[right] - lx
    # the padding rows, which the loop skips, keep their points
    unchanged = kept | (rows.row >= rows.rows)[:, None]
    return jnp.where(unchanged, ys, ly + ((xs - lx) / jnp.where(width > 0, width, 1.0))
                     * (flat_y[right] - ly))


def _raised_at_one(cand, values, log_slopes, sign, z, split, middle, next_bound, rows):
    """``cand`` with its value at the right end of the interval [z_(split-1), z_split] holding
    x = 1 raised as far as soundness allows given the value at its left end.

    The candidates' piecewise-linear curve lies below the true convex curve if each segment lies
    below some line that does. On this interval Alg. 2 uses the tangent at its left end: when
    Q's losses sit inside the interval (a sampling probability below the step), the curve turns
    sharply there and that tangent, followed to the right end, falls to 0, and the lower hull
    takes every value right of it to 0 (the optimistic epsilon read 0). Here the segment only
    has to stay below the largest of three tangents (at both ends and at the middle), a convex
    piecewise-linear function below the curve: below it at both ends and at its two kinks. The
    largest right-end value that keeps the left end's value and those four conditions (and the
    next interval's, ``next_bound``) is taken, never less than Alg. 2's. Where that still leaves
    less than a tenth of the curve's value there, both ends follow the middle tangent instead.
    Either way each segment lies below one line below the curve: sound. ``split`` and the
    ``middle``'s values are row scalars of ``rows``, the layout of the other arguments."""
    z_mid, mid_value, mid_log_slope = middle
    xp = array_module(cand)
    index = rows.index()
    left, right = xp.maximum(split - 1, 0), xp.minimum(split, rows.points - 1)
    points = (rows.at(z, left), z_mid, rows.at(z, right))
    at = (rows.at(values, left), mid_value, rows.at(values, right))
    slope = tuple(sign * xp.exp(log_slope - point) for log_slope, point in zip(
        (rows.at(log_slopes, left), mid_log_slope, rows.at(log_slopes, right)), points,
        strict=True))

    def tangents(x):  # the three tangent lines at x (in x = e^z)
        return [a + s * (x - xp.exp(p)) for a, s, p in zip(at, slope, points, strict=True)]

    x_left, x_right = xp.exp(points[0]), xp.exp(points[2])
    a = rows.at(cand, left)
    bound = xp.minimum(at[2], rows.at(next_bound, right))
    for first in (0, 1):  # the kinks: where consecutive tangents cross
        gap = slope[first] - slope[first + 1]
        cross = (at[first + 1] - at[first] + slope[first] * xp.exp(points[first])
                 - slope[first + 1] * xp.exp(points[first + 1])) / xp.where(gap != 0, gap, 1.0)
        kink = xp.clip(xp.where(gap != 0, cross, x_left), x_left, x_right)
        envelope = functools.reduce(xp.maximum, tangents(kink))
        reach = (kink - x_left) / (x_right - x_left)  # the segment's position at the kink
        bound = xp.minimum(bound, xp.where(reach > 0, a + (envelope - a) / xp.where(
            reach > 0, reach, 1.0), xp.inf))
    raised = xp.maximum(rows.at(cand, right), bound)
    kept_left = xp.where(index == right, rows.over_points(raised), cand)
    # where even so less than a tenth of the curve's value at the right end is left (the
    # collapse), both ends follow the middle's tangent instead: the left end gives up some of
    # its value, and x = 1 keeps most of its own
    new_left = xp.minimum(a, tangents(x_left)[1])
    new_right = xp.minimum(rows.at(next_bound, right), tangents(x_right)[1])
    on_middle = xp.where(index == right, rows.over_points(new_right),
                         xp.where(index == left, rows.over_points(new_left), cand))
    return xp.where(rows.over_points(raised < at[2] / 10), on_middle, kept_left)


def _below_zero(z, rows: Row | TiledRows):
    """How many of each row's grid points ``z`` lie below 0 (a row scalar of ``rows``)."""
    return rows.sum(array_module(z).where(rows.index() < rows.points, z < 0, False))


def optimistic_curve(values, log_slopes, sign, z, step, at_zero, first, last, middle=None,
                     rows: Row | TiledRows | None = None):
    """Alg. 2: values at the grid points of an optimistic (lower) estimate of a convex curve.

    ``values``: the true curve at z (delta, or the excess delta - (1 - x), accurate at z < 0);
    ``sign * exp(log_slopes)``: x times its derivative in x = e^z there (in logs, so that a
    tangent followed across a large step neither overflows nor gives 0 * inf);
    ``at_zero``: its value at x = 0; ``first``, ``last``: the lower bounds used at the first and
    last points (following the tangent at x_0 to x = 0: the curve's own value at x_0, and that
    tangent's value at 0 as ``at_zero``). Candidates on tangent lines (left of x = 1 from the
    previous point, right of it from the next one), then their lower convex hull with the point
    at x = 0, at the grid points.
    Adding a linear function (as the excess does) leaves the hull's points unchanged, so both
    forms describe one optimistic PLD.

    ``middle``: (loss, value, log slope) at the middle of the interval holding x = 1, or
    None: the candidates at that interval's ends then use a third tangent, there
    (:func:`_raised_at_one`), so that a coarse step no longer reads an optimistic epsilon of 0.

    ``rows``: the layout of ``values``, ``log_slopes`` and ``z`` (see
    :mod:`pldjax.kernels.rows`; None: one row, a 1-D array); the other arguments are then its
    row scalars. In tiles ``values`` and the row scalars but ``step`` may have a leading axis
    (several curves on one grid).
    """
    xp = array_module(values)
    rows = rows or row_of(values)
    over = rows.over_points
    log_up = step + xp.log(-xp.expm1(-step))  # log(e^h - 1), finite for any step
    log_down = xp.log(-xp.expm1(-step))  # log(1 - e^-h)
    from_left = rows.preceding(values + over(sign) * xp.exp(log_slopes + over(log_up)), first)
    from_right = rows.following(values - over(sign) * xp.exp(log_slopes + over(log_down)), last)
    split = _below_zero(z, rows)  # first grid point with z >= 0 (x >= 1)
    index, is_last = rows.index(), rows.is_last()
    cand = xp.where(index < over(split), from_left,
                    xp.where(index > over(split), from_right, xp.minimum(from_left, from_right)))
    cand = xp.where(is_last, over(last), cand)
    if middle is not None:
        next_bound = xp.where(is_last, over(last), from_right)
        raised = _raised_at_one(cand, values, log_slopes, sign, z, split, middle, next_bound, rows)
        cand = xp.where(over((split >= 1) & (split <= rows.points - 1)), raised, cand)
    # x measured relative to the window centre: scaling x keeps convexity and avoids overflow
    xs = xp.exp(z - over(rows.at(z, rows.points // 2)))
    if isinstance(rows, TiledRows):
        return _tiled_lower_hull(xs, cand, at_zero, rows)
    points = xp.concatenate([xp.full((1,), at_zero, values.dtype), cand])
    return lower_hull_at(xp.concatenate([xp.zeros((1,)), xs]), points)[1:]


def privacy_buckets(log_sf_p, pessimistic: bool, atom=0.0, beyond=False):
    """Masses of the loss rounded up (pessimistic) or down (optimistic) to the grid points, from
    log P(L > z_i): the mass in (z_{i-1}, z_i] goes to z_i, or the mass in [z_i, z_{i+1}) to z_i.
    Returns (probs, inf_mass); at the window's ends the outside mass goes to +inf and z_0
    (pessimistic), or to z_{n-1} and -inf (optimistic: dropped, never rounded up); ``atom``,
    P(L = +inf), stays at +inf in the optimistic case too. Where ``beyond`` (past the largest
    finite loss), P(L > z_i) is the atom exactly."""
    sf = jnp.where(beyond, atom, jnp.exp(log_sf_p))  # P(L > z_i), non-increasing
    between = sf[:-1] - sf[1:]  # P(z_i < L <= z_{i+1})
    if pessimistic:
        return jnp.concatenate([(1.0 - sf[0])[None], between]), sf[-1]
    probs = jnp.concatenate([between, jnp.zeros((1,))])
    atom = jnp.minimum(atom, sf[-1])
    return probs.at[-1].add(sf[-1] - atom), atom * jnp.ones(())


def grid_points(offset, step, n: int):
    """The losses z_i = (offset + i) * step, i < n (nats)."""
    xp = array_module(offset, step)
    return (offset + xp.arange(n, dtype=xp.float64)) * step


def beyond_losses(z, max_loss, atom, values):
    """``values`` of the curve delta at the grid points ``z``, with those at z >= ``max_loss``
    (the mechanism's largest finite loss, see :class:`LossTails`) set to ``atom``, P(L = +inf),
    which they equal exactly there."""
    xp = array_module(z)
    return xp.where(z >= xp.maximum(max_loss, 0.0), atom, values)


def discretize(tails, offset, step, n: int, pessimistic: bool, rounding: str = "connect_dots",
               atom=0.0, max_loss=jnp.inf):
    """Discretize a mechanism given by ``tails(eps) -> (log P(L>eps), log Q(L>eps),
    log P(L<=eps), log Q(L<=eps))``; ``atom`` is P(L = +inf), the mass P puts where Q has none,
    and ``max_loss`` the largest finite loss (see :class:`LossTails`).

    Returns (probs, inf_mass) on the grid z_i = (offset + i) * step, i < n. The pessimistic
    construction finds the atom in its last point's delta; the optimistic one keeps it at +inf
    (it is exactly representable) and builds its estimate for the finite part, whose curve is
    delta - atom.
    """
    z = grid_points(offset, step, n)
    if pessimistic and rounding == "connect_dots":
        values = curve_values(*_one_side(tails(z), z >= 0), z)
        return masses_from_values(beyond_losses(z, max_loss, atom, values), step, z)
    return masses_from_tails(estimate_tails(tails_and_curve(tails), z, step, pessimistic), z,
                             step, pessimistic, rounding, atom, max_loss)


def _middle_point(z, step):
    """The middle of the grid interval holding x = 1 (eps = 0), as a (1,) array (the first
    interval's middle when every point is at or above 0, the last's when every one is below)."""
    n, xp = z.shape[0], array_module(z)
    return z[xp.clip(xp.searchsorted(z, 0.0, side="left") - 1, 0, n - 1)][None] + step / 2


def tail_points(z, pessimistic: bool):
    """Where an estimate reads a mechanism's tails for the grid points ``z``: at z itself, but
    for an optimistic estimate at the float below each z > 0. The tangent at such a point
    extends to the left (:func:`optimistic_curve`), so it takes the curve's left derivative
    there, -Q(L >= z): with the right one, -Q(L > z), an atom of the loss on a grid point (the
    largest loss of a randomized response or a Laplace mechanism on its lattice) lost its
    tangent and went down a step. Optimistic privacy buckets so hold [z_i, z_{i+1}) at z_i."""
    xp = array_module(z)
    return z if pessimistic else xp.where(z > 0, xp.nextafter(z, -xp.inf), z)


def estimate_tails(estimate, z, step, pessimistic: bool):
    """What every estimate but the pessimistic connect-the-dots one needs of a mechanism: its
    ``estimate`` (its four tails, then its optimistic curve delta and excess: see
    :func:`tails_and_curve`) at the grid points ``z`` (:func:`tail_points`) and, last, at the
    middle of the interval holding x = 1 (see :func:`optimistic_curve`): a (6, n + 1) array, in
    one evaluation (the mechanism's whole share of the work)."""
    at = jnp.concatenate([tail_points(z, pessimistic), _middle_point(z, step)])
    return jnp.stack(jnp.broadcast_arrays(*estimate(at)))


def masses_from_tails(at_points, z, step, pessimistic: bool, rounding: str, atom=0.0,
                      max_loss=jnp.inf, rows: TiledRows | None = None):
    """(probs, inf_mass) on the grid ``z`` from the mechanism's :func:`estimate_tails`
    ``at_points``: the optimistic connect-the-dots estimate, or privacy buckets (either
    direction of rounding); see :func:`discretize`. Independent of the mechanism.

    ``rows``: rows in tiles (optimistic connect-the-dots only): ``at_points`` (6, tiles,
    tile + 1), each tile's values at its points and, last, at its row's middle point; ``z`` in
    tiles, and ``step``, ``atom`` and ``max_loss`` their row scalars (see
    :mod:`pldjax.kernels.rows`). None: one row, ``at_points`` (6, n + 1)."""
    xp = array_module(z)
    if rows is None:
        rows = row_of(z)
        middle = at_points[:, -1]
    else:
        middle = at_points[..., -1:]
    lsp, lsq, lcp, lcq, delta, excess = at_points[..., :-1]
    _, lsq_mid, _, lcq_mid, delta_mid, excess_mid = middle
    if rounding == "privacy_buckets":
        return privacy_buckets(lsp, pessimistic, atom, z >= xp.maximum(max_loss, 0.0))
    # past the largest finite loss the finite part's curve delta - atom is 0 exactly: computed as
    # a difference, its round-off left masses up to the window's top, an optimistic delta above
    # the atom there and so epsilon(atom) at the top of the window
    raw_atom = atom
    delta = beyond_losses(z, rows.over_points(max_loss), rows.over_points(atom), delta)
    # Left of the window the estimate follows the tangent at x_0 = e^{z_0}: it reaches
    # P(L > z_0) = 1 - lost at x = 0, i.e. P's mass at losses <= z_0 is dropped (moved down to
    # -inf), where rounding it up to z_0 would overstate delta below z_0.
    lost = xp.exp(rows.first(lcp))
    delta, excess = rows.cummin(delta), rows.cummax(excess)
    # the finite part: delta - atom tends to 0 beyond the window (no Q mass at +inf: the slopes
    # and the excess e^eps Q(L <= eps) - P(L <= eps) are those of the finite part already)
    atom = xp.clip(xp.minimum(atom, rows.last(delta)), 0.0, 1.0 - lost)
    delta = xp.maximum(delta - rows.over_points(atom), 0.0)
    excess = excess - rows.over_points(atom)
    # both curves at the middle of the interval holding x = 1 (the last grid point below 0, or
    # the first point when none is, half a step up)
    below = xp.clip(_below_zero(z, rows) - 1, 0, rows.points - 1)
    z_mid = rows.at(z, below) + step / 2
    delta_mid = xp.maximum(beyond_losses(z_mid, max_loss, raw_atom, delta_mid) - atom, 0.0)
    excess_mid = excess_mid - atom
    # delta for the masses at z >= 0; the excess (accurate where delta is close to 1) for z < 0:
    # both estimates in one vmapped call (one traced hull, not two: its program compiled about
    # 15% faster)
    stacked = [xp.stack(pair) for pair in (
        (delta, excess), (lsq + z, lcq + z), (rows.row_scalar(-1.0), rows.row_scalar(1.0)),
        (1.0 - lost - atom, -lost - atom), (rows.first(delta), rows.first(excess)),
        (xp.zeros_like(lost), xp.expm1(rows.last(z))), (delta_mid, excess_mid),
        (lsq_mid + z_mid, lcq_mid + z_mid))]
    values, log_slopes, sign, at_zero, first, last, mid_value, mid_log_slope = stacked
    if isinstance(rows, TiledRows):
        curve, excess = optimistic_curve(values, log_slopes, sign, z, step, at_zero, first, last,
                                         (z_mid, mid_value, mid_log_slope), rows)
    else:
        curve, excess = map_rows(
            lambda v, ls, sg, a0, f, la, mv, ml: optimistic_curve(
                v, ls, sg, z, step, a0, f, la, (z_mid, mv, ml)))(
            values, log_slopes, sign, at_zero, first, last, mid_value, mid_log_slope)
    below_window = rows.over_points(lost + atom)
    probs, _ = masses_from_curve(
        xp.clip(curve, 0.0, 1.0), step, xp.maximum(excess, -below_window), z, below=lost + atom,
        pessimistic=False, rows=rows,
    )
    return _buckets_where_collapsed(probs, atom * xp.ones((), probs.dtype), lsp, z, raw_atom,
                                    max_loss, rows)


#: An optimistic connect-the-dots estimate whose delta at eps = 0 is below this fraction of the
#: optimistic privacy buckets' on the same grid is replaced by the buckets (see
#: :func:`_buckets_where_collapsed`).
COLLAPSED = 0.5


def _buckets_where_collapsed(probs, inf_mass, log_sf_p, z, atom, max_loss, rows):
    """The optimistic connect-the-dots masses ``probs`` (with ``inf_mass``), or, in the rows
    where they collapsed, the optimistic privacy buckets of the same tails (those of
    :func:`privacy_buckets`, in any layout of ``rows``): P's loss rounded down to the grid
    points, its mass below the window dropped, the ``atom`` P(L = +inf) kept.
    Both are lower bounds at every eps (rounding losses down and dropping mass to -inf only
    lower (1 - e^(eps - L))_+), and stay so under composition.

    Connect-the-dots puts the curve's corner at x = 1 on a grid point and joins it to its
    neighbours by segments below the curve; where most of the loss lies within a step of 0 (a
    Gaussian of small sigma Poisson-subsampled at a small q: sigma 0.3, q 1e-3), the curve
    follows 1 - x up to x = 1 and the corner's value has to be 0, and so, the curve being
    convex, every value beyond it: epsilon read 0 at any delta. The buckets keep the mass of the
    large losses. A row takes them where its delta at eps = 0 is below COLLAPSED times theirs
    (elsewhere connect-the-dots is at least as tight, and its masses are kept as they are).
    ``log_sf_p``: log P(L >= z) at z > 0, log P(L > z) at z <= 0 (:func:`tail_points`); the
    other arguments as :func:`masses_from_tails`' (``atom`` as given there)."""
    xp = array_module(z)
    beyond = z >= rows.over_points(xp.maximum(max_loss, 0.0))
    # non-increasing against round-off (a lower value moves mass to a smaller loss: still below)
    survival = rows.cummin(xp.where(beyond, rows.over_points(atom), xp.exp(log_sf_p)))
    bucket_atom = xp.minimum(atom, rows.last(survival))
    buckets = survival - rows.following(survival, bucket_atom)
    buckets = xp.where(rows.index() < rows.over_points(rows.points), xp.maximum(buckets, 0.0),
                       0.0)
    gain = xp.where(z > 0, -xp.expm1(-xp.maximum(z, 0.0)), 0.0)  # 1 - e^-z: delta(0)'s weights
    collapsed = inf_mass + rows.sum(probs * gain) < COLLAPSED * (bucket_atom
                                                                 + rows.sum(buckets * gain))
    return (xp.where(rows.over_points(collapsed), buckets, probs),
            xp.where(collapsed, bucket_atom, inf_mass))


# -- mechanisms -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LossTails:
    """Pure functions describing one mechanism's privacy loss; ``params`` is a tuple of arrays.

    Instances are static jit arguments (hashed by identity): define them once, at module level.
    """

    tails: Callable  # (params, eps) -> log P(L>eps), log Q(L>eps), log P(L<=eps), log Q(L<=eps)
    spread: Callable  # params -> typical scale of the loss (nats), > 0; sets the step
    center: Callable  # params -> where the window is centred (nats)
    half_width: Callable  # params -> half-width the window must cover (nats)
    # chi^2(P || Q) = E_Q[(P/Q)^2] - 1, for Poisson subsampling of the mechanism (None: not offered)
    chi2: Callable | None = None
    # params -> P(L = +inf), the mass P puts where Q has none (None: no such atom); kept at +inf
    # by the optimistic construction
    inf_mass: Callable | None = None
    # (params, tail) -> (low, high): a loss range (nats) outside which P holds at most ``tail``
    # of its mass, for tail in (0, 1); tail 0 gives the default window (center +- half_width).
    # None: the window is always the default one (see :func:`window`)
    bulk: Callable | None = None
    # (params, eps, upper, pessimistic) -> (log P, log Q) of L > eps where ``upper``, of
    # L <= eps elsewhere, leaned as :func:`leaned_tails`: what the pessimistic estimate needs of
    # ``tails`` (see :func:`side_tails`), at half the cost. None: taken from ``tails``
    side_tails: Callable | None = None
    # (params, eps, pessimistic) -> the four tails, leaned (see :func:`leaned_tails`). None:
    # ``tails``, as computed
    leaned_tails: Callable | None = None
    # params -> the largest finite loss (nats): at and beyond it the curve is P(L = +inf)
    # exactly, which the tails give only up to round-off (e^{log delta} is not delta, and an
    # optimistic estimate left that round-off as masses up to the window's top). None: unbounded
    max_loss: Callable | None = None
    # (params, eps, upper) -> the values of :func:`curve_values` (delta where ``upper``, its
    # excess elsewhere), pessimistic, where the mechanism keeps more digits than the difference
    # of its tails does (see :func:`mechanism_curve`). None: from ``side_tails``
    curve: Callable | None = None
    # (params, eps) -> the four tails, then delta(eps) and its excess, each at or below the truth:
    # what :func:`tails_and_curve` gives from ``tails``, where the mechanism keeps more digits
    # (see :func:`mechanism_estimate`). None: from ``tails``
    estimate: Callable | None = None
    # whether every function above also runs in NumPy on NumPy arrays (and returns NumPy), so
    # that a small connect-the-dots discretization on the host compiles nothing (see
    # :func:`_mechanism_kernel`)
    host: bool = False
    # for a mechanism of two directions (a last parameter REMOVE or ADD): whether the add pair
    # is the remove pair with P and Q swapped, so that a composition of the remove direction
    # also bounds the add one's (see pldjax.kernels.compose.swapped_delta_bound)
    swapped_directions: bool = False


def window(mechanism: LossTails, params, tail):
    """(centre, half-width) in nats of the window ``mechanism`` is discretized on.

    ``tail`` (>= 0, broadcasting with ``params``) is the mass of P a caller lets the window leave
    outside (0: the mechanism's default window). Soundness never depends on it: the
    discretization moves losses below the window up into it and losses above it to the +inf atom
    (pessimistic) or nowhere (optimistic). Tightness does: a T-fold composition of mechanisms that
    each moved at most ``tail`` of P's mass is off by at most T tail in delta (the composed losses
    differ only where some step's loss left the window).
    """
    if mechanism.bulk is None:
        return mechanism.center(params), mechanism.half_width(params)
    low, high = mechanism.bulk(params, tail)
    return (low + high) / 2, (high - low) / 2


def _mechanism_kernel(params, tail, step, *, mechanism: LossTails, size: int, pessimistic: bool,
                      fixed: bool, rounding, then: Callable | None = None, extra: tuple = (),
                      host: bool = False, tiles: int | None = None):
    """A batch of mechanisms (``params``, ``tail`` and ``step``: flat arrays, see :func:`window`)
    -> (probs, inf_mass, offset, step), each batched; each one's ``step`` (nats; data, so that new
    values compile nothing) is used when ``fixed``, else each one's automatic step. Vmapped
    inside jit: a warm call traces nothing.

    ``then``: a function (probs, inf_mass, offset, step, *extra) -> outputs that runs in the
    program of the masses (a caller's next step: DP-SGD's window placement), whose outputs the
    call returns instead; a static argument, so it must hash the same across calls (a
    module-level function, or one cached partial of it).

    The pessimistic connect-the-dots estimate is two compiled kernels, queued one after the
    other without waiting: the curve (the mechanism's tails, nearly all of the work, one value a
    point; in tiles, one program a mechanism whatever the size, see :func:`_in_tiles`) and its
    masses (a program a shape, whatever the mechanism). Given both in one program, XLA on a CPU
    recomputed the tails in several of the masses' loops (3.0-3.4 ms against 2.2 ms for 2 x
    16,384 points); with the curve computed once
    (:func:`~pldjax.core.compilation.computed_once`) the one program ran 0.2-0.7 ms faster but
    compiled in 1.6 s against 0.9 s for the two (DP-SGD's first call: the curve runs 2.9x slower
    with the masses' compiler options, and the masses compile slower with the curve's). The other
    estimates are two calls likewise: the mechanism's tails, and the masses from them, one
    program per shape whatever the mechanism (in one program they compiled in 2.2 s a shape).

    ``tiles``: the masses of a connect-the-dots estimate (pessimistic or optimistic) are computed
    in that many tiles, with ``then`` taking the layout too (:func:`_tiled_masses_kernel`,
    :func:`_tiled_tails_masses_kernel`): one program for every grid size (the optimistic sweep
    of 1,024 DP-SGD sigmas compiled its masses per size, five programs and 14-16 s of XLA on a
    2-core CPU).

    Connect-the-dots work on NumPy inputs, of a mechanism whose functions run in NumPy
    (:func:`runs_on_host`), is computed on the host row by row (:func:`_host_row`), with no
    program to compile: small work (at most HOST_ROWS rows and HOST_POINTS points in all, no
    ``then``) always, any where the caller asks for it (``host``: ``then`` runs on the NumPy
    rows, in NumPy)."""
    options = dict(mechanism=mechanism, pessimistic=pessimistic, fixed=fixed)
    rows = tail.shape[0]
    then = then or _grid_masses
    small = then is _grid_masses and rows <= HOST_ROWS and rows * size <= HOST_POINTS
    if ((host or small) and runs_on_host(mechanism, rounding)
            and all(array_module(a) is np for a in (*params, tail, step))):
        with np.errstate(all="ignore"):  # log(0) = -inf and the like, as in XLA
            rows = map_rows(functools.partial(_host_row, size=size, **options))(params, tail,
                                                                                step)
            return then(*rows, *extra)
    if pessimistic and rounding == "connect_dots":
        # in tiles, calls of one shape (their masses' one program takes their outputs)
        least = 1 if tiles is None else min(tiles, _call_tiles())
        values, offset, h = _in_tiles(_curve_kernel, params, tail, step, size=size, least=least,
                                      **options)
        if tiles is not None:
            return _tiled_masses_kernel(*_padded_parts((values, offset, h), tiles),
                                        np.int64(size), np.int64(rows), extra, then=then)
        return _masses_kernel(values, offset, h, extra, size=size, rows=tail.shape[0],
                              then=then)
    if tiles is not None:  # optimistic connect-the-dots in tiles
        outputs = _in_tiles(_tails_kernel, params, tail, step, size=size,
                            least=min(tiles, _call_tiles()), **options)
        return _tiled_tails_masses_kernel(*_padded_parts(outputs, tiles), np.int64(size),
                                          np.int64(rows), extra, then=then)
    at_points, offset, h, atom, top = _in_tiles(_tails_kernel, params, tail, step, size=size,
                                                **options)
    return _tails_masses_kernel(at_points, offset, h, atom, top, extra, size=size,
                                rows=tail.shape[0], pessimistic=pessimistic, rounding=rounding,
                                then=then)


def runs_on_host(mechanism: LossTails, rounding: str) -> bool:
    """Whether discretizing ``mechanism`` with ``rounding`` can run in NumPy on the host
    (:func:`_mechanism_kernel`): connect-the-dots, of a mechanism whose functions run in
    NumPy."""
    return rounding == "connect_dots" and mechanism.host


def _host_row(params, tail, step, *, mechanism: LossTails, size: int, pessimistic: bool,
              fixed: bool):
    """(probs, inf_mass, offset, step) of one row's connect-the-dots estimate in NumPy: the work
    of :func:`_curve_kernel` and :func:`_masses_kernel` (pessimistic), or of
    :func:`_tails_kernel` and :func:`_tails_masses_kernel` (optimistic), for concrete
    parameters in host memory (a mechanism with ``host`` set), with no program to compile."""
    offset, h = _window_grid(params, tail, step, mechanism=mechanism, size=size,
                             pessimistic=pessimistic, fixed=fixed)
    z = grid_points(offset, h, size)
    atom = np.float64(0.0 if mechanism.inf_mass is None else mechanism.inf_mass(params))
    top = np.float64(np.inf if mechanism.max_loss is None else mechanism.max_loss(params))
    if pessimistic:
        values = beyond_losses(z, top, atom, mechanism_curve(mechanism, params, z))
        probs, inf_mass = masses_from_values(values, h, z)
    else:
        at = np.concatenate([tail_points(z, pessimistic), _middle_point(z, h)])
        at_points = np.stack(np.broadcast_arrays(*mechanism_estimate(mechanism, params)(at)))
        probs, inf_mass = masses_from_tails(at_points, z, h, pessimistic, "connect_dots", atom,
                                            top)
    return probs, np.float64(inf_mass), np.int64(offset), np.float64(h)


def _grid_masses(probs, inf_mass, offset, step):
    """The mechanism kernels' default ``then``: the masses and their grids."""
    return probs, inf_mass, offset, step


#: Most tiles in one compiled call on a CPU: a call holds the power of two at or above its tiles,
#: up to this many, as often as needed (a grid of a power-of-two size has a power of two of
#: tiles: no points computed in vain; at most seven programs a mechanism, one for a sweep's
#: chunks).
CALL_TILES = 64
#: The same on an accelerator, where a call costs mostly its launch: a chunk of the accounting
#: (up to 2^24 points) in at most 8 calls.
ACCELERATOR_CALL_TILES = 2048


def _call_tiles() -> int:
    """Most tiles in one call of a tile kernel on the default backend."""
    return CALL_TILES if jax.default_backend() == "cpu" else ACCELERATOR_CALL_TILES


def _in_tiles(kernel, params, tail, step, *, size: int, least: int = 1, **options):
    """The outputs of ``kernel`` (:func:`_curve_kernel` or :func:`_tails_kernel`) for every tile
    of each row's grid of ``size`` points, as tuples of the calls' outputs (one per output),
    which :func:`_from_tiles` puts back together. At top level each call has a power of two of
    tiles, at least ``least``, at most CALL_TILES (ACCELERATOR_CALL_TILES off the CPU), padded
    with repeats; inside a
    trace one call holds them all."""
    tiles = -(-size // TILE)
    rows = tail.shape[0]
    if is_traced((params, tail, step)):
        index = jnp.repeat(jnp.arange(rows), tiles)
        tile = jnp.tile(jnp.arange(tiles), rows)
        out = kernel(tuple(p[index] for p in params), tail[index], step[index],
                     jnp.asarray(size, jnp.int64), tile, **options)
        return tuple((a,) for a in out)
    count = rows * tiles
    per_call = min(max(grid_lib.next_pow2(count), least), _call_tiles())
    padded = -(-count // per_call) * per_call
    index = np.minimum(np.arange(padded), count - 1)  # repeats of the last tile
    tile, index = index % tiles, index // tiles
    params, tail, step = ([np.asarray(a)[index] for a in params], np.asarray(tail)[index],
                          np.asarray(step)[index])
    size = np.asarray(size, np.int64)
    calls = [kernel(tuple(p[begin:begin + per_call] for p in params),
                    tail[begin:begin + per_call], step[begin:begin + per_call], size,
                    tile[begin:begin + per_call], **options)
             for begin in range(0, padded, per_call)]
    return tuple(zip(*calls, strict=True))


def _from_tiles(parts, size: int, rows: int):
    """One output of :func:`_in_tiles` (a tuple of the calls' arrays, a tile's values along the
    last axis) as ``rows`` rows of ``size`` values, inside a kernel."""
    tiles = -(-size // TILE)
    tiled = jnp.concatenate(parts)[:rows * tiles]
    tiled = tiled.reshape((rows, tiles) + tiled.shape[1:])
    return jnp.moveaxis(tiled, 1, -2).reshape(tiled.shape[:1] + tiled.shape[2:-1] + (-1,))[
        ..., :size]


def _row_firsts(parts, size: int, rows: int):
    """One output of :func:`_in_tiles` at each of the ``rows`` rows' first tile (a row's scalars,
    which each of its tiles repeats), inside a kernel."""
    tiles = -(-size // TILE)
    return jnp.concatenate(parts)[:rows * tiles:tiles]


# on a CPU, XLA's defaults: its tails (erfc, logs) ran 3x slower with FAST_COMPILE
@exported_jit(static_argnames=("mechanism", "pessimistic", "fixed"), cpu_options=None)
def _curve_kernel(params, tail, step, size, tile, **options):
    """(values, offset, step) of a batch of tiles: each one's TILE values of
    :func:`curve_values`, from the ``tile``-th tile of its grid of ``size`` points (data: one
    program for every size), and its grid's offset and step."""
    def one(single, single_tail, single_step, k):
        offset, h = _window_grid(single, single_tail, single_step, size=size, **options)
        z = grid_points(offset + k * TILE, h, TILE)
        mechanism = options["mechanism"]
        values = mechanism_curve(mechanism, single, z)
        if mechanism.max_loss is not None:
            atom = 0.0 if mechanism.inf_mass is None else mechanism.inf_mass(single)
            values = beyond_losses(z, mechanism.max_loss(single), atom, values)
        return values, offset, h

    return jax.vmap(one)(params, tail, step, tile)


def masses_rows(values, offset, step):
    """(probs, inf_mass) of a batch of :func:`curve_values` rows, each on its grid (offset, step)
    (see :func:`masses_from_values`)."""
    def one(row, single_offset, h):
        return masses_from_values(row, h, grid_points(single_offset, h, row.shape[0]))

    return jax.vmap(one)(values, offset, step)


@exported_jit(static_argnames=("size", "rows", "then"))
def _masses_kernel(values, offset, step, extra, *, size, rows, then):
    """``then`` of a batch of :func:`curve_values` rows' masses (:func:`masses_rows`), from the
    tiles of :func:`_in_tiles` (``values``, ``offset`` and ``step``: the curve calls' outputs,
    ``rows`` rows of ``size`` points)."""
    values = _from_tiles(values, size, rows)
    offset, step = (_row_firsts(parts, size, rows) for parts in (offset, step))
    return then(*masses_rows(values, offset, step), offset, step, *extra)


def _padded_parts(outputs, tiles: int):
    """:func:`_in_tiles`' outputs (tuples of the calls' arrays) with the last call's arrays
    repeated until they hold ``tiles`` tiles (the repeats are padding: no row reads them)."""
    held = sum(part.shape[0] for part in outputs[0])
    per_call = outputs[0][-1].shape[0]
    if held > tiles or (tiles - held) % per_call:
        raise ValueError(f"{held} tiles do not pad to {tiles} in calls of {per_call}")
    more = (tiles - held) // per_call
    return tuple(parts + (parts[-1],) * more for parts in outputs)


@exported_jit(static_argnames=("then",))
def _tiled_masses_kernel(values, offset, step, points, rows, extra, *, then):
    """``then`` of a batch of :func:`curve_values` rows' masses (:func:`masses_from_values`) in
    tiles: ``values``, ``offset`` and ``step`` are the curve calls' outputs (the tiles of
    :func:`_in_tiles`, padded), ``rows`` rows of ``points`` points (both data: one program for
    every grid size). ``then(probs, inf_mass, offset, step, layout, *extra)`` gets the masses
    in tiles, the others as row scalars of the layout (:class:`~pldjax.kernels.rows.TiledRows`)."""
    values = jnp.concatenate(values)
    offset, step = (jnp.concatenate(parts)[:, None] for parts in (offset, step))
    layout = TiledRows(values.shape[0], points, rows)
    z = (offset + layout.position()) * step
    return then(*masses_from_values(values, step, z, layout), offset, step, layout, *extra)


# FAST_COMPILE, unlike the curve: the four tails ran 8x slower with XLA's defaults (64
# subsampled Gaussians' optimistic sweep: 2.9 s against 0.35 s)
@exported_jit(static_argnames=("mechanism", "pessimistic", "fixed"))
def _tails_kernel(params, tail, step, size, tile, **options):
    """(tails, offset, step, atom, largest finite loss) of a batch of tiles: :func:`estimate_tails`
    on the ``tile``-th tile of each one's grid of ``size`` points (data: one program for every
    size), its point in the middle of the row's interval holding x = 1 last, with what
    :func:`masses_from_tails` needs of the mechanism besides."""
    mechanism = options["mechanism"]

    def one(single, single_tail, single_step, k):
        offset, h = _window_grid(single, single_tail, single_step, size=size, **options)
        z = grid_points(offset + k * TILE, h, TILE)
        # the row's _middle_point: the last grid point below 0 (its first: the row's points
        # below 0 are the first -offset), half a step up
        below = jnp.clip(-offset, 0, size) - 1
        middle = grid_points(offset + jnp.clip(below, 0, size - 1), h, 1) + h / 2
        atom = 0.0 if mechanism.inf_mass is None else mechanism.inf_mass(single)
        top = jnp.inf if mechanism.max_loss is None else mechanism.max_loss(single)
        at = jnp.concatenate([tail_points(z, options["pessimistic"]), middle])
        return (jnp.stack(jnp.broadcast_arrays(*mechanism_estimate(mechanism, single)(at))),
                offset, h,
                jnp.asarray(atom, jnp.float64), jnp.asarray(top, jnp.float64))

    return jax.vmap(one)(params, tail, step, tile)


@exported_jit(static_argnames=("size", "rows", "pessimistic", "rounding", "then"))
def _tails_masses_kernel(at_points, offset, step, atom, top, extra, *, size, rows, pessimistic,
                         rounding, then):
    """``then`` of a batch's masses (:func:`masses_from_tails`) and grids, from the tiles of
    :func:`_in_tiles` (``rows`` rows of ``size`` points): one compiled program per shape for
    every mechanism."""
    middle = _row_firsts(tuple(part[..., -1:] for part in at_points), size, rows)
    at_points = jnp.concatenate(
        [_from_tiles(tuple(part[..., :-1] for part in at_points), size, rows), middle], axis=-1)
    offset, step, atom, top = (_row_firsts(parts, size, rows)
                               for parts in (offset, step, atom, top))

    def one(single, single_offset, h, single_atom, single_top):
        z = grid_points(single_offset, h, size)
        return masses_from_tails(single, z, h, pessimistic, rounding, single_atom, single_top)

    probs, inf_mass = jax.vmap(one)(at_points, offset, step, atom, top)
    return then(probs, inf_mass, offset, step, *extra)


@exported_jit(static_argnames=("then",))
def _tiled_tails_masses_kernel(at_points, offset, step, atom, top, points, rows, extra, *, then):
    """``then`` of a batch's optimistic connect-the-dots masses (:func:`masses_from_tails`) in
    tiles, from the tails calls' outputs (the tiles of :func:`_in_tiles`, padded: each tile's
    tails with its row's middle point last, and its row's scalars), ``rows`` rows of ``points``
    points (both data: one program for every grid size); ``then`` as for
    :func:`_tiled_masses_kernel`."""
    at_points = jnp.moveaxis(jnp.concatenate(at_points), 1, 0)
    offset, step, atom, top = (jnp.concatenate(parts)[:, None]
                               for parts in (offset, step, atom, top))
    layout = TiledRows(at_points.shape[1], points, rows)
    z = (offset + layout.position()) * step
    probs, inf_mass = masses_from_tails(at_points, z, step, False, "connect_dots", atom, top,
                                        layout)
    return then(probs, inf_mass, offset, step, layout, *extra)


#: The compiled kernels a discretization runs (for pldjax.core.compilation's counts).
MECHANISM_KERNELS = (_curve_kernel, _masses_kernel, _tiled_masses_kernel, _tails_kernel,
                     _tails_masses_kernel, _tiled_tails_masses_kernel)


def _window_grid(params, tail, step, *, mechanism: LossTails, size: int, pessimistic: bool,
                 fixed: bool):
    """(offset, step) of one (unbatched) mechanism's grid of ``size`` points (an int, or an
    integer array inside a kernel: data): ``step`` when ``fixed``, else the automatic one."""
    xp = array_module(step)
    center, half_width = window(mechanism, params, tail)
    if not fixed:
        h = grid_lib.auto_step(mechanism.spread(params), half_width, size)
        if not pessimistic:
            h = xp.minimum(h, grid_lib.optimistic_step_limit(size))
    else:
        h = xp.asarray(step, xp.float64)
    return grid_lib.window_offset(center, h, size, pessimistic), h


@exported_jit(static_argnames=("mechanism",))
def _half_widths(params, tail, step, *, mechanism: LossTails):
    """Each element's half-width in units of ``step``. With no fixed step, in units of twice the
    fine step, so that a range of parameters shares one size (one compiled kernel); auto_step
    then picks the finest step that covers the loss."""
    return jax.vmap(functools.partial(_half_width_in_steps, mechanism, step=step))(params, tail)


def _half_width_in_steps(mechanism: LossTails, params, tail, step):
    """:func:`_half_widths` of one element, or elementwise of NumPy arrays."""
    h = 2 * grid_lib.fine_step(mechanism.spread(params)) if step is None else step
    return window(mechanism, params, tail)[1] / h


def _broadcast_flat(params, tail, xp):
    """(params, tail) broadcast together and flattened, as float64 arrays of ``xp``; the
    broadcast shape. A ``tail`` of None is 0 (the default windows)."""
    tail = 0.0 if tail is None else tail
    *params, tail = xp.broadcast_arrays(*(xp.asarray(a, xp.float64) for a in (*params, tail)))
    return tuple(p.reshape(-1) for p in params), tail.reshape(-1), tail.shape


def mechanism_half_widths(mechanism: LossTails, params, tail=None,
                          step=None) -> Callable[[], np.ndarray]:
    """Each element's window half-width (see :func:`window`) in units of ``step`` (1.0: nats;
    None: of twice its fine step, see :func:`_half_widths`), for the broadcast concrete
    ``params`` and ``tail``; flat. Starts their compiled call and returns the function that
    reads them, so that the caller's host work can run meanwhile."""
    params, tail, _ = _broadcast_flat(params, tail, np)
    count = tail.size
    if count == 0:
        return lambda: np.zeros(0)
    if mechanism.host:  # elementwise in NumPy: nothing to compile
        with np.errstate(all="ignore"):
            widths = np.asarray(_half_width_in_steps(mechanism, params, tail, step), np.float64)
        return lambda: widths
    # padded (repeating the last element) to a power of two >= 8 elements: one compiled shape
    # for a configuration's one or two directions and few for a sweep
    repeat_last = np.minimum(np.arange(max(8, grid_lib.next_pow2(count))), count - 1)
    params, tail = tuple(p[repeat_last] for p in params), tail[repeat_last]
    widths = _half_widths(params, tail, step, mechanism=mechanism)
    return lambda: np.asarray(widths)[:count]


def mechanism_sizes(mechanism: LossTails, params, grid: Grid | None = None,
                    tail=None, smallest: int = grid_lib.MECHANISM_SIZE) -> np.ndarray:
    """The number of grid points each element of the broadcast ``params`` (and ``tail``, see
    :func:`window`) would get alone (concrete parameters; flat): a power of two from
    ``smallest`` up that holds its window. A batch is discretized at the largest of its
    elements' sizes, so batching elements of one size changes no element's grid (used to group
    sweeps)."""
    grid = grid or Grid()
    if grid.size is not None:
        return np.full(_broadcast_flat(params, tail, np)[1].size, grid.size)
    return grid_lib.sizes_for_half_widths(mechanism_half_widths(mechanism, params, tail, grid.step)(),
                                    smallest)


def _size(mechanism: LossTails, params, tail, grid: Grid) -> int:
    if grid.size is not None:
        return grid.size
    if is_traced((params, tail)):
        if grid.step is not None:
            raise ValueError("a Grid with a fixed step needs an explicit size under jit")
        return grid_lib.MECHANISM_SIZE
    return int(np.max(mechanism_sizes(mechanism, params, grid, tail)))


def _check_step(step: float, size: int, pessimistic: bool) -> None:
    """A given step (nats) must be in (0, MAX_STEP] and keep the discretization's exponentials
    finite (see the module notes); of several, check the smallest and the largest."""
    if not 0 < step <= grid_lib.MAX_STEP:
        raise ValueError(f"Grid.step must be in (0, {grid_lib.MAX_STEP}] nats, got {step!r}")
    limit = grid_lib.optimistic_step_limit(size)
    if not pessimistic and step > limit:
        raise ValueError(
            f"Grid.step must be at most {limit} for an optimistic PLD of {size} points (the largest "
            f"power of two on which its window spans at most {grid_lib.OPTIMISTIC_SPAN} nats), got "
            f"{step!r}"
        )


def discretize_arrays(mechanism: LossTails, params, grid: Grid | None, pessimistic: bool,
                      tail=None, size: int | None = None, then: Callable | None = None,
                      extra: tuple = (), steps=None, host: bool = False,
                      tiles: int | None = None) -> tuple:
    """(probs, inf_mass, offset, step) of ``mechanism``'s (single-direction) PLD, batched over
    the broadcast ``params`` and ``tail`` (the mass of P each window may leave outside, see
    :func:`window`; None: 0, the default windows); ``size``: the grid size when the caller has
    it from :func:`mechanism_sizes`. Concrete results in host memory stay NumPy arrays (glue
    code reads them on the host; :func:`pldjax.mechanisms.events.discretize_directions` gives PLDs).
    ``then`` and ``extra``: the outputs of ``then(probs, inf_mass, offset, step, *extra)``
    instead, computed on the flat rows in the program of their masses and left where they are
    (untrimmed; see :func:`_mechanism_kernel`). ``steps``: concrete grid steps (nats)
    broadcasting with ``params``, each element's own, in place of ``grid.step`` (with ``size``:
    elements on different steps share one call). ``host``: small work with a ``then`` runs in
    NumPy too; ``tiles``: the masses in tiles (see :func:`_mechanism_kernel`)."""
    traced = is_traced((params, tail))
    xp = jnp if traced else np
    # on the host: no small compiled kernels for each array operation
    flat, flat_tail, shape = _broadcast_flat(params, tail, xp)
    grid = grid or Grid()
    if steps is not None and grid.step is not None:
        raise ValueError("pass either steps or a Grid(step=...), not both")
    size = size or _size(mechanism, flat, flat_tail, grid)
    fixed = steps is not None or grid.step is not None
    steps = np.asarray(grid.step or 0.0 if steps is None else steps, np.float64)
    if fixed and steps.size:
        for bound in (np.min(steps), np.max(steps)):
            _check_step(float(bound), size, pessimistic)
    fixed_steps = xp.broadcast_to(xp.asarray(steps, xp.float64), shape).reshape(-1)
    out = _mechanism_kernel(
        flat, flat_tail, fixed_steps, mechanism=mechanism, size=size,
        pessimistic=bool(pessimistic), fixed=fixed, rounding=grid.rounding, then=then,
        extra=extra, host=host, tiles=tiles,
    )
    if then is not None:
        return out
    probs, inf_mass, offset, step = out
    if not traced:
        # in host memory, the reshapes and the trim run in NumPy (each eager jnp operation would
        # be one more small program to compile, or to load from the cache, in every new process)
        xp = np if on_host(probs) else jnp
        probs, inf_mass, offset, step = (xp.asarray(a) for a in out)
    probs, offset = probs.reshape(shape + (size,)), offset.reshape(shape)
    if not (traced or grid.size is not None):
        probs, offset = _trim(probs, offset)
    return probs, inf_mass.reshape(shape), offset, step.reshape(shape)


def _occupied_range(probs) -> tuple[int, int]:
    """(first, last) index of the columns holding mass in any row; (0, 0) when none does."""
    occupied = np.flatnonzero(np.asarray((probs != 0).any(axis=0)))
    return (int(occupied[0]), int(occupied[-1])) if occupied.size else (0, 0)


#: Smallest window :func:`_trim` leaves.
_TRIM_MIN = 16


def _trim(probs, offset):
    """Drop the zero-mass bins at both ends of an automatic window when at least three quarters of
    it is empty (the PLD is unchanged; a mechanism whose loss lies beyond what the window can hold,
    e.g. Laplace at scale 1e-20, has all of its mass in the +inf atom, and later kernels would
    otherwise carry 2^20 empty points)."""
    size = probs.shape[-1]
    first, last = _occupied_range(probs.reshape(-1, size))
    used = max(last + 1 - first, 1)
    new_size = max(grid_lib.next_pow2(used), _TRIM_MIN)
    if 4 * new_size > size:
        return probs, offset
    first = min(first, size - new_size)
    return probs[..., first:first + new_size], offset + first
