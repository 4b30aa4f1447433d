"""Neighbouring relations (pldjax.neighboring)."""

import pytest

from pldjax.neighboring import Neighboring


def test_members_are_their_strings():
    assert Neighboring.ADD_REMOVE == "add_remove" and Neighboring.REPLACE_ONE == "replace_one"
    assert Neighboring.parse("replace_one") is Neighboring.REPLACE_ONE
    assert Neighboring.parse(Neighboring.ADD_REMOVE) is Neighboring.ADD_REMOVE


@pytest.mark.parametrize("bad", ["swap", "ADD_REMOVE", None, 1, ["add_remove"]])
def test_anything_else_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match=r"neighboring must be one of \('add_remove', 'replace_one'\)"):
        Neighboring.parse(bad)
    with pytest.raises(ValueError, match="adjacency"):
        Neighboring.parse(bad, "adjacency")
