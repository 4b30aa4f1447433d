"""What a PLD says about its pair of distributions: tradeoff curves (f-DP), Rényi
divergences and the moment generating function of the loss, and conversions between privacy
profiles and tradeoff curves.

For one direction PLD(P || Q) with masses p_i at losses z_i, the same outcomes have Q-masses
q_i = p_i e^{-z_i}; the atom at +inf is P-only mass and 1 - sum q_i is Q-only mass (loss -inf).

* Tradeoff curve (Neyman-Pearson): the most powerful test rejects P on the lowest losses first, so
  beta(alpha) is the piecewise-linear curve through (sum_{i<k} p_i, sum_{i>=k} q_i). A pessimistic
  PLD dominates the true pair, so its curve is a lower bound on the true beta.
* Rényi divergence of order a (Chourasia et al. 2024, eqs. (19)-(21)):
  D_a = log E_P[e^{(a-1) L}] / (a - 1), infinite for a >= 1 when there is an atom at +inf. Rényi
  divergences obey data processing, so a pessimistic PLD gives an upper bound.

Two-direction PLDs report the worse direction: the smaller beta, the larger divergence.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import array_module, cumulative_sum, kernel_jit
from pldjax.core.pld import PLD
from pldjax.core.precision import FLOAT_MAX, float64, host_result, last_float_before
from pldjax.core.special import log1p, special_functions
from pldjax.core.validation import check_range, is_traced, within
from pldjax.kernels.hockey_stick import per_direction, read_or_nothing, stored_length


def _log_masses(probs, offset, step):
    xp = array_module(probs)
    z = (offset + xp.arange(probs.shape[-1], dtype=xp.float64)) * step
    positive = probs > 0
    log_p = xp.where(positive, xp.log(xp.where(positive, probs, 1.0)), -xp.inf)
    return z, log_p


def _on_its_side(pessimistic, upper, lower):
    """``upper()`` for a pessimistic PLD, ``lower()`` for an optimistic one (arrays or tuples of
    them): a Python bool picks one, a traced flag (data, so that both estimates share one
    compiled program) computes both and picks elementwise."""
    if isinstance(pessimistic, bool):
        return upper() if pessimistic else lower()
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pessimistic, a, b), upper(), lower())


def tradeoff_kernel(probs, inf_mass, offset, step, alphas, pessimistic=True):
    """beta(alpha) of one direction: the type II error of the best test at type I error alpha.

    An optimistic PLD bounds delta(eps) from below only from its window's bottom z0 up; below it
    the truth's delta is still at least 1 - e^eps, whose dual line keeps beta(alpha) at or above
    1 - alpha e^{-z0} (so beta(0) = 1, as for every mechanism whose two distributions share
    their support).
    """
    xp = array_module(probs)
    z, log_p = _log_masses(probs, offset, step)
    q = xp.exp(xp.minimum(log_p - z, 0.0))
    type_one = xp.concatenate([xp.zeros((1,)), cumulative_sum(probs)])
    type_two = xp.concatenate([cumulative_sum(q, reverse=True), xp.zeros((1,))])
    beta = xp.interp(alphas, type_one, type_two, right=0.0)
    # the two running sums and the interpolation are each a few ulps per term off: beta moves by
    # that bound to its safe side (down for a pessimistic PLD; on a grid where the estimate is
    # exact, G_1's curve read 4e-13 above the truth without it)
    roundoff = (4 * stored_length(probs) + 16) * xp.finfo(xp.float64).eps

    def lower():
        below = xp.where(alphas > 0, 1.0 - alphas * xp.exp(-z[0]), 1.0)
        return xp.maximum(beta + roundoff, below)

    return xp.clip(_on_its_side(pessimistic, lambda: beta - roundoff, lower), 0.0, 1.0 - alphas)


#: Absolute allowance on a tradeoff bound read from a mechanism's loss tails: each tail (in
#: [0, 1]) is a few ulps off, and a bound adds up a few terms of at most 2.
TAILS_ROUNDOFF = 1e-12
#: Below this type I error the tails' vertices may be subnormal floats (a few significant bits,
#: and the lines through them scale them by up to e^745): the bounds there are the trivial ones.
SMALLEST_ALPHA = 2.0**-1000


def _tradeoff_bracket(mechanism, params, alphas):
    """(lower, upper) bounds on beta(alpha) of one direction of ``mechanism`` (a
    :class:`~pldjax.kernels.discretize.LossTails`) with ``params``, from its exact tails.

    The test rejecting P where L <= t has type I error a_t = P(L <= t) and type II error
    b_t = Q(L > t). For each alpha the float t_lo with a_t <= alpha < a_t at the next float t_hi
    is found by bisection. The tradeoff curve is convex, so it lies below the chord through
    (a_lo, b_lo) and (a_hi, b_hi) (the upper bound; exact across an atom of the loss) and above
    the line of slope -e^{-t} through each of the two points (Neyman-Pearson: threshold t
    minimizes beta + e^{-t} alpha): the lower bound. Where a bisection end is not a valid
    vertex, the curve's own ends (0, 1) and (1, 0) replace it. Below SMALLEST_ALPHA (and at 0)
    the bounds are the trivial [0, 1 - alpha].
    """
    log_alphas = jnp.log(alphas)

    def tails(t):  # log P(L <= t), log Q(L > t)
        _, log_sf_q, log_cdf_p, _ = mechanism.tails(params, t)
        return log_cdf_p, log_sf_q

    t_lo = last_float_before(lambda t: tails(t)[0] > log_alphas, alphas.shape)
    t = jnp.stack([t_lo, jnp.minimum(jnp.nextafter(t_lo, jnp.inf), FLOAT_MAX)])
    log_a, log_b = tails(t)
    a, b = jnp.exp(log_a), jnp.exp(log_b)
    left = a[0] <= alphas
    a_left, b_left = jnp.where(left, a[0], 0.0), jnp.where(left, b[0], 1.0)
    right = a[1] >= alphas
    a_right, b_right = jnp.where(right, a[1], 1.0), jnp.where(right, b[1], 0.0)
    span = a_right - a_left
    weight = jnp.where(span > 0, (alphas - a_left) / jnp.where(span > 0, span, 1.0), 0.0)
    chord = b_left + jnp.clip(weight, 0.0, 1.0) * (b_right - b_left)
    # b_t + e^{-t} (a_t - alpha), the product in logs (e^{-t} alone overflows far out); a line
    # that round-off makes infinite or NaN is left out
    gap = a - alphas
    tangents = b + jnp.sign(gap) * jnp.exp(jnp.log(jnp.abs(gap)) - t)
    tangents = jnp.where(jnp.isfinite(tangents), tangents, 0.0)
    resolved = alphas >= SMALLEST_ALPHA
    upper = jnp.minimum(jnp.where(resolved, chord + TAILS_ROUNDOFF, 1.0), 1.0 - alphas)
    lower = jnp.where(resolved, jnp.clip(jnp.max(tangents, axis=0) - TAILS_ROUNDOFF, 0.0, upper), 0.0)
    return lower, upper


@functools.partial(kernel_jit, static_argnames=("mechanism",))
def _tradeoff_from_tails_kernel(params, alphas, *, mechanism):
    lower, upper = jax.vmap(lambda p: _tradeoff_bracket(mechanism, p, alphas))(params)
    return jnp.min(lower, axis=0), jnp.min(upper, axis=0)


@float64
def tradeoff_from_tails(mechanism, params, alphas) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on a mechanism's tradeoff curve beta(alpha) read from its exact loss tails (no
    grid): within round-off of the truth, for every alpha.

    Args:
      mechanism: a :class:`~pldjax.kernels.discretize.LossTails`.
      params: its parameters, a tuple of 1-D arrays whose leading axis runs over the directions
        of the neighbouring relation (length 1, or 2 with the direction as the last
        parameter); each direction's pair one mechanism (scalars otherwise).
      alphas: type I errors in [0, 1], a 1-D array.

    Returns:
      (lower, upper), NumPy arrays like ``alphas``: the worse direction's beta(alpha) lies in
      [lower, upper] (lower pessimistic, upper optimistic), up to TAILS_ROUNDOFF of which each
      is moved to its safe side.
    """
    alphas = np.asarray(alphas, np.float64)
    check_range("alphas", alphas, 0.0, 1.0)
    # the alphas padded to a power of two (at least 8) with repeats: few compiled shapes
    size = max(8, 1 << (alphas.size - 1).bit_length())
    padded = np.concatenate([alphas, np.full(size - alphas.size, alphas[-1])])
    params = tuple(np.asarray(p, np.float64) for p in params)
    lower, upper = _tradeoff_from_tails_kernel(params, padded, mechanism=mechanism)
    return np.asarray(lower)[:alphas.size], np.asarray(upper)[:alphas.size]


def _cell_below_window(probs, inf_mass, z, log_p, orders):
    """(log lost, log missing, live): the P-mass and Q-mass of an optimistic PLD's cell below its
    window (see :func:`_log_below_window`) for each order a, and whether there is one (both
    masses positive); log lost is NaN where the cell cannot be placed."""
    xp = array_module(probs)
    roundoff = stored_length(probs) * 2.0**-53
    lost = 1.0 - xp.sum(probs) - inf_mass
    missing = 1.0 - xp.sum(xp.exp(log_p - z)) + roundoff
    # a cell above z0 (beyond round-off) would not keep the curve below the truth's: NaN, which
    # renyi_kernel turns into the trivial lower bound 0
    above = lost > (missing + roundoff) * xp.exp(z[0]) + roundoff
    lost = xp.where(orders < 1.0, lost + roundoff, lost - roundoff)
    # no cell unless both masses are positive (then no 0 * log 0 either)
    live = (lost > 0) & (missing > 0)
    log_lost = xp.log(xp.where(live, lost, 1.0))
    log_missing = xp.log(xp.where(missing > 0, missing, 1.0))
    return xp.where(above, xp.nan, log_lost), log_missing, live


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
    xp = array_module(probs)
    log_lost, log_missing, live = _cell_below_window(probs, inf_mass, z, log_p, orders)
    return xp.where(live | xp.isnan(log_lost), orders * log_lost + (1.0 - orders) * log_missing,
                    -xp.inf)


def log_mgf_kernel(probs, inf_mass, offset, step, ts, pessimistic=True):
    """log E_P[e^{t L}] of one direction for each t (Chourasia et al. 2024, eq. (19)): the atom at
    +inf makes it infinite for t > 0 and contributes nothing for t < 0. An optimistic PLD adds
    the cell below its window (see :func:`_log_below_window`)."""
    xp = array_module(probs)
    z, log_p = _log_masses(probs, offset, step)
    finite = special_functions(xp).logsumexp(
        log_p[None, :] + ts[:, None] * z[None, :], axis=1)

    def with_cell():  # (a cell that cannot be placed is left out)
        cell = _log_below_window(probs, inf_mass, z, log_p, ts + 1.0)
        return xp.logaddexp(finite, xp.where(xp.isnan(cell), -xp.inf, cell))

    finite = _on_its_side(pessimistic, lambda: finite, with_cell)
    with_atom = xp.logaddexp(finite, xp.where(ts == 0, xp.log(inf_mass), -xp.inf))
    return xp.where((ts > 0) & (inf_mass > 0), xp.inf, with_atom)


#: Orders a whose |a - 1| times the largest |loss| is at most this are read from expm1 of the
#: losses (see :func:`renyi_kernel`).
_NEAR_ORDER_ONE = 1.0


def renyi_kernel(probs, inf_mass, offset, step, orders, pessimistic=True):
    """Rényi divergence D_a(P || Q) of one direction for each order a > 0 (a = 1: KL); an upper
    bound if ``pessimistic``, else a lower bound (with the cell below the window, see
    :func:`_log_below_window`).

    D_a = log(sum p e^{(a - 1) z}) / (a - 1), the sum over the finite losses (the +inf atom
    adds nothing below order 1, and makes D_a infinite from it on). Near order 1
    (|a - 1| max |z| <= 1) the sum is (1 - inf_mass) (1 + sum p expm1((a - 1) z) / sum p): the
    masses' total taken as the 1 - inf_mass they stand for, not as their floating-point sum, whose
    round-off (1e-16 and more) divided by a - 1 swamped D_a there (gdp(sqrt 10)'s optimistic D
    at a = 1 + 2e-13 read 5.0022, above the truth 5, and its pessimistic one at 1 - 1e-12
    4.9997, below it)."""
    xp = array_module(probs)
    z, log_p = _log_masses(probs, offset, step)
    a = orders[:, None]
    safe = xp.where(a == 1.0, 2.0, a)
    shift = safe - 1.0
    kl = xp.sum(probs * z)
    grid_log_sum = special_functions(xp).logsumexp(
        log_p[None, :] + shift * z[None, :], axis=1)
    grid_total = xp.sum(probs)
    reach = xp.max(xp.where(probs > 0, xp.abs(z), 0.0))
    near = xp.abs(shift[:, 0]) * reach <= _NEAR_ORDER_ONE
    grid_excess = xp.sum(probs * xp.expm1(xp.minimum(shift * z, _NEAR_ORDER_ONE)), axis=1)

    def grid_only():
        return grid_log_sum, grid_excess, grid_total, kl

    def with_cell():
        # the cell adds lost log(lost / missing) >= -missing / e to the KL divergence (at order
        # 0 the cell's term is its Q-mass; lost's round-off leaves the sign open)
        cell = _log_below_window(probs, inf_mass, z, log_p, xp.zeros(()))
        log_lost, log_missing, live = _cell_below_window(probs, inf_mass, z, log_p, safe[:, 0])
        log_lost = xp.where(live | xp.isnan(log_lost), log_lost, -xp.inf)
        loss = log_lost - log_missing  # the cell's loss
        lost = xp.exp(log_lost)
        excess = xp.where(live, lost * xp.expm1(xp.minimum(shift[:, 0] * loss,
                                                           _NEAR_ORDER_ONE)), 0.0)
        return (xp.logaddexp(grid_log_sum, xp.where(live, log_lost + shift[:, 0] * loss,
                                                    log_lost)),
                grid_excess + excess, grid_total + lost, kl - xp.exp(cell) / xp.e)

    log_sum, excess, total, kl = _on_its_side(pessimistic, grid_only, with_cell)
    log_sum = xp.where(near, log1p(excess / total, xp) + log1p(-inf_mass, xp), log_sum)
    general = log_sum / shift[:, 0]
    value = xp.where(orders == 1.0, kl, general)
    # D_a >= 0 for distributions: a value below 0 is round-off (clamped), -inf or NaN a failed
    # evaluation (e.g. overflow at huge orders), reported as inf (an upper bound) or 0 (a lower
    # bound)
    failed = _on_its_side(pessimistic, lambda: xp.inf, lambda: 0.0)
    value = xp.where(xp.isnan(value) | xp.isneginf(value), failed, xp.maximum(value, 0.0))
    return xp.where((orders >= 1.0) & (inf_mass > 0), xp.inf, value)


@float64
def tradeoff_from_profile(epsilons, deltas, alphas) -> jax.Array:
    """A lower bound on the tradeoff curve from privacy-profile points (Prop. 9's duality).

    Each point (eps_j, delta_j) with delta(eps_j) <= delta_j forces beta(alpha) >=
    e^{-eps_j} (1 - delta_j - alpha); the largest such bound (and 0) is returned at ``alphas``.
    Exact at the kinks when the points are a grid PLD's curve at its grid points.

    Args:
      epsilons: the points' eps_j (nats), finite reals, any shape (flattened).
      deltas: the points' delta_j, in [0, 1], any shape (flattened); one per epsilon (or one for
        all): each must be at least the true delta(eps_j) for the result to be a bound.
      alphas: type I errors at which to evaluate the bound, in [0, 1], any shape.

    Returns:
      The lower bound on beta (>= 0) at each alpha, with the shape of ``alphas`` (a NumPy array,
      or a NumPy float for a scalar ``alphas``; a JAX array under ``jit``). It is a pessimistic
      bound: the true tradeoff curve is at or above it.
    """
    check_range("epsilons", epsilons)
    check_range("alphas", alphas, 0.0, 1.0)
    check_range("deltas", deltas, 0.0, 1.0)
    _check_points("epsilons", epsilons, "deltas", deltas)
    traced = is_traced((epsilons, deltas, alphas))
    xp = jnp if traced else np  # concrete values in NumPy: no small program per operation
    eps = xp.asarray(epsilons, xp.float64).reshape(-1)
    d = xp.asarray(deltas, xp.float64).reshape(-1)
    a = xp.asarray(alphas, xp.float64)
    # every privacy curve has delta(eps) >= 1 - e^eps: a point below it (beyond round-off)
    # comes from none
    possible = d >= -xp.expm1(xp.minimum(eps, 0.0)) - 1e-12
    if not traced and not np.all(possible):
        j = int(np.argmin(possible))
        raise ValueError(f"deltas must be at least 1 - e^eps at each point (every privacy curve "
                         f"is), got delta {float(d[j])!r} at epsilon {float(eps[j])!r}")
    gap = 1.0 - d - a[..., None]
    with np.errstate(over="ignore", invalid="ignore"):  # e^-eps = inf where the gap is 0: not kept
        bounds = xp.where(gap > 0, xp.exp(-eps) * xp.maximum(gap, 0.0), 0.0)
    bound = xp.clip(xp.max(bounds, axis=-1), 0.0, 1.0 - a)  # beta(alpha) <= 1 - alpha always
    if traced:  # an invalid value claims nothing
        valid = (jnp.all(within(epsilons, -np.inf)) & jnp.all(within(deltas, 0.0, 1.0))
                 & jnp.all(possible))
        bound = jnp.where(valid & within(alphas, 0.0, 1.0), bound, 0.0)
    return host_result(bound)


def _check_points(first_name: str, first, second_name: str, second) -> None:
    """Raise a ValueError naming the argument unless ``first`` holds at least one point and
    ``second`` one value per point, or one for all."""
    if np.size(first) == 0:
        raise ValueError(f"{first_name} must hold at least one point, got none")
    if np.size(second) not in (1, np.size(first)):
        raise ValueError(f"{second_name} must hold one value per point of {first_name} "
                         f"({np.size(first)}) or one for all, got {np.size(second)}")


@float64
def profile_from_tradeoff(alphas, betas, epsilons) -> jax.Array:
    """An upper bound on the privacy profile from tradeoff points (Prop. 9's duality).

    delta(eps) = sup over tests of 1 - alpha - e^eps beta(alpha). If the piecewise-linear curve
    through the points (alpha_i, beta_i) lies below the true tradeoff curve everywhere (e.g. a
    pessimistic PLD's curve at its kinks), the supremum over it is attained at the points and
    max_i (1 - alpha_i - e^eps beta_i) is an upper bound on delta(eps). Points taken *on* a
    curved tradeoff function give a lower bound instead (their chords lie above it).

    Args:
      alphas: the points' type I errors alpha_i, in [0, 1], any shape (flattened).
      betas: the points' type II errors beta_i, in [0, 1], any shape (flattened); one per alpha
        (or one for all).
      epsilons: where to evaluate delta (nats), finite reals, any shape.

    Returns:
      max(0, max_i (1 - alpha_i - e^eps beta_i)) at each epsilon, with the shape of
      ``epsilons`` (a NumPy array, or a NumPy float for a scalar ``epsilons``; a JAX array under
      ``jit``). An upper bound on delta(eps) (pessimistic) when the points' curve lies below the
      true tradeoff curve, as above; a lower bound for points on a curved tradeoff function.
    """
    check_range("alphas", alphas, 0.0, 1.0)
    check_range("betas", betas, 0.0, 1.0)
    check_range("epsilons", epsilons)
    _check_points("alphas", alphas, "betas", betas)
    traced = is_traced((alphas, betas, epsilons))
    xp = jnp if traced else np  # concrete values in NumPy: no small program per operation
    a = xp.asarray(alphas, xp.float64).reshape(-1)
    b = xp.asarray(betas, xp.float64).reshape(-1)
    e = xp.asarray(epsilons, xp.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # e^eps = inf where beta is 0: not kept
        lines = 1.0 - a - xp.where(b > 0, xp.exp(e[..., None]) * b, 0.0)
    bound = xp.maximum(xp.max(lines, axis=-1), 0.0)
    if traced:  # an invalid value claims nothing
        valid = jnp.all(within(alphas, 0.0, 1.0)) & jnp.all(within(betas, 0.0, 1.0))
        bound = jnp.where(valid & within(epsilons), bound, 1.0)
    return host_result(bound)


# ``pessimistic`` is data in these programs: a pessimistic and an optimistic PLD of one shape share
# each of them
_tradeoff_jit = kernel_jit(tradeoff_kernel)
_renyi_jit = kernel_jit(renyi_kernel)
_log_mgf_jit = kernel_jit(log_mgf_kernel)


@float64
def tradeoff(pld: PLD, alpha) -> jax.Array:
    """The f-DP tradeoff curve beta(alpha), alpha in [0, 1] (see :meth:`PLD.tradeoff`)."""
    check_range("alpha", alpha, 0.0, 1.0)
    kernel = functools.partial(_tradeoff_jit, pessimistic=pld.pessimistic)
    on_host = functools.partial(tradeoff_kernel, pessimistic=pld.pessimistic)
    read = per_direction(pld, alpha, kernel, "minimum", host_kernel=on_host)
    return read_or_nothing(read, alpha, 0.0 if pld.pessimistic else 1.0, low=0.0, high=1.0)


@float64
def renyi(pld: PLD, order) -> jax.Array:
    """Rényi divergence of the given order(s) > 0 (see :meth:`PLD.renyi`)."""
    check_range("order", order, 0.0, low_open=True)
    kernel = functools.partial(_renyi_jit, pessimistic=pld.pessimistic)
    on_host = functools.partial(renyi_kernel, pessimistic=pld.pessimistic)
    read = per_direction(pld, order, kernel, "maximum", host_kernel=on_host)
    return read_or_nothing(read, order, np.inf if pld.pessimistic else 0.0, low=0.0,
                           low_open=True)


@float64
def log_mgf(pld: PLD, t) -> jax.Array:
    """log E_P[e^{t L}] (see :meth:`PLD.log_mgf`); the larger of two directions."""
    check_range("t", t, allow_inf=False)
    kernel = functools.partial(_log_mgf_jit, pessimistic=pld.pessimistic)
    on_host = functools.partial(log_mgf_kernel, pessimistic=pld.pessimistic)
    return per_direction(pld, t, kernel, "maximum", host_kernel=on_host)
