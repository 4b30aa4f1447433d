import jax
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def x64_off():
    """Run a test with the user's jax_enable_x64 switched off."""
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", True)
