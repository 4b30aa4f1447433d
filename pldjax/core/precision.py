"""Float64 everywhere: every public entry point runs inside ``jax.enable_x64(True)``.

Guarantees are never computed in float32, whatever the user's ``jax_enable_x64`` setting: the
decorator below switches 64-bit mode on for the duration of the call (JAX >= 0.10 provides the
context manager), so results are bit-identical with the flag on or off.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import array_module

F = TypeVar("F", bound=Callable)


def float64(fn: F) -> F:
    """Run ``fn`` with 64-bit JAX types enabled."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def host_result(x):
    """Concrete results leave as NumPy values (safe for arithmetic with x64 off): a NumPy scalar
    for one value (a float64 is a Python float), an array for several; traced stay."""
    if isinstance(x, jax.core.Tracer):
        return x
    return np.asarray(x)[()]


_SIGN = np.int64(-(2**63))
_MAGNITUDE = np.int64(2**63 - 1)
FLOAT_MAX = float(np.finfo(np.float64).max)


def _bitcast(x, dtype, xp):
    """The bits of ``x`` read as ``dtype`` (64 bits to 64 bits)."""
    if xp is np:
        return np.asarray(x).view(dtype)
    return jax.lax.bitcast_convert_type(x, dtype)


def _ordered(x, xp=jnp):
    """float64 -> int64 in the same order (-0.0 and +0.0 both 0)."""
    bits = _bitcast(x, np.int64, xp)
    return xp.where(bits >= 0, bits, -(bits & _MAGNITUDE))


def _unordered(key, xp=jnp):
    """The inverse of :func:`_ordered`."""
    bits = xp.where(key >= 0, key, (-key) | _SIGN)
    return _bitcast(bits, np.float64, xp)


def last_float_before(rises: Callable, shape, xp=jnp) -> jax.Array:
    """The largest float64 x in [-FLOAT_MAX, FLOAT_MAX] with ``rises(x)`` False, for a predicate
    that is False below some point and True from it on (elementwise, an array of ``shape``):
    64 halvings of the floats' ordered bit patterns, which reach adjacent floats whatever the
    range. -FLOAT_MAX where ``rises`` is True everywhere; FLOAT_MAX where it is never True (both
    ends are taken as they are, never evaluated). A traceable jnp function, or with ``xp``
    NumPy a NumPy one (the same halvings)."""
    lo = xp.broadcast_to(_ordered(xp.asarray(-FLOAT_MAX), xp), shape)
    hi = xp.broadcast_to(_ordered(xp.asarray(FLOAT_MAX), xp), shape)

    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2) without overflow
        up = rises(_unordered(mid, xp))
        return xp.where(up, lo, mid), xp.where(up, mid, hi)

    if xp is np:
        bounds = (lo, hi)
        for i in range(64):
            bounds = halve(i, bounds)
        return _unordered(bounds[0], xp)
    lo, _ = jax.lax.fori_loop(0, 64, halve, (lo, hi))
    return _unordered(lo)


def add_up(a, b):
    """a + b rounded up: the float sum, moved one ulp up when it fell below the exact sum (the
    two-sum error term is positive). Exact sums stay exact, so budgets spent in representable
    steps are counted exactly and every other running total is an upper bound."""
    total = a + b
    b_part = total - a
    error = (a - (total - b_part)) + (b - b_part)
    xp = array_module(a, b)
    return xp.where(error > 0, xp.nextafter(total, np.inf), total)


def _split(x):
    """Veltkamp's split of ``x``: (high, low) with high + low = x, each on half the mantissa, so
    that products of halves are exact (inf or NaN beyond 2^996, where 2^27 x overflows)."""
    scaled = 134217729.0 * x  # 2^27 + 1
    high = scaled - (scaled - x)
    return high, x - high


#: Products below this may have a subnormal rounding error (it is a multiple of 2^-104 of the
#: product, from the halves' products), which XLA flushes to 0 and NumPy rounds: there
#: :func:`_two_product`'s error term is not trusted.
_SMALLEST_EXACT_PRODUCT = 1e-270


def _two_product(x, y):
    """(p, e): p the float product x y and e its rounding error, p + e = x y exactly (Dekker),
    while |p| >= _SMALLEST_EXACT_PRODUCT and the splits are finite."""
    product = x * y
    (x_high, x_low), (y_high, y_low) = _split(x), _split(y)
    error = ((x_high * y_high - product) + x_high * y_low + x_low * y_high) + x_low * y_low
    return product, error


def square_up(x):
    """x^2 rounded up: the float product, moved one ulp up when it fell below the exact square
    (Dekker's two-product error term is positive). Exact squares stay exact, except below 1e-270,
    where the error term may be subnormal and the product is moved up anyway; a square below the
    smallest normal float is charged that normal; only x = 0 gives 0."""
    xp = array_module(x)
    x = xp.asarray(x, xp.float64)
    square, error = _two_product(x, x)
    tiny = float(np.finfo(np.float64).tiny)
    up = xp.where(error > 0, xp.nextafter(square, np.inf), square)
    # beyond 2^996 the split overflows, and small squares' error terms may be subnormal: the
    # product alone is then moved up
    trusted = xp.isfinite(error) & (square >= _SMALLEST_EXACT_PRODUCT)
    up = xp.where(trusted, up, xp.nextafter(square, np.inf))
    return xp.where(x == 0, 0.0, xp.where(square < tiny, tiny, up))


def quotient_rounded(a, b, up: bool):
    """a / b for a >= 0 and b > 0 (float64), rounded ``up`` or down: the float quotient, moved one
    ulp where it fell on the wrong side of the exact one (Dekker's two-product of it and b,
    against a; a less that product is exact, the two being within a factor of 2). Exact
    quotients stay exact; where the product is below 1e-270, a factor below 1e-290 or the split
    overflows, the quotient is moved anyway; one below the smallest normal float becomes that
    normal (up) or 0 (down), as :func:`square_up` charges a tiny square. Subnormal inputs are
    excepted: XLA reads them as 0."""
    xp = array_module(a, b)
    a, b = xp.asarray(a, xp.float64), xp.asarray(b, xp.float64)
    with np.errstate(all="ignore"):  # NumPy: a quotient or split beyond float64 is handled below
        quotient = a / b
        product, error = _two_product(quotient, b)
        residual = (a - product) - error  # a - quotient b: > 0 where the quotient is too small
    # (a factor below 1e-290 has a subnormal ulp: its split's low half is inexact too)
    trusted = (xp.isfinite(residual) & (xp.abs(product) >= _SMALLEST_EXACT_PRODUCT)
               & (quotient > 1e-290) & (b > 1e-290))
    wrong = (residual > 0) if up else (residual < 0)
    moved = xp.nextafter(quotient, np.inf if up else 0.0)
    # an underflow to 0 moves up, an overflow to inf down; a quotient of 0 by 0 or inf is exact
    movable = (quotient < np.inf) if up else (quotient > 0)
    movable = movable & (a > 0) & (b < np.inf)
    rounded = xp.where(movable & (wrong | ~trusted), moved, quotient)
    # below the smallest normal float, which XLA may flush to 0: that normal, or 0
    tiny = float(np.finfo(np.float64).tiny)
    return xp.where(movable & (quotient < tiny), tiny if up else 0.0, rounded)


def square_down(x: float) -> float:
    """x^2 rounded down, exactly (on the host: a budget that a running total rounded up is
    compared with)."""
    square = float(x) * float(x)
    if Fraction(square) > Fraction(float(x)) ** 2:
        square = float(np.nextafter(square, 0.0))
    return square


# -- 64-bit values that survive any jit boundary ----------------------------------------------------
# With x64 off, a caller's jax.jit turns float64/int64 arguments into float32/int32 before pldjax
# code runs, and restored arrays come back in 32 bits. State leaves that hold 64-bit quantities
# are therefore stored as their exact bits, a trailing axis of two uint32 words: uint32 crosses
# every boundary (jit, vmap, save/load) unchanged whatever the x64 flag.
_WIDE = (np.dtype(np.float64), np.dtype(np.int64))


def _words(host: np.ndarray) -> np.ndarray:
    """A float64 / int64 NumPy array as its uint32 words, shape ``(..., 2)``, the low word first
    (the order of ``jax.lax.bitcast_convert_type``)."""
    little = np.ascontiguousarray(host, host.dtype.newbyteorder("<"))
    return little.reshape(host.shape + (1,)).view("<u4").astype(np.uint32)


def _from_words(words: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Inverse of :func:`_words`: uint32 words ``(..., 2)`` as a ``dtype`` (64-bit) array."""
    little = np.ascontiguousarray(words, "<u4")
    return little.view(dtype.newbyteorder("<")).reshape(words.shape[:-1]).astype(dtype)


def pack(tree):
    """Every float64 / int64 leaf of ``tree`` as uint32 bit pairs (shape ``(..., 2)``); other
    leaves unchanged. Exact; call with x64 enabled. Concrete leaves are packed on the host
    (NumPy, then placed on the device: no compiled program), traced ones in the trace."""
    def one(leaf):
        if not isinstance(leaf, jax.core.Tracer):
            host = np.asarray(leaf)
            if host.dtype in _WIDE:
                return jax.device_put(_words(host))
            return leaf if isinstance(leaf, jax.Array) else jax.device_put(host)
        leaf = jnp.asarray(leaf)
        if leaf.dtype in _WIDE:
            return jax.lax.bitcast_convert_type(leaf, jnp.uint32)
        return leaf

    return jax.tree_util.tree_map(one, tree)


def unpack(tree, like, *, host: bool = False):
    """Inverse of :func:`pack`: leaves of ``like`` (arrays or ShapeDtypeStructs, the unpacked
    structure) give each leaf's 64-bit dtype. Call with x64 enabled. Concrete leaves are unpacked
    on the host (NumPy: no compiled program) and placed on the device, or, with ``host``, left
    as NumPy arrays (for readings computed on the host)."""
    def one(leaf, spec):
        dtype = np.dtype(spec.dtype)
        if not isinstance(leaf, jax.core.Tracer):
            value = np.asarray(leaf)
            if dtype in _WIDE:
                _check_packed(value)
                value = _from_words(value, dtype)
            elif isinstance(leaf, jax.Array) and not host:
                return leaf
            return value if host else jax.device_put(value)
        leaf = jnp.asarray(leaf)
        if dtype in _WIDE:
            _check_packed(leaf)
            return jax.lax.bitcast_convert_type(leaf, dtype)
        return leaf

    return jax.tree_util.tree_map(one, tree, like)


def _check_packed(leaf) -> None:
    if leaf.dtype != np.uint32 or leaf.shape[-1:] != (2,):
        raise ValueError(f"a packed state leaf must be uint32 of shape (..., 2), got "
                         f"{leaf.dtype} {leaf.shape}: pass the state the filter returned")


def upper_of_rounded(x):
    """A float64 upper bound on every real number that rounds to ``x`` in its own dtype.

    Float64 values are returned as they are, integers as float64 (one step up from 2^53, where the
    conversion may round down). A float32 / float16 / bfloat16 value, e.g. a Python float that a
    caller's jit with x64 off rounded to float32, cannot be recovered; the largest real that rounds
    to it is x plus half its ulp (toward +inf), exact in float64, and is what a sound budget must
    charge. A value of a complex, boolean (or other non-real) dtype is no real number: NaN, which
    every cost check refuses (an imaginary part was silently dropped, and 0.5j charged 0; True
    charged 1). Call with
    x64 enabled. Concrete values are computed on the host (a NumPy float64 array: no compiled
    program), traced ones in the trace."""
    xp = jnp if isinstance(x, jax.core.Tracer) else np
    x = xp.asarray(x)
    if x.dtype == np.float64:
        return x
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        return xp.full(x.shape, np.nan, np.float64)
    if not jnp.issubdtype(x.dtype, jnp.floating):  # integers above 2^53 may round down
        wide = x.astype(np.float64)
        return xp.where(xp.abs(wide) >= 2.0**53, xp.nextafter(wide, np.inf), wide)
    info = jnp.finfo(x.dtype)
    wide = x.astype(np.float64)
    _, exponent = xp.frexp(wide)  # |x| in [2^(e-1), 2^e): the ulp above |x| is 2^(e-1-nmant)
    half = xp.ldexp(xp.ones_like(wide), exponent - info.nmant - 2)
    top = xp.where(wide == float(info.max), np.inf, wide + half)  # above max rounds to inf
    # subnormals (which the conversion may flush to zero) and zero: below the smallest normal
    top = xp.where(xp.abs(wide) < float(info.tiny), float(info.tiny), top)
    return xp.where(xp.isfinite(wide), top, wide)


def lower_of_rounded(x):
    """A float64 lower bound on every real number that rounds to ``x`` (see
    :func:`upper_of_rounded`)."""
    x = (jnp if isinstance(x, jax.core.Tracer) else np).asarray(x)
    return -upper_of_rounded(-x)


def root_of_difference_down(mu, nu):
    """sqrt(mu^2 - nu^2) for 0 <= nu <= mu, rounded down: the float computation
    sqrt((mu - nu)(mu + nu)) is within 2 ulps of the exact value (three roundings of relative
    size <= 2^-53 each under the root, halved by it, plus the root's own), so two steps toward 0
    put it below. It runs on mu and nu scaled by the power of two that brings mu into [1/2, 1)
    (exact), so that the product neither underflows (mu = 1e-300 read 0) nor loses bits as a
    subnormal. mu itself where nu = 0 (a free query keeps the budget it had, to the bit); 0
    where nu >= mu."""
    xp = array_module(mu, nu)
    mu, nu = xp.asarray(mu, xp.float64), xp.asarray(nu, xp.float64)
    exponent = xp.frexp(mu)[1]
    m, n = xp.ldexp(mu, -exponent), xp.ldexp(nu, -exponent)
    root = xp.sqrt(xp.maximum((m - n) * (m + n), 0.0))
    root = xp.ldexp(xp.nextafter(xp.nextafter(root, 0.0), 0.0), exponent)
    # scaled back into the subnormals it was rounded (to nearest): one more step down
    root = xp.where(root < np.finfo(np.float64).tiny, xp.nextafter(root, 0.0), root)
    return xp.where(nu == 0, mu, xp.maximum(root, 0.0))


def six_digits(value: float, up: bool) -> str:
    """``value`` to six significant digits, rounded up (``up``: an upper bound printed stays one)
    or down (a lower bound), from its exact binary value."""
    if not math.isfinite(value) or value == 0:
        return f"{value:.6g}"
    exact = decimal.Decimal(value)
    unit = decimal.Decimal(1).scaleb(exact.adjusted() - 5)
    rounded = exact.quantize(unit, rounding=decimal.ROUND_CEILING if up else decimal.ROUND_FLOOR)
    text = f"{float(rounded):.6g}"  # as Python prints floats; the same digits,
    return text if decimal.Decimal(text) == rounded else str(rounded)  # but for subnormals
