"""The filter interface and what every filter shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.gaussian_dp import stack_directions
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.validate import is_traced


class Filter(NamedTuple):
    """One privacy filter: ``init() -> state``, ``spend(state, query) -> (state, accepted)``,
    ``remaining(state)``, plus what the interaction satisfies (``guarantee``) and the parameters
    that identify it (``kind``, ``params``: used to check saved states)."""

    init: Callable[[], Any]
    spend: Callable[[Any, Any], tuple[Any, jax.Array]]
    remaining: Callable[[Any], Any]
    guarantee: dict
    kind: str
    params: dict


def keep_if(accepted, new, old):
    """``new`` where accepted, else ``old`` (leaf by leaf): a rejected query changes nothing."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(accepted, a, b), new, old)


def query_directions(query: PLD, filter_name: str):
    """A single (unbatched: vmap batches it) pessimistic query as stacked directions."""
    if not isinstance(query, PLD):
        raise TypeError(f"{filter_name}: the query must be a PLD or a cost, got {type(query)}")
    if not query.pessimistic:
        raise ValueError(
            f"{filter_name}: the query PLD must be pessimistic (an upper bound) for a sound answer")
    if query.batch_shape:
        raise ValueError(
            f"{filter_name}: spend takes one query; vmap spend over a batch of queries")
    return stack_directions(query)


def check_native(filter_name: str, query) -> None:
    """A cost given in numbers (a float, an array or a tuple of them) must be >= 0 and not NaN
    (inf is allowed: such a query is rejected). Checked on the host; skipped under jit."""
    if isinstance(query, PLD) or is_traced(query):
        return
    for leaf in jax.tree_util.tree_leaves(query):
        arr = np.asarray(leaf, np.float64)
        if np.any(np.isnan(arr)) or np.any(arr < 0):
            raise ValueError(f"{filter_name}: a query cost must be a number >= 0, got {query!r}")


def as_cost(value) -> jax.Array:
    return jnp.asarray(value, jnp.float64)


def jitted_spend(kind: str, core, prepare=None, static: tuple[str, ...] = ()):
    """``spend`` from a pure ``core(state, query, **static)``: the query is checked on the host
    (``prepare(query) -> (query, static values)`` may also adapt it there), then the core runs
    compiled once per query structure. Under a caller's jit or vmap it is simply traced."""
    compiled = jax.jit(core, static_argnames=static)

    @float64
    def spend(state, query):
        check_native(kind, query)
        options = {}
        if prepare is not None:
            query, options = prepare(state, query)
        return compiled(state, query, **options)

    return spend
