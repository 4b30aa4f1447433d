"""Hockey-stick evaluation on a grid PLD: delta(epsilon) at many epsilons, and its inverse.

For a PLD with masses p_i at z_i = (offset + i) h and an atom m at +inf,

    delta(eps) = m + sum_{z_i > eps} p_i (1 - exp(eps - z_i)).

All quantities are built from tail sums with non-negative terms only (no cancellation):
``S_k = sum_{i>=k} p_i``, ``R_k = sum_{i>=k} p_i e^{-(i-k)h}`` and
``D_k = sum_{i>k} p_i (1 - e^{-(i-k)h})`` (delta at z_k without the atom), the last two by linear
recurrences (see :func:`_reverse_recurrence`). Between grid points, with t = z_j - eps in [0, h),
``delta(eps) = m + e^{-t} D_j + (1 - e^{-t}) S_j``: exact on the discrete PLD, O(n + len(eps)).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import (
    array_module,
    computed_once,
    cumulative_sum,
    early_exit_on_cpu,
    kernel_jit,
    map_rows,
    matmul,
    on_host,
)
from pldjax.core.pld import PLD, batched, computed_on_host
from pldjax.core.precision import float64, host_result
from pldjax.core.validation import check_range, is_traced, within

_BLOCK = 128
#: Up to this many targets, epsilon_kernel works from sums at the blocks' starts and the
#: crossing's block (:func:`_crossing_sums`) instead of S, R and D at every point.
_DIRECT_TARGETS = 4


def _powers(decay, size: int, dtype, xp=jnp):
    """The size x size matrix of decay^(i-k) at row k, column i >= k (0 below the diagonal):
    ``size`` powers, each placed along its diagonal (a power per entry would be 16,384 for a
    block of 128, in every evaluation of every row)."""
    lag = xp.arange(size)[None, :] - xp.arange(size)[:, None]  # i - k
    column = decay ** xp.arange(size).astype(dtype)
    column = computed_once(column) if xp is jnp else column
    return xp.where(lag >= 0, column[xp.maximum(lag, 0)], 0.0)


def _reverse_recurrence(decay, terms, block: int = _BLOCK):
    """x_k = terms_k + decay * x_{k+1} (x_n = 0) for all k, i.e. sum_{i>=k} decay^(i-k) terms_i.

    Blocked, with no sequential loop (on a GPU each step of one is a kernel launch): inside
    blocks of ``block`` points a product with the triangular matrix of powers of ``decay``
    (:func:`_powers`), then the same recurrence over the blocks' first points, with decay^block
    and blocks of about the square root of their number, for what later blocks contribute; at
    most ``block`` points: one triangular product. All terms are non-negative for the sums used
    here, so no digits cancel; it compiles much faster than an associative scan.
    """
    xp = array_module(terms)
    n = terms.shape[0]
    if n <= block:
        return _powers(decay, n, terms.dtype, xp) @ terms
    blocks = -(-n // block)
    padded = xp.pad(terms, (0, blocks * block - n)).reshape(blocks, block)
    inner = matmul(padded, _powers(decay, block, terms.dtype, xp).T)  # sum_{i >= k in its block}
    starts = _block_starts(decay**block, inner[:, 0])
    after = xp.concatenate([starts[1:], xp.zeros((1,), terms.dtype)])
    to_end = decay ** (block - xp.arange(block)).astype(terms.dtype)  # decay^(block end - k)
    return (inner + after[:, None] * to_end[None, :]).reshape(-1)[:n]


def _block_starts(decay, heads):
    """The reverse recurrence x_b = heads_b + decay x_{b+1} over the first points of blocks
    (``decay``: the per-point decay to the power of their length), in blocks of about the square
    root of their number (a power of two, at most _BLOCK): a few small products however many."""
    block = min(_BLOCK, 1 << max(0, math.ceil(math.log2(heads.shape[0]) / 2)))
    return _reverse_recurrence(decay, heads, block)


def _block_level_sums(probs, step):
    """S, R and D (see :func:`tail_sums`) at the first point of every block of _BLOCK points, from
    one pass over the masses: each block's mass, sum of p_i e^{-lh} and of p_i (1 - e^{-lh})
    (l: the index inside the block), then recurrences over the blocks only, with non-negative
    terms (no cancellation). Returns them (each of length blocks + 1, a trailing 0) and the
    masses in rows of _BLOCK."""
    xp = array_module(probs)
    blocks = -(-probs.shape[0] // _BLOCK)
    padded = xp.pad(probs, (0, blocks * _BLOCK - probs.shape[0])).reshape(blocks, _BLOCK)
    lag = xp.arange(_BLOCK, dtype=probs.dtype) * step
    mass, decayed, grown = matmul(
        padded, xp.stack([xp.ones_like(lag), xp.exp(-lag), -xp.expm1(-lag)], axis=1)).T
    zero = xp.zeros((1,), probs.dtype)
    decay, gain = xp.exp(-_BLOCK * step), -xp.expm1(-_BLOCK * step)
    # D_b = grown_b + D_{b+1} + (1 - e^{-Bh}) R_{b+1}: beyond the block, 1 - e^{-(i - bB)h} =
    # (1 - e^{-(i - (b+1)B)h}) + e^{-(i - (b+1)B)h} (1 - e^{-Bh})

    def blocked(mass, decayed, grown):
        r = xp.concatenate([_block_starts(decay, decayed), zero])
        return cumulative_sum(mass, reverse=True), r[:-1], cumulative_sum(grown + gain * r[1:], reverse=True)

    def sequential(mass, decayed, grown):  # one loop over the blocks: little to compile
        def back(carry, block):
            s, r, d = carry
            m, dec, gr = block
            carry = (m + s, dec + decay * r, gr + d + gain * r)
            return carry, carry

        return jax.lax.scan(back, (zero[0],) * 3, (mass, decayed, grown), reverse=True)[1]

    if xp is np:
        sums = blocked(mass, decayed, grown)
    else:  # on a CPU the loop (one row's blocks take microseconds); elsewhere no loop
        sums = early_exit_on_cpu((mass, decayed, grown), cpu=sequential, elsewhere=blocked)
    s, r, d = (xp.concatenate([a, zero]) for a in sums)
    return s, r, d, padded


def _crossing_sums(probs, inf_mass, step, deltas, scale=1.0):
    """For each target in ``deltas``: j, the number of grid points whose delta (inf_mass +
    ``scale`` D_k, non-increasing in k) is above it, at most n - 1, and S_j and R_j (see
    :func:`tail_sums`). One pass over the masses (:func:`_block_level_sums`), then inside the
    block where delta crosses the target only: O(n + len(deltas) _BLOCK^2)."""
    xp = array_module(probs)
    n = probs.shape[-1]
    s, r, d, padded = _block_level_sums(probs, step)
    blocks = padded.shape[0]
    # block b holds the crossing, where b + 1 block starts lie above the target (a count: the
    # starts' deltas do not increase, and a count compiles faster than a search)
    above_starts = xp.sum(inf_mass + d[None, :-1] * scale > deltas[:, None], axis=1)
    block = xp.clip(above_starts - 1, 0, blocks - 1)
    inside = padded[block]  # (targets, _BLOCK)
    s_next, r_next, d_next = s[block + 1], r[block + 1], d[block + 1]
    local = xp.arange(_BLOCK)
    # 1 - e^{-(i - k) h} for i > k: _BLOCK values placed along their diagonals
    lag = local[None, :] - local[:, None]  # i - k
    grown = -xp.expm1(-local.astype(probs.dtype) * step)
    grown = computed_once(grown) if xp is jnp else grown
    grown = xp.where(lag > 0, grown[xp.maximum(lag, 0)], 0.0)
    to_end = (_BLOCK - local).astype(probs.dtype) * step
    d_inside = (inside @ grown.T + d_next[:, None]
                - xp.expm1(-to_end)[None, :] * r_next[:, None])
    index = block[:, None] * _BLOCK + local[None, :]
    above = (inf_mass + d_inside * scale > deltas[:, None]) & (index < n)
    j = xp.minimum(block * _BLOCK + xp.sum(above, axis=1), n - 1)
    first = j - block * _BLOCK  # in [0, _BLOCK]: the block's points from it on are in S_j, R_j
    later = local[None, :] >= first[:, None]
    shift = (local[None, :] - first[:, None]).astype(probs.dtype) * step
    s_j = s_next + xp.sum(xp.where(later, inside, 0.0), axis=1)
    r_j = (xp.exp(-(_BLOCK - first).astype(probs.dtype) * step) * r_next
           + xp.sum(xp.where(later, inside * xp.exp(-xp.maximum(shift, 0.0)), 0.0), axis=1))
    return j, s_j, r_j


def tail_sums(probs, step, *, with_r: bool = True):
    """(S, R, D), each of length n + 1 with a trailing 0, as defined in the module docstring; R
    None unless ``with_r`` (NumPy computes whatever it is asked for)."""
    xp = array_module(probs)
    zero = xp.zeros((1,), probs.dtype)
    s = xp.concatenate([cumulative_sum(probs, reverse=True), zero])
    r = None
    if with_r:
        r = xp.concatenate([_reverse_recurrence(xp.exp(-step), probs), zero])
    # D_k = e^{-h} D_{k+1} + (1 - e^{-h}) S_{k+1}
    d = xp.concatenate([_reverse_recurrence(xp.exp(-step), -xp.expm1(-step) * s[1:]), zero])
    return s, r, d


def curve_roundoff(n):
    """Relative round-off bound of a curve read from ``n`` masses (:func:`grid_deltas`,
    :func:`delta_kernel`; an int, or an array inside a kernel): the tail sum S (a sum of n
    non-negative terms), the blocked recurrence D (one 128-term block product and n / 128
    carries) and the atom, each a few ulps per operation on its longest path, and the masses' own
    round-off; a generous 4 n + 512 ulps. Relative, so a zero tail stays zero."""
    return (4 * n + 512) * float(np.finfo(np.float64).eps)


def stored_length(probs):
    """The number of masses up to the last nonzero one (0 if none): zeros above it, such as a
    kernel's padding, add nothing to any sum, and no round-off either."""
    xp = array_module(probs)
    index = xp.arange(1, probs.shape[-1] + 1)
    return xp.max(xp.where(probs != 0, index, 0), axis=-1, initial=0)


def _finite_scale(probs, pessimistic):
    """What the finite masses' part of a curve is multiplied by: 1 + :func:`curve_roundoff` of
    the stored masses for a pessimistic PLD (an upper bound stays one), 1 - it for an
    optimistic one (``pessimistic`` a bool, or a traced one: data, so that both share one
    compiled program), 1 (the discrete PLD's own curve, to round-off) for None."""
    if pessimistic is None:
        return 1.0
    roundoff = curve_roundoff(stored_length(probs))
    return array_module(probs).where(pessimistic, 1.0 + roundoff, 1.0 - roundoff)


def grid_deltas(probs, inf_mass, step, finite_scale=1.0):
    """delta at every grid point z_k, shape (n,): non-increasing in k, at most 1. The finite
    masses' part is multiplied by ``finite_scale`` (a caller's round-off allowance; the atom at
    +inf is exact)."""
    _, _, d = tail_sums(probs, step, with_r=False)
    return array_module(probs).minimum(inf_mass + d[:-1] * finite_scale, 1.0)


def delta_kernel(probs, inf_mass, offset, step, epsilons, pessimistic: bool | None = None):
    """delta(eps) for an array of eps on one single-direction PLD: its finite part moved by
    its round-off (:func:`curve_roundoff`) up for a ``pessimistic`` PLD, down for an optimistic
    one; None: the discrete PLD's own curve (to round-off)."""
    xp = array_module(probs)
    n = probs.shape[-1]
    s, _, d = tail_sums(probs, step, with_r=False)
    u = xp.clip(epsilons / step - offset, -1.0, n + 1.0)
    j = xp.clip(xp.ceil(u), 0, n).astype(xp.int32)
    t = xp.maximum((offset + j) * step - epsilons, 0.0)
    finite = (xp.exp(-t) * d[j] - xp.expm1(-t) * s[j]) * _finite_scale(probs, pessimistic)
    finite = xp.where(j >= n, 0.0, finite)
    # in [0, 1] as every delta is: round-off in the masses (which sum to 1 only up to it) can
    # push the sum an ulp or two above 1, and 1 bounds every true delta from above
    return xp.clip(inf_mass + finite, 0.0, 1.0)


def _grid_point_rounded_up(index, step):
    """index * step rounded up to the next float64 where the product is not exact (a pessimistic
    epsilon at a grid point must not fall below the loss it stands for: 1000 * 1e20 rounds to a
    float below 1e23). The product's round-off is found exactly by Dekker's splitting."""
    product = index * step
    split = 134217729.0  # 2^27 + 1
    index_high = index * split - (index * split - index)
    step_high = step * split - (step * split - step)
    index_low, step_low = index - index_high, step - step_high
    round_off = (((index_high * step_high - product) + index_high * step_low)
                 + index_low * step_high) + index_low * step_low
    xp = array_module(product)
    return xp.where(round_off > 0, xp.nextafter(product, xp.inf), product)


#: Relative round-off charged to each term of epsilon's last steps (log, log, two differences).
_LOG_ROUNDOFF = 4.0 * float(np.finfo(np.float64).eps)


def _slack_side(slack, pessimistic):
    """``slack`` added for a pessimistic estimate, taken off for an optimistic one (``pessimistic``
    a bool or a traced one), none for None (the discrete PLD's own epsilon)."""
    if pessimistic is None:
        return 0.0
    return array_module(slack).where(pessimistic, slack, -slack)


def epsilon_kernel(probs, inf_mass, offset, step, deltas, pessimistic: bool | None = None):
    """Smallest eps >= 0 with delta(eps) <= target, on :func:`delta_kernel`'s curve (the same
    ``pessimistic``); inf if impossible."""
    xp = array_module(probs)
    n = probs.shape[-1]
    scale = _finite_scale(probs, pessimistic)
    if deltas.shape[0] <= _DIRECT_TARGETS:
        # a few targets: S, R and D at the blocks' starts, then each one's crossing block alone
        # (no pass over the whole grid per point)
        j, s_j, r_j = _crossing_sums(probs, inf_mass, step, deltas, scale)
    else:
        s, r, d = tail_sums(probs, step)
        # grid deltas > target
        j = xp.searchsorted(-(inf_mass + d[:-1] * scale), -deltas, side="left")
        j = xp.minimum(j, n - 1)
        s_j, r_j = s[j], r[j]
    z_j = _grid_point_rounded_up(offset + j, step)
    # on (z_{j-1}, z_j]: delta(z_j - t) = m + scale (S_j - e^{-t} R_j), increasing in t >= 0
    room = s_j - (deltas - inf_mass) / scale
    with np.errstate(divide="ignore", invalid="ignore"):  # NumPy: room <= 0 is handled below
        log_r, log_room = xp.log(r_j), xp.log(room)
        t = log_r - log_room
        # the logarithms' and the differences' round-off (a few ulps of each term), on the
        # estimate's side: t is a small difference of two logarithms near a crossing (epsilon
        # of R_{0.01} at delta 1e-8 read 27 ulps below the exact value)
        slack = xp.where(t > 0, _LOG_ROUNDOFF * (xp.abs(log_r) + xp.abs(log_room) + xp.abs(z_j)),
                         0.0)
    eps = xp.where(room <= 0, -xp.inf, z_j - xp.maximum(t, 0.0) + _slack_side(slack, pessimistic))
    eps = xp.maximum(eps, 0.0)
    # every mechanism is (0, 1)-DP: delta >= 1 needs no epsilon, whatever round-off left in
    # masses summing to 1 + ulp (this also keeps epsilon(delta) non-increasing up to delta = 1)
    return xp.where(deltas >= 1.0, 0.0, xp.where(inf_mass > deltas, xp.inf, eps))


_delta_jit = kernel_jit(delta_kernel)
_epsilon_jit = kernel_jit(epsilon_kernel)


def padded_to_a_power_of_two(array, axis: int, fill):
    """``array`` extended along ``axis`` to a power-of-two length with ``fill`` ("last": copies of
    its last entry), so that the sizes a kernel is called with come from a short ladder (each new
    shape is a new compiled program). In NumPy: an array in host memory comes back as one (no
    copy where no padding is needed); one on an accelerator stays there when already of such a
    length (or empty), and is copied to the host only to be padded."""
    if on_host(array):
        array = np.asarray(array)
    length = array.shape[axis]
    extra = grid_lib.next_pow2(length) - length
    if extra == 0 or length == 0:
        return array
    array = np.asarray(array)
    if fill == "last":
        return np.concatenate([array, np.repeat(np.take(array, [-1], axis), extra, axis)], axis)
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, extra)
    return np.pad(array, widths, constant_values=fill)


def per_direction(pld: PLD, values, kernel, combine: str = "maximum",
                  host_kernel: Callable | None = None) -> jax.Array:
    """``kernel(probs, inf_mass, offset, step, flat_values)`` over the PLD's batch axes for each
    direction, combined across directions (the worse one by default); shape batch + values.

    On concrete PLDs the kernel sees power-of-two shapes only (a few compiled programs for every
    PLD): the masses padded with zero masses above the window (which add nothing to any of the
    kernels' sums), the values and the flattened batch rows with repeats, cut off again after.
    Inside a trace the shapes are the caller's. ``host_kernel``: the same function for NumPy
    arrays, run instead where :func:`~pldjax.core.pld.computed_on_host` says (no program to
    compile)."""
    if (host_kernel is not None and not is_traced(values)  # (a concrete PLD read under jit)
            and computed_on_host([pld], pld.size)):
        return host_result(_per_direction_on_host(pld, values, host_kernel, combine))
    if is_traced((pld, values)):
        values = jnp.asarray(values, jnp.float64)
        flat = values.reshape(-1)
        result = None
        for direction in pld.directions():
            fn = batched(lambda p, m, o, h: kernel(p, m, o, h, flat), len(direction.batch_shape))
            out = fn(direction.probs, direction.inf_mass, direction.offset, direction.step)
            result = out if result is None else getattr(jnp, combine)(result, out)
        return host_result(result.reshape(pld.batch_shape + values.shape))
    values = np.asarray(values, np.float64)
    flat = padded_to_a_power_of_two(values.reshape(-1), 0, "last")
    rows = math.prod(pld.batch_shape)
    result = None
    for direction in pld.directions():
        probs = padded_to_a_power_of_two(direction.probs, -1, 0.0)
        scalars = [np.broadcast_to(np.asarray(a), pld.batch_shape)
                   for a in (direction.inf_mass, direction.offset, direction.step)]
        if pld.batch_shape:
            probs = padded_to_a_power_of_two(probs.reshape(rows, -1), 0, "last")
            scalars = [padded_to_a_power_of_two(a.reshape(rows), 0, "last") for a in scalars]
            out = jax.vmap(lambda p, m, o, h: kernel(p, m, o, h, flat))(probs, *scalars)
            out = np.asarray(out)[:rows]
        else:
            out = np.asarray(kernel(probs, *scalars, flat))
        out = out[..., :values.size]
        result = out if result is None else getattr(np, combine)(result, out)
    return host_result(result.reshape(pld.batch_shape + values.shape))


def _per_direction_on_host(pld: PLD, values, kernel, combine: str) -> np.ndarray:
    """:func:`per_direction` in NumPy, row by row, on the PLD's own shapes."""
    values = np.asarray(values, np.float64)
    flat = values.reshape(-1)
    result = None
    for direction in pld.directions():
        shape = direction.batch_shape
        probs = np.asarray(direction.probs, np.float64).reshape((-1, direction.size))
        scalars = [np.broadcast_to(np.asarray(a), shape).reshape(-1)
                   for a in (direction.inf_mass, direction.offset, direction.step)]
        with np.errstate(all="ignore"):  # the kernels' masked branches, as under jit
            out = map_rows(lambda p, m, o, h: kernel(p, m, o, h, flat))(probs, *scalars)
        result = out if result is None else getattr(np, combine)(result, out)
    return result.reshape(pld.batch_shape + values.shape)


@float64
def delta(pld: PLD, epsilon) -> jax.Array:
    """delta(epsilon) of ``pld`` (see :meth:`PLD.delta`)."""
    check_range("epsilon", epsilon, 0.0, allow_inf=True)
    read = per_direction(pld, epsilon,
                         functools.partial(_delta_jit, pessimistic=pld.pessimistic),
                         host_kernel=functools.partial(delta_kernel, pessimistic=pld.pessimistic))
    return read_or_nothing(read, epsilon, 1.0 if pld.pessimistic else 0.0, low=0.0,
                           allow_inf=True)


@float64
def epsilon(pld: PLD, delta) -> jax.Array:
    """epsilon(delta) of ``pld`` (see :meth:`PLD.epsilon`)."""
    check_range("delta", delta, 0.0, 1.0)
    read = per_direction(pld, delta,
                         functools.partial(_epsilon_jit, pessimistic=pld.pessimistic),
                         host_kernel=functools.partial(epsilon_kernel,
                                                       pessimistic=pld.pessimistic))
    return read_or_nothing(read, delta, np.inf if pld.pessimistic else 0.0, low=0.0, high=1.0)


def read_or_nothing(read, values, nothing: float, **bounds) -> jax.Array:
    """``read`` (batch + the shape of ``values``) where ``values`` lie in their range (``bounds``
    as :func:`~pldjax.core.validation.within`'s), elsewhere ``nothing``, the reading that claims
    nothing: under jit an invalid value cannot raise (see :mod:`pldjax.core.validation`), and its
    reading would be NaN or a number out of range. Concrete values were checked already."""
    if not is_traced(values):
        return read
    return host_result(jnp.where(within(values, **bounds), read, nothing))
