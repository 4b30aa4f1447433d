"""Float64 everywhere: every public entry point runs inside ``jax.enable_x64(True)``.

Guarantees are never computed in float32, whatever the user's ``jax_enable_x64`` setting: the
decorator below switches 64-bit mode on for the duration of the call (JAX >= 0.10 provides the
context manager), so results are bit-identical with the flag on or off.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np

F = TypeVar("F", bound=Callable)


def float64(fn: F) -> F:
    """Run ``fn`` with 64-bit JAX types enabled."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def host_result(x):
    """Concrete results leave as NumPy float64 (safe for arithmetic with x64 off); traced stay."""
    if isinstance(x, jax.core.Tracer):
        return x
    return np.asarray(x)


def add_up(a, b):
    """a + b rounded up: the float sum, moved one ulp up when it fell below the exact sum (the
    two-sum error term is positive). Exact sums stay exact, so budgets spent in representable
    steps are counted exactly and every other running total is an upper bound."""
    total = a + b
    b_part = total - a
    error = (a - (total - b_part)) + (b - b_part)
    return jnp.where(error > 0, jnp.nextafter(total, jnp.inf), total)
