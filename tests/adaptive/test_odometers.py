"""Privacy odometers (pldjax.adaptive.odometers): formulas against mpmath, validity by simulation of adaptive
randomized-response and Gaussian sequences, monotonicity, bad input, jit / vmap, exact save/restore.

Validity tests: a valid delta-odometer has P(exists n: L_{1:n} > U_n) <= delta. We simulate many
independent adaptive sequences and count the paths whose loss ever crosses the reading; the test
fails when that count is improbably high for a crossing probability of delta (binomial upper tail
below 1e-6), so a valid odometer fails it with probability below 1e-6 over the seed."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from compiled_programs import compiled_programs, programs_of_a_new_process
from scipy.special import ndtri
from scipy.stats import binom

import pldjax as pj

OD = pj.odometers


# -- independent references (mpmath) ---------------------------------------------------------------
def _log_inv(delta_prime):
    return mp.log(1 / mp.mpf(delta_prime))


def ref_filter(v, delta_prime, y):
    big_l, v, y = _log_inv(delta_prime), mp.mpf(v), mp.mpf(y)
    return mp.sqrt(2 * big_l * y) / 2 + mp.sqrt(2 * big_l) / (2 * mp.sqrt(y)) * v + v / 2


def ref_mixture(v, delta_prime, gamma):
    v, gamma = mp.mpf(v), mp.mpf(gamma)
    inner = mp.log(mp.sqrt((v + gamma) / gamma) / mp.mpf(delta_prime))
    return mp.sqrt(2 * inner * (gamma + v)) + v / 2


def ref_stitched(v, delta_prime, v0):
    v, v0 = mp.mpf(v), mp.mpf(v0)
    if v < v0:
        return mp.inf
    inner = mp.log(mp.log(2 * v / v0)) + mp.mpf("0.72") * mp.log(mp.mpf("5.2") / mp.mpf(delta_prime))
    return mp.mpf("1.7") * mp.sqrt(v * inner) + v / 2


def ref_rogers(v, delta_prime, n):
    v, n, dp = mp.mpf(v), mp.mpf(n), mp.mpf(delta_prime)
    if 1 / n**2 <= v <= 1:
        return mp.sqrt(2 * v * (mp.log(110 * mp.e) + 2 * mp.log(mp.log(n) / dp))) + v / 2
    return mp.sqrt(2 * (1 / n**2 + v) * (1 + mp.log(1 + n**2 * v) / 2)
                   * mp.log(mp.log(4 / dp * mp.log(n, 2)))) + v / 2


def ref_gdp_tail(mu, delta, slack):
    """log delta - log Phi(Phi^-1(delta - slack) - mu), Phi^-1 by bisection in mpmath."""
    target = mp.mpf(delta) - mp.mpf(slack)
    lo, hi = mp.mpf(-60), mp.mpf(60)
    for _ in range(300):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mp.ncdf(mid) < target else (lo, mid)
    return mp.log(mp.mpf(delta)) - mp.log(mp.ncdf(lo - mp.mpf(mu)))


def _run(od, epsilons, deltas=None):
    state = od.init()
    deltas = [0.0] * len(epsilons) if deltas is None else deltas
    readings = []
    for e, d in zip(epsilons, deltas, strict=True):
        state, ok = od.step(state, e, d)
        assert bool(ok)
        readings.append(float(od.bound(state)["epsilon"]))
    return state, readings


def _exact_variance(epsilons):
    return mp.fsum(mp.mpf(e) ** 2 for e in epsilons)


FAMILIES = {
    "filter": (lambda d, dq=None: OD.filter_odometer(d, y_star=0.7, delta_queries=dq),
               lambda v, dp: ref_filter(v, dp, 0.7)),
    "mixture": (lambda d, dq=None: OD.mixture_odometer(d, gamma=0.05, delta_queries=dq),
                lambda v, dp: ref_mixture(v, dp, 0.05)),
    "stitched": (lambda d, dq=None: OD.stitched_odometer(d, v0=0.02, delta_queries=dq),
                 lambda v, dp: ref_stitched(v, dp, 0.02)),
    "rogers": (lambda d, dq=None: OD.rogers_odometer(d, dataset_size=1000, delta_queries=dq),
               lambda v, dp: ref_rogers(v, dp, 1000)),
}


# -- formulas ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_readings_match_mpmath_and_lie_above(name):
    make, ref = FAMILIES[name]
    od = make(2e-6)  # delta' = delta'' = 1e-6
    rng = np.random.default_rng(1)
    # spans V from 1e-6 (below Rogers' 1/n^2 window) to ~30 (above it)
    epsilons = list(np.concatenate([[1e-3], rng.uniform(0.0, 0.3, 10), rng.uniform(0.5, 3.0, 6)]))
    _, readings = _run(od, epsilons)
    for n, reading in enumerate(readings, 1):
        exact = ref(_exact_variance(epsilons[:n]), 1e-6)
        if exact == mp.inf:
            assert reading == math.inf
            continue
        assert reading >= exact, (n, reading, exact)
        assert reading <= exact * (1 + 1e-11), (n, reading, exact)


def test_filter_odometer_convention_reads_epsilon_at_y_star():
    """'+ 2 eps' convention: y* solves sqrt(2 L y) + y / 2 = eps; the reading at V = y* is eps."""
    eps, dp = 1.0, 1e-6
    od = OD.filter_odometer(2 * dp, epsilon=eps)
    big_l = _log_inv(dp)
    y_exact = (mp.sqrt(2 * big_l + 2 * eps) - mp.sqrt(2 * big_l)) ** 2
    y = od.params["y_star"]
    assert y <= y_exact and y >= y_exact * (1 - 1e-14)
    state, ok = od.step(od.init(), math.sqrt(y))
    assert float(od.bound(state)["epsilon"]) == pytest.approx(eps, rel=1e-12)
    # same tuning point as the (epsilon, delta) filter with the same delta'
    f = pj.filters.approx_dp_filter(eps, 2 * dp)
    assert float(f.remaining(f.init())["epsilon_squared"]) == y


def test_filter_odometer_touches_the_pointwise_bound_at_y_star():
    dp, y = 1e-6, 0.7
    od = OD.filter_odometer(2 * dp, y_star=y)
    for v in (0.1, 0.5, 0.7, 1.0, 3.0):
        state, _ = od.step(od.init(), math.sqrt(v))
        reading = float(od.bound(state)["epsilon"])
        pointwise = float(OD.pointwise_epsilon(v, dp))
        assert reading >= pointwise * (1 - 1e-12)
        if v == y:
            assert reading == pytest.approx(pointwise, rel=3e-12)


def test_ladder_epsilons_match_mpmath_and_lie_above():
    od = OD.gdp_ladder_odometer(0.05, delta=1e-6, growth=2.0, rungs=12)
    delta_k, slack = 1e-6 / 12, od.guarantee["slack"]
    assert slack == pytest.approx(delta_k * 1e-3)
    for mu, eps in zip(od.guarantee["mu"], od.guarantee["epsilon"], strict=True):
        exact = ref_gdp_tail(mu, delta_k, slack)
        assert eps >= exact and eps <= exact * (1 + 2e-9) + 2e-12, (mu, eps, exact)


def test_gdp_tail_bounds_the_gaussian_loss_tail():
    """For the Gaussian pair itself L ~ N(mu^2/2, mu^2): P(L > eps) <= delta, nearly tight."""
    for mu in (0.1, 1.0, 5.0, 40.0):
        for delta in (1e-2, 1e-6, 1e-12):
            t = float(OD.gdp_tail_epsilon(mu, delta))
            tail = mp.ncdf(-(mp.mpf(t) - mp.mpf(mu) ** 2 / 2) / mu)
            assert tail <= delta
            assert tail >= delta / 20  # the bound covers every GDP pair, not just this one


def test_gdp_tail_names_bad_arguments_and_reads_a_number_as_a_float():
    assert isinstance(OD.gdp_tail_epsilon(1.0, 1e-6), float)
    assert OD.gdp_tail_epsilon([1.0, 2.0], 1e-6).shape == (2,)
    for args, name in (((-1.0, 1e-6), "mu"), ((1.0, 2.0), "delta"), ((1.0, float("nan")), "delta"),
                       ((1.0, 1e-6, -1e-9), "slack")):
        with pytest.raises(ValueError, match=name):
            OD.gdp_tail_epsilon(*args)


def test_reading_is_inf_once_the_deltas_exceed_delta_queries():
    od = OD.mixture_odometer(2.0**-16, gamma=0.1, delta_queries=2.0**-18)
    state = od.init()
    for _ in range(4):
        state, _ = od.step(state, 0.1, 2.0**-20)
    assert np.isfinite(od.bound(state)["epsilon"])  # delta'' spent exactly: still finite
    state, _ = od.step(state, 0.1, 2.0**-40)
    assert od.bound(state)["epsilon"] == np.inf
    state, _ = od.step(state, 0.0, 0.0)
    assert od.bound(state)["epsilon"] == np.inf  # and stays so


def test_extreme_valid_steps_give_sound_readings():
    for name in sorted(FAMILIES):
        od = FAMILIES[name][0](1e-6)
        state, ok = od.step(od.init(), 1e-200)  # its square underflows: still charged > 0
        assert bool(ok) and float(od.bound(state)["epsilon"]) > 0
        assert np.asarray(state.variance).view(np.float64)[0] > 0  # packed bits of V_n
        state, ok = od.step(state, 1e200)  # square overflows: V = inf, reading inf
        assert bool(ok) and od.bound(state)["epsilon"] == np.inf
    tiny = OD.mixture_odometer(1e-300, gamma=1e-300)
    state, _ = tiny.step(tiny.init(), 1.0, 0.0)
    assert np.isfinite(tiny.bound(state)["epsilon"])


def test_infinite_epsilon_is_valid_and_reads_inf():
    for name in sorted(FAMILIES):
        od = FAMILIES[name][0](1e-6)
        state, ok = od.step(od.init(), math.inf)
        assert bool(ok) and od.bound(state)["epsilon"] == np.inf
    lad = OD.gdp_ladder_odometer(0.1, delta=1e-6)
    state, ok = lad.step(lad.init(), math.inf)
    assert bool(ok) and lad.bound(state)["epsilon"] == np.inf and lad.bound(state)["mu"] == np.inf


def test_ladder_reads_the_lowest_rung_that_holds_the_gdp_composition():
    od = OD.gdp_ladder_odometer(0.1, delta=1e-6, growth=2.0, rungs=8)
    mus = od.guarantee["mu"]
    state = od.init()
    total = 0.0
    for nu in (0.05, 0.2, 0.0, 0.3, 0.5):
        state, ok = od.step(state, nu)
        total += nu * nu
        k = int(np.argmax(mus * mus >= total))
        assert float(od.bound(state)["mu"]) == mus[k]
        assert float(od.bound(state)["epsilon"]) == od.guarantee["epsilon"][k]
    state, _ = od.step(state, 100.0)  # beyond the top rung (12.8)
    assert od.bound(state)["mu"] == np.inf


def test_ladder_takes_pld_queries():
    od = OD.gdp_ladder_odometer(0.25, delta=1e-6, growth=2.0, rungs=6)
    state, ok = od.step(od.init(), pj.gdp(0.6))  # a PLD: nu = gdp_mu, an upper bound on 0.6
    assert bool(ok) and float(od.bound(state)["mu"]) == 1.0
    with pytest.raises(ValueError, match="pessimistic"):
        od.step(state, pj.gdp(0.6, pessimistic=False))


def test_ladder_residue_rungs_are_the_residue_filters_they_claim():
    od = OD.gdp_ladder_odometer(0.1, delta=1e-6, growth=2.0, rungs=5, residue=True)
    state = od.init()
    slack = od.guarantee["slack"]
    for k, mu in enumerate(od.guarantee["mu"]):
        ref = pj.filters.gdp_residue_filter(float(mu), delta=slack).init()
        mine = jax.tree_util.tree_map(lambda leaf, k=k: leaf[k], state.rungs)
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(mine),
                                                         jax.tree_util.tree_leaves(ref),
                                                         strict=True))
    gdp = OD.gdp_ladder_odometer(0.1, delta=1e-6, growth=2.0, rungs=5)
    s_res, s_gdp = state, gdp.init()
    for nu in (0.05, 0.15, 0.3, 0.1):  # number queries: the residue update is the GDP update
        s_res, _ = od.step(s_res, nu)
        s_gdp, _ = gdp.step(s_gdp, nu)
        assert od.bound(s_res) == gdp.bound(s_gdp)


# -- validity by simulation ------------------------------------------------------------------------
def _batched_init(od, paths):
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (paths, *x.shape)), od.init())


def _crossing_rate(od, paths, steps, seed, low, high, *, gaussian=False):
    """The fraction of ``paths`` adaptive sequences whose loss ever crosses the reading. The
    analyst takes the larger step ``high`` while the loss is above 0, else ``low`` (pushing when
    ahead). Randomized response RR(eps) (default): the loss under x moves by +eps with probability
    e^eps / (1 + e^eps), else by -eps; it is (eps, 0)-pDP, and 2 Phi^-1(e^eps / (1 + e^eps))-GDP for
    the ladder. ``gaussian``: nu-GDP Gaussian steps (ladder only), loss increment N(nu^2/2, nu^2)."""
    rng = np.random.default_rng(seed)
    ladder = od.kind == "gdp_ladder_odometer"
    state = _batched_init(od, paths)
    step = jax.jit(jax.vmap(od.step))
    loss = np.zeros(paths)
    crossed = np.zeros(paths, bool)
    for _ in range(steps):
        cost = np.where(loss > 0, high, low)
        if gaussian:
            state, ok = step(state, cost)
            loss += cost * rng.standard_normal(paths) + cost * cost / 2
        else:
            if ladder:
                state, ok = step(state, 2 * ndtri(1 / (1 + np.exp(-cost))))
            else:
                state, ok = step(state, cost, np.zeros(paths))
            up = rng.random(paths) < 1 / (1 + np.exp(-cost))
            loss += np.where(up, cost, -cost)
        assert bool(np.all(ok))
        crossed |= loss > np.asarray(od.bound(state)["epsilon"])
    return crossed.mean()


def _assert_not_above(rate, paths, delta):
    count = round(rate * paths)
    assert binom.sf(count - 1, paths, delta) >= 1e-6, (rate, delta)


# observed crossing rates at delta = 0.3, 2000 paths, 40 steps (seed 0): filter 0.17, mixture
# 0.04, stitched and Rogers 0.002, ladder on Gaussian steps 0.07 (RR steps: 0)
SIM_FAMILIES = {
    "filter": lambda d: OD.filter_odometer(d, y_star=2.0, delta_queries=0.0),
    "mixture": lambda d: OD.mixture_odometer(d, gamma=0.5, delta_queries=0.0),
    "stitched": lambda d: OD.stitched_odometer(d, v0=0.05, delta_queries=0.0),
    "rogers": lambda d: OD.rogers_odometer(min(d, 0.35), dataset_size=10, delta_queries=0.0),
    "ladder": lambda d: OD.gdp_ladder_odometer(0.5, delta=d, growth=2.0, rungs=4),
}


@pytest.mark.parametrize("name", sorted(SIM_FAMILIES))
def test_loss_rarely_crosses_the_reading(name):
    delta, paths = 0.3, 2000
    od = SIM_FAMILIES[name](delta)
    rate = _crossing_rate(od, paths, 40, 0, 0.1, 0.4, gaussian=name == "ladder")
    _assert_not_above(rate, paths, od.guarantee["delta"])


@pytest.mark.slow
@pytest.mark.parametrize("name", [*sorted(SIM_FAMILIES), "ladder-rr"])
@pytest.mark.parametrize("delta", [0.3, 0.05])
def test_loss_rarely_crosses_the_reading_many_paths(name, delta):
    paths = 100_000
    od = SIM_FAMILIES[name.removesuffix("-rr")](delta)
    rate = _crossing_rate(od, paths, 200, 1, 0.05, 0.5, gaussian=name == "ladder")
    _assert_not_above(rate, paths, od.guarantee["delta"])


@pytest.mark.slow
def test_gaussian_ladder_with_many_rungs_rarely_crosses():
    paths, delta = 100_000, 0.05
    od = OD.gdp_ladder_odometer(0.1, delta=delta, growth=2.0 ** 0.5, rungs=16)
    rate = _crossing_rate(od, paths, 100, 2, 0.1, 0.4, gaussian=True)
    _assert_not_above(rate, paths, delta)


# -- monotonicity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_reading_decreases_with_delta_prime(name):
    make = FAMILIES[name][0]
    epsilons = list(np.random.default_rng(3).uniform(0, 0.5, 12))
    previous = None
    for delta_prime in (1e-9, 1e-6, 1e-3, 0.1, 0.3):
        _, readings = _run(make(2 * delta_prime, delta_prime), epsilons)
        if previous is not None:
            assert all(r <= p for r, p in zip(readings, previous, strict=True))
        previous = readings


def test_ladder_reading_decreases_with_delta():
    nus = list(np.random.default_rng(4).uniform(0, 0.5, 12))
    previous = None
    for delta in (1e-9, 1e-6, 1e-3, 0.1, 0.5):
        od = OD.gdp_ladder_odometer(0.1, delta=delta)
        state, readings = od.init(), []
        for nu in nus:
            state, _ = od.step(state, nu)
            readings.append(float(od.bound(state)["epsilon"]))
        if previous is not None:
            assert all(r <= p for r, p in zip(readings, previous, strict=True))
        previous = readings


@pytest.mark.parametrize("name", [*sorted(FAMILIES), "ladder"])
def test_reading_increases_with_each_epsilon(name):
    rng = np.random.default_rng(5)
    # Rogers et al.'s printed formula drops at V = 1 (see below): keep V_n below 1 for it
    top = 0.2 if name == "rogers" else 0.4
    base = list(rng.uniform(0, top, 10))
    if name == "ladder":
        od = OD.gdp_ladder_odometer(0.1, delta=1e-6)

        def readings_of(costs):
            state, out = od.init(), []
            for c in costs:
                state, _ = od.step(state, c)
                out.append(float(od.bound(state)["epsilon"]))
            return out
    else:
        od = FAMILIES[name][0](2e-6)

        def readings_of(costs):
            return _run(od, costs)[1]
    reference = readings_of(base)
    for i in range(len(base)):
        bumped = list(base)
        bumped[i] += float(rng.uniform(0.01, top / 2))
        assert all(b >= r for b, r in zip(readings_of(bumped), reference, strict=True))


def test_rogers_formula_as_printed_drops_at_v_equal_1():
    od = OD.rogers_odometer(1e-6, dataset_size=10_000)
    below = _run(od, [1.0 - 1e-6])[1][0]  # V_n just below 1: the middle case
    above = _run(od, [1.0 + 1e-6])[1][0]
    assert below == pytest.approx(float(ref_rogers((1 - 1e-6) ** 2, 5e-7, 10_000)), rel=1e-11)
    assert above < below


# -- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda: OD.mixture_odometer(math.nan, gamma=1.0), "delta"),
    (lambda: OD.mixture_odometer(0.0, gamma=1.0), "delta"),
    (lambda: OD.mixture_odometer(1.0, gamma=1.0), "delta"),
    (lambda: OD.mixture_odometer(1e-6, gamma=-1.0), "gamma"),
    (lambda: OD.mixture_odometer(1e-6, gamma=1.0, delta_queries=1e-6), "delta_queries"),
    (lambda: OD.filter_odometer(1e-6), "exactly one"),
    (lambda: OD.filter_odometer(1e-6, epsilon=1.0, y_star=1.0), "exactly one"),
    (lambda: OD.filter_odometer(1e-6, epsilon=math.nan), "epsilon"),
    (lambda: OD.filter_odometer(1e-6, y_star=0.0), "y_star"),
    (lambda: OD.stitched_odometer(1e-6, v0=math.inf), "v0"),
    (lambda: OD.rogers_odometer(0.9, dataset_size=100), "1/e"),
    (lambda: OD.rogers_odometer(1e-6, dataset_size=1), "dataset_size"),
    (lambda: OD.rogers_odometer(1e-6, dataset_size=2.5), "dataset_size"),
    (lambda: OD.rogers_odometer(1e-6, dataset_size=10**200), "dataset_size"),
    (lambda: OD.filter_odometer(1e-6, epsilon=1e-300), "too small"),
    (lambda: OD.gdp_ladder_odometer(0.0, delta=1e-6), "mu0"),
    (lambda: OD.gdp_ladder_odometer(0.1, delta=2.0), "delta"),
    (lambda: OD.gdp_ladder_odometer(0.1, delta=1e-6, growth=1.0), "growth"),
    (lambda: OD.gdp_ladder_odometer(0.1, delta=1e-6, rungs=0), "rungs"),
    (lambda: OD.gdp_ladder_odometer(0.1, delta=1e-6, rungs=10**6), "rungs"),
    (lambda: OD.gdp_ladder_odometer(1e100, delta=1e-6, growth=10.0, rungs=300), "overflows"),
    (lambda: OD.gdp_ladder_odometer(0.1, delta=1e-6, rungs=10, slack=1e-7), "slack"),
    (lambda: OD.gdp_ladder_odometer(0.1, delta=1e-6, residue="yes"), "residue"),
])
def test_bad_parameters_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("args, match", [
    ((math.nan, 0.0), "epsilon"), ((-0.1, 0.0), "epsilon"), ((0.1, math.nan), "delta"),
    ((0.1, -1e-9), "delta"), ((0.1, 1.5), "delta"), ((np.array([0.1, math.nan]), 0.0), "epsilon"),
    ((np.array([0.1, 0.2]), 0.0), "state's shape"), ((0.1, np.array([0.0, 1e-9])), "state's shape"),
])
def test_bad_steps_raise_on_the_host_and_leave_the_state(args, match):
    od = OD.mixture_odometer(1e-6, gamma=0.1)
    state, _ = od.step(od.init(), 0.2)
    before = jax.tree_util.tree_map(np.array, state)
    with pytest.raises(ValueError, match=match):
        od.step(state, *args)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(state),
                                                     jax.tree_util.tree_leaves(before),
                                                     strict=True))


def test_pld_step_to_a_pdp_odometer_is_refused():
    od = OD.stitched_odometer(1e-6, v0=0.1)
    with pytest.raises(ValueError, match="epsilon must be a number"):
        od.step(od.init(), pj.gdp(1.0))


@pytest.mark.parametrize("bad", [math.nan, -0.5])
def test_bad_ladder_queries_raise(bad):
    od = OD.gdp_ladder_odometer(0.1, delta=1e-6)
    with pytest.raises(ValueError, match="query"):
        od.step(od.init(), bad)


@pytest.mark.parametrize("epsilon, delta", [(math.nan, 0.0), (-1.0, 0.0), (0.1, 2.0),
                                            (0.1, math.nan)])
def test_bad_steps_under_jit_are_refused_without_change(epsilon, delta):
    od = OD.filter_odometer(1e-6, epsilon=1.0)
    state, _ = od.step(od.init(), 0.3)
    new, ok = jax.jit(od.step)(state, epsilon, delta)
    assert not bool(ok)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(new),
                                                     jax.tree_util.tree_leaves(state),
                                                     strict=True))


@pytest.mark.parametrize("name", [*sorted(FAMILIES), "ladder", "residue ladder"])
@pytest.mark.parametrize("cost", [0.5j, 0.5 + 5j, 0.5 + 0j])
def test_complex_steps_raise_on_the_host_and_are_refused_under_jit(name, cost):
    """Under jit a complex epsilon_n or delta_n had its imaginary part dropped (and a complex
    ladder query killed every rung while reporting ok)."""
    if name.endswith("ladder"):
        od = OD.gdp_ladder_odometer(0.1, delta=1e-6, rungs=4, residue=name == "residue ladder")
        steps = [(cost,)]
    else:
        od = FAMILIES[name][0](2e-6)
        steps = [(cost, 0.0), (0.1, cost * 1e-7)]
    state, _ = od.step(od.init(), 0.05)
    for args in steps:
        with pytest.raises(ValueError, match="must be a real number"):
            od.step(state, *args)
        new, ok = jax.jit(od.step)(state, *(jnp.asarray(a) for a in args))
        assert not bool(ok)
        assert _same(new, state)


@pytest.mark.parametrize("bad", [math.nan, -0.5])
def test_bad_ladder_queries_under_jit_are_refused_without_change(bad):
    od = OD.gdp_ladder_odometer(0.1, delta=1e-6)
    state, _ = od.step(od.init(), 0.3)
    new, ok = jax.jit(od.step)(state, bad)
    assert not bool(ok)
    assert od.bound(new) == od.bound(state)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(new),
                                                     jax.tree_util.tree_leaves(state),
                                                     strict=True))


# -- jit, vmap, x64, save / restore ------------------------------------------------------------------
def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                    jax.tree_util.tree_leaves(b), strict=True))


@pytest.mark.parametrize("name", [*sorted(FAMILIES), "ladder"])
def test_jit_and_vmap_agree_with_the_host(name):
    if name == "ladder":
        od = OD.gdp_ladder_odometer(0.1, delta=1e-6)
        args = [(0.3,), (0.1,), (0.7,)]
    else:
        od = FAMILIES[name][0](2e-6)
        args = [(0.3, 1e-7), (0.1, 0.0), (0.7, 2e-7)]
    host, jitted = od.init(), od.init()
    step = jax.jit(od.step)
    for a in args:
        host, _ = od.step(host, *a)
        jitted, _ = step(jitted, *(jnp.asarray(v, jnp.float64) for v in a))
    assert _same(host, jitted)
    # the reading: on the host in NumPy, under jit in the trace, the same values
    assert jax.jit(od.bound)(host) == pytest.approx(od.bound(host), rel=1e-15)
    # vmap: three independent odometers, each given its own sequence
    columns = [jnp.asarray(np.array(col, np.float64)) for col in zip(*args, strict=True)]
    batched = _batched_init(od, 3)
    batched, ok = jax.vmap(od.step)(batched, *columns)
    assert bool(np.all(ok))
    readings = od.bound(batched)
    for i, a in enumerate(args):
        single, _ = od.step(od.init(), *a)
        assert _same(jax.tree_util.tree_map(lambda leaf, i=i: leaf[i], batched), single)
        assert {k: v[i] for k, v in readings.items()} == od.bound(single)


def _save_restore_round_trip(tmp_path, name, suffix):
    od = (OD.gdp_ladder_odometer(0.1, delta=1e-6) if name == "ladder"
          else OD.mixture_odometer(1e-6, gamma=0.1))
    state = od.init()
    for e in (0.1, 0.3, 1.0 / 3.0):
        state, _ = od.step(state, e)
    path = tmp_path / f"state{suffix}"
    pj.io.save_odometer_state(path, od, state)
    restored = pj.io.load_odometer_state(path, od)
    assert _same(restored, state)
    assert od.bound(restored) == od.bound(state)
    with pytest.raises(ValueError, match="saved for"):
        pj.io.load_odometer_state(path, OD.stitched_odometer(1e-6, v0=0.1))
    return od.bound(restored)


@pytest.mark.parametrize("name", ["mixture", "ladder"])
@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_save_restore_is_exact(tmp_path, name, suffix):
    _save_restore_round_trip(tmp_path, name, suffix)


@pytest.mark.parametrize("name", ["mixture", "ladder"])
@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_save_restore_is_exact_with_x64_off(x64_off, tmp_path, name, suffix):
    off = _save_restore_round_trip(tmp_path, name, suffix)
    jax.config.update("jax_enable_x64", True)
    assert off == _save_restore_round_trip(tmp_path / "on", name, suffix)


LADDERS = {
    "gdp": lambda: OD.gdp_ladder_odometer(0.05, delta=1e-6, growth=2.0, rungs=4),
    "residue": lambda: OD.gdp_ladder_odometer(0.05, delta=1e-6, growth=2.0, rungs=4,
                                              residue=True),
}


@pytest.mark.parametrize("name", sorted(LADDERS))
@pytest.mark.parametrize("steps", [[math.inf], [0.06, 0.02], [0.06, 100.0, 0.01]])
def test_restore_refuses_ladder_alive_flags_set_back(tmp_path, name, steps):
    """A ladder whose rungs died (every rung after an infinite cost: the true reading is +inf)
    saved with its alive flags set back to True read mu = 0.05: the flags must match the rungs'
    budgets."""
    od = LADDERS[name]()
    state = od.init()
    for nu in steps:
        state, ok = od.step(state, nu)
        assert bool(ok)
    assert not bool(np.all(state.alive))
    truth = od.bound(state)
    path = tmp_path / "state.json"
    pj.io.save_odometer_state(path, od, state)  # the state as produced loads, and reads the same
    assert od.bound(pj.io.load_odometer_state(path, od)) == truth
    pj.io.save_odometer_state(path, od, state._replace(alive=jnp.ones_like(state.alive)))
    with pytest.raises(ValueError, match="no sequence of steps.*rung 0"):
        pj.io.load_odometer_state(path, od)


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_reachable_ladder_states_pass_the_state_check(name):
    """Number and PLD steps, rungs dying one by one, refused steps: every state reached is one the
    restore check accepts."""
    od = LADDERS[name]()
    state = od.init()
    assert od.state_problem(state) is None
    for query in (0.03, pj.gdp(0.05), 0.0, 0.08, 1.0, 0.01, math.inf, 0.01):
        state, ok = od.step(state, query)
        assert bool(ok) and od.state_problem(state) is None


@pytest.mark.parametrize("variance, delta_spent, match", [
    (-0.01, 0.0, "epsilon_n\\^2.*negative"), (math.nan, 0.0, "epsilon_n\\^2.*NaN"),
    (0.1, -1e-7, "delta_n.*negative"), (0.1, math.nan, "delta_n.*NaN")])
def test_restore_refuses_a_negative_or_nan_sum(tmp_path, variance, delta_spent, match):
    """A filter odometer saved with V_n = -0.01 read epsilon = -0.005; NaN sums are no better."""
    from pldjax.adaptive.odometers import VarianceState
    from pldjax.core.precision import pack

    od = OD.filter_odometer(1e-6, y_star=0.01)
    with jax.enable_x64(True):
        edited = pack(VarianceState(jnp.float64(variance), jnp.float64(delta_spent)))
    path = tmp_path / "state.npz"
    pj.io.save_odometer_state(path, od, edited)
    with pytest.raises(ValueError, match=match):
        pj.io.load_odometer_state(path, od)
    state, _ = od.step(od.init(), math.inf)  # +inf sums are reachable
    pj.io.save_odometer_state(path, od, state)
    assert od.bound(pj.io.load_odometer_state(path, od))["epsilon"] == math.inf


@pytest.mark.parametrize("name", ["mixture", "gdp", "residue"])
@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_batched_states_restore_exactly(tmp_path, name, suffix):
    if name == "mixture":
        od = OD.mixture_odometer(1e-6, gamma=0.1)
        args = (jnp.asarray([[0.1, 0.2, 0.3], [0.4, 0.5, math.inf]]), jnp.zeros((2, 3)))
    else:
        od = LADDERS[name]()
        args = (jnp.asarray([[0.01, 0.06, 0.2], [0.3, 0.0, math.inf]]),)
    state = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (2, 3, *x.shape)), od.init())
    state, ok = jax.vmap(jax.vmap(od.step))(state, *args)
    assert bool(np.all(ok))
    path = tmp_path / f"state{suffix}"
    pj.io.save_odometer_state(path, od, state)
    restored = pj.io.load_odometer_state(path, od)
    assert _same(restored, state)
    for key, value in od.bound(restored).items():
        assert np.array_equal(value, od.bound(state)[key])
    # one element edited (all rungs set back alive, or V_n < 0) is refused
    if name == "mixture":
        from pldjax.core.precision import pack

        with jax.enable_x64(True):
            edited = state._replace(variance=state.variance.at[1, 2].set(pack(jnp.float64(-1.0))))
    else:
        edited = state._replace(alive=state.alive.at[1, 2].set(True))
    pj.io.save_odometer_state(path, od, edited)
    with pytest.raises(ValueError, match="negative|rung 0 .*batch element \\(1, 2\\)"):
        pj.io.load_odometer_state(path, od)


def test_restore_refuses_leaves_of_different_batch_shapes(tmp_path):
    od = OD.gdp_ladder_odometer(0.05, delta=1e-6, rungs=4)
    state = od.init()
    edited = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (2, *x.shape)), state)
    edited = edited._replace(alive=jnp.broadcast_to(state.alive, (3, 4)))
    path = tmp_path / "state.npz"
    pj.io.save_odometer_state(path, od, edited)
    with pytest.raises(ValueError, match="batch shapes"):
        pj.io.load_odometer_state(path, od)


def test_readings_do_not_depend_on_the_x64_flag():
    od = OD.stitched_odometer(1e-6, v0=0.01)
    epsilons = [0.1, 1.0 / 3.0, 0.2]
    on, _ = _run(od, epsilons)
    jax.config.update("jax_enable_x64", False)
    try:
        off, _ = _run(od, epsilons)
        jitted = od.init()
        for e in epsilons:  # a caller's jit rounds the floats to float32: charged upward
            jitted, _ = jax.jit(od.step)(jitted, e, 0.0)
        assert od.bound(jitted)["epsilon"] >= od.bound(on)["epsilon"]
    finally:
        jax.config.update("jax_enable_x64", True)
    assert _same(on, off)


@pytest.mark.slow
def test_residue_ladder_is_never_above_the_gdp_ladder_on_pld_steps():
    """Randomized-response PLD steps: the residue rungs (GDP residue filters) keep every rung alive
    at least as long as the GDP rungs (the residue update is never below the naive one)."""
    common = {"delta": 1e-6, "growth": 2.0, "rungs": 4}
    residue = OD.gdp_ladder_odometer(0.5, residue=True, **common)
    plain = OD.gdp_ladder_odometer(0.5, **common)
    s_res, s_plain = residue.init(), plain.init()
    query = pj.randomized_response(0.5)
    for _ in range(8):
        s_res, ok_res = residue.step(s_res, query)
        s_plain, ok_plain = plain.step(s_plain, query)
        assert bool(ok_res) and bool(ok_plain)
        assert float(residue.bound(s_res)["mu"]) <= float(plain.bound(s_plain)["mu"])


def test_a_new_odometer_of_a_family_compiles_nothing():
    # its parameters only shape the reading on the host: every variance odometer shares one step
    first = OD.filter_odometer(1e-6, epsilon=1.0)
    first.step(first.init(), 0.1)
    for other in (OD.filter_odometer(1e-5, epsilon=2.0), OD.mixture_odometer(1e-6, gamma=0.5),
                  OD.stitched_odometer(1e-6, v0=0.01)):
        (state, ok), names = compiled_programs(lambda o=other: o.step(o.init(), 0.1))
        assert names == [] and bool(ok)


def test_first_steps_readings_and_restores_compile_only_the_steps_kernel(tmp_path):
    # an odometer's glue (its state, its checks, its readings, a restore) runs in NumPy: a new
    # process compiles the variance odometers' one step program and nothing else
    names, printed = programs_of_a_new_process(f"""
        import json
        import pldjax as pj
        od = pj.odometers.mixture_odometer(1e-6, gamma=0.1)
        state, ok = od.step(od.init(), 0.3, 1e-8)
        lad = pj.odometers.gdp_ladder_odometer(0.05, delta=1e-6)
        rungs, ok_pld = lad.step(lad.init(), pj.gaussian(2.0, sampling_prob=0.01))
        rungs, ok_nu = lad.step(rungs, 0.2)
        pj.io.save_odometer_state({str(tmp_path / "lad.npz")!r}, lad, rungs)
        back = pj.io.load_odometer_state({str(tmp_path / "lad.npz")!r}, lad)
        print(json.dumps([bool(ok), bool(ok_pld), bool(ok_nu), float(od.bound(state)["epsilon"]),
                          {{k: float(v) for k, v in lad.bound(back).items()}}]))
    """, cache=tmp_path / "xla")  # empty: every program compiles
    assert names == ["jit(option_probe)", "jit(guarded)"]
    od = OD.mixture_odometer(1e-6, gamma=0.1)
    state, _ = od.step(od.init(), 0.3, 1e-8)
    lad = OD.gdp_ladder_odometer(0.05, delta=1e-6)
    rungs, _ = lad.step(lad.init(), pj.gaussian(2.0, sampling_prob=0.01))
    rungs, _ = lad.step(rungs, 0.2)
    expected = [True, True, True, float(od.bound(state)["epsilon"]),
                {k: float(v) for k, v in lad.bound(rungs).items()}]
    assert json.loads(printed.splitlines()[-1]) == expected

