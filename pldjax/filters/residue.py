"""Residue filters (residue-filters.txt §4): pure DP, GDP, the GDP residue filter, and Rényi.

Each keeps a remaining budget and accepts a query L only if the updated budget U(B, L) satisfies
the residue condition U(B, L) (+) L <= B (Thm 1), which makes the whole interaction dominated by
the initial budget.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.filters.base import Filter, keep_if, make_filter, pld_cost, query_directions
from pldjax.gaussian_dp import MAX_RESIDUE_SIZE, RESIDUE_STEPS, gdp_mu_kernel, residue_kernel, residue_plan
from pldjax.order import ROUNDOFF, renyi_kernel
from pldjax.pld import PLD
from pldjax.precision import add_up, float64, root_of_difference_down
from pldjax.validate import check_count, check_range, is_traced


def _max_loss(probs, offset, step):
    """Largest finite grid loss carrying mass, per direction (>= 0; a pessimistic grid PLD's losses
    are rounded up, so this bounds the true largest loss)."""
    z = (offset[:, None] + jnp.arange(probs.shape[-1])) * step[:, None]
    return jnp.maximum(jnp.max(jnp.where(probs > 0, z, -jnp.inf), axis=-1), 0.0)


# -- pure DP --------------------------------------------------------------------------------------
class PureDPState(NamedTuple):
    epsilon_spent: jax.Array
    delta_spent: jax.Array


@float64
def pure_dp_filter(epsilon: float, *, delta: float = 0.0) -> Filter:
    """The pure-DP filter (Rogers et al.; residue-filters.txt Remark 3): accept while the sum of
    the queries' epsilons stays <= ``epsilon``. The interaction is (epsilon, delta)-DP.

    Query: a float epsilon_0 (an epsilon_0-DP query), or a PLD whose cost is its largest finite
    loss over both directions (exact for the grid PLD) and whose atom at +inf is charged to the
    ``delta`` budget (default 0: such queries are rejected). Sums are rounded up, so the count of
    accepted queries is floor(epsilon / epsilon_0) in exact arithmetic on the given floats.
    """
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)

    def init():
        return PureDPState(jnp.zeros(()), jnp.zeros(()))

    def core(state, query):
        if isinstance(query, PLD):
            probs, inf_mass, offset, step = query_directions(query, "pure_dp")
            cost = pld_cost(jnp.max(_max_loss(probs, offset, step)))
            cost_delta = pld_cost(jnp.max(inf_mass))
        else:
            cost, cost_delta = query, jnp.zeros(())
        new = PureDPState(add_up(state.epsilon_spent, cost), add_up(state.delta_spent, cost_delta))
        accepted = (new.epsilon_spent <= epsilon) & (new.delta_spent <= delta)
        return keep_if(accepted, new, state), accepted

    def remaining(state):
        return {"epsilon": epsilon - state.epsilon_spent, "delta": delta - state.delta_spent}

    return make_filter("pure_dp", {"epsilon": float(epsilon), "delta": float(delta)},
                       {"epsilon": epsilon, "delta": delta}, init=init, core=core,
                       remaining=remaining)


# -- GDP ------------------------------------------------------------------------------------------
class GDPState(NamedTuple):
    mu_squared_spent: jax.Array
    delta_spent: jax.Array


def _nu(query: PLD, mu_max: float):
    """(nu, delta charged): the smallest nu with the query below G_nu, with the query's own slack."""
    probs, inf_mass, offset, step = query_directions(query, "gdp")
    slack = jnp.max(inf_mass)
    nus = jax.vmap(gdp_mu_kernel, in_axes=(0, 0, 0, 0, None, None))(
        probs, inf_mass, offset, step, slack, mu_max)
    return pld_cost(jnp.max(nus)), pld_cost(slack) + ROUNDOFF


@float64
def gdp_filter(mu: float, *, delta: float = 1e-10) -> Filter:
    """The GDP filter (Koskela et al.; residue-filters.txt Remark 2): a query L costs nu^2, nu the
    smallest with L below G_nu; accept while the sum of nu^2 stays <= mu^2.

    Query: a float nu (a nu-GDP query, charged exactly) or a PLD (nu by :func:`pldjax.gdp_mu`,
    an upper bound; its atom at +inf plus ROUNDOFF charged to ``delta``). The interaction has
    delta(eps) <= delta_{G_mu}(eps) + delta at every eps.
    """
    check_range("mu", mu, 0.0)
    check_range("delta", delta, 0.0, 1.0)

    def init():
        return GDPState(jnp.zeros(()), jnp.zeros(()))

    def core(state, query):
        if isinstance(query, PLD):
            nu, cost_delta = _nu(query, max(float(mu), 1e-300))
        else:
            nu, cost_delta = query, jnp.zeros(())
        new = GDPState(add_up(state.mu_squared_spent, nu * nu),
                       add_up(state.delta_spent, cost_delta))
        accepted = (new.mu_squared_spent <= mu * mu) & (new.delta_spent <= delta)
        return keep_if(accepted, new, state), accepted

    def remaining(state):
        return {"mu": jnp.sqrt(jnp.maximum(mu * mu - state.mu_squared_spent, 0.0)),
                "delta": delta - state.delta_spent}

    return make_filter("gdp", {"mu": float(mu), "delta": float(delta)},
                       {"mu": mu, "delta": delta}, init=init, core=core, remaining=remaining)


# -- GDP residue ----------------------------------------------------------------------------------
class ResidueState(NamedTuple):
    mu: jax.Array
    delta_left: jax.Array


@float64
def gdp_residue_filter(mu: float, *, delta: float = 1e-10, steps: int = RESIDUE_STEPS,
                size: int | None = None) -> Filter:
    """The GDP residue filter (residue-filters.txt Thm 5): the budget G_mu becomes G_mu' with mu'
    the largest value (by ``steps`` bisection steps, rounded down) such that G_mu' (+) L is below
    G_mu. Never worse than the GDP filter: it starts from the naive sqrt(mu^2 - nu^2).

    Query: a float nu (a nu-GDP query: mu' = sqrt(mu^2 - nu^2), rounded down) or a pessimistic PLD (its
    atom at +inf plus ROUNDOFF charged to ``delta``). The interaction has
    delta(eps) <= delta_{G_mu}(eps) + delta at every eps. ``size``: points of the check window on
    the query's grid; by default chosen on the host (coarsening too-fine query grids
    pessimistically), and MAX_RESIDUE_SIZE under jit.
    """
    check_range("mu", mu, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    steps = check_count("steps", steps, minimum=1)

    def init():
        return ResidueState(jnp.asarray(mu, jnp.float64), jnp.asarray(delta, jnp.float64))

    def prepare(state, query):
        if not isinstance(query, PLD):
            return query, {"window": 0, "factor": 1}
        if is_traced((query, state)):
            return query, {"window": MAX_RESIDUE_SIZE if size is None else size, "factor": 1}
        factor, window = residue_plan(mu, query, size)
        return query, {"window": window, "factor": factor}

    def core(state, query, window, factor):
        if isinstance(query, PLD):
            probs, inf_mass, offset, step = query_directions(query, "gdp_residue")
            slack = jnp.max(inf_mass)
            cost_delta = slack + ROUNDOFF
            left, fits = residue_kernel(probs, inf_mass, offset, step, state.mu, slack,
                                        size=window, steps=steps, factor=factor)
        else:
            nu = query
            fits = nu <= state.mu
            left = root_of_difference_down(state.mu, nu)
            cost_delta = jnp.zeros(())
        accepted = fits & (cost_delta <= state.delta_left)
        new = ResidueState(left, -add_up(-state.delta_left, cost_delta))  # rounded down
        return keep_if(accepted, new, state), accepted

    def remaining(state):
        return {"mu": state.mu, "delta": state.delta_left}

    return make_filter("gdp_residue",
                       {"mu": float(mu), "delta": float(delta), "steps": steps, "size": size},
                       {"mu": mu, "delta": delta}, init=init, core=core, remaining=remaining,
                       prepare=prepare, static=("window", "factor"))


# -- Rényi ----------------------------------------------------------------------------------------
class RenyiState(NamedTuple):
    spent: jax.Array


@float64
def renyi_filter(orders, budget) -> Filter:
    """The Rényi filter (Feldman and Zrnic; residue-filters.txt Remark 4), for a vector of orders
    at once: accept while, at EVERY order a, the sum of the queries' D_a stays <= ``budget[a]``.
    The interaction is then (a, budget[a])-RDP at each order (the conjunction of one filter per
    order, each sound by itself; "accept while some order has room" is not offered).

    Query: an array of Rényi divergences (one per order) or a pessimistic PLD (its divergences,
    the worse direction: an upper bound; an atom at +inf makes them infinite, i.e. rejected).
    """
    orders = np.atleast_1d(np.asarray(orders, np.float64))
    check_range("orders", orders, 1.0, low_open=True)
    budget = np.asarray(budget, np.float64)
    if budget.ndim > 1 or budget.size not in (1, orders.size):
        raise ValueError(f"budget must be one number or one per order ({orders.size} "
                         f"numbers), got shape {budget.shape}")
    budget = np.broadcast_to(budget, orders.shape).copy()
    check_range("budget", budget, 0.0)

    def init():
        return RenyiState(jnp.zeros(orders.shape))

    def core(state, query):
        if isinstance(query, PLD):
            probs, inf_mass, offset, step = query_directions(query, "renyi")
            costs = jax.vmap(renyi_kernel, in_axes=(0, 0, 0, 0, None))(
                probs, inf_mass, offset, step, jnp.asarray(orders))
            cost = pld_cost(jnp.max(costs, axis=0))
        else:
            cost = jnp.broadcast_to(query, orders.shape)
        new = RenyiState(add_up(state.spent, cost))
        accepted = jnp.all(new.spent <= budget)
        return keep_if(accepted, new, state), accepted

    def remaining(state):
        return {"orders": orders, "budget": budget - state.spent}

    return make_filter("renyi", {"orders": orders.tolist(), "budget": budget.tolist()},
                       {"orders": orders, "rdp": budget}, init=init, core=core,
                       remaining=remaining, cost_shape=orders.shape)
