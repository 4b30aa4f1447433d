"""Truncated Poisson sampling of the Gaussian mechanism (jax-privacy's batch selection; dp_accounting's
``TruncatedSubsampledGaussianDpEvent``): a pessimistic PLD for one step.

The mechanism. Each of the ``n = dataset_size`` records joins the batch independently with
probability q; when more than B (``truncated_batch_size``) records are drawn, a uniformly random B
of them are kept. The sum of the kept records' clipped contributions (norm <= 1) gets Gaussian
noise of standard deviation sigma. Selection looks at indices only, never at the data.

Sources. The scheme is the fixed-shape Poisson subsampling of L. Chua, B. Ghazi, P. Kamath,
R. Kumar, P. Manurangsi, A. Sinha and C. Zhang, "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling" (NeurIPS 2024, arXiv:2411.04205), in its part on implementing Poisson subsampling at
scale (batches truncated to B and padded with zero-weight examples); they absorb the probability
that any batch exceeds B into delta. jax-privacy's accounting for it cites also "Tighter Privacy
Analysis for Truncated Poisson Sampling" (arXiv:2508.15089, 2025), and dp_accounting bounds one
step by a mixture: with the probability t that at least B other records are drawn, a replace-one
Gaussian at sigma / 2 subsampled at a conditional rate, otherwise the plain Poisson-subsampled
Gaussian. The derivation below is pldjax's own (it lets the adversary see how many other records
were kept, which gives an exact mixture of Poisson-subsampled Gaussians); tests/
test_truncated_poisson.py checks its weights and rates against an enumeration of the sampling and
its curve against mpmath.

Derivation, zero-out (REPLACE_SPECIAL) and replace-one adjacency. Both datasets have n records
and the sensitive index i is kept in both, so the selection has the same law under both. Let Z
say whether i is in the final batch and R be the set of other indices in it; then the output is
g(R) + v Z + N(0, sigma^2) with v = x_i's contribution (zero-out: v against 0; replace-one: v
against v', |v - v'| <= 2). Revealing R (post-processing can only help the adversary, so the
result is an upper bound) leaves, for each R, the pair (pi_R N(g + v) + (1 - pi_R) N(g), N(g)):
a Poisson-subsampled Gaussian at rate pi_R = P(Z = 1 | R). Hockey-stick divergences are linear
in such a revealed mixture, so the PLD is the mixture of these PLDs with weights P(R). With
K ~ Binomial(n - 1, q) other records drawn, b(k) = P(K = k) and S = P(Binomial(n, q) > B):

* |R| = r <= B - 2: only K = r gives it, with or without i: weight P(K <= B - 2), rate q;
* |R| = B - 1: K = B - 1 (i drawn or not), or K >= B with i drawn and kept (probability
  B / (K + 1)); using sum_{k >= B} b(k) B / (k + 1) = B S / (n q), the weight is
  w = b(B - 1) + (B / n) S and the rate is (q b(B - 1) + (B / n) S) / w >= q;
* |R| = B: i is not in the batch, the pair is (N(g), N(g)): the identity, the remaining weight.

Add/remove adjacency (dp_accounting accepts it; jax-privacy does not use truncation with it):
the datasets have n - 1 or n other records, and a record that is added can push another one out
of a full batch, so the output moves by up to 2. Conditioning on the neighbour's final batch T:
when |T| < B the added record joins with probability q (shift 1); when |T| = B (probability at
most P(Binomial(n, q) >= B), increasing in the number of others) it joins with probability at
most q and replaces one member of T (shift <= 2). The PLD used is the mixture of the Poisson
subsampled Gaussian at rate q with sensitivity 1 and with sensitivity 2 (the latter has the
larger curve, so giving it the larger weight is pessimistic).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from pldjax.align import onto_step
from pldjax.mechanisms import gaussian, identity
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.validate import check_count, check_range

NEIGHBORING = ("replace_special", "replace_one", "add_remove")


def mixture(weights, plds: list[PLD]) -> PLD:
    """The PLD of the mechanism that picks component k with probability ``weights[k]`` and
    reveals which: sum_k w_k PLD_k (hockey-stick curves are linear in it), pessimistic when every
    component is. Components are concrete, unbatched PLDs with the same directions; they are put
    on the finest of their steps (exact for the automatic power-of-two grids)."""
    step = min(float(np.min(np.asarray(p.step))) for p in plds)
    parts = [onto_step(p, step, "mixture") for p in plds]
    directions = []
    for d in range(len(parts[0].directions())):
        ds = [p.directions()[d] for p in parts]
        lo = min(int(x.offset) for x in ds)
        hi = max(int(x.offset) + x.size for x in ds)
        # zeros above the top loss change nothing; a power-of-two size reuses compiled kernels
        probs = np.zeros(1 << int(np.ceil(np.log2(hi - lo))))
        inf_mass = 0.0
        for w, x in zip(weights, ds, strict=True):
            start = int(x.offset) - lo
            probs[start:start + x.size] += w * np.asarray(x.probs)
            inf_mass += w * float(x.inf_mass)
        directions.append(PLD(probs, np.float64(inf_mass), np.int64(lo), np.float64(step), True))
    return PLD.from_directions(*directions)


def rates(sampling_prob: float, dataset_size: int, truncated_batch_size: int):
    """Zero-out / replace-one mixture: (weight, rate) of the components with a non-zero rate
    (the rest of the mass is the identity). See the module docstring."""
    q, n, b = sampling_prob, dataset_size, truncated_batch_size
    others = stats.binom(n - 1, q)
    low = float(others.cdf(b - 2)) if b >= 2 else 0.0
    full = b / n * float(stats.binom.sf(b, n, q))  # (B / n) P(Binomial(n, q) > B)
    at_edge = float(others.pmf(b - 1))
    weight = at_edge + full
    parts = [(low, q)]
    if weight > 0:
        parts.append((weight, min(1.0, (q * at_edge + full) / weight)))
    return [(w, r) for w, r in parts if w > 0]


@float64
def truncated_poisson_gaussian(
    noise_multiplier: float,
    sampling_prob: float,
    dataset_size: int,
    truncated_batch_size: int,
    *,
    neighboring: str = "replace_special",
) -> PLD:
    """Pessimistic PLD of one step of truncated Poisson sampling with the Gaussian mechanism.

    Args:
      noise_multiplier: sigma / clipping norm, > 0.
      sampling_prob: q in [0, 1], each record's probability of being drawn before truncation.
      dataset_size: n >= 1 records (public: it sets the truncation probability).
      truncated_batch_size: B >= 0, the largest batch kept (B = 0: nothing is released).
      neighboring: "replace_special" (zero-out, jax-privacy's default, the tight case),
        "replace_one" or "add_remove" (looser: a record added can push another one out).

    Returns an upper bound (pessimistic PLD); compose it with ``self_compose`` for many steps.
    """
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    n = check_count("dataset_size", dataset_size, minimum=1)
    b = check_count("truncated_batch_size", truncated_batch_size)
    if neighboring not in NEIGHBORING:
        raise ValueError(f"neighboring must be one of {NEIGHBORING}, got {neighboring!r}")
    q, sigma = float(sampling_prob), float(noise_multiplier)
    if q == 0 or b == 0:
        return identity()
    if neighboring == "add_remove":
        heavy = float(stats.binom.sf(b - 1, n, q))  # P(Binomial(n, q) >= B)
        light = gaussian(sigma, sampling_prob=q)
        if heavy == 0:
            return light
        return mixture([1.0 - heavy, heavy], [light, gaussian(sigma, sensitivity=2.0, sampling_prob=q)])
    relation = "add_remove" if neighboring == "replace_special" else "replace_one"
    parts = rates(q, n, b)
    plds = [gaussian(sigma, sampling_prob=r, neighboring=relation) for _, r in parts]
    weights = [w for w, _ in parts]
    rest = 1.0 - sum(weights)
    if rest > 0:
        plds.append(identity())
        weights.append(rest)
    if len(plds) == 1:
        return plds[0]
    if any(not p.symmetric for p in plds):  # the identity has no reverse: give it one
        plds = [p if not p.symmetric else PLD.from_directions(p, p)
                for p in plds]
    return mixture(weights, plds)


__all__ = ["mixture", "truncated_poisson_gaussian"]
