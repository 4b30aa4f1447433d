"""Approximate zCDP and (epsilon, delta) filters of Whitehouse, Ramdas, Rogers and Wu, "Fully
Adaptive Composition in Differential Privacy" (ICML 2023), §3.

Thm 1: accept while the sum of the queries' rho_n stays <= rho and the sum of their delta_n <= delta;
the interaction is delta-approximate rho-zCDP. Thm 8 ((epsilon, delta) filter, stated in sums of
epsilon_n^2): with delta = delta' + delta'', accept while sum epsilon_n^2 <= y* and
sum delta_n <= delta'', where y* solves sqrt(2 log(1/delta') y) + y / 2 = epsilon:
y* = (sqrt(2 log(1/delta') + 2 epsilon) - sqrt(2 log(1/delta')))^2 (eq. (11) as printed solves for
epsilon / 2 instead: substituting it back gives epsilon / 2). It is Thm 1 with rho = y* / 2 and an
(epsilon_n, delta_n)-DP query counted as delta_n-approximate epsilon_n^2 / 2-zCDP (Lemma 1).

A PLD query is converted soundly to (rho_n, delta_n): with m its atom at +inf and 1 - c its
missing Q mass (c = sum p_i e^{-z_i}), P = (1 - delta_n) P' + delta_n P'' and
Q = (1 - delta_n) Q' + delta_n Q'' for delta_n = max(m, 1 - c), P' = P_finite / (1 - m) and
Q' = Q_finite / c; rho_n bounds sup_{a > 1} max(D_a(P'||Q'), D_a(Q'||P')) / a from a geometric
grid of orders (D_a is non-decreasing in a, so on (a_j, a_{j+1}] D_a / a <= D_{a_{j+1}} / a_j, and
beyond the last order D_a <= D_inf = the largest loss).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from pldjax.adaptive.filters.base import Filter, keep_if, make_filter, pld_cost, query_directions
from pldjax.core.pld import PLD
from pldjax.core.precision import add_up, float64, square_up
from pldjax.core.special import log1p
from pldjax.core.validation import check_range

#: Orders for the zCDP bound of a PLD query: 1 + 1e-4 .. 1e4, ratio ~1.009 (overestimate <= 0.9%).
_ORDERS = np.geomspace(1.0 + 1e-4, 1e4, 1024)


def _zcdp_of_direction(probs, inf_mass, offset, step):
    """(rho, delta) bound for one direction's grid PLD (see the module docstring)."""
    z = (offset + jnp.arange(probs.shape[-1])) * step
    positive = probs > 0
    log_p = jnp.where(positive, jnp.log(jnp.where(positive, probs, 1.0)), -jnp.inf)
    log_c = logsumexp(log_p - z)
    log_keep = log1p(-jnp.minimum(inf_mass, 0.5), jnp)
    delta = jnp.maximum(inf_mass, -jnp.expm1(jnp.minimum(log_c, 0.0)))
    a = jnp.asarray(_ORDERS)[:, None]
    # D_a(P'||Q') and D_a(Q'||P') with P' = P_fin / (1 - m), Q' = Q_fin / c
    forward = (logsumexp(log_p + (a - 1) * z, axis=1) - a[:, 0] * log_keep
               + (a[:, 0] - 1) * log_c) / (a[:, 0] - 1)
    backward = (logsumexp(log_p - a * z, axis=1) - a[:, 0] * log_c
                + (a[:, 0] - 1) * log_keep) / (a[:, 0] - 1)
    divergence = jnp.maximum(jnp.maximum(forward, backward), 0.0)
    largest = jnp.max(jnp.abs(jnp.where(positive, z, 0.0))) + jnp.abs(log_keep - log_c)
    lower = jnp.concatenate([jnp.ones((1,)), jnp.asarray(_ORDERS)])
    rho = jnp.maximum(jnp.max(divergence / lower[:-1]), largest / _ORDERS[-1])
    return rho, jnp.where(inf_mass > 0.5, 1.0, delta)


def zcdp_cost(query: PLD, name: str):
    """(rho_n, delta_n) of a pessimistic PLD query: the worse direction."""
    probs, inf_mass, offset, step = query_directions(query, name)
    rho, delta = jax.vmap(_zcdp_of_direction)(probs, inf_mass, offset, step)
    return pld_cost(jnp.max(rho)), pld_cost(jnp.max(delta))


class ZCDPState(NamedTuple):
    rho_spent: jax.Array
    delta_spent: jax.Array


def _zcdp_core(native: Callable, kind: str, settings, state, query):
    """Thm 1's filter; ``native(query) -> (rho_n, delta_n)`` reads a cost given in numbers."""
    rho_budget, delta_budget = settings
    rho, delta = zcdp_cost(query, kind) if isinstance(query, PLD) else native(query)
    new = ZCDPState(add_up(state.rho_spent, rho), add_up(state.delta_spent, delta))
    accepted = (new.rho_spent <= rho_budget) & (new.delta_spent <= delta_budget)
    return keep_if(accepted, new, state), accepted


def _zcdp_filter(rho_budget, delta_budget, core, guarantee, kind, params,
                 remaining=None) -> Filter:
    """Thm 1's filter with its ``core`` (:func:`_zcdp_core` for a kind);
    ``remaining(state)`` replaces the default reading (rho and delta left)."""

    def init():
        return ZCDPState(np.zeros(()), np.zeros(()))

    def left(state):
        return {"rho": rho_budget - state.rho_spent, "delta": delta_budget - state.delta_spent}

    return make_filter(kind, params, guarantee, init=init, core=core,
                       remaining=left if remaining is None else remaining,
                       settings=(np.float64(rho_budget), np.float64(delta_budget)), cost_pair=True)


def _pair(query):
    """(first, delta_n) of a cost given as a pair (checked by make_filter) or as one number
    (delta_n = 0)."""
    return query if isinstance(query, tuple) else (query, jnp.zeros(()))


def _approx_zcdp_core(settings, state, query):
    return _zcdp_core(_pair, "approx_zcdp", settings, state, query)


@float64
def approx_zcdp_filter(rho: float, delta: float) -> Filter:
    """Whitehouse et al. Thm 1: the interaction is ``delta``-approximate ``rho``-zCDP.

    Query: (rho_n, delta_n), a float rho_n (delta_n = 0), or a pessimistic PLD (converted soundly,
    see the module docstring).

    Args:
      rho: the zCDP budget, a finite number >= 0.
      delta: the budget for the sum of the queries' delta_n, in [0, 1].

    Returns:
      A :class:`Filter`. Its ``spend`` takes a cost (rho_n, delta_n), a number rho_n (delta_n = 0)
      or a pessimistic PLD (each number >= 0; inf is rejected); its ``remaining`` reads
      ``{"rho": ..., "delta": ...}``, the budgets left (NumPy float64); its ``guarantee``
      ``{"rho", "delta"}`` states that the interaction is delta-approximate rho-zCDP.
    """
    check_range("rho", rho, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    return _zcdp_filter(rho, delta, _approx_zcdp_core,
                        {"rho": rho, "delta": delta}, "approx_zcdp",
                        {"rho": float(rho), "delta": float(delta)})


def residue_epsilon_squared(epsilon, delta_prime):
    """y*: the largest sum of epsilon_n^2 with sqrt(2 log(1/delta') y) + y / 2 <= epsilon,
    (sqrt(2L + 2 epsilon) - sqrt(2L))^2 with L = log(1/delta'), written without cancellation."""
    two_log = 2.0 * np.log(1.0 / delta_prime)
    root = (2.0 * epsilon / (np.sqrt(two_log + 2.0 * epsilon) + np.sqrt(two_log))) ** 2
    # below the exact root despite round-off: the formula's roundings moved it up to 3.3 ulps
    # above (20,000 random cases against mpmath); two ulps down were not enough (a cost 6e-19
    # above the exact root was accepted), 16 are
    return root * (1.0 - 2.0**-48)


def _epsilon_squared_half(query):
    """(epsilon_n^2 / 2 rounded up, delta_n) of a cost (epsilon_n, delta_n) or epsilon_n."""
    eps_n, delta_n = _pair(query)
    # half of a square charged at the smallest normal would be subnormal, which XLA flushes
    # to 0 (a budget below it then accepted every tiny query)
    tiny = jnp.finfo(jnp.float64).tiny
    return jnp.where(eps_n > 0, jnp.maximum(square_up(eps_n) / 2, tiny), 0.0), delta_n


def _approx_dp_core(settings, state, query):
    return _zcdp_core(_epsilon_squared_half, "approx_dp", settings, state, query)


@float64
def approx_dp_filter(epsilon: float, delta: float, *, delta_queries: float | None = None) -> Filter:
    """Whitehouse et al. Thm 8: the interaction is (``epsilon``, ``delta``)-DP.

    ``delta`` = delta' + delta'': ``delta_queries`` (delta'', default delta / 2) bounds the sum of
    the queries' delta_n; delta' pays for the concentration bound. Query: (epsilon_n, delta_n), a
    float epsilon_n (delta_n = 0), or a pessimistic PLD (its zCDP cost rho_n counts as
    epsilon_n^2 = 2 rho_n). ``remaining`` reports the sum of epsilon_n^2 still allowed.

    Args:
      epsilon: in nats, finite and > 0.
      delta: in (0, 1).
      delta_queries: delta'', the budget for the sum of the queries' delta_n, in [0, ``delta``);
        None (default) means delta / 2. The rest, delta' = delta - delta_queries, pays for the
        concentration bound.

    Returns:
      A :class:`Filter`. Its ``spend`` takes a cost (epsilon_n, delta_n), a number epsilon_n in nats
      (delta_n = 0) or a pessimistic PLD (each number >= 0; inf is rejected); its ``remaining`` reads
      ``{"epsilon_squared": ..., "delta": ...}``, the sum of epsilon_n^2 still allowed and the
      delta_n budget left (NumPy float64); its ``guarantee`` ``{"epsilon", "delta"}`` states that the
      interaction is (epsilon, delta)-DP.
    """
    check_range("epsilon", epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    delta_queries = delta / 2 if delta_queries is None else delta_queries
    check_range("delta_queries", delta_queries, 0.0, float(delta), high_open=True)
    y_star = float(residue_epsilon_squared(epsilon, delta - delta_queries))

    def remaining(state):
        return {"epsilon_squared": y_star - 2 * state.rho_spent,
                "delta": delta_queries - state.delta_spent}

    return _zcdp_filter(y_star / 2, delta_queries, _approx_dp_core,
                        {"epsilon": epsilon, "delta": delta},
                        "approx_dp", {"epsilon": float(epsilon), "delta": float(delta),
                                      "delta_queries": float(delta_queries)}, remaining)
