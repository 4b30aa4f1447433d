import os

import jax
import pytest

# the CLI turns on a persistent compilation cache; tests must not write into the home directory
os.environ.setdefault("PLDJAX_COMPILATION_CACHE", "0")

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def x64_off():
    """Run a test with the user's jax_enable_x64 switched off."""
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", True)
