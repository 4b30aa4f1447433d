"""Mass bookkeeping: where surplus mass is taken from."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from pldjax.core import mass
from pldjax.core.mass import exact_sum, take_from_bottom, take_from_top


def _taken_from_bottom(probs, amount):
    """The definition over the whole array: each bin gives what the amount still asks of it
    after the bins below gave theirs."""
    below = np.cumsum(probs) - probs
    return probs - np.minimum(np.maximum(amount - below, 0.0), probs)


@pytest.mark.parametrize("amount", [0.0, 1e-300, 3e-13, 1e-6, 0.3, 1.0, 5.0])
@pytest.mark.parametrize("empty_bottom", [0, 5_000, 98_000])
def test_mass_taken_on_the_host_is_the_whole_arrays_definition_bit_for_bit(amount, empty_bottom):
    rng = np.random.default_rng(empty_bottom)
    probs = rng.exponential(size=98_304) * (rng.random(98_304) < 0.7)
    probs[:empty_bottom] = 0.0
    probs /= probs.sum()
    np.testing.assert_array_equal(take_from_bottom(probs, amount, np),
                                  _taken_from_bottom(probs, amount))
    np.testing.assert_array_equal(take_from_top(probs, amount, np),
                                  _taken_from_bottom(probs[::-1], amount)[::-1])
    # compiled: its running sums add in another order (within n ulps of a total mass of 1)
    np.testing.assert_allclose(take_from_bottom(jnp.asarray(probs), amount),
                               _taken_from_bottom(probs, amount), rtol=0.0,
                               atol=probs.size * np.finfo(np.float64).eps)
    np.testing.assert_allclose(take_from_top(jnp.asarray(probs), amount),
                               _taken_from_bottom(probs[::-1], amount)[::-1], rtol=0.0,
                               atol=probs.size * np.finfo(np.float64).eps)


@pytest.mark.parametrize("size", [1_000, 128 * 128])
def test_mass_taken_in_a_kernel_is_the_definition_by_blocks_or_not(size):
    """A row of a multiple of the block takes mass block by block, any other bin by bin: both
    give the definition's bins (to round-off) at amounts inside, between and beyond blocks,
    from the bottom and from the top."""
    rng = np.random.default_rng(size)
    probs = rng.exponential(size=size)
    probs[rng.random(size) < 0.2] = 0.0
    probs /= probs.sum()
    for amount in [0.0, probs[0], np.sum(probs[:128]), np.sum(probs[:300]) * 0.999, 1.0, 2.0]:
        np.testing.assert_allclose(take_from_bottom(jnp.asarray(probs), amount),
                                   _taken_from_bottom(probs, amount), rtol=0.0,
                                   atol=size * np.finfo(np.float64).eps)
        np.testing.assert_allclose(take_from_top(jnp.asarray(probs[::-1]), amount),
                                   _taken_from_bottom(probs, amount)[::-1], rtol=0.0,
                                   atol=size * np.finfo(np.float64).eps)


def _spread_values(rng, size, signed):
    """Values across float64's whole range of exponents, subnormals and zeros among them."""
    values = rng.random(size) * np.ldexp(1.0, rng.integers(-1074, 1000, size))
    values[rng.random(size) < 0.05] = 0.0
    return values * np.where(rng.random(size) < 0.5, -1.0, 1.0) if signed else values


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("size", [0, 1, 7, 5_000, 300_000])
def test_exact_sum_is_fsums_correctly_rounded_sum(size, signed):
    rng = np.random.default_rng(size)
    for values in (_spread_values(rng, size, signed), rng.random(size) ** 12,
                   np.full(size, 5e-324), 1.0 + rng.random(size) * 1e-16):
        assert exact_sum(values) == math.fsum(values)


def test_exact_sum_keeps_what_cancels_and_adds_across_its_chunks(monkeypatch):
    """Terms that cancel leave the tiny ones exactly; chunks (made small here) whose lowest
    exponents differ add on the lowest."""
    cancelling = np.array([1e300, 3e-320, -1e300, 1.0, 2.0**-60, -1.0, 7e-310])
    assert exact_sum(cancelling) == math.fsum(cancelling) == 3e-320 + 2.0**-60 + 7e-310
    monkeypatch.setattr(mass, "_EXACT_CHUNK", 3)
    rng = np.random.default_rng(3)
    for values in (cancelling, _spread_values(rng, 1000, True), rng.random(1000)):
        assert exact_sum(values) == math.fsum(values)
        assert exact_sum(values[::-1]) == math.fsum(values)


def test_exact_sum_of_non_finite_values_is_fsums():
    assert exact_sum(np.array([1.0, np.inf])) == np.inf
    with pytest.raises(ValueError):
        exact_sum(np.array([np.inf, -np.inf]))
    assert math.isnan(exact_sum(np.array([1.0, np.nan])))
