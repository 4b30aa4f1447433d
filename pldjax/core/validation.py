"""Argument checks shared by the public API: clear ValueErrors, nothing clamped silently.

Checks run on concrete values: a bad value raises a ValueError naming the argument and its
allowed range. Under ``jit`` or ``vmap`` the values are tracers, which cannot raise; for them the
rule is that **a result built from invalid traced input claims nothing**. :func:`within` is the
traced counterpart of :func:`check_range` (the same ranges, as a boolean array), and where it is
False the result is the one that promises nothing:

* a pessimistic PLD (an upper bound) has all of its mass in the atom at +inf: delta = 1 at
  every epsilon and epsilon = inf at every delta < 1;
* an optimistic PLD (a lower bound) is the identity, all of its mass at loss 0: delta(eps) =
  max(0, 1 - e^eps), below every privacy curve;
* filters and odometers reject the step and keep their state.

Never a value that looks like a guarantee, and never NaN; each element of a batch (an array of
parameters, or ``vmap``) is judged on its own. Mechanisms apply it once, where a record's
parameters become a PLD (:func:`pldjax.mechanisms.events.privacy_loss`, with
:meth:`pldjax.core.pld.PLD.where_valid`).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np


def is_traced(x) -> bool:
    """True for values that are JAX tracers (inside jit / vmap / grad)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def refuse_traced(function: str, values, inside_jit: str,
                  why: str = "picks its grids from the values") -> None:
    """Raise a ValueError naming ``function`` when any of ``values`` is traced: ``function``
    needs them on the host (``why``: by default, it picks its grids, shapes, from them), so it
    cannot run under jit or vmap; ``inside_jit`` says what to do instead."""
    if is_traced(values):
        raise ValueError(f"{function} {why} and cannot run under jit or vmap; {inside_jit}")


#: The smallest noise multiplier (the noise's standard deviation over the sensitivity) of the
#: computations that draw or bound a step's privacy loss from it directly (Monte Carlo, the
#: shuffling lower bound): the loss, about 1 / (2 sigma^2) nats, then stays far inside float64's
#: range (below about 1.5e-154 it overflows, and what is built from it no longer holds).
SMALLEST_NOISE_MULTIPLIER = 1e-100


def check_noise_multiplier(value, name: str = "noise_multiplier") -> None:
    """Raise a ValueError naming ``name`` unless ``value`` (one number) is finite and at least
    SMALLEST_NOISE_MULTIPLIER."""
    if isinstance(value, numbers.Real) and 0 < value < SMALLEST_NOISE_MULTIPLIER:
        raise ValueError(f"{name} must be at least {SMALLEST_NOISE_MULTIPLIER:g} (a step's privacy "
                         f"loss, about 1 / (2 {name}^2) nats, overflows float64 below about "
                         f"1.5e-154), got {float(value):g}")
    check_range(name, value, SMALLEST_NOISE_MULTIPLIER)


def check_single(function: str, name: str, value) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is one concrete number: ``function``
    reads it on the host (so it cannot run under jit or vmap) and takes one configuration a
    call. Its range is :func:`check_range`'s to check."""
    refuse_traced(function, value, "call it with concrete values", f"reads {name} on the host")
    if np.ndim(value) != 0:
        raise ValueError(f"{name} must be a single number (one configuration a call), got an "
                         f"array of shape {np.shape(value)}")


def check_range(
    name: str,
    value,
    low: float = -np.inf,
    high: float = np.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> None:
    """Raise ValueError unless every element of ``value`` lies in the stated interval (no NaN)."""
    # the common case first, without arrays (NaN fails every comparison)
    if type(value) is float or (type(value) is int and abs(value) < 2**1023):
        if ((value > low if low_open else value >= low)
                and (value < high if high_open else value <= high)
                and (allow_inf or math.isfinite(value))):
            return
    elif is_traced(value):
        return
    lo_b = "(" if low_open or low == -np.inf else "["
    hi_b = ")" if high_open or high == np.inf else "]"
    allowed = f"{lo_b}{low}, {high}{hi_b}"
    # strings, booleans, complex numbers and None are refused, not converted (an array's dtype
    # is read without converting it)
    if isinstance(value, numbers.Real):
        kind = "b" if isinstance(value, (bool, np.bool_)) else "f"
    else:
        dtype = getattr(value, "dtype", None)
        kind = np.dtype(np.asarray(value).dtype if dtype is None else dtype).kind
    if kind not in "iuf":
        raise ValueError(f"{name} must be a real number in {allowed}, got {value!r}")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except OverflowError:
        raise ValueError(f"{name} must be a number in {allowed}, got {value!r} (beyond float64)"
                         ) from None
    if np.any(np.isnan(arr)):
        raise ValueError(f"{name} must be a number in {allowed}, got NaN")
    if not allow_inf and np.any(np.isinf(arr)):
        raise ValueError(f"{name} must be finite and in {allowed}, got {value!r}")
    bad = (arr <= low) if low_open else (arr < low)
    bad |= (arr >= high) if high_open else (arr > high)
    if np.any(bad):
        shown = arr[bad].ravel()[0] if arr.ndim else arr
        raise ValueError(f"{name} must lie in {allowed}, got {float(shown)!r}")


def check_flag(name: str, value) -> bool:
    """``value`` as a bool where it is True or False (a NumPy bool too); else ValueError naming
    ``name``: a string, None or a number is not read as one ("no" is truthy)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def check_count(name: str, value, *, minimum: int = 0) -> int:
    """An integer count >= ``minimum`` (a Python int, a NumPy integer, a whole float, or a
    concrete 0-d NumPy or JAX array of one), as a Python int; else ValueError."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    dtype = getattr(value, "dtype", None)
    if (dtype is not None and not isinstance(value, numbers.Number) and np.ndim(value) == 0
            and not is_traced(value) and np.dtype(dtype).kind in "iuf"):
        value = np.asarray(value).item()  # a 0-d array (an Event's parameters become arrays)
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def check_whole(name: str, value, minimum: float = 0.0) -> None:
    """Raise a ValueError naming ``name`` unless every element of ``value`` (a number or an array,
    concrete) is a whole number >= ``minimum`` (an integer, or a float with no fractional part)."""
    check_range(name, value, minimum)
    values = np.asarray(value, np.float64)
    if np.any(values != np.floor(values)):
        raise ValueError(f"{name} must be whole numbers >= {minimum:g}, got {value!r}")


def check_broadcast(**arguments) -> tuple[int, ...]:
    """The broadcast shape of the ``arguments`` (by name: numbers, sequences or arrays); a
    ValueError naming each one's shape where they do not broadcast."""
    shapes = {name: np.shape(value) for name, value in arguments.items()}
    try:
        return np.broadcast_shapes(*shapes.values())
    except ValueError:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"the arguments must broadcast to one shape; got {listed}") from None


def broadcast_arguments(**arguments) -> list[np.ndarray]:
    """The ``arguments`` (by name) as float64 NumPy arrays of their broadcast shape
    (:func:`check_broadcast`)."""
    shape = check_broadcast(**arguments)
    return [np.broadcast_to(np.asarray(value, np.float64), shape) for value in arguments.values()]


def within(
    value,
    low: float = -np.inf,
    high: float = np.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
    integer: bool = False,
):
    """Elementwise, whether ``value`` passes :func:`check_range` with the same arguments (and, with
    ``integer``, is a whole number): a boolean JAX array, for traced values that cannot raise.
    NaN, inf (unless ``allow_inf``), complex and boolean values are outside every range."""
    dtype = getattr(value, "dtype", None)
    kind = np.dtype(np.asarray(value).dtype if dtype is None else dtype).kind
    if kind not in "iuf":
        return jnp.zeros(np.shape(value), bool)
    x = jnp.asarray(value, jnp.float64)
    ok = (x > low) if low_open else (x >= low)  # False for NaN
    ok &= (x < high) if high_open else (x <= high)
    if not allow_inf:
        ok &= jnp.isfinite(x)
    if integer:
        ok &= jnp.where(jnp.isfinite(x), x % 1 == 0, False)
    return ok
