import functools
import importlib
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_programs import compiled_programs
from reference import gaussian_delta, gaussian_epsilon, rr_kfold_delta, rr_kfold_delta_mp, rr_mixed_delta

import pldjax as pj
from pldjax.core.pld import unchecked_pld

compose_module = importlib.import_module("pldjax.kernels.compose")  # pj.compose is the function

DELTAS = [1e-3, 1e-5, 1e-8, 1e-12]


@pytest.mark.parametrize("sigma,count", [(1.0, 1), (2.0, 1000), (4.0, 3000), *(
    pytest.param(*case, marks=pytest.mark.slow) for case in ((1.0, 100), (0.7, 10)))])
def test_gaussian_composition_matches_gdp_closed_form(sigma, count):
    """Both estimates bracket G_mu's closed form. At sigma 4, 3000 runs the optimistic one's far
    tail is round-off, which must not lift it above the truth (2.7e-19): NumPy's own complex
    log1p, inaccurate for small arguments, lifted the host's composition to 2.8e-15 there."""
    mu = math.sqrt(count) / sigma
    upper = pj.gaussian(sigma).self_compose(count)
    lower = pj.gaussian(sigma, pessimistic=False).self_compose(count)
    eps_up, eps_lo = upper.epsilon(DELTAS), lower.epsilon(DELTAS)
    for i, d in enumerate(DELTAS):
        exact = gaussian_epsilon(mu, d)
        assert eps_up[i] >= exact * (1 - 1e-9)
        assert eps_lo[i] <= exact * (1 + 1e-9)
        # within 0.1% of exact; at 1e-12 the FFT round-off allowance costs up to 1%
        tolerance = 0.001 if d >= 1e-8 else 0.01
        assert eps_up[i] <= exact * (1 + tolerance) + 1e-9
        assert eps_up[i] - eps_lo[i] <= (tolerance + 0.004) * exact + 1e-9
    eps = np.array([0.0, 0.5, 1.0]) * mu * mu + np.array([0.0, 1.0, 2.0]) * mu
    for e, up, lo in zip(eps, upper.delta(eps), lower.delta(eps), strict=True):
        exact = gaussian_delta(mu, e)
        assert lo <= exact * (1 + 1e-9) + 1e-15 <= up * (1 + 2e-9) + 2e-15


def test_spectrum_with_a_zero_composes_without_nan():
    # the q = 1 "subsampled" Gaussian's window has an exact zero in its spectrum: its log is -inf,
    # and -inf times the count must stay -inf (it was NaN, and every reading with it)
    composed = pj.gaussian(1.0, sampling_prob=1.0).self_compose(2)
    exact = gaussian_epsilon(math.sqrt(2.0), 1e-5)  # mu of two sigma = 1 releases
    assert exact <= composed.epsilon(1e-5) <= exact * (1 + 1e-4)
    assert pj.compose_schedule([(1.0, 1.0, 2)]).epsilon(1e-5) >= exact


def test_randomized_response_kfold_matches_corollary_4_7():
    eps, delta, k = 0.5, 1e-6, 20
    upper = pj.randomized_response(eps, delta).self_compose(k)
    ts = np.array([0.0, 1.0, 2.5, 4.0, 6.0])
    got = upper.delta(ts)
    want = np.array([rr_kfold_delta(eps, delta, k, t) for t in ts])
    # dyadic epsilon sits on the grid: the discrete PLD is exact up to round-off
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)
    assert np.all(got >= want - 1e-15)


@pytest.mark.parametrize("eps0", [1e-4, 1e-3, 0.01])
def test_an_optimistic_randomized_response_composes_below_the_truth(eps0):
    """R_{eps0} on its automatic grid (256 points between and around +-eps0, where the curve's
    round-off leaves masses of +-1e-9), optimistic, composed 1,000 times: delta at the loss's
    median and above it at or below the exact binomial sum (mpmath) and within 1e-7 of it.
    Negative round-off masses clipped to 0 and all masses scaled back to the total had left the
    Q-mass 3e-14 short, and delta(0) read 1.2e-8 relative above the truth at eps0 = 1e-4."""
    count = 1000
    composed = pj.randomized_response(eps0, pessimistic=False).self_compose(count)
    for t in (0.0, 30 * eps0, 60 * eps0):
        exact = float(rr_kfold_delta_mp(eps0, 0.0, count, t))
        got = float(composed.delta(t))
        assert exact * (1 - 1e-7) <= got <= exact, (t, got, exact)


def test_composed_atoms_are_rounded_to_the_safe_side():
    # 1 - (1 - a)(1 - b) and 1 - (1 - a)^k, exact in mpmath: an optimistic atom at or below them,
    # a pessimistic one at or above (a rounding above the truth put optimistic epsilon = inf at a
    # delta the truth meets)
    import mpmath as mp

    for pessimistic in (False, True):
        rr = functools.partial(pj.randomized_response, 0.5, pessimistic=pessimistic)
        for a, b in [(1e-3, 1e-3), (1e-6, 3e-7), (0.05, 1e-9), (0.3, 0.7), (1e-12, 1e-12)]:
            checks = [(pj.compose([rr(a), rr(b)]), 1 - (1 - mp.mpf(a)) * (1 - mp.mpf(b)))]
            checks += [(rr(a).self_compose(k), 1 - (1 - mp.mpf(a)) ** k) for k in (1, 2, 3, 10)]
            for pld, exact in checks:
                atom = float(pld.inf_mass)
                assert (atom >= exact) if pessimistic else (atom <= exact), (a, b, atom)
    # all of the mass at +inf stays there
    for pessimistic in (False, True):
        assert float(pj.randomized_response(0.5, 1.0, pessimistic=pessimistic)
                     .self_compose(3).inf_mass) == 1.0


def test_compiled_composed_atoms_are_rounded_to_the_safe_side_where_xla_log1p_loses_digits():
    """1 - (1 - m)^k composed by the compiled kernel for one-step atoms m in [0.366, 0.415],
    where XLA's float64 log1p is 2.7e-14 off (beyond the atom's 16-ulp allowance: a pessimistic
    atom up to 7e-16 below the exact one), against mpmath: a pessimistic atom at or above it, an
    optimistic one at or below."""
    import mpmath as mp

    atoms = np.linspace(0.366, 0.415, 50)
    for pessimistic in (True, False):
        run = jax.jit(lambda *a, p=pessimistic: compose_module.self_compose_rows(
            *a, size=64, tail=1e-18, pessimistic=p))
        for count in (2, 3, 5):
            probs = np.outer(1.0 - atoms, [0.5, 0.5])
            with jax.enable_x64(True):
                _, composed, _ = run(probs, atoms, np.zeros(50, np.int64), np.full(50, 0.5),
                                     np.full(50, float(count)))
            for atom, got in zip(atoms, np.asarray(composed), strict=True):
                exact = 1 - (1 - mp.mpf(float(atom))) ** count
                assert (got >= exact) if pessimistic else (got <= exact), (atom, count, got)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_lattice_pmf_keeps_its_far_frequencies_at_a_large_count(compiled):
    """Randomized response's two losses +-0.5, 32 bins apart: its spectrum returns to modulus 1
    at every 512th frequency of a 16,384-point window, so that at count 2,000 the power keeps
    those far frequencies besides the lowest ones (a cut at the first negligible frequency would
    fold the lattice's mass). Composed (in NumPy and compiled), the PLD reads Cor. 4.7's closed
    form."""
    eps, count, step, size = 0.5, 2000, 1.0 / 32, 16384
    p = math.exp(eps) / (1 + math.exp(eps))
    probs = np.zeros((1, 33))
    probs[0, 0], probs[0, 32] = 1 - p, p  # losses -eps and +eps
    args = (probs, np.zeros(1), np.array([-16]), np.array([step]), np.array([float(count)]))
    if compiled:
        with jax.enable_x64(True):
            out = jax.jit(lambda *a: compose_module.self_compose_rows(
                *a, size=size, tail=1e-18, pessimistic=True))(*args)
    else:
        out = compose_module.self_compose_rows(*args, size=size, tail=1e-18, pessimistic=True)
    composed, inf_mass, start = (np.asarray(a)[0] for a in out)
    pld = unchecked_pld(composed, inf_mass, start, np.float64(step), True)
    ts = np.array([200.0, 245.0, 290.0, 330.0])  # the composed loss: mean 244.9, sd 21.7
    want = np.array([rr_kfold_delta(eps, 0.0, count, t) for t in ts])
    got = np.asarray(pld.delta(ts))
    assert np.all(got >= want - 1e-15)
    np.testing.assert_allclose(got, want, rtol=1e-6)  # (the round-off charged: 6e-12 at 330)


@pytest.mark.slow
def test_randomized_response_mixed_matches_theorem_4_6():
    pairs = [(1.0, 1e-5), (0.5, 0.0), (0.25, 1e-6), (0.3, 1e-7)]  # 0.3 is not on the grid
    upper = pj.compose([pj.randomized_response(e, d) for e, d in pairs])
    lower = pj.compose([pj.randomized_response(e, d, pessimistic=False) for e, d in pairs])
    ts = np.array([0.0, 0.5, 1.0, 1.5, 2.0])
    want = np.array([rr_mixed_delta(pairs, t) for t in ts])
    got_up, got_lo = upper.delta(ts), lower.delta(ts)
    assert np.all(got_up >= want - 1e-15)
    assert np.all(got_lo <= want + 1e-15)
    np.testing.assert_allclose(got_up, want, rtol=5e-3, atol=1e-9)


def test_compose_sequence_of_gaussians_is_gaussian():
    sigmas = [1.0, 2.0, 0.5]
    mu = math.sqrt(sum(1 / s**2 for s in sigmas))
    upper = pj.compose([pj.gaussian(s) for s in sigmas])
    for d in [1e-4, 1e-9]:
        exact = gaussian_epsilon(mu, d)
        got = float(upper.epsilon(d))
        assert exact <= got <= exact * 1.001


def test_a_long_list_of_gaussians_composes_in_pairs_to_the_gdp_bracket():
    """37 Gaussians of distinct sigmas (pairs, pairs of pairs, one left over at each odd level):
    GDP of mu = sqrt(sum mu_i^2), held between the optimistic and the pessimistic composition.
    Composed one after another, 400 such PLDs took 385 s (a window size a step, each compiled)."""
    mus = 0.02 + 0.003 * np.arange(37)
    exact = [gaussian_epsilon(float(np.sqrt(np.sum(mus**2))), d) for d in (1e-4, 1e-9)]
    lower, upper = (pj.compose([pj.gdp(float(m), pessimistic=pe) for m in mus]).epsilon(
        np.array([1e-4, 1e-9])) for pe in (False, True))
    assert np.all(lower <= exact) and np.all(exact <= upper)
    assert np.all(upper <= np.array(exact) * (1 + 1e-3))


@pytest.mark.slow
def test_self_compose_equals_repeated_compose():
    p = pj.laplace(2.0)
    once = p.self_compose(4)
    fold = pj.compose([p, p, p, p])
    eps = np.array([0.0, 0.5, 1.0, 1.5])
    np.testing.assert_allclose(once.delta(eps), fold.delta(eps), rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("pessimistic", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_mass_is_conserved_through_composition(pessimistic):
    p = pj.laplace(0.5, pessimistic=pessimistic)
    for q in [p.self_compose(50), p.compose(pj.gaussian(1.0, pessimistic=pessimistic)),
              pj.compose([p, p], size=512)]:
        assert float(q.total_mass()) == pytest.approx(1.0, abs=1e-13)
        assert np.all(np.asarray(q.probs) >= 0)


def test_truncation_is_pessimistic():
    p = pj.gaussian(1.0).compose(pj.gaussian(1.0))
    small = pj.compose([pj.gaussian(1.0), pj.gaussian(1.0)], size=256)
    assert small.size == 256
    eps = np.linspace(0, 6, 13)
    assert np.all(small.delta(eps) >= p.delta(eps) - 1e-15)
    small_lo = pj.compose([pj.gaussian(1.0, pessimistic=False)] * 2, size=256)
    assert np.all(small_lo.delta(eps) <= p.delta(eps) + 1e-15)


def test_identity_is_neutral():
    p = pj.gaussian(1.5)
    eps = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(p.compose(pj.identity()).delta(eps), p.delta(eps), rtol=1e-9)
    np.testing.assert_allclose(p.self_compose(0).delta(eps), pj.identity().delta(eps))


def test_different_power_of_two_steps_compose_exactly():
    a = pj.gaussian(1.0, grid=pj.Grid(step=2.0**-6))
    b = pj.gaussian(1.0, grid=pj.Grid(step=2.0**-8))
    c = a.compose(b)
    assert float(c.step) == 2.0**-8
    exact = gaussian_epsilon(math.sqrt(2), 1e-6)
    assert exact <= float(c.epsilon(1e-6)) <= exact * 1.001


def test_pessimistic_and_optimistic_cannot_mix():
    with pytest.raises(ValueError, match="pessimistic"):
        pj.gaussian(1.0).compose(pj.gaussian(1.0, pessimistic=False))


@pytest.mark.slow
def test_batched_self_composition():
    sigmas = np.array([0.8, 1.0, 2.0])
    eps = pj.gaussian(sigmas).self_compose(100).epsilon(1e-5)
    assert eps.shape == (3,)
    for s, e in zip(sigmas, eps, strict=True):
        exact = gaussian_epsilon(10 / s, 1e-5)
        assert exact <= e <= exact * 1.001


@pytest.mark.slow
@pytest.mark.parametrize("sigma,count", [(1.0, 10_000), (0.5, 1000), (5.0, 100_000)])
def test_gaussian_large_counts(sigma, count):
    mu = math.sqrt(count) / sigma
    upper = pj.gaussian(sigma).self_compose(count)
    lower = pj.gaussian(sigma, pessimistic=False).self_compose(count)
    for d in [1e-5, 1e-10, 1e-12]:
        exact = gaussian_epsilon(mu, d)
        assert float(lower.epsilon(d)) <= exact <= float(upper.epsilon(d))
    exact = gaussian_epsilon(mu, 1e-5)
    assert float(upper.epsilon(1e-5)) <= exact * 1.001


# -- guards: every size a caller can pass is capped, huge counts refused, never NaN ---------------
def test_grid_size_is_capped():
    from pldjax.core import grid

    assert pj.Grid(size=grid.MAX_MECHANISM_SIZE).size == grid.MAX_MECHANISM_SIZE
    for size in (grid.MAX_MECHANISM_SIZE + 1, 2**28, 10**18):
        with pytest.raises(ValueError, match=r"Grid.size must be an integer in \[2, 1048576\]"):
            pj.Grid(size=size)


def test_explicit_window_sizes_are_capped():
    from pldjax.core import grid

    g = pj.gaussian(1.0)
    with pytest.raises(ValueError, match=r"size must be an integer in \[2, 33554432\]"):
        g.self_compose(10, size=2**26)
    with pytest.raises(ValueError, match=r"size must be an integer in \[1, 33554432\]"):
        pj.compose([g, g], size=grid.MAX_SIZE + 1)


def test_convolution_and_automatic_windows_are_capped(monkeypatch):
    from pldjax.core import grid

    g = pj.gaussian(1.0)  # 2048 points
    monkeypatch.setattr(grid, "MAX_SIZE", 1024)
    with pytest.raises(ValueError, match="FFT of 4096 points.*2 \\* grid.MAX_SIZE = 2048"):
        pj.compose([g, g])
    with pytest.raises(ValueError, match="MAX_SIZE = 1024"):
        g.self_compose(10**4)


@pytest.mark.parametrize("epsilon, step", [(1.0 + 4e-13, 1.0), (0.3, 0.1), (1.0, 1.0), (0.7, 0.25)])
def test_approx_dp_composition_on_a_grid_never_moves_a_loss_down(epsilon, step):
    """Each composed loss m epsilon (m = -count .. count in steps of 2) lies on the first grid
    point at or above it: a loss 4e-13 of a step above one was moved down onto it (epsilon read
    1.0 for the truth 1 + 4e-13)."""
    count = 3
    p = pj.approx_dp_composition(epsilon, 0.0, count, grid=pj.Grid(step=step))
    points = (int(p.offset) + np.nonzero(np.asarray(p.probs))[0]) * step
    exact = [Fraction(m) * Fraction(epsilon) for m in range(-count, count + 1, 2)]
    assert [Fraction(float(z)) >= loss for z, loss in zip(points, exact, strict=True)] == [True] * 4
    assert [Fraction(float(z) - step) < loss for z, loss in zip(points, exact, strict=True)] == [True] * 4
    assert float(p.epsilon(0.0)) >= Fraction(count) * Fraction(epsilon)


def test_approx_dp_composition_guards():
    from pldjax.core import grid

    limit = (grid.MAX_SIZE - 1) // 2
    for count in (limit + 1, 10**9, 10**18):
        with pytest.raises(ValueError, match=rf"count must be an integer in \[1, {limit}\]"):
            pj.approx_dp_composition(0.1, 0.0, count)
    with pytest.raises(ValueError, match="grid.step"):
        pj.approx_dp_composition(1.0, 0.0, 10, grid=pj.Grid(step=1e-9))
    with pytest.raises(ValueError, match="grid.step"):
        pj.approx_dp_composition(1e300, 0.0, 10, grid=pj.Grid(step=1.0))
    with pytest.raises(ValueError, match="epsilon must be a scalar"):
        pj.approx_dp_composition(np.array([0.1, 0.2]), 0.0, 10)
    with pytest.raises(ValueError, match="delta must be a scalar"):
        pj.approx_dp_composition(0.1, [1e-5], 10)


@pytest.mark.parametrize(("epsilon", "delta", "count", "t"), [(1e-4, 1e-9, 5000, 0.0),
                                                           (0.5, 1e-6, 40, 1.0), (2.0, 0.0, 300, 30.0)])
def test_approx_dp_composition_is_exact(epsilon, delta, count, t):
    """The closed form (Cor. 4.7 in mpmath), from above within the curve's round-off allowance
    (its binomial masses came from log-gamma, 8e-12 off at count 5000, and delta(0) was 4.6e-12
    below the truth)."""
    from reference import rr_kfold_delta

    from pldjax.kernels.hockey_stick import curve_roundoff

    exact = rr_kfold_delta(epsilon, delta, count, t)
    pld = pj.approx_dp_composition(epsilon, delta, count)
    value = float(pld.delta(t))
    assert exact <= value <= exact * (1 + 1e-14) + (exact - delta) * curve_roundoff(pld.size)


def test_approx_dp_composition_of_numbers_compiles_nothing():
    """Concrete parameters: the masses in NumPy (no program for each count); under jit the
    compiled masses, the same to a few ulps."""
    pld, names = compiled_programs(lambda: pj.approx_dp_composition(0.7, 1e-6, 37))
    assert names == []
    traced = jax.jit(lambda e, d: pj.approx_dp_composition(e, d, 37).probs)(0.7, 1e-6)
    np.testing.assert_allclose(pld.probs, traced, rtol=1e-13, atol=1e-300)
    assert float(pld.inf_mass) == pytest.approx(-np.expm1(37 * np.log1p(-1e-6)), rel=1e-15)


@pytest.mark.parametrize("count", [10**12, 10**13, 10**15, 10**18, 2**63, 10**30, 10**400])
def test_huge_counts_are_refused_consistently(count):
    g = pj.gaussian(1.0)
    with pytest.raises(ValueError, match="MAX_SIZE|too large|count must be an integer in"):
        g.self_compose(count)
    if count > 10**12:  # an explicit window cannot rescue indices beyond float64's integers
        with pytest.raises(ValueError, match="too large|count must be an integer in"):
            g.self_compose(count, size=1024)


def test_huge_count_in_a_small_explicit_window_is_a_sound_bound():
    # 10**12 runs of G_1 are G_(10**6): delta(eps) = 1 to double precision for eps << mu^2 / 2
    p = pj.gaussian(1.0).self_compose(10**12, size=1024)
    delta = p.delta([0.0, 10.0, 1e6])
    assert np.all(delta >= 1.0 - 1e-12) and np.all(delta <= 1.0)


def test_window_widths_refuse_lost_precision_and_huge_indices():
    """Each refusal is a CompositionTooWide (a ValueError the adapters catch alone, answering
    with the Chernoff bound), with the caller's remedy."""
    from pldjax.kernels.compose import MAX_INDEX, CompositionTooWide, pmf_summary, window_widths

    summary = jax.vmap(pmf_summary)(jnp.array([[0.5, 0.5]]))
    offset = np.array([-1])
    assert window_widths(summary, offset, 10, np.array([-10.0]), np.array([0.0])).tolist() == [11.0]
    with pytest.raises(CompositionTooWide, match="cannot be placed.*coarser Grid"):
        window_widths(summary, offset, 10, np.array([0.0]), np.array([-1.0]))
    with pytest.raises(CompositionTooWide, match="steps = .* too large for this grid.*raise it"):
        window_widths(summary, offset, MAX_INDEX, np.array([-1.0]), np.array([0.0]), "steps",
                      "raise it")
    # the support alone (offset + last index with mass, times the count) reaches MAX_INDEX
    with pytest.raises(CompositionTooWide, match="too large for this grid"):
        window_widths(summary, np.array([1]), MAX_INDEX // 2 + 1, np.array([0.0]), np.array([1.0]))
    # no finite mass: nothing to place
    empty = jax.vmap(pmf_summary)(jnp.zeros((1, 2)))
    assert window_widths(empty, offset, 10**30, np.array([np.inf]),
                         np.array([-np.inf])).tolist() == [1.0]


def test_compose_of_a_fixed_size_runs_under_a_jit_with_x64_off(x64_off):
    """The window's bulk was found by jnp.argmax, whose lowering under a caller's jit with x64
    off returned int32 where the trace (in pldjax's float64) held int64: the call raised."""
    def composed():
        return pj.compose([pj.gdp(1.0), pj.gdp(1.0)], size=4096).epsilon(1e-5)

    assert float(jax.jit(composed)()) == pytest.approx(float(composed()), rel=1e-9)


def test_compose_refuses_losses_beyond_max_index_rather_than_wrap_around():
    """Two PLDs of all their mass 2^62 steps up summed to an offset past int64, which wrapped
    around to -2^63: epsilon read 0 for a mechanism with no privacy."""
    from pldjax.kernels.compose import CompositionTooWide

    far = pj.PLD(np.array([1.0]), 0.0, 2**62, 2.0**-40)
    with pytest.raises(CompositionTooWide, match="MAX_INDEX"):
        pj.compose([far, far])
    near = pj.PLD(np.array([1.0]), 0.0, 2**51, 2.0**-40)  # losses add exactly below 2^53 steps
    assert float(pj.compose([near, near]).epsilon(0.0)) == 2.0**52 * 2.0**-40


@pytest.mark.parametrize("count", [2, 5, 10**18])
def test_all_mass_at_infinity_composes_to_itself(count):
    p = pj.approx_dp_composition(0.0, 1.0).self_compose(count)
    assert float(p.delta(3.0)) == 1.0
    assert float(p.epsilon(0.5)) == np.inf
    assert float(pj.identity().self_compose(count).delta(0.0)) == 0.0


def test_dpsgd_huge_steps_refused():
    with pytest.raises(ValueError, match="steps"):
        pj.dpsgd_epsilon(1.0, 0.01, 10**18, 1e-5)


@pytest.mark.parametrize("epsilon", [0.0, 1.0])
def test_no_finite_mass_self_composes_without_nan(epsilon):
    # found by the property tests: randomized_response(eps, delta=1) has all its mass at +inf
    p = pj.randomized_response(epsilon, 1.0).self_compose(2)
    assert float(p.delta(0.0)) == 1.0


def test_huge_count_guards_with_caller_x64_off(x64_off):
    g = pj.gaussian(1.0)
    with pytest.raises(ValueError, match="too large"):
        g.self_compose(10**18)
    assert float(pj.approx_dp_composition(0.0, 1.0).self_compose(10**18).delta(3.0)) == 1.0


@pytest.mark.parametrize("pessimistic", [True, False])
def test_self_compose_with_all_mass_at_infinity(pessimistic):
    """R_{eps,1} has no finite mass: its composition is fully revealing, never NaN."""
    composed = pj.randomized_response(1.0, 1.0, pessimistic=pessimistic).self_compose(2)
    assert np.all(composed.delta(np.array([0.0, 1.0])) >= (1.0 if pessimistic else 1 - 1e-12))
    assert not np.isnan(composed.epsilon(0.5))


@pytest.mark.parametrize("count", [1, pytest.param(10, marks=pytest.mark.slow)])
def test_pure_dp_composes_to_its_exact_epsilon_at_delta_zero(count):
    # the count-fold sum has no mass beyond count times the mechanism's largest loss, so round-off
    # must not spread mass there: Laplace(1), sensitivity 1, is count-DP exactly (closed form)
    event = pj.Event(pj.noise.Laplace(1.0))
    assert count <= pj.event_epsilon(event, count, 0.0) <= count * (1 + 1e-12)
    composed = pj.laplace(1.0).self_compose(count)
    assert count <= float(composed.epsilon(0.0)) <= count * (1 + 1e-12)
    for pessimistic in (True, False):  # and no delta (not even round-off) beyond it
        pld = pj.laplace(1.0, pessimistic=pessimistic).self_compose(count)
        assert float(pld.delta(count * (1 + 1e-9))) == 0.0


def _sum_of_uniforms_pmf(count: int, size: int) -> np.ndarray:
    """P(S = s), s = -size/2 .. size/2 - 1, for S the sum of ``count`` iid uniforms on {-3..3}:
    the exact spectrum (sin(3.5 t) / (7 sin(t / 2)))^count, one inverse FFT (size far above S's
    spread, so the wrap-around is negligible)."""
    theta = 2 * np.pi * np.arange(size // 2 + 1) / size
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(theta == 0, 1.0, np.sin(3.5 * theta) / (7 * np.sin(theta / 2)))
    power = np.sign(ratio) ** count * np.exp(count * np.log(np.abs(ratio)))
    return np.fft.fftshift(np.fft.irfft(power, size))


@pytest.mark.slow
def test_round_off_in_the_total_mass_is_not_charged_count_fold():
    # seven masses 1/7 sum to 1 - 2.2e-16 in float64; a 2^20-fold power made that a 2.3e-10
    # deficit, charged to the +inf atom (dpsgd_epsilon(2, 1e-6, 1e6, 1e-10) was inf)
    # (a PMF, not a privacy loss: its Q mass, sum p e^-z, is 1 + 5e-7; built unchecked)
    count, step, size = 2**20, 2.0**-11, 2**18
    pld = unchecked_pld(jnp.full(7, 1 / 7), jnp.float64(0.0), jnp.int64(-3), jnp.float64(step),
                        True)
    assert float(jnp.sum(pld.probs)) < 1.0
    composed = pld.self_compose(count)
    losses = (np.arange(size) - size // 2) * step
    exact = _sum_of_uniforms_pmf(count, size)
    for eps in (0.0, 1.0, 2.0, 3.0, 4.0):
        want = np.sum(np.maximum(-np.expm1(eps - losses), 0.0) * exact)
        assert want - 1e-12 <= float(composed.delta(eps)) <= want + 2e-11
    assert float(composed.inf_mass) <= 1e-15
    assert np.isfinite(pj.dpsgd_epsilon(2.0, 1e-6, 10**6, 1e-10))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["wide", "lattice", "few"])
def test_power_on_a_prefix_of_the_frequencies_matches_every_frequency(case, monkeypatch):
    """The power is taken only up to the batch's last frequency whose power is above e^-700
    (1e-304); the rest would change no bin by more than that. Against the power over every
    frequency (no shorter widths to choose from): equal to 1e-300 in every bin, on a composition
    wide enough that a short width is taken (and a shorter one would drop frequencies that
    matter), on a PMF on every other grid point (its spectrum
    is periodic: the full width is needed) and at a small count."""
    rng = np.random.default_rng(7)
    probs = rng.random((2, 64))
    if case == "lattice":
        probs[:, 1::2] = 0.0
    probs /= probs.sum(axis=1, keepdims=True)
    count = {"wide": 700.0, "lattice": 4000.0, "few": 3.0}[case]
    size = {"wide": 2**16, "lattice": 8192, "few": 256}[case]
    args = (jnp.asarray(probs), jnp.zeros(2), jnp.array([-20, -31]), jnp.full(2, 0.01),
            jnp.full(2, count))

    def composed():  # one program (a new trace for each call: the module constant changes)
        with jax.enable_x64(True):
            return jax.jit(lambda *a: compose_module.self_compose_rows(
                *a, size=size, tail=1e-18, pessimistic=True))(*args)

    spectrum = np.fft.rfft(probs, size)
    kept = np.abs(spectrum) ** count >= np.exp(-700.0)
    last = np.max(np.nonzero(kept.any(axis=0)))
    # wide: within a short width (1/16 of 32,769 frequencies), above the 256 always computed
    assert (case == "wide") == (256 < last < size // 2 // 16)
    prefix = composed()
    monkeypatch.setattr(compose_module, "_POWER_FRACTIONS", ())
    full = composed()
    for a, b in zip(prefix, full, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-300)


def test_rows_are_wrapped_to_the_window_from_their_centres():
    """wrap_rows: each row's masses summed modulo the window's size and turned to start at its
    centre, in NumPy and in jax.numpy, for rows shorter and longer than the window."""
    from pldjax.kernels.compose import wrap_rows

    probs = np.random.default_rng(3).random((3, 10))
    centers = np.array([0, 5, 9])
    for size in (16, 4):
        expected = np.zeros((3, size))
        for row, center in enumerate(centers):
            for i in range(10):
                expected[row, (i - center) % size] += probs[row, i]
        np.testing.assert_allclose(wrap_rows(np, probs, size, centers), expected, rtol=1e-15)
        np.testing.assert_allclose(wrap_rows(jnp, jnp.asarray(probs), size, jnp.asarray(centers)),
                                   expected, rtol=1e-15)


@pytest.mark.parametrize("on_host", [False, True])
def test_a_batch_composes_each_row_in_its_window_order(on_host):
    """self_compose_rows on a batch of counts 1 and 50: the run of one is its PMF itself, the
    other the 50-fold linear convolution (direct, np.convolve), both read from the window's first
    bin (start) up, compiled and in NumPy."""
    rng = np.random.default_rng(11)
    probs = rng.random((2, 40))
    probs /= probs.sum(axis=1, keepdims=True)
    offsets, counts = np.array([-7, -30]), np.array([1.0, 50.0])
    args = (probs, np.zeros(2), offsets, np.full(2, 0.01), counts)
    if on_host:
        out, inf_mass, start = compose_module.self_compose_rows(*args, size=4096, tail=1e-18,
                                                                pessimistic=True)
    else:
        with jax.enable_x64(True):
            out, inf_mass, start = jax.jit(lambda *a: compose_module.self_compose_rows(
                *a, size=4096, tail=1e-18, pessimistic=True))(*map(jnp.asarray, args))
    out, start = np.asarray(out), np.asarray(start)
    direct = [probs[0], functools.reduce(np.convolve, [probs[1]] * 50)]
    for row, (pmf, first) in enumerate(zip(direct, offsets * counts.astype(int), strict=True)):
        placed = np.zeros(4096)
        placed[first - start[row]:first - start[row] + pmf.size] = pmf
        tolerance = 0.0 if row == 0 else 1e-14
        np.testing.assert_allclose(out[row], placed, rtol=1e-13, atol=tolerance)
    assert float(inf_mass[0]) == 0.0


def test_the_search_on_a_coarse_copy_finds_the_t_of_the_points():
    """The Newton search for the tangency t runs on a coarse copy of a long PMF: blocks of
    consecutive points, each a normal of the block's mass, mean and variance (the last block
    padded with empty points). On a PMF of 16,389 points whose masses lie in its last blocks (whole
    empty blocks among them), it finds the t it finds on the same masses stored on 1,000 points,
    whose blocks start elsewhere: to 3e-7, where a block's variance 1% off moved t by 5e-7, a
    block's mean a quarter step off by 7e-6, a block's mass 0.1% off by 1.5e-4 (measured with
    the 1,000 points searched one by one)."""
    n, offset, step, count, tail = 2**14 + 5, -4_000, 1e-3, 1000.0, 1e-12
    probs = np.zeros(n)
    probs[n - 600:] = np.random.default_rng(n).random(600) ** 4
    probs[n - 400:n - 300] = 0.0
    probs /= probs.sum()

    def exponents(masses, first):
        with jax.enable_x64(True):
            return jax.jit(lambda p: compose_module.chernoff_exponents(p, first, step, count, tail))(
                jnp.asarray(masses))

    coarse, points = exponents(probs, offset), exponents(probs[n - 1000:], offset + n - 1000)
    for got, want in zip(coarse, points, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=3e-7, atol=0)


@pytest.mark.parametrize("count", [pytest.param(3.0, marks=pytest.mark.slow), 1000.0, 10**6])
def test_chernoff_exponents_are_exact_and_near_the_best_window(count):
    """The Newton search for the tangency t runs on a coarse copy of the PMF (blocks taken as
    normals of their mass, mean and variance: no bound), and K is then evaluated on the PMF itself
    at the t found. Every returned exponent must be the PMF's own count log E[e^{+-tZ}] (checked
    in NumPy, log-sum-exp in float64), and the window edges within a little of the best Chernoff
    edges (a fine scan over t, SciPy) on a 40,000-point PMF with a heavy upper tail."""
    from scipy.optimize import minimize_scalar
    from scipy.special import logsumexp

    n, offset, step, tail = 40_000, -4_000, 1e-4, 1e-12
    z = (offset + np.arange(n)) * step
    log_p = np.logaddexp(-0.5 * ((z - 0.01) / 0.02) ** 2, np.log(1e-3) - (z - 0.01) / 0.1)
    probs = np.exp(log_p - logsumexp(log_p))
    with jax.enable_x64(True):
        t_up, up, t_down, down = (np.asarray(a) for a in compose_module.chernoff_exponents(
            jnp.asarray(probs), offset, step, count, tail))
        summary = compose_module.pmf_summary(jnp.asarray(probs))
        lo, hi = (float(e) * step for e in compose_module.summary_window(
            summary, offset, step, count, tail, (t_up, up, t_down, down)))
    used = t_up > 0
    assert used.any() and (t_down > 0).any()
    for ts, ks, side in ((t_up, up, 1.0), (t_down, down, -1.0)):
        for t, k in zip(ts[ts > 0], ks[ts > 0], strict=True):
            exact = count * logsumexp(np.log(probs) + side * t * z)
            assert k == pytest.approx(exact, rel=1e-12, abs=1e-12)

    def edge(side):  # the best Chernoff edge of the count-fold sum on this side
        def bound(log_t):
            t = np.exp(log_t)
            return (count * logsumexp(np.log(probs) + side * t * z) - np.log(tail / 2)) / t
        return side * minimize_scalar(bound, bounds=(-15, 8), method="bounded",
                                      options={"xatol": 1e-10}).fun

    # never beyond the sum's support
    best_hi = min(edge(1.0), count * (offset + n - 1) * step)
    best_lo = max(edge(-1.0), count * offset * step)
    width = best_hi - best_lo
    assert best_hi - 1e-9 * width <= hi + step <= best_hi + 1e-3 * width + 2 * step
    assert best_lo - 1e-3 * width - 2 * step <= lo - step <= best_lo + 1e-9 * width


def _as_off_the_cpu(args, *, cpu, elsewhere):
    """compilation.early_exit_on_cpu as a GPU runs it: what compose's kernels compute there."""
    return elsewhere(*args)


@pytest.mark.parametrize("count", [pytest.param(3.0, marks=pytest.mark.slow), 700.0,
                                   pytest.param(10**6, marks=pytest.mark.slow)])
def test_programs_without_early_exits_match_the_cpus(count, monkeypatch):
    """Off the CPU, the Chernoff search runs all its iterates (those after it converged keep
    its carry) and the power takes every frequency, so that a GPU never waits for a predicate.
    The same t bit for bit as the CPU's early exits, and the same composition to the FFT's
    round-off (the branch is compiled apart from the rest; the count 700 composition takes the
    CPU's short power width)."""
    rng = np.random.default_rng(11)
    probs = rng.random((2, 64)) ** 3
    probs /= probs.sum(axis=1, keepdims=True)
    args = (jnp.asarray(probs), jnp.zeros(2), jnp.array([-20, -31]), jnp.full(2, 0.01),
            jnp.full(2, count))

    def run():
        def both(*args):
            exponents = jax.vmap(compose_module.chernoff_exponents, (0, 0, 0, 0, None))(
                args[0], args[2], args[3], args[4], 1e-18)
            composed = compose_module.self_compose_rows(*args, size=2**16, tail=1e-18,
                                                        pessimistic=True)
            return (*exponents, *composed)

        with jax.enable_x64(True):  # one program each time: jit traces the patched module anew
            return [np.asarray(a) for a in jax.jit(both)(*args)]

    on_cpu = run()
    monkeypatch.setattr(compose_module, "early_exit_on_cpu", _as_off_the_cpu)
    elsewhere = run()
    for a, b in zip(on_cpu[:4], elsewhere[:4], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(on_cpu[4:], elsewhere[4:], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("sigma,count", [(1.0, 100), pytest.param(4.0, 3000, marks=pytest.mark.slow)])
def test_gpu_composition_of_gaussians_bounds_the_gdp_closed_form(sigma, count, monkeypatch):
    """The composition as a GPU computes it (every Chernoff iterate, every frequency's power),
    run here on the Gaussian PLD: delta(eps) at or above the closed form of G_mu, mu =
    sqrt(count) / sigma, and within 0.1% of it or the FFT's round-off (1e-14), as the CPU's."""
    one = pj.gaussian(sigma)
    on_cpu = one.self_compose(count)
    size = on_cpu.probs.shape[0]
    monkeypatch.setattr(compose_module, "early_exit_on_cpu", _as_off_the_cpu)
    with jax.enable_x64(True):
        probs, inf_mass, offset = jax.jit(lambda *a: compose_module.self_compose_rows(
            *a, size=size, tail=1e-18, pessimistic=True))(
            one.probs[None], one.inf_mass[None], jnp.asarray(one.offset)[None],
            jnp.asarray(one.step)[None], jnp.full(1, float(count)))
    composed = pj.PLD(probs[0], inf_mass[0], offset[0], one.step, True)
    mu = math.sqrt(count) / sigma
    for eps in (0.0, 0.5 * mu * mu + mu, mu * mu + 2 * mu):
        exact = gaussian_delta(mu, eps)
        got = float(composed.delta(eps))
        assert exact * (1 - 2e-9) - 2e-15 <= got <= exact * (1 + 1e-3) + 1e-14
        assert got == pytest.approx(float(on_cpu.delta(eps)), rel=1e-9, abs=1e-14)


def test_an_optimistic_round_off_surplus_is_scaled_down_not_taken_from_the_top():
    """A PLD of losses 0 and 0.01 nats with masses summing to 1 + 2^-52 (as the round-off of an
    optimistic PLD's masses can leave them), composed 10^5 times: its loss is 0.01 times a
    binomial count (scipy's pmf the truth), and the optimistic delta stays below it and within
    1e-6 of it down to delta = 1e-7, 1e-3 at 2e-11. The surplus, grown 10^5-fold to 2e-11, was
    taken from the highest bins, where delta lives: 1e-4 low at delta = 1e-7, 22% at 2e-11."""
    from scipy.stats import binom

    eps0, p, count = 0.01, 0.01, 10**5
    low = np.nextafter(np.nextafter(1 - p, 2.0), 2.0)
    assert low + p > 1.0
    composed = pj.PLD(np.array([low, p]), 0.0, 0, eps0, pessimistic=False).self_compose(count)
    k = np.arange(count + 1)
    losses, weights = eps0 * k, binom.pmf(k, count, p)
    for eps, within in ((11.0, 1e-6), (11.5, 1e-6), (12.0, 1e-3)):
        above = losses > eps
        truth = np.sum(weights[above] * -np.expm1(eps - losses[above]))
        got = float(composed.delta(eps))
        assert truth * (1 - within) <= got <= truth, (eps, got, truth)


def test_a_round_off_surplus_in_the_masses_stays_a_scaling_at_a_huge_count():
    """A PMF whose finite masses add up to a few ulps over 1 - inf_mass (round-off; rows in tiles
    sum in another order than rows alone): at 10^9 steps the surplus grows a millionfold, and
    must grow as a scaling of the composed PMF. The low frequencies' total had been taken from
    the PMF's summary while their deviations came from the masses themselves: the mismatch
    spread a constant over the whole window, and epsilon(1e-5) of sigma 0.3, q 1e-10 read 5.26
    for 0.74 (4 ulps of surplus)."""
    remove = pj.gaussian(0.3, sampling_prob=1e-10).forward
    probs = np.asarray(remove.probs)

    def composed(scale):
        pld = unchecked_pld(probs * scale, float(remove.inf_mass), int(remove.offset),
                            float(remove.step), True).self_compose(10**9)
        return pld.epsilon(1e-5), pld.delta(1.0)

    (eps, delta), (eps_over, delta_over) = composed(1.0), composed(1.0 + 4e-15)
    assert eps <= eps_over <= 1.25 * eps
    assert delta <= delta_over <= 1.05 * delta


def _swapped_bound(pld, steps, epsilons):
    """The add direction's delta bound from a composition of ``pld`` (the remove direction of a
    Poisson-subsampled pair), composed in NumPy on a window that holds both directions."""
    from pldjax.kernels.compose import (
        chernoff_exponents,
        compose_wrapped_rows,
        pmf_summary,
        swapped_delta_bound,
        wrap_rows,
    )

    probs = np.asarray(pld.probs, np.float64)[None]
    offset, step = np.asarray([int(pld.offset)]), np.asarray([float(pld.step)])
    count, inf_mass = np.asarray([float(steps)]), np.asarray([float(pld.inf_mass)])
    summary = pmf_summary(probs[0])
    summary = type(summary)(*(np.asarray([v]) for v in summary))
    exponents = [np.asarray([e]) for e in chernoff_exponents(probs[0], offset[0], step[0],
                                                             count[0], 1e-18)]
    size = 1 << 18
    _, _, start, parts = compose_wrapped_rows(
        wrap_rows(np, probs, size, summary.center), summary, inf_mass, offset, step, count,
        exponents, tail=np.asarray([1e-18]), pessimistic=True, swapped=True)
    one = type(parts)(*(a[0] for a in parts))
    return np.array([swapped_delta_bound(one, start[0], step[0], count[0], eps)
                     for eps in epsilons])


@pytest.mark.parametrize("sigma, steps", [(1.0, 1), (1.0, 1000), (2.0, 3000), (0.8, 10_000)])
def test_a_remove_composition_bounds_the_add_direction_from_above(sigma, steps):
    """The add pair of Poisson subsampling is the remove pair swapped: the remove direction's
    composition bounds the add direction's delta between its optimistic and pessimistic
    compositions of its own."""
    remove = pj.gaussian(sigma=sigma, sampling_prob=0.01)
    epsilons = np.array([0.0, 0.005, 0.5, 1.0, 2.0, 4.0])
    bound = _swapped_bound(remove, steps, epsilons)
    lower = pj.gaussian(sigma=sigma, sampling_prob=0.01, pessimistic=False).self_compose(steps)
    upper = remove.self_compose(steps)
    low = np.array([float(lower.reverse.delta(e)) for e in epsilons])
    high = np.array([float(upper.reverse.delta(e)) for e in epsilons])
    assert np.all(bound >= low)
    # as tight as the add direction's own composition, up to the one-step masses' round-off
    # charged count-fold
    assert np.all(bound <= high * (1 + 1e-3) + 1e-7)


@pytest.mark.parametrize("on_host", [False, True])
def test_a_few_fold_composition_of_a_skewed_pmf_is_exact_to_round_off(on_host):
    """The 3-fold composition of a geometric PMF, some of whose lowest frequencies have |P_k -
    m| / m near 0.6 (where XLA's complex log1p loses digits, 2e-14 relative, an error the count
    multiplies), matches the direct convolution (np.convolve) to round-off, compiled and in
    NumPy."""
    probs = np.exp(-np.arange(1400) / 20.0)
    probs = (probs / probs.sum())[None]
    args = (probs, np.zeros(1), np.zeros(1, np.int64), np.full(1, 1 / 64), np.full(1, 3.0))
    options = dict(size=4096, tail=1e-13, pessimistic=True)
    if on_host:
        out, _, start = compose_module.self_compose_rows(*args, **options)
    else:
        with jax.enable_x64(True):
            out, _, start = jax.jit(lambda *a: compose_module.self_compose_rows(*a, **options))(
                *map(jnp.asarray, args))
    out, start = np.asarray(out)[0], int(np.asarray(start)[0])
    direct = functools.reduce(np.convolve, [probs[0]] * 3)
    placed = np.zeros(4096)
    placed[-start:] = direct[:4096 + start]  # the window starts below the support
    # (the round-off charged to every bin is taken back from the lowest one)
    others = np.arange(4096) != -start
    np.testing.assert_allclose(out[others], placed[others], rtol=0, atol=2e-15)
    assert placed[-start] - 1e-13 <= out[-start] <= placed[-start]
    # far out, where the convolution holds no mass, the round-off charged to each bin (XLA's
    # complex log1p would double it, to 1.3e-17)
    assert np.max(out[placed < 1e-25]) <= 1e-17


def _delta_of_masses(probs, inf_mass, offset, step, eps) -> np.ndarray:
    """delta(eps) of a one-direction PMF (NumPy or extended precision), bin by bin."""
    losses = (offset + np.arange(probs.shape[0])) * probs.dtype.type(step)
    out = []
    for e in eps:
        above = losses > e
        out.append(float(inf_mass + np.sum(probs[above] * -np.expm1(e - losses[above]))))
    return np.array(out)


def _extended_power(probs, count: int) -> np.ndarray:
    """The count-fold linear convolution of a PMF in extended precision (NumPy's long double
    FFT, by squaring)."""
    def convolve(a, b):
        length = a.size + b.size - 1
        size = 1 << (length - 1).bit_length()
        return np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)[:length]

    result, base = None, probs.astype(np.longdouble)
    while count:
        if count & 1:
            result = base if result is None else convolve(result, base)
        count >>= 1
        if count:
            base = convolve(base, base)
    return result


@pytest.mark.parametrize("on_host", [False, True])
def test_round_off_next_to_a_large_atom_is_charged_by_its_norm(on_host):
    """Two steps of the Gaussian (sigma 0.3) sampled with probability 1e-6, on a 2^-10 grid: all
    but 4e-3 of the mass lies in a few bins near 0, and the FFT's error comes in spikes near
    them (hundreds of times its rms). The composed pessimistic delta stays above the
    composition in extended precision (NumPy's long double FFT) wherever that is above its own
    round-off, within 1% of it down to delta = 1e-10 and 8% down to 1e-11; the largest spike
    charged to every bin put it 4% above at 1.1e-10 and 38% at 1.1e-11."""
    one = pj.gaussian(0.3, sampling_prob=1e-6, grid=pj.Grid(step=2.0**-10)).forward
    probs, inf_mass, offset, step = (np.asarray(a) for a in (one.probs, one.inf_mass, one.offset,
                                                               one.step))
    size = 2 * probs.shape[0]
    exact = _extended_power(probs, 2)
    eps = np.linspace(0.0, 24.0, 97)
    truth = _delta_of_masses(exact, 1 - (1 - np.longdouble(inf_mass)) ** 2, 2 * int(offset),
                             float(step), eps)
    args = (probs[None], inf_mass[None], offset[None], step[None], np.full(1, 2.0))
    options = dict(size=size, tail=1e-30, pessimistic=True)
    if on_host:
        out, out_inf, start = compose_module.self_compose_rows(*args, **options)
    else:
        with jax.enable_x64(True):
            out, out_inf, start = jax.jit(
                lambda *a: compose_module.self_compose_rows(*a, **options))(*map(jnp.asarray, args))
    got = _delta_of_masses(np.asarray(out)[0], float(np.asarray(out_inf)[0]),
                           int(np.asarray(start)[0]), float(step), eps)
    resolved = truth > 1e-16  # the extended-precision sum's own round-off is about 4e-19
    assert np.all(got[resolved] >= truth[resolved] * (1 - 1e-12))
    small = (truth >= 1e-11) & (truth <= 1e-9)
    assert np.count_nonzero(small) >= 5
    assert np.all(got[small] <= truth[small] * 1.08)
    assert np.all(got[truth >= 1e-10] <= truth[truth >= 1e-10] * 1.01)


@pytest.mark.parametrize("pessimistic", [True, False])
def test_round_off_charges_on_the_host_are_the_compiled_kernels(pessimistic):
    """Each bin's round-off charge, computed in NumPy, agrees with the compiled kernel's
    wherever the support lies: inside the window, across it, beyond either end or empty."""
    size = 4096
    raw = np.random.default_rng(0).normal(size=size) * 1e-3 + np.linspace(0.0, 1e-3, size)
    charges = jax.jit(compose_module.roundoff_charges, static_argnums=3)
    for first, last in [(0, size - 1), (-7, size + 9), (size // 3, size // 2), (-1e18, 1e18),
                        (size + 2, size + 5), (-9, -2), (5, 4), (size - 1, size - 1)]:
        bounds = np.float64(first), np.float64(last)
        host, host_level = compose_module.roundoff_charges(raw, *bounds, pessimistic)
        with jax.enable_x64(True):
            compiled, level = charges(jnp.asarray(raw), *bounds, pessimistic)
        inside = (np.arange(size) >= first) & (np.arange(size) <= last)
        assert np.all(host[~inside] == 0.0)
        # (the levels' sums of squares add in another order: a few ulps, times the ranks that a
        # bin's charge takes the difference of)
        np.testing.assert_allclose(host, np.asarray(compiled), rtol=1e-10, atol=0.0)
        np.testing.assert_allclose(host_level, float(level), rtol=1e-12)
        if pessimistic and inside.any():  # E a bin from the top, then the sqrt law's increments
            assert host[inside].max() <= host_level * (1 + 1e-12)


@pytest.mark.parametrize("sigma,q,count,step", [
    (0.3, 1e-6, 2, 2.0**-8), (0.5, 1e-4, 10, 2.0**-8), (2.0, 0.1, 20, 2.0**-8),
    (1.0, 1.0, 30, 2.0**-6), (0.5, 1e-3, 100, 2.0**-7), (3.0, 0.5, 100, 2.0**-7)])
def test_pessimistic_powers_bound_their_extended_precision_convolution(sigma, q, count, step):
    """Each direction of a Gaussian step (Poisson-sampled, or not at q = 1) composed count times
    in one FFT power, in a window that holds the whole sum: its delta is at or above the same
    composition in extended precision at every epsilon where that is above 1e-15 (its own
    round-off). The spectrum's logs (from the deviation from the total mass on a leading run of
    frequencies, from P itself beyond) and the round-off charged keep the power on the safe
    side, from a step whose mass sits in a few bins (q = 1e-6) to a spread one (q = 1)."""
    for one in pj.gaussian(sigma, sampling_prob=q, grid=pj.Grid(step=step)).directions():
        probs, inf_mass, offset = (np.asarray(a) for a in (one.probs, one.inf_mass, one.offset))
        exact = _extended_power(probs, count)
        size = 1 << (exact.size - 1).bit_length()
        out, out_inf, start = compose_module.self_compose_rows(
            probs[None], inf_mass[None], offset[None], np.full(1, step), np.full(1, float(count)),
            size=size, tail=1e-300, pessimistic=True)
        eps = np.linspace(0.0, (count * int(offset) + exact.size) * step, 200)
        truth = _delta_of_masses(exact, 1 - (1 - np.longdouble(inf_mass)) ** count,
                                 count * int(offset), step, eps)
        got = _delta_of_masses(np.asarray(out)[0], float(np.asarray(out_inf)[0]),
                               int(np.asarray(start)[0]), step, eps)
        resolved = truth > 1e-15
        assert np.all(got[resolved] >= truth[resolved] * (1 - 1e-12)), (sigma, q, count)


@pytest.mark.parametrize("start, step, size", [(-40_000, 1e-3, 2**16), (123, 0.011, 3 * 2**14),
                                               (-7, 0.05, 1_000)])
def test_a_windows_exponentials_are_the_exponentials_of_its_losses(start, step, size):
    """e^-loss on a window (by blocks where the size allows, compiled and in NumPy) is within a
    few units of round-off of mpmath's, beyond the rounding of the loss itself."""
    import mpmath

    from pldjax.kernels.compose import falling_exponentials

    picked = np.unique(np.linspace(0, size - 1, 97).astype(np.int64))
    with mpmath.workdps(40):
        exact = np.array([float(mpmath.exp(-(start + int(j)) * mpmath.mpf(step))) for j in picked])
    losses = np.abs((start + picked) * step)
    allowed = (4.0 + losses) * np.finfo(np.float64).eps
    for got in (falling_exponentials(np.int64(start), np.float64(step), size),
                jax.jit(falling_exponentials, static_argnums=2)(start, step, size)):
        assert np.all(np.abs(np.asarray(got)[picked] / exact - 1.0) <= allowed)
