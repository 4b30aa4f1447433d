"""Monte Carlo accounting of b-min-sep sampling, against jax-privacy's own NumPy sampler and
privacy loss, against the PLDs of its two special cases (Poisson sampling at min_sep = 1,
balls-in-bins at sampling_prob = 1), and for its refusals."""

import itertools
import math
import warnings

import jax
import numpy as np
import pytest
from compiled_programs import accounting_on_the_host

import pldjax as pj
from pldjax.accounting import monte_carlo

#: Samples a direction: every check below allows for their sampling error.
SAMPLES = 1 << 16


def _mean_and_error(values):
    return float(np.mean(values)), float(np.std(values) / math.sqrt(len(values)))


def test_losses_agree_with_jax_privacys_sampler():
    from jax_privacy import batch_selection
    from jax_privacy.experimental.monte_carlo import sample_generation

    sigma, p, steps, min_sep = 1.0, 0.1, 40, 5
    with jax.enable_x64(True):
        remove, add = monte_carlo.draws(1 / sigma, p, steps, min_sep, True, SAMPLES, 7)
    # theirs is the loss of the direction sampled from: L under P, -L under Q
    for positive, mine, seed in ((True, remove, 1), (False, -add, 2)):
        theirs, _ = sample_generation.get_privacy_loss_sample(
            batch_selection.BMinSepSampling(p, steps, min_sep), sigma, np.array([1.0]),
            seed=seed, positive_sample=positive, num_samples=SAMPLES)
        for eps in (0.2, 0.5, 1.0):
            a, a_error = _mean_and_error(-np.expm1(np.minimum(eps - theirs, 0.0)))
            b, b_error = _mean_and_error(-np.expm1(np.minimum(eps - mine, 0.0)))
            assert abs(a - b) <= 5 * math.hypot(a_error, b_error)


def _enumerated_loss(y, mu, p, min_sep, warm_start):
    """log E_x[exp(mu <x, y> - mu^2 |x| / 2)] over every participation pattern x of b-min-sep
    sampling, each with its probability (Python floats, no recursion)."""
    cooldown, steps = min_sep - 1, len(y)
    stationary = 1.0 + cooldown * p
    starts = ([(0, 1.0 / stationary)] + [(c, p / stationary) for c in range(1, min_sep)]
              if warm_start else [(0, 1.0)])
    terms = []  # the log of each pattern's probability times its likelihood ratio
    for barred, weight in starts:  # barred: steps of cooldown left
        for pattern in itertools.product((0, 1), repeat=steps):
            probability, left = weight, barred
            for x in pattern:
                if left:
                    probability, left = probability * (1 - x), left - 1
                else:
                    probability *= p if x else 1 - p
                    left = cooldown if x else 0
            if probability > 0:
                terms.append(math.log(probability) + sum(
                    mu * yt - mu * mu / 2 for x, yt in zip(pattern, y, strict=True) if x))
    top = max(terms)
    return top + math.log(math.fsum(math.exp(t - top) for t in terms))


def _forward(mu, p, min_sep, steps, warm_start, rows, log_space):
    """(z, taken, losses, underflowed) of forward_losses on ``rows`` seeded rows of noise and
    participations."""
    cooldown = min_sep - 1
    block, group = monte_carlo.block_and_group(min_sep)
    padded = -(-steps // (block * group)) * block * group
    rng = np.random.default_rng(min_sep * 100 + steps)
    z = np.full((padded, rows), 40.0)  # past the last step: large, and never read
    z[:steps] = rng.normal(size=(steps, rows))
    taken = np.zeros((padded, rows), bool)
    taken[:steps] = rng.random((steps, rows)) < 0.3

    def draw(first, state, live):
        def rows_of(a):
            return jax.lax.dynamic_slice_in_dim(a, first * block, group * block).reshape(
                group, block, rows)
        return rows_of(z), rows_of(taken), state

    stationary = 1.0 + cooldown * p
    with jax.enable_x64(True):
        log_eligible = -math.log(stationary) if warm_start else 0.0
        log_cooling = (math.log(p / stationary) if p > 0 else -math.inf) if warm_start else -math.inf
        losses, underflowed = monte_carlo.forward_losses(
            draw, 0.0, mu, p, steps, log_eligible, log_cooling, size=rows, min_sep=min_sep,
            log_space=log_space)
    return z, taken, np.asarray(losses), bool(underflowed)


@pytest.mark.parametrize("log_space", [False, True])
@pytest.mark.parametrize(("min_sep", "steps", "p", "warm_start"), [
    (3, 7, 0.3, True), (3, 7, 0.3, False), (4, 7, 0.6, True), (1, 5, 0.3, True),
    (3, 6, 1.0, False), (5, 3, 0.2, True), (2, 6, 0.0, True), (2, 11, 0.4, False),
])
def test_the_forward_recursion_is_the_sum_over_participation_patterns(min_sep, steps, p,
                                                                       warm_start, log_space):
    mu, rows = 1.3, 4
    z, taken, losses, underflowed = _forward(mu, p, min_sep, steps, warm_start, rows, log_space)
    assert not underflowed
    for r in range(rows):
        under_p = z[:steps, r] + mu * taken[:steps, r]
        for row, y in ((0, under_p), (1, z[:steps, r])):
            assert losses[row, r] == pytest.approx(
                _enumerated_loss(y, mu, p, min_sep, warm_start), rel=1e-12, abs=1e-12)


def test_weights_too_small_for_the_linear_recursion_are_flagged_and_held_in_log_space():
    # mu = 40 with certain participation: each block multiplies the weights by about e^-800
    mu, p, min_sep, steps, rows = 40.0, 1.0, 3, 8, 4
    assert _forward(mu, p, min_sep, steps, True, rows, log_space=False)[3]
    z, taken, losses, underflowed = _forward(mu, p, min_sep, steps, True, rows, log_space=True)
    assert not underflowed
    for r in range(rows):
        under_p = z[:steps, r] + mu * taken[:steps, r]
        for row, y in ((0, under_p), (1, z[:steps, r])):
            assert losses[row, r] == pytest.approx(
                _enumerated_loss(y, mu, p, min_sep, True), rel=1e-12)
    # the sampler draws such a chunk again in log space: every loss finite
    with jax.enable_x64(True):
        drawn = monte_carlo.draws(mu, p, steps, min_sep, True, 64, 0)
    assert np.all(np.isfinite(drawn)) and np.all(drawn[1] < -500)


def test_chunks_drawn_at_once_are_the_chunks_drawn_one_after_another(x64_off, monkeypatch):
    # (the min_sep of the jax-privacy comparison: its compiled program; steps are data)
    arguments = (1.0, 0.1, 8, 5, True, SAMPLES + 3, 7)
    with warnings.catch_warnings():  # a float32 truncation warned of in a worker is an error
        warnings.simplefilter("error")
        at_once = monte_carlo.draws(*arguments)
    monkeypatch.setattr(monte_carlo, "CHUNK_WORKERS", 1)
    with jax.enable_x64(True):
        one_after_another = monte_carlo.draws(*arguments)
    assert at_once.dtype == np.float64 and at_once.shape == (2, SAMPLES + 3)
    np.testing.assert_array_equal(at_once, one_after_another)


def test_one_step_separation_is_poisson_sampling(monkeypatch):
    sigma, p, steps, eps = 1.0, 0.2, 30, 0.5
    result = pj.monte_carlo_delta(sigma, p, steps, 1, eps, samples=SAMPLES)
    accounting_on_the_host(monkeypatch)  # the reference PLDs (their kernels compile elsewhere)
    lower = pj.dpsgd_delta(sigma, p, steps, eps, pessimistic=False)
    upper = pj.dpsgd_delta(sigma, p, steps, eps)
    assert result.delta >= lower
    assert result.estimate <= result.delta
    assert abs(result.estimate - upper) <= 5 * math.sqrt(upper / SAMPLES)
    assert result.failure_probability == 1e-3 and result.samples == SAMPLES


@pytest.mark.slow
def test_certain_sampling_is_balls_in_bins():
    sigma, bins = 2.0, 8
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(bins))
    upper, lower = event.pld(), event.pld(pessimistic=False)
    for eps in (0.1, 0.3):
        result = pj.monte_carlo_delta(sigma, 1.0, bins, bins, eps, samples=SAMPLES, key=int(10 * eps))
        truth_low, truth_high = float(lower.delta(eps)), float(upper.delta(eps))
        assert result.delta >= truth_low
        assert truth_low - 5 * math.sqrt(truth_high / SAMPLES) <= result.estimate
        assert result.estimate <= truth_high + 5 * math.sqrt(truth_high / SAMPLES)


def test_epsilon_is_where_the_delta_bound_meets_the_target():
    args = (1.0, 0.1, 20, 5)
    found = pj.monte_carlo_epsilon(*args, 1e-2, samples=SAMPLES)
    assert 0 < found.epsilon < math.inf and found.delta == 1e-2
    assert pj.monte_carlo_delta(*args, found.epsilon * 1.001, samples=SAMPLES).delta <= 1e-2
    assert pj.monte_carlo_delta(*args, found.epsilon * 0.99, samples=SAMPLES).delta > 1e-2
    # a delta below what the samples can vouch for (about log(2 / failure) / samples)
    assert pj.monte_carlo_epsilon(*args, 1e-6, samples=SAMPLES).epsilon == math.inf


@pytest.mark.parametrize(("arguments", "named"), [
    ((0.0, 0.1, 10, 2, 1.0), "noise_multiplier"),
    ((1e-300, 0.1, 10, 2, 1.0), "noise_multiplier must be at least 1e-100"),
    ((1.0, 1.5, 10, 2, 1.0), "sampling_prob"),
    ((1.0, 0.1, 0, 2, 1.0), "steps"),
    ((1.0, 0.1, 10, 0, 1.0), "min_sep"),
    ((1.0, 0.1, 10, 2, -1.0), "epsilon"),
    ((1.0, 0.1, 10, 10**6, 1.0), "min_sep"),
    ((1.0, 0.1, 10**9, 2, 1.0), "samples"),
    ((np.array([1.0, 2.0]), 0.1, 10, 2, 1.0), "noise_multiplier must be a single number"),
    ((1.0, np.array([0.1, 0.2]), 10, 2, 1.0), "sampling_prob must be a single number"),
    ((1.0, 0.1, 10, 2, np.array([1.0, 2.0])), "epsilon must be a single number"),
])
def test_bad_arguments_are_refused_by_name(arguments, named):
    with pytest.raises(ValueError, match=named):
        pj.monte_carlo_delta(*arguments)
    # (5e-324 halved to 0 for each direction's bound: ZeroDivisionError)
    for failure in (0.0, 5e-324, np.array([0.1, 0.2])):
        with pytest.raises(ValueError, match="failure_probability"):
            pj.monte_carlo_delta(1.0, 0.1, 10, 2, 1.0, failure_probability=failure)
    with pytest.raises(ValueError, match="delta"):
        pj.monte_carlo_epsilon(1.0, 0.1, 10, 2, 0.0)


def test_the_work_guard_counts_the_whole_chunks_drawn():
    """64 samples are drawn as one chunk of chunk_size: over 10^8 steps that is 2 x 10^11
    sample-steps (it took 210 s at 10^6 steps), past MAX_WORK, though 64 x 10^8 is not."""
    from pldjax.accounting.monte_carlo import MAX_WORK, chunk_size

    steps = 10**8
    assert 64 * steps <= MAX_WORK < chunk_size(2) * steps
    with pytest.raises(ValueError, match="samples drawn times steps"):
        pj.monte_carlo_delta(1.0, 0.01, steps, 2, 1.0, samples=64)


@pytest.mark.parametrize("key", [1.5, True, "a", 2**63, -(2**63) - 1, "jax key"])
def test_a_key_that_is_no_64_bit_integer_is_refused_by_name(key):
    key = jax.random.key(0) if key == "jax key" else key
    with pytest.raises(ValueError, match=r"key must be an integer seed in \[-2\^63, 2\^63\)"):
        pj.monte_carlo_delta(1.0, 0.1, 10, 2, 1.0, key=key)


@pytest.mark.parametrize("min_sep", [1, 2, 20, 256, 257, 1000, monte_carlo.MAX_MIN_SEP])
@pytest.mark.parametrize(("accelerator", "most", "budget"), [
    (False, monte_carlo.CHUNK, 2**28), (True, monte_carlo.ACCELERATOR_CHUNK, 2**30)])
def test_a_calls_cooldown_buffer_stays_under_256_mib_on_a_cpu_and_1_gib_elsewhere(
        min_sep, accelerator, most, budget):
    size = monte_carlo.chunk_size(min_sep, accelerator)
    assert (min_sep - 1) * 2 * size * 8 < budget
    assert size == most or (min_sep - 1) * 2 * (2 * size) * 8 >= budget  # no smaller than need be


@pytest.mark.parametrize("warm_start", ["False", None, 0, np.array([True])])
def test_a_warm_start_that_is_no_bool_is_refused(warm_start):
    """A string "False" is truthy: read as a bool it would give the warm start's lower delta
    where the cold start was meant."""
    with pytest.raises(ValueError, match="warm_start must be True or False"):
        pj.monte_carlo_epsilon(1.0, 0.1, 10, 2, 1e-3, samples=1000, warm_start=warm_start)


def test_inside_jit_the_sampler_refuses_by_name():
    with pytest.raises(ValueError, match="monte_carlo_epsilon reads noise_multiplier on the host"):
        jax.jit(lambda s: pj.monte_carlo_epsilon(s, 0.1, 10, 2, 1e-3, samples=1000).epsilon)(1.0)
