"""Conversions: tradeoff curves, Rényi divergences, swap."""

import numpy as np
import pytest
from reference import gaussian_tradeoff, rr_renyi

import pldjax as pj

ALPHAS = np.array([0.0, 1e-6, 1e-3, 0.05, 0.3, 0.7, 0.99, 1.0])


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0])
def test_gaussian_tradeoff_closed_form(mu):
    want = np.array([gaussian_tradeoff(mu, a) for a in ALPHAS])
    lower = pj.gdp(mu).tradeoff(ALPHAS)
    upper = pj.gdp(mu, pessimistic=False).tradeoff(ALPHAS)
    assert np.all(lower <= want + 1e-12) and np.all(want <= upper + 1e-12)
    assert np.all(upper - lower <= 2e-3)


def test_subsampled_tradeoff_is_the_worse_direction():
    pld = pj.gaussian(1.0, sampling_prob=0.1)
    both = pld.tradeoff(ALPHAS)
    each = [d.tradeoff(ALPHAS) for d in pld.directions()]
    np.testing.assert_array_equal(both, np.minimum(*each))


@pytest.mark.parametrize("order", [0.5, 1.0, 2.0, 5.0])
def test_renyi_of_randomized_response(order):
    # dyadic epsilon sits on the grid: the discrete PLD is exact
    got = pj.randomized_response(0.5).renyi(order)
    assert got == pytest.approx(rr_renyi(0.5, order), rel=1e-9)


def test_renyi_of_gaussian_and_the_atom_at_infinity():
    mu, orders = 1.0, np.array([1.0, 2.0, 8.0])
    lower = pj.gdp(mu, pessimistic=False).renyi(orders)
    np.testing.assert_allclose(lower, orders * mu**2 / 2, rtol=1e-3)
    assert np.all(lower <= orders * mu**2 / 2 * (1 + 1e-9))
    # the pessimistic discretization keeps the tail beyond its window as an atom at +inf
    assert np.all(np.isinf(pj.gdp(mu).renyi(orders)))
    assert np.isfinite(pj.gdp(mu).renyi(0.5))
    assert np.isinf(pj.randomized_response(1.0, 1e-6).renyi(2.0))


def test_swap_exchanges_directions_and_twice_is_identity():
    pld = pj.gaussian(0.8, sampling_prob=0.2)
    swapped = pld.swap()
    np.testing.assert_array_equal(swapped.probs, pld.reverse.probs)
    np.testing.assert_array_equal(swapped.reverse.probs, pld.probs)
    twice = swapped.swap()
    np.testing.assert_array_equal(twice.probs, pld.probs)
    np.testing.assert_array_equal(twice.reverse.probs, pld.reverse.probs)
    g = pj.gdp(1.0)
    assert g.swap() is g


def test_bad_orders_and_alphas_are_refused():
    with pytest.raises(ValueError, match="order"):
        pj.gdp(1.0).renyi(0.0)
    with pytest.raises(ValueError, match="alpha"):
        pj.gdp(1.0).tradeoff(1.5)
