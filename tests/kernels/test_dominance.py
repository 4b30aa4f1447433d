"""The Blackwell order of PLDs and suprema of families, against closed forms."""

import json

import numpy as np
import pytest
from compiled_programs import programs_of_a_new_process

import pldjax as pj


def _budget(mu):
    return pj.gdp(mu, pessimistic=False, grid=pj.Grid(step=2.0**-8))

@pytest.mark.slow
def test_dominance_of_ordered_gaussians():
    assert pj.gdp(0.5).dominated_by(_budget(1.0), delta_slack=1e-15)
    assert not pj.gdp(1.0).dominated_by(_budget(0.5), delta_slack=1e-15)
    # the pessimistic discretization keeps a tiny atom at +inf, here below the round-off allowance;
    # a composition's tail atom is not
    assert 0 < float(pj.gdp(0.5).inf_mass) < 1e-20
    assert pj.gdp(0.5).dominated_by(_budget(1.0))
    approximate = pj.randomized_response(0.5, 1e-10)  # a genuine atom at +inf
    assert not approximate.dominated_by(_budget(1.0))
    assert approximate.dominated_by(_budget(1.0), delta_slack=1e-10)


def test_crossing_profiles_are_not_ordered_though_renyi_is():
    """laplace-transform-dp.txt Thm 3.6: RR(1, 0) against the Gaussian with kappa = 1/2 (G_1)."""
    rr, g = pj.randomized_response(1.0), pj.gdp(1.0)
    orders = np.array([0.5, 1.0, 2.0, 4.0])
    assert np.all(rr.renyi(orders) <= pj.gdp(1.0, pessimistic=False).renyi(orders))
    assert rr.delta(0.0) > g.delta(0.0) and rr.delta(1.0) < pj.gdp(1.0, pessimistic=False).delta(1.0)
    assert not rr.dominated_by(_budget(1.0), delta_slack=1e-15)
    assert not g.dominated_by(pj.randomized_response(1.0, pessimistic=False), delta_slack=1e-15)


def test_dominance_needs_sound_inputs():
    with pytest.raises(ValueError, match="optimistic"):
        pj.gdp(0.5).dominated_by(pj.gdp(1.0))
    with pytest.raises(ValueError, match="pessimistic"):
        pj.gdp(0.5, pessimistic=False).dominated_by(_budget(1.0))


@pytest.mark.slow
def test_sup_of_an_ordered_family_is_its_largest_member():
    grid = pj.Grid(step=2.0**-6)
    family = [pj.gdp(mu, grid=grid) for mu in (0.5, 1.0, 2.0)]
    top = pj.sup(family)
    eps = np.linspace(0.0, 6.0, 25)
    np.testing.assert_allclose(top.delta(eps), family[-1].delta(eps), rtol=1e-9, atol=1e-13)


def test_sup_dominates_members_and_is_below_upper_bounds():
    grid = pj.Grid(step=2.0**-6)
    members = [pj.gdp(1.0, grid=grid), pj.randomized_response(1.0, grid=grid),
               pj.laplace(1.0, grid=grid)]
    top = pj.sup(members)
    assert top.pessimistic and float(top.total_mass()) == pytest.approx(1.0, abs=1e-12)
    eps = np.linspace(0.0, 5.0, 41)
    for m in members:
        assert np.all(top.delta(eps) >= m.delta(eps) - 1e-13)
    # every G_mu that bounds all members bounds the sup (on the same grid the sup adds nothing
    # but round-off, which it keeps as an atom at +inf of a few 1e-13)
    mu = max(float(pj.gdp_mu(m, delta_slack=1e-12)) for m in members)
    assert float(pj.gdp_mu(top, delta_slack=1e-12)) <= mu * (1 + 1e-6)
    batch = pj.sup(pj.gdp(np.array([0.5, 1.5]), grid=grid))
    np.testing.assert_allclose(batch.delta(eps), pj.gdp(1.5, grid=grid).delta(eps), rtol=1e-9,
                               atol=1e-13)


def test_sup_refuses_a_bad_size_by_name():
    family = [pj.gdp(1.0), pj.gdp(2.0)]
    for size in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="size must be an integer >= 1"):
            pj.sup(family, size=size)
    with pytest.raises(ValueError, match="memory guard"):
        pj.sup(family, size=2**40)
    far = pj.PLD(np.array([1.0]), 0.0, 2**40, 1.0)  # members 2^40 points apart
    with pytest.raises(ValueError, match="plds: their sup spans"):
        pj.sup([pj.PLD(np.array([1.0]), 0.0, 0, 1.0), far])


def test_sup_keeps_both_directions():
    a = pj.gaussian(1.0, sampling_prob=0.1, grid=pj.Grid(step=2.0**-8))
    b = pj.gaussian(2.0, sampling_prob=0.3, grid=pj.Grid(step=2.0**-8))
    top = pj.sup([a, b])
    assert not top.symmetric
    eps = np.linspace(0.0, 2.0, 9)
    for i in (0, 1):
        for m in (a, b):
            assert np.all(top.directions()[i].delta(eps) >= m.directions()[i].delta(eps) - 1e-13)


@pytest.mark.slow
def test_dominance_batched_and_under_jit():
    import jax

    budget = _budget(1.0)
    queries = pj.gdp(np.array([0.3, 0.9, 1.2]))
    got = queries.dominated_by(budget, delta_slack=1e-15)
    np.testing.assert_array_equal(got, [True, True, False])
    jitted = jax.jit(lambda q: q.dominated_by(budget, delta_slack=1e-15))
    np.testing.assert_array_equal(np.asarray(jitted(queries)), [True, True, False])


@pytest.mark.slow
def test_sup_of_a_batched_family_under_jit():
    import jax

    grid = pj.Grid(step=2.0**-6)
    family = pj.gdp(np.array([0.5, 1.0, 1.5]), grid=grid)
    size = family.size + int(np.ptp(np.asarray(family.offset)))
    top = jax.jit(lambda f: pj.sup(f, size=size))(family)
    eps = np.linspace(0.0, 5.0, 21)
    np.testing.assert_allclose(top.delta(eps), pj.gdp(1.5, grid=grid).delta(eps), rtol=1e-9,
                               atol=1e-13)


def test_sup_and_dominance_of_host_plds_compile_nothing(tmp_path):
    # a list of PLDs is stacked, its sup taken and a verdict read in NumPy: a new process
    # compiles no program
    names, printed = programs_of_a_new_process("""
        import json
        import pldjax as pj
        top = pj.sup([pj.gdp(1.0), pj.laplace(1.0), pj.randomized_response(0.5)])
        verdict = pj.gdp(0.5).dominated_by(pj.gdp(1.0, pessimistic=False), delta_slack=1e-15)
        print(json.dumps([float(top.epsilon(1e-6)), verdict]))
    """, cache=tmp_path / "xla")  # empty: every program compiles
    assert names == []
    top = pj.sup([pj.gdp(1.0), pj.laplace(1.0), pj.randomized_response(0.5)])
    assert json.loads(printed.splitlines()[-1]) == [float(top.epsilon(1e-6)), True]


def test_sup_and_dominance_in_numpy_are_the_compiled_kernels_to_round_off():
    """A family's sup and a batch's verdicts in NumPy (host arrays) are those of the compiled
    kernels (under jit) to round-off (each moves its masses' round-off, a few 1e-13 of delta, to
    +inf); the sup of two crossing curves follows the larger."""
    import jax

    grid = pj.Grid(step=2.0**-7)
    # nearly G_0.9 and nearly Laplace(1): the first above from eps = 0.75 on
    family = pj.compose([pj.gdp(np.array([0.9, 0.2]), grid=grid),
                         pj.laplace(np.array([40.0, 1.0]), grid=grid)])
    size = family.size + int(np.ptp(np.asarray(family.offset)))
    on_host = pj.sup(family, size=size)
    compiled = jax.jit(lambda f: pj.sup(f, size=size))(family)
    eps = np.linspace(0.0, 6.0, 25)
    np.testing.assert_allclose(on_host.delta(eps), compiled.delta(eps), rtol=1e-12, atol=2e-12)
    members = [np.asarray(family[i].delta(eps)) for i in (0, 1)]
    for member in members:
        assert np.all(on_host.delta(eps) >= member - 1e-13)
    # the larger member's curve, joined by chords between the grid's points
    np.testing.assert_allclose(on_host.delta(eps), np.maximum(*members), rtol=1e-4, atol=2e-12)
    budget = _budget(1.0)
    queries = pj.gdp(np.array([0.3, 0.9, 1.2]), grid=grid)
    verdicts = queries.dominated_by(budget, delta_slack=1e-15)
    np.testing.assert_array_equal(verdicts, [True, True, False])
    jitted = jax.jit(lambda q: q.dominated_by(budget, delta_slack=1e-15))(queries)
    np.testing.assert_array_equal(np.asarray(jitted), verdicts)
