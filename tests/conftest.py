import gc
import os
from pathlib import Path

# Every test process (xdist workers, notebook kernels, subprocesses) shares one persistent cache of
# compiled kernels: they compile many of the same kernels, and a CPU compile takes seconds. Set
# before jax is imported so that the processes started from here inherit it.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "xla")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
# the CLI turns on its own persistent cache; tests must not write into the home directory
os.environ.setdefault("PLDJAX_COMPILATION_CACHE", "0")
# first calls compile for seconds: their notices on stderr would reach the tests that read it
# (tests/core/test_notice.py turns them back on)
os.environ.setdefault("PLDJAX_QUIET", "1")
# small accounting calls run in NumPy until a process has done some host work, then compile:
# which of the two a test's call gets would depend on the tests run before it in its process
# (values alike to round-off only), so every call compiles (tests/accounting/test_dpsgd.py turns
# the host work back on); a run with a large PLDJAX_HOST_WORK runs every test's calls on the host
# wherever they may (docs/development.md)
os.environ.setdefault("PLDJAX_HOST_WORK", "0")

import jax  # noqa: E402
import mpmath  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

from pldjax.core.compilation import FAST_COMPILE, above_mapping_limit  # noqa: E402

jax.config.update("jax_enable_x64", True)

# Hypothesis profiles of tests/test_properties.py: "pldjax-fast" in the default run (few examples,
# derandomized so CI is deterministic, not shrunk), "pldjax-slow" with the slow tests (`pytest -m slow`;
# PLDJAX_HYPOTHESIS_EXAMPLES sets its number of examples). No deadline: a first call compiles.
_UNHEALTHY = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]
settings.register_profile("pldjax-fast", max_examples=6, deadline=None, derandomize=True,
                          database=None, suppress_health_check=_UNHEALTHY, print_blob=True,
                          phases=[Phase.explicit, Phase.generate])  # no shrinking: report as found
settings.register_profile("pldjax-slow", deadline=None, database=None, print_blob=True,
                          max_examples=int(os.environ.get("PLDJAX_HYPOTHESIS_EXAMPLES", "25")),
                          suppress_health_check=_UNHEALTHY)


#: The marker expression of the README's test command (pyproject's addopts).
DEFAULT_RUN = "not slow and not notebook and not docs"


def pytest_configure(config):
    # The default run is mostly compilation: its thousands of programs compile about a third
    # faster without LLVM's optimizations (the XLA programs are the same; their machine code is
    # less optimized and may round differently in the last bits, e.g. where -O2 fuses a multiply
    # and an add), each in one piece rather than split for parallel code generation (a quarter
    # fewer memory mappings, so the fixture below drops the caches less often), and all with
    # the options pldjax's own kernels compile with on a CPU (compilation.FAST_COMPILE: the
    # tests' jitted pipelines and eager operations compiled a third faster with them). The
    # slow, notebook and docs runs compile as users do. Set before the first compilation, which
    # reads XLA_FLAGS; a caller's own XLA_FLAGS win.
    if config.getoption("markexpr") == DEFAULT_RUN:
        fast = " ".join(f"--{name}={str(value).lower()}" for name, value in FAST_COMPILE.items())
        os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                           f"--xla_cpu_parallel_codegen_split_count=1 {fast}")


@pytest.fixture
def x64_off():
    """Run a test with the user's jax_enable_x64 switched off."""
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", True)


#: Decimal digits every test's mpmath references start from: a test that sets mpmath.mp.dps
#: (to more, or to fewer for speed) sets it for itself only, whatever ran before it in its process.
MPMATH_DIGITS = 50


@pytest.fixture(autouse=True)
def _mpmath_digits():
    with mpmath.workdps(MPMATH_DIGITS):
        yield


@pytest.fixture(autouse=True)
def _drop_compiled_kernels_before_the_mapping_limit():
    # a worker running half of the default run compiles thousands of programs (pldjax's kernels,
    # the tests' own jitted functions), each holding memory mappings, and reached Linux's limit (a
    # segfault inside XLA; see pldjax.core.compilation.release_compiled_kernels); the test process
    # owns every cache, so it drops them all: later tests reload theirs from the cache
    yield
    if above_mapping_limit():
        jax.clear_caches()
        gc.collect()


#: Notebooks too long for the notebook run (they execute with the slow tests, `pytest -m slow`).
SLOW_NOTEBOOKS = {"02_gdp_residue_filter.ipynb", "03_natural_filter_cost.ipynb"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # every notebook is marked `notebook`: they run as their own command (README, .ci/run), which
    # keeps the default run well inside its time
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebook)
        if item.path.name in SLOW_NOTEBOOKS:
            item.add_marker(pytest.mark.slow)
