"""Sampling schemes (pldjax.mechanisms.sampling): the records, their map onto the kernels, and references
(mpmath, an exact enumeration of small datasets, dp-accounting's PLD and RDP accountants)."""

import itertools
import logging

import jax
import mpmath as mp
import numpy as np
import pytest
import scipy.special
from compiled_programs import programs_of_a_new_process
from reference import mixture_delta_mp

import pldjax as pj
from pldjax.core.precision import float64
from pldjax.kernels.discretize import mechanism_curve, mechanism_estimate

# -- mixture of shifts (several contributions per user) -----------------------------------------------
#: sigma, scales, probs: up to two contributions of norm <= 1 per user (dp-accounting's example)
MIX = (0.8, (0.0, 1.0, 2.0), (0.81, 0.18, 0.01))


def _mixture(pessimistic=True, sigma=MIX[0], scales=MIX[1], probs=MIX[2]):
    return pj.privacy_loss(pj.noise.Gaussian(sigma), pj.sampling.Mixture(scales, probs),
                           pessimistic=pessimistic)


@pytest.mark.parametrize("sigma, scales, probs", [(0.05, (0.0, 1.0, 3.0), (0.9, 0.09, 0.01)),
                                                   (1.0, (0.0, 1.0, 2.0), (0.98, 0.015, 0.005))])
def test_a_mixtures_curves_bracket_mpmath_across_its_window(sigma, scales, probs):
    """The pessimistic and optimistic curves of a mixture of shifts at 61 points across each
    direction's window (eps >= 0), compiled and in NumPy: at or above (at or below) the
    mixture's curve at 50 digits, within 1e-7. The shifts a_k = w_k / sigma are rounded, which
    moves the tails at x - a_k by their slope times an ulp of a_k: the optimistic curve of
    sigma = 0.05 sat 5e-15 above the truth (a_k = 60 at eps = 2,084)."""
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.Mixture(scales, probs))
    mechanism, params, _ = event.directions()
    lower_params = event.directions(False)[1]
    pessimistic = jax.jit(float64(lambda p, z: mechanism_curve(mechanism, p, z)))
    optimistic = jax.jit(float64(lambda p, z: mechanism_estimate(mechanism, p)(z)[4]))
    for direction, pld in enumerate(event.pld().directions()):
        z = np.linspace(int(pld.offset), int(pld.offset) + pld.size - 1, 61) * float(pld.step)
        z = z[z >= 0]
        truth = np.array([mixture_delta_mp(sigma, scales, probs, e, add=direction == 1) for e in z])
        held = truth > 1e-300
        row, lower_row = (*params, np.float64(direction)), (*lower_params, np.float64(direction))
        with np.errstate(all="ignore"):
            in_numpy = (mechanism_curve(mechanism, tuple(np.asarray(p) for p in row), z),
                        mechanism_estimate(mechanism, tuple(np.asarray(p) for p in lower_row))(z)[4])
        for upper, lower in ((np.asarray(pessimistic(row, z)), np.asarray(optimistic(lower_row, z))),
                             in_numpy):
            assert isinstance(upper, np.ndarray) and isinstance(lower, np.ndarray)
            assert np.all(upper[held] >= truth[held])
            assert np.all(upper[held] <= truth[held] * (1 + 1e-7))
            assert np.all(lower[held] <= truth[held])
            assert np.all(lower[held] >= truth[held] * (1 - 1e-7))


def test_a_mixtures_pld_compiles_nothing_in_a_new_process(tmp_path):
    """A mixture's PLD (both estimates) is built in NumPy, as the Gaussian's is: a new process
    compiles no program, and reads the epsilon this process reads."""
    names, printed = programs_of_a_new_process("""
        import pldjax as pj
        mixture = pj.sampling.Mixture.binomial(0.01, 4)
        for pessimistic in (True, False):
            print(float(pj.privacy_loss(pj.noise.Gaussian(1.0), mixture,
                                        pessimistic=pessimistic).epsilon(1e-6)))
    """, cache=tmp_path / "xla")  # empty: every program compiles
    assert names == []
    mixture = pj.sampling.Mixture.binomial(0.01, 4)
    assert [float(line) for line in printed.splitlines()[-2:]] == [
        float(pj.privacy_loss(pj.noise.Gaussian(1.0), mixture, pessimistic=p).epsilon(1e-6))
        for p in (True, False)]


def test_mixture_single_step_against_mpmath():
    """Both directions, pessimistic above and optimistic below the mpmath values, and tight."""
    up, lo = _mixture(), _mixture(False)
    assert not up.symmetric
    # the add direction's loss ends at -log p_0 = 0.21: points away from the chord over its end
    # (the curve falls steeply towards it: 5e-3 there)
    cases = [(np.array([0.0, 0.05, 0.2, 0.5, 1.0, 2.0, 4.0]), 2e-3), (np.array([0.0, 0.05, 0.1]), 5e-3)]
    for i, (eps, rel) in enumerate(cases):
        want = np.array([mixture_delta_mp(*MIX, e, add=i == 1) for e in eps])
        upper, lower = np.asarray(up.directions()[i].delta(eps)), np.asarray(lo.directions()[i].delta(eps))
        assert np.all(upper >= want * (1 - 1e-9) - 1e-15)
        assert np.all(lower <= want * (1 + 1e-9) + 1e-15)
        assert np.all(upper <= want * (1 + rel))
        assert np.all(lower >= want * (1 - 5 * rel))
    for pld in (up, lo):
        for direction in pld.directions():
            assert float(direction.total_mass()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.slow
def test_mixture_of_many_components_against_mpmath():
    """A user with 200 records (Mixture.binomial, 201 components). Each component was its own
    traced term, and 101 of them crashed the compiler (signal 11 after a minute, 5 GB); they are
    stacked now. Components of probability 0 (the binomial's far tail underflows) are left out,
    and beyond MAX_COMPONENTS present ones a ValueError says so."""
    sigma = 2.0
    mixture = pj.sampling.Mixture.binomial(0.05, 200)
    up = pj.privacy_loss(pj.noise.Gaussian(sigma), mixture)
    present = mixture.probs > 0
    eps = np.array([0.5, 2.0, 5.0])
    want = np.array([mixture_delta_mp(sigma, mixture.scales[present], mixture.probs[present], e,
                                    add=False) for e in eps])
    upper = np.asarray(up.directions()[0].delta(eps))
    lower = np.asarray(pj.privacy_loss(pj.noise.Gaussian(sigma), mixture, pessimistic=False)
                       .directions()[0].delta(eps))
    # shifts up to 100, but the components beyond probability 2^-60 do not set the grid: steps
    # of 1/4 nat (2 nats when all of them did, and the upper bound 3% above)
    assert np.all(lower <= want * (1 + 1e-9)) and np.all(lower >= want * (1 - 2e-3))
    assert np.all(upper >= want * (1 - 1e-9)) and np.all(upper <= want * (1 + 1e-9))
    with pytest.raises(ValueError, match="MAX_COMPONENTS"):
        pj.privacy_loss(pj.noise.Gaussian(sigma), pj.sampling.Mixture.binomial(0.5, 10**4))


@pytest.mark.slow
def test_negligible_components_fold_into_the_pessimistic_atom_and_stay_in_the_optimistic():
    """Binomial(20, 1e-3): the 13 components from 8 copies on (each below 2^-60) leave the
    pessimistic mixture's programs for an output that reveals the record (a dominating pair);
    both PLDs against mpmath over all 21 components."""
    sigma, mixture = 2.0, pj.sampling.Mixture.binomial(1e-3, 20)
    up = pj.privacy_loss(pj.noise.Gaussian(sigma), mixture)
    lo = pj.privacy_loss(pj.noise.Gaussian(sigma), mixture, pessimistic=False)
    eps = np.array([0.0, 0.002, 0.005, 0.01])
    for i, add in enumerate((False, True)):
        want = np.array([mixture_delta_mp(sigma, mixture.scales, mixture.probs, e, add=add)
                         for e in eps])
        upper = np.asarray(up.directions()[i].delta(eps))
        lower = np.asarray(lo.directions()[i].delta(eps))
        assert np.all(upper >= want) and np.all(upper <= want * (1 + 1e-3) + 1e-15)
        assert np.all(lower <= want) and np.all(lower >= want * (1 - 1e-2))


def _binomial_mixture_loss(y, shifts, log_probs):
    """log sum_k p_k e^(a_k y - a_k^2 / 2): the loss of the Gaussian mixture against N(0, 1)."""
    return scipy.special.logsumexp(log_probs + shifts * y - shifts**2 / 2)


@pytest.mark.parametrize("tail", [1e-9, 1e-15])
def test_binomial_mixture_window_holds_all_but_the_tail_and_leaves_unlikely_copies_out(tail):
    """The window a step of Mixture.binomial gets for a tail (the mass of P each of many composed
    steps may leave outside; 1e-15 is 1,000 steps at delta 1e-6) holds all but that mass of P in
    both directions: the outputs where the loss reaches the window's ends, found by root finding
    on the closed-form loss, leave at most ``tail`` of the normal mixture (remove) or of N(0, 1)
    (add) outside (scipy's tails). Ten draws at rate 1e-4 hold up to five copies with
    probability above 2^-60, whose losses the default window reaches (23 nats); the tail's
    window reaches only the likely copies' losses (below 3 nats). No tail widens the default
    window."""
    from scipy import optimize, stats

    from pldjax.kernels.discretize import window
    from pldjax.mechanisms.subsampling import ADD, REMOVE

    mixture = pj.sampling.Mixture.binomial(1e-4, 10)
    event = pj.Event(pj.noise.Gaussian(1.0), mixture, "replace_special")
    mechanism, params, both = event.directions(pessimistic=False)  # every component, none folded
    assert both
    present = mixture.probs > 0
    shifts, log_probs = mixture.scales[present], np.log(mixture.probs[present])
    highest = []
    for direction in (REMOVE, ADD):
        center, half = (float(v) for v in window(mechanism, (*params, direction), tail))
        low, high = center - half, center + half
        if direction == ADD:  # the add direction's loss is -l(y), under P = N(0, 1)
            low, high = -high, -low
        y_low, y_high = (optimize.brentq(lambda y, v=v: _binomial_mixture_loss(
            y, shifts, log_probs) - v, -60.0, 60.0, xtol=1e-13) for v in (low, high))
        if direction == REMOVE:
            outside = np.sum(np.exp(log_probs) * (stats.norm.cdf(y_low - shifts)
                                                  + stats.norm.sf(y_high - shifts)))
        else:
            outside = stats.norm.cdf(y_low) + stats.norm.sf(y_high)
        assert outside <= tail * (1 + 1e-6), (direction, outside)
        highest.append(high if direction == REMOVE else -low)
    assert max(highest) < 3.0, highest
    default_center, default_half = (float(v) for v in window(mechanism, (*params, REMOVE), 0.0))
    assert default_center + default_half > 20.0
    for tiny in (tail, 1e-30, 1e-300):
        center, half = (float(v) for v in window(mechanism, (*params, REMOVE), tiny))
        assert default_center - default_half - 1e-12 <= center - half  # round-off of the sums
        assert center + half <= default_center + default_half + 1e-12


@pytest.mark.slow
def test_accounting_on_the_binomial_mixtures_tail_window_keeps_its_bounds_together():
    """The accounting the 1e-15 window above serves (1,000 steps at delta 1e-6), 10 draws from
    10^4 records: its bounds 1e-3 apart."""
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Mixture.binomial(1e-4, 10),
                     "replace_special")
    upper = pj.event_epsilon(event, 1000, 1e-6)
    lower = pj.event_epsilon(event, 1000, 1e-6, pessimistic=False)
    assert lower <= upper <= lower * (1 + 1e-3)


def test_mixture_of_nothing_and_one_contribution_is_poisson_sampling():
    q = 0.05
    mixed = _mixture(scales=[0.0, 1.0], probs=[1 - q, q])
    poisson = pj.gaussian(MIX[0], sampling_prob=q)
    eps = np.array([0.0, 0.1, 0.5, 1.0])
    for a, b in zip(mixed.directions(), poisson.directions(), strict=True):
        assert float(a.step) == float(b.step) and a.size == b.size
        np.testing.assert_allclose(np.asarray(a.delta(eps)), np.asarray(b.delta(eps)), rtol=1e-9, atol=1e-16)


def test_mixture_binomial_user_level():
    m = pj.sampling.Mixture.binomial(0.1, 3)
    np.testing.assert_array_equal(m.scales, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(m.probs, [0.729, 0.243, 0.027, 0.001], rtol=1e-12)
    one = pj.sampling.Mixture.binomial(0.1, 1)
    np.testing.assert_allclose(one.probs, [0.9, 0.1], rtol=1e-15)
    np.testing.assert_allclose(pj.sampling.Mixture.binomial(0.0, 2).probs, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(pj.sampling.Mixture.binomial(1.0, 2).probs, [0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="count"):
        pj.sampling.Mixture.binomial(0.1, 0)


@pytest.mark.parametrize("call,match", [
    (lambda: pj.sampling.TruncatedPoisson(0.1, np.array([100, 200]), 10),
     r"dataset_size must be a single integer .* shape \(2,\)"),
    (lambda: pj.sampling.Mixture([0.0, 1.0], [0.5, 0.6]), "add up to 1"),
    (lambda: pj.sampling.Mixture([0.0, -1.0], [0.5, 0.5]), "scales"),
    (lambda: pj.sampling.Mixture([0.0, float("inf")], [0.5, 0.5]), "scales"),
    (lambda: pj.sampling.Mixture([0.0, 1.0], [1.5, -0.5]), "probs"),
    (lambda: pj.sampling.Mixture([0.0, 1.0, 2.0], [0.5, 0.5]), "scales and probs"),
    (lambda: pj.sampling.Mixture(1.0, 1.0), "scales and probs"),
    (lambda: pj.privacy_loss(pj.noise.Gaussian(1.0), pj.sampling.Mixture([0, 1], [0.5, 0.5]),
                             "replace_one"), "add_remove"),
    (lambda: pj.privacy_loss(pj.noise.Laplace(1.0), pj.sampling.Mixture([0, 1], [0.5, 0.5])),
     "location family"),
    (lambda: pj.sampling.Poisson(1.5), "sampling_prob"),
    (lambda: pj.sampling.Mixture.binomial(np.array([0.1, 0.2]), 3),
     "sampling_prob must be a single number"),
    (lambda: jax.jit(lambda q: pj.sampling.Mixture.binomial(q, 3).probs)(0.1),
     "Mixture.binomial reads sampling_prob on the host"),
    (lambda: pj.sampling.FixedBatch(-0.1), "sampling_prob"),
    (lambda: pj.privacy_loss(pj.noise.RandomizedResponse(1.0), pj.sampling.Poisson(0.1)),
     "no subsampled form"),
    (lambda: pj.gaussian(1.0, sampling="bernoulli", sampling_prob=0.1), "sampling"),
    (lambda: pj.gaussian(1.0, sampling=pj.sampling.Poisson(0.1), sampling_prob=0.1), "sampling_prob"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("sigma", [1e-5, 1e17])
def test_mixture_extreme_noise_is_sound(sigma):
    """Tiny noise (shifts of 1e5 scales: the far components' mass sits in the +inf atom) and huge
    noise (shifts below float64's resolution: rounded up, or to the identity when optimistic)."""
    eps = np.array([0.0, 1.0, 10.0])
    up, lo = _mixture(sigma=sigma), _mixture(False, sigma=sigma)
    for i in range(2):
        upper, lower = np.asarray(up.directions()[i].delta(eps)), np.asarray(lo.directions()[i].delta(eps))
        exact = np.array([mixture_delta_mp(sigma, MIX[1], MIX[2], e, add=i == 1) for e in eps])
        assert np.all(np.isfinite(upper)) and np.all(np.isfinite(lower))
        assert np.all(upper >= exact * (1 - 1e-9) - 1e-15) and np.all(lower <= exact * (1 + 1e-9) + 1e-15)


@pytest.mark.slow
def test_mixture_against_dp_accounting():
    """Composed, between dp-accounting's optimistic and pessimistic PLDs (1e-4) + 0.1%."""
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    sigma, scales, probs = 2.0, (0.0, 1.0, 2.0), (0.9, 0.09, 0.01)
    logging.disable(logging.WARNING)  # its optimistic estimate warns that it uses privacy buckets
    try:
        theirs = {pe: pldlib.from_mixture_gaussian_mechanism(sigma, scales, probs, pessimistic_estimate=pe,
                                                             value_discretization_interval=1e-4)
                  for pe in (True, False)}
        for count in (1, 100):
            up, lo = (theirs[pe].self_compose(count).get_epsilon_for_delta(1e-5) for pe in (True, False))
            ours = _mixture(sigma=sigma, scales=scales, probs=probs).self_compose(count).epsilon(1e-5)
            ours_lower = _mixture(False, sigma, scales, probs).self_compose(count).epsilon(1e-5)
            assert lo <= ours <= up * 1.001
            assert ours_lower <= up
    finally:
        logging.disable(logging.NOTSET)


# -- sampling without replacement under replace-one ----------------------------------------------------
def _laplacemixture_delta_mp(p_locs, q_locs, eps):
    """delta(eps) = int (P - e^eps Q)_+ for uniform mixtures of Laplace(loc, 1) densities, exactly
    (mpmath): between consecutive locations P - e^eps Q = A e^x + B e^-x has at most one root."""
    with mp.workdps(40):
        w = mp.e ** mp.mpf(eps)
        terms = [(mp.mpf(loc), mp.mpf(1) / len(p_locs)) for loc in p_locs]
        terms += [(mp.mpf(loc), -w / len(q_locs)) for loc in q_locs]
        cuts = sorted({loc for loc, _ in terms})
        edges = [-mp.inf, *cuts, mp.inf]
        total = mp.mpf(0)
        for left, right in itertools.pairwise(edges):
            # density e^{-|x - loc|} / 2: on (left, right) a loc <= left contributes e^loc e^-x / 2
            a = sum(c * mp.e ** (-loc) / 2 for loc, c in terms if loc >= right)
            b = sum(c * mp.e**loc / 2 for loc, c in terms if loc <= left)
            points = [left, right]
            if a * b < 0:
                root = mp.log(-b / a) / 2
                if left < root < right:
                    points = [left, root, right]

            def primitive(x, a=a, b=b):  # of A e^x + B e^-x
                return (a * mp.e**x if a else 0) - (b * mp.e ** (-x) if b else 0)

            for u, v in itertools.pairwise(points):
                if mp.isfinite(u) and mp.isfinite(v):
                    middle = (u + v) / 2
                else:
                    middle = v - 1 if mp.isfinite(v) else u + 1
                if a * mp.e**middle + b * mp.e ** (-middle) > 0:
                    total += primitive(v) - primitive(u)
        return float(total)


def _batch_sums(values, size):
    return [sum(batch) for batch in itertools.combinations(values, size)]


def test_fixed_batch_laplace_against_exact_enumeration():
    """A sum query over n = 3 records in [-1, 1] (L1 sensitivity 1), batches of 1 drawn without
    replacement, Laplace noise of scale 1: every pair of datasets differing in one record
    (values in {-1, 0, 1}) has delta at most ours, and the worst pair attains it (tight)."""
    n, size = 3, 1
    eps = np.array([0.0, 0.1, 0.3, 0.6])
    worst = np.zeros_like(eps)
    for rest in itertools.product((-1, 0, 1), repeat=n - 1):
        for first, replaced in itertools.permutations((-1, 0, 1), 2):
            p_locs = _batch_sums((first, *rest), size)
            q_locs = _batch_sums((replaced, *rest), size)
            worst = np.maximum(worst, [_laplacemixture_delta_mp(p_locs, q_locs, e) for e in eps])
    kw = dict(sampling_prob=size / n, neighboring="replace_one", sampling="fixed_batch")
    upper = np.asarray(pj.laplace(1.0, **kw).delta(eps))
    lower = np.asarray(pj.laplace(1.0, pessimistic=False, **kw).delta(eps))
    assert np.all(upper >= worst * (1 - 1e-9) - 1e-15)
    assert np.all(upper <= worst * (1 + 1e-3) + 1e-12)
    assert np.all(lower <= worst * (1 + 1e-9) + 1e-15)


def _wbk_epsilon(eps_of_order, pure_eps, q, count, delta, orders=range(2, 65)):
    """Wang, Balle and Kasiviswanathan, "Subsampled Renyi differential privacy and analytical
    moments accountant" (2019), Thm 9: RDP of sampling without replacement from the base's RDP
    eps(j) and pure-DP eps(inf), composed ``count`` times and converted with eps + log(1/delta) /
    (alpha - 1) (mpmath)."""
    q, best = mp.mpf(q), mp.inf
    with mp.workdps(40):
        tail = mp.e ** mp.mpf(pure_eps) - 1
        for alpha in orders:
            e2 = eps_of_order(2)
            total = 1 + q**2 * mp.binomial(alpha, 2) * min(4 * (mp.e**e2 - 1), mp.e**e2 * min(2, tail**2))
            for j in range(3, alpha + 1):
                total += q**j * mp.binomial(alpha, j) * mp.e ** ((j - 1) * eps_of_order(j)) * min(2, tail**j)
            rdp = mp.log(total) / (alpha - 1)
            best = min(best, count * rdp + mp.log(1 / mp.mpf(delta)) / (alpha - 1))
    return float(best)


def test_fixed_batch_laplace_below_the_renyi_bound():
    """Composed: at or below the RDP bound for sampling without replacement (the only one peers
    offer; dp-accounting's RDP accountant has it for the Gaussian alone)."""
    scale, q, count, delta = 2.0, 0.05, 200, 1e-6
    shift = mp.mpf(2) / scale  # replace-one: the contribution moves from -1 to +1

    def laplace_rdp(alpha):  # Mironov, "Renyi differential privacy" (2017), Prop. 6
        a = mp.mpf(alpha)
        return mp.log(a / (2 * a - 1) * mp.e ** ((a - 1) * shift)
                      + (a - 1) / (2 * a - 1) * mp.e ** (-a * shift)) / (a - 1)

    ours = pj.laplace(scale, sampling_prob=q, neighboring="replace_one", sampling="fixed_batch")
    ours = float(ours.self_compose(count).epsilon(delta))
    assert 0 < ours <= _wbk_epsilon(laplace_rdp, shift, q, count, delta)


def test_fixed_batch_gaussian_below_dp_accounting_renyi():
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    sigma, n, size, count, delta = 1.0, 1000, 20, 500, 1e-6
    accountant = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    event = dp_event.SampledWithoutReplacementDpEvent(n, size, dp_event.GaussianDpEvent(sigma))
    theirs = accountant.compose(event, count).get_epsilon(delta)
    # their sensitivity bounds |f(D) - f(D')| = 1: a contribution of norm 1/2 moving to its negative
    ours = pj.gaussian(sigma, sensitivity=0.5, sampling_prob=size / n, neighboring="replace_one",
                       sampling="fixed_batch")
    assert 0 < float(ours.self_compose(count).epsilon(delta)) <= theirs


def test_mixture_component_of_probability_zero_changes_nothing():
    """An absent component whose moment overflows (shift 40 scales) used to turn the grid's spread
    heuristic into 0 * inf; it is left out."""
    eps = np.array([0.0, 0.5, 2.0])
    mixed = pj.privacy_loss(pj.noise.Gaussian(0.05), pj.sampling.Mixture([0.0, 1.0, 2.0], [0.99, 0.01, 0.0]))
    np.testing.assert_allclose(mixed.delta(eps), pj.gaussian(0.05, sampling_prob=0.01).delta(eps), rtol=1e-9)


@pytest.mark.slow  # the pessimistic PLD needs the largest grid (2^20 points), as for Poisson
def test_mixture_tiny_probability_of_a_contribution_is_sound():
    """q = 1e-20 of a shift: below float64's resolution of the loss (log(1 - q + ...) rounds to
    0), so q is rounded up to noise.MIN_PARAMETER (pessimistic) or to 0 (optimistic), as for
    Poisson sampling."""
    q, eps = 1e-20, np.array([0.0, 0.1, 1.0])
    scales, probs = [0.0, 1.0, 2.0], [1 - q, 0.9 * q, 0.1 * q]
    up, lo = _mixture(sigma=1.0, scales=scales, probs=probs), _mixture(False, 1.0, scales, probs)
    for i in range(2):
        exact = np.array([mixture_delta_mp(1.0, scales, probs, e, add=i == 1) for e in eps])
        upper, lower = np.asarray(up.directions()[i].delta(eps)), np.asarray(lo.directions()[i].delta(eps))
        assert np.all(upper >= exact) and np.all(upper <= 1e-8)
        assert np.all(lower == 0.0)


def test_lists_of_parameters_are_batches_as_arrays_are():
    """A list (or tuple) in an event's parameters is one array, a batch: RandomAllocation's
    steps as a list raised a refusal that named event_epsilon itself, a list of sigmas a
    TypeError, and calibrate_steps an ambiguous truth value after its whole search (each list
    was a pytree node of several leaves)."""
    noise, sampling = pj.noise, pj.sampling
    for listed, array in [
        (pj.Event(noise.Gaussian(1.0), sampling.RandomAllocation([2, 3])),
         pj.Event(noise.Gaussian(1.0), sampling.RandomAllocation(np.array([2, 3])))),
        (pj.Event(noise.Gaussian((1.0, 2.0)), sampling.RandomAllocation(2)),
         pj.Event(noise.Gaussian(np.array([1.0, 2.0])), sampling.RandomAllocation(2))),
    ]:
        np.testing.assert_array_equal(pj.event_epsilon(listed, 1, 1e-5),
                                      pj.event_epsilon(array, 1, 1e-5))
    # one leaf each: every accounting function sees the array
    event = pj.Event(noise.Gaussian([1.0, 2.0]), sampling.Poisson((0.01, 0.02)))
    assert len(jax.tree_util.tree_leaves(event)) == 3  # sigma, sensitivity, sampling_prob
    assert isinstance(event.noise.sigma, np.ndarray)
    assert isinstance(event.sampling.sampling_prob, np.ndarray)
    with pytest.raises(ValueError, match="sigma must be a real number"):
        noise.Gaussian(["1.0"])
