"""Named constructors of PLDs: thin wrappers of
:func:`~pldjax.mechanisms.events.privacy_loss` (:func:`gaussian`, :func:`laplace`, ...), and
PLDs built from other descriptions (:func:`from_privacy_curve`, :func:`approx_dp_composition`,
:func:`identity`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import array_module, kernel_jit, to_device
from pldjax.core.grid import Grid
from pldjax.core.pld import PLD, from_rows, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.special import binomial_pmf, log1p, special_functions
from pldjax.core.validation import check_count, check_range, is_traced, refuse_traced, within
from pldjax.kernels.discretize import lower_hull_at, masses_from_curve
from pldjax.mechanisms import sampling as sampling_lib
from pldjax.mechanisms.events import privacy_loss
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import (
    GDP,
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    RandomizedResponse,
)
from pldjax.mechanisms.sampling import Sampling

#: The arguments the named noise constructors share (see :func:`pldjax.mechanisms.sampling.from_args` and
#: :func:`privacy_loss`).
_SHARED_ARGS = """
      sampling_prob: q in [0, 1], the probability that a record takes part in a step (for
        ``sampling="fixed_batch"``, the batch fraction b / n); scalar or array (it broadcasts with
        the noise's parameters). None (default): no sampling.
      neighboring: "add_remove" (default), "replace_one" or "replace_special" (zero-out), or a
        :class:`~pldjax.mechanisms.neighboring.Neighboring`; see :func:`privacy_loss`.
      sampling: "poisson" (default) or "fixed_batch" (sampling without replacement, under
        ``neighboring="replace_one"`` only), taken with ``sampling_prob`` (see
        :func:`pldjax.mechanisms.sampling.from_args`); or a :mod:`pldjax.mechanisms.sampling`
        record, with ``sampling_prob`` left None.
      pessimistic: True (default) for the connect-the-dots upper estimate, False for the
        optimistic lower estimate; see :func:`privacy_loss`.
      grid: optional :class:`Grid`; None (default): automatic. See :func:`privacy_loss`.

    Returns:
      A :class:`PLD` whose batch shape is the broadcast shape of the array arguments (unbatched
      for scalars), with both adjacency directions where the scheme has two (see
      :func:`privacy_loss`). Pessimistic by default: it dominates the true mechanism (an upper
      bound on delta(eps) and on epsilon(delta)); with ``pessimistic=False``, optimistic (a lower
      bound).
"""


def _wrapper_doc(fn):
    fn.__doc__ += _SHARED_ARGS
    return fn


@_wrapper_doc
@float64
def gaussian(
    sigma,
    *,
    sensitivity=1.0,
    sampling_prob=None,
    neighboring: Neighboring | str = Neighboring.ADD_REMOVE,
    sampling: Sampling | str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The Gaussian mechanism N(f(x), sigma^2), optionally subsampled (:class:`pldjax.mechanisms.noise.
    Gaussian`). Without subsampling and with add/remove neighbours it is G_{sensitivity/sigma}.

    Args:
      sigma: noise standard deviation, > 0 (scalar or array: a batch of PLDs; all array arguments
        broadcast).
      sensitivity: L2 sensitivity (the largest norm of one record's contribution), > 0; 1 by
        default (then ``sigma`` is the noise multiplier)."""
    return privacy_loss(Gaussian(sigma, sensitivity), sampling_lib.from_args(sampling_prob, sampling),
                        neighboring, pessimistic=pessimistic, grid=grid)


@float64
def gdp(mu, *, pessimistic: bool = True, grid: Grid | None = None) -> PLD:
    """G_mu = PLD(N(0, 1) || N(mu, 1)), the mu-GDP curve; ``mu`` >= 0 (mu = 0 is the identity).

    Args:
      mu: >= 0 and finite (scalar or array: a batch of PLDs).
      pessimistic: True (default) for the connect-the-dots upper estimate, False for the
        optimistic lower estimate.
      grid: optional :class:`Grid`; None (default): automatic.

    Returns:
      A :class:`PLD` with the batch shape of ``mu`` and one direction (the pair is symmetric).
      Pessimistic by default (it dominates G_mu: an upper bound on delta and epsilon); with
      ``pessimistic=False``, optimistic (a lower bound).
    """
    return privacy_loss(GDP(mu), pessimistic=pessimistic, grid=grid)


@_wrapper_doc
@float64
def laplace(
    scale,
    *,
    sensitivity=1.0,
    sampling_prob=None,
    neighboring: Neighboring | str = Neighboring.ADD_REMOVE,
    sampling: Sampling | str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The Laplace mechanism with noise scale ``scale`` > 0 and L1 sensitivity ``sensitivity`` > 0
    (:class:`pldjax.mechanisms.noise.Laplace`). Without subsampling its loss lies in [-s/b, s/b]
    (s = sensitivity, b = scale) and delta(eps) = 1 - exp((eps - s/b)/2).

    Args:
      scale: noise scale b, > 0 (scalar or array).
      sensitivity: L1 sensitivity, > 0 (scalar or array); 1 by default."""
    return privacy_loss(Laplace(scale, sensitivity), sampling_lib.from_args(sampling_prob, sampling),
                        neighboring, pessimistic=pessimistic, grid=grid)


@_wrapper_doc
@float64
def discrete_laplace(
    scale,
    *,
    sensitivity=1,
    sampling_prob=None,
    neighboring: Neighboring | str = Neighboring.ADD_REMOVE,
    sampling: Sampling | str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The discrete Laplace mechanism: integer noise K with P(K = k) proportional to e^{-abs(k)/scale}
    (:class:`pldjax.mechanisms.noise.DiscreteLaplace`). Its loss takes the values t(D - 2k) clipped to
    [-tD, tD] (t = 1/scale, D = sensitivity): on a grid whose step divides t the PLD is exact.
    Pessimistic (an upper bound) by default.

    Args:
      scale: > 0, in units of the query's integer output (scalar or array); the loss is in nats.
      sensitivity: whole number >= 1 (L1 sensitivity of an integer-valued query); 1 by
        default."""
    return privacy_loss(DiscreteLaplace(scale, sensitivity),
                        sampling_lib.from_args(sampling_prob, sampling), neighboring,
                        pessimistic=pessimistic, grid=grid)


@_wrapper_doc
@float64
def discrete_gaussian(
    sigma,
    *,
    sensitivity=1,
    sampling_prob=None,
    neighboring: Neighboring | str = Neighboring.ADD_REMOVE,
    sampling: Sampling | str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The discrete Gaussian mechanism: integer noise with P(K = k) proportional to
    e^{-k^2 / (2 sigma^2)} (:class:`pldjax.mechanisms.noise.DiscreteGaussian`). Pessimistic by default.

    The distribution is summed over the integers within 40 sigma of the centre, beyond which its
    mass is below float64's smallest number. ``sigma`` must be concrete (the support's length is
    a static shape).

    Args:
      sigma: >= 1e-150 (below it the loss overflows float64), in units of the query's integer
        output (scalar or array; the noise's standard deviation is close to sigma for sigma >= 1,
        below it for small sigma).
      sensitivity: whole number >= 1 (L1 = L2 sensitivity of an integer-valued query); 1 by
        default. Like ``sigma``, it must be concrete."""
    return privacy_loss(DiscreteGaussian(sigma, sensitivity),
                        sampling_lib.from_args(sampling_prob, sampling), neighboring,
                        pessimistic=pessimistic, grid=grid)


@float64
def randomized_response(
    epsilon,
    delta=0.0,
    *,
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """R_{epsilon,delta} (:class:`pldjax.mechanisms.noise.RandomizedResponse`): the PLD of an
    (epsilon, delta)-DP guarantee.

    Losses +epsilon and -epsilon with masses (1-delta) e^eps/(1+e^eps) and (1-delta)/(1+e^eps), and
    an atom delta at +inf. Exact when epsilon is a multiple of the grid step (e.g. dyadic epsilon on
    the automatic grid); otherwise connect-the-dots gives the pessimistic (or optimistic) estimate.

    Args:
      epsilon: >= 0 and finite (nats); scalar or array (a batch; it broadcasts with ``delta``).
      delta: in [0, 1], the mass of the atom at +inf; 0 by default (pure epsilon-DP).
      pessimistic: True (default) for the connect-the-dots upper estimate, False for the
        optimistic lower estimate.
      grid: optional :class:`Grid`; None (default): automatic.

    Returns:
      A :class:`PLD` with the broadcast shape of ``epsilon`` and ``delta`` as batch shape and one
      direction. Pessimistic by default (it dominates R_{epsilon,delta}: an upper bound); with
      ``pessimistic=False``, optimistic (a lower bound).
    """
    return privacy_loss(RandomizedResponse(epsilon, delta), pessimistic=pessimistic, grid=grid)


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
    # a concave kink within the values' own round-off (16 ulps, over the spacing in x) is none:
    # near eps = -10 at step 1e-3 the exact Gaussian curve's slopes carry errors of 1e-8
    noise = (16 * np.finfo(np.float64).eps * np.maximum(np.abs(curve[:-1]), np.abs(curve[1:]))
             / np.diff(x))
    kinks = np.diff(slopes) + tol * np.maximum(1.0, np.abs(slopes[1:])) + noise[:-1] + noise[1:]
    if size > 2 and np.any(kinks < 0):
        raise ValueError(f"{name} is not a privacy curve: it must be convex in e^eps")
    excess = curve + np.expm1(z)
    with np.errstate(all="ignore"):  # in NumPy, as XLA: e^h overflows to inf for huge steps
        probs, inf_mass = masses_from_curve(curve, step, excess, z)
    return from_rows(probs, inf_mass, np.int64(offset), np.float64(step), (), True)


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
        points and lies above it in between: an upper bound, and the tightest on this grid. It is
        called once, on the window's grid points, and must return an array of their shape with
        values in [0, 1]; values that are not a privacy curve (beyond a tolerance of about 1e-9)
        are a ValueError.
      epsilon_min: the bottom of the loss window (nats, finite); losses below it are moved up
        into its lowest point, epsilon_min rounded down to a multiple of ``step``.
      epsilon_max: the top of the loss window (nats, finite, > epsilon_min), rounded up to a
        multiple of ``step``; delta(epsilon_max), taken at that rounded point, becomes the atom
        at +inf. The window may hold at most grid.MAX_MECHANISM_SIZE (2^20) points, else a
        ValueError (use a larger step).
      step: grid spacing (nats), in (0, grid.MAX_STEP] = (0, 256]; a power of two composes with
        the automatic grids.
      reverse: the curve of PLD(Q || P) when the mechanism is not symmetric (e.g. add/remove
        adjacency); the result then has both directions. None (default): symmetric, one
        direction. Same requirements as ``delta``.

    Returns:
      An unbatched, pessimistic :class:`PLD` on the window's grid (an upper bound), which
      dominates every pair whose curves lie at or below ``delta`` (and ``reverse``); two
      directions when ``reverse`` is given.
    """
    check_range("step", step, 0.0, grid_lib.MAX_STEP, low_open=True)
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
    return PLD.from_directions(forward, None if reverse is None else _curve_to_pld(
        reverse, step, offset, size, "reverse"))


#: Rényi orders of :func:`zcdp`'s conversion, 1 + 2^-20 to 1 + 2^20 (a finite set: each order's
#: bound is valid, so their smallest is an upper bound whichever orders are taken).
_ZCDP_ORDERS = 1.0 + np.geomspace(2.0**-20, 2.0**20, 4001)
#: Every how many of _ZCDP_ORDERS :func:`_zcdp_bound` looks first (it divides 4,000, so that
#: the last order is among them).
_ZCDP_STRIDE = 32
#: Points of :func:`zcdp`'s window (its step follows).
_ZCDP_POINTS = 4096
#: The widest window of :func:`zcdp` (nats; see :func:`zcdp_window`).
_ZCDP_MAX_WINDOW = 700.0


def _zcdp_log_delta(orders, epsilons, rho: float, xi: float):
    """log of the conversion of (a, xi + rho a)-RDP to (eps, delta)-DP at each order a of
    ``orders`` and epsilon of ``epsilons`` (broadcast; Canonne, Kamath and Steinke 2020, Prop.
    12): (a - 1)(xi + rho a - eps) - log a + (a - 1) log(1 - 1/a)."""
    return ((orders - 1.0) * (xi + rho * orders - epsilons) - np.log(orders)
            + (orders - 1.0) * np.log1p(-1.0 / orders))


def _zcdp_bound(epsilons, rho: float, xi: float) -> np.ndarray:
    """The smallest over _ZCDP_ORDERS of :func:`_zcdp_log_delta`'s conversion, at most 1, at each
    of ``epsilons`` (nats, >= 0).

    The log of the conversion is convex in the order a (a quadratic in a, -log a, and (a - 1)
    log(1 - 1/a), whose second derivative is 1 / (a^2 (a - 1))), so along the ascending orders
    it falls, then rises: its smallest lies within a stride of the smallest of every
    _ZCDP_STRIDE-th order, and only those orders and that band are evaluated (about a twentieth
    of the orders; the same expressions, so the same values as the minimum over all of them,
    but for ties that rounding breaks)."""
    with np.errstate(over="ignore"):  # a huge rho: delta's bound overflows to inf, read as 1
        coarse = _zcdp_log_delta(_ZCDP_ORDERS[::_ZCDP_STRIDE, None], epsilons[None, :], rho, xi)
        around = _ZCDP_STRIDE * np.argmin(coarse, axis=0)
        band = np.clip(around[:, None] + np.arange(-_ZCDP_STRIDE, _ZCDP_STRIDE + 1),
                       0, _ZCDP_ORDERS.size - 1)
        log_delta = _zcdp_log_delta(_ZCDP_ORDERS[band], epsilons[:, None], rho, xi)
        return np.minimum(np.exp(np.min(log_delta, axis=1)), 1.0)


def zcdp_window(rho: float, xi: float = 0.0) -> float:
    """The top of :func:`zcdp`'s window (nats): where the converted curve falls below 1e-18. A
    ValueError naming ``rho`` and ``xi`` where they are out of range or the window is wider
    than 700 nats (its hull is taken in x = e^(eps - top), which underflows below -745)."""
    check_range("rho", rho, 0.0)
    check_range("xi", xi, 0.0)
    rho, xi = float(rho), float(xi)
    # the Gaussian-like tail: delta near e^(-(eps - xi - rho)^2 / (4 rho)) reaches 1e-18 below
    # this top, which the scan below lowers to where the bound does
    top = xi + rho
    if top <= _ZCDP_MAX_WINDOW:  # else already too wide (and the estimate below could overflow)
        top = xi + rho + 2.0 * np.sqrt(rho * np.log(1e18)) + 8.0 * rho + 1.0
        scan = np.linspace(0.0, top, 1025)
        below = scan[_zcdp_bound(scan, rho, xi) <= grid_lib.TAIL_MASS]
        top = float(below[0]) if below.size else top
    if top > _ZCDP_MAX_WINDOW:
        raise ValueError(f"rho = {rho:g} and xi = {xi:g} need a window of {top:.4g} nats, beyond "
                         f"the {_ZCDP_MAX_WINDOW:g} on which e^eps stays a float64: rho at most "
                         "about 400 and xi at most about 690 (a mechanism beyond is not private "
                         "in any useful sense)")
    return top


@float64
def zcdp(rho: float, xi: float = 0.0) -> PLD:
    """A pessimistic PLD that dominates every (xi, rho)-zCDP mechanism (Rényi DP xi + rho a at
    every order a > 1; Bun and Steinke 2016): its curve is the tightest conversion of that Rényi
    bound to a privacy profile (Canonne, Kamath and Steinke 2020, Prop. 12, the smallest over
    4,001 orders), made convex in e^eps (its lower convex hull at the grid points: every
    mechanism's curve is convex and below the conversion, so below the hull too), on a window
    from eps = 0 (losses below 0 move up to 0; the mechanisms are symmetric) to where the curve
    is below 1e-18 (what lies beyond is the atom at +inf), about 4,096 points. ``rho`` and ``xi``
    >= 0 (nats; (xi, rho) composes by addition); a window wider than 700 nats (rho above about
    400, xi above about 690) is refused with a ValueError.

    Args:
      rho: >= 0 and finite, a scalar (nats): the Rényi divergence's growth rate in the order.
      xi: >= 0 and finite, a scalar (nats): the order-independent part; 0 by default (rho-zCDP).

    Returns:
      An unbatched, pessimistic :class:`PLD` with one direction, on a power-of-two grid step,
      which is an upper bound on delta(eps) and epsilon(delta) of every (xi, rho)-zCDP
      mechanism.
    """
    refuse_traced("zcdp", (rho, xi), "build it from concrete rho and xi, outside the trace",
                  "builds its curve from rho and xi on the host")
    top = zcdp_window(rho, xi)
    rho, xi = float(rho), float(xi)
    step = float(np.ldexp(1.0, int(np.ceil(np.log2(top / (_ZCDP_POINTS - 1))))))
    grid = np.arange(int(np.ceil(top / step)) + 1) * step
    values = _zcdp_bound(grid, rho, xi)
    # with (x, delta) = (0, 1), where every curve starts (delta(-inf) = 1): a curve falling
    # faster than that chord at eps = 0 leaves its lowest point a negative mass, which the
    # masses cannot hold (near pure DP, rho = 0, every mass went to +inf)
    hull = lower_hull_at(np.concatenate([[0.0], np.exp(grid - grid[-1])]),
                         np.concatenate([[1.0], values]))[1:]
    hull = np.minimum(np.maximum.accumulate(hull[::-1])[::-1], values)  # non-increasing, below
    return from_privacy_curve(lambda eps: np.interp(eps, grid, hull), epsilon_min=0.0,
                              epsilon_max=float(grid[-1]), step=step)


def _lattice_masses(epsilon, delta, count: int):
    """The masses of the losses -count epsilon, ..., count epsilon (ascending, 2 count + 1 points
    of step epsilon, every other one 0) of ``count`` compositions of R_{epsilon,delta}, and the
    atom at +inf; NumPy's for NumPy scalars (``_lattice_masses_jit`` under a trace: one program
    for each count)."""
    xp = array_module(epsilon, delta)
    eps = xp.asarray(epsilon, xp.float64)
    log_keep = count * log1p(-xp.asarray(delta, xp.float64), xp)
    # j of the count steps at loss -eps (probability 1 / (1 + e^eps) each): losses
    # (count - 2 j) eps, ascending in the index i = count - j
    expit = special_functions(xp).expit
    masses = xp.exp(log_keep) * binomial_pmf(xp.arange(count + 1.0), count, expit(-eps),
                                             expit(eps), xp)[::-1]
    if xp is np:
        probs = np.zeros(2 * count + 1)
        probs[::2] = masses
        return probs, -np.expm1(log_keep)
    return jnp.zeros(2 * count + 1).at[::2].set(masses), -jnp.expm1(log_keep)


_lattice_masses_jit = kernel_jit(_lattice_masses, static_argnames="count")


@float64
def approx_dp_composition(epsilon: float, delta: float, count: int = 1, *,
                          grid: Grid | None = None) -> PLD:
    """The exact PLD of ``count`` compositions of an (epsilon, delta)-DP guarantee (R_{eps,delta}).

    Chourasia, Javaid and Sikdar, "Laplace transform interpretation of differential privacy",
    Cor. 4.7, in closed form: losses (count - 2j) epsilon with masses
    (1-delta)^count C(count, j) p^(count-j) (1-p)^j, p = e^eps / (1 + e^eps), and an atom
    1 - (1-delta)^count at +inf; built directly on the lattice of step epsilon (O(count), no FFT, no
    discretization error). Tight: no composition of (epsilon, delta)-DP mechanisms is worse.
    ``grid``: put it on ``grid.step`` instead (exact when the step divides epsilon, otherwise
    each loss is rounded up: pessimistic); ``epsilon = 0`` (R_{0,delta}) needs no grid.
    ``epsilon`` and ``delta`` are scalars (build a batch by stacking). Memory guard: the lattice has
    2 count + 1 points (2 count epsilon / step + 1 on ``grid``), at most grid.MAX_SIZE, so
    ``count`` <= (grid.MAX_SIZE - 1) // 2; larger is a ValueError.

    Args:
      epsilon: >= 0 and finite, a scalar (nats).
      delta: in [0, 1], a scalar.
      count: number of compositions, a whole number in [1, (grid.MAX_SIZE - 1) // 2]; 1 by
        default.
      grid: None (default): the lattice of step epsilon (step 1 when epsilon = 0). A
        :class:`Grid`: the losses on ``grid.step`` (on step 1 when ``grid.step`` is None), each
        rounded up to a grid point; at most grid.MAX_SIZE points, else a ValueError naming the
        smallest step that fits. A traced epsilon or delta (under ``jit`` or ``vmap``) needs
        None (else a ValueError).

    Returns:
      An unbatched :class:`PLD` with one direction, flagged pessimistic (exact on the lattice of
      step epsilon, an upper bound with its losses rounded up on ``grid``). Traced epsilon or
      delta out of range give the PLD that claims nothing (all of the mass at +inf).
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
    if grid is not None and is_traced((epsilon, delta)):
        raise ValueError("approx_dp_composition(grid=...) places its losses on the grid from a "
                         "concrete epsilon and delta; under jit or vmap leave grid None (the "
                         "lattice of step epsilon)")
    step = 1.0 if grid is None or grid.step is None else float(grid.step)
    if grid is not None and 2 * count * float(epsilon) / step + 1 > grid_lib.MAX_SIZE:
        raise ValueError(f"grid.step = {step} is too fine for count = {count} and epsilon = "
                         f"{float(epsilon)}: the lattice would need more than grid.MAX_SIZE = "
                         f"{grid_lib.MAX_SIZE} points (a memory guard); use a step of at least "
                         f"{2 * count * float(epsilon) / (grid_lib.MAX_SIZE - 1):.3g}")
    if is_traced((epsilon, delta)):
        # the lattice of step epsilon, or at epsilon = 0 every mass at loss 0 (on step 1); an
        # invalid epsilon or delta claims nothing (see pldjax.core.validation)
        probs, inf_mass = _lattice_masses_jit(epsilon, delta, count=count)
        positive = epsilon > 0
        at_zero = jnp.zeros(2 * count + 1).at[count].set(jnp.sum(probs))
        pld = unchecked_pld(jnp.where(positive, probs, at_zero), inf_mass,
                            jnp.asarray(-count, jnp.int64),
                            jnp.where(positive, jnp.asarray(epsilon, jnp.float64), 1.0), True)
        return pld.where_valid(within(epsilon, 0.0) & within(delta, 0.0, 1.0))
    with np.errstate(divide="ignore"):  # log(1 - delta) = -inf at delta = 1, as in XLA
        probs, inf_mass = _lattice_masses(np.float64(epsilon), np.float64(delta), count=count)
    if grid is None and epsilon > 0:
        return unchecked_pld(to_device(probs), to_device(inf_mass), to_device(np.int64(-count)),
                             to_device(np.float64(epsilon)), True)
    losses = (2 * np.arange(count + 1) - count) * float(epsilon)
    # each loss up to the first grid point at or above it (a quotient rounded up past a grid
    # point that holds the loss is moved back onto it)
    index = np.ceil(losses / step).astype(np.int64)
    index -= (index - 1) * step >= losses
    on_grid = np.zeros(int(index[-1] - index[0]) + 1)
    np.add.at(on_grid, index - index[0], np.asarray(probs)[::2])
    return unchecked_pld(to_device(on_grid), to_device(inf_mass), to_device(index[0]),
                         to_device(np.float64(step)), True)


@float64
def identity(*, pessimistic: bool = True) -> PLD:
    """The PLD of a mechanism that reveals nothing: all mass at loss 0 (neutral for composition).

    Args:
      pessimistic: the result's flag, True by default; the PLD is exact either way, and the flag
        only decides which PLDs it composes with (all must be pessimistic, or all optimistic).

    Returns:
      An unbatched :class:`PLD` with one direction, mass 1 at loss 0 (one point, step 1 nat) and
      none at +inf. Both an upper and a lower bound; flagged as ``pessimistic`` says.
    """
    parts = np.ones(1), np.float64(0.0), np.int64(0), np.float64(1.0)
    return unchecked_pld(*(to_device(a) for a in parts), pessimistic)


__all__ = ["approx_dp_composition", "discrete_gaussian", "discrete_laplace", "from_privacy_curve",
           "gaussian", "gdp", "identity", "laplace", "randomized_response"]
