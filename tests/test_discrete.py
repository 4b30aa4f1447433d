"""Integer-noise mechanisms: discrete Laplace and discrete Gaussian."""

import logging

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pldlib

import pldjax as pj

EPS = np.array([0.0, 0.3, 1.0, 2.0, 4.0])


def _exact_delta(log_p, log_q, eps):
    """sum_k max(P(k) - e^eps Q(k), 0) over an explicit integer support (NumPy)."""
    p, q = np.exp(log_p - np.logaddexp.reduce(log_p)), np.exp(log_q - np.logaddexp.reduce(log_q))
    return np.array([np.sum(np.maximum(p - np.exp(e) * q, 0.0)) for e in eps])


def _dlap(scale, shift):
    ks = np.arange(-2000, 2001)
    return -np.abs(ks) / scale, -np.abs(ks - shift) / scale


def _dgauss(sigma, shift):
    ks = np.arange(-4000, 4001)
    return -(ks**2) / (2 * sigma**2), -((ks - shift) ** 2) / (2 * sigma**2)


@pytest.mark.parametrize("make,exact,args", [
    (pj.discrete_laplace, _dlap, (2.0, 1)),
    (pj.discrete_laplace, _dlap, (0.7, 3)),
    (pj.discrete_gaussian, _dgauss, (3.0, 1)),
    (pj.discrete_gaussian, _dgauss, (1.0, 2)),
])
def test_single_profile_against_explicit_sums(make, exact, args):
    scale, shift = args
    want = _exact_delta(*exact(scale, shift), EPS)
    up = make(scale, sensitivity=shift).delta(EPS)
    lo = make(scale, sensitivity=shift, pessimistic=False).delta(EPS)
    # round-off of the mass differences: 1e-12 relative, as for the continuous mechanisms
    assert np.all(up >= want * (1 - 1e-12) - 1e-15)
    assert np.all(lo <= want * (1 + 1e-12) + 1e-15)
    # every loss sits on the automatic grid: the pessimistic PLD is exact
    np.testing.assert_allclose(up, want, rtol=1e-9, atol=1e-14)


def _peer(factory, count, pessimistic):
    logging.disable(logging.WARNING)
    try:
        pld = factory(value_discretization_interval=1e-4, pessimistic_estimate=pessimistic)
        return pld.self_compose(count).get_epsilon_for_delta(1e-6)
    finally:
        logging.disable(logging.NOTSET)


def _exact_dlap_epsilon(scale, shift, count, delta):
    """Exact epsilon of count-fold discrete Laplace: its losses are t j, j in [-D, D] (NumPy)."""
    t = 1 / scale
    log_p, _ = _dlap(scale, shift)
    ks = np.arange(-2000, 2001)
    p = np.exp(log_p - np.logaddexp.reduce(log_p))
    steps = np.abs(ks - shift) - np.abs(ks)
    masses = np.array([p[steps == j].sum() for j in range(-shift, shift + 1)])
    dist = np.array([1.0])
    for _ in range(count):
        dist = np.convolve(dist, masses)
    z = (np.arange(dist.size) - shift * count) * t

    def delta_at(e):
        above = z > e
        return np.sum(dist[above] * -np.expm1(e - z[above]))

    low, high = 0.0, float(z[-1])
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if delta_at(mid) > delta else (low, mid)
    return high


@pytest.mark.parametrize("count", [20, 200])
def test_composition_exact_and_against_dp_accounting(count):
    laplace = pj.discrete_laplace(0.7, sensitivity=3).self_compose(count).epsilon(1e-6)
    exact = _exact_dlap_epsilon(0.7, 3, count, 1e-6)
    assert exact * (1 - 1e-9) <= laplace <= exact * (1 + 1e-6)
    factory = lambda **kw: pldlib.from_discrete_laplace_mechanism(1 / 0.7, sensitivity=3, **kw)  # noqa: E731
    assert laplace <= _peer(factory, count, True) * 1.001
    # (dp-accounting's optimistic estimate is above the exact value here at count = 200)
    gauss = pj.discrete_gaussian(3.0).self_compose(count).epsilon(1e-6)
    factory = lambda **kw: pldlib.from_discrete_gaussian_mechanism(3.0, **kw)  # noqa: E731
    assert _peer(factory, count, False) * (1 - 1e-9) <= gauss <= _peer(factory, count, True) * 1.001


def test_subsampled_discrete_mechanisms_against_dp_accounting():
    for ours, factory in [
        (pj.discrete_laplace(2.0, sampling_prob=0.1),
         lambda **kw: pldlib.from_discrete_laplace_mechanism(0.5, sampling_prob=0.1, **kw)),
        (pj.discrete_gaussian(2.0, sampling_prob=0.1),
         lambda **kw: pldlib.from_discrete_gaussian_mechanism(2.0, sampling_prob=0.1, **kw)),
    ]:
        assert not ours.symmetric
        eps = ours.self_compose(100).epsilon(1e-6)
        assert _peer(factory, 100, False) <= eps <= _peer(factory, 100, True) * 1.001


@pytest.mark.parametrize("call,match", [
    (lambda: pj.discrete_laplace(0.0), "scale"),
    (lambda: pj.discrete_laplace(1.0, sensitivity=1.5), "sensitivity"),
    (lambda: pj.discrete_gaussian(float("nan")), "sigma"),
    (lambda: pj.discrete_gaussian(1.0, sensitivity=0), "sensitivity"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
