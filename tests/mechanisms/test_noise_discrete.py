"""Integer-noise mechanisms: discrete Laplace and discrete Gaussian."""

import logging

import numpy as np
import pytest
from compiled_programs import programs_of_a_new_process
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


def test_a_discrete_gaussian_is_built_in_numpy_alone_and_compiled_in_a_large_batch(tmp_path):
    """One discrete Gaussian (either estimate, subsampled too) is built in NumPy, as the other
    noises are: a new process compiles no program. A batch of more rows than the host takes
    runs the compiled kernels; both are sound against the explicit sums, and the pessimistic
    PLDs exact on their grids."""
    names, printed = programs_of_a_new_process("""
        import pldjax as pj
        for pessimistic in (True, False):
            print(float(pj.discrete_gaussian(3.0, pessimistic=pessimistic).epsilon(1e-6)))
            print(float(pj.discrete_gaussian(2.0, sampling_prob=0.01,
                                             pessimistic=pessimistic).epsilon(1e-6)))
    """, cache=tmp_path / "xla")  # empty: every program compiles
    assert names == []
    assert [float(line) for line in printed.splitlines()[-4:]] == [
        float(pld.epsilon(1e-6)) for p in (True, False)
        for pld in (pj.discrete_gaussian(3.0, pessimistic=p),
                    pj.discrete_gaussian(2.0, sampling_prob=0.01, pessimistic=p))]
    sigmas = np.linspace(1.0, 3.0, 17)
    want = np.stack([_exact_delta(*_dgauss(sigma, 1), EPS) for sigma in sigmas])
    for pessimistic in (True, False):
        lone = np.stack([np.asarray(pj.discrete_gaussian(sigma, pessimistic=pessimistic).delta(EPS))
                         for sigma in sigmas[::4]])
        batch = pj.discrete_gaussian(sigmas, pessimistic=pessimistic)
        batched = np.stack([np.asarray(batch.delta(eps)) for eps in EPS], axis=1)
        for got, exact in ((lone, want[::4]), (batched, want)):
            if pessimistic:
                assert np.all(got >= exact * (1 - 1e-12) - 1e-15)
                np.testing.assert_allclose(got, exact, rtol=1e-9, atol=1e-14)
            else:
                assert np.all(got <= exact * (1 + 1e-12) + 1e-15)


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


@pytest.mark.slow
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


def _mixture_pair(log_a, log_b, q):
    """(remove, add) pairs of Poisson subsampling with probability q, from unnormalized logs."""
    a = np.exp(log_a - np.logaddexp.reduce(log_a))
    b = np.exp(log_b - np.logaddexp.reduce(log_b))
    mix = (1 - q) * b + q * a
    return (mix, b), (b, mix)


def _hockey(p, q, eps):
    return np.array([np.sum(np.maximum(p - np.exp(e) * q, 0.0)) for e in eps])


@pytest.mark.parametrize("make,exact,args", [
    (pj.discrete_laplace, _dlap, (2.0, 1, 0.1)),
    (pj.discrete_gaussian, _dgauss, (2.0, 1, 0.1)),
])
def test_subsampled_single_step_against_explicit_mixtures(make, exact, args):
    """Both directions of one Poisson-subsampled step against sums over the integers (NumPy)."""
    scale, shift, q = args
    (rp, rq), (ap, aq) = _mixture_pair(*exact(scale, shift), q)
    eps = np.array([0.0, 0.01, 0.05, 0.1, 0.2])
    want = np.maximum(_hockey(rp, rq, eps), _hockey(ap, aq, eps))
    up = make(scale, sensitivity=shift, sampling_prob=q)
    assert not up.symmetric
    got = np.asarray(up.delta(eps))
    assert np.all(got >= want * (1 - 1e-12) - 1e-15)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-15)
    for direction in up.directions():  # mass is never lost
        assert float(direction.total_mass()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("make,exact,scale", [
    (pj.discrete_laplace, _dlap, 1.5),
    (pj.discrete_gaussian, _dgauss, 1.5),
])
def test_replace_one_doubles_the_shift(make, exact, scale):
    want = _exact_delta(*exact(scale, 2), EPS)
    got = make(scale, neighboring="replace_one").delta(EPS)
    assert np.all(got >= want * (1 - 1e-12) - 1e-15)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-14)
    with pytest.raises(ValueError, match="replace_one"):
        make(scale, sampling_prob=0.1, neighboring="replace_one")


def test_sensitivity_array_wider_than_scale():
    sens = np.array([1, 3])
    for make, exact in [(pj.discrete_laplace, _dlap), (pj.discrete_gaussian, _dgauss)]:
        batch = make(2.0, sensitivity=sens)
        assert batch.batch_shape == (2,)
        for i, d in enumerate(sens):
            want = _exact_delta(*exact(2.0, int(d)), [0.3])[0]
            assert float(batch[i].delta(0.3)) == pytest.approx(want, rel=1e-6)


def test_jit_traced_parameters(x64_off):
    import jax

    fixed = pj.Grid(step=2.0**-8, size=4096)
    # a float32 scale traced under jit: 1 / scale must still be taken in float64
    jitted = jax.jit(lambda s, d: pj.discrete_laplace(s, sensitivity=d, grid=fixed).delta(0.5))
    eager = pj.discrete_laplace(np.float32(0.7), sensitivity=2, grid=fixed).delta(0.5)
    assert float(jitted(np.float32(0.7), np.float32(2.0))) == pytest.approx(float(eager), rel=1e-12)
    with pytest.raises(ValueError, match="concrete"):
        jax.jit(lambda s: pj.discrete_gaussian(s).delta(0.5))(2.0)


def test_discrete_laplace_chi2_closed_form():
    """chi^2(P || Q) (Poisson subsampling's step heuristic) against an mpmath sum, small t included."""
    import jax
    import jax.numpy as jnp
    import mpmath as mp

    from pldjax.mechanisms.noise import DISCRETE_LAPLACE

    mp.mp.dps = 50
    for t, d in [(1e-8, 1), (1e-7, 1), (1e-3, 3), (0.5, 1), (2.0, 4), (30.0, 2)]:
        tm = mp.mpf(t)
        total = mp.tanh(tm / 2) * (
            (mp.e ** (tm * d) + mp.e ** (-2 * tm * d)) / -mp.expm1(-tm)
            + mp.e ** (tm * d) * mp.fsum(mp.e ** (-3 * tm * k) for k in range(1, d))
        )
        with jax.enable_x64(True):
            got = float(DISCRETE_LAPLACE.chi2((jnp.float64(t), jnp.float64(d))))
        assert got == pytest.approx(float(total - 1), rel=1e-6, abs=0.0)


def test_discrete_gaussian_truncation_below_float64():
    """The support reaches 40 sigma (+ 2 sensitivities) either side: the mass it leaves out, bounded
    by a geometric series, is below float64's smallest positive number (so adding it to P(L > eps)
    as an atom would change nothing)."""
    import mpmath as mp

    from pldjax.mechanisms.noise import DGAUSS_SIGMAS

    mp.mp.dps = 30
    for sigma in [0.01, 0.3, 1.0, 7.0, 1000.0, 50000.0]:
        s = mp.mpf(sigma)
        a = mp.ceil(DGAUSS_SIGMAS * s)  # first integer left out on either side (or beyond)
        # sum_{k >= a} e^{-k^2/(2 s^2)} <= e^{-a^2/(2 s^2)} / (1 - e^{-a/s^2}); normalizer >= 1
        outside = 2 * mp.e ** (-(a**2) / (2 * s**2)) / -mp.expm1(-a / s**2)
        assert outside < mp.mpf(2) ** -1075


def test_tiny_noise_gives_no_nan():
    """The excess curve e^eps Q - P is formed without 0 * inf when P(L <= eps) underflows."""
    assert np.all(np.isfinite(pj.discrete_laplace(0.001).delta(np.array([0.0, 500.0]))))
    assert np.all(np.isfinite(pj.discrete_laplace(0.001, sampling_prob=0.5).delta(np.array([0.0, 1.0]))))
    assert np.all(np.isfinite(pj.laplace(0.0005).delta(np.array([0.0, 100.0]))))


def test_subsampled_losses_beyond_709_nats_are_kept():
    """An atom of mass 0.005 at log(0.99 + 0.01 e^769.2) = 764.6: epsilon(1e-6) must reach it."""
    assert pj.laplace(0.0013, sampling_prob=0.01).epsilon(1e-6) >= 764.6


@pytest.mark.parametrize("call,match", [
    (lambda: pj.discrete_laplace(float("nan")), "scale"),
    (lambda: pj.discrete_laplace(-1.0), "scale"),
    (lambda: pj.discrete_laplace(1.0, sensitivity=float("nan")), "sensitivity"),
    (lambda: pj.discrete_gaussian(0.0), "sigma"),
    (lambda: pj.discrete_gaussian(1.0, sensitivity=2.5), "sensitivity"),
    (lambda: pj.discrete_gaussian(1.0, sampling_prob=1.5), "sampling_prob"),
    (lambda: pj.discrete_laplace(1.0, neighboring="swap"), "neighboring"),
    (lambda: pj.discrete_gaussian(1e7), "sigma"),
    # beyond float64's range the support was an OverflowError, and below it a 300-digit number
    (lambda: pj.discrete_gaussian(1e308), r"sigma=1e\+308.*about inf integers"),
    (lambda: pj.discrete_gaussian(1e300), r"about 8e\+301 integers"),
    (lambda: pj.discrete_gaussian(1.0, sensitivity=1e308), "sensitivity=1e\\+308"),
])
def test_more_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_masses_from_curve_with_a_huge_step():
    """A step beyond 709 nats (e^h overflows) still gives masses that add up, never NaN."""
    import jax.numpy as jnp

    from pldjax.kernels.discretize import masses_from_curve

    curve = jnp.array([1.0, 0.5, 0.25, 0.0])
    probs, inf_mass = masses_from_curve(curve, 1024.0)
    assert np.all(np.isfinite(probs)) and float(inf_mass) == 0.0
    assert float(jnp.sum(probs)) == pytest.approx(1.0)
    np.testing.assert_allclose(np.asarray(probs), [0.0, 0.5, 0.25, 0.25], atol=1e-15)


def test_optimistic_window_far_below_the_loss_keeps_its_mass():
    """An optimistic window wholly below the loss (x = e^z underflows): the mass goes to the top
    of the window (a lower bound), none is lost."""
    import jax
    import jax.numpy as jnp

    from pldjax.kernels.discretize import discretize
    from pldjax.mechanisms import noise

    probs, inf_mass = jax.jit(lambda: discretize(
        lambda e: noise.GAUSSIAN.tails((jnp.array(1.0),), e), -4000, 0.5, 256, False))()
    assert float(jnp.sum(probs)) == pytest.approx(1.0) and float(inf_mass) == 0.0
    assert float(probs[-1]) == pytest.approx(1.0)


@pytest.mark.parametrize("scale", [0.01, pytest.param(0.1, marks=pytest.mark.slow)])
def test_optimistic_small_noise_is_finite_and_below_pessimistic(scale):
    """The exact lattice grid is too wide for the optimistic construction here: the automatic grid."""
    for make in (pj.discrete_gaussian, pj.discrete_laplace):
        lower = make(scale, pessimistic=False).delta(EPS)
        upper = make(scale).delta(EPS)
        assert np.all(np.isfinite(lower)) and np.all(lower <= upper + 1e-12)


@pytest.mark.parametrize("pessimistic", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_discrete_noise_at_vanishing_scale(pessimistic):
    # found by the long property profile: lattice steps of 1e300 nats and sigma^2 underflow
    pld = pj.discrete_laplace(1e-300, pessimistic=pessimistic)
    assert not np.any(np.isnan(pld.delta(np.array([0.0, 1.0]))))
    if pessimistic:
        assert np.all(pld.delta(np.array([0.0, 1.0])) == 1.0)  # the exact delta is 1 - ~0
    with pytest.raises(ValueError, match="sigma"):
        pj.discrete_gaussian(1e-160, pessimistic=pessimistic)
