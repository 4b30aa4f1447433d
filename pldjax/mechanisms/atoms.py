"""PLDs from atoms: one direction's PLD from finite losses with their P-masses (and a mass at
+inf), for mechanisms whose losses are computed as points (a lattice's, or a post-processing's
bins) rather than as tails: split between grid points keeping their Q-mass (an upper bound) or
merged onto the grid (a lower bound)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.mass import settle
from pldjax.core.pld import PLD, unchecked_pld

#: Losses are moved by this margin (nats) before they are rounded onto the grid, past the
#: round-off of their logarithms, on the side of the estimate.
LOSS_MARGIN = 1e-9
#: Most P-mass :func:`pld_from_atoms` moves up into its window from below (raising delta by at
#: most that, and a lower bound's too): more, and the grid's step doubles instead, at most
#: MOST_DOUBLINGS times (a default step of the loss's spread / 64 becomes about the spread).
MOVED_MASS = 1e-9
MOST_DOUBLINGS = 6


def merged_onto_grid(losses, masses, step: float) -> tuple[int, np.ndarray]:
    """(index of the first grid point, masses on the grid) of an optimistic coarsening of atoms
    (``losses`` in nats, ``masses`` their P-masses) onto multiples of ``step``: the atoms of
    each cell [l_i, l_i + step) are merged, then grid point l_i takes the rest of its cell and a
    share of the cell below, as much of it (from the top down) as keeps their merged loss at or
    above l_i; naming that merger l_i lowers its loss, and merging is post-processing, so the
    pair is dominated. Losses land on grid points exactly where shares balance, rather than a
    step lower on average (rounding every atom down loses about step / 2 in epsilon)."""
    shifted = losses - LOSS_MARGIN
    index = np.floor(shifted / step)
    low = int(index.min())
    cells = (index - low).astype(np.int64)
    mass = np.bincount(cells, weights=masses)
    # each cell's Q-mass in units of its lower point's e^{-l_i}, between mass e^{-step} and mass
    q_mass = np.bincount(cells, weights=masses * np.exp(index * step - shifted))
    # Q-mass over P-mass e^{-l}: a cell moved up adds `excess` at its upper point, a cell kept
    # at its point leaves `room` (both in units of that point's e^{-l})
    excess = np.maximum(q_mass * math.exp(step) - mass, 0.0)
    room = np.maximum(mass - q_mass, 0.0)
    # a cell whose upper neighbour has no room moves up whole or not at all; the others, from
    # the top down (the only sequential part: cells are mostly empty where atoms are sparse)
    moved_up = np.where(excess <= 0.0, 1.0, 0.0)
    moved_up[-1] = 0.0  # the top cell has nowhere to go
    for i in np.flatnonzero(room[1:] > 0.0)[::-1].tolist():
        free = (1.0 - moved_up[i + 1]) * room[i + 1]
        moved_up[i] = 1.0 if excess[i] <= free else free / excess[i]
    probs = mass * (1.0 - moved_up)
    probs[1:] += (mass * moved_up)[:-1]
    return low, probs


def doubled_until(step: float, fits: Callable[[float], bool]) -> float | None:
    """``step`` doubled until ``fits`` it, at most MOST_DOUBLINGS times; None if none does."""
    for _ in range(MOST_DOUBLINGS + 1):
        if fits(step):
            return step
        step *= 2.0
    return None


def pld_from_atoms(losses, masses, inf_mass, step: float, pessimistic: bool) -> PLD | None:
    """One direction's PLD from atoms (finite ``losses`` in nats, with ``masses``) and a mass at
    +inf, on multiples of ``step``. Pessimistic: an atom between two grid points is split
    between them keeping its Q-mass (mass m at loss l: m (1 - e^{-(l - l_0)}) / (1 - e^{-step}) at
    l_1, the rest at l_0; the atom is their merger, so the split pair dominates); optimistic:
    merged onto the grid (:func:`merged_onto_grid`). Mass within TAIL_MASS of either end of the
    window is moved to its safe side, then :func:`settle` restores a total of 1 (a pessimistic
    PLD's masses and +inf atom are upper bounds: the surplus comes off its lowest losses).
    The window is at most MAX_MECHANISM_SIZE points below the highest loss: atoms further below
    move up to its bottom, as mass below any window does, where they hold at most MOVED_MASS
    (a lattice's round-off bounds); else the step doubles until they do, at most
    MOST_DOUBLINGS times (random allocation at 3 x 10^6 steps and sigma 1: the add direction's
    losses span 16 nats, and its bulk, moved up by 6 nats, put one allocation's epsilon(0.1) at
    5.75, where a Gaussian bound's is 1.16). None where that is not enough (random allocation at
    sigma = 10^6: a loss 1e-5 nats wide on a lattice whose lowest points lie 14 nats below,
    10^9 grid points): the caller takes another bound."""
    top = np.max(losses, initial=-np.inf)

    def bottom(h: float) -> float:
        return top - (grid_lib.MAX_MECHANISM_SIZE - 4) * h

    step = doubled_until(step, lambda h: np.sum(masses[losses < bottom(h)]) <= MOVED_MASS)
    if step is None:
        return None
    losses = np.maximum(losses, bottom(step))
    if pessimistic:
        shifted = losses + LOSS_MARGIN
        index = np.floor(shifted / step)
        upper = masses * (np.expm1(index * step - shifted) / np.expm1(-step))
        index = np.concatenate([index, index + 1.0]).astype(np.int64)
        masses = np.concatenate([masses - upper, upper])
        low = int(index.min())
        probs = np.bincount(index - low, weights=masses)
    else:
        low, probs = merged_onto_grid(losses, masses, step)
    below = np.cumsum(probs)
    above = np.cumsum(probs[::-1])
    first = int(np.searchsorted(below, grid_lib.TAIL_MASS, side="right"))
    last = len(probs) - 1 - int(np.searchsorted(above, grid_lib.TAIL_MASS, side="right"))
    first, last = min(first, last), max(first, last)
    window = probs[first:last + 1].copy()
    window[0] += below[first] - probs[first]
    cut = above[len(probs) - 2 - last] if last + 1 < len(probs) else 0.0
    if pessimistic:
        inf_mass = inf_mass + cut
    else:
        window[0] += cut
    window = np.pad(window, (0, grid_lib.next_pow2(len(window)) - len(window)))
    window, inf_mass = settle(window, np.float64(inf_mass), 0.0, 0.0, pessimistic, xp=np)
    return unchecked_pld(window, np.float64(inf_mass), np.int64(low + first), np.float64(step),
                         pessimistic=pessimistic)
