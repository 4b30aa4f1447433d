"""Every Python block of the README and of the documentation runs, and prints what the page says.

A page's ```python blocks run in order in one namespace, as a reader pasting them would run them;
a ```text block right after a Python block is the output that block must print. Marked ``docs``:
they run as their own command (``pytest -m docs``), after the Opacus extra is installed, since a
block that imports a package that is not installed is skipped."""

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                     if "_build" not in p.parts)]
#: A fenced block: its language, its text.
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
#: Optional packages a block may import (skipped where they are not installed).
OPTIONAL = ("opacus", "torch", "jax_privacy", "dp_accounting", "matplotlib")


def python_blocks(text: str) -> list[tuple[str, str | None]]:
    """(code, the output it must print, or None) for each Python block of a Markdown page."""
    blocks = list(BLOCK.finditer(text))
    out = []
    for i, block in enumerate(blocks):
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        if block.group(1) != "python":
            continue
        follows = (after is not None and after.group(1) == "text"
                   and not text[block.end():after.start()].strip())
        out.append((block.group(2), after.group(2) if follows else None))
    return out


def missing_packages(code: str) -> list[str]:
    imported = set(re.findall(r"^\s*(?:import|from)\s+(\w+)", code, re.M))
    if "pj.opacus" in code:
        imported.add("opacus")
    return [name for name in OPTIONAL
            if name in imported and importlib.util.find_spec(name) is None]


def test_blocks_are_found_with_their_outputs():
    page = ("```python\nprint(1)\n```\n\n```text\n1\n```\n\n```python\nx = 2\n```\n\n"
            "```bash\nls\n```\n")
    assert python_blocks(page) == [("print(1)\n", "1\n"), ("x = 2\n", None)]


@pytest.mark.docs
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_python_block_runs_and_prints_what_the_page_shows(page, tmp_path, monkeypatch):
    blocks = python_blocks(page.read_text())
    if not blocks:
        pytest.skip("no Python blocks")
    monkeypatch.chdir(tmp_path)  # files a block writes (saved states) stay out of the checkout
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__docs__"}
    for number, (code, expected) in enumerate(blocks, start=1):
        missing = missing_packages(code)
        if missing:
            pytest.skip(f"block {number} needs {', '.join(missing)}")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{page.name}, Python block {number}", "exec"), namespace)
        if expected is not None:
            assert printed.getvalue() == expected, f"block {number} of {page.name}"
