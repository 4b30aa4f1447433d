"""DP-SGD accounting: epsilon or delta of T steps of the Poisson-subsampled Gaussian mechanism.

For one configuration or for many at once. Configurations are sorted by the grid they need and
processed in fixed-size chunks: per chunk, one vmapped call discretizes both directions, one
places every composition's window (Chernoff), and one fused call composes (an FFT power per
configuration) and evaluates. Chunks keep memory bounded and shapes repeat, so a sweep compiles a
handful of kernels, whatever its length. When several devices are visible the configuration axis
of each chunk is sharded over a one-dimensional device mesh (``jax.sharding``).

Every value is pessimistic (an upper bound on the true epsilon or delta) unless
``pessimistic=False`` is passed, which gives the optimistic lower bound.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pldjax import grid as grid_lib
from pldjax.compose import (
    _checked_size,
    chernoff_exponents,
    compose,
    deviation_weights,
    self_compose_kernel,
    tail_window,
    window_widths,
)
from pldjax.grid import Grid
from pldjax.mechanisms import gaussian, identity
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.profile import delta_kernel, epsilon_kernel
from pldjax.validate import check_count, check_range, is_traced

#: Configurations discretized together (per device when sharded), and the most grid points
#: (rows x size) one composition call handles: together they bound the memory in use.
CHUNK = 32
COMPOSE_ELEMENTS = 2**23


@functools.partial(jax.jit, static_argnames=("size", "pessimistic", "evaluate"))
def _compose_and_evaluate(probs, inf_mass, offset, step, count, target, exponents, weights, *,
                          size, pessimistic, evaluate):
    kernel = epsilon_kernel if evaluate == "epsilon" else delta_kernel

    def one(p, m, o, h, c, t, e):
        cp, cm, co = self_compose_kernel(
            p, m, o, h, c, weights, e, size=size, tail=grid_lib.TAIL_MASS, pessimistic=pessimistic
        )
        return kernel(cp, cm, co, h, t[None])[0]

    return jax.vmap(one)(probs, inf_mass, offset, step, count, target, exponents)


@jax.jit
def window_placement(probs, offset, step, count):
    """Each row's count-fold composition: its Chernoff tail window (lo, hi) (grid indices) and
    the exponents it came from (which the composition reuses for its tail bounds), in one call."""
    def one(p, o, h, c):
        exponents = chernoff_exponents(p, o, h, c)
        lo, hi = tail_window(p, o, h, c, grid_lib.TAIL_MASS, exponents)
        return lo, hi, exponents

    return jax.vmap(one)(probs, offset, step, count)


def _sharding() -> NamedSharding | None:
    devices = jax.devices()
    if len(devices) == 1:
        return None
    return NamedSharding(Mesh(np.asarray(devices), ("configs",)), PartitionSpec("configs"))


def _place(arrays, sharding):
    if sharding is None:
        return arrays
    return [jax.device_put(a, sharding) for a in arrays]


def _account_chunk(sigma, q, steps, target, *, neighboring, pessimistic, grid, evaluate, sharding):
    """Values for one chunk of configurations (all steps >= 1).

    Both directions of every configuration are discretized in one call, their windows placed in
    one call; then rows are grouped by the composition size they need (a power of two) and each
    group is composed and evaluated in calls of at most COMPOSE_ELEMENTS grid points in all.
    """
    devices = 1 if sharding is None else len(jax.devices())
    # the glue between the compiled calls runs in NumPy on one device (each eager jnp operation
    # would be one more small program to compile, or to load from the cache, per process)
    xp = np if sharding is None else jnp
    sigma, q, steps, target = _place(
        [np.asarray(a, np.float64) for a in (sigma, q, steps, target)], sharding
    )
    pld = gaussian(
        sigma, sampling_prob=q, neighboring=neighboring, pessimistic=pessimistic, grid=grid
    )
    directions = pld.directions()
    probs, inf_mass, offset, step = (
        xp.concatenate([xp.asarray(getattr(p, name)) for p in directions])
        for name in ("probs", "inf_mass", "offset", "step")
    )
    counts = xp.concatenate([steps] * len(directions))
    targets = xp.concatenate([target] * len(directions))
    lo, hi, exponents = window_placement(probs, offset, step, counts)
    exponents = [xp.asarray(e) for e in exponents]
    sizes = np.array([grid_lib.next_pow2(int(w))
                      for w in window_widths(probs, offset, counts, lo, hi, "steps")])
    values = np.zeros(sizes.shape[0])
    for size in np.unique(sizes):
        rows = np.nonzero(sizes == size)[0]
        per_call = max(devices, COMPOSE_ELEMENTS // int(size) // devices * devices)
        for begin in range(0, rows.size, per_call):
            part = rows[begin:begin + per_call]
            batch = min(per_call, -(-grid_lib.next_pow2(part.size) // devices) * devices)
            padded = xp.asarray(np.concatenate([part, np.full(batch - part.size, part[-1])]))
            arrays = _place(
                [a[padded] for a in (probs, inf_mass, offset, step, counts, targets, *exponents)],
                sharding,
            )
            size = _checked_size(int(size), "dpsgd accounting", "steps")
            got = _compose_and_evaluate(
                *arrays[:6], tuple(arrays[6:]), deviation_weights(size), size=size,
                pessimistic=pessimistic, evaluate=evaluate,
            )
            values[part] = np.asarray(got)[: part.size]
    return np.max(values.reshape(len(directions), -1), axis=0)


def _mechanism_points(sigma, q):
    """Rough relative grid size a configuration needs (used to sort configurations into chunks)."""
    mu = 1.0 / sigma
    spread = np.minimum(q * np.sqrt(np.expm1(np.minimum(mu**2, 700.0))), mu)
    top = np.logaddexp(np.log1p(-np.minimum(q, 1 - 1e-16)), np.log(q) + mu**2 / 2 + 10 * mu)
    return top / spread


def _progress(total: int, enabled: bool) -> Callable[[int], None]:
    def report(done: int) -> None:
        if enabled:
            bar = "#" * (30 * done // total)
            print(f"\r[{bar:<30}] {done}/{total} configurations", end="", file=sys.stderr)
            if done == total:
                print(file=sys.stderr)

    return report


def _account(noise_multiplier, sampling_prob, steps, target, target_name, *, neighboring,
             pessimistic, grid, evaluate, progress):
    values = (noise_multiplier, sampling_prob, steps, target)
    if is_traced(values):
        raise ValueError(
            f"dpsgd_{evaluate} picks its grids from the values and cannot run under jit; inside "
            "jit, build the PLD with pj.gaussian(..., grid=pj.Grid(size=...)) and self_compose(size=...)"
        )
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    check_range("steps", steps, 0.0)
    if target_name == "delta":
        check_range("delta", target, 0.0, 1.0)
    else:
        check_range("epsilon", target, 0.0, allow_inf=True)
    steps_arr = np.asarray(steps, np.float64)
    if np.any(steps_arr != np.floor(steps_arr)):
        raise ValueError(f"steps must be whole numbers >= 0, got {steps!r}")
    arrays = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in values))
    shape = arrays[0].shape
    sigma, q, steps_arr, target = (a.reshape(-1) for a in arrays)
    out = np.zeros(sigma.shape[0])  # zero steps: epsilon 0 and delta 0
    active = np.nonzero((steps_arr > 0) & (q > 0))[0]
    order = active[np.lexsort((steps_arr[active], _mechanism_points(sigma[active], q[active])))]
    sharding = _sharding()
    chunk = CHUNK * (1 if sharding is None else len(jax.devices()))
    chunk = min(chunk, max(len(order), 1))
    if sharding is not None:
        chunk = -(-chunk // len(jax.devices())) * len(jax.devices())
    report = _progress(len(order), progress)
    for begin in range(0, len(order), chunk):
        idx = order[begin:begin + chunk]
        padded = np.concatenate([idx, np.full(chunk - len(idx), idx[-1])])
        got = _account_chunk(
            sigma[padded], q[padded], steps_arr[padded], target[padded],
            neighboring=neighboring, pessimistic=pessimistic, grid=grid, evaluate=evaluate,
            sharding=sharding,
        )
        out[idx] = got[: len(idx)]
        report(begin + len(idx))
    # never NaN: should a configuration still produce one, report the trivial sound bound
    # (epsilon inf or delta 1 pessimistic, 0 optimistic) rather than a number that is none
    out = np.where(np.isnan(out), (np.inf if evaluate == "epsilon" else 1.0) if pessimistic else 0.0,
                   out)
    return out.reshape(shape) if shape else float(out[0])


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
):
    """Smallest epsilon such that ``steps`` DP-SGD steps are (epsilon, delta)-DP.

    Each step is the Gaussian mechanism with noise multiplier ``noise_multiplier`` (noise standard
    deviation / clipping norm) on a Poisson sample of rate ``sampling_prob``. All four arguments
    broadcast; the result has their broadcast shape (a float for scalars). Pessimistic: an upper
    bound on the true epsilon (both adjacency directions, the worse reported).

    Args:
      noise_multiplier: > 0.
      sampling_prob: in [0, 1] (0: nothing is learned, epsilon 0).
      steps: whole number of steps >= 0.
      delta: in [0, 1].
      neighboring: "add_remove" (default) or "replace_one".
      pessimistic: False for the optimistic (lower-bound) estimate.
      grid: optional mechanism :class:`Grid` (a finer step is tighter and slower).
      progress: print a progress bar to stderr.
    """
    return _account(noise_multiplier, sampling_prob, steps, delta, "delta", neighboring=neighboring,
                    pessimistic=pessimistic, grid=grid, evaluate="epsilon", progress=progress)


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
):
    """Smallest delta such that ``steps`` DP-SGD steps are (epsilon, delta)-DP (``epsilon`` >= 0).

    Same conventions as :func:`dpsgd_epsilon`; pessimistic (an upper bound) by default.
    """
    return _account(noise_multiplier, sampling_prob, steps, epsilon, "epsilon",
                    neighboring=neighboring, pessimistic=pessimistic, grid=grid, evaluate="delta",
                    progress=progress)


@float64
def compose_schedule(
    segments: Sequence[tuple[float, float, int]],
    *,
    neighboring: str = "add_remove",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The PLD of a DP-SGD run whose noise or batch size changes: segments (sigma, q, steps).

    Each segment is ``steps`` runs of the Poisson-subsampled Gaussian (noise multiplier sigma,
    sampling probability q) composed in one FFT power; the segments are then composed by FFT
    convolution (:func:`pldjax.compose.compose`, which aligns their grids on the safe side: exactly
    onto the finest step when the automatic power-of-two steps allow it within grid.MAX_SIZE,
    otherwise onto the coarsest, pessimistically or optimistically as the PLDs are). Both
    adjacency directions are kept. Returns a
    :class:`~pldjax.pld.PLD`: read ``.epsilon(delta)`` or ``.delta(epsilon)`` from it.
    """
    segments = list(segments)
    if not segments:
        raise ValueError("segments must hold at least one (noise_multiplier, sampling_prob, steps)")
    parts = []
    for i, segment in enumerate(segments):
        if len(segment) != 3:
            raise ValueError(
                f"segments[{i}] must be (noise_multiplier, sampling_prob, steps), got {segment!r}"
            )
        sigma, q, steps = segment
        check_range(f"segments[{i}] noise_multiplier", sigma, 0.0, low_open=True)
        check_range(f"segments[{i}] sampling_prob", q, 0.0, 1.0)
        steps = check_count(f"segments[{i}] steps", steps)
        if steps > 0 and q > 0:
            pld = gaussian(
                sigma, sampling_prob=q, neighboring=neighboring, pessimistic=pessimistic, grid=grid
            )
            parts.append(pld.self_compose(steps))
    if not parts:
        return identity(pessimistic=pessimistic)
    return compose(parts) if len(parts) > 1 else parts[0]
