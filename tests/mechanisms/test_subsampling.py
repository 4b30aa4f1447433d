"""Subsampled mechanisms: exact single-step profiles (both directions), peers, adjacency relations."""

import dataclasses
import logging

import jax
import mpmath
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pldlib
from dp_accounting.privacy_accountant import NeighboringRelation
from reference import (
    gaussian_delta,
    gaussian_epsilon,
    laplace_delta,
    replace_one_gaussian_curve_mp,
    replace_one_gaussian_epsilon,
    subsampled_add_delta,
    subsampled_gaussian_curve_mp,
    subsampled_remove_delta,
)

import pldjax as pj
from pldjax.core.compilation import array_module
from pldjax.core.precision import float64
from pldjax.kernels.discretize import mechanism_curve, mechanism_estimate

EPS = np.array([0.0, 0.01, 0.05, 0.2, 0.5, 1.0, 2.0])


def _check_profile(pld_up, pld_lo, want, rel):
    up, lo = np.asarray(pld_up.delta(EPS)), np.asarray(pld_lo.delta(EPS))
    assert np.all(up >= want * (1 - 1e-9) - 1e-15)
    assert np.all(lo <= want * (1 + 1e-9) + 1e-15)
    # next to the end of the loss's support (the add direction stops at -log(1-q)) the chord
    # from the last grid point falls to zero over one step: tiny in absolute terms only
    assert np.all(up <= want * (1 + rel) + 1e-8)
    big = want > 1e-6
    assert np.all(up[big] <= want[big] * (1 + rel))


@pytest.mark.parametrize("sigma,q", [(1.0, 0.01), (0.6, 0.1), (2.0, 0.5), (1.0, 0.999)])
def test_subsampled_gaussian_profiles_both_directions(sigma, q):
    """Thm 5.1 (remove) and its mirror (add) against mpmath, one direction at a time."""
    base = lambda e: gaussian_delta(1 / sigma, e)  # noqa: E731
    up = pj.gaussian(sigma, sampling_prob=q)
    lo = pj.gaussian(sigma, sampling_prob=q, pessimistic=False)
    assert not up.symmetric
    for i, reference in enumerate([subsampled_remove_delta, subsampled_add_delta]):
        want = np.array([reference(base, q, e) for e in EPS])
        # 2e-3: the add direction's curve ends steeply at -log(1 - q), a few steps from eps
        _check_profile(up.directions()[i], lo.directions()[i], want, rel=2e-3)
    # the pair as a whole reports the worse direction
    np.testing.assert_array_equal(
        up.delta(EPS), np.maximum(up.directions()[0].delta(EPS), up.directions()[1].delta(EPS))
    )


@pytest.mark.parametrize("scale,q", [(1.0, 0.05), (0.5, 0.3)])
def test_subsampled_laplace_profiles_both_directions(scale, q):
    base = lambda e: laplace_delta(1 / scale, e)  # noqa: E731
    up = pj.laplace(scale, sampling_prob=q)
    lo = pj.laplace(scale, sampling_prob=q, pessimistic=False)
    for i, reference in enumerate([subsampled_remove_delta, subsampled_add_delta]):
        want = np.array([reference(base, q, e) for e in EPS])
        # the optimistic estimate is loose next to the Laplace atoms; only the upper side is tight
        _check_profile(up.directions()[i], lo.directions()[i], want, rel=2e-3)


def _dp_accounting_epsilon(factory, count, delta, pessimistic):
    logging.disable(logging.WARNING)  # its optimistic estimate warns that it uses privacy buckets
    try:
        pld = factory(value_discretization_interval=1e-4, pessimistic_estimate=pessimistic)
        return pld.self_compose(count).get_epsilon_for_delta(delta)
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize("sigma,q,count", [(1.0, 0.01, 1000),
                                           pytest.param(0.8, 0.05, 100, marks=pytest.mark.slow),
                                           (2.0, 0.002, 3000)])
def test_subsampled_gaussian_against_dp_accounting(sigma, q, count):
    factory = lambda **kw: pldlib.from_gaussian_mechanism(sigma, sampling_prob=q, **kw)  # noqa: E731
    ours = pj.gaussian(sigma, sampling_prob=q).self_compose(count).epsilon(1e-5)
    theirs_up = _dp_accounting_epsilon(factory, count, 1e-5, True)
    theirs_lo = _dp_accounting_epsilon(factory, count, 1e-5, False)
    assert theirs_lo <= ours <= theirs_up * 1.001
    # dpsgd's windows leave delta / 2^20 outside (charged to delta), self_compose's 1e-18
    assert pj.dpsgd_epsilon(sigma, q, count, 1e-5) == pytest.approx(ours, rel=1e-6)


def test_subsampled_laplace_against_dp_accounting():
    scale, q, count = 2.0, 0.05, 100
    factory = lambda **kw: pldlib.from_laplace_mechanism(scale, sampling_prob=q, **kw)  # noqa: E731
    ours = pj.laplace(scale, sampling_prob=q).self_compose(count).epsilon(1e-5)
    theirs_up = _dp_accounting_epsilon(factory, count, 1e-5, True)
    theirs_lo = _dp_accounting_epsilon(factory, count, 1e-5, False)
    assert theirs_lo <= ours <= theirs_up * 1.001


@pytest.mark.slow
def test_replace_one_against_dp_accounting_and_never_tighter_than_add_remove():
    sigma, q, count = 1.5, 0.02, 500
    relation = NeighboringRelation.REPLACE_ONE
    factory = lambda **kw: pldlib.from_gaussian_mechanism(  # noqa: E731
        sigma, sampling_prob=q, neighboring_relation=relation, **kw
    )
    replace = pj.gaussian(sigma, sampling_prob=q, neighboring="replace_one")
    assert replace.symmetric
    ours = replace.self_compose(count).epsilon(1e-5)
    assert _dp_accounting_epsilon(factory, count, 1e-5, False) <= ours
    assert ours <= _dp_accounting_epsilon(factory, count, 1e-5, True) * 1.001
    add_remove_lower = pj.gaussian(sigma, sampling_prob=q, pessimistic=False).self_compose(count)
    assert ours >= add_remove_lower.epsilon(1e-5)
    single = pj.gaussian(sigma, sampling_prob=q, neighboring="replace_one", pessimistic=False)
    assert np.all(single.delta(EPS) >= pj.gaussian(sigma, sampling_prob=q).delta(EPS) - 1e-12)


#: Noise scales of the replace-one window checks, where the window once left the loss's top out.
REPLACE_ONE_SIGMAS = np.array([0.05, 0.08, 0.1, 0.12, 0.15, 0.16, 0.2, 0.25, 0.5, 1.0, 2.0])


# q = 1 repeats the next test's sampled PLDs (with the slow tests)
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, pytest.param(1.0, marks=pytest.mark.slow)])
def test_replace_one_window_holds_the_loss_at_every_sampling_probability(q):
    # the window reaches the loss at output -(mu + 10) for every q: at q = 1 the loss is linear
    # and reaches 2 mu^2 + 20 mu, four times the mu^2/2 + 10 mu of log(1 - q + q e^(mu^2/2 + 10 mu))
    # alone, and the top left out went to the +inf atom (epsilon = inf at sigma 0.15, 0.25, ...)
    exact = np.array([replace_one_gaussian_epsilon(1 / s, q, 1e-5) for s in REPLACE_ONE_SIGMAS])
    upper = np.array([pj.gaussian(s, sampling_prob=q, neighboring="replace_one").epsilon(1e-5)
                      for s in REPLACE_ONE_SIGMAS])
    assert np.all(upper >= exact * (1 - 1e-9)) and np.all(upper <= exact * (1 + 1e-3)), (upper, exact)


def test_replace_one_at_sampling_probability_one_is_the_gaussian_of_twice_the_sensitivity():
    # replace-one moves the query by 2 sensitivities: at q = 1 the mechanism is G_{2 / sigma}
    exact = np.array([gaussian_epsilon(2 / s, 1e-5) for s in REPLACE_ONE_SIGMAS])
    sampled = np.array([pj.gaussian(s, sampling_prob=1.0, neighboring="replace_one").epsilon(1e-5)
                        for s in REPLACE_ONE_SIGMAS])
    unsampled = pj.gaussian(REPLACE_ONE_SIGMAS, neighboring="replace_one").epsilon(1e-5)
    for upper in (sampled, unsampled):
        assert np.all(upper >= exact * (1 - 1e-9)) and np.all(upper <= exact * (1 + 1e-3)), upper


@pytest.mark.parametrize("neighboring", ["add_remove", "replace_one"])
def test_everyone_sampled_is_the_mechanism_itself(neighboring):
    # at q = 1 every record takes part: the PLD is the Gaussian's, whose window reaches any loss
    # (the subsampled kernel's stops at BASE_REACH_MAX = 1e4 nats: sigma = 0.005 read inf)
    shift = 2.0 if neighboring == "replace_one" else 1.0
    for sigma in (0.005, 1.0):
        sampled = float(pj.gaussian(sigma, sampling_prob=1.0, neighboring=neighboring).epsilon(1e-5))
        alone = float(pj.gaussian(sigma, neighboring=neighboring).epsilon(1e-5))
        assert sampled == alone
        exact = gaussian_epsilon(shift / sigma, 1e-5)
        assert exact * (1 - 1e-9) <= sampled <= exact * (1 + 1e-3)
    batch = pj.gaussian(0.5, sampling_prob=np.ones(3), neighboring=neighboring)
    assert batch.batch_shape == (3,)
    optimistic = pj.gaussian(0.005, sampling_prob=1.0, neighboring=neighboring, pessimistic=False)
    assert float(optimistic.epsilon(1e-5)) <= gaussian_epsilon(shift / 0.005, 1e-5)


@pytest.mark.parametrize("sigma,q,grid", [(0.3, 0.02, None), (0.5, 0.05, pj.Grid(step=1 / 16))])
def test_optimistic_estimate_on_a_step_coarser_than_the_sampling_probability(sigma, q, grid):
    # Q's losses sit inside the grid interval below 0: the tangent from its left end fell to 0
    # at x = 1, and with it the whole optimistic curve (epsilon read 0 against 11.92 and 5.52)
    lower = float(pj.gaussian(sigma, sampling_prob=q, grid=grid, pessimistic=False).epsilon(1e-5))
    upper = float(pj.gaussian(sigma, sampling_prob=q, grid=grid).epsilon(1e-5))
    base = lambda e: gaussian_delta(1 / sigma, e)  # noqa: E731
    true_delta = max(subsampled_remove_delta(base, q, lower), subsampled_add_delta(base, q, lower))
    assert true_delta >= 1e-5 * (1 - 1e-9)  # still a lower bound on epsilon
    assert 0.99 * upper <= lower <= upper


@pytest.mark.parametrize("sigma,q", [(0.3, 1e-4), (0.3, 1e-3),
                                     pytest.param(0.5, 1e-6, marks=pytest.mark.slow)])
def test_optimistic_estimate_where_most_of_the_loss_lies_within_a_step_of_zero(sigma, q):
    # all but a sampled record's rare large losses lie within about q of 0, inside one step:
    # connect-the-dots had to put delta(0) = 0, and so 0 at every eps (epsilon read 0 at any
    # delta, against 28.5 for the pessimistic bound at sigma 0.3, q 1e-3, 1,000 steps, 1e-8)
    # (the add direction's losses all lie below -log(1 - q), within the step: its delta(0) is 0
    # on this grid, the remove direction's carries the pair's)
    lower = pj.gaussian(sigma, sampling_prob=q, pessimistic=False)
    total_variation = q * (2.0 * float(mpmath.ncdf(1 / (2 * sigma))) - 1.0)  # delta(0), exact
    assert 0.25 * total_variation <= float(lower.delta(0.0)) <= total_variation * (1 + 1e-9)
    low, high = float(lower.epsilon(1e-7)), float(pj.gaussian(sigma, sampling_prob=q).epsilon(1e-7))
    base = lambda e: gaussian_delta(1 / sigma, e)  # noqa: E731
    true_delta = max(subsampled_remove_delta(base, q, low), subsampled_add_delta(base, q, low))
    assert true_delta >= 1e-7 * (1 - 1e-9)  # still a lower bound on epsilon
    assert 0.5 * high <= low <= high
    composed = [float(pj.dpsgd_epsilon(sigma, q, 1_000, 1e-8, pessimistic=p)) for p in (False, True)]
    assert 0.5 * composed[1] <= composed[0] <= composed[1]


def test_replace_one_without_subsampling_doubles_the_shift():
    a = pj.gaussian(2.0, neighboring="replace_one")
    np.testing.assert_allclose(a.delta(EPS), pj.gdp(1.0).delta(EPS), rtol=1e-12, atol=1e-16)


def test_fixed_batch_sampling():
    fixed = pj.gaussian(1.0, sampling_prob=0.05, neighboring="replace_one", sampling="fixed_batch")
    assert not fixed.symmetric
    base = lambda e: gaussian_delta(2.0, e)  # noqa: E731
    want = np.array([subsampled_remove_delta(base, 0.05, e) for e in EPS])
    up = np.asarray(fixed.directions()[0].delta(EPS))
    assert np.all(up >= want - 1e-15) and np.all(up <= want * 1.001 + 1e-13)
    with pytest.raises(ValueError, match="replace_one"):
        pj.gaussian(1.0, sampling_prob=0.05, sampling="fixed_batch")
    with pytest.raises(ValueError, match="Gaussian only"):
        pj.laplace(1.0, sampling_prob=0.05, neighboring="replace_one")


def test_sampling_prob_zero_is_free_and_bad_values_are_refused():
    assert pj.gaussian(1.0, sampling_prob=0.0).epsilon(1e-5) == 0.0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="sampling_prob"):
            pj.gaussian(1.0, sampling_prob=bad)
    with pytest.raises(ValueError, match="neighboring"):
        pj.gaussian(1.0, sampling_prob=0.1, neighboring="swap")


@pytest.mark.parametrize("make", [
    pytest.param(lambda g, p: pj.gaussian(1.0, sampling_prob=0.05, grid=g, pessimistic=p),
                 id="subsampled_gaussian"),
    pytest.param(lambda g, p: pj.laplace(1.0, grid=g, pessimistic=p), id="laplace",
                 marks=pytest.mark.slow)])
def test_connect_the_dots_never_worse_than_privacy_buckets_on_the_same_grid(make):
    grid_cd = pj.Grid(step=2.0**-10)
    grid_pb = pj.Grid(step=2.0**-10, rounding="privacy_buckets")
    cd_up, pb_up = make(grid_cd, True).self_compose(50), make(grid_pb, True).self_compose(50)
    cd_lo, pb_lo = make(grid_cd, False).self_compose(50), make(grid_pb, False).self_compose(50)
    eps = np.linspace(0.0, 3.0, 13)
    assert np.all(cd_up.delta(eps) <= pb_up.delta(eps) * (1 + 1e-9) + 1e-15)
    assert np.all(cd_lo.delta(eps) >= pb_lo.delta(eps) * (1 - 1e-9) - 1e-15)
    assert cd_up.epsilon(1e-6) <= pb_up.epsilon(1e-6)


def test_from_privacy_curve_reproduces_a_pld_on_the_grid():
    """Connect-the-dots is exact for a PLD already supported on the grid."""
    pld = pj.randomized_response(0.5, 1e-4).self_compose(6)
    losses = np.asarray(pld.losses)

    def curve(e):  # symmetric PLD: delta(-t) = 1 - e^-t + e^-t delta(t)
        d = np.asarray(pld.delta(np.abs(e)))
        return np.where(e < 0, -np.expm1(e) + np.exp(e) * d, d)

    again = pj.from_privacy_curve(curve, epsilon_min=losses[0], epsilon_max=losses[-1],
                                  step=float(pld.step))
    # exact up to round-off: masses are second differences of delta values over expm1(step)
    np.testing.assert_allclose(np.asarray(again.probs), np.asarray(pld.probs), rtol=1e-9, atol=1e-12)
    assert float(again.inf_mass) == pytest.approx(float(pld.inf_mass), rel=1e-9)


def test_from_privacy_curve_gaussian_both_directions_and_checks():
    mu = 1.0
    curve = lambda e: np.array([gaussian_delta(mu, x) if x >= 0 else  # noqa: E731
                                -np.expm1(x) + np.exp(x) * gaussian_delta(mu, -x) for x in e])
    pld = pj.from_privacy_curve(curve, epsilon_min=-6.0, epsilon_max=6.0, step=2.0**-6,
                                reverse=curve)
    assert not pld.symmetric
    eps = np.array([0.0, 0.5, 1.0, 2.0])
    want = np.array([gaussian_delta(mu, e) for e in eps])
    got = np.asarray(pld.delta(eps))
    assert np.all(got >= want - 1e-15) and np.all(got <= want * 1.01 + 1e-12)
    with pytest.raises(ValueError, match="privacy curve"):
        pj.from_privacy_curve(lambda e: np.clip(0.5 + 0.1 * e, 0, 1), epsilon_min=0.0,
                              epsilon_max=1.0, step=0.1)
    with pytest.raises(ValueError, match="convex"):  # linear in e^eps, one value 1e-6 low
        pj.from_privacy_curve(lambda e: (1 - np.exp(e - 1)) / 2 - 1e-6 * np.isclose(e, 0.5),
                              epsilon_min=0.0, epsilon_max=1.0, step=0.1)
    with pytest.raises(ValueError, match="step"):  # e^step overflows (accepted with warnings)
        pj.from_privacy_curve(curve, epsilon_min=0.0, epsilon_max=1e300, step=1e300)


def test_from_privacy_curve_takes_an_exact_curve_at_fine_steps():
    """The exact Gaussian curve (SciPy) from eps = -10 at step 1e-3: the convexity check was
    tighter than the values' round-off where they are close to 1 (slopes off by 1e-8)."""
    from scipy.stats import norm

    def curve(eps):
        return norm.cdf(0.5 - eps) - np.exp(eps) * norm.cdf(-0.5 - eps)

    pld = pj.from_privacy_curve(curve, epsilon_min=-10.0, epsilon_max=10.0, step=1e-3)
    eps = np.array([0.0, 0.5, 1.0, 2.0])
    want = np.array([gaussian_delta(1.0, e) for e in eps])
    got = np.asarray(pld.delta(eps))
    assert np.all(got >= want - 1e-15) and np.all(got <= want * 1.001 + 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.5])
@pytest.mark.parametrize("q", [0.001, 0.01, 0.05])
@pytest.mark.parametrize("count", [100, 10_000])
def test_dpsgd_against_dp_accounting_grid(sigma, q, count):
    """Across (sigma, q, T): between dp-accounting's optimistic and pessimistic (1e-4) + 0.1%."""
    factory = lambda **kw: pldlib.from_gaussian_mechanism(sigma, sampling_prob=q, **kw)  # noqa: E731
    ours = pj.dpsgd_epsilon(sigma, q, count, 1e-5)
    ours_lower = pj.dpsgd_epsilon(sigma, q, count, 1e-5, pessimistic=False)
    theirs_up = _dp_accounting_epsilon(factory, count, 1e-5, True)
    theirs_lo = _dp_accounting_epsilon(factory, count, 1e-5, False)
    assert theirs_lo <= ours <= theirs_up * 1.001 + 1e-9
    assert ours_lower <= theirs_up + 1e-9


@pytest.mark.parametrize("neighboring", ["add_remove", "replace_one"])
def test_tiny_sampling_prob_is_sound(neighboring):
    """q far below float64's resolution of 1 - q: the pessimistic PLD is that of a larger q (a
    bound), the optimistic one the identity; never NaN."""
    eps = np.array([0.0, 1.0])
    upper = pj.gaussian(1.0, sampling_prob=1e-20, neighboring=neighboring).delta(eps)
    lower = pj.gaussian(1.0, sampling_prob=1e-20, neighboring=neighboring, pessimistic=False)
    lower = lower.delta(eps)
    assert np.all(np.isfinite(upper)) and np.all(np.isfinite(lower))
    assert np.all(lower >= 0) and np.all(lower <= upper) and np.all(upper <= 1e-8)
    if neighboring == "add_remove":
        base = lambda e: gaussian_delta(1.0, e)  # noqa: E731
        exact = np.array([max(subsampled_remove_delta(base, 1e-20, e),
                              subsampled_add_delta(base, 1e-20, e)) for e in eps])
        assert np.all(upper >= exact) and np.all(lower <= exact)


def test_small_noise_add_direction_window_covers_its_loss():
    """The add direction's P is the base's B: its loss sits near -log(1 - q), which the window
    must reach (it used to sit below it, every mass in the +inf atom)."""
    mu, q = 1 / 0.03, 0.1
    pld = pj.gaussian(0.03, sampling_prob=q)
    add = pld.directions()[1]
    assert float(add.inf_mass) < 1e-12
    eps = np.array([0.0, 1.0, 10.0])
    exact = np.array([subsampled_add_delta(lambda e: gaussian_delta(mu, e), q, e) for e in eps])
    got = add.delta(eps)
    assert np.all(got >= exact - 1e-15) and np.all(got <= exact + 1e-3)


@pytest.mark.parametrize("tail", [1e-6, 1e-12, 1e-20])
@pytest.mark.parametrize("sigma,q", [(1.0, 0.01), (0.5, 0.2), (2.0, 1.0)])
def test_window_for_a_tail_leaves_at_most_that_mass_of_p_outside(sigma, q, tail):
    """The window dpsgd_epsilon narrows to T / delta (discretize.window) holds all of P but
    ``tail``: P's mass beyond both ends from the closed form (scipy's normal tails)."""
    from scipy.stats import norm

    from pldjax.kernels import discretize
    from pldjax.mechanisms import subsampling
    from pldjax.mechanisms.noise import GAUSSIAN

    mu = 1 / sigma
    center, half = (float(v) for v in discretize.window(GAUSSIAN, (mu,), tail))
    low, high = center - half, center + half  # the loss is N(mu^2/2, mu) under P
    assert norm.sf((high - mu**2 / 2) / mu) + norm.cdf((low - mu**2 / 2) / mu) <= tail * (1 + 1e-9)
    default = discretize.window(GAUSSIAN, (mu,), 0.0)
    assert [float(v) for v in default] == [mu**2 / 2, 10 * mu]

    def base_loss(loss):  # the base loss l with log(1 - q + q e^l) = loss (-inf below the range)
        with np.errstate(divide="ignore"):
            return np.log(np.maximum(np.expm1(loss) + q, 0.0)) - np.log(q)

    def base_outside(l_low, l_high, sign):  # P(l outside [l_low, l_high]), l ~ N(sign mu^2/2, mu)
        return norm.sf((l_high - sign * mu**2 / 2) / mu) + norm.cdf((l_low - sign * mu**2 / 2) / mu)

    mechanism = subsampling.poisson(GAUSSIAN)
    for direction in (subsampling.REMOVE, subsampling.ADD):
        center, half = (float(v) for v in discretize.window(mechanism, (mu, q, direction), tail))
        low, high = center - half, center + half
        if direction == subsampling.REMOVE:  # P = (1 - q) B + q A, L = log(1 - q + q e^l)
            l_low, l_high = base_loss(low), base_loss(high)
            outside = (1 - q) * base_outside(l_low, l_high, -1) + q * base_outside(l_low, l_high, 1)
        else:  # P = B, L = -log(1 - q + q e^l)
            outside = base_outside(base_loss(-high), base_loss(-low), -1)
        assert outside <= tail * (1 + 1e-9)
        assert half < float(discretize.window(mechanism, (mu, q, direction), 0.0)[1])


def test_dpsgd_windows_follow_steps_and_delta():
    # sigma = 1, q = 0.01, T = 1e4, delta = 1e-5 (the DP-SGD benchmark configuration): each step may leave
    # delta 2^-20 / T of P outside, which halves the mechanism grid of the default window
    from pldjax.accounting import planner
    from pldjax.kernels import discretize
    from pldjax.mechanisms import subsampling

    mechanism, params, _ = pj.dpsgd_event(1.0, 0.01).directions(True)
    params = tuple(params) + (subsampling.REMOVE,)
    tail = planner.mechanism_tail(np.array([1e4]), np.array([1e-5]), "epsilon")
    assert discretize.mechanism_sizes(mechanism, params).tolist() == [32768]
    assert discretize.mechanism_sizes(mechanism, params, tail=tail).tolist() == [16384]
    assert planner.mechanism_tail(np.array([1e4]), np.array([1.0]), "delta").tolist() == [0.0]


def test_threshold_matches_mpmath():
    """log((e^x - 1 + q) / q), the base loss where the subsampled loss crosses x (where the
    remove direction reads its base's tails: a base that gives back the loss it is asked at
    shows it), from one log with Goldberg's log1p correction (x > 0) or without it (x <= 0):
    against mpmath, also where 1 + (q - 1) e^-x rounds (q tiny, x tiny) and where e^x - 1 + q
    cancels."""
    import jax

    from pldjax.core.precision import float64
    from pldjax.kernels.discretize import LossTails
    from pldjax.mechanisms.subsampling import REMOVE, poisson

    def unused(params):
        raise AssertionError("only the tails are read")

    asked = poisson(LossTails(tails=lambda params, loss: (loss,) * 4, spread=unused,
                              center=unused, half_width=unused))
    mpmath.mp.dps = 50
    xs = np.array([-0.5, -1e-3, -1e-9, 0.0, 1e-12, 1e-9, 1e-6, 1e-3, 0.3, 1.0, 5.0, 40.0, 800.0])
    for q in (1e-9, 1e-3, 0.3, 1.0):
        # the remove direction's log Q(L > x): its base's at the threshold, unmixed
        got = np.asarray(jax.jit(float64(lambda x, q: asked.tails((q, REMOVE), x)[1]))(xs, q))
        for x, value in zip(xs, got, strict=True):
            inner = mpmath.expm1(mpmath.mpf(x)) + mpmath.mpf(q)
            if inner <= 0:
                assert value == -np.inf
                continue
            want = float(mpmath.log(inner / mpmath.mpf(q)))
            # e^x - 1 + q from a rounded e^x - 1: an error of u e^x in it, which the log turns
            # into u e^x / (e^x - 1 + q) (large where the sum cancels: q = 1e-9, x = -1e-9)
            cancel = float(mpmath.exp(mpmath.mpf(min(x, 0.0))) / inner)
            assert value == pytest.approx(want, rel=2e-15, abs=4e-16 * cancel), (q, x)


@pytest.mark.parametrize("sampled", [False, True])
def test_side_tails_are_the_tails_on_each_side(sampled):
    """LossTails.side_tails (one side of the four tails, what the pessimistic discretization
    reads) agrees with the four tails, for the Gaussian and its Poisson subsampling in both
    directions, mu = 0 included, over losses from far below to far above the bulk."""
    import jax
    import jax.numpy as jnp

    from pldjax.core.precision import float64
    from pldjax.kernels import discretize
    from pldjax.mechanisms.noise import GAUSSIAN
    from pldjax.mechanisms.subsampling import ADD, REMOVE, poisson

    mechanism = poisson(GAUSSIAN) if sampled else GAUSSIAN
    four_only = dataclasses.replace(mechanism, side_tails=None)  # its sides read from its tails
    eps = jnp.asarray(np.concatenate([-np.geomspace(1e3, 1e-6, 40), [0.0],
                                      np.geomspace(1e-6, 1e3, 40)]))
    upper = eps >= 0
    # the parameters are data: one program for each function, whatever their values
    side_tails = jax.jit(float64(lambda e, u, p: mechanism.side_tails(p, e, u)))
    four_tails = jax.jit(float64(lambda e, u, p: discretize.side_tails(four_only, p, e, u)))
    for mu in (0.0, 0.3, 1.0, 5.0):
        cases = [(mu, q, d) for q in (1e-4, 0.1, 1.0) for d in (REMOVE, ADD)] if sampled else [(mu,)]
        for params in cases:
            params = tuple(jnp.asarray(p, jnp.float64) for p in params)
            side, four = side_tails(eps, upper, params), four_tails(eps, upper, params)
            for got, want in zip(side, four, strict=True):
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-14, atol=0)


@pytest.mark.parametrize("sigma,size", [(0.05, 64), (0.0185, 256)])
def test_sampling_prob_one_keeps_the_add_directions_large_losses(sigma, size):
    """At q = 1 the add direction's threshold log(e^x - 1 + q) was computed as log(expm1(x) + 1),
    0 below x = -37: its losses above 37 nats went to -inf, a mass of 1 + e^-16 sat at 48 nats
    (delta(48) read 0 against the Gaussian's 1 - 2e-14, and the PLD summed to 1 + 1.1e-7)."""
    from reference import gaussian_delta

    # a traced q: a concrete q = 1 is the Gaussian itself, without the subsampled kernel
    pld = jax.jit(lambda q: pj.gaussian(sigma, sampling_prob=q, grid=pj.Grid(size=size)))(1.0)
    for direction in pld.directions():
        assert abs(float(direction.total_mass()) - 1.0) <= 1e-12
        for eps in (48.0, 0.5 / sigma**2):
            assert float(direction.delta(eps)) >= gaussian_delta(1.0 / sigma, eps) - 1e-15


@pytest.mark.parametrize("sigma, q", [(0.6, 1e-6), (1.0, 1e-4), (1.0, 0.01), (3.0, 0.05),
                                      (30.0, 0.1), (0.8, 0.6), (0.01, 0.01), (0.05, 1e-4),
                                      (0.02, 0.5), (0.01, 0.9)])
def test_a_subsampled_gaussians_curves_bracket_the_closed_form(sigma, q):
    """The pessimistic and optimistic curves of one Poisson-subsampled Gaussian step (delta at
    eps >= 0, its excess below), both directions, at 161 points across each window, in NumPy and
    compiled: at or above (at or below) the mixture's own curve at 50 digits, within 1e-8
    relative. Before, from the difference of the mixture's two tails, which nearly cancel at a
    small q, they sat up to 7e-11 on the wrong side of the truth at q = 1e-6 (and the threshold,
    from 1 - q rounded, was 3e-11 off near eps = 0); the base Gaussian's tails of sigma = 30
    (mu = 1/30) nearly cancel too. At small noise the rounding of the threshold and of the
    base's large log-tails moved the curve up to 5e-14 to the wrong side (sigma 0.01, q 0.01 and
    0.9)."""
    mechanism, params, _ = pj.dpsgd_event(sigma, q).directions()
    params = [float(np.asarray(p).reshape(-1)[0]) for p in params]
    lower_params = [float(np.asarray(p).reshape(-1)[0])
                    for p in pj.dpsgd_event(sigma, q).directions(False)[1]]

    def optimistic(p, z):
        values = mechanism_estimate(mechanism, p)(z)
        return array_module(z).where(z >= 0, values[4], values[5])

    compiled = jax.jit(float64(lambda p, z: mechanism_curve(mechanism, p, z)))
    compiled_optimistic = jax.jit(float64(optimistic))
    for direction, pld in enumerate((pj.gaussian(sigma, sampling_prob=q).forward,
                                     pj.gaussian(sigma, sampling_prob=q).backward)):
        z = np.linspace(int(pld.offset), int(pld.offset) + pld.size - 1, 161) * float(pld.step)
        with mpmath.workdps(50):
            truth = np.array([float(subsampled_gaussian_curve_mp(sigma, q, e, direction == 1))
                              for e in z])
        held = truth > 1e-300
        assert held.sum() >= 10
        row, lower_row = (*params, float(direction)), (*lower_params, float(direction))
        for got in (mechanism_curve(mechanism, row, z), np.asarray(compiled(row, z))):
            assert np.all(got[held] >= truth[held])
            assert np.all(got[held] <= truth[held] * (1 + 1e-8))
        for got in (optimistic(lower_row, z), np.asarray(compiled_optimistic(lower_row, z))):
            assert np.all(got[held] <= truth[held])
            assert np.all(got[held] >= truth[held] * (1 - 1e-8))


@pytest.mark.parametrize("sigma, q", [(0.6, 1e-6), (1.0, 0.01), (30.0, 0.1), (0.8, 0.6),
                                      (0.1, 0.3), (0.05, 1e-3), (0.01, 1e-3)])
def test_a_replace_one_gaussians_curves_bracket_the_closed_form(sigma, q):
    """As above, for Poisson subsampling under replace-one adjacency (one direction: the pair is
    symmetric): at or above (at or below) the closed form at 60 digits, within 1e-7. Where one
    term of the curve is the whole value (e^eps Q negligible beside P), the larger term's own
    round-off was left uncovered: 1.1e-14 below the truth at sigma 0.05, q 1e-3."""
    event = pj.dpsgd_event(sigma, q, "replace_one")
    mechanism, params, _ = event.directions()
    row, lower_row = (tuple(float(np.asarray(p).reshape(-1)[0]) for p in event.directions(pessimistic)[1])
                      for pessimistic in (True, False))
    pld = pj.gaussian(sigma, sampling_prob=q, neighboring="replace_one")
    z = np.linspace(int(pld.offset), int(pld.offset) + pld.size - 1, 161) * float(pld.step)
    with mpmath.workdps(60):
        mu = 1 / mpmath.mpf(sigma)  # the true ratio; the rows' are rounded up and down
        truth = np.array([float(replace_one_gaussian_curve_mp(mu, q, e)) for e in z])
    held = truth > 1e-300
    assert held.sum() >= 40

    def optimistic(p, z):
        values = mechanism_estimate(mechanism, p)(z)
        return array_module(z).where(z >= 0, values[4], values[5])

    compiled = jax.jit(float64(lambda p, z: mechanism_curve(mechanism, p, z)))
    for got in (mechanism_curve(mechanism, row, z), np.asarray(compiled(row, z))):
        assert np.all(got[held] >= truth[held])
        assert np.all(got[held] <= truth[held] * (1 + 1e-7))
    for got in (optimistic(lower_row, z), np.asarray(jax.jit(float64(optimistic))(lower_row, z))):
        assert np.all(got[held] <= truth[held])
        assert np.all(got[held] >= truth[held] * (1 - 1e-7))
