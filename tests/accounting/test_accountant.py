"""The accountant (pj.accountant): exact composition of changing steps, jit, checkpoints, x64."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_programs import programs_of_a_new_process

import pldjax as pj

DELTA = 1e-5

# -- accountant -----------------------------------------------------------------------------------
def test_accountant_composes_changing_steps_exactly():
    state = pj.accountant.init()
    assert pj.accountant.epsilon(state, DELTA) == 0.0
    for _ in range(3):
        state = pj.accountant.step(state, noise_multiplier=1.1, sampling_prob=0.01)
    state = pj.accountant.step(state, noise_multiplier=0.9, sampling_prob=0.02, steps=200)
    state = pj.accountant.step(state, noise_multiplier=1.1, sampling_prob=0.01, steps=97)
    assert pj.accountant.segments(state) == [(1.1, 0.01, 3), (0.9, 0.02, 200), (1.1, 0.01, 97)]
    expected = float(pj.compose_schedule([(1.1, 0.01, 3), (0.9, 0.02, 200),
                                          (1.1, 0.01, 97)]).epsilon(DELTA))
    assert pj.accountant.epsilon(state, DELTA) == pytest.approx(expected, rel=1e-12)
    # one segment is the plain DP-SGD accounting (whose window leaves delta / 2^20 outside, not
    # 1e-18, charged to delta: about a millionth higher at most)
    one = pj.accountant.step(pj.accountant.init(), 1.0, 0.01, steps=500)
    assert pj.accountant.epsilon(one, DELTA) == pytest.approx(
        float(pj.dpsgd_epsilon(1.0, 0.01, 500, DELTA)), rel=1e-6)
    # many targets at once, each as read alone
    many = pj.accountant.epsilon(one, [DELTA, 1e-3])
    assert many.shape == (2,) and many[1] == pj.accountant.epsilon(one, 1e-3)
    assert pj.accountant.delta(one, np.array([1.0, 2.0]))[0] == pj.accountant.delta(one, 1.0)


def test_accountant_step_is_jittable_and_overflow_refuses_to_report():
    step = jax.jit(pj.accountant.step)
    state = pj.accountant.init(capacity=2)
    for sigma in (1.0, 1.0, 2.0):
        state = step(state, sigma, 0.01, 1)
    assert pj.accountant.segments(state) == [(1.0, 0.01, 2), (2.0, 0.01, 1)]
    full = state
    state = step(state, 3.0, 0.01, 1)  # a third segment does not fit
    with pytest.raises(ValueError, match="capacity"):
        pj.accountant.epsilon(state, DELTA)
    # on the host it raises at once, and the state passed in keeps its readable record
    with pytest.raises(ValueError, match="cannot be recorded .* capacity \\(2"):
        pj.accountant.step(full, 3.0, 0.01, 1)
    assert pj.accountant.epsilon(full, DELTA) == pytest.approx(
        pj.compose_schedule([(1.0, 0.01, 2), (2.0, 0.01, 1)]).epsilon(DELTA), rel=1e-6)
    with pytest.raises(ValueError, match="noise_multiplier"):
        pj.accountant.step(pj.accountant.init(), -1.0, 0.01)
    # under jit bad values cannot raise: nothing is recorded and every reading raises
    for bad in ((-1.0, 0.01, 1), (np.nan, 0.01, 1), (1.0, 1.5, 1), (1.0, np.nan, 1), (1.0, 0.01, -3)):
        marked = step(pj.accountant.step(pj.accountant.init(), 1.0, 0.01, 5), *bad)
        with pytest.raises(ValueError, match="invalid noise_multiplier") as raised:
            pj.accountant.epsilon(marked, DELTA)
        assert "capacity" not in str(raised.value)  # one segment of 64: not the cause
    with pytest.raises(ValueError, match="sampling_prob"):
        pj.accountant.step(pj.accountant.init(), 1.0, 1.5)


def test_accountant_step_counts_never_wrap_around():
    """Two steps=2^63-1 and 12 more wrapped int64 around to a run of 10 steps (epsilon 0.38 for
    about 2^64 steps); two of 2^62 to none (epsilon 0). A count beyond int64 now marks the state
    (every reading raises), eagerly and under jit; a steps argument above 2^62 is refused."""
    A = pj.accountant
    with pytest.raises(ValueError, match="steps"):
        A.step(A.init(), 1.0, 0.01, steps=2**63)
    with pytest.raises(ValueError, match="steps"):
        A.step(A.init(), 1.0, 0.01, steps=1e30)
    for step in (A.step, jax.jit(A.step)):
        state = step(step(A.init(), 1.0, 0.01, 2**62), 1.0, 0.01, 2**62 - 1)
        assert A.segments(state) == [(1.0, 0.01, 2**63 - 1)]
        if step is A.step:  # on the host the step raises, and the state passed in stays usable
            with pytest.raises(ValueError, match="2\\^63 - 1 steps"):
                step(state, 1.0, 0.01, 1)
            assert A.segments(state) == [(1.0, 0.01, 2**63 - 1)]
            continue
        state = step(state, 1.0, 0.01, 1)  # 2^63 steps: not representable
        with pytest.raises(ValueError, match="2\\^63 - 1 steps"):
            A.epsilon(state, DELTA)
    # a float count beyond the largest under jit is invalid, not saturated
    state = jax.jit(A.step)(A.init(), 1.0, 0.01, 1e30)
    with pytest.raises(ValueError, match="not fully recorded"):
        A.epsilon(state, DELTA)
    # so is a fraction of a step (never rounded to a whole count)
    for count in (0.999, 2.5):
        state = jax.jit(A.step)(A.init(), 1.0, 0.01, count)
        with pytest.raises(ValueError, match="not a whole number"):
            A.epsilon(state, DELTA)
    # an int32 count (a caller's jit with x64 off) is compared with the limit in float64
    state = jax.jit(A.step)(A.init(), 1.0, 0.01, np.int32(7))
    assert A.segments(state) == [(1.0, 0.01, 7)]


@pytest.mark.slow
def test_accountant_checkpoint_midway_ends_with_the_same_epsilon(tmp_path):
    state = pj.accountant.init()
    for sigma in (1.0, 1.2, 0.8):
        state = pj.accountant.step(state, sigma, 0.01, steps=100)
    pj.accountant.save(tmp_path / "acct.npz", state)
    restored = pj.accountant.load(tmp_path / "acct.npz")
    for s in (state, restored):
        s = pj.accountant.step(s, 1.5, 0.02, steps=50)
        if s is not restored:
            whole = pj.accountant.epsilon(s, DELTA)
    resumed = pj.accountant.epsilon(pj.accountant.step(restored, 1.5, 0.02, steps=50), DELTA)
    assert resumed == whole


# -- calibration ----------------------------------------------------------------------------------


def test_accountant_with_x64_off_is_exact_or_pessimistic(x64_off, tmp_path):
    eager = pj.accountant.step(pj.accountant.init(), 1.1, 0.01, 100)
    pj.accountant.save(tmp_path / "a.npz", eager)
    restored = pj.accountant.load(tmp_path / "a.npz")
    assert pj.accountant.segments(restored) == [(1.1, 0.01, 100)]
    assert pj.accountant.epsilon(restored, DELTA) == pj.accountant.epsilon(eager, DELTA)
    # Python floats rounded to float32 by the caller's jit: recorded on the pessimistic side
    jitted = jax.jit(pj.accountant.step)(pj.accountant.init(), 1.1, 0.01, 100)
    [(sigma, q, steps)] = pj.accountant.segments(jitted)
    assert steps == 100
    assert sigma <= float(np.float32(1.1)) and sigma <= 1.1 and sigma == pytest.approx(1.1, 1e-7)
    assert q >= float(np.float32(0.01)) and q >= 0.01 and q == pytest.approx(0.01, 1e-7)
    assert pj.accountant.epsilon(jitted, DELTA) >= pj.accountant.epsilon(eager, DELTA)
    one = jax.jit(pj.accountant.step)(pj.accountant.init(), 2.0, 1.0)
    assert pj.accountant.segments(one)[0][1] == 1.0  # q = 1 stays a probability


def test_accountant_state_is_the_same_with_x64_on_and_off(x64_off):
    off = pj.accountant.step(pj.accountant.init(), 0.7, 0.3, 5)
    jax.config.update("jax_enable_x64", True)
    on = pj.accountant.step(pj.accountant.init(), 0.7, 0.3, 5)
    jax.config.update("jax_enable_x64", False)
    for a, b in zip(jax.tree_util.tree_leaves(on), jax.tree_util.tree_leaves(off), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


# -- events other than DP-SGD steps -----------------------------------------------------------------
LAPLACE = pj.Event(pj.noise.Laplace(2.0), pj.sampling.Poisson(0.05))


def test_event_accountant_records_events_and_reads_their_composition(tmp_path):
    state = pj.accountant.init(capacity=4, event=LAPLACE)
    step = jax.jit(pj.accountant.step)
    state = step(state, LAPLACE, steps=20)
    other = pj.Event(pj.noise.Laplace(3.0), pj.sampling.Poisson(0.1))
    state = pj.accountant.step(state, other, steps=10)
    run = pj.accountant.events(state)
    assert run == [(LAPLACE, 20), (other, 10)]
    expected = pj.compose([LAPLACE.pld().self_compose(20), other.pld().self_compose(10)])
    assert pj.accountant.epsilon(state, DELTA) == pytest.approx(float(expected.epsilon(DELTA)),
                                                                rel=1e-12)
    with pytest.raises(ValueError, match="events"):
        pj.accountant.segments(state)
    with pytest.raises(ValueError, match="structure"):
        pj.accountant.step(state, 1.0, 0.01)
    for path in (tmp_path / "e.npz", tmp_path / "e.json"):
        pj.accountant.save(path, state)
        restored = pj.accountant.load(path, capacity=4, event=LAPLACE)
        assert pj.accountant.events(restored) == run
        with pytest.raises(ValueError):
            pj.accountant.load(path, capacity=4)  # a DP-SGD accountant: another layout


def test_event_accountant_takes_a_template_with_integer_parameters():
    """init(event=...) turns the template's parameters into arrays: a truncated Poisson template
    was refused with "dataset_size must be an integer >= 1, got Array(1000)"."""
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.TruncatedPoisson(0.01, 1000, 20),
                     "replace_special")
    state = pj.accountant.init(capacity=2, event=event)
    state = jax.jit(pj.accountant.step)(state, event, steps=3)
    [(recorded, steps)] = pj.accountant.events(state)
    assert steps == 3 and recorded == event


@pytest.mark.slow
def test_event_accountant_reads_truncated_poisson_steps():
    """The accountant takes any event; a truncated Poisson run failed to read ("not one
    mechanism") once recorded."""
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.TruncatedPoisson(0.05, 1000, 55),
                     "replace_special")
    state = pj.accountant.step(pj.accountant.init(capacity=2, event=event), event, steps=4)
    assert pj.accountant.epsilon(state, DELTA) == float(event.pld().self_compose(4).epsilon(DELTA))


def test_a_step_that_cannot_be_recorded_names_its_cause():
    """A float32 parameter with no safe rounding was reported as "more parameter changes than the
    accountant's capacity ... or more than 2^63 - 1 steps ..., or an event parameter in float32":
    the message now names the parameter."""
    event = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Mixture(np.array([0.0, 1.0]),
                                                                np.array([0.9, 0.1])))
    state = pj.accountant.init(capacity=1, event=event)
    single = pj.Event(event.noise, pj.sampling.Mixture(np.array([0.0, 1.0], np.float32),
                                                       np.array([0.9, 0.1])))
    with pytest.raises(ValueError, match="Mixture.scales = .* is float32"):
        pj.accountant.step(state, single)
    state = pj.accountant.step(state, event)
    other = pj.Event(pj.noise.Gaussian(2.0), event.sampling)
    with pytest.raises(ValueError, match="capacity \\(1; use init"):
        pj.accountant.step(state, other)


def test_event_accountant_rounds_float32_parameters_to_the_safe_side(x64_off):
    state = jax.jit(pj.accountant.step)(pj.accountant.init(event=LAPLACE), LAPLACE, steps=3)
    [(event, steps)] = pj.accountant.events(state)
    assert steps == 3
    assert event.noise.scale <= 2.0 and event.noise.sensitivity >= 1.0
    assert event.sampling.sampling_prob >= 0.05 and event.sampling.sampling_prob == pytest.approx(
        0.05, rel=1e-7)
    # a mixture's parameters have no safe side: a float32 one is not recorded, readings raise
    mixture = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Mixture(np.array([0.0, 1.0]),
                                                                  np.array([0.9, 0.1])))
    marked = jax.jit(pj.accountant.step)(pj.accountant.init(event=mixture), mixture)
    with pytest.raises(ValueError, match="float32"):
        pj.accountant.epsilon(marked, DELTA)


def test_files_of_the_dpsgd_accountant_before_events_still_load(tmp_path):
    from pldjax.core import serialization as io
    from pldjax.core.precision import pack

    # such a file's leaves: noise multipliers, sampling probabilities, steps, count, overflow
    old = pack((jnp.array([1.1, 1.0]), jnp.array([0.01, 0.0]), jnp.array([100, 0]), jnp.array(1),
                jnp.array(False)))
    io.save(tmp_path / "old.json", old, kind="accountant", params={"capacity": 2})
    restored = pj.accountant.load(tmp_path / "old.json", capacity=2)
    assert pj.accountant.segments(restored) == [(1.1, 0.01, 100)]
    jax.config.update("jax_enable_x64", False)  # the caller's setting does not matter
    try:
        restored = pj.accountant.load(tmp_path / "old.json", capacity=2)
    finally:
        jax.config.update("jax_enable_x64", True)
    assert pj.accountant.segments(restored) == [(1.1, 0.01, 100)]


def test_event_accountant_state_is_the_same_with_x64_on_and_off(x64_off, tmp_path):
    off = pj.accountant.step(pj.accountant.init(capacity=2, event=LAPLACE), LAPLACE, steps=4)
    pj.accountant.save(tmp_path / "off.npz", off)
    jax.config.update("jax_enable_x64", True)
    on = pj.accountant.step(pj.accountant.init(capacity=2, event=LAPLACE), LAPLACE, steps=4)
    restored = pj.accountant.load(tmp_path / "off.npz", capacity=2, event=LAPLACE)
    jax.config.update("jax_enable_x64", False)
    for state in (off, restored):
        for a, b in zip(jax.tree_util.tree_leaves(on), jax.tree_util.tree_leaves(state), strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("edit, match", [
    (dict(count=5), "5 segments in use, outside"),
    (dict(count=-1), "-1 segments"),
    (dict(steps=[-3, 50, 0, 0]), "negative step count"),
    (dict(steps=[100, 50, 0, 7]), "beyond the 2 segments"),
    (dict(sigma=[1.0, -1.0, 1.0, 1.0]), "invalid: sigma must lie"),
    (dict(q=[1.5, 0.02, 0.0, 0.0]), "invalid: sampling_prob"),
    (dict(sigma=[np.nan, 2.0, 1.0, 1.0]), "invalid: sigma"),
])
def test_loading_refuses_a_state_no_steps_reach(tmp_path, edit, match):
    """A damaged or edited file (a negative noise multiplier, a probability above 1, counts
    that no step writes) is refused by name when loaded, not read as a privacy guarantee."""
    from pldjax.core.precision import pack

    A = pj.accountant
    state = A.step(A.step(A.init(capacity=4), 1.0, 0.01, 100), 2.0, 0.02, 50)
    plain = {**dict(sigma=[1.0, 2.0, 1.0, 1.0], q=[0.01, 0.02, 0.0, 0.0], steps=[100, 50, 0, 0],
                    count=2), **edit}
    with jax.enable_x64(True):
        edited = pack(A.AccountantState(
            (jnp.asarray(plain["sigma"]), jnp.ones(4), jnp.asarray(plain["q"])),
            jnp.asarray(plain["steps"], jnp.int64), jnp.asarray(plain["count"], jnp.int64),
            jnp.asarray(False), state.structure))
    path = tmp_path / "acct.json"
    A.save(path, edited)
    with pytest.raises(ValueError, match=f"acct.json: no sequence of steps .*{match}"):
        A.load(path, capacity=4)
    A.save(path, state)  # the state as recorded still loads
    assert A.segments(A.load(path, capacity=4)) == [(1.0, 0.01, 100), (2.0, 0.02, 50)]


def test_pure_dp_epsilon_of_a_mixed_run_is_exact_and_reported():
    """Bounded events' largest losses add up (each an atom): 600 / 0.7 + 400 log(1 + 0.1 (e - 1))
    within 1e-12 above, where the composed PLD's window cut them off to inf; the report's
    epsilon at delta = 0 is the same."""
    laplace = pj.Event(pj.noise.Laplace(0.7), pj.sampling.Poisson(1.0))
    state = pj.accountant.init(event=laplace)
    state = pj.accountant.step(state, event=laplace, steps=600)
    state = pj.accountant.step(state, event=pj.Event(pj.noise.Laplace(1.0), pj.sampling.Poisson(0.1)),
                               steps=400)
    truth = 600 / 0.7 + 400 * math.log1p(0.1 * math.expm1(1.0))
    both = pj.accountant.epsilon(state, np.array([0.0, 1e-5]))
    assert truth <= both[0] <= truth * (1 + 1e-12) and both[1] < truth
    report = pj.privacy_report(state, deltas=[0.0])
    assert truth <= report.epsilon_upper[0] <= truth * (1 + 1e-12)
    assert report.epsilon_lower[0] <= truth


def test_init_compiles_nothing_and_a_first_step_only_its_kernel(tmp_path):
    names, printed = programs_of_a_new_process("""
        import json
        import pldjax as pj
        state = pj.accountant.init()
        laplace = pj.Event(pj.noise.Laplace(2.0), pj.sampling.Poisson(0.05))
        ledger = pj.accountant.init(event=laplace)
        print(json.dumps([float(pj.accountant.epsilon(state, delta=1e-5)),
                          float(pj.accountant.epsilon(ledger, delta=1e-5))]))
        state = pj.accountant.step(state, noise_multiplier=1.1, sampling_prob=0.01)
    """, cache=tmp_path / "xla")  # empty: every program compiles
    assert names == ["jit(option_probe)", "jit(_step)"]  # the step's, none for the empty states
    assert json.loads(printed.splitlines()[-1]) == [0.0, 0.0]

