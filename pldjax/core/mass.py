"""Mass bookkeeping on a grid PMF: where mass that is surplus, missing or misplaced goes.

The safe side: a pessimistic PLD takes surplus mass from its lowest losses and puts missing mass
in the atom at +inf (each only raises delta(eps) at eps above the affected bins); an optimistic
PLD takes surplus from its highest losses and puts missing mass at its lowest (each only lowers
delta(eps) above the window's bottom).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import cumulative_sum

#: Elements summed in one pass of :func:`exact_sum`: its per-exponent sums of integers below 2^27
#: stay below 2^52, where float64 holds them exactly.
_EXACT_CHUNK = 2**25


def exact_sum(values) -> float:
    """The sum of the float64 ``values`` rounded once, to nearest (``math.fsum``'s value), in a few
    NumPy passes instead of fsum's loop (9x faster on two million masses). Each finite value is
    an integer mantissa m (|m| < 2^53) times 2^e; the mantissas' top 27 and bottom 26 bits are
    summed per exponent (exactly: float64 holds those integer sums), and the few thousand sums
    at most are added as Python integers, on the lowest exponent seen. Non-finite values:
    fsum's answer."""
    values = np.asarray(values, np.float64).ravel()
    if not np.isfinite(values).all():
        return math.fsum(values)
    total, lowest = 0, 0
    for begin in range(0, values.shape[0], _EXACT_CHUNK):
        fraction, exponent = np.frexp(values[begin:begin + _EXACT_CHUNK])
        # values = (high 2^26 + low) 2^(exponent - 53), high and low integers (every step exact)
        scaled = fraction * 2.0**27
        top = np.floor(scaled)
        base = int(exponent.min(initial=0))  # <= 0: lowest stays <= 0
        at = exponent - base
        high = np.bincount(at, weights=top)
        low = np.bincount(at, weights=(scaled - top) * 2.0**26)
        chunk = sum((int(h) << 26) + int(lo) << shift
                    for shift, (h, lo) in enumerate(zip(high, low, strict=True)) if h or lo)
        if base < lowest:
            total, lowest = total << (lowest - base), base
        total += chunk << (base - lowest)
    return total / 2 ** (53 - lowest)  # Python's integer division rounds once, to nearest


#: Bins a block of :func:`take_from_bottom` and :func:`take_from_top` inside a kernel.
_TAKEN_BLOCK = 128


def take_from_bottom(probs, amount, xp=jnp):
    """``probs`` (masses, >= 0) less ``amount`` of mass taken from its lowest bins (never below
    zero); ``xp``: jax.numpy, or NumPy for host arrays.

    Inside a kernel, on a multiple of _TAKEN_BLOCK bins, in blocks: every bin of the blocks whose
    mass up to their end is at most the amount is emptied, those of the blocks above are kept,
    and only the block in between takes part of its mass bin by bin (a running sum over the
    whole row was a tenth of a composition's time, for an amount that is mostly round-off)."""
    if xp is np:
        return _take_from_bottom_on_host(probs, amount)
    return _taken_in_blocks(probs, amount, from_top=False)


def _taken_in_blocks(probs, amount, *, from_top: bool):
    """:func:`take_from_bottom`, or with ``from_top`` :func:`take_from_top`, inside a kernel."""
    size = probs.shape[0]
    if size % _TAKEN_BLOCK:
        if from_top:
            return _taken_bin_by_bin(probs[::-1], amount, 0.0)[::-1]
        return _taken_bin_by_bin(probs, amount, 0.0)
    blocks = probs.reshape(-1, _TAKEN_BLOCK)
    count = blocks.shape[0]
    # the mass from the taken end through each block: monotone, the masses are >= 0
    through = cumulative_sum(jnp.sum(blocks, axis=1), reverse=from_top)
    crossing = jnp.sum(through <= amount)  # blocks emptied, from the taken end
    distance = jnp.arange(count)  # of each block from the taken end, in blocks
    if from_top:
        distance = count - 1 - distance
    part = jnp.clip(count - 1 - crossing if from_top else crossing, 0, count - 1)
    beyond = part + 1 if from_top else part - 1  # the block before it on the taken side
    before = jnp.where((beyond >= 0) & (beyond < count),
                       through[jnp.clip(beyond, 0, count - 1)], 0.0)
    row = jax.lax.dynamic_index_in_dim(blocks, part, keepdims=False)
    partial = (_taken_bin_by_bin(row[::-1], amount, before)[::-1] if from_top
               else _taken_bin_by_bin(row, amount, before))
    return jnp.where(distance[:, None] < crossing, 0.0,
                     jnp.where(distance[:, None] == crossing, partial[None, :],
                               blocks)).reshape(size)


def _taken_bin_by_bin(probs, amount, below_first):
    """``probs`` less ``amount`` taken from its lowest bins, with ``below_first`` of mass below
    its first bin, inside a kernel."""
    below = below_first + cumulative_sum(probs) - probs
    return probs - jnp.minimum(jnp.maximum(amount - below, 0.0), probs)


#: Bins of a first try of :func:`_take_from_bottom_on_host`.
_FIRST_REACH = 1024


def _take_from_bottom_on_host(probs, amount, in_place: bool = False):
    """:func:`take_from_bottom` in NumPy, computed on the lowest bins alone, as many as hold
    twice the amount (a settle's amount is round-off: a few bins of a window of 10^5): the
    bins beyond keep their mass (a running sum is the same on a prefix, and beyond it the mass
    below a bin is at least the amount, with a margin far above round-off), so the values are
    those of the whole array's computation. Only the bins with less than the amount below them
    change; ``in_place``: in ``probs`` itself (a caller's own array)."""
    reach = _FIRST_REACH
    while True:
        head = probs[:reach]
        below = np.cumsum(head) - head
        if reach >= probs.shape[0] or below[-1] >= 2.0 * amount:
            break
        reach *= 8
    taken = probs if in_place else probs.copy()
    short = np.flatnonzero(below < amount)  # the bins that give mass
    changed = short[-1] + 1 if short.size else 0
    head, below = head[:changed], below[:changed]
    taken[:changed] = head - np.minimum(np.maximum(amount - below, 0.0), head)
    return taken


def take_from_top(probs, amount, xp=jnp):
    """``probs`` less ``amount`` of mass taken from its highest bins (never below zero)."""
    if xp is np:
        return _take_from_bottom_on_host(probs[::-1], amount)[::-1]
    return _taken_in_blocks(probs, amount, from_top=True)


def settle(probs, inf_mass, per_bin, tail_slack, pessimistic, xp=jnp):
    """Account for misplaced mass on the safe side and restore total mass 1.

    ``per_bin``: bound on each bin's round-off error; ``tail_slack``: bound on mass folded or
    truncated into the window from outside it. ``pessimistic``: a bool, or a traced one (data, so
    that a kernel compiles once for both estimates: a conditional, of which only one side runs
    where the flag is the same for a whole vmapped batch). ``xp``: jax.numpy, or NumPy for host
    arrays (with a bool flag).
    """
    if isinstance(pessimistic, (bool, np.bool_)):
        return (_settle_pessimistic if pessimistic else _settle_optimistic)(
            probs, inf_mass, per_bin, tail_slack, xp)
    return jax.lax.cond(pessimistic, _settle_pessimistic, _settle_optimistic, probs,
                        jnp.asarray(inf_mass, probs.dtype), per_bin, tail_slack)


def _settle_pessimistic(probs, inf_mass, per_bin, tail_slack, xp=jnp):
    probs = probs + per_bin
    inf_mass = xp.minimum(inf_mass + tail_slack, 1.0)
    excess = xp.sum(probs) + inf_mass - 1.0
    if xp is np:  # probs is this function's own array
        probs = _take_from_bottom_on_host(probs, np.maximum(excess, 0.0), in_place=True)
    else:
        probs = take_from_bottom(probs, xp.maximum(excess, 0.0), xp)
    return probs, inf_mass - xp.minimum(excess, 0.0)


def _settle_optimistic(probs, inf_mass, per_bin, tail_slack, xp=jnp):
    probs = take_from_top(xp.maximum(probs - per_bin, 0.0), tail_slack, xp)
    excess = xp.sum(probs) + inf_mass - 1.0
    probs = take_from_top(probs, xp.maximum(excess, 0.0), xp)
    return xp.concatenate([probs[:1] + xp.maximum(-excess, 0.0), probs[1:]]), inf_mass
