"""Layer 5, adaptive composition: privacy filters, odometers and the natural filter's cost.

``filters`` builds every filter on one interface (pure functions in a NamedTuple and a pytree
state), ``odometers`` tracks the privacy spent so far, and ``natural_cost`` computes the
worst-case cost of a natural filter for a query family and budget (the V_k recursion).
A new filter is one module in ``filters`` built with
:func:`~pldjax.adaptive.filters.base.make_filter`.
"""
