"""Converting PLDs: the swapped pair, tradeoff (f-DP) curves and Rényi divergences.

For one direction PLD(P || Q) with masses p_i at losses z_i, the same outcomes have Q-masses
q_i = p_i e^{-z_i}; the atom at +inf is P-only mass and 1 - sum q_i is Q-only mass (loss -inf).

* Tradeoff curve (Neyman-Pearson): the most powerful test rejects P on the lowest losses first, so
  beta(alpha) is the piecewise-linear curve through (sum_{i<k} p_i, sum_{i>=k} q_i). A pessimistic
  PLD dominates the true pair, so its curve is a lower bound on the true beta.
* Rényi divergence of order a (laplace-transform-dp.txt eqs. (19)-(21)):
  D_a = log E_P[e^{(a-1) L}] / (a - 1), infinite for a >= 1 when there is an atom at +inf. Rényi
  divergences obey data processing, so a pessimistic PLD gives an upper bound.

Two-direction PLDs report the worse direction: the smaller beta, the larger divergence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from pldjax.pld import PLD, batched
from pldjax.precision import float64, host_result
from pldjax.validate import check_range, is_traced


def _log_masses(probs, offset, step):
    z = (offset + jnp.arange(probs.shape[-1], dtype=jnp.float64)) * step
    positive = probs > 0
    log_p = jnp.where(positive, jnp.log(jnp.where(positive, probs, 1.0)), -jnp.inf)
    return z, log_p


def tradeoff_kernel(probs, inf_mass, offset, step, alphas):
    """beta(alpha) of one direction: the type II error of the best test at type I error alpha."""
    z, log_p = _log_masses(probs, offset, step)
    q = jnp.exp(jnp.minimum(log_p - z, 0.0))
    type_one = jnp.concatenate([jnp.zeros((1,)), jnp.cumsum(probs)])
    type_two = jnp.concatenate([jnp.cumsum(q[::-1])[::-1], jnp.zeros((1,))])
    beta = jnp.interp(alphas, type_one, type_two, right=0.0)
    return jnp.clip(beta, 0.0, 1.0 - alphas)


def renyi_kernel(probs, inf_mass, offset, step, orders):
    """Rényi divergence D_a(P || Q) of one direction for each order a > 0 (a = 1: KL)."""
    z, log_p = _log_masses(probs, offset, step)
    a = orders[:, None]
    safe = jnp.where(a == 1.0, 2.0, a)
    general = logsumexp(log_p[None, :] + (safe - 1.0) * z[None, :], axis=1) / (safe[:, 0] - 1.0)
    kl = jnp.sum(probs * z)
    value = jnp.where(orders == 1.0, kl, general)
    return jnp.where((orders >= 1.0) & (inf_mass > 0), jnp.inf, value)


_tradeoff_jit = jax.jit(tradeoff_kernel)
_renyi_jit = jax.jit(renyi_kernel)


def _per_direction(pld: PLD, values, kernel, jitted, combine) -> jax.Array:
    values = jnp.asarray(values, jnp.float64)
    flat = values.reshape(-1)
    chosen = kernel if is_traced(pld) or is_traced(values) else jitted
    result = None
    for direction in pld.directions():
        fn = batched(lambda p, m, o, h: chosen(p, m, o, h, flat), len(direction.batch_shape))
        out = fn(direction.probs, direction.inf_mass, direction.offset, direction.step)
        result = out if result is None else combine(result, out)
    return host_result(result.reshape(pld.batch_shape + values.shape))


@float64
def tradeoff(pld: PLD, alpha) -> jax.Array:
    """The f-DP tradeoff curve beta(alpha), alpha in [0, 1] (see :meth:`PLD.tradeoff`)."""
    check_range("alpha", alpha, 0.0, 1.0)
    return _per_direction(pld, alpha, tradeoff_kernel, _tradeoff_jit, jnp.minimum)


@float64
def renyi(pld: PLD, order) -> jax.Array:
    """Rényi divergence of the given order(s) > 0 (see :meth:`PLD.renyi`)."""
    check_range("order", order, 0.0, low_open=True)
    return _per_direction(pld, order, renyi_kernel, _renyi_jit, jnp.maximum)


def swap(pld: PLD) -> PLD:
    """PLD(Q || P) from PLD(P || Q): the two directions exchanged (a symmetric PLD is unchanged)."""
    if pld.reverse is None:
        return pld
    back = pld.reverse
    return PLD(back.probs, back.inf_mass, back.offset, back.step, back.pessimistic, pld._forward())
