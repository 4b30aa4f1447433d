"""Truncated Poisson sampling (pldjax/truncated_poisson.py): the mixture weights against a brute-force
enumeration of the sampling, the PLD against the exact revealed mechanism (mpmath) and a lower
bound (the true mechanism with the other records at zero), and against dp_accounting's bound."""

import itertools
from fractions import Fraction

import mpmath as mp
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution as dpa_pld
from reference import gaussian_delta, subsampled_add_delta, subsampled_remove_delta

import pldjax as pj
from pldjax.truncated_poisson import rates, truncated_poisson_gaussian

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


@pytest.mark.parametrize(("sigma", "q", "n", "b"), [(1.0, 0.3, 6, 2), (0.7, 0.5, 5, 3)])
def test_zero_out_pld_is_tight_for_the_revealed_mechanism_and_above_the_truth(sigma, q, n, b):
    pld = truncated_poisson_gaussian(sigma, q, n, b)
    mix = enumerate_rates(Fraction(q), n, b)
    inclusion = float(sum(w * r for w, r in mix.values()))  # P(Z = 1)
    for eps in (0.0, 0.3, 1.0, 2.0):
        ours = float(pld.delta(eps))
        exact = exact_revealed_delta(sigma, q, n, b, eps)
        assert exact - 1e-12 <= ours <= exact + 1e-4
        # with every other record at zero the output is the Poisson-subsampled Gaussian at the
        # rate P(Z = 1): a mechanism the bound must cover
        assert ours >= poisson_delta(sigma, inclusion, eps) - 1e-12


def test_no_truncation_is_the_poisson_subsampled_gaussian():
    for relation in ("replace_special", "add_remove"):
        pld = truncated_poisson_gaussian(1.0, 0.01, 500, 500, neighboring=relation)
        assert float(pld.epsilon(1e-5)) == pytest.approx(float(pj.dpsgd_epsilon(1.0, 0.01, 1, 1e-5)),
                                                         rel=1e-7)


@pytest.mark.parametrize("relation", ["replace_special",
                                      pytest.param("replace_one", marks=pytest.mark.slow),
                                      pytest.param("add_remove", marks=pytest.mark.slow)])
def test_above_the_untruncated_mechanism_and_near_dp_accounting(relation):
    """Truncation only moves privacy one way for zero-out here (the |R| = B - 1 component has a
    rate >= q); each bound stays above the plain Poisson one and, for zero-out, below
    dp_accounting's looser mixture bound."""
    sigma, q, n, b = 1.0, 0.05, 1000, 50
    rel = {"replace_special": NeighboringRelation.REPLACE_SPECIAL,
           "replace_one": NeighboringRelation.REPLACE_ONE,
           "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE}[relation]
    ours = float(truncated_poisson_gaussian(sigma, q, n, b, neighboring=relation).epsilon(1e-5))
    plain_relation = "replace_one" if relation == "replace_one" else "add_remove"
    plain = float(pj.gaussian(sigma, sampling_prob=q, neighboring=plain_relation).epsilon(1e-5))
    assert ours >= plain
    theirs = dpa_pld.from_truncated_subsampled_gaussian_mechanism(
        n, q, b, sigma, neighboring_relation=rel).get_epsilon_for_delta(1e-5)
    if relation == "replace_special":
        assert ours <= theirs


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
