"""What a fresh process pays before its first answer (issue 17): the import's cost. The cache policy
itself is tested in test_api.py, the compiled-program count in test_dpsgd.py."""

import subprocess
import sys


def test_import_leaves_scipy_out():
    """``import pldjax`` loads no SciPy (0.1-0.4 s of every fresh process): the few host-side
    users (Mixture.binomial, gdp_tail_epsilon, the optional adapters) import it where they need it."""
    code = "import sys, pldjax; print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
