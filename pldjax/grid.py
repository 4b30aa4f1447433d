"""Grids: how finely and how widely a mechanism's loss is discretized.

By default everything is automatic. A mechanism's step is a power of two a fixed fraction of the
spread of its privacy loss (so that PLDs of different mechanisms sit on commensurate grids and can
be composed exactly), its window is ``size`` points around the loss's bulk, and compositions pick
their own window from tail bounds (see :mod:`pldjax.compose`). A user may pass a :class:`Grid` to
fix the step or the size of a mechanism's grid.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from pldjax.validate import check_count, check_range

#: Mechanism steps lie in [spread / 2^(k+1), spread / 2^k] with k = STEP_FRACTION_LOG2.
STEP_FRACTION_LOG2 = 6
#: Number of grid points of a freshly discretized mechanism.
MECHANISM_SIZE = 2048
#: Bound on the probability mass that truncation may move out of a composition's window.
TAIL_MASS = 1e-18


@dataclasses.dataclass(frozen=True)
class Grid:
    """A user's choice of discretization; every field left as None is chosen automatically.

    Attributes:
      step: grid spacing in nats (> 0). Smaller is tighter and slower.
      size: number of grid points of the discretized mechanism (>= 2).
    """

    step: float | None = None
    size: int | None = None

    def __post_init__(self):
        if self.step is not None:
            check_range("Grid.step", self.step, 0.0, low_open=True)
        if self.size is not None:
            object.__setattr__(self, "size", check_count("Grid.size", self.size, minimum=2))


def resolve(grid: Grid | None, half_width=None) -> Grid:
    """The grid with defaults filled in (the step stays None if automatic).

    With a fixed step and no size, the size is the power of two whose window covers
    ``half_width`` (nats, concrete) on both sides; otherwise it is MECHANISM_SIZE.
    """
    grid = grid or Grid()
    size = grid.size
    if size is None and grid.step is not None and half_width is not None:
        size = max(MECHANISM_SIZE, 1 << int(np.ceil(np.log2(2 * half_width / grid.step + 4))))
    return Grid(step=grid.step, size=size or MECHANISM_SIZE)


def auto_step(spread, half_width, size: int):
    """A power-of-two step (so that grids of different mechanisms are commensurate).

    The largest power of two <= spread / 2^STEP_FRACTION_LOG2 (accuracy), unless the window of
    ``size`` points would then not reach ``half_width`` on both sides of its centre: then the
    smallest power of two that does.
    """
    fine = jnp.floor(jnp.log2(spread)) - STEP_FRACTION_LOG2
    cover = jnp.ceil(jnp.log2(2.0 * half_width / (size - 2)))
    return jnp.ldexp(1.0, jnp.maximum(fine, cover).astype(jnp.int32))


def window_offset(center, step, size: int):
    """Grid index of the first point of a window of ``size`` points centred on ``center``."""
    return jnp.floor(center / step).astype(jnp.int64) - size // 2
