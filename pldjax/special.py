"""Special functions the mechanisms' loss tails need, written for speed in float64.

:func:`log_ndtr` is log Phi(x) for the standard normal CDF Phi, to a few ulps over the whole real
line, from one ``erfc`` and one ``log`` per point; :func:`log_ndtr_pair` gives
log Phi(x) and log Phi(-x) for the cost of one (``jax.scipy.special.log_ndtr`` evaluates all
three of its branches under ``where``, each with ``erf``/``erfc`` and logarithms: about 4x the
cost, and it loses digits near its branch points: 7e-2 relative at x = 7.98 in jax 0.10).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

#: From this |x| on, Phi(-|x|) comes from its asymptotic series (erfc is still a normal float
#: there, 1e-197; the series' first omitted term is below 1e-17 relative).
_SERIES_FROM = 30.0
#: Coefficients of Phi(-a) a sqrt(2 pi) e^{a^2/2} = sum_k c_k a^{-2k}: (-1)^k (2k - 1)!!.
_SERIES = (1.0, -1.0, 3.0, -15.0, 105.0, -945.0, 10395.0, -135135.0)


def _lower_tail(a):
    """(Phi(-a), s, far) for a = |x| >= 0 from one ``erfc``: where ``far`` (a >= 30, Phi(-a) tiny),
    log Phi(-a) is log(s) - a^2 / 2 (s from the asymptotic series, no erfc needed); elsewhere
    s = Phi(-a)."""
    lower = 0.5 * jax.lax.erfc(a * math.sqrt(0.5))
    far = a >= _SERIES_FROM
    safe = jnp.maximum(a, _SERIES_FROM)
    r = 1.0 / (safe * safe)
    series = _SERIES[-1]
    for c in _SERIES[-2::-1]:
        series = c + r * series
    scaled = series / (safe * math.sqrt(2 * math.pi))  # Phi(-a) e^{a^2/2} for a >= 30
    return lower, jnp.where(far, scaled, lower), far


def log1p_parts(y):
    """(u, r) with log(1 + y) = log(u) r to a few ulps, for y >= -1: u = 1 + y rounded, and
    r = y / (u - 1) corrects log(u) for that rounding (Goldberg's log1p); where u rounds to 1,
    u = e and r = y. One ``log``, which a caller may share with another branch, where XLA's
    float64 log1p costs more and loses digits below -0.3 (2.5e-14 relative at -0.41)."""
    u = 1.0 + y
    exact = u == 1.0
    # 1 - u, not u - 1: XLA rewrites (1 + y) - 1 to y, which would drop the correction
    return jnp.where(exact, math.e, u), jnp.where(exact, y, -y / jnp.where(exact, 1.0, 1.0 - u))


def log_ndtr(x):
    """log Phi(x) in float64 (Phi: the standard normal CDF); -inf at -inf, 0 at +inf.

    With a = |x| and lower = Phi(-a) = erfc(a / sqrt 2) / 2, one ``erfc`` and one ``log`` a point:
    for x < 0, log(lower) (from the asymptotic series times e^{-a^2/2} beyond a = 30); for x >= 0,
    log(1 - lower) (see :func:`log1p_parts`).
    """
    x = jnp.asarray(x, jnp.float64)
    a = jnp.abs(x)
    lower, scaled, far = _lower_tail(a)
    u, r = log1p_parts(-lower)
    negative = x < 0
    logged = jnp.log(jnp.where(negative, scaled, u))
    return jnp.where(negative, jnp.where(far, logged - 0.5 * a * a, logged), logged * r)


def log_ndtr_pair(x):
    """(log Phi(x), log Phi(-x)), each as :func:`log_ndtr`, from one ``erfc`` per point (half the
    cost of two calls): one of the two is log Phi(-|x|), the other log(1 - Phi(-|x|))."""
    x = jnp.asarray(x, jnp.float64)
    a = jnp.abs(x)
    lower, scaled, far = _lower_tail(a)
    logged = jnp.log(scaled)
    log_lower = jnp.where(far, logged - 0.5 * a * a, logged)
    u, r = log1p_parts(-lower)
    log_upper = jnp.log(u) * r
    negative = x < 0
    return jnp.where(negative, log_lower, log_upper), jnp.where(negative, log_upper, log_lower)
