"""Putting several PLDs on one grid step, on the safe side.

Every operation that combines PLDs (composition, suprema, the natural filter and its worst-case
analysis) needs their finite losses on one grid. :func:`align` chooses the common step and moves
each PLD onto it with :func:`regrid_kernel`:

* **Refine, exactly.** When every step is an integer multiple of the finest one (automatic grids
  use powers of two) and the refined PLDs fit the memory guard ``grid.MAX_SIZE``, the coarser PLDs
  are re-expressed on the finest step: every loss is a point of the finer grid, nothing changes.
* **Otherwise coarsen, on the safe side.** Each PLD goes onto the coarsest step. A pessimistic PLD
  splits the mass p at a loss z between the neighbouring coarse points z_lo <= z <= z_hi so that
  both its P-mass and its Q-mass p e^-z are kept (connect-the-dots, Doroshenko et al. 2022, Alg. 1):
  its hockey-stick curve is unchanged at the coarse points and joined by chords in x = e^eps in
  between, which lie above the convex original, so the result is an upper bound (and the tightest
  on the coarse grid; rounding each loss up to z_hi is looser). An optimistic PLD rounds each loss
  down to z_lo: delta(eps) = m + sum_{z > eps} p (1 - e^(eps - z)) grows with every z, so this is
  a lower bound. The atom at +inf is kept as it is in both cases.

Under ``jit`` (traced steps) the ratios cannot be looked at: the PLDs are then moved onto the
largest of their steps (elementwise), which needs at most ``n + 2`` points for a PLD of ``n``: a
static shape. Where the steps are equal this changes nothing; where they differ it is the sound
coarsening above. PLDs on one step object are left as they are.

Positions are computed in float64 from z = (offset + i) step: exact for steps in power-of-two
ratios; otherwise a loss within a few ulps of a coarse point may be taken to sit on it (a change
of delta far below ``order.ROUNDOFF``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import array_module, glue_module, kernel_jit, map_rows
from pldjax.core.pld import PLD, broadcast_rows, computed_on_host, from_rows, unchecked_pld
from pldjax.core.validation import is_traced

#: Relative tolerance under which two steps are one step, and a ratio of steps an integer.
STEP_RTOL = 1e-9


def regrid_kernel(probs, offset, step, target, *, size: int, pessimistic: bool):
    """One direction's finite masses (losses (offset + i) ``step``) moved onto the grid of step
    ``target``: exact where a loss is a grid point; otherwise split between the two neighbouring
    points keeping P- and Q-mass (pessimistic) or moved down to the lower one (optimistic).

    Returns (probs, offset) on ``size`` points from the new offset; ``size`` (static) must be at
    least :func:`regrid_size` (n + 2 suffices when ``target`` >= ``step``). The atom at +inf is
    not touched. NumPy masses are moved in NumPy."""
    xp = array_module(probs)

    def segment_sum(values, index):  # indices from size on are dropped
        if xp is np:
            return np.bincount(index, values, minlength=size)[:size]
        return jax.ops.segment_sum(values, index, num_segments=size)

    n = probs.shape[-1]
    z = (offset + xp.arange(n)).astype(xp.float64) * step
    low = xp.floor(z / target)
    low = xp.where(low * target > z, low - 1.0, low)  # the division may round across a point
    low = xp.where((low + 1.0) * target <= z, low + 1.0, low)
    start = low[0]
    index = (low - start).astype(xp.int64)
    if pessimistic:
        above = xp.clip(z - low * target, 0.0, target)  # z - z_lo in [0, target)
        share = xp.clip(xp.expm1(-above) / xp.expm1(-target), 0.0, 1.0)  # part moved to z_hi
        up = probs * share
        out = segment_sum(probs - up, index) + segment_sum(up, index + 1)
    else:
        out = segment_sum(probs, index)
    return out, start.astype(xp.int64)


def regrid_size(n: int, ratio: float) -> int:
    """Points that :func:`regrid_kernel` needs for ``n`` points and ``ratio`` = step / target
    (the largest of a batch)."""
    whole = round(ratio)
    if whole >= 1 and abs(ratio - whole) <= STEP_RTOL * whole:
        return (n - 1) * whole + 2
    return math.ceil((n - 1) * ratio * (1 + 1e-12)) + 3


@kernel_jit(static_argnames=("size", "pessimistic"))
def _regrid_batch(probs, offset, step, target, *, size: int, pessimistic: bool):
    kernel = functools.partial(regrid_kernel, size=size, pessimistic=pessimistic)
    return jax.vmap(kernel)(probs, offset, step, target)


def regrid(pld: PLD, target, size: int) -> PLD:
    """A single-direction PLD with one batch axis (or none) on the step ``target`` (same batch
    shape), on ``size`` points (see :func:`regrid_kernel`)."""
    shape = pld.batch_shape
    rows = broadcast_rows(pld, shape)
    xp = glue_module((rows.probs, target))
    target = xp.broadcast_to(xp.asarray(target, xp.float64), shape).reshape(rows.step.shape)
    if xp is np and computed_on_host([rows], size):
        kernel = functools.partial(regrid_kernel, size=size, pessimistic=pld.pessimistic)
        probs, offset = map_rows(kernel)(*(np.asarray(a) for a in (rows.probs, rows.offset,
                                                                   rows.step, target)))
    else:
        probs, offset = _regrid_batch(rows.probs, rows.offset, rows.step, target, size=size,
                                      pessimistic=pld.pessimistic)
    regridded = from_rows(probs, rows.inf_mass, offset, target, shape, pld.pessimistic)
    return unchecked_pld(regridded.probs, pld.inf_mass, regridded.offset, regridded.step,
                         pld.pessimistic)


def _only_zero_loss(pld: PLD) -> bool:
    """A PLD whose finite part is the single loss 0 sits on every grid."""
    return pld.size == 1 and bool(np.all(np.asarray(pld.offset) == 0))


def align(plds: Sequence[PLD], name: str) -> list[PLD]:
    """Single-direction PLDs of one batch shape on one step per batch element, on the safe side
    (see the module docstring): refined exactly when every step is an integer multiple of the
    finest and the refined sizes fit grid.MAX_SIZE, else coarsened onto the coarsest step
    (pessimistic PLDs by connect-the-dots, optimistic ones by rounding losses down). Under jit,
    coarsened onto the largest step. ``name``: the caller, for error messages."""
    plds = list(plds)
    if len(plds) < 2:
        return plds
    if all(p.step is plds[0].step for p in plds):
        return plds
    if is_traced([p.step for p in plds]):
        target = functools.reduce(jnp.maximum, [jnp.asarray(p.step, jnp.float64) for p in plds])
        return [regrid(p, target, p.size + 2) for p in plds]
    steps = [np.asarray(p.step, np.float64) for p in plds]
    movable = [not _only_zero_loss(p) for p in plds]
    ruling = [s for s, m in zip(steps, movable, strict=True) if m] or steps
    finest = functools.reduce(np.minimum, ruling)
    coarsest = functools.reduce(np.maximum, ruling)
    refined = []
    for p, s in zip(plds, steps, strict=True):
        ratio = s / finest
        whole = np.round(ratio)
        if not np.all((whole >= 1) & (np.abs(ratio - whole) <= STEP_RTOL * whole)):
            break
        refined.append((p.size - 1) * int(np.max(whole)) + 2)
    fits = len(refined) == len(plds) and max(refined) <= grid_lib.MAX_SIZE
    target = finest if fits else coarsest
    out = []
    for p, s, m in zip(plds, steps, movable, strict=True):
        if np.allclose(s, target, rtol=STEP_RTOL, atol=0):
            out.append(p)
        elif not m:
            out.append(unchecked_pld(p.probs, p.inf_mass, p.offset,
                                     jnp.broadcast_to(jnp.asarray(target), p.batch_shape), p.pessimistic))
        else:
            size = regrid_size(p.size, float(np.max(s / target)))
            if size > grid_lib.MAX_SIZE:  # coarsening never grows a PLD: only a huge one
                raise ValueError(
                    f"plds: {name} would re-grid a PLD of {p.size} points onto step "
                    f"{float(np.min(target)):.3g}: {size} points, more than grid.MAX_SIZE = "
                    f"{grid_lib.MAX_SIZE} (a memory guard)")
            out.append(regrid(p, target, size))
    return out


def onto_step(pld: PLD, target: float, name: str) -> PLD:
    """Every direction of a PLD with concrete steps on the given step ``target`` (nats), on its
    safe side: exact where the PLD's step is an integer multiple of ``target``, otherwise by
    connect-the-dots (pessimistic) or rounding losses down (optimistic), onto a finer or a coarser
    grid alike. ValueError when the result would exceed grid.MAX_SIZE points (a memory guard)."""
    def one(d: PLD) -> PLD:
        steps = np.asarray(d.step, np.float64)
        if np.allclose(steps, target, rtol=STEP_RTOL, atol=0):
            return d
        size = regrid_size(d.size, float(np.max(steps)) / target)
        if size > grid_lib.MAX_SIZE:
            raise ValueError(
                f"query: {name} would re-grid a PLD of {d.size} points on step "
                f"{float(np.max(steps)):.3g} onto step {target:.3g}: {size} points, more than "
                f"grid.MAX_SIZE = {grid_lib.MAX_SIZE} (a memory guard)")
        return regrid(d, target, size)

    return pld.map_directions(one)
