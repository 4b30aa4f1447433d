"""Gaussian differential privacy: the smallest mu with L below G_mu, and the GDP residue.

G_mu is the PLD of the Gaussian mechanism with sensitivity / sigma = mu; its loss under P is
N(mu^2/2, mu^2) and its curve is delta_mu(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu).

* :func:`gdp_mu`: the smallest mu with L dominated by G_mu (the naive GDP filter's cost).
* :func:`gdp_residue` (Regehr et al. 2026, Thm 5): the largest mu' in [0, mu] with
  G_mu' (+) L dominated by G_mu, by a bounded Newton search inside jit. The composed curve is
  exact at the query's grid points: for a grid PLD L with masses p_i at z_i,
  delta_{G_mu' (+) L}(eps) = sum_i p_i delta_mu'(eps - z_i) + p_inf, a discrete convolution of p
  with delta_mu' sampled on the same grid (one FFT per test, exponentially tilted so that its
  round-off, which is charged, shrinks into the far tail: :func:`_tilt`). Between the points both curves are
  convex in x = e^eps: the composed one lies below its chords and G_mu above its tangents, which
  is what :func:`_verdict` compares. The naive update sqrt(mu^2 - nu^2) (nu = gdp_mu(L)) is valid
  by construction, so the search starts from it and the residue is never below it.

Both searches test a candidate (a yes/no certificate) and steer by a score, the log of the
largest ratio of the curve to its bound (of what each exceeds the slack by): the test is
monotone, so a search with a bracket needs a few tests where bisection took 32-64, and only
values that passed the test are returned. gdp_mu runs a secant (:func:`_search`) on a few of the
curve's intervals and tests the answer on all of them (two such tests where the secant took
11-25); the residue takes Newton steps (:func:`newton_search`) with the score's exact slope at
its worst check (3-7 tests).

Soundness: every "below" certifies delta <= delta_{G_mu} + delta_slack + ROUNDOFF at every eps >= 0
in every direction, which for the symmetric G_mu is the full order (see :func:`_verdict`
and :mod:`pldjax.kernels.divergences`); a filter charges that slack to its delta budget. G_mu's curve is
computed with erfc and the Mills ratio (:func:`gdp_parts`, relative error bounded by
:func:`gdp_error`, checked against mpmath) and the bound is widened by that error on each side,
then lowered by 4 ulps (_SUM_MARGIN) for the rounding of the sums on either side.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.align import regrid_kernel, regrid_size
from pldjax.core.compilation import (
    HOST_ROWS,
    array_module,
    computed_once,
    cores,
    host_work,
    kernel_jit,
    map_in_threads,
    map_rows,
    readable_on_host,
    while_loop,
)
from pldjax.core.grid import MAX_SIZE, check_size, next_pow2
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD, batched, broadcast_rows, computed_on_host
from pldjax.core.precision import float64, host_result, root_of_difference_down
from pldjax.core.special import MILLS_SERIES, special_functions
from pldjax.core.validation import check_count, check_range, is_traced
from pldjax.kernels.compose import fft_roundoff
from pldjax.kernels.dominance import ROUNDOFF
from pldjax.kernels.hockey_stick import curve_roundoff, grid_deltas, padded_to_a_power_of_two

#: Default number of search steps of the residue (tests after its first): the search stops
#: earlier once its bracket is narrower than _RESIDUE_RTOL mu'^2 + _RESIDUE_ATOL mu^2.
RESIDUE_STEPS = 16
#: Width of the bracket in s = mu'^2 at which the residue search stops: relative to the s reached,
#: plus a floor of mu^2 that keeps small residues (a nearly spent budget) resolved.
_RESIDUE_RTOL = 1e-5
_RESIDUE_ATOL = 1e-7
#: Search steps and relative tolerance of gdp_mu (and of the naive update inside the residue).
_MU_STEPS = 40
_MU_RTOL = 1e-15
#: gdp_mu's working set: intervals of the curve spread over it to begin with, added per round,
#: and most rounds.
_MU_SPREAD = 64
_MU_CANDIDATES = 16
_MU_ROUNDS = 6
#: The residue's check window covers [0, mu^2/2 + _TAIL_SIGMAS * mu] on the query's grid, where
#: G_mu's curve falls below Phi(-8.5) < 1e-17, a thousandth of ROUNDOFF; beyond it the composed
#: curve (non-increasing) is compared by its last value with the slack plus ROUNDOFF (the flat
#: check), which is what the bound there is to within that thousandth. (11 sigmas, 2e-28, gave
#: the same residues to 1.2e-6 on 33% longer windows.)
_TAIL_SIGMAS = 8.5
#: Smallest mu gdp_mu tests: queries below it (the identity, to the grid's resolution) get it.
_TINY_MU = 1e-300
#: The budget's bounds (G_mu's curve plus the slack plus ROUNDOFF) are lowered by this factor, 4
#: ulps: a curve and its bound are both sums rounded to nearest (an atom of 0.5 added to a curve
#: of 1e-14 keeps it to an ulp of 0.5), so either may be half an ulp of its size off the exact
#: value; with a large slack that was more than the certificate's own ROUNDOFF can absorb.
_SUM_MARGIN = 1.0 - 2.0**-50
#: Largest residue check window (grid points); coarser query grids are used beyond it.
MAX_RESIDUE_SIZE = 2**15
#: Largest budget mu of a residue (mu^2 must stay finite in float64; G_mu is fully revealing to
#: double precision far below it).
MAX_MU = 1e100
#: From here on e^x Phi(-t) is phi(mu/2 - x/mu) times the Mills ratio's asymptotic series (erfc
#: would underflow soon after; before it, exp(x) erfc(t / sqrt 2) loses about t^2 ulps, within
#: gdp_error); the series' error there is below 1e-18 relative.
_MILLS_FROM = 36.0
_SQRT_HALF = 0.7071067811865476
_LOG_SQRT_2PI = 0.9189385332046728
_INV_SQRT_2PI = 0.3989422804014327


def _mills(t):
    """Phi(-t) / phi(t) for t >= _MILLS_FROM: (1/t) sum_k (-1)^k (2k-1)!! / t^(2k), k < 8."""
    u = 1.0 / (t * t)
    series = 0.0
    for coefficient in MILLS_SERIES[::-1]:
        series = coefficient + u * series
    return series / t


def _erfc(xp):
    """XLA's erfc for ``jax.numpy``, SciPy's for NumPy (both within :func:`gdp_error`)."""
    return jax.lax.erfc if xp is jnp else special_functions(xp).erfc


def _phi(a):
    """The standard normal density."""
    return array_module(a).exp(-0.5 * a * a - _LOG_SQRT_2PI)


def gdp_parts(mu, x):
    """(delta_mu(x), e^x Phi(-mu/2 - x/mu)) for every real x (the second is -x d delta / dx), each
    within :func:`gdp_error` of the exact value (relative); mu = 0 gives the identity's (1 - e^x)_+.

    With a = mu/2 - x/mu and t = mu/2 + x/mu: delta = Phi(a) - e^x Phi(-t). Phi(a) comes from one
    erfc; e^x Phi(-t) from exp(x) erfc(t / sqrt 2) while t < _MILLS_FROM, else as phi(a) M(t)
    (e^x phi(t) = phi(a)) with the Mills ratio M: no log_ndtr, no overflow, no underflow of a
    term that matters. Two erfc and two exp per point (log_ndtr costs about four times that)."""
    xp = array_module(mu, x)
    erfc = _erfc(xp)
    safe = xp.maximum(mu, 1e-300)
    a = safe / 2 - x / safe
    t = safe / 2 + x / safe
    p1 = 0.5 * erfc(-a * _SQRT_HALF)
    direct = 0.5 * xp.exp(xp.minimum(x, 700.0)) * erfc(xp.minimum(t, _MILLS_FROM) * _SQRT_HALF)
    if xp is np and not np.any(t >= _MILLS_FROM):  # on the host: no series where none is needed
        p2 = direct
    else:
        p2 = xp.where(t < _MILLS_FROM, direct, _phi(a) * _mills(xp.maximum(t, _MILLS_FROM)))
    return xp.maximum(p1 - p2, 0.0), p2


def gdp_error(mu):
    """Relative error bound of :func:`gdp_parts`'s delta at ``mu``: 2^-32 (1 + 1/mu), at most 1
    (the curve is a difference of two nearby terms when mu is small; checked against mpmath in
    tests/kernels/test_gaussian_dp.py, whose worst case is 6.4e-12 (1 + 1/mu)). The computed G_mu
    curve is raised by it where it bounds a query from above and lowered where it is the budget."""
    xp = array_module(mu)
    return xp.minimum(2.0**-32 * (1.0 + 1.0 / xp.maximum(mu, 1e-300)), 1.0)


def gdp_delta_upper(mu, x):
    """An upper bound on delta_mu(x) at x >= 0: the smallest of :func:`gdp_parts`'s delta raised
    by :func:`gdp_error` (where that bound is below 1), delta_mu(0) = erf(mu / sqrt 8) <=
    mu / sqrt(2 pi) (the curve falls with x) and its first term Phi(mu/2 - x/mu). The last two
    hold where the first is lost: for mu below about 1e-15 the difference of two values near 1/2
    leaves no digit of delta_mu (0 instead of 4e-17 at mu = 1e-16, x = 0)."""
    xp = array_module(mu, x)
    delta, _ = gdp_parts(mu, x)
    error = gdp_error(mu)
    relative = xp.where(error < 1.0, delta * (1.0 + error), 1.0)
    safe = xp.maximum(mu, 1e-300)
    flat = mu * _INV_SQRT_2PI * (1.0 + 2.0**-40)
    first = 0.5 * _erfc(xp)((x / safe - safe / 2) * _SQRT_HALF) * (1.0 + 2.0**-32)
    return xp.minimum(xp.minimum(relative, flat), xp.minimum(first, 1.0))


def gdp_delta_lower(mu, x):
    """A lower bound on delta_mu(x): :func:`gdp_parts`'s delta lowered by :func:`gdp_error` and
    by 1e-300 (an erfc in the subnormal range keeps few digits), 0 where the error bound reaches
    1 (the two terms' difference has lost its digits)."""
    xp = array_module(mu, x)
    delta, _ = gdp_parts(mu, x)
    error = gdp_error(mu)
    return xp.where(error < 1.0, xp.maximum(delta * (1.0 - error) - 1e-300, 0.0), 0.0)


#: Added to :func:`gdp_delta_upper` where :func:`gdp_epsilon_bound` reads it: an erfc in the
#: subnormal range keeps few digits, and one that underflowed reads 0 where delta is not.
_UNDERFLOW = 1e-300


def gdp_epsilon_bound(mu, delta, pessimistic: bool) -> np.ndarray:
    """epsilon(delta) of G_mu (NumPy, on the host; ``mu`` >= 0 and ``delta`` in [0, 1], arrays
    that broadcast), in nats: pessimistic, the least float found at which
    :func:`gdp_delta_upper` (raised by 1e-300) is at most ``delta``, an upper bound on the
    exact value; optimistic, the largest float found at which :func:`gdp_delta_lower` is at
    least ``delta``, a lower bound (0 where none is). Both are within an ulp of the float where
    their bound crosses ``delta`` (a bisection on the floats' bit patterns, which order
    non-negative floats as their values: at most 64 halvings, whatever the range). inf where
    ``delta`` is 0 and ``mu`` > 0 (G_mu is not pure DP) or where ``mu`` is inf; 0 where
    ``delta`` is 1 or ``mu`` is 0."""
    mu, delta = (np.asarray(a, np.float64) for a in np.broadcast_arrays(mu, delta))
    out = np.zeros(mu.shape)
    live = (mu > 0) & (delta < 1.0)
    out[live & ((delta == 0) | np.isinf(mu))] = np.inf
    live &= (delta > 0) & np.isfinite(mu)
    mu, delta = mu[live], delta[live]
    if pessimistic:
        def fits(x):
            return gdp_delta_upper(mu, x) + _UNDERFLOW <= delta
    else:
        def fits(x):
            return ~(gdp_delta_lower(mu, x) >= delta)
    # (squares and series terms of huge arguments overflow to inf, which the curve reads as 0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        # beyond mu^2/2 + mu z the first term Phi(mu/2 - x/mu) < delta, z = Phi^-1(1 - delta)
        # <= sqrt(2 log(1/delta)); doubled while it is not
        high = mu * mu / 2 + mu * (np.sqrt(2.0 * np.log(1.0 / delta)) + 1.0) + 1.0
        for _ in range(2100):
            short = ~fits(high) & np.isfinite(high)
            if not short.any():
                break
            high = np.where(short, 2.0 * high, high)
        low_bits = np.zeros(mu.shape, np.int64)  # 0.0
        high_bits = np.where(np.isfinite(high), high, np.finfo(np.float64).max).view(np.int64)
        at_zero = fits(np.zeros(mu.shape))
        while np.any(high_bits - low_bits > 1):
            middle = low_bits + (high_bits - low_bits) // 2
            good = fits(middle.view(np.float64))
            high_bits = np.where(good, middle, high_bits)
            low_bits = np.where(good, low_bits, middle)
        if pessimistic:
            found = np.where(at_zero, 0.0, high_bits.view(np.float64))
            found = np.where(fits(found), found, np.inf)  # beyond the largest float: inf
        else:
            found = np.where(at_zero, 0.0, low_bits.view(np.float64))
    out[live] = found
    return out


def gdp_delta_bound(mu, epsilon, pessimistic: bool) -> np.ndarray:
    """delta(epsilon) of G_mu (NumPy, on the host; ``mu`` >= 0 and ``epsilon`` >= 0, arrays that
    broadcast, inf allowed): :func:`gdp_delta_upper` raised by 1e-300 (pessimistic, an upper
    bound) or :func:`gdp_delta_lower` (optimistic, a lower bound); 0 at epsilon = inf, 1 at
    mu = inf (finite epsilon)."""
    mu, epsilon = (np.asarray(a, np.float64) for a in np.broadcast_arrays(mu, epsilon))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        finite = np.where(np.isfinite(epsilon), epsilon, 0.0)
        value = (np.minimum(gdp_delta_upper(mu, finite) + _UNDERFLOW, 1.0) if pessimistic
                 else gdp_delta_lower(mu, finite))
    value = np.where(np.isinf(mu), 1.0, value)
    return np.where(np.isinf(epsilon), 0.0, value)


def gdp_complement_upper(mu, x, tail):
    """An upper bound on 1 - delta_mu(x) = Phi(-mu/2 + x/mu) + e^x Phi(-mu/2 - x/mu), from
    :func:`gdp_parts`'s ``tail`` (the second term) and one erfc: both terms positive, so no
    cancellation; raised by :func:`gdp_error` and by 1e-300 for an erfc that underflowed."""
    xp = array_module(mu, x)
    erfc = _erfc(xp)
    safe = xp.maximum(mu, 1e-300)
    below = 0.5 * erfc((safe / 2 - x / safe) * _SQRT_HALF)
    return (below + tail) * (1.0 + gdp_error(mu)) + 1e-300


def _gdp_delta(mu, eps):
    """delta_mu(eps) for every real eps (within :func:`gdp_error`); mu = 0 gives (1 - e^eps)_+."""
    return gdp_parts(mu, eps)[0]


def _with_lead(z, d):
    """The points and curve values with eps = 0 added in front when the points start above it
    (the curve is linear in x = e^eps below its first point)."""
    xp = array_module(z, d)
    lead = xp.minimum(z[0], 0.0)
    return (xp.concatenate([xp.reshape(lead, (1,)), z]),
            xp.concatenate([xp.reshape(1.0 - (1.0 - d[0]) * xp.exp(lead - z[0]), (1,)), d]))


def _flat_bound(delta_slack):
    """What a curve's last value (its flat tail beyond the points) is compared with: G_mu is 0
    there, so the slack plus ROUNDOFF, lowered by _SUM_MARGIN like every bound."""
    return (delta_slack + ROUNDOFF) * _SUM_MARGIN


def _widths(z):
    """(e^h - 1, e^-h) of each interval's width h = z_{i+1} - z_i: what :func:`_budget_bounds`
    needs of the points besides their values, the same for every mu (a scalar pair for points a
    constant step apart)."""
    xp = array_module(z)
    width = z[1:] - z[:-1]
    return xp.expm1(width), xp.exp(-width)


def _budget_bounds(z, mu, delta_slack, widths):
    """What a curve at the increasing points ``z`` is compared with under the budget G_mu plus
    the slack: (point bounds, chord positions t, chord bounds), all lower bounds on
    delta_mu + delta_slack + ROUNDOFF at the points and on the tangent envelope between them;
    ``widths`` = :func:`_widths` of the points.

    Between two points a curve convex in x = e^eps is below its chord and G_mu's convex curve
    above both tangents at the ends; chord minus the larger tangent is concave, so comparing at
    the ends and at the tangents' crossing (position t in [0, 1]) suffices."""
    xp = array_module(z, mu)
    g, tail = gdp_parts(mu, z)
    g = (g * (1.0 - gdp_error(mu)) + delta_slack + ROUNDOFF) * _SUM_MARGIN
    # where 1 - G_mu (computed without cancellation) is below ROUNDOFF / 2, G_mu + ROUNDOFF
    # exceeds 1, which bounds every curve: 1 there (the widened value falls short of it, and
    # no curve near 1 passed a point of a mu above 10)
    g = xp.where(gdp_complement_upper(mu, z, tail) <= ROUNDOFF / 2, xp.maximum(g, 1.0), g)
    slope = -tail  # x times d delta / dx at the points
    # computed once: the slices below would otherwise each be fused with (and redo) the erfc's
    g, slope = computed_once((g, slope))
    # on [x_i, x_{i+1}], x = x_i (1 + u), u in [0, grow] (t = u / grow): tangent i is
    # g_i + s_i u, tangent i+1 is g_{i+1} + s_{i+1} (e^-h u - shrink), h = z_{i+1} - z_i and
    # shrink = e^-h grow = 1 - e^-h; in u every term stays finite where grow overflows (a first
    # point thousands of nats above eps = 0)
    grow, back = widths
    shrink = xp.where(xp.isfinite(grow), back * grow, 1.0)
    g0, g1, s0, s1 = g[:-1], g[1:], slope[:-1], slope[1:]
    denominator = s0 - s1 * back  # <= 0: the curve is convex
    numerator = g1 - g0 - s1 * shrink
    u = xp.clip(numerator / xp.where(denominator < 0, denominator, -1.0), 0.0, grow)
    u = xp.where(denominator < 0, u, 0.0)
    envelope = xp.maximum(g0 + s0 * u, g1 + s1 * (back * u - shrink))
    return g, xp.where(grow > 0, u / xp.where(grow > 0, grow, 1.0), 0.0), envelope


def _ratio(value, bound, floor, used):
    """(value - floor) / (bound - floor) where ``used`` (0 elsewhere), the denominator at least
    2^-40 floor: differences from the floor below that are its round-off (a curve an ulp above a
    bound an ulp above the floor read 1, "at the boundary", whatever mu)."""
    xp = array_module(value, bound)
    return xp.where(used, (value - floor) / xp.maximum(bound - floor, 2.0**-40 * floor), 0.0)


def _checks(z, d, bounds, delta_slack):
    """The curve ``d`` at the increasing points ``z`` (convex in x = e^eps) against the budget
    whose :func:`_budget_bounds` are given, wherever eps >= 0: (chord ok, point ok, chord ratio,
    point ratio), each chord's between its two points and each point's. A ratio compares what
    exceeds the bound's constant part c = delta_slack + ROUNDOFF: (curve - c) / (bound - c), 1 at
    the boundary like curve / bound, but not held near 1 by a large slack whatever mu (a curve at
    c passes for every mu); it only steers searches, ok decides."""
    g, t, envelope = bounds
    floor = delta_slack + ROUNDOFF
    chord = d[:-1] + (d[1:] - d[:-1]) * t
    # a bound of 1 or more holds for every curve: it does not steer
    return ((chord <= envelope) | (z[1:] <= 0.0), (d <= g) | (z < 0.0),
            _ratio(chord, envelope, floor, (z[1:] > 0.0) & (envelope < 1.0)),
            _ratio(d, g, floor, (z >= 0.0) & (g < 1.0)))


def _score(worst):
    """A search's score from the largest ratio of :func:`_checks`: its log, kept finite."""
    xp = array_module(worst)
    return xp.log(xp.clip(worst, 1e-300, 1e300))


def _comparisons(z, d, bounds, delta_slack):
    """:func:`_checks` per interval [z_i, z_{i+1}]: (ok, ratio) of its chord and its two ends."""
    xp = array_module(z, d)
    chord_ok, point_ok, chord_ratio, point_ratio = _checks(z, d, bounds, delta_slack)
    return (chord_ok & point_ok[:-1] & point_ok[1:],
            xp.maximum(chord_ratio, xp.maximum(point_ratio[:-1], point_ratio[1:])))


def _verdict(z, d, bounds, delta_slack):
    """(ok, score, at, along): ok if the curve ``d`` at the points ``z`` (convex in x = e^eps, flat
    beyond the last point) is below the budget whose :func:`_budget_bounds` are given, at every
    eps >= 0; score = log of the largest ratio of :func:`_checks` (> 0 roughly where not ok; it only
    steers the search, ok decides), found at the point ``at`` or on the chord from it, ``along``
    (position t in [0, 1]) of the way to the next (0 for a point).

    Why eps >= 0 is enough: G_mu is symmetric, so a pair is below it iff both directions' curves
    are below it at eps >= 0 (the curve at -eps is fixed by the other direction's at eps), and
    every direction is checked (a one-direction PLD stands for a symmetric pair). Below eps = 0 a
    pessimistic grid curve carries the Q-only mass its rounding creates (about 1e-4 after
    coarsening, 1e-6 after composition) and would fail a comparison that says nothing about DP.
    Right of the points the curve is at most its last value while G_mu tends to 0.
    """
    xp = array_module(z, d)
    # reduced apart, not per interval (:func:`_comparisons`): the residue's tests ran 10% faster
    chord_ok, point_ok, chord_ratio, point_ratio = _checks(z, d, bounds, delta_slack)
    flat = d[-1] <= _flat_bound(delta_slack)  # whatever mu: no ratio of its own
    ok = xp.all(chord_ok) & xp.all(point_ok) & flat
    top_chord, top_point = xp.max(chord_ratio), xp.max(point_ratio)
    worst = xp.maximum(xp.maximum(top_chord, top_point), xp.where(flat, 0.0, 1e300))
    chord = top_chord > top_point
    at = xp.where(chord, _first_index(chord_ratio, top_chord), _first_index(point_ratio, top_point))
    return ok, _score(worst), at, xp.where(chord, bounds[1][at], 0.0)


def _first_index(values, target):
    """Index of the first of ``values`` equal to ``target`` (an argmax from a max; jnp.argmax of
    float64 under vmap fails to trace with x64 off)."""
    xp = array_module(values)
    n = values.shape[0]
    return xp.min(xp.where(values == target, xp.arange(n, dtype=xp.int32), n - 1))


def _grid_curve(probs, inf_mass, offset, step):
    """(points, curve) of a grid PLD, the curve of its finite masses raised by
    :func:`~pldjax.kernels.hockey_stick.curve_roundoff` (an upper bound on the exact curve of the
    grid PLD; the atom at +inf is exact, so a slack of exactly the atom covers the curve's flat
    tail) and led by eps = 0 if the grid starts above it."""
    xp = array_module(probs)
    z = (offset + xp.arange(probs.shape[0], dtype=xp.float64)) * step
    return _with_lead(z, grid_deltas(probs, inf_mass, step, 1.0 + curve_roundoff(probs.shape[0])))


def _search(evaluate, good, bad, points, steps: int | jax.Array, tol, score_tol):
    """Safeguarded secant search on a bracket [good, bad] (either order) of a monotone test:
    ``evaluate(v)`` -> (ok, score, value); ok moves the good end, otherwise the bad end. Only
    values that passed ``evaluate`` (or the initial good end, which the caller certifies) are
    ever returned, so the search is as sound as one test. The score (about 0 at the boundary,
    < 0 on the good side) only places the next point: the secant through the last two points
    tested (``points`` = ((v0, score0), (v1, score1)) to start), kept at least ``tol`` / 2 inside
    the bracket, so that once the good end is within ``tol`` / 2 of the boundary the next point
    closes the bracket; the midpoint where the secant is undefined or outside, or the bracket
    has not halved in five tests (so it shrinks at least geometrically). ``tol`` is a function
    of the good end. Stops when the bracket is at most ``tol`` wide or the good end scored above
    -``score_tol`` (a while loop, at most ``steps`` tests). ``good`` = (v, value, score).
    Returns the good end's value (the third output of ``evaluate``, or the initial one), the bad
    end (where the test failed, or the initial one) and the good end's score."""
    xp = array_module(good[0], bad)
    (x0, f0), (x1, f1) = points

    def body(carry):
        k, gv, gval, gf, bv, x0, f0, x1, f1, ref, stall = carry
        lo, hi = xp.minimum(gv, bv), xp.maximum(gv, bv)
        width = hi - lo
        secant = x1 - f1 * (x1 - x0) / xp.where(f1 != f0, f1 - f0, 1.0)
        nudge = xp.minimum(tol(gv) / 2, width / 2)
        usable = (f1 != f0) & (secant > lo) & (secant < hi) & (stall < 5)
        # the midpoint: geometric across a wide bracket of positive values
        middle = xp.where((lo > 0) & (hi > 4 * lo), xp.sqrt(lo) * xp.sqrt(hi), lo + width / 2)
        x = xp.where(usable, xp.clip(secant, lo + nudge, hi - nudge), middle)
        ok, f, value = evaluate(x)
        gv, gval, gf = xp.where(ok, x, gv), xp.where(ok, value, gval), xp.where(ok, f, gf)
        bv = xp.where(ok, bv, x)
        new_width = xp.abs(gv - bv)
        halved = new_width <= ref / 2
        return (k + 1, gv, gval, gf, bv, x1, f1, x, f, xp.where(halved, new_width, ref),
                xp.where(halved, 0, stall + 1).astype(xp.int32))

    def cond(carry):
        k, gv, _, gf, bv = carry[:5]
        return (k < steps) & (xp.abs(gv - bv) > tol(gv)) & (gf < -score_tol)

    start = (xp.zeros((), xp.int32), *good, bad, x0, f0, x1, f1, xp.abs(good[0] - bad),
             xp.zeros((), xp.int32))
    end = while_loop(cond, body, start)
    return end[2], end[4], end[3]


def newton_search(evaluate, good, bad, first, steps: int, tol):
    """Largest value passing a monotone test on the bracket (good, bad), good < bad, by Newton
    steps on the test's score; ``evaluate(x)`` -> (ok, score, slope, value): ok moves the good end
    up, otherwise the bad end down; the score is about 0 at the boundary (< 0 on the good side) and
    ``slope`` its derivative in x at the check that set it. ``good`` = (x, value) is certified by
    the caller and never tested; only values that passed the test (or it) are returned, so the
    search is as sound as one test. ``tol`` is a function of the good end.

    The first test is at ``first``; then each aims at the root r of an end's score: the bad end's
    where it has one (past the boundary the binding comparison sets the score, while a good end's
    may be a flatter comparison's whose root lies far beyond), by the secant through the last two
    failures or with one, by its slope (Newton); else the good end's by its slope. It goes
    a quarter of tol below r (a likely pass that leaves the good end near the boundary); where an
    end is within 0.65 tol of r, a quarter of tol past r but at most 0.9 tol from that end, so that
    the bracket closes in one test. Where r is outside the bracket, where neither end has a slope,
    or where the bracket has not halved in four tests: the midpoint (geometric across a wide
    bracket of positive values). Stops when the bracket is at most tol wide or after ``steps``
    tests after the first; returns the good end's value."""
    xp = array_module(good[0], bad)
    nan = xp.asarray(xp.nan, xp.float64)

    def root(end, score, slope):
        return xp.where(xp.isfinite(score) & (slope > 0), end - score / slope, nan)

    def body(carry):
        k, g, value, fg, dg, b, fb, db, b0, fb0, ref, stall = carry
        width, t = b - g, tol(g)
        # from the bad end: the secant through the last two failures where there are two (it
        # follows the binding comparison's curvature), else the slope
        secant = (fb - fb0) / (b - b0)
        from_bad = root(b, fb, xp.where(xp.isfinite(secant) & (secant > 0), secant, db))
        from_good = root(g, fg, dg)
        r = xp.where((from_bad > g) & (from_bad < b), from_bad,
                      xp.where((from_good > g) & (from_good < b), from_good, nan))
        x = xp.where(r - g < 0.65 * t, xp.minimum(r + t / 4, g + 0.9 * t),
                      xp.where(b - r < 0.65 * t, xp.maximum(r - t / 4, b - 0.9 * t), r - t / 4))
        middle = xp.where((g > 0) & (b > 4 * g), xp.sqrt(g) * xp.sqrt(b), g + width / 2)
        x = xp.where(xp.isfinite(r) & (stall < 4), x, middle)
        nudge = xp.minimum(t, width) / 4
        x = xp.where(k == 0, first, xp.clip(x, g + nudge, b - nudge))
        ok, f, d, v = evaluate(x)
        g, value, fg, dg = (xp.where(ok, new, old) for new, old in ((x, g), (v, value), (f, fg),
                                                                        (d, dg)))
        b0, fb0 = xp.where(ok, b0, b), xp.where(ok, fb0, fb)
        b, fb, db = (xp.where(ok, old, new) for new, old in ((x, b), (f, fb), (d, db)))
        halved = b - g <= ref / 2
        return (k + 1, g, value, fg, dg, b, fb, db, b0, fb0, xp.where(halved, b - g, ref),
                xp.where(halved, 0, stall + 1).astype(xp.int32))

    def cond(carry):
        k, g = carry[:2]
        b = carry[5]
        return (k <= steps) & (b - g > tol(g))

    g, value = good
    bad = xp.asarray(bad, xp.float64)
    start = (xp.zeros((), xp.int32), g, value, nan, nan, bad, nan, nan, bad, nan, bad - g,
             xp.zeros((), xp.int32))
    return while_loop(cond, body, start)[2]


def gdp_mu_kernel(probs, inf_mass, offset, step, delta_slack, mu_max, rtol=_MU_RTOL):
    """Smallest mu in (0, mu_max] (to relative resolution ``rtol``, rounded up: the value returned
    passed the test) with L below G_mu plus the slack; inf if not even mu_max is enough.

    Few of the curve's intervals bind, so the search runs on a working set of them (at most a
    few hundred points a test, not the grid's thousands): _MU_SPREAD intervals spread over the
    grid and the _MU_CANDIDATES around eps = 0 to begin with. Each round's secant search on the
    set gives a candidate, which is tested on the whole curve: a pass ends the search (a smaller
    value fails the set, a subset of the curve's comparisons, so the candidate is the smallest
    to ``rtol``); a failure adds its worst interval and its _MU_CANDIDATES - 1 neighbours to the
    set. One or two rounds are typical (a subsampled Gaussian's remove direction binds at
    eps = 0: one; its add direction, G_nu, randomized response: two). The last of _MU_ROUNDS
    rounds tests mu_max, and bisection on the whole curve finishes what the rounds (or a search
    on a flat score) left open."""
    xp = array_module(probs)
    mu_max = xp.asarray(mu_max, xp.float64)
    z, d = _grid_curve(probs, inf_mass, offset, step)
    # right of the points the curve stays at its last value, which no mu covers beyond the slack
    flat_ok = d[-1] <= _flat_bound(delta_slack)
    # a start below: G_mu(0) must reach the curve at the first point >= 0 (less the slack)
    reach = xp.max(xp.where(z >= 0, d, 0.0)) - delta_slack - ROUNDOFF
    start = 2.0 * special_functions(xp).ndtri(xp.clip((1.0 + reach) / 2, 0.5, 1.0 - 1e-16))
    # never above that lower bound (a floor of mu_max * 1e-30 passed, and was returned, for
    # gaussian(1) at mu_max = 1e31: 10); positive, for the search's geometric midpoints
    floor = xp.clip(start * (1 - 1e-9), _TINY_MU, mu_max)

    widths = _widths(z)

    def whole(mu):
        return _comparisons(z, d, _budget_bounds(z, mu, delta_slack, widths), delta_slack)

    def on_set(intervals):
        # the intervals' ends one after the other: every other interval of these points is one
        # of the set's, those between (from one's end back to the next one's start) are ignored
        ends = xp.stack([intervals, intervals + 1], axis=-1).reshape(-1)
        z_set, d_set = z[ends], d[ends]
        widths_set = _widths(z_set)

        def evaluate(mu):
            ok, ratio = _comparisons(z_set, d_set,
                                     _budget_bounds(z_set, mu, delta_slack, widths_set),
                                     delta_slack)
            return xp.all(ok[::2]), _score(xp.max(ratio[::2])), mu

        return evaluate

    def round_(carry):
        k, intervals, low, answer, rounds_done = carry
        evaluate = on_set(intervals)
        # both ends in one test (one copy of its program, not two: 10% less to compile)
        (ok_max, ok_low), (f_max, f_low), _ = map_rows(evaluate)(xp.stack([mu_max, low]))
        # low passing the set (the floor may): an empty bracket, nothing to search
        top = xp.where(ok_low, low, mu_max)
        found, below, f_found = _search(evaluate, (top, top, xp.where(ok_low, f_low, f_max)),
                                        low, ((mu_max, f_max), (low, f_low)),
                                        xp.where(rounds_done, 0, _MU_STEPS),
                                        lambda good: rtol * good, rtol)
        # the search ended where it should: its bracket closed, or at the boundary's score
        closed = (found - below <= rtol * found) | (f_found >= -rtol)
        last = k + 1 >= _MU_ROUNDS
        # once the rounds are done, where they ran out (mu_max passed) or the last search did (a
        # flat score): bisection on the whole curve from the last failure, in the same loop (one
        # copy of the whole curve's test in the program, not two: 15% less to compile)
        middle = xp.where((low > 0) & (answer > 4 * low), xp.sqrt(low) * xp.sqrt(answer),
                           low + (answer - low) / 2)
        candidate = xp.where(rounds_done, middle, xp.where(last, mu_max, found))
        ok, ratio = whole(candidate)
        passed = xp.all(ok)
        # the worst interval, failed ones first (a failed comparison's ratio is below 1 where its
        # bound is within round-off of the slack), and its neighbours (XLA's top_k on a CPU costs
        # 50 whole tests; argmax of float64 with x64 off fails to trace under vmap)
        key = xp.where(ok, xp.minimum(ratio, 1.0), 2.0 + xp.maximum(ratio, -1.0))
        worst = _first_index(key, xp.max(key))
        worst = xp.clip(worst + xp.arange(_MU_CANDIDATES) - _MU_CANDIDATES // 2, 0, n - 1)
        grown = _placed(intervals, worst.astype(intervals.dtype),
                        _MU_SPREAD + (k + 1) * _MU_CANDIDATES)
        # failing on the working set, mu_max fails the curve: nothing fits; a value that fails
        # the set (the search's bad end) fails the curve, and bounds what is left open
        searched = (k + 1, grown,
                    xp.where(passed & closed & ~last, candidate,
                              xp.where(passed, below, candidate)),
                    xp.where(passed, candidate, answer), passed | ~ok_max | last)
        halved = (k, intervals, xp.where(passed, low, candidate),
                  xp.where(passed, candidate, answer), rounds_done)
        return tuple(xp.where(rounds_done, h, r) for h, r in zip(halved, searched, strict=True))

    def open_(carry):
        _, _, low, answer, rounds_done = carry
        return ~rounds_done | (answer - low > rtol * answer)

    n = z.shape[0] - 1
    spread = xp.linspace(0, n - 1, _MU_SPREAD).astype(xp.int32)
    # and the intervals around eps = 0, where a direction of small loss binds (the remove
    # direction of a subsampled Gaussian): its first round then passes
    zero = _first_index(z >= 0, True) - 1 + xp.arange(_MU_CANDIDATES) - _MU_CANDIDATES // 2
    intervals = xp.concatenate([spread, xp.clip(zero, 0, n - 1).astype(xp.int32),
                                 xp.zeros(_MU_CANDIDATES * _MU_ROUNDS, xp.int32)])
    start_carry = (xp.zeros((), xp.int32), intervals, floor, xp.asarray(xp.inf, xp.float64),
                   ~flat_ok)
    return while_loop(open_, round_, start_carry)[3]


def _placed(array, values, start):
    """``array`` with ``values`` written from index ``start`` on (clamped so that all of them fit,
    as ``jax.lax.dynamic_update_slice`` does)."""
    if array_module(array) is not np:
        return jax.lax.dynamic_update_slice(array, values, (start,))
    start = int(np.clip(start, 0, array.shape[0] - values.shape[0]))
    placed = array.copy()
    placed[start:start + values.shape[0]] = values
    return placed


_gdp_mu_jit = kernel_jit(gdp_mu_kernel)


@float64
def gdp_mu(pld: PLD, *, delta_slack: float = 0.0, mu_max: float = 64.0):
    """Smallest mu such that the PLD is dominated by G_mu (mu-GDP), up to ``delta_slack``.

    An upper bound on the true value for a pessimistic PLD: the comparison is with G_mu's exact
    curve, sound between grid points (tangent lines); it certifies
    delta_L <= delta_{G_mu} + delta_slack + ROUNDOFF at every eps. Both directions of a
    two-direction PLD must be dominated. inf when no mu <= ``mu_max`` works (e.g. an atom at +inf
    above the slack). Batched over the PLD's batch axes. A small PLD in host memory (see
    :func:`~pldjax.core.pld.computed_on_host`) is searched in NumPy: no program to compile.
    """
    if not pld.pessimistic:
        raise ValueError("gdp_mu needs a pessimistic PLD (an upper bound) for a sound answer")
    check_range("delta_slack", delta_slack, 0.0, 1.0)
    check_range("mu_max", mu_max, 0.0, low_open=True)
    host = not is_traced((delta_slack, mu_max)) and computed_on_host([pld], pld.size)
    result = None
    for direction in pld.directions():
        if host:
            rows = broadcast_rows(direction, direction.batch_shape)
            search = functools.partial(gdp_mu_kernel, delta_slack=np.float64(delta_slack),
                                       mu_max=np.float64(mu_max))
            with np.errstate(all="ignore"):  # NaN and inf are values the search handles
                out = map_rows(search)(*(np.asarray(a) for a in (rows.probs, rows.inf_mass,
                                                                 rows.offset, rows.step)))
            out = out.reshape(direction.batch_shape)
        else:
            fn = batched(lambda p, m, o, h: _gdp_mu_jit(p, m, o, h, delta_slack, mu_max),
                         len(direction.batch_shape))
            probs = direction.probs
            if not is_traced(probs):
                # zero masses above the window (the curve there is the atom, already compared
                # at every eps): the sizes of a short ladder, a few compiled programs for every
                # PLD
                probs = padded_to_a_power_of_two(probs, -1, 0.0)
            out = fn(probs, direction.inf_mass, direction.offset, direction.step)
        result = out if result is None else array_module(out).maximum(result, out)
    return host_result(result)


#: Bisection steps of :func:`gdp_mu_below_kernel` (in log mu across [_TINY_MU, MAX_MU]: 920 nats
#: of log mu, halved 80 times, leave a bracket about 1e-21 relative wide).
_BELOW_STEPS = 80


def gdp_mu_below_kernel(epsilons: np.ndarray, deltas: np.ndarray) -> np.float64:
    """The largest mu (rounded down) that points below a privacy profile force on any mu-GDP
    guarantee of it: for a pair with delta(eps_i) >= ``deltas[i]`` at each ``epsilons[i]`` (eps >= 0;
    an optimistic PLD's profile is such a lower bound), every mu whose G_mu dominates the pair
    (delta <= delta_mu at every eps) is at least the value returned (0 where no point forces
    anything). In NumPy (the points are a PLD's readings, on the host).

    delta_mu(eps) grows with mu, so each point's mu is found by bisection in log mu, keeping the
    lower end only where delta_mu(eps) raised by :func:`gdp_error` is at most the point's delta: a
    mu certified there is below any mu whose curve reaches that delta."""
    def certified(mu):
        return (_gdp_delta(mu, epsilons) * (1.0 + gdp_error(mu)) <= deltas) & (deltas > 0)

    low, high = np.full(np.shape(epsilons), _TINY_MU), np.full(np.shape(epsilons), MAX_MU)
    for _ in range(_BELOW_STEPS):
        middle = np.sqrt(low) * np.sqrt(high)
        ok = certified(middle)
        low, high = np.where(ok, middle, low), np.where(ok, high, middle)
    return np.max(np.where(certified(low) & (epsilons >= 0), low, 0.0))


@float64
def gdp_mu_below(pld: PLD, epsilons):
    """A lower bound on the smallest mu with the true mechanism mu-GDP, from its optimistic PLD
    read at ``epsilons`` (nats, >= 0; the more, and the closer to where G_mu binds, the tighter):
    see :func:`gdp_mu_below_kernel`, run in NumPy. The worse direction of a two-direction PLD
    counts; not batched."""
    if pld.pessimistic:
        raise ValueError("gdp_mu_below needs an optimistic PLD (a lower bound) for a sound answer")
    if pld.batch_shape:
        raise ValueError(f"gdp_mu_below takes one PLD, got batch shape {pld.batch_shape}")
    epsilons = np.asarray(epsilons, np.float64).reshape(-1)
    check_range("epsilons", epsilons, 0.0, allow_inf=False)
    if epsilons.size == 0:
        return 0.0
    deltas = np.asarray(pld.delta(epsilons), np.float64)
    with np.errstate(all="ignore"):  # as in XLA
        return float(gdp_mu_below_kernel(epsilons, deltas))


# -- residue --------------------------------------------------------------------------------------
def size_class(n):
    """The smallest m 2^k >= n (and >= 16) with m in {8, 9, 10, 12, 15}: five sizes an octave, all
    5-smooth, so that static shapes stay few while a window or an FFT is at most 25% (12.5% on
    average) longer than it needs to be. Elementwise on an array of counts; an int for an int."""
    count = np.maximum(np.asarray(n, np.int64), 16)
    # count / 8 < 2 octave (frexp's exponent is the bit length; int64 before the shift)
    octave = np.left_shift(np.int64(1), np.frexp(count)[1].astype(np.int64) - 4)
    candidates = np.multiply.outer(np.array([8, 9, 10, 12, 15, 16, 18, 20, 24, 30]), octave)
    sizes = np.min(np.where(candidates >= count, candidates, np.iinfo(np.int64).max), axis=0)
    return int(sizes) if np.ndim(n) == 0 else sizes


def _window_plans(mu_max, step, n: int):
    """(factor, size) for queries of ``n`` points with budgets up to ``mu_max`` on grids of
    ``step`` (arrays of one entry per query): the query grid is coarsened ``factor``-fold (a power
    of two, a float: it may exceed int64 for huge mu) until its check window needs at most
    MAX_RESIDUE_SIZE points to cover [0, w], w = mu^2/2 + _TAIL_SIGMAS mu; the window then fills
    its test's transform (:func:`_fft_length`), so that no lag of it is evaluated in vain."""
    mu_max = np.asarray(mu_max, np.float64)
    reach = mu_max**2 / 2 + _TAIL_SIGMAS * mu_max
    factor = np.ones_like(reach * np.asarray(step, np.float64))
    while True:
        points = np.ceil(reach / (step * factor)) + 2
        over = points > MAX_RESIDUE_SIZE
        if not np.any(over):
            break
        factor = np.where(over, 2 * factor, factor)
    coarse = np.zeros(factor.shape, np.int64)
    for each in np.unique(factor):
        coarse[factor == each] = _coarse_points(n, int(each))
    return factor, size_class(coarse - 1 + points.astype(np.int64)) - coarse + 1


def _coarse_points(n: int, factor: int) -> int:
    """Points of an ``n``-point query grid coarsened ``factor``-fold for the residue search."""
    return n if factor == 1 else regrid_size(n, 1 / factor)


def _fft_length(n: int, size: int) -> int:
    """FFT length of a residue test on ``n`` query points and ``size`` check points: outputs
    n-1 .. n-2+size of a cyclic convolution of that length are exact."""
    return size_class(n - 1 + size)


def query_mu(probs, inf_mass, offset, step, delta_slack, mu_max):
    """gdp_mu of one query whose arrays carry a leading direction axis (the largest of its
    directions'), inf above ``mu_max``."""
    xp = array_module(probs)
    mu_max = xp.maximum(mu_max, 1e-300)
    return xp.max(map_rows(lambda p, m, o, h: gdp_mu_kernel(p, m, o, h, delta_slack, mu_max,
                                                           _MU_RTOL))(probs, inf_mass, offset, step))


def _tilt(mu, reach_lags, reach_points):
    """Exponential tilt lambda of a residue test's convolution: it composes p_i e^(lambda z_i) with
    G(x) e^(lambda x), whose convolution at eps is e^(lambda eps) times the curve. The FFT's
    round-off is about the same in every output bin (a few 1e-16 of the largest), so untilted it
    shrinks by e^(-lambda eps): the far tail, where a subsampled Gaussian's residue binds at
    curves of 1e-12 and less, is computed to far below its margin instead of to 1e-15.

    lambda = -(log delta_mu)'(0) = Phi(-mu/2) / delta_mu(0) keeps e^(lambda eps) delta_mu(eps) at
    most delta_mu(0) (log-concave), so a curve near the budget's is no larger tilted than at
    eps = 0 and the round-off there is as before; at most 300 over the largest |lag| and |z|, so
    no factor overflows and nothing that matters underflows."""
    xp = array_module(mu, reach_lags, reach_points)
    g, tail = gdp_parts(mu, xp.zeros(()))
    slope = tail / xp.maximum(g, 1e-300)
    return xp.minimum(slope, 300.0 / xp.maximum(xp.maximum(reach_lags, reach_points), 1e-300))


def residue_kernel(probs, inf_mass, offset, step, mu, delta_slack, *, size: int, steps: int,
                   factor: int = 1, nu=None):
    """(mu', accepted) for one query and one budget mu; ``probs`` etc. carry a leading direction
    axis (1 or 2 directions, all of which must fit). The query fits when nu = gdp_mu(query) <= mu
    (certified on the query's own grid, rounded up: :func:`query_mu`, or ``nu`` when the caller
    has it), and mu' >= the naive update sqrt(mu^2 - nu^2) (the theorem's: it is not tested).
    From there a bracketed Newton search (:func:`newton_search` in s = mu'^2, at most ``steps``
    tests after the first, stopping when the bracket is narrower than 1e-5 s + 1e-7 mu^2) looks
    for larger values with G_mu' (+) L below G_mu plus the slack, on the query's grid coarsened
    ``factor``-fold (pessimistically, by connect-the-dots: :func:`pldjax.core.align.regrid_kernel`) so
    that the check window of ``size`` points reaches the tail of G_mu (0 if rejected). Every test
    is one FFT convolution and one sum over the query's points (the score's slope); G_mu's side
    of the comparison is computed once. Traced, or in NumPy (on the host) for NumPy arrays."""
    xp = array_module(probs)
    mu = xp.asarray(mu, xp.float64)
    if nu is None:
        nu = query_mu(probs, inf_mass, offset, step, delta_slack, mu)
    # the budget 0 (G_0, the identity) holds exactly the queries whose delta(0), in every
    # direction, the slack covers (nu's search starts at 1e-300): residue 0 (a sum of positive
    # terms, each rounded up in relative 1e-12; each direction's delta at eps < 0 then follows
    # from the other's at -eps)
    points = (offset[:, None] + xp.arange(probs.shape[-1])) * step[:, None]
    at_zero = inf_mass + xp.sum(probs * -xp.expm1(-xp.maximum(points, 0.0)), axis=-1)
    free = (mu == 0) & xp.all(at_zero * (1.0 + 1e-12) <= delta_slack)
    accepted = (nu <= mu) | free
    naive = xp.where(accepted & ~free, root_of_difference_down(mu, nu), 0.0)
    if factor > 1:
        coarse = functools.partial(regrid_kernel, size=_coarse_points(probs.shape[-1], factor),
                                   pessimistic=True)
        step_coarse = step * float(factor)  # a float: the factor may exceed int64 for huge mu
        probs, offset = map_rows(coarse)(probs, offset, step, step_coarse)
        step = step_coarse
    n = probs.shape[-1]
    nfft = _fft_length(n, size)
    checks = xp.arange(size)[None, :] * step[:, None]  # eps_j = j h, per direction (from 0)
    # lags k = j - i for check j and grid point i: eps_j - z_i = (k - offset) h; all nfft of them,
    # the tilt 0 past the n - 1 + size used (the transform's zero padding: G_mu' fused into a pad
    # ran about 2x slower a point on XLA's CPU backend)
    lags = (xp.arange(-(n - 1), nfft - (n - 1))[None, :] - offset[:, None]) * step[:, None]
    used = xp.arange(nfft) < n - 1 + size
    points = (offset[:, None] + xp.arange(n)[None, :]) * step[:, None]
    tilt = _tilt(mu, xp.max(xp.where(used, xp.abs(lags), 0.0)), xp.max(xp.abs(points)))
    spectra = xp.fft.rfft(probs * xp.exp(tilt * points), nfft)
    lag_tilt, untilt = xp.where(used, xp.exp(tilt * lags), 0.0), xp.exp(-tilt * checks)
    # the checks are a step apart: two scalars per direction for their widths
    bounds = map_rows(lambda z, widths: _budget_bounds(z, mu, delta_slack, widths))(
        checks, (xp.expm1(step), xp.exp(-step)))
    verdict = map_rows(lambda z, d, bounds: _verdict(z, d, bounds, delta_slack))
    floor = delta_slack + ROUNDOFF

    def slope(mu_residue, curve, at, along, probs, lags):
        # d/ds of log(curve - floor) (s = mu'^2) at the worst check, a point or along a chord
        # (the derivative taken at its nearer end): d delta_mu / d mu = phi(mu/2 - x/mu), summed
        # over the query's points at their lags eps - z_i
        near = xp.minimum(at + (along > 0.5), size - 1)
        x = (lags[near:near + n] if xp is np else jax.lax.dynamic_slice(lags, (near,), (n,)))[::-1]
        safe = xp.maximum(mu_residue, 1e-300)
        change = xp.sum(probs * _phi(safe / 2 - x / safe)) / (2 * safe)
        value = curve[at] + (curve[xp.minimum(at + 1, size - 1)] - curve[at]) * along
        excess = value - floor
        return xp.where(excess > 0, change / xp.where(excess > 0, excess, 1.0), xp.nan)

    def evaluate(s):
        mu_residue = xp.sqrt(s)
        raw = xp.fft.irfft(spectra * xp.fft.rfft(_gdp_delta(mu_residue, lags) * lag_tilt), nfft)
        # raised by the FFT's round-off (as a composition's bins are), untilted, and by the lag
        # curve's relative error (which also covers the tilt's few ulps): an upper bound on the
        # exact composed curve
        curves = ((raw[:, n - 1:n - 1 + size] + map_rows(fft_roundoff)(raw)[:, None]) * untilt
                  * (1.0 + gdp_error(mu_residue)) + inf_mass[:, None])
        ok, score, at, along = verdict(checks, curves, bounds)
        slopes = map_rows(functools.partial(slope, mu_residue))(curves, at, along, probs, lags)
        top = xp.max(score)
        return xp.all(ok), top, xp.max(xp.where(score == top, slopes, -xp.inf)), mu_residue

    s_naive, s_top = naive * naive, mu * mu
    # the naive update is the theorem's (certified with nu), not tested; the first test 30% of the
    # way up (the gains over it are typically 30-95% of the way up); nothing to search where the
    # query does not fit
    low = newton_search(evaluate, (s_naive, naive), xp.where(accepted, s_top, s_naive),
                        s_naive + 0.3 * (s_top - s_naive), steps,
                        lambda good: _RESIDUE_RTOL * good + _RESIDUE_ATOL * s_top)
    return xp.where(accepted & ~free, xp.maximum(low, naive), 0.0), accepted


@np.errstate(all="ignore")  # NaN and inf are values the searches handle
def _residues_on_host(queries, slack, which, mus, mu_max, factors, windows, steps: int):
    """:func:`gdp_residue`'s residues of the pairs (``which`` query, budget ``mus``) in NumPy,
    each query's nu searched once up to its ``mu_max``; -inf where a query does not fit."""
    nus = _nus_on_host(queries, slack, mu_max)
    residue = np.full(which.shape[0], -np.inf)
    for i, w in enumerate(which):
        found, fits = _pairs_on_host(queries, slack, nus, which[i:i + 1], mus[i:i + 1],
                                     int(factors[w]), int(windows[w]), steps)
        residue[i] = found[0] if fits[0] else -np.inf
    return residue


@np.errstate(all="ignore")  # NaN and inf are values the searches handle
def _pairs_on_host(queries, slack, nus, which, mus, factor: int, window: int, steps: int):
    """(residue, fits) of :func:`residue_kernel` in NumPy for the pairs (``which`` query, budget
    ``mus``) of one check window (``factor``, ``window``), the queries' ``nus`` given."""
    found, fits = np.zeros(which.shape[0]), np.zeros(which.shape[0], bool)
    for i, (w, budget) in enumerate(zip(which, mus, strict=True)):
        found[i], fits[i] = residue_kernel(
            *(np.asarray(a[w]) for a in queries), np.float64(budget), np.asarray(slack[w]),
            size=window, steps=steps, factor=factor, nu=nus[w])
    return found, fits


def _nus_on_host(queries, slack, mu_max) -> np.ndarray:
    """Each query's nu (:func:`query_mu`, searched up to its ``mu_max``) in NumPy."""
    return np.array([query_mu(*(a[w] for a in queries), slack[w], np.float64(mu_max[w]))
                     for w in range(slack.shape[0])])


def residue_plan(mu_max, pld: PLD, size: int | None) -> tuple[int, int]:
    """(factor, size): how many-fold the query's grid is coarsened for the residue search so that
    its check window fits, and the static window size, for budgets up to ``mu_max`` (its largest)
    and the PLD's finest step; host-side, before jit."""
    if size is not None:
        return 1, check_size("size", size, minimum=16, maximum=MAX_SIZE)
    factor, size = _window_plans(np.max(mu_max), np.min(np.asarray(pld.step, np.float64)),
                                 pld.size)
    return int(factor), int(size)


def _pad_rows(array, padding: int):
    """``array`` with ``padding`` copies of its last row appended along its leading axis."""
    xp = array_module(array)
    return xp.pad(array, [(0, padding)] + [(0, 0)] * (array.ndim - 1), mode="edge")


def map_chunks(fn, xs, count, fill, *, batch_size: int):
    """``jax.lax.map(fn, xs, batch_size=batch_size)`` run on the first ``count`` rows only (a
    traced count, so that calls padded to one shape share a program): the chunks past it are not
    run, and their rows are ``fill`` (a pytree like ``fn``'s output, of scalars)."""
    tree_map = jax.tree_util.tree_map
    rows = jax.tree_util.tree_leaves(xs)[0].shape[0]
    total = -(-rows // batch_size) * batch_size
    xs = tree_map(lambda a: _pad_rows(a, total - rows), xs)
    chunk_fn = jax.vmap(fn)
    shapes = jax.eval_shape(chunk_fn, tree_map(lambda a: a[:batch_size], xs))
    out = tree_map(lambda shape, value: jnp.full((total,) + shape.shape[1:], value, shape.dtype),
                   shapes, fill)

    def body(i, out):
        part = tree_map(lambda a: jax.lax.dynamic_slice_in_dim(a, i * batch_size, batch_size), xs)
        return tree_map(lambda o, got: jax.lax.dynamic_update_slice_in_dim(o, got, i * batch_size, 0),
                        out, chunk_fn(part))

    out = jax.lax.fori_loop(0, (count + batch_size - 1) // batch_size, body, out)
    return tree_map(lambda o: o[:rows], out)


def _queries_nu(queries, slack, mu_max, count, *, batch_size: int):
    """nu = gdp_mu (the naive update's) of the first ``count`` queries (a leading axis of
    ``queries``) with their ``slack``, searched up to their ``mu_max``, ``batch_size`` queries at
    a time; inf for the others, which are not searched."""
    return map_chunks(lambda args: query_mu(*args), (*queries, slack, mu_max), count, jnp.inf,
                      batch_size=batch_size)


def _residue_pairs(queries, slack, nu, which, mu, count, *, size: int, steps: int,
                   batch_size: int, factor: int):
    """(residue, accepted) of residue_kernel for the first ``count`` budgets ``mu`` (flat) and
    queries ``queries[which]`` with their ``slack[which]`` and ``nu[which]``, ``batch_size``
    pairs at a time; (0, False) for the other pairs, which are not searched."""

    def one(args):
        w, u = args
        p, m, o, h = (a[w] for a in queries)
        return residue_kernel(p, m, o, h, u, slack[w], size=size, steps=steps, factor=factor,
                              nu=nu[w])

    return map_chunks(one, (which, mu), count, (0.0, False), batch_size=batch_size)


_queries_nu_jit = kernel_jit(_queries_nu, static_argnames=("batch_size",))
_residue_pairs_jit = kernel_jit(_residue_pairs,
                                static_argnames=("size", "steps", "batch_size", "factor"))


#: Pairs of one check window that a process searches in NumPy (:func:`gdp_residue`), in place
#: of the window's compiled program, before it compiles the program: a ski rental, counted in
#: the process's host work (pldjax.core.compilation.HostWork: each pair as its directions times
#: its transform's points). On a 2-core CPU a subsampled-Gaussian pair took 25 ms in NumPy
#: against 5 ms compiled, where a window's program took 1.4-2.4 s to trace and compile: a
#: first residue table of 16 x 9 nodes (144 pairs, 3 windows) 7.2 s compiled.
HOST_RESIDUE_PAIRS = 96


def _padded_count(count: int, batch_size: int) -> int:
    """What ``count`` queries or pairs are padded to: whole chunks of ``batch_size``, a power of
    two of them up to 16 chunks and a :func:`size_class` beyond (at most 25% more memory), so
    that calls whose counts vary compile a few shapes, not one each (a new count recompiled
    every kernel of its call: 11-14 s for 60, 63 and 64 subsampled-Gaussian queries on a 2-core
    CPU). The chunks past ``count`` are not run (:func:`map_chunks`)."""
    chunks = -(-count // batch_size)
    return batch_size * (next_pow2(chunks) if chunks <= 16 else size_class(chunks))


#: Pairs :func:`gdp_residue` searches together by default on a CPU. A vmapped search runs until
#: its slowest pair is done, for every pair of the chunk, and on a CPU a chunk gains little from
#: being wide: 256 subsampled-Gaussian pairs took 2.49 s in chunks of 8 against 4.15 s in one of
#: 256 (2 cores; randomized response 0.60 against 0.71 s). Since gdp_mu's working set, chunks
#: of 4 (2-core AMD EPYC, 64 pairs, milliseconds a pair for chunks of 1/2/4/8/16):
#: subsampled Gaussian 5.09/4.53/4.58/5.42/6.43, randomized response 2.35/1.92/1.68/1.67/1.84.
RESIDUE_BATCH_CPU = 4
#: Elsewhere a chunk holds as many pairs as fill RESIDUE_POINTS transform points (directions x
#: FFT length a pair; each test keeps a few complex arrays of that size), a power of two up to
#: RESIDUE_BATCH: on an H100, 10^4 randomized-response pairs (15,360 points each) took 0.123 s in
#: chunks of 256 and 0.092 s in chunks of 2,048; subsampled-Gaussian ones (two directions of
#: 16,384) 0.849 and 0.822 s.
RESIDUE_POINTS = 2**25
RESIDUE_BATCH = 2048


def residue_batch_size(points: int = 0) -> int:
    """The default ``batch_size`` of :func:`gdp_residue` on the default backend, for pairs of
    ``points`` transform points each (0: unknown, the most pairs)."""
    if jax.default_backend() == "cpu":
        return RESIDUE_BATCH_CPU
    pairs = min(RESIDUE_BATCH, max(1, RESIDUE_POINTS // max(int(points), 1)))
    return 1 << (pairs.bit_length() - 1)


@announces_slow_calls("pldjax.gdp_residue")
@float64
def gdp_residue(mu, query: PLD, *, delta_slack=0.0, steps: int = RESIDUE_STEPS,
                size: int | None = None, batch_size: int | None = None):
    """The largest mu' in [0, mu] with G_mu' (+) L dominated by G_mu (Regehr et al. 2026, Thm 5).

    A sound lower bound (pessimistic): G_mu' (+) query is certified below G_mu plus
    ``delta_slack`` + ROUNDOFF at every eps (charge that to a delta budget; ``delta_slack`` must
    cover the query's atom at +inf). Never below the naive GDP update sqrt(mu^2 - nu^2). Never
    NaN: ``-inf`` where the query does not fit (it is not certified below G_mu, so no residue
    exists; ``-inf`` orders below every valid residue and fails ``>= 0``, like a filter's
    accepted=False). ``mu`` and the query's batch axes broadcast: each distinct query's nu, of
    the naive update, is searched once for all its budgets, and the pairs whose queries need the
    same check window are one compiled call, ``batch_size`` pairs at a time (default
    :func:`residue_batch_size`: 4 on a CPU; elsewhere up to 2,048, fewer for long transforms;
    never more than the next power of two of the pairs searched together; the result does not
    depend on it, nor on the pairs of other queries). ``steps``: most search steps after the
    first test (it stops earlier, at a bracket of 1e-5 mu'^2 + 1e-7 mu^2; typically 2-3 are
    used for pure-DP queries, 3-6 for subsampled-Gaussian ones); ``size``:
    check window points (automatic on the host: each query's own, from its finest step and its
    largest budget, so a call whose queries span many grid steps compiles one kernel per window,
    about a second each on a CPU, kept by the persistent compilation cache; the numbers of
    queries and pairs are padded to a few sizes, so that later calls with other numbers reuse
    them; under jit the window must be given, and the query's step is then used as is).
    """
    if not query.pessimistic:
        raise ValueError("gdp_residue needs a pessimistic query PLD (an upper bound)")
    check_range("mu", mu, 0.0, MAX_MU)
    check_range("delta_slack", delta_slack, 0.0, 1.0)
    steps = check_count("steps", steps, minimum=1)
    if batch_size is not None:
        batch_size = check_count("batch_size", batch_size, minimum=1)
    traced = is_traced((mu, query, delta_slack))
    if traced and size is None:
        raise ValueError("gdp_residue under jit needs size=")
    if size is not None:
        _, size = residue_plan(mu, query, size)  # checks the window given
    xp = jnp if traced else np  # concrete glue in NumPy: no small program per operation
    mu = xp.asarray(mu, xp.float64)
    # the distinct (query, slack) pairs, each searched for its nu once: a query broadcast
    # against many budgets (a residue table) does not repeat it
    queries_shape = np.broadcast_shapes(query.batch_shape, np.shape(delta_slack))
    shape = np.broadcast_shapes(mu.shape, queries_shape)
    stacked = query.stack_directions()
    on_the_host = not traced and all(readable_on_host(a) for a in stacked)
    nb = len(query.batch_shape)
    directions, n = stacked[0].shape[nb:]
    queries = tuple(xp.broadcast_to(xp.asarray(a), queries_shape + a.shape[nb:])
                    .reshape((-1,) + a.shape[nb:]) for a in stacked)
    slack = xp.broadcast_to(xp.asarray(delta_slack, xp.float64), queries_shape).reshape(-1)
    count = int(np.prod(queries_shape, dtype=np.int64))
    which = np.broadcast_to(np.arange(count).reshape(queries_shape), shape).reshape(-1)
    mus = xp.broadcast_to(mu, shape).reshape(-1)

    def chunk(factor, window, rows):
        # never wider than the rows (a vmapped chunk computes its padding too)
        return min(next_pow2(rows), batch_size or residue_batch_size(
            directions * _fft_length(_coarse_points(n, factor), window)))

    if traced:  # one window, the query's own steps
        mu_max = jax.ops.segment_max(mus, which, num_segments=count)
        nu = _queries_nu(queries, slack, mu_max, count, batch_size=chunk(1, size, count))
        residue, accepted = _residue_pairs(queries, slack, nu, which, mus, which.shape[0],
                                           size=size, steps=steps,
                                           batch_size=chunk(1, size, which.shape[0]), factor=1)
        return jnp.where(accepted, residue, -jnp.inf).reshape(shape)
    mus = np.asarray(mus)
    mu_max = np.zeros(count)  # 0 for a query without pairs (only where there are none at all)
    np.maximum.at(mu_max, which, mus)
    if size is None:
        # each query its own window, from its finest step and its largest budget: pairs are
        # searched in groups of one window (a batch mixing steps of 2^-10 and 2^-8 otherwise
        # checks the coarse ones over four times the reach they need)
        factors, windows = _window_plans(
            mu_max, np.min(np.asarray(queries[3]).reshape(count, -1), axis=1), n)
    else:
        factors, windows = np.ones(count), np.full(count, size)
    if on_the_host and which.shape[0] <= HOST_ROWS:  # a few pairs: searched in NumPy
        return _residues_on_host(queries, slack, which, mus, mu_max, factors, windows,
                                 steps).reshape(shape)
    # padded (with copies of the last query, and of a group's last pair) to _padded_count, every
    # group to its call's number of pairs (the pairs past a group's are not searched)
    queries_batch = chunk(1, 0, count)
    padding = _padded_count(count, queries_batch) - count
    # a few queries (a residue table's): their nu searched in NumPy, not compiled
    nu = _nus_on_host(queries, slack, mu_max) if on_the_host and count <= HOST_ROWS else None
    if padding:
        queries, slack = tuple(_pad_rows(a, padding) for a in queries), _pad_rows(slack, padding)
    if nu is None:
        nu = _queries_nu_jit(queries, slack, np.pad(mu_max, (0, padding)), np.int32(count),
                             batch_size=queries_batch)
    else:
        nu = np.pad(nu, (0, padding), mode="edge")
    keys = np.stack([factors, windows], axis=1)[which]
    nus = np.asarray(nu)
    groups = []  # the pairs of one window each
    for factor, window in np.unique(keys, axis=0):
        factor, window = int(factor), int(window)
        pairs = np.nonzero((keys[:, 0] == factor) & (keys[:, 1] == window))[0]
        # alike pairs side by side (a chunk searches as long as its slowest pair): by the share
        # of the budget the query's nu takes; the bench's gauss chunks ran 335 tests, not 351
        pairs = pairs[np.argsort(nus[which[pairs]] / np.maximum(mus[pairs], 1e-300), kind="stable")]
        groups.append((pairs, factor, window))

    def rented(pairs, factor: int, window: int) -> bool:
        """Whether a window's pairs are searched in NumPy (see HOST_RESIDUE_PAIRS)."""
        points = directions * _fft_length(_coarse_points(n, factor), window)
        return on_the_host and host_work.claim(
            pairs.shape[0] * points, ("gdp_residue", directions, n, factor, window),
            HOST_RESIDUE_PAIRS * points)

    groups = [(pairs, factor, window, rented(pairs, factor, window))
              for pairs, factor, window in groups]

    @float64  # in each worker thread: JAX's 64-bit switch is the thread's own
    def search(group):
        pairs, factor, window, host = group
        if host:
            return _pairs_on_host(queries, slack, np.asarray(nu), which[pairs], mus[pairs],
                                  factor, window, steps)
        batch = chunk(factor, window, pairs.shape[0])
        padding = _padded_count(which.shape[0], batch) - pairs.shape[0]
        return _residue_pairs_jit(
            queries, slack, nu, np.pad(which[pairs], (0, padding), mode="edge"),
            np.pad(mus[pairs], (0, padding), mode="edge"), np.int32(pairs.shape[0]), size=window,
            steps=steps, batch_size=batch, factor=factor)

    # the windows' calls in threads, one a core: a first call traces and compiles their programs
    # side by side; values are read back once all are queued, so that an accelerator runs ahead
    searched = list(map_in_threads(search, groups, min(len(groups), cores()), "pldjax-residue"))
    residue = np.full(which.shape[0], -np.inf)
    for (pairs, *_), (found, fits) in zip(groups, searched, strict=True):
        residue[pairs] = np.where(np.asarray(fits)[:pairs.shape[0]],
                                  np.asarray(found)[:pairs.shape[0]], -np.inf)
    return residue.reshape(shape)
