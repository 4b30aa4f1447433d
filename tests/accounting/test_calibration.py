"""Calibration at the edges: NaN never meets a target, every tolerance and limit is validated,
every loop is bounded, and calibrate_steps honours max_steps exactly.

Most tests replace the epsilon evaluation by a closed form (fast, and NaN or adversarial where a
test needs it); the calibrators only see its values through the one predicate they share.
"""

import numpy as np
import pytest
from compiled_programs import accounting_on_the_host

import pldjax as pj
from pldjax.accounting import calibration as calibrate

DELTA = 1e-5


def fake(formula):
    """An epsilon evaluation ``formula(sigma, q, steps)`` of a DP-SGD event in place of
    event_epsilon."""
    def epsilons(event, steps, delta):
        sigma, q, steps = np.broadcast_arrays(*(np.asarray(a, np.float64) for a in (
            event.noise.sigma, event.sampling.sampling_prob, steps)))
        with np.errstate(invalid="ignore"):
            return np.asarray(formula(sigma, q, steps), np.float64)
    return epsilons


def linear(sigma, q, steps):
    """epsilon = q * steps / sigma, NaN for steps > 1000, sigma < 0.3 or q > 0.5."""
    eps = q * steps / sigma
    return np.where((steps > 1000) | (sigma < 0.3) | (q > 0.5), np.nan, eps)


@pytest.fixture
def linear_epsilon(monkeypatch):
    monkeypatch.setattr(calibrate, "event_epsilon", fake(linear))


# -- NaN and inf never meet a target --------------------------------------------------------------
def test_nan_and_inf_never_meet_a_target(monkeypatch):
    # the same epsilon at every number of steps, against the target 1.0: every step allowed (up
    # to max_steps), or none (one step already exceeds it)
    for epsilon, meets in ((0.5, True), (1.0, True), (1.5, False), (np.nan, False),
                           (np.inf, False), (-np.inf, False)):
        monkeypatch.setattr(calibrate, "event_epsilon",
                            fake(lambda s, q, t, value=epsilon: np.full(np.shape(t), value)))
        if meets:
            assert pj.calibrate_steps(1.0, DELTA, 1.0, 0.1, max_steps=10) == 10
        else:
            with pytest.raises(ValueError, match="one step already exceeds"):
                pj.calibrate_steps(1.0, DELTA, 1.0, 0.1, max_steps=10)


def test_steps_stop_where_epsilon_turns_nan(linear_epsilon):
    # finite epsilon <= 1e6 for every steps <= 1000, NaN above: the answer is 1000, not max_steps
    assert pj.calibrate_steps(1e6, DELTA, 1.0, 0.1) == 1000
    assert pj.calibrate_steps(1e6, DELTA, 1.0, 0.1, max_steps=10**9) == 1000


def test_steps_refuse_when_one_step_is_nan(linear_epsilon):
    with pytest.raises(ValueError, match=r"epsilon there: \[nan\]\): one step already exceeds"):
        pj.calibrate_steps(1.0, DELTA, 0.01, 0.1)


def test_noise_and_sampling_prob_avoid_nan_regions(linear_epsilon):
    sigma = pj.calibrate_noise_multiplier(1e6, DELTA, 0.1, 10, sigma_min=1e-3)
    assert 0.3 <= sigma <= 0.3 * (1 + 2 * calibrate.RTOL)
    q = pj.calibrate_sampling_prob(1e6, DELTA, 1.0, 10)
    assert 0.5 / (1 + 2 * calibrate.RTOL) <= q <= 0.5
    with pytest.raises(ValueError, match="no noise multiplier"):
        pj.calibrate_noise_multiplier(1e6, DELTA, 0.1, 10, sigma_max=0.2, sigma_min=0.01)


@pytest.mark.slow
def test_one_step_of_tiny_noise_costs_thousands():
    # one step of sigma = 0.01, q = 0.05 costs epsilon ~ 5350: no number of steps meets 1.0, and
    # the optax transform refuses instead of allowing 10**7 steps
    with pytest.raises(ValueError, match="one step already exceeds"):
        pj.calibrate_steps(target_epsilon=1.0, delta=DELTA, noise_multiplier=0.01,
                           sampling_prob=0.05)


# -- the contract of calibrate_steps --------------------------------------------------------------
@pytest.mark.parametrize(("target", "max_steps", "expected"), [
    (1.0, 10**7, 100),   # epsilon(T) = T / 100: the largest T with epsilon <= 1 is 100
    (1.0, 50, 50),       # max_steps caps the answer
    (1.0, 1, 1),
    (1.0, 2, 2),
    (1.0, 100, 100),
    (1.0, 101, 100),
    (0.015, 10**7, 1),
    (0.025, 3, 2),
])
def test_steps_largest_within_target_and_max_steps(monkeypatch, target, max_steps, expected):
    monkeypatch.setattr(calibrate, "event_epsilon", fake(lambda s, q, t: t / 100))
    assert pj.calibrate_steps(target, DELTA, 1.0, 1.0, max_steps=max_steps) == expected


def test_steps_vectorized_contract(monkeypatch):
    monkeypatch.setattr(calibrate, "event_epsilon", fake(lambda s, q, t: t / 100))
    got = pj.calibrate_steps(np.array([0.01, 0.5, 7.77, 1e9]), DELTA, 1.0, 1.0, max_steps=10**6)
    assert got.tolist() == [1, 50, 777, 10**6]


@pytest.mark.parametrize("max_steps", [0, -5, float("nan"), float("inf"), 2.5, "10", 2**60])
def test_steps_reject_bad_max_steps(monkeypatch, max_steps):
    monkeypatch.setattr(calibrate, "event_epsilon", fake(lambda s, q, t: t / 100))
    with pytest.raises(ValueError, match="max_steps"):
        pj.calibrate_steps(1.0, DELTA, 1.0, 1.0, max_steps=max_steps)


def test_steps_max_steps_one_real():
    assert pj.calibrate_steps(2.0, DELTA, 1.0, 0.05, max_steps=1) == 1


# -- tolerances and limits are validated ----------------------------------------------------------
BAD_RTOL = [0.0, -1e-4, float("nan"), float("inf"), -float("inf"), 1.0, 10.0, 1e-300]


@pytest.mark.parametrize("rtol", BAD_RTOL)
def test_bad_rtol_is_refused(linear_epsilon, rtol):
    with pytest.raises(ValueError, match="rtol"):
        pj.calibrate_noise_multiplier(1.0, DELTA, 0.1, 10, rtol=rtol)
    with pytest.raises(ValueError, match="rtol"):
        pj.calibrate_sampling_prob(1.0, DELTA, 1.0, 10, rtol=rtol)


@pytest.mark.parametrize(("limits", "name"), [
    ({"sigma_min": 0.0}, "sigma_min"),
    ({"sigma_min": -1.0}, "sigma_min"),
    ({"sigma_min": float("nan")}, "sigma_min"),
    ({"sigma_min": float("inf")}, "sigma_min"),
    ({"sigma_max": float("nan")}, "sigma_max"),
    ({"sigma_max": float("inf")}, "sigma_max"),
    ({"sigma_min": 2.0, "sigma_max": 1.0}, "sigma_max"),
    ({"sigma_min": 1.0, "sigma_max": 1.0}, "sigma_max"),
])
def test_bad_sigma_limits_are_refused(linear_epsilon, limits, name):
    with pytest.raises(ValueError, match=name):
        pj.calibrate_noise_multiplier(1.0, DELTA, 0.1, 10, **limits)


@pytest.mark.parametrize("q_min", [0.0, -0.1, 1.5, float("nan"), float("inf")])
def test_bad_q_min_is_refused(linear_epsilon, q_min):
    with pytest.raises(ValueError, match="q_min"):
        pj.calibrate_sampling_prob(1.0, DELTA, 1.0, 10, q_min=q_min)


@pytest.mark.parametrize("steps", [2.5, float("nan"), -1])
def test_bad_steps_are_refused_before_any_evaluation(linear_epsilon, steps):
    # (calibrate_sampling_prob searched first, and its evaluation's error blamed the search)
    for call in (pj.calibrate_noise_multiplier, pj.calibrate_sampling_prob):
        with pytest.raises(ValueError, match="^steps must"):
            call(1.0, DELTA, 0.5, steps)


def test_extreme_valid_limits_converge(monkeypatch):
    # epsilon = 1 / sigma and q: the answers are closed forms, from the widest float64 limits
    monkeypatch.setattr(calibrate, "event_epsilon", fake(lambda s, q, t: q / s))
    sigma = pj.calibrate_noise_multiplier(4.0, DELTA, 1.0, 1, sigma_min=1e-300, sigma_max=1e300,
                                          rtol=calibrate.MIN_RTOL)
    assert 0.25 <= sigma <= 0.25 * (1 + 2 * calibrate.MIN_RTOL)
    q = pj.calibrate_sampling_prob(1e-200, DELTA, 1.0, 1, q_min=1e-300, rtol=calibrate.MIN_RTOL)
    assert 1e-200 / (1 + 2 * calibrate.MIN_RTOL) <= q <= 1e-200
    # limits inside the bracketing start (sigma = 1) are respected
    assert pj.calibrate_noise_multiplier(4.0, DELTA, 1.0, 1, sigma_min=2.0, sigma_max=3.0) == 2.0
    with pytest.raises(ValueError, match="no noise multiplier"):
        pj.calibrate_noise_multiplier(4.0, DELTA, 1.0, 1, sigma_min=0.01, sigma_max=0.1)


# -- every loop is bounded ------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_adversarial_epsilon_never_hangs(monkeypatch, seed):
    # epsilon is noise: no monotonicity for the bisections to rely on, yet each call ends with an
    # answer that met its target when evaluated, or a ValueError
    rng = np.random.default_rng(seed)
    noise = fake(lambda s, q, t: rng.choice([0.5, 2.0, np.nan, np.inf], size=np.shape(s)))
    monkeypatch.setattr(calibrate, "event_epsilon", noise)
    for call in (
        lambda: pj.calibrate_noise_multiplier(np.ones(4), DELTA, 0.1, 10, sigma_min=1e-300,
                                              sigma_max=1e300, rtol=calibrate.MIN_RTOL),
        lambda: pj.calibrate_sampling_prob(np.ones(4), DELTA, 1.0, 10, q_min=1e-300,
                                           rtol=calibrate.MIN_RTOL),
        lambda: pj.calibrate_steps(np.ones(4), DELTA, 1.0, 0.1, max_steps=calibrate.MAX_STEPS),
    ):
        try:
            call()
        except ValueError as err:
            assert "reaches target_epsilon" in str(err)


def test_iterations_raise_past_their_bound():
    with pytest.raises(RuntimeError, match="did not converge in 3"):
        for _ in calibrate.iterations(3, "loop"):
            pass


def test_bad_neighboring_is_refused_before_any_evaluation(linear_epsilon):
    for call in (pj.calibrate_noise_multiplier, pj.calibrate_steps, pj.calibrate_sampling_prob):
        with pytest.raises(ValueError, match="^neighboring must be one of"):
            call(1.0, DELTA, 0.5, 10, neighboring="bogus")


def test_evaluation_errors_say_where_the_search_was(monkeypatch):
    def refuse(event, steps, delta):
        raise ValueError("steps = 5e+08 is too large")
    monkeypatch.setattr(calibrate, "event_epsilon", refuse)
    with pytest.raises(ValueError, match=r"could not evaluate epsilon .* steps 1 .*max_steps"):
        pj.calibrate_steps(1.0, DELTA, 1.0, 0.1)


def test_caller_x64_off_same_answers(x64_off):
    assert pj.calibrate_steps(2.0, DELTA, 1.0, 0.05, max_steps=1) == 1
    with pytest.raises(ValueError, match="rtol"):
        pj.calibrate_noise_multiplier(1.0, DELTA, 0.1, 10, rtol=0.0)


@pytest.mark.slow
def test_calibrated_noise_meets_the_target_and_is_tight():
    targets = np.array([1.0, 4.0])
    sigmas = pj.calibrate_noise_multiplier(targets, DELTA, 0.05, 100)
    assert sigmas.shape == (2,)
    achieved = pj.dpsgd_epsilon(sigmas, 0.05, 100, DELTA)
    assert np.all(achieved <= targets)
    assert np.all(pj.dpsgd_epsilon(sigmas * 0.999, 0.05, 100, DELTA) > targets)
    with pytest.raises(ValueError, match="no noise multiplier"):
        pj.calibrate_noise_multiplier(1e-3, DELTA, 1.0, 10**4, sigma_max=2.0)


def test_calibration_at_a_tiny_delta_on_the_host_finds_a_finite_noise(monkeypatch):
    """Calibrated in NumPy on the host (a fresh process's first calls), delta 1e-12 after 10,000
    steps: every epsilon of the search finite, so a noise multiplier is found that meets the
    target and is tight (the host's add rows once read epsilon = inf there at every sigma, and
    the search refused with "no noise multiplier")."""
    accounting_on_the_host(monkeypatch)
    sigma = pj.calibrate_noise_multiplier(2.0, 1e-12, 0.01, 10_000)
    assert 1.0 < sigma < 10.0
    assert pj.dpsgd_epsilon(sigma, 0.01, 10_000, 1e-12) <= 2.0
    assert pj.dpsgd_epsilon(sigma * 0.999, 0.01, 10_000, 1e-12) > 2.0


@pytest.mark.slow
def test_calibrated_steps_and_sampling_prob():
    steps = pj.calibrate_steps(2.0, DELTA, 1.0, 0.05)
    eps = pj.dpsgd_epsilon(1.0, 0.05, [steps, steps + 1], DELTA)
    assert eps[0] <= 2.0 < eps[1]
    q = pj.calibrate_sampling_prob(2.0, DELTA, 1.0, 100)
    assert pj.dpsgd_epsilon(1.0, q, 100, DELTA) <= 2.0
    assert pj.dpsgd_epsilon(1.0, q * 1.001, 100, DELTA) > 2.0
    with pytest.raises(ValueError, match="sampling probability >= q_min"):
        pj.calibrate_sampling_prob(0.01, DELTA, 0.5, 10, q_min=0.1)
    with pytest.raises(ValueError, match="q_min"):
        pj.calibrate_sampling_prob(2.0, DELTA, 1.0, 100, q_min=0.0)
    # a search over [1, 1]: answered, or refused, without a search
    assert pj.calibrate_sampling_prob(1e3, DELTA, 1.0, 10, q_min=1.0) == 1.0
    with pytest.raises(ValueError, match="sampling probability >= q_min"):
        pj.calibrate_sampling_prob(0.01, DELTA, 1.0, 10, q_min=1.0)
    with pytest.raises(ValueError, match="one step already exceeds"):
        pj.calibrate_steps(0.01, DELTA, 0.5, 1.0)


@pytest.mark.slow
def test_calibrated_parameters_meet_their_targets_one_at_a_time():
    # searched in batches, checked as a caller evaluates one: at rtol 1e-12 a batch's epsilon an
    # ulp below a single call's returned a sigma whose own epsilon was 33.000000000007326
    targets = [0.3, 0.7, 1.3, 2.9, 5.5, 9.1, 17, 33]
    family = lambda s: pj.Event(pj.noise.Gaussian(s))  # noqa: E731
    sigmas = pj.calibrate_event(family, targets, 1e-6, steps=100, low=0.01, high=1e3,
                                increasing=False, rtol=1e-12)
    for sigma, target in zip(sigmas, targets, strict=True):
        assert pj.event_epsilon(family(sigma), 100, 1e-6) <= target


def _batch_below_alone(formula):
    """An epsilon evaluation whose batches read 1e-9 (relative) below the same configuration alone
    (a batch compiled with other round-off than a single call)."""
    exact = fake(formula)

    def epsilons(event, steps, delta):
        eps = exact(event, steps, delta)
        return eps * (1 - 1e-9) if eps.size > 1 else eps
    return epsilons


@pytest.mark.parametrize("rtol", [calibrate.MIN_RTOL, 1e-4])
def test_answers_of_a_batch_meet_their_targets_alone(monkeypatch, rtol):
    monkeypatch.setattr(calibrate, "event_epsilon", _batch_below_alone(lambda s, q, t: q * t / s))
    targets = np.array([1.0, 3.0, 7.0])
    sigmas = pj.calibrate_noise_multiplier(targets, DELTA, 0.5, 10, rtol=rtol)
    assert np.all(0.5 * 10 / sigmas <= targets)  # alone, as a caller evaluates each
    # and still tight: within rtol, or the 1e-9 the batches were off by
    assert np.all(0.5 * 10 / (sigmas / (1 + 2 * rtol + 1e-8)) > targets)
    qs = pj.calibrate_sampling_prob(targets / 10, DELTA, 2.0, 10, rtol=rtol)
    assert np.all(qs * 10 / 2.0 <= targets / 10)
    monkeypatch.setattr(calibrate, "event_epsilon", _batch_below_alone(lambda s, q, t: t / 100))
    steps = pj.calibrate_steps(np.array([0.5, 2.0, 7.77]), DELTA, 1.0, 1.0, max_steps=10**6)
    assert steps.tolist() == [50, 200, 777]


# -- optax ----------------------------------------------------------------------------------------


# -- any one-parameter family of events ----------------------------------------------------------
def test_calibrate_laplace_scale_against_its_closed_form():
    # one Laplace release: delta(eps) = 1 - exp((eps - 1/b) / 2), so epsilon(delta) = 1/b +
    # 2 log(1 - delta) <= target for b >= 1 / (target - 2 log(1 - delta))
    targets = np.array([0.5, 2.0])
    scales = pj.calibrate_event(lambda b: pj.Event(pj.noise.Laplace(b)), targets, DELTA, low=1e-2,
                          high=1e2, increasing=False)
    exact = 1 / (targets - 2 * np.log1p(-DELTA))
    assert np.all(scales >= exact) and np.all(scales <= exact * (1 + 1e-3))
    assert np.all(pj.event_epsilon(pj.Event(pj.noise.Laplace(scales)), 1, DELTA) <= targets)


@pytest.mark.slow
def test_calibrate_a_truncated_poisson_noise_multiplier():
    """A family whose PLD is built by its sampling (TruncatedPoisson, not one mechanism) was
    refused by the batched accounting under the calibration."""
    def family(sigma):
        return pj.Event(pj.noise.Gaussian(sigma), pj.sampling.TruncatedPoisson(0.05, 1000, 55),
                        "replace_special")

    sigma = pj.calibrate_event(family, 1.0, DELTA, steps=5, low=0.3, high=10.0, increasing=False,
                               rtol=1e-2)
    assert float(family(sigma).pld().self_compose(5).epsilon(DELTA)) <= 1.0
    assert float(family(sigma / 1.02).pld().self_compose(5).epsilon(DELTA)) > 1.0


def _family(q):
    return pj.Event(pj.noise.Laplace(1.0), pj.sampling.Poisson(q))


def test_calibrate_refuses_bad_families_before_evaluating():
    with pytest.raises(ValueError, match="make_event must return"):
        pj.calibrate_event(lambda x: x, 1.0, DELTA, low=0.1, high=1.0, increasing=True)
    with pytest.raises(ValueError, match="make_event must be a function"):
        pj.calibrate_event(_family(0.1), 1.0, DELTA, low=0.1, high=1.0, increasing=True)
    with pytest.raises(ValueError, match="high"):
        pj.calibrate_event(_family, 1.0, DELTA, low=1.0, high=1.0, increasing=True)
    with pytest.raises(ValueError, match="either event"):
        pj.calibrate_steps(1.0, DELTA, 1.0, 0.1, event=_family(0.1))


@pytest.mark.slow
def test_calibrate_increasing_family_and_steps_of_an_event():
    family = _family
    q = pj.calibrate_event(family, 1.0, DELTA, steps=20, low=1e-4, high=1.0, increasing=True,
                     rtol=1e-3)
    assert pj.event_epsilon(family(q), 20, DELTA) <= 1.0
    assert pj.event_epsilon(family(q * 1.002), 20, DELTA) > 1.0
    steps = pj.calibrate_steps(1.0, DELTA, event=family(q), max_steps=100)
    assert steps == 20 or pj.event_epsilon(family(q), steps + 1, DELTA) > 1.0
    with pytest.raises(ValueError, match="no parameter in \\[low, high\\]"):
        pj.calibrate_event(family, 1e-3, DELTA, steps=20, low=0.5, high=1.0, increasing=True)
