"""Precision, jit/vmap, retracing, and bad input."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_programs import compiled_programs

import pldjax as pj


def _workload():
    c = pj.compose([pj.gaussian(0.9).self_compose(300), pj.randomized_response(0.5, 1e-7)])
    return c.epsilon([1e-5, 1e-10]), c.delta([1.0, 40.0]), np.asarray(c.probs)


def test_results_identical_with_x64_on_and_off(x64_off):
    off = _workload()
    jax.config.update("jax_enable_x64", True)
    on = _workload()
    for a, b in zip(off, on, strict=True):
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, b)


def test_pytree_round_trip():
    p = pj.gaussian(1.0)
    leaves, tree = jax.tree_util.tree_flatten(p)
    q = jax.tree_util.tree_unflatten(tree, leaves)
    assert q.pessimistic and q.size == p.size
    with pytest.raises(AttributeError):
        p.step = 1.0


def test_user_jit_and_no_retrace_for_new_parameters():
    traces = []

    @jax.jit
    def eps_for(sigma):
        traces.append(sigma)
        return pj.gaussian(sigma).self_compose(100, size=2**15).epsilon(1e-5)

    with jax.enable_x64(True):
        a = eps_for(jnp.float64(1.0))
        b = eps_for(jnp.float64(1.3))
    assert len(traces) == 1
    assert float(a) == pytest.approx(float(pj.gaussian(1.0).self_compose(100).epsilon(1e-5)), rel=1e-6)
    assert float(b) < float(a)


def test_api_kernels_do_not_retrace_for_new_values():
    # the window size is static (automatic sizes come in powers of two); fix it to compare
    pj.gaussian(1.0).self_compose(50, size=2**13)
    _, names = compiled_programs(lambda: (pj.gaussian(1.1).self_compose(50, size=2**13),
                                          pj.gaussian(0.95).self_compose(70, size=2**13)))
    assert names == []


def test_vmap_over_plds():
    batch = pj.gaussian(jnp.array([0.8, 1.0, 2.0]))
    with jax.enable_x64(True):
        out = jax.vmap(lambda p: p.delta(1.0))(batch)
    np.testing.assert_allclose(out, batch.delta(1.0))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: pj.gaussian(0.0), "sigma"),
        (lambda: pj.gaussian(-1.0), "sigma"),
        (lambda: pj.gaussian(float("nan")), "sigma.*NaN"),
        (lambda: pj.gaussian(np.array([1.0, -2.0])), "sigma"),
        (lambda: pj.gaussian(1.0, sensitivity=0.0), "sensitivity"),
        (lambda: pj.gdp(-0.1), "mu"),
        (lambda: pj.laplace(0.0), "scale"),
        (lambda: pj.randomized_response(-1.0), "epsilon"),
        (lambda: pj.randomized_response(1.0, 1.5), "delta"),
        (lambda: pj.gaussian(1.0).delta(-0.5), "epsilon"),
        (lambda: pj.gaussian(1.0).epsilon(1.5), "delta"),
        (lambda: pj.gaussian(1.0).epsilon(-1e-3), "delta"),
        (lambda: pj.gaussian(1.0).epsilon(float("nan")), "delta"),
        (lambda: pj.gaussian(1.0).self_compose(-1), "count"),
        (lambda: pj.gaussian(1.0).self_compose(2.5), "count"),
        (lambda: pj.gaussian(1.0).self_compose(True), "count"),
        (lambda: pj.compose([]), "plds"),
        (lambda: pj.Grid(step=-1.0), "step"),
        (lambda: pj.Grid(size=1), "size"),
        # strings, booleans, complex numbers and None are refused, never converted
        (lambda: pj.gaussian("1"), "sigma must be a real number"),
        (lambda: pj.gaussian(True), "sigma must be a real number"),
        (lambda: pj.gaussian(None), "sigma must be a real number"),
        (lambda: pj.gaussian(1 + 2j), "sigma must be a real number"),
        (lambda: pj.gaussian(np.array([True, False])), "sigma must be a real number"),
        (lambda: pj.gaussian(1.0, sampling_prob="0.5"), "sampling_prob must be a real number"),
        (lambda: pj.gaussian(1.0).epsilon("1e-5"), "delta must be a real number"),
        (lambda: pj.dpsgd_epsilon(1.0, 0.01, True, 1e-5), "steps must be a real number"),
        # a flag is True or False: "no" is truthy, None falsy
        (lambda: pj.gaussian(1.0, pessimistic="no"), "pessimistic must be True or False"),
        (lambda: pj.gdp(1.0, pessimistic=None), "pessimistic must be True or False"),
        (lambda: pj.dpsgd_epsilon(1.0, 0.01, 10, 1e-5, pessimistic="no"),
         "pessimistic must be True or False"),
        (lambda: pj.dpsgd_delta(1.0, 0.01, 10, 1.0, pessimistic=0), "pessimistic must be True or False"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.slow
def test_cli_epsilon_and_delta(capsys):
    from pldjax.cli import main

    full_batch = ["--sampling-prob", "1", "--steps", "10"]
    assert main(["epsilon", "--noise-multiplier", "2.0", *full_batch, "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    pess, opt = float(out.split()[2]), float(out.split("optimistic")[1].strip(" )\n"))
    assert opt <= pess <= opt * 1.005
    assert main(["delta", "--noise-multiplier", "2.0", *full_batch, "--epsilon", "1.0"]) == 0
    assert main(["epsilon", "--noise-multiplier", "-1", *full_batch, "--delta", "1e-5"]) == 2
    assert "noise_multiplier" in capsys.readouterr().err


_CACHE_DIRS_AFTER_IMPORT = """
import os, sys, warnings, jax, pldjax
from pldjax.core.compilation import enable_default_cache
print(jax.config.jax_compilation_cache_dir)
for name, value, jax_dir in [a.split("|") for a in sys.argv[1:]]:
    jax.config.update("jax_compilation_cache_dir", jax_dir or None)
    os.environ[name] = value
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enable_default_cache()
    print(jax.config.jax_compilation_cache_dir, len(caught))
"""


def test_compilation_cache_is_on_by_default_with_opt_outs(tmp_path):
    """The import's cache directory, then (in the same process, nothing compiled) what the same
    start-up step does under each opt-out."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "home"), JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the test run's own cache (conftest)
    env.pop("PLDJAX_COMPILATION_CACHE", None)
    mine = str(tmp_path / "mine")
    (tmp_path / "file").write_text("")
    cases = [
        "PLDJAX_COMPILATION_CACHE|0|",  # opt out: JAX's settings untouched
        f"PLDJAX_COMPILATION_CACHE||{mine}",  # a directory configured for JAX wins
        # a directory that cannot be created leaves the cache off with a warning
        f"PLDJAX_COMPILATION_CACHE|{tmp_path / 'file' / 'xla'}|",
    ]
    out = subprocess.run([sys.executable, "-c", _CACHE_DIRS_AFTER_IMPORT, *cases], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(tmp_path / "home" / "pldjax" / "xla"), "None 0",
                                       f"{mine} 0", "None 1"]  # the last one warns


@pytest.mark.slow
def test_compilation_cache_keeps_kernels_across_processes(tmp_path):
    code = (
        "import jax, pldjax as pj; print(jax.config.jax_compilation_cache_dir); "
        "print(pj.dpsgd_epsilon(1.0, 0.01, 100, 1e-5))"  # compiles (a small PLD alone would not)
    )
    env = dict(os.environ, PLDJAX_COMPILATION_CACHE=str(tmp_path / "xla"), JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the test run's own cache (conftest)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == str(tmp_path / "xla")
    assert any((tmp_path / "xla").iterdir())
    env["PLDJAX_COMPILATION_CACHE"] = "0"
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert off.returncode == 0 and off.stdout.splitlines()[0] == "None"


def test_public_namespace_holds_only_the_api():
    """Every public name of the package is in __all__ or one of its own modules (no stray
    imports, such as importlib, leak into ``dir(pj)`` and tab completion)."""
    import types

    for name, value in vars(pj).items():  # not dir(): its lazy names would import optional extras
        if name.startswith("_"):
            continue
        own_module = isinstance(value, types.ModuleType) and value.__name__.startswith("pldjax.")
        assert name in pj.__all__ or own_module, name


@pytest.mark.parametrize("name", ["noise", "sampling", "neighboring", "filters", "io", "odometers",
                                  "accountant", "optax", "plot"])
def test_public_modules_list_their_public_names_only(name):
    module = getattr(pj, name)
    assert dir(module) == sorted(module.__all__)
    assert not {"np", "jnp", "jax", "math", "abc", "annotations"} & set(dir(module))
    for public in module.__all__:
        assert hasattr(module, public), public
