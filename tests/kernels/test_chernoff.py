"""pldjax.kernels.chernoff: the Chernoff (moment) bound on a composition's epsilon and delta, against the
same bound written in closed form for the Gaussian (log E[e^{lambda L}] = lambda (lambda + 1)
mu^2 / 2, minimised over lambda in mpmath) and against the exact Gaussian curve."""

import math

import mpmath as mp
import pytest
from reference import gaussian_delta, gaussian_epsilon

import pldjax as pj
from pldjax.kernels import chernoff


def closed_form_epsilon(mu: float, count: int, delta: float) -> float:
    """min over lambda of (log c_lambda + count lambda (lambda + 1) mu^2 / 2 - log delta) / lambda."""
    def bound(lam):
        lam = mp.mpf(lam)
        log_c = -mp.log1p(lam) - lam * mp.log1p(1 / lam)
        return (log_c + count * lam * (lam + 1) * mp.mpf(mu) ** 2 / 2 - mp.log(delta)) / lam

    guess = math.sqrt(2 * math.log(1 / delta) / count) / mu
    return float(bound(mp.findroot(lambda x: mp.diff(bound, x), guess)))


@pytest.mark.parametrize(("mu", "count", "delta"), [(0.5, 100, 1e-18), (1.0, 4, 1e-12)])
def test_gaussian_matches_the_closed_form_and_bounds_the_truth(mu, count, delta):
    pld = pj.gdp(mu)
    eps = chernoff.epsilon([(pld, count)], delta)
    total = mu * math.sqrt(count)
    assert eps >= gaussian_epsilon(total, delta)  # an upper bound on the truth
    assert eps == pytest.approx(closed_form_epsilon(mu, count, delta), rel=2e-3)
    assert chernoff.delta([(pld, count)], eps) <= delta * (1 + 1e-9)
    assert chernoff.delta([(pld, count)], eps) >= gaussian_delta(total, eps)
    # parts add up: two halves are the whole
    assert chernoff.epsilon([(pld, count // 2), (pld, count - count // 2)], delta) == pytest.approx(eps)


def test_atoms_at_infinity_and_edges():
    rr = pj.randomized_response(1.0, 1e-6)
    assert chernoff.epsilon([(rr, 10)], 9e-6) == math.inf  # 10 atoms of 1e-6 pass 9e-6
    assert chernoff.epsilon([(rr, 10)], 1e-4) < math.inf
    assert chernoff.delta([(rr, 10)], math.inf) == pytest.approx(1e-5)
    assert chernoff.epsilon([(pj.gdp(1.0), 0)], 1e-9) == 0.0
    assert chernoff.epsilon([(pj.gdp(1.0), 3)], 1.0) == 0.0
    for bad, name in [(([(pj.gdp(1.0), 1)], 1.5), "delta"), (([(pj.gdp(1.0), -1)], 0.1), "count"),
                      (([(pj.gdp(1.0, pessimistic=False), 1)], 0.1), "pessimistic")]:
        with pytest.raises(ValueError, match=name):
            chernoff.epsilon(*bad)
