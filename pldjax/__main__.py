"""``python -m pldjax``: the command line of :mod:`pldjax.cli` (as the ``pldjax`` command)."""

import sys

from pldjax.cli import main

if __name__ == "__main__":
    sys.exit(main())
