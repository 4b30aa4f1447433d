"""pj.zcdp: a PLD above every rho-zCDP mechanism's curve, as tight as the Rényi conversion."""

import math

import dp_accounting as dpa
import numpy as np
import pytest
from scipy.stats import norm

import pldjax as pj

EPSILONS = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 6.0])


def test_above_the_gaussian_and_randomized_response_of_the_same_rho():
    """Two 1/2-zCDP mechanisms: the Gaussian of sigma 1 (G_1) and R_1 (pure 1-DP is 1/2-zCDP,
    Bun and Steinke 2016, Prop. 1.4); the worst case is above both."""
    pld = pj.zcdp(0.5)
    got = np.asarray(pld.delta(EPSILONS))
    gaussian = norm.cdf(0.5 - EPSILONS) - np.exp(EPSILONS) * norm.cdf(-0.5 - EPSILONS)
    rr = np.maximum(0.0, (1.0 - np.exp(EPSILONS - 1.0)) * math.e / (1.0 + math.e))
    assert np.all(got >= gaussian) and np.all(got >= rr)


def test_as_tight_as_the_renyi_conversion_and_composed_by_adding_rho():
    """One event reads what dp_accounting's RDP accountant reads (the same conversion, at finer
    orders); ten 1/2-zCDP events in the adapter are one 5-zCDP curve, not ten curves composed."""
    rdp = dpa.rdp.RdpAccountant()
    rdp.compose(dpa.ZCDpEvent(0.5))
    assert float(pj.zcdp(0.5).epsilon(1e-6)) == pytest.approx(rdp.get_epsilon(1e-6), rel=1e-3)
    rdp.compose(dpa.ZCDpEvent(0.5), 9)
    acc = pj.dp_accounting.PLDAccountant()
    acc.compose(dpa.ZCDpEvent(0.5), 10)
    assert acc.get_epsilon(1e-6) == pytest.approx(rdp.get_epsilon(1e-6), rel=1e-3)
    acc.compose(dpa.ZCDpEvent(0.0, xi=0.0))  # nothing
    assert acc.get_epsilon(1e-6) == pytest.approx(rdp.get_epsilon(1e-6), rel=1e-3)


@pytest.mark.parametrize(("rho", "xi"), [(0.5, 0.0), (0.01, 0.0), (5.0, 0.3)])
def test_the_curve_follows_the_conversion_at_its_best_order_among_all_4001(rho, xi):
    """The documented orders (1 + 2^-20 to 1 + 2^20, 4,001 of them, geometric), each converted
    here, the smallest taken at every epsilon: the PLD's curve (their convex hull, read between
    its grid points) stays within 1e-3 of it where it is above 1e-15."""
    orders = 1.0 + np.geomspace(2.0**-20, 2.0**20, 4001)[:, None]
    pld = pj.zcdp(rho, xi)
    eps = np.linspace(0.0, float(pld.epsilon(1e-15)), 97)
    conversion = np.exp(np.min((orders - 1) * (xi + rho * orders - eps) - np.log(orders)
                               + (orders - 1) * np.log1p(-1 / orders), axis=0))
    conversion = np.minimum(conversion, 1.0)
    got = np.asarray(pld.delta(eps))
    np.testing.assert_allclose(got, conversion, rtol=1e-3)


def test_xi_shifts_the_renyi_bound_and_bad_parameters_are_named():
    assert float(pj.zcdp(0.5, 0.1).epsilon(1e-6)) > float(pj.zcdp(0.5).epsilon(1e-6))
    with pytest.raises(ValueError, match="rho"):
        pj.zcdp(-1.0)
    with pytest.raises(ValueError, match="xi"):
        pj.zcdp(0.5, float("nan"))
    import warnings

    for rho, xi in ((1e6, 0.0), (0.5, 1e6), (math.inf, 0.0), (1e300, 0.0), (1e308, 1e308)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # refused before any overflow
            with pytest.raises(ValueError, match="rho"):
                pj.zcdp(rho, xi)
    acc = pj.dp_accounting.PLDAccountant()
    acc.compose(dpa.ZCDpEvent(math.inf))
    assert acc.get_epsilon(1e-6) == math.inf


@pytest.mark.parametrize(("rho", "xi"), [(1e-12, 0.0), (0.0, 0.0), (60.0, 0.0),
                                        pytest.param(0.5, 500.0, marks=pytest.mark.slow)])
def test_extreme_parameters_give_finite_sound_values_without_warnings(rho, xi):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pld = pj.zcdp(rho, xi)
        eps = float(pld.epsilon(1e-6))
    # R_xi (pure xi-DP) is (xi, rho)-zCDP and reads xi + log(1 - 1e-6) at delta 1e-6: so must
    # the worst case, unless its whole curve is below 1e-6
    assert math.isfinite(eps) and eps >= 0.0
    assert eps >= xi + math.log1p(-1e-6) or float(pld.delta(0.0)) <= 1e-6


@pytest.mark.parametrize(("rho", "xi"), [(0.0, 0.01), (0.0, 1.0), (0.0, 5.0), (1e-3, 2.0)])
def test_near_pure_dp_the_curve_is_kept_not_sent_to_infinity(rho, xi):
    """(xi, rho)-zCDP near pure DP: the conversion falls faster at eps = 0 than any curve can
    (the lowest point's mass came out negative), and every mass went to +inf (epsilon inf,
    delta 1). (xi, 0)-zCDP implies xi-DP, which the conversion's orders approach; R_xi is a
    (xi, 0)-zCDP mechanism, whose curve the result stays above."""
    pld = pj.zcdp(rho, xi)
    assert float(pld.inf_mass) < 1e-15
    assert float(pld.epsilon(1e-6)) <= xi + 2 * math.sqrt(rho * math.log(1e6)) + rho
    rr = np.maximum(0.0, (1.0 - np.exp(EPSILONS - xi)) * math.exp(xi) / (1.0 + math.exp(xi)))
    assert np.all(np.asarray(pld.delta(EPSILONS)) >= rr)


def test_a_zcdp_total_too_large_is_refused_when_composed_and_changes_nothing():
    acc = pj.dp_accounting.PLDAccountant()
    acc.compose(dpa.ZCDpEvent(0.5), 2)
    before, ledger = acc.get_epsilon(1e-6), acc.ledger
    with pytest.raises(ValueError, match="rho"):
        acc.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.ZCDpEvent(300.0),
                                         dpa.ZCDpEvent(300.0)]))
    assert acc.get_epsilon(1e-6) == before and acc.ledger == ledger
