"""Every promise holds under jit and vmap as on the host.

On the host an invalid parameter raises a ValueError naming it. Under ``jax.jit`` or
``jax.vmap`` it is a tracer and cannot raise, so the PLD built from it claims nothing: the
pessimistic one has all of its mass at +inf (epsilon = inf at every delta < 1, delta = 1 at every
epsilon), the optimistic one is the identity (delta(eps) = 0 for eps >= 0); never a finite
epsilon, a delta below 1 or NaN. Valid traced parameters give the host's values.

One grid size throughout (each new shape compiles anew).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pldjax as pj
from pldjax.core.validation import check_range, within

GRID = pj.Grid(size=1024)
NAN, INF = math.nan, math.inf


def outside(low=-INF, high=INF, *, low_open=False, high_open=False, integer=False):
    """Values a host check with these bounds refuses: NaN, +-inf and draws beyond each bound
    (and non-whole numbers inside it, for ``integer``)."""
    parts = [st.sampled_from([NAN, INF, -INF])]
    if low > -INF:
        parts.append(st.floats(max_value=low, exclude_max=not low_open, allow_nan=False,
                               allow_infinity=False))
    if high < INF:
        parts.append(st.floats(min_value=high, exclude_min=not high_open, allow_nan=False,
                               allow_infinity=False))
    if integer:
        parts.append(st.floats(low, 1e6, allow_nan=False).filter(lambda x: x % 1 != 0))
    return st.one_of(parts)


#: name -> (build(x, pessimistic): a PLD with the one parameter x, a valid x, invalid values
#: for the vmap test, a strategy of invalid values for the jit test)
CASES = {
    "gaussian_sigma": (
        lambda x, p: pj.gaussian(x, grid=GRID, pessimistic=p),
        1.3, [NAN, -1.0, 0.0, INF], outside(0.0, low_open=True)),
    "gaussian_sensitivity": (
        lambda x, p: pj.gaussian(1.0, sensitivity=x, grid=GRID, pessimistic=p),
        0.8, [NAN, -1.0, 0.0, INF], outside(0.0, low_open=True)),
    "laplace_scale": (
        lambda x, p: pj.laplace(x, grid=GRID, pessimistic=p),
        2.0, [NAN, -2.0, 0.0, INF], outside(0.0, low_open=True)),
    "discrete_laplace_scale": (
        lambda x, p: pj.discrete_laplace(x, grid=GRID, pessimistic=p),
        1.5, [NAN, -1.0, 0.0, INF], outside(0.0, low_open=True)),
    "discrete_laplace_sensitivity": (
        lambda x, p: pj.discrete_laplace(1.5, sensitivity=x, grid=GRID, pessimistic=p),
        2.0, [NAN, 1.5, 0.0, -1.0, INF], outside(1.0, integer=True)),
    "gdp_mu": (
        lambda x, p: pj.gdp(x, grid=GRID, pessimistic=p),
        1.0, [NAN, -1.0, INF], outside(0.0)),
    "randomized_response_epsilon": (
        lambda x, p: pj.randomized_response(x, 1e-7, grid=GRID, pessimistic=p),
        0.5, [NAN, -1.0, INF], outside(0.0)),
    "approx_dp_composition_epsilon": (
        lambda x, p: pj.approx_dp_composition(x, 1e-7, 3),
        0.5, [NAN, -1.0, INF], outside(0.0)),
    "approx_dp_composition_delta": (
        lambda x, p: pj.approx_dp_composition(1.0, x, 3),
        1e-7, [NAN, -0.1, 1.5], outside(0.0, 1.0)),
    "randomized_response_delta": (
        lambda x, p: pj.randomized_response(1.0, x, grid=GRID, pessimistic=p),
        1e-7, [NAN, -0.1, 1.5], outside(0.0, 1.0)),
    "poisson_sampling_prob": (
        lambda x, p: pj.privacy_loss(pj.noise.Gaussian(1.0), pj.sampling.Poisson(x),
                                     pessimistic=p, grid=GRID),
        0.1, [NAN, -0.5, 1.5, INF], outside(0.0, 1.0)),
    "poisson_noise_scale": (
        lambda x, p: pj.privacy_loss(pj.noise.Laplace(x), pj.sampling.Poisson(0.1),
                                     pessimistic=p, grid=GRID),
        2.0, [NAN, -2.0, 0.0], outside(0.0, low_open=True)),
    "poisson_replace_one_sampling_prob": (
        lambda x, p: pj.privacy_loss(pj.noise.Gaussian(1.0), pj.sampling.Poisson(x),
                                     "replace_one", pessimistic=p, grid=GRID),
        0.1, [NAN, -0.5, 1.5], outside(0.0, 1.0)),
    "fixed_batch_sampling_prob": (
        lambda x, p: pj.privacy_loss(pj.noise.Gaussian(1.0), pj.sampling.FixedBatch(x),
                                     "replace_one", pessimistic=p, grid=GRID),
        0.1, [NAN, -0.5, 1.5], outside(0.0, 1.0)),
    # probabilities (1 - x, x): x outside [0, 1] makes one of them negative
    "mixture_probs": (
        lambda x, p: pj.privacy_loss(pj.noise.GDP(1.0), pj.sampling.Mixture(
            jnp.array([0.0, 1.0]), jnp.stack([1 - x, x])), pessimistic=p, grid=GRID),
        0.1, [NAN, -0.5, 1.5], outside(0.0, 1.0)),
    # probabilities (x/2, x/2): all zero at x = 0, adding up to 1 only at x = 1
    "mixture_probs_total": (
        lambda x, p: pj.privacy_loss(pj.noise.GDP(1.0), pj.sampling.Mixture(
            jnp.array([0.0, 1.0]), jnp.stack([x / 2, x / 2])), pessimistic=p, grid=GRID),
        1.0, [0.0, 0.5, NAN], st.sampled_from([0.0, 0.5, 0.9, 1.1, NAN])),
    "mixture_scales": (
        lambda x, p: pj.privacy_loss(pj.noise.GDP(1.0), pj.sampling.Mixture(
            jnp.stack([0.0, x]), jnp.array([0.9, 0.1])), pessimistic=p, grid=GRID),
        1.0, [NAN, -1.0, INF], outside(0.0)),
}

#: The cases also checked for the optimistic PLD (each one more compiled program).
OPTIMISTIC = ["gaussian_sigma", "randomized_response_delta", "poisson_sampling_prob",
              "mixture_probs_total"]


def _readings(pld) -> np.ndarray:
    """(epsilon(1e-5), delta(0), delta(1), total mass) of each element of a PLD (each
    direction's mass); shape batch + (4,)."""
    mass = np.min(np.stack([np.asarray(d.total_mass()) for d in pld.directions()]), axis=0)
    return np.stack([np.asarray(v, np.float64) for v in
                     (pld.epsilon(1e-5), pld.delta(0.0), pld.delta(1.0), mass)], axis=-1)


def _claims_nothing(readings, pessimistic: bool) -> None:
    readings = np.asarray(readings, np.float64)
    if pessimistic:
        np.testing.assert_array_equal(readings, [INF, 1.0, 1.0, 1.0])
    else:  # the identity: delta(eps) = 0 for eps >= 0, and no mass lost
        np.testing.assert_array_equal(readings, [0.0, 0.0, 0.0, 1.0])


def _host_readings(name: str, pessimistic: bool) -> np.ndarray:
    build, valid, _, _ = CASES[name]
    return _readings(build(valid, pessimistic))


#: Pessimistic cases whose programs take longest to compile (a parameter of a kernel that other
#: cases already reach under jit): with the slow tests.
SLOW_PESSIMISTIC = {"discrete_laplace_sensitivity", "mixture_probs", "fixed_batch_sampling_prob",
                    "gaussian_sigma", "mixture_scales", "poisson_sampling_prob",
                    "poisson_replace_one_sampling_prob", "poisson_noise_scale"}


def _pessimistic_and_optimistic(fast_optimistic=()):
    """Every case pessimistic (SLOW_PESSIMISTIC with the slow tests), and the OPTIMISTIC ones
    optimistic: those named in ``fast_optimistic`` in the default run, the others with the slow
    tests (each one more compiled program)."""
    return [pytest.param(name, True, id=f"{name}-pessimistic",
                         marks=pytest.mark.slow if name in SLOW_PESSIMISTIC else ())
            for name in CASES] + [
        pytest.param(name, False, id=f"{name}-optimistic",
                     marks=() if name in fast_optimistic else pytest.mark.slow)
        for name in OPTIMISTIC]


#: Parameters in one traced batch: a valid value at each end, invalid ones between.
BATCH = 10


@pytest.mark.parametrize("name, pessimistic", _pessimistic_and_optimistic({"gaussian_sigma"}))
def test_invalid_traced_parameter_claims_nothing_for_its_element_only(name, pessimistic):
    # one program for each case, jit of vmap building the PLDs (read on the host, by kernels that
    # every case shares): the listed invalid values, then hypothesis's draws
    build, valid, bad, invalid = CASES[name]
    plds = jax.jit(jax.vmap(lambda x: build(x, pessimistic)))
    host = _host_readings(name, pessimistic)

    def check(values):
        rows = _readings(plds(jnp.array([valid, *values, valid], jnp.float64)))
        for row in (rows[0], rows[-1]):
            np.testing.assert_allclose(row, host, rtol=1e-12, atol=0)
        for row in rows[1:-1]:
            _claims_nothing(row, pessimistic)

    check((bad * BATCH)[:BATCH - 2])

    @settings(settings.get_profile("pldjax-fast"), max_examples=3)
    @given(st.lists(invalid, min_size=BATCH - 2, max_size=BATCH - 2))
    def prop(values):
        check(values)

    prop()


def test_claiming_nothing_survives_composition_under_jit():
    epsilon = jax.jit(lambda s: pj.gaussian(s, grid=GRID).self_compose(10, size=4 * GRID.size)
                      .epsilon(1e-5))
    assert float(epsilon(1.0)) < INF
    for sigma in (NAN, -1.0):
        assert float(epsilon(sigma)) == INF


@pytest.mark.slow
def test_a_batch_of_parameters_in_one_record_is_judged_element_by_element():
    sigmas = jnp.array([1.0, NAN, -1.0, 2.0])
    delta = jax.jit(lambda s: pj.gaussian(s, sampling_prob=jnp.array([0.1, 0.1, 0.1, 1.5]),
                                          grid=GRID).delta(1.0))(sigmas)
    np.testing.assert_array_equal(np.asarray(delta)[1:], [1.0, 1.0, 1.0])
    host = float(pj.gaussian(1.0, sampling_prob=0.1, grid=GRID).delta(1.0))
    np.testing.assert_allclose(float(delta[0]), host, rtol=1e-12)


@pytest.mark.parametrize("build", [
    pytest.param(lambda s: pj.discrete_gaussian(s, grid=GRID), id="discrete_gaussian"),
    pytest.param(lambda q: pj.privacy_loss(pj.noise.Gaussian(1.0),
                                           pj.sampling.TruncatedPoisson(q, 1000, 20), grid=GRID),
                 id="truncated_poisson"),
    pytest.param(lambda e: pj.approx_dp_composition(e, 1e-7, 3, grid=pj.Grid(step=0.1)),
                 id="approx_dp_composition_on_a_grid"),
    pytest.param(lambda d: pj.approx_dp_composition(1.0, d * 1e-7, 3, grid=pj.Grid(step=0.1)),
                 id="approx_dp_composition_on_a_grid_traced_delta"),
    pytest.param(lambda rho: pj.zcdp(rho), id="zcdp"),
])
def test_constructors_that_need_concrete_parameters_refuse_tracers(build):
    with pytest.raises(ValueError, match="concrete"):
        jax.jit(lambda x: build(x).delta(1.0))(1.0)


@pytest.mark.parametrize("pessimistic", [True, False])
def test_an_invalid_traced_reading_claims_nothing(pessimistic):
    """A NaN delta or epsilon, or an alpha or order out of range, read NaN (or a type II error
    of -1) under jit; each reads what claims nothing instead, the valid ones beside it as they
    are."""
    pld = pj.gaussian(1.0, pessimistic=pessimistic, grid=GRID)
    upper = {"epsilon": np.inf, "delta": 1.0, "tradeoff": 0.0, "renyi": np.inf}
    lower = {"epsilon": 0.0, "delta": 0.0, "tradeoff": 1.0, "renyi": 0.0}
    for name, good, bad in [("epsilon", 1e-5, NAN), ("delta", 1.0, NAN), ("tradeoff", 0.3, 2.0),
                            ("renyi", 2.0, -1.0)]:
        read = jax.jit(getattr(pld, name))(jnp.array([good, bad]))
        nothing = (upper if pessimistic else lower)[name]
        np.testing.assert_array_equal(np.asarray(read)[1], nothing)
        np.testing.assert_allclose(float(read[0]), float(getattr(pld, name)(good)), rtol=1e-8)


def test_a_concrete_pld_is_read_at_traced_values():
    """A PLD built outside jit, read inside it (or under vmap): its readings there took the
    host's NumPy path and raised TracerArrayConversionError."""
    for pld in (pj.gdp(1.0), pj.gaussian(1.0, sampling_prob=0.01, grid=GRID).self_compose(100)):
        np.testing.assert_allclose(float(jax.jit(pld.epsilon)(1e-5)), float(pld.epsilon(1e-5)),
                                   rtol=1e-8)
        epsilons = jnp.array([0.5, 1.0])
        np.testing.assert_allclose(np.asarray(jax.vmap(pld.delta)(epsilons)),
                                   np.asarray(pld.delta(epsilons)), rtol=1e-8)


BOUNDS = st.sampled_from([
    dict(low=0.0), dict(low=0.0, low_open=True), dict(low=0.0, high=1.0),
    dict(low=0.0, high=1.0, high_open=True), dict(low=-1.0, high=1.0, allow_inf=True),
    dict(low=-INF, allow_inf=True),
])


@pytest.mark.slow
@settings(settings.get_profile("pldjax-fast"), max_examples=40)
@given(st.one_of(st.floats(), st.sampled_from([0.0, 1.0, -1.0, NAN, INF, -INF])), BOUNDS)
def test_within_agrees_with_the_host_check(value, bounds):
    try:
        check_range("x", value, **bounds)
        accepted = True
    except ValueError:
        accepted = False
    assert bool(within(value, **bounds)) == accepted
    assert bool(jax.jit(lambda v: within(v, **bounds))(value)) == accepted


def test_within_refuses_complex_and_boolean_values():
    assert not bool(within(1.0 + 0j, 0.0))
    assert not bool(within(jnp.array(True), 0.0))
    np.testing.assert_array_equal(within(jnp.array([2.0, 2.5]), 1.0, integer=True), [True, False])


def _gaussian_event(sigma):
    return pj.Event(pj.noise.Gaussian(sigma), pj.sampling.Poisson(0.01))


#: The accounting functions: each picks its grids from the values, so under jit or vmap it
#: refuses to run, with a message that names it (never a value computed from a tracer).
ACCOUNTING = {
    "dpsgd_epsilon": lambda x: pj.dpsgd_epsilon(x, 0.01, 100, 1e-5),
    "dpsgd_delta": lambda x: pj.dpsgd_delta(x, 0.01, 100, 1.0),
    "event_epsilon": lambda x: pj.event_epsilon(_gaussian_event(x), 100, 1e-5),
    "event_delta": lambda x: pj.event_delta(_gaussian_event(x), 100, 1.0),
    "compose_schedule": lambda x: pj.compose_schedule([(x, 0.01, 100)]),
    "calibrate_noise_multiplier": lambda x: pj.calibrate_noise_multiplier(x, 1e-5, 0.01, 100),
    "calibrate_event": lambda x: pj.calibrate_event(_gaussian_event, x, 1e-5, steps=100, low=0.1,
                                                    high=10.0, increasing=False),
    "calibrate_sampling_prob": lambda x: pj.calibrate_sampling_prob(x, 1e-5, 1.0, 100),
    "calibrate_steps": lambda x: pj.calibrate_steps(x, 1e-5, 1.0, 0.01),
}


@pytest.mark.parametrize("name", ACCOUNTING)
def test_accounting_functions_refuse_tracers_by_name(name):
    for transform, x in ((jax.jit, 1.0), (jax.vmap, jnp.array([1.0, NAN]))):
        with pytest.raises(ValueError, match=f"{name} picks its grids .* cannot run under jit"):
            transform(ACCOUNTING[name])(x)
