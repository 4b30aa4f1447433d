"""Truncated Poisson sampling (pldjax/truncated_poisson.py, pj.sampling.TruncatedPoisson): the mixture
weights against a brute-force enumeration of the sampling, the PLD against the exact revealed
mechanism (mpmath), lower bounds (the true mechanism with the other records at zero; every small
dataset, enumerated and integrated in mpmath) and dp_accounting's bound."""

import itertools
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from compiled_programs import programs_of_a_new_process
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from reference import gaussian_delta, subsampled_add_delta, subsampled_remove_delta

import pldjax as pj
from pldjax.mechanisms.truncated_poisson import inclusion, rates, truncated_poisson_gaussian

mp.mp.dps = 30


def enumerate_rates(q: Fraction, n: int, b: int) -> dict[int, tuple[Fraction, Fraction]]:
    """P(|R| = r) and P(Z = 1 | |R| = r) by enumerating which of the n records are drawn and,
    when more than b are, every b-subset kept (uniformly). Record 0 is the sensitive one; R is
    the set of other records kept and Z says whether record 0 is kept."""
    joint: dict[tuple[int, int], Fraction] = {}
    for drawn in itertools.product((0, 1), repeat=n):
        prob = Fraction(1)
        for d in drawn:
            prob *= q if d else 1 - q
        members = [i for i in range(n) if drawn[i]]
        kept_sets = list(itertools.combinations(members, b)) if len(members) > b else [tuple(members)]
        for kept in kept_sets:
            z = int(0 in kept)
            key = (len(kept) - z, z)
            joint[key] = joint.get(key, Fraction(0)) + prob / len(kept_sets)
    out = {}
    for r in {r for r, _ in joint}:
        total = joint.get((r, 0), Fraction(0)) + joint.get((r, 1), Fraction(0))
        out[r] = (total, joint.get((r, 1), Fraction(0)) / total)
    return out


@pytest.mark.parametrize(("q", "n", "b"), [(Fraction(3, 10), 6, 2), (Fraction(1, 2), 5, 3),
                                           (Fraction(1, 5), 7, 1)])
def test_mixture_weights_match_brute_force_enumeration(q, n, b):
    exact = enumerate_rates(q, n, b)
    ours = rates(float(q), n, b)
    nonzero = [(float(w), float(r)) for w, r in exact.values() if r > 0]
    nonzero.sort(key=lambda x: x[1])
    # the components r <= b - 2 all have rate q: merge them as the code does
    merged = {}
    for w, r in nonzero:
        merged[round(r, 12)] = merged.get(round(r, 12), 0.0) + w
    expected = sorted(merged.items())
    got = sorted((r, w) for w, r in ours)
    assert len(got) == len(expected)
    for (r0, w0), (r1, w1) in zip(expected, got, strict=True):
        assert r1 == pytest.approx(r0, rel=1e-11) and w1 == pytest.approx(w0, rel=1e-11)


def exact_revealed_delta(sigma, q, n, b, eps):
    """delta(eps) of the mechanism that also reveals R: a mixture of Poisson-subsampled Gaussians
    (weights and rates by enumeration), the worse direction, in mpmath."""
    mix = enumerate_rates(Fraction(q).limit_denominator(10**6), n, b)

    def base(e):
        return gaussian_delta(1.0 / sigma, e)

    remove = sum(float(w) * subsampled_remove_delta(base, float(r), eps) for w, r in mix.values() if r > 0)
    add = sum(float(w) * subsampled_add_delta(base, float(r), eps) for w, r in mix.values() if r > 0)
    return max(remove, add)


def poisson_delta(sigma, rate, eps):
    def base(e):
        return gaussian_delta(1.0 / sigma, e)

    return max(subsampled_remove_delta(base, rate, eps), subsampled_add_delta(base, rate, eps))


@pytest.mark.parametrize(("sigma", "q", "n", "b"), [
    pytest.param(1.0, 0.3, 6, 2, marks=pytest.mark.slow), (0.7, 0.5, 5, 3)])
def test_zero_out_pld_is_tight_for_the_revealed_mechanism_and_above_the_truth(sigma, q, n, b):
    """At or below the revealed mechanism of analysis 1 (exact, in mpmath; the other analysis can
    only lower it), and above a mechanism the truth covers."""
    pld = truncated_poisson_gaussian(sigma, q, n, b)
    mix = enumerate_rates(Fraction(q), n, b)
    included = float(sum(w * r for w, r in mix.values()))  # P(Z = 1)
    assert included == pytest.approx(inclusion(q, n, b), rel=1e-12)
    for eps in (0.0, 0.3, 1.0, 2.0):
        ours = float(pld.delta(eps))
        assert ours <= exact_revealed_delta(sigma, q, n, b, eps) + 1e-4
        # with every other record at zero the output is the Poisson-subsampled Gaussian at the
        # rate P(Z = 1): a mechanism the bound must cover
        assert ours >= poisson_delta(sigma, included, eps) - 1e-12


def test_no_truncation_is_the_poisson_subsampled_gaussian():
    for relation in ("replace_special", "add_remove"):
        pld = truncated_poisson_gaussian(1.0, 0.01, 500, 500, neighboring=relation)
        assert float(pld.epsilon(1e-5)) == pytest.approx(float(pj.dpsgd_epsilon(1.0, 0.01, 1, 1e-5)),
                                                         rel=1e-7)


def test_truncation_too_rare_to_matter_keeps_the_poisson_grid_and_curve():
    """Batches of 250 where 100 are expected (truncation has probability below 1e-36): the
    analyses' components that only truncation reaches (twice the sensitivity, windows of +-16
    nats) weigh less than NEGLIGIBLE_COMPONENT and go to the +inf atom, so the PLD keeps the
    Poisson-subsampled Gaussian's grid (they stretched 10^8 records at q = 1e-4 to 2^23 points),
    and an analysis at or below the other everywhere is kept whole (rebuilding it left an atom of
    2e-16 a step)."""
    for relation in ("replace_special", "add_remove"):
        pld = truncated_poisson_gaussian(1.0, 0.01, 10_000, 250, neighboring=relation)
        plain = pj.privacy_loss(pj.noise.Gaussian(1.0), pj.sampling.Poisson(0.01), "add_remove")
        assert [d.size for d in pld.directions()] == [d.size for d in plain.directions()]
        eps = np.linspace(0.0, 6.0, 25)
        ours, theirs = np.asarray(pld.delta(eps)), np.asarray(plain.delta(eps))
        assert np.all(ours >= theirs) and np.all(ours <= theirs + 1e-30)
        assert float(pld.self_compose(1000).epsilon(1e-10)) == pytest.approx(
            float(plain.self_compose(1000).epsilon(1e-10)), rel=1e-12)


@pytest.mark.parametrize(("relation", "sigma", "q", "n", "b", "counts"), [
    ("replace_special", 1.0, 0.05, 1000, 50, (1,)),
    pytest.param("replace_special", 1.0, 0.05, 1000, 50, (10,), marks=pytest.mark.slow),
    pytest.param("add_remove", 1.0, 0.01, 10_000, 120, (1, 10), marks=pytest.mark.slow),
    pytest.param("replace_one", 1.0, 0.01, 10_000, 120, (1, 10), marks=pytest.mark.slow),
    pytest.param("replace_special", 0.8, 0.1, 200, 15, (1, 10), marks=pytest.mark.slow),
    pytest.param("replace_one", 0.8, 0.1, 200, 15, (1, 10), marks=pytest.mark.slow),
    pytest.param("add_remove", 0.8, 0.1, 200, 15, (1, 10), marks=pytest.mark.slow)])
def test_at_or_below_dp_accounting_and_above_the_lower_bound(relation, sigma, q, n, b, counts):
    """Within 1e-3 of dp_accounting's PLD accountant at 1e-4 (or below it: the tighter
    of its analysis and pldjax's is taken), above the plain Poisson-subsampled PLD and above the
    optimistic estimate (every other record at zero), for one and ten steps."""
    rel = {"replace_special": NeighboringRelation.REPLACE_SPECIAL,
           "replace_one": NeighboringRelation.REPLACE_ONE,
           "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE}[relation]
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.TruncatedPoisson(q, n, b), relation)
    pld, low = event.pld(), event.pld(pessimistic=False)
    theirs = dpa_pld.from_truncated_subsampled_gaussian_mechanism(n, q, b, sigma,
                                                                  neighboring_relation=rel)
    plain_relation = "replace_one" if relation == "replace_one" else "add_remove"
    plain = pj.gaussian(sigma, sampling_prob=q, neighboring=plain_relation, pessimistic=False)
    for count in counts:
        ours = float(pld.self_compose(count).epsilon(1e-4))
        assert ours <= theirs.self_compose(count).get_epsilon_for_delta(1e-4) + 1e-3
        assert ours >= float(low.self_compose(count).epsilon(1e-4))
        assert ours >= float(plain.self_compose(count).epsilon(1e-4))


def test_the_scheme_is_refused_where_it_has_no_meaning():
    scheme = pj.sampling.TruncatedPoisson(0.1, 100, 10)
    with pytest.raises(ValueError, match="Gaussian"):
        pj.privacy_loss(pj.noise.Laplace(1.0), scheme, "replace_special")
    with pytest.raises(ValueError, match="not one mechanism"):
        pj.Event(pj.noise.Gaussian(1.0), scheme).directions()
    with pytest.raises(ValueError, match="scalar, concrete sigma"):
        pj.privacy_loss(pj.noise.Gaussian([1.0, 2.0]), scheme)
    for kwargs, name in [(dict(sampling_prob=-0.1), "sampling_prob"),
                         (dict(dataset_size=0), "dataset_size"),
                         (dict(truncated_batch_size=2.5), "truncated_batch_size")]:
        args = dict(sampling_prob=0.1, dataset_size=10, truncated_batch_size=2) | kwargs
        with pytest.raises(ValueError, match=name):
            pj.sampling.TruncatedPoisson(**args)


def test_integer_parameters_may_be_numpy_or_jax_values():
    """An Event's parameters become arrays (the accountant's template, a vmapped event): a
    dataset_size of Array(1000) was refused as not an integer."""
    import jax.numpy as jnp

    for n, b in [(jnp.asarray(1000), jnp.asarray(20)), (np.int64(1000), np.asarray(20)),
                 (jnp.asarray(1000.0), np.uint8(20))]:
        scheme = pj.sampling.TruncatedPoisson(jnp.asarray(0.01), n, b)
        assert int(scheme.dataset_size) == 1000 and int(scheme.truncated_batch_size) == 20
    for kwargs, message in [(dict(dataset_size=jnp.asarray(0)), "dataset_size .* got 0"),
                            (dict(dataset_size=jnp.asarray(2.5)), "dataset_size .* got 2.5"),
                            (dict(dataset_size=jnp.asarray([10, 20])), "dataset_size"),
                            (dict(truncated_batch_size=jnp.asarray(True)), "truncated_batch_size")]:
        args = dict(sampling_prob=0.1, dataset_size=10, truncated_batch_size=2) | kwargs
        with pytest.raises(ValueError, match=message):
            pj.sampling.TruncatedPoisson(**args)


def test_bad_arguments_name_themselves():
    for kwargs, name in [(dict(noise_multiplier=0.0), "noise_multiplier"),
                         (dict(sampling_prob=1.5), "sampling_prob"),
                         (dict(dataset_size=0), "dataset_size"),
                         (dict(truncated_batch_size=-1), "truncated_batch_size"),
                         (dict(neighboring="swap"), "neighboring")]:
        args = dict(noise_multiplier=1.0, sampling_prob=0.1, dataset_size=10, truncated_batch_size=2)
        args.update(kwargs)
        neighboring = args.pop("neighboring", "replace_special")
        with pytest.raises(ValueError, match=name):
            truncated_poisson_gaussian(**args, neighboring=neighboring)
    assert float(truncated_poisson_gaussian(1.0, 0.1, 10, 0).epsilon(1e-9)) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(("sigma", "q"), [(1e-3, 0.1), (1.0, 1e-12)])
def test_extreme_parameters_give_sound_finite_answers(sigma, q):
    """Tiny noise puts the components' windows thousands of nats wide (the envelope then keeps
    the tighter analysis whole, no NaN from e^z); a tiny rate puts components on very different
    steps (aligned onto the coarsest instead of refusing)."""
    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.TruncatedPoisson(q, 100, 5),
                     "replace_special")
    pld, low = event.pld(), event.pld(pessimistic=False)
    for direction in pld.directions():
        assert float(np.sum(np.asarray(direction.probs)) + np.asarray(direction.inf_mass)) == (
            pytest.approx(1.0, abs=1e-12))
    for eps in (0.0, 1.0, 10.0):
        ours, lower = float(pld.delta(eps)), float(low.delta(eps))
        assert 0.0 <= lower <= ours <= 1.0
        assert ours >= poisson_delta(sigma, inclusion(q, 100, 5), eps) - 1e-12


def true_output_mixture(contributions: list[float], q: float, b: int) -> list[tuple[float, float]]:
    """The output of truncated Poisson sampling with scalar contributions, as (weight, mean) of
    its Gaussian components, by enumerating which records are drawn and which b are kept."""
    n = len(contributions)
    out: dict[float, float] = {}
    for drawn in itertools.product((0, 1), repeat=n):
        prob = mp.mpf(1)
        for d in drawn:
            prob *= q if d else 1 - q
        members = [i for i in range(n) if drawn[i]]
        kept_sets = list(itertools.combinations(members, b)) if len(members) > b else [tuple(members)]
        for kept in kept_sets:
            mean = sum(contributions[i] for i in kept)
            out[mean] = out.get(mean, 0) + prob / len(kept_sets)
    return [(w, m) for m, w in out.items()]


def mixture_delta(p, q, sigma, eps) -> float:
    """delta(eps) of the pair of Gaussian mixtures (weight, mean): int (P - e^eps Q)_+ (mpmath)."""
    def density(mix, x):
        return sum(w * mp.npdf(x, m, sigma) for w, m in mix)

    def excess(x):
        return max(density(p, x) - mp.e**eps * density(q, x), 0)

    with mp.workdps(15):
        return float(mp.quad(excess, mp.linspace(-8 - 4 * sigma, 8 + 4 * sigma, 33)))


@pytest.mark.slow
@pytest.mark.parametrize("relation", ["replace_special", "replace_one", "add_remove"])
def test_above_the_true_mechanism_on_small_datasets(relation):
    """Soundness of the envelope of both analyses against the true mechanism itself: four records
    (three others with contributions in {-1, 0, 1}), batches truncated to two, every
    configuration enumerated exactly and integrated in mpmath."""
    sigma, q, n, b = 1.0, 0.5, 4, 2
    pld = pj.privacy_loss(pj.noise.Gaussian(sigma), pj.sampling.TruncatedPoisson(q, n, b), relation)
    pair = {"replace_special": (1.0, 0.0), "replace_one": (-1.0, 1.0), "add_remove": (1.0, None)}
    v, w = pair[relation]
    for others in itertools.product((-1.0, 0.0, 1.0), repeat=n - 1):
        others = list(others)
        with_v = true_output_mixture(others + [v], q, b)
        other = true_output_mixture(others if w is None else others + [w], q, b)
        for eps in (0.0, 1.0):
            exact = max(mixture_delta(with_v, other, sigma, eps),
                        mixture_delta(other, with_v, sigma, eps))
            assert float(pld.delta(eps)) >= exact - 1e-7


@pytest.mark.parametrize("relation", [pytest.param("replace_special", marks=pytest.mark.slow),
                                      pytest.param("replace_one", marks=pytest.mark.slow),
                                      "add_remove"])
def test_one_step_curve_has_no_floor(relation):
    """The one-step curve falls with epsilon as dp_accounting's does, at or below it up to
    float64's round-off: an atom at +inf of 5.6e-9 (add/remove) once held delta(eps) at 5.6e-9 for
    eps = 2, 4 and 8 alike (dp_accounting: 1.3e-9, 3.8e-13, 1.3e-22), the round-off of forming
    the envelope's values near 1 divided by the step, and the masses' round-off deficit (1.2e-16,
    add/remove) once went there too. Above the optimistic estimate throughout."""
    rel = {"replace_special": NeighboringRelation.REPLACE_SPECIAL,
           "replace_one": NeighboringRelation.REPLACE_ONE,
           "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE}[relation]
    event = pj.Event(pj.noise.Gaussian(1.47), pj.sampling.TruncatedPoisson(0.01, 10_000, 120),
                     relation)
    pld, low = event.pld(), event.pld(pessimistic=False)
    theirs = dpa_pld.from_truncated_subsampled_gaussian_mechanism(10_000, 0.01, 120, 1.47,
                                                                  neighboring_relation=rel)
    eps = np.linspace(0.0, 12.0, 25)
    ours = np.asarray(pld.delta(eps), np.float64)
    reference = np.array([theirs.get_delta_for_epsilon(e) for e in eps])
    assert np.all(ours <= reference * 1.01 + 1e-15)
    assert np.all(ours >= np.asarray(low.delta(eps), np.float64))
    assert max(float(d.inf_mass) for d in pld.directions()) < 1e-15
    assert np.isfinite(float(pld.epsilon(1e-12)))


def test_likely_truncation_leaves_no_floor_either():
    """Batches cut at their expected size (B = nq, truncated half of the time): the envelope's
    masses are rebuilt from a curve with long chords, whose round-off clipped at zero left a
    surplus of mass; taken from every loss <= 0 it lowered the curve there, which came back as an
    atom at +inf of 6.3e-14 a step (zero-out). Taken from the lowest losses, the atom stays at
    round-off."""
    for relation in ("replace_special", "add_remove"):
        pld = truncated_poisson_gaussian(1.0, 0.01, 100_000, 1000, neighboring=relation)
        assert max(float(d.inf_mass) for d in pld.directions()) < 1e-15
        assert np.isfinite(float(pld.epsilon(1e-13)))


def test_long_chords_leave_no_floor_at_a_thousand_steps():
    """q = 0.01, 10^4 records, batches of 100 (= nq), zero-out: along the envelope's long chords
    the second differences of its values are round-off of both signs, and clipped they left a
    surplus that came back as an atom at +inf of 3.35e-14 a step, so that epsilon(1e-12) after
    1,000 steps read inf. The masses from the chords' slopes leave 5e-16; the one-step curve stays
    at or below dp_accounting's (within 1%, as test_one_step_curve_has_no_floor allows)."""
    pld = truncated_poisson_gaussian(1.0, 0.01, 10_000, 100, neighboring="replace_special")
    assert max(float(d.inf_mass) for d in pld.directions()) < 1e-15
    assert np.isfinite(float(pld.self_compose(1000).epsilon(1e-12)))
    theirs = dpa_pld.from_truncated_subsampled_gaussian_mechanism(
        10_000, 0.01, 100, 1.0, neighboring_relation=NeighboringRelation.REPLACE_SPECIAL)
    eps = np.linspace(0.0, 12.0, 25)
    reference = np.array([theirs.get_delta_for_epsilon(e) for e in eps])
    assert np.all(np.asarray(pld.delta(eps), np.float64) <= reference * 1.01 + 1e-15)


@pytest.mark.slow
def test_a_thousand_steps_stay_finite_at_small_delta():
    """sigma = 1, q = 0.01, 10^4 records, batches of 120, add/remove, 1,000 steps: epsilon at
    delta = 1e-6 is finite and at most dp_accounting's (6.52; it was inf), above the optimistic
    estimate."""
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.TruncatedPoisson(0.01, 10_000, 120),
                     "add_remove")
    ours = float(pj.event_epsilon(event, 1000, 1e-6))
    theirs = dpa_pld.from_truncated_subsampled_gaussian_mechanism(
        10_000, 0.01, 120, 1.0, neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    assert ours <= theirs.self_compose(1000).get_epsilon_for_delta(1e-6)
    assert ours >= float(pj.event_epsilon(event, 1000, 1e-6, pessimistic=False))


def test_a_process_takes_its_first_envelopes_in_numpy():
    # truncated Poisson's envelope of its analyses, and sampling with replacement's of its
    # bounds: a process's first ones run in NumPy (a ski rental of each window's program) and
    # compile nothing; the epsilons of the compiled envelopes (this run's, PLDJAX_HOST_WORK=0) to
    # their round-off (each an upper bound)
    code = """
        import os
        os.environ["PLDJAX_HOST_WORK"] = str(10**15)
        import pldjax as pj
        truncated = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.TruncatedPoisson(0.01, 10_000, 120))
        drawn = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.WithReplacement(10_000, 10),
                         "replace_special")
        print(float(pj.event_epsilon(truncated, 1000, 1e-6)),
              float(pj.event_epsilon(drawn, 100, 1e-5)))
    """
    names, printed = programs_of_a_new_process(code)
    assert not [name for name in names if "envelope" in name]
    truncated = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.TruncatedPoisson(0.01, 10_000, 120))
    drawn = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.WithReplacement(10_000, 10),
                     "replace_special")
    compiled = [float(pj.event_epsilon(truncated, 1000, 1e-6)),
                float(pj.event_epsilon(drawn, 100, 1e-5))]
    np.testing.assert_allclose([float(v) for v in printed.split()], compiled, rtol=1e-8)
