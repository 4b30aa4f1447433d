"""Random allocation (balls-in-bins) against references that do not come from pldjax: the Gaussian
mechanism's closed form (one step), one-dimensional mpmath quadratures of the exact pair (two
steps), Monte Carlo estimates of the exact pair (more steps, and several selections, where the
PLD is the composition of blocks)."""

import math

import mpmath
import numpy as np
import pytest
from compiled_programs import programs_of_a_new_process
from reference import gaussian_epsilon
from scipy import stats

import pldjax as pj

EPSILONS = (0.0, 0.25, 0.5, 1.0, 2.0)


def _gaussian_delta(mu: float, eps: float) -> float:
    return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))


def _two_step_delta(mu: float, eps: float, direction: str) -> float:
    """delta(eps) of the exact balls-in-bins pair with two steps, by mpmath quadrature.

    Under Q each step's likelihood ratio Z = exp(mu X - mu^2 / 2) (X standard normal) is a
    lognormal of mean 1 and the loss is log S, S = (Z_1 + Z_2) / 2; remove: E_Q[(S - e^eps)_+],
    add: E_Q[(1 - e^eps S)_+]. Given Z_1 = z the inner expectation over Z_2 is a Black-Scholes
    price (E[(Z - K)_+] = Phi(d1) - K Phi(d2), d1 = (mu^2 / 2 - log K) / mu, d2 = d1 - mu). At
    20 digits: the same doubles as at 30 for the tests' eps up to 2, in half the time; values
    below 1e-13 (larger eps) carry the quadrature's absolute error, about 1e-20 of the whole."""
    with mpmath.workdps(20):
        return _two_step_delta_mp(mpmath.mpf(mu), eps, direction)


def _two_step_delta_mp(mu, eps: float, direction: str) -> float:
    """:func:`_two_step_delta` at the working precision."""
    c = mpmath.exp(eps)
    ncdf = mpmath.ncdf

    def z_of(x):
        return mpmath.exp(mu * x - mu**2 / 2)

    def d12(strike):
        d1 = (mu**2 / 2 - mpmath.log(strike)) / mu
        return d1, d1 - mu

    if direction == "remove":
        def inner(x):
            strike = 2 * c - z_of(x)
            if strike <= 0:
                return (1 - strike) / 2
            d1, d2 = d12(strike)
            return (ncdf(d1) - strike * ncdf(d2)) / 2
        kink = (mpmath.log(2 * c) + mu**2 / 2) / mu
        pieces = [-mpmath.inf, kink, mpmath.inf]
    else:
        def inner(x):
            strike = 2 / c - z_of(x)
            if strike <= 0:
                return mpmath.mpf(0)
            d1, d2 = d12(strike)
            return c / 2 * (strike * ncdf(-d2) - ncdf(-d1))
        kink = (mpmath.log(2 / c) + mu**2 / 2) / mu
        pieces = [-mpmath.inf, kink]
    value = mpmath.quad(lambda x: mpmath.npdf(x) * inner(x), pieces)
    return float(value)


def _monte_carlo_delta(mu: float, steps: int, selected: int, eps: float, samples: int,
                       seed: int) -> tuple[float, float, float, float]:
    """(remove delta, its standard error, add delta, its standard error) of the exact
    random-allocation pair (a uniform ``selected``-subset of ``steps`` coordinates moved by mu)
    from draws under Q: S is the mean over subsets of the product of their Z, an elementary
    symmetric polynomial divided by its number of terms."""
    rng = np.random.default_rng(seed)
    z = np.exp(mu * rng.standard_normal((samples, steps)) - mu**2 / 2)
    poly = np.zeros((samples, selected + 1))
    poly[:, 0] = 1.0
    for i in range(steps):
        poly[:, 1:] = poly[:, 1:] + z[:, i:i + 1] * poly[:, :-1]
    s = poly[:, selected] / math.comb(steps, selected)
    c = math.exp(eps)
    remove, add = np.maximum(s - c, 0.0), np.maximum(1.0 - c * s, 0.0)
    root = math.sqrt(samples)
    return remove.mean(), remove.std() / root, add.mean(), add.std() / root


def _bounds(sigma, steps, selected=1):
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    return event.pld(), event.pld(pessimistic=False)


def test_every_step_selected_is_the_gaussian_mechanism_composed():
    upper, lower = _bounds(1.25, 3, 3)
    mu = math.sqrt(3) / 1.25
    for eps in EPSILONS:
        exact = _gaussian_delta(mu, eps)
        for high, low in zip(upper.directions(), lower.directions(), strict=True):
            assert float(low.delta(eps)) <= exact <= float(high.delta(eps))
            assert float(high.delta(eps)) - float(low.delta(eps)) <= 2e-3 * exact + 1e-9


@pytest.mark.parametrize("sigma", [2.0, 0.35, pytest.param(1.0, marks=pytest.mark.slow)])
def test_two_steps_bracket_the_exact_pair(sigma):
    """Both bounds within a few percent of the exact two-step pair, both directions; at sigma
    0.35 most Z are far below their mean (median e^-4.1), which a lattice aimed at S's spread
    floors to 0 (the add direction's upper bound read 2.4 times the exact delta at eps 5, its
    lower bound 0 from eps 0.5); the upper bound's epsilons stay finite and increasing down to
    delta 1e-14."""
    upper, lower = _bounds(sigma, 2)
    for eps in EPSILONS:
        for index, direction in enumerate(("remove", "add")):
            exact = _two_step_delta(1 / sigma, eps, direction)
            high = float(upper.directions()[index].delta(eps))
            low = float(lower.directions()[index].delta(eps))
            assert low <= exact <= high, (eps, direction)
            assert high <= exact * 1.01 + 1e-10
            assert low >= exact * 0.98 - 1e-10
    epsilons = [float(upper.epsilon(delta)) for delta in (1e-6, 1e-10, 1e-12, 1e-14)]
    assert all(math.isfinite(eps) for eps in epsilons) and epsilons == sorted(epsilons)
    assert float(lower.epsilon(1e-14)) <= epsilons[-1]


@pytest.mark.slow
def test_small_noise_and_few_steps_read_finite_epsilons_down_to_delta_1e_14():
    """Each block's lattice PLD, met with the Gaussian bound of one selection, keeps the
    lattice's tail beyond the Gaussian bound's window (where that bound's tail is its +inf atom,
    1.3e-10 at sigma 0.36 and 3 steps): the upper bound's epsilons stay finite and increasing."""
    upper, lower = _bounds(0.36, 3)
    epsilons = [float(upper.epsilon(delta)) for delta in (1e-6, 1e-10, 1e-12, 1e-14)]
    assert all(math.isfinite(eps) for eps in epsilons) and epsilons == sorted(epsilons)
    assert float(lower.epsilon(1e-14)) <= epsilons[-1]


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.35, 0.5, 5.0])
def test_two_steps_bracket_the_exact_pair_across_the_window(sigma):
    """Both bounds on their side of the exact two-step pair from eps = 0 to the reading at
    delta 1e-14, in both directions, at small and large noise (at 0.35 every lattice of one
    selection is met: the tail-reaching one, a finer one and the add direction's)."""
    upper, lower = _bounds(sigma, 2)
    top = float(upper.epsilon(1e-14))
    for eps in np.linspace(0.0, top, 25):
        for index, direction in enumerate(("remove", "add")):
            exact = _two_step_delta(1 / sigma, float(eps), direction)
            high = float(upper.directions()[index].delta(eps))
            low = float(lower.directions()[index].delta(eps))
            assert low <= exact * (1 + 1e-12) + 1e-15, (eps, direction)
            assert high >= exact * (1 - 1e-12) - 1e-15, (eps, direction)


@pytest.mark.parametrize(("sigma", "steps", "selected"), [
    (2.0, 6, 2),
    pytest.param(1.0, 50, 1, marks=pytest.mark.slow),
    pytest.param(1.0, 7, 3, marks=pytest.mark.slow),
])
def test_bounds_bracket_a_monte_carlo_estimate_of_the_exact_pair(sigma, steps, selected):
    upper, lower = _bounds(sigma, steps, selected)
    for eps in (0.05, 0.2, 0.5):
        remove, remove_se, add, add_se = _monte_carlo_delta(1 / sigma, steps, selected, eps,
                                                            10**6, seed=steps)
        for index, (estimate, se) in enumerate(((remove, remove_se), (add, add_se))):
            assert float(upper.directions()[index].delta(eps)) >= estimate - 5 * se
            assert float(lower.directions()[index].delta(eps)) <= estimate + 5 * se


@pytest.mark.parametrize(("sigma", "steps", "selected"), [(2.0, 100, 99), (1.0, 100, 50)])
def test_lower_bound_is_at_least_the_gaussian_of_the_outputs_sum(sigma, steps, selected):
    """The sum of the outputs is N(selected / sigma, steps) under P against N(0, steps) under Q
    (in units of the noise): the Gaussian mechanism of shift selected / (sigma sqrt(steps)), whose
    epsilon (closed form) the lower bound must reach where the lattice statistic falls short
    (most steps selected: 25.0 and 25.9 here before, with that Gaussian at 35.1 and 35.6)."""
    from scipy.optimize import brentq

    mu = selected / (sigma * math.sqrt(steps))
    delta = 1e-6
    exact = brentq(lambda eps: _gaussian_delta(mu, eps) - delta, 0.0, 10 * mu * mu + 10 * mu)
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    lower = pj.event_epsilon(event, 1, delta, pessimistic=False)
    upper = pj.event_epsilon(event, 1, delta)
    assert exact * (1 - 2e-3) <= lower <= upper


def test_many_selections_are_never_looser_than_the_gaussian_bound():
    """A record selected k times is at worst k Gaussian releases (the adversary also told which
    steps): sqrt(k) / sigma GDP, closed form. The blocks' k-fold composition rounds up at every
    fold, and at 5 x 10^5 of 10^6 steps it ended 4.8x above that bound (epsilon 1.2e6 against
    2.5e5)."""
    sigma, steps, selected, delta = 1.0, 10**6, 5 * 10**5, 1e-5
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    with mpmath.workdps(30):
        bound = gaussian_epsilon(math.sqrt(selected) / sigma, delta)
    assert pj.event_epsilon(event, 1, delta) <= bound * (1 + 1e-3)



@pytest.mark.slow
def test_one_selection_among_millions_of_steps_is_never_looser_than_the_gaussian_bound():
    """At 3 x 10^6 steps the add direction's losses span 16 nats at its step, more than a
    window holds: its bulk, moved up by 6 nats into the window, gave epsilon(0.1) = 5.75 and
    epsilon(1e-6) = 5.86, above the Gaussian bound of one selection (1.16 and 4.89, closed
    form). The loss of one of 3 x 10^6 steps is nearly Gaussian with mu^2 = log(1 + (e - 1) / t)
    (its chi-square divergence), whose delta(0) is 3e-4: epsilon(0.1) is 0."""
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.RandomAllocation(3 * 10**6, 1))
    with mpmath.workdps(30):
        bounds = [gaussian_epsilon(1.0, delta) for delta in (1e-6, 0.1)]
    got = pj.event_epsilon(event, 1, np.array([1e-6, 0.1]))
    assert got[0] <= bounds[0] * (1 + 1e-6)
    assert got[1] == 0.0 < bounds[1]

@pytest.mark.slow
@pytest.mark.parametrize("selected", [1, 10])
def test_bounds_against_feldman_and_shenfelds_accountant(selected):
    """Feldman and Shenfeld's random-allocation accountant (the PLD_accounting package) gives the
    epsilons of a dominating and a dominated PLD. For one selection both bound the truth, which
    pldjax's bounds must then reach; for several, both are of the k-fold composition of
    one-selection allocations of t / k steps, which pldjax's upper bound composes too: it must be
    no looser, up to 0.1%, and its lower bound (of the truth, not of that composition) within 1%
    below it. Sigma 2, 10 or 1 of 100 steps, delta 1e-6 (at the package's default accuracy
    their brackets are [2.380, 2.466] and [0.2005, 0.2100]; pldjax's [2.4031, 2.4244] and
    [0.20493, 0.20494])."""
    from PLD_accounting.random_allocation_api import gaussian_allocation_epsilon_range

    sigma, steps, delta = 2.0, 100, 1e-6
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    upper = pj.event_epsilon(event, 1, delta)
    lower = pj.event_epsilon(event, 1, delta, pessimistic=False)
    their_upper, their_lower = gaussian_allocation_epsilon_range(
        delta=delta, sigma=sigma, num_steps=steps, num_selected=selected)
    assert lower <= their_upper and upper <= their_upper * (1 + 1e-3)
    assert lower >= 0.99 * upper
    if selected == 1:
        assert their_lower <= upper


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.5, 0.4, 0.35])
def test_small_noise_upper_bound_is_no_looser_than_feldman_and_shenfelds(sigma):
    """10 of 100 steps, delta 1e-5: pldjax's upper bound (of the blocked composition of
    one-selection allocations, as Feldman and Shenfeld's) no looser than theirs, up to 0.1%.
    Their brackets: [25.93, 26.03] at sigma 0.5, [42.16, 42.28] at 0.4, [55.94, 56.07] at 0.35;
    pldjax's upper bounds 25.98, 42.21 and 55.99, where the tail-reaching lattice alone, whose
    spacing is hundreds of times coarser than aimed there, gave 29.90 and 45.94, and at 0.35 the
    add direction, whose lattice put 0.14 of Q-mass at +inf, fell back to the Gaussian bound
    (68.89)."""
    from PLD_accounting.random_allocation_api import gaussian_allocation_epsilon_range

    steps, selected, delta = 100, 10, 1e-5
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    their_upper, _ = gaussian_allocation_epsilon_range(
        delta=delta, sigma=sigma, num_steps=steps, num_selected=selected)
    assert pj.event_epsilon(event, 1, delta) <= their_upper * (1 + 1e-3)


@pytest.mark.slow
def test_epochs_compose_and_stay_above_the_shuffled_lower_bound():
    # zero-out shuffling's lower bound (Chua et al.) is a statistic of the one-selection pair
    sigma, steps, epochs, delta = 2.0, 8, 3, 1e-5
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps),
                     "replace_special")
    upper = pj.event_epsilon(event, epochs, delta)
    lower = pj.event_epsilon(event, epochs, delta, pessimistic=False)
    shuffled = float(pj.shuffling_lower_bound(sigma, steps, epochs,
                                              neighboring="replace_special").epsilon(delta))
    assert shuffled <= lower <= upper <= 1.01 * lower
    add_remove = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps))
    assert pj.event_epsilon(add_remove, epochs, delta) == upper
    assert upper == pytest.approx(float(event.pld().self_compose(epochs).epsilon(delta)))


@pytest.mark.parametrize(("arguments", "named"), [
    ((0,), "steps"), ((2.5,), "steps"), ((4, 0), "selected"), ((4, 5), "selected"),
    ((-3,), "steps"), ((float("nan"),), "steps"), ((10**20, 10**19), r"steps must be an integer in"),
])
def test_bad_counts_are_refused_by_name(arguments, named):
    with pytest.raises(ValueError, match=named):
        pj.sampling.RandomAllocation(*arguments)


@pytest.mark.parametrize(("steps", "selected", "named"), [
    ([10, 0], 1, "steps"), ([10, 20], [11, 2], "selected"), ([10.5], 1, "steps"),
    ([10, 20, 30], [1, 2], "broadcast"), ([4, float("nan")], 1, "steps"),
])
def test_bad_counts_in_arrays_are_refused_by_name(steps, selected, named):
    with pytest.raises(ValueError, match=named):
        pj.sampling.RandomAllocation(np.asarray(steps), np.asarray(selected))


def test_arrays_of_steps_and_selected_are_a_sweep_of_single_configurations():
    # sigma (rows) against (steps, selected) pairs (columns): each value as its own call's, bit
    # for bit, both bounds; one PLD takes one of each
    sigmas, steps, selected = np.array([[1.5], [3.0]]), np.array([8, 12]), np.array([1, 3])
    event = pj.Event(pj.noise.Gaussian(sigmas), pj.sampling.RandomAllocation(steps, selected))
    for pessimistic in (True, False):
        swept = pj.event_epsilon(event, 2, 1e-6, pessimistic=pessimistic)
        assert swept.shape == (2, 2)
        for (i, j), value in np.ndenumerate(swept):
            one = pj.Event(pj.noise.Gaussian(float(sigmas[i, 0])),
                           pj.sampling.RandomAllocation(int(steps[j]), int(selected[j])))
            assert value == pj.event_epsilon(one, 2, 1e-6, pessimistic=pessimistic)
    with pytest.raises(ValueError, match="one steps and one selected"):
        event.pld()


def test_pairs_without_an_analysis_are_refused():
    scheme = pj.sampling.RandomAllocation(10)
    with pytest.raises(ValueError, match="replace_one"):
        pj.Event(pj.noise.Gaussian(1.0), scheme, "replace_one").pld()
    with pytest.raises(ValueError, match="Gaussian"):
        pj.Event(pj.noise.Laplace(1.0), scheme).pld()



@pytest.mark.parametrize(("sigma", "steps", "selected"), [(2.0, 100, 10), (1.0, 200, 1)])
def test_upper_bounds_are_pairs_that_a_filter_accepts(sigma, steps, selected):
    """The lattice's upper-bound masses and the compositions' round-off charges implied a Q mass
    (sum p e^-z) up to 2e-7 above 1, which no pair has: a filter refused the epoch's PLD as a
    degenerate query. Mass moved up from the lowest losses to loss 0 restores it (and leaves
    delta at epsilon >= 0 as it was)."""
    from pldjax.core.pld import pld_problems

    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    pld = event.pld()
    assert not any(bool(bad) for *_, bad in pld_problems(pld))
    gdp = pj.filters.gdp_filter(5.0, delta=1e-6)
    _, accepted = gdp.spend(gdp.init(), pld)
    assert bool(accepted)

@pytest.mark.parametrize(("sigma", "steps", "selected"), [
    (1e-6, 10, 1), pytest.param(1e17, 10, 1, marks=pytest.mark.slow), (2.0, 10**9, 1),
    pytest.param(0.3, 100, 1, marks=pytest.mark.slow),
    # blocks of 4 steps whose heavy tail no lattice holds (their +inf atoms once summed to
    # inf), and blocks of 10^5 steps whose lattice round-off (2e-8 each) did the same
    pytest.param(0.5, 40, 10, marks=pytest.mark.slow),
    pytest.param(2.0, 10**9, 10**4, marks=pytest.mark.slow),
    # a lattice whose lowest points lie 14 nats below a loss of 1e-5 nats (10^9 grid points
    # asked for), and blocks whose upper-bound masses imply a Q mass 7e-9 above 1 (their meet
    # with the Gaussian bound was refused as no privacy curve)
    pytest.param(1e6, 100, 10, marks=pytest.mark.slow),
    pytest.param(1e3, 10**4, 10, marks=pytest.mark.slow)])
def test_extremes_give_sound_finite_bounds(sigma, steps, selected):
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    with np.errstate(all="raise"):
        upper = pj.event_epsilon(event, 1, 1e-6)
        lower = pj.event_epsilon(event, 1, 1e-6, pessimistic=False)
    assert 0.0 <= lower <= upper < math.inf
    # never above the Gaussian mechanism of the selections composed, which dominates every
    # allocation
    revealed = pj.Event(pj.noise.Gaussian(sigma / math.sqrt(selected)))
    assert upper <= pj.event_epsilon(revealed, 1, 1e-6) * (1 + 1e-3)


def test_noise_too_small_for_any_float64_epsilon_reads_inf_without_warnings():
    event = pj.Event(pj.noise.Gaussian(1e-300), pj.sampling.RandomAllocation(10, 1))
    with np.errstate(all="raise"):
        assert pj.event_epsilon(event, 1, 1e-5) == math.inf


def test_value_does_not_depend_on_the_callers_x64_setting(x64_off):
    # two configurations: built side by side in threads, each of which switches to 64 bits
    event = pj.Event(pj.noise.Gaussian(2.0), pj.sampling.RandomAllocation(6, np.array([1, 2])))
    on_off = pj.event_epsilon(event, 2, 1e-6)
    import jax

    with jax.enable_x64(True):
        assert np.array_equal(pj.event_epsilon(event, 2, 1e-6), on_off)


def test_batches_the_accountant_and_reports_read_the_same_epochs():
    import jax.numpy as jnp

    sigmas, steps, epochs, delta = (1.5, 2.0), 10, 3, 1e-5
    singles = [pj.event_epsilon(pj.Event(pj.noise.Gaussian(s), pj.sampling.RandomAllocation(steps)),
                                epochs, delta) for s in sigmas]
    batched = pj.Event(pj.noise.Gaussian(jnp.array(sigmas)), pj.sampling.RandomAllocation(steps))
    np.testing.assert_array_equal(pj.event_epsilon(batched, epochs, delta), singles)
    event = pj.Event(pj.noise.Gaussian(sigmas[1]), pj.sampling.RandomAllocation(steps))
    state = pj.accountant.step(pj.accountant.init(event=event), event, steps=epochs)
    assert pj.accountant.epsilon(state, delta) == pytest.approx(singles[1], rel=1e-12)
    report = pj.privacy_report(event, count=epochs, deltas=[delta])
    assert report.epsilon_lower[0] <= singles[1] == pytest.approx(report.epsilon_upper[0])


def test_too_many_epochs_are_refused_naming_the_steps_and_the_event():
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.RandomAllocation(100, 10))
    with pytest.raises(ValueError, match=r"steps = 1000000000 of Event\(.*RandomAllocation"):
        pj.event_epsilon(event, 10**9, 1e-6)


def test_a_process_builds_its_lattices_in_numpy_on_a_cpu():
    # NumPy's FFTs are as fast as the compiled lattice program's on a CPU: a process (with host
    # work to spend) builds every lattice in NumPy and compiles none; the bounds are those of
    # the compiled lattices (this run's, PLDJAX_HOST_WORK=0) up to their FFTs' round-off
    names, printed = programs_of_a_new_process("""
        import os
        os.environ["PLDJAX_HOST_WORK"] = str(10**15)
        import pldjax as pj
        event = pj.Event(pj.noise.Gaussian(2.0), pj.sampling.RandomAllocation(100, 10))
        print(float(pj.event_epsilon(event, 1, 1e-6)),
              float(pj.event_epsilon(event, 1, 1e-6, pessimistic=False)))
    """)
    assert not [name for name in names if "lattice" in name]
    event = pj.Event(pj.noise.Gaussian(2.0), pj.sampling.RandomAllocation(100, 10))
    compiled = [float(pj.event_epsilon(event, 1, 1e-6, pessimistic=p)) for p in (True, False)]
    np.testing.assert_allclose([float(v) for v in printed.split()], compiled, rtol=1e-6)
