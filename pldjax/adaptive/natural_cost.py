"""The cost of adaptivity: the worst-case adversary recursion V_k of the natural filter.

Regehr et al. 2026, Thm 6: with a query family L (Id always allowed) and budget B,
V_1(L') = sup{L : L' (+) L <= B} and V_{j+1}(L') = sup{L (+) V_j(L' (+) L) : L' (+) L <= B}; the
interaction with the natural filter over k rounds has PLD V_k(Id). Composition commutes, so the
state is the multiset M of queries played; with Id allowed, V_j(M) = sup(V_{j-1}(M),
L_i (+) V_{j-1}(M + i) for every legal i), from V_0 = Id.

One pass over the levels suffices. V_j(M) grows with j (it includes V_{j-1}(M)) and composition is
monotone, so by induction on j, V_j(M) = sup(Id, L_i (+) V_{j-1}(M + i) for every legal i): the
term V_{j-1}(M) = sup(Id, L_i (+) V_{j-2}(M + i)) is below it. Only W(M) = V_{k-|M|}(M) is ever
needed, and W(M) = sup(Id, L_i (+) W(M + i) for every legal i), W = Id on level k: one
composition per legal move, from level k - 1 down to V_k(Id) = W(()). The grid recursion below is
monotone in the same way (non-negative weights, maxima), so this is the j-by-j recursion's
result, not an approximation of it. Only *reachable* multisets matter (every multiset on a path of
legal moves from the empty one is legal): the compositions, legality checks and W are computed
for those and for the candidates one legal move beyond them, nothing else.

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
(:func:`pldjax.core.align.align`): exactly onto the finest step when their steps are integer multiples
of it and the result fits grid.MAX_SIZE, otherwise onto the coarsest step by connect-the-dots
(pessimistic: each query replaced by one that dominates it, as :func:`pldjax.adaptive.filters.natural_filter`
does with its queries); the analysis is then that of the aligned family.

Speed: each level is one compiled call on arrays padded to a power-of-two number of rows (so one
program serves every level and most calls), looping over the level's actual rows in chunks;
each curve's spectrum is taken once for all the moves that lead to it, the queries' once per
call, and the FFT length is the shortest 5-smooth one without wrap-around. Their programs
depend on the window and the family, so each new family compiles its own (0.1-0.4 s each on a
CPU; the natural-filter notebook compiled 90 of them in 17 s). So a problem of at most
HOST_VALUES values runs the same kernels in NumPy on the host instead, every move of a level at
once, as long as the process's host work lasts (:class:`pldjax.core.compilation.HostWork`, the
budget the accounting functions spend, counted in these values): four Gaussian queries of 256
points over 8 rounds took 0.07 s on the host against 1.7 s compiling, but 0.06 s warm against
0.03 s compiled, so a loop of many analyses compiles once that budget is spent. A memory guard
refuses (ValueError) a level of more than 2^16 multisets or a forward kernel of more than 2^30
values before any multiset is listed.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.align import align
from pldjax.core.compilation import array_module, host_work, kernel_jit, map_rows, to_device
from pldjax.core.grid import MAX_SIZE, next_pow2
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.validation import check_count, check_range
from pldjax.kernels.discretize import masses_from_curve
from pldjax.kernels.dominance import ROUNDOFF
from pldjax.kernels.hockey_stick import delta_kernel


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
    return Family(probs, np.array([float(q.inf_mass) for q in queries]), int(low), float(steps[0]))


class Window(NamedTuple):
    """The recursion's grid points start, ..., start + size - 1 (in steps), and how far a curve is
    extended on each side for a composition with a query of the family."""

    start: int
    size: int
    left: int
    right: int


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
    # F_j = sum_i p_i V_(j - offset - i) reads V at window offsets -(offset + n - 1) .. size - 1 - offset
    return Window(int(low), int(high - low + 1), max(0, int(family.offset) + n - 1),
                  max(0, -int(family.offset)))


#: Queries with at most this many grid points are composed by direct sums (exact zeros stay
#: zero); wider ones by FFT, whose absolute round-off (~1e-13) is then below the tolerances.
DIRECT_WIDTH = 128

#: Rows (curves, moves) handled together inside the level kernels.
_CHUNK = 4

#: Memory guards: the most multisets of one level (padded), and the most float64 values the
#: forward kernel holds (two buffers of curves and a spectra table: 2**30 is 8 GiB).
_MAX_ROWS = 2**16
_MAX_VALUES = 2**30
#: Problems whose forward kernel holds at most this many values may run in NumPy on the host
#: (see the module docstring).
HOST_VALUES = 2**23


def _fft_size(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n (XLA's CPU FFT is as fast per point on these as on powers of
    two, which can be almost twice as long)."""
    best = next_pow2(n)
    five = 1
    while five < best:
        three = five
        while three < best:
            size = three
            while size < n:
                size *= 2
            best = min(best, size)
            three *= 3
        five *= 5
    return best


class _Plan(NamedTuple):
    """Static shape of the level kernels: the window, the family's offset and width, and the FFT
    length (0: direct sums)."""

    window: Window
    offset: int
    width: int
    nfft: int


def _plan(family: Family, window: Window) -> _Plan:
    n = family.probs.shape[1]
    if n <= DIRECT_WIDTH:
        return _Plan(window, family.offset, n, 0)
    extended = window.left + window.size + window.right
    begin = window.left - family.offset
    # circular convolution of length N: the outputs read at begin .. begin + size - 1 must not
    # receive the wrapped tail of the linear one (extended + n - 1 points)
    need = max(extended + n - 1 - begin, begin + window.size, extended)
    return _Plan(window, family.offset, n, _fft_size(need))


def _capacity(count: int) -> int:
    """Rows of a padded batch: a power of two, at least one chunk."""
    return max(next_pow2(count), _CHUNK)


def _extend(curve, window: Window, step):
    """The curve (or each of a stack of curves, along the last axis) on
    [start - left, start + size + right): linear in e^eps from (0, 1) on the left, flat on the
    right."""
    xp = array_module(curve)
    left = xp.arange(-window.left, 0) * step  # eps - eps_0
    head = 1.0 - (1.0 - curve[..., :1]) * xp.exp(left)
    tail = xp.broadcast_to(curve[..., -1:], curve.shape[:-1] + (window.right,))
    return xp.concatenate([head, curve, tail], axis=-1)


def _identity_curve(window: Window, step):
    xp = array_module(step)
    eps = (window.start + xp.arange(window.size)) * step
    return xp.maximum(-xp.expm1(eps), 0.0)


def _rows_of(curve, rows: int):
    """``rows`` copies of a curve (a NumPy array one may write into, or a JAX broadcast)."""
    if array_module(curve) is np:
        return np.tile(curve, (rows, 1))
    return jnp.broadcast_to(curve, (rows, curve.shape[0]))


def _host_or_compiled(kernel, host: bool):
    """A level kernel compiled, or with ``host`` its function itself, on NumPy arrays."""
    return kernel.__wrapped__ if host else kernel


@kernel_jit(static_argnames=("window", "rows"))
def _identity_rows(step, *, window: Window, rows: int):
    return _rows_of(_identity_curve(window, step), rows)


def _chunks(count):
    return (count + _CHUNK - 1) // _CHUNK


def _chunk(array, c):
    return jax.lax.dynamic_slice_in_dim(array, c * _CHUNK, _CHUNK)


def _padded_ints(values, size: int):
    out = np.zeros(size, np.int32)
    out[:len(values)] = values
    return out


def _multisets(m: int, size: int) -> list[tuple[int, ...]]:
    return list(itertools.combinations_with_replacement(range(m), size))


def _removals(ms: tuple) -> list[tuple[int, tuple]]:
    """(i, ms - {i}) for each distinct element i of the multiset ms."""
    out = []
    for i in sorted(set(ms)):
        rest = list(ms)
        rest.remove(i)
        out.append((i, tuple(rest)))
    return out


# -- the budget -----------------------------------------------------------------------------------
class _Budget(NamedTuple):
    probs: jax.Array
    inf_mass: jax.Array
    offset: jax.Array
    step: jax.Array


def _budget(budget: PLD) -> _Budget:
    if not isinstance(budget, PLD) or budget.batch_shape or budget.reverse is not None:
        raise ValueError("budget must be one unbatched, symmetric PLD")
    return _Budget(np.asarray(budget.probs, np.float64), np.asarray(budget.inf_mass, np.float64),
                   np.asarray(budget.offset, np.int64), np.asarray(budget.step, np.float64))


class _Limits(NamedTuple):
    """The budget's curve where legality compares it: at the window's points, and at its own
    grid points ``points`` (eps, nats)."""

    at_window: jax.Array
    points: jax.Array
    at_points: jax.Array


def _limits(budget: _Budget, window: Window, step) -> _Limits:
    xp = array_module(budget.probs)
    eps = (window.start + xp.arange(window.size)) * step
    points = (budget.offset + xp.arange(budget.probs.shape[0])) * budget.step
    return _Limits(delta_kernel(*budget, eps), points, delta_kernel(*budget, points))


def _excess_at_points(curve, limits: _Limits, window: Window, step):
    """max over the window's points eps_j >= 0 of curve_j - delta_B(eps_j)."""
    xp = array_module(curve)
    eps = (window.start + xp.arange(window.size)) * step
    return xp.max(xp.where(eps >= 0, curve - limits.at_window, -xp.inf))


def _full_excess(curve, limits: _Limits, window: Window, step):
    """max over every eps >= 0 of delta_V - delta_B, V the grid PLD through the curve's values
    (at least :func:`_excess_at_points`: it includes the same comparisons).

    V's curve is linear in e^eps between the window's points (flat beyond them) and B's between
    its own, so comparing at both sets of points is exact; V is interpolated at B's points
    directly from the values (rebuilding V's masses would amplify their round-off ~1/step-fold).
    """
    xp = array_module(curve)
    eps = (window.start + xp.arange(window.size)) * step
    b_eps = limits.points
    position = b_eps / step - window.start
    j = xp.clip(xp.floor(position).astype(np.int64), 0, window.size - 2)
    weight = xp.clip(xp.expm1(b_eps - eps[j]) / xp.expm1(step), 0.0, 1.0)
    inside = curve[j] + (curve[j + 1] - curve[j]) * weight
    values = xp.where(position >= window.size - 1, curve[-1], inside)
    theirs = xp.where(b_eps >= 0, values - limits.at_points, -xp.inf)
    return xp.maximum(_excess_at_points(curve, limits, window, step), xp.max(theirs))


# -- the level kernels ----------------------------------------------------------------------------
# Compiled, they loop over chunks of _CHUNK rows; in NumPy (on the host) they take every row of a
# level at once.
def _spectra(curves, rows, count, step, plan: _Plan, table):
    """rfft of the extended curves[rows[r]] for r < count, written into the rows of ``table``
    (the rest is left as it is; in NumPy: those rows alone)."""
    if array_module(curves) is np:
        return np.fft.rfft(_extend(curves[rows[:int(count)]], plan.window, step), plan.nfft)

    def body(c, table):
        extended = jax.vmap(lambda v: _extend(v, plan.window, step))(curves[_chunk(rows, c)])
        return jax.lax.dynamic_update_slice_in_dim(
            table, jnp.fft.rfft(extended, plan.nfft), c * _CHUNK, axis=0)

    return jax.lax.fori_loop(0, _chunks(count), body, table)


def _moves(src, q, curves, rows, spectra, query_spectra, probs, inf_mass, step, plan: _Plan):
    """L_q[e] (+) V for the moves e: V = curves[rows[src[e]]] (the rows of ``spectra``, or its
    extended values read at the query's taps)."""
    xp = array_module(curves)
    window = plan.window
    begin = window.left - plan.offset  # output j reads extended index j + begin - i
    if plan.nfft:
        full = xp.fft.irfft(spectra[src] * query_spectra[q], plan.nfft)
        out = full[:, begin:begin + window.size]
    elif xp is np:  # tap by tap: never the taps-by-points gather of every move at once
        extended = _extend(curves[rows[src]], window, step)
        weights = probs[q]
        out = np.zeros((src.shape[0], window.size))
        for i in range(plan.width):
            out += weights[:, i:i + 1] * extended[:, begin - i:begin - i + window.size]
    else:
        taps = begin + jnp.arange(window.size)[None, :] - jnp.arange(plan.width)[:, None]
        out = jax.vmap(lambda v, p: p @ _extend(v, window, step)[taps])(curves[rows[src]], probs[q])
    return out + inf_mass[q][:, None]


def _prepare(curves, rows, count, probs, step, plan: _Plan, table):
    if not plan.nfft:
        return None, None
    xp = array_module(curves)
    return _spectra(curves, rows, count, step, plan, table), xp.fft.rfft(probs, plan.nfft)


@kernel_jit(static_argnames=("plan", "rows"))
def _start(step, budget, *, plan: _Plan, rows: int):
    """What a forward pass starts from: Id in every row (level 0), a spare buffer and a spectra
    table of as many rows (for :func:`_forward_level` to take over), and the budget's limits."""
    xp = array_module(step)
    window = plan.window
    # (in NumPy the levels take their spectra fresh: no table to hold them)
    table = jnp.zeros((rows, plan.nfft // 2 + 1), np.complex128) if plan.nfft and xp is jnp else None
    limits = None if budget is None else _limits(budget, window, step)
    return (_rows_of(_identity_curve(window, step), rows), xp.zeros((rows, window.size)), table,
            limits)


# on a CPU the levels keep XLA's defaults: 3-8% slower with FAST_COMPILE
@kernel_jit(static_argnames=("plan",), donate_argnames=("out", "table"), cpu_options=None)
def _forward_level(curves, out, table, rows, count, source, query, moves, probs, inf_mass, step,
                   limits, *, plan: _Plan):
    """The compositions L_query[e] (+) curves[rows[source[e]]] for e < moves, written into the
    first rows of ``out`` (the rest keep what they held), with their excess over the budget at the
    grid points and everywhere (inf beyond ``moves``; 0 without ``limits``); ``table``: room for
    the sources' spectra. Returns (out, table, excesses at the points, excesses everywhere):
    ``out`` and ``table`` are taken over (donated; in NumPy ``out`` is written in place and
    ``table`` is None), so a pass allocates them once."""
    xp = array_module(curves)
    window = plan.window
    spectra, query_spectra = _prepare(curves, rows, count, probs, step, plan, table)
    size = source.shape[0]
    fill = xp.inf if limits is not None else 0.0
    if xp is np:
        moves = int(moves)
        values = _moves(source[:moves], query[:moves], curves, rows, spectra, query_spectra,
                        probs, inf_mass, step, plan)
        out[:moves] = values
        at_points, everywhere = np.full(size, fill), np.full(size, fill)
        if limits is not None and moves:
            at_points[:moves] = map_rows(lambda v: _excess_at_points(v, limits, window, step))(
                values)
            everywhere[:moves] = map_rows(lambda v: _full_excess(v, limits, window, step))(values)
        return out, spectra, at_points, everywhere

    def body(c, carry):
        out, at_points, everywhere = carry
        values = _moves(_chunk(source, c), _chunk(query, c), curves, rows, spectra,
                        query_spectra, probs, inf_mass, step, plan)
        out = jax.lax.dynamic_update_slice_in_dim(out, values, c * _CHUNK, axis=0)
        if limits is not None:
            points = jax.vmap(lambda v: _excess_at_points(v, limits, window, step))(values)
            full = jax.vmap(lambda v: _full_excess(v, limits, window, step))(values)
            at_points = jax.lax.dynamic_update_slice_in_dim(at_points, points, c * _CHUNK, 0)
            everywhere = jax.lax.dynamic_update_slice_in_dim(everywhere, full, c * _CHUNK, 0)
        return out, at_points, everywhere

    init = (out, jnp.full((size,), fill), jnp.full((size,), fill))
    out, at_points, everywhere = jax.lax.fori_loop(0, _chunks(moves), body, init)
    return out, spectra, at_points, everywhere


@kernel_jit(static_argnames=("plan",), cpu_options=None)
def _backward_level(curves, count, source, query, target, moves, probs, inf_mass, step, *,
                    plan: _Plan):
    """W at the level above: row r is max(Id, L_query[e] (+) curves[source[e]] for the moves
    e < ``moves`` with target[e] = r), for the first ``count`` rows of ``curves`` as sources."""
    xp = array_module(curves)
    window = plan.window
    rows = xp.arange(curves.shape[0])
    table = (jnp.zeros((rows.shape[0], plan.nfft // 2 + 1), np.complex128)
             if plan.nfft and xp is jnp else None)
    spectra, query_spectra = _prepare(curves, rows, count, probs, step, plan, table)
    init = _rows_of(_identity_curve(window, step), curves.shape[0])
    if xp is np:
        moves = int(moves)
        values = _moves(source[:moves], query[:moves], curves, rows, spectra, query_spectra,
                        probs, inf_mass, step, plan)
        np.maximum.at(init, target[:moves], values)
        return init

    def body(c, out):
        values = _moves(_chunk(source, c), _chunk(query, c), curves, rows, spectra,
                        query_spectra, probs, inf_mass, step, plan)
        valid = c * _CHUNK + jnp.arange(_CHUNK) < moves
        return out.at[_chunk(target, c)].max(jnp.where(valid[:, None], values, -jnp.inf))

    return jax.lax.fori_loop(0, _chunks(moves), body, init)


# -- the passes -----------------------------------------------------------------------------------
class _Problem(NamedTuple):
    """The family on device and the kernels' static shape."""

    family: Family
    plan: _Plan
    probs: np.ndarray  # host arrays: the kernels take them as arguments
    inf_mass: np.ndarray
    step: np.float64
    capacity: int  # rows of the forward kernels: the largest level, padded
    host: bool  # whether the kernels run in NumPy (see the module docstring)


def _problem(family: Family, window: Window, rounds: int) -> _Problem:
    """The kernels' shapes; ValueError when they exceed the memory guards."""
    m = family.probs.shape[0]
    largest = max(math.comb(m + t - 1, t) for t in range(rounds + 1))
    plan = _plan(family, window)
    capacity = _capacity(largest)
    values = capacity * (2 * window.size + plan.nfft + 2)
    if capacity > _MAX_ROWS or values > _MAX_VALUES:
        raise ValueError(
            f"queries, rounds: {m} queries over {rounds} rounds need up to {largest} query "
            f"multisets a level, each a curve of {window.size} grid points ({values} values at "
            f"once), more than the memory guards allow ({_MAX_ROWS} multisets, {_MAX_VALUES} "
            "values); use fewer queries or rounds, or coarser grids")
    return _Problem(family, plan, np.asarray(family.probs, np.float64),
                    np.asarray(family.inf_mass, np.float64), np.float64(family.step), capacity,
                    values <= HOST_VALUES and host_work.claim(values))


def _forward(p: _Problem, curves, sources: list[int], moves: list[tuple[int, int]], limits,
             buffers):
    """_forward_level on padded arrays: ``sources`` rows of ``curves``, ``moves`` (position in
    ``sources``, query), into ``buffers`` (out, table), which it takes over. Returns (curves in
    rows 0 .. len(moves) - 1, the spectra table, excess at the grid points, excess everywhere)."""
    cap = p.capacity
    out, table = buffers
    source = _padded_ints([s for s, _ in moves], cap)
    query = _padded_ints([q for _, q in moves], cap)
    return _host_or_compiled(_forward_level, p.host)(
        curves, out, table, _padded_ints(sources, cap), np.int32(len(sources)), source, query,
        np.int32(len(moves)), p.probs, p.inf_mass, p.step, limits, plan=p.plan)


def _fresh(p: _Problem, budget):
    """(Id rows, (spare rows, spectra table), limits) from :func:`_start`."""
    identity, spare, table, limits = _host_or_compiled(_start, p.host)(
        p.step, budget, plan=p.plan, rows=p.capacity)
    return identity, (spare, table), limits


def _all_curves(p: _Problem, rounds: int, budget) -> list:
    """The composition of every multiset of at most ``rounds`` queries: per level, the device
    array of padded rows in the order of :func:`_multisets` (the parent of ms is ms[:-1])."""
    m = p.probs.shape[0]
    curves, buffers, limits = _fresh(p, budget)
    levels = [curves]
    index = {(): 0}
    for t in range(1, rounds + 1):
        level = _multisets(m, t)
        moves = [(index[ms[:-1]], ms[-1]) for ms in level]
        curves = _forward(p, curves, list(range(len(index))), moves, limits, buffers)[0]
        index = {ms: row for row, ms in enumerate(level)}
        levels.append(curves)
        buffers = _fresh(p, budget)[1]  # every level is kept
    return levels


class Analysis(NamedTuple):
    """Legality and reachability of every multiset of at most ``rounds`` queries (False for
    multisets that no reachable one leads to: their compositions are never needed)."""

    problem: _Problem
    budget: _Budget
    limits: _Limits
    multisets: list  # list of levels: level t holds the multisets of size t
    index: dict  # multiset -> (level, row)
    legal_upper: list  # level t: (count_t,) composition below B at the grid points (+ROUNDOFF)
    legal_lower: list  # level t: (count_t,) composition below B at every eps
    reach_upper: list
    reach_lower: list


def _analyse(queries, budget: PLD, rounds: int) -> Analysis:
    family = _family(queries)
    b = _budget(budget)
    p = _problem(family, _window(family, rounds, budget), rounds)
    m = family.probs.shape[0]

    multisets = [[()]]
    index = {(): (0, 0)}
    legal_upper = [np.array([True])]
    legal_lower = [np.array([True])]
    reach_upper = [np.array([True])]
    reach_lower = [np.array([True])]
    # the two curve buffers alternate: the last level's and the next one's
    curves, (spare, table), limits = _fresh(p, b)
    position = {(): 0}  # row in ``curves`` of each computed multiset of the last level
    for t in range(1, rounds + 1):
        level = _multisets(m, t)
        for row, ms in enumerate(level):
            index[ms] = (t, row)
        sources = [ms for row, ms in enumerate(multisets[t - 1]) if reach_upper[t - 1][row]]
        source_of = {ms: k for k, ms in enumerate(sources)}
        candidates, moves = [], []
        for row, ms in enumerate(level):
            reached = [(i, rest) for i, rest in _removals(ms) if rest in source_of]
            if reached:  # the parent ms[:-1] when it is reached, as the full table would use
                i, rest = next((x for x in reached if x[1] == ms[:-1]), reached[0])
                candidates.append(row)
                moves.append((source_of[rest], i))
        up = np.zeros(len(level), bool)
        low = np.zeros(len(level), bool)
        r_up = np.zeros(len(level), bool)
        r_low = np.zeros(len(level), bool)
        if candidates:
            new, table, at_points, everywhere = _forward(
                p, curves, [position[ms] for ms in sources], moves, limits, (spare, table))
            curves, spare = new, curves
            at_points = np.asarray(at_points)[:len(candidates)]
            everywhere = np.asarray(everywhere)[:len(candidates)]
            up[candidates] = at_points <= ROUNDOFF
            low[candidates] = everywhere <= ROUNDOFF
        for row in candidates:
            for _, rest in _removals(level[row]):
                _, prow = index[rest]
                r_up[row] |= reach_upper[t - 1][prow]
                r_low[row] |= reach_lower[t - 1][prow]
        r_up &= up
        r_low &= low
        position = {level[row]: k for k, row in enumerate(candidates)}
        multisets.append(level)
        legal_upper.append(up)
        legal_lower.append(low)
        reach_upper.append(r_up)
        reach_lower.append(r_low)
    return Analysis(p, b, limits, multisets, index, legal_upper, legal_lower, reach_upper,
                    reach_lower)


def _recursion(a: Analysis, rounds: int, upper: bool):
    """V_rounds(Id) in row 0 of the result, as curve values (upper or lower bound):
    W(M) = max(Id, L_i (+) W(M + i) over the reachable M + i), level by level from the top (see
    the module docstring)."""
    p = a.problem
    m = p.probs.shape[0]
    reach = a.reach_upper if upper else a.reach_lower
    reached = [[ms for ms, r in zip(level, flags, strict=True) if r]
               for level, flags in zip(a.multisets, reach, strict=True)]
    rows = _capacity(max(len(level) for level in reached))
    moves_cap = _capacity(m * rows)
    # W = Id on level rounds
    values = _host_or_compiled(_identity_rows, p.host)(p.step, window=p.plan.window, rows=rows)
    position = {ms: k for k, ms in enumerate(reached[rounds])}
    for t in range(rounds - 1, -1, -1):
        source, query, target = [], [], []
        for k, ms in enumerate(reached[t]):
            for i in range(m):
                child = tuple(sorted(ms + (i,)))
                if child in position:
                    source.append(position[child])
                    query.append(i)
                    target.append(k)
        values = _host_or_compiled(_backward_level, p.host)(
            values, np.int32(len(position)), _padded_ints(source, moves_cap),
            _padded_ints(query, moves_cap), _padded_ints(target, moves_cap), np.int32(len(source)),
            p.probs, p.inf_mass, p.step, plan=p.plan)
        position = {ms: k for k, ms in enumerate(reached[t])}
    return values


class Bounds(NamedTuple):
    """V_k(Id) bracketed: ``upper`` (a pessimistic PLD), ``lower`` (its curve's values at
    ``epsilons``, each below the true V_k there), ``gap`` (largest difference of the two curves
    at the grid points)."""

    upper: PLD
    epsilons: np.ndarray
    upper_deltas: np.ndarray
    lower_deltas: np.ndarray
    gap: float


@kernel_jit(static_argnames=("window",))
def _summary(up_rows, low_rows, step, limits: _Limits, *, window: Window):
    """From row 0 of the recursions' results: the grid, both curves, the upper curve's PLD
    (Alg. 1: masses, inf mass, offset, step), the gap, and the excess over the budget of the upper
    bound (everywhere) and of the lower one (at the grid points)."""
    xp = array_module(up_rows)
    up, low = up_rows[0], low_rows[0]
    eps = (window.start + xp.arange(window.size)) * step
    probs, inf_mass = masses_from_curve(up, step, up + xp.expm1(eps), eps)
    offset = xp.asarray(window.start, np.int64)
    return (eps, up, low, probs, inf_mass, offset, xp.asarray(step), xp.max(up - low),
            _full_excess(up, limits, window, step), _excess_at_points(low, limits, window, step))


def _bounds(a: Analysis, rounds: int) -> tuple[Bounds, float, float]:
    """The bounds, and the excesses over the budget of the upper and of the lower one."""
    p = a.problem
    up = _recursion(a, rounds, upper=True)
    same_moves = all(np.array_equal(u, v) for u, v in zip(a.reach_upper, a.reach_lower, strict=True))
    low = up if same_moves else _recursion(a, rounds, upper=False)
    eps, up, low, probs, inf_mass, offset, step, gap, upper_excess, lower_excess = (
        _host_or_compiled(_summary, p.host)(up, low, p.step, a.limits, window=p.plan.window))
    pld = unchecked_pld(*(to_device(x) for x in (probs, inf_mass, offset, step)), True)
    bounds = Bounds(pld, np.asarray(eps), np.asarray(up), np.asarray(low), float(gap))
    return bounds, float(upper_excess), float(lower_excess)


@announces_slow_calls("pldjax.natural_filter_bounds")
@float64
def natural_filter_bounds(queries, *, budget: PLD, rounds: int) -> Bounds:
    """Upper and lower bounds on V_rounds(Id), the natural filter's worst-case PLD (Thm 6), for a
    finite family of symmetric query PLDs (aligned onto one grid step, see the module docstring;
    Id is always allowed).

    Args:
      queries: the query family, a non-empty iterable of unbatched symmetric PLDs (one direction
        each; ValueError otherwise), aligned onto one step first.
      budget: the natural filter's budget, one unbatched symmetric PLD (ValueError otherwise), on any
        step.
      rounds: k, the number of rounds, an integer >= 1. The compositions of up to ``rounds`` queries
        must fit the memory guards (at most 2^16 multisets a level, 2^30 values held at once), else
        a ValueError.

    Returns:
      A :class:`~pldjax.adaptive.natural_cost.Bounds` ``(upper, epsilons, upper_deltas, lower_deltas,
      gap)``. ``upper`` is a pessimistic PLD above V_rounds(Id) (an upper bound); ``epsilons`` is the
      recursion's grid (nats, NumPy float64); ``upper_deltas`` are the upper bound's curve values
      there and ``lower_deltas`` values at or below the true V_rounds(Id) curve there (a lower bound);
      ``gap`` (a float) is the largest difference of the two.
    """
    rounds = check_count("rounds", rounds, minimum=1)
    return _bounds(_analyse(queries, budget, rounds), rounds)[0]


@announces_slow_calls("pldjax.natural_filter_cost")
@float64
def natural_filter_cost(queries, *, budget: PLD, rounds: int) -> PLD:
    """V_rounds(Id) as a pessimistic PLD: an upper bound on the privacy of every analyst
    interacting with the natural filter of ``budget`` for ``rounds`` rounds using ``queries``
    (aligned onto one step first, see the module docstring).

    Args:
      queries: the query family, a non-empty iterable of unbatched symmetric PLDs (one direction
        each; ValueError otherwise), aligned onto one step first.
      budget: the natural filter's budget, one unbatched symmetric PLD (ValueError otherwise), on any
        step.
      rounds: k, the number of rounds, an integer >= 1. The compositions of up to ``rounds`` queries
        must fit the memory guards (at most 2^16 multisets a level, 2^30 values held at once), else
        a ValueError.

    Returns:
      A pessimistic :class:`PLD`, an upper bound on V_rounds(Id) (the ``upper`` of
      :func:`natural_filter_bounds`).
    """
    return natural_filter_bounds(queries, budget=budget, rounds=rounds).upper


class Verdict(NamedTuple):
    """``status``: "free" (V_k(Id) below the budget, from the upper bound), "not free" (an
    analyst provably exceeds it; ``witness`` says how) or "undecided" (the bounds straddle)."""

    status: str
    upper_excess: float
    lower_excess: float
    gap: float
    witness: dict | None


def _witness(a: Analysis, rounds: int) -> dict | None:
    """A strategy that provably exceeds the budget: play the multiset ``prefix``, then, depending
    on its outputs, one of the ``options`` (multisets played after it; each path legal). Its PLD
    is prefix (+) sup(options) <= V_k(Id); returned with an eps where it exceeds the budget."""
    p = a.problem
    window = p.plan.window
    eps = (window.start + np.arange(window.size)) * p.step
    budget_curve = np.asarray(a.limits.at_window)
    m = p.probs.shape[0]
    curves = _all_curves(p, rounds, a.budget)
    best = None
    for t in range(rounds):
        for row, prefix in enumerate(a.multisets[t]):
            if not a.reach_lower[t][row]:
                continue
            options = []
            for extra in range(1, rounds - t + 1):
                for more in _multisets(m, extra):
                    whole = tuple(sorted(prefix + more))
                    if _path_legal(a, prefix, more):
                        options.append((more, whole))
            if len(options) < 2:
                continue
            top = np.max(np.stack([np.asarray(curves[len(more)])[a.index[more][1]]
                                   for more, _ in options]), axis=0)
            for i in prefix:
                rows = np.broadcast_to(top, (p.capacity, window.size))
                top = np.asarray(_forward(p, rows, [0], [(0, i)], a.limits,
                                          _fresh(p, a.budget)[1])[0])[0]
            excess = np.where(eps >= 0, np.asarray(top) - budget_curve, -np.inf)
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


@announces_slow_calls("pldjax.natural_filter_free")
@float64
def natural_filter_free(queries, *, budget: PLD, rounds: int) -> Verdict:
    """Is the natural filter with ``budget`` free for ``rounds`` rounds of these queries?

    "free" when the upper bound on V_rounds(Id) is dominated by the budget (up to
    rounds * ROUNDOFF); "not free" when the lower bound exceeds it by more than that at some eps,
    with a witness strategy (see :func:`_witness`; None if the excess needs deeper adaptivity than
    one branching point); "undecided" otherwise. Queries on different steps are aligned first
    (exactly when possible, else pessimistically: see the module docstring); the budget may sit
    on any step.

    Args:
      queries: the query family, a non-empty iterable of unbatched symmetric PLDs (one direction
        each; ValueError otherwise), aligned onto one step first.
      budget: the natural filter's budget, one unbatched symmetric PLD (ValueError otherwise), on any
        step.
      rounds: k, the number of rounds, an integer >= 1. The compositions of up to ``rounds`` queries
        must fit the memory guards (at most 2^16 multisets a level, 2^30 values held at once), else
        a ValueError.

    Returns:
      A :class:`~pldjax.adaptive.natural_cost.Verdict` ``(status, upper_excess, lower_excess, gap,
      witness)``. ``status`` is "free", "not free" or "undecided" as above; ``upper_excess`` is the
      largest excess of the upper bound's curve over the budget's at every eps >= 0, ``lower_excess``
      that of the lower bound at the grid points eps >= 0, ``gap`` as in :func:`natural_filter_bounds`
      (floats); ``witness`` is None, or for "not free" a dict with the strategy (``prefix``,
      ``options``: lists of query indices) and where it exceeds the budget (``epsilon``, ``delta``,
      ``budget_delta``, ``excess``).
    """
    rounds = check_count("rounds", rounds, minimum=1)
    a = _analyse(queries, budget, rounds)
    bounds, upper_excess, lower_excess = _bounds(a, rounds)
    tol = rounds * ROUNDOFF
    if upper_excess <= tol:
        return Verdict("free", upper_excess, lower_excess, bounds.gap, None)
    if lower_excess > tol:
        return Verdict("not free", upper_excess, lower_excess, bounds.gap, _witness(a, rounds))
    return Verdict("undecided", upper_excess, lower_excess, bounds.gap, None)


@announces_slow_calls("pldjax.totally_ordered")
@float64
def totally_ordered(queries, *, rounds: int, tolerance: float = ROUNDOFF) -> bool:
    """Thm 8's condition: every two compositions of 1 to max(``rounds`` - 1, 1) queries are
    ordered (one's curve below the other's at every grid point eps >= 0, up to ``tolerance``). If it holds the
    natural filter is free for every budget; if it fails for non-degenerate members it is not
    free for some budget at 2 rounds - 3 rounds.

    Args:
      queries: the query family, a non-empty iterable of unbatched symmetric PLDs (one direction
        each; ValueError otherwise), aligned onto one step first.
      rounds: an integer >= 1: the compositions of 1 to max(rounds - 1, 1) queries are compared. Their
        pairs must fit the memory guard (at most 2^25 pairs), and the compositions the guards of
        :func:`natural_filter_bounds`, else a ValueError.
      tolerance: how far one curve may rise above another and still count as below it, finite and
        >= 0; default ROUNDOFF (1e-14).

    Returns:
      True (a Python bool) when every two of these compositions are ordered, else False.
    """
    rounds = check_count("rounds", rounds, minimum=1)
    check_range("tolerance", tolerance, 0.0)
    family = _family(queries)
    depth = max(rounds - 1, 1)
    m = family.probs.shape[0]
    compositions = sum(math.comb(m + t - 1, t) for t in range(1, depth + 1))
    if compositions * compositions > MAX_SIZE:  # the table of pairs: a memory guard
        raise ValueError(
            f"queries, rounds: {m} queries over {rounds} rounds give {compositions} compositions, "
            f"whose {compositions ** 2} pairs exceed the memory guard ({MAX_SIZE} pairs); use "
            "fewer queries or rounds")
    p = _problem(family, _window(family, depth), depth)
    levels = _all_curves(p, depth, None)
    window = p.plan.window
    nonnegative = np.asarray((window.start + np.arange(window.size)) * family.step >= 0)
    stacked = np.concatenate([np.asarray(levels[t])[:math.comb(m + t - 1, t)]
                              for t in range(1, depth + 1)])[:, nonnegative]
    below = np.asarray(_host_or_compiled(_largest_differences, p.host)(stacked)) <= tolerance
    return bool(np.all(below | below.T))


@kernel_jit
def _largest_differences(curves):
    """max over the points of curves[i] - curves[j], for every pair (i, j): one fused reduction,
    so the pairs-by-points differences are never held at once."""
    if array_module(curves) is np:  # a row of pairs at a time
        return np.stack([np.max(row - curves, axis=-1) for row in curves])
    return jnp.max(curves[:, None, :] - curves[None, :, :], axis=-1)
