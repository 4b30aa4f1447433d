"""Sphinx configuration of pldjax's documentation (MyST Markdown pages, the notebooks, and an API
reference from the docstrings). Build: ``sphinx-build -W -b html docs docs/_build/html``."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "pldjax"
author = "The pldjax authors"
copyright = "2026, The pldjax authors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]

# the notebooks are rendered with the outputs they were saved with: the test suite runs them
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

exclude_patterns = ["_build"]
html_theme = "sphinx_book_theme"
html_title = "pldjax"
html_theme_options = {"show_toc_level": 2}
autodoc_mock_imports = ["torch", "opacus"]
