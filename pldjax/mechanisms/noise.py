"""Noise distributions: one unit per distribution, each a small typed record of its parameters.

A unit (a class below, with its tails right above it) holds everything the rest of pldjax needs
to know about one distribution:

* its parameters, as a frozen dataclass whose ``ranges`` say what each may be: concrete values
  are checked when it is built (a ValueError naming the argument and its allowed range), traced
  ones by :meth:`Parameters.valid`, and a PLD built from invalid traced ones claims nothing
  (see :mod:`pldjax.core.validation`);
* its privacy loss: a :class:`~pldjax.kernels.discretize.LossTails` of pure functions of the parameters
  (the log-tails of the loss under P and Q, which give the hockey-stick curve exactly);
* its sensitivity handling, :meth:`Noise.pair`: the mechanism and its parameters for one
  neighbouring relation (replace-one moves a record's contribution from -sensitivity to
  +sensitivity, twice the shift of add/remove; zero-out, a record against one contributing
  nothing, is add/remove's shift);
* optionally :attr:`Noise.location` (the noise as a location family, which
  :class:`pldjax.mechanisms.sampling.Mixture` needs) and :meth:`Noise.lattice` (a grid on which an
  integer-valued noise is discretized exactly).

Records are pytrees whose leaves are the parameters (the class is static structure): they pass
through ``jit`` and ``vmap``, and arrays of parameters give a batch of PLDs. Values are stored as
given and converted to float64 where they are used (inside pldjax's float64 entry points), so a
record built with ``jax_enable_x64`` off loses nothing.

To add a distribution: write its tails as a LossTails, then a record class with ``ranges`` and
``pair`` (and
``location`` if it is a log-concave location family), decorated with :func:`record`; export it in
``__all__``. :func:`pldjax.mechanisms.events.privacy_loss` and every sampling scheme then take it.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import array_module
from pldjax.core.grid import Grid
from pldjax.core.namespace import public_dir
from pldjax.core.precision import quotient_rounded
from pldjax.core.special import log1p, log_ndtr, log_ndtr_pair, special_functions
from pldjax.core.validation import check_broadcast, check_range, is_traced, within
from pldjax.kernels.discretize import LossTails
from pldjax.mechanisms.neighboring import Neighboring

#: Below this (in nats, or as a sampling probability) a mechanism's parameter no longer shows in
#: float64 log-tails (log 1/2 + 1e-17 rounds to log 1/2), so its curve would come out 0.
MIN_PARAMETER = 2.0**-30


def resolvable(x, pessimistic: bool):
    """``x`` (an array, >= 0), with values in (0, MIN_PARAMETER) replaced by MIN_PARAMETER for a
    pessimistic PLD and by 0 for an optimistic one. Sound for a mechanism whose privacy loss grows
    with ``x`` (Gaussian and Laplace 1/scale, randomized-response epsilon, sampling probability:
    the smaller one is a post-processing of the larger): the result dominates the truth or is
    dominated by it. 0 gives the identity, and MIN_PARAMETER a curve of order 1e-9. Concrete
    input stays on the host (NumPy): no small compiled program per operation in a new process."""
    xp = jnp if is_traced(x) else np
    x = xp.asarray(x, xp.float64)
    tiny = (x > 0) & (x < MIN_PARAMETER)
    return xp.where(tiny, MIN_PARAMETER if pessimistic else 0.0, x)


def _ratio(sensitivity, scale, pessimistic: bool):
    """``sensitivity / scale`` in float64 (the loss scale of an additive noise), on the host for
    concrete input like :func:`resolvable`, rounded up for a ``pessimistic`` PLD and down for an
    optimistic one (:func:`~pldjax.core.precision.quotient_rounded`): the nearest float may lie
    on either side of the true ratio of the given floats, and the curves grow with it (see
    :func:`resolvable`). Exact quotients stay: ``Gaussian(2.0)`` is ``GDP(0.5)``."""
    xp = jnp if is_traced((sensitivity, scale)) else np
    return quotient_rounded(xp.asarray(sensitivity, xp.float64), xp.asarray(scale, xp.float64),
                            up=pessimistic)


def _placeholder(value) -> bool:
    """True for the bare ``object()`` leaves JAX puts into a pytree to learn its structure (in
    ``vmap``'s axis handling): the record is rebuilt around them, and there is nothing to check."""
    return type(value) is object


def check_parameter(name: str, value, low: float = -np.inf, *, integer: bool = False,
                    **kwargs) -> None:
    """:func:`~pldjax.core.validation.check_range` for a record's field (placeholders pass); with
    ``integer``, also a whole number."""
    if _placeholder(value):
        return
    check_range(name, value, low, **kwargs)
    if integer and not is_traced(value) and np.any(np.asarray(value, np.float64) % 1 != 0):
        raise ValueError(f"{name} must be a whole number >= {low:g} (integer-valued queries), "
                         f"got {value!r}")


class Parameters:
    """Base of the parameter records (noises and sampling schemes). ``ranges`` maps each field to
    its allowed range (the keyword arguments of :func:`check_parameter`): concrete values are
    checked when the record is built, traced ones give :meth:`valid`."""

    ranges: ClassVar[dict[str, dict]] = {}

    def __post_init__(self):
        for name, allowed in self.ranges.items():
            check_parameter(name, getattr(self, name), **allowed)
        if not is_traced([getattr(self, name) for name in self.ranges]):
            check_broadcast(**{name: getattr(self, name) for name in self.ranges})

    def valid(self):
        """Whether each element of the batch has its parameters in their ranges: True when none
        is traced (concrete values were checked when the record was built), else a boolean array
        (:func:`~pldjax.core.validation.within`) broadcasting with the parameters."""
        values = [getattr(self, name) for name in self.ranges]
        if not is_traced(values):
            return True
        ok = jnp.ones((), bool)
        for value, allowed in zip(values, self.ranges.values(), strict=True):
            ok = ok & within(value, **allowed)
        return ok


#: Shifts (in the noise's scales, or 1/scale) above this are lowered to it: a shift of 1e150
#: already puts every loss away from the bulk beyond 1e149 nats (1e299 for the Gaussian), far
#: beyond any window and subsampling's BASE_REACH_MAX, so the PLD no longer changes in float64,
#: while a sensitivity / scale that overflowed to inf gave inf - inf = NaN in the windows.
MAX_SHIFT = 1e150


def _shift(shift, neighboring: Neighboring):
    """The shift between the output distributions: one sensitivity (add/remove, and zero-out:
    the record's contribution against none) or two (replace-one: a contribution of norm at most
    the sensitivity moves from -C to +C), at most MAX_SHIFT."""
    xp = jnp if is_traced(shift) else np
    if neighboring == Neighboring.REPLACE_ONE:  # doubled after the cap: no overflow to warn of
        return 2 * xp.minimum(shift, MAX_SHIFT / 2)
    return xp.minimum(shift, MAX_SHIFT)


def record(cls):
    """A frozen dataclass whose fields are the leaves of a pytree (the parts' records: noises and
    sampling schemes). A list or tuple given for a field is one array (a batch of values, as a
    NumPy array would be), never a pytree node of leaves, which the accounting would take for
    further parameters; except in a record whose ``batch_sequences`` is False
    (:class:`~pldjax.mechanisms.sampling.Mixture`, whose components a sequence lists)."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    names = [field.name for field in dataclasses.fields(cls)]
    own = getattr(cls, "__post_init__", None)

    def __post_init__(self):
        for name in names if getattr(type(self), "batch_sequences", True) else ():
            value = getattr(self, name)
            if isinstance(value, list | tuple):
                object.__setattr__(self, name, (jnp if is_traced(value) else np).asarray(value))
        if own is not None:
            own(self)

    cls.__post_init__ = __post_init__
    return jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])


@dataclasses.dataclass(frozen=True)
class Location:
    """A noise with a log-concave density f, in its own units (so that a shift is a number of
    scales), as :class:`pldjax.mechanisms.sampling.Mixture` needs it. Functions of float64 arrays:

    * ``log_ratio(x, a)``: log f(x - a) / f(x), non-decreasing in x for a >= 0 (log-concavity);
      exactly 0 for a = 0;
    * ``log_sf(x)``, ``log_cdf(x)``: log P(X > x) and log P(X <= x) for X ~ f;
    * ``cross(a, b)``: E_f[f(X - a) f(X - b) / f(X)^2] - 1 (a chi^2-like moment; it only sets
      the grid step, never a value);
    * ``reach(p)``: an x with P(X > x) <= p and P(X < -x) <= p for p in (0, 1] (+inf for p = 0;
      it only sizes a window, never a value).
    """

    log_ratio: Callable
    log_sf: Callable
    log_cdf: Callable
    cross: Callable
    reach: Callable


class Noise(Parameters, abc.ABC):
    """Base of the noise records (see the module docstring)."""

    #: The noise as a location family; when not None, :meth:`pair` returns one parameter, the
    #: shift in the noise's own units. None: the noise is not a location family.
    location: ClassVar[Location | None] = None

    @abc.abstractmethod
    def pair(self, neighboring: Neighboring, pessimistic: bool) -> tuple[LossTails, tuple]:
        """(mechanism, params): the mechanism without sampling under ``neighboring``, one
        direction (symmetric), its parameters float64 arrays that broadcast together. Parameters
        below float64's resolution are rounded on the safe side (:func:`resolvable`)."""

    def lattice(self, params: tuple, pessimistic: bool) -> Grid | None:
        """A grid on which the PLD without sampling is exact (losses on a lattice) or holds its
        largest loss on a grid point (bounded losses), or None for the automatic one.
        ``params``: as returned by :meth:`pair`."""
        return None

    def top_loss(self, params: tuple):
        """For a pair whose loss lies in [-top, top] with an atom at top (bounded noise): top
        (nats, as the parameters' array); None where the loss is unbounded. ``params``: as
        returned by :meth:`pair`."""
        return None


def _positive_or_one(x):
    return array_module(x).where(x > 0, x, 1.0)


# -- Gaussian ---------------------------------------------------------------------------------------
def _gaussian_tails(params, eps):
    (mu,) = params
    xp = array_module(mu, eps)
    pos = mu > 0
    safe = xp.where(pos, mu, 1.0)
    sf = xp.where(eps < 0, 0.0, -xp.inf)  # mu = 0: the loss is 0 with certainty
    cdf = xp.where(eps < 0, -xp.inf, 0.0)
    # L = mu X - mu^2 / 2 with X ~ N(mu, 1) under P and N(0, 1) under Q; each tail and its
    # complement from one erfc (log_ndtr_pair)
    sf_p, cdf_p = log_ndtr_pair(safe / 2 - eps / safe)
    sf_q, cdf_q = log_ndtr_pair(-safe / 2 - eps / safe)
    return (
        xp.where(pos, sf_p, sf),
        xp.where(pos, sf_q, sf),
        xp.where(pos, cdf_p, cdf),
        xp.where(pos, cdf_q, cdf),
    )


def _gaussian_side_tails(params, eps, upper, pessimistic=None):
    """(log P, log Q) of L > eps where ``upper``, of L <= eps elsewhere (see
    :func:`_gaussian_tails`): one ``log_ndtr`` each. They need no lean (``pessimistic`` is
    ignored): the rounding eps / mu shares moves both arguments alike, which changes the curve
    only by its square, and what the subtractions add is relative to the arguments, which the
    curve's log margin covers."""
    (mu,) = params
    xp = array_module(mu, eps)
    pos = mu > 0
    safe = xp.where(pos, mu, 1.0)
    sign = xp.where(upper, 1.0, -1.0)
    # mu = 0: the loss is 0 with certainty
    certain = xp.where(upper == (eps < 0), 0.0, -xp.inf)
    log_p = log_ndtr(sign * (safe / 2 - eps / safe))
    log_q = log_ndtr(sign * (-safe / 2 - eps / safe))
    return xp.where(pos, log_p, certain), xp.where(pos, log_q, certain)


#: The Gaussian's default window reaches this many standard deviations of the loss on either
#: side of its mean under P (P's mass outside: 2 Phi(-10) = 1.5e-23).
GAUSSIAN_REACH = 10.0


def gaussian_reach(tail):
    """k with P(|N(0, 1)| > k) = ``tail``, at most GAUSSIAN_REACH (which a tail of 0 gives)."""
    xp = array_module(tail)
    special = special_functions(xp)
    floor = 2 * special.ndtr(-GAUSSIAN_REACH)
    return xp.where(tail > floor, -special.ndtri(xp.maximum(tail, floor) / 2), GAUSSIAN_REACH)


def _gaussian_bulk(params, tail):
    """The loss's mean under P, mu^2 / 2, +- gaussian_reach(tail) of its standard deviations mu."""
    (mu,) = params
    half = gaussian_reach(tail) * _positive_or_one(mu)
    return mu**2 / 2 - half, mu**2 / 2 + half


GAUSSIAN = LossTails(
    tails=_gaussian_tails,
    side_tails=_gaussian_side_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=lambda p: p[0] ** 2 / 2,
    half_width=lambda p: GAUSSIAN_REACH * _positive_or_one(p[0]),
    chi2=lambda p: array_module(p[0]).expm1(p[0] ** 2),
    bulk=_gaussian_bulk,
    host=True,
)

#: N(0, 1): log f(x - a) / f(x) = a (x - a/2), and E[f(X-a) f(X-b) / f(X)^2] = e^{ab}.
GAUSSIAN_LOCATION = Location(
    log_ratio=lambda x, a: a * (x - a / 2),
    log_sf=lambda x: log_ndtr(-x),
    log_cdf=log_ndtr,
    cross=lambda a, b: array_module(a, b).expm1(a * b),
    reach=lambda p: -special_functions(array_module(p)).ndtri(p),
)


@record
class Gaussian(Noise):
    """The Gaussian mechanism N(f(x), sigma^2): ``sigma`` > 0 the noise's standard deviation,
    ``sensitivity`` > 0 the L2 sensitivity (the largest norm of one record's contribution, e.g.
    DP-SGD's clipping norm). Scalars or arrays (a batch; they broadcast)."""

    sigma: Any
    sensitivity: Any = 1.0

    location: ClassVar[Location] = GAUSSIAN_LOCATION

    ranges: ClassVar[dict] = {"sigma": dict(low=0.0, low_open=True),
                              "sensitivity": dict(low=0.0, low_open=True)}

    def pair(self, neighboring: Neighboring, pessimistic: bool) -> tuple[LossTails, tuple]:
        mu = _ratio(self.sensitivity, self.sigma, pessimistic)
        return GAUSSIAN, (_shift(resolvable(mu, pessimistic), neighboring),)


@record
class GDP(Noise):
    """mu-GDP: the pair N(0, 1), N(mu, 1) (a Gaussian with sensitivity / sigma = mu); ``mu`` >= 0
    (0 is the identity). Under replace-one the shift doubles, as for :class:`Gaussian`."""

    mu: Any

    location: ClassVar[Location] = GAUSSIAN_LOCATION

    ranges: ClassVar[dict] = {"mu": dict(low=0.0)}

    def pair(self, neighboring: Neighboring, pessimistic: bool) -> tuple[LossTails, tuple]:
        return GAUSSIAN, (_shift(resolvable(self.mu, pessimistic), neighboring),)


# -- Laplace ----------------------------------------------------------------------------------------
def _laplace_tails(params, eps):
    # P = Lap(0, b), Q = Lap(1, b), eps0 = 1/b: L = eps0 for x <= 0, eps0 (1 - 2x) on (0, 1),
    # -eps0 for x >= 1; so L > eps iff x < (1 - eps/eps0) / 2 for eps in [-eps0, eps0).
    (eps0,) = params
    xp = array_module(eps0, eps)
    inside = (eps >= -eps0) & (eps < eps0)
    below = eps < -eps0
    half = -xp.log(2.0)
    sf = xp.where(below, 0.0, -xp.inf)
    cdf = xp.where(below, -xp.inf, 0.0)
    return (
        xp.where(inside, log1p(-0.5 * xp.exp(-(eps0 - eps) / 2), xp), sf),
        xp.where(inside, half - (eps0 + eps) / 2, sf),
        xp.where(inside, half - (eps0 - eps) / 2, cdf),
        xp.where(inside, log1p(-0.5 * xp.exp(-(eps0 + eps) / 2), xp), cdf),
    )


def _laplace_chi2(params):
    # E_Q[(P/Q)^2] = (2/3) e^eps0 + (1/3) e^(-2 eps0), integrating over the three pieces of L
    (eps0,) = params
    xp = array_module(eps0)
    return (2 * xp.expm1(eps0) + xp.expm1(-2 * eps0)) / 3


def _zeros_like_first(params):
    return array_module(params[0]).zeros_like(params[0])


LAPLACE = LossTails(
    tails=_laplace_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=_zeros_like_first,
    half_width=lambda p: 1.01 * _positive_or_one(p[0]),
    chi2=_laplace_chi2,
    host=True,
)


@record
class Laplace(Noise):
    """The Laplace mechanism: noise of scale ``scale`` > 0 (density e^{-abs(x)/scale} / (2 scale))
    and L1 sensitivity ``sensitivity`` > 0. Without sampling its loss lies in [-s/b, s/b]
    (s = sensitivity, b = scale) and delta(eps) = 1 - exp((eps - s/b)/2)."""

    scale: Any
    sensitivity: Any = 1.0

    ranges: ClassVar[dict] = {"scale": dict(low=0.0, low_open=True),
                              "sensitivity": dict(low=0.0, low_open=True)}

    def pair(self, neighboring: Neighboring, pessimistic: bool) -> tuple[LossTails, tuple]:
        eps0 = _ratio(self.sensitivity, self.scale, pessimistic)
        return LAPLACE, (_shift(resolvable(eps0, pessimistic), neighboring),)

    def lattice(self, params: tuple, pessimistic: bool) -> Grid | None:
        # the atoms at +-eps0 (each of mass 1/2) on grid points: epsilon at delta = 0 is eps0
        # to round-off, where a grid step between them read up to a step more
        return top_loss_lattice(self.top_loss(params), LAPLACE, params, pessimistic)

    def top_loss(self, params: tuple):
        return params[0]


# -- randomized response -------------------------------------------------------------------------------
def _rr_tails(params, eps):
    e, d = params
    xp = array_module(e, eps)
    expit = special_functions(xp).expit  # the logistic sigmoid
    low = (1 - d) * expit(-e)  # mass at loss -e under P (and at +e under Q)
    high = (1 - d) * expit(e)  # mass at loss +e under P (and at -e under Q)
    above_low, above_high = eps < -e, eps < e
    return (
        xp.log(d + high * above_high + low * above_low),
        xp.log(low * above_high + high * above_low),
        xp.log(low * ~above_low + high * ~above_high),
        xp.log(d + high * ~above_low + low * ~above_high),
    )


RANDOMIZED_RESPONSE = LossTails(
    tails=_rr_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=_zeros_like_first,
    half_width=lambda p: 1.01 * _positive_or_one(p[0]),
    inf_mass=lambda p: p[1],  # delta: the output only P can produce
    max_loss=lambda p: p[0],
    host=True,
)


@record
class RandomizedResponse(Noise):
    """R_{epsilon,delta}: the PLD of an (epsilon, delta)-DP guarantee (Kairouz, Oh and
    Viswanath, "The composition theorem for differential privacy", 2015): losses +-epsilon and
    an atom delta at +inf. ``epsilon`` >= 0 (nats), ``delta`` in [0, 1].

    It is a privacy curve, not noise added to a query: it has no sensitivity, so it is built for
    ``neighboring="add_remove"`` (the relation its guarantee was stated for) and without
    sampling."""

    epsilon: Any
    delta: Any = 0.0

    ranges: ClassVar[dict] = {"epsilon": dict(low=0.0), "delta": dict(low=0.0, high=1.0)}

    def pair(self, neighboring: Neighboring, pessimistic: bool) -> tuple[LossTails, tuple]:
        if neighboring != Neighboring.ADD_REMOVE:
            raise ValueError("RandomizedResponse is the curve of a guarantee and has no sensitivity "
                             "to double: pass neighboring='add_remove' (the default)")
        return RANDOMIZED_RESPONSE, (resolvable(self.epsilon, pessimistic), self.delta)

    def lattice(self, params: tuple, pessimistic: bool) -> Grid | None:
        # both losses, +-epsilon, on grid points: the PLD is exact
        return top_loss_lattice(self.top_loss(params), RANDOMIZED_RESPONSE, params, pessimistic)

    def top_loss(self, params: tuple):
        return params[0]


# -- integer-valued noise: discrete Laplace and discrete Gaussian ----------------------------------
def _lattice(unit, points_per_unit: float, mechanism: LossTails, params: tuple,
             pessimistic: bool) -> Grid | None:
    """For a scalar integer-noise mechanism whose losses are multiples of ``unit``: a grid step of
    unit / 2^j (about 1/``points_per_unit`` of it or finer), so every loss sits on the grid and the
    discretization is exact. None (the automatic grid) for a batch, a traced unit, an optimistic
    PLD whose lattice window would span more than the optimistic construction allows, or a step
    above grid.MAX_STEP or below the automatic grid's finest (a curve's values at points 1e-16
    apart keep no digit of their differences: the discrete Laplace of scale 1e14 read delta 1)."""
    if np.size(unit) != 1 or is_traced(unit):
        return None
    j = max(0, int(np.ceil(np.log2(points_per_unit))))
    step = float(np.asarray(unit).reshape(())) / 2**j
    if not grid_lib.fine_step(np.float64(grid_lib.MIN_SPREAD)) <= step <= grid_lib.MAX_STEP:
        return None  # losses too far apart for any grid (or inf), or too close: automatic
    if not pessimistic:
        half = float(np.max(mechanism.half_width(tuple(np.asarray(p, np.float64) for p in params))))
        if step > grid_lib.optimistic_step_limit(grid_lib.size_for_half_width(half / step)):
            return None
    return Grid(step=step)


def top_loss_lattice(top, mechanism: LossTails, params: tuple, pessimistic: bool,
                     step_at_most: float = math.inf, step_at_least: float = 0.0) -> Grid | None:
    """For a mechanism whose largest loss ``top`` is an atom: a grid step of top / 2^j, so that
    it sits on a grid point (see :func:`_lattice`), with at least 64 points up to it, no larger
    than ``step_at_most`` (nats) unless that would take it below ``step_at_least`` (where the
    largest window no longer holds the losses), and no larger than grid.MAX_STEP (a top beyond
    64 of them gets more points, up to a window of grid.MAX_MECHANISM_SIZE: randomized response
    of epsilon 1e5 read epsilon(0) = 100,096 and delta(1e5) = 1 on the automatic grid); None
    (the automatic grid) for a batch, where ``top`` is 0, or where such a window would be
    larger."""
    if np.size(top) != 1 or is_traced(top) or not float(np.asarray(top).reshape(())) > 0:
        return None
    top = float(np.asarray(top).reshape(()))
    halvings = math.ceil(math.log2(top / step_at_most)) if step_at_most < math.inf else 0
    if step_at_least > 0:
        halvings = min(halvings, math.floor(math.log2(top / step_at_least)))
    halvings = max(6, halvings)
    coarsest = math.ceil(math.log2(top / grid_lib.MAX_STEP))
    if coarsest > halvings:  # a window of [-top, top] at that step, and still above the least
        if (2.0 ** (coarsest + 1) + 1 > grid_lib.MAX_MECHANISM_SIZE
                or top / 2.0**coarsest < step_at_least):
            return None
        halvings = coarsest
    return _lattice(top, 2.0**halvings, mechanism, params, pessimistic)


def _dlap_log_cdf(t, k):
    """log P(K <= k) for P(K = j) proportional to e^{-t |j|}; k integer-valued (or +-inf)."""
    xp = array_module(t, k)
    log_norm = xp.log1p(xp.exp(-t))
    safe = xp.where(xp.isfinite(k), k, 0.0)
    value = xp.where(safe <= 0, t * safe - log_norm, log1p(-xp.exp(-t * (safe + 1) - log_norm), xp))
    return xp.where(k == xp.inf, 0.0, xp.where(k == -xp.inf, -xp.inf, value))


def _dlap_log_sf(t, k):
    """log P(K > k) (the mirror image of the CDF: P(K > k) = P(K <= -k - 1))."""
    return _dlap_log_cdf(t, -k - 1)


def _loss_threshold(below_top, above_bottom, position):
    """The largest integer k with loss(k) > eps: +inf when every k qualifies, -inf when none."""
    xp = array_module(below_top, above_bottom, position)
    return xp.where(above_bottom, xp.inf, xp.where(below_top, xp.ceil(position) - 1, -xp.inf))


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
    xp = array_module(t)
    outer = (xp.expm1(t * shift) + xp.expm1(-2 * t * shift) - xp.expm1(-t)) / (1 + xp.exp(-t))
    log_inner = t * shift - 3 * t + xp.log(-xp.expm1(-3 * t * (shift - 1))) - xp.log(-xp.expm1(-3 * t))
    return outer + xp.tanh(t / 2) * xp.exp(log_inner)


DISCRETE_LAPLACE = LossTails(
    tails=_dlap_tails,
    spread=lambda p: _positive_or_one(p[0] * p[1]),
    center=_zeros_like_first,
    half_width=lambda p: 1.01 * _positive_or_one(p[0] * p[1]),
    chi2=_dlap_chi2,
    host=True,
)


@record
class DiscreteLaplace(Noise):
    """The discrete Laplace mechanism: integer noise K with P(K = k) proportional to
    e^{-abs(k)/scale}; ``scale`` > 0 in units of the query's integer output, ``sensitivity`` a whole
    number >= 1 (the L1 sensitivity of an integer-valued query). Its loss takes the values
    t(D - 2k) clipped to [-tD, tD] (t = 1/scale, D = sensitivity): on a grid whose step divides t
    the PLD is exact."""

    scale: Any
    sensitivity: Any = 1

    ranges: ClassVar[dict] = {"scale": dict(low=0.0, low_open=True),
                              "sensitivity": dict(low=1.0, integer=True)}

    def pair(self, neighboring: Neighboring, pessimistic: bool) -> tuple[LossTails, tuple]:
        scale, sensitivity = self.scale, self.sensitivity
        # 1 / scale in float64 also for a traced (possibly float32) scale; no broadcast here:
        # discretize_arrays broadcasts (a sensitivity array may be wider than scale)
        t = _ratio(1.0, scale, pessimistic)  # a subnormal scale: inf, lowered to MAX_SHIFT
        shift = sensitivity if is_traced(sensitivity) else np.asarray(sensitivity, np.float64)
        xp = array_module(t, shift)  # NumPy on the host: no program per operation
        t, shift = xp.minimum(xp.asarray(t, xp.float64), MAX_SHIFT), xp.asarray(shift, xp.float64)
        return DISCRETE_LAPLACE, (t, _shift(shift, neighboring))

    def lattice(self, params: tuple, pessimistic: bool) -> Grid | None:
        if is_traced(self.sensitivity):
            return None
        # losses t (D - 2k): multiples of t; about 64 grid points across the loss range [-tD, tD]
        return _lattice(params[0], 64 / float(np.max(self.sensitivity)), DISCRETE_LAPLACE, params,
                        pessimistic)

    def top_loss(self, params: tuple):
        return params[0] * params[1]  # t D (twice that under replace-one)


def _dgauss_log_pmf(support: int, sigma, offset=0.0):
    """(integers k, log P(K = k + offset)) for the discrete Gaussian on ``support`` integers: k
    of shape (support,), the log-masses of shape sigma's and offset's (broadcast) + (support,);
    NumPy's for NumPy parameters."""
    xp = array_module(sigma, offset)
    half = support // 2
    ks = xp.arange(-half, support - half, dtype=xp.float64)
    scale = 2 * xp.asarray(sigma)[..., None] ** 2
    log_norm = special_functions(xp).logsumexp(-(ks**2) / scale, axis=-1, keepdims=True)
    return ks, -((ks - xp.asarray(offset)[..., None]) ** 2) / scale - log_norm


def _cumulative_logsumexp(x, xp, reverse: bool = False):
    """log of the running sums of e^x (from the end where ``reverse``)."""
    if xp is np:
        return np.logaddexp.accumulate(x[::-1])[::-1] if reverse else np.logaddexp.accumulate(x)
    return jax.lax.cumlogsumexp(x, reverse=reverse)


def _dgauss_tails(support: int, params, eps):
    # P(K = k) proportional to e^{-k^2 / (2 s^2)} on k in [-support/2, support/2), Q shifted by D;
    # loss (D^2 - 2 k D) / (2 s^2) decreases in k: loss > eps  <=>  k <= ceil((D^2 - 2 s^2 eps)/(2D)) - 1
    sigma, shift = params
    xp = array_module(sigma, shift, eps)
    half = support // 2
    _, log_p = _dgauss_log_pmf(support, sigma)
    cdf = _cumulative_logsumexp(log_p, xp)
    sf = xp.concatenate([_cumulative_logsumexp(log_p, xp, reverse=True)[1:], xp.full((1,), -xp.inf)])
    k = xp.ceil((shift**2 - 2 * sigma**2 * eps) / (2 * shift)) - 1

    def lookup(table, index, below, above):
        inside = xp.clip(index + half, 0, support - 1).astype(xp.int32)
        return xp.where(index < -half, below, xp.where(index > support - half - 1, above, table[inside]))

    return (
        lookup(cdf, k, -xp.inf, 0.0), lookup(cdf, k - shift, -xp.inf, 0.0),
        lookup(sf, k, 0.0, -xp.inf), lookup(sf, k - shift, 0.0, -xp.inf),
    )


def _dgauss_chi2(support: int, params):
    sigma, shift = params
    xp = array_module(sigma, shift)
    _, log_p = _dgauss_log_pmf(support, sigma)
    _, log_q = _dgauss_log_pmf(support, sigma, shift)
    return xp.exp(special_functions(xp).logsumexp(2 * log_p - log_q, axis=-1)) - 1


@functools.cache
def _discrete_gaussian(support: int) -> LossTails:
    """The discrete Gaussian on ``support`` integers around 0 (a static size, hence a factory)."""
    return LossTails(
        tails=functools.partial(_dgauss_tails, support),
        spread=lambda p: _positive_or_one(p[1] / p[0]),
        center=lambda p: p[1] ** 2 / (2 * p[0] ** 2),
        half_width=lambda p: (p[1] ** 2 + 2 * p[1] * (40 * p[0] + p[1])) / (2 * p[0] ** 2),
        chi2=functools.partial(_dgauss_chi2, support),
        host=True,
    )


#: Integers either side of the discrete Gaussian's centre, in standard deviations: the mass beyond
#: 38.6 sigma is below 1e-324, zero in float64, so truncating there loses nothing representable.
DGAUSS_SIGMAS = 40
_DGAUSS_MAX_SUPPORT = 2**22
#: Below this sigma the loss scale 1 / (2 sigma^2) overflows float64 (a smaller sigma is refused,
#: not rounded up: a larger sigma would understate the loss).
_DGAUSS_MIN_SIGMA = 1e-150


@record
class DiscreteGaussian(Noise):
    """The discrete Gaussian mechanism: integer noise with P(K = k) proportional to
    e^{-k^2 / (2 sigma^2)} (Canonne, Kamath and Steinke, "The discrete Gaussian for differential
    privacy", 2020); ``sigma`` >= 1e-150 (below it the loss overflows float64) in units of the
    query's integer output, ``sensitivity`` a whole number >= 1 (L1 = L2 sensitivity of an
    integer-valued query). The distribution is summed over the integers within 40 sigma of the
    centre, beyond which its mass is below float64's smallest number; ``sigma`` and
    ``sensitivity`` must be concrete (the support's length is a static shape)."""

    sigma: Any
    sensitivity: Any = 1

    ranges: ClassVar[dict] = {"sigma": dict(low=_DGAUSS_MIN_SIGMA),
                              "sensitivity": dict(low=1.0, integer=True)}

    def _support(self) -> int:
        if is_traced((self.sigma, self.sensitivity)):
            raise ValueError("discrete_gaussian needs concrete sigma and sensitivity (its support "
                             "is a static size)")
        sigma, sensitivity = float(np.max(self.sigma)), float(np.max(self.sensitivity))
        needed = 2 * (DGAUSS_SIGMAS * sigma + 2 * sensitivity + 2)  # inf beyond float64's range
        if needed <= _DGAUSS_MAX_SUPPORT:
            support = grid_lib.next_pow2(int(np.ceil(needed)))
            if support <= _DGAUSS_MAX_SUPPORT:
                return support
        raise ValueError(f"discrete_gaussian(sigma={sigma:.6g}, sensitivity={sensitivity:.6g}) needs "
                         f"a support of about {needed:.3g} integers (more than "
                         f"{_DGAUSS_MAX_SUPPORT}); use a Gaussian for such wide noise")

    def pair(self, neighboring: Neighboring, pessimistic: bool) -> tuple[LossTails, tuple]:
        support = self._support()  # concrete parameters (else a clear error), kept in NumPy
        sigma, shift = (np.asarray(a, np.float64) for a in (self.sigma, self.sensitivity))
        return _discrete_gaussian(support), (sigma, _shift(shift, neighboring))

    def lattice(self, params: tuple, pessimistic: bool) -> Grid | None:
        sigma = float(np.max(self.sigma))
        # losses (D - 2k) D / (2 sigma^2): multiples of D / (2 sigma^2); about 64 points per sd D/sigma
        unit = np.asarray(self.sensitivity, np.float64) / (2 * np.asarray(self.sigma, np.float64) ** 2)
        if np.size(unit) != 1 or not 80 * sigma < grid_lib.MAX_MECHANISM_SIZE:
            return None
        return _lattice(unit, 32 / sigma, _discrete_gaussian(self._support()), params, pessimistic)


__all__ = [
    "DiscreteGaussian",
    "DiscreteLaplace",
    "GDP",
    "Gaussian",
    "Laplace",
    "Location",
    "Noise",
    "RandomizedResponse",
]
__dir__ = public_dir(__all__)
