"""Noise records (pldjax.mechanisms.noise) and the entry point that builds their PLDs (pj.privacy_loss)."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from reference import discrete_laplace_delta_mp, gaussian_delta, gaussian_delta_mp, rr_kfold_delta_mp

import pldjax as pj
from pldjax.core.compilation import array_module
from pldjax.core.precision import float64
from pldjax.kernels.discretize import mechanism_curve, mechanism_estimate
from pldjax.mechanisms.neighboring import Neighboring


def _same(a: pj.PLD, b: pj.PLD) -> None:
    assert len(a.directions()) == len(b.directions())
    for x, y in zip(a.directions(), b.directions(), strict=True):
        for name in ("probs", "inf_mass", "offset", "step"):
            np.testing.assert_array_equal(np.asarray(getattr(x, name)), np.asarray(getattr(y, name)))


@pytest.mark.parametrize("parts,named", [
    ((pj.noise.Gaussian(0.7, sensitivity=2.0),), lambda: pj.gaussian(0.7, sensitivity=2.0)),
    ((pj.noise.GDP(0.5),), lambda: pj.gdp(0.5)),
    ((pj.noise.Laplace(1.3), pj.sampling.Poisson(0.05)), lambda: pj.laplace(1.3, sampling_prob=0.05)),
    ((pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.01), "replace_one"),
     lambda: pj.gaussian(1.0, sampling_prob=0.01, neighboring="replace_one")),
    ((pj.noise.Laplace(1.0), pj.sampling.FixedBatch(0.05), Neighboring.REPLACE_ONE),
     lambda: pj.laplace(1.0, sampling_prob=0.05, neighboring="replace_one", sampling="fixed_batch")),
    ((pj.noise.DiscreteLaplace(2.0, sensitivity=3),), lambda: pj.discrete_laplace(2.0, sensitivity=3)),
    ((pj.noise.DiscreteGaussian(1.5), None, "replace_one"),
     lambda: pj.discrete_gaussian(1.5, neighboring="replace_one")),
    ((pj.noise.RandomizedResponse(1.0, 1e-6),), lambda: pj.randomized_response(1.0, 1e-6)),
])
def test_entry_point_is_what_the_named_constructors_build(parts, named):
    _same(pj.privacy_loss(*parts), named())
    _same(pj.Event(*parts).pld(), named())


def test_a_sampling_record_is_accepted_by_the_named_constructors():
    _same(pj.gaussian(1.0, sampling=pj.sampling.Poisson(0.01)), pj.gaussian(1.0, sampling_prob=0.01))


def test_gdp_is_the_gaussian_with_unit_sensitivity():
    _same(pj.privacy_loss(pj.noise.GDP(0.5)), pj.privacy_loss(pj.noise.Gaussian(2.0)))


@pytest.mark.parametrize("call,match", [
    (lambda: pj.noise.Gaussian(0.0), "sigma"),
    (lambda: pj.noise.Gaussian(1.0, sensitivity=float("nan")), "sensitivity"),
    (lambda: pj.noise.GDP(-1.0), "mu"),
    (lambda: pj.noise.Laplace(np.array([1.0, -1.0])), "scale"),
    (lambda: pj.noise.DiscreteLaplace(1.0, sensitivity=0.5), "sensitivity"),
    (lambda: pj.noise.DiscreteGaussian(1e-200), "sigma"),
    (lambda: pj.noise.RandomizedResponse(1.0, 2.0), "delta"),
    (lambda: pj.privacy_loss(pj.noise.RandomizedResponse(1.0), neighboring="replace_one"), "add_remove"),
    (lambda: pj.privacy_loss(pj.noise.Gaussian(1.0), neighboring="swap"), "neighboring"),
    (lambda: pj.Event("gaussian"), "noise"),
    (lambda: pj.Event(pj.noise.Gaussian(1.0), 0.1), "sampling"),
    (lambda: pj.Event(pj.noise.Gaussian(1.0), neighboring="both"), "neighboring"),
])
def test_records_are_checked_when_built(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_event_is_a_pytree_with_static_structure():
    a = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.01), "replace_one")
    b = pj.Event(pj.noise.Gaussian(2.0), pj.sampling.Poisson(0.02), Neighboring.REPLACE_ONE)
    assert a.neighboring is Neighboring.REPLACE_ONE
    assert jax.tree.leaves(a) == [1.0, 1.0, 0.01]  # sigma, sensitivity, sampling_prob
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert hash(jax.tree.structure(a)) == hash(jax.tree.structure(b))
    assert hash(a) == hash(pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.01), "replace_one"))
    mixture = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Mixture([0.0, 1.0], [0.5, 0.5]))
    assert jax.tree.structure(mixture) != jax.tree.structure(a)


def _delta_on_a_fixed_grid(event):
    return event.pld(grid=pj.Grid(step=2.0**-8, size=2048)).delta(0.5)


def test_event_under_jit():
    """Parameters are data: one compiled kernel for every value."""
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.05))
    eager = float(_delta_on_a_fixed_grid(event))
    assert float(jax.jit(_delta_on_a_fixed_grid)(event)) == pytest.approx(eager, rel=1e-12)


@pytest.mark.slow
def test_event_under_vmap():
    delta = _delta_on_a_fixed_grid
    eager = float(delta(pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.05))))
    ones = jnp.ones(2)
    batch = pj.Event(pj.noise.Gaussian(jnp.array([1.0, 2.0]), ones), pj.sampling.Poisson(0.05 * ones))
    both = jax.vmap(delta)(batch)  # every leaf batched (an in_axes record would fail its checks)
    assert float(both[0]) == pytest.approx(eager, rel=1e-12) and float(both[1]) < eager


def test_records_built_with_x64_off_lose_nothing(x64_off):
    event = pj.Event(pj.noise.Gaussian(0.7), pj.sampling.Poisson(0.01))
    jax.config.update("jax_enable_x64", True)
    want = float(pj.gaussian(0.7, sampling_prob=0.01).delta(0.3))
    jax.config.update("jax_enable_x64", False)
    assert float(event.pld().delta(0.3)) == want


def test_replace_one_doubles_the_shift():
    pld = pj.privacy_loss(pj.noise.Laplace(2.0, sensitivity=0.5), neighboring="replace_one")
    _same(pld, pj.laplace(2.0))  # shift 2 * 0.5 / 2: one scale in two
    eps = np.array([0.0, 0.5, 1.0])
    got = pj.privacy_loss(pj.noise.GDP(0.5), neighboring="replace_one").delta(eps)
    assert np.all(got >= [gaussian_delta(1.0, e) - 1e-15 for e in eps])


def test_event_directions_give_the_mechanism_before_discretization():
    from pldjax.mechanisms import subsampling
    from pldjax.mechanisms.noise import GAUSSIAN

    mechanism, params, both = pj.Event(pj.noise.Gaussian(2.0), pj.sampling.Poisson(0.1)).directions()
    assert mechanism is subsampling.poisson(GAUSSIAN) and both
    np.testing.assert_array_equal(params, [0.5, 0.1])
    mechanism, params, both = pj.Event(pj.noise.Gaussian(2.0), None, "replace_one").directions()
    assert mechanism is GAUSSIAN and not both and float(params[0]) == 1.0


@pytest.mark.parametrize("make", [
    lambda p: pj.gaussian(1e-300, sensitivity=1e10, sampling_prob=0.5, pessimistic=p),
    lambda p: pj.discrete_laplace(1e-310, sampling_prob=0.5, pessimistic=p),
    *(pytest.param(make, marks=pytest.mark.slow) for make in (
        lambda p: pj.privacy_loss(pj.noise.Gaussian(1e-300, sensitivity=1e10),
                                  pj.sampling.Mixture([0.0, 1.0], [0.5, 0.5]), pessimistic=p),
        lambda p: pj.laplace(1e-300, sensitivity=1e10, sampling_prob=0.5, pessimistic=p),
        lambda p: pj.gaussian(1e-300, sensitivity=1e10, sampling_prob=0.5, neighboring="replace_one",
                              sampling="fixed_batch", pessimistic=p),
        lambda p: pj.privacy_loss(pj.noise.GDP(1e300), pj.sampling.Poisson(0.5), pessimistic=p),
    )),
])
def test_a_shift_beyond_float64_is_sound(make):
    """sensitivity / scale overflowing to inf (or 1/scale for a subnormal scale) gave NaN through
    inf - inf in the subsampled windows; the shift is lowered to MAX_SHIFT, where the PLD no longer
    changes. Truth: the sampled record is identified, delta(eps) = 1/2 (remove direction)."""
    eps = np.array([0.0, 1.0, 1e3])
    upper, lower = np.asarray(make(True).delta(eps)), np.asarray(make(False).delta(eps))
    assert np.all(np.isfinite(upper)) and np.all(np.isfinite(lower))
    assert np.all(upper >= 0.5) and np.all(upper <= 1.0) and np.all((lower >= 0) & (lower <= 0.5))


def test_optimistic_window_of_a_loss_beyond_its_span_sits_on_a_power_of_two_step():
    """sigma = 1e-6: the loss (about 5e11 nats) lies far beyond what an optimistic window may
    span, whose step is then capped at the largest power of two that keeps the span within
    grid.OPTIMISTIC_SPAN: exactly a power of two, also where that cap is computed inside a kernel
    (XLA's exp2 of -8 is 2^-8 and an ulp, which moved the window by a point)."""
    from pldjax.core import grid

    pld = pj.gaussian(1e-6, pessimistic=False)
    for direction in pld.directions():
        step = float(np.asarray(direction.step))
        assert np.frexp(step)[0] == 0.5
        assert (direction.size - 1) * step <= grid.OPTIMISTIC_SPAN
    assert 0.0 < pld.epsilon(1e-5) <= 1e12


@pytest.mark.parametrize("pessimistic", [True, False])
def test_a_grid_in_tiles_gives_the_same_pld_however_the_tiles_are_called(monkeypatch, pessimistic):
    """A mechanism's curve (or tails) is computed in tiles of a few thousand points, several
    tiles a compiled call: how many a call holds never changes a mass (here one a call, a size
    that is no whole number of tiles, two directions)."""
    from pldjax.kernels import discretize

    def build():
        pld = pj.gaussian(0.9, sampling_prob=0.03, grid=pj.Grid(size=5000), pessimistic=pessimistic)
        return [np.asarray(a) for d in pld.directions()
                for a in (d.probs, d.inf_mass, d.offset, d.step)]

    every = build()
    monkeypatch.setattr(discretize, "CALL_TILES", 1)
    for got, want in zip(build(), every, strict=True):
        np.testing.assert_array_equal(got, want)


def _pure_epsilon(eps0: float, q: float, runs: int) -> float:
    """runs * log(1 + q (e^eps0 - 1)): the largest loss of Poisson-subsampled (or, under
    replace-one, fixed-batch) bounded noise whose own largest loss is eps0, at 40 digits."""
    import mpmath

    mpmath.mp.dps = 40
    return float(runs * mpmath.log1p(q * mpmath.expm1(mpmath.mpf(eps0))))


@pytest.mark.parametrize("event, runs, truth", [
    (pj.Event(pj.noise.Laplace(0.7)), 1, _pure_epsilon(1 / 0.7, 1.0, 1)),
    (pj.Event(pj.noise.Laplace(0.7)), 1000, _pure_epsilon(1 / 0.7, 1.0, 1000)),
    (pj.Event(pj.noise.RandomizedResponse(0.3)), 7, 2.1),
    (pj.Event(pj.noise.Laplace(0.1), pj.sampling.Poisson(1e-4)), 10, _pure_epsilon(10.0, 1e-4, 10)),
    (pj.Event(pj.noise.DiscreteLaplace(0.7), pj.sampling.Poisson(0.1)), 3,
     _pure_epsilon(1 / 0.7, 0.1, 3)),
    (pj.Event(pj.noise.Laplace(1.0), pj.sampling.FixedBatch(0.1), "replace_one"), 20,
     _pure_epsilon(2.0, 0.1, 20)),
    # largest losses beyond 64 grid.MAX_STEPs: more points on their lattice
    (pj.Event(pj.noise.RandomizedResponse(1e5)), 1, 1e5),
    (pj.Event(pj.noise.RandomizedResponse(1e5)), 10, 1e6),
    (pj.Event(pj.noise.Laplace(1e-6)), 10, 1e7),
])
def test_pure_dp_epsilon_is_exact_from_above(event, runs, truth):
    """Bounded noise's epsilon at delta = 0 adds up over runs (the largest losses are atoms,
    which occur together): within 1e-12 above the truth, where a grid step between the atoms
    read up to a step more and a composition's window could cut the top off to inf (and a
    largest loss of 1e5 nats, on the automatic grid's largest step, read 100,096). The
    optimistic value is a lower bound."""
    upper = pj.event_epsilon(event, runs, 0.0)
    assert truth <= upper <= truth * (1 + 1e-12)
    assert pj.event_epsilon(event, runs, 0.0, pessimistic=False) <= truth
    if runs == 1:
        assert truth * (1 - 1e-15) <= float(event.pld().epsilon(0.0)) <= truth * (1 + 1e-12)
        assert float(event.pld().delta(truth)) <= 1e-15  # round-off (it read 1 at 1e5 nats)


def test_randomized_response_pld_is_exact_on_its_lattice():
    """Both losses, +-epsilon, lie on the grid (a step of epsilon / 64): delta(eps) is
    (e^epsilon - e^eps) / (1 + e^epsilon) for eps in [0, epsilon], up to the round-off allowance
    it adds (its curve's logs are moved apart by their possible error: 1.9e-13 at eps = 0;
    before, epsilon = 0.3 sat between grid points and read 0.30078 at delta = 0)."""
    eps = np.array([0.0, 0.1, 0.25, 0.3, 0.5])
    truth = np.maximum(np.expm1(0.3) - np.expm1(eps), 0.0) / (1 + np.exp(0.3))
    got = np.asarray(pj.randomized_response(0.3).delta(eps))
    assert np.all(got >= truth) and np.all(got <= truth + 5e-13)
    assert float(pj.randomized_response(0.3).epsilon(0.0)) == 0.3


def test_optimistic_estimate_keeps_an_atom_on_a_grid_point():
    """Randomized response's losses +-epsilon sit on its lattice: the optimistic PLD is the
    exact one (its largest loss, with mass e^eps / (1 + e^eps), no longer went down a step), and
    Laplace keeps its atom of 1/2 at 1/b (rounded down: 1/0.7 is not a float)."""
    eps = 0.3
    rr = pj.randomized_response(eps, pessimistic=False)
    probs = np.asarray(rr.probs)
    held = probs > 1e-12  # elsewhere round-off, about 1e-17 a point
    losses = (int(rr.offset) + np.nonzero(held)[0]) * float(rr.step)
    np.testing.assert_allclose(losses, [-eps, eps], rtol=1e-15)
    # to 1e-11: its curve's logs are moved together by their possible error
    np.testing.assert_allclose(probs[held], [1 / (1 + np.exp(eps)), 1 / (1 + np.exp(-eps))],
                               rtol=1e-11)
    assert float(rr.epsilon(0.0)) == eps
    laplace = pj.laplace(0.7, pessimistic=False)
    eps0 = float(laplace.epsilon(0.0))
    assert Fraction(eps0) <= 1 / Fraction(0.7) <= Fraction(np.nextafter(eps0, np.inf))
    top = np.asarray(laplace.probs)[round(eps0 / float(laplace.step)) - int(laplace.offset)]
    assert abs(float(top) - 0.5) < 1e-12


@pytest.mark.slow
def test_subsampled_bounded_noise_lattice_is_as_tight_as_the_automatic_grid():
    """The lattice that puts subsampled Laplace's largest loss on a grid point is no coarser
    than the automatic grid's accuracy step: over 1,000 runs at delta = 1e-5 both bounds are at
    least as tight as the automatic grid's (a lattice of 64 points up to the largest loss was
    2.4e-5 looser above and 0.24% below)."""
    event = pj.Event(pj.noise.Laplace(1.0), pj.sampling.Poisson(0.05))
    on_lattice, automatic = (
        [pj.event_epsilon(event, 1000, 1e-5, pessimistic=p, grid=grid) for p in (True, False)]
        for grid in (None, pj.Grid()))
    assert on_lattice[0] <= automatic[0]
    assert on_lattice[1] >= automatic[1]
    assert on_lattice[1] <= on_lattice[0] <= on_lattice[1] * (1 + 1e-3)


def test_tiny_noise_at_a_tiny_sampling_prob_keeps_its_losses_in_the_window():
    """A lattice fine enough for accuracy would need a window wider than the largest mechanism
    grid for Laplace(1e-3) at q = 1e-9 (losses up to 979 nats): it stops at the step whose
    window still holds them. Then nothing is lost to +inf: delta(0) is at most q = 1e-9, so
    epsilon at 1e-6 is 0, and epsilon at 0 is the largest loss (before, every add-direction
    mass went to +inf and epsilon read inf)."""
    pld = pj.laplace(1e-3, sampling_prob=1e-9)
    assert all(float(d.inf_mass) == 0.0 for d in pld.directions())
    assert float(pld.epsilon(1e-6)) == 0.0
    truth = _pure_epsilon(1e3, 1e-9, 1)
    assert truth <= float(pld.epsilon(0.0)) <= truth * (1 + 1e-12)


@pytest.mark.parametrize("mu", [1e-8, 1e-7, 1e-5, 1e-3, 0.3])
def test_a_nearly_silent_gaussians_pessimistic_curve_holds_above_the_closed_form(mu):
    """delta(eps) of one Gaussian release at grid points (eps = 0) and between them, against the
    closed form at 40 digits: at or above it, within 1e-3 relative."""
    pld = pj.gdp(mu)
    epsilons = np.array([0.0, mu / 4, mu, 3 * mu])
    with mpmath.workdps(40):
        exact = np.array([float(gaussian_delta_mp(mu, eps)) for eps in epsilons])
    got = np.asarray(pld.delta(epsilons))
    assert np.all(got >= exact)
    assert np.all(got <= exact * (1 + 1e-3))
    assert pj.dpsgd_delta(1 / mu, 1.0, 1, 0.0) >= exact[0]


@pytest.mark.parametrize("mu", [1e5, 1e3, 50.0, 20.0, 1.0, 0.01])
def test_a_gaussians_curves_bracket_the_closed_form_across_its_window(mu):
    """The pessimistic and optimistic curves of one Gaussian release (delta at eps >= 0, its
    excess e^eps delta(-eps) below), NumPy and compiled, at 201 points across its window: at or
    above (at or below) the closed form at 60 digits, within 1e-8 relative. At large losses
    log Q is far larger than eps + log Q, from which the curve's margin was taken, and P's own
    error was not covered where it is the whole value: 3e-14 below the truth at mu = 50
    (eps = 1,400), 7e-11 at mu = 1e5."""
    mechanism, params, _ = pj.Event(pj.noise.GDP(mu)).directions()
    row = tuple(float(np.asarray(p).reshape(-1)[0]) for p in params)
    pld = pj.gdp(mu)
    z = np.linspace(int(pld.offset), int(pld.offset) + pld.size - 1, 201) * float(pld.step)
    with mpmath.workdps(60):
        truth = np.array([float(gaussian_delta_mp(mu, e) if e >= 0
                                else mpmath.exp(e) * gaussian_delta_mp(mu, -e)) for e in z])

    def optimistic(p, z):
        values = mechanism_estimate(mechanism, p)(z)
        return array_module(z).where(z >= 0, values[4], values[5])

    held = truth > 1e-300
    assert held.sum() >= 100
    with np.errstate(over="ignore"):  # the excess at eps >= 0, unread, overflows beyond 709
        host = (mechanism_curve(mechanism, row, z), optimistic(row, z))
    pessimistic = (host[0], jax.jit(float64(lambda p, z: mechanism_curve(mechanism, p, z)))(row, z))
    for got in map(np.asarray, pessimistic):
        assert np.all(got[held] >= truth[held])
        assert np.all(got[held] <= truth[held] * (1 + 1e-8))
    for got in map(np.asarray, (host[1], jax.jit(float64(optimistic))(row, jnp.asarray(z)))):
        assert np.all(got[held] <= truth[held])
        assert np.all(got[held] >= truth[held] * (1 - 1e-8))


@pytest.mark.parametrize("noise, truth", [
    (pj.noise.DiscreteLaplace(1 / 30, sensitivity=3),
     lambda e: discrete_laplace_delta_mp(1 / mpmath.mpf(1 / 30), 3, e)),
    (pj.noise.DiscreteLaplace(1.0), lambda e: discrete_laplace_delta_mp(1.0, 1, e)),
    (pj.noise.RandomizedResponse(30.0), lambda e: rr_kfold_delta_mp(30.0, 0.0, 1, e)),
    (pj.noise.RandomizedResponse(5.0, 1e-6), lambda e: rr_kfold_delta_mp(5.0, 1e-6, 1, e)),
], ids=["discrete_laplace_t30_d3", "discrete_laplace_t1", "rr_30", "rr_5_1e-6"])
def test_integer_and_pure_noises_curves_bracket_mpmath_across_the_window(noise, truth):
    """delta(eps) at 201 points across the window (eps >= 0), NumPy and compiled, both bounds:
    at or on the right side of the exact curve (mpmath, 50 digits), within 1e-8. At eps = 89.7
    the discrete Laplace of t = 30 reads log Q = -90, rounded by 7e-15: the margin was taken
    from eps + log Q = -0.3 and the optimistic curve sat 3e-15 above the truth."""
    mechanism, params, _ = pj.Event(noise).directions()
    row, lower_row = (tuple(np.float64(np.asarray(p).reshape(-1)[0])
                            for p in pj.Event(noise).directions(pessimistic)[1])
                      for pessimistic in (True, False))
    pld = pj.Event(noise).pld()
    z = np.linspace(int(pld.offset), int(pld.offset) + pld.size - 1, 201) * float(pld.step)
    z = z[z >= 0]
    exact = np.array([float(truth(e)) for e in z])
    held = exact > 1e-300
    assert held.sum() >= 40
    compiled = (jax.jit(float64(lambda p, z: mechanism_curve(mechanism, p, z))),
                jax.jit(float64(lambda p, z: mechanism_estimate(mechanism, p)(z)[4])))
    with np.errstate(all="ignore"):  # tails beyond the losses' range, unread
        host = (mechanism_curve(mechanism, row, z), mechanism_estimate(mechanism, lower_row)(z)[4])
    for upper in (host[0], compiled[0](row, z)):
        upper = np.asarray(upper)
        assert np.all(upper[held] >= exact[held])
        assert np.all(upper[held] <= exact[held] * (1 + 1e-8))
    for lower in (host[1], compiled[1](lower_row, z)):
        lower = np.asarray(lower)
        assert np.all(lower[held] <= exact[held])
        assert np.all(lower[held] >= exact[held] * (1 - 1e-8))


@pytest.mark.parametrize("scale", [0.3, 0.7, 1e-5, 0.02, 2.0])
def test_a_rounded_loss_scale_is_moved_to_the_safe_side(scale):
    """sensitivity / scale is rounded to the nearest float, which may lie below the true ratio:
    the pessimistic PLD's is at or above it and the optimistic one's at or below, exact
    quotients unmoved (Gaussian(2.0) is GDP(0.5))."""
    records = [(pj.noise.Gaussian(scale, sensitivity=3.0), Fraction(3) / Fraction(scale)),
               (pj.noise.Laplace(scale, sensitivity=3.0), Fraction(3) / Fraction(scale)),
               (pj.noise.DiscreteLaplace(scale, sensitivity=3), 1 / Fraction(scale))]
    for record, ratio in records:
        upper, lower = (float(np.asarray(record.pair(Neighboring.ADD_REMOVE, pessimistic)[1][0]))
                        for pessimistic in (True, False))
        assert Fraction(lower) <= ratio <= Fraction(upper)
        assert (upper == lower) == (ratio == Fraction(upper))
