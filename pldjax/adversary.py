"""The cost of adaptivity: the worst-case adversary recursion V_k of the natural filter.

residue-filters.txt Thm 6: with a query family L (Id always allowed) and budget B,
V_1(L') = sup{L : L' (+) L <= B} and V_{j+1}(L') = sup{L (+) V_j(L' (+) L) : L' (+) L <= B}; the
interaction with the natural filter over k rounds has PLD V_k(Id). Composition commutes, so the
state is the multiset M of queries played; with Id allowed, V_j(M) = sup(V_{j-1}(M),
L_i (+) V_{j-1}(M + i) for every legal i), from V_0 = Id, for all multisets with |M| <= k - j, one
vmapped call per j.

Everything runs in *curve space* on one uniform grid eps_j = (w0 + j) h that holds every possible
composition: a PLD is represented by its hockey-stick values at the grid points. For a query L on
the same grid, delta_{L (+) V}(eps_j) = sum_i p_i delta_V(eps_j - z_i) + p_inf, and every
eps_j - z_i is a grid point (beyond the window the curve continues linearly in e^eps from (0, 1)
on the left and flat on the right, exactly so for PLDs supported in the window). The supremum's
curve is the pointwise maximum (Prop. 11).

* Upper bound (is the filter free?): legality generous (a move is legal when the composed curve is
  below B at the grid points, a necessary condition), and the supremum of grid values joined by
  chords, which lies above the true maximum of the members' curves between grid points.
* Lower bound (is it not free?): legality strict (the composed grid PLD is dominated by B at every
  eps, compared exactly at both grids' points; up to ROUNDOFF, so a witness is a proof up to
  float round-off, and the tests re-check witnesses in exact arithmetic), and grid values only: at the
  grid points the maximum of lower values is below the true supremum, and compositions need only
  grid values.

Queries and budget are symmetric pairs (one direction each), and so are their compositions and
suprema, so "below B" is decided at eps >= 0 only (the curve at -eps follows from the one at eps).
There the curves are away from 1, where the round-off of values near 1 would swamp a comparison.

The queries are the given grid PLDs exactly (a family of lattice mechanisms such as randomized
response is represented exactly; a Gaussian's grid PLD stands for itself), and so is the budget,
which may sit on any step. Queries on different steps are aligned first
(:func:`pldjax.align.align`): exactly onto the finest step when their steps are integer multiples
of it and the result fits grid.MAX_SIZE, otherwise onto the coarsest step by connect-the-dots
(pessimistic: each query replaced by one that dominates it, as :func:`pldjax.filters.natural_filter`
does with its queries); the analysis is then that of the aligned family.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.align import align
from pldjax.discretize import masses_from_curve
from pldjax.grid import next_pow2
from pldjax.order import ROUNDOFF
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.profile import delta_kernel
from pldjax.validate import check_count


class Family(NamedTuple):
    """Queries on one grid: masses (m, n) from the common offset, atoms at +inf (m,)."""

    probs: np.ndarray
    inf_mass: np.ndarray
    offset: int
    step: float


def _family(queries) -> Family:
    queries = list(queries)
    if not queries or not all(isinstance(q, PLD) for q in queries):
        raise ValueError("queries must be a non-empty list of PLDs")
    for q in queries:
        if q.batch_shape or q.reverse is not None:
            raise ValueError("the recursion takes unbatched, symmetric PLDs (one direction)")
    queries = align(queries, "the natural-filter analysis")
    steps = np.array([float(q.step) for q in queries])
    spans = []
    for q in queries:
        nonzero = np.flatnonzero(np.asarray(q.probs) > 0)
        lo, hi = (0, 0) if nonzero.size == 0 else (nonzero[0], nonzero[-1])
        spans.append((int(q.offset) + lo, int(q.offset) + hi))
    low = min(a for a, _ in spans)
    high = max(b for _, b in spans)
    probs = np.zeros((len(queries), high - low + 1))
    for row, (q, (a, b)) in enumerate(zip(queries, spans, strict=True)):
        start = a - int(q.offset)
        probs[row, a - low:b - low + 1] = np.asarray(q.probs)[start:start + b - a + 1]
    return Family(probs, np.array([float(q.inf_mass) for q in queries]), low, float(steps[0]))


class Window(NamedTuple):
    start: int  # grid index of the first point
    size: int  # points
    pad: int  # extension on each side for compositions


def _window(family: Family, rounds: int, budget: PLD | None = None) -> Window:
    """Every composition of up to ``rounds`` queries, 0, and the budget's grid range."""
    n = family.probs.shape[1]
    low = min(0, rounds * family.offset)
    high = max(0, rounds * (family.offset + n - 1))
    if budget is not None:  # the range of the budget's masses
        b_step = float(budget.step)
        nonzero = np.flatnonzero(np.asarray(budget.probs) > 0)
        first, last = (0, 0) if nonzero.size == 0 else (int(nonzero[0]), int(nonzero[-1]))
        low = min(low, math.floor((int(budget.offset) + first) * b_step / family.step))
        high = max(high, math.ceil((int(budget.offset) + last) * b_step / family.step))
    pad = abs(family.offset) + n
    return Window(low, high - low + 1, pad)


def _extend(curve, window: Window, step):
    """The curve on [start - pad, start + size + pad): linear in e^eps from (0, 1) on the left,
    flat on the right."""
    left = jnp.arange(-window.pad, 0) * step  # eps - eps_0
    head = 1.0 - (1.0 - curve[0]) * jnp.exp(left)
    tail = jnp.full((window.pad,), curve[-1])
    return jnp.concatenate([head, curve, tail])


#: Queries with at most this many grid points are composed by direct sums (exact zeros stay
#: zero); wider ones by FFT, whose absolute round-off (~1e-13) is then below the tolerances.
_DIRECT_WIDTH = 128


def _compose_curve(curve, probs, inf_mass, offset, window: Window, step):
    """delta_{L (+) V} at the window's points from V's values there (L on the common grid)."""
    n = probs.shape[0]
    extended = _extend(curve, window, step)
    # F_j = sum_i p_i E[j - offset - i], E indexed from -pad
    begin = window.pad - offset
    if n <= _DIRECT_WIDTH:
        rows = begin + jnp.arange(window.size)[None, :] - jnp.arange(n)[:, None]
        return probs @ extended[rows] + inf_mass
    size = extended.shape[0] + n - 1
    nfft = next_pow2(size)
    full = jnp.fft.irfft(jnp.fft.rfft(probs, nfft) * jnp.fft.rfft(extended, nfft), nfft)
    return jax.lax.dynamic_slice(full, (begin,), (window.size,)) + inf_mass


def _padded(batch: int) -> int:
    """Batches are padded to powers of two so that few shapes are ever compiled."""
    return next_pow2(max(batch, 1))


@functools.partial(jax.jit, static_argnames=("offset", "window"))
def _compose_batch(curves, probs, inf_mass, step, *, offset: int, window: Window):
    return jax.vmap(_compose_curve, in_axes=(0, 0, 0, None, None, None))(
        curves, probs, inf_mass, offset, window, step)


def compose_rows(curves, probs, inf_mass, offset: int, window: Window, step):
    """_compose_curve for each row (curve i with query row i), in padded batches."""
    count = curves.shape[0]
    size = _padded(count)

    def pad(a):
        return jnp.concatenate([a, jnp.repeat(a[:1], size - count, axis=0)]) if size > count else a

    out = _compose_batch(pad(curves), pad(probs), pad(inf_mass), jnp.asarray(step),
                         offset=offset, window=window)
    return out[:count]


@functools.partial(jax.jit, static_argnames=("offset", "window"))
def _moves_batch(curves, children, probs, inf_mass, step, *, offset: int, window: Window):
    """L_i (+) V for V = curves[children[r, i]], every row r and query i: (rows, m, size). Each
    curve's spectrum is taken once, however many moves lead to it."""
    m, n = probs.shape
    if n <= _DIRECT_WIDTH:
        def row(indices):
            return jax.vmap(lambda c, p, u: _compose_curve(curves[c], p, u, offset, window, step))(
                indices, probs, inf_mass)
        return jax.lax.map(row, children, batch_size=16)
    extended = jax.vmap(lambda c: _extend(c, window, step))(curves)
    nfft = next_pow2(extended.shape[1] + n - 1)
    spectra = jnp.fft.rfft(extended, nfft)
    query_spectra = jnp.fft.rfft(probs, nfft)
    begin = window.pad - offset

    def row(indices):
        full = jnp.fft.irfft(spectra[indices] * query_spectra, nfft)
        return jax.lax.dynamic_slice_in_dim(full, begin, window.size, axis=-1) + inf_mass[:, None]

    return jax.lax.map(row, children, batch_size=16)


def moves(curves, children, probs, inf_mass, offset: int, window: Window, step):
    """_moves_batch in padded shapes (few compilations)."""
    count, rows = curves.shape[0], children.shape[0]
    curves = jnp.concatenate([curves, jnp.repeat(curves[:1], _padded(count) - count, axis=0)])
    children = np.concatenate([children, np.zeros((_padded(rows) - rows, children.shape[1]), int)])
    out = _moves_batch(curves, jnp.asarray(children), probs, inf_mass, jnp.asarray(step),
                       offset=offset, window=window)
    return out[:rows]


@functools.partial(jax.jit, static_argnames=("window",))
def _legality_batch(curves, b_probs, b_inf, b_off, b_step, step, *, window: Window):
    budget = _Budget(b_probs, b_inf, b_off, b_step)
    eps = (window.start + jnp.arange(window.size)) * step
    at_points = jax.vmap(lambda c: _excess_at_points(c, budget, eps))(curves)
    everywhere = jax.vmap(lambda c: _full_excess(c, budget, window, step))(curves)
    return at_points, everywhere


def legality(curves, budget: _Budget, window: Window, step):
    """(excess at the grid points, excess everywhere) of each curve over the budget."""
    count = curves.shape[0]
    size = _padded(count)
    if size > count:
        curves = jnp.concatenate([curves, jnp.repeat(curves[:1], size - count, axis=0)])
    up, low = _legality_batch(curves, *budget, jnp.asarray(step), window=window)
    return np.asarray(up)[:count], np.asarray(low)[:count]


def _identity_curve(window: Window, step):
    eps = (window.start + jnp.arange(window.size)) * step
    return jnp.maximum(-jnp.expm1(eps), 0.0)


def _multisets(m: int, size: int) -> list[tuple[int, ...]]:
    return list(itertools.combinations_with_replacement(range(m), size))


class _Budget(NamedTuple):
    probs: jax.Array
    inf_mass: jax.Array
    offset: jax.Array
    step: jax.Array


def _budget(budget: PLD) -> _Budget:
    if not isinstance(budget, PLD) or budget.batch_shape or budget.reverse is not None:
        raise ValueError("budget must be one unbatched, symmetric PLD")
    return _Budget(jnp.asarray(budget.probs, jnp.float64), jnp.asarray(budget.inf_mass, jnp.float64),
                   jnp.asarray(budget.offset, jnp.int64), jnp.asarray(budget.step, jnp.float64))


def _excess_at_points(curves, budget: _Budget, eps):
    """max over eps_j >= 0 of curve_j - delta_B(eps_j) for each curve (leading axis)."""
    b = delta_kernel(budget.probs, budget.inf_mass, budget.offset, budget.step, eps)
    return jnp.max(jnp.where(eps >= 0, curves - b, -jnp.inf), axis=-1)


def _full_excess(curve, budget: _Budget, window: Window, step):
    """max over every eps >= 0 of delta_V - delta_B, V the grid PLD through the curve's values.

    V's curve is linear in e^eps between the window's points (flat beyond them) and B's between
    its own, so comparing at both sets of points is exact; V is interpolated at B's points
    directly from the values (rebuilding V's masses would amplify their round-off ~1/step-fold).
    """
    eps = (window.start + jnp.arange(window.size)) * step
    own = jnp.where(eps >= 0, curve - delta_kernel(*budget, eps), -jnp.inf)
    b_eps = (budget.offset + jnp.arange(budget.probs.shape[0])) * budget.step
    position = b_eps / step - window.start
    j = jnp.clip(jnp.floor(position).astype(jnp.int64), 0, window.size - 2)
    weight = jnp.clip(jnp.expm1(b_eps - eps[j]) / jnp.expm1(step), 0.0, 1.0)
    inside = curve[j] + (curve[j + 1] - curve[j]) * weight
    values = jnp.where(position >= window.size - 1, curve[-1], inside)
    theirs = jnp.where(b_eps >= 0, values - delta_kernel(*budget, b_eps), -jnp.inf)
    return jnp.maximum(jnp.max(own), jnp.max(theirs))


class Analysis(NamedTuple):
    """Compositions of every multiset of at most ``rounds`` queries and their legality."""

    family: Family
    window: Window
    multisets: list  # list of levels: level t holds the multisets of size t
    index: dict  # multiset -> (level, row)
    curves: list  # level t: (count_t, size) curves of the compositions
    legal_upper: list  # level t: (count_t,) composition below B at the grid points (+ROUNDOFF)
    legal_lower: list  # level t: (count_t,) composition below B at every eps
    reach_upper: list
    reach_lower: list


def _analyse(queries, budget: PLD, rounds: int) -> Analysis:
    family = _family(queries)
    b = _budget(budget)
    window = _window(family, rounds, budget)
    step = family.step
    probs = jnp.asarray(family.probs)
    inf_mass = jnp.asarray(family.inf_mass)
    m = probs.shape[0]

    multisets = [[()]]
    index = {(): (0, 0)}
    curves = [_identity_curve(window, step)[None, :]]
    legal_upper = [np.array([True])]
    legal_lower = [np.array([True])]
    reach_upper = [np.array([True])]
    reach_lower = [np.array([True])]
    for t in range(1, rounds + 1):
        level = _multisets(m, t)
        parents = np.array([index[ms[:-1]][1] for ms in level])
        last = np.array([ms[-1] for ms in level])
        level_curves = compose_rows(curves[t - 1][parents], probs[last], inf_mass[last],
                                    family.offset, window, step)
        up, low = legality(level_curves, b, window, step)
        up, low = up <= ROUNDOFF, low <= ROUNDOFF
        r_up = np.zeros(len(level), bool)
        r_low = np.zeros(len(level), bool)
        for row, ms in enumerate(level):
            for drop in set(ms):
                rest = list(ms)
                rest.remove(drop)
                _, prow = index[tuple(rest)]
                r_up[row] |= reach_upper[t - 1][prow]
                r_low[row] |= reach_lower[t - 1][prow]
            r_up[row] &= up[row]
            r_low[row] &= low[row]
        for row, ms in enumerate(level):
            index[ms] = (t, row)
        multisets.append(level)
        curves.append(level_curves)
        legal_upper.append(up)
        legal_lower.append(low)
        reach_upper.append(r_up)
        reach_lower.append(r_low)
    return Analysis(family, window, multisets, index, curves, legal_upper, legal_lower,
                    reach_upper, reach_lower)


def _recursion(a: Analysis, rounds: int, upper: bool):
    """V_rounds(Id) as curve values (upper or lower bound)."""
    family, window = a.family, a.window
    probs = jnp.asarray(family.probs)
    inf_mass = jnp.asarray(family.inf_mass)
    m = probs.shape[0]
    reach = a.reach_upper if upper else a.reach_lower
    identity = _identity_curve(window, family.step)
    # values[t]: V_j at every multiset of level t (|M| = t <= rounds - j)
    values = [jnp.broadcast_to(identity, (len(level), window.size)) for level in a.multisets]
    for j in range(1, rounds + 1):
        new_values = []
        for t in range(0, rounds - j + 1):
            level = a.multisets[t]
            best = values[t]
            children = np.array([[a.index[tuple(sorted(ms + (i,)))][1] for i in range(m)]
                                 for ms in level])
            allowed = reach[t + 1][children]  # (count_t, m)
            moved = moves(values[t + 1], children, probs, inf_mass, family.offset, window,
                          family.step)
            moved = jnp.where(jnp.asarray(allowed)[:, :, None], moved, -jnp.inf)
            new_values.append(jnp.maximum(best, jnp.max(moved, axis=1)))
        values = new_values + values[rounds - j + 1:]
    return values[0][0]


class Bounds(NamedTuple):
    """V_k(Id) bracketed: ``upper`` (a pessimistic PLD), ``lower`` (its curve's values at
    ``epsilons``, each below the true V_k there), ``gap`` (largest difference of the two curves
    at the grid points)."""

    upper: PLD
    epsilons: np.ndarray
    upper_deltas: np.ndarray
    lower_deltas: np.ndarray
    gap: float


def _bounds(a: Analysis, rounds: int) -> Bounds:
    step = a.family.step
    eps = (a.window.start + jnp.arange(a.window.size)) * step
    up = _recursion(a, rounds, upper=True)
    same_moves = all(np.array_equal(u, v) for u, v in zip(a.reach_upper, a.reach_lower, strict=True))
    low = up if same_moves else _recursion(a, rounds, upper=False)
    probs, inf_mass = masses_from_curve(up, step, up + jnp.expm1(eps), eps)
    pld = PLD(probs, inf_mass, jnp.asarray(a.window.start, jnp.int64),
              jnp.asarray(step, jnp.float64), True)
    return Bounds(pld, np.asarray(eps), np.asarray(up), np.asarray(low),
                  float(jnp.max(up - low)))


@float64
def natural_filter_bounds(queries, *, budget: PLD, rounds: int) -> Bounds:
    """Upper and lower bounds on V_rounds(Id), the natural filter's worst-case PLD (Thm 6), for a
    finite family of symmetric query PLDs (aligned onto one grid step, see the module docstring;
    Id is always allowed)."""
    rounds = check_count("rounds", rounds, minimum=1)
    return _bounds(_analyse(queries, budget, rounds), rounds)


@float64
def natural_filter_cost(queries, *, budget: PLD, rounds: int) -> PLD:
    """V_rounds(Id) as a pessimistic PLD: an upper bound on the privacy of every analyst
    interacting with the natural filter of ``budget`` for ``rounds`` rounds using ``queries``
    (aligned onto one step first, see the module docstring)."""
    return natural_filter_bounds(queries, budget=budget, rounds=rounds).upper


class Verdict(NamedTuple):
    """``status``: "free" (V_k(Id) below the budget, from the upper bound), "not free" (an
    analyst provably exceeds it; ``witness`` says how) or "undecided" (the bounds straddle)."""

    status: str
    upper_excess: float
    lower_excess: float
    gap: float
    witness: dict | None


def _witness(a: Analysis, budget: PLD, rounds: int) -> dict | None:
    """A strategy that provably exceeds the budget: play the multiset ``prefix``, then, depending
    on its outputs, one of the ``options`` (multisets played after it; each path legal). Its PLD
    is prefix (+) sup(options) <= V_k(Id); returned with an eps where it exceeds the budget."""
    family, window = a.family, a.window
    step = family.step
    b = _budget(budget)
    eps = (window.start + jnp.arange(window.size)) * step
    budget_curve = np.asarray(delta_kernel(b.probs, b.inf_mass, b.offset, b.step, eps))
    probs = jnp.asarray(family.probs)
    inf_mass = jnp.asarray(family.inf_mass)
    best = None
    for t in range(rounds):
        for row, prefix in enumerate(a.multisets[t]):
            if not a.reach_lower[t][row]:
                continue
            options = []
            for extra in range(1, rounds - t + 1):
                for more in _multisets(family.probs.shape[0], extra):
                    whole = tuple(sorted(prefix + more))
                    if _path_legal(a, prefix, more):
                        options.append((more, whole))
            if len(options) < 2:
                continue
            top = jnp.max(jnp.stack([a.curves[len(more)][a.index[more][1]]
                                     for more, _ in options]), axis=0)
            for i in prefix:
                top = compose_rows(top[None], probs[i][None], inf_mass[i][None],
                                   family.offset, window, step)[0]
            excess = np.where(np.asarray(eps) >= 0, np.asarray(top) - budget_curve, -np.inf)
            j = int(np.argmax(excess))
            if excess[j] > rounds * ROUNDOFF and (best is None or excess[j] > best["excess"]):
                best = {"prefix": list(prefix), "options": [list(more) for more, _ in options],
                        "epsilon": float(eps[j]), "delta": float(np.asarray(top)[j]),
                        "budget_delta": float(budget_curve[j]), "excess": float(excess[j])}
    return best


def _path_legal(a: Analysis, prefix: tuple, more: tuple) -> bool:
    """Every composition along prefix + more (in that order) is strictly below the budget."""
    played = tuple(sorted(prefix))
    for i in more:
        played = tuple(sorted(played + (i,)))
        level, row = a.index[played]
        if not a.legal_lower[level][row]:
            return False
    return True


@float64
def natural_filter_free(queries, *, budget: PLD, rounds: int) -> Verdict:
    """Is the natural filter with ``budget`` free for ``rounds`` rounds of these queries?

    "free" when the upper bound on V_rounds(Id) is dominated by the budget (up to
    rounds * ROUNDOFF); "not free" when the lower bound exceeds it by more than that at some eps,
    with a witness strategy (see :func:`_witness`; None if the excess needs deeper adaptivity than
    one branching point); "undecided" otherwise. Queries on different steps are aligned first
    (exactly when possible, else pessimistically: see the module docstring); the budget may sit
    on any step.
    """
    rounds = check_count("rounds", rounds, minimum=1)
    a = _analyse(queries, budget, rounds)
    bounds = _bounds(a, rounds)
    b = _budget(budget)
    step = a.family.step
    up_curve = jnp.asarray(bounds.upper_deltas)
    upper_excess = float(_full_excess(up_curve, b, a.window, step))
    lower_excess = float(_excess_at_points(jnp.asarray(bounds.lower_deltas)[None], b,
                                           jnp.asarray(bounds.epsilons))[0])
    tol = rounds * ROUNDOFF
    if upper_excess <= tol:
        return Verdict("free", upper_excess, lower_excess, bounds.gap, None)
    if lower_excess > tol:
        return Verdict("not free", upper_excess, lower_excess, bounds.gap,
                       _witness(a, budget, rounds))
    return Verdict("undecided", upper_excess, lower_excess, bounds.gap, None)


@float64
def totally_ordered(queries, *, rounds: int, tolerance: float = ROUNDOFF) -> bool:
    """Thm 8's condition: every two compositions of fewer than ``rounds`` queries are ordered
    (one's curve below the other's at every grid point eps >= 0, up to ``tolerance``). If it holds the
    natural filter is free for every budget; if it fails for non-degenerate members it is not
    free for some budget at 2 rounds - 3 rounds."""
    rounds = check_count("rounds", rounds, minimum=1)
    family = _family(queries)
    depth = max(rounds - 1, 1)
    window = _window(family, depth)
    step = family.step
    probs = jnp.asarray(family.probs)
    inf_mass = jnp.asarray(family.inf_mass)
    level_curves = [_identity_curve(window, step)[None, :]]
    index = {(): 0}
    members = []
    for t in range(1, depth + 1):
        level = _multisets(probs.shape[0], t)
        parents = np.array([index[ms[:-1]] for ms in level])
        last = np.array([ms[-1] for ms in level])
        curves = compose_rows(level_curves[-1][parents], probs[last], inf_mass[last],
                              family.offset, window, step)
        index = {ms: row for row, ms in enumerate(level)}
        level_curves.append(curves)
        members.append(curves)
    nonnegative = (window.start + jnp.arange(window.size)) * step >= 0
    stacked = jnp.concatenate(members)[:, nonnegative]
    difference = stacked[:, None, :] - stacked[None, :, :]
    below = jnp.max(difference, axis=-1) <= tolerance
    return bool(jnp.all(below | below.T))

