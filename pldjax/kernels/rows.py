"""Row layouts: what the row kernels (a PMF's masses from its curve, its Chernoff exponents and
summary) need of the row they work on, for one row as a 1-D array (:class:`Row`) or for a batch
of rows laid out in tiles (:class:`TiledRows`).

In tiles, a batch of rows of n points each is an array (tiles, TILE), each row on n / TILE
consecutive tiles, with n data: one compiled program serves every grid size (compiled per size,
the masses and window placement of a sweep were five programs of 1-2 s each on a CPU). Sums,
extrema and running extrema along a row combine each tile's own with those of the row's other
tiles; a row's scalars are held per tile, shape (tiles, 1), so that they broadcast over its
points. Tiles beyond the rows (padding) form rows of their own, which no real row sees.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import array_module, quotient, remainder

#: Points of a tile: a mechanism's curve (or tails) is computed in tiles of this many points, each
#: tile knowing its place in its row's window, so that one compiled program a mechanism serves
#: every grid size (a sweep's mechanisms on five sizes compiled five, 2-2.5 s each).
TILE = grid_lib.MECHANISM_SIZE


class Row:
    """One row: a 1-D array (NumPy or JAX); its scalars are 0-d."""

    def __init__(self, xp, points: int):
        self.xp = xp
        self.points = points  #: n, the row's number of points (an int)

    def index(self):
        """Each point's index in the row (int64)."""
        return self.xp.arange(self.points)

    def position(self):
        """Each point's index in the row (float64)."""
        return self.xp.arange(self.points, dtype=self.xp.float64)

    def row_scalar(self, value):
        """A number as a float64 row scalar."""
        return self.xp.float64(value)

    def over_points(self, scalar):
        """A row scalar (with leading axes) broadcast over the row's points."""
        return self.xp.asarray(scalar)[..., None]

    def sum(self, x):
        return self.xp.sum(x, axis=-1)

    def max(self, x):
        return self.xp.max(x, axis=-1)

    def min(self, x):
        return self.xp.min(x, axis=-1)

    def first(self, x):
        return x[..., 0]

    def last(self, x):
        return x[..., -1]

    def at(self, x, k):
        """Each row's value at its index ``k`` (an integer row scalar, in [0, n))."""
        k = self.xp.asarray(k)[..., None]
        lead = np.broadcast_shapes(x.shape[:-1], k.shape[:-1])
        x, k = self.xp.broadcast_to(x, lead + x.shape[-1:]), self.xp.broadcast_to(k, lead + (1,))
        return self.xp.take_along_axis(x, k, axis=-1)[..., 0]

    def is_first(self):
        return self.index() == 0

    def is_last(self):
        return self.index() == self.points - 1

    def cummin(self, x):
        """Running minimum along the row."""
        if self.xp is np:
            return np.minimum.accumulate(x, axis=-1)
        return jax.lax.cummin(x, x.ndim - 1)

    def cummax(self, x):
        if self.xp is np:
            return np.maximum.accumulate(x, axis=-1)
        return jax.lax.cummax(x, x.ndim - 1)

    def cumsum(self, x):
        """Running sum along the row."""
        if self.xp is np:
            return np.cumsum(x, axis=-1)
        return jax.lax.cumsum(x, x.ndim - 1)

    def held(self, x):
        """x, its points beyond the row's end (in tiles) holding its last value."""
        return x

    def following(self, x, fill):
        """x shifted one point back: each point holds its successor's value, the last ``fill``
        (a row scalar)."""
        return self.xp.concatenate([x[..., 1:], self.xp.asarray(fill)[..., None]], axis=-1)

    def preceding(self, x, fill):
        """x shifted one point on: each point holds its predecessor's value, the first
        ``fill``."""
        return self.xp.concatenate([self.xp.asarray(fill)[..., None], x[..., :-1]], axis=-1)


class TiledRows:
    """Rows in tiles (see the module docstring): arrays (..., tiles, tile); a row's scalars
    (..., tiles, 1), the same on each of its tiles. ``points``: each row's n (data), a multiple
    of ``tile`` or less than one (a row then takes a tile, its first n points); ``rows``: the
    real rows (data), on the first tiles."""

    def __init__(self, tiles: int, points, rows, tile: int = TILE):
        self.tiles = tiles
        self.tile = tile
        self.points = points
        self.rows = rows
        self.per_row = jnp.maximum(quotient(points + tile - 1, tile), 1)
        index = jnp.arange(tiles)
        self.row = quotient(index, self.per_row)  #: each tile's row
        self.place = remainder(index, self.per_row)  #: each tile's place in its row
        #: each row's first tile (a row beyond the tiles: the last tile)
        self.first_tile = jnp.minimum(index * self.per_row, tiles - 1)

    def real(self):
        """(tiles,) whether each row (by its index) is one of the real rows."""
        return jnp.arange(self.tiles) < self.rows

    def by_direction(self, directions: int):
        """The real rows, ``directions`` consecutive ones a configuration, put direction by
        direction (every configuration's first row, then every one's second, ...), padding rows
        where they are: (tiles,) the row that each row comes from (a gather of row values) and
        (tiles,) the tile that each tile comes from (a gather of tiles)."""
        index = jnp.arange(self.tiles)
        configs = jnp.maximum(quotient(self.rows, directions), 1)
        source = jnp.where(index < self.rows,
                           remainder(index, configs) * directions + quotient(index, configs),
                           index)
        return source, source[self.row] * self.per_row + self.place

    def index(self):
        return self.place[:, None] * self.tile + jnp.arange(self.tile)

    def position(self):
        return self.index().astype(jnp.float64)

    def row_scalar(self, value):
        return jnp.full((self.tiles, 1), value, jnp.float64)

    def over_points(self, scalar):
        return scalar

    def per_row_values(self, scalar):
        """(..., tiles) each row's value of a row scalar (..., tiles, 1), by row index."""
        return scalar[..., self.first_tile, 0]

    def spread(self, values):
        """A row scalar (..., tiles, 1) from each row's value (..., tiles), by row index."""
        return values[..., self.row][..., None]

    def _combine(self, tile_values, op):
        """Each tile's (..., tiles) combined with op over its row's tiles, as a row scalar."""
        moved = jnp.moveaxis(tile_values, -1, 0)
        reduce = {"sum": jax.ops.segment_sum, "max": jax.ops.segment_max,
                  "min": jax.ops.segment_min}[op]
        combined = reduce(moved, self.row, num_segments=self.tiles, indices_are_sorted=True)
        return self.spread(jnp.moveaxis(combined, 0, -1))

    def sum(self, x):
        return self._combine(jnp.sum(x, axis=-1), "sum")

    def max(self, x):
        return self._combine(jnp.max(x, axis=-1), "max")

    def min(self, x):
        return self._combine(jnp.min(x, axis=-1), "min")

    def first(self, x):
        return self.spread(x[..., self.first_tile, 0])

    def last(self, x):
        last = jnp.maximum(self.points - 1, 0)
        last_tile = jnp.minimum(self.first_tile + quotient(last, self.tile), self.tiles - 1)
        return self.spread(x[..., last_tile, remainder(last, self.tile)])

    def at(self, x, k):
        tile = jnp.minimum(self.row[:, None] * self.per_row + quotient(k, self.tile),
                           self.tiles - 1)
        flat = tile * self.tile + remainder(k, self.tile)
        lead = np.broadcast_shapes(x.shape[:-2], flat.shape[:-2])
        x = jnp.broadcast_to(x, lead + x.shape[-2:]).reshape(lead + (-1,))
        flat = jnp.broadcast_to(flat, lead + flat.shape[-2:])[..., 0]
        return jnp.take_along_axis(x, flat, axis=-1)[..., None]

    def is_first(self):
        return (self.place[:, None] == 0) & (jnp.arange(self.tile) == 0)

    def is_last(self):
        return self.index() == self.points - 1

    def _scan_tiles(self, values, op):
        """Inclusive running op over each row's tiles of per-tile values (..., tiles)
        (Hillis-Steele: log2(tiles) shifted steps, each within the row)."""
        shift = 1
        while shift < self.tiles:
            before = jnp.concatenate([values[..., :shift], values[..., :-shift]], axis=-1)
            values = jnp.where(self.place >= shift, op(values, before), values)
            shift *= 2
        return values

    def _running(self, x, within, op):
        inside = within(x, x.ndim - 1)
        through = self._scan_tiles(inside[..., -1], op)  # up to each tile's end
        before = jnp.concatenate([through[..., :1], through[..., :-1]], axis=-1)
        return jnp.where(self.place[:, None] > 0, op(inside, before[..., None]), inside)

    def cummin(self, x):
        return self._running(x, jax.lax.cummin, jnp.minimum)

    def cummax(self, x):
        return self._running(x, jax.lax.cummax, jnp.maximum)

    def cumsum(self, x):
        return self._running(x, jax.lax.cumsum, jnp.add)

    def held(self, x):
        return jnp.where(self.index() < self.points, x, self.last(x))

    def following(self, x, fill):
        nxt = jnp.concatenate([x[..., 1:, :1], x[..., -1:, :1]], axis=-2)  # next tile's first
        beyond = self.index() >= self.points - 1  # the last point, and a short row's after it
        return jnp.where(beyond, fill, jnp.concatenate([x[..., 1:], nxt], axis=-1))

    def preceding(self, x, fill):
        prev = jnp.concatenate([x[..., :1, -1:], x[..., :-1, -1:]], axis=-2)  # last of previous
        edge = jnp.where(self.place[:, None] == 0, fill, prev)
        return jnp.concatenate([edge, x[..., :-1]], axis=-1)


def row_of(x) -> Row:
    """The :class:`Row` of a 1-D array (or of arrays with leading axes, the row last)."""
    return Row(array_module(x), x.shape[-1])
