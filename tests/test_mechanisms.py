import numpy as np
import pytest
from reference import gaussian_delta, laplace_delta

import pldjax as pj

EPS = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 3.0, 4.5])


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.0, 10.0])
def test_gaussian_single_brackets_closed_form(sigma):
    exact = np.array([gaussian_delta(1 / sigma, e) for e in EPS])
    upper = pj.gaussian(sigma).delta(EPS)
    lower = pj.gaussian(sigma, pessimistic=False).delta(EPS)
    assert np.all(upper >= exact * (1 - 1e-12) - 1e-15)
    assert np.all(lower <= exact * (1 + 1e-12) + 1e-15)
    assert np.all(upper - lower <= 1e-2 * exact + 1e-14)


def test_gdp_is_gaussian_with_unit_sensitivity():
    a, b = pj.gdp(0.5), pj.gaussian(2.0)
    np.testing.assert_array_equal(np.asarray(a.probs), np.asarray(b.probs))
    assert pj.gaussian(2.0, sensitivity=3.0).delta(1.0) == pytest.approx(
        pj.gdp(1.5).delta(1.0), rel=1e-12
    )


def test_gdp_zero_is_identity():
    p = pj.gdp(0.0)
    assert p.delta(0.0) == pytest.approx(0.0, abs=1e-15)
    assert p.epsilon(0.0) == 0.0


@pytest.mark.parametrize("scale", [0.5, 1.0, 4.0])
def test_laplace_closed_form(scale):
    eps0 = 1 / scale
    eps = np.array([0.0, eps0 / 3, eps0 / 2, 0.9 * eps0, eps0, 2 * eps0])
    exact = np.array([laplace_delta(eps0, e) for e in eps])
    upper = pj.laplace(scale).delta(eps)
    lower = pj.laplace(scale, pessimistic=False).delta(eps)
    assert np.all(upper >= exact - 1e-14)
    assert np.all(lower <= exact + 1e-14)
    # the optimistic estimate is loosest next to the atom at eps0
    assert np.all(lower >= 0.8 * exact - 1e-12)
    assert np.all(upper <= exact * (1 + 1e-3) + 1e-12)


def test_randomized_response_exact_on_dyadic_epsilon():
    p = pj.randomized_response(1.0, 1e-6)
    losses, probs = np.asarray(p.losses), np.asarray(p.probs)
    big = probs > 1e-12
    np.testing.assert_allclose(losses[big], [-1.0, 1.0])
    e = np.e
    np.testing.assert_allclose(
        probs[big], [(1 - 1e-6) / (1 + e), (1 - 1e-6) * e / (1 + e)], rtol=1e-12
    )
    assert float(p.inf_mass) == pytest.approx(1e-6, rel=1e-9)


@pytest.mark.parametrize("factory", [
    lambda pe: pj.gaussian(0.7, pessimistic=pe),
    lambda pe: pj.laplace(1.3, pessimistic=pe),
    lambda pe: pj.randomized_response(0.3, 1e-4, pessimistic=pe),
])
@pytest.mark.parametrize("pessimistic", [True, False])
def test_mass_is_one(factory, pessimistic):
    p = factory(pessimistic)
    assert float(p.total_mass()) == pytest.approx(1.0, abs=1e-14)
    assert np.all(np.asarray(p.probs) >= 0)


def test_batch_matches_individual_calls():
    sigmas = np.array([0.8, 1.0, 2.0])
    batch = pj.gaussian(sigma=sigmas)
    assert batch.batch_shape == (3,)
    for i, s in enumerate(sigmas):
        single = pj.gaussian(float(s))
        np.testing.assert_allclose(np.asarray(batch[i].probs), np.asarray(single.probs), atol=1e-17)
        assert float(batch[i].step) == float(single.step)


def test_user_grid():
    p = pj.gaussian(1.0, grid=pj.Grid(step=2.0**-5, size=512))
    assert p.size == 512 and float(p.step) == 2.0**-5
    assert p.delta(1.0) >= gaussian_delta(1.0, 1.0) - 1e-15
