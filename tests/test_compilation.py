"""What a fresh process pays before its first answer (issue 17): the import's cost. The cache policy
itself is tested in test_api.py, the compiled-program count in test_dpsgd.py."""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pldjax as pj


def test_import_leaves_scipy_out():
    """``import pldjax`` loads no SciPy (0.1-0.4 s of every fresh process): the few host-side
    users (Mixture.binomial, gdp_tail_epsilon, the optional adapters) import it where they need it."""
    code = "import sys, pldjax; print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only")
def test_compiled_kernels_are_released_before_the_mapping_limit(monkeypatch):
    # every compiled CPU kernel holds memory mappings; a 1,024-configuration sweep reached Linux's
    # limit and died of a segfault inside XLA. Past the threshold JAX's caches are dropped: the
    # mappings go back down, and a sweep that drops them after every chunk gets the same values
    square = jax.jit(lambda x: x * x)
    square(jnp.ones(3))

    def mappings():
        return Path("/proc/self/maps").read_bytes().count(b"\n")

    assert not pj.compilation.release_compiled_kernels(limit=10**9)
    assert square._cache_size() == 1
    before = mappings()
    for size in range(40):  # compiled kernels add mappings ...
        jax.jit(lambda x: jnp.fft.rfft(x) * 2)(jnp.ones(size + 8)).block_until_ready()
    assert mappings() > before
    during = mappings()
    assert pj.compilation.release_compiled_kernels(limit=0)
    assert square._cache_size() == 0 and mappings() < during  # ... which dropping gives back
    sigmas, steps = np.linspace(0.6, 3.0, 40), np.geomspace(100, 3000, 40).round()
    whole = pj.dpsgd_epsilon(sigmas, 0.01, steps, 1e-5)
    monkeypatch.setattr(pj.compilation, "MAPPING_FRACTION", 0.0)  # drop after every chunk
    monkeypatch.setattr(pj.dpsgd._MAPPINGS, "first", 0)
    monkeypatch.setattr(pj.dpsgd._MAPPINGS, "every", 0)
    np.testing.assert_array_equal(pj.dpsgd_epsilon(sigmas, 0.01, steps, 1e-5), whole)


def test_mapping_guard_reads_the_mappings_only_every_so_many_new_kernels(monkeypatch):
    """A read of /proc/self/maps costs milliseconds once a process holds many kernels: the guard
    looks at `first` compiled shapes, then after every `every` more, and again from `first` once
    the caches were dropped (by it or by anyone)."""
    from pldjax import compilation

    class Kernel:
        shapes = 0

        def _cache_size(self):
            return self.shapes

    kernel, reads, answer = Kernel(), [], [False]

    def release():
        reads.append(kernel.shapes)
        if answer[0]:
            kernel.shapes = 0
        return answer[0]

    monkeypatch.setattr(compilation, "release_compiled_kernels", release)
    guard = compilation.MappingGuard([kernel], first=4, every=3)
    for shapes in range(12):
        kernel.shapes = shapes
        guard.check()
    assert reads == [4, 7, 10]
    answer[0] = True
    kernel.shapes = 13
    assert guard.check() and kernel.shapes == 0
    for shapes in (1, 3):
        kernel.shapes = shapes
        assert not guard.check()
    kernel.shapes = 4
    assert guard.check()
    assert reads == [4, 7, 10, 13, 4]
