"""Special functions the mechanisms' loss tails need, written for speed in float64.

:func:`log_ndtr` is log Phi(x) for the standard normal CDF Phi, to a few ulps over the whole real
line, from one ``erfc``, one ``log`` and one ``log1p`` per point; :func:`log_ndtr_pair` gives
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
    """(log Phi(-a), Phi(-a)) for a = |x| >= 0: one ``erfc`` and one logarithm (the asymptotic
    series times e^{-a^2/2} from a = 30 on, where Phi(-a) is tiny but log Phi(-a) needs no erfc)."""
    lower = 0.5 * jax.lax.erfc(a * math.sqrt(0.5))
    far = a >= _SERIES_FROM
    safe = jnp.maximum(a, _SERIES_FROM)
    r = 1.0 / (safe * safe)
    series = _SERIES[-1]
    for c in _SERIES[-2::-1]:
        series = c + r * series
    scaled = series / (safe * math.sqrt(2 * math.pi))  # Phi(-a) e^{a^2/2} for a >= 30
    logged = jnp.log(jnp.where(far, scaled, lower))
    return jnp.where(far, logged - 0.5 * a * a, logged), lower


def _log_complement(lower):
    """log(1 - lower) for lower = Phi(-a) in [0, 1/2], with one ``log1p``: of -lower where lower
    < 1/4, else log(2 (1 - lower)) - log 2 = log1p(1 - 2 lower) - log 2 (1 - 2 lower is exact
    there; XLA's float64 log1p loses digits below -0.3: 2.5e-14 relative at -0.41)."""
    small = lower < 0.25
    return jnp.log1p(jnp.where(small, -lower, 1.0 - 2.0 * lower)) - jnp.where(small, 0.0, math.log(2))


def log_ndtr(x):
    """log Phi(x) in float64 (Phi: the standard normal CDF); -inf at -inf, 0 at +inf.

    With a = |x| and lower = Phi(-a) = erfc(a / sqrt 2) / 2: for x < 0, log(lower) (from the
    asymptotic series times e^{-a^2/2} beyond a = 30); for x >= 0, log(1 - lower) (see
    :func:`_log_complement`).
    """
    x = jnp.asarray(x, jnp.float64)
    log_lower, lower = _lower_tail(jnp.abs(x))
    return jnp.where(x < 0, log_lower, _log_complement(lower))


def log_ndtr_pair(x):
    """(log Phi(x), log Phi(-x)), each as :func:`log_ndtr`, from one ``erfc`` per point (half the
    cost of two calls): one of the two is log Phi(-|x|), the other log(1 - Phi(-|x|))."""
    x = jnp.asarray(x, jnp.float64)
    log_lower, lower = _lower_tail(jnp.abs(x))
    log_upper = _log_complement(lower)
    negative = x < 0
    return jnp.where(negative, log_lower, log_upper), jnp.where(negative, log_upper, log_lower)
