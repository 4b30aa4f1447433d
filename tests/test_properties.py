"""Property-based tests (hypothesis) of the public API over the whole range of its arguments.

Every public constructor and evaluator is called with arguments drawn log-uniformly over their
valid range (1e-300 to 1e300 where the type allows, plus the boundary values 0, 1, inf where
valid), and must give a sound value or a ValueError naming the argument:

- never NaN; delta in [0, 1]; epsilon >= 0 (inf allowed);
- sound brackets against closed forms computed here in mpmath, independently of pldjax: Gaussian /
  GDP (composition of G_mu T times is G_{mu sqrt T}), randomized response (binomial composition),
  single-shot Laplace, Poisson subsampling (q = 1 is the base mechanism): pessimistic >= truth
  and optimistic <= truth, up to ALLOWANCE;
- monotonicity: delta non-increasing in eps, epsilon non-increasing in delta; DP-SGD epsilon
  non-decreasing in steps and q and non-increasing in sigma (up to the grid gap, see there);
- the same value alone and inside a batch;
- filters never let the true cost of the accepted queries exceed the budget, never hold NaN,
  and leave the state untouched when they refuse;
- calibration never returns NaN and never hangs.

Each property runs over two ranges: "ordinary" (where pldjax was already checked to hold) and
"whole" (1e-300 .. 1e300).

How to run:
  fast profile (default run, derandomized, a few examples each, well under a minute):
      pytest tests/test_properties.py -n 0
  long profile (the slow tests, random, many examples):
      pytest tests/test_properties.py -m slow -n 0
  The long profile runs 25 examples a test; PLDJAX_HYPOTHESIS_EXAMPLES=1000 runs more.
The two hypothesis profiles ("pldjax-fast", "pldjax-slow") are registered in conftest.py.

Shapes are kept few (scalars and batches of a fixed size BATCH) because JAX compiles one kernel
per shape: the automatic grids are powers of two, so only a handful of sizes ever occur.
"""

from __future__ import annotations

import math
import signal
from contextlib import contextmanager

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pldjax as pj

#: Round-off allowance of a bracket check: |value - truth| beyond the sound side may reach
#: ROUNDOFF (1e-14, the library's documented floating-point slack on curves) plus a relative 1e-9
#: (float64 evaluation of exp/log of the references and of the grid sums).
ABS_TOL = 1e-14
REL_TOL = 1e-9
BATCH = 4
TINY, HUGE = 1e-300, 1e300

FAST_EXAMPLES = 4


def variants(*, heavy: bool = False, default_run: bool = True):
    """Parametrize a test over (profile, range): the fast profile in the default run, the long
    one with the slow tests; the ordinary range, and the whole range. ``heavy`` tests (many
    compiled shapes) run the whole range with the slow tests only, and fewer examples in the fast
    profile. Without ``default_run`` (a property whose code the default run checks elsewhere)
    every variant runs with the slow tests."""
    slow = [pytest.mark.slow]
    return pytest.mark.parametrize("profile, whole", [
        pytest.param("fast", False, id="fast-ordinary", marks=[] if default_run else slow),
        pytest.param("fast", True, id="fast-whole", marks=slow if heavy or not default_run else []),
        pytest.param("slow", False, id="slow-ordinary", marks=slow),
        pytest.param("slow", True, id="slow-whole", marks=slow),
    ])


def check(profile: str, prop, *, fast: int = FAST_EXAMPLES, **strategies) -> None:
    """Run ``prop`` as a hypothesis test under the named profile (``fast`` examples in the fast
    one: its heavy tests take fewer)."""
    chosen = settings.get_profile(f"pldjax-{profile}")
    if profile == "fast":
        chosen = settings(chosen, max_examples=fast)
    settings(chosen)(given(**strategies)(prop))()


# -- strategies -----------------------------------------------------------------------------------
def log_uniform(lo: float, hi: float, *extra: float) -> st.SearchStrategy[float]:
    """log-uniform in [lo, hi], the end points (and ``extra`` values) drawn first."""
    a, b = math.log10(lo), math.log10(hi)
    return st.one_of(
        st.sampled_from([lo, hi, *extra]),
        st.floats(a, b).map(lambda e: min(max(10.0**e, lo), hi)),
    )


def positive(whole: bool, lo: float, hi: float, *extra: float):
    """A parameter in (0, inf): the whole range 1e-300 .. 1e300, or the ordinary [lo, hi]."""
    return log_uniform(TINY, HUGE, lo, hi, *extra) if whole else log_uniform(lo, hi, *extra)


def non_negative(whole: bool, lo: float, hi: float):
    return st.one_of(st.just(0.0), positive(whole, lo, hi))


def probability(whole: bool, lo: float = 1e-6):
    """A value in [0, 1] (delta, q, alpha): 0, 1 and log-uniform in [1e-300 or lo, 1]."""
    return st.one_of(st.sampled_from([0.0, 1.0]), log_uniform(TINY if whole else lo, 1.0))


def count(whole: bool, hi: int = 10**4):
    """A whole number >= 1, log-uniform up to 1e18 (whole) or ``hi``."""
    top = 18 if whole else math.log10(hi)
    return st.one_of(st.sampled_from([1, 2]), st.floats(0, top).map(lambda e: max(1, int(10**e))))


def epsilons(whole: bool):
    return st.one_of(st.sampled_from([0.0, math.inf]), positive(whole, 1e-3, 50.0))


# -- references (mpmath, independent of pldjax) ---------------------------------------------------
def _log_phi(x):
    """log Phi(x) in mpmath, also far in the tails (asymptotic series beyond |x| = 1e8)."""
    if x > 1e8:
        return mp.mpf(0)
    if x < -1e8:
        return -x * x / 2 - mp.log(-x) - mp.log(2 * mp.pi) / 2 + mp.log1p(-1 / x**2 + 3 / x**4)
    return mp.log(mp.ncdf(x))


def gdp_delta(mu: float, eps: float) -> float:
    """delta(eps) of G_mu = PLD(N(0,1) || N(mu,1)): Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
    if eps == math.inf:
        return 0.0
    if mu == 0 or mu == math.inf:
        return max(0.0, -math.expm1(min(eps, 0.0))) if mu == 0 else 1.0
    digits = 60 + max(0, int(max(math.log10(max(abs(eps), 1.0)), 2 * math.log10(max(mu, 1.0)))))
    with mp.workdps(digits):
        m, e = mp.mpf(mu), mp.mpf(eps)
        first = mp.exp(_log_phi(m / 2 - e / m))
        second = mp.exp(e + _log_phi(-m / 2 - e / m))
        return float(max(first - second, 0))


def gdp_tradeoff(mu: float, alpha: float) -> float:
    """beta(alpha) of G_mu: Phi(Phi^-1(1 - alpha) - mu)."""
    if alpha <= 0:
        return 1.0
    if alpha >= 1:
        return 0.0
    with mp.workdps(400):
        z = -mp.sqrt(2) * mp.erfinv(2 * mp.mpf(alpha) - 1)
        return float(mp.exp(_log_phi(z - mu)))


def laplace_delta(eps0: float, eps: float) -> float:
    """delta(eps) of the Laplace mechanism with eps0 = sensitivity / scale (loss in [-eps0, eps0])."""
    if eps >= eps0:
        return 0.0
    if eps <= -eps0:
        return -math.expm1(eps)
    return -math.expm1((eps - eps0) / 2)


def rr_delta(eps: float, delta: float, k: int, t: float) -> float:
    """k-fold composition of R_{eps,delta} at t (binomial: losses (2y - k) eps, y ~ Bin(k, p))."""
    if t == math.inf:
        return float(-mp.expm1(k * mp.log1p(-mp.mpf(delta))))
    magnitude = max(math.log10(max(abs(t), 1.0)), math.log10(max(eps, 1.0)) + math.log10(k))
    digits = 60 + int(magnitude) + 1
    with mp.workdps(digits):
        e, t = mp.mpf(eps), mp.mpf(t)
        log_p, log_1p = -mp.log1p(mp.exp(-e)), -mp.log1p(mp.exp(e))
        expect = mp.mpf(0)
        for y in range(k + 1):
            loss = e * (2 * y - k)
            if loss > t:
                log_w = mp.log(mp.binomial(k, y)) + y * log_p + (k - y) * log_1p
                expect += mp.exp(log_w) * -mp.expm1(t - loss)
        keep = mp.exp(k * mp.log1p(-mp.mpf(delta)))
        return float(1 - keep + keep * expect)


def subsampled_delta(base, q: float, eps: float) -> float:
    """delta(eps) of Poisson subsampling at rate q of a symmetric base curve ``base``, the worse
    of the remove direction (q A + (1-q) B || B) and the add direction (B || q A + (1-q) B)
    (laplace-transform-dp.txt Thm 5.1), for eps >= 0."""
    if q == 0 or eps == math.inf:
        return 0.0
    with mp.workdps(60 + max(0, int(math.log10(max(eps, 1.0))))):
        qm, e = mp.mpf(q), mp.mpf(eps)
        remove = qm * base(float(mp.log1p(mp.expm1(e) / qm)))
        c = 1 - (1 - qm) * mp.exp(e)
        add = c * base(float(e + mp.log(qm) - mp.log(c))) if c > 0 else 0
        return float(max(remove, add))


# -- strategies and checks -----------------------------------------------------------------------------
def refused(names, fn):
    """``fn()``, or None after a ValueError that names one of ``names`` (the argument at fault)."""
    names = (names,) if isinstance(names, str) else names
    try:
        return fn()
    except ValueError as err:
        assert any(n in str(err) for n in names), f"ValueError does not name {names}: {err}"
        return None


def as_array(x) -> np.ndarray:
    out = np.asarray(x, np.float64)
    assert not np.any(np.isnan(out)), f"NaN in {out}"
    return out


def assert_delta(x) -> np.ndarray:
    out = as_array(x)
    assert np.all((out >= 0) & (out <= 1)), f"delta outside [0, 1]: {out!r}"
    return out


def assert_epsilon(x) -> np.ndarray:
    out = as_array(x)
    assert np.all(out >= 0), f"negative epsilon: {out!r}"
    return out


def allowance(truth: float) -> float:
    return ABS_TOL + REL_TOL * abs(truth)


def assert_bracket(value: float, truth: float, pessimistic: bool, what: str = "delta") -> None:
    """Pessimistic >= truth, optimistic <= truth, up to the round-off allowance."""
    if value == truth:  # also an infinite truth met exactly (inf - inf would be NaN below)
        return
    if pessimistic:
        assert value >= truth - allowance(truth), f"pessimistic {what} {value!r} < truth {truth!r}"
    else:
        assert value <= truth + allowance(truth), f"optimistic {what} {value!r} > truth {truth!r}"


def assert_epsilon_bracket(eps: float, delta: float, truth_delta, pessimistic: bool) -> None:
    """epsilon(delta) sound against a true curve: a pessimistic eps has truth_delta(eps) <= delta;
    an optimistic one truth_delta(eps) >= delta (eps at most the true epsilon) unless it is 0, and
    is inf only where the true curve stays above delta (an atom at +inf larger than delta)."""
    if pessimistic:
        if eps < math.inf:
            got = truth_delta(eps)
            assert got <= delta + allowance(delta), f"pessimistic eps {eps!r}: true delta {got!r} > {delta!r}"
    elif eps == math.inf:  # only where the truth's atom at +inf exceeds delta (kept exactly)
        got = truth_delta(1e6)
        assert got > delta - allowance(delta), f"optimistic eps inf: true delta {got!r} <= {delta!r}"
    elif eps > 0:
        got = truth_delta(eps)
        assert got >= delta - allowance(delta), f"optimistic eps {eps!r}: true delta {got!r} < {delta!r}"


def check_pld_against(pld, eps, delta, truth_delta, pessimistic: bool) -> None:
    """delta(eps) and epsilon(delta) of ``pld`` never NaN, in range, and sound against the truth."""
    d = float(assert_delta(pld.delta(eps)))
    assert_bracket(d, truth_delta(eps), pessimistic)
    e = float(assert_epsilon(pld.epsilon(delta)))
    assert_epsilon_bracket(e, delta, truth_delta, pessimistic)


# -- Gaussian / GDP -------------------------------------------------------------------------------
@variants()
def test_gaussian_sound(profile, whole):
    def prop(sigma, eps, delta, pessimistic):
        pld = refused("sigma", lambda: pj.gaussian(sigma, pessimistic=pessimistic))
        if pld is not None:
            check_pld_against(pld, eps, delta, lambda e: gdp_delta(1 / sigma, e), pessimistic)

    check(profile, prop, sigma=positive(whole, 0.05, 1e3), eps=epsilons(whole),
          delta=probability(whole), pessimistic=st.booleans())


@variants()
def test_gdp_sound(profile, whole):
    def prop(mu, eps, delta, pessimistic):
        pld = refused("mu", lambda: pj.gdp(mu, pessimistic=pessimistic))
        if pld is not None:
            check_pld_against(pld, eps, delta, lambda e: gdp_delta(mu, e), pessimistic)

    check(profile, prop, mu=non_negative(whole, 1e-3, 20.0), eps=epsilons(whole),
          delta=probability(whole), pessimistic=st.booleans())


@variants()
def test_gaussian_replace_one_sound(profile, whole):
    # without subsampling, replace-one moves the mean by 2 sensitivities: G_{2/sigma}
    def prop(sigma, eps, delta, pessimistic):
        pld = refused("sigma", lambda: pj.gaussian(sigma, neighboring="replace_one",
                                                   pessimistic=pessimistic))
        if pld is not None:
            check_pld_against(pld, eps, delta, lambda e: gdp_delta(2 / sigma, e), pessimistic)

    check(profile, prop, sigma=positive(whole, 0.05, 1e3), eps=epsilons(whole),
          delta=probability(whole), pessimistic=st.booleans())


@variants()
def test_subsampled_gaussian_sound(profile, whole):
    # q = 1 is the base mechanism; every q against Thm 5.1 of laplace-transform-dp applied to G_mu
    def prop(sigma, q, eps, delta, pessimistic):
        pld = refused(("sigma", "sampling_prob"), lambda: pj.gaussian(
            sigma, sampling_prob=q, pessimistic=pessimistic))
        if pld is not None:
            truth = lambda e: subsampled_delta(lambda x: gdp_delta(1 / sigma, x), q, e)
            check_pld_against(pld, eps, delta, truth, pessimistic)

    check(profile, prop, sigma=positive(whole, 0.3, 1e2), q=probability(whole, 1e-4),
          eps=epsilons(whole), delta=probability(whole), pessimistic=st.booleans())


@variants(heavy=True, default_run=False)
def test_subsampled_variants_never_nan(profile, whole):
    # replace-one Poisson and fixed-batch sampling: no closed form here, range and no-NaN only
    def prop(sigma, q, sampling, eps, delta, pessimistic):
        pld = refused(("sigma", "sampling_prob"), lambda: pj.gaussian(
            sigma, sampling_prob=q, neighboring="replace_one", sampling=sampling,
            pessimistic=pessimistic))
        if pld is not None:
            assert_delta(pld.delta(eps))
            assert_epsilon(pld.epsilon(delta))

    check(profile, prop, fast=2, sigma=positive(whole, 0.3, 1e2), q=probability(whole, 1e-4),
          sampling=st.sampled_from(["poisson", "fixed_batch"]), eps=epsilons(whole),
          delta=probability(whole), pessimistic=st.booleans())


# -- Laplace, discrete noise, randomized response -------------------------------------------------
@variants()
def test_laplace_sound(profile, whole):
    def prop(scale, sensitivity, eps, delta, pessimistic):
        pld = refused(("scale", "sensitivity"), lambda: pj.laplace(
            scale, sensitivity=sensitivity, pessimistic=pessimistic))
        if pld is not None:
            eps0 = sensitivity / scale
            check_pld_against(pld, eps, delta, lambda e: laplace_delta(eps0, e), pessimistic)

    check(profile, prop, scale=positive(whole, 0.02, 1e3), sensitivity=positive(whole, 0.1, 10.0, 1.0),
          eps=epsilons(whole), delta=probability(whole), pessimistic=st.booleans())


@variants()
def test_subsampled_laplace_q1_is_laplace(profile, whole):
    def prop(scale, eps, delta, pessimistic):
        pld = refused("scale", lambda: pj.laplace(scale, sampling_prob=1.0, pessimistic=pessimistic))
        if pld is not None:
            check_pld_against(pld, eps, delta, lambda e: laplace_delta(1 / scale, e), pessimistic)

    check(profile, prop, scale=positive(whole, 0.05, 1e3), eps=epsilons(whole),
          delta=probability(whole), pessimistic=st.booleans())


@variants(heavy=True)
def test_discrete_noise_never_nan(profile, whole):
    def prop(kind, scale, sensitivity, eps, delta, pessimistic):
        build = pj.discrete_laplace if kind == "laplace" else pj.discrete_gaussian
        name = "scale" if kind == "laplace" else "sigma"
        pld = refused((name, "sensitivity"), lambda: build(
            scale, sensitivity=sensitivity, pessimistic=pessimistic))
        if pld is None:
            return
        d = assert_delta(pld.delta(np.array([0.0, eps])))
        assert d[1] <= d[0] + ABS_TOL
        assert_epsilon(pld.epsilon(delta))

    check(profile, prop, fast=2, kind=st.sampled_from(["laplace", "gaussian"]),
          scale=positive(whole, 0.1, 100.0), sensitivity=st.sampled_from([1, 2, 5]),
          eps=epsilons(whole), delta=probability(whole), pessimistic=st.booleans())


@variants()
def test_randomized_response_sound(profile, whole):
    def prop(eps_rr, delta_rr, k, eps, delta, pessimistic):
        pld = refused(("epsilon", "delta"), lambda: pj.randomized_response(
            eps_rr, delta_rr, pessimistic=pessimistic))
        if pld is None:
            return
        check_pld_against(pld, eps, delta, lambda e: rr_delta(eps_rr, delta_rr, 1, e), pessimistic)
        composed = refused("count", lambda: pld.self_compose(k))
        if composed is not None:
            check_pld_against(composed, eps, delta, lambda e: rr_delta(eps_rr, delta_rr, k, e),
                              pessimistic)

    check(profile, prop, eps_rr=non_negative(whole, 1e-2, 5.0), delta_rr=probability(whole),
          k=st.sampled_from([1, 2, 7, 30]), eps=epsilons(whole), delta=probability(whole),
          pessimistic=st.booleans())


@variants()
def test_approx_dp_composition_closed_form(profile, whole):
    # exact (no discretization on its own lattice): equal to the binomial formula up to round-off
    def prop(eps_rr, delta_rr, k, eps, delta):
        pld = refused(("epsilon", "delta", "count"), lambda: pj.approx_dp_composition(eps_rr, delta_rr, k))
        if pld is not None:
            truth = lambda e: rr_delta(eps_rr, delta_rr, k, e)
            check_pld_against(pld, eps, delta, truth, True)
            assert float(pld.delta(eps)) <= truth(eps) + allowance(truth(eps))

    check(profile, prop, eps_rr=non_negative(whole, 1e-2, 5.0), delta_rr=probability(whole),
          k=st.sampled_from([1, 3, 40, 1000]), eps=epsilons(whole), delta=probability(whole))


def test_identity_reveals_nothing():
    for pessimistic in (True, False):
        pld = pj.identity(pessimistic=pessimistic)
        assert np.all(pld.delta(np.array([0.0, 1e-300, 1.0, 1e300, np.inf])) == 0)
        assert np.all(pld.epsilon(np.array([0.0, 1e-300, 0.5, 1.0])) == 0)
        assert np.all(pld.renyi(np.array([1e-300, 0.5, 1.0, 2.0, 1e300])) == 0)
        alpha = np.array([0.0, 1e-300, 0.3, 1.0])
        np.testing.assert_allclose(pld.tradeoff(alpha), 1 - alpha, atol=1e-15)


# -- composition, tradeoff, Rényi -----------------------------------------------------------------
@variants(heavy=True)
def test_gdp_composition_is_gdp(profile, whole):
    # G_mu composed T times is G_{mu sqrt T}; G_a (+) G_b is G_sqrt(a^2 + b^2)
    def prop(mu, other, steps, eps, delta, pessimistic):
        pld = refused("mu", lambda: pj.gdp(mu, pessimistic=pessimistic))
        if pld is None:
            return
        composed = refused("count", lambda: pld.self_compose(steps))
        if composed is not None:
            total = mu * math.sqrt(steps)
            check_pld_against(composed, eps, delta, lambda e: gdp_delta(total, e), pessimistic)
        # far-apart steps are aligned by coarsening; a refusal would have to name plds
        other = other * min(max(mu, 1e-2), 1e2)
        pair = refused("plds", lambda: pj.compose([pld, pj.gdp(other, pessimistic=pessimistic)]))
        if pair is not None:
            total = math.hypot(mu, other)
            check_pld_against(pair, eps, delta, lambda e: gdp_delta(total, e), pessimistic)

    check(profile, prop, mu=positive(whole, 1e-2, 5.0), other=st.sampled_from([0.5, 1.0]),
          steps=count(whole), eps=epsilons(whole), delta=probability(whole),
          pessimistic=st.booleans())


@variants()
def test_gdp_tradeoff_and_renyi_sound(profile, whole):
    # a pessimistic tradeoff is a lower bound on beta, its Rényi divergence an upper bound on
    # D_a(G_mu) = a mu^2 / 2; optimistic the other way round
    def prop(mu, alpha, order, pessimistic):
        pld = refused("mu", lambda: pj.gdp(mu, pessimistic=pessimistic))
        if pld is None:
            return
        beta = float(as_array(pld.tradeoff(alpha)))
        assert 0 <= beta <= 1 - alpha + ABS_TOL
        assert_bracket(-beta, -gdp_tradeoff(mu, alpha), pessimistic, "-beta")
        rdp = float(refused("order", lambda: as_array(pld.renyi(order))) or 0.0)
        assert rdp >= 0
        if rdp:
            assert_bracket(rdp, order * mu * mu / 2, pessimistic, "renyi")

    check(profile, prop, mu=non_negative(whole, 1e-2, 10.0), alpha=probability(whole),
          order=positive(whole, 0.5, 64.0, 1.0), pessimistic=st.booleans())


def test_compose_far_apart_steps():
    # gdp(1e-300) sits on a step ~1e-302: composing it with gdp(0.5) must give a sound bound or a
    # ValueError, not a raw TypeError (nor, for gdp(1e-6), a 25 GB allocation: not run here)
    pair = refused(("size", "step", "grid"), lambda: pj.compose([pj.gdp(1e-300), pj.gdp(0.5)]))
    if pair is not None:
        assert_bracket(float(assert_delta(pair.delta(0.0))), gdp_delta(0.5, 0.0), True)


# -- monotonicity and batches ---------------------------------------------------------------------
def _mechanism(kind: str, x: float, pessimistic: bool):
    if kind == "gaussian":
        return refused("sigma", lambda: pj.gaussian(x, pessimistic=pessimistic))
    if kind == "subsampled":
        return refused("sigma", lambda: pj.gaussian(x, sampling_prob=0.01, pessimistic=pessimistic))
    if kind == "laplace":
        return refused("scale", lambda: pj.laplace(x, pessimistic=pessimistic))
    return refused("epsilon", lambda: pj.randomized_response(x, pessimistic=pessimistic))


@variants()
def test_profiles_monotone(profile, whole):
    # one PLD's delta(eps) is non-increasing in eps and epsilon(delta) non-increasing in delta
    # (exactly on the grid; the allowance covers summation round-off only)
    def prop(kind, x, eps, deltas, pessimistic):
        pld = _mechanism(kind, x, pessimistic)
        if pld is None:
            return
        d = assert_delta(pld.delta(np.sort(np.asarray(eps))))
        assert np.all(np.diff(d) <= ABS_TOL), d
        e = assert_epsilon(pld.epsilon(np.sort(np.asarray(deltas))))
        assert np.all(e[1:] <= e[:-1] * (1 + REL_TOL) + ABS_TOL), e  # inf <= inf holds

    arrays = lambda s: st.lists(s, min_size=BATCH, max_size=BATCH)
    check(profile, prop, kind=st.sampled_from(["gaussian", "subsampled", "laplace", "rr"]),
          x=positive(whole, 0.05, 50.0), eps=arrays(epsilons(whole)),
          deltas=arrays(probability(whole)), pessimistic=st.booleans())


@variants(default_run=False)
def test_gaussian_alone_and_in_a_batch(profile, whole):
    # each batch element keeps its own offset and step, so the values should agree to round-off;
    # both must be sound either way
    def prop(sigma, eps, delta, pessimistic):
        alone = refused("sigma", lambda: pj.gaussian(sigma, pessimistic=pessimistic))
        batch = refused("sigma", lambda: pj.gaussian(
            np.array([sigma, 0.5, 1.0, 3.0]), pessimistic=pessimistic))
        assert (alone is None) == (batch is None)
        if alone is None:
            return
        truth = lambda e: gdp_delta(1 / sigma, e)
        check_pld_against(batch[0], eps, delta, truth, pessimistic)
        a, b = float(assert_delta(alone.delta(eps))), float(assert_delta(batch.delta(eps)[0]))
        assert a == pytest.approx(b, rel=1e-6, abs=ABS_TOL)

    check(profile, prop, sigma=positive(whole, 0.05, 1e3), eps=epsilons(whole),
          delta=probability(whole), pessimistic=st.booleans())


# -- DP-SGD ---------------------------------------------------------------------------------------
DPSGD_NAMES = ("noise_multiplier", "sampling_prob", "steps", "delta", "epsilon")


@variants(heavy=True)
def test_dpsgd_sound(profile, whole):
    # never NaN and in range; q = 1 is G_{sqrt(T) / sigma}; T = 1 is the subsampled Gaussian
    def prop(sigma, q, steps, eps, delta, pessimistic):
        e = refused(DPSGD_NAMES, lambda: dpsgd(pj.dpsgd_epsilon, sigma, q, steps, delta, pessimistic))
        d = refused(DPSGD_NAMES, lambda: dpsgd(pj.dpsgd_delta, sigma, q, steps, eps, pessimistic))
        if q == 1:
            truth = lambda x: gdp_delta(math.sqrt(steps) / sigma, x)
        elif steps == 1:
            truth = lambda x: subsampled_delta(lambda y: gdp_delta(1 / sigma, y), q, x)
        else:
            truth = None
        if e is not None:
            assert_epsilon(e)
            if truth is not None:
                assert_epsilon_bracket(float(e), delta, truth, pessimistic)
        if d is not None:
            assert_delta(d)
            if truth is not None:
                assert_bracket(float(d), truth(eps), pessimistic)

    check(profile, prop, fast=2, sigma=positive(whole, 0.5, 20.0),
          q=st.one_of(st.just(1.0), probability(whole, 1e-3)),
          steps=st.one_of(st.just(1), count(whole, 10**4)), eps=epsilons(whole),
          delta=probability(whole), pessimistic=st.booleans())


def dpsgd(fn, sigma, q, steps, target, pessimistic):
    return fn(sigma, q, steps, target, pessimistic=pessimistic)


@variants(heavy=True)
def test_dpsgd_alone_and_in_a_batch(profile, whole):
    # a batch is sorted and chunked: the same configuration may sit on another composed grid, so
    # both values must be sound and agree within the pessimistic-optimistic gap of the lone one
    def prop(sigma, q, steps, delta):
        alone = refused(DPSGD_NAMES, lambda: pj.dpsgd_epsilon(sigma, q, steps, delta))
        batch = refused(DPSGD_NAMES, lambda: pj.dpsgd_epsilon(
            np.array([sigma, 1.0, 2.0, 0.7]), np.array([q, 0.01, 0.1, 0.05]),
            np.array([steps, 100, 1000, 10]), delta))
        assert (alone is None) == (batch is None)
        if alone is None:
            return
        a, b = float(assert_epsilon(alone)), float(assert_epsilon(batch)[0])
        low = refused(DPSGD_NAMES, lambda: pj.dpsgd_epsilon(sigma, q, steps, delta,
                                                            pessimistic=False))
        if low is None:
            # the optimistic composition refused as too wide for float64 (sigma 1e-300, q = 1,
            # 10^13 steps), where the pessimistic one is all at +inf and skips it (epsilon inf,
            # or 0 at delta = 1, which every mechanism meets)
            assert a == b == (0.0 if delta >= 1 else np.inf)
            return
        low = float(assert_epsilon(low))
        assert low <= a + allowance(a) and low <= b + allowance(b)
        if a != b:  # (both inf when delta = 0: the truth is inf)
            assert abs(a - b) <= max(a - low, 0.0) + allowance(a) + 1e-9, (a, b, low)

    check(profile, prop, fast=1, sigma=positive(whole, 0.5, 20.0), q=probability(whole, 1e-3),
          steps=count(whole, 10**4), delta=probability(whole))


@variants(heavy=True)
def test_dpsgd_monotone(profile, whole):
    # The truth is non-decreasing in steps and q and non-increasing in sigma. Two pessimistic
    # values come from different grids, so one may exceed the other by its own discretization
    # error: the tolerance is the pessimistic-optimistic gap of the value that should be smaller
    # (the honest error bar), plus round-off.
    def prop(sigma, q, steps, delta, which):
        small, big = (sigma, q, steps), (sigma, q, steps)
        if which == "steps":
            big = (sigma, q, 2 * steps)
        elif which == "q":
            big = (sigma, min(2 * q, 1.0), steps)
        else:
            small = (2 * sigma, q, steps)
        values = refused(DPSGD_NAMES, lambda: pj.dpsgd_epsilon(
            np.array([small[0], big[0]]), np.array([small[1], big[1]]),
            np.array([small[2], big[2]]), delta))
        if values is None:
            return
        lo, hi = assert_epsilon(values)
        # the optimistic grid may refuse what the pessimistic one bounds (sigma 1e-300, q 1,
        # 10^13 steps: inf pessimistic, "steps = 1e+13 is too large for this grid" optimistic)
        opt = refused(DPSGD_NAMES, lambda: pj.dpsgd_epsilon(*small, delta, pessimistic=False))
        if opt is None:
            return
        opt = float(assert_epsilon(opt))
        gap = max(lo - opt, 0.0) if lo > opt else 0.0  # (both inf where delta = 0: no gap)
        assert lo <= hi + gap + allowance(hi) + 1e-9, (small, big, lo, hi, opt)

    check(profile, prop, fast=1, sigma=positive(whole, 0.5, 20.0), q=probability(whole, 1e-3),
          steps=count(whole, 10**4), delta=probability(whole),
          which=st.sampled_from(["steps", "q", "sigma"]))


# -- GDP conversions ------------------------------------------------------------------------------
@variants(default_run=False)
def test_gdp_mu_certificate(profile, whole):
    # mu = gdp_mu(L) certifies delta_L(t) <= delta_{G_mu}(t) + ROUNDOFF at every t: checked with
    # the exact curves of G_mu (as a query, gdp_mu >= mu) and of randomized response
    def prop(kind, x):
        if kind == "gdp":
            pld, truth = pj.gdp(x), lambda t: gdp_delta(x, t)
        else:
            pld = refused("epsilon", lambda: pj.randomized_response(x))
            truth = lambda t: rr_delta(x, 0.0, 1, t)
        if pld is None:
            return
        mu = float(assert_epsilon(pj.gdp_mu(pld)))
        if kind == "gdp":
            assert mu >= x * (1 - REL_TOL) or mu == math.inf
        if mu < math.inf:
            for t in (0.0, x / 2, x, 2 * x, mu * mu / 2):
                assert truth(t) <= gdp_delta(mu, t) + 1e-14 + REL_TOL * gdp_delta(mu, t), (mu, t)

    check(profile, prop, kind=st.sampled_from(["gdp", "rr"]), x=positive(whole, 1e-2, 8.0))


@variants(heavy=True)
def test_gdp_residue_sound(profile, whole):
    # For a GDP query G_nu the true residue is sqrt(mu^2 - nu^2): the returned residue is at most
    # that (sound), never NaN (-inf where the query does not fit, finite when it fits), and at
    # least the naive update from gdp_mu.
    def prop(mu, nu, kind):
        query = pj.gdp(nu) if kind == "gdp" else pj.randomized_response(nu)
        got = refused("mu", lambda: np.asarray(pj.gdp_residue(mu, query), np.float64))
        if got is None:
            return
        assert not np.isnan(got) and (got == -np.inf or 0 <= got <= mu), (mu, nu, kind)
        cost = float(pj.gdp_mu(query, mu_max=max(mu, 64.0)))
        if cost < mu * (1 - 1e-6):  # fits clearly
            assert np.isfinite(got), (mu, nu, kind)
            naive = math.sqrt((mu - cost) * (mu + cost))
            assert naive * (1 - REL_TOL) - ABS_TOL <= float(got) <= mu
        if cost > mu * (1 + 1e-6):  # clearly does not fit
            assert got == -np.inf, (mu, nu, kind)
        if kind == "gdp" and np.isfinite(got):
            assert float(got) <= math.sqrt(max(mu * mu - nu * nu, 0.0)) * (1 + REL_TOL) + ABS_TOL

    check(profile, prop, fast=2, mu=positive(whole, 0.1, 50.0), nu=positive(False, 0.05, 2.0),
          kind=st.sampled_from(["gdp", "rr"]))


# -- filters --------------------------------------------------------------------------------------
def _query(kind: str, x: float):
    """(pessimistic query PLD, true costs): pure-DP epsilon, GDP mu, zCDP rho, Rényi(a) function."""
    if kind == "laplace":
        pld = refused("scale", lambda: pj.laplace(x))
        return pld, {"eps": 1 / x, "mu": None, "rho": None, "renyi": None}
    if kind == "rr":
        pld = refused("epsilon", lambda: pj.randomized_response(x))
        return pld, {"eps": x, "mu": None, "rho": None, "renyi": None}
    pld = refused("sigma", lambda: pj.gaussian(x))
    mu = 1 / x
    return pld, {"eps": math.inf, "mu": mu, "rho": mu * mu / 2, "renyi": lambda a: a * mu * mu / 2}


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(u), np.asarray(v), equal_nan=True)
               for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


@variants(heavy=True)
def test_filters_never_overspend(profile, whole):
    # Spend the same query up to ROUNDS times: the true costs of the accepted ones stay within
    # the budget, no state holds NaN, and a refused query leaves the state as it was.
    rounds = 4

    def prop(name, budget, kind, x):
        query, truth = _query(kind, x)
        if query is None:
            return
        filt = {
            "pure_dp": lambda: pj.filters.pure_dp_filter(budget, delta=1e-6),
            "gdp": lambda: pj.filters.gdp_filter(budget),
            "gdp_residue": lambda: pj.filters.gdp_residue_filter(budget),
            "renyi": lambda: pj.filters.renyi_filter([2.0, 8.0], budget),
            "approx_zcdp": lambda: pj.filters.approx_zcdp_filter(budget, 1e-6),
            "approx_dp": lambda: pj.filters.approx_dp_filter(budget, 1e-6),
        }[name]()
        state = filt.init()
        accepted = 0
        for _ in range(rounds):
            new, ok = filt.spend(state, query)
            assert not any(np.any(np.isnan(np.asarray(leaf))) for leaf in jax.tree_util.tree_leaves(new))
            if bool(ok):
                accepted += 1
            else:
                assert _same(new, state), "a refused query changed the state"
            state = new
        slack = 1 + 1e-9
        if not accepted:  # nothing spent (and 0 * an infinite true cost is not a number)
            return
        mu = truth["mu"]
        if name == "pure_dp" and mu is not None:
            # the Gaussian's +inf atom went to the filter's delta: the k accepted queries are
            # sqrt(k) mu-GDP, and their true delta at the epsilon budget must fit delta
            assert gdp_delta(math.sqrt(accepted) * mu, budget) <= 1e-6 * slack
        elif name == "pure_dp":
            assert accepted * truth["eps"] <= budget * slack
        elif name in ("gdp", "gdp_residue") and mu is not None:
            assert mu <= budget and accepted * mu * mu <= budget**2 * slack
        elif name == "renyi" and truth["renyi"] is not None:
            assert accepted * truth["renyi"](2.0) <= budget * slack
            assert accepted * truth["renyi"](8.0) <= budget * slack
        elif name == "approx_zcdp" and truth["rho"] is not None:
            assert accepted * truth["rho"] <= budget * slack
        elif name == "approx_dp" and truth["rho"] is not None:
            # Whitehouse et al. Thm 8: sum of eps_n^2 = 2 rho_n at most y* = (sqrt(2L + 2 eps) -
            # sqrt(2L))^2, L = log(1 / delta'), delta' = delta / 2 (the default split)
            two_log = 2 * math.log(2 / 1e-6)
            y_star = (math.sqrt(two_log + 2 * budget) - math.sqrt(two_log)) ** 2
            assert accepted * 2 * truth["rho"] <= y_star * slack

    check(profile, prop, fast=3,
          name=st.sampled_from(["pure_dp", "gdp", "gdp_residue", "renyi", "approx_zcdp", "approx_dp"]),
          budget=positive(False, 0.1, 10.0), kind=st.sampled_from(["laplace", "rr", "gaussian"]),
          x=positive(whole, 0.1, 20.0))


def test_renyi_filter_refuses_a_two_fold_randomized_response_without_losing_budget():
    f = pj.filters.renyi_filter([2.0, 8.0], 1.0)
    state, _ = f.spend(f.init(), pj.randomized_response(0.5, 1.0).self_compose(2))
    left = np.asarray(f.remaining(state)["budget"])
    assert not np.any(np.isnan(left)) and np.all(left <= 1.0)
    _, ok = f.spend(state, np.array([1e9, 1e9]))
    assert not bool(ok)


# -- calibration: never NaN, never a hang ---------------------------------------------------------
class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: int):
    """Raise Hang if the block runs longer than ``seconds`` (a Python-level loop is interrupted)."""

    def alarm(*_):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("rtol", [
    0.0,
    -1e-3,
    math.nan,
    math.inf,
])
@pytest.mark.parametrize("which", ["noise_multiplier", "sampling_prob"])
def test_calibration_tolerance_validated(which, rtol):
    fn = pj.calibrate_noise_multiplier if which == "noise_multiplier" else pj.calibrate_sampling_prob
    args = (1.0, 1e-5, 0.01, 100) if which == "noise_multiplier" else (1.0, 1e-5, 1.0, 100)
    with time_limit(5), pytest.raises(ValueError, match="rtol"):  # refused before any work
        fn(*args, rtol=rtol)


@pytest.mark.parametrize("max_steps", [0, -5, math.nan])
def test_calibrate_steps_max_steps_validated(max_steps):
    with time_limit(30), pytest.raises(ValueError, match="max_steps"):
        pj.calibrate_steps(1.0, 1e-5, 1.0, 0.01, max_steps=max_steps)


@variants(heavy=True)
def test_calibration_meets_its_target(profile, whole):
    # the answer is never NaN and meets the target by the pessimistic epsilon (or a clear
    # ValueError); each call bounded in time
    def prop(which, target, delta, sigma, q, steps):
        names = ("target_epsilon", "delta", "noise_multiplier", "sampling_prob", "steps",
                 "max_steps", "reaches")
        with time_limit(300):
            if which == "steps":
                got = refused(names, lambda: pj.calibrate_steps(target, delta, sigma, q, max_steps=10**6))
                if got is not None:
                    assert got >= 1
                    assert pj.dpsgd_epsilon(sigma, q, int(got), delta) <= target
            elif which == "sigma":
                got = refused(names, lambda: pj.calibrate_noise_multiplier(
                    target, delta, q, steps, rtol=1e-2))
                if got is not None:
                    assert pj.dpsgd_epsilon(float(as_array(got)), q, steps, delta) <= target
            else:
                got = refused(names, lambda: pj.calibrate_sampling_prob(
                    target, delta, sigma, steps, rtol=1e-2))
                if got is not None:
                    assert 0 < float(as_array(got)) <= 1
                    assert pj.dpsgd_epsilon(sigma, float(got), steps, delta) <= target

    check(profile, prop, fast=1, which=st.sampled_from(["steps", "sigma", "q"]),
          target=positive(whole, 0.5, 10.0), delta=log_uniform(1e-10 if not whole else TINY, 0.1),
          sigma=positive(whole, 0.5, 5.0), q=log_uniform(1e-3 if not whole else TINY, 1.0),
          steps=count(False, 1000))


def test_module_profiles_registered():
    for name in ("pldjax-fast", "pldjax-slow"):
        assert settings.get_profile(name).deadline is None
    assert jnp.zeros(()).dtype == jnp.float64  # conftest turns x64 on for the suite
