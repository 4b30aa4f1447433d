import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import brute_force_delta

import pldjax as pj
from pldjax.core.pld import unchecked_pld
from pldjax.kernels.hockey_stick import tail_sums


def _random_pld(seed: int, n: int, inf_mass: float) -> pj.PLD:
    rng = np.random.default_rng(seed)
    probs = rng.exponential(size=n) * (rng.random(n) < 0.6)
    probs[rng.integers(n)] += 0.1  # never all zero
    probs = probs / probs.sum() * (1 - inf_mass)
    offset = int(rng.integers(-n, n // 2))
    step = float(rng.choice([0.01, 0.1, 0.37]))
    # any PMF on the grid, not only a privacy loss's (whose Q mass sum p e^-z is at most 1): the
    # kernels' arithmetic against brute force
    return unchecked_pld(jnp.asarray(probs), jnp.asarray(inf_mass), jnp.asarray(offset),
                         jnp.asarray(step))


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 40),
    inf_mass=st.sampled_from([0.0, 1e-9, 0.01]),
    eps=st.floats(0.0, 5.0),
)
def test_delta_matches_brute_force(seed, n, inf_mass, eps):
    pld = _random_pld(seed, n, inf_mass)
    want = brute_force_delta(np.asarray(pld.losses), np.asarray(pld.probs), inf_mass, eps)
    assert float(pld.delta(eps)) == pytest.approx(want, rel=1e-10, abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 40),
    target=st.floats(1e-12, 0.5),
)
def test_epsilon_inverts_delta(seed, n, target):
    pld = _random_pld(seed, n, 0.0)
    eps = float(pld.epsilon(target))
    assert float(pld.delta(eps)) <= target * (1 + 1e-9) + 1e-15
    if eps > 1e-9:  # smallest such epsilon: a little less violates the target
        assert float(pld.delta(eps * (1 - 1e-6) - 1e-9)) > target * (1 - 1e-9)


def test_epsilon_is_infinite_when_the_atom_exceeds_delta():
    p = pj.randomized_response(1.0, 1e-3)
    assert np.isinf(p.epsilon(1e-4))
    assert np.isfinite(p.epsilon(2e-3))


def test_epsilon_at_a_grid_point_is_never_below_the_loss_it_stands_for():
    # pure DP: epsilon(0) is the largest loss, 1000 * 1e20 = 1e23, which rounds to a float64 below
    # it; a pessimistic epsilon must be the float above (the true delta at the float below is 1)
    mpmath = pytest.importorskip("mpmath")
    for eps0, count in ((1e20, 1000), (0.1, 3), (1.0, 7)):
        got = pj.approx_dp_composition(eps0, 0.0, count).epsilon(0.0)
        with mpmath.workdps(60):
            assert mpmath.mpf(float(got)) >= count * mpmath.mpf(eps0)
            assert mpmath.mpf(float(np.nextafter(got, 0.0))) < count * mpmath.mpf(eps0)


def test_epsilon_inside_a_grid_interval_brackets_the_exact_value():
    """Randomized response R_{eps0}: epsilon(delta) = eps0 + log(1 - delta / p), p = e^eps0 /
    (1 + e^eps0), is a small difference of logarithms near the crossing; the pessimistic reading
    was 27 ulps below it (the logarithms' round-off), the optimistic one must not be above."""
    mpmath = pytest.importorskip("mpmath")
    for eps0, delta in ((0.01, 1e-8), (1e-4, 1e-12), (0.5, 1e-3), (3.0, 1e-10)):
        with mpmath.workdps(50):
            p = mpmath.e ** mpmath.mpf(eps0) / (1 + mpmath.e ** mpmath.mpf(eps0))
            exact = mpmath.mpf(eps0) + mpmath.log(1 - mpmath.mpf(delta) / p)
            upper = pj.randomized_response(eps0).epsilon(delta)
            lower = pj.randomized_response(eps0, pessimistic=False).epsilon(delta)
            assert mpmath.mpf(float(lower)) <= exact <= mpmath.mpf(float(upper)), (eps0, delta)
            assert float(upper) - float(lower) <= 1e-14 + 1e-12 * eps0


@pytest.mark.slow
def test_many_epsilons_in_one_call_and_shapes():
    p = pj.gaussian(np.array([1.0, 2.0]))
    eps = np.linspace(0, 5, 12).reshape(3, 4)
    out = p.delta(eps)
    assert out.shape == (2, 3, 4)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    assert np.all(np.diff(out.reshape(2, -1), axis=1) <= 0)
    assert p.epsilon([1e-3, 1e-6]).shape == (2, 2)


def test_two_directions_report_the_worse():
    fwd = pj.gaussian(1.0)
    rev = pj.gaussian(0.5)
    both = pj.PLD(fwd.probs, fwd.inf_mass, fwd.offset, fwd.step, True, rev)
    eps = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(both.delta(eps), np.maximum(fwd.delta(eps), rev.delta(eps)))
    assert float(both.epsilon(1e-5)) == pytest.approx(max(fwd.epsilon(1e-5), rev.epsilon(1e-5)))


def test_delta_capped_at_one_and_epsilon_zero_at_delta_one():
    """Masses summing to 1 + ulp must not give delta > 1; any PLD is (0, 1)-DP."""
    pld = unchecked_pld(jnp.array([0.5, 0.5 + 4e-16]), jnp.array(0.0), jnp.array(-3, jnp.int64),
                        jnp.array(1.0))
    d = pld.delta(np.array([0.0, 0.5, 10.0]))
    assert np.all(d <= 1.0) and np.all(d >= 0.0)
    eps = pld.epsilon(np.array([0.5, 1 - 1e-16, 1.0]))
    assert eps[-1] == 0.0 and np.all(np.diff(eps) <= 0)


@pytest.mark.parametrize("n", [127, 128, 129, 1000, 4099])
@pytest.mark.parametrize("target", [1e-10, 1e-4, 0.05, 0.4])
def test_epsilon_over_many_blocks_inverts_the_brute_force_delta(n, target):
    # epsilon of one target locates its crossing block by block
    pld = _random_pld(n, n, 1e-12)
    losses, probs = np.asarray(pld.losses), np.asarray(pld.probs)
    eps = float(pld.epsilon(target))
    assert brute_force_delta(losses, probs, 1e-12, eps) <= target * (1 + 1e-9) + 1e-15
    if eps > 1e-9:
        assert brute_force_delta(losses, probs, 1e-12, eps * (1 - 1e-6) - 1e-9) > target * (1 - 1e-9)


@jax.jit
def _decayed_tail_sums(probs, step):
    """R_k = sum_{i >= k} e^{-(i - k) h} p_i for every k (:func:`tail_sums`'s R, its trailing 0
    left out)."""
    return tail_sums(probs, step)[1][:-1]


@pytest.mark.parametrize("n", [1, 128, 16_385, 40_000, 2**21 + 7])
@pytest.mark.parametrize("step", [1e-4, 0.01, 3.0])
def test_reverse_recurrence_matches_a_sequential_filter(n, step):
    # R by the blocked recurrence: blocks of 128 points, then blocks of blocks down to one (from
    # 16,385 points on, two levels and more); the reference runs x_k = p_k + e^-h x_{k+1} point
    # by point (scipy's IIR filter)
    from scipy.signal import lfilter

    terms = np.random.default_rng(n).exponential(size=n)
    want = lfilter([1.0], [1.0, -np.exp(-step)], terms[::-1])[::-1]
    got = np.asarray(_decayed_tail_sums(jnp.asarray(terms), step))
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_delta_at_the_grid_points_of_a_fine_grid_is_never_below_the_truth():
    """Where connect-the-dots is exact (the grid points), the masses' sums read delta 2.6e-14
    (relative) below the exact curve on 32,768 points: the pessimistic curve is raised by its
    round-off bound, and epsilon read on the same curve."""
    import mpmath

    mpmath.mp.dps = 40
    pld = pj.gdp(1.0, grid=pj.Grid(step=2**-10))
    epsilons = np.array([0.5, 1.0, 2.0])
    truth = [float(mpmath.ncdf(mpmath.mpf(1) / 2 - e) - mpmath.exp(e) * mpmath.ncdf(-mpmath.mpf(1) / 2 - e))
             for e in map(mpmath.mpf, epsilons)]
    assert np.all(np.asarray(pld.delta(epsilons)) >= truth)
    assert np.all(np.asarray(pld.epsilon(truth)) >= epsilons)
