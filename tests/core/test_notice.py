"""A call that runs for seconds says why on stderr, once, and how long it took; quick calls,
nested calls and PLDJAX_QUIET stay silent."""

import threading
import time

import jax
import pytest

import pldjax as pj
from pldjax.core import notice


@pytest.fixture
def loud(monkeypatch):
    monkeypatch.delenv("PLDJAX_QUIET", raising=False)
    monkeypatch.setattr(notice, "NOTICE_AFTER", 0.05)
    monkeypatch.setattr(notice, "_POLL", 0.01)


def test_a_slow_call_says_what_runs_and_then_how_long_it_took(loud, capsys):
    @notice.announces_slow_calls("pldjax.example")
    def slow(x):
        with notice.slow_call_notice("pldjax.inner"):  # nested: silent
            jax.jit(lambda y: y * 1.618033)(0.5).block_until_ready()  # a new program
            time.sleep(0.3)
        return 2 * x

    assert slow(21) == 42
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("pldjax.example is still running after 0.05 s: it compiles XLA")
    assert err[1].startswith("pldjax.example done in ") and err[1].endswith(" s")


@pytest.mark.parametrize("cache", [None, "cache"])
def test_a_compiling_call_mentions_the_persistent_cache_only_where_there_is_one(
        loud, capsys, tmp_path, cache):
    configured = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", cache and str(tmp_path / cache))
    try:
        with notice.slow_call_notice("pldjax.example"):
            jax.jit(lambda y: y * 2.718281)(0.25).block_until_ready()  # a new program
            time.sleep(0.3)
    finally:
        jax.config.update("jax_compilation_cache_dir", configured)
    said = capsys.readouterr().err.splitlines()[0]
    assert said.startswith("pldjax.example is still running after 0.05 s: it compiles XLA")
    assert ("persistent cache" in said) == (cache is not None)


def test_a_slow_call_that_compiles_nothing_does_not_say_it_compiles(loud, capsys):
    with notice.slow_call_notice("pldjax.warm"):
        time.sleep(0.3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("pldjax.warm is still running after 0.05 s: it computes (no new XLA "
                      "program so far: the work itself takes this long)")


def test_quick_calls_and_quiet_processes_stay_silent(loud, capsys, monkeypatch):
    with notice.slow_call_notice("pldjax.quick"):
        pass
    time.sleep(0.1)
    monkeypatch.setenv("PLDJAX_QUIET", "1")
    with notice.slow_call_notice("pldjax.quiet"):
        time.sleep(0.2)
    assert capsys.readouterr().err == ""


def test_a_failing_call_leaves_no_notice_running(loud, capsys):
    with pytest.raises(ValueError, match="bad"), notice.slow_call_notice("pldjax.failing"):
        raise ValueError("bad")
    with notice.slow_call_notice("pldjax.next"):  # the slot is free again: this one speaks
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert "pldjax.failing" not in err and "pldjax.next done in" in err
    assert any(t.name == "pldjax-notice" and t.daemon for t in threading.enumerate())


def test_calls_that_may_compile_for_seconds_announce_themselves(monkeypatch):
    said = []
    speak = notice.slow_call_notice

    def spy(name, *args, **kwargs):
        said.append(name)
        return speak(name, *args, **kwargs)

    monkeypatch.setattr(notice, "slow_call_notice", spy)
    grid = pj.Grid(step=1 / 16)
    queries = [pj.randomized_response(0.5, grid=grid)]
    budget = pj.approx_dp_composition(1.0, 0.0, grid=grid)
    pj.natural_filter_cost(queries, budget=budget, rounds=1)
    pj.natural_filter_bounds(queries, budget=budget, rounds=1)
    pj.natural_filter_free(queries, budget=budget, rounds=1)
    pj.totally_ordered(queries, rounds=1)
    pj.gdp_residue(1.0, queries[0])
    table = pj.filters.residue.gdp_residue_table(20.0, 0.01, 1.0, mu_nodes=2, c_nodes=2,
                                                 residue=False)
    pj.optax.individual_dpsgd(0.1, 1.0, 20.0, sampling_prob=0.01, table=table, key=jax.random.key(0),
                              mu_budget=1.0, num_examples=4, delta_slack=1e-6)
    assert {"pldjax.natural_filter_cost", "pldjax.natural_filter_bounds",
            "pldjax.natural_filter_free", "pldjax.totally_ordered", "pldjax.gdp_residue",
            "pldjax.filters.residue.gdp_residue_table", "pldjax.optax.individual_dpsgd"} <= set(said)
