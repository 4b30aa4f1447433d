"""Sampling with replacement (pj.sampling.WithReplacement): the upper bound against every batch of
small datasets, enumerated (each of the n^B draws of a batch, with the other records placed along
the differing record's line) and integrated in mpmath; the lower bound against the dataset it is
built from; both bounds around each other where the batches are too many to enumerate; and bad
input refused by name."""

import itertools

import jax
import mpmath as mp
import numpy as np
import pytest
from reference import gaussian_delta, gaussian_mixtures_delta_mp

import pldjax as pj

EPS = np.array([0.0, 0.25, 0.5, 1.0, 2.0, 3.0])
#: The differing record's contribution under each dataset (x, x'), in clip norms: x' = 0 is the
#: zero-out record; replace-one moves the record anywhere in the ball.
RECORDS = {"replace_special": [(1.0, 0.0)], "replace_one": [(1.0, -1.0), (1.0, 0.0), (1.0, 0.5)]}
#: Where the other records sit, in clip norms (on the line through the differing record).
OTHERS = (-1.0, -0.5, 0.0, 0.5, 1.0)


def batch_means(n: int, batch: int, values: list[float], sigma: float) -> list[float]:
    """The noisy sum's mean, in noise standard deviations, for each of the n^batch batches."""
    return [sum(values[i] for i in draw) / sigma
            for draw in itertools.product(range(n), repeat=batch)]


def enumerated_delta(n: int, batch: int, sigma: float, record: tuple, other: float, eps) -> float:
    """The larger direction's delta(eps) of one dataset pair (record 0 differs)."""
    p = batch_means(n, batch, [record[0]] + [other] * (n - 1), sigma)
    q = batch_means(n, batch, [record[1]] + [other] * (n - 1), sigma)
    return max(gaussian_mixtures_delta_mp(p, q, eps), gaussian_mixtures_delta_mp(q, p, eps))


def event(sigma: float, n: int, batch: int, neighboring: str) -> pj.Event:
    return pj.Event(pj.noise.Gaussian(sigma), pj.sampling.WithReplacement(n, batch), neighboring)


@pytest.mark.parametrize("n, batch, sigma, neighboring", [
    (2, 1, 1.0, "replace_special"), (4, 3, 1.5, "replace_special"), (3, 2, 0.8, "replace_one"),
    pytest.param(3, 2, 0.8, "replace_special", marks=pytest.mark.slow),
    pytest.param(2, 1, 1.0, "replace_one", marks=pytest.mark.slow),
    pytest.param(4, 3, 1.5, "replace_one", marks=pytest.mark.slow)])
def test_upper_bound_covers_every_enumerated_dataset_and_lower_bound_its_own(n, batch, sigma,
                                                                              neighboring):
    ev = event(sigma, n, batch, neighboring)
    upper = np.asarray(ev.pld().delta(EPS))
    lower = np.asarray(ev.pld(pessimistic=False).delta(EPS))
    exact = {(record, other): np.array([enumerated_delta(n, batch, sigma, record, other, e)
                                        for e in EPS])
             for record in RECORDS[neighboring] for other in OTHERS}
    worst = np.max(list(exact.values()), axis=0)
    assert np.all(upper >= worst)
    # the lower bound is the dataset with the others at -1 and x at +1 (x' = 0, or -1), binned
    built_from = exact[(RECORDS[neighboring][0], -1.0)]
    assert np.all(lower <= built_from + 1e-15)
    assert np.all(lower >= 0.9 * built_from - 1e-12)
    # the others' place matters: the pair of copies against none (the others at 0) is not the worst
    assert np.any(worst > exact[(RECORDS[neighboring][0], 0.0)] * 1.05)


@pytest.mark.parametrize("neighboring, d", [("replace_special", 1.0), ("replace_one", 2.0)])
def test_upper_bound_is_at_most_the_bound_with_the_copies_revealed(neighboring, d):
    """The copies revealed, sum_k P(K = k) delta_G(k d / sigma) (the Gaussian's closed form), is
    one of the two bounds: the PLD's curve is at most it, up to its grid's chords, and well below
    it where the record is rarely drawn."""
    n, batch, sigma = 1000, 10, 1.0
    upper = np.asarray(event(sigma, n, batch, neighboring).pld().delta(EPS))
    copies = pj.sampling.Mixture.binomial(1 / n, batch)
    revealed = np.array([sum(p * gaussian_delta(k * d / sigma, e)
                             for k, p in zip(copies.scales, copies.probs, strict=True) if k > 0)
                         for e in EPS])
    assert np.all(upper <= revealed * (1 + 1e-3) + 1e-12)
    assert upper[EPS == 0.5][0] < 0.5 * revealed[EPS == 0.5][0]


def test_bounds_bracket_many_steps_and_lie_above_the_copies_against_none():
    """10 draws from 1,000 records, 1,000 steps, zero-out: the copies of the record against none
    (Mixture.binomial, the others at 0) is one dataset of many, and far from the worst."""
    ev = event(1.0, 1000, 10, "replace_special")
    upper = pj.event_epsilon(ev, 1000, 1e-5)
    lower = pj.event_epsilon(ev, 1000, 1e-5, pessimistic=False)
    against_none = pj.event_epsilon(pj.Event(pj.noise.Gaussian(1.0),
                                             pj.sampling.Mixture.binomial(1e-3, 10),
                                             "replace_special"), 1000, 1e-5)
    assert against_none < 2.0 < 11.0 < lower <= upper <= 1.3 * lower


def test_one_draw_from_one_record_is_the_gaussian_mechanism_of_the_copies():
    """n = 1: every draw is the record, K = B: the Gaussian of shift B / sigma, both bounds."""
    for neighboring, d in (("replace_special", 1.0), ("replace_one", 2.0)):
        ev = event(2.0, 1, 3, neighboring)
        exact = np.array([gaussian_delta(3 * d / 2.0, e) for e in EPS])
        upper = np.asarray(ev.pld().delta(EPS))
        lower = np.asarray(ev.pld(pessimistic=False).delta(EPS))
        assert np.all(upper >= exact) and np.all(upper <= exact * 1.01 + 1e-9)
        assert np.all(lower <= exact) and np.all(lower >= exact * 0.97 - 1e-9)


def test_extreme_noise_and_sizes_give_sound_bounds():
    """Tiny noise: an upper bound of inf or at least the lower; huge noise or a record almost
    never drawn: about 0; no draws: the identity."""
    for sigma, n, batch in ((1e-6, 1000, 10), (1e17, 1000, 10), (1.0, 10**12, 10**6),
                            (1.0, 100, 0)):
        ev = event(sigma, n, batch, "replace_special")
        upper = pj.event_epsilon(ev, 10, 1e-5)
        lower = pj.event_epsilon(ev, 10, 1e-5, pessimistic=False)
        assert 0.0 <= lower <= upper, (sigma, n, batch)
        if sigma >= 1.0:
            assert upper < 1e-3
    assert event(1.0, 100, 0, "replace_one").pld().size == 1


def attained_delta_at_zero_mp(n: int, batch: int, sigma: float, replace_one: bool) -> float:
    """delta(0), the total variation, of one step on the dataset with the other records at -1 and
    the record at +1 against 0 (zero-out) or -1 (replace-one): the batch's sum, shifted by the
    batch size, is 2K against K or 0 clip norms (K ~ Bin(batch, 1/n) copies). A lower bound on
    the worst case. The two densities cross once, at y0, for the tiny shifts tested here (under
    replace-one their ratio increases in y; under zero-out it does to first order in the shift),
    so the total variation is the difference of the two tails beyond y0 (for any y0 that
    difference is at most the total variation: a lower bound still). In mpmath at 40 digits,
    which keep shifts of 1e-17 noise scales to 23 digits."""
    with mp.workdps(40):
        mu, rate = mp.mpf(1) / mp.mpf(sigma), mp.mpf(1) / n
        weights = [mp.binomial(batch, k) * rate**k * (1 - rate) ** (batch - k)
                   for k in range(batch + 1)]
        p = [(w, 2 * k * mu) for k, w in enumerate(weights)]
        q = ([(mp.mpf(1), mp.mpf(0))] if replace_one
             else [(w, k * mu) for k, w in enumerate(weights)])

        def gap(y):
            return (mp.fsum(w * mp.npdf(y - m) for w, m in p)
                    - mp.fsum(w * mp.npdf(y - m) for w, m in q))

        crossing = mp.findroot(gap, (-1, 1), solver="anderson")

        def tail(mixture):
            return mp.fsum(w * mp.ncdf(m - crossing) for w, m in mixture)

        return float(tail(p) - tail(q))


@pytest.mark.parametrize("sigma", [1e8, pytest.param(1e13, marks=pytest.mark.slow),
                                   pytest.param(1e16, marks=pytest.mark.slow), 1e17])
@pytest.mark.parametrize("neighboring", ["replace_special", "replace_one"])
def test_huge_noise_keeps_an_upper_bound_at_every_scale(sigma, neighboring):
    """A Gaussian curve of a shift far below the float's digits (delta_mu(0) = erf(mu / sqrt 8)
    computed as a difference of two values near 1/2) must still be bounded from above."""
    ev = event(sigma, 100, 10, neighboring)
    attained = attained_delta_at_zero_mp(100, 10, sigma, neighboring == "replace_one")
    upper = pj.event_delta(ev, 1, 0.0)
    assert attained <= upper <= 2.0 * attained
    assert pj.event_delta(ev, 1, 0.0, pessimistic=False) <= attained * (1 + 1e-9)
    assert pj.event_epsilon(ev, 1, attained / 2) > 0.0


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="dataset_size"):
        pj.sampling.WithReplacement(0, 10)
    with pytest.raises(ValueError, match="batch_size"):
        pj.sampling.WithReplacement(100, -1)
    with pytest.raises(ValueError, match="batch_size"):
        pj.sampling.WithReplacement(100, 2.5)
    with pytest.raises(ValueError, match="dataset_size"):
        pj.sampling.WithReplacement([100, 200], 2)
    with pytest.raises(ValueError, match="add_remove"):
        event(1.0, 100, 10, "add_remove").pld()
    with pytest.raises(ValueError, match="Gaussian"):
        pj.Event(pj.noise.Laplace(1.0), pj.sampling.WithReplacement(100, 10),
                 "replace_special").pld()
    with pytest.raises(ValueError, match="more than 256 numbers of copies"):
        event(1.0, 10, 10**6, "replace_special").pld()
    with pytest.raises(ValueError, match="concrete"):
        jax.jit(lambda s: event(s, 100, 10, "replace_special").pld().probs)(1.0)
