"""Layer 2, the kernels: pure, jit-compiled, vmappable functions of PLD arrays.

``discretize`` turns a mechanism's loss tails into a PLD (connect-the-dots), ``compose``
convolves PLDs by FFT, ``hockey_stick`` evaluates delta(epsilon) and epsilon(delta),
``divergences`` gives tradeoff curves, Rényi divergences and moment generating functions,
``dominance`` the Blackwell order and suprema of families, ``gaussian_dp`` the GDP mu and the
GDP residue, ``chernoff`` bounds a composition from its parts' moment generating functions, and
``envelope`` builds the tightest pessimistic PLD below several upper bounds on one curve.
Kernels use only :mod:`pldjax.core`.
"""
