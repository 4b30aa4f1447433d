"""Privacy amplification by subsampling: the kernels, as mechanisms whose loss tails are exact.

The sampling schemes a user names (:mod:`pldjax.mechanisms.sampling`) map a noise onto these.

Poisson subsampling with add/remove adjacency (Chourasia, Javaid and Sikdar, "Laplace transform
interpretation of differential privacy", Thm 5.1). Let A, B be the base mechanism's output
distributions on neighbouring inputs with loss l = log(A/B), and q the sampling probability. The
two directions of the subsampled mechanism are

* remove: P = (1 - q) B + q A against Q = B; the loss L = log(1 - q + q e^l) increases with l;
* add:    P = B against Q = (1 - q) B + q A; the loss L = -log(1 - q + q e^l) decreases with l.

Each is a monotone function of the base loss, so its tails are mixtures of the base's tails at one
threshold, and the hockey-stick curve the discretization sees is exact. Ties (atoms of l sitting
exactly on a threshold) do not matter: delta(eps) is continuous and an atom at L = eps contributes
P(L = eps) - e^eps Q(L = eps) = 0 to it.

Replace-one adjacency for the Gaussian (one record's contribution g replaced by g', both of norm at
most the sensitivity C, so the worst pair is g = -C, g' = +C, as in dp-accounting): P = (1 - q) N(0, 1)
+ q N(-mu, 1) against Q = (1 - q) N(0, 1) + q N(mu, 1) in units of sigma, mu = C / sigma. The loss
decreases in the output x and the pair is symmetric under x -> -x, so one direction describes it.

Sampling without replacement (a fixed batch of b records out of n, q = b / n) has a sound PLD under
replace-one adjacency: the pair (q A + (1 - q) B, B) and its swap, with (A, B) the base mechanism's
replace-one pair (for the Gaussian, shift 2 C). Under add/remove adjacency the dataset size changes,
so "a fixed batch size" is not one mechanism and no PLD is offered.

The mixture of shifts (dp-accounting's mixture of Gaussians; several contributions per record):
the record's contribution is a_k scales of the noise with probability p_k (a_k >= 0, sum p_k = 1,
a_k = 0 for "not sampled"). Remove: P = sum_k p_k F(. - a_k) against Q = F; add: the swap. For a
log-concave density f the loss l(x) = log sum_k p_k f(x - a_k) / f(x) does not decrease in the
output x, so L > eps is the event x > x*(eps), and x* is found by bisection over the float64
numbers (64 halvings of their ordered bit patterns reach adjacent floats, whatever the range);
the tails are mixtures of the noise's tails at x* and the hockey-stick curve is exact up to
round-off.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import array_module, computed_once
from pldjax.core.precision import last_float_before
from pldjax.core.special import log1p, log1p_parts, log_ndtr_pair, special_functions
from pldjax.kernels.discretize import (
    LossTails,
    curve_values,
    leaned_tails,
    side_tails,
    window,
)
from pldjax.mechanisms.noise import GAUSSIAN, MAX_SHIFT, Location


def _log_mix(log_weight_b, log_b, log_q, log_a):
    """log((1 - q) b + q a) given log(1 - q), log b, log q, log a."""
    xp = array_module(log_weight_b, log_b, log_q, log_a)
    return xp.logaddexp(log_weight_b + log_b, log_q + log_a)


def _threshold(x, q, log_q):
    """log((e^x - 1 + q) / q) where e^x > 1 - q, else -inf: the base loss at which the subsampled
    loss crosses (for the remove direction x = eps, for add x = -eps). For x > 0 it is written as
    x + log1p((q - 1) e^-x) - log q, which does not overflow for x beyond 709, except for
    0 < x <= 1 and q < 1/2, where e^x - 1 + q is a sum of positive terms (there 1 - q, rounded,
    cancels: the threshold of x = 3e-21 at q = 1e-6 was 2.9e-11 for 3.4e-15); for x <= 0 and
    q >= 1/2 as x + log1p(-(1 - q) e^-x) - log q, which keeps a large -x (exact at q = 1)."""
    xp = array_module(x, q)
    m = xp.expm1(-xp.abs(x))  # e^x - 1 for x <= 0, e^-x - 1 for x > 0
    above = x > 0
    grows = above & (x <= 1.0) & (q < 0.5)
    u, r = log1p_parts((q - 1.0) * (1.0 + m))  # (q - 1) e^-x for x > 0
    # m + q = e^x - 1 + q for x <= 0; -m / (1 + m) = e^x - 1 for x > 0 (where it is taken:
    # elsewhere 1 + m may be 0, and NumPy's division by it is not a result)
    with np.errstate(divide="ignore"):
        argument = xp.where(grows, q - m / (1.0 + m), xp.where(above, u, m + q))
    positive = argument > 0
    logged = xp.log(xp.where(positive, argument, 1.0))
    below = xp.where(positive, logged - log_q, -xp.inf)
    # from q = 1/2 (1 - q exact) x <= 0 is taken as x + log(1 - (1 - q) e^-x): expm1(x) + q
    # rounded to 0 below x = -37 at q = 1 (and e^x underflows below -745), which put the add
    # direction's losses above 37 nats at -inf; for small q, m + q keeps the digits of x near 0
    if xp is not np or np.any(q >= 0.5):  # (NumPy: not computed where no q needs it)
        scaled = xp.where(q < 1.0, (1.0 - q) * xp.exp(xp.minimum(-x, 709.0)), 0.0)
        inside = scaled < 1.0
        near_one = xp.where(inside, x + log1p(-xp.where(inside, scaled, 0.0), xp) - log_q,
                            -xp.inf)
        below = xp.where(q >= 0.5, near_one, below)
    return xp.where(above & ~grows, x + logged * r - log_q, below)


def _log1p_q_expm1(q, loss):
    """log(1 - q + q e^loss) without overflow (used for window placement only)."""
    xp = array_module(q, loss)
    return xp.logaddexp(log1p(-q, xp), xp.log(q) + loss)


def _subsampled_spread(base: LossTails, params):
    """Heuristic scale of the subsampled loss: q sqrt(chi^2) while q is small, never more than
    the base's own spread, nor than sqrt(q) times the base's loss scale (a rare, large loss)."""
    *base_params, q = params
    base_params = tuple(base_params)
    xp = array_module(q)
    base_spread = base.spread(base_params)
    small_q = q * xp.sqrt(base.chi2(base_params))
    rare = xp.sqrt(q) * (xp.abs(base.center(base_params)) + base_spread)
    spread = xp.minimum(xp.minimum(small_q, rare), base_spread)
    return xp.where(spread > 0, spread, 1.0)


#: Base losses beyond this many nats are left out of the subsampled window (so that it stays
#: near the bulk at log(1 - q) for tiny noise): their mass goes to the +inf atom (pessimistic)
#: or to the window's top (optimistic), both sound.
BASE_REACH_MAX = 1e4


def _base_range(base: LossTails, params, tail):
    """(q, low, high): the base loss's range under both of its distributions, at most
    BASE_REACH_MAX. The base window covers the loss under A (its window for ``tail``, see
    :func:`pldjax.kernels.discretize.window`); under B a symmetric base's loss is its mirror image, and
    the subsampled mechanism sees both (the add direction's P is B). So A and B each hold at most
    ``tail`` outside, and so does either direction's P, a mixture of them."""
    *base_params, q = params
    base_params = tuple(base_params)
    xp = array_module(q, tail)
    center, half = window(base, base_params, tail)
    reach = xp.minimum(xp.maximum(xp.abs(center - half), xp.abs(center + half)), BASE_REACH_MAX)
    return q, -reach, reach


def _loss_range(base: LossTails, params, tail=0.0):
    """(low, high) of the subsampled loss: L = log(1 - q + q e^l) is monotone in the base loss;
    P's mass outside is at most ``tail`` (0: the default window)."""
    *rest, adding = params
    xp = array_module(adding, tail)
    q, low, high = _base_range(base, tuple(rest), tail)
    remove = (_log1p_q_expm1(q, low), _log1p_q_expm1(q, high))
    add = (-_log1p_q_expm1(q, high), -_log1p_q_expm1(q, low))
    return tuple(xp.where(adding > 0, a, r) for r, a in zip(remove, add, strict=True))


def _threshold_error(x, threshold, log_q):
    """A bound on the rounding error of ``threshold`` = :func:`_threshold` (x, q, log q): a few
    ulps of 1 + |x| + |threshold| + |log q| (its sums and logarithms), and, where x <= 0,
    e^x - 1 + q = q e^threshold is the difference of two rounded terms of about q (or of 1
    and (1 - q) e^-x, from q = 1/2), an error of a few ulps of q in it: e^-threshold ulps in
    the threshold. Held to 1 nat (a threshold whose argument rounding can wipe out lies more
    than 36 nats below 0, where the base's curve is below e^-36 q); 0 where the threshold is
    infinite (exact)."""
    xp = array_module(x, threshold)
    finite = xp.isfinite(threshold)
    t = xp.where(finite, threshold, 0.0)
    error = 2 * np.finfo(np.float64).eps * (3.0 + xp.abs(x) + xp.abs(t) + xp.abs(log_q)
                                            + 2 * xp.exp(xp.minimum(-t, 700.0)))
    return xp.where(finite, xp.minimum(error, 1.0), 0.0)


def _threshold_arguments(params, eps):
    """(x, log q) of :func:`_threshold`: x the subsampled loss whose base threshold is read (for
    remove eps, for add -eps)."""
    *_, q, adding = params
    xp = array_module(q, eps)
    return xp.where(adding > 0, -eps, eps), xp.log(q)


def _base_threshold(params, eps):
    """The base loss at which the subsampled loss crosses ``eps`` (:func:`_threshold`)."""
    x, log_q = _threshold_arguments(params, eps)
    return _threshold(x, params[-2], log_q)


def _leaned_threshold(params, eps, upper, pessimistic):
    """The base threshold of :func:`_base_threshold` moved by its rounding error
    (:func:`_threshold_error`) to where the base's curve at it is at or above (``pessimistic``)
    or below its value at the true threshold: the base's delta does not increase in the
    threshold, its excess does not decrease; the side the base reads is ``upper``'s for
    remove, the other for add."""
    x, log_q = _threshold_arguments(params, eps)
    xp = array_module(x)
    threshold = _threshold(x, params[-2], log_q)
    base_upper = upper != (params[-1] > 0)
    lean = _threshold_error(x, threshold, log_q) * xp.where(base_upper == pessimistic, -1.0, 1.0)
    return threshold + lean


def _mixed_tails(params, base_tails):
    """Tails of the remove or add direction (see the module docstring) from the base's four
    tails at the threshold."""
    *_, q, adding = params
    xp = array_module(q, *base_tails)
    add = adding > 0
    log_q, log_1mq = xp.log(q), log1p(-q, xp)
    sp, sq, cp, cq = base_tails
    mixed_sf, mixed_cdf = _log_mix(log_1mq, sq, log_q, sp), _log_mix(log_1mq, cq, log_q, cp)
    remove = (mixed_sf, sq, mixed_cdf, cq)
    # add: L > eps  <=>  l < threshold, so the "above" tails of L are the "at most" tails of l
    added = (cq, mixed_cdf, sq, mixed_sf)
    return tuple(xp.where(add, a, r) for r, a in zip(remove, added, strict=True))


def _tails(base: LossTails, params, eps):
    """Tails of the remove or add direction, from one evaluation of the base's tails per
    point."""
    return _mixed_tails(params, base.tails(tuple(params[:-2]), _base_threshold(params, eps)))


def _base_side(base: LossTails, params, eps, upper, pessimistic=None):
    """(threshold, log A, log B): the base loss's threshold for ``eps`` and the base's tails
    there on the side that ``upper`` (L > eps, else L <= eps) reads: for add, L > eps is the
    base loss below its threshold, so the base's other side. ``pessimistic`` True (False): the
    threshold and the base's tails lean so that the base's curve from them is at or above
    (below) its value at the true threshold (:func:`_leaned_threshold`,
    :func:`~pldjax.kernels.discretize.side_tails`)."""
    threshold = (_base_threshold(params, eps) if pessimistic is None
                 else _leaned_threshold(params, eps, upper, pessimistic))
    return (threshold, *side_tails(base, tuple(params[:-2]), threshold, upper != (params[-1] > 0),
                                   pessimistic))


def _mixed_side(params, base_p, base_q):
    """(log P, log Q) of the side :func:`_base_side` read, from its base tails: one mixture."""
    *_, q, adding = params
    xp = array_module(q, base_p)
    mixed = _log_mix(log1p(-q, xp), base_q, xp.log(q), base_p)
    add = adding > 0
    return xp.where(add, base_q, mixed), xp.where(add, mixed, base_q)


def _side_tails(base: LossTails, params, eps, upper, pessimistic=None):
    """(log P, log Q) of L > eps where ``upper``, of L <= eps elsewhere (see
    :func:`pldjax.kernels.discretize.side_tails`): one side of the base's tails and one mixture a
    point, as computed whatever ``pessimistic`` (the curve, :func:`_curve`, leans the base's
    instead)."""
    _, base_p, base_q = _base_side(base, params, eps, upper)
    return _mixed_side(params, base_p, base_q)


def _scaled(params, eps, base_values, mixed_values):
    """The curve values of :func:`_curve` from the base's (at the threshold, on the side that
    :func:`_base_side` reads), scaled, and from the mixture's tails (``mixed_values()``), which
    serve at q = 1 (NumPy computes them only where some q is 1)."""
    *_, q, adding = params
    xp = array_module(q, eps)
    # the add direction's e^eps: beyond its largest loss, -log(1 - q) (at most 37 nats for q < 1),
    # the base's values are 0 (its threshold is -inf)
    scale = q * xp.where(adding > 0, xp.exp(xp.minimum(eps, 709.0)), 1.0)
    below_one = q < 1.0
    mixed = mixed_values() if xp is not np or not np.all(below_one) else 0.0
    return xp.where(below_one, xp.where(q > 0, scale * base_values, 0.0), mixed)


def _side_curve(base: LossTails, params, eps, upper, pessimistic):
    """The curve values of :func:`_curve` (delta where ``upper``, its excess elsewhere), at or
    above the truth where ``pessimistic``."""
    threshold, base_p, base_q = _base_side(base, params, eps, upper, pessimistic)
    return _side_values(params, eps, upper, threshold, base_p, base_q, pessimistic)


def _side_values(params, eps, upper, threshold, base_p, base_q, pessimistic):
    """:func:`_side_curve` from the base's tails (on the side read) at the threshold."""
    base_values = curve_values(base_p, base_q, threshold, upper != (params[-1] > 0), pessimistic)
    return _scaled(params, eps, base_values, lambda: curve_values(
        *_mixed_side(params, base_p, base_q), eps, upper, pessimistic))


def _estimate(base: LossTails, params, eps):
    """The four tails, then delta(eps) and its excess at or below the truth (see
    :class:`~pldjax.kernels.discretize.LossTails`), from one evaluation of the base's tails per
    point, at the threshold leaned down (:func:`_leaned_threshold`) with the base's tails leaned
    down (:func:`~pldjax.kernels.discretize.leaned_tails`): the tails as :func:`_tails` gives
    them from those; of the curve, the side that keeps its digits (delta where eps >= 0, the
    excess below) as :func:`_curve` gives it, optimistic, and the other side from delta -
    excess = 1 - e^eps, a sum of two non-negative terms (the base's own other side overflowed:
    the add direction's delta at eps = -5254 is e^eps q times the base's excess at 5256,
    e^5256 times a probability)."""
    upper = eps >= 0
    threshold = _leaned_threshold(params, eps, upper, pessimistic=False)
    base_tails = leaned_tails(base, tuple(params[:-2]), threshold, pessimistic=False)
    # read by all six outputs: XLA's CPU fusion would compute them in each
    threshold, sp, sq, cp, cq = computed_once(
        tuple(jnp.broadcast_to(a, jnp.shape(threshold)) if array_module(a) is jnp else a
              for a in (threshold, *base_tails)))
    tails = _mixed_tails(params, (sp, sq, cp, cq))
    xp = array_module(*tails)
    base_upper = upper != (params[-1] > 0)
    side = _side_values(params, eps, upper, threshold, xp.where(base_upper, sp, cp),
                        xp.where(base_upper, sq, cq), pessimistic=False)
    with np.errstate(over="ignore"):  # e^eps - 1 is +inf beyond eps = 709.78, as it should be
        linear = xp.expm1(eps)
    return (*tails, xp.where(upper, side, side - linear), xp.where(upper, side + linear, side))


def _curve(base: LossTails, params, eps, upper):
    """The curve values of :func:`pldjax.kernels.discretize.mechanism_curve` (delta where
    ``upper``, its excess elsewhere), for q < 1 from the base's at the threshold t: with
    e^eps = 1 - q + q e^t (remove), P - e^eps Q = q (A - e^t B) on the side L > eps and likewise
    below, so the remove direction's delta and excess are q times the base's delta and excess
    at t; with e^-eps = 1 - q + q e^t (add) they are e^eps q times the base's excess and delta
    at t (the sides swap). The difference of the mixture's tails nearly cancels for a small q
    (P is close to Q): its round-off put the curve of q = 1e-6 (sigma 0.6) up to 7e-11 below
    the truth, compounded over a million steps. At q = 1 (where e^eps q of the add direction
    overflows) the mixture's tails, which are then the base's. The threshold and the base's
    tails lean by their rounding error (:func:`_base_side`): at sigma = 0.01, q = 0.01 the curve
    was 1e-14 below the truth where its threshold's rounding moved the base's tails."""
    return _side_curve(base, params, eps, upper, pessimistic=True)


def _center(base: LossTails, params):
    low, high = _loss_range(base, params)
    return (low + high) / 2


def _half_width(base: LossTails, params):
    low, high = _loss_range(base, params)
    return (high - low) / 2


#: The direction parameter of :func:`poisson`: remove (the mixture against the base) and add.
REMOVE, ADD = 0.0, 1.0


@functools.cache
def poisson(base: LossTails) -> LossTails:
    """The Poisson-subsampled ``base``; params: base params + (q, direction), direction REMOVE or
    ADD (data, so that both directions share one compiled kernel and one vmapped call).

    Cached, so that the same mechanism object (a static jit argument) is returned every time.
    """
    return LossTails(
        tails=functools.partial(_tails, base),
        side_tails=functools.partial(_side_tails, base),
        curve=functools.partial(_curve, base),
        estimate=functools.partial(_estimate, base),
        spread=lambda params: _subsampled_spread(base, tuple(params[:-1])),
        center=functools.partial(_center, base),
        half_width=functools.partial(_half_width, base),
        bulk=functools.partial(_loss_range, base),
        host=base.host,
        swapped_directions=True,
    )


# -- replace-one Gaussian -------------------------------------------------------------------------
def _replace_one_threshold(mu, q, eps):
    """The output x at which the replace-one loss equals eps (the loss decreases in x).

    With v = e^(-mu x) and c = e^(-mu^2/2): e^L = (1 - q + q c v) / (1 - q + q c / v), so
    q c v^2 + (1 - q)(1 - e^eps) v - q c e^eps = 0; its positive root, written without
    cancellation for either sign of D = (1 - q) expm1(eps), wholly in logs (c underflows for
    mu beyond about 38, and expm1(eps) overflows beyond 709).
    """
    xp = array_module(mu, q, eps)
    log_2qc = xp.log(2 * q) - mu**2 / 2
    log_w = log_2qc + eps / 2  # w = 2 q c e^(eps/2): 4 q^2 c^2 e^eps = w^2
    # log |D|, -inf at eps = 0
    log_abs_expm1 = xp.where(eps > 0, eps + xp.log(-xp.expm1(-xp.abs(eps))),
                              xp.log(-xp.expm1(-xp.abs(eps))))
    log_d = log1p(-q, xp) + log_abs_expm1
    log_root = xp.logaddexp(2 * log_d, 2 * log_w) / 2  # log hypot(D, w)
    log_sum = xp.logaddexp(log_d, log_root)  # log(root + |D|)
    log_v = xp.where(eps >= 0, log_sum - log_2qc, 2 * log_w - log_2qc - log_sum)
    return -log_v / mu


def _replace_one_tails(params, eps):
    mu, q = params
    xp = array_module(mu, q, eps)
    active = (q > 0) & (mu > 0)
    # mu^2 must stay finite; beyond mu = 1e150 the curve no longer changes in float64 (the losses
    # away from 0 exceed 1e299 nats, far beyond any window)
    mu, q = xp.where(active, xp.minimum(mu, 1e150), 1.0), xp.where(active, q, 0.5)
    x = _replace_one_threshold(mu, q, eps)
    log_q, log_1mq = xp.log(q), log1p(-q, xp)
    # P = (1-q) N(0,1) + q N(-mu,1), Q = (1-q) N(0,1) + q N(mu,1); L > eps <=> output < x
    # each log Phi(y) and log Phi(-y) from one erfc (log_ndtr_pair)
    at_x, at_minus_x = log_ndtr_pair(x)
    shifted_up, shifted_up_c = log_ndtr_pair(x + mu)
    shifted_down, shifted_down_c = log_ndtr_pair(x - mu)
    tails = (
        _log_mix(log_1mq, at_x, log_q, shifted_up),
        _log_mix(log_1mq, at_x, log_q, shifted_down),
        _log_mix(log_1mq, at_minus_x, log_q, shifted_up_c),
        _log_mix(log_1mq, at_minus_x, log_q, shifted_down_c),
    )
    # q = 0 or mu = 0: P = Q, the loss is 0 with certainty
    sf = xp.where(eps < 0, 0.0, -xp.inf)
    cdf = xp.where(eps < 0, -xp.inf, 0.0)
    return tuple(xp.where(active, t, i) for t, i in zip(tails, (sf, sf, cdf, cdf), strict=True))


def _replace_one_half_width(params):
    mu, q = params
    xp = array_module(mu, q)
    # the loss at output -(mu + 10), below which P holds under 1e-23 (the loss decreases in the
    # output): log(1 - q + q e^(mu^2/2 + 10 mu)) - log(1 - q + q e^(-3 mu^2/2 - 10 mu)). The
    # second term is at most log(1 / (1 - q)) while q < 1, but at q = 1 the loss is linear,
    # -2 mu x, and it is 3 mu^2/2 + 10 mu: the first term alone left the top (up to 3/4 of the
    # loss) out of the window, into the +inf atom
    top = _log1p_q_expm1(q, mu**2 / 2 + 10 * mu) - _log1p_q_expm1(q, -1.5 * mu**2 - 10 * mu)
    reach = 1.01 * top + 2 * q * mu + 1e-300
    return xp.minimum(reach, BASE_REACH_MAX)


def _replace_one_spread(params):
    mu, q = params
    xp = array_module(mu, q)
    # sd of the loss: about 2 q sqrt(sinh(mu^2)) for small q, 2 mu at q = 1
    spread = xp.minimum(2 * q * xp.sqrt(xp.sinh(mu**2)), 2 * mu)
    return xp.where(spread > 0, spread, 1.0)


GAUSSIAN_REPLACE_ONE = LossTails(
    tails=_replace_one_tails,
    spread=_replace_one_spread,
    center=lambda p: array_module(p[0]).zeros_like(p[0]),
    half_width=_replace_one_half_width,
    host=True,
)


#: Poisson subsampling under replace-one, by base mechanism (Gaussian only: its loss threshold has
#: a closed form, see above).
REPLACE_ONE = {GAUSSIAN: GAUSSIAN_REPLACE_ONE}


# -- mixture of shifts ------------------------------------------------------------------------------
def _components(values, x):
    """``values`` (one per component, on the first axis, then any batch axes, which ``x`` has
    first too: NumPy evaluates a batch's windows at once) shaped to broadcast against ``x``."""
    return values.reshape(values.shape + (1,) * (np.ndim(x) - (np.ndim(values) - 1)))


def _mixture_loss(location: Location, x, shifts, log_probs):
    """l(x) = log sum_k p_k f(x - a_k) / f(x); components with p_k = 0 left out (no -inf + inf)."""
    xp = array_module(x, shifts)
    a, lp = _components(shifts, x), _components(log_probs, x)
    return special_functions(xp).logsumexp(
        xp.where(xp.isneginf(lp), -xp.inf, lp + location.log_ratio(x, a)), axis=0)


def _mixture_threshold(location: Location, shifts, log_probs, eps):
    """The largest float x with l(x) <= eps (l non-decreasing): L > eps is the event X > x up to
    the one float between x and its successor. -FLOAT_MAX when l > eps everywhere, FLOAT_MAX
    when l <= eps everywhere (their tails are 1 and 0 to float64's resolution)."""
    return last_float_before(lambda x: _mixture_loss(location, x, shifts, log_probs) > eps,
                             eps.shape, array_module(shifts, eps))


def _mixture_parts(params):
    """(shifts a_k, log p_k, direction, log r) from params (r, shift, w_1..w_K, p_1..p_K,
    direction), the components stacked on a leading axis (the programs' size does not grow with
    K); r is the mass of the output that reveals the record (see :func:`mixture`)."""
    reveal, shift, *rest, direction = params
    xp = array_module(*params)
    count = len(rest) // 2
    weights, probs = xp.stack(rest[:count]), xp.stack(rest[count:])
    # at most MAX_SHIFT (see pldjax.mechanisms.noise: a (x - a/2) stays finite); a zero scale is no shift
    shifts = xp.where(weights > 0, xp.minimum(weights * shift, MAX_SHIFT), 0.0)
    with np.errstate(divide="ignore"):  # log(0) = -inf: an absent component, as in XLA
        return shifts, xp.log(probs), direction, xp.log(reveal)


#: The error allowed a mixture component's tail argument x - a_k, in float64 epsilons times
#: |x| + a_k: the shift a_k = w_k sensitivity / sigma is rounded twice (at most an epsilon of it
#: in all), the difference once (half an epsilon of it).
MIXTURE_ARGUMENT_ULPS = 2


def _mixture_tails(location: Location, params, eps, pessimistic=None):
    """The four tails at the output threshold x of ``eps`` (the set L > eps is X > x, or
    X <= x adding): mixtures of the noise's tails at x - a_k. ``pessimistic`` True (False): each
    x - a_k lowered (raised) by its rounding error (MIXTURE_ARGUMENT_ULPS), which raises
    (lowers) the mixture's tails above x and lowers (raises) those below, so that the curve
    from them is at or above (below) the truth (see
    :func:`~pldjax.kernels.discretize.leaned_tails`); the tails of F itself are exact at x.
    The threshold needs no such care: a set off the optimal one by its rounding changes the
    curve by its square."""
    shifts, log_probs, direction, log_reveal = _mixture_parts(params)
    xp = array_module(shifts, eps)
    add = direction > 0
    x = _mixture_threshold(location, shifts, log_probs, xp.where(add, -eps, eps))
    arguments = x - _components(shifts, x)
    if pessimistic is not None:
        error = MIXTURE_ARGUMENT_ULPS * np.finfo(np.float64).eps * (xp.abs(x)
                                                                     + _components(shifts, x))
        arguments = arguments + (-error if pessimistic else error)

    def mixed(tail):
        return special_functions(xp).logsumexp(_components(log_probs, x) + tail(arguments),
                                               axis=0)

    sf, cdf = location.log_sf(x), location.log_cdf(x)
    # the revealing output lies above every x (its loss is +inf removing, -inf adding)
    mixed_sf = xp.logaddexp(mixed(location.log_sf), log_reveal)
    mixed_cdf = mixed(location.log_cdf)
    remove = (mixed_sf, sf, mixed_cdf, cdf)  # L > eps  <=>  X > x
    added = (cdf, mixed_cdf, sf, mixed_sf)  # L = -l(X) > eps  <=>  l(X) < -eps  <=>  X <= x
    return tuple(xp.where(add, a, r) for r, a in zip(remove, added, strict=True))


#: The window covers outputs within this many scales of the components (their mass beyond is
#: below 1e-23 for the Gaussian; it goes to the +inf atom, or nowhere for an optimistic PLD).
_REACH = 10.0


#: Components of a mixture less likely than this (about grid.TAIL_MASS) are left out of its
#: window's reach and of its loss scale, which only size the grid: their outputs beyond the window
#: go to the +inf atom (at most this mass per component and step, pessimistic) or nowhere
#: (optimistic). Without it the far components of a binomial mixture (a shift of 85 at
#: probability 1e-300, from 100 draws at rate 1e-4) set the scale, and with it a step of 2 nats.
#: A pessimistic mixture folds them into its revealing output (:func:`mixture`).
NEGLIGIBLE_COMPONENT = 2.0**-60


def _weighty(log_probs):
    """Where the components are not negligible (:data:`NEGLIGIBLE_COMPONENT`)."""
    return log_probs >= np.log(NEGLIGIBLE_COMPONENT)


def _reaching(shifts, log_probs):
    """The shifts of the components that are not negligible, 0 elsewhere."""
    return array_module(shifts).where(_weighty(log_probs), shifts, 0.0)


def _mixture_range(location: Location, params, tail=0.0):
    """(low, high) of the loss, for the direction in params, over the outputs in [-x_0,
    max_k (a_k + x_k)], capped at BASE_REACH_MAX: P holds at most ``tail`` of its mass outside,
    besides the negligible components (:data:`NEGLIGIBLE_COMPONENT`), which no window covers.

    x_0 reaches a quarter of the tail (location.reach), for the mixture's lower tail and for
    both tails of the base (the add direction's P); x_k reaches tail / (4 K p_k) for the K
    components, each left out (x_k = 0) where 4 K p_k <= tail (together at most a quarter of the
    tail). Each reach is at most REACH, which a tail of 0 gives: the default window, [-REACH,
    (the largest shift of a component that is not negligible) + REACH]; a tail below the mass
    REACH leaves out is held to that mass. For a binomial mixture at a small rate most
    components are far less likely than the tail that a composition of many steps lets each
    step leave out, and the window shrinks to the likely components' losses (10 draws at rate
    1e-4, 1,000 steps at delta 1e-6: up to 1.8 nats instead of 23)."""
    shifts, log_probs, direction, _ = _mixture_parts(params)
    xp = array_module(shifts)
    tail = xp.asarray(tail, xp.float64)
    parts = 4.0 * shifts.shape[0]

    def reach(log_share):
        return xp.clip(location.reach(xp.exp(log_share)), 0.0, _REACH)

    with np.errstate(divide="ignore"):
        log_tail = xp.log(tail)  # -inf for 0
    own = log_tail - math.log(parts) - log_probs
    kept = _weighty(log_probs) & (own < 0.0)
    top = xp.max(xp.where(kept, shifts + reach(xp.minimum(own, 0.0)), 0.0), axis=0)
    base = reach(log_tail - math.log(4.0))
    low = _mixture_loss(location, -base, shifts, log_probs)
    high = _mixture_loss(location, xp.maximum(top, base), shifts, log_probs)
    low, high = (xp.clip(v, -BASE_REACH_MAX, BASE_REACH_MAX) for v in (low, high))
    add = direction > 0
    return xp.where(add, -high, low), xp.where(add, -low, high)


def _mixture_spread(location: Location, params):
    """Heuristic scale of the loss, as for Poisson subsampling: sqrt(chi^2) of the mixture while
    it is close to F, never more than the largest component's own loss scale a_max, nor than
    sqrt(q) (a_max^2/2 + a_max) (a rare, large loss; q the probability of a shift > 0), over the
    components that are not negligible (:data:`NEGLIGIBLE_COMPONENT`)."""
    shifts, log_probs, _, _ = _mixture_parts(params)
    xp = array_module(shifts)
    probs = xp.where(_weighty(log_probs), xp.exp(log_probs), 0.0)

    def add_row(j, total):
        # absent components (p = 0) add nothing, even where the moment overflows (no 0 * inf)
        pair = probs[j] * probs
        return total + xp.sum(xp.where(pair > 0, pair * location.cross(shifts[j], shifts), 0.0),
                              axis=0)

    # row by row: K values in memory at a time, not K^2
    chi2 = xp.zeros(shifts.shape[1:])
    if xp is np:
        for j in range(shifts.shape[0]):
            chi2 = add_row(j, chi2)
    else:
        chi2 = jax.lax.fori_loop(0, shifts.shape[0], add_row, chi2)
    top = xp.max(_reaching(shifts, log_probs), axis=0)
    moving = xp.sum(xp.where(shifts > 0, probs, 0.0), axis=0)
    rare = xp.sqrt(moving) * (top**2 / 2 + top)
    spread = xp.minimum(xp.minimum(xp.sqrt(xp.maximum(chi2, 0.0)), rare), top)
    return xp.where(spread > 0, spread, 1.0)


@functools.cache
def mixture(location: Location) -> LossTails:
    """The mixture of shifts of a location family, both directions; params:
    (r, shift, w_1..w_K, p_1..p_K, direction) with shifts a_k = w_k * shift (in the noise's
    scales), probabilities p_k (summing to 1 - r) and direction REMOVE or ADD; any number K >= 1
    of components. With probability r >= 0 the mixture gives an output the base never gives, which
    reveals the record (a loss of +inf removing it, -inf adding it): a pessimistic mixture puts
    its negligible components there, a pair that dominates the mixture (sending that output to a
    draw of those components gives back the mixture and leaves the base). Cached: one object (a
    static jit argument) per family."""

    def center(params):
        low, high = _mixture_range(location, params)
        return (low + high) / 2

    def half_width(params):
        low, high = _mixture_range(location, params)
        return (high - low) / 2

    return LossTails(
        tails=functools.partial(_mixture_tails, location),
        leaned_tails=functools.partial(_mixture_tails, location),
        spread=functools.partial(_mixture_spread, location),
        center=center,
        half_width=half_width,
        bulk=functools.partial(_mixture_range, location),
        host=True,
    )
