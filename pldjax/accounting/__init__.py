"""Layer 4, accounting: epsilon and delta of compositions of any event.

``engine`` accounts for many configurations of an event in batched, fixed-shape calls,
``planner`` chooses their grids (and the steps of ``rtol``), ``dpsgd`` holds the DP-SGD
wrappers, ``schedule`` composes runs whose mechanism changes, ``calibration`` searches a
one-parameter family for a target, ``accountant`` is a ledger of events that lives inside
a jitted training step, and ``report`` brackets what a privacy review reads (epsilon, delta,
the attacker's TPR, Gaussian and Rényi DP). Accounting takes events from
:mod:`pldjax.mechanisms`, never a hard-coded mechanism.
"""
