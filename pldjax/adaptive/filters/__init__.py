"""Privacy filters: adaptive sequences of queries under a fixed budget, with exact accounting.

Every filter is a :class:`Filter`, a named tuple of pure functions in the style of optax::

    f = pj.filters.gdp_residue_filter(mu=1.0)
    state = f.init()                          # a pytree (a NamedTuple of arrays)
    state, accepted = f.spend(state, query)   # pure: jit-able, vmappable over states and queries
    f.remaining(state)                        # what is left, in the filter's own terms
    f.guarantee                               # what the whole interaction satisfies

A query is a pessimistic PLD (its curve is above the true one), or the filter's own cost in its
own units (documented per filter: e.g. an epsilon for ``pure_dp_filter``, a GDP mu for
``gdp_filter``). A
rejected query leaves the state unchanged (``spend`` returns the old state and False); a failing
``spend`` (bad input) raises before anything is returned, and the caller's state is never
modified (states are immutable values).

**Filters continue after a rejection.** The papers' algorithms stop at the first rejected query;
here a later, smaller query may still be accepted. This is sound because every decision is a
function of the queries' PLDs and of the state alone, never of the data: an analyst who sees a
rejection learns nothing it could not have computed itself, so the continuing filter is a
post-processing of the stopping filter run by an analyst who never submits a query it knows would
be rejected (it submits nothing instead, which leaves the state as it was).

Degenerate queries (NaN, negative or missing mass, a bad step, a NaN or negative cost) are never
accepted, and states keep their 64-bit values as exact bit pairs whatever the caller's
``jax_enable_x64`` (see :mod:`pldjax.adaptive.filters.base`); read them with ``remaining``.

Slack. Pessimistic PLDs of unbounded mechanisms keep a tiny atom at +inf, and comparisons of
curves computed in floating point hold up to :data:`pldjax.kernels.dominance.ROUNDOFF` (1e-14). Filters that
compare curves therefore keep a separate ``delta`` budget (the "catastrophic" delta): each
accepted PLD query is charged its atom at +inf plus ROUNDOFF, and the guarantee holds with that
delta added (for a composition, slacks add up: delta_{A (+) C} <= delta_{B (+) D} + a + c when
delta_A <= delta_B + a and delta_C <= delta_D + c, everywhere).
"""

from pldjax.adaptive.filters.base import Filter
from pldjax.adaptive.filters.natural import additive_profile_filter, natural_filter
from pldjax.adaptive.filters.residue import gdp_filter, gdp_residue_filter, pure_dp_filter, renyi_filter
from pldjax.adaptive.filters.whitehouse import approx_dp_filter, approx_zcdp_filter
from pldjax.core.namespace import public_dir

__all__ = [
    "Filter",
    "additive_profile_filter",
    "approx_dp_filter",
    "approx_zcdp_filter",
    "gdp_filter",
    "gdp_residue_filter",
    "natural_filter",
    "pure_dp_filter",
    "renyi_filter",
]
__dir__ = public_dir(__all__)
