"""Special functions the mechanisms' loss tails need, written for speed in float64.

:func:`log_ndtr` is log Phi(x) for the standard normal CDF Phi, to a few ulps for x <= 0 (and a
few ulps of 1 beyond), from one ``erfc`` and one ``log`` per point; :func:`log_ndtr_pair` gives
log Phi(x) and log Phi(-x) for the cost of one (``jax.scipy.special.log_ndtr`` evaluates all
three of its branches under ``where``, each with ``erf``/``erfc`` and logarithms: about 4x the
cost, and it loses digits near its branch points: 7e-2 relative at x = 7.98 in jax 0.10).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import array_module

#: From this |x| on, Phi(-|x|) comes from its asymptotic series (erfc is still a normal float
#: there, 1e-197; the series' first omitted term is below 1e-17 relative).
_SERIES_FROM = 30.0
#: Coefficients of Phi(-a) a sqrt(2 pi) e^{a^2/2} = sum_k c_k a^{-2k}: (-1)^k (2k - 1)!!.
MILLS_SERIES = (1.0, -1.0, 3.0, -15.0, 105.0, -945.0, 10395.0, -135135.0)


def special_functions(xp):
    """``scipy.special`` for NumPy (``xp`` as :func:`~pldjax.core.compilation.array_module`
    gives it; imported on first use: ``import pldjax`` leaves SciPy out), else
    ``jax.scipy.special``."""
    if xp is np:
        import scipy.special

        return scipy.special
    return jax.scipy.special


def _lower_tail(a):
    """(Phi(-a), s, far) for a = |x| >= 0 from one ``erfc``: where ``far`` (a >= 30, Phi(-a) tiny),
    log Phi(-a) is log(s) - a^2 / 2 (s from the asymptotic series, no erfc needed); elsewhere
    s = Phi(-a). NumPy in, NumPy out (as the functions below)."""
    xp = array_module(a)
    lower = 0.5 * special_functions(xp).erfc(a * math.sqrt(0.5))
    far = a >= _SERIES_FROM
    if xp is np:  # the series at the far points alone (few, if any)
        scaled = np.array(lower)
        scaled[far] = _mills_scaled(a[far])
        return lower, scaled, far
    return lower, xp.where(far, _mills_scaled(xp.maximum(a, _SERIES_FROM)), lower), far


def _mills_scaled(a):
    """Phi(-a) e^{a^2/2} for a >= _SERIES_FROM, from the asymptotic series."""
    r = 1.0 / (a * a)
    series = MILLS_SERIES[-1]
    for c in MILLS_SERIES[-2::-1]:
        series = c + r * series
    return series / (a * math.sqrt(2 * math.pi))


def log1p_parts(y):
    """(u, r) with log(1 + y) = log(u) r to a few ulps, for y >= -1: u = 1 + y rounded, and
    r = y / (u - 1) corrects log(u) for that rounding (Goldberg's log1p); where u rounds to 1,
    u = e and r = y. One ``log``, which a caller may share with another branch, where XLA's
    float64 log1p costs more and loses digits below -0.3 (2.5e-14 relative at -0.41)."""
    xp = array_module(y)
    u = 1.0 + y
    exact = u == 1.0
    # 1 - u, not u - 1: XLA rewrites (1 + y) - 1 to y, which would drop the correction
    return xp.where(exact, math.e, u), xp.where(exact, y, -y / xp.where(exact, 1.0, 1.0 - u))


def log1p(y, xp=None):
    """log(1 + y) for y >= -1, to a few ulps in NumPy and in XLA, whose float64 log1p loses
    digits between -0.414 and -0.367 (2.7e-14 relative): there log(u) r of
    :func:`log1p_parts`. A pessimistic bound's last digits (a composed atom 1 - (1 - m)^k, taken
    16 ulps from above) then hold. ``xp``: NumPy or jax.numpy (None: as ``y`` says, see
    :func:`~pldjax.core.compilation.array_module`)."""
    xp = xp or array_module(y)
    if xp is np:
        return np.log1p(y)
    u, r = log1p_parts(y)
    return xp.log(u) * r


def log_ndtr(x):
    """log Phi(x) in float64 (Phi: the standard normal CDF); -inf at -inf, 0 at +inf.

    With a = |x| and lower = Phi(-a) = erfc(a / sqrt 2) / 2, one ``erfc`` and one ``log`` a point:
    for x < 0, log(lower) (from the asymptotic series times e^{-a^2/2} beyond a = 30), to a few
    ulps (3, against mpmath, for x in [-40, 0]); for x >= 0, log(1 - lower) (see
    :func:`log1p_parts`), about -lower, to erfc's relative accuracy there: XLA's and SciPy's lose
    about x^2 ulps to the rounding of x^2 in e^{-x^2} (12 ulps below x = 3, 120 near 10, 500 near
    20), and erfc underflows beyond x = 26 (an absolute error below 1e-300).
    """
    xp = array_module(x)
    with np.errstate(all="ignore"):  # NumPy: log(0) = -inf and the like, as in XLA
        x = xp.asarray(x, xp.float64)
        a = xp.abs(x)
        lower, scaled, far = _lower_tail(a)
        u, r = log1p_parts(-lower)
        negative = x < 0
        logged = xp.log(xp.where(negative, scaled, u))
        return xp.where(negative, xp.where(far, logged - 0.5 * a * a, logged), logged * r)


def log_ndtr_pair(x):
    """(log Phi(x), log Phi(-x)), each as :func:`log_ndtr`, from one ``erfc`` per point (half the
    cost of two calls): one of the two is log Phi(-|x|), the other log(1 - Phi(-|x|))."""
    xp = array_module(x)
    with np.errstate(all="ignore"):  # NumPy: log(0) = -inf and the like, as in XLA
        x = xp.asarray(x, xp.float64)
        a = xp.abs(x)
        lower, scaled, far = _lower_tail(a)
        logged = xp.log(scaled)
        log_lower = xp.where(far, logged - 0.5 * a * a, logged)
        u, r = log1p_parts(-lower)
        log_upper = xp.log(u) * r
        negative = x < 0
        return xp.where(negative, log_lower, log_upper), xp.where(negative, log_upper, log_lower)


#: log k! - log(sqrt(2 pi k) (k / e)^k) for k = 1 .. 15 (mpmath, 40 digits; beyond 15 its
#: asymptotic series is as accurate).
STIRLING_ERRORS = (
    0.08106146679532726, 0.0413406959554093, 0.02767792568499834, 0.020790672103765093,
    0.016644691189821193, 0.013876128823070748, 0.01189670994589177, 0.010411265261972096,
    0.009255462182712733, 0.00833056343336287, 0.007573675487951841, 0.00694284010720953,
    0.006408994188004207, 0.0059513701127588475, 0.005554733551962801,
)


def _stirling_error(n, xp):
    """log n! - log(sqrt(2 pi n) (n / e)^n) for whole n >= 1 (a float array): the table to 15,
    then 1/(12 n) - 1/(360 n^3) + 1/(1260 n^5) - 1/(1680 n^7) + 1/(1188 n^9)."""
    table = xp.asarray((0.0, *STIRLING_ERRORS))
    m = xp.maximum(n, 16.0)
    nn = m * m
    series = (1 / 12 - (1 / 360 - (1 / 1260 - (1 / 1680 - 1 / (1188 * nn)) / nn) / nn) / nn) / m
    return xp.where(n <= 15, table[xp.clip(n, 0, 15).astype(xp.int64)], series)


def _deviance(x, mean, xp):
    """x log(x / mean) + mean - x (>= 0; x >= 0, mean >= 0) without its cancellation near
    x = mean: there (x - mean) v + 2 x sum_{k >= 1} v^(2k+1) / (2k+1) with
    v = (x - mean) / (x + mean), |v| < 0.1 (Loader's bd0)."""
    total = x + mean
    v = (x - mean) / xp.where(total > 0, total, 1.0)
    series, term, v2 = (x - mean) * v, 2 * x * v, v * v
    for k in range(1, 10):  # |v| < 0.1: the terms fall 100-fold each
        term = term * v2
        series = series + term / (2 * k + 1)
    direct = xp.where(x > 0, x * xp.log(xp.where(x > 0, x, 1.0) / mean), 0.0) + mean - x
    return xp.where(xp.abs(x - mean) < 0.1 * total, series, direct)


def binomial_pmf(k, n: int, p, q, xp=jnp):
    """P(K = k) for K ~ Binomial(n, p), given p and q = 1 - p (each to full relative accuracy: a
    small one is not recovered from 1 minus the other), to a few ulps relative (Loader 2000:
    Stirling errors and deviances, no log-gamma; exp(lgamma(n + 1) - ...) carries errors of
    u log(n!), 8e-12 relative at n = 5000). ``k``: whole numbers in [0, n] (float array);
    ``xp``: jax.numpy, or NumPy on the host."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # p or q = 0: log 0
        return _binomial_pmf(xp.asarray(k, xp.float64), n, p, q, xp)


def _binomial_pmf(k, n: int, p, q, xp):
    # the logs where they keep their digits (XLA's log1p loses some below -0.3)
    log_p = xp.where(q < 0.25, xp.log1p(-q), xp.log(p))
    log_q = xp.where(p < 0.25, xp.log1p(-p), xp.log(q))
    inner = xp.clip(k, 1.0, max(n - 1.0, 1.0))
    rest = n - inner
    log_pmf = (_stirling_error(xp.asarray(float(n)), xp) - _stirling_error(inner, xp)
               - _stirling_error(rest, xp) - _deviance(inner, n * p, xp) - _deviance(rest, n * q, xp)
               - 0.5 * (math.log(2 * math.pi) + xp.log(inner) + xp.log(rest / n)))
    ends = xp.where(k == 0, n * log_q, n * log_p)
    return xp.exp(xp.where((k == 0) | (k == n), ends, log_pmf))
