"""Grids that align themselves: pldjax.core.align and every operation that takes several PLDs.

References are closed forms (G_a (+) G_b = G_sqrt(a^2 + b^2), randomized response) in mpmath and
direct sums over the masses, never the code under test."""

import math

import jax
import numpy as np
import pytest
from reference import brute_force_delta, gaussian_delta, rr_mixed_delta

import pldjax as pj
from pldjax.core.align import align, regrid, regrid_size

EPS = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.0])


def _gauss(mu):
    return np.array([gaussian_delta(mu, e) for e in EPS])


def _sound_bracket(upper: pj.PLD, lower: pj.PLD, mu: float, width: float) -> None:
    """upper above G_mu, lower below it (up to round-off), and the two within ``width``."""
    exact = _gauss(mu)
    up, low = upper.delta(EPS), lower.delta(EPS)
    assert np.all(up >= exact - 1e-13), up - exact
    assert np.all(low <= exact + 1e-13), low - exact
    assert np.all(up - low <= width), up - low


@pytest.mark.parametrize("pessimistic", [True, False])
def test_regrid_kernel_keeps_the_curve_at_coarse_points_on_its_safe_side(pessimistic):
    fine = pj.gdp(1.0, pessimistic=pessimistic, grid=pj.Grid(step=0.003, size=2048))
    target = 0.01  # not a multiple of 0.003
    coarse = regrid(fine, target, regrid_size(fine.size, 0.3))
    losses = np.asarray(fine.losses)
    probs = np.asarray(fine.probs)
    c_losses, c_probs = np.asarray(coarse.losses), np.asarray(coarse.probs)
    assert float(coarse.step) == target
    assert np.sum(c_probs) == pytest.approx(np.sum(probs), abs=1e-14)
    q_mass = np.sum(probs * np.exp(-losses))
    c_q_mass = np.sum(c_probs * np.exp(-c_losses))
    for eps in (-0.5, 0.0, 0.37, 1.0, 1.5):
        want = brute_force_delta(losses, probs, float(fine.inf_mass), eps)
        got = brute_force_delta(c_losses, c_probs, float(coarse.inf_mass), eps)
        if pessimistic:  # connect-the-dots: P- and Q-mass kept, the curve raised between points
            assert got >= want - 1e-15
        else:  # losses rounded down
            assert got <= want + 1e-15
    if pessimistic:
        assert c_q_mass == pytest.approx(q_mass, rel=1e-12)
        for k in (-20, 0, 37, 100):  # unchanged at the coarse points
            eps = (int(coarse.offset) + 60 + k) * target
            want = brute_force_delta(losses, probs, float(fine.inf_mass), eps)
            got = brute_force_delta(c_losses, c_probs, float(coarse.inf_mass), eps)
            assert got == pytest.approx(want, abs=1e-14)


def test_refinement_is_exact_and_coarsening_only_when_needed():
    a = pj.gdp(1.0, grid=pj.Grid(step=2.0**-6))
    b = pj.gdp(1.0, grid=pj.Grid(step=2.0**-8))
    fine_a, fine_b = align([a, b], "test")
    assert float(fine_a.step) == 2.0**-8 and fine_b is b
    # the same curve, read with the round-off allowance of 4x the points
    np.testing.assert_allclose(fine_a.delta(EPS), a.delta(EPS), rtol=1e-11)
    # refining a onto 2^-30 would need 2^35 points: coarsen b onto a's step instead
    c = pj.gdp(1.0, grid=pj.Grid(step=2.0**-30, size=64))
    coarse_a, coarse_c = align([a, c], "test")
    assert coarse_a is a and float(coarse_c.step) == 2.0**-6


@pytest.mark.slow
def test_sup_of_randomized_responses_on_different_automatic_steps():
    """The issue's example: their automatic steps differ (2^-6 and 2^-7)."""
    members = [(1.0, 0.0), (0.5, 0.05)]
    top = pj.sup([pj.randomized_response(e, d) for e, d in members])
    step = float(top.step)
    eps = np.linspace(-1.5, 2.0, 36)

    def exact(x):
        return max(rr_mixed_delta([m], x) for m in members)

    got = np.asarray(top.delta(np.maximum(eps, 0.0)))
    for x, g in zip(np.maximum(eps, 0.0), got, strict=True):
        assert g >= exact(x) - 1e-12  # above both members
        assert g <= exact(x - step) + 1e-10  # within one grid step of the exact sup
    # two-direction members too
    two = pj.sup([pj.gaussian(1.0, sampling_prob=0.1), pj.gaussian(2.0, sampling_prob=0.3)])
    assert len(two.directions()) == 2


@pytest.mark.parametrize("mu", [1e-6, pytest.param(1e-300, marks=pytest.mark.slow)])
def test_compose_of_far_apart_steps_is_a_sound_bracket(mu):
    """Found by the property tests: refining gdp(0.5) onto gdp(1e-6)'s step needed 25.8 GB; it
    is now coarsened the other way."""
    upper = pj.compose([pj.gdp(mu), pj.gdp(0.5)])
    lower = pj.compose([pj.gdp(mu, pessimistic=False), pj.gdp(0.5, pessimistic=False)])
    _sound_bracket(upper, lower, math.hypot(max(mu, 2.0**-30), 0.5), 5e-3)


@pytest.mark.slow
def test_compose_of_incommensurate_steps_is_a_sound_bracket():
    def pair(pessimistic):
        return pj.compose([
            pj.gdp(0.7, pessimistic=pessimistic, grid=pj.Grid(step=0.01)),
            pj.gdp(0.9, pessimistic=pessimistic, grid=pj.Grid(step=0.003))])

    upper, lower = pair(True), pair(False)
    assert float(upper.step) == 0.01
    _sound_bracket(upper, lower, math.hypot(0.7, 0.9), 3e-3)
    # a refinement past grid.MAX_SIZE (2^16 points at step 1 onto 2^-10) coarsens instead
    a = pj.gaussian(1.0, grid=pj.Grid(step=1.0, size=2**16))
    b = pj.gaussian(1.0, grid=pj.Grid(step=2.0**-10, size=16))
    c = pj.compose([a, b])
    assert float(c.step) == 1.0
    assert np.all(c.delta(EPS) >= _gauss(math.sqrt(2.0)) - 1e-13)


def test_compose_under_jit_aligns_onto_the_larger_step():
    a = pj.gdp(0.7, grid=pj.Grid(step=0.01, size=512))
    b = pj.gdp(0.9, grid=pj.Grid(step=0.003, size=2048))
    c = jax.jit(lambda x, y: pj.compose([x, y], size=4096))(a, b)
    assert float(c.step) == 0.01
    assert np.all(c.delta(EPS) >= _gauss(math.hypot(0.7, 0.9)) - 1e-13)
    np.testing.assert_allclose(c.delta(EPS), pj.compose([a, b]).delta(EPS), atol=1e-9)


def test_sup_under_jit_of_a_family_on_different_steps():
    family = pj.gdp(np.array([0.5, 1.0, 1.5]))  # automatic steps 2^-7, 2^-6, 2^-6
    assert len(set(np.asarray(family.step).tolist())) == 2
    top = jax.jit(lambda f: pj.sup(f, size=4096))(family)
    assert float(top.step) == 2.0**-6
    got = top.delta(EPS)
    assert np.all(got >= _gauss(1.5) - 1e-13)
    assert np.all(got <= _gauss(1.5) + 1e-3)


def test_natural_filter_analysis_of_queries_on_different_steps():
    grid = pj.Grid(step=2.0**-1)
    queries = [pj.randomized_response(1.5, grid=grid), pj.randomized_response(1.0)]  # 2^-6
    budget = pj.randomized_response(3.0, grid=grid)
    verdict = pj.natural_filter_free(queries, budget=budget, rounds=1)
    same = [pj.randomized_response(e, grid=pj.Grid(step=2.0**-6)) for e in (1.5, 1.0)]
    want = pj.natural_filter_free(same, budget=budget, rounds=1)  # refined exactly
    assert verdict.status == want.status
    assert verdict.upper_excess == pytest.approx(want.upper_excess, abs=1e-12)
    assert verdict.lower_excess == pytest.approx(want.lower_excess, abs=1e-12)


@pytest.mark.slow
def test_natural_filter_analysis_of_gaussians_on_different_steps():
    """The issue's example: gdp(0.3) and gdp(0.5) sit on 2^-8 and 2^-7 (refined exactly)."""
    queries = [pj.gdp(0.3), pj.gdp(0.5)]
    budget = pj.gdp(1.0, pessimistic=False)
    verdict = pj.natural_filter_free(queries, budget=budget, rounds=2)
    assert verdict.status in ("free", "undecided")
    cost = pj.natural_filter_cost(queries, budget=budget, rounds=2)
    assert np.all(np.isfinite(cost.delta(EPS)))
    # Gaussians are totally ordered (Thm 8): the worst case stays below G_1 up to grid error
    assert np.all(cost.delta(EPS) <= _gauss(1.0) + 1e-2)


def test_natural_filter_aligns_its_queries_eager_and_under_jit():
    budget = pj.approx_dp_composition(1.0, 1e-6, 1)
    f = pj.filters.natural_filter(budget, step=1 / 128)
    exact = pj.randomized_response(0.25, grid=pj.Grid(step=1 / 128))
    finer = pj.randomized_response(0.25, grid=pj.Grid(step=1 / 512))  # refined onto 1/128: exact
    odd = pj.randomized_response(0.25, grid=pj.Grid(step=0.003))  # coarsened, dominates
    for query in (finer, odd):
        state, ok = f.spend(f.init(), query)
        assert bool(ok)
        got = f.remaining(state).delta(EPS)
        assert np.all(got >= exact.delta(EPS) - 1e-12)
    spend = jax.jit(f.spend)
    _, ok = spend(f.init(), odd)  # traced steps: coarsened in the compiled call
    assert bool(ok)
    coarser = pj.randomized_response(0.25, grid=pj.Grid(step=1 / 64))
    _, ok = spend(f.init(), coarser)  # cannot go onto a finer grid in a static shape: rejected
    assert not bool(ok)
    _, ok = f.spend(f.init(), coarser)  # on the host it is refined exactly
    assert bool(ok)


@pytest.mark.slow
def test_optimistic_randomized_response_keeps_its_atom():
    """The issue's example: R_{1.95,0.05} optimistic on step 1/1024 had delta(5) = 0."""
    grid = pj.Grid(step=1 / 1024)
    for rounding in ("connect_dots", "privacy_buckets"):
        g = pj.Grid(step=grid.step, rounding=rounding)
        low = pj.randomized_response(1.95, 0.05, pessimistic=False, grid=g)
        assert float(low.delta(5.0)) == pytest.approx(0.05, abs=1e-15)
        eps = np.linspace(0.0, 3.0, 31)
        exact = np.array([rr_mixed_delta([(1.95, 0.05)], e) for e in eps])
        assert np.all(low.delta(eps) <= exact + 1e-15)
        assert float(low.total_mass()) == pytest.approx(1.0, abs=1e-12)
    # as a natural-filter budget: R_{0,0.04} is below R_{1.95,0.05}, and the filter now sees it
    budget = pj.randomized_response(1.95, 0.05, pessimistic=False, grid=grid)
    f = pj.filters.natural_filter(budget)
    _, ok = f.spend(f.init(), pj.randomized_response(0.0, 0.04, grid=grid))
    assert bool(ok)


@pytest.mark.slow
def test_both_directions_are_aligned():
    def pair(pessimistic, steps):
        return pj.compose([pj.laplace(1.0, sampling_prob=0.2, pessimistic=pessimistic,
                                      grid=pj.Grid(step=s)) for s in steps])

    upper = pair(True, (0.01, 0.003))
    assert len(upper.directions()) == 2
    assert all(float(d.step) == 0.01 for d in upper.directions())
    lower = pair(False, (0.01, 0.003))
    assert all(float(d.step) == 0.01 for d in lower.directions())
    fine_upper, fine_lower = pair(True, (2.0**-10,) * 2), pair(False, (2.0**-10,) * 2)
    for d_up, d_low, f_up, f_low in zip(upper.directions(), lower.directions(),
                                        fine_upper.directions(), fine_lower.directions(),
                                        strict=True):
        # each aligned bound lies on its side of the other side's bound on a fine common grid
        assert np.all(d_up.delta(EPS) >= f_low.delta(EPS) - 1e-13)
        assert np.all(d_low.delta(EPS) <= f_up.delta(EPS) + 1e-13)
