"""Shuffled batches (pj.shuffling_lower_bound), a lower bound: the Gaussian mechanism it is with
one batch (closed form), the Gaussian of one use an epoch above it, a Monte Carlo of the whole
output above each direction, and Chua et al.'s single-threshold tests (mpmath) below it."""

import math
import warnings

import jax
import mpmath as mp
import numpy as np
import pytest
from reference import gaussian_delta

import pldjax as pj

EPSILONS = [0.0, 0.5, 1.0, 2.0, 4.0]
#: How far the record's batch moves under each relation (clip norm 1).
SHIFT = {"replace_one": 2.0, "replace_special": 1.0}


@pytest.mark.parametrize("neighboring", [pytest.param("replace_one", marks=pytest.mark.slow),
                                         "replace_special"])
def test_one_batch_is_the_gaussian_mechanism_from_below(neighboring):
    sigma, epochs = 1.3, 3
    bound = pj.shuffling_lower_bound(sigma, 1, epochs, neighboring=neighboring)
    assert not bound.pessimistic
    mu = SHIFT[neighboring] * math.sqrt(epochs) / sigma
    truth = np.array([gaussian_delta(mu, eps) for eps in EPSILONS])
    got = np.asarray(bound.delta(EPSILONS))
    assert np.all(got <= truth)
    np.testing.assert_allclose(got, truth, atol=1e-3)


def test_never_above_one_gaussian_use_an_epoch():
    # an epoch's output is a post-processing of the Gaussian mechanism run once on the record
    sigma, batches, epochs = 0.9, 1000, 4
    bound = pj.shuffling_lower_bound(sigma, batches, epochs)
    mu = 2.0 * math.sqrt(epochs) / sigma
    assert np.all(np.asarray(bound.delta(EPSILONS)) <= [gaussian_delta(mu, e) for e in EPSILONS])
    assert float(bound.epsilon(1e-5)) > 0


def test_each_direction_below_a_monte_carlo_of_the_whole_output():
    sigma, batches, shift = 1.0, 4, SHIFT["replace_one"]
    y = np.random.default_rng(0).normal(0.0, sigma, size=(1_000_000, batches))  # under Q
    # log dP/dQ(y) = log of the mean over t of exp((shift y_t - shift^2 / 2) / sigma^2)
    log_ratio = (np.logaddexp.reduce((shift * y - shift**2 / 2) / sigma**2, axis=1)
                 - math.log(batches))
    bound = pj.shuffling_lower_bound(sigma, batches)
    for eps in (0.5, 1.0, 2.0):
        # H(P || Q) = E_Q[(dP/dQ - e^eps)_+] and H(Q || P) = E_Q[(1 - e^eps dP/dQ)_+]
        for direction, samples in (
            (bound.forward, np.maximum(np.exp(log_ratio) - math.exp(eps), 0.0)),
            (bound.backward, np.maximum(1.0 - np.exp(eps + log_ratio), 0.0)),
        ):
            error = samples.std() / math.sqrt(samples.size)
            assert float(direction.delta(eps)) <= samples.mean() + 5 * error


def test_at_least_the_best_single_threshold_test():
    # Chua et al.'s test: is the largest coordinate above tau? Its delta in mpmath
    mp.mp.dps = 40
    sigma, batches, shift = 1.0, 100, SHIFT["replace_one"]
    bound = pj.shuffling_lower_bound(sigma, batches)

    def above(tau):  # P(M > tau), Q(M > tau)
        rest = mp.ncdf(tau / sigma) ** (batches - 1)
        return 1 - mp.ncdf((tau - shift) / sigma) * rest, 1 - mp.ncdf(tau / sigma) * rest

    for eps in (1.0, 3.0):
        best = max(p - mp.e**eps * q for p, q in map(above, mp.linspace(0, 8, 321)))
        assert float(bound.forward.delta(eps)) >= float(best) * (1 - 3e-3)


@pytest.mark.slow
def test_shuffled_training_can_be_far_less_private_than_its_poisson_accounting():
    # Chua et al.'s finding: sigma 1, 1,000 batches, one epoch
    shuffled = float(pj.shuffling_lower_bound(1.0, 1000).epsilon(1e-5))
    poisson = float(pj.dpsgd_epsilon(1.0, 1e-3, 1000, 1e-5, neighboring="replace_one"))
    assert shuffled > 5 * poisson


@pytest.mark.parametrize("kwargs, name", [
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=math.nan), "noise_multiplier"),
    (dict(noise_multiplier=math.inf), "noise_multiplier"),
    (dict(noise_multiplier=1e-200), "noise_multiplier must be at least 1e-100"),
    (dict(steps_per_epoch=0), "steps_per_epoch"),
    (dict(steps_per_epoch=2.5), "steps_per_epoch"),
    (dict(epochs=0), "epochs"),
    (dict(neighboring="add_remove"), "neighboring"),
    (dict(neighboring="sideways"), "neighboring"),
    (dict(noise_multiplier=np.array([1.0, 2.0])), "noise_multiplier must be a single number"),
])
def test_bad_arguments_are_refused_by_name(kwargs, name):
    arguments = dict(noise_multiplier=1.0, steps_per_epoch=10, epochs=1) | kwargs
    with pytest.raises(ValueError, match=name):
        pj.shuffling_lower_bound(**arguments)


def test_extremes_give_a_sound_bound_or_a_clear_refusal_whatever_the_x64_setting(x64_off):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny = pj.shuffling_lower_bound(1e-6, 10)
        assert float(tiny.epsilon(1e-5)) > 1e6  # the truth: about 2 / sigma^2 = 2e12
        huge = pj.shuffling_lower_bound(1e17, 10)
        assert float(huge.delta(0.0)) == 0.0 and float(huge.epsilon(1e-9)) == 0.0
        with pytest.raises(ValueError, match="epochs = 1000000000"):
            pj.shuffling_lower_bound(1.0, 10, 10**9)
    off = float(pj.shuffling_lower_bound(1.0, 1000, 2).epsilon(1e-5))
    jax.config.update("jax_enable_x64", True)
    assert off == float(pj.shuffling_lower_bound(1.0, 1000, 2).epsilon(1e-5))


def test_inside_jit_the_lower_bound_refuses_by_name():
    with pytest.raises(ValueError, match="shuffling_lower_bound reads noise_multiplier on the host"):
        jax.jit(lambda s: pj.shuffling_lower_bound(s, 10).epsilon(1e-5))(1.0)
