"""Mass bookkeeping: where surplus mass is taken from."""

import jax.numpy as jnp
import numpy as np
import pytest

from pldjax.core.mass import take_from_bottom, take_from_top


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
