"""Mass bookkeeping on a grid PMF: where mass that is surplus, missing or misplaced goes.

The safe side: a pessimistic PLD takes surplus mass from its lowest losses and puts missing mass
in the atom at +inf (each only raises delta(eps) at eps above the affected bins); an optimistic
PLD takes surplus from its highest losses and puts missing mass at its lowest (each only lowers
delta(eps) above the window's bottom).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def take_from_bottom(probs, amount):
    """``probs`` less ``amount`` of mass taken from its lowest bins (never below zero)."""
    below = jnp.cumsum(probs) - probs
    return probs - jnp.clip(amount - below, 0.0, probs)


def take_from_top(probs, amount):
    """``probs`` less ``amount`` of mass taken from its highest bins (never below zero)."""
    return take_from_bottom(probs[::-1], amount)[::-1]


def settle(probs, inf_mass, per_bin, tail_slack, pessimistic):
    """Account for misplaced mass on the safe side and restore total mass 1.

    ``per_bin``: bound on each bin's round-off error; ``tail_slack``: bound on mass folded or
    truncated into the window from outside it. ``pessimistic``: a bool, or a traced one (data, so
    that a kernel compiles once for both estimates: a conditional, of which only one side runs
    where the flag is the same for a whole vmapped batch).
    """
    if isinstance(pessimistic, (bool, np.bool_)):
        return (_settle_pessimistic if pessimistic else _settle_optimistic)(
            probs, inf_mass, per_bin, tail_slack)
    return jax.lax.cond(pessimistic, _settle_pessimistic, _settle_optimistic, probs,
                        jnp.asarray(inf_mass, probs.dtype), per_bin, tail_slack)


def _settle_pessimistic(probs, inf_mass, per_bin, tail_slack):
    probs = probs + per_bin
    inf_mass = jnp.minimum(inf_mass + tail_slack, 1.0)
    excess = jnp.sum(probs) + inf_mass - 1.0
    probs = take_from_bottom(probs, jnp.maximum(excess, 0.0))
    return probs, inf_mass - jnp.minimum(excess, 0.0)


def _settle_optimistic(probs, inf_mass, per_bin, tail_slack):
    probs = take_from_top(jnp.maximum(probs - per_bin, 0.0), tail_slack)
    excess = jnp.sum(probs) + inf_mass - 1.0
    probs = take_from_top(probs, jnp.maximum(excess, 0.0))
    return probs.at[0].add(jnp.maximum(-excess, 0.0)), inf_mass
