"""pldjax.core.precision: exact 64-bit packing and directed roundings used by filters and states."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
from compiled_programs import compiled_programs

from pldjax.core.precision import pack, quotient_rounded, root_of_difference_down, square_up, unpack


def test_pack_round_trips_float64_and_int64_bit_for_bit_with_x64_off(x64_off):
    with jax.enable_x64(True):
        values = (jnp.asarray([0.1, -0.0, np.inf, np.nan, 5e-324, 1.7976931348623157e308]),
                  jnp.asarray([2**62 + 1, -1], jnp.int64), jnp.asarray(True))
        packed = pack(values)
    assert packed[0].dtype == packed[1].dtype == np.uint32 and packed[0].shape == (6, 2)
    back = jax.jit(lambda x: x)(packed)  # a caller's jit with x64 off leaves uint32 alone
    with jax.enable_x64(True):
        out = unpack(back, values)
        np.testing.assert_array_equal(np.asarray(out[0]).view(np.uint64),
                                      np.asarray(values[0]).view(np.uint64))
        assert np.asarray(out[1]).tolist() == [2**62 + 1, -1] and bool(out[2])


def test_root_of_difference_is_rounded_down_by_mpmath():
    mp.mp.dps = 50
    rng = np.random.default_rng(0)
    mu = np.exp(rng.uniform(np.log(1e-3), np.log(1e6), 2000))
    nu = mu * rng.uniform(0, 1, 2000) ** rng.choice([1, 8, 64], 2000)
    with jax.enable_x64(True):
        got = np.asarray(root_of_difference_down(jnp.asarray(mu), jnp.asarray(nu)))
    for g, m, n in zip(got, mu, nu, strict=True):
        exact = mp.sqrt(mp.mpf(float(m)) ** 2 - mp.mpf(float(n)) ** 2)
        assert mp.mpf(float(g)) <= exact and g >= float(exact) * (1 - 1e-15)


def test_root_of_difference_keeps_a_free_budget_and_tiny_ones():
    """nu = 0 gives mu itself (a filter's free query lowered mu 2 ulps a spend); a budget below
    1e-154, whose square underflows, is kept (1e-300 read 0) and still rounded down."""
    mp.mp.dps = 50
    mu = np.array([1.0, 0.3, 1e-300, 1e-300, 3e-160, 5e-324, 1e300])
    nu = np.array([0.0, 0.0, 0.0, 5e-301, 1e-160, 0.0, 9e299])
    for xp in (np, jnp):
        with jax.enable_x64(True):
            got = np.asarray(root_of_difference_down(xp.asarray(mu), xp.asarray(nu)))
        assert got[[0, 1, 2, 5]].tolist() == mu[[0, 1, 2, 5]].tolist()
        for g, m, n in zip(got[[3, 4, 6]], mu[[3, 4, 6]], nu[[3, 4, 6]], strict=True):
            exact = mp.sqrt(mp.mpf(float(m)) ** 2 - mp.mpf(float(n)) ** 2)
            assert mp.mpf(float(g)) <= exact and g >= float(exact) * (1 - 1e-15)


def test_concrete_leaves_pack_on_the_host_as_the_traced_bitcast_does():
    """Concrete states are packed and unpacked with NumPy (no compiled program per operation, and
    the caller's first call compiles nothing for them), to the same bits as the traced
    bitcast; host=True leaves the unpacked values as NumPy arrays."""
    floats = np.array([[0.1, -0.0, np.inf, -np.inf, np.nan, 5e-324],
                       [-2.2250738585072014e-308, 1.7976931348623157e308, 1.0, -1.5, 1e-300, 3.0]])
    floats[1, 5] = np.frombuffer(np.uint64(0x7FF8_0000_DEAD_BEEF).tobytes(), np.float64)[0]  # payload
    ints = np.array([2**63 - 1, -(2**63), -1, 0, 2**62 + 1], np.int64)
    values = (floats, ints, np.float64(0.25), np.bool_(True), np.float32(0.5))
    with jax.enable_x64(True):
        packed, names = compiled_programs(lambda: pack(values))
        traced = jax.jit(pack)(values)
        assert all(isinstance(leaf, jax.Array) for leaf in packed)
        for got, want in zip(packed, traced, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        (on_device, on_host), more = compiled_programs(
            lambda: (unpack(packed, values), unpack(packed, values, host=True)))
    assert names == [] and more == []
    assert all(isinstance(leaf, jax.Array) for leaf in on_device)
    assert all(isinstance(leaf, np.ndarray) for leaf in on_host)
    for leaves in (on_device, on_host):
        np.testing.assert_array_equal(np.asarray(leaves[0]).view(np.uint64), floats.view(np.uint64))
        np.testing.assert_array_equal(np.asarray(leaves[1]), ints)
        assert np.asarray(leaves[2]) == 0.25 and np.asarray(leaves[2]).dtype == np.float64
        assert bool(leaves[3]) and np.asarray(leaves[4]).dtype == np.float32


def test_quotients_are_rounded_the_asked_way_by_exact_fractions():
    """a / b up and down, NumPy and compiled, over 40 orders of magnitude each way and at the
    edges (exact quotients, underflow to 0, overflow to inf, 0 / b): each bound on its side of
    the exact quotient, exact ones unmoved, the others within an ulp of it."""
    rng = np.random.default_rng(0)
    a = np.concatenate([10 ** rng.uniform(-20, 20, 500), [1.0, 3.0, 1.0, 1e-200, 1e200, 0.0]])
    b = np.concatenate([10 ** rng.uniform(-20, 20, 500), [2.0, 0.3, 0.25, 1e200, 1e-200, 3.0]])
    exact = [Fraction(x) / Fraction(y) for x, y in zip(a, b, strict=True)]
    for xp in (np, jnp):
        with jax.enable_x64(True):
            up, down = (np.asarray(quotient_rounded(xp.asarray(a), xp.asarray(b), up=u))
                        for u in (True, False))
        for truth, u, d in zip(exact, up, down, strict=True):
            if np.isfinite(u):
                assert Fraction(u) >= truth
            assert Fraction(d) <= truth
            if truth == Fraction(d):
                assert u == d
            elif Fraction(np.finfo(np.float64).tiny) <= truth < Fraction(np.finfo(np.float64).max):
                # normal: the two adjacent floats
                assert np.nextafter(d, np.inf) == u


def test_tiny_squares_and_quotients_stay_on_their_side_of_the_exact_value():
    """Where a product is near the bottom of the normal range, Dekker's error term is subnormal
    (rounded in NumPy, flushed to 0 by XLA) and cannot tell the side: squares of 1e-154 to
    1e-133 and quotients of 1e-292 to 1e-265, NumPy and compiled, still on their side."""
    rng = np.random.default_rng(1)
    x = 10 ** rng.uniform(-154, -133, 4000)
    a, b = 10 ** rng.uniform(-292, -265, 4000), 10 ** rng.uniform(-5, 5, 4000)
    with jax.enable_x64(True):
        for run in (lambda f, *args: f(*args), lambda f, *args: jax.jit(f)(*args)):
            squares = np.asarray(run(square_up, x))
            up = np.asarray(run(lambda a, b: quotient_rounded(a, b, True), a, b))
            down = np.asarray(run(lambda a, b: quotient_rounded(a, b, False), a, b))
            assert all(Fraction(s) >= Fraction(v) ** 2 for s, v in zip(squares, x, strict=True))
            for u, d, p, q in zip(up, down, a, b, strict=True):
                assert Fraction(d) <= Fraction(p) / Fraction(q) <= Fraction(u)
