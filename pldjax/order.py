"""Comparing and converting PLDs: Blackwell order, suprema, tradeoff curves, Rényi divergences.

For one direction PLD(P || Q) with masses p_i at losses z_i, the same outcomes have Q-masses
q_i = p_i e^{-z_i}; the atom at +inf is P-only mass and 1 - sum q_i is Q-only mass (loss -inf).

* Tradeoff curve (Neyman-Pearson): the most powerful test rejects P on the lowest losses first, so
  beta(alpha) is the piecewise-linear curve through (sum_{i<k} p_i, sum_{i>=k} q_i). A pessimistic
  PLD dominates the true pair, so its curve is a lower bound on the true beta.
* Rényi divergence of order a (Chourasia et al. 2024, eqs. (19)-(21)):
  D_a = log E_P[e^{(a-1) L}] / (a - 1), infinite for a >= 1 when there is an atom at +inf. Rényi
  divergences obey data processing, so a pessimistic PLD gives an upper bound.

* Order (Regehr et al. 2026, Prop. 10): L is dominated by B iff delta_L(eps) <= delta_B(eps) for
  every real eps. On grids both curves are piecewise linear in e^eps between their points, so the
  comparison at the union of both grids' points is exact (below both grids both curves are linear
  from (x = 0, 1); above both they are constant).
* Supremum (Prop. 11): the pointwise maximum of the curves at the points of a common grid, joined by
  chords (connect-the-dots): a convex curve above every member's, turned back into masses.

Two-direction PLDs report the worse direction: the smaller beta, the larger divergence, and both
directions must be dominated.

Pessimistic discretizations of mechanisms with unbounded loss (the Gaussian) and compositions keep
the mass beyond their window as a small atom at +inf (1e-24 .. 1e-15): delta never reaches 0, so no
smooth curve that tends to 0 can dominate them exactly. :meth:`dominated_by` and :mod:`pldjax.gaussian_dp`
therefore take an additive ``delta_slack``: they certify delta_L <= delta_B + delta_slack + ROUNDOFF
(1e-14) at every eps, which a filter must account as an extra delta.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from pldjax.align import align, regrid
from pldjax.compilation import kernel_jit
from pldjax.discretize import masses_from_curve
from pldjax.mass import settle
from pldjax.pld import PLD, batched, check_same_kind
from pldjax.precision import float64, host_result
from pldjax.profile import delta_kernel, grid_deltas, per_direction
from pldjax.validate import check_range, is_traced


def _log_masses(probs, offset, step):
    z = (offset + jnp.arange(probs.shape[-1], dtype=jnp.float64)) * step
    positive = probs > 0
    log_p = jnp.where(positive, jnp.log(jnp.where(positive, probs, 1.0)), -jnp.inf)
    return z, log_p


def tradeoff_kernel(probs, inf_mass, offset, step, alphas, pessimistic: bool = True):
    """beta(alpha) of one direction: the type II error of the best test at type I error alpha.

    An optimistic PLD bounds delta(eps) from below only from its window's bottom z0 up; below it
    the truth's delta is still at least 1 - e^eps, whose dual line keeps beta(alpha) at or above
    1 - alpha e^{-z0} (so beta(0) = 1, as for every mechanism whose two distributions share
    their support).
    """
    z, log_p = _log_masses(probs, offset, step)
    q = jnp.exp(jnp.minimum(log_p - z, 0.0))
    type_one = jnp.concatenate([jnp.zeros((1,)), jnp.cumsum(probs)])
    type_two = jnp.concatenate([jnp.cumsum(q[::-1])[::-1], jnp.zeros((1,))])
    beta = jnp.interp(alphas, type_one, type_two, right=0.0)
    if not pessimistic:
        below = jnp.where(alphas > 0, 1.0 - alphas * jnp.exp(-z[0]), 1.0)
        beta = jnp.maximum(beta, below)
    return jnp.clip(beta, 0.0, 1.0 - alphas)


def _log_below_window(probs, inf_mass, z, log_p, orders):
    """log of P^a Q^(1-a) summed over an optimistic PLD's cell below its window, for each order a.

    An optimistic PLD drops the P-mass below its window's bottom z0 (its total is 1 - lost) and
    its grid holds only the Q-mass sum p_i e^{-z_i}, 1 - missing: the rest of Q lies below z0 too.
    One cell holding P-mass lost and Q-mass missing (at loss log(lost / missing) <= z0, since
    P(L <= z0) <= e^{z0} Q(L <= z0)) completes the masses to a pair of distributions whose curve
    is max(delta_opt(eps), 1 - e^eps), still below the truth's, so its Rényi divergences stay
    lower bounds at every order (without it D_a for a < 1 counted Q's missing mass as Q-only and
    exceeded the truth: 0.0026 for gdp(10) at order 1e-300, truth 5e-299). The masses are
    differences of sums (round-off n u each): taken high where a larger value lowers D_a (both
    below order 1, ``missing`` above it) and ``lost`` low above order 1.
    """
    roundoff = probs.shape[-1] * 2.0**-53
    lost = 1.0 - jnp.sum(probs) - inf_mass
    missing = 1.0 - jnp.sum(jnp.exp(log_p - z)) + roundoff
    # a cell above z0 (beyond round-off) would not keep the curve below the truth's: NaN, which
    # renyi_kernel turns into the trivial lower bound 0
    above = lost > (missing + roundoff) * jnp.exp(z[0]) + roundoff
    lost = jnp.where(orders < 1.0, lost + roundoff, lost - roundoff)
    # no cell unless both masses are positive (then no 0 * log 0 either)
    live = (lost > 0) & (missing > 0)
    log_lost = jnp.log(jnp.where(live, lost, 1.0))
    log_missing = jnp.log(jnp.where(missing > 0, missing, 1.0))
    cell = jnp.where(live, orders * log_lost + (1.0 - orders) * log_missing, -jnp.inf)
    return jnp.where(above, jnp.nan, cell)


def log_mgf_kernel(probs, inf_mass, offset, step, ts, pessimistic: bool = True):
    """log E_P[e^{t L}] of one direction for each t (Chourasia et al. 2024, eq. (19)): the atom at
    +inf makes it infinite for t > 0 and contributes nothing for t < 0. An optimistic PLD adds
    the cell below its window (see :func:`_log_below_window`)."""
    z, log_p = _log_masses(probs, offset, step)
    finite = logsumexp(log_p[None, :] + ts[:, None] * z[None, :], axis=1)
    if not pessimistic:  # (a cell that cannot be placed is left out, as before)
        cell = _log_below_window(probs, inf_mass, z, log_p, ts + 1.0)
        finite = jnp.logaddexp(finite, jnp.where(jnp.isnan(cell), -jnp.inf, cell))
    with_atom = jnp.logaddexp(finite, jnp.where(ts == 0, jnp.log(inf_mass), -jnp.inf))
    return jnp.where((ts > 0) & (inf_mass > 0), jnp.inf, with_atom)


def renyi_kernel(probs, inf_mass, offset, step, orders, pessimistic: bool = True):
    """Rényi divergence D_a(P || Q) of one direction for each order a > 0 (a = 1: KL); an upper
    bound if ``pessimistic``, else a lower bound (with the cell below the window, see
    :func:`_log_below_window`)."""
    z, log_p = _log_masses(probs, offset, step)
    a = orders[:, None]
    safe = jnp.where(a == 1.0, 2.0, a)
    terms = logsumexp(log_p[None, :] + (safe - 1.0) * z[None, :], axis=1)
    kl = jnp.sum(probs * z)
    if not pessimistic:
        terms = jnp.logaddexp(terms, _log_below_window(probs, inf_mass, z, log_p, safe[:, 0]))
        # the cell adds lost log(lost / missing) >= -missing / e to the KL divergence (at order
        # 0 the cell's term is its Q-mass; lost's round-off leaves the sign open)
        kl = kl - jnp.exp(_log_below_window(probs, inf_mass, z, log_p, jnp.zeros(()))) / jnp.e
    general = terms / (safe[:, 0] - 1.0)
    value = jnp.where(orders == 1.0, kl, general)
    # D_a >= 0 for distributions: a value below 0 is round-off (clamped), -inf or NaN a failed
    # evaluation (e.g. overflow at huge orders), reported as inf (an upper bound) or 0 (a lower
    # bound)
    failed = jnp.inf if pessimistic else 0.0
    value = jnp.where(jnp.isnan(value) | jnp.isneginf(value), failed, jnp.maximum(value, 0.0))
    return jnp.where((orders >= 1.0) & (inf_mass > 0), jnp.inf, value)


@float64
def tradeoff_from_profile(epsilons, deltas, alphas) -> jax.Array:
    """A lower bound on the tradeoff curve from privacy-profile points (Prop. 9's duality).

    Each point (eps_j, delta_j) with delta(eps_j) <= delta_j forces beta(alpha) >=
    e^{-eps_j} (1 - delta_j - alpha); the largest such bound (and 0) is returned at ``alphas``.
    Exact at the kinks when the points are a grid PLD's curve at its grid points.
    """
    check_range("epsilons", epsilons)
    check_range("alphas", alphas, 0.0, 1.0)
    check_range("deltas", deltas, 0.0, 1.0)
    eps = jnp.asarray(epsilons, jnp.float64).reshape(-1)
    d = jnp.asarray(deltas, jnp.float64).reshape(-1)
    a = jnp.asarray(alphas, jnp.float64)
    bounds = jnp.exp(-eps) * (1.0 - d - a[..., None])
    return host_result(jnp.maximum(jnp.max(bounds, axis=-1), 0.0))


@float64
def profile_from_tradeoff(alphas, betas, epsilons) -> jax.Array:
    """An upper bound on the privacy profile from tradeoff points (Prop. 9's duality).

    delta(eps) = sup over tests of 1 - alpha - e^eps beta(alpha). If the piecewise-linear curve
    through the points (alpha_i, beta_i) lies below the true tradeoff curve everywhere (e.g. a
    pessimistic PLD's curve at its kinks), the supremum over it is attained at the points and
    max_i (1 - alpha_i - e^eps beta_i) is an upper bound on delta(eps). Points taken *on* a
    curved tradeoff function give a lower bound instead (their chords lie above it).
    """
    check_range("alphas", alphas, 0.0, 1.0)
    check_range("betas", betas, 0.0, 1.0)
    check_range("epsilons", epsilons)
    a = jnp.asarray(alphas, jnp.float64).reshape(-1)
    b = jnp.asarray(betas, jnp.float64).reshape(-1)
    e = jnp.asarray(epsilons, jnp.float64)
    lines = 1.0 - a - jnp.exp(e[..., None]) * b
    return host_result(jnp.maximum(jnp.max(lines, axis=-1), 0.0))


_tradeoff_jit = kernel_jit(tradeoff_kernel, static_argnames=("pessimistic",))
_renyi_jit = kernel_jit(renyi_kernel, static_argnames=("pessimistic",))
_log_mgf_jit = kernel_jit(log_mgf_kernel, static_argnames=("pessimistic",))


@float64
def tradeoff(pld: PLD, alpha) -> jax.Array:
    """The f-DP tradeoff curve beta(alpha), alpha in [0, 1] (see :meth:`PLD.tradeoff`)."""
    check_range("alpha", alpha, 0.0, 1.0)
    kernel = functools.partial(_tradeoff_jit, pessimistic=pld.pessimistic)
    return per_direction(pld, alpha, kernel, jnp.minimum)


@float64
def renyi(pld: PLD, order) -> jax.Array:
    """Rényi divergence of the given order(s) > 0 (see :meth:`PLD.renyi`)."""
    check_range("order", order, 0.0, low_open=True)
    kernel = functools.partial(_renyi_jit, pessimistic=pld.pessimistic)
    return per_direction(pld, order, kernel, jnp.maximum)


@float64
def log_mgf(pld: PLD, t) -> jax.Array:
    """log E_P[e^{t L}] (see :meth:`PLD.log_mgf`); the larger of two directions."""
    check_range("t", t, allow_inf=False)
    kernel = functools.partial(_log_mgf_jit, pessimistic=pld.pessimistic)
    return per_direction(pld, t, kernel, jnp.maximum)


def swap(pld: PLD) -> PLD:
    """PLD(Q || P) from PLD(P || Q): the two directions exchanged (a symmetric PLD is unchanged)."""
    if pld.reverse is None:
        return pld
    return PLD.from_directions(pld.reverse, pld.forward)


# -- order ----------------------------------------------------------------------------------------
#: Absolute round-off of delta values computed from grid masses (sums of up to 2^25 terms near 1):
#: comparisons certify delta_L <= delta_B + delta_slack + ROUNDOFF.
ROUNDOFF = 1e-14


def dominance_excess_kernel(l_probs, l_inf, l_off, l_step, b_probs, b_inf, b_off, b_step):
    """max over every real eps of delta_L(eps) - delta_B(eps), single directions: both curves are
    piecewise linear in e^eps between their grid points, so the union of the two grids suffices."""
    def points(probs, off, step):
        return (off + jnp.arange(probs.shape[-1], dtype=jnp.float64)) * step

    union = jnp.concatenate([points(l_probs, l_off, l_step), points(b_probs, b_off, b_step)])
    return jnp.max(
        delta_kernel(l_probs, l_inf, l_off, l_step, union)
        - delta_kernel(b_probs, b_inf, b_off, b_step, union)
    )


_dominance_excess_jit = kernel_jit(dominance_excess_kernel)


def _unbatched(pld: PLD, what: str) -> None:
    if pld.batch_shape:
        raise ValueError(f"{what} takes unbatched PLDs (index the batch: pld[i])")


@float64
def dominated_by(query: PLD, budget: PLD, *, delta_slack: float = 0.0):
    """True only if delta_query(eps) <= delta_budget(eps) + delta_slack at every eps for the exact
    distributions (L is dominated by B in the Blackwell order when delta_slack = 0).

    ``query`` must be pessimistic (its curve is above the truth) and ``budget`` optimistic (below
    the truth): then the exact comparison of the two grid PLDs is a proof. The answer may be False
    although the exact relation holds by less than the budget's optimistic gap (build the budget
    on a finer grid to shrink it); it is never True when the relation fails by more than
    ``delta_slack`` plus ROUNDOFF. Both directions must be dominated. Batched over the query's
    batch axes (the budget is one PLD); works under jit (the result is then a traced bool array).
    The two may sit on any grid steps, eager or under jit: both curves are compared at the union
    of their grids' points, which is exact, so nothing is re-gridded (no alignment is needed).
    """
    _unbatched(budget, "dominated_by (budget)")
    if not query.pessimistic:
        raise ValueError("the query PLD must be pessimistic (an upper bound) for a sound answer")
    if budget.pessimistic:
        raise ValueError(
            "the budget PLD must be optimistic (pessimistic=False: a lower bound on its curve) "
            "for a sound answer"
        )
    check_range("delta_slack", delta_slack, 0.0, 1.0)
    pairs = [(query, budget)] if query.reverse is None and budget.reverse is None else list(
        zip((query.forward, query.backward), (budget.forward, budget.backward), strict=True))
    excess = None
    for q, b in pairs:
        fn = batched(
            lambda p, m, o, h, b=b: _dominance_excess_jit(p, m, o, h, b.probs, b.inf_mass, b.offset, b.step),
            len(q.batch_shape),
        )
        out = fn(q.probs, q.inf_mass, q.offset, q.step)
        excess = out if excess is None else jnp.maximum(excess, out)
    result = host_result(excess <= delta_slack + ROUNDOFF)
    return bool(result) if not query.batch_shape and not is_traced(result) else result


# -- supremum -------------------------------------------------------------------------------------
def sup_kernel(probs, inf_mass, offset, step, *, size: int):
    """The sup of a family (arrays with a leading family axis, one step) on ``size`` grid points
    from the lowest member offset: (probs, inf_mass, offset)."""
    low = jnp.min(offset)
    points = (low + jnp.arange(size, dtype=jnp.float64)) * step
    curves = jax.vmap(delta_kernel, in_axes=(0, 0, 0, None, None))(
        probs, inf_mass, offset, step, points
    )
    curve = jnp.max(curves, axis=0)
    out, out_inf = masses_from_curve(curve, step, curve + jnp.expm1(points), points)
    # round-off in the masses may leave the rebuilt curve a few 1e-13 below the maximum: move that
    # much mass from the bottom to +inf, which raises delta by it at every grid point
    shortfall = jnp.max(curve - grid_deltas(out, out_inf, step))
    out, out_inf = settle(out, out_inf, 0.0, jnp.maximum(shortfall, 0.0), True)
    return out, out_inf, low


_sup_jit = kernel_jit(sup_kernel, static_argnames=("size",))


@float64
def sup(plds, *, size: int | None = None) -> PLD:
    """The least upper bound of a family in the Blackwell order, as a pessimistic PLD (Prop. 11).

    ``plds``: one PLD whose leading batch axis is the family (one compiled call; works under
    jit, where ``size`` must be given), or a list of unbatched PLDs. All must be pessimistic.
    Members on different steps are first aligned on the safe side (:func:`pldjax.align.align`):
    exactly onto the finest step when the steps are integer multiples of it and the result fits
    grid.MAX_SIZE, otherwise onto the coarsest step by connect-the-dots (each member's curve
    raised to its chords there: still an upper bound); under jit onto the largest step. The
    result's curve is the maximum of the members' curves at the common grid's points joined by
    chords: above every member, and the tightest such PLD on the grid; the sup of an ordered
    family is its largest member. ``size``: number of grid points of the result from the lowest
    member's first point (default: up to the highest member's last point).
    """
    family = _as_family(plds)
    if not family.pessimistic:
        raise ValueError("sup needs pessimistic PLDs: the maximum of lower bounds bounds nothing")
    traced = is_traced(family)
    if traced and size is None:
        raise ValueError("sup under jit needs size=")

    def one(direction: PLD) -> PLD:
        n = size
        if n is None:
            offsets = np.asarray(direction.offset)
            n = int(offsets.max() - offsets.min()) + direction.size
        probs, inf_mass, offset = _sup_jit(
            direction.probs, direction.inf_mass, direction.offset, direction.step[0], size=n
        )
        return PLD(probs, inf_mass, offset, direction.step[0], True)

    return family.map_directions(one)


def _as_family(plds) -> PLD:
    """A list of unbatched PLDs (or a PLD with one batch axis) as one PLD with a family axis,
    each direction on one step (aligned, see :func:`sup`)."""
    if isinstance(plds, PLD):
        if len(plds.batch_shape) != 1:
            raise ValueError("sup takes a PLD with exactly one batch axis (the family), or a list")
        if is_traced(plds.step):  # the largest step of the family: a static size
            def widest(d: PLD) -> PLD:
                return regrid(d, jnp.max(d.step), d.size + 2)

            return plds.map_directions(widest)
        members = [plds[i] for i in range(len(plds))]
    else:
        members = list(plds)
        if not members or not all(isinstance(m, PLD) for m in members):
            raise ValueError("plds must be a non-empty list of PLDs")
        for m in members:
            _unbatched(m, "sup (a list of unbatched PLDs or one PLD with one batch axis)")
    check_same_kind(members)
    two = any(m.reverse is not None for m in members)

    def stack(directions: list[PLD]) -> PLD:
        directions = align(directions, "sup")
        n = max(d.size for d in directions)  # zero mass appended above a window changes nothing
        return PLD(
            jnp.stack([jnp.pad(d.probs, (0, n - d.size)) for d in directions]),
            jnp.stack([d.inf_mass for d in directions]),
            jnp.stack([jnp.asarray(d.offset, jnp.int64) for d in directions]),
            jnp.stack([jnp.asarray(d.step, jnp.float64) for d in directions]),
            members[0].pessimistic,
        )

    forward = stack([m.forward for m in members])
    return PLD.from_directions(forward, stack([m.backward for m in members]) if two else None)
