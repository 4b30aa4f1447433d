"""Special functions the mechanisms' loss tails need, written for speed in float64.

:func:`log_ndtr` is log Phi(x) for the standard normal CDF Phi, to a few ulps over the whole real
line, from one ``erfc`` and one logarithm per point (``jax.scipy.special.log_ndtr`` evaluates all
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


def log_ndtr(x):
    """log Phi(x) in float64 (Phi: the standard normal CDF); -inf at -inf, 0 at +inf.

    With a = |x| and lower = Phi(-a) = erfc(a / sqrt 2) / 2: for x < 0, log(lower) (from the
    asymptotic series times e^{-a^2/2} beyond a = 30); for x >= 0, log(1 - lower), as log1p
    where lower < 1/4 and as a plain log above (XLA's float64 log1p loses digits below -0.3:
    2.5e-14 relative at -0.41).
    """
    x = jnp.asarray(x, jnp.float64)
    a = jnp.abs(x)
    lower = 0.5 * jax.lax.erfc(a * math.sqrt(0.5))
    far = a >= _SERIES_FROM
    safe = jnp.maximum(a, _SERIES_FROM)
    r = 1.0 / (safe * safe)
    series = _SERIES[-1]
    for c in _SERIES[-2::-1]:
        series = c + r * series
    scaled = series / (safe * math.sqrt(2 * math.pi))  # Phi(-a) e^{a^2/2} for a >= 30
    negative = x < 0
    # one logarithm for log(lower) (x < 0) and log(1 - lower) (x >= 0, lower >= 1/4); log1p
    # for lower < 1/4, where 1 - lower loses digits of the small result
    log_arg = jnp.where(negative, jnp.where(far, scaled, lower), 1.0 - lower)
    logged = jnp.log(log_arg)
    log_lower = jnp.where(far, logged - 0.5 * a * a, logged)
    log_upper = jnp.where(lower < 0.25, jnp.log1p(-lower), logged)
    return jnp.where(negative, log_lower, log_upper)
