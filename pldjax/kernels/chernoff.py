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


def _exponents(parts: Sequence[tuple[PLD, int]]) -> list[tuple[np.ndarray, float]]:
    """Per direction: (sum_k count_k log E[e^{lambda L_k}; L_k finite] at each LAMBDAS,
    sum_k count_k m_k)."""
    checked = []
    for i, (pld, count) in enumerate(parts):
        if not isinstance(pld, PLD) or pld.batch_shape or not pld.pessimistic:
            raise ValueError(f"parts[{i}] must be an unbatched, pessimistic PLD")
        count = check_count(f"parts[{i}] count", count)
        if count > 0:
            checked.append((pld, count))
    if not checked:  # nothing composed: the identity, delta = 0 at every epsilon
        return []
    two = any(not p.symmetric for p, _ in checked)
    out = []
    for d in range(2 if two else 1):
        total, atoms = np.zeros(LAMBDAS.shape), 0.0
        for pld, count in checked:
            direction = pld.directions()[min(d, len(pld.directions()) - 1)]
            mgf = np.asarray(_log_mgf(direction.probs, jnp.float64(0.0), direction.offset,
                                      direction.step, jnp.asarray(LAMBDAS[:, None])))[:, 0]
            total += count * mgf
            atoms += count * float(direction.inf_mass)
        out.append((total, min(atoms, 1.0)))
    return out


def _log_c(lam):
    return -np.log1p(lam) - lam * np.log1p(1.0 / lam)


@float64
def epsilon(parts: Sequence[tuple[PLD, int]], delta: float) -> float:
    """An upper bound on epsilon at ``delta`` in [0, 1] of the composition of ``count`` runs of
    each ``(pld, count)`` in ``parts`` (see the module docstring); inf when the parts' atoms at
    +inf alone reach delta."""
    check_range("delta", delta, 0.0, 1.0)
    if delta >= 1.0:  # every mechanism is (0, 1)-DP
        return 0.0
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


__all__ = ["LAMBDAS", "RESOLVED_DELTA", "delta", "epsilon"]
