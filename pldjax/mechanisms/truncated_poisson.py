"""Truncated Poisson sampling of the Gaussian mechanism (jax-privacy's batch selection; dp_accounting's
``TruncatedSubsampledGaussianDpEvent``): the PLD of one step, as the tighter of two sound analyses.
The user-facing scheme is :class:`pldjax.mechanisms.sampling.TruncatedPoisson`; this module is its kernel.

The mechanism. Each of the ``n = dataset_size`` records joins the batch independently with
probability q; when more than B (``truncated_batch_size``) records are drawn, a uniformly random B
of them are kept. The sum of the kept records' clipped contributions (norm <= C, the Gaussian's
sensitivity) gets Gaussian noise of standard deviation sigma. Selection looks at indices only.
Under add/remove, n counts the records of the dataset that holds the differing record.

Sources. The scheme is the fixed-shape Poisson subsampling of L. Chua, B. Ghazi, P. Kamath,
R. Kumar, P. Manurangsi, A. Sinha and C. Zhang, "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling" (NeurIPS 2024, arXiv:2411.04205), in its part on implementing Poisson subsampling at
scale. jax-privacy's accounting for it cites "Tighter Privacy Analysis for Truncated Poisson
Sampling" (arXiv:2508.15089, 2025), whose mixture dp_accounting implements (analysis 2 below).

Notation: K ~ Binomial(n - 1, q) other records drawn, b(k) = P(K = k), S = P(Binomial(n, q) > B);
sum_{k >= B} b(k) B / (k + 1) = B S / (n q), so the probability that the sensitive record i is in
the final batch is pi = q P(K <= B - 1) + B S / n.

Analysis 1 (pldjax's own: the adversary also sees which other records were kept). Zero-out
(REPLACE_SPECIAL) and replace-one: both datasets have n records and the selection has one law. Let
Z say whether i is in the final batch and R be the set of other indices in it; the output is
g(R) + v Z + N(0, sigma^2). Revealing R (post-processing can only help the adversary, so the result
is an upper bound) leaves for each R the Poisson-subsampled pair at rate pi_R = P(Z = 1 | R), and
hockey-stick divergences are linear in such a revealed mixture:

* |R| = r <= B - 2: only K = r gives it: weight P(K <= B - 2), rate q;
* |R| = B - 1: K = B - 1, or K >= B with i drawn and kept (probability B / (K + 1)): weight
  w = b(B - 1) + (B / n) S, rate (q b(B - 1) + (B / n) S) / w >= q;
* |R| = B: i is not in the batch: the identity, the remaining weight.

Add/remove: a record that is added can push another one out of a full batch, so the output moves
by up to 2C. Conditioning on the neighbour's final batch T: when |T| < B the added record joins
with probability q (shift C); when |T| = B (probability at most P(Binomial(n, q) >= B)) it joins
with probability at most q and replaces one member of T (shift <= 2C): the mixture of the
Poisson-subsampled Gaussian at rate q with sensitivity C and with sensitivity 2C.

Analysis 2 (dp_accounting's mixture). With probability 1 - t, t = P(K >= B), no truncation can
involve i: the Poisson-subsampled pair at rate q under the relation. Given K >= B, write the kept
others as a uniform (B - 1)-subset R' plus, when i is not kept, one more record j: the output is
g(R') + (v if i is kept, else u_j), i kept with probability q' = E[q B / (K + 1) | K >= B] =
B S / (n t) (the law of (R', j) does not depend on K, so averaging the rate is exact). Against
the neighbour's g(R') + (v' if kept, else u_j), and after subtracting u_j, this is a pair of
Poisson-subsampled shifts of norm <= 2C, bounded by replace-one at sensitivity 2C (one record
moving from -2C to +2C) at rate q'.

Both are upper bounds; neither dominates (analysis 1 is far tighter under zero-out, analysis 2 a
little tighter under replace-one and add/remove). The true curve lies below both, and it is
convex in x = e^eps, so it lies below the lower convex envelope of their pointwise minimum: the
PLD built here (:func:`tightest`), whichever relation. The optimistic estimate is a mechanism the
truth must cover: every other record contributing 0, i is in the batch with probability pi, which
is the Poisson-subsampled pair at rate pi.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from pldjax.core import grid as grid_lib
from pldjax.core.align import align
from pldjax.core.compilation import array_module, kernel_jit, matmul
from pldjax.core.grid import Grid
from pldjax.core.pld import PLD, from_rows, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.validation import check_range
from pldjax.kernels.envelope import HULL_REACH, envelope_masses, envelope_on_host, excess_on_grid
from pldjax.kernels.hockey_stick import delta_kernel
from pldjax.mechanisms.events import privacy_loss
from pldjax.mechanisms.named import identity
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import Gaussian
from pldjax.mechanisms.sampling import Poisson, TruncatedPoisson
from pldjax.mechanisms.subsampling import NEGLIGIBLE_COMPONENT


# -- PLDs on one common window --------------------------------------------------------------------
def _common_window(directions: list[PLD]) -> tuple[float, int, np.ndarray, np.ndarray]:
    """Concrete single-direction PLDs on one step, on the safe side (:func:`pldjax.core.align.align`:
    the finest, exact for the automatic power-of-two grids, when that fits the memory guard, else
    the coarsest) and one window holding all of them: (step, offset, probs (K, n), inf masses
    (K,)), n a power of two (zeros above the top loss change nothing)."""
    parts = align(directions, "truncated Poisson sampling")
    step = float(np.asarray(parts[0].step))
    lo = min(int(p.offset) for p in parts)
    hi = max(int(p.offset) + p.size for p in parts)
    probs = np.zeros((len(parts), grid_lib.next_pow2(hi - lo)))
    for k, p in enumerate(parts):
        start = int(p.offset) - lo
        probs[k, start:start + p.size] = np.asarray(p.probs)
    return step, lo, probs, np.asarray([float(p.inf_mass) for p in parts])


def _same_directions(plds: list[PLD]) -> list[PLD]:
    """Give every PLD two directions when one of them has two (a symmetric PLD is its own
    reverse)."""
    if all(p.symmetric for p in plds):
        return plds
    return [PLD.from_directions(p, p) if p.symmetric else p for p in plds]


def mixture(weights, plds: list[PLD]) -> PLD:
    """The PLD of the mechanism that picks component k with probability ``weights[k]`` and
    reveals which: sum_k w_k PLD_k (hockey-stick curves are linear in it), pessimistic when every
    component is. Components are concrete, unbatched PLDs of one kind."""
    plds = _same_directions(plds)
    w = np.asarray(weights, np.float64)
    directions = []
    for d in range(len(plds[0].directions())):
        step, lo, probs, inf = _common_window([p.directions()[d] for p in plds])
        directions.append(unchecked_pld(matmul(probs.T, w), np.float64(w @ inf), np.int64(lo),
                                        np.float64(step), plds[0].pessimistic))
    return PLD.from_directions(*directions)


def _envelope_kernel(probs, inf_mass, offset, step, *, size: int, hull: bool):
    """One direction: the PLD whose curve is the lower convex envelope (in x = e^z) of the
    pointwise minimum of the K curves at the window's grid points (see :func:`tightest`); without
    ``hull``, the component whose curve has the smallest sum. A component whose curve is the
    minimum at every grid point is that envelope already: it is kept as it is (rebuilt, its
    masses' round-off left an atom of 2e-16 at +inf). NumPy's for NumPy arrays
    (``_envelope_jit``: one program for each size)."""
    xp = array_module(probs)
    z = (offset + xp.arange(size, dtype=xp.float64)) * step
    if xp is np:
        curves = np.stack([delta_kernel(p, m, offset, step, z)
                           for p, m in zip(probs, inf_mass, strict=True)])
    else:
        curves = jax.vmap(delta_kernel, in_axes=(0, 0, None, None, None))(probs, inf_mass, offset,
                                                                           step, z)
    if not hull:
        best = xp.argmin(xp.sum(curves, axis=1))
        return probs[best], inf_mass[best]
    least = xp.min(curves, axis=0)
    lowest = xp.all(curves <= least, axis=1)
    if xp is np:
        if lowest.any():
            return probs[np.argmax(lowest)], inf_mass[np.argmax(lowest)]
        return envelope_masses(least, _least_excess(probs, z, step), z, step)
    return jax.lax.cond(jnp.any(lowest),
                        lambda: (probs[jnp.argmax(lowest)], inf_mass[jnp.argmax(lowest)]),
                        lambda: envelope_masses(least, _least_excess(probs, z, step), z, step))


_envelope_jit = kernel_jit(_envelope_kernel, static_argnames=("size", "hull"))


def _least_excess(probs, z, step):
    """The smallest of the components' excesses over 1 - e^z at the grid points ``z``."""
    if array_module(probs) is np:
        return np.min([excess_on_grid(p, z, step) for p in probs], axis=0)
    return jnp.min(jax.vmap(excess_on_grid, in_axes=(0, None, None))(probs, z, step), axis=0)


@float64
def tightest(plds: list[PLD]) -> PLD:
    """The tightest pessimistic PLD below several pessimistic PLDs of one mechanism (upper bounds
    from different analyses): per direction, the lower convex envelope in x = e^eps of the
    pointwise minimum of their hockey-stick curves at the grid points of a common window, joined
    by chords. Sound: the true curve is convex and below every curve, hence below that envelope,
    and (being convex) below its chords between grid points. Components are concrete, unbatched.
    A window spanning more than 2 HULL_REACH nats keeps the analysis with the smallest curve."""
    plds = _same_directions(list(plds))
    if len(plds) == 1:
        return plds[0]
    if not all(p.pessimistic for p in plds):
        raise ValueError("tightest needs pessimistic PLDs: the minimum of lower bounds bounds nothing")
    directions = []
    for d in range(len(plds[0].directions())):
        step, lo, probs, inf = _common_window([p.directions()[d] for p in plds])
        size = probs.shape[1]
        options = dict(size=size, hull=size * step / 2 <= HULL_REACH)
        if envelope_on_host(probs.size, ("envelope of components", probs.shape, options["hull"])):
            with np.errstate(all="ignore"):
                out, out_inf = _envelope_kernel(np.asarray(probs, np.float64),
                                                np.asarray(inf, np.float64), np.int64(lo),
                                                np.float64(step), **options)
        else:
            out, out_inf = _envelope_jit(jnp.asarray(probs), jnp.asarray(inf), np.int64(lo),
                                         np.float64(step), **options)
        directions.append(from_rows(out, out_inf, np.int64(lo), np.float64(step), (), True))
    return PLD.from_directions(*directions)


# -- the two analyses ----------------------------------------------------------------------------
def rates(sampling_prob: float, dataset_size: int, truncated_batch_size: int):
    """Analysis 1, zero-out / replace-one: (weight, rate) of the components with a non-zero rate
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


def truncation(sampling_prob: float, dataset_size: int, truncated_batch_size: int):
    """Analysis 2: (t, q') with t = P(K >= B) the probability that truncation can involve the
    record and q' = B S / (n t) its rate given that (None when t = 0). See the module docstring."""
    q, n, b = sampling_prob, dataset_size, truncated_batch_size
    t = float(stats.binom.sf(b - 1, n - 1, q))
    if t == 0:
        return 0.0, None
    return t, min(1.0, float(stats.binom.sf(b, n, q)) * b / (t * n))


def inclusion(sampling_prob: float, dataset_size: int, truncated_batch_size: int) -> float:
    """pi: the probability that a given record is in the final batch."""
    q, n, b = sampling_prob, dataset_size, truncated_batch_size
    return min(1.0, q * float(stats.binom.cdf(b - 1, n - 1, q))
               + b / n * float(stats.binom.sf(b, n, q)))


def _poisson(noise: Gaussian, rate: float, neighboring: Neighboring, scale: float = 1.0,
             **kwargs) -> PLD:
    """The Poisson-subsampled ``noise`` at ``rate``, its sensitivity multiplied by ``scale``."""
    if scale != 1.0:
        noise = dataclasses.replace(noise, sensitivity=scale * float(noise.sensitivity))
    return privacy_loss(noise, Poisson(rate), neighboring, **kwargs)


def _concrete_scalars(**values) -> dict:
    out = {}
    for name, value in values.items():
        if isinstance(value, jax.core.Tracer) or np.ndim(value) != 0:
            raise ValueError(f"truncated Poisson sampling needs a scalar, concrete {name} (its PLD "
                             f"is a mixture built on the host), got {value!r}")
        out[name] = value.item() if hasattr(value, "item") else value
    return out


@float64
def truncated_poisson_pld(noise: Gaussian, sampling_prob, dataset_size, truncated_batch_size,
                          neighboring: Neighboring | str = Neighboring.REPLACE_SPECIAL, *,
                          pessimistic: bool = True, grid: Grid | None = None) -> PLD:
    """The PLD of one step of truncated Poisson sampling with Gaussian ``noise`` (see the module
    docstring); arguments as :class:`pldjax.mechanisms.sampling.TruncatedPoisson` (checked there).
    Pessimistic: the tighter of the two analyses; optimistic: the pair with every other record at
    zero (a lower bound)."""
    if not isinstance(noise, Gaussian):
        raise ValueError("truncated Poisson sampling is offered for pldjax.mechanisms.noise.Gaussian noise, "
                         f"got {type(noise).__name__}")
    neighboring = Neighboring.parse(neighboring)
    v = _concrete_scalars(sigma=noise.sigma, sensitivity=noise.sensitivity, sampling_prob=sampling_prob,
                          dataset_size=dataset_size, truncated_batch_size=truncated_batch_size)
    q, n, b = float(v["sampling_prob"]), int(v["dataset_size"]), int(v["truncated_batch_size"])
    noise = Gaussian(float(v["sigma"]), float(v["sensitivity"]))
    if q == 0 or b == 0:
        return identity(pessimistic=pessimistic)
    # zero-out pairs as add/remove where the dataset size does not matter (Poisson sampling)
    pair = Neighboring.REPLACE_ONE if neighboring == Neighboring.REPLACE_ONE else Neighboring.ADD_REMOVE
    kwargs = dict(pessimistic=pessimistic, grid=grid)
    if not pessimistic:
        return _poisson(noise, inclusion(q, n, b), pair, **kwargs)

    if neighboring == Neighboring.ADD_REMOVE:
        heavy = float(stats.binom.sf(b - 1, n, q))  # P(Binomial(n, q) >= B)
        first = [(1.0 - heavy, _poisson(noise, q, pair, **kwargs))]
        if heavy > 0:
            first.append((heavy, _poisson(noise, q, pair, 2.0, **kwargs)))
    else:
        first = [(w, _poisson(noise, r, pair, **kwargs)) for w, r in rates(q, n, b)]
        rest = 1.0 - sum(w for w, _ in first)
        if rest > 0:
            first.append((rest, identity()))
    t, rate = truncation(q, n, b)
    second = [(1.0 - t, _poisson(noise, q, pair, **kwargs))]
    if rate is not None:
        second.append((t, _poisson(noise, rate, Neighboring.REPLACE_ONE, 2.0, **kwargs)))
    return tightest([_analysis(parts) for parts in (first, second)])


def _analysis(parts: list[tuple[float, PLD]]) -> PLD:
    """The pessimistic PLD of one analysis, the mixture of its (weight, PLD) components; those
    less likely than NEGLIGIBLE_COMPONENT (as for a mixture of shifts) are folded into the +inf
    atom, which raises delta by their weight at every epsilon (their windows, up to +-16 nats at
    twice the sensitivity, stretched the common grid of TruncatedPoisson(1e-4, 10^8, 12,000), with
    weights of 1e-84, to 2^23 points); the identity, on one point, widens nothing and stays."""
    folded = [w < NEGLIGIBLE_COMPONENT and pld.size > 1 for w, pld in parts]
    rare = sum(w for (w, _), fold in zip(parts, folded, strict=True) if fold)
    parts = [part for part, fold in zip(parts, folded, strict=True) if not fold]
    if rare > 0:
        parts.append((rare, unchecked_pld(np.zeros(1), np.float64(1.0), np.int64(0), np.float64(1.0), True)))
    if len(parts) == 1:
        return parts[0][1]
    return mixture(*zip(*parts, strict=True))


@float64
def truncated_poisson_gaussian(
    noise_multiplier: float,
    sampling_prob: float,
    dataset_size: int,
    truncated_batch_size: int,
    *,
    neighboring: Neighboring | str = Neighboring.REPLACE_SPECIAL,
    pessimistic: bool = True,
) -> PLD:
    """PLD of one step of truncated Poisson sampling with the Gaussian mechanism (a thin wrapper
    of ``privacy_loss(Gaussian(noise_multiplier), TruncatedPoisson(...), neighboring)``).

    Args:
      noise_multiplier: sigma / clipping norm, > 0.
      sampling_prob: q in [0, 1], each record's probability of being drawn before truncation.
      dataset_size: n >= 1 records (public: it sets the truncation probability).
      truncated_batch_size: B >= 0, the largest batch kept (B = 0: nothing is released).
      neighboring: "replace_special" (zero-out, jax-privacy's default), "replace_one" or
        "add_remove".
      pessimistic: True (default) for an upper bound, False for a lower bound.

    Compose it with ``self_compose`` for many steps.
    """
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    return privacy_loss(Gaussian(noise_multiplier),
                        TruncatedPoisson(sampling_prob, dataset_size, truncated_batch_size),
                        neighboring, pessimistic=pessimistic)


__all__ = ["inclusion", "mixture", "rates", "tightest", "truncated_poisson_gaussian",
           "truncated_poisson_pld", "truncation"]
