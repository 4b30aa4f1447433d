"""Tradeoff curves, Rényi divergences and swap, against closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import gaussian_tradeoff, rr_renyi

import pldjax as pj

ALPHAS = np.array([0.0, 1e-6, 1e-3, 0.05, 0.3, 0.7, 0.99, 1.0])


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0, 10.0])
def test_gaussian_tradeoff_closed_form(mu):
    want = np.array([gaussian_tradeoff(mu, a) for a in ALPHAS])
    lower = pj.gdp(mu).tradeoff(ALPHAS)
    upper = pj.gdp(mu, pessimistic=False).tradeoff(ALPHAS)
    assert np.all(lower <= want + 1e-12) and np.all(want <= upper + 1e-12)
    assert np.all(upper - lower <= 2e-3)


def test_optimistic_tradeoff_keeps_beta_of_zero():
    # gdp(10)'s window cuts off the other distribution's mass below its bottom (0.3%): the
    # optimistic tradeoff must still be an upper bound there (beta(0) = 1), not that mass short
    alphas = np.array([0.0, 1e-300, 1e-40, 1e-20])
    want = np.array([gaussian_tradeoff(10.0, a) for a in alphas])
    assert np.all(pj.gdp(10.0, pessimistic=False).tradeoff(alphas) >= want - 1e-12)
    assert np.all(pj.gdp(10.0).tradeoff(alphas) <= want + 1e-12)


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


@pytest.mark.slow
def test_gdp_mu():
    assert float(pj.gdp_mu(pj.gdp(1.0), delta_slack=1e-15)) == pytest.approx(1.0, rel=2e-4)
    assert float(pj.gdp_mu(pj.gdp(1.0), delta_slack=1e-15)) >= 1.0
    assert float(pj.gdp_mu(pj.gdp(2.0).self_compose(4), delta_slack=1e-15)) == pytest.approx(
        4.0, rel=2e-4)
    # randomized response R_1: delta(0) = tanh(1/2) = 2 Phi(mu/2) - 1 decides
    from scipy.stats import norm

    want = 2 * norm.ppf((1 + np.tanh(0.5)) / 2)
    got = float(pj.gdp_mu(pj.randomized_response(1.0)))
    assert want * (1 - 1e-9) <= got <= want * (1 + 1e-6)  # ROUNDOFF may shave 1e-13
    assert np.isinf(pj.gdp_mu(pj.approx_dp_composition(0.5, 1e-6, 1)))  # an atom at +inf, no slack
    batch = pj.gdp_mu(pj.gdp(np.array([0.5, 2.0])), delta_slack=1e-15)
    np.testing.assert_allclose(batch, [0.5, 2.0], rtol=2e-4)


def test_exact_composition_of_approximate_dp_guarantees():
    """Cor. 4.7 fast path against the mpmath evaluation and against FFT composition on a grid."""
    from reference import rr_kfold_delta

    fast = pj.approx_dp_composition(0.3, 1e-6, 40)
    ts = np.array([0.0, 1.0, 2.5, 4.0, 8.0])
    want = np.array([rr_kfold_delta(0.3, 1e-6, 40, t) for t in ts])
    np.testing.assert_allclose(fast.delta(ts), want, rtol=1e-9, atol=1e-15)
    assert float(fast.total_mass()) == pytest.approx(1.0, abs=1e-12)
    # the FFT composition on the grid agrees, plus its (pessimistic) round-off allowance
    slow = pj.randomized_response(0.25, 1e-6).self_compose(40).delta(ts)
    exact = pj.approx_dp_composition(0.25, 1e-6, 40).delta(ts)
    assert np.all(slow >= exact * (1 - 1e-12)) and np.all(slow <= exact * (1 + 1e-7))


def test_profile_and_tradeoff_conversions_round_trip():
    """Prop. 9: the profile and the tradeoff curve determine each other (G_mu closed forms)."""
    from reference import gaussian_delta

    mu = 1.0
    eps = np.linspace(-6.0, 8.0, 1401)
    deltas = np.array([gaussian_delta(mu, e) if e >= 0 else
                       -np.expm1(e) + np.exp(e) * gaussian_delta(mu, -e) for e in eps])
    alphas = np.array([1e-4, 0.01, 0.1, 0.5, 0.9])
    beta = pj.tradeoff_from_profile(eps, deltas, alphas)
    want = np.array([gaussian_tradeoff(mu, a) for a in alphas])
    assert np.all(beta <= want + 1e-12) and np.all(beta >= want - 2e-3)
    grid_alphas = np.linspace(0.0, 1.0, 2001)
    grid_betas = np.array([gaussian_tradeoff(mu, a) for a in grid_alphas])
    back = pj.profile_from_tradeoff(grid_alphas, grid_betas, [0.0, 1.0, 2.0])
    want = np.array([gaussian_delta(mu, e) for e in (0.0, 1.0, 2.0)])
    # points on the exact (convex) curve: their chords lie above it, so this profile is a lower
    # bound; an upper bound needs points whose interpolation stays below the curve
    assert np.all(back <= want + 1e-12)
    np.testing.assert_allclose(back, want, rtol=5e-3, atol=1e-6)


def test_profile_and_tradeoff_conversions_refuse_impossible_points_and_never_read_nan():
    # beta = 0 at alpha = 1 (every tradeoff curve's end) times e^eps beyond 709: inf * 0 was NaN
    assert pj.profile_from_tradeoff([0.0, 0.5, 1.0], [1.0, 0.3, 0.0], [710.0]).tolist() == [0.0]
    with pytest.raises(ValueError, match="deltas must be at least 1 - e"):
        pj.tradeoff_from_profile([-1.0], [0.0], [0.0])  # read beta = e > 1
    with pytest.raises(ValueError, match="epsilons must hold at least one point"):
        pj.tradeoff_from_profile([], [], [0.1])
    with pytest.raises(ValueError, match="alphas must hold at least one point"):
        pj.profile_from_tradeoff([], [], [0.1])
    with pytest.raises(ValueError, match="deltas must hold one value per point"):
        pj.tradeoff_from_profile([0.1, 0.2], [0.1, 0.2, 0.3], [0.1])
    with pytest.raises(ValueError, match="betas must hold one value per point"):
        pj.profile_from_tradeoff([0.1, 0.2], [0.1, 0.2, 0.3], [0.1])
    # under jit an invalid value claims nothing: delta 1, beta 0
    read = jax.jit(pj.profile_from_tradeoff)(jnp.array([0.0, 1.0]), jnp.array([1.0, 0.0]),
                                             jnp.array([np.nan, 1.0]))
    assert np.asarray(read).tolist() == [1.0, 0.0]
    read = jax.jit(pj.tradeoff_from_profile)(jnp.array([1.0]), jnp.array([0.1]),
                                             jnp.array([np.nan, 0.2]))
    assert float(read[0]) == 0.0 and float(read[1]) == pytest.approx(np.exp(-1.0) * 0.7)


def test_log_mgf_of_gaussian_and_randomized_response():
    ts = np.array([-0.5, 0.0, 1.0, 3.0])
    # L ~ N(mu^2/2, mu^2) under P: log E[e^{tL}] = t mu^2/2 + t^2 mu^2/2
    mu = 1.0
    got = pj.gdp(mu, pessimistic=False).log_mgf(ts)
    np.testing.assert_allclose(got, ts * mu**2 / 2 + ts**2 * mu**2 / 2, rtol=2e-3, atol=1e-9)
    rr = pj.randomized_response(0.5)
    p = np.exp(0.5) / (1 + np.exp(0.5))
    want = np.log(p * np.exp(0.5 * ts) + (1 - p) * np.exp(-0.5 * ts))
    np.testing.assert_allclose(rr.log_mgf(ts), want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rr.renyi(3.0), rr.log_mgf(2.0) / 2, rtol=1e-12)


def test_renyi_is_never_negative_or_nan_at_extreme_orders():
    # gdp(1).renyi(1e-300) was -8.9e-16, gdp(1.7e-155).renyi(1e300) was -inf
    assert float(pj.gdp(1.0).renyi(1e-300)) >= 0.0
    assert float(pj.gdp(1.7e-155).renyi(1e300)) >= 1e300 * 1.7e-155**2 / 2  # an upper bound
    values = np.asarray(pj.randomized_response(0.5).renyi(np.array([1e-300, 0.5, 1.0, 2.0,
                                                                      1e300])))
    assert not np.any(np.isnan(values)) and np.all(values >= 0)


@pytest.mark.parametrize("mu", [1.0, 3.0, 10.0, 30.0])
def test_optimistic_renyi_and_log_mgf_are_lower_bounds_below_order_one(mu):
    # the optimistic window cuts Q's mass below it (gdp(10): 0.26%); counted as Q-only mass it
    # made D_a for a < 1 exceed the truth a mu^2 / 2 (gdp(10).renyi(1e-300) was 0.0026)
    orders = np.array([1e-300, 1e-3, 0.1, 0.5, 0.9, 1.0, 2.0, 8.0])
    truth = orders * mu**2 / 2
    lower = np.asarray(pj.gdp(mu, pessimistic=False).renyi(orders))
    assert np.all(lower <= truth * (1 + 1e-9) + 1e-300)
    assert np.all(lower >= 0) and np.all(np.isfinite(lower))
    upper = np.asarray(pj.gdp(mu).renyi(orders[orders < 1]))  # pessimistic: atom at +inf above 1
    assert np.all(upper >= truth[orders < 1] * (1 - 1e-9) - 1e-15)
    if mu <= 3.0:  # the window holds Q's bulk: tight (orders up to 2: high orders weigh the tail)
        np.testing.assert_allclose(lower[1:7], truth[1:7], rtol=2e-3)
    # log E_P[e^{tL}] = t mu^2 / 2 + t^2 mu^2 / 2: an optimistic PLD bounds it from above for
    # t in (-1, 0) (D_a = log_mgf(a - 1) / (a - 1) from below)
    ts = np.array([-0.999, -0.5, -0.1])
    mgf = np.asarray(pj.gdp(mu, pessimistic=False).log_mgf(ts))
    assert np.all(mgf >= (ts + ts**2) * mu**2 / 2 - 1e-12)



@pytest.mark.parametrize("mu", [1.0, 3.1622776601683795])
def test_renyi_divergences_near_order_one_bracket_the_truth(mu):
    """D_a of G_mu is a mu^2 / 2 at every order. Within 1e-6 of order 1 the round-off of the
    masses' sum (1e-16), divided by a - 1, had swamped D_a: gdp(sqrt 10)'s optimistic D at
    a = 1 + 2e-13 read 5.0022 (truth 5), its pessimistic one at 1 - 1e-12 4.9997."""
    orders = 1.0 + np.array([-1e-6, -1e-9, -1e-12, 2.03e-13, 1e-12, 1e-9, 1e-6])
    truth = orders * mu**2 / 2
    lower = np.asarray(pj.gdp(mu, pessimistic=False).renyi(orders))
    assert np.all(lower <= truth)
    np.testing.assert_allclose(lower, truth, rtol=1e-3)
    below = orders < 1.0  # above order 1 the pessimistic atom at +inf makes D_a infinite
    upper = np.asarray(pj.gdp(mu).renyi(orders[below]))
    assert np.all(upper >= truth[below])
    np.testing.assert_allclose(upper, truth[below], rtol=1e-3)


@pytest.mark.parametrize("eps", [1.0, 30.0, 740.0, 1e5])
def test_tradeoff_from_tails_brackets_randomized_response_at_extreme_errors(eps):
    """R_eps's beta(alpha) = max(0, 1 - e^eps alpha, e^-eps (1 - alpha)) (exact in mpmath). At
    eps = 1e5 the tails hold the mass e^-eps as 0 and at 740 as a subnormal float; the bracket
    still holds the truth, and is trivial only at the smallest alphas (0 among them)."""
    import mpmath

    from pldjax.kernels.divergences import SMALLEST_ALPHA, tradeoff_from_tails
    from pldjax.mechanisms.neighboring import Neighboring
    from pldjax.mechanisms.noise import RandomizedResponse

    mechanism, params = RandomizedResponse(eps).pair(Neighboring.ADD_REMOVE, True)
    alphas = np.array([0.0, 1e-322, 1e-300, 1e-40, 1e-6, 0.3, 0.5, 1.0])
    lower, upper = tradeoff_from_tails(mechanism, tuple(np.reshape(p, 1) for p in params), alphas)
    mpmath.mp.dps = 60
    e = mpmath.mpf(eps)
    truth = [float(max(0, 1 - mpmath.exp(e) * mpmath.mpf(a), mpmath.exp(-e) * (1 - mpmath.mpf(a))))
             for a in alphas]
    assert np.all(lower <= truth) and np.all(truth <= upper)
    resolved = alphas >= SMALLEST_ALPHA
    assert np.all(upper[resolved] - lower[resolved] <= 3e-12)
    np.testing.assert_array_equal(lower[~resolved], 0.0)
