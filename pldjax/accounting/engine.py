"""The batched accounting engine: epsilon or delta of T runs of any
:class:`~pldjax.mechanisms.events.Event` (:func:`event_epsilon`, :func:`event_delta`).

For one configuration or for many at once (an event's parameters may be arrays: a batch).
Configurations are sorted by the grid they need (:mod:`pldjax.accounting.planner`) and processed
in fixed-size chunks: per chunk, one vmapped call discretizes both directions
(:meth:`~pldjax.mechanisms.events.Event.directions`) and one places every composition's window
(Chernoff); each row then waits, with the rows of later chunks that need the same window size,
for a fused call that composes (an FFT power per row) and evaluates. Chunks keep memory bounded
and shapes repeat, so a sweep compiles a handful of kernels, whatever its length. When several
devices are visible the configuration axis of each chunk is sharded over a one-dimensional
device mesh (``jax.sharding``).

One composition for two directions. Where the add pair is the remove pair with P and Q swapped
(Poisson subsampling), a pessimistic composition of the remove direction also bounds the add
direction's delta (:func:`~pldjax.kernels.compose.swapped_delta_bound`). On the host's glue
(a CPU), epsilon's remove rows are discretized and composed first, alone, and only the
configurations whose bound stays above delta at the remove direction's epsilon have their add
rows discretized and composed afterwards (:func:`_one_direction`), so every value is the one
that composing both rows gives, or lower where the add direction's composition was the looser
bound. The sweep of 1,024 DP-SGD sigmas discretizes and composes 1,074 rows instead of 2,048,
with the same values. A compiled call of one configuration discretizes its add row with its
remove row, in the place of the repeat that pads a discretization to two rows, and composes it
in the remove row's call where both windows have one size, or alone once the bound leaves the
add direction open (:attr:`_Compositions.lone_pair`): the same values, and no second phase.
A pessimistic call discretized on the host discretizes the remove rows alone and exchanges
their pairs for the add rows (:func:`~pldjax.core.pld.swapped_rows`: connect-the-dots
commutes with the exchange, so they are the add direction's own to about 1e-10, but for a +inf
atom, the round-off of Q's mass: where that atom, composed, could move a small delta's reading,
the add rows are discretized themselves, see SWAPPED_ATOM_SHARE), and composes at once those
that the bound is unlikely to settle (:func:`_settled_by_remove`). An optimistic estimate (a
lower bound) is the larger of its directions' epsilons, each a lower bound on its own: the add
direction is composed only where the same bound, read from the remove direction's optimistic
composition, says that it may be the larger (the optimistic sweep of 1,024: 1,074 rows, with
the same values).

Every value is pessimistic (an upper bound on the true epsilon or delta) unless
``pessimistic=False`` is passed, which gives the optimistic lower bound.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pldjax.accounting.planner import (
    accuracy_steps,
    bulk_resolving_steps,
    check_rtol,
    composition_tail,
    configuration_sizes,
    covering_steps,
    gaussian_poisson_parameters,
    half_widths_nats,
    lattice_steps,
    mechanism_points,
    mechanism_tail,
    optimistic_steps,
    rtol_remedy,
    spends,
)
from pldjax.core import grid as grid_lib
from pldjax.core.compilation import (
    MappingGuard,
    array_module,
    compiles_started,
    compiling_ahead,
    cores,
    exported_jit,
    host_work,
    keep_freed_host_memory,
    map_in_threads,
    map_rows,
)
from pldjax.core.grid import Grid
from pldjax.core.notice import slow_call_notice
from pldjax.core.pld import swapped_rows
from pldjax.core.precision import float64, quotient_rounded
from pldjax.core.validation import (
    broadcast_arguments,
    check_flag,
    check_range,
    check_whole,
    refuse_traced,
)
from pldjax.kernels.chernoff import pure_epsilon
from pldjax.kernels.compose import (
    BLOCKED_POINTS,
    COARSER_GRID,
    STEP_ROUNDOFF,
    UNIT_ROUNDOFF,
    CompositionTooWide,
    PMFSummary,
    checked_size,
    chernoff_exponents,
    compose_wrapped_rows,
    pmf_summary,
    summary_window,
    swapped_delta_bound,
    tail_bounds,
    window_start,
    window_widths,
    wrap_rows,
    wrap_tiled_rows,
)
from pldjax.kernels.discretize import MECHANISM_KERNELS, runs_on_host
from pldjax.kernels.gaussian_dp import gdp_delta_bound, gdp_epsilon_bound
from pldjax.kernels.hockey_stick import delta_kernel, epsilon_kernel
from pldjax.kernels.rows import TILE, TiledRows
from pldjax.mechanisms.events import Event, direction_arrays, distinct_configurations
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import Noise
from pldjax.mechanisms.sampling import Directions
from pldjax.mechanisms.subsampling import ADD, REMOVE

#: Most configurations discretized together (per device when sharded; enough that a CPU's chunk
#: of any size fills the tiles of its masses' one program, see :func:`_tiled`), the most mechanism
#: grid points (configurations x points) one chunk discretizes (about 200 bytes each at the peak of
#: discretization and window placement: 32 configurations on 131,072 points took the process
#: from 0.3 to 1.5 GB; bench/dpsgd.py's sweep peaks at 0.9-1.0 GB with 2^18, 1.4 GB without the
#: limit, equally fast), and the most grid points (rows x size) one composition call handles:
#: together they bound the memory in use.
CHUNK = 128
CHUNK_ELEMENTS = 2**18
#: The most mechanism grid points of one chunk discretized on the host (see :func:`_on_host`),
#: where rows are discretized one by one and their masses kept until the call is placed.
HOST_CHUNK_ELEMENTS = 2**22
#: Most rows a call discretizes on the host per distinct mechanism grid size it has (on average:
#: this many times the number of sizes in all, a call's host and compiled costs): NumPy takes about
#: 5 ms a row (mostly its per-operation cost, on rows of 2^11-2^17 points; in threads it took
#: longer), where the compiled path compiles for seconds (2-core CPU: its masses 1.5 s, one
#: program for every size since they are tiled, 1-3 s before, a program per size). The sweep of
#: 1,024 sigmas (2,048 rows on 5 sizes) took 10.6 s on the host, 8 s compiling a program per
#: size.
HOST_ROWS_PER_SIZE = 256
#: Where each row's PMF centre sits among a chunk's row scalars (they begin with its summary).
_CENTER = PMFSummary._fields.index("center")
#: Most grid points a process composes in NumPy at one composition size, over all its calls
#: (about 65 ns a point there, 2-core CPU, where compiling that size takes about 1.5 CPU-s with
#: its tracing): then, and for rows that would go beyond, the compiled kernel (see
#: :func:`_account_chunk`). A call discretized by the compiled kernels on a CPU composes in NumPy
#: the sizes it has few rows of and no program ready for, where their points, summed over the
#: call (as its survey estimates them, see :meth:`_Compositions.start_sizes`), fit in what is
#: left of this: the sweep of 1,024 sigmas composes its 9 rows of 32,768 points and 149 of
#: 49,152 so, and compiles two programs instead of four (first call 7.4-7.5 s against 8.0-8.1
#: s, side by side; its third call, which then compiles the 49,152 points' program, 4.2-4.4 s
#: against 3.0-3.1 s; a process with the persistent cache filled loads all four, as before).
HOST_SIZE_POINTS = 2**24
#: The most of delta that the +inf atom of a pessimistic call's add rows exchanged from its
#: remove rows (:func:`~pldjax.core.pld.swapped_rows`: Q's mass beyond the remove row's, the
#: round-off bound of its sum, about 3e-15) may reach once composed: beyond it, the add rows are
#: discretized themselves (charged whole at every step, that atom read epsilon = inf for sigma 1,
#: q 0.01 and 10,000 steps at delta 1e-11, where the add direction's own rows read 8.90).
SWAPPED_ATOM_SHARE = 1e-4
COMPOSE_ELEMENTS = 2**23
#: On a CPU, small windows share a composition call up to this many grid points (see
#: :func:`_rows_per_call`).
CPU_CALL_ELEMENTS = 2**18
#: Windows of up to this many points are composed at a power of two, larger ones at
#: grid.half_octave_size (two sizes an octave), except on one accelerator (powers of two
#: throughout): a composition shape takes seconds to compile on a CPU whatever its size, and
#: padding a small window costs little. bench/compile.py's 256 random configurations compose at
#: 11 sizes (21 at four sizes an octave), compiled 29 programs instead of 43 in a 29 s first call
#: instead of 48 s, and run 13% slower warm (one configuration 15%: 98,304 points, not 81,920).
SMALL_WINDOW = 8192
#: The most rows of any composition call: the evaluation holds a few 128 x 128 matrices a row
#: whatever the window (about 0.4 MB a row at its peak), so tiny windows must not fill a call
#: of COMPOSE_ELEMENTS points (4 million rows of 2 points asked for 567 GB).
CALL_ROWS = 1024
#: On a CPU, composition calls run in up to this many worker threads, one a core: XLA spreads a
#: call's FFTs over the cores unevenly (a call of 2 rows of 98,304 points took 13 ms of CPU time
#: in 12.8 ms on 2 cores), so a second call in flight, and the host's glue for the next one,
#: fill the other core.
COMPOSE_WORKERS = 4
#: CHUNK and CHUNK_ELEMENTS on an accelerator, where a call's cost is mostly its launch and a
#: chunk's memory (about 200 bytes a point, 3.4 GB) is small beside the device's.
ACCELERATOR_CHUNK = 1024
ACCELERATOR_CHUNK_ELEMENTS = 2**24
#: On an accelerator, the most tiles a chunk's masses are computed in wherever they are in tiles
#: (see :func:`_tiled`; two directions of ACCELERATOR_CHUNK_ELEMENTS points): every chunk of a
#: call in as many, those of all the call's rows up to this many, whatever their grids, so that
#: its masses are one program (a program per grid size took about 6 s each to compile on an
#: H200) and a small call's are small, each chunk with as many configurations as fill them.
ACCELERATOR_TILES = 2 * ACCELERATOR_CHUNK_ELEMENTS // TILE
#: Configurations of a call whose windows are placed in NumPy, before its first chunk, to
#: start compiling the composition sizes they need (see :func:`_survey`): shared among its
#: groups in proportion to their configurations, at least one each; about 5 ms each on a
#: 2-core CPU, once a process, ahead of the compositions' programs (16 a group took 0.45 s of
#: the 1,024-sigma sweep's first call, on 5 groups).
SURVEYED = 16
#: On one accelerator, the most composition calls queued to its worker thread and not yet
#: dispatched (each holds its chunk's arrays on the device; see _Compositions._dispatch).
GATHERED_CALLS_AHEAD = 16


@exported_jit(static_argnames=("pessimistic", "evaluate", "swapped"))
def _compose_and_evaluate(wrapped, summary, inf_mass, offset, step, count, target, exponents, *,
                          pessimistic, evaluate, swapped=False):
    """Each row's count-fold composition (its PMF wrapped to the window,
    :func:`~pldjax.kernels.compose.wrap_rows`), read at its target: one compiled shape per (rows,
    window size). With ``swapped`` (``evaluate="epsilon"``), each row's epsilon is paired with
    :func:`~pldjax.kernels.compose.swapped_delta_bound` of its composition there (rows, 2): of
    pessimistic rows an upper bound on the swapped pair's delta, of optimistic rows an estimate
    of it. Its function itself
    (``_compose_and_evaluate.__wrapped__``) runs on NumPy rows in NumPy (a bool
    ``pessimistic``)."""
    kernel = epsilon_kernel if evaluate == "epsilon" else delta_kernel
    probs, composed_inf, start, *parts = compose_wrapped_rows(
        wrapped, summary, inf_mass, offset, step, count, exponents,
        tail=composition_tail(target, evaluate), pessimistic=pessimistic, swapped=swapped,
    )
    values = map_rows(lambda p, m, o, h, t: kernel(p, m, o, h, t[None], pessimistic)[0])(
        probs, composed_inf, start, step, target)
    if not swapped:
        return values
    bounds = map_rows(swapped_delta_bound)(parts[0], start, step, count, values)
    xp = array_module(values)
    return xp.stack([values, bounds], axis=-1)


@exported_jit(static_argnames=("size",))
def _gather_rows(probs, index, scalars, *, size):
    """The rows ``index`` of a chunk kept on the device, ready for :func:`_compose_and_evaluate`:
    ``probs`` (chunk rows, mechanism grid) wrapped to ``size``, and ``scalars`` (each with a
    leading chunk rows axis) gathered (a caller pads ``index`` to a full composition call with
    repeats, so that the composition's compiled shapes depend on the window alone; this program
    is cheap to compile per chunk shape)."""
    return (wrap_rows(jnp, probs[index], size, scalars[_CENTER][index]),
            [a[index] for a in scalars])


class _Tiled(NamedTuple):
    """A chunk's masses kept in tiles on the device (see :func:`_placed_tiles`), its rows in this
    module's order, each ``points`` points long."""

    masses: jax.Array
    points: np.int64


@exported_jit(static_argnames=("size", "folds"))
def _gather_tiled_rows(masses, points, index, scalars, *, size, folds):
    """:func:`_gather_rows` of a chunk's masses in tiles (:class:`_Tiled`: ``points``, data,
    at most ``folds`` times ``size``): one program a window size, whatever the mechanism's
    grid."""
    return (wrap_tiled_rows(masses, points, index, size, folds, scalars[_CENTER][index]),
            [a[index] for a in scalars])


def _gathered(probs, index, scalars, size: int):
    """:func:`_gather_rows` of a chunk's masses, or :func:`_gather_tiled_rows` of masses in
    tiles."""
    if isinstance(probs, _Tiled):
        folds = max(1, -(-int(probs.points) // size))
        return _gather_tiled_rows(*probs, index, scalars, size=size, folds=folds)
    return _gather_rows(probs, index, scalars, size=size)


def _placement_rows(probs, offset, step, count, target, evaluate):
    """Each row's count-fold composition: its Chernoff tail window (lo, hi) (grid indices) for
    :func:`composition_tail`, the exponents it came from (which the composition reuses for its
    tail bounds) and the PMF's :func:`~pldjax.kernels.compose.pmf_summary`."""
    def one(p, o, h, c, t):
        tail = composition_tail(t, evaluate)
        exponents = chernoff_exponents(p, o, h, c, tail)
        summary = pmf_summary(p)
        lo, hi = summary_window(summary, o, h, c, tail, exponents)
        return lo, hi, exponents, summary

    return map_rows(one)(probs, offset, step, count, target)


def _placed_rows(probs, inf_mass, offset, step, count, target, *, directions: int, evaluate: str):
    """The discretization's ``then`` (see :func:`~pldjax.mechanisms.events.direction_arrays`): its rows
    in this module's order (every configuration's first direction, then every one's second), with
    their windows placed (:func:`_placement_rows`; ``count`` and ``target`` in that order):
    (probs, inf_mass, offset, step, lo, hi, exponents, summary). It runs in the program of the
    masses, which is queued behind the curve's without a round trip through the host."""
    xp = array_module(probs)

    def by_direction(a):
        a = a.reshape((-1, directions) + a.shape[1:])
        return xp.moveaxis(a, 1, 0).reshape((-1,) + a.shape[2:])

    probs, inf_mass, offset, step = (by_direction(a) for a in (probs, inf_mass, offset, step))
    return (probs, inf_mass, offset, step,
            *_placement_rows(probs, offset, step, count, target, evaluate))


@functools.cache
def _placement(directions: int, evaluate: str) -> Callable:
    """:func:`_placed_rows` for ``directions`` and ``evaluate``: one object each, as the
    discretization kernels' static ``then`` must be to reuse their compiled programs."""
    return functools.partial(_placed_rows, directions=directions, evaluate=evaluate)


def _placed_tiles(probs, inf_mass, offset, step, layout: TiledRows, count, target, *,
                  directions: int, evaluate: str):
    """:func:`_placed_rows` of rows in tiles (see
    :func:`~pldjax.kernels.discretize._mechanism_kernel`'s ``tiles``): ``count`` and ``target``
    one a row in the discretization's order (the directions innermost), padded to the tiles;
    returns the masses in tiles and every row's placement (one value a row, as many as tiles),
    the rows in this module's order (every configuration's first direction, then every one's
    second: :meth:`~pldjax.kernels.rows.TiledRows.by_direction`), the padding rows last."""
    per_row = layout.per_row_values
    count, target = (layout.spread(a) for a in (count, target))
    exponents = chernoff_exponents(probs, offset, step, count, composition_tail(target, evaluate),
                                   layout)
    exponents = [per_row(e)[0][:, None] for e in exponents]
    summary = PMFSummary(*(per_row(field) for field in pmf_summary(probs, layout)))
    offset, step, count, target = (per_row(a) for a in (offset, step, count, target))

    def window(s, o, h, c, t, e):
        return summary_window(s, o, h, c, composition_tail(t, evaluate), e)

    lo, hi = jax.vmap(window)(summary, offset, step, count, target, exponents)
    rows, tiles = layout.by_direction(directions)
    return (probs[tiles], *(a[rows] for a in (per_row(inf_mass), offset, step, lo, hi)),
            [e[rows] for e in exponents], PMFSummary(*(field[rows] for field in summary)))


@functools.cache
def _tiled_placement(directions: int, evaluate: str) -> Callable:
    """:func:`_placed_tiles` for ``directions`` and ``evaluate`` (one object, see
    :func:`_placement`)."""
    return functools.partial(_placed_tiles, directions=directions, evaluate=evaluate)


def _sharding() -> NamedSharding | None:
    devices = jax.devices()
    if len(devices) == 1:
        return None
    return NamedSharding(Mesh(np.asarray(devices), ("configs",)), PartitionSpec("configs"))


def _place(arrays, sharding):
    if sharding is None:
        return arrays
    return [jax.device_put(a, sharding) for a in arrays]


def _keeps_chunks_on_device() -> bool:
    """True on an accelerator: chunks are large, the glue between compiled calls runs there and
    only a few scalars per row come to the host (a chunk's PMFs through the host and back took
    longer than their composition). On a CPU the glue runs in NumPy."""
    return jax.default_backend() != "cpu"


def _account_chunk(params, steps, target, *, compositions, mechanism, mechanism_size, both,
                   pessimistic, grid, grid_steps, evaluate, sharding, remedy, ahead=False,
                   tiles=None):
    """Values for one chunk of configurations (all steps >= 1), once ``compositions`` (a
    :class:`_Compositions`) has run: ``params`` are the flat parameters of ``mechanism``
    (:meth:`~pldjax.mechanisms.events.Event.directions`); ``grid_steps``: each one's mechanism grid
    step (nats; rtol's, a lattice's), or None for ``grid``'s.

    Both directions of every configuration (or the one of :func:`_one_direction`) are
    discretized, and their windows placed, in one call, queued here. Returns ``place``: it
    reads the windows' widths back (waiting for that call), hands each row to ``compositions``
    under the composition size it needs (:meth:`_Compositions.window_size`) and returns a
    function giving the chunk's values. A caller queues the next chunk's discretization before
    it places this one, so that on an accelerator the device has work while the host places.
    ``remedy``: what an error about a window that cannot be placed tells the caller to change.
    ``ahead``: only start compiling the chunk's discretization programs
    (:func:`~pldjax.core.compilation.compiling_ahead`); returns the shapes of the masses and
    the row scalars that ``place`` hands to ``compositions`` (:func:`_survey`). Where
    ``compositions.host``, the chunk is discretized and placed in NumPy, and so are its rows
    composed at each size of at most HOST_SIZE_POINTS points that the process may still compose
    on the host (a size's compiled program is a ski rental's purchase: a process composes that
    many points at the size in NumPy before it compiles the size's program); on a CPU a
    compiled call's rows are too, at sizes with no program compiled, in that share.
    ``tiles``: the chunk's masses are computed in that many tiles (see :func:`_tiled`).
    """
    # on a CPU the glue runs in NumPy on one device (each eager jnp operation would be one more
    # small program to compile, or to load from the cache, per process)
    xp = np if compositions.host_glue else jnp
    params = [np.asarray(p, np.float64) for p in params]
    steps, target = np.asarray(steps, np.float64), np.asarray(target, np.float64)
    one_direction = _one_direction(compositions, both)
    pair = one_direction and compositions.lone_pair and steps.shape[0] == 2
    discretized, directions = _chunk_directions(compositions, mechanism, params, steps, both,
                                                pair)
    both = directions == 2
    # rows: every configuration's first direction, then (when it has two) every one's second;
    # the host reads the counts (window widths), the discretization and every composition call
    # of the chunk read the counts and targets: on an accelerator put there once
    counts, targets = (np.concatenate([a] * directions) for a in (steps, target))
    row_counts, row_targets = counts, targets
    if sharding is not None:
        row_counts, row_targets = _place([counts, targets], sharding)
    elif not compositions.host_glue:  # in tiles, padded as the rows' other scalars: one shape
        padding = 0 if tiles is None else tiles - counts.shape[0]
        row_counts, row_targets = (jax.device_put(np.pad(a, (0, padding), mode="edge"))
                                   for a in (counts, targets))
    then, extra = _placement(directions, evaluate), (row_counts, row_targets)
    if tiles is not None:  # one a row in the discretization's order, padded to the tiles
        then = _tiled_placement(directions, evaluate)
        extra = tuple(np.pad(np.repeat(a, directions), (0, tiles - a.shape[0] * directions),
                             mode="edge") for a in (steps, target))
    discretize = functools.partial(
        direction_arrays, discretized, grid, pessimistic,
        mechanism_tail(steps, target, evaluate), mechanism_size, then=then, extra=extra,
        steps=grid_steps, host=compositions.host, tiles=tiles)
    if compositions.host and compositions.swapped and both and compositions.phase == "both":
        def rows_of_direction(direction, chosen):
            return direction_arrays(
                Directions(mechanism, (*(p[chosen] for p in params),
                                       np.full(steps[chosen].shape, direction)), False),
                grid, pessimistic, mechanism_tail(steps[chosen], target[chosen], evaluate),
                mechanism_size, then=_as_rows,
                steps=None if grid_steps is None else grid_steps[chosen], host=True)

        def discretize():  # the add rows from the remove rows, their pairs exchanged
            remove = rows_of_direction(REMOVE, slice(None))
            add = swapped_rows(*remove)
            own = steps * add[1] > SWAPPED_ATOM_SHARE * target
            if np.any(own):  # where that atom could move the reading: the add rows themselves
                add = [np.array(a) for a in add]  # (copies: a step array may be the remove's)
                for rows, direct in zip(add, rows_of_direction(ADD, own), strict=True):
                    rows[own] = direct
            return then(*(np.stack([r, a], axis=1).reshape((-1,) + r.shape[1:])
                          for r, a in zip(remove, add, strict=True)), *extra)
    if ahead:
        with compiling_ahead():
            probs, inf_mass, offset, step, lo, hi, exponents, summary = discretize()
        if tiles is not None and not compositions.host_glue:
            probs = _Tiled(probs, np.int64(mechanism_size))
        return probs, (*summary, inf_mass, offset, step, row_counts, row_targets, *exponents)
    probs, inf_mass, offset, step, lo, hi, exponents, summary = discretize()
    chunk_rows = counts.shape[0]
    if tiles is not None:  # the rows in this module's order (see _placed_tiles)
        per_row = -(-mechanism_size // TILE)
        if compositions.host_glue:  # as rows, padding dropped
            probs = np.asarray(probs)[:chunk_rows * per_row].reshape(chunk_rows, -1)[
                :, :mechanism_size]
            inf_mass, offset, step, lo, hi = (np.asarray(a)[:chunk_rows]
                                              for a in (inf_mass, offset, step, lo, hi))
            exponents = [np.asarray(e)[:chunk_rows] for e in exponents]
            summary = PMFSummary(*(np.asarray(f)[:chunk_rows] for f in summary))
        else:  # kept in tiles on the device, where the rows are gathered from
            probs = _Tiled(probs, np.int64(mechanism_size))
    # off the host glue (xp = jnp) these wait for nothing; on a CPU, where the chunk is placed
    # at once, they wait for the call as place() would
    inf_mass, offset, step = (xp.asarray(a) for a in (inf_mass, offset, step))
    probs = probs if isinstance(probs, _Tiled) else xp.asarray(probs)
    exponents = [xp.asarray(e) for e in exponents]
    summary = PMFSummary(*(xp.asarray(s) for s in summary))

    def row_sizes(rows: slice):
        """The composition sizes of ``rows``, each checked against grid.MAX_SIZE."""
        sizes = np.array([compositions.window_size(int(w)) for w in window_widths(
            PMFSummary(*(np.asarray(f)[rows] for f in summary)), np.asarray(offset)[rows],
            counts[rows], np.asarray(lo)[rows], np.asarray(hi)[rows], "steps", remedy)])
        for size in np.unique(sizes):
            checked_size(int(size), "dpsgd accounting", "steps", remedy)
        return sizes

    def place():
        try:
            sizes = row_sizes(slice(1 if pair else chunk_rows))
        except CompositionTooWide as error:
            # the first configuration that cannot be placed, named by its values (in a batch,
            # which one failed)
            for row in range(counts.shape[0]):
                try:
                    row_sizes(slice(row, row + 1))
                except CompositionTooWide as wide:
                    k = row % steps.shape[0]
                    values = ", ".join(f"{float(p[k]):.6g}" for p in params)
                    given = "delta" if evaluate == "epsilon" else "epsilon"
                    named = CompositionTooWide(
                        f"{str(error).removesuffix('; ' + remedy)} (at steps {steps[k]:.6g} and "
                        f"{given} {target[k]:.6g}, the mechanism's parameters ({values})); "
                        f"{remedy}")
                    if grid is None and grid_steps is None and wide.points is not None:
                        # on its automatic step: the step on which its window would fit
                        named.automatic_step = float(np.asarray(step)[row])
                        named.fitting_step = named.automatic_step * float(
                            grid_lib.next_pow2(-(-wide.points // grid_lib.MAX_SIZE)))
                    raise named from None
            raise
        if pair:  # an add row no window holds (0) is left to the add phase, which needs it or not
            try:
                sizes = np.concatenate([sizes, row_sizes(slice(1, 2))])
            except CompositionTooWide:
                sizes = np.concatenate([sizes, [0]])
        # a row repeated (the chunk's padding, or a configuration given twice) is composed once
        if steps.shape[0] == 1:
            first = same = np.arange(directions)
        else:
            config = np.column_stack([*discretized.params, steps, target])
            rows_of = np.column_stack([np.repeat(np.arange(directions), config.shape[0]),
                                       np.tile(config, (directions, 1))])
            _, first, same = np.unique(rows_of, axis=0, return_index=True, return_inverse=True)
        values = np.zeros((sizes.shape[0], 2) if compositions.swapped else sizes.shape[0])
        configs = counts.shape[0] // directions
        # the rows composed: every one, except where the remove composition bounds the add
        # direction: on the host's first phase the add rows whose pair's remove window holds
        # theirs are left out; else each phase's rows are of one direction
        left_out = np.zeros(counts.shape[0], bool)
        if compositions.swapped and not one_direction:
            left_out[configs:] = _settled_by_remove(
                sizes, lo, hi, PMFSummary(*(np.asarray(f) for f in summary)), offset, step,
                counts, [np.asarray(e) for e in exponents], targets)
        composed = first[~left_out[first]]
        if pair:  # the add row: in the remove row's call (below), or alone (in finish)
            composed = composed[composed == 0]
        scalars = (*summary, inf_mass, offset, step, row_counts, row_targets, *exponents)
        rows_of_size = {int(size): composed[sizes[composed] == size]
                        for size in np.unique(sizes[composed])}
        # sizes with no program compiled for their rows, fewest points first, composed in NumPy
        # while they fit in the process's host work and in their own share of it: a host
        # call's, and on a CPU a compiled call's few rows of a size (a sweep's last rows of a
        # size: no program compiled for them)
        on_host = {size for size, rows in sorted(rows_of_size.items(),
                                                 key=lambda item: len(item[1]) * item[0])
                   if compositions.host_glue and host_work.claim(
                       len(rows) * size, compositions.program(size), HOST_SIZE_POINTS)}
        # the lone configuration's add row in its remove row's call, on the remove row's size
        # (on another, see finish)
        rides = pair and sizes[1] == sizes[0] and int(sizes[0]) not in on_host
        if rides:
            rows_of_size[int(sizes[0])] = np.array([0, 1])
        for size, rows in rows_of_size.items():  # every new composition shape starts
            if size not in on_host:                # compiling at once
                compositions.compile_ahead(size, probs, scalars, len(rows))
        for size, rows in rows_of_size.items():
            compositions.add(size, probs, scalars, rows, values, size in on_host)

        def finish():
            """The chunk's values (in the add phase, the add direction's), and which of its
            configurations still need their add row composed (the bound did not settle it)."""
            read = values[first][same.reshape(-1)]
            if not compositions.swapped:
                return np.max(read.reshape(directions, -1), axis=0), np.zeros(configs, bool)
            if compositions.phase == "add":
                return read[:, 0], np.zeros(configs, bool)
            remove, bound = read[:configs, 0], read[:configs, 1]
            settled = (bound <= targets[:configs]) | (remove == np.inf)
            if pair and not settled[0] and (rides or sizes[1] > 0):
                # the lone configuration's add direction, which its remove row's bound leaves
                # open: its row composed already (rides), or now, alone on a size of its own
                if not rides:
                    size = int(sizes[1])
                    compositions.add(size, probs, scalars, np.array([1]), values,
                                     compositions.host_glue and host_work.claim(
                                         size, compositions.program(size), HOST_SIZE_POINTS))
                    compositions.flush()
                remove[0] = max(remove[0], values[1, 0])
                settled[0] = True
            if one_direction:  # every add row left out
                return remove, ~settled
            add = read[configs:, 0]
            skipped = left_out[configs:]
            return np.maximum(remove, np.where(skipped, -np.inf, add)), skipped & ~settled

        return finish

    return place


def _chunk_directions(compositions: _Compositions, mechanism, params, steps, both: bool,
                      pair: bool = False) -> tuple[Directions, int]:
    """The directions a chunk of configurations ``params`` discretizes, and the rows each
    configuration has: where :func:`_one_direction`, the direction of ``compositions.phase``
    alone, passed as one more parameter; with ``pair`` (a chunk of one configuration twice,
    see :attr:`_Compositions.lone_pair`), its remove direction, then its add direction."""
    if _one_direction(compositions, both):
        direction = REMOVE if compositions.phase == "both" else ADD
        chosen = np.array([REMOVE, ADD]) if pair else np.full(np.shape(steps), direction)
        return Directions(mechanism, (*params, chosen), False), 1
    return Directions(mechanism, tuple(params), both), 2 if both else 1


def _one_direction(compositions: _Compositions, both: bool) -> bool:
    """Whether a chunk of a mechanism with ``both`` directions discretizes the direction of
    ``compositions.phase`` alone: where the remove composition bounds the add direction
    (``compositions.swapped``), the remove rows first, then the add rows of the configurations
    that bound did not settle; except in a pessimistic call's first phase on the host, which
    derives the add rows from the remove rows (:func:`~pldjax.core.pld.swapped_rows`) and
    composes those it expects to need (:func:`_settled_by_remove`) at once."""
    return compositions.swapped and both and (not compositions.host or compositions.phase == "add"
                                              or not compositions.pessimistic)


def _as_rows(probs, inf_mass, offset, step):
    """A discretization's ``then`` that keeps its rows as they are."""
    return probs, inf_mass, offset, step


def _settled_by_remove(sizes, lo, hi, summary: PMFSummary, offset, step, counts, exponents,
                       deltas) -> np.ndarray:
    """For each configuration of a chunk of both directions (rows: every remove row, then every
    add row; each argument one a row), whether its add row can be left out: its remove row's
    composition window, as placed at its size (:func:`~pldjax.kernels.compose.window_start`),
    holds the add row's window mirrored and the remove row's PMF unfolded, so that the remove
    composition bounds the add direction too
    (:func:`~pldjax.kernels.compose.swapped_delta_bound`), and that bound is likely to settle
    it at ``deltas``: the mass folded into the window, weighted by e^epsilon there, is charged
    at below a quarter of delta at the largest epsilon the window holds, with the one-step
    masses' round-off (the rows it misses are composed afterwards)."""
    n = len(sizes) // 2
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    size = sizes[:n].astype(np.float64)
    start = window_start(lo[:n], hi[:n], size, True)
    holds = (start <= -hi[n:]) & (-lo[n:] <= start + size - 1) & (summary.points[:n] <= size)
    rows = (PMFSummary(*(f[:n] for f in summary)), offset[:n], step[:n], counts[:n], start,
            start + size - 1, [e[:n] for e in exponents])
    above, below = map_rows(tail_bounds)(*rows)
    with np.errstate(over="ignore", invalid="ignore"):
        charged = np.exp(np.minimum((start + size - 1) * step[:n], 700.0)) * (above + below)
    # and the one-step masses' round-off, charged count-fold
    charged += np.expm1(counts[:n] * np.log1p(STEP_ROUNDOFF * (summary.points[:n] + 1.0)
                                              * UNIT_ROUNDOFF))
    return holds & (charged <= deltas[:n] / 4)


class _Compositions:
    """Rows waiting for their composition and evaluation, by window size.

    On a CPU, and when sharded, across chunks: a size's rows are composed as soon as they fill a
    call (:func:`_rows_per_call`), and :meth:`flush` composes what is left, padded with repeats.
    On a CPU a call of fewer rows than cores takes as long as a full one, so a chunk's odd row
    waits for the next chunk's instead of sharing its call with a repeat (the sweep of 1,024
    sigmas composes 2,056 rows, 8 of them repeats). There the calls run in worker threads
    (COMPOSE_WORKERS) while the host discretizes and wraps the next rows: each call's rows and
    values are its own, so the values are those of calls made one after another (the sweep of
    1,024 sigmas took 12.3-12.8 s warm one call after another, 8.6-9.6 s in threads, on 2
    cores). On one accelerator a chunk's rows are composed straight from the chunk
    (:func:`_gather_rows`, :func:`_gather_tiled_rows`), the calls queued in order by a worker
    thread (:meth:`_dispatch`), and their values read back at :meth:`flush`, so the device runs
    ahead of the host; there every call of a size has the same number of rows (one compiled
    shape per size): a full call, or the power of two at or above ``rows``, the most rows the
    accounting call has (a single configuration's two directions composed 64 rows of 131,072
    points otherwise).

    ``host`` (a call discretized on the host, see :func:`_on_host`): the glue runs in NumPy, and
    the rows of the sizes its caller chooses are composed in NumPy by the kernel's own function,
    one row a call, in the worker threads, with nothing to compile.
    """

    def __init__(self, *, sharding, pessimistic: bool, evaluate: str, rows: int, tiles: int = 0,
                 host: bool = False, swapped: bool = False):
        self._sharding = sharding
        self._devices = 1 if sharding is None else len(jax.devices())
        self.host = host and sharding is None
        self._gathers = sharding is None and _keeps_chunks_on_device() and not self.host
        self.host_glue = sharding is None and not self._gathers
        #: Whether each composition also bounds its pair's swapped direction (see
        #: :func:`_compose_and_evaluate`; estimates it, optimistic): rows of the remove
        #: direction on the host's glue.
        self.swapped = swapped and self.host_glue
        #: "both": every row is composed, except (``swapped``) the add rows: none discretized
        #: (:func:`_one_direction`), or on the host those that their remove row's bound may
        #: settle (:func:`_settled_by_remove`); "add": the add rows alone (of the
        #: configurations whose bound did not), with the same programs.
        self.phase = "both"
        self._xp = np if self.host_glue else jnp
        #: The composition size for a window of ``width`` points (:func:`composition_size`), or
        #: on one accelerator the power of two (a quarter of the compiled shapes, compiled for
        #: seconds each there, for at most twice the points)
        self.window_size = grid_lib.next_pow2 if self._gathers else composition_size
        self.rows = rows  #: the rows of the whole accounting call
        self.tiles = tiles  #: the tiles of those rows' masses (each on its grid's tiles)
        self._sizes_seen: set[int] = set()
        self._full_sizes: set[int] = set()  # sizes whose full call has its program (see _run)
        self.pessimistic = pessimistic
        self._options = dict(pessimistic=pessimistic, evaluate=evaluate)
        if self.swapped:
            self._options["swapped"] = True
        self._pending: dict[int, list] = {}
        self._results: list = []
        # on a CPU, calls in worker threads (see the class docstring) where several rows are
        # composed at once: with ``swapped`` an add row mostly waits for its remove row's bound,
        # so that one configuration composes one row, in the caller's thread (a worker's start
        # and hand-off took 2-3 ms of its 20 ms on the host); on one accelerator, calls queued
        # in order by one worker thread (see _dispatch)
        composed = rows // 2 if self.swapped else rows
        self._worker_count = (min(cores(), COMPOSE_WORKERS)
                              if self.host_glue and composed > (1 if self.host else 2) else 1)
        self._workers = (ThreadPoolExecutor(self._worker_count, "pldjax-compose")
                         if self._worker_count > 1 or self._gathers else None)
        self._running: collections.deque[Future] = collections.deque()

    @property
    def lone_pair(self) -> bool:
        """Whether the call's one configuration discretizes its add row with its remove row, in
        the place of the repeat that pads a discretization to two rows (a compiled call's first
        phase, see :func:`_one_direction`), and composes it in the remove row's call where their
        windows have one size (its value then read only where the remove row's bound leaves
        the add direction open), or alone where that bound does: no second phase. One DP-SGD
        epsilon (sigma 1, q 0.01, delta 1e-5) at T 10^5 took 68 ms in two phases, each a
        discretization and a composition of one row padded to two, and takes 35 ms; at T 10
        and delta 1e-9, whose add window is smaller, 26 ms and 19 ms (2-core CPU)."""
        return self.swapped and self.phase == "both" and self.rows == 2 and not self.host

    def close(self) -> None:
        """Cancel the calls not yet begun (after an error or an interrupt) and end the worker
        threads."""
        if self._workers is not None:
            self._workers.shutdown(cancel_futures=True)

    def compile_ahead(self, size: int, probs, scalars, rows: int) -> None:
        """Start compiling the composition program that a chunk's ``rows`` rows of ``size`` will
        run, unless one started before (arguments as :meth:`add`'s): on the host, the one of a
        full call where they are more than two (a call of two rows is the last one of a size
        that gets no more), or of two rows where the whole accounting call has no more. Not when
        sharded."""
        if size in self._sizes_seen or self._sharding is not None:
            return
        if not self._gathers and self.rows > 2 and rows <= 2:
            return  # perhaps a call of two rows at the end, perhaps a full one: not known yet
        self._sizes_seen.add(size)
        most, batch = self._call_rows(size), self._batch(size)
        self._bought(size, batch)
        with compiling_ahead():
            if self._gathers:
                index = jax.ShapeDtypeStruct((most,), np.asarray(0).dtype)
                _compose_and_evaluate(*_composition_arguments(*_gathered(probs, index, scalars, size)),
                                      **self._options)
                return
            if batch == most:
                self._full_sizes.add(size)
            _compose_and_evaluate(*self._call_shapes(size, probs, scalars), **self._options)

    def _call_shapes(self, size: int, probs, scalars) -> tuple:
        """The arguments' shapes of this call's composition program for ``size`` on the host's
        glue (:meth:`_batch` rows; ``probs``, ``scalars`` as :meth:`add`'s)."""
        batch = self._batch(size)
        wrapped = jax.ShapeDtypeStruct((batch, size), probs.dtype)
        columns = [jax.ShapeDtypeStruct((batch,) + a.shape[1:], a.dtype) for a in scalars]
        return _composition_arguments(wrapped, columns)

    def start_sizes(self, surveys: list) -> None:
        """Start compiling the composition sizes that the call's groups' surveys (:func:`_survey`:
        each one's estimated points by size, with the shapes of its chunks) met, except, on the
        host's glue, those whose points, summed over the groups, the process may still compose
        in NumPy (HOST_SIZE_POINTS) and whose program is not ready without compiling (one an
        earlier process compiled is loaded from the persistent cache in a fraction of the
        time); each from the first group that met it."""
        points, shapes = collections.Counter(), {}
        for estimates, probs, scalars in surveys:
            points.update(estimates)
            for size in estimates:
                shapes.setdefault(size, (probs, scalars))
        for size, total in points.items():
            probs, scalars = shapes[size]
            rented = (self.host_glue
                      and host_work.fits(total, self.program(size), HOST_SIZE_POINTS)
                      and not _compose_and_evaluate.stored(
                          *self._call_shapes(size, probs, scalars), **self._options))
            if not rented:
                self.compile_ahead(size, probs, scalars, self.rows)

    def program(self, size: int) -> tuple:
        """The key of work done on the host in place of the compiled composition that this
        call's rows of ``size`` run in (:class:`~pldjax.core.compilation.HostWork`): one
        configuration's rows run in a program of two rows (:meth:`_batch`), not bought where a
        sweep compiled only a full call's for the size; a sweep's rows in any program of the
        size (a full call's, or one of two for its last rows)."""
        key = self._size_key(size)
        return key + (self._batch(size),) if self._one_configuration else key

    def _size_key(self, size: int) -> tuple:
        return ("composition", size, tuple(sorted(self._options.items())))

    def _bought(self, size: int, batch: int) -> None:
        """Record that the program of ``batch`` rows of ``size`` is compiled (or compiling)."""
        host_work.buy(self._size_key(size))
        host_work.buy(self._size_key(size) + (batch,))

    def _batch(self, size: int) -> int:
        """The rows of this call's program for ``size`` (see :meth:`compile_ahead`): a full
        call's, or two for one configuration's rows on the host's glue."""
        most = self._call_rows(size)
        return min(most, 2) if self._one_configuration else most

    @property
    def _one_configuration(self) -> bool:
        """Whether this call's rows are one configuration's, composed on the host's glue in
        programs of two rows."""
        return self.rows <= 2 and not self._gathers

    def _call_rows(self, size: int) -> int:
        """The rows of one composition call of ``size`` (see the class docstring)."""
        most = _rows_per_call(size, self._devices)
        return min(most, grid_lib.next_pow2(self.rows)) if self._gathers else most

    def add(self, size: int, probs, scalars, rows: np.ndarray, values: np.ndarray,
            on_host: bool = False) -> None:
        """Queue the rows ``rows`` of a chunk (on one accelerator: start their composition) from
        its PMFs ``probs`` (rows, mechanism grid) and ``scalars`` (summary, inf_mass, offset,
        step, count, target, exponents; each with a leading rows axis); their values go to
        values[rows] by :meth:`flush` at the latest. ``on_host``: composed in NumPy (a
        ``host`` call's), one row a call."""
        if on_host:
            for row in rows:
                arrays = [wrap_rows(np, probs[row:row + 1], size, scalars[_CENTER][row:row + 1]),
                          *(column[row:row + 1] for column in scalars)]
                self._submit(arrays, [(values, row)], on_host=True)
            return
        most = self._call_rows(size)
        if self._gathers:
            for begin in range(0, len(rows), most):
                part = rows[begin:begin + most]
                index = np.concatenate([part, np.full(most - len(part), part[-1])])
                while len(self._running) >= GATHERED_CALLS_AHEAD:  # bounded memory
                    self._running.popleft().result()
                self._running.append(self._workers.submit(self._dispatch, probs, index, scalars,
                                                          size, values, part))
            return
        pending = self._pending.setdefault(size, [])
        pending.append((probs[rows], [a[rows] for a in scalars], values, rows))
        while sum(len(block[3]) for block in pending) >= most:
            self._run(size, most)

    def flush(self) -> None:
        """Compose every row still queued; read back every value."""
        for size, pending in self._pending.items():
            most = self._call_rows(size)
            while pending:
                self._run(size, most)
        while self._running:
            self._running.popleft().result()
        for got, values, rows in self._results:
            values[rows] = np.asarray(got)[: len(rows)]
        self._results.clear()

    def _run(self, size: int, most: int) -> None:
        """Compose up to ``most`` queued rows of ``size`` in one call (padded with repeats)."""
        xp, devices, blocks = self._xp, self._devices, self._pending[size]
        wrapped, columns, sinks = [], [], []
        while len(sinks) < most and blocks:
            probs, scalars, values, indices = blocks[0]
            k = min(most - len(sinks), len(indices))
            # wrapped here, so that the composition's shapes do not depend on the mechanism's grid
            wrapped.append(wrap_rows(xp, probs[:k], size, scalars[_CENTER][:k]))
            columns.append([column[:k] for column in scalars])
            sinks += [(values, index) for index in indices[:k]]
            if k < len(indices):
                blocks[0] = (probs[k:], [column[k:] for column in scalars], values, indices[k:])
            else:
                blocks.pop(0)
        # two rows (a single configuration's directions), or a full call padded with repeats:
        # two compiled shapes per window size at most, and one where a full call's program is
        # there already (a sweep's last rows of a size: a few rows padded, not one more program)
        batch = min(most, 2) if len(sinks) <= 2 and size not in self._full_sizes else most
        if batch == most:
            self._full_sizes.add(size)
        self._bought(size, batch)
        batch = -(-batch // devices) * devices  # sharded: a multiple of the devices
        if batch > len(sinks):
            repeat = batch - len(sinks)
            wrapped.append(xp.repeat(wrapped[-1][-1:], repeat, axis=0))
            columns.append([xp.repeat(column[-1:], repeat, axis=0) for column in columns[-1]])
        arrays = [parts[0] if len(parts) == 1 else xp.concatenate(parts)
                  for parts in [wrapped, *zip(*columns, strict=True)]]
        self._submit(_place(arrays, self._sharding), sinks)

    def _submit(self, arrays, sinks, on_host: bool = False) -> None:
        """Compose one call's ``arrays`` (in a worker thread where there are workers)."""
        if self._workers is None:
            self._compose(arrays, sinks, on_host)
            return
        while len(self._running) >= 2 * self._worker_count:  # bounded memory
            self._running.popleft().result()
        self._running.append(self._workers.submit(self._compose, arrays, sinks, on_host))

    @float64  # in the worker thread: JAX's 64-bit switch is the thread's own
    def _dispatch(self, probs, index, scalars, size: int, values, part) -> None:
        """Queue the gather and composition of a chunk's rows ``index`` on the accelerator (their
        values go to values[part] at :meth:`flush`): from a worker thread, so that a call whose
        program is still compiling waits there, while the host places the next chunks (whose
        new composition sizes then start compiling at once, see :meth:`compile_ahead`)."""
        got = _compose_and_evaluate(*_composition_arguments(*_gathered(probs, index, scalars, size)),
                                    **self._options)
        self._results.append((got, values, part))

    @float64  # in each worker thread: JAX's 64-bit switch is the thread's own
    def _compose(self, arrays, sinks, on_host: bool) -> None:
        compose = _compose_and_evaluate.__wrapped__ if on_host else _compose_and_evaluate
        with np.errstate(all="ignore"):  # in NumPy: log(0) = -inf and the like, as in XLA
            got = np.asarray(compose(*_composition_arguments(arrays[0], arrays[1:]),
                                     **self._options))
        for value, (values, index) in zip(got, sinks, strict=False):
            values[index] = value


def _composition_arguments(wrapped, columns) -> tuple:
    """:func:`_compose_and_evaluate`'s positional arguments from a call's wrapped rows and its row
    scalars in :meth:`_Compositions.add`'s order (summary, inf_mass, offset, step, count, target,
    exponents)."""
    return wrapped, PMFSummary(*columns[:5]), *columns[5:10], tuple(columns[10:])


def composition_size(width: int) -> int:
    """Points of the composition window that holds ``width`` points (see SMALL_WINDOW)."""
    return grid_lib.next_pow2(width) if width <= SMALL_WINDOW else grid_lib.half_octave_size(width)


def _rows_per_call(size: int, devices: int) -> int:
    """Most rows one composition call takes (a power of two; a multiple of the devices when
    sharded): COMPOSE_ELEMENTS grid points in all and at most CALL_ROWS rows, and on a CPU the
    power of two at or above its cores (XLA runs one row per core; 2 rows of 81,920 points took
    3.4 ms a row on 2 cores, 1 row 6.4 ms, 8 rows 3.1 ms: more rows a call only add compiled
    shapes), or as many as fill CPU_CALL_ELEMENTS points where windows are small (a call's
    fixed cost then weighs: the sweep of 1,024 took 7.5 -> 6.8 s, at rtol 1e-2 2.05 -> 1.66 s)."""
    most = max(1, min(CALL_ROWS, COMPOSE_ELEMENTS // size))
    if not _keeps_chunks_on_device():
        most = min(most, max(grid_lib.next_pow2(cores()), CPU_CALL_ELEMENTS // size))
    most = 1 << (most.bit_length() - 1)
    return max(devices, most // devices * devices)


def _progress(total: int, enabled: bool) -> Callable[[int], None]:
    def report(done: int) -> None:
        if enabled:
            bar = "#" * (30 * done // total)
            print(f"\r[{bar:<30}] {done}/{total} configurations", end="", file=sys.stderr)
            if done == total:
                print(file=sys.stderr)

    return report


#: Releases the accounting kernels before a sweep runs out of memory mappings: a first look at
#: 64 compiled shapes, then every 16 more (see pldjax.core.compilation.MappingGuard).
_MAPPINGS = MappingGuard((*MECHANISM_KERNELS, _compose_and_evaluate, _gather_rows,
                          _gather_tiled_rows), first=64, every=16)


def _account_group(order, params, steps, target, *, sharding, mechanism_size, grid_steps,
                   ahead=False, **kwargs):
    """The configurations ``order`` (one mechanism grid size; ``grid_steps``: every
    configuration's own grid step, or None: ``grid``'s), in chunks: yields each chunk's
    (indices, ``place``) once its discretization is queued (see :func:`_account_chunk`); on the
    host (``compositions.host``) in chunks of up to HOST_CHUNK_ELEMENTS points, unpadded.
    ``ahead``: starts compiling the discretization programs and yields the group's
    :func:`_survey`, to call once they are on their way."""
    if kwargs["compositions"].host:  # nothing compiled: no padding
        chunk = max(1, HOST_CHUNK_ELEMENTS // mechanism_size)
        for begin in range(0, len(order), chunk):
            idx = order[begin:begin + chunk]
            yield idx, _account_chunk(
                [p[idx] for p in params], steps[idx], target[idx], sharding=sharding,
                mechanism_size=mechanism_size,
                grid_steps=None if grid_steps is None else grid_steps[idx], **kwargs)
        return
    devices = 1 if sharding is None else len(jax.devices())
    on_device = _keeps_chunks_on_device()
    configs, elements = ((ACCELERATOR_CHUNK, ACCELERATOR_CHUNK_ELEMENTS) if on_device
                         else (CHUNK, CHUNK_ELEMENTS))
    chunk = min(configs, max(1, elements // mechanism_size)) * devices
    # few distinct batch shapes, so few compiled kernels: on a CPU one configuration alone, or
    # full chunks padded with repeats (a discretization costs milliseconds, a new shape seconds
    # to compile); on an accelerator, whose chunks are large, powers of two
    tiled = _tiled(mechanism_size, sharding=sharding, **kwargs)
    directions = 2 if kwargs["both"] else 1
    if on_device:
        chunk = min(chunk, grid_lib.next_pow2(len(order)))
    elif len(order) == 1 and not (tiled and kwargs["compositions"].rows > directions):
        chunk = 1  # (in tiles, a lone configuration among others shares their program)
    # at least two rows a discretization (a configuration of one direction alone is repeated):
    # XLA compiles a batch of one row with other reductions than a batch of several, so a single
    # call's masses were an ulp away from the same configuration's in a batch, its epsilon 1e-12
    # (relative) away, and a calibration checked in batches returned a sigma whose epsilon alone
    # was above the target
    chunk = max(chunk, 1 if kwargs["both"] else 2)
    if _one_direction(kwargs["compositions"], kwargs["both"]):
        # one row a configuration: twice the configurations, the same rows (and programs)
        directions, chunk = 1, 2 * chunk
    chunk = -(-chunk // devices) * devices
    # masses in tiles: the chunk's tiles padded instead (one program whatever the size); on an
    # accelerator every chunk of the call in as many tiles, as many configurations as fill them
    tiles = None
    if tiled and on_device:
        tiles = min(ACCELERATOR_TILES, grid_lib.next_pow2(kwargs["compositions"].tiles))
        chunk = max(1, tiles // (directions * -(-mechanism_size // TILE)))
    elif tiled:
        tiles = grid_lib.next_pow2(directions * chunk * -(-mechanism_size // TILE))
    for begin in range(0, len(order), chunk):
        idx = order[begin:begin + chunk]
        padded = idx if tiles else np.concatenate([idx, np.full(chunk - len(idx), idx[-1])])
        if kwargs["compositions"].lone_pair and directions == 1:  # its two directions' rows
            padded = np.repeat(idx, 2)
        placed = _account_chunk([p[padded] for p in params], steps[padded], target[padded],
                                sharding=sharding, mechanism_size=mechanism_size,
                                grid_steps=None if grid_steps is None else grid_steps[padded],
                                ahead=ahead, tiles=tiles, **kwargs)
        if ahead:  # every chunk of the group has the first one's shapes
            yield functools.partial(_survey, order, params, steps, target, *placed,
                                    mechanism_size=mechanism_size, grid_steps=grid_steps, **kwargs)
            return
        yield idx, placed


def _survey(order, params, steps, target, probs, scalars, *, samples: int, compositions,
            mechanism, mechanism_size, both, pessimistic, grid, grid_steps, evaluate, remedy,
            **_) -> tuple[dict[int, int], object, object]:
    """The composition sizes that the configurations ``order`` (a group of
    :func:`_account_group`) will likely need, each with an estimate of the grid points its rows
    will compose, known before the first chunk's masses are there (and ``probs``, ``scalars``:
    the group's chunks' shapes, from :func:`_account_chunk`'s ``ahead``), so that
    :meth:`_Compositions.start_sizes` starts compiling their programs at once: the window sizes
    are known only from the masses, so without it a sweep meets its sizes chunk by chunk, each
    one's program compiled while the chunks wait for it (the sweep of 1,024 sigmas: three, a
    second each, one after another). ``samples`` configurations (see :func:`_survey_samples`),
    evenly spread over ``order`` (alike ones lie side by side), are discretized and their
    windows placed in NumPy, each standing for those nearest to it. A size missed is met, and
    compiled, as its chunk is placed. A surveyed size's last rows are composed in a full call
    padded with repeats rather than in a call of two rows, which moves their values by
    round-off at most."""
    positions = np.unique(np.linspace(0, len(order) - 1, min(len(order), samples))
                          .round().astype(np.int64))
    sample = order[positions]
    # the configurations each one stands for: those nearer to it than to its neighbours
    bounds = np.concatenate([[0.0], (positions[1:] + positions[:-1]) / 2, [len(order)]])
    stands_for = np.diff(bounds)
    params = [np.asarray(p, np.float64)[sample] for p in params]
    steps, target = steps[sample], target[sample]
    discretized, directions = _chunk_directions(compositions, mechanism, params, steps, both)
    counts, targets = (np.concatenate([a] * directions) for a in (steps, target))
    _, _, offset, _, lo, hi, _, summary = direction_arrays(
        discretized, grid, pessimistic,
        mechanism_tail(steps, target, evaluate), mechanism_size,
        then=_placement(directions, evaluate), extra=(counts, targets),
        steps=None if grid_steps is None else grid_steps[sample], host=True)
    try:
        widths = window_widths(summary, offset, counts, lo, hi, "steps", remedy)
    except CompositionTooWide:
        return {}, probs, scalars  # the chunk that holds it raises, naming it
    row_sizes = np.array([compositions.window_size(int(w)) for w in widths])
    rows = np.tile(stands_for, directions)
    return {size: int(np.sum(rows[row_sizes == size]) * size)
            for size in np.unique(row_sizes).tolist() if size <= grid_lib.MAX_SIZE}, probs, scalars


def _survey_samples(group_sizes) -> list[int]:
    """How many configurations each group's :func:`_survey` places, for groups of
    ``group_sizes`` configurations: SURVEYED in all, in proportion to their sizes, at least one
    a group and at most its size."""
    sizes = np.asarray(group_sizes, np.float64)
    shares = np.maximum(np.round(SURVEYED * sizes / np.sum(sizes)), 1.0)
    return np.minimum(shares, sizes).astype(np.int64).tolist()


def _tiled(mechanism_size: int, *, sharding, compositions, grid, **_) -> bool:
    """Whether a chunk's masses are computed in tiles (one compiled program for every grid
    size: :func:`_placed_tiles`): connect-the-dots estimates on grids of a multiple of TILE
    points or a power of two below (from BLOCKED_POINTS), compiled, on one device; on an
    accelerator pessimistic ones alone (an optimistic estimate's hull in tiles is one
    sequential loop over the points, a CPU's way: see
    :func:`~pldjax.kernels.discretize._tiled_lower_hull`)."""
    return (not compositions.host and sharding is None
            and (compositions.host_glue or compositions.pessimistic)
            and (grid or Grid()).rounding == "connect_dots"
            and (mechanism_size % TILE == 0
                 or (TILE % mechanism_size == 0 and mechanism_size >= BLOCKED_POINTS)))


def account(event: Event, steps, target, target_name, *, pessimistic, grid, evaluate, progress,
             rtol=None, function=None):
    """The values of :func:`event_epsilon` (``evaluate="epsilon"``) or :func:`event_delta`, for
    ``function`` (the public function called, named in errors and in a slow first call's
    notice, :mod:`pldjax.core.notice`)."""
    function = function or f"event_{evaluate}"
    keep_freed_host_memory()
    options = dict(pessimistic=pessimistic, grid=grid, evaluate=evaluate, progress=progress,
                   rtol=rtol, function=function)
    def attempt(**changed):
        try:
            return _account(event, steps, target, target_name, **{**options, **changed})
        except _BulkStepTooWide:
            return _account(event, steps, target, target_name, refine_bulk=False,
                            **{**options, **changed})

    with slow_call_notice(f"pldjax.{function}"):
        try:
            return attempt()
        except _AutomaticStepTooFine as too_fine:
            # one configuration on its automatic step (a sound estimate on any step): doubled
            # until its composition fits, up to AUTOMATIC_COARSENING times the automatic step
            step = too_fine.step
            while True:
                try:
                    return attempt(grid=Grid(step=step))
                except CompositionTooWide:
                    step *= 2.0
                    if step > too_fine.most:
                        raise too_fine.__cause__ from None


#: The most a configuration's automatic mechanism step is made coarser (a power of two) where
#: its composition would need more than grid.MAX_SIZE points (DP-SGD at 10^9 steps): each
#: doubling of the step costs about four times the discretization's error (sigma 8, q 0.01,
#: 10^9 steps, delta 1e-5 on twice the step: epsilon between 955.14 and 955.64), so beyond
#: this the call refuses instead (with CompositionTooWide, whose remedy is a coarser Grid or
#: rtol).
AUTOMATIC_COARSENING = 8


class _AutomaticStepTooFine(Exception):
    """One configuration whose composition on its automatic mechanism step no window holds:
    :func:`account` runs it again on ``step``, a coarser one, and on its doublings up to
    ``most`` (its CompositionTooWide is the ``__cause__``, raised where none fits)."""

    def __init__(self, step: float, most: float):
        super().__init__(step, most)
        self.step, self.most = step, most


class _BulkStepTooWide(Exception):
    """An optimistic row on a step that resolves its loss's bulk
    (:func:`~pldjax.accounting.planner.bulk_resolving_steps`) whose composition no window holds:
    :func:`account` runs the call again on the automatic steps."""


#: Most configurations whose PLDs :func:`_account_by_pld` builds at once, in threads: their
#: FFTs run on one core each (2 threads on 2 cores: 16 random-allocation configurations in 8.0 s
#: against 13.7 s), and each holds its lattice (up to 2^21 points) while it runs.
PLD_WORKERS = 4


#: What to use inside jit instead of an accounting function that takes an event.
EVENT_INSIDE_JIT = ("inside jit, build the PLD with event.pld(grid=pj.Grid(size=...)) and "
                    "self_compose(size=...)")


def _account(event: Event, steps, target, target_name, *, pessimistic, grid, evaluate, progress,
             rtol, function, refine_bulk=True):
    if not isinstance(event, Event):
        raise ValueError(f"event must be a pldjax.Event, got {event!r}")
    refuse_traced(function, (event, steps, target), EVENT_INSIDE_JIT)
    check_flag("pessimistic", pessimistic)
    check_whole("steps", steps)
    if target_name == "delta":
        check_range("delta", target, 0.0, 1.0)
    else:
        check_range("epsilon", target, 0.0, allow_inf=True)
    check_rtol(rtol, grid)
    steps_arr = np.asarray(steps, np.float64)
    if not getattr(event.sampling, "one_mechanism", True):
        if rtol is not None:
            raise ValueError(_RTOL_NEEDS_GAUSSIAN)
        return _account_by_pld(event, steps_arr, target, evaluate, pessimistic=pessimistic,
                               grid=grid, progress=progress)
    mechanism, params, both = event.directions(pessimistic)
    arrays = broadcast_arguments(**{f"the event's parameter {i}": p for i, p in enumerate(params)},
                                 steps=steps_arr, **{target_name: target})
    shape = arrays[0].shape
    *params, steps_arr, target = (a.reshape(-1) for a in arrays)
    closed_form = gaussian_poisson_parameters(event, shape)
    if rtol is not None and closed_form is None:
        raise ValueError(_RTOL_NEEDS_GAUSSIAN)
    out = np.zeros(steps_arr.shape[0])  # zero steps: epsilon 0 and delta 0
    active = np.nonzero((steps_arr > 0) & spends(event, shape) & _needs_reading(target, evaluate))[0]
    if closed_form is not None:  # the Gaussian without sampling composes to a Gaussian
        exact = closed_form[1][active] == 1.0
        out[active[exact]] = _gaussian_values(event, shape, active[exact], steps_arr, target,
                                              evaluate, pessimistic)
        active = active[~exact]
        if not len(active):
            return _finished(out, shape, evaluate, pessimistic)
    if evaluate == "epsilon" and type(event.noise).top_loss is not Noise.top_loss:
        pure = target[active] == 0
        out[active[pure]] = _pure_epsilons(event, shape, active[pure], steps_arr,
                                           pessimistic=pessimistic, grid=grid)
        active = active[~pure]
        if not len(active):
            return _finished(out, shape, evaluate, pessimistic)
    # configurations on one grid step share a chunk (one Grid per call): rtol's steps, or each
    # one's exact lattice (integer-valued noise), or the automatic steps (one group)
    half_widths = None
    refined_bulk = False  # some optimistic rows on a bulk-resolving step (see account)
    if rtol is not None:
        read_half_widths = half_widths_nats(
            mechanism, [p[active] for p in params], both,
            mechanism_tail(steps_arr[active], target[active], evaluate))
        sigma, q = closed_form
        group_steps = accuracy_steps(sigma[active], q[active], steps_arr[active], target[active],
                                      target_name, event.neighboring, float(rtol))
        half_widths = read_half_widths()
        group_steps = np.maximum(group_steps, covering_steps(half_widths))
        if not pessimistic:
            group_steps = optimistic_steps(group_steps, half_widths, grid)
    else:
        lattice = lattice_steps(event, shape, pessimistic) if grid is None else None
        group_steps = np.zeros(active.shape[0]) if lattice is None else lattice[active]
        if (refine_bulk and not pessimistic and grid is None and lattice is None
                and closed_form is not None):
            chosen = [p[active] for p in params]
            with np.errstate(all="ignore"):  # overflow to inf is the spread's intended limit
                spreads = mechanism.spread(tuple(chosen) + ((np.full(len(active), REMOVE),)
                                                             if both else ()))
            group_steps = bulk_resolving_steps(
                spreads, closed_form[1][active],
                half_widths_nats(mechanism, chosen, both,
                                 mechanism_tail(steps_arr[active], target[active], evaluate)))
            refined_bulk = bool(np.any(group_steps > 0))
    # the mechanism grid each configuration gets alone: a chunk is discretized at its largest
    # member's size, so no configuration is slower (or on another grid) in a batch
    sizes = np.zeros(active.shape[0], np.int64)
    for group_step in np.unique(group_steps):
        in_group = group_steps == group_step
        stepped = active[in_group]
        group_grid = (grid if group_step == 0
                      else dataclasses.replace(grid or Grid(), step=float(group_step)))
        sizes[in_group] = configuration_sizes(
            mechanism, [p[stepped] for p in params], both, group_grid,
            mechanism_tail(steps_arr[stepped], target[stepped], evaluate),
            None if half_widths is None else half_widths[in_group])
    grid_steps = np.zeros(steps_arr.shape[0])
    grid_steps[active] = group_steps
    report = _progress(len(active), progress)
    directions = 2 if both else 1
    rows = directions * max(len(active), 1)
    sharding = _sharding()
    compositions = _Compositions(
        sharding=sharding, pessimistic=pessimistic, evaluate=evaluate, rows=rows,
        tiles=directions * int(np.sum(-(-sizes // TILE))),
        host=_on_host(mechanism, grid, rows, sizes, directions * int(np.sum(sizes))),
        swapped=both and mechanism.swapped_directions and evaluate == "epsilon")

    def run(chosen, report) -> np.ndarray:
        """Account for the configurations active[chosen] (their values into ``out``); returns
        those whose add direction is still to be composed (flat indices)."""
        members_all, member_sizes, member_steps = active[chosen], sizes[chosen], group_steps[chosen]

        def chunks(ahead=False):  # each chunk's discretization queued as the loop asks for it
            # configurations of one size share chunks: on the automatic grid, or each on its own
            # step (rtol's, a lattice's). Chunks of one step each were 48 for bench/dpsgd.py's
            # 10^4 configurations at rtol=1e-2 on an accelerator, 14 now (23 mechanism shapes, 7
            # now)
            on_own_step = member_steps > 0
            for own_steps in np.unique(on_own_step):
                for size in np.unique(member_sizes[on_own_step == own_steps]):
                    picked = (on_own_step == own_steps) & (member_sizes == size)
                    members = members_all[picked]
                    remedy = COARSER_GRID
                    if rtol is not None:
                        remedy = rtol_remedy(rtol, np.min(member_steps[picked]))
                    # alike configurations side by side (few distinct composition sizes per
                    # chunk)
                    points = (np.zeros(members.shape[0]) if closed_form is None
                              else mechanism_points(*(a[members] for a in closed_form)))
                    order = members[np.lexsort((steps_arr[members], points,
                                                member_steps[picked]))]
                    yield from _account_group(
                        order, params, steps_arr, target, mechanism=mechanism,
                        mechanism_size=int(size), both=both, pessimistic=pessimistic,
                        grid=grid, grid_steps=grid_steps if own_steps else None,
                        evaluate=evaluate, sharding=sharding, compositions=compositions,
                        remedy=remedy, ahead=ahead)

        finishers = []
        queued = collections.deque()
        done = 0

        def place_first():
            nonlocal done
            idx, place = queued.popleft()
            finishers.append((idx, place()))
            done += len(idx)
            report(done)
            # a sweep compiles a kernel per shape it meets (and so may a loop of single calls)
            _MAPPINGS.check()

        # on an accelerator one chunk ahead: the next chunk's discretization is queued before
        # this one is placed, so that the device works while the host places (on a CPU, which
        # computes as fast either way, it would only hold two chunks at once)
        ahead = 0 if compositions.host_glue else 1
        if sharding is None and not compositions.host:  # every group's discretization
            started = compiles_started()                  # programs start compiling at once
            surveys = list(chunks(ahead=True))
            if compiles_started() > started:  # new programs: then the compositions' too
                # (a survey's first argument: its group's configurations)
                samples = _survey_samples([len(survey.args[0]) for survey in surveys])
                compositions.start_sizes([survey(samples=k)
                                          for survey, k in zip(surveys, samples, strict=True)])
        for chunk in chunks():
            queued.append(chunk)
            if len(queued) > ahead:
                place_first()
        while queued:
            place_first()
        compositions.flush()
        unsettled = []
        for idx, finish in finishers:
            values, again = finish()
            out[idx] = np.maximum(out[idx], values[: len(idx)])
            unsettled.append(idx[again[: len(idx)]])
        return np.concatenate(unsettled) if unsettled else np.zeros(0, np.int64)

    try:
        again = run(np.ones(len(active), bool), report)
        if len(again):  # the swapped bound did not settle their add direction: composed now
            compositions.phase = "add"
            run(np.isin(active, again), lambda done: None)
    except CompositionTooWide as error:
        if refined_bulk:
            raise _BulkStepTooWide from None
        if error.fitting_step is not None and rtol is None and len(active) == 1:
            most = min(error.automatic_step * AUTOMATIC_COARSENING, grid_lib.MAX_STEP)
            if error.fitting_step <= most:
                raise _AutomaticStepTooFine(error.fitting_step, most) from error
        raise
    finally:
        compositions.close()
    return _finished(out, shape, evaluate, pessimistic)


def _on_host(mechanism, grid: Grid | None, rows: int, sizes, points: int) -> bool:
    """Whether an accounting call of ``rows`` rows on mechanism grids of ``sizes``, ``points``
    grid points in all, is discretized and placed in NumPy on the host (:class:`_Compositions`'
    ``host``): on one device (a CPU, or an accelerator whose compiling would take as long), for
    a discretization that runs there (:func:`~pldjax.kernels.discretize.runs_on_host`), of at
    most HOST_ROWS_PER_SIZE rows per distinct size on average, where the process's host work
    (:class:`~pldjax.core.compilation.HostWork`) still holds those points (counted as spent
    here). Its values are the compiled kernels' to round-off (the same windows, grids and
    steps)."""
    return (len(jax.devices()) == 1
            and runs_on_host(mechanism, (grid or Grid()).rounding)
            and rows <= HOST_ROWS_PER_SIZE * max(len(np.unique(sizes)), 1)
            and host_work.claim(points))


def _gaussian_values(event: Event, shape, members, steps, target, evaluate: str,
                     pessimistic: bool) -> np.ndarray:
    """epsilon or delta (``evaluate``) at ``target`` of ``steps`` runs of the Gaussian event
    without sampling (or at sampling probability 1), for the configurations ``members`` (flat
    indices): the composition is G_mu with mu = shift sqrt(steps) / sigma (the shift one
    sensitivity, two under replace-one), read from its closed form
    (:func:`~pldjax.kernels.gaussian_dp.gdp_epsilon_bound`, ``gdp_delta_bound``) with mu
    rounded to the estimate's safe side, with no grid (to about 1e-12 relative down to delta
    about 1e-290, see :func:`event_epsilon`)."""
    noise = event.noise
    sensitivity, sigma = (np.broadcast_to(np.asarray(a, np.float64), shape).reshape(-1)[members]
                          for a in (noise.sensitivity, noise.sigma))
    mu = quotient_rounded(sensitivity, sigma, up=pessimistic)
    if event.neighboring == Neighboring.REPLACE_ONE:
        mu = 2.0 * mu
    with np.errstate(over="ignore"):
        mu = mu * np.sqrt(steps[members]) * (1.0 + 2.0**-50 if pessimistic else 1.0 - 2.0**-50)
    bound = gdp_epsilon_bound if evaluate == "epsilon" else gdp_delta_bound
    return bound(mu, target[members], pessimistic)


def _pure_epsilons(event: Event, shape, members, steps, *, pessimistic, grid) -> np.ndarray:
    """Epsilon at delta = 0 of ``steps`` runs for each of the configurations ``members`` (flat
    indices) of an event with bounded noise (:func:`pldjax.kernels.chernoff.pure_epsilon`: the
    number of runs times one run's largest loss), read from that configuration's own PLD (on
    its lattice, :func:`pldjax.mechanisms.events.lattice`, which holds the largest loss on a
    grid point: exact to round-off, from above if pessimistic)."""
    out = np.empty(steps.shape[0])
    for one, chosen in distinct_configurations(event, shape, members):
        one_run = one.pld(pessimistic=pessimistic, grid=grid)
        for i in chosen:
            out[i] = pure_epsilon([(one_run, int(steps[i]))], pessimistic=pessimistic)
    return out[members]


def _finished(out, shape, evaluate: str, pessimistic: bool):
    # never NaN: should a configuration still produce one, report the trivial sound bound
    # (epsilon inf or delta 1 pessimistic, 0 optimistic) rather than a number that is none
    out = np.where(np.isnan(out), (np.inf if evaluate == "epsilon" else 1.0) if pessimistic else 0.0,
                   out)
    return out.reshape(shape) if shape else float(out[0])


_RTOL_NEEDS_GAUSSIAN = (
    "rtol needs an estimate of the loss's spread, available for the Gaussian (without sampling "
    "or Poisson-subsampled) only; for this event pass grid=pj.Grid(step=...)")


def _needs_reading(target, evaluate: str) -> np.ndarray:
    """Where a composition must be read: every mechanism is (0, 1)-DP, so epsilon at delta >= 1
    is 0 whatever the steps (10^9 steps of sigma 1e-3 need no window to say so)."""
    return target < 1.0 if evaluate == "epsilon" else np.ones(np.shape(target), bool)


def _account_by_pld(event: Event, steps, target, evaluate: str, *, pessimistic, grid, progress):
    """:func:`account` for an event whose PLD is not one mechanism (its sampling builds it, as
    TruncatedPoisson does): each distinct configuration's PLD (:meth:`Event.pld`, scalar
    parameters) built once, composed once per distinct number of steps, and read at every target
    of those (0 for no steps). Several configurations are built at once, in up to PLD_WORKERS
    threads (one a core): each its own, so the values are a single call's."""
    shape = np.broadcast_shapes(*(np.shape(leaf) for leaf in jax.tree.leaves(event)),
                                np.shape(steps), np.shape(target))
    steps, target = (np.broadcast_to(np.asarray(a, np.float64), shape).reshape(-1)
                     for a in (steps, target))
    active = np.nonzero((steps > 0) & _needs_reading(target, evaluate))[0]
    out = np.zeros(steps.shape[0])
    report = _progress(len(active), progress)

    @float64  # in each thread: JAX's 64-bit switch is the thread's own
    def account_one(configuration) -> int:
        one, members = configuration
        pld = one.pld(pessimistic=pessimistic, grid=grid)
        for count in np.unique(steps[members]):
            chosen = members[steps[members] == count]
            try:
                composed = pld.self_compose(int(count))
            except CompositionTooWide as error:  # named by the caller's argument and event
                raise CompositionTooWide(f"steps = {int(count)} of {one!r} (its PLD composed that "
                                         f"many times): {error}") from None
            read = composed.epsilon if evaluate == "epsilon" else composed.delta
            out[chosen] = np.asarray(read(target[chosen]), np.float64)
        return len(members)

    configurations = distinct_configurations(event, shape, active)
    workers = min(len(configurations), cores(), PLD_WORKERS)
    done = 0
    for accounted in map_in_threads(account_one, configurations, workers, "pldjax-pld"):
        done += accounted
        report(done)
    return _finished(out, shape, evaluate, pessimistic)


#: The Args and Returns sections of :func:`event_epsilon` and :func:`event_delta`, filled in with
#: each one's target argument (``target``: its Args entry) and value (``value``, ``failed``,
#: ``note``).
_EVENT_ARGS = """
    Args:
      event: a :class:`~pldjax.mechanisms.events.Event`, e.g. ``pj.Event(pj.noise.Laplace(2.0),
        pj.sampling.Poisson(0.01))``; array parameters are a batch (they broadcast with
        ``steps`` and the target; the result has the broadcast shape, a float for scalars).
      steps: whole number of compositions >= 0.
      {target}
      pessimistic: False for the optimistic (lower-bound) estimate.
      grid: optional mechanism :class:`Grid` (a finer step is tighter and slower); automatic by
        default (for integer-valued noise without sampling: each configuration's exact lattice).
      progress: print a progress bar to stderr.
      rtol: target relative accuracy of epsilon, in (0, 1], for the Gaussian (without sampling
        or Poisson-subsampled) only, whose loss spread has a closed form (any other event: a
        ValueError; pass ``grid`` instead); see :func:`dpsgd_epsilon`. A scalar, and not
        together with a ``grid`` that sets a step; None (default): the automatic grid.

    Returns:
      {value}, a float for scalar arguments, else a NumPy float64 array of the broadcast shape
      of the event's parameters, ``steps`` and the target. Pessimistic by default (an upper
      bound on the truth, the worse direction), optimistic (a lower bound) with
      ``pessimistic=False``. 0 for zero steps or a sampling probability of 0; never NaN (a
      failed computation reports {failed}, or 0 when optimistic).
      {note}
"""


@float64
def event_epsilon(
    event: Event,
    steps,
    delta,
    *,
    pessimistic: bool = True,
    grid: Grid | None = None,
    progress: bool = False,
    rtol: float | None = None,
):
    """Smallest epsilon (nats) such that ``steps`` runs of ``event`` are (epsilon, delta)-DP,
    ``delta`` in [0, 1]. Pessimistic (an upper bound on the truth; for events with two adjacency
    directions the worse is reported) unless ``pessimistic=False`` (a lower bound).

    Configurations are grouped by the grid each gets alone, so a batch gives the values of one
    call per configuration. An event whose PLD is not one mechanism (its sampling builds it:
    ``TruncatedPoisson``) is composed from :meth:`~pldjax.mechanisms.events.Event.pld`, one distinct
    configuration at a time. At delta = 0, bounded noise (Laplace, randomized response, discrete
    Laplace; subsampled or not) gives pure DP's epsilon: the runs times one run's largest loss,
    exact to round-off (no composition is built). The Gaussian without sampling (or at sampling
    probability 1) composes to Gaussian DP, mu = sqrt(steps) times its one run's (twice that
    under replace-one): read from that closed form on its safe side, on no grid (``grid`` and
    ``rtol`` do not apply), to about 1e-12 relative down to delta about 1e-290 (below, the
    1e-300 it charges for erfc's underflow weighs: 2% at delta = 1e-300).
    """
    return account(event, steps, delta, "delta", pessimistic=pessimistic, grid=grid,
                    evaluate="epsilon", progress=progress, rtol=rtol)


@float64
def event_delta(
    event: Event,
    steps,
    epsilon,
    *,
    pessimistic: bool = True,
    grid: Grid | None = None,
    progress: bool = False,
    rtol: float | None = None,
):
    """Smallest delta such that ``steps`` runs of ``event`` are (epsilon, delta)-DP, ``epsilon``
    >= 0 (nats, inf allowed). Same conventions as :func:`event_epsilon`; ``rtol`` as in
    :func:`dpsgd_delta`.
    """
    return account(event, steps, epsilon, "epsilon", pessimistic=pessimistic, grid=grid,
                    evaluate="delta", progress=progress, rtol=rtol)


event_epsilon.__doc__ += _EVENT_ARGS.format(
    target="delta: in [0, 1].",
    value="Epsilon in nats",
    failed="inf",
    note="Inf where no finite epsilon is certified at ``delta``.").rstrip()
event_delta.__doc__ += _EVENT_ARGS.format(
    target="epsilon: in nats, >= 0 (inf allowed).",
    value="Delta in [0, 1]",
    failed="1",
    note="").rstrip()  # no blank line left where the note was
