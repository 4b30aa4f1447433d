"""Accounting for T-fold self-composition: epsilon or delta of T runs of any mechanism described
by a :class:`~pldjax.mechanisms.Event` (:func:`event_epsilon`, :func:`event_delta`), and of T
DP-SGD steps, the Poisson-subsampled Gaussian (:func:`dpsgd_epsilon`, :func:`dpsgd_delta`: thin
wrappers that build the event).

For one configuration or for many at once (an event's parameters may be arrays: a batch).
Configurations are sorted by the grid they need and processed in fixed-size chunks: per chunk,
one vmapped call discretizes both directions (:meth:`~pldjax.mechanisms.Event.directions`) and one
places every composition's window (Chernoff); each row then waits, with the rows of later chunks
that need the same window size, for a fused call that composes (an FFT power per row) and
evaluates. Chunks keep memory bounded and shapes repeat, so a sweep compiles a handful of
kernels, whatever its length. When several devices are visible the configuration axis
of each chunk is sharded over a one-dimensional device mesh (``jax.sharding``).

Every value is pessimistic (an upper bound on the true epsilon or delta) unless
``pessimistic=False`` is passed, which gives the optimistic lower bound.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import sys
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pldjax import grid as grid_lib
from pldjax import sampling as sampling_lib
from pldjax.compilation import MappingGuard, exported_jit
from pldjax.compose import (
    COARSER_GRID,
    CompositionTooWide,
    PMFSummary,
    _checked_size,
    chernoff_exponents,
    compose,
    compose_wrapped_rows,
    pmf_summary,
    summary_window,
    window_widths,
    wrap_rows,
)
from pldjax.discretize import MECHANISM_KERNELS, mechanism_half_widths, mechanism_sizes
from pldjax.grid import Grid
from pldjax.mechanisms import Event, direction_arrays, identity
from pldjax.neighboring import Neighboring
from pldjax.noise import Gaussian, Noise
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.profile import delta_kernel, epsilon_kernel
from pldjax.sampling import Directions
from pldjax.subsampling import REMOVE
from pldjax.validate import check_count, check_range, is_traced

#: Most configurations discretized together (per device when sharded), the most mechanism grid
#: points (configurations x points) one chunk discretizes (about 200 bytes each at the peak of
#: discretization and window placement: 32 configurations on 131,072 points took the process
#: from 0.3 to 1.5 GB; bench/dpsgd.py's sweep peaks at 0.9-1.0 GB with 2^18, 1.4 GB without the
#: limit, equally fast), and the most grid points (rows x size) one composition call handles:
#: together they bound the memory in use.
CHUNK = 32
CHUNK_ELEMENTS = 2**18
COMPOSE_ELEMENTS = 2**23
#: On a CPU, small windows share a composition call up to this many grid points (see
#: :func:`_rows_per_call`).
CPU_CALL_ELEMENTS = 2**18
#: Windows of up to this many points are composed at a power of two, larger ones at
#: grid.fft_size (four sizes an octave), except on one accelerator (powers of two throughout): a
#: composition shape takes about a second to compile on a CPU whatever its size, and padding a
#: small window costs little. bench/dpsgd.py's 1,024 configurations at rtol=1e-2 compiled 35
#: shapes in a 79 s first call, now 18 in 46 s, equally fast warm (2 cores).
SMALL_WINDOW = 8192
#: The most rows of any composition call: the evaluation holds a few 128 x 128 matrices a row
#: whatever the window (about 0.4 MB a row at its peak), so tiny windows must not fill a call
#: of COMPOSE_ELEMENTS points (4 million rows of 2 points asked for 567 GB).
CALL_ROWS = 1024
#: The smallest mechanism grid of a configuration whose step is given (rtol's, a lattice's): its
#: window alone sets the size (grid.MECHANISM_SIZE, the automatic step's floor, held four times
#: the 511 points sigma = 1, q = 0.01 needs at rtol=5e-2).
STEPPED_MECHANISM_SIZE = 256
#: CHUNK and CHUNK_ELEMENTS on an accelerator, where a call's cost is mostly its launch and a
#: chunk's memory (about 200 bytes a point, 3.4 GB) is small beside the device's.
ACCELERATOR_CHUNK = 1024
ACCELERATOR_CHUNK_ELEMENTS = 2**24


#: A composition read at delta (dpsgd_epsilon) may leave this fraction of delta outside its window:
#: Chernoff-bounded and charged to delta (the +inf atom of a pessimistic PLD, the bottom of an
#: optimistic one), so delta(eps) moves by at most delta / 2^20 and epsilon by about 1e-6 over
#: -d log(delta) / d eps nats (4e-8 relative at sigma = 0.8, q = 0.02, T = 50, delta = 1e-5).
#: The window then spans sqrt(log(2 / tail)) instead of sqrt(log(2 / grid.TAIL_MASS)) standard
#: deviations of the composed loss: 0.79x at delta = 1e-5. The mechanisms' windows get the same
#: fraction (:func:`mechanism_tail`, T steps of delta / (2^20 T) each): half the mechanism grid at
#: sigma = 1, q = 0.01, T = 1e4, delta = 1e-5, and epsilon 2e-11 relative higher.
TAIL_FRACTION = 2.0**-20


def mechanism_tail(steps, target, evaluate: str):
    """The mass of P each step's mechanism window may leave outside (see
    :func:`pldjax.discretize.window`): a fraction TAIL_FRACTION / steps of the delta that
    ``evaluate == "epsilon"`` reads at, so delta moves by at most delta / 2^20 more; 0 (the
    default windows) where delta is the unknown result."""
    if evaluate != "epsilon":
        return np.zeros_like(target)
    return target * TAIL_FRACTION / np.maximum(steps, 1.0)


def composition_tail(target, evaluate: str):
    """The mass each composition's window may leave outside (see TAIL_FRACTION): a fraction of
    the delta that ``evaluate == "epsilon"`` reads at (never below grid.TAIL_MASS), and
    grid.TAIL_MASS where delta is the unknown result."""
    if evaluate != "epsilon":
        return jnp.full_like(target, grid_lib.TAIL_MASS)
    return jnp.maximum(target * TAIL_FRACTION, grid_lib.TAIL_MASS)


@exported_jit(static_argnames=("pessimistic", "evaluate"))
def _compose_and_evaluate(wrapped, summary, inf_mass, offset, step, count, target, exponents, *,
                          pessimistic, evaluate):
    """Each row's count-fold composition (its PMF wrapped to the window,
    :func:`~pldjax.compose.wrap_rows`), read at its target: one compiled shape per (rows,
    window size)."""
    kernel = epsilon_kernel if evaluate == "epsilon" else delta_kernel
    probs, composed_inf, start = compose_wrapped_rows(
        wrapped, summary, inf_mass, offset, step, count, exponents,
        tail=composition_tail(target, evaluate), pessimistic=pessimistic,
    )
    return jax.vmap(lambda p, m, o, h, t: kernel(p, m, o, h, t[None])[0])(
        probs, composed_inf, start, step, target)


@exported_jit(static_argnames=("size",))
def _gather_rows(probs, index, scalars, *, size):
    """The rows ``index`` of a chunk kept on the device, ready for :func:`_compose_and_evaluate`:
    ``probs`` (chunk rows, mechanism grid) wrapped to ``size``, and ``scalars`` (each with a
    leading chunk rows axis) gathered (a caller pads ``index`` to a full composition call with
    repeats, so that the composition's compiled shapes depend on the window alone; this program
    is cheap to compile per chunk shape)."""
    return wrap_rows(jnp, probs[index], size), [a[index] for a in scalars]


def _placement_rows(probs, offset, step, count, target, evaluate):
    """Each row's count-fold composition: its Chernoff tail window (lo, hi) (grid indices) for
    :func:`composition_tail`, the exponents it came from (which the composition reuses for its
    tail bounds) and the PMF's :func:`~pldjax.compose.pmf_summary`."""
    def one(p, o, h, c, t):
        tail = composition_tail(t, evaluate)
        exponents = chernoff_exponents(p, o, h, c, tail)
        summary = pmf_summary(p)
        lo, hi = summary_window(summary, o, h, c, tail, exponents)
        return lo, hi, exponents, summary

    return jax.vmap(one)(probs, offset, step, count, target)


def _placed_rows(probs, inf_mass, offset, step, count, target, *, directions: int, evaluate: str):
    """The discretization's ``then`` (see :func:`~pldjax.mechanisms.direction_arrays`): its rows
    in this module's order (every configuration's first direction, then every one's second), with
    their windows placed (:func:`_placement_rows`; ``count`` and ``target`` in that order):
    (probs, inf_mass, offset, step, lo, hi, exponents, summary). It runs in the program of the
    masses, which is queued behind the curve's without a round trip through the host."""
    def by_direction(a):
        a = a.reshape((-1, directions) + a.shape[1:])
        return jnp.moveaxis(a, 1, 0).reshape((-1,) + a.shape[2:])

    probs, inf_mass, offset, step = (by_direction(a) for a in (probs, inf_mass, offset, step))
    return (probs, inf_mass, offset, step,
            *_placement_rows(probs, offset, step, count, target, evaluate))


@functools.cache
def _placement(directions: int, evaluate: str) -> Callable:
    """:func:`_placed_rows` for ``directions`` and ``evaluate``: one object each, as the
    discretization kernels' static ``then`` must be to reuse their compiled programs."""
    return functools.partial(_placed_rows, directions=directions, evaluate=evaluate)


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
                   pessimistic, grid, grid_steps, evaluate, sharding, remedy):
    """Values for one chunk of configurations (all steps >= 1), once ``compositions`` (a
    :class:`_Compositions`) has run: ``params`` are the flat parameters of ``mechanism``
    (:meth:`~pldjax.mechanisms.Event.directions`); ``grid_steps``: each one's mechanism grid
    step (nats; rtol's, a lattice's), or None for ``grid``'s.

    Both directions of every configuration are discretized, and their windows placed, in one
    call, queued here. Returns ``place``: it reads the windows' widths back (waiting for that
    call), hands each row to ``compositions`` under the composition size it needs
    (:meth:`_Compositions.window_size`) and returns a function giving the chunk's values. A
    caller queues the next chunk's discretization before it places this one, so that on an
    accelerator the device has work while the host places. ``remedy``: what an error about a
    window that cannot be placed tells the caller to change.
    """
    # on a CPU the glue runs in NumPy on one device (each eager jnp operation would be one more
    # small program to compile, or to load from the cache, per process)
    xp = np if compositions.host_glue else jnp
    params = [np.asarray(p, np.float64) for p in params]
    steps, target = np.asarray(steps, np.float64), np.asarray(target, np.float64)
    directions = 2 if both else 1
    # rows: every configuration's first direction, then (when it has two) every one's second;
    # the host reads the counts (window widths), the discretization and every composition call
    # of the chunk read the counts and targets: on an accelerator put there once
    counts, targets = (np.concatenate([a] * directions) for a in (steps, target))
    row_counts, row_targets = counts, targets
    if sharding is not None:
        row_counts, row_targets = _place([counts, targets], sharding)
    elif not compositions.host_glue:
        row_counts, row_targets = jax.device_put(counts), jax.device_put(targets)
    probs, inf_mass, offset, step, lo, hi, exponents, summary = direction_arrays(
        Directions(mechanism, tuple(params), both), grid, pessimistic,
        mechanism_tail(steps, target, evaluate), mechanism_size,
        then=_placement(directions, evaluate), extra=(row_counts, row_targets), steps=grid_steps)
    # off the host glue (xp = jnp) these wait for nothing; on a CPU, where the chunk is placed
    # at once, they wait for the call as place() would
    probs, inf_mass, offset, step = (xp.asarray(a) for a in (probs, inf_mass, offset, step))
    exponents = [xp.asarray(e) for e in exponents]
    summary = PMFSummary(*(xp.asarray(s) for s in summary))

    def place():
        sizes = np.array([compositions.window_size(int(w)) for w in window_widths(
            summary, offset, counts, lo, hi, "steps", remedy)])
        # a row repeated (the chunk's padding, or a configuration given twice) is composed once
        if steps.shape[0] == 1:
            first = same = np.arange(directions)
        else:
            config = np.column_stack([*params, steps, target])
            rows_of = np.column_stack([np.repeat(np.arange(directions), config.shape[0]),
                                       np.tile(config, (directions, 1))])
            _, first, same = np.unique(rows_of, axis=0, return_index=True, return_inverse=True)
        values = np.zeros(sizes.shape[0])
        scalars = (*summary, inf_mass, offset, step, row_counts, row_targets, *exponents)
        for size in np.unique(sizes[first]):
            size = _checked_size(int(size), "dpsgd accounting", "steps", remedy)
            compositions.add(size, probs, scalars, first[sizes[first] == size], values)

        def finish():
            return np.max(values[first][same.reshape(-1)].reshape(directions, -1), axis=0)

        return finish

    return place


class _Compositions:
    """Rows waiting for their composition and evaluation, by window size.

    On a CPU, and when sharded, across chunks: a size's rows are composed as soon as they fill a
    call (:func:`_rows_per_call`), and :meth:`flush` composes what is left, padded with repeats.
    On a CPU a call of fewer rows than cores takes as long as a full one, so a chunk's odd row
    waits for the next chunk's instead of sharing its call with a repeat (the sweep of 1,024
    composed 2,298 rows, 250 of them repeats). On one accelerator a chunk's rows are composed
    straight from the chunk (:func:`_gather_rows`), and their values read back at
    :meth:`flush`, so the device runs ahead of the host; there every call of a size has the
    same number of rows (one compiled shape per size): a full call, or the power of two at or
    above ``rows``, the most rows the accounting call has (a single configuration's two
    directions composed 64 rows of 131,072 points otherwise).
    """

    def __init__(self, *, sharding, pessimistic: bool, evaluate: str, rows: int):
        self._sharding = sharding
        self._devices = 1 if sharding is None else len(jax.devices())
        self._gathers = sharding is None and _keeps_chunks_on_device()
        self.host_glue = sharding is None and not self._gathers
        self._xp = np if self.host_glue else jnp
        #: The composition size for a window of ``width`` points (:func:`composition_size`), or
        #: on one accelerator the power of two (a quarter of the compiled shapes, compiled for
        #: seconds each there, for at most twice the points)
        self.window_size = grid_lib.next_pow2 if self._gathers else composition_size
        self._rows = grid_lib.next_pow2(rows)
        self._options = dict(pessimistic=pessimistic, evaluate=evaluate)
        self._pending: dict[int, list] = {}
        self._results: list = []

    def add(self, size: int, probs, scalars, rows: np.ndarray, values: np.ndarray) -> None:
        """Queue the rows ``rows`` of a chunk (on one accelerator: start their composition) from
        its PMFs ``probs`` (rows, mechanism grid) and ``scalars`` (summary, inf_mass, offset,
        step, count, target, exponents; each with a leading rows axis); their values go to
        values[rows] by :meth:`flush` at the latest."""
        most = _rows_per_call(size, self._devices)
        if self._gathers:
            most = min(most, self._rows)
            for begin in range(0, len(rows), most):
                part = rows[begin:begin + most]
                index = np.concatenate([part, np.full(most - len(part), part[-1])])
                wrapped, columns = _gather_rows(probs, index, scalars, size=size)
                got = _compose_and_evaluate(wrapped, PMFSummary(*columns[:5]), *columns[5:10],
                                            tuple(columns[10:]), **self._options)
                self._results.append((got, values, part))
            return
        pending = self._pending.setdefault(size, [])
        pending.append((probs[rows], [a[rows] for a in scalars], values, rows))
        while sum(len(block[3]) for block in pending) >= most:
            self._run(size, most)

    def flush(self) -> None:
        """Compose every row still queued; read back every value."""
        for size, pending in self._pending.items():
            most = _rows_per_call(size, self._devices)
            while pending:
                self._run(size, most)
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
            wrapped.append(wrap_rows(xp, probs[:k], size))
            columns.append([column[:k] for column in scalars])
            sinks += [(values, index) for index in indices[:k]]
            if k < len(indices):
                blocks[0] = (probs[k:], [column[k:] for column in scalars], values, indices[k:])
            else:
                blocks.pop(0)
        # a power of two of rows, padded with repeats (few compiled shapes)
        batch = min(most, max(2, grid_lib.next_pow2(len(sinks))))
        batch = -(-batch // devices) * devices  # sharded: a multiple of the devices
        if batch > len(sinks):
            repeat = batch - len(sinks)
            wrapped.append(xp.repeat(wrapped[-1][-1:], repeat, axis=0))
            columns.append([xp.repeat(column[-1:], repeat, axis=0) for column in columns[-1]])
        arrays = [parts[0] if len(parts) == 1 else xp.concatenate(parts)
                  for parts in [wrapped, *zip(*columns, strict=True)]]
        arrays = _place(arrays, self._sharding)
        got = np.asarray(_compose_and_evaluate(
            arrays[0], PMFSummary(*arrays[1:6]), *arrays[6:11], tuple(arrays[11:]),
            **self._options,
        ))
        for value, (values, index) in zip(got, sinks, strict=False):
            values[index] = value


def composition_size(width: int) -> int:
    """Points of the composition window that holds ``width`` points (see SMALL_WINDOW)."""
    return grid_lib.next_pow2(width) if width <= SMALL_WINDOW else grid_lib.fft_size(width)


def _rows_per_call(size: int, devices: int) -> int:
    """Most rows one composition call takes (a power of two; a multiple of the devices when
    sharded): COMPOSE_ELEMENTS grid points in all and at most CALL_ROWS rows, and on a CPU the
    power of two at or above its cores (XLA runs one row per core; 2 rows of 81,920 points took
    3.4 ms a row on 2 cores, 1 row 6.4 ms, 8 rows 3.1 ms: more rows a call only add compiled
    shapes), or as many as fill CPU_CALL_ELEMENTS points where windows are small (a call's
    fixed cost then weighs: the sweep of 1,024 took 7.5 -> 6.8 s, at rtol 1e-2 2.05 -> 1.66 s)."""
    most = max(1, min(CALL_ROWS, COMPOSE_ELEMENTS // size))
    if not _keeps_chunks_on_device():
        most = min(most, max(grid_lib.next_pow2(_cores()), CPU_CALL_ELEMENTS // size))
    most = 1 << (most.bit_length() - 1)
    return max(devices, most // devices * devices)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _loss_spread(sigma, q):
    """Rough standard deviation (nats) of one step's privacy loss: q sqrt(chi^2) for small q,
    at most the unsubsampled loss's 1 / sigma."""
    mu = 1.0 / sigma
    return np.minimum(q * np.sqrt(np.expm1(np.minimum(mu, np.sqrt(700.0)) ** 2)), mu)


def _mechanism_points(sigma, q):
    """Rough relative grid size a configuration needs (used to sort configurations into chunks)."""
    mu = np.minimum(1.0 / sigma, 1e150)  # squared below float64's largest
    top = np.logaddexp(np.log1p(-np.minimum(q, 1 - 1e-16)), np.log(q) + mu**2 / 2 + 10 * mu)
    return top / _loss_spread(sigma, q)


#: Integer Renyi orders of :func:`_rdp_epsilon` (a coarse set: it only sizes grids).
_RDP_ORDERS = np.array([2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256])


@functools.cache
def _rdp_terms() -> tuple[np.ndarray, ...]:
    """The terms k = 0 .. a of the binomial expansion at each order a of _RDP_ORDERS, flat (944
    terms, not 18 x 257): for each term log C(a, k) and the coefficients a - k, k and k^2 - k of
    log(1 - q), log q and 1 / (2 sigma^2); and where each order's terms start."""
    order = np.repeat(_RDP_ORDERS, _RDP_ORDERS + 1).astype(np.float64)
    k = np.concatenate([np.arange(a + 1) for a in _RDP_ORDERS]).astype(np.float64)
    log_binomial = np.array([math.lgamma(a + 1.0) - math.lgamma(j + 1.0) - math.lgamma(a - j + 1.0)
                             for a, j in zip(order, k, strict=True)])
    starts = np.concatenate([[0], np.cumsum(_RDP_ORDERS + 1)[:-1]])
    return log_binomial, order - k, k, k * k - k, starts


#: Configurations per block of :func:`_rdp_epsilon` (each takes 944 terms; 32 to 128 were alike).
_RDP_BLOCK = 64


def _rdp_epsilon(sigma, q, steps, delta):
    """An estimate of epsilon (nats) from the Renyi DP of the Poisson-subsampled Gaussian at
    integer orders (Mironov, Talwar and Zhang's binomial expansion) and the standard conversion:
    an upper bound, about 10% loose, used only to choose a grid step (never reported); flat.
    Every term combines three logarithms per configuration with constant coefficients."""
    sigma, q, steps, delta = (a.reshape(-1) for a in np.broadcast_arrays(
        *(np.asarray(a, np.float64) for a in (sigma, q, steps, delta))))
    log_binomial, misses, k, square, starts = _rdp_terms()
    counts = _RDP_ORDERS + 1
    orders = _RDP_ORDERS.astype(np.float64)
    with np.errstate(divide="ignore"):
        # -inf (q = 1, or 0) made finite: times a count of 0 it must give 0, not NaN
        log_miss = np.maximum(np.log1p(-q), -1e300)[:, None]
        log_hit = np.maximum(np.log(q), -1e300)[:, None]
    twice_variance = (2 * sigma**2)[:, None]
    out = np.empty(sigma.shape)
    for begin in range(0, sigma.size, _RDP_BLOCK):
        part = slice(begin, begin + _RDP_BLOCK)
        terms = (log_binomial + misses * log_miss[part] + k * log_hit[part]
                 + square / twice_variance[part])
        top = np.maximum.reduceat(terms, starts, axis=-1)
        spread = np.exp(terms - np.repeat(top, counts, axis=-1))
        log_a = top + np.log(np.add.reduceat(spread, starts, axis=-1))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            eps = (steps[part, None] * log_a / (orders - 1)
                   + np.log(1.0 / delta[part, None]) / (orders - 1))
        out[part] = np.nan_to_num(np.min(eps, axis=-1), nan=np.inf)
    return out


def accuracy_step(rtol, steps, epsilon, spread, z):
    """The grid step (a power of two, nats) for a target relative accuracy ``rtol`` of an
    ``epsilon`` (an estimate, nats) after ``steps`` compositions of a loss whose standard
    deviation is ``spread``, at ``z`` standard deviations of the composed loss above its mean.

    Connect-the-dots adds up to h^2 / 4 of variance per composition (a two-point split across
    one step; measured errors are about half of this rule's: see bench/README.md). For a
    Gaussian-like composed loss of variance v = T spread^2 (mean v / 2), epsilon = v / 2 +
    z sqrt(v) moves by (1/2 + z / (2 sqrt v)) T h^2 / 4. So h is the largest power of two with
    that at most rtol epsilon, kept at most ``spread`` (the rule needs several points across one
    step's loss) and at least grid.MIN_SPREAD: on finer steps a near-identity loss's curve loses
    its masses to round-off (sigma 1e12, q = 1, 1,000 steps: delta(0) 1.5e-8 on steps of 2^-40,
    2.9e-7 on 2^-41, 1 and so epsilon inf on 2^-42 and below; the truth is 1.3e-11).
    """
    sd = np.sqrt(np.maximum(steps, 1.0)) * spread
    slope = 0.5 + np.maximum(z, 0.0) / (2.0 * np.maximum(sd, 1e-300))
    wanted = np.sqrt(4.0 * rtol * np.maximum(epsilon, 0.0) / (np.maximum(steps, 1.0) * slope))
    wanted = np.clip(np.minimum(wanted, spread), grid_lib.MIN_SPREAD, grid_lib.MAX_STEP)
    return np.ldexp(1.0, np.floor(np.log2(wanted)).astype(np.int64))


def _progress(total: int, enabled: bool) -> Callable[[int], None]:
    def report(done: int) -> None:
        if enabled:
            bar = "#" * (30 * done // total)
            print(f"\r[{bar:<30}] {done}/{total} configurations", end="", file=sys.stderr)
            if done == total:
                print(file=sys.stderr)

    return report


def _rtol_remedy(rtol, step) -> str:
    """What a composition too wide for float64 at ``rtol``'s grid ``step`` tells its caller."""
    return (f"rtol={float(rtol):.3g} asks for grid steps down to {float(step):.3g} nats here, too "
            "fine: use a larger rtol (or the default grid, rtol=None)")


def _check_rtol(rtol, grid: Grid | None) -> None:
    if rtol is None:
        return
    check_range("rtol", rtol, 0.0, 1.0, low_open=True)
    if np.ndim(rtol) != 0:
        raise ValueError(f"rtol must be a scalar, got shape {np.shape(rtol)}")
    if grid is not None and grid.step is not None:
        raise ValueError("pass either rtol (the step follows from it) or a Grid(step=...), not both")


def _accuracy_steps(sigma, q, steps, target, target_name, neighboring, rtol):
    """Each configuration's grid step for ``rtol`` (see :func:`accuracy_step`); the epsilon it
    aims at is given (dpsgd_delta) or estimated (dpsgd_epsilon) by the smaller of Renyi DP and
    the Gaussian estimate sd (z + sd / 2) of a composed loss with standard deviation sd (Renyi
    DP alone overestimated tiny epsilons 10-17x, and so the step: 85 of bench/dpsgd.py's 1,024
    configurations were up to 4x rtol off; now 2, at most 1.7x), and never taken below sd."""
    shift_sigma = sigma / 2 if neighboring == "replace_one" else sigma
    spread = _loss_spread(shift_sigma, q)
    sd = np.sqrt(steps) * spread
    if target_name == "delta":
        z = np.sqrt(2.0 * np.log(1.0 / np.maximum(target, 1e-300)))
        estimate = np.minimum(_rdp_epsilon(shift_sigma, q, steps, np.maximum(target, 1e-300)),
                              sd * (z + sd / 2))
    else:
        estimate = target
        z = (target - sd**2 / 2) / np.maximum(sd, 1e-300)
    # never below one standard deviation of the composed loss (a large delta's tiny epsilon)
    estimate = np.maximum(np.where(np.isfinite(estimate), estimate, sd), sd)
    return accuracy_step(rtol, steps, estimate, spread, np.nan_to_num(z, posinf=0.0))


def _mechanism_sizes(mechanism, params, both, grid, tail, half_widths=None):
    """The mechanism grid size each configuration gets alone (see discretize.mechanism_sizes):
    with a given step (rtol's, a lattice's), from STEPPED_MECHANISM_SIZE up. ``half_widths``:
    their windows' half-widths in nats (:func:`_half_widths_nats`) where the caller has them
    (then no compiled call)."""
    if half_widths is not None and grid is not None and grid.step is not None:
        return _sizes_on_steps(half_widths, grid.step, grid)
    smallest = grid_lib.MECHANISM_SIZE if grid is None or grid.step is None else STEPPED_MECHANISM_SIZE
    return mechanism_sizes(mechanism, tuple(params) + ((REMOVE,) if both else ()), grid, tail,
                           smallest)


def _sizes_on_steps(half_widths, steps, grid: Grid | None) -> np.ndarray:
    """The mechanism grid sizes of windows of ``half_widths`` nats on the given ``steps`` (see
    :func:`_mechanism_sizes`): from STEPPED_MECHANISM_SIZE up, or ``grid.size`` when set."""
    if grid is not None and grid.size is not None:
        return np.full(np.shape(half_widths), grid.size)
    return grid_lib.mechanism_sizes(half_widths / steps, STEPPED_MECHANISM_SIZE)


def _half_widths_nats(mechanism, params, both, tail) -> Callable[[], np.ndarray]:
    """Each configuration's mechanism window half-width (nats; flat), as _mechanism_sizes
    measures it (the remove direction's when there are two): the function that reads them once
    computed (see discretize.mechanism_half_widths)."""
    return mechanism_half_widths(mechanism, tuple(params) + ((REMOVE,) if both else ()), tail,
                                 1.0)


def _covering_steps(half_widths):
    """rtol's finest steps (nats): on a finer one a window of ``half_widths`` nats no longer
    fits the largest mechanism grid (MAX_MECHANISM_SIZE points), and the loss beyond the grid
    goes to its ends (a tiny sampling probability over many steps: a loss spread of 7e-8 nats
    asked for steps of 6e-8, on which a window of 2.4 nats was 2^25 points, and the composition
    could not be placed even at rtol = 1, where the automatic grid answers)."""
    return grid_lib.cover_step(np.nan_to_num(half_widths, nan=0.0), grid_lib.MAX_MECHANISM_SIZE,
                               np)


def _optimistic_steps(steps, half_widths, grid: Grid | None):
    """rtol's ``steps`` for the optimistic estimate, whose window spans at most
    grid.OPTIMISTIC_SPAN nats: each at most the limit of the size its window then gets (a finer
    step is only more accurate; the estimate is 0 beyond its window, still a lower bound). A
    coarser one was refused with an error about a Grid.step the caller never gave (sigma = 1e-6,
    or sigma = 0.05 with q = 1). Sizes grow as steps shrink, so this repeats until they agree."""
    while True:
        limits = grid_lib.optimistic_step_limit(_sizes_on_steps(half_widths, steps, grid))
        if np.all(steps <= limits):
            return steps
        steps = np.minimum(steps, limits)


def _gaussian_poisson(event: Event, shape) -> tuple[np.ndarray, np.ndarray] | None:
    """(noise multiplier sigma / sensitivity, sampling probability), flat, for an event that is
    the Gaussian without sampling (q = 1) or Poisson-subsampled, whose closed forms (loss
    spread, Renyi DP) order chunks and size rtol's grids; None for any other event."""
    sampling = event.sampling
    if type(event.noise) is not Gaussian or not (sampling is None
                                                or type(sampling) is sampling_lib.Poisson):
        return None
    noise = event.noise
    sigma = np.asarray(noise.sigma, np.float64) / np.asarray(noise.sensitivity, np.float64)
    q = 1.0 if sampling is None else np.asarray(sampling.sampling_prob, np.float64)
    return tuple(np.broadcast_to(a, shape).reshape(-1) for a in (sigma, q))


def _spends(event: Event, shape) -> np.ndarray:
    """Where a configuration can reveal anything (flat): False where its sampling probability
    is 0 (its PLD is the identity)."""
    q = getattr(event.sampling, "sampling_prob", 1.0)
    return np.broadcast_to(np.asarray(q, np.float64) > 0, shape).reshape(-1)


def _lattice_steps(event: Event, params, shape, pessimistic: bool) -> np.ndarray | None:
    """Each configuration's exact lattice step (0: the automatic grid) for an integer-valued noise
    without sampling, as :func:`~pldjax.mechanisms.privacy_loss` picks it for each alone (flat;
    ``params``: the flat mechanism parameters, ``shape``: the batch's); None when the event has
    no lattice."""
    noise = event.noise
    if event.sampling is not None or type(noise).lattice is Noise.lattice:
        return None
    names = [field.name for field in dataclasses.fields(noise)]
    rows = np.stack([np.broadcast_to(np.asarray(getattr(noise, name), np.float64),
                                     shape).reshape(-1) for name in names] + list(params), axis=-1)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    steps = np.zeros(unique.shape[0])
    for i, row in enumerate(unique):
        one = type(noise)(**dict(zip(names, row[:len(names)], strict=True)))
        grid = one.lattice(tuple(row[len(names):]), pessimistic)
        steps[i] = 0.0 if grid is None else grid.step
    return steps[inverse.reshape(-1)]


#: Releases the accounting kernels before a sweep runs out of memory mappings: a first look at
#: 64 compiled shapes, then every 16 more (see pldjax.compilation.MappingGuard).
_MAPPINGS = MappingGuard((*MECHANISM_KERNELS, _compose_and_evaluate, _gather_rows), first=64,
                         every=16)


def _account_group(order, params, steps, target, *, sharding, mechanism_size, grid_steps,
                   **kwargs):
    """The configurations ``order`` (one mechanism grid size; ``grid_steps``: every
    configuration's own grid step, or None: ``grid``'s), in chunks: yields each chunk's
    (indices, ``place``) once its discretization is queued (see :func:`_account_chunk`)."""
    devices = 1 if sharding is None else len(jax.devices())
    on_device = _keeps_chunks_on_device()
    # few distinct batch shapes, so few compiled kernels: 1, 2, 4, 8, then multiples of 8
    # (padded with repeats, at most 7 rows of waste); powers of two on an accelerator
    wanted = (grid_lib.next_pow2(len(order)) if len(order) <= 8 or on_device
              else -(-len(order) // 8) * 8)
    configs, elements = ((ACCELERATOR_CHUNK, ACCELERATOR_CHUNK_ELEMENTS) if on_device
                         else (CHUNK, CHUNK_ELEMENTS))
    chunk = min(configs, max(1, elements // mechanism_size)) * devices
    chunk = min(chunk, wanted)
    chunk = -(-chunk // devices) * devices
    for begin in range(0, len(order), chunk):
        idx = order[begin:begin + chunk]
        padded = np.concatenate([idx, np.full(chunk - len(idx), idx[-1])])
        yield idx, _account_chunk([p[padded] for p in params], steps[padded], target[padded],
                                  sharding=sharding, mechanism_size=mechanism_size,
                                  grid_steps=None if grid_steps is None else grid_steps[padded],
                                  **kwargs)


def _account(event: Event, steps, target, target_name, *, pessimistic, grid, evaluate, progress,
             rtol=None, function=None):
    function = function or f"event_{evaluate}"
    if not isinstance(event, Event):
        raise ValueError(f"event must be a pldjax.Event, got {event!r}")
    if is_traced((event, steps, target)):
        raise ValueError(
            f"{function} picks its grids from the values and cannot run under jit; inside jit, "
            "build the PLD with event.pld(grid=pj.Grid(size=...)) and self_compose(size=...)"
        )
    check_range("steps", steps, 0.0)
    if target_name == "delta":
        check_range("delta", target, 0.0, 1.0)
    else:
        check_range("epsilon", target, 0.0, allow_inf=True)
    _check_rtol(rtol, grid)
    steps_arr = np.asarray(steps, np.float64)
    if np.any(steps_arr != np.floor(steps_arr)):
        raise ValueError(f"steps must be whole numbers >= 0, got {steps!r}")
    mechanism, params, both = event.directions(pessimistic)
    arrays = np.broadcast_arrays(*(np.asarray(p, np.float64) for p in params), steps_arr,
                                 np.asarray(target, np.float64))
    shape = arrays[0].shape
    *params, steps_arr, target = (a.reshape(-1) for a in arrays)
    closed_form = _gaussian_poisson(event, shape)
    if rtol is not None and closed_form is None:
        raise ValueError(
            "rtol needs an estimate of the loss's spread, available for the Gaussian (without "
            "sampling or Poisson-subsampled) only; for this event pass grid=pj.Grid(step=...)"
        )
    out = np.zeros(steps_arr.shape[0])  # zero steps: epsilon 0 and delta 0
    active = np.nonzero((steps_arr > 0) & _spends(event, shape))[0]
    # configurations on one grid step share a chunk (one Grid per call): rtol's steps, or each
    # one's exact lattice (integer-valued noise), or the automatic steps (one group)
    half_widths = None
    if rtol is not None:
        read_half_widths = _half_widths_nats(
            mechanism, [p[active] for p in params], both,
            mechanism_tail(steps_arr[active], target[active], evaluate))
        sigma, q = closed_form
        group_steps = _accuracy_steps(sigma[active], q[active], steps_arr[active], target[active],
                                      target_name, event.neighboring, float(rtol))
        half_widths = read_half_widths()
        group_steps = np.maximum(group_steps, _covering_steps(half_widths))
        if not pessimistic:
            group_steps = _optimistic_steps(group_steps, half_widths, grid)
    else:
        lattice = _lattice_steps(event, params, shape, pessimistic) if grid is None else None
        group_steps = np.zeros(active.shape[0]) if lattice is None else lattice[active]
    sharding = _sharding()
    compositions = _Compositions(sharding=sharding, pessimistic=pessimistic, evaluate=evaluate,
                                 rows=(2 if both else 1) * max(len(active), 1))

    # the mechanism grid each configuration gets alone: a chunk is discretized at its largest
    # member's size, so no configuration is slower (or on another grid) in a batch
    sizes = np.zeros(active.shape[0], np.int64)
    for group_step in np.unique(group_steps):
        in_group = group_steps == group_step
        stepped = active[in_group]
        group_grid = (grid if group_step == 0
                      else dataclasses.replace(grid or Grid(), step=float(group_step)))
        sizes[in_group] = _mechanism_sizes(
            mechanism, [p[stepped] for p in params], both, group_grid,
            mechanism_tail(steps_arr[stepped], target[stepped], evaluate),
            None if half_widths is None else half_widths[in_group])
    grid_steps = np.zeros(steps_arr.shape[0])
    grid_steps[active] = group_steps

    def chunks():  # each chunk's discretization queued as the loop below asks for it
        # configurations of one size share chunks: on the automatic grid, or each on its own
        # step (rtol's, a lattice's). Chunks of one step each were 48 for bench/dpsgd.py's 10^4
        # configurations at rtol=1e-2 on an accelerator, 14 now (23 mechanism shapes, 7 now)
        on_own_step = group_steps > 0
        for own_steps in np.unique(on_own_step):
            for size in np.unique(sizes[on_own_step == own_steps]):
                chosen = (on_own_step == own_steps) & (sizes == size)
                members = active[chosen]
                remedy = COARSER_GRID
                if rtol is not None:
                    remedy = _rtol_remedy(rtol, np.min(group_steps[chosen]))
                # alike configurations side by side (few distinct composition sizes per chunk)
                points = (np.zeros(members.shape[0]) if closed_form is None
                          else _mechanism_points(*(a[members] for a in closed_form)))
                order = members[np.lexsort((steps_arr[members], points, group_steps[chosen]))]
                yield from _account_group(
                    order, params, steps_arr, target, mechanism=mechanism,
                    mechanism_size=int(size), both=both, pessimistic=pessimistic,
                    grid=grid, grid_steps=grid_steps if own_steps else None, evaluate=evaluate,
                    sharding=sharding, compositions=compositions, remedy=remedy)

    report = _progress(len(active), progress)
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

    # on an accelerator one chunk ahead: the next chunk's discretization is queued before this
    # one is placed, so that the device works while the host places (on a CPU, which computes
    # as fast either way, it would only hold two chunks at once)
    ahead = 0 if compositions.host_glue else 1
    for chunk in chunks():
        queued.append(chunk)
        if len(queued) > ahead:
            place_first()
    while queued:
        place_first()
    compositions.flush()
    for idx, finish in finishers:
        out[idx] = finish()[: len(idx)]

    # never NaN: should a configuration still produce one, report the trivial sound bound
    # (epsilon inf or delta 1 pessimistic, 0 optimistic) rather than a number that is none
    out = np.where(np.isnan(out), (np.inf if evaluate == "epsilon" else 1.0) if pessimistic else 0.0,
                   out)
    return out.reshape(shape) if shape else float(out[0])


_EVENT_ARGS = """
    Args:
      event: a :class:`~pldjax.mechanisms.Event`, e.g. ``pj.Event(pj.noise.Laplace(2.0),
        pj.sampling.Poisson(0.01))``; array parameters are a batch (they broadcast with
        ``steps`` and the target; the result has the broadcast shape, a float for scalars).
      steps: whole number of compositions >= 0.
      pessimistic: False for the optimistic (lower-bound) estimate.
      grid: optional mechanism :class:`Grid` (a finer step is tighter and slower); automatic by
        default (for integer-valued noise without sampling: each configuration's exact lattice).
      progress: print a progress bar to stderr.
      rtol: target relative accuracy of epsilon, in (0, 1], for the Gaussian (without sampling
        or Poisson-subsampled) only, whose loss spread has a closed form (any other event: a
        ValueError; pass ``grid`` instead); see :func:`dpsgd_epsilon`.
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
    call per configuration.
    """
    return _account(event, steps, delta, "delta", pessimistic=pessimistic, grid=grid,
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
    return _account(event, steps, epsilon, "epsilon", pessimistic=pessimistic, grid=grid,
                    evaluate="delta", progress=progress, rtol=rtol)


event_epsilon.__doc__ += _EVENT_ARGS
event_delta.__doc__ += _EVENT_ARGS


def dpsgd_event(noise_multiplier, sampling_prob, neighboring: Neighboring | str = "add_remove"
                ) -> Event:
    """The event of one DP-SGD step: the Gaussian with noise multiplier ``noise_multiplier`` > 0
    (noise standard deviation / clipping norm) on a Poisson sample of rate ``sampling_prob`` in
    [0, 1] (arrays allowed: a batch). Checks the arguments under these names."""
    if not is_traced((noise_multiplier, sampling_prob)):
        check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
        check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    return Event(Gaussian(noise_multiplier), sampling_lib.Poisson(sampling_prob),
                 Neighboring.parse(neighboring))


@float64
def dpsgd_epsilon(
    noise_multiplier,
    sampling_prob,
    steps,
    delta,
    *,
    neighboring: str = "add_remove",
    pessimistic: bool = True,
    grid: Grid | None = None,
    progress: bool = False,
    rtol: float | None = None,
):
    """Smallest epsilon such that ``steps`` DP-SGD steps are (epsilon, delta)-DP.

    Each step is the Gaussian mechanism with noise multiplier ``noise_multiplier`` (noise standard
    deviation / clipping norm) on a Poisson sample of rate ``sampling_prob``
    (:func:`event_epsilon` of :func:`dpsgd_event`). All four arguments broadcast; the result has
    their broadcast shape (a float for scalars). Pessimistic: an upper bound on the true epsilon
    (both adjacency directions, the worse reported).

    Args:
      noise_multiplier: > 0.
      sampling_prob: in [0, 1] (0: nothing is learned, epsilon 0).
      steps: whole number of steps >= 0.
      delta: in [0, 1].
      neighboring: "add_remove" (default) or "replace_one".
      pessimistic: False for the optimistic (lower-bound) estimate.
      grid: optional mechanism :class:`Grid` (a finer step is tighter and slower).
      progress: print a progress bar to stderr.
      rtol: target relative accuracy of epsilon, in (0, 1]; the grid step follows from it (the
        discretization error of a T-fold composition grows like T step^2). None (default): the
        automatic grid (about 1e-5 relative here). For example 1e-2 (several times faster), or
        5e-2 for hyperparameter searches. Whatever rtol, the pessimistic value stays an upper
        bound; rtol sets how close to the truth it aims to be (a target, not a guarantee). The
        step is never finer than the finest on which one step's loss window fits the largest
        mechanism grid (grid.MAX_MECHANISM_SIZE points); where rtol asks for a finer one (a
        tiny sampling probability, or a very small rtol) it is not met. The optimistic value
        (``pessimistic=False``) stays a lower bound but can be far below the truth, even 0, on
        a step coarser than -log(1 - q), which a coarse rtol can pick (see the README).
    """
    if is_traced((noise_multiplier, sampling_prob, steps, delta)):
        raise ValueError(_UNDER_JIT.format("epsilon"))
    return _account(dpsgd_event(noise_multiplier, sampling_prob, neighboring), steps, delta,
                    "delta", pessimistic=pessimistic, grid=grid, evaluate="epsilon",
                    progress=progress, rtol=rtol, function="dpsgd_epsilon")


@float64
def dpsgd_delta(
    noise_multiplier,
    sampling_prob,
    steps,
    epsilon,
    *,
    neighboring: str = "add_remove",
    pessimistic: bool = True,
    grid: Grid | None = None,
    progress: bool = False,
    rtol: float | None = None,
):
    """Smallest delta such that ``steps`` DP-SGD steps are (epsilon, delta)-DP (``epsilon`` >= 0).

    Same conventions as :func:`dpsgd_epsilon`; pessimistic (an upper bound) by default.
    ``rtol``: the grid's target accuracy, as an epsilon-equivalent (the step for which epsilon
    would be accurate to rtol relative near ``epsilon``).
    """
    if is_traced((noise_multiplier, sampling_prob, steps, epsilon)):
        raise ValueError(_UNDER_JIT.format("delta"))
    return _account(dpsgd_event(noise_multiplier, sampling_prob, neighboring), steps, epsilon,
                    "epsilon", pessimistic=pessimistic, grid=grid, evaluate="delta",
                    progress=progress, rtol=rtol, function="dpsgd_delta")


_UNDER_JIT = ("dpsgd_{} picks its grids from the values and cannot run under jit; inside jit, "
              "build the PLD with pj.gaussian(..., grid=pj.Grid(size=...)) and self_compose(size=...)")


@float64
def compose_schedule(
    segments: Sequence[tuple[float, float, int] | tuple[Event, int]],
    *,
    neighboring: str = "add_remove",
    pessimistic: bool = True,
    grid: Grid | None = None,
    rtol: float | None = None,
) -> PLD:
    """The PLD of a run whose mechanism changes: segments (event, steps), or (sigma, q, steps)
    for DP-SGD steps (:func:`dpsgd_event` under ``neighboring``; an event carries its own).

    Each segment is ``steps`` runs of its event (scalar parameters) composed in one FFT power;
    the segments are then composed by FFT convolution (:func:`pldjax.compose.compose`, which
    aligns their grids on the safe side: exactly onto the finest step when the automatic
    power-of-two steps allow it within grid.MAX_SIZE, otherwise onto the coarsest,
    pessimistically or optimistically as the PLDs are). Both adjacency directions are kept.
    Returns a :class:`~pldjax.pld.PLD`: read ``.epsilon(delta)`` or ``.delta(epsilon)`` from it.
    ``rtol``: target relative accuracy of the epsilons read from it, as in :func:`dpsgd_epsilon`
    (one step for every segment, from their total count and the composed loss's spread; the
    Gaussian's closed form, so every segment must be a Gaussian event, else a ValueError).
    """
    segments = list(segments)
    if not segments:
        raise ValueError("segments must hold at least one (event, steps) or (noise_multiplier, "
                         "sampling_prob, steps)")
    _check_rtol(rtol, grid)
    parts, checked = [], []
    for i, segment in enumerate(segments):
        if len(segment) == 2 and isinstance(segment[0], Event):
            event, steps = segment
            if any(np.size(p) != 1 for p in event.directions(pessimistic).params):
                raise ValueError(f"segments[{i}]: the event's parameters must be scalars (one "
                                 f"segment, one mechanism), got {event!r}")
        elif len(segment) == 3:
            sigma, q, steps = segment
            check_range(f"segments[{i}] noise_multiplier", sigma, 0.0, low_open=True)
            check_range(f"segments[{i}] sampling_prob", q, 0.0, 1.0)
            event = dpsgd_event(float(sigma), float(q), neighboring)
        else:
            raise ValueError(f"segments[{i}] must be (event, steps) or (noise_multiplier, "
                             f"sampling_prob, steps), got {segment!r}")
        steps = check_count(f"segments[{i}] steps", steps)
        if steps > 0 and _spends(event, ()).item():
            checked.append((event, steps))
    if rtol is not None and checked:
        sigma, q, steps = [], [], []
        for i, (event, count) in enumerate(checked):
            closed_form = _gaussian_poisson(event, ())
            if closed_form is None:
                raise ValueError(f"rtol needs every segment to be a Gaussian event (without "
                                 f"sampling or Poisson-subsampled), segments[{i}] is not; pass "
                                 f"grid=pj.Grid(step=...) instead")
            replace = event.neighboring == Neighboring.REPLACE_ONE
            sigma.append(closed_form[0].item() / (2 if replace else 1))
            q.append(closed_form[1].item())
            steps.append(count)
        shift_sigma, q, steps = (np.array(column, np.float64) for column in (sigma, q, steps))
        spread = _loss_spread(shift_sigma, q)
        # no delta here: a Gaussian-like composed loss read at delta about 1e-5 (z = 4.8)
        sd = np.sqrt(np.sum(steps * spread**2))
        count = np.sum(steps)
        step = accuracy_step(float(rtol), count, sd**2 / 2 + 4.8 * sd, sd / np.sqrt(count), 4.8)
        half_widths = np.concatenate([_half_widths_nats(*event.directions(pessimistic), None)()
                                      for event, _ in checked])
        step = max(float(step), float(np.max(_covering_steps(half_widths))))
        grid = dataclasses.replace(grid or Grid(), step=step)
    for i, (event, steps) in enumerate(checked):
        try:
            parts.append(event.pld(pessimistic=pessimistic, grid=grid).self_compose(steps))
        except CompositionTooWide as error:
            if rtol is None:
                raise
            raise CompositionTooWide(f"{_rtol_remedy(rtol, grid.step)}, for segments[{i}] ({error})"
                                     ) from error
    if not parts:
        return identity(pessimistic=pessimistic)
    return compose(parts) if len(parts) > 1 else parts[0]
