"""Gaussian differential privacy: the smallest mu with L below G_mu, and the GDP residue.

G_mu is the PLD of the Gaussian mechanism with sensitivity / sigma = mu; its loss under P is
N(mu^2/2, mu^2) and its curve is delta_mu(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu).

* :func:`gdp_mu`: the smallest mu with L dominated by G_mu (the naive GDP filter's cost).
* :func:`gdp_residue` (residue-filters.txt Thm 5): the largest mu' in [0, mu] with
  G_mu' (+) L dominated by G_mu, by a fixed number of bisection steps inside jit. The composed
  curve is exact at the query's grid points: for a grid PLD L with masses p_i at z_i,
  delta_{G_mu' (+) L}(eps) = sum_i p_i delta_mu'(eps - z_i) + p_inf, a discrete convolution of p
  with delta_mu' sampled on the same grid (one FFT per bisection step). Between the points both
  curves are convex in x = e^eps: the composed one lies below its chords and G_mu above its
  tangents, which is what :func:`_curve_below_gdp` compares. The naive update
  sqrt(mu^2 - nu^2) (nu = gdp_mu(L)) is valid by construction, so the search starts from it and
  the residue is never below it.

Soundness: every "below" certifies delta <= delta_{G_mu} + delta_slack + ROUNDOFF at every eps >= 0
in every direction, which for the symmetric G_mu is the full order (see :func:`_curve_below_gdp`
and :mod:`pldjax.order`); a filter charges that slack to its delta budget.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr

from pldjax.align import regrid_kernel, regrid_size
from pldjax.discretize import hockey_stick
from pldjax.grid import MAX_SIZE, check_size, next_pow2
from pldjax.order import ROUNDOFF
from pldjax.pld import PLD, batched
from pldjax.precision import float64, host_result, root_of_difference_down
from pldjax.profile import grid_deltas
from pldjax.validate import check_count, check_range, is_traced

_BISECTION_STEPS = 64
#: Default bisection steps of the residue search: its bracket [naive, mu] shrinks 2^-32-fold.
RESIDUE_STEPS = 32
#: G_mu's curve beyond mu^2/2 + _TAIL_SIGMAS * mu is below Phi(-11) ~ 2e-28: the residue check
#: covers [0, that] on the query's grid and relies on the flat-tail argument beyond it.
_TAIL_SIGMAS = 11.0
#: Largest residue check window (grid points); coarser query grids are used beyond it.
MAX_RESIDUE_SIZE = 2**15
#: Largest budget mu of a residue (mu^2 must stay finite in float64; G_mu is fully revealing to
#: double precision far below it).
MAX_MU = 1e100


def _gdp_delta(mu, eps):
    """delta_mu(eps) for every real eps; mu = 0 gives the identity's (1 - e^eps)_+."""
    safe = jnp.maximum(mu, 1e-300)
    return hockey_stick(log_ndtr(safe / 2 - eps / safe), log_ndtr(-safe / 2 - eps / safe), eps)


def _curve_below_gdp(z, d, mu, delta_slack):
    """True if a curve with values ``d`` at the increasing points ``z`` (multiples of one step, or
    at least with 0 among them when they straddle it), convex in x = e^eps and linear in x below
    ``z[0]``, is <= delta_mu + delta_slack + ROUNDOFF at every eps >= 0.

    Why eps >= 0 is enough: G_mu is symmetric, so a pair is below it iff both directions' curves
    are below it at eps >= 0 (the curve at -eps is fixed by the other direction's at eps), and
    every direction is checked (a one-direction PLD stands for a symmetric pair, DESIGN.md). Below
    eps = 0 a pessimistic grid curve carries the Q-only mass its rounding creates (about 1e-4 after
    coarsening, 1e-6 after composition) and would fail a comparison that says nothing about DP.

    Between two points the curve is below its chord and G_mu's convex curve above both tangents
    at the ends; chord minus the larger tangent is concave, so comparing at the ends and at the
    tangents' crossing suffices. Right of the points the curve is at most its last value while
    G_mu tends to 0.
    """
    # the curve at eps = 0 when the points start above it: linear in x from the first point
    lead = jnp.minimum(z[0], 0.0)
    z = jnp.concatenate([lead[None], z])
    d = jnp.concatenate([(1.0 - (1.0 - d[0]) * jnp.exp(lead - z[1]))[None], d])
    safe = jnp.maximum(mu, 1e-300)
    log_q = log_ndtr(-safe / 2 - z / safe)
    g = hockey_stick(log_ndtr(safe / 2 - z / safe), log_q, z)
    g = g * (1.0 - 8.0 * np.finfo(np.float64).eps) + delta_slack + ROUNDOFF  # below the exact
    slope = -jnp.exp(z + log_q)  # x times d delta / dx at the points
    # on [x_i, x_{i+1}], x = x_i (1 + grow t): tangent i is g_i + s_i grow t, tangent i+1 is
    # g_{i+1} + s_{i+1} e^-h grow (t - 1), h = z_{i+1} - z_i
    width = z[1:] - z[:-1]
    grow, back = jnp.expm1(width), jnp.exp(-width)
    g0, g1, s0, s1 = g[:-1], g[1:], slope[:-1], slope[1:]
    denominator = grow * (s0 - s1 * back)  # <= 0: the curve is convex
    numerator = g1 - g0 - s1 * back * grow
    t = jnp.clip(numerator / jnp.where(denominator < 0, denominator, -1.0), 0.0, 1.0)
    t = jnp.where(denominator < 0, t, 0.0)
    envelope = jnp.maximum(g0 + s0 * grow * t, g1 + s1 * back * grow * (t - 1.0))
    chord_ok = (d[:-1] + (d[1:] - d[:-1]) * t <= envelope) | (z[1:] <= 0.0)
    point_ok = (d <= g) | (z < 0.0)
    return jnp.all(chord_ok) & jnp.all(point_ok) & (d[-1] <= delta_slack + ROUNDOFF)


def _below_gdp(probs, inf_mass, offset, step, mu, delta_slack):
    """True if the grid PLD's curve is <= delta_mu + delta_slack + ROUNDOFF at every eps >= 0.

    The curve's values come from tail sums and recurrences of non-negative terms, whose relative
    round-off grows with the grid (about n ulps): they are raised by :func:`_curve_error` first so
    that the comparison is made with an upper bound on the exact curve of the grid PLD."""
    z = (offset + jnp.arange(probs.shape[0], dtype=jnp.float64)) * step
    d = grid_deltas(probs, inf_mass, step)
    return _curve_below_gdp(z, d * (1.0 + _curve_error(probs.shape[0])), mu, delta_slack)


def _curve_error(n: int) -> float:
    """Relative round-off bound of :func:`pldjax.profile.grid_deltas` on ``n`` points: the tail
    sum S (a sum of n non-negative terms), the blocked recurrence D (one 128-term block product
    and n / 128 carries) and the atom, each a few ulps per operation on its longest path; a
    generous 4 n + 512 ulps. Relative, so a zero tail stays zero."""
    return float((4 * n + 512) * np.finfo(np.float64).eps)


def gdp_mu_kernel(probs, inf_mass, offset, step, delta_slack, mu_max):
    """Smallest mu in (0, mu_max] (to bisection resolution, rounded up) with L below G_mu plus the
    slack; inf if not even mu_max is enough."""

    def halve(_, bracket):
        low, high = bracket
        mid = (low + high) / 2
        ok = _below_gdp(probs, inf_mass, offset, step, mid, delta_slack)
        return jnp.where(ok, low, mid), jnp.where(ok, mid, high)

    _, high = jax.lax.fori_loop(0, _BISECTION_STEPS, halve, (jnp.zeros(()), mu_max))
    return jnp.where(_below_gdp(probs, inf_mass, offset, step, mu_max, delta_slack), high, jnp.inf)


_gdp_mu_jit = jax.jit(gdp_mu_kernel)


@float64
def gdp_mu(pld: PLD, *, delta_slack: float = 0.0, mu_max: float = 64.0):
    """Smallest mu such that the PLD is dominated by G_mu (mu-GDP), up to ``delta_slack``.

    An upper bound on the true value for a pessimistic PLD: the comparison is with G_mu's exact
    curve, sound between grid points (tangent lines); it certifies
    delta_L <= delta_{G_mu} + delta_slack + ROUNDOFF at every eps. Both directions of a
    two-direction PLD must be dominated. inf when no mu <= ``mu_max`` works (e.g. an atom at +inf
    above the slack). Batched over the PLD's batch axes.
    """
    if not pld.pessimistic:
        raise ValueError("gdp_mu needs a pessimistic PLD (an upper bound) for a sound answer")
    check_range("delta_slack", delta_slack, 0.0, 1.0)
    check_range("mu_max", mu_max, 0.0, low_open=True)
    kernel = gdp_mu_kernel if is_traced(pld) else _gdp_mu_jit
    result = None
    for direction in pld.directions():
        fn = batched(lambda p, m, o, h: kernel(p, m, o, h, delta_slack, mu_max),
                     len(direction.batch_shape))
        out = fn(direction.probs, direction.inf_mass, direction.offset, direction.step)
        result = out if result is None else jnp.maximum(result, out)
    return host_result(result)


# -- residue --------------------------------------------------------------------------------------
def residue_size(mu_max, step, query_size: int) -> int:
    """Static number of check points covering [0, w], w = mu^2/2 + _TAIL_SIGMAS mu, at ``step``."""
    reach = float(np.max(mu_max)) ** 2 / 2 + _TAIL_SIGMAS * float(np.max(mu_max))
    return max(next_pow2(int(np.ceil(reach / float(np.min(step)))) + 2), 16)


def residue_kernel(probs, inf_mass, offset, step, mu, delta_slack, *, size: int, steps: int,
                   factor: int = 1):
    """(mu', accepted) for one query and one budget mu; ``probs`` etc. carry a leading direction
    axis (1 or 2 directions, all of which must fit). The query fits when nu = gdp_mu(query) <= mu
    (certified on the query's own grid), and mu' >= the naive update sqrt(mu^2 - nu^2); from
    there ``steps`` bisection steps on [naive, mu] look for larger values with G_mu' (+) L below
    G_mu plus the slack, on the query's grid coarsened ``factor``-fold (pessimistically, by
    connect-the-dots: :func:`pldjax.align.regrid_kernel`) so that the check window of ``size``
    points reaches the tail of G_mu (0 if rejected)."""
    mu = jnp.asarray(mu, jnp.float64)
    nu = jnp.max(jax.vmap(gdp_mu_kernel, in_axes=(0, 0, 0, 0, None, None))(
        probs, inf_mass, offset, step, delta_slack, jnp.maximum(mu, 1e-300)))
    accepted = nu <= mu
    naive = jnp.where(accepted, root_of_difference_down(mu, nu), 0.0)
    if factor > 1:
        coarse = functools.partial(regrid_kernel, size=regrid_size(probs.shape[-1], 1 / factor),
                                   pessimistic=True)
        step_coarse = step * float(factor)  # a float: the factor may exceed int64 for huge mu
        probs, offset = jax.vmap(coarse)(probs, offset, step, step_coarse)
        step = step_coarse
    n = probs.shape[-1]
    nfft = next_pow2(2 * n + size - 2)
    checks = jnp.arange(size)[None, :] * step[:, None]  # eps_j = j h, per direction
    # lags k = j - i for check j and grid point i: eps_j - z_i = (k - offset) h
    lags = (jnp.arange(-(n - 1), size)[None, :] - offset[:, None]) * step[:, None]
    spectra = jnp.fft.rfft(probs, nfft)

    def fits(mu_residue):
        curves = jnp.fft.irfft(spectra * jnp.fft.rfft(_gdp_delta(mu_residue, lags), nfft), nfft)
        curves = curves[:, n - 1:n - 1 + size] + inf_mass[:, None]
        ok = jax.vmap(_curve_below_gdp, in_axes=(0, 0, None, None))(checks, curves, mu, delta_slack)
        return jnp.all(ok)

    def halve(_, bracket):
        low, high = bracket
        mid = (low + high) / 2
        ok = fits(mid)
        return jnp.where(ok, mid, low), jnp.where(ok, high, mid)

    low, _ = jax.lax.fori_loop(0, steps, halve, (naive, mu))
    return jnp.where(accepted, jnp.maximum(low, naive), 0.0), accepted


def stack_directions(pld: PLD):
    """(probs, inf_mass, offset, step) with a direction axis right after the batch axes."""
    directions = pld.directions()
    n = max(d.size for d in directions)
    nb = len(pld.batch_shape)

    def pad(d):
        return jnp.pad(d.probs, [(0, 0)] * nb + [(0, n - d.size)])

    return (jnp.stack([pad(d) for d in directions], axis=nb),
            jnp.stack([jnp.asarray(d.inf_mass, jnp.float64) for d in directions], axis=nb),
            jnp.stack([jnp.asarray(d.offset, jnp.int64) for d in directions], axis=nb),
            jnp.stack([jnp.asarray(d.step, jnp.float64) for d in directions], axis=nb))


def residue_plan(mu_max, pld: PLD, size: int | None) -> tuple[int, int]:
    """(factor, size): how many-fold the query's grid is coarsened for the residue search so that
    its check window fits, and the static window size; host-side, before jit."""
    if size is not None:
        return 1, check_size("size", size, minimum=16, maximum=MAX_SIZE)
    steps = np.asarray(pld.step, np.float64)
    factor = 1
    while residue_size(mu_max, steps * factor, pld.size) > MAX_RESIDUE_SIZE:
        factor *= 2
    return factor, residue_size(mu_max, steps * factor, (pld.size - 1) // factor + 2)


def _residue_batch(stacked, mu, delta_slack, *, size: int, steps: int, batch_size: int,
                   factor: int):
    """residue_kernel over a flat batch (leading axis) of queries and budgets, a chunk at a time."""

    def one(args):
        p, m, o, h, u, s = args
        return residue_kernel(p, m, o, h, u, s, size=size, steps=steps, factor=factor)

    return jax.lax.map(one, (*stacked, mu, delta_slack), batch_size=batch_size)


_residue_batch_jit = jax.jit(_residue_batch,
                             static_argnames=("size", "steps", "batch_size", "factor"))


@float64
def gdp_residue(mu, query: PLD, *, delta_slack=0.0, steps: int = RESIDUE_STEPS,
                size: int | None = None, batch_size: int = 256):
    """The largest mu' in [0, mu] with G_mu' (+) L dominated by G_mu (residue-filters.txt Thm 5).

    A sound lower bound (pessimistic): G_mu' (+) query is certified below G_mu plus
    ``delta_slack`` + ROUNDOFF at every eps (charge that to a delta budget; ``delta_slack`` must
    cover the query's atom at +inf). Never below the naive GDP update sqrt(mu^2 - nu^2). NaN where
    the query does not fit (query not below G_mu). ``mu`` and the query's batch axes broadcast:
    many (mu, L) pairs are one compiled call, ``batch_size`` pairs at a time. ``steps``: bisection
    steps (resolution (mu - naive) 2^-steps); ``size``: check window points (automatic on the
    host; under jit it must be given, and the query's step then used as is).
    """
    if not query.pessimistic:
        raise ValueError("gdp_residue needs a pessimistic query PLD (an upper bound)")
    check_range("mu", mu, 0.0, MAX_MU)
    check_range("delta_slack", delta_slack, 0.0, 1.0)
    steps = check_count("steps", steps, minimum=1)
    if is_traced((mu, query, delta_slack)) and size is None:
        raise ValueError("gdp_residue under jit needs size=")
    factor, size = residue_plan(mu, query, size)
    mu = jnp.asarray(mu, jnp.float64)
    shape = jnp.broadcast_shapes(mu.shape, query.batch_shape, jnp.shape(delta_slack))
    stacked = stack_directions(query)
    nb = len(query.batch_shape)
    flat = tuple(
        jnp.broadcast_to(a, shape + a.shape[nb:]).reshape((-1,) + a.shape[nb:]) for a in stacked)
    mus = jnp.broadcast_to(mu, shape).reshape(-1)
    slack = jnp.broadcast_to(jnp.asarray(delta_slack, jnp.float64), shape).reshape(-1)
    run = _residue_batch if is_traced((mus, flat)) else _residue_batch_jit
    residue, accepted = run(flat, mus, slack, size=size, steps=steps, batch_size=batch_size,
                            factor=factor)
    return host_result(jnp.where(accepted, residue, jnp.nan).reshape(shape))
