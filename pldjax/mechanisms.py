"""Mechanisms and their PLDs, discretized by connect-the-dots on an automatic grid.

Each mechanism is described by pure functions of its parameters: the log-survival functions of its
privacy loss under P and Q (which give the hockey-stick curve exactly), the spread of the loss (which
sets the step), and the window's centre and half-width.
:func:`~pldjax.discretize.discretize_mechanism` turns these into a :class:`~pldjax.pld.PLD`,
batched over parameter arrays in one jitted, vmapped call; the parameters are data, so new values
never trigger recompilation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pldjax import grid as grid_lib
from pldjax import subsampling
from pldjax.discretize import Mechanism, discretize_mechanism, masses_from_curve
from pldjax.grid import Grid
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.special import log_ndtr
from pldjax.validate import check_count, check_range, is_traced


def _gaussian_tails(params, eps):
    (mu,) = params
    pos = mu > 0
    safe = jnp.where(pos, mu, 1.0)
    sf = jnp.where(eps < 0, 0.0, -jnp.inf)  # mu = 0: the loss is 0 with certainty
    cdf = jnp.where(eps < 0, -jnp.inf, 0.0)
    return (
        jnp.where(pos, log_ndtr(safe / 2 - eps / safe), sf),
        jnp.where(pos, log_ndtr(-safe / 2 - eps / safe), sf),
        jnp.where(pos, log_ndtr(eps / safe - safe / 2), cdf),
        jnp.where(pos, log_ndtr(eps / safe + safe / 2), cdf),
    )


def _positive_or_one(x):
    return jnp.where(x > 0, x, 1.0)


GAUSSIAN = Mechanism(
    tails=_gaussian_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=lambda p: p[0] ** 2 / 2,
    half_width=lambda p: 10.0 * _positive_or_one(p[0]),
    chi2=lambda p: jnp.expm1(p[0] ** 2),
)


def _laplace_tails(params, eps):
    # P = Lap(0, b), Q = Lap(1, b), eps0 = 1/b: L = eps0 for x <= 0, eps0 (1 - 2x) on (0, 1),
    # -eps0 for x >= 1; so L > eps iff x < (1 - eps/eps0) / 2 for eps in [-eps0, eps0).
    (eps0,) = params
    inside = (eps >= -eps0) & (eps < eps0)
    below = eps < -eps0
    half = -jnp.log(2.0)
    sf = jnp.where(below, 0.0, -jnp.inf)
    cdf = jnp.where(below, -jnp.inf, 0.0)
    return (
        jnp.where(inside, jnp.log1p(-0.5 * jnp.exp(-(eps0 - eps) / 2)), sf),
        jnp.where(inside, half - (eps0 + eps) / 2, sf),
        jnp.where(inside, half - (eps0 - eps) / 2, cdf),
        jnp.where(inside, jnp.log1p(-0.5 * jnp.exp(-(eps0 + eps) / 2)), cdf),
    )


LAPLACE = Mechanism(
    tails=_laplace_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=lambda p: jnp.zeros_like(p[0]),
    half_width=lambda p: 1.01 * _positive_or_one(p[0]),
    # E_Q[(P/Q)^2] = (2/3) e^eps0 + (1/3) e^(-2 eps0), integrating over the three pieces of L
    chi2=lambda p: (2 * jnp.expm1(p[0]) + jnp.expm1(-2 * p[0])) / 3,
)


def _rr_tails(params, eps):
    e, d = params
    low = (1 - d) * jax.nn.sigmoid(-e)  # mass at loss -e under P (and at +e under Q)
    high = (1 - d) * jax.nn.sigmoid(e)  # mass at loss +e under P (and at -e under Q)
    above_low, above_high = eps < -e, eps < e
    return (
        jnp.log(d + high * above_high + low * above_low),
        jnp.log(low * above_high + high * above_low),
        jnp.log(low * ~above_low + high * ~above_high),
        jnp.log(d + high * ~above_low + low * ~above_high),
    )


RANDOMIZED_RESPONSE = Mechanism(
    tails=_rr_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=lambda p: jnp.zeros_like(p[0]),
    half_width=lambda p: 1.01 * _positive_or_one(p[0]),
    inf_mass=lambda p: p[1],  # delta: the output only P can produce
)


#: Below this (in nats, or as a sampling probability) a mechanism's parameter no longer shows in
#: float64 log-tails (log 1/2 + 1e-17 rounds to log 1/2), so its curve would come out 0.
MIN_PARAMETER = 2.0**-30


def _resolvable(x, pessimistic: bool):
    """``x`` (an array, >= 0), with values in (0, MIN_PARAMETER) replaced by MIN_PARAMETER for a
    pessimistic PLD and by 0 for an optimistic one. Sound for a mechanism whose privacy loss grows
    with ``x`` (Gaussian and Laplace 1/scale, randomized-response epsilon, sampling probability:
    the smaller one is a post-processing of the larger): the result dominates the truth or is
    dominated by it. 0 gives the identity, and MIN_PARAMETER a curve of order 1e-9."""
    x = jnp.asarray(x, jnp.float64)
    tiny = (x > 0) & (x < MIN_PARAMETER)
    return jnp.where(tiny, MIN_PARAMETER if pessimistic else 0.0, x)


NEIGHBORING = ("add_remove", "replace_one")
SAMPLING = ("poisson", "fixed_batch")


def _check_choice(name: str, value, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _noise_mechanism(
    base: Mechanism,
    params: tuple,
    sampling_prob,
    neighboring: str,
    sampling: str,
    pessimistic: bool,
    grid: Grid | None,
    replace_one_subsampled: Mechanism | None,
    name: str,
) -> PLD:
    """An additive-noise mechanism whose base pair is ``base`` with ``params`` (the last one being
    the shift between the output distributions: one sensitivity), under the adjacency and
    sampling asked for."""
    _check_choice("neighboring", neighboring, NEIGHBORING)
    _check_choice("sampling", sampling, SAMPLING)
    params = tuple(jnp.asarray(p, jnp.float64) for p in params)
    if any(base is m for m in _MONOTONE_IN_SHIFT):
        params = params[:-1] + (_resolvable(params[-1], pessimistic),)
    if neighboring == "replace_one":
        # a record's contribution goes from -sensitivity to +sensitivity
        params = params[:-1] + (2 * params[-1],)
    if sampling_prob is None:
        if sampling != "poisson":
            raise ValueError("sampling='fixed_batch' needs a sampling_prob (batch size / dataset size)")
        return discretize_mechanism(base, params, grid, pessimistic)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    q = _resolvable(sampling_prob, pessimistic)
    if sampling == "fixed_batch":
        if neighboring != "replace_one":
            raise ValueError(
                "sampling='fixed_batch' (without replacement) has a PLD under "
                "neighboring='replace_one' only: with add/remove neighbours the dataset size, "
                "hence the batch, changes"
            )
    elif neighboring == "replace_one":
        if replace_one_subsampled is None:
            raise ValueError(
                f"{name}: Poisson subsampling with neighboring='replace_one' is available for the "
                "Gaussian only; use sampling='fixed_batch' or neighboring='add_remove'"
            )
        undoubled = params[:-1] + (params[-1] / 2,)  # the replace-one mechanism takes one shift
        return discretize_mechanism(replace_one_subsampled, undoubled + (q,), grid, pessimistic)
    directions = jnp.asarray([subsampling.REMOVE, subsampling.ADD])
    both = discretize_mechanism(
        subsampling.poisson(base),
        tuple(p[..., None] for p in params) + (q[..., None], directions),
        grid,
        pessimistic,
    )
    remove, add = (
        PLD(both.probs[..., i, :], both.inf_mass[..., i], both.offset[..., i], both.step[..., i],
            both.pessimistic)
        for i in (0, 1)
    )
    return PLD(remove.probs, remove.inf_mass, remove.offset, remove.step, remove.pessimistic, add)


_ADJACENCY_DOC = """
      sampling_prob: probability q in [0, 1] that a record takes part (Poisson subsampling), or the
        batch fraction for ``sampling="fixed_batch"``; None (default) for no subsampling.
      neighboring: "add_remove" (default; one record added or removed) or "replace_one" (one
        record's contribution replaced by another, both of norm at most ``sensitivity``).
      sampling: "poisson" (default) or "fixed_batch" (sampling without replacement; replace-one
        adjacency only).
      pessimistic: True for the connect-the-dots upper estimate (default), False for the
        optimistic lower estimate.
      grid: optional :class:`Grid`; automatic by default.

    With Poisson subsampling and add/remove adjacency the PLD has two directions (remove: the
    mixture against the base; add: the base against the mixture, laplace-transform-dp.txt Thm 5.1);
    every reported value is the worse of the two.
"""


@float64
def gaussian(
    sigma,
    *,
    sensitivity=1.0,
    sampling_prob=None,
    neighboring: str = "add_remove",
    sampling: str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The Gaussian mechanism N(f(x), sigma^2), optionally subsampled.

    Without subsampling and with add/remove neighbours it is G_{sensitivity/sigma}.

    Args:
      sigma: noise standard deviation, > 0 (scalar or array: a batch of PLDs; all array arguments
        broadcast).
      sensitivity: L2 sensitivity (the largest norm of one record's contribution), > 0.
    """
    check_range("sigma", sigma, 0.0, low_open=True)
    check_range("sensitivity", sensitivity, 0.0, low_open=True)
    mu = jnp.asarray(sensitivity, jnp.float64) / jnp.asarray(sigma, jnp.float64)
    return _noise_mechanism(
        GAUSSIAN, (mu,), sampling_prob, neighboring, sampling, pessimistic, grid,
        subsampling.GAUSSIAN_REPLACE_ONE, "gaussian",
    )


gaussian.__doc__ += _ADJACENCY_DOC


@float64
def gdp(mu, *, pessimistic: bool = True, grid: Grid | None = None) -> PLD:
    """G_mu = PLD(N(0, 1) || N(mu, 1)), the mu-GDP curve; ``mu`` >= 0 (mu = 0 is the identity)."""
    check_range("mu", mu, 0.0)
    return discretize_mechanism(GAUSSIAN, (_resolvable(mu, pessimistic),), grid, pessimistic)


@float64
def laplace(
    scale,
    *,
    sensitivity=1.0,
    sampling_prob=None,
    neighboring: str = "add_remove",
    sampling: str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The Laplace mechanism with noise scale ``scale`` > 0 and L1 sensitivity ``sensitivity`` > 0.

    Without subsampling its loss lies in [-s/b, s/b] (s = sensitivity, b = scale) and
    delta(eps) = 1 - exp((eps - s/b)/2).

    Args:
      scale: noise scale b, > 0 (scalar or array).
      sensitivity: L1 sensitivity, > 0.
    """
    check_range("scale", scale, 0.0, low_open=True)
    check_range("sensitivity", sensitivity, 0.0, low_open=True)
    eps0 = jnp.asarray(sensitivity, jnp.float64) / jnp.asarray(scale, jnp.float64)
    return _noise_mechanism(
        LAPLACE, (eps0,), sampling_prob, neighboring, sampling, pessimistic, grid, None, "laplace"
    )


laplace.__doc__ += _ADJACENCY_DOC


#: Mechanisms whose last parameter (mu or 1/scale) can be floored by :func:`_resolvable`.
_MONOTONE_IN_SHIFT = (GAUSSIAN, LAPLACE)


# -- discrete noise ---------------------------------------------------------------------------------
def _dlap_log_cdf(t, k):
    """log P(K <= k) for P(K = j) proportional to e^{-t |j|}; k integer-valued (or +-inf)."""
    log_norm = jnp.log1p(jnp.exp(-t))
    safe = jnp.where(jnp.isfinite(k), k, 0.0)
    value = jnp.where(safe <= 0, t * safe - log_norm, jnp.log1p(-jnp.exp(-t * (safe + 1) - log_norm)))
    return jnp.where(k == jnp.inf, 0.0, jnp.where(k == -jnp.inf, -jnp.inf, value))


def _dlap_log_sf(t, k):
    """log P(K > k) (the mirror image of the CDF: P(K > k) = P(K <= -k - 1))."""
    return _dlap_log_cdf(t, -k - 1)


def _loss_threshold(below_top, above_bottom, position):
    """The largest integer k with loss(k) > eps: +inf when every k qualifies, -inf when none."""
    return jnp.where(above_bottom, jnp.inf, jnp.where(below_top, jnp.ceil(position) - 1, -jnp.inf))


def _dlap_tails(params, eps):
    # P = DLap(0), Q = DLap(D), t = 1/scale: loss t(|k - D| - |k|) in [-tD, tD], decreasing in k;
    # loss > eps  <=>  k <= ceil((D - eps/t) / 2) - 1
    t, shift = params
    k = _loss_threshold(eps < t * shift, eps < -t * shift, (shift - eps / t) / 2)
    return (
        _dlap_log_cdf(t, k), _dlap_log_cdf(t, k - shift),
        _dlap_log_sf(t, k), _dlap_log_sf(t, k - shift),
    )


def _dlap_chi2(params):
    # E_Q[(P/Q)^2] = tanh(t/2) [e^{tD} / (1 - e^-t) + e^{tD} sum_{0<k<D} e^{-3tk} + e^{-2tD} / (1 - e^-t)]
    # tanh(t/2) / (1 - e^-t) = 1 / (1 + e^-t), so E_Q[(P/Q)^2] - 1 is the sum of
    #   outer = (e^{tD} + e^{-2tD} - 1 - e^-t) / (1 + e^-t)   (written with expm1: order t^2, not 1 - 1)
    #   inner = tanh(t/2) e^{tD} e^{-3t} (1 - e^{-3t(D-1)}) / (1 - e^{-3t})   (0 for D = 1, no inf * 0)
    t, shift = params
    outer = (jnp.expm1(t * shift) + jnp.expm1(-2 * t * shift) - jnp.expm1(-t)) / (1 + jnp.exp(-t))
    log_inner = t * shift - 3 * t + jnp.log(-jnp.expm1(-3 * t * (shift - 1))) - jnp.log(-jnp.expm1(-3 * t))
    return outer + jnp.tanh(t / 2) * jnp.exp(log_inner)


DISCRETE_LAPLACE = Mechanism(
    tails=_dlap_tails,
    spread=lambda p: _positive_or_one(p[0] * p[1]),
    center=lambda p: jnp.zeros_like(p[0]),
    half_width=lambda p: 1.01 * _positive_or_one(p[0] * p[1]),
    chi2=_dlap_chi2,
)


def _dgauss_log_pmf(support: int, sigma, offset=0.0):
    """(integers k, log P(K = k + offset)) for the discrete Gaussian on ``support`` integers."""
    half = support // 2
    ks = jnp.arange(-half, support - half, dtype=jnp.float64)
    log_norm = jax.scipy.special.logsumexp(-(ks**2) / (2 * sigma**2))
    return ks, -((ks - offset) ** 2) / (2 * sigma**2) - log_norm


def _dgauss_tails(support: int, params, eps):
    # P(K = k) proportional to e^{-k^2 / (2 s^2)} on k in [-support/2, support/2), Q shifted by D;
    # loss (D^2 - 2 k D) / (2 s^2) decreases in k: loss > eps  <=>  k <= ceil((D^2 - 2 s^2 eps)/(2D)) - 1
    sigma, shift = params
    half = support // 2
    _, log_p = _dgauss_log_pmf(support, sigma)
    cdf = jax.lax.cumlogsumexp(log_p)
    sf = jnp.concatenate([jax.lax.cumlogsumexp(log_p, reverse=True)[1:], jnp.full((1,), -jnp.inf)])
    k = jnp.ceil((shift**2 - 2 * sigma**2 * eps) / (2 * shift)) - 1

    def lookup(table, index, below, above):
        inside = jnp.clip(index + half, 0, support - 1).astype(jnp.int32)
        return jnp.where(index < -half, below, jnp.where(index > support - half - 1, above, table[inside]))

    return (
        lookup(cdf, k, -jnp.inf, 0.0), lookup(cdf, k - shift, -jnp.inf, 0.0),
        lookup(sf, k, 0.0, -jnp.inf), lookup(sf, k - shift, 0.0, -jnp.inf),
    )


def _dgauss_chi2(support: int, params):
    sigma, shift = params
    _, log_p = _dgauss_log_pmf(support, sigma)
    _, log_q = _dgauss_log_pmf(support, sigma, shift)
    return jnp.exp(jax.scipy.special.logsumexp(2 * log_p - log_q)) - 1


@functools.cache
def _discrete_gaussian(support: int) -> Mechanism:
    """The discrete Gaussian on ``support`` integers around 0 (a static size, hence a factory)."""
    return Mechanism(
        tails=functools.partial(_dgauss_tails, support),
        spread=lambda p: _positive_or_one(p[1] / p[0]),
        center=lambda p: p[1] ** 2 / (2 * p[0] ** 2),
        half_width=lambda p: (p[1] ** 2 + 2 * p[1] * (40 * p[0] + p[1])) / (2 * p[0] ** 2),
        chi2=functools.partial(_dgauss_chi2, support),
    )


#: Integers either side of the discrete Gaussian's centre, in standard deviations: the mass beyond
#: 38.6 sigma is below 1e-324, zero in float64, so truncating there loses nothing representable.
_DGAUSS_SIGMAS = 40
_DGAUSS_MAX_SUPPORT = 2**22
#: Below this sigma the loss scale 1 / (2 sigma^2) overflows float64 (a smaller sigma is refused,
#: not rounded up: a larger sigma would understate the loss).
_DGAUSS_MIN_SIGMA = 1e-150


def _lattice_grid(grid: Grid | None, sampling_prob, unit, points_per_unit: float,
                  mechanism: Mechanism, params: tuple, pessimistic: bool) -> Grid | None:
    """For a lone (scalar, not subsampled) integer-noise mechanism whose losses are multiples of
    ``unit``: a grid step of unit / 2^j (about 1/``points_per_unit`` of it or finer), so every
    loss sits on the grid and the discretization is exact. Otherwise ``grid`` unchanged (also
    for an optimistic PLD whose lattice window would span more than the optimistic construction
    allows, or a step above grid.MAX_STEP: the automatic grid then)."""
    if grid is not None or sampling_prob is not None or np.size(unit) != 1 or is_traced(unit):
        return grid
    j = max(0, int(np.ceil(np.log2(points_per_unit))))
    step = float(np.asarray(unit).reshape(())) / 2**j
    if not step <= grid_lib.MAX_STEP:  # losses too far apart for any grid (or inf): automatic
        return grid
    if not pessimistic:
        half = float(np.max(mechanism.half_width(tuple(np.asarray(p, np.float64) for p in params))))
        if step > grid_lib.optimistic_step_limit(grid_lib.mechanism_size(half / step)):
            return grid
    return Grid(step=step)


def _check_integer(name: str, value) -> None:
    check_range(name, value, 1.0)
    if not is_traced(value) and np.any(np.asarray(value, np.float64) % 1 != 0):
        raise ValueError(f"{name} must be a whole number >= 1 (integer-valued queries), got {value!r}")


@float64
def discrete_laplace(
    scale,
    *,
    sensitivity=1,
    sampling_prob=None,
    neighboring: str = "add_remove",
    sampling: str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The discrete Laplace mechanism: integer noise K with P(K = k) proportional to e^{-|k|/scale}.

    Its loss takes the values t(D - 2k) clipped to [-tD, tD] (t = 1/scale, D = sensitivity): on a
    grid whose step divides t the PLD is exact. Pessimistic (an upper bound) by default.

    Args:
      scale: > 0, in units of the query's integer output (scalar or array); the loss is in nats.
      sensitivity: whole number >= 1 (L1 sensitivity of an integer-valued query).
    """
    check_range("scale", scale, 0.0, low_open=True)
    _check_integer("sensitivity", sensitivity)
    # 1 / scale in float64 also for a traced (possibly float32) scale
    t = 1.0 / np.asarray(scale, np.float64) if not is_traced(scale) else 1.0 / jnp.asarray(scale, jnp.float64)
    # no broadcast here: discretize_mechanism broadcasts (a sensitivity array may be wider than scale)
    shift = sensitivity if is_traced(sensitivity) else np.asarray(sensitivity, np.float64)
    # losses t (D - 2k): multiples of t; about 64 grid points across the loss range [-tD, tD]
    if not is_traced(sensitivity):
        grid = _lattice_grid(grid, sampling_prob, t, 64 / float(np.max(sensitivity)),
                             DISCRETE_LAPLACE, (t, shift), pessimistic)
    return _noise_mechanism(
        DISCRETE_LAPLACE, (t, shift), sampling_prob, neighboring, sampling, pessimistic, grid, None,
        "discrete_laplace",
    )


discrete_laplace.__doc__ += _ADJACENCY_DOC


@float64
def discrete_gaussian(
    sigma,
    *,
    sensitivity=1,
    sampling_prob=None,
    neighboring: str = "add_remove",
    sampling: str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The discrete Gaussian mechanism: integer noise with P(K = k) proportional to
    e^{-k^2 / (2 sigma^2)} (Canonne, Kamath and Steinke). Pessimistic by default.

    The distribution is summed over the integers within 40 sigma of the centre, beyond which its
    mass is below float64's smallest number. ``sigma`` must be concrete (the support's length is
    a static shape).

    Args:
      sigma: >= 1e-150 (below it the loss overflows float64), in units of the query's integer
        output (scalar or array; the noise's standard deviation is close to sigma for sigma >= 1,
        below it for small sigma).
      sensitivity: whole number >= 1 (L1 = L2 sensitivity of an integer-valued query).
    """
    check_range("sigma", sigma, _DGAUSS_MIN_SIGMA)
    _check_integer("sensitivity", sensitivity)
    if is_traced((sigma, sensitivity)):
        raise ValueError("discrete_gaussian needs concrete sigma and sensitivity (its support is a "
                         "static size)")
    needed = 2 * (_DGAUSS_SIGMAS * float(np.max(sigma)) + 2 * float(np.max(sensitivity)) + 2)
    support = grid_lib.next_pow2(int(np.ceil(needed)))
    if support > _DGAUSS_MAX_SUPPORT:
        raise ValueError(f"sigma={np.max(sigma)} needs a support of {support} integers (more than "
                         f"{_DGAUSS_MAX_SUPPORT}); use gaussian() for such wide noise")
    s = jnp.asarray(sigma, jnp.float64)
    shift = np.asarray(sensitivity, np.float64)  # broadcast with sigma by discretize_mechanism
    # losses (D - 2k) D / (2 sigma^2): multiples of D / (2 sigma^2); about 64 points per sd D/sigma
    unit = np.asarray(sensitivity, np.float64) / (2 * np.asarray(sigma, np.float64) ** 2)
    if np.size(unit) == 1 and 80 * float(np.max(sigma)) < grid_lib.MAX_MECHANISM_SIZE:
        grid = _lattice_grid(grid, sampling_prob, unit, 32 / float(np.max(sigma)),
                             _discrete_gaussian(support), (s, shift), pessimistic)
    return _noise_mechanism(
        _discrete_gaussian(support), (s, shift), sampling_prob, neighboring, sampling, pessimistic,
        grid, None, "discrete_gaussian",
    )


discrete_gaussian.__doc__ += _ADJACENCY_DOC


@float64
def randomized_response(
    epsilon,
    delta=0.0,
    *,
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """R_{epsilon,delta} (residue-filters.txt Def. 5): the PLD of an (epsilon, delta)-DP guarantee.

    Losses +epsilon and -epsilon with masses (1-delta) e^eps/(1+e^eps) and (1-delta)/(1+e^eps), and
    an atom delta at +inf. Exact when epsilon is a multiple of the grid step (e.g. dyadic epsilon on
    the automatic grid); otherwise connect-the-dots gives the pessimistic (or optimistic) estimate.
    """
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    return discretize_mechanism(
        RANDOMIZED_RESPONSE, (_resolvable(epsilon, pessimistic), delta), grid, pessimistic
    )


def _curve_to_pld(delta_fn, step: float, offset: int, size: int, name: str) -> PLD:
    z = (offset + np.arange(size)) * step
    curve = np.asarray(delta_fn(z), np.float64)
    if curve.shape != z.shape:
        raise ValueError(f"{name} must map an array of epsilons to an array of the same shape")
    if np.any(~np.isfinite(curve)) or np.any(curve < 0) or np.any(curve > 1):
        raise ValueError(f"{name} must return values in [0, 1]")
    x = np.exp(z - z[size // 2])
    tol = 1e-9
    if np.any(np.diff(curve) > tol) or np.any(curve < -np.expm1(z) - tol):
        raise ValueError(
            f"{name} is not a privacy curve: it must be non-increasing with delta(eps) >= 1 - e^eps"
        )
    slopes = np.diff(curve) / np.diff(x)
    if size > 2 and np.any(np.diff(slopes) < -tol * np.maximum(1.0, np.abs(slopes[1:]))):
        raise ValueError(f"{name} is not a privacy curve: it must be convex in e^eps")
    excess = curve + np.expm1(z)
    probs, inf_mass = masses_from_curve(jnp.asarray(curve), step, jnp.asarray(excess), jnp.asarray(z))
    return PLD(probs, inf_mass, jnp.asarray(offset, jnp.int64), jnp.asarray(step, jnp.float64), True)


@float64
def from_privacy_curve(
    delta: Callable,
    *,
    epsilon_min: float,
    epsilon_max: float,
    step: float,
    reverse: Callable | None = None,
) -> PLD:
    """The pessimistic PLD of any mechanism, from its hockey-stick curve(s) (connect-the-dots Alg. 1).

    Args:
      delta: vectorized function eps (NumPy array, nats) -> delta(eps) of PLD(P || Q): the exact
        privacy curve, or an upper bound on it that is itself a privacy curve (non-increasing,
        convex in e^eps, delta(eps) >= 1 - e^eps). The result's curve interpolates it at the grid
        points and lies above it in between: an upper bound, and the tightest on this grid.
      epsilon_min, epsilon_max: the loss window (nats); losses below it are moved up into its
        lowest point, and delta(epsilon_max) becomes the atom at +inf.
      step: grid spacing (nats); a power of two composes with the automatic grids.
      reverse: the curve of PLD(Q || P) when the mechanism is not symmetric (e.g. add/remove
        adjacency); the result then has both directions.
    """
    check_range("step", step, 0.0, low_open=True)
    check_range("epsilon_min", epsilon_min)
    check_range("epsilon_max", epsilon_max, float(epsilon_min), low_open=True)
    offset = int(np.floor(epsilon_min / step))
    size = int(np.ceil(epsilon_max / step)) - offset + 1
    if size > grid_lib.MAX_MECHANISM_SIZE:
        raise ValueError(
            f"the window [{epsilon_min}, {epsilon_max}] at step {step} needs {size} points "
            f"(more than {grid_lib.MAX_MECHANISM_SIZE}); use a larger step"
        )
    forward = _curve_to_pld(delta, step, offset, size, "delta")
    if reverse is None:
        return forward
    back = _curve_to_pld(reverse, step, offset, size, "reverse")
    return PLD(forward.probs, forward.inf_mass, forward.offset, forward.step, True, back)


@float64
def approx_dp_composition(epsilon: float, delta: float, count: int = 1, *,
                          grid: Grid | None = None) -> PLD:
    """The exact PLD of ``count`` compositions of an (epsilon, delta)-DP guarantee (R_{eps,delta}).

    laplace-transform-dp.txt Cor. 4.7 in closed form: losses (count - 2j) epsilon with masses
    (1-delta)^count C(count, j) p^(count-j) (1-p)^j, p = e^eps / (1 + e^eps), and an atom
    1 - (1-delta)^count at +inf; built directly on the lattice of step epsilon (O(count), no FFT, no
    discretization error). Tight: no composition of (epsilon, delta)-DP mechanisms is worse.
    ``grid``: put it on ``grid.step`` instead (exact when the step divides epsilon, otherwise
    each loss is rounded up: pessimistic); ``epsilon = 0`` (R_{0,delta}) needs no grid.
    ``epsilon`` and ``delta`` are scalars (build a batch by stacking). Memory guard: the lattice has
    2 count + 1 points (2 count epsilon / step + 1 on ``grid``), at most grid.MAX_SIZE, so
    ``count`` <= (grid.MAX_SIZE - 1) // 2; larger is a ValueError.
    """
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if np.ndim(value) != 0:
            raise ValueError(f"{name} must be a scalar, got shape {np.shape(value)}")
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    count = check_count("count", count, minimum=1)
    max_count = (grid_lib.MAX_SIZE - 1) // 2
    if count > max_count:
        raise ValueError(f"count must be an integer in [1, {max_count}] (a memory guard: the "
                         f"lattice has 2 count + 1 points), got {count}")
    step = 1.0 if grid is None or grid.step is None else float(grid.step)
    if grid is not None and 2 * count * float(epsilon) / step + 1 > grid_lib.MAX_SIZE:
        raise ValueError(f"grid.step = {step} is too fine for count = {count} and epsilon = "
                         f"{float(epsilon)}: the lattice would need more than grid.MAX_SIZE = "
                         f"{grid_lib.MAX_SIZE} points (a memory guard); use a step of at least "
                         f"{2 * count * float(epsilon) / (grid_lib.MAX_SIZE - 1):.3g}")
    j = jnp.arange(count + 1, dtype=jnp.float64)
    log_binomial = (jax.scipy.special.gammaln(count + 1.0) - jax.scipy.special.gammaln(j + 1.0)
                    - jax.scipy.special.gammaln(count - j + 1.0))
    eps = jnp.asarray(epsilon, jnp.float64)
    log_keep = count * jnp.log1p(-jnp.asarray(delta, jnp.float64))
    # losses (count - 2 j) eps, ascending in the index i = count - j
    log_mass = (log_keep + log_binomial - (count - j) * jax.nn.softplus(-eps)
                - j * jax.nn.softplus(eps))[::-1]
    inf_mass = -jnp.expm1(log_keep)
    if grid is None and epsilon > 0:
        probs = jnp.zeros(2 * count + 1).at[::2].set(jnp.exp(log_mass))
        return PLD(probs, inf_mass, jnp.asarray(-count, jnp.int64), eps, True)
    losses = (2 * np.arange(count + 1) - count) * float(epsilon)
    index = np.ceil(losses / step - 1e-12).astype(np.int64)
    probs = jnp.zeros(int(index[-1] - index[0]) + 1).at[index - index[0]].add(jnp.exp(log_mass))
    return PLD(probs, inf_mass, jnp.asarray(index[0], jnp.int64), jnp.asarray(step), True)


@float64
def identity(*, pessimistic: bool = True) -> PLD:
    """The PLD of a mechanism that reveals nothing: all mass at loss 0 (neutral for composition)."""
    one = jnp.ones((1,), jnp.float64)
    return PLD(one, jnp.zeros(()), jnp.zeros((), jnp.int64), jnp.ones(()), pessimistic)


__all__ = [
    "approx_dp_composition",
    "discrete_gaussian",
    "discrete_laplace",
    "from_privacy_curve",
    "gaussian",
    "gdp",
    "identity",
    "laplace",
    "randomized_response",
]
