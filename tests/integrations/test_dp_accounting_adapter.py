"""pj.dp_accounting: pldjax as a dp_accounting PrivacyAccountant, on every event with a PLD, against
dp_accounting's own accountants (reference values never come from pldjax)."""

import copy
import math
import time

import dp_accounting as dpa
import jax
import mpmath as mp
import numpy as np
import pytest
from dp_accounting import dp_event as ev
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from reference import brute_force_delta, gaussian_epsilon, mixture_delta_mp

import pldjax as pj

DELTA = 1e-5
NR = dpa.NeighboringRelation
AR, RO, RS = NR.ADD_OR_REMOVE_ONE, NR.REPLACE_ONE, NR.REPLACE_SPECIAL

#: (name, event, relations dp_accounting's PLD accountant accepts for it)
EVENTS = [
    ("gaussian", ev.GaussianDpEvent(1.5), (AR, RO, RS)),
    ("laplace", ev.LaplaceDpEvent(2.0), (AR, RS)),
    ("discrete_laplace", ev.DiscreteLaplaceDpEvent(0.5, 1), (AR, RS)),
    ("poisson_gaussian", ev.PoissonSampledDpEvent(0.01, ev.GaussianDpEvent(1.0)), (AR, RO, RS)),
    ("poisson_laplace", ev.PoissonSampledDpEvent(0.05, ev.LaplaceDpEvent(1.0)), (AR, RS)),
    ("randomized_response", ev.RandomizedResponseDpEvent(0.5, 4), (RO, RS)),
    ("binary_randomized_response", ev.RandomizedResponseDpEvent(0.1, 2), (RO, RS)),
    ("mixture_of_gaussians", ev.MixtureOfGaussiansDpEvent(1.0, [0, 1, 2], [0.9, 0.08, 0.02]),
     (AR, RS)),
    # B >= n: truncation never happens, both analyses are the Poisson-subsampled Gaussian
    ("truncated_no_truncation", ev.TruncatedSubsampledGaussianDpEvent(500, 0.02, 500, 1.0),
     (AR, RO, RS)),
    # truncation: the tighter of pldjax's analysis and dp_accounting's, so at or below its value
    ("truncated", ev.TruncatedSubsampledGaussianDpEvent(10_000, 0.01, 120, 1.0), (AR, RO, RS)),
]
#: events whose epsilon may be below dp_accounting's (a tighter analysis), never above it + 1e-3
AT_OR_BELOW = {"truncated"}
#: the cases the default run checks (the whole matrix runs with the slow tests)
FAST = {("laplace", AR), ("discrete_laplace", RS), ("randomized_response", RS)}
CASES = [pytest.param(name, event, rel, id=f"{name}-{rel.name}",
                      marks=() if (name, rel) in FAST else pytest.mark.slow)
         for name, event, rels in EVENTS for rel in rels]


def _reference(event, rel, count):
    """dp_accounting's PLD accountant at its default 1e-4 discretization (its accountant ignores
    the count of a self-composed RandomizedResponseDpEvent, so that one is composed here)."""
    if isinstance(event, ev.RandomizedResponseDpEvent):
        pld = dpa_pld.from_randomized_response(event.noise_parameter, event.num_buckets,
                                               neighboring_relation=rel)
        return pld.self_compose(count).get_epsilon_for_delta(DELTA)
    acct = dpa.pld.PLDAccountant(rel)
    return acct.compose(event, count).get_epsilon(DELTA)


@pytest.mark.parametrize(("name", "event", "rel"), CASES)
def test_every_event_within_1e3_of_dp_accounting(name, event, rel):
    for count in (1, 10):
        ours = pj.dp_accounting.PLDAccountant(rel).compose(ev.SelfComposedDpEvent(event, count))
        if name in AT_OR_BELOW:
            assert ours.get_epsilon(DELTA) <= _reference(event, rel, count) + 1e-3
        else:
            assert ours.get_epsilon(DELTA) == pytest.approx(_reference(event, rel, count), abs=1e-3)


def test_dp_accounting_adapter_matches_pldjax():
    acct = pj.dp_accounting.PLDAccountant()
    sampled = dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0))
    acct.compose(dpa.SelfComposedDpEvent(sampled, 300))
    # rel 1e-6: dpsgd's windows leave delta / 2^20 outside (charged to delta), the PLD's 1e-18
    assert acct.get_epsilon(DELTA) == pytest.approx(float(pj.dpsgd_epsilon(1.0, 0.01, 300, DELTA)),
                                                    rel=1e-6)
    acct.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(20.0), dpa.NoOpDpEvent()]), 2)
    expected = pj.compose_schedule([(1.0, 0.01, 300), (20.0, 1.0, 2)])
    assert acct.get_epsilon(DELTA) == pytest.approx(float(expected.epsilon(DELTA)), rel=1e-12)
    assert acct.get_delta(1.0) == pytest.approx(float(expected.delta(1.0)), rel=1e-12)


def test_it_is_a_dp_accounting_pld_accountant_with_a_zero_argument_constructor():
    acct = pj.dp_accounting.PLDAccountant()
    assert isinstance(acct, dpa.pld.PLDAccountant)  # jax-privacy's type checks pass
    assert acct.neighboring_relation == AR
    assert acct.get_epsilon(DELTA) == 0.0 and acct.get_delta(0.0) == 0.0
    # jax-privacy makes fresh accountants with copy.deepcopy
    acct.compose(dpa.GaussianDpEvent(3.0))
    clone = copy.deepcopy(acct)
    clone.compose(dpa.GaussianDpEvent(3.0))
    assert clone.get_epsilon(DELTA) > acct.get_epsilon(DELTA)


def test_non_private_events_give_infinite_epsilon():
    for rel, event in [(AR, dpa.NonPrivateDpEvent()), (AR, dpa.GaussianDpEvent(0.0)),
                       (RS, dpa.PoissonSampledDpEvent(0.5, dpa.LaplaceDpEvent(0.0))),
                       (RO, dpa.RandomizedResponseDpEvent(0.0, 3))]:
        acct = pj.dp_accounting.PLDAccountant(rel).compose(dpa.GaussianDpEvent(1.0))
        acct.compose(dpa.ComposedDpEvent([dpa.NoOpDpEvent(), event]))
        assert acct.get_epsilon(DELTA) == math.inf
        assert acct.get_delta(100.0) == 1.0
    # events that release nothing
    acct = pj.dp_accounting.PLDAccountant(RO)
    for event in [dpa.RandomizedResponseDpEvent(1.0, 5), dpa.RandomizedResponseDpEvent(0.0, 1),
                  dpa.PoissonSampledDpEvent(0.0, dpa.GaussianDpEvent(0.0)),
                  dpa.TruncatedSubsampledGaussianDpEvent(100, 0.1, 0, 1.0)]:
        acct.compose(event, 5)
    assert acct.get_epsilon(DELTA) == 0.0


INF = math.inf
INFINITE_NOISE = [
    (AR, dpa.GaussianDpEvent(INF)), (RO, dpa.GaussianDpEvent(INF)), (AR, dpa.LaplaceDpEvent(INF)),
    (AR, dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(INF))),
    (RS, dpa.PoissonSampledDpEvent(0.5, dpa.LaplaceDpEvent(INF))),
    (RO, dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(INF))),
    (AR, ev.MixtureOfGaussiansDpEvent(INF, [0.0, 1.0], [0.5, 0.5])),
    (RS, dpa.TruncatedSubsampledGaussianDpEvent(100, 0.1, 10, INF)),
]


@pytest.mark.parametrize(("rel", "event"), INFINITE_NOISE,
                         ids=[f"{type(e).__name__}-{rel.name}" for rel, e in INFINITE_NOISE])
def test_infinite_noise_releases_nothing(rel, event):
    """GaussianDpEvent(inf) was refused as out of range; infinite noise is the identity (as
    dp_accounting's RDP accountant reads it: epsilon 0)."""
    alone = pj.dp_accounting.PLDAccountant(rel)
    assert alone.supports(event)
    alone.compose(event, 3)
    assert alone.get_epsilon(DELTA) == 0.0 and alone.get_delta(0.0) == 0.0
    acct = pj.dp_accounting.PLDAccountant(rel).compose(dpa.GaussianDpEvent(2.0))
    before = acct.get_epsilon(DELTA)
    assert acct.compose(dpa.ComposedDpEvent([event, dpa.GaussianDpEvent(INF)])).get_epsilon(
        DELTA) == before
    assert pj.dp_accounting.to_event(event, rel).noise == pj.noise.GDP(0.0)


UNSUPPORTED = [
    (AR, dpa.SampledWithReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0))),
    (RS, dpa.SampledWithReplacementDpEvent(100, 10, dpa.LaplaceDpEvent(1.0))),
    (AR, dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0))),
    (RS, dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0))),
    (RO, dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.LaplaceDpEvent(1.0))),
    (AR, dpa.RandomizedResponseDpEvent(0.5, 3)),
    (RO, dpa.PoissonSampledDpEvent(0.1, dpa.LaplaceDpEvent(1.0))),
    (RO, ev.MixtureOfGaussiansDpEvent(1.0, [1.0], [1.0])),
    (AR, dpa.PoissonSampledDpEvent(0.1, dpa.RandomizedResponseDpEvent(0.5, 2))),
    (AR, dpa.UnsupportedDpEvent()),
    (AR, ev.SingleEpochTreeAggregationDpEvent(1.0, 4)),
    (AR, ev.RepeatAndSelectDpEvent(dpa.GaussianDpEvent(1.0), 1.0, 1.0)),
]


@pytest.mark.parametrize(("rel", "event"), UNSUPPORTED, ids=[type(e).__name__ for _, e in UNSUPPORTED])
def test_supports_and_compose_agree_on_unsupported_events(rel, event):
    acct = pj.dp_accounting.PLDAccountant(rel).compose(dpa.GaussianDpEvent(2.0))
    before = acct.get_epsilon(DELTA)
    nested = dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.SelfComposedDpEvent(event, 3)])
    for e in (event, nested):
        assert not acct.supports(e)
        with pytest.raises(dpa.UnsupportedEventError, match=type(event).__name__):
            acct.compose(e)
    assert acct.get_epsilon(DELTA) == before  # a refused event changes nothing
    assert acct.ledger == dpa.GaussianDpEvent(2.0)


def test_events_whose_pld_cannot_be_built_are_refused_when_composed():
    """A mixture of 2,000 Gaussians (more than sampling.MAX_COMPONENTS) passed supports() and
    compose(), then every get_epsilon raised: the accountant was broken for good."""
    many = ev.MixtureOfGaussiansDpEvent(1.0, [1.0] * 2000, [1 / 2000] * 2000)
    acct = pj.dp_accounting.PLDAccountant().compose(dpa.GaussianDpEvent(2.0))
    before = acct.get_epsilon(DELTA)
    for event in (many, dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), many])):
        assert not acct.supports(event)
        with pytest.raises(dpa.UnsupportedEventError, match="MAX_COMPONENTS"):
            acct.compose(event)
    assert acct.get_epsilon(DELTA) == before
    assert acct.ledger == dpa.GaussianDpEvent(2.0)
    assert acct.compose(dpa.GaussianDpEvent(2.0)).get_epsilon(DELTA) > before  # still usable
    # as many components as the guard allows still compose
    assert pj.dp_accounting.PLDAccountant().supports(
        ev.MixtureOfGaussiansDpEvent(1.0, [1.0] * 1024, [1 / 1024] * 1024))


def test_supports_and_compose_agree_on_supported_events():
    for _, event, rels in EVENTS:
        for rel in rels:
            acct = pj.dp_accounting.PLDAccountant(rel)
            assert acct.supports(event)
            acct.compose(event)
    swor = dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0))
    assert pj.dp_accounting.PLDAccountant(RO).supports(swor)  # was refused by compose
    assert pj.dp_accounting.PLDAccountant(RO).compose(swor).get_epsilon(DELTA) < math.inf


def test_bad_parameters_raise_value_errors_and_change_nothing():
    acct = pj.dp_accounting.PLDAccountant().compose(dpa.GaussianDpEvent(2.0))
    before = acct.get_epsilon(DELTA)
    bad = [(dpa.GaussianDpEvent(-1.0), "noise_multiplier"),
           (dpa.GaussianDpEvent(float("nan")), "noise_multiplier"),
           (dpa.PoissonSampledDpEvent(1.5, dpa.GaussianDpEvent(1.0)), "sampling_probability"),
           (dpa.LaplaceDpEvent(-2.0), "noise_multiplier"),
           (dpa.TruncatedSubsampledGaussianDpEvent(100, 0.1, -1, 1.0), "truncated_batch_size"),
           (dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.0), -3), "count")]
    for event, field in bad:
        with pytest.raises(ValueError, match=field):
            acct.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), event]))
    with pytest.raises(ValueError, match="count"):
        acct.compose(dpa.GaussianDpEvent(1.0), -1)
    with pytest.raises(ValueError, match="target_delta"):
        acct.get_epsilon(1.5)
    with pytest.raises(ValueError, match="neighboring_relation"):
        pj.dp_accounting.PLDAccountant("add_remove")
    assert acct.get_epsilon(DELTA) == before
    assert acct.ledger == dpa.GaussianDpEvent(2.0)


@pytest.mark.slow
def test_ledger_round_trips_as_named_tuples():
    acct = pj.dp_accounting.PLDAccountant(RS)
    acct.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(5.0), 4))
    acct.compose(dpa.LaplaceDpEvent(5.0), 3)
    acct.compose(dpa.RandomizedResponseDpEvent(0.8, 3))
    stored = acct.ledger.to_named_tuple()
    restored = pj.dp_accounting.PLDAccountant(RS).compose(dpa.DpEvent.from_named_tuple(stored))
    assert restored.ledger == acct.ledger
    assert restored.get_epsilon(DELTA) == acct.get_epsilon(DELTA)


@pytest.mark.slow
def test_calibrate_dp_mechanism_with_the_adapter():
    def make(sigma):
        return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(sigma)),
                                       200)

    sigma = dpa.calibrate_dp_mechanism(pj.dp_accounting.PLDAccountant, make, 2.0, DELTA,
                                       dpa.LowerEndpointAndGuess(0.3, 1.0), tol=1e-3)
    assert float(pj.dpsgd_epsilon(sigma, 0.02, 200, DELTA)) <= 2.0
    assert float(pj.dpsgd_epsilon(sigma - 2e-3, 0.02, 200, DELTA)) > 2.0


@pytest.mark.parametrize(("sigma", "m", "n", "count"), [
    (1.0, 10, 1000, 50), pytest.param(0.5, 1, 100, 10, marks=pytest.mark.slow)])
def test_sampling_without_replacement_is_at_or_below_dp_accountings_rdp(sigma, m, n, count):
    event = dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(sigma)), count)
    rdp = dpa.rdp.RdpAccountant(neighboring_relation=RO).compose(event).get_epsilon(DELTA)
    assert pj.dp_accounting.PLDAccountant(RO).compose(event).get_epsilon(DELTA) <= rdp


@pytest.mark.parametrize(("p", "k", "rel"), [
    (0.2, 5, RS), pytest.param(0.5, 4, RO, marks=pytest.mark.slow),
    pytest.param(0.3, 2, RO, marks=pytest.mark.slow)])
def test_k_randomized_response_is_tight_against_exact_enumeration(p, k, rel):
    """Three-fold composition by exact enumeration in mpmath of the mechanism's outputs."""
    mp.mp.dps = 30
    p = mp.mpf(p)
    if rel == RO:  # R(x) against R(x'): outcomes x, x', other
        pairs = [(1 - p + p / k, p / k), (p / k, 1 - p + p / k), ((k - 2) * p / k, (k - 2) * p / k)]
    else:  # R(x) against the uniform answer
        pairs = [(1 - p + p / k, mp.mpf(1) / k), ((k - 1) * p / k, mp.mpf(k - 1) / k)]
    pairs = [(a, b) for a, b in pairs if a > 0]
    three = [(a1 * a2 * a3, b1 * b2 * b3) for a1, b1 in pairs for a2, b2 in pairs for a3, b3 in pairs]
    losses = [mp.log(a / b) for a, b in three]
    pld = pj.dp_accounting.PLDAccountant(rel).compose(
        dpa.RandomizedResponseDpEvent(float(p), k), 3).pld()
    for eps in (0.0, 0.5, 1.5):
        exact = brute_force_delta(losses, [a for a, _ in three], 0.0, eps)
        if rel == RS:  # the other direction: uniform against R(x)
            back = brute_force_delta([-z for z in losses], [b for _, b in three], 0.0, eps)
            exact = max(exact, back)
        ours = float(pld.delta(eps))
        assert exact - 1e-12 <= ours <= exact + 2e-3


@pytest.mark.slow
def test_mixture_of_gaussians_with_two_atoms_is_the_poisson_subsampled_gaussian():
    """S in {0, 1} with P(S = 1) = q is Poisson subsampling: an independent pldjax path."""
    acct = pj.dp_accounting.PLDAccountant().compose(
        ev.MixtureOfGaussiansDpEvent(0.8, [0.0, 1.0], [0.9, 0.1]), 20)
    assert acct.get_epsilon(DELTA) == pytest.approx(float(pj.dpsgd_epsilon(0.8, 0.1, 20, DELTA)),
                                                    abs=1e-3)
    assert acct.get_epsilon(DELTA) >= float(
        pj.dpsgd_epsilon(0.8, 0.1, 20, DELTA, pessimistic=False)) - 1e-12


@pytest.mark.slow
def test_randomized_response_composes_its_count_exactly():
    """30-fold composition against the multinomial enumeration (dp_accounting's accountant ignores
    the count of a self-composed RandomizedResponseDpEvent; its PLD at 1e-4 is 1.7e-3 above)."""
    mp.mp.dps = 40
    p, k, count = mp.mpf(0.5), 4, 30
    up, down, same = 1 - p + p / k, p / k, (k - 2) * p / k
    top = mp.log(up / down)
    terms = [((i - j) * top, mp.factorial(count) / (mp.factorial(i) * mp.factorial(j)
                                                  * mp.factorial(count - i - j))
              * up**i * down**j * same**(count - i - j))
             for i in range(count + 1) for j in range(count + 1 - i)]
    ours = pj.dp_accounting.PLDAccountant(RO).compose(dpa.RandomizedResponseDpEvent(0.5, 4), count)
    eps = ours.get_epsilon(DELTA)
    assert brute_force_delta([z for z, _ in terms], [m for _, m in terms], 0.0, eps) <= DELTA
    assert brute_force_delta([z for z, _ in terms], [m for _, m in terms], 0.0, eps - 1e-5) > DELTA


@pytest.mark.slow
def test_results_do_not_depend_on_the_callers_x64_setting(x64_off):
    def account():
        acct = pj.dp_accounting.PLDAccountant(RS)
        acct.compose(dpa.TruncatedSubsampledGaussianDpEvent(1000, 0.05, 55, 1.3), 5)
        acct.compose(dpa.RandomizedResponseDpEvent(0.55, 3))
        return acct.get_epsilon(DELTA), acct.get_delta(1.0)

    def fresh():  # the event PLDs are cached by their parameters: build them again
        pj.dp_accounting.event_pld.cache_clear()
        pj.dp_accounting.k_randomized_response.cache_clear()

    fresh()
    off = account()
    with jax.enable_x64(True):
        fresh()
        on = account()
    assert off == on


def test_to_event_reads_leaf_events_as_pldjax_events():
    to_event = pj.dp_accounting.to_event
    assert to_event(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0))) == pj.Event(
        pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.01), "add_remove")
    assert to_event(ev.TruncatedSubsampledGaussianDpEvent(1000, 0.05, 55, 1.3), RS) == pj.Event(
        pj.noise.Gaussian(1.3), pj.sampling.TruncatedPoisson(0.05, 1000, 55), "replace_special")
    assert to_event(dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(2.0)),
                    RO) == pj.Event(pj.noise.Gaussian(2.0, 0.5), pj.sampling.FixedBatch(0.1),
                                    "replace_one")
    assert to_event(ev.MixtureOfGaussiansDpEvent(1.0, [0, 1], [0.9, 0.1])).sampling == (
        pj.sampling.Mixture((0.0, 1.0), (0.9, 0.1)))
    assert to_event(dpa.NoOpDpEvent()).noise == pj.noise.GDP(0.0)  # the identity
    for event, rel in [(dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0)]), AR),
                       (dpa.RandomizedResponseDpEvent(0.5, 3), RO),
                       (dpa.RandomizedResponseDpEvent(0.5, 3), AR), (dpa.ZCDpEvent(0.1), AR)]:
        with pytest.raises(dpa.UnsupportedEventError):
            to_event(event, rel)
    with pytest.raises(ValueError, match="not private"):
        to_event(dpa.GaussianDpEvent(0.0))
    with pytest.raises(ValueError, match="noise_multiplier"):
        to_event(dpa.GaussianDpEvent(-1.0))


@pytest.mark.slow
def test_tiny_delta_gets_a_finite_sound_epsilon_quickly():
    """delta = 1e-18 (where an FFT composition's round-off floor reads inf) is answered
    by the smaller of the PLD's and the Chernoff bound, above the exact value (the composed
    Gaussian is Gaussian: mpmath) and close to dp_accounting's RDP bound (the same kind of bound),
    in a few seconds."""
    gaussian = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(10.0), 100)  # G_1
    sampled = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(0.8)),
                                      10_000)
    for event, exact in [(gaussian, gaussian_epsilon(1.0, 1e-18)), (sampled, None)]:
        start = time.perf_counter()
        acct = pj.dp_accounting.PLDAccountant().compose(event)
        eps = acct.get_epsilon(1e-18)
        assert time.perf_counter() - start < 30
        rdp = dpa.rdp.RdpAccountant().compose(event).get_epsilon(1e-18)
        assert math.isfinite(eps) and eps == pytest.approx(rdp, rel=1e-2)
        if exact is not None:
            assert eps >= exact
        assert acct.get_delta(eps) <= 1e-18 * (1 + 1e-9)
    assert dpa.pld.PLDAccountant().compose(sampled).get_epsilon(1e-18) == math.inf


def test_a_composition_too_wide_for_a_grid_is_still_answered():
    """10^9 runs of GaussianDpEvent(1e3): no grid holds the composition, and the error asked for
    a coarser Grid, which this interface cannot pass; the Chernoff bound answers, above the
    closed form (mu = sqrt(1e9) / 1e3)."""
    from reference import gaussian_delta

    acct = pj.dp_accounting.PLDAccountant()
    acct.compose(ev.GaussianDpEvent(1e3), 10**9)
    mu = math.sqrt(1e9) / 1e3
    for delta in [1e-5, 1e-40]:
        eps = acct.get_epsilon(delta)
        assert gaussian_epsilon(mu, delta) <= eps <= 1.1 * gaussian_epsilon(mu, delta)
    assert gaussian_delta(mu, 700.0) <= acct.get_delta(700.0) < 1.0


def test_true_positive_rates_and_gdp_estimate_of_g1():
    """GaussianDpEvent(sqrt 3) three times is G_1: TPR(FPR) = Phi(Phi^-1(FPR) + 1) exactly (0.38914
    at FPR 0.1, as dp_accounting's own tests read it), mu 1."""
    import numpy as np
    from scipy.stats import norm

    acc = pj.dp_accounting.PLDAccountant()
    acc.compose(ev.GaussianDpEvent(math.sqrt(3)), 1)
    acc.compose(ev.GaussianDpEvent(math.sqrt(3)), 2)
    fprs = np.array([1e-6, 1e-3, 0.1, 0.5])
    tpr = acc.get_true_positive_rates(fprs)
    exact = norm.cdf(norm.ppf(fprs) + 1.0)
    assert np.all(tpr >= exact) and np.all(tpr - exact <= 1e-4)
    assert isinstance(acc.get_true_positive_rates(0.1), float)
    assert acc.get_true_positive_rates(0.1, deltas=[1e-5]) == pytest.approx(0.38914, abs=1e-4)
    assert acc.get_gdp_parameter_estimate() == pytest.approx(1.0, abs=3e-3)


def test_true_positive_rates_at_the_extremes():
    nothing = pj.dp_accounting.PLDAccountant()
    nothing.compose(ev.PoissonSampledDpEvent(0.0, ev.GaussianDpEvent(1.0)))
    assert 0.5 <= nothing.get_true_positive_rates(0.5) <= 0.5 + 1e-12
    assert nothing.get_gdp_parameter_estimate() < 1e-2
    everything = pj.dp_accounting.PLDAccountant()
    everything.compose(ev.PoissonSampledDpEvent(0.1, ev.GaussianDpEvent(0.0)))
    assert everything.get_true_positive_rates(0.1) == 1.0
    assert everything.get_gdp_parameter_estimate() == math.inf
    with pytest.raises(ValueError, match="false_positive_rates"):
        nothing.get_true_positive_rates(1.5)
    with pytest.raises(ValueError, match="false_positive_rates"):
        nothing.get_gdp_parameter_estimate([0.7])


def test_tree_aggregation_is_the_gaussian_of_its_depth():
    """Three single-epoch trees of 15 steps (depth 4) at noise multiplier 2, zero-out: a record
    reaches 4 nodes, so each tree is G_mu with mu = sqrt(4) / 2, and three are G_sqrt(3)."""
    from scipy.stats import norm

    event = ev.SingleEpochTreeAggregationDpEvent(2.0, [7, 15])
    acc = pj.dp_accounting.PLDAccountant(dpa.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(event, 3)
    mu, eps = math.sqrt(3.0), 2.0
    exact = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert exact <= acc.get_delta(eps) <= exact * (1 + 1e-3)
    rdp = dpa.rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    rdp.compose(event, 3)
    assert acc.get_epsilon(1e-6) <= rdp.get_epsilon(1e-6)
    assert not pj.dp_accounting.PLDAccountant().supports(event)  # add/remove: refused


def _newer_event(name, **fields):
    """An event of a newer dp_accounting release, as its class would be (matched by name)."""
    import attr

    cls = attr.make_class(name, list(fields), bases=(ev.DpEvent,), frozen=True, slots=True)
    return cls(**fields)


def test_events_of_newer_dp_accounting_releases_are_recognised_by_name():
    acc = pj.dp_accounting.PLDAccountant()
    acc.compose(_newer_event("EpsilonDeltaDpEvent", epsilon=1.0, delta=0.1))
    acc.compose(_newer_event("EpsilonDeltaDpEvent", epsilon=2.0, delta=0.2))
    # composed (eps, delta) guarantees: delta(3) = 1 - 0.9 x 0.8 exactly; dp_accounting's own
    # tests read TPR(0.1) = 0.91938 from its (eps, delta) pairs, which our curve is at or below
    assert 0.28 <= acc.get_delta(3.0) <= 0.28 + 1e-12
    assert acc.get_epsilon(0.2801) <= 3.0
    assert acc.get_true_positive_rates(0.1) <= 0.91938 + 1e-3
    pure = pj.dp_accounting.PLDAccountant()
    pure.compose(_newer_event("ExponentialMechanismDpEvent", epsilon=1.0))
    pure.compose(_newer_event("ExponentialMechanismDpEvent", epsilon=2.0))
    assert pure.get_epsilon(0.0) == pytest.approx(3.0, rel=1e-12) and pure.get_epsilon(0.0) >= 3.0
    flip, laplace = pj.dp_accounting.PLDAccountant(), pj.dp_accounting.PLDAccountant()
    flip.compose(_newer_event("PermuteAndFlipDpEvent", epsilon=0.5))
    laplace.compose(ev.LaplaceDpEvent(2.0))
    assert flip.get_epsilon(1e-5) == laplace.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="EpsilonDeltaDpEvent.delta"):
        pj.dp_accounting.PLDAccountant().compose(
            _newer_event("EpsilonDeltaDpEvent", epsilon=1.0, delta=1.5))
    assert not acc.supports(_newer_event("RepeatAndSelectLikeDpEvent", epsilon=1.0))


def test_report_of_a_ledger_reads_both_plds_of_its_events():
    acct = pj.dp_accounting.PLDAccountant()
    acct.compose(ev.PoissonSampledDpEvent(0.01, ev.GaussianDpEvent(1.0)), 1000)
    acct.compose(ev.LaplaceDpEvent(10.0), 3)
    report = pj.privacy_report(acct, deltas=[1e-5], orders=[2.0, 8.0])
    assert [e for e, _ in acct.events()] == [pj.dpsgd_event(1.0, 0.01),
                                             pj.Event(pj.noise.Laplace(10.0))]
    assert report.assumptions["runs"] == 1003 and " x 1000" in report.assumptions["events"]
    # the same compositions built by hand: the upper bound is the ledger's PLD, the lower one
    # its optimistic twin
    upper = float(acct.pld().epsilon(1e-5))
    lower = float(pj.compose([pj.dpsgd_event(1.0, 0.01).pld(pessimistic=False).self_compose(1000),
                              pj.laplace(10.0, pessimistic=False).self_compose(3)]).epsilon(1e-5))
    assert report.epsilon_upper[0] == upper and report.epsilon_lower[0] == pytest.approx(lower)
    assert 0 < report.epsilon_lower[0] <= report.epsilon_upper[0] <= 1.01 * report.epsilon_lower[0]
    # Renyi DP: dp-accounting's RDP of the Gaussian steps plus Mironov's (2017) closed form of
    # Laplace(b): log(a/(2a-1) e^((a-1)/b) + (a-1)/(2a-1) e^(-a/b)) / (a - 1), three times
    rdp = dpa.rdp.RdpAccountant(orders=[2.0, 8.0])
    rdp.compose(ev.PoissonSampledDpEvent(0.01, ev.GaussianDpEvent(1.0)), 1000)
    a = np.array([2.0, 8.0])
    laplace = np.log(a / (2 * a - 1) * np.exp((a - 1) / 10) + (a - 1) / (2 * a - 1)
                     * np.exp(-a / 10)) / (a - 1)
    truth = rdp._rdp + 3 * laplace
    assert np.all(report.renyi_upper >= truth) and np.all(report.renyi_upper <= truth * 1.001)
    assert np.all(report.renyi_lower <= report.renyi_upper)
    with pytest.raises(ValueError, match="reads its own ledger"):
        pj.privacy_report(acct, count=3)


def test_report_of_a_ledger_with_a_zcdp_total_has_the_trivial_lower_bounds():
    acct = pj.dp_accounting.PLDAccountant().compose(dpa.ZCDpEvent(0.1))
    assert acct.events() is None
    with pytest.raises(ValueError, match="no optimistic PLD"):
        acct.pld(pessimistic=False)
    report = pj.privacy_report(acct, deltas=[1e-5])
    assert report.epsilon_lower[0] == 0.0 and 0 < report.epsilon_upper[0] < np.inf


@pytest.mark.parametrize("rel", [RS, RO])
def test_sampling_with_replacement_is_read_as_draws_with_replacement(rel):
    """SampledWithReplacementDpEvent is pj.sampling.WithReplacement under zero-out and replace-one
    (its bounds against every enumerated batch are checked in tests/mechanisms)."""
    event = dpa.SampledWithReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(1.0))
    step = pj.dp_accounting.to_event(event, rel)
    assert step.sampling == pj.sampling.WithReplacement(1000, 10)
    assert step.noise == pj.noise.Gaussian(1.0)
    acct = pj.dp_accounting.PLDAccountant(rel).compose(event, 100)
    assert acct.get_epsilon(DELTA) == pytest.approx(pj.event_epsilon(step, 100, DELTA), rel=1e-9)


def test_sampling_with_replacement_refuses_batches_of_too_many_likely_copies_by_name():
    event = dpa.SampledWithReplacementDpEvent(10, 10**6, dpa.GaussianDpEvent(1.0))
    with pytest.raises(ValueError, match="numbers of copies"):
        pj.dp_accounting.PLDAccountant(RS).compose(event).get_epsilon(DELTA)
    with pytest.raises(ValueError, match="count must be an integer in"):
        pj.sampling.Mixture.binomial(1e-9, 2**30)


def test_one_draw_with_replacement_under_replace_one_is_a_batch_of_one_without_replacement():
    """One draw is a batch of one drawn without replacement: the upper bound's curve is the pair
    of sampling without replacement with the record moving from -C to +C (Balle et al. 2018),
    which one dataset attains."""
    eps = np.array([0.0, 0.5, 1.0, 2.0, 3.0])
    event = dpa.SampledWithReplacementDpEvent(50, 1, dpa.GaussianDpEvent(1.0))
    upper = np.asarray(pj.dp_accounting.PLDAccountant(RO).compose(event).pld().delta(eps))
    tight = np.asarray(pj.privacy_loss(pj.noise.Gaussian(1.0), pj.sampling.FixedBatch(1 / 50),
                                       "replace_one").delta(eps))
    np.testing.assert_allclose(upper, tight, rtol=1e-6)


@pytest.mark.slow
def test_far_unlikely_copies_of_a_record_do_not_coarsen_the_grid():
    """100 draws from 10^4 records: the batch holds up to 85 copies with probability > 0 (down to
    1e-300); the grid stays fine, and the upper bound lies above the copies against none (the
    other records at 0, one dataset), in mpmath."""
    event = dpa.SampledWithReplacementDpEvent(10_000, 100, dpa.GaussianDpEvent(1.0))
    pld = pj.dp_accounting.PLDAccountant(RS).compose(event).pld()
    assert all(float(d.step) <= 2.0**-8 for d in pld.directions())
    copies = pj.sampling.Mixture.binomial(1e-4, 100)
    present = copies.probs > 0
    eps = np.array([0.005, 0.02, 0.1])
    against_none = np.array([max(mixture_delta_mp(1.0, copies.scales[present].tolist(),
                                                  copies.probs[present].tolist(), e, add=add)
                                 for add in (False, True)) for e in eps])
    assert np.all(np.asarray(pld.delta(eps)) >= against_none)


def test_pure_dp_epsilon_of_a_ledger_is_exact():
    """epsilon at delta = 0 adds up the events' largest losses (dp-accounting's LaplaceDpEvent
    takes the scale): 100 + 1000 log(1 + 0.1 (e^{1/0.7} - 1)), within 1e-12 above."""
    acct = pj.dp_accounting.PLDAccountant()
    acct.compose(ev.LaplaceDpEvent(1.0), 100)
    acct.compose(ev.PoissonSampledDpEvent(0.1, ev.LaplaceDpEvent(0.7)), 1000)
    truth = 100 + 1000 * math.log1p(0.1 * math.expm1(1 / 0.7))
    assert truth <= acct.get_epsilon(0.0) <= truth * (1 + 1e-12)
