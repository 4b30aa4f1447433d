"""What a public module shows: its public names only.

``dir(pj.sampling)`` and a notebook's tab completion list every global of a module, the
``np``, ``jnp`` and ``math`` it imports included. A public module ends with
``__dir__ = public_dir(__all__)`` (PEP 562), so that they list what it offers; every name stays
importable as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def public_dir(names: Iterable[str]) -> Callable[[], list[str]]:
    """A module-level ``__dir__`` that lists ``names`` (the module's ``__all__``), sorted."""
    listed = sorted(names)
    return lambda: list(listed)
