"""Rows in tiles: every row operation, and the masses, Chernoff exponents and summary computed
on rows in tiles, agree with the same computed on each row alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pldjax as pj
from pldjax.core.grid import next_pow2
from pldjax.core.precision import float64
from pldjax.kernels.compose import chernoff_exponents, pmf_summary
from pldjax.kernels.discretize import (
    curve_values,
    estimate_tails,
    grid_points,
    masses_from_tails,
    masses_from_values,
    mechanism_estimate,
    side_tails,
)
from pldjax.kernels.rows import TILE, TiledRows

SMALL_TILE = 8


def _in_tiles(rows: np.ndarray, tiles: int, tile: int) -> np.ndarray:
    """Rows (r, n) as (tiles, tile), noise after a row shorter than a tile and in the tiles
    beyond the rows (padding)."""
    noise = np.random.default_rng(1).normal(size=(tiles, tile))
    count, n = rows.shape
    if n < tile:
        rows = np.concatenate([rows, noise[:count, n:]], axis=1)
    laid = rows.reshape(-1, tile)
    return np.concatenate([laid, noise[laid.shape[0]:]])


def _per_row(layout_values, per_row: int, count: int) -> np.ndarray:
    """A row scalar of the layout (tiles, 1), read on each real row's first tile."""
    return np.asarray(layout_values)[::per_row, 0][:count]


@pytest.mark.parametrize("n", [SMALL_TILE // 2, SMALL_TILE, 2 * SMALL_TILE, 4 * SMALL_TILE])
def test_row_operations_in_tiles_agree_with_each_row_alone(n):
    """Sums, extrema, first and last points, a point at each row's own index, running extrema
    and sums and the shifts along a row, on rows of half a tile (noise after them) and of 1, 2 and 4
    tiles, padding tiles after them (the sums and extrema of rows short of a tile, whose points
    beyond their end hold their last value)."""
    tiles, per_row = 16, max(n // SMALL_TILE, 1)
    count = tiles // per_row - 1
    rows = np.random.default_rng(per_row).normal(size=(count, n))
    fill = np.arange(count, dtype=np.float64) + 100.0
    index = (3 * np.arange(count) + 1) % n

    @jax.jit
    @float64
    def tiled(x, fill_rows, index_rows):
        layout = TiledRows(tiles, jnp.int64(n), jnp.int64(count), SMALL_TILE)
        fill = layout.spread(jnp.pad(fill_rows, (0, tiles - count)))
        at = layout.at(x, layout.spread(jnp.pad(index_rows, (0, tiles - count))))
        held = layout.held(x)
        return (layout.sum(held), layout.max(held), layout.min(held), layout.first(x), at,
                layout.last(x),
                layout.cummin(x), layout.cummax(x), layout.following(x, fill),
                layout.preceding(x, fill), layout.is_first(), layout.is_last(), layout.index(),
                layout.cumsum(x))

    out = tiled(_in_tiles(rows, tiles, SMALL_TILE), fill, index)
    scalars = [_per_row(a, per_row, count) for a in out[:6]]
    beyond = (per_row * SMALL_TILE - n) * rows[:, -1]  # the held points of a short row
    np.testing.assert_allclose(scalars[0], rows.sum(axis=1) + beyond, rtol=1e-14)
    np.testing.assert_array_equal(scalars[1], rows.max(axis=1))
    np.testing.assert_array_equal(scalars[2], rows.min(axis=1))
    np.testing.assert_array_equal(scalars[3], rows[:, 0])
    np.testing.assert_array_equal(scalars[4], rows[np.arange(count), index])
    np.testing.assert_array_equal(scalars[5], rows[:, -1])
    points = [np.asarray(a)[:count * per_row].reshape(count, -1)[:, :n] for a in out[6:]]
    np.testing.assert_array_equal(points[0], np.minimum.accumulate(rows, axis=1))
    np.testing.assert_array_equal(points[1], np.maximum.accumulate(rows, axis=1))
    np.testing.assert_array_equal(points[2], np.column_stack([rows[:, 1:], fill]))
    np.testing.assert_array_equal(points[3], np.column_stack([fill, rows[:, :-1]]))
    first, last = np.zeros((count, n), bool), np.zeros((count, n), bool)
    first[:, 0], last[:, -1] = True, True
    np.testing.assert_array_equal(points[4], first)
    np.testing.assert_array_equal(points[5], last)
    np.testing.assert_array_equal(points[6], np.tile(np.arange(n), (count, 1)))
    np.testing.assert_allclose(points[7], np.cumsum(rows, axis=1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [TILE // 4, pytest.param(TILE, marks=pytest.mark.slow), 4 * TILE,
                               pytest.param(8 * TILE, marks=pytest.mark.slow)])
def test_masses_and_placement_in_tiles_agree_with_each_row_alone(n):
    """DP-SGD's curves (sigma 0.7 to 2, both directions, q = 0.01) on grids of n points: the
    masses, Chernoff exponents and PMF summaries computed in tiles (padding tiles after the
    rows) are those of each row alone, to round-off."""
    sigmas = np.array([0.7, 1.0, 2.0])
    mechanism, params, _ = pj.dpsgd_event(sigmas[:, None], 0.01).directions()
    params = [np.broadcast_to(p, (3, 2)).reshape(-1) for p in (*params, np.array([0.0, 1.0]))]
    count, per_row = params[0].shape[0], max(n // TILE, 1)
    tiles = next_pow2(count * per_row) * 2
    step, offset = 2.0**-9, -n // 2
    z = grid_points(np.float64(offset), step, n)
    values = np.stack([curve_values(*side_tails(mechanism, [p[i] for p in params], z, z >= 0), z)
                       for i in range(count)])
    steps, tail = np.array([1e4, 300.0, 1e4, 300.0, 1e4, 300.0]), 1e-12
    # each row alone, compiled too (XLA flushes subnormal masses to zero, NumPy keeps them)
    masses_alone = jax.jit(float64(lambda v: masses_from_values(v, step, jnp.asarray(z))))
    alone = [masses_alone(values[i]) for i in range(count)]
    exponents_alone = [jax.jit(float64(chernoff_exponents))(alone[i][0], offset, step, steps[i],
                                                             tail) for i in range(count)]
    summary_alone = [jax.jit(float64(pmf_summary))(probs) for probs, _ in alone]

    @jax.jit
    @float64
    def tiled(values, steps):
        layout = TiledRows(tiles, jnp.int64(n), jnp.int64(count))
        h, start = jnp.full((tiles, 1), step), jnp.full((tiles, 1), offset)
        probs, inf_mass = masses_from_values(values, h, (start + layout.position()) * h, layout)
        counts = layout.spread(jnp.pad(steps, (0, tiles - count), constant_values=1.0))
        exponents = chernoff_exponents(probs, start, h, counts, jnp.full((tiles, 1), tail), layout)
        return probs, inf_mass, [e[0] for e in exponents], pmf_summary(probs, layout)

    probs, inf_mass, exponents, summary = tiled(_in_tiles(values, tiles, TILE), steps)
    probs = np.asarray(probs)[:count * per_row].reshape(count, -1)[:, :n]
    np.testing.assert_allclose(probs, np.stack([p for p, _ in alone]), rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(_per_row(inf_mass, per_row, count), [m for _, m in alone],
                               rtol=1e-13)
    for i, got in enumerate(exponents):
        np.testing.assert_allclose(_per_row(got, per_row, count),
                                   [float(e[i][0]) for e in exponents_alone], rtol=1e-9)
    for field, got in zip(summary._fields, summary, strict=True):
        np.testing.assert_allclose(_per_row(got, per_row, count),
                                   [getattr(s, field) for s in summary_alone], rtol=1e-13,
                                   err_msg=field)


@pytest.mark.parametrize("n", [TILE // 4, pytest.param(TILE, marks=pytest.mark.slow), 4 * TILE,
                               pytest.param(8 * TILE, marks=pytest.mark.slow)])
def test_optimistic_masses_in_tiles_agree_with_each_row_alone(n):
    """The optimistic connect-the-dots masses (tangent candidates, those at x = 1 raised, their
    lower hulls from the point at x = 0) of DP-SGD's curves, both directions, on grids of n
    points, computed in tiles (padding tiles after the rows) are those of each row alone, to
    round-off: sigma 0.7 and 2 at q = 0.01, and sigma 1 at q = 1e-6, whose losses under Q sit
    inside the interval holding x = 1 (the candidates at its ends are raised, as they are for
    sigma 0.7)."""
    mechanism, params, _ = pj.dpsgd_event(np.array([[0.7], [2.0], [1.0]]),
                                          np.array([[0.01], [0.01], [1e-6]])).directions()
    params = [np.broadcast_to(p, (3, 2)).reshape(-1) for p in (*params, np.array([0.0, 1.0]))]
    count, per_row = params[0].shape[0], max(n // TILE, 1)
    tiles = next_pow2(count * per_row) * 2
    step, offset = 2.0**-9, -n // 2
    z = grid_points(np.float64(offset), step, n)

    @jax.jit
    @float64
    def row_tails(row_params):  # (6, n + 1): the middle point last
        return estimate_tails(mechanism_estimate(mechanism, row_params), jnp.asarray(z), step,
                              False)

    tails = np.stack([row_tails([p[i] for p in params]) for i in range(count)])
    alone = [jax.jit(float64(lambda t: masses_from_tails(t, jnp.asarray(z), step, False,
                                                         "connect_dots")))(t) for t in tails]
    # each tile: its row's points, then the row's middle point
    laid = np.stack([_in_tiles(tails[:, k, :n], tiles, TILE) for k in range(6)])
    middle = np.random.default_rng(2).normal(size=(6, tiles, 1))
    middle[:, :count * per_row] = np.repeat(tails[:, :, n:], per_row, axis=0).transpose(1, 0, 2)

    @jax.jit
    @float64
    def tiled(at_points):
        layout = TiledRows(tiles, jnp.int64(n), jnp.int64(count))
        h, start = jnp.full((tiles, 1), step), jnp.full((tiles, 1), offset)
        return masses_from_tails(at_points, (start + layout.position()) * h, h, False,
                                 "connect_dots", jnp.zeros((tiles, 1)),
                                 jnp.full((tiles, 1), jnp.inf), layout)

    probs, inf_mass = tiled(np.concatenate([laid, middle], axis=-1))
    probs = np.asarray(probs)[:count * per_row].reshape(count, -1)[:, :n]
    expected = np.stack([p for p, _ in alone])
    assert np.all(expected.sum(axis=1) > 0.5)
    # the hull's values between its vertices may differ in their last bit between the two
    # programs: their second differences are masses of 1e-17 where there are none
    np.testing.assert_allclose(probs, expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(probs.sum(axis=1), expected.sum(axis=1), rtol=1e-14)
    np.testing.assert_array_equal(_per_row(inf_mass, per_row, count), [m for _, m in alone])


@pytest.mark.parametrize("directions", [1, 2])
def test_rows_in_tiles_are_put_direction_by_direction(directions):
    """Rows with their directions innermost (configuration k's direction d at row k D + d), put
    with every configuration's first direction first: row d K + k comes from row k D + d, its
    tiles with it; padding rows stay where they are."""
    per_row, configs, tiles = 2, 3, 16
    rows = directions * configs
    layout = TiledRows(tiles, jnp.int64(per_row * SMALL_TILE), jnp.int64(rows), SMALL_TILE)
    source_rows, source_tiles = (np.asarray(a) for a in layout.by_direction(directions))
    want_rows = np.arange(tiles // per_row)
    want_rows[:rows] = [(i % configs) * directions + i // configs for i in range(rows)]
    np.testing.assert_array_equal(source_rows[:tiles // per_row], want_rows)
    np.testing.assert_array_equal(source_rows[tiles // per_row:], np.arange(tiles // per_row, tiles))
    want_tiles = (want_rows[:, None] * per_row + np.arange(per_row)).reshape(-1)
    np.testing.assert_array_equal(source_tiles, want_tiles)


@pytest.mark.parametrize("n,size", [(TILE // 2, 4 * TILE), (TILE, TILE), (3 * TILE, 4 * TILE),
                                    (3 * TILE, TILE), (3 * TILE, 1000)])
def test_rows_gathered_from_tiles_are_each_row_wrapped_and_turned(n, size):
    """The rows a composition gathers from masses in tiles: each row's points summed modulo the
    window's size and turned to start at its centre, whether the row is shorter than the window
    or wraps around it several times (a row shorter than a tile has noise after it)."""
    from pldjax.kernels.compose import wrap_tiled_rows

    per_row, count = -(-n // TILE), 3
    tiles = per_row * count + 2
    probs = np.random.default_rng(n + size).random((count, n))
    centers = np.array([0, n // 2, n - 1])
    index = np.array([2, 0, 1, 2])
    folds = -(-n // size)
    got = jax.jit(float64(wrap_tiled_rows), static_argnums=(3, 4))(
        jnp.asarray(_in_tiles(probs, tiles, TILE)), jnp.int64(n), jnp.asarray(index), size,
        folds, jnp.asarray(centers[index]))
    for row, k in zip(np.asarray(got), index, strict=True):
        wrapped = np.bincount(np.arange(n) % size, weights=probs[k], minlength=size)
        np.testing.assert_allclose(row, np.roll(wrapped, -(centers[k] % size)), rtol=1e-15)
