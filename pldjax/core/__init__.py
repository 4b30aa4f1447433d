"""Layer 1, the core: the PLD type and the numbers every layer above relies on.

Nothing here knows about mechanisms or accounting. ``validation`` checks arguments,
``precision`` keeps results in float64 whatever the caller's ``jax_enable_x64`` setting,
``grid`` chooses steps and window sizes, ``pld`` is the :class:`~pldjax.core.pld.PLD` pytree and
its directions, ``mass`` says where surplus or missing mass goes, ``align`` moves PLDs onto one
step on the safe side, ``special`` holds special functions, ``compilation`` the jit wrappers and
the persistent compilation cache, and ``serialization`` saves and restores states exactly.
"""
