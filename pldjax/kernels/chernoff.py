"""epsilon and delta of a composition from its parts' moment generating functions (a Chernoff bound,
the route of Rényi-DP accountants), for delta below what FFT composition resolves.

An FFT composition charges its round-off and its window's cut-off tails to the atom at +inf and to
every bin (see :mod:`pldjax.kernels.compose`): about 1e-19 per bin, so a composed PLD cannot resolve delta
much below 1e-15, and reads epsilon = inf or a loose value there. The bound here never composes on
a grid. For a composition of ``count_k`` runs of pessimistic PLDs L_k (each a PMF p_k on its grid
plus an atom m_k at +inf) and any lambda > 0:

    delta(eps) = E_P[(1 - e^{eps - L})_+]
              <= P(some part at +inf) + c_lambda e^{-lambda eps} prod_k (sum_i p_{k,i} e^{lambda z_i})^count_k

with c_lambda = sup_{y > 0} (1 - e^{-y}) e^{-lambda y} = (lambda / (1 + lambda))^lambda / (1 + lambda)
(the tight conversion of Canonne, Kamath and Steinke, "The discrete Gaussian for differential
privacy", 2020, Prop. 12, and of Asoodeh et al. 2021) and P(some part at +inf) <= sum_k count_k m_k.
The PMFs are exact (no FFT), and a pessimistic PLD dominates its mechanism, so its composition does
too: every lambda gives an upper bound, and the smallest over a geometric grid of lambdas is taken.
Each direction is bounded and the worse one is reported. Pessimistic PLDs only; concrete, unbatched.

At delta = 0 (pure DP) no lambda helps; epsilon(0) of the composition is the sum of the parts'
largest losses, read exactly (a composed PLD reads inf wherever its window cut that corner off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import kernel_jit
from pldjax.core.pld import PLD
from pldjax.core.precision import float64
from pldjax.core.validation import check_count, check_range
from pldjax.kernels.divergences import log_mgf_kernel

#: lambdas of the bound: geometric from 1e-3 to 1e6 (each gives a valid bound; 40 per decade keep
#: the smallest within about 3% of the optimum in its exponent)
LAMBDAS = np.geomspace(1e-3, 1e6, 361)
#: Below this delta (or where an FFT composition reads epsilon = inf) accountants also read this
#: bound: FFT round-off is charged at about 1e-19 a bin, so composed PLDs resolve delta down to
#: about 1e-12 only.
RESOLVED_DELTA = 1e-10
#: Relative slack for float64 round-off in the log-sums (far below the bound's own looseness).
_ROUNDOFF = 1e-12

_log_mgf = kernel_jit(jax.vmap(log_mgf_kernel, in_axes=(None, None, None, None, 0)))


def _by_direction(parts: Sequence[tuple[PLD, int]],
                  pessimistic: bool = True) -> list[list[tuple[PLD, int]]]:
    """For each direction of the composition, its (one-direction PLD, count) parts (checked:
    each unbatched, of the estimate ``pessimistic`` asks for; parts of count 0 left out, none
    for an empty composition)."""
    checked = []
    estimate = "pessimistic" if pessimistic else "optimistic"
    for i, (pld, count) in enumerate(parts):
        if not isinstance(pld, PLD) or pld.batch_shape or pld.pessimistic != pessimistic:
            raise ValueError(f"parts[{i}] must be an unbatched, {estimate} PLD")
        count = check_count(f"parts[{i}] count", count)
        if count > 0:
            checked.append((pld, count))
    two = any(not p.symmetric for p, _ in checked)
    return [[(pld.directions()[min(d, len(pld.directions()) - 1)], count) for pld, count in checked]
            for d in range(2 if two else 1)] if checked else []


def _exponents(parts: Sequence[tuple[PLD, int]]) -> list[tuple[np.ndarray, float]]:
    """Per direction: (sum_k count_k log E[e^{lambda L_k}; L_k finite] at each LAMBDAS,
    sum_k count_k m_k)."""
    out = []
    for direction in _by_direction(parts):
        total, atoms = np.zeros(LAMBDAS.shape), 0.0
        for pld, count in direction:
            mgf = np.asarray(_log_mgf(pld.probs, jnp.float64(0.0), pld.offset, pld.step,
                                      jnp.asarray(LAMBDAS[:, None])))[:, 0]
            total += count * mgf
            atoms += count * float(pld.inf_mass)
        out.append((total, min(atoms, 1.0)))
    return out


#: Relative allowance for the round-off of :func:`pure_epsilon`'s sum (each product and the
#: sum round by half an ulp; the parts' largest losses are grid points, exact).
PURE_ROUNDOFF = 2.0**-50


def pure_epsilon(parts: Sequence[tuple[PLD, int]], *, pessimistic: bool = True) -> float:
    """epsilon at delta = 0 (pure DP) of the composition of ``count`` runs of each ``(pld,
    count)`` in ``parts``: the worse direction's sum of count times the largest loss its PLD
    holds (inf with an atom at +inf). Each part's largest loss has positive probability, so the
    parts' occur together and add up: the composition's own epsilon(0), which a composed PLD
    reads as inf wherever its window cut that corner off.

    Args:
      parts: (PLD, count) pairs, each PLD unbatched and of the estimate ``pessimistic`` names,
        each count an integer >= 0.
      pessimistic: True (default) for pessimistic parts, False for optimistic ones.

    Returns:
      epsilon(0) in nats (0 for an empty composition), moved by PURE_ROUNDOFF of itself to
      its safe side: an upper bound on the mechanisms' when the parts are pessimistic, a lower
      bound when they are optimistic.
    """
    worst = 0.0
    for direction in _by_direction(parts, pessimistic):
        worst = max(worst, math.fsum(count * float(pld.epsilon(0.0)) for pld, count in direction))
    return worst * (1.0 + PURE_ROUNDOFF if pessimistic else 1.0 - PURE_ROUNDOFF)


def _log_c(lam):
    return -np.log1p(lam) - lam * np.log1p(1.0 / lam)


@float64
def epsilon(parts: Sequence[tuple[PLD, int]], delta: float) -> float:
    """An upper bound on epsilon at ``delta`` in [0, 1] of the composition of ``count`` runs of
    each ``(pld, count)`` in ``parts`` (see the module docstring); inf when the parts' atoms at
    +inf alone reach delta. At delta = 0, :func:`pure_epsilon`."""
    check_range("delta", delta, 0.0, 1.0)
    if delta >= 1.0:  # every mechanism is (0, 1)-DP
        return 0.0
    if delta == 0.0:
        return pure_epsilon(parts)
    worst = 0.0
    for total, atoms in _exponents(parts):
        if delta <= atoms:
            return math.inf
        with np.errstate(invalid="ignore", over="ignore"):
            eps = (_log_c(LAMBDAS) + total - math.log(delta - atoms)) / LAMBDAS
        eps = np.where(np.isnan(eps), np.inf, eps)
        best = float(np.min(eps))
        worst = max(worst, best + _ROUNDOFF * (abs(best) + 1.0))
    return max(worst, 0.0)


@float64
def delta(parts: Sequence[tuple[PLD, int]], epsilon: float) -> float:
    """An upper bound on delta at ``epsilon`` >= 0 of the composition (see :func:`epsilon`)."""
    check_range("epsilon", epsilon, 0.0, allow_inf=True)
    worst = 0.0
    for total, atoms in _exponents(parts):
        if math.isinf(epsilon):
            finite = 0.0
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                logs = _log_c(LAMBDAS) + total - LAMBDAS * epsilon
            finite = float(np.exp(np.min(np.where(np.isnan(logs), np.inf, logs))))
        worst = max(worst, atoms + finite * (1.0 + _ROUNDOFF))
    return min(worst, 1.0)


__all__ = ["LAMBDAS", "PURE_ROUNDOFF", "RESOLVED_DELTA", "delta", "epsilon", "pure_epsilon"]
