import math
import time

import jax
import mpmath as mp
import numpy as np
import pytest
from reference import (
    RR_CASES,
    around_atom,
    assert_epsilon_brackets,
    discrete_laplace_epsilon,
    gaussian_delta,
    laplace_delta,
    laplace_epsilon,
    rr_kfold_delta,
    rr_kfold_epsilon,
)

import pldjax as pj
from pldjax.core import notice
from pldjax.kernels import discretize
from pldjax.mechanisms import truncated_poisson

EPS = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 3.0, 4.5])


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.0, 10.0])
def test_gaussian_single_brackets_closed_form(sigma):
    exact = np.array([gaussian_delta(1 / sigma, e) for e in EPS])
    upper = pj.gaussian(sigma).delta(EPS)
    lower = pj.gaussian(sigma, pessimistic=False).delta(EPS)
    assert np.all(upper >= exact * (1 - 1e-12) - 1e-15)
    assert np.all(lower <= exact * (1 + 1e-12) + 1e-15)
    assert np.all(upper - lower <= 1e-2 * exact + 1e-14)


def test_gdp_is_gaussian_with_unit_sensitivity():
    a, b = pj.gdp(0.5), pj.gaussian(2.0)
    np.testing.assert_array_equal(np.asarray(a.probs), np.asarray(b.probs))
    assert pj.gaussian(2.0, sensitivity=3.0).delta(1.0) == pytest.approx(
        pj.gdp(1.5).delta(1.0), rel=1e-12
    )


def test_gdp_zero_is_identity():
    p = pj.gdp(0.0)
    assert p.delta(0.0) == pytest.approx(0.0, abs=1e-15)
    assert p.epsilon(0.0) == 0.0


@pytest.mark.parametrize("scale", [0.5, 1.0, 4.0])
def test_laplace_closed_form(scale):
    eps0 = 1 / scale
    eps = np.array([0.0, eps0 / 3, eps0 / 2, 0.9 * eps0, eps0, 2 * eps0])
    exact = np.array([laplace_delta(eps0, e) for e in eps])
    upper = pj.laplace(scale).delta(eps)
    lower = pj.laplace(scale, pessimistic=False).delta(eps)
    assert np.all(upper >= exact - 1e-14)
    assert np.all(lower <= exact + 1e-14)
    # the optimistic estimate is loosest next to the atom at eps0
    assert np.all(lower >= 0.8 * exact - 1e-12)
    assert np.all(upper <= exact * (1 + 1e-3) + 1e-12)


def test_randomized_response_exact_on_dyadic_epsilon():
    """The two masses to 1e-11 relative: the pessimistic curve moves its logs apart by their
    possible error, which leaves round-off masses of 3e-13 in all on the points between."""
    p = pj.randomized_response(1.0, 1e-6)
    losses, probs = np.asarray(p.losses), np.asarray(p.probs)
    big = probs > 1e-12
    np.testing.assert_allclose(losses[big], [-1.0, 1.0])
    e = np.e
    np.testing.assert_allclose(
        probs[big], [(1 - 1e-6) / (1 + e), (1 - 1e-6) * e / (1 + e)], rtol=1e-11
    )
    assert float(p.inf_mass) == pytest.approx(1e-6, rel=1e-9)


@pytest.mark.parametrize("epsilon0, delta0", RR_CASES)
@pytest.mark.parametrize("count", [1, 3])
def test_randomized_response_epsilon_brackets_its_exact_inverse(epsilon0, delta0, count):
    # the optimistic estimate is a lower bound also at and just above the atom delta_0: its
    # finite part is 0 past epsilon_0 (round-off masses up to the window's top put epsilon(delta_0)
    # at 15.7 for R_{1, 1e-6}), and a composed atom is rounded down, never above the truth
    atom = float(1 - (1 - mp.mpf(delta0)) ** count)
    targets = around_atom(atom)
    exact = [rr_kfold_epsilon(epsilon0, delta0, count, t) for t in targets]
    lower, upper = (pj.randomized_response(epsilon0, delta0, pessimistic=pe).self_compose(count)
                    .epsilon(np.array(targets)) for pe in (False, True))
    assert_epsilon_brackets(lower, exact, upper)


def test_randomized_response_pessimistic_epsilon_at_its_own_delta_is_finite():
    # past epsilon_0 the curve is delta_0 exactly: the atom is delta_0, epsilon(delta_0) is
    # epsilon_0 rounded up to the grid
    for epsilon0, delta0 in [(1.0, 1e-6), (0.5, 1e-3), (0.3, 1e-5), (2.7, 0.2)]:
        p = pj.randomized_response(epsilon0, delta0)
        assert float(p.inf_mass) == delta0
        assert epsilon0 <= float(p.epsilon(delta0)) <= epsilon0 + float(p.step)


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0, 7.3, 40.0])
def test_laplace_epsilon_brackets_its_closed_form(scale):
    targets = np.array([0.0, 1e-300, 1e-12, 1e-6, 0.05, 0.3])
    exact = [laplace_epsilon(1 / scale, t) for t in targets]
    lower, upper = (pj.laplace(scale, pessimistic=pe).epsilon(targets) for pe in (False, True))
    assert_epsilon_brackets(lower, exact, upper)


@pytest.mark.parametrize("scale, sensitivity", [(0.3, 1), (1.0, 1), (0.7, 3), (5.0, 2)])
def test_discrete_laplace_epsilon_brackets_its_exact_enumeration(scale, sensitivity):
    targets = np.array([0.0, 1e-300, 1e-12, 1e-6, 0.05, 0.3])
    exact = [discrete_laplace_epsilon(1 / scale, sensitivity, t) for t in targets]
    lower, upper = (pj.discrete_laplace(scale, sensitivity=sensitivity, pessimistic=pe)
                    .epsilon(targets) for pe in (False, True))
    assert_epsilon_brackets(lower, exact, upper)


@pytest.mark.parametrize("factory", [
    lambda pe: pj.gaussian(0.7, pessimistic=pe),
    lambda pe: pj.laplace(1.3, pessimistic=pe),
    lambda pe: pj.randomized_response(0.3, 1e-4, pessimistic=pe),
])
@pytest.mark.parametrize("pessimistic", [True, False])
def test_mass_is_one(factory, pessimistic):
    p = factory(pessimistic)
    assert float(p.total_mass()) == pytest.approx(1.0, abs=1e-14)
    assert np.all(np.asarray(p.probs) >= 0)


def test_batch_matches_individual_calls():
    sigmas = np.array([0.8, 1.0, 2.0])
    batch = pj.gaussian(sigma=sigmas)
    assert batch.batch_shape == (3,)
    for i, s in enumerate(sigmas):
        single = pj.gaussian(float(s))
        np.testing.assert_allclose(np.asarray(batch[i].probs), np.asarray(single.probs), atol=1e-17)
        assert float(batch[i].step) == float(single.step)


def test_user_grid():
    p = pj.gaussian(1.0, grid=pj.Grid(step=2.0**-5, size=512))
    assert p.size == 512 and float(p.step) == 2.0**-5
    assert p.delta(1.0) >= gaussian_delta(1.0, 1.0) - 1e-15


# -- extreme but valid parameters: a sound bound, never NaN --------------------------
EDGE_EPS = np.array([0.0, 1.0, 10.0, 300.0])


def _gaussian_exact(mu, eps):
    """gaussian_delta where mpmath can evaluate it; beyond, its limits: 1 for mu >= 1e3 (the loss
    sits near mu^2/2 > 300), erf(mu / 2 sqrt 2) at eps = 0 and 0 above for mu <= 1e-6."""
    if mu >= 1e3:
        return 1.0
    if mu <= 1e-6:
        return math.erf(mu / (2 * math.sqrt(2))) if eps == 0 else 0.0
    return gaussian_delta(mu, eps)


def _sound_bracket(make, exact):
    upper = make(True).delta(EDGE_EPS)
    lower = make(False).delta(EDGE_EPS)
    for value in (upper, lower):
        assert np.all(np.isfinite(value)) and np.all((value >= 0) & (value <= 1))
    assert np.all(upper >= exact * (1 - 1e-12) - 1e-15)
    assert np.all(lower <= exact * (1 + 1e-12) + 1e-15)
    for pld in (make(True), make(False)):
        eps = pld.epsilon(np.array([1e-12, 1e-5, 0.5, 1.0]))
        assert not np.any(np.isnan(eps)) and np.all(eps >= 0) and np.all(eps[:-1] >= eps[1:])


@pytest.mark.parametrize("sigma", [1e-300, pytest.param(1e-5, marks=pytest.mark.slow), 1e17, 1e300])
def test_gaussian_extreme_sigma_is_sound(sigma):
    # sigma -> 0: the loss sits beyond any sane grid (delta = 1 up to mu^2/2); sigma -> inf: identity
    mu = 1 / sigma
    exact = np.array([_gaussian_exact(mu, e) for e in EDGE_EPS])
    _sound_bracket(lambda p: pj.gaussian(sigma, pessimistic=p), exact)


@pytest.mark.parametrize("mu", [60.0, 7e4, 1e300])
def test_gdp_large_mu_is_sound(mu):
    exact = np.array([_gaussian_exact(mu, e) for e in EDGE_EPS])
    _sound_bracket(lambda p: pj.gdp(mu, pessimistic=p), exact)


@pytest.mark.parametrize("scale", [pytest.param(1e-300, marks=pytest.mark.slow), 1e-5, 1e17])
def test_laplace_extreme_scale_is_sound(scale):
    exact = np.array([laplace_delta(1 / scale, e) if scale > 1e-200 else 1.0 for e in EDGE_EPS])
    _sound_bracket(lambda p: pj.laplace(scale, pessimistic=p), exact)


@pytest.mark.parametrize("epsilon", [1e-17, 1e5, 1e300])
def test_randomized_response_extreme_epsilon_is_sound(epsilon):
    # delta(e) = (e^eps0 - e^e) / (1 + e^eps0) for e < eps0, written without overflow
    exact = np.array([max(0.0, float(-np.expm1(e - epsilon) / (1 + np.exp(-epsilon))))
                      for e in EDGE_EPS])
    _sound_bracket(lambda p: pj.randomized_response(epsilon, pessimistic=p), exact)


@pytest.mark.parametrize("scale", [1e10, 1e14, 1e20])
def test_discrete_laplace_huge_scale_is_sound_and_small(scale):
    # sensitivity 1: the loss is +-t (t = 1 / scale), randomized response of epsilon t; a lattice
    # of step t / 64 finer than a curve's digits left a delta of 1
    t = 1.0 / scale
    exact = np.array([max(0.0, float(-np.expm1(e - t) / (1 + np.exp(-t)))) for e in EDGE_EPS])
    _sound_bracket(lambda p: pj.Event(pj.noise.DiscreteLaplace(scale)).pld(pessimistic=p), exact)
    assert pj.event_delta(pj.Event(pj.noise.DiscreteLaplace(scale)), 1, 0.0) <= 1e-10


def test_delta_never_exceeds_one():
    assert pj.gaussian(0.01).delta(1.0) <= 1.0
    assert np.all(pj.gaussian(np.array([0.01, 0.02])).delta(np.array([0.0, 1.0])) <= 1.0)


def test_pessimistic_masses_stay_above_the_curve_off_lattice():
    # R_{1.95,0.05} on step 2^-10 (1.95 is not on the grid): the masses' round-off surplus used to
    # be removed by a proportional rescaling, which put delta 5e-11 below the exact curve
    eps0, atom = 1.95, 0.05
    pld = pj.randomized_response(eps0, atom, grid=pj.Grid(step=2.0**-10))
    ts = np.linspace(0.0, 2.0, 41)
    # exact: atom + (1 - atom) e^eps0 / (1 + e^eps0) (1 - e^(t - eps0)) for t < eps0
    exact = atom + (1 - atom) / (1 + np.exp(-eps0)) * np.maximum(-np.expm1(ts - eps0), 0.0)
    assert np.all(np.asarray(pld.delta(ts)) >= exact - 1e-14)
    assert abs(float(pld.total_mass()) - 1.0) < 1e-14


def _kl_gaussian(scale):
    return float(mp.mpf(1) / (2 * mp.mpf(scale) ** 2))


def _kl_laplace(scale):  # eps0 + e^-eps0 - 1, eps0 = 1 / scale
    eps0 = 1 / mp.mpf(scale)
    return float(eps0 + mp.expm1(-eps0))


def _kl_discrete_laplace(scale):  # losses +-a, P(+a) = 1 / (1 + e^-a): a tanh(a / 2)
    a = 1 / mp.mpf(scale)
    return float(a * mp.tanh(a / 2))


@pytest.mark.parametrize("factory, kl", [(pj.gaussian, _kl_gaussian), (pj.laplace, _kl_laplace),
                                         (pj.discrete_laplace, _kl_discrete_laplace)])
@pytest.mark.parametrize("scale", [1e2, 1e4, 1e6, 1e7, 1e8])
def test_tiny_losses_keep_the_mean_and_a_valid_q(factory, kl, scale):
    """A PLD that dominates a mechanism has E_P[L] (the KL divergence) at least the mechanism's,
    and Q's total E_P[e^-L] at most 1. With a loss of spread 1e-6 or less the masses at losses
    below 0 were rebuilt from curve values near 1 (1 - e^z lost the digits), i.e. from round-off:
    E_P[L] came out negative for the Gaussian at scale 1e6 and Q's total 1 + 1.4e-11 for the
    discrete Laplace at 1e4, and T-fold compositions fell below the truth (next test)."""
    pld = factory(scale)
    probs = np.asarray(pld.probs, np.float64)
    z = (int(pld.offset) + np.arange(probs.shape[-1])) * float(pld.step)
    assert math.fsum(probs * z) >= kl(scale) * (1 - 1e-6)
    assert math.fsum(probs * np.exp(-z)) <= 1 + 1e-14


@pytest.mark.slow
def test_compositions_of_tiny_losses_stay_above_the_truth():
    """The adversarial cases of the fix above, at 10^6 steps: before it, the Gaussian at sigma 1e7
    was 39% low in delta and 7% in epsilon (51% at 10^8 steps), DP-SGD's path 5%, and the
    discrete Laplace at scale 1e7 over 1000 steps 0.11%."""
    # the Gaussian composes to G_mu with mu = sqrt(T) / sigma = 1e-4
    assert pj.gaussian(1e7).self_compose(10**6).delta(3e-4) >= gaussian_delta(1e-4, 3e-4)
    eps = float(pj.gaussian(1e7).self_compose(10**6).epsilon(1e-6))
    assert gaussian_delta(1e-4, eps) <= 1e-6 < gaussian_delta(1e-4, eps * (1 - 1e-3))
    eps = pj.dpsgd_epsilon(1e7, 1.0, 10**6, 1e-6)
    assert gaussian_delta(1e-4, eps) <= 1e-6 < gaussian_delta(1e-4, eps * (1 - 1e-3))
    # the discrete Laplace at scale b with sensitivity 1 is randomized response R_{1/b}
    eps = float(pj.discrete_laplace(1e7).self_compose(1000).epsilon(1e-8))
    assert rr_kfold_delta(1e-7, 0.0, 1000, eps) <= 1e-8
    assert rr_kfold_delta(1e-7, 0.0, 1000, eps * (1 - 1e-3)) > 1e-8


@pytest.mark.slow
def test_a_window_with_no_finite_mass_is_trimmed():
    # Laplace(1e-20) put all of its mass in the +inf atom on a 2^20-point window, and a
    # GDP filter then took a minute per query on it; empty edges are now dropped (same PLD)
    tiny = pj.laplace(1e-20)
    assert tiny.size == 16 and float(tiny.inf_mass) == 1.0 and float(tiny.delta(1e3)) == 1.0
    assert pj.gdp_mu(tiny) == float("inf")
    ordinary = pj.gaussian(1.0)
    assert ordinary.size >= 256  # windows with mass near their edges are kept whole


def _numpy_lower_hull(xs, ys):
    """Reference: Andrew's monotone chain in plain Python; (vertex indices, values at xs)."""
    chain = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        while len(chain) >= 2:
            (ax, ay), (bx, by) = (xs[chain[-2]], ys[chain[-2]]), (xs[chain[-1]], ys[chain[-1]])
            if (bx - ax) * (y - ay) - (by - ay) * (x - ax) > 0:
                break
            chain.pop()
        chain.append(i)
    return np.array(chain), np.interp(xs, xs[chain], ys[chain])


def _hull_shapes(rng, m):
    x = np.cumsum(rng.uniform(0.01, 1.0, m))
    middle = (x - x.mean()) ** 2
    middle[m // 2] -= 1e3
    # nearly collinear, as the optimistic candidates of tiny sampling probabilities: the peeling
    # does not settle in its rounds and the chain finishes
    level = 1.0 + 1e-3 * x + 1e-15 * rng.normal(size=m)
    return x, [(x - x.mean()) ** 2, -(x - x.mean()) ** 2, rng.normal(size=m),
               np.exp(-x / x[-1]) - 5.0 * (np.arange(m) == 0), middle,
               (np.arange(m) % 2) + 1e-3 * x**2, level]


@pytest.mark.parametrize("where", ["cpu", "off_the_cpu", "numpy"])
def test_lower_hull_by_peeling_finds_the_monotone_chains_vertices(where, monkeypatch):
    # the optimistic construction's hull (Alg. 2): peeling rounds, then the sequential chain for
    # rows still changing; shapes that settle in one round, in more rounds than it runs (a low
    # point far from its tangent points drops one neighbour a round), and with the chain
    # finishing; off the CPU every round runs (compilation.early_exit_on_cpu), forced here; on
    # NumPy arrays the same rounds and chain run on the host. The hull keeps the values of the
    # reference chain's vertices, and is the reference's between
    if where == "off_the_cpu":
        monkeypatch.setattr(discretize, "early_exit_on_cpu",
                            lambda args, *, cpu, elsewhere: elsewhere(*args))
    rng = np.random.default_rng(7)
    hull = (discretize.lower_hull_at if where == "numpy"
            else jax.jit(lambda xs, ys: discretize.lower_hull_at(xs, ys)))  # traced with the patch
    for m in (2, 3, 17, 1500):
        x, shapes = _hull_shapes(rng, m)
        for y in shapes:
            vertices, expected = _numpy_lower_hull(x, y)
            got = np.asarray(hull(x, y))
            np.testing.assert_array_equal(got[vertices], y[vertices])
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_lower_hull_values_alone_and_batched():
    # under vmap (nested too) the rows are peeled together and the chain runs only when a row
    # still changes: each row's values are what it gets alone, and the reference's
    rng = np.random.default_rng(3)
    x, shapes = _hull_shapes(rng, 1500)
    ys = np.stack(shapes)
    alone = np.stack([np.asarray(jax.jit(discretize.lower_hull_at)(x, y)) for y in ys])
    for y, got in zip(ys, alone, strict=True):
        _, expected = _numpy_lower_hull(x, y)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
        assert np.all(got <= y + 1e-12 * np.abs(y))
    batched = jax.jit(jax.vmap(discretize.lower_hull_at, in_axes=(None, 0)))(x, ys)
    np.testing.assert_array_equal(np.asarray(batched), alone)
    nested = jax.jit(jax.vmap(jax.vmap(discretize.lower_hull_at)))(
        np.broadcast_to(x, (2,) + ys.shape), np.stack([ys, ys[::-1]]))
    np.testing.assert_array_equal(np.asarray(nested), np.stack([alone, alone[::-1]]))


def test_a_step_finer_than_the_curves_digits_gives_a_valid_sound_pld():
    """On a step far finer than its automatic one, a curve's round-off (about u / step a mass)
    outweighs the connect-the-dots masses: Grid(step=1e-9) for the Gaussian of sigma 1 gave masses
    summing to 1.07, and a subsampled sigma = 1e13 at 2^-46 summed to 1.49 and composed to NaN.
    Such an estimate now certifies nothing (all of its mass at +inf): a valid PLD whose every value
    bounds the truth, never NaN."""
    fine = pj.gaussian(1.0, grid=pj.Grid(step=1e-9))
    tiny = pj.gaussian(1e13, sampling_prob=0.01, grid=pj.Grid(step=2.0**-46))
    for pld in (fine, tiny):
        for direction in pld.directions():
            assert float(np.sum(direction.probs) + direction.inf_mass) <= 1.0 + 1e-12
        composed = pld.self_compose(1000)
        assert not np.isnan(float(composed.epsilon(1e-5)))
    for eps in (0.0, 0.5, 2.0):
        assert float(fine.delta(eps)) >= gaussian_delta(1.0, eps)
    # a step the curve's digits allow is unchanged: its masses add up to 1
    ordinary = pj.gaussian(1.0, grid=pj.Grid(step=1e-6)).directions()[0]
    assert abs(float(np.sum(ordinary.probs) + ordinary.inf_mass) - 1.0) <= 1e-12
    assert float(ordinary.inf_mass) < 0.5


def test_direction_arrays_each_configuration_on_its_own_step():
    """``steps`` puts each configuration (both its directions) on its own grid step in one call,
    as dpsgd's rtol chunks do: the masses and grids of a Grid(step=...) call for each alone, and
    a step outside (0, MAX_STEP] is refused as Grid.step is."""
    from pldjax.mechanisms.events import direction_arrays

    directions = pj.dpsgd_event(np.array([1.0, 2.0, 0.7]), 0.05).directions(True)
    steps = np.array([2.0**-9, 2.0**-7, 2.0**-8])
    for pessimistic in (True, False):
        together = direction_arrays(directions, pj.Grid(size=1024), pessimistic, steps=steps)
        for i, step in enumerate(steps):
            one = pj.dpsgd_event(np.array([1.0, 2.0, 0.7])[i], 0.05).directions(True)
            alone = direction_arrays(one, pj.Grid(step=float(step), size=1024), pessimistic)
            for got, want in zip(together, alone, strict=True):
                np.testing.assert_allclose(np.asarray(got)[:, i], np.asarray(want), rtol=1e-13,
                                           atol=1e-300)
        np.testing.assert_array_equal(together[3], np.broadcast_to(steps, (2, 3)))
    with pytest.raises(ValueError, match="Grid.step must be in"):
        direction_arrays(directions, pj.Grid(size=1024), True, steps=np.array([0.0, 1e-3, 1e-3]))
    with pytest.raises(ValueError, match="either steps or a Grid"):
        direction_arrays(directions, pj.Grid(step=1e-3, size=1024), True, steps=steps)


def _masses_and_scaled(probs, inf_mass, offset, step, scale):
    return probs, inf_mass * scale


@pytest.mark.slow
def test_direction_arrays_then_gets_the_flat_rows_in_the_masses_program():
    """``then`` runs on the flat rows, each configuration's directions innermost (remove, add),
    with ``extra`` beside them; its outputs are the call's, the masses those of the plain call
    (the pessimistic curve's masses and the optimistic estimate's) to round-off (relative, and
    1e-15 absolute: masses of a total of 1): the plain call of so few rows runs in NumPy, ``then``
    in the compiled program."""
    from pldjax.mechanisms.events import direction_arrays

    directions = pj.dpsgd_event(np.array([1.0, 2.0]), 0.05).directions(True)
    grid = pj.Grid(size=1024)  # untrimmed either way
    for pessimistic in (True, False):
        plain = direction_arrays(directions, grid, pessimistic)
        probs, scaled = direction_arrays(directions, grid, pessimistic, then=_masses_and_scaled,
                                         extra=(np.arange(1.0, 5.0),))
        # plain: (directions, configurations, ...); then's rows: configuration-major
        np.testing.assert_allclose(probs, np.swapaxes(plain[0], 0, 1).reshape(4, -1), rtol=1e-9,
                                   atol=1e-15)
        np.testing.assert_allclose(scaled, plain[1].T.reshape(-1) * np.arange(1.0, 5.0),
                                   rtol=1e-9, atol=1e-300)


def test_a_pld_that_takes_seconds_to_build_says_so(monkeypatch, capsys):
    """privacy_loss (and Event.pld) speak like the accounting calls when they run long: a
    truncated-Poisson PLD of 10^8 records took 6-26 s, silent."""
    monkeypatch.delenv("PLDJAX_QUIET", raising=False)
    monkeypatch.setattr(notice, "NOTICE_AFTER", 0.05)
    monkeypatch.setattr(notice, "_POLL", 0.01)
    tightest = truncated_poisson.tightest

    def slow_tightest(plds):
        time.sleep(0.3)
        return tightest(plds)

    monkeypatch.setattr(truncated_poisson, "tightest", slow_tightest)
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.TruncatedPoisson(0.01, 1000, 20),
                     "replace_special")
    event.pld()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("pldjax.privacy_loss is still running after 0.05 s")
    assert err[1].startswith("pldjax.privacy_loss done in ")
