"""Grids: how finely and how widely a mechanism's loss is discretized.

By default everything is automatic. A mechanism's step is a power of two a fixed fraction of the
spread of its privacy loss (so that PLDs of different mechanisms sit on commensurate grids and can
be composed exactly), its window is the power-of-two number of points that covers the loss's
bulk, and compositions pick their own window from tail bounds (see :mod:`pldjax.kernels.compose`). A
user may pass a :class:`Grid` to fix the step or the size of a mechanism's grid.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import array_module
from pldjax.core.validation import check_count, check_range

#: LossTails steps lie in [spread / 2^(k+1), spread / 2^k] with k = STEP_FRACTION_LOG2.
STEP_FRACTION_LOG2 = 6
#: Fewest and most grid points of a freshly discretized mechanism (the automatic size is the
#: power of two in between whose window covers the loss at the fine step; under jit, where the
#: parameters cannot be looked at, it is MECHANISM_SIZE and the step widens to cover the loss).
MECHANISM_SIZE = 2048
# Memory guards, the one place they are set: every size a caller can pass or cause (Grid.size,
# compose / self_compose windows and their size=, approx_dp_composition's lattice) is checked
# against one of these before anything is allocated, and refused with a ValueError naming the
# argument. Memory is about 40 bytes per point at the peak of a discretization or an FFT.
#: Most grid points of a discretized mechanism (Grid.size, the automatic size, a privacy curve).
MAX_MECHANISM_SIZE = 2**20
#: Most grid points of a composition's window (compose / self_compose size=, automatic windows,
#: approx_dp_composition's lattice); a pairwise convolution's FFT has at most twice as many.
MAX_SIZE = 2**25
#: Largest automatic step and smallest spread a step is derived from (nats): e^step stays far from
#: overflow, and a loss narrower than MIN_SPREAD (sigma -> inf: near the identity) is put on steps
#: of about MIN_SPREAD / 64 instead of denormal ones (coarser, so pessimistic values rise a little).
MAX_STEP = 2.0**8
MIN_SPREAD = 2.0**-40
#: The optimistic construction works in x = e^z: its window ends below OPTIMISTIC_Z_MAX and spans
#: at most OPTIMISTIC_SPAN nats (so e^z and the hull's cross products stay finite). Its curve is 0
#: beyond the window: a lower bound whatever the mechanism, only less tight for larger losses.
OPTIMISTIC_Z_MAX = 320.0
OPTIMISTIC_SPAN = 640.0
#: The centre of a window is kept within +-CENTER_MAX nats (grid indices stay far from int64
#: overflow); a loss beyond goes to the +inf atom (pessimistic) or nowhere (optimistic).
CENTER_MAX = 2.0**50
#: Bound on the probability mass that truncation may move out of a composition's window.
TAIL_MASS = 1e-18
ROUNDINGS = ("connect_dots", "privacy_buckets")


@dataclasses.dataclass(frozen=True)
class Grid:
    """A user's choice of discretization; every field left as None is chosen automatically.

    Attributes:
      step: grid spacing in nats (> 0). Smaller is tighter and slower.
      size: number of grid points of the discretized mechanism, an integer in
        [2, MAX_MECHANISM_SIZE] (a memory guard).
      rounding: "connect_dots" (default; Doroshenko et al. 2022, Alg. 1 / Alg. 2, the best estimate
        on the grid) or "privacy_buckets" (each loss rounded up to the next grid point, or down
        for an optimistic PLD; looser, offered for comparison).
    """

    step: float | None = None
    size: int | None = None
    rounding: str = "connect_dots"

    def __post_init__(self):
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"Grid.rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.step is not None:
            check_range("Grid.step", self.step, 0.0, low_open=True)
        if self.size is not None:
            object.__setattr__(self, "size", check_size("Grid.size", self.size, minimum=2,
                                                        maximum=MAX_MECHANISM_SIZE))


def check_size(name: str, value, *, minimum: int, maximum: int) -> int:
    """A number of grid points in [minimum, maximum] (a memory guard), else ValueError."""
    value = check_count(name, value, minimum=minimum)
    if value > maximum:
        raise ValueError(f"{name} must be an integer in [{minimum}, {maximum}] (a memory guard), "
                         f"got {value}")
    return value


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (and >= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def half_octave_size(n: int) -> int:
    """The smallest size >= n (and >= 1) of the form 2^k or 3 * 2^k: two sizes an octave, so a
    window rounded up to one has at most 1.5 times its points (at a power of two: up to twice);
    an FFT of 3 * 2^k points costs about the same per point as one of a power of two (XLA's CPU
    FFT factors 3)."""
    power = next_pow2(n)
    return 3 * power // 4 if power >= 4 and n <= 3 * power // 4 else power


def fine_step(spread):
    """The largest power of two <= spread / 2^STEP_FRACTION_LOG2: the step accuracy asks for."""
    xp = array_module(spread)
    spread = xp.clip(spread, MIN_SPREAD, 2.0**STEP_FRACTION_LOG2 * MAX_STEP)
    return xp.ldexp(1.0, (xp.floor(xp.log2(spread)) - STEP_FRACTION_LOG2).astype(xp.int32))


def sizes_for_half_widths(half_widths_in_steps, smallest: int = MECHANISM_SIZE) -> np.ndarray:
    """Numbers of points (powers of two in [smallest, MAX_MECHANISM_SIZE]) of windows reaching
    ``half_widths_in_steps`` grid steps on both sides of their centres (inf or nan: the largest)."""
    points = np.nan_to_num(np.minimum(2 * np.asarray(half_widths_in_steps) + 4,
                                      MAX_MECHANISM_SIZE), nan=MAX_MECHANISM_SIZE)
    sizes = np.exp2(np.ceil(np.log2(np.maximum(np.ceil(points), 1.0))))
    return np.clip(sizes, smallest, MAX_MECHANISM_SIZE).astype(np.int64)


def size_for_half_width(half_width_in_steps: float) -> int:
    """:func:`mechanism_sizes` of one window."""
    return int(sizes_for_half_widths(half_width_in_steps))


def cover_step(half_width, size: int, xp=jnp):
    """The smallest power-of-two step (nats, at most MAX_STEP) on which a window of ``size``
    points reaches ``half_width`` nats on both sides of its centre; ``xp``: jax.numpy (traced
    parameters) or numpy."""
    wanted = xp.clip(2.0 * half_width / (size - 2), 2.0**-1000, MAX_STEP)
    return xp.ldexp(1.0, xp.ceil(xp.log2(wanted)).astype(xp.int32))


def auto_step(spread, half_width, size: int):
    """A power-of-two step (so that grids of different mechanisms are commensurate).

    The largest power of two <= spread / 2^STEP_FRACTION_LOG2 (accuracy), unless the window of
    ``size`` points would then not reach ``half_width`` on both sides of its centre: then the
    smallest power of two that does (:func:`cover_step`).
    Never above MAX_STEP (a wider loss is then not covered: its tails go to the window's ends).
    """
    xp = array_module(spread, half_width)
    return xp.minimum(xp.maximum(fine_step(spread), cover_step(half_width, size, xp)), MAX_STEP)


def optimistic_step_limit(size):
    """The largest power-of-two step (nats) whose window of ``size`` points (an int, a NumPy
    array of them, or a JAX array inside a kernel) spans <= OPTIMISTIC_SPAN."""
    xp = np if isinstance(size, int | np.ndarray | np.integer) else jnp
    exponent = xp.floor(xp.log2(OPTIMISTIC_SPAN / (xp.asarray(size, xp.float64) - 1)))
    return xp.ldexp(1.0, exponent.astype(xp.int32))  # exactly a power of two (XLA's exp2 is not)


def window_offset(center, step, size: int, pessimistic: bool = True):
    """Grid index of the first point of a window of ``size`` points centred on ``center`` (kept
    within +-CENTER_MAX; an optimistic window also ends below OPTIMISTIC_Z_MAX, see above)."""
    xp = array_module(center, step)
    center = xp.clip(xp.nan_to_num(center), -CENTER_MAX, CENTER_MAX)
    if not pessimistic:
        center = xp.minimum(center, OPTIMISTIC_Z_MAX - (size - size // 2) * step)
    return xp.floor(center / step).astype(xp.int64) - size // 2

