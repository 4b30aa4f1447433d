"""Neighbouring relations: which pairs of datasets a guarantee compares.

A :class:`Neighboring` member is a string (``Neighboring.ADD_REMOVE == "add_remove"``), so the
public API takes either; :meth:`Neighboring.parse` turns the string a caller passed into a member
or raises a ValueError naming the argument.
"""

from __future__ import annotations

import enum

from pldjax.core.namespace import public_dir


class Neighboring(enum.StrEnum):
    """ADD_REMOVE: one record added or removed (the dataset size changes). REPLACE_ONE: one
    record's contribution replaced by another, both of norm at most the sensitivity, so the
    query's output moves by up to twice the sensitivity (as in dp-accounting). REPLACE_SPECIAL
    (zero-out, dp-accounting's name): one record replaced by a special record that contributes
    nothing; the dataset size stays, the output moves by up to one sensitivity. For noise added to
    a query, with or without Poisson sampling, its pair is add/remove's (the record's contribution
    against none, both directions), as in dp-accounting; it differs where the size matters
    (truncated Poisson sampling, :class:`pldjax.mechanisms.sampling.TruncatedPoisson`)."""

    ADD_REMOVE = "add_remove"
    REPLACE_ONE = "replace_one"
    REPLACE_SPECIAL = "replace_special"

    @classmethod
    def parse(cls, value: Neighboring | str, name: str = "neighboring") -> Neighboring:
        """The member for ``value`` (a member or its string), else a ValueError naming ``name``."""
        try:
            return cls(value)
        except ValueError:
            allowed = tuple(member.value for member in cls)
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}") from None


__all__ = ["Neighboring"]
__dir__ = public_dir(__all__)
