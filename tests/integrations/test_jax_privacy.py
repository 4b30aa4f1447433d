"""jax-privacy with pldjax's accountant: its event builders, dp_accounting's calibration, its training
accountants (whose PLD type checks must pass) and its BandMF execution plan with truncated Poisson
sampling. Reference values come from dp_accounting's own accountants."""

import dataclasses
import math
import warnings

import dp_accounting as dpa
import numpy as np
import pytest

jax_privacy = pytest.importorskip("jax_privacy")

from jax_privacy import accounting as jp_accounting  # noqa: E402
from jax_privacy.experimental import accounting as jp_events  # noqa: E402
from jax_privacy.experimental import execution_plan  # noqa: E402

import pldjax as pj  # noqa: E402

DELTA = 1e-6
NR = dpa.NeighboringRelation


def test_dpsgd_event_calibration_matches_dp_accounting():
    def make(sigma):
        return jp_events.dpsgd_event(sigma, 500, sampling_prob=0.01)

    sigma = dpa.calibrate_dp_mechanism(pj.dp_accounting.PLDAccountant, make, 2.0, DELTA, tol=1e-3)
    assert pj.dp_accounting.PLDAccountant().compose(make(sigma)).get_epsilon(DELTA) <= 2.0
    theirs = dpa.pld.PLDAccountant().compose(make(sigma)).get_epsilon(DELTA)
    assert 2.0 - 2e-2 <= theirs <= 2.0 + 1e-3  # dp_accounting agrees: sigma is calibrated


@pytest.mark.slow
def test_truncated_dpsgd_event_under_zero_out():
    event = jp_events.truncated_dpsgd_event(1.0, 20, sampling_prob=0.05, num_examples=1000,
                                            truncated_batch_size=55)
    ours = pj.dp_accounting.PLDAccountant(NR.REPLACE_SPECIAL).compose(event).get_epsilon(DELTA)
    theirs = dpa.pld.PLDAccountant(NR.REPLACE_SPECIAL).compose(event).get_epsilon(DELTA)
    untruncated = pj.dp_accounting.PLDAccountant(NR.REPLACE_SPECIAL).compose(
        jp_events.dpsgd_event(1.0, 20, sampling_prob=0.05)).get_epsilon(DELTA)
    assert untruncated <= ours <= theirs + 1e-3


def test_fixed_batch_event_is_at_or_below_dp_accountings_rdp():
    event = jp_events.fixed_dpsgd_event(1.0, 200, dataset_size=1000, batch_size=10)
    rdp = dpa.rdp.RdpAccountant(neighboring_relation=NR.REPLACE_ONE).compose(event)
    assert pj.dp_accounting.PLDAccountant(NR.REPLACE_ONE).compose(event).get_epsilon(DELTA) <= (
        rdp.get_epsilon(DELTA))


def test_training_accountants_accept_pldjax_config():
    config = pj.dp_accounting.jax_privacy_config()
    assert isinstance(config, jp_accounting.PldAccountantConfig)
    assert isinstance(config.create_accountant(), pj.dp_accounting.PLDAccountant)
    params = jp_accounting.DpParams(noise_multipliers=1.0, num_samples=10_000, batch_size=100,
                                    delta=DELTA)
    ours = jp_accounting.DpsgdTrainingAccountant(config).compute_epsilon(300, params)
    theirs = jp_accounting.DpsgdTrainingAccountant(
        jp_accounting.PldAccountantConfig()).compute_epsilon(300, params)
    assert ours == pytest.approx(theirs, abs=1e-3)
    sigma = jp_accounting.calibrate_noise_multiplier(
        target_epsilon=2.0, accountant=jp_accounting.DpsgdTrainingAccountant(config),
        batch_sizes=100, num_updates=300, num_samples=10_000, target_delta=DELTA)
    assert pj.dp_accounting.PLDAccountant().compose(
        jp_events.dpsgd_event(sigma, 300, sampling_prob=0.01)).get_epsilon(DELTA) <= 2.0 + 1e-2


@pytest.mark.slow
def test_user_level_accountant_passes_its_pld_type_check():
    """jax-privacy's user-level accountant insists on a dp_accounting PLDAccountant and composes
    MixtureOfGaussiansDpEvents."""
    params = jp_accounting.DpParams(noise_multipliers=2.0, num_samples=10_000, batch_size=100,
                                    delta=DELTA, examples_per_user=2)
    ours = jp_accounting.DpsgdTrainingUserLevelAccountant(
        pj.dp_accounting.jax_privacy_config()).compute_epsilon(50, params)
    theirs = jp_accounting.DpsgdTrainingUserLevelAccountant(
        jp_accounting.PldAccountantConfig()).compute_epsilon(50, params)
    assert ours == pytest.approx(theirs, abs=1e-3)


@pytest.mark.slow
def test_bandmf_plan_with_truncated_poisson_calibrates_with_pldjax():
    config = execution_plan.BandMFExecutionPlanConfig(
        iterations=20, strategy=np.array([1.0]), epsilon=4.0, delta=DELTA, sampling_prob=0.05,
        truncated_batch_size=60, num_examples=1000,
        accountant=pj.dp_accounting.PLDAccountant(NR.REPLACE_SPECIAL))
    plan = config.plan
    eps = pj.dp_accounting.PLDAccountant(NR.REPLACE_SPECIAL).compose(plan.dp_event).get_epsilon(DELTA)
    assert eps <= 4.0 + 1e-6


def test_batch_selection_strategies_are_refused_as_sampling_schemes_by_name():
    from jax_privacy import batch_selection as bs

    strategies = [bs.BMinSepSampling(0.01, 100, 10), bs.BallsInBinsSampling(100, 10),
                  bs.CyclicPoissonSampling(0.01, 100), bs.FixedBatchSampling(32, 100)]
    for strategy in strategies:
        name = type(strategy).__name__
        for build in (lambda s: pj.privacy_loss(pj.noise.Gaussian(1.0), s),
                      lambda s: pj.Event(pj.noise.Gaussian(1.0), s)):
            with pytest.raises(ValueError, match=f"sampling must be .*got {name}"):
                build(strategy)


def _epsilon(event, relation, accountant=None):
    accountant = accountant or pj.dp_accounting.PLDAccountant(relation)
    return accountant.compose(event).get_epsilon(DELTA)


def test_cyclic_poisson_is_poisson_on_the_steps_a_record_is_eligible_for():
    from jax_privacy import batch_selection as bs

    sigma, q = 1.0, 0.02
    cyclic = bs.CyclicPoissonSampling(q, 401, cycle_length=4)  # a record: 101 eligible steps
    event = pj.dp_accounting.batch_selection_event(cyclic, sigma, 10_000, NR.REPLACE_SPECIAL)
    ours = _epsilon(event, NR.REPLACE_SPECIAL)
    theirs = _epsilon(jp_events.dpsgd_event(sigma, 101, sampling_prob=q), NR.REPLACE_SPECIAL,
                      dpa.pld.PLDAccountant(NR.REPLACE_SPECIAL, value_discretization_interval=1e-4))
    assert theirs * (1 - 2e-3) <= ours <= theirs * (1 + 1e-4)
    fewer = bs.CyclicPoissonSampling(q, 400, cycle_length=4)  # 100 eligible steps
    assert _epsilon(pj.dp_accounting.batch_selection_event(
        fewer, sigma, 10_000, NR.REPLACE_SPECIAL), NR.REPLACE_SPECIAL) < ours
    # without cycles, Poisson sampling under any relation (add/remove: jax-privacy's default)
    poisson = pj.dp_accounting.batch_selection_event(bs.CyclicPoissonSampling(q, 101), sigma, 10)
    assert _epsilon(poisson, NR.ADD_OR_REMOVE_ONE) == pytest.approx(
        pj.dpsgd_epsilon(sigma, q, 101, DELTA), rel=1e-6)


def test_truncated_cyclic_poisson_accounts_for_a_group_of_records():
    from jax_privacy import batch_selection as bs

    strategy = bs.CyclicPoissonSampling(0.01, 300, truncated_batch_size=60, cycle_length=3)
    event = pj.dp_accounting.batch_selection_event(strategy, 1.0, 12_000, NR.REPLACE_SPECIAL)
    group = jp_events.truncated_dpsgd_event(1.0, 100, sampling_prob=0.01, num_examples=4000,
                                            truncated_batch_size=60)
    assert event == group


@pytest.mark.slow
def test_truncated_cyclic_poisson_group_has_a_finite_epsilon():
    """The group's truncated event composes to a finite epsilon (about 10 s: a truncated Poisson
    PLD of 4,000 records; the default run composes one such event in
    test_bandmf_plan_with_truncated_poisson_calibrates_with_pldjax)."""
    from jax_privacy import batch_selection as bs

    strategy = bs.CyclicPoissonSampling(0.01, 300, truncated_batch_size=60, cycle_length=3)
    event = pj.dp_accounting.batch_selection_event(strategy, 1.0, 12_000, NR.REPLACE_SPECIAL)
    assert math.isfinite(_epsilon(event, NR.REPLACE_SPECIAL))


def test_fixed_batches_without_replacement_are_accounted_over_twice_the_clip_norm():
    """Noise of sigma clip norms against replace-one's sensitivity of two: the event's Gaussian
    is sigma / 2 over that sensitivity (jax-privacy's fixed_dpsgd_event passed sigma on, and one
    step of sigma 1, q 0.1 read epsilon(1e-3) = 0.650, below 0.752 of a run that meets it: a
    record's clipped gradient +1 against -1, all others 0, computed here by quadrature)."""
    from jax_privacy import batch_selection as bs
    from scipy import integrate, optimize, stats

    event = pj.dp_accounting.batch_selection_event(bs.FixedBatchSampling(10, 100), 1.0, 1000,
                                                   NR.REPLACE_ONE)
    assert event == jp_events.fixed_dpsgd_event(0.5, 100, dataset_size=1000, batch_size=10)
    step, count = pj.dp_accounting.batch_selection_accounting(bs.FixedBatchSampling(100, 1), 1.0,
                                                              1000, NR.REPLACE_ONE)
    assert count == 1
    q, delta = 0.1, 1e-3
    own = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.FixedBatch(q), "replace_one")
    assert pj.event_epsilon(step, 1, delta) == pytest.approx(pj.event_epsilon(own, 1, delta),
                                                              rel=1e-12)

    def run_delta(eps):  # the run's pair: (1 - q) N(0, 1) + q N(1, 1) against N(-1, 1)'s
        def excess(x):
            p = (1 - q) * stats.norm.pdf(x) + q * stats.norm.pdf(x, 1.0)
            r = (1 - q) * stats.norm.pdf(x) + q * stats.norm.pdf(x, -1.0)
            return max(0.0, p - np.exp(eps) * r)
        return integrate.quad(excess, -40, 40, points=[0.0], limit=400, epsabs=1e-14)[0]

    run = optimize.brentq(lambda eps: run_delta(eps) - delta, 0.0, 5.0)
    assert run == pytest.approx(0.752, abs=1e-3)
    assert pj.event_epsilon(step, 1, delta) >= run
    for relation in (NR.ADD_OR_REMOVE_ONE, NR.REPLACE_SPECIAL):
        with pytest.raises(ValueError, match="FixedBatchSampling without replacement .* REPLACE_ONE"):
            pj.dp_accounting.batch_selection_accounting(bs.FixedBatchSampling(10, 100), 1.0, 1000,
                                                        relation)


@pytest.mark.parametrize("relation", [NR.REPLACE_SPECIAL, NR.REPLACE_ONE])
def test_fixed_batches_with_replacement_are_sampled_with_replacement(relation):
    from jax_privacy import batch_selection as bs

    strategy = bs.FixedBatchSampling(10, 100, replace=True)
    event = pj.dp_accounting.batch_selection_event(strategy, 1.0, 1000, relation)
    assert event == dpa.SelfComposedDpEvent(
        dpa.SampledWithReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(1.0)), 100)
    step, count = pj.dp_accounting.batch_selection_accounting(strategy, 1.0, 1000, relation)
    assert count == 100 and step.noise == pj.noise.Gaussian(1.0)
    assert step.sampling == pj.sampling.WithReplacement(1000, 10)


@pytest.mark.slow
def test_fixed_batches_with_replacement_are_accounted_as_their_event_is():
    """The event and count read from the strategy give the epsilon of its dp_accounting event
    (the bounds against an exact enumeration of the batches are checked in the default run by
    tests/mechanisms/test_with_replacement.py)."""
    from jax_privacy import batch_selection as bs

    strategy = bs.FixedBatchSampling(10, 100, replace=True)
    event = pj.dp_accounting.batch_selection_event(strategy, 1.0, 1000, NR.REPLACE_SPECIAL)
    step, count = pj.dp_accounting.batch_selection_accounting(strategy, 1.0, 1000,
                                                              NR.REPLACE_SPECIAL)
    assert pj.event_epsilon(step, count, DELTA) == pytest.approx(
        pj.dp_accounting.PLDAccountant(NR.REPLACE_SPECIAL).compose(event).get_epsilon(DELTA),
        rel=1e-4)


@pytest.mark.parametrize("strategy, relation, match", [
    ("BallsInBinsSampling(100, 10)", NR.ADD_OR_REMOVE_ONE, "batch_selection_accounting"),
    ("BMinSepSampling(0.01, 100, 10)", NR.ADD_OR_REMOVE_ONE, "Monte Carlo"),
    ("FixedBatchSampling(10, 100, replace=True)", NR.ADD_OR_REMOVE_ONE, "with replacement"),
    ("CyclicPoissonSampling(0.01, 100, cycle_length=2)", NR.ADD_OR_REMOVE_ONE, "EQUAL_SPLIT"),
    ("CyclicPoissonSampling(0.01, 100, truncated_batch_size=5, cycle_length=2, "
     "partition_type=bs.PartitionType.INDEPENDENT)", NR.REPLACE_ONE, "INDEPENDENT"),
])
def test_strategies_without_an_analysis_are_refused_by_name(strategy, relation, match):
    from jax_privacy import batch_selection as bs  # noqa: F401 (read by eval)

    built = eval(f"bs.{strategy}")
    with pytest.raises(ValueError, match=f"{type(built).__name__}.*{match}"):
        pj.dp_accounting.batch_selection_event(built, 1.0, 1000, relation)


def test_batch_selection_event_names_bad_arguments():
    from jax_privacy import batch_selection as bs

    for args, name in (((bs.CyclicPoissonSampling(0.01, 10), -1.0, 100), "noise_multiplier"),
                       ((bs.CyclicPoissonSampling(0.01, 10), 1.0, 0), "dataset_size"),
                       ((pj.sampling.Poisson(0.01), 1.0, 100), "Poisson"),
                       ((bs.CyclicPoissonSampling(0.01, 10), 1.0, 100, "add_remove"),
                        "neighboring must be one of")):
        with pytest.raises(ValueError, match=name):
            pj.dp_accounting.batch_selection_event(*args)
    # a relation given as a string, not the strategy, is what is wrong
    with pytest.raises(ValueError, match="neighboring must be one of"):
        pj.dp_accounting.batch_selection_accounting(bs.BallsInBinsSampling(5, 2), 1.0, 1000,
                                                    "add_remove")


def test_balls_in_bins_accounting_brackets_jax_privacys_monte_carlo():
    from jax_privacy import batch_selection as bs
    from jax_privacy.experimental.monte_carlo import sample_generation

    # jax-privacy's sampler takes about 0.4 ms a sample here
    sigma, samples = 2.0, 4_000
    strategy = bs.BallsInBinsSampling(12, 6)  # each record's bin used twice
    event, count = pj.dp_accounting.batch_selection_accounting(strategy, sigma, 1000)
    assert count == 1 and event.noise.sensitivity == pytest.approx(np.sqrt(2))
    upper, lower = event.pld(), event.pld(pessimistic=False)
    for direction, (seed, positive) in enumerate(((1, True), (2, False))):
        losses, _ = sample_generation.get_privacy_loss_sample(
            strategy, sigma, np.array([1.0]), seed=seed, positive_sample=positive,
            num_samples=samples)
        for eps in (0.1, 0.3, 0.6):
            values = -np.expm1(np.minimum(eps - losses, 0.0))
            mean, error = values.mean(), values.std() / np.sqrt(samples)
            assert float(lower.directions()[direction].delta(eps)) <= mean + 5 * error
            assert float(upper.directions()[direction].delta(eps)) >= mean - 5 * error
    with pytest.raises(ValueError, match="replace-one"):
        pj.dp_accounting.batch_selection_accounting(strategy, sigma, 1000, NR.REPLACE_ONE)


def test_balls_in_bins_of_unequal_uses_warns_that_its_lower_bounds_are_none():
    """One iteration in two bins: only one bin is used, Poisson sampling at q = 1/2; the event
    (the record's bin used once, whichever it is) read 0.149 as an optimistic delta(0.5) against
    that run's 0.080 (dp-accounting), so a report's bracket missed the truth."""
    from jax_privacy import batch_selection as bs

    with pytest.warns(UserWarning, match="optimistic ones .* are no lower bounds"):
        event, count = pj.dp_accounting.batch_selection_accounting(bs.BallsInBinsSampling(1, 2),
                                                                   1.0, 100)
    assert float(pj.event_delta(event, count, 0.5)) >= 0.0799  # still above the run
    # 7 iterations in 3 bins (used 3, 2, 2 times): the run lies between the event (3 uses) read
    # pessimistically and the one of 2 uses the warning names read optimistically, against
    # jax-privacy's own sampler of the run
    from jax_privacy.experimental.monte_carlo import sample_generation

    strategy, sigma, samples = bs.BallsInBinsSampling(7, 3), 2.0, 4_000
    with pytest.warns(UserWarning, match=r"sensitivity sqrt\(2\) are"):
        upper, _ = pj.dp_accounting.batch_selection_accounting(strategy, sigma, 1000)
    lower = dataclasses.replace(upper, noise=pj.noise.Gaussian(sigma, math.sqrt(2)))
    upper, lower = upper.pld(), lower.pld(pessimistic=False)
    for direction, (seed, positive) in enumerate(((3, True), (4, False))):
        losses, _ = sample_generation.get_privacy_loss_sample(
            strategy, sigma, np.array([1.0]), seed=seed, positive_sample=positive,
            num_samples=samples)
        for eps in (0.1, 0.4):
            values = -np.expm1(np.minimum(eps - losses, 0.0))
            mean, error = values.mean(), values.std() / np.sqrt(samples)
            assert float(lower.directions()[direction].delta(eps)) <= mean + 5 * error
            assert float(upper.directions()[direction].delta(eps)) >= mean - 5 * error
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # b divides T: exact, no warning
        pj.dp_accounting.batch_selection_accounting(bs.BallsInBinsSampling(12, 6), 1.0, 100)


def test_batch_selection_accounting_reads_the_strategies_events():
    from jax_privacy import batch_selection as bs

    strategy = bs.CyclicPoissonSampling(0.02, iterations=400, cycle_length=4)
    event, count = pj.dp_accounting.batch_selection_accounting(strategy, 1.0, 10_000,
                                                               NR.REPLACE_SPECIAL)
    assert count == 100
    dp_event = pj.dp_accounting.batch_selection_event(strategy, 1.0, 10_000, NR.REPLACE_SPECIAL)
    expected = pj.dp_accounting.PLDAccountant(NR.REPLACE_SPECIAL).compose(dp_event).get_epsilon(DELTA)
    assert pj.event_epsilon(event, count, DELTA) == pytest.approx(expected, rel=1e-3)
    with pytest.raises(ValueError, match="BMinSepSampling.*monte_carlo_epsilon"):
        pj.dp_accounting.batch_selection_accounting(bs.BMinSepSampling(0.01, 100, 10), 1.0, 1000)
