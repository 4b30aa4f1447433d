"""Residue filters (Regehr et al. 2026, §4): pure DP, GDP, the GDP residue filter, and Rényi.

Each keeps a remaining budget and accepts a query L only if the updated budget U(B, L) satisfies
the residue condition U(B, L) (+) L <= B (Thm 1), which makes the whole interaction dominated by
the initial budget.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.adaptive.filters.base import Filter, keep_if, make_filter, pld_cost, query_directions
from pldjax.core.compilation import array_module, map_rows, to_device
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD
from pldjax.core.precision import add_up, float64, root_of_difference_down, square_down, square_up
from pldjax.core.validation import check_count, check_range, is_traced
from pldjax.kernels.divergences import renyi_kernel
from pldjax.kernels.dominance import ROUNDOFF
from pldjax.kernels.gaussian_dp import (
    MAX_MU,
    MAX_RESIDUE_SIZE,
    RESIDUE_STEPS,
    gdp_mu,
    gdp_mu_kernel,
    gdp_residue,
    residue_kernel,
    residue_plan,
)
from pldjax.mechanisms.named import gaussian


def _max_loss(probs, offset, step):
    """Largest finite grid loss carrying mass, per direction (>= 0; a pessimistic grid PLD's losses
    are rounded up, so this bounds the true largest loss)."""
    xp = array_module(probs)
    z = (offset[:, None] + xp.arange(probs.shape[-1])) * step[:, None]
    return xp.maximum(xp.max(xp.where(probs > 0, z, -np.inf), axis=-1), 0.0)


# -- pure DP --------------------------------------------------------------------------------------
class PureDPState(NamedTuple):
    epsilon_spent: jax.Array
    delta_spent: jax.Array


def _pure_dp_core(settings, state, query):
    epsilon, delta = settings
    if isinstance(query, PLD):
        probs, inf_mass, offset, step = query_directions(query, "pure_dp")
        cost = pld_cost(_max_loss(probs, offset, step).max())
        cost_delta = pld_cost(inf_mass.max())
    else:
        cost, cost_delta = query, array_module(query).zeros(())
    new = PureDPState(add_up(state.epsilon_spent, cost), add_up(state.delta_spent, cost_delta))
    accepted = (new.epsilon_spent <= epsilon) & (new.delta_spent <= delta)
    return keep_if(accepted, new, state), accepted


@float64
def pure_dp_filter(epsilon: float, *, delta: float = 0.0) -> Filter:
    """The pure-DP filter (Rogers et al.; Regehr et al. 2026, Remark 3): accept while the sum of
    the queries' epsilons stays <= ``epsilon``. The interaction is (epsilon, delta)-DP.

    Query: a float epsilon_0 (an epsilon_0-DP query), or a PLD whose cost is its largest finite
    loss over both directions (exact for the grid PLD) and whose atom at +inf is charged to the
    ``delta`` budget (default 0: such queries are rejected). Sums are rounded up, so the count of
    accepted queries is floor(epsilon / epsilon_0) in exact arithmetic on the given floats.

    Args:
      epsilon: the budget, in nats: a finite number >= 0.
      delta: the budget that pays for the PLD queries' atoms at +inf, in [0, 1]; with the default 0
        a PLD query with an atom at +inf is rejected. A query given as a number charges nothing to it.

    Returns:
      A :class:`Filter`. Its ``spend`` takes a query epsilon_0 (a number >= 0 in nats; inf is
      rejected) or a pessimistic PLD, charged as above; its ``remaining`` reads
      ``{"epsilon": ..., "delta": ...}``, the budgets left (NumPy float64); its ``guarantee``
      ``{"epsilon", "delta"}`` states that the whole interaction is (epsilon, delta)-DP.
    """
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)

    def init():
        return PureDPState(np.zeros(()), np.zeros(()))

    def remaining(state):
        return {"epsilon": epsilon - state.epsilon_spent, "delta": delta - state.delta_spent}

    return make_filter("pure_dp", {"epsilon": float(epsilon), "delta": float(delta)},
                       {"epsilon": epsilon, "delta": delta}, init=init, core=_pure_dp_core,
                       remaining=remaining, settings=(np.float64(epsilon), np.float64(delta)),
                       host=True)


# -- GDP ------------------------------------------------------------------------------------------
class GDPState(NamedTuple):
    mu_squared_spent: jax.Array
    delta_spent: jax.Array


def _nu(query: PLD, mu_max: float):
    """(nu, delta charged): the smallest nu with the query below G_nu, with the query's own slack."""
    probs, inf_mass, offset, step = query_directions(query, "gdp")
    slack = inf_mass.max()
    nus = map_rows(lambda p, m, o, h: gdp_mu_kernel(p, m, o, h, slack, mu_max))(
        probs, inf_mass, offset, step)
    return pld_cost(nus.max()), pld_cost(slack) + ROUNDOFF


def _gdp_core(settings, state, query):
    budget, delta, mu_max = settings
    if isinstance(query, PLD):
        nu, cost_delta = _nu(query, mu_max)
    else:
        nu, cost_delta = query, array_module(query).zeros(())
    new = GDPState(add_up(state.mu_squared_spent, square_up(nu)),
                   add_up(state.delta_spent, cost_delta))
    accepted = (new.mu_squared_spent <= budget) & (new.delta_spent <= delta)
    return keep_if(accepted, new, state), accepted


@float64
def gdp_filter(mu: float, *, delta: float = 1e-10) -> Filter:
    """The GDP filter (Koskela et al.; Regehr et al. 2026, Remark 2): a query L costs nu^2, nu the
    smallest with L below G_nu; accept while the sum of nu^2 stays <= mu^2.

    Query: a float nu (a nu-GDP query, nu^2 charged rounded up) or a PLD (nu by
    :func:`pldjax.gdp_mu`, an upper bound; its atom at +inf plus ROUNDOFF charged to ``delta``).
    The interaction has delta(eps) <= delta_{G_mu}(eps) + delta at every eps.

    Args:
      mu: the GDP budget, a finite number in [0, 1e100].
      delta: the slack budget, in [0, 1]: each accepted PLD query charges it its atom at +inf plus
        ROUNDOFF (1e-14), a query given as a number charges nothing. The default 1e-10 pays for about
        10,000 PLD queries without an atom at +inf.

    Returns:
      A :class:`Filter`. Its ``spend`` takes a cost nu (a number >= 0; inf is rejected) or a
      pessimistic PLD; its ``remaining`` reads ``{"mu": ..., "delta": ...}``, the GDP budget left
      (sqrt(mu^2 - sum of the accepted nu^2)) and the slack left, as NumPy float64; its ``guarantee``
      ``{"mu", "delta"}`` states that the interaction has delta(eps) <= delta_{G_mu}(eps) + delta at
      every eps.
    """
    check_range("mu", mu, 0.0, MAX_MU)
    check_range("delta", delta, 0.0, 1.0)
    budget = square_down(mu)  # the spent nu^2 are summed rounded up

    def init():
        return GDPState(np.zeros(()), np.zeros(()))

    def remaining(state):
        xp = jnp if is_traced(state) else np  # a concrete state is read on the host
        return {"mu": xp.sqrt(xp.maximum(budget - state.mu_squared_spent, 0.0)),
                "delta": delta - state.delta_spent}

    return make_filter("gdp", {"mu": float(mu), "delta": float(delta)},
                       {"mu": mu, "delta": delta}, init=init, core=_gdp_core, remaining=remaining,
                       settings=(np.float64(budget), np.float64(delta),
                                 np.float64(max(float(mu), 1e-300))), host=True)


# -- GDP residue ----------------------------------------------------------------------------------
class ResidueState(NamedTuple):
    mu: jax.Array
    delta_left: jax.Array


def _gdp_residue_core(settings, state, query, window, factor, steps):
    if isinstance(query, PLD):
        probs, inf_mass, offset, step = query_directions(query, "gdp_residue")
        slack = inf_mass.max()
        cost_delta = slack + ROUNDOFF
        left, fits = residue_kernel(probs, inf_mass, offset, step, state.mu, slack,
                                    size=window, steps=steps, factor=factor)
    else:
        nu = query
        fits = nu <= state.mu
        left = root_of_difference_down(state.mu, nu)
        cost_delta = array_module(nu).zeros(())
    accepted = fits & (cost_delta <= state.delta_left)
    new = ResidueState(left, -add_up(-state.delta_left, cost_delta))  # rounded down
    return keep_if(accepted, new, state), accepted


@float64
def gdp_residue_filter(mu: float, *, delta: float = 1e-10, steps: int = RESIDUE_STEPS,
                size: int | None = None) -> Filter:
    """The GDP residue filter (Regehr et al. 2026, Thm 5): the budget G_mu becomes G_mu' with mu'
    the largest value (a search of at most 1 + ``steps`` tests, rounded down) such that G_mu' (+) L is below
    G_mu. Never worse than the GDP filter: it starts from the naive sqrt(mu^2 - nu^2).

    Query: a float nu (a nu-GDP query: mu' = sqrt(mu^2 - nu^2), rounded down) or a pessimistic PLD (its
    atom at +inf plus ROUNDOFF charged to ``delta``). The interaction has
    delta(eps) <= delta_{G_mu}(eps) + delta at every eps. ``size``: points of the check window on
    the query's grid; by default chosen on the host (coarsening too-fine query grids
    pessimistically), and MAX_RESIDUE_SIZE under jit.

    Args:
      mu: the initial GDP budget, a finite number in [0, 1e100].
      delta: the slack budget, in [0, 1]; default 1e-10. Each accepted PLD query charges it its atom
        at +inf plus ROUNDOFF (1e-14); a query given as a number charges nothing.
      steps: an integer >= 1 (default RESIDUE_STEPS, 16): the residue search of a PLD query makes at
        most 1 + ``steps`` tests.
      size: None (default: chosen as said above), or the number of points of the check window, an
        integer in [16, 2**25], checked when a PLD query is spent on concrete values.

    Returns:
      A :class:`Filter`. Its ``spend`` takes a cost nu (a number >= 0; inf is rejected) or a
      pessimistic PLD; its ``remaining`` reads ``{"mu": ..., "delta": ...}``, the remaining budget mu'
      and the slack left (NumPy float64); its ``guarantee`` ``{"mu", "delta"}`` states that the
      interaction has delta(eps) <= delta_{G_mu}(eps) + delta at every eps.
    """
    check_range("mu", mu, 0.0, MAX_MU)
    check_range("delta", delta, 0.0, 1.0)
    steps = check_count("steps", steps, minimum=1)

    def init():
        return ResidueState(np.asarray(mu, np.float64), np.asarray(delta, np.float64))

    def prepare(state, query):
        if not isinstance(query, PLD):
            return query, {"window": 0, "factor": 1, "steps": steps}
        if is_traced((query, state)):
            return query, {"window": MAX_RESIDUE_SIZE if size is None else size, "factor": 1,
                           "steps": steps}
        factor, window = residue_plan(mu, query, size)
        return query, {"window": window, "factor": factor, "steps": steps}

    def remaining(state):
        return {"mu": state.mu, "delta": state.delta_left}

    return make_filter("gdp_residue",
                       {"mu": float(mu), "delta": float(delta), "steps": steps, "size": size},
                       {"mu": mu, "delta": delta}, init=init, core=_gdp_residue_core,
                       remaining=remaining, prepare=prepare, static=("window", "factor", "steps"),
                       host=True)


# -- Rényi ----------------------------------------------------------------------------------------
class RenyiState(NamedTuple):
    spent: jax.Array


def _renyi_core(settings, state, query):
    orders, budget = settings
    if isinstance(query, PLD):
        probs, inf_mass, offset, step = query_directions(query, "renyi")
        costs = jax.vmap(renyi_kernel, in_axes=(0, 0, 0, 0, None))(
            probs, inf_mass, offset, step, orders)
        cost = pld_cost(jnp.max(costs, axis=0))
    else:
        cost = jnp.broadcast_to(query, orders.shape)
    new = RenyiState(add_up(state.spent, cost))
    accepted = jnp.all(new.spent <= budget)
    return keep_if(accepted, new, state), accepted


@float64
def renyi_filter(orders, budget) -> Filter:
    """The Rényi filter (Feldman and Zrnic; Regehr et al. 2026, Remark 4), for a vector of orders
    at once: accept while, at EVERY order a, the sum of the queries' D_a stays <= ``budget[a]``.
    The interaction is then (a, budget[a])-RDP at each order (the conjunction of one filter per
    order, each sound by itself; "accept while some order has room" is not offered).

    Query: an array of Rényi divergences (one per order) or a pessimistic PLD (its divergences,
    the worse direction: an upper bound; an atom at +inf makes them infinite, i.e. rejected).

    Args:
      orders: the Rényi orders a, one number or a 1-D array, each finite and > 1.
      budget: the RDP budget at each order, in nats: one number (the same at every order) or one per
        order, each finite and >= 0.

    Returns:
      A :class:`Filter`. Its ``spend`` takes a query's Rényi divergences in nats (an array of one per
      order, or one number for all orders, each >= 0; inf is rejected) or a pessimistic PLD; its
      ``remaining`` reads ``{"orders": ..., "budget": ...}``, the orders and the budget left at each
      (NumPy float64 arrays); its ``guarantee`` ``{"orders", "rdp"}`` (``rdp`` the budgets) states
      that the interaction is (a, rdp[a])-RDP at every order a.
    """
    check_range("orders", orders, 1.0, low_open=True)  # (strings and the like refused first)
    if np.ndim(orders) > 1 or np.size(orders) == 0:
        raise ValueError(f"orders must be one number or a 1-D array of at least one order, got "
                         f"shape {np.shape(orders)}")
    orders = np.atleast_1d(np.asarray(orders, np.float64))
    check_range("budget", budget, 0.0)
    budget = np.asarray(budget, np.float64)
    if budget.ndim > 1 or budget.size not in (1, orders.size):
        raise ValueError(f"budget must be one number or one per order ({orders.size} "
                         f"numbers), got shape {budget.shape}")
    budget = np.broadcast_to(budget, orders.shape).copy()
    check_range("budget", budget, 0.0)

    def init():
        return RenyiState(np.zeros(orders.shape))

    def remaining(state):
        return {"orders": orders, "budget": budget - state.spent}

    return make_filter("renyi", {"orders": orders.tolist(), "budget": budget.tolist()},
                       {"orders": orders, "rdp": budget}, init=init, core=_renyi_core,
                       remaining=remaining, settings=(orders, budget), cost_shape=orders.shape)


# -- GDP residue table (per-example accounting at training speed) ---------------------------------
class ResidueTable(NamedTuple):
    """Certified GDP residue costs of one Poisson-subsampled Gaussian step for a grid of budgets
    and sensitivities, built once by :func:`gdp_residue_table` and read by :func:`table_spend`.

    ``cost[j, k]`` is an effective GDP cost nu: for every budget mu >= ``mu_nodes[j]`` and
    sensitivity c <= ``c_nodes[k]`` the update mu' = sqrt(mu^2 - nu^2) (rounded down) satisfies
    G_mu' (+) L_c below G_mu plus ``delta[k]`` (ROUNDOFF included), L_c the step's PLD at
    sensitivity c (noise sigma / c, sampling probability q). The costs hold for that step only:
    ``noise_multiplier`` (sigma) and ``sampling_prob`` (q) record it."""

    mu_nodes: jax.Array  # (M,) increasing, mu_nodes[0] = 0
    c_nodes: jax.Array  # (K,) increasing, from 0 to 1
    cost: jax.Array  # (M, K), non-increasing along mu, non-decreasing along c
    delta: jax.Array  # (K,) delta charged by a step at c_nodes[k]
    noise_multiplier: jax.Array  # () sigma of the step the costs are certified for
    sampling_prob: jax.Array  # () its Poisson sampling probability q


#: The largest budget of a :func:`gdp_residue_table` (its ``mu_max``).
MAX_TABLE_MU = 1e6


@announces_slow_calls("pldjax.filters.residue.gdp_residue_table")
@float64
def gdp_residue_table(noise_multiplier: float, sampling_prob: float, mu_max: float, *,
                      mu_nodes: int = 16, c_nodes: int = 17, mu_min: float | None = None,
                      residue: bool = True, grid=None) -> ResidueTable:
    """The residue costs of the step L_c = ``pj.gaussian(noise_multiplier / c,
    sampling_prob=sampling_prob)`` (add/remove, both directions) on a grid: budgets 0 and
    ``mu_nodes`` - 1 values spaced geometrically from ``mu_min`` (default mu_max / 32) to
    ``mu_max``; sensitivities c = 0, 1/(c_nodes - 1), ..., 1 (in units of the clipping norm).

    Why a lookup that rounds mu down and c up is sound: (1) if G_r (+) L_{c'} is below G_m, so
    is G_r (+) L_c for c <= c' (the subsampled Gaussian is Blackwell-monotone in its
    sensitivity); (2) composing both sides with G_s, s^2 = mu^2 - m^2, keeps the order and
    G_m (+) G_s = G_mu, so G_sqrt(r^2 + s^2) (+) L_c is below G_mu: the cost in mu^2 units,
    m^2 - r^2, certified at a node m <= mu and c' >= c, holds at (mu, c). Equivalently the residue
    is non-decreasing in mu and non-increasing in c. Each entry is the smaller of the GDP residue
    (:func:`pldjax.gdp_residue`) and the naive cost gdp_mu(L_c), and the table is then made
    monotone (a cost certified at a lower mu or a larger c holds here too), so lookups are sound
    whatever the rounding inside the searches. Build cost: mu_nodes x c_nodes residues in one
    batched call, plus c_nodes PLDs and their gdp_mu. ``residue=False``: the naive costs only
    (the GDP filter's), without the residues.
    """
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0, low_open=True)
    check_range("mu_max", mu_max, 0.0, MAX_TABLE_MU, low_open=True)
    mu_nodes = check_count("mu_nodes", mu_nodes, minimum=2)
    c_nodes = check_count("c_nodes", c_nodes, minimum=2)
    mu_min = float(mu_max) / 32 if mu_min is None else mu_min
    check_range("mu_min", mu_min, 0.0, float(mu_max), low_open=True)
    c = np.linspace(0.0, 1.0, c_nodes)
    mus = np.concatenate([[0.0], np.geomspace(mu_min, mu_max, mu_nodes - 1)])
    mus[-1] = mu_max
    steps = gaussian(noise_multiplier / c[1:], sampling_prob=sampling_prob, grid=grid)
    # one slack for all: the largest atom at +inf of any step PLD (each entry certifies with it)
    slack = float(np.max([np.max(np.asarray(d.inf_mass, np.float64)) for d in steps.directions()]))
    naive = np.asarray(gdp_mu(steps, delta_slack=slack, mu_max=float(mu_max)))
    if residue:
        residue = np.asarray(gdp_residue(mus[1:, None], steps, delta_slack=slack))
    else:
        residue = np.full((mu_nodes - 1, c_nodes - 1), -np.inf)
    fits = residue >= 0  # gdp_residue is -inf where the step does not fit the budget
    kept = np.where(fits, residue, 0.0)
    spent = (mus[1:, None] - kept) * (mus[1:, None] + kept)  # m^2 - r^2
    spent = np.nextafter(np.nextafter(np.sqrt(np.nextafter(spent, np.inf)), np.inf), np.inf)
    cost = np.full((mu_nodes, c_nodes), np.inf)
    cost[:, 0] = 0.0  # c = 0: the identity
    cost[0, 1:] = naive
    cost[1:, 1:] = np.where(fits, np.minimum(spent, naive), naive)
    cost = np.minimum.accumulate(cost, axis=0)  # valid for every larger budget
    cost = np.minimum.accumulate(cost[:, ::-1], axis=1)[:, ::-1]  # and every smaller c
    delta = np.concatenate([[0.0], np.full(c_nodes - 1, slack + ROUNDOFF)])
    return ResidueTable(*(to_device(np.asarray(a, np.float64)) for a in (mus, c, cost, delta,
                                                                          noise_multiplier,
                                                                          sampling_prob)))


def table_spend(table: ResidueTable, mu, delta_left, c):
    """One step of sensitivity ``c`` (in [0, 1]; anything else is rejected) charged against
    budgets ``mu`` (with ``delta_left``), by table lookup: (new mu, new delta_left, accepted),
    elementwise; rejected entries keep their budgets. mu is rounded down and c up to table nodes (sound: see
    :func:`gdp_residue_table`); mu' = sqrt(mu^2 - cost^2) is rounded down and delta_left is
    charged ``table.delta`` (rounded down). Pure jnp: vmaps, jits, and runs at >= 1e7 lookups/s
    on a CPU (bench/gdp_residue.py)."""
    if not (jnp.issubdtype(jnp.result_type(c), jnp.floating)
            or jnp.issubdtype(jnp.result_type(c), jnp.integer)):
        c = jnp.full(jnp.shape(c), jnp.nan)  # no real sensitivity (complex): rejected, as NaN is
    # few nodes: comparing with all of them is the fastest search on CPUs and GPUs
    j = jnp.searchsorted(table.mu_nodes, mu, side="right", method="compare_all") - 1  # node <= mu
    k = jnp.searchsorted(table.c_nodes, c, side="left", method="compare_all")  # node >= c
    inside = (j >= 0) & (k < table.c_nodes.shape[0])
    cost = jnp.where(inside, table.cost[jnp.maximum(j, 0), jnp.minimum(k, table.c_nodes.shape[0] - 1)],
                     jnp.inf)
    charge = table.delta[jnp.minimum(k, table.c_nodes.shape[0] - 1)]
    # a negative sensitivity (or NaN) is no sensitivity: rejected, never read as the node c = 0
    accepted = inside & (c >= 0) & (cost <= mu) & (charge <= delta_left)
    spent = accepted & (cost > 0)  # a free step (c = 0) leaves mu exactly as it is
    new_mu = jnp.where(spent, root_of_difference_down(mu, jnp.where(spent, cost, 0.0)), mu)
    new_delta = jnp.where(accepted, -add_up(-delta_left, charge), delta_left)
    return new_mu, new_delta, accepted
