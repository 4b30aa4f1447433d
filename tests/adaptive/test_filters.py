"""Privacy filters: residues against closed forms and an independent dense evaluation, run lengths,
state that survives (save / restore, failures), jit and vmap of spend, bad input."""

import json
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_programs import compiled_programs, programs_of_a_new_process
from scipy import stats

import pldjax as pj
from pldjax.core.pld import unchecked_pld
from pldjax.kernels.dominance import ROUNDOFF

F = pj.filters


def spend_until_rejected(f, query, limit=1000):
    state, count = f.init(), 0
    for _ in range(limit):
        state, accepted = f.spend(state, query)
        if not accepted:
            return count, state
        count += 1
    return count, state


# -- independent reference: the curve of G_mu' (+) (randomized response), from scipy --------------
def gaussian_delta(mu, eps):
    """delta of G_mu at eps (any real eps), scipy's normal distribution."""
    eps = np.asarray(eps, np.float64)
    if mu == 0:
        return np.maximum(-np.expm1(eps), 0.0)
    return stats.norm.cdf(mu / 2 - eps / mu) - np.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)


def rr_composed_delta(mu_residue, eps_rr, eps):
    """delta of G_mu' (+) RR_eps_rr: sum over RR's two atoms of delta_{G_mu'}(eps - loss)."""
    keep = 1 / (1 + np.exp(-eps_rr))
    return keep * gaussian_delta(mu_residue, eps - eps_rr) + (1 - keep) * gaussian_delta(
        mu_residue, eps + eps_rr)


DENSE = np.linspace(-30, 30, 240001)


@pytest.mark.parametrize("mu, eps_rr", [pytest.param(1.0, 0.5, marks=pytest.mark.slow),
                                        pytest.param(0.8, 0.25, marks=pytest.mark.slow),
                                        pytest.param(3.0, 2.0, marks=pytest.mark.slow), (2.0, 1.0),
                                        (3.0, 0.02)])  # the last one runs on a coarsened grid
def test_residue_condition_holds_by_independent_dense_evaluation(mu, eps_rr):
    query = pj.randomized_response(eps_rr)
    residue = float(pj.gdp_residue(mu, query))
    assert 0 <= residue <= mu
    excess = rr_composed_delta(residue, eps_rr, DENSE) - gaussian_delta(mu, DENSE)
    assert excess.max() <= 1e-13
    # and it is tight: a slightly larger residue breaks the condition somewhere
    bigger = rr_composed_delta(residue + 1e-3 * mu, eps_rr, DENSE) - gaussian_delta(mu, DENSE)
    assert bigger.max() > 0


@pytest.mark.parametrize("query", [
    pytest.param(pj.randomized_response(0.5), id="rr0.5"),
    pytest.param(pj.randomized_response(1.5), id="rr1.5"),
    pytest.param(pj.laplace(2.0), id="lap"),
    pytest.param(pj.gdp(0.4), id="gdp", marks=pytest.mark.slow),
    pytest.param(pj.gaussian(1.0, sampling_prob=0.01), id="sgm",  # coarsened, 2 directions
                 marks=pytest.mark.slow)])
@pytest.mark.parametrize("mu", [0.9, 2.0])
def test_residue_never_below_naive_update(query, mu):
    slack = float(query.inf_mass)
    nu = float(pj.gdp_mu(query, delta_slack=slack))
    naive = np.sqrt(max(mu**2 - nu**2, 0.0))
    residue = float(pj.gdp_residue(mu, query, delta_slack=slack))
    if nu > mu:  # the query does not fit the budget at all: no residue (never NaN)
        assert residue == -np.inf
        return
    assert residue >= naive * (1 - 4e-16)  # the naive value, up to its own rounding


@pytest.mark.slow
def test_gaussian_query_leaves_exactly_the_gaussian_residue():
    # a nu-GDP query given by its nu: exactly sqrt(mu^2 - nu^2)
    f = F.gdp_residue_filter(1.0)
    state, accepted = f.spend(f.init(), 0.6)
    assert bool(accepted)
    assert float(f.remaining(state)["mu"]) == pytest.approx(0.8, rel=1e-15)
    # the pessimistic PLD of G_nu: a lower bound, within the grid's accuracy
    for nu in (0.3, 0.6):
        query = pj.gdp(nu)
        got = float(pj.gdp_residue(1.0, query, delta_slack=float(query.inf_mass)))
        exact = np.sqrt(1 - nu**2)
        assert got <= exact
        assert got == pytest.approx(exact, rel=1e-4)


@pytest.mark.slow
def test_gdp_residue_batched_over_pairs_and_minus_inf_when_the_query_does_not_fit():
    mus = np.array([0.3, 1.0, 2.0])
    query = pj.randomized_response(0.5)
    batch = pj.gdp_residue(mus, query)
    assert batch[0] == -np.inf  # RR_0.5 is not 0.3-GDP: no residue (never NaN)
    assert not batch[0] >= 0 and batch[0] < batch[1]
    assert batch[1] == pytest.approx(float(pj.gdp_residue(1.0, query)), rel=1e-12)
    queries = pj.randomized_response(np.array([0.25, 0.5, 1.0]))
    pairs = pj.gdp_residue(np.array([1.0, 1.0, 2.0]), queries)
    assert pairs[0] > pairs[1]
    assert pairs[2] == pytest.approx(float(pj.gdp_residue(2.0, pj.randomized_response(1.0))),
                                     rel=1e-12)


# -- run lengths ----------------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon, eps0", [(1.0, 0.25), (1.0, 0.1), (0.9, 0.3), (2.0, 0.3)])
def test_pure_dp_filter_admits_floor_epsilon_over_eps0(epsilon, eps0):
    expected = int(Fraction(epsilon) / Fraction(eps0))  # exact arithmetic on the given floats
    count, _ = spend_until_rejected(F.pure_dp_filter(epsilon), eps0)
    assert count == expected


def test_pure_dp_filter_with_pld_queries():
    query = pj.randomized_response(0.25)  # the grid step divides 0.25: its largest loss is exact
    assert spend_until_rejected(F.pure_dp_filter(1.0), query)[0] == 4
    # a Gaussian's PLD has an atom at +inf: rejected unless a delta budget pays for it
    assert spend_until_rejected(F.pure_dp_filter(100.0), pj.gdp(0.5))[0] == 0


@pytest.mark.parametrize("mu, nu", [(1.0, 0.5), (1.0, 0.3), (2.0, 0.7)])
def test_gdp_filter_admits_floor_mu2_over_nu2(mu, nu):
    expected = int(Fraction(mu) ** 2 / Fraction(nu) ** 2)
    assert spend_until_rejected(F.gdp_filter(mu), nu)[0] == expected
    # the residue filter keeps mu itself: square roots may round it a hair low, never high
    assert spend_until_rejected(F.gdp_residue_filter(mu), nu)[0] in (expected, expected - 1)


def test_gdp_filter_never_accepts_above_the_exact_budget():
    """Pairs nu_1, nu_2 with nu_1^2 + nu_2^2 within a few ulps of mu^2 = 1, judged in exact
    rational arithmetic: nu^2 was charged rounded to nearest, and (0.7683991025035597,
    0.6399709518968216), 1.9e-17 above the budget, was accepted. Exact squares stay exact."""
    rng = np.random.default_rng(7)
    firsts = np.concatenate([[0.7683991025035597, 0.14524109418144696, 0.6], rng.uniform(0.05, 0.95,
                                                                                         60)])
    accepted_below = below = 0
    f = F.gdp_filter(1.0, delta=0.0)  # one filter: its spend compiles once
    for first in firsts:
        second = float(np.sqrt(1.0 - first * first))
        for nu in second + np.arange(-6, 3) * np.spacing(second):
            state, ok = f.spend(f.init(), float(first))
            state, ok = f.spend(state, float(nu))
            exact = Fraction(float(first)) ** 2 + Fraction(float(nu)) ** 2
            assert not (bool(ok) and exact > 1)
            below += exact <= 1 - Fraction(1, 2**50)
            accepted_below += bool(ok) and exact <= 1 - Fraction(1, 2**50)
    assert accepted_below == below > 0  # and no tighter than a few ulps
    assert bool(f.spend(f.init(), 1.0)[1])  # an exact square is charged exactly


@pytest.mark.slow
def test_gdp_filters_with_pld_queries_and_residue_at_least_as_long():
    query = pj.gdp(0.3)  # nu from the pessimistic PLD is a hair above 0.3: 11 = floor(1/0.09)
    assert spend_until_rejected(F.gdp_filter(1.0), query)[0] == 11
    rr = pj.randomized_response(0.5)
    naive, _ = spend_until_rejected(F.gdp_filter(1.0), rr)
    residue, _ = spend_until_rejected(F.gdp_residue_filter(1.0), rr)
    assert residue >= naive > 0


def test_whitehouse_residue_solves_the_corrected_equation():
    from pldjax.adaptive.filters.whitehouse import residue_epsilon_squared

    for epsilon, delta_prime in [(1.0, 1e-6), (0.3, 1e-9), (5.0, 1e-3)]:
        y = residue_epsilon_squared(epsilon, delta_prime)
        log_term = np.log(1 / delta_prime)
        assert np.sqrt(2 * log_term * y) + y / 2 == pytest.approx(epsilon, rel=1e-13)
        assert np.sqrt(2 * log_term * y) + y / 2 <= epsilon


def test_approx_dp_filter_budget_is_below_the_exact_root():
    """y* (the largest sum of eps_n^2) at or below its exact value (mpmath), and eps_n^2 charged
    rounded up: 0.18254685258945505^2, 6.4e-19 above the exact y* for (1, 1e-6), was accepted."""
    import mpmath

    from pldjax.adaptive.filters.whitehouse import residue_epsilon_squared

    mpmath.mp.dps = 40
    for epsilon, delta_prime in [(1.0, 5e-7), (0.3, 1e-9), (5.0, 1e-3), (1e-3, 1e-12), (50.0, 0.4)]:
        two_log = 2 * mpmath.log(1 / mpmath.mpf(delta_prime))
        exact = (mpmath.sqrt(two_log + 2 * mpmath.mpf(epsilon)) - mpmath.sqrt(two_log)) ** 2
        y = residue_epsilon_squared(epsilon, delta_prime)
        assert y <= exact and y >= exact * (1 - 1e-13)
    f = F.approx_dp_filter(1.0, 1e-6)
    assert not bool(f.spend(f.init(), 0.18254685258945505)[1])


@pytest.mark.parametrize("epsilon, delta, eps_n", [(1.0, 1e-6, 0.1), (3.0, 1e-5, 0.05)])
def test_approx_dp_filter_admits_the_closed_form_count(epsilon, delta, eps_n):
    delta_prime = delta / 2
    log_term = np.log(1 / delta_prime)
    y_star = (np.sqrt(2 * log_term + 2 * epsilon) - np.sqrt(2 * log_term)) ** 2
    expected = int(np.floor(y_star / eps_n**2))
    assert spend_until_rejected(F.approx_dp_filter(epsilon, delta), eps_n)[0] == expected
    # a query's delta_n is charged to delta'' = delta / 2
    assert spend_until_rejected(F.approx_dp_filter(epsilon, 2.0**-20), (0.0, 2.0**-23))[0] == 4


def test_approx_zcdp_filter_counts_and_pld_conversion():
    assert spend_until_rejected(F.approx_zcdp_filter(1.0, 1e-6), (0.125, 0.0))[0] == 8
    # G_nu is (nu^2 / 2)-zCDP; the PLD bound may overestimate by the order grid (< 1%)
    f = F.approx_zcdp_filter(1.0, 1e-6)
    state, _ = f.spend(f.init(), pj.gdp(0.5))
    rho = 1.0 - float(f.remaining(state)["rho"])
    assert 0.125 <= rho <= 0.125 * 1.01


def test_renyi_filter_counts_per_order():
    orders = np.array([2.0, 4.0])
    # G_nu has D_a = a nu^2 / 2: budgets allowing 10 and 5 queries of nu = 0.5 -> 5 (every order)
    f = F.renyi_filter(orders, orders * 0.25 / 2 * np.array([10, 5]))
    assert spend_until_rejected(f, orders * 0.25 / 2)[0] == 5
    laplace = pj.laplace(4.0)  # scale 4: D_a of its PLD is an upper bound on the exact one
    a = orders
    exact = np.log(a / (2 * a - 1) * np.exp((a - 1) / 4) + (a - 1) / (2 * a - 1) * np.exp(-a / 4))
    exact = exact / (a - 1)
    count, _ = spend_until_rejected(F.renyi_filter(orders, 10 * exact), laplace)
    assert count in (9, 10)
    # an atom at +inf (a Gaussian's truncated tail) makes every divergence infinite: rejected
    assert spend_until_rejected(F.renyi_filter(orders, [100.0, 100.0]), pj.gdp(0.5))[0] == 0


def rr(epsilon):
    """Randomized response on the natural filters' grid step (which divides these epsilons)."""
    return pj.randomized_response(epsilon, grid=pj.Grid(step=1 / 128))


@pytest.mark.slow
def test_natural_filter_on_an_approximate_dp_budget():
    budget = pj.approx_dp_composition(1.0, 1e-6, 1)
    f = F.natural_filter(budget, step=1 / 128)
    assert spend_until_rejected(f, rr(0.25))[0] == 4
    count, state = spend_until_rejected(f, rr(0.5))
    assert count == 2
    composed = f.remaining(state)
    assert float(composed.delta(1.0)) <= 1e-6 + ROUNDOFF


def test_natural_filter_refuses_a_cost_in_numbers_by_name():
    f = F.natural_filter(pj.approx_dp_composition(1.0, 1e-6, 1), step=1 / 128)
    with pytest.raises(ValueError, match="natural: the query must be a pessimistic PLD"):
        f.spend(f.init(), 0.5)


def test_natural_filter_at_no_slack_against_a_gdp_budget():
    """Randomized responses against G_1 at delta_slack 0: the convolution's round-off allowance
    was added to every bin, 3e-13 of mass above the responses' losses, more than G_1's tail, and
    the first one was rejected. The accepted composition is below G_1 (mpmath, both exact)."""
    from reference import gaussian_delta, rr_kfold_delta

    f = F.natural_filter(pj.gdp(1.0, pessimistic=False))
    count, _ = spend_until_rejected(f, rr(0.25))
    assert count >= 4
    for t in np.linspace(-1.0, 6.0, 57):
        assert rr_kfold_delta(0.25, 0.0, count, t) <= gaussian_delta(1.0, t) + ROUNDOFF


@pytest.mark.slow
def test_natural_filter_accepts_the_identity_and_keeps_its_state():
    """Every filter accepts the identity for free: the natural filter keeps its state exactly
    (composed by FFT, the identity would add the per-bin round-off allowance; added to every
    bin, the allowance made it reject even the identity against G_mu at slack 0)."""
    f = F.natural_filter(pj.gdp(0.5, pessimistic=False))
    state, ok = f.spend(f.init(), rr(0.25))
    assert bool(ok)
    after, ok = f.spend(state, pj.identity())
    assert bool(ok)
    for a, b in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_natural_filter_spends_queries_of_many_lengths_with_one_program():
    """Queries whose lengths on the filter's step differ (515, 259, 67 and 42 points here) are
    convolved on the same FFT length with the state: after the first spend, the others compile
    nothing, and they are accepted as against the budget's curve."""
    f = F.natural_filter(pj.gaussian(0.5))
    state, ok = f.spend(f.init(), pj.gaussian(2.0))
    assert bool(ok)
    queries = [pj.gaussian(3.0), pj.laplace(2.0), rr(0.3)]

    def spend_all(state):
        for query in queries:
            state, ok = f.spend(state, query)
            assert bool(ok)
        return state

    state, names = compiled_programs(lambda: spend_all(state))
    assert names == []
    composed = pj.compose([pj.gaussian(2.0), *queries])
    eps = np.array([0.0, 1.0, 2.0])
    assert np.all(np.asarray(f.remaining(state).delta(eps)) >= np.asarray(composed.delta(eps)) - 1e-12)


def test_additive_profile_parameters_and_guarantee():
    f = F.additive_profile_filter(1.0, 1e-6, 10)
    g = f.guarantee
    n = 1 + int(np.ceil(np.log2(10 * 3 / 1.0)))
    assert g["bands"] == n
    logs = int(np.ceil(np.log(1e6)))
    assert g["epsilon"] == n * 2 * logs * 11
    assert g["delta"] == pytest.approx(n * (32 * logs + 4) * 1e-6)
    assert g["budgets"][0] == 10 and g["budgets"][-1] == 4e-6
    assert spend_until_rejected(f, pj.randomized_response(0.1))[0] == 10  # capacity k


def test_additive_filter_accepts_whatever_the_natural_filter_accepts():
    # Thm 14 on one sequence: while the natural (eps, delta) filter accepts, so does the additive
    epsilon, delta = 1.0, 1e-6
    natural = F.natural_filter(pj.approx_dp_composition(epsilon, delta, 1), step=1 / 128)
    additive = F.additive_profile_filter(epsilon, delta, 8)
    queries = [rr(e) for e in (0.25, 0.125, 0.5, 0.25, 0.125)]
    s_nat, s_add = natural.init(), additive.init()
    for q in queries:
        s_nat, ok_nat = natural.spend(s_nat, q)
        s_add, ok_add = additive.spend(s_add, q)
        assert bool(ok_add) or not bool(ok_nat)


# -- the interface: rejection, continuing, jit, vmap ----------------------------------------------
def test_rejected_query_leaves_state_unchanged_and_filter_continues():
    f = F.pure_dp_filter(1.0)
    state, _ = f.spend(f.init(), 0.75)
    after, accepted = f.spend(state, 0.5)
    assert not bool(accepted)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, after, state))
    after, accepted = f.spend(after, 0.25)  # a smaller query still fits
    assert bool(accepted)


@pytest.mark.slow
def test_spend_is_jittable_and_vmappable():
    f = F.gdp_residue_filter(1.0, size=4096)
    eager, ok = f.spend(f.init(), pj.randomized_response(0.5))
    assert bool(ok)
    # jit of vmap: one program for both
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (3,) + x.shape), f.init())
    queries = pj.randomized_response(np.array([0.25, 0.5, 4.0]))
    new, accepted = jax.jit(jax.vmap(f.spend))(states, queries)
    assert np.asarray(accepted).tolist() == [True, True, False]
    left = f.remaining(new)["mu"]
    assert left[1] == pytest.approx(float(f.remaining(eager)["mu"]), rel=1e-12)
    assert left[2] == 1.0  # rejected: unchanged
    # per-example budgets with native costs
    g = F.gdp_filter(1.0)
    many = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (5,) + x.shape), g.init())
    _, ok = jax.vmap(g.spend)(many, jnp.array([0.1, 0.5, 1.0, 1.5, 0.0]))
    assert np.asarray(ok).tolist() == [True, True, True, False, True]


#: (a filter with the given budget, a query, a budget too small for it (None: the filter's
#: shapes would change))
NEW_BUDGETS = {
    "pure_dp": (lambda b: F.pure_dp_filter(b, delta=1e-6), 0.1, 0.01),
    "gdp": (lambda b: F.gdp_filter(b), 0.3, 0.01),
    "gdp_residue": (lambda b: F.gdp_residue_filter(b), 0.3, 0.01),
    "renyi": (lambda b: F.renyi_filter([2.0, 8.0], b), np.array([0.1, 0.4]), 0.01),
    "approx_zcdp": (lambda b: F.approx_zcdp_filter(b, 1e-6), (0.01, 1e-9), 0.001),
    "approx_dp": (lambda b: F.approx_dp_filter(b, 1e-6), 0.1, 0.01),
    "additive_profile": (lambda b: F.additive_profile_filter(b, 1e-6, 10), pj.gdp(0.5), None),
    "natural": (lambda b: F.natural_filter(pj.gdp(b, grid=pj.Grid(step=2**-6, size=2048)),
                                           size=4096), pj.gdp(0.5), 0.01),
}


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=pytest.mark.slow) if kind == "natural"
                                  else kind for kind in NEW_BUDGETS])
def test_a_new_filter_of_a_kind_compiles_nothing(kind):
    # its budget is data: every filter of a kind shares one compiled spend, which reads each
    # filter's own budget
    build, query, small = NEW_BUDGETS[kind]
    first = build(2.0)
    first.spend(first.init(), query)
    for budget, accepts in ((3.0, True), (small, False)):
        if budget is not None:
            other = build(budget)
            (_, accepted), names = compiled_programs(lambda f=other: f.spend(f.init(), query))
            assert names == [] and bool(accepted) == accepts


#: Queries (a PLD, or a cost in numbers) whose spends on the host must agree with the compiled
#: spend: one and two directions, a grid the residue coarsens, a query that does not fit.
HOST_QUERIES = {
    "randomized_response": lambda: pj.randomized_response(0.5),
    "too_large": lambda: pj.randomized_response(4.0),  # nu = 4.19 > 3
    "subsampled_gaussian": lambda: pj.gaussian(1.0, sampling_prob=0.01),
    "number": lambda: 0.4,
}
HOST_FILTERS = {
    "pure_dp": lambda: F.pure_dp_filter(20.0, delta=1e-6),
    "gdp": lambda: F.gdp_filter(3.0),
    "gdp_residue": lambda: F.gdp_residue_filter(3.0, size=4096),
}


@pytest.mark.parametrize("kind, queries", [
    ("gdp_residue", ["randomized_response", "too_large"]),  # one compiled spend: seconds
    pytest.param("gdp_residue", list(HOST_QUERIES), marks=pytest.mark.slow),
    pytest.param("gdp", list(HOST_QUERIES), marks=pytest.mark.slow),
    pytest.param("pure_dp", list(HOST_QUERIES), marks=pytest.mark.slow),
], ids=["gdp_residue", "gdp_residue_all", "gdp_all", "pure_dp_all"])
def test_spends_on_the_host_agree_with_the_compiled_spend(kind, queries):
    # concrete states and queries are spent in NumPy; under a caller's jit the same core is
    # traced and compiled: the same verdicts, and budgets to round-off
    f = HOST_FILTERS[kind]()
    compiled = jax.jit(f.spend)
    verdicts = []
    for name in queries:
        make = HOST_QUERIES[name]
        state = f.init()
        for _ in range(2):  # a fresh budget, then a spent one
            host_state, host_ok = f.spend(state, make())
            traced_state, traced_ok = compiled(state, make())
            assert bool(host_ok) == bool(traced_ok), name
            for key, value in f.remaining(host_state).items():
                np.testing.assert_allclose(value, f.remaining(traced_state)[key], rtol=1e-9,
                                           err_msg=f"{name}: {key}")
            state = host_state
            verdicts.append(bool(host_ok))
    assert True in verdicts and (False in verdicts or kind == "pure_dp")


def test_first_residue_spend_compiles_nothing(tmp_path):
    names, printed = programs_of_a_new_process("""
        import json
        import numpy as np
        import pldjax as pj
        f = pj.filters.gdp_residue_filter(mu=1.0)
        state, accepted = f.spend(f.init(), pj.randomized_response(0.5))
        left = f.remaining(state)
        print(json.dumps({"accepted": bool(accepted),
                          "state": [np.asarray(leaf).tolist() for leaf in state],
                          "left": [float(left["mu"]), float(left["delta"])]}))
    """, cache=tmp_path / "xla")  # empty: every program compiles
    got = {"names": names, **json.loads(printed.splitlines()[-1])}
    assert got["names"] == []  # the query is built, and the spend runs, in NumPy
    # the same state as this process's spend
    f = F.gdp_residue_filter(mu=1.0)
    state, accepted = f.spend(f.init(), pj.randomized_response(0.5))
    assert got["accepted"] and bool(accepted)
    assert got["state"] == [np.asarray(leaf).tolist() for leaf in state]
    left = f.remaining(state)
    assert got["left"] == [float(left["mu"]), float(left["delta"])]
    nu = float(pj.gdp_mu(pj.randomized_response(0.5)))
    assert np.sqrt(1.0 - nu * nu) * (1 - 1e-15) <= got["left"][0] < 1.0
    assert got["left"][1] == pytest.approx(1e-10 - ROUNDOFF, rel=1e-15)


# -- state that survives --------------------------------------------------------------------------
FILTERS = {
    "pure_dp": (lambda: F.pure_dp_filter(1.0), 0.3),
    "gdp_residue": (lambda: F.gdp_residue_filter(1.0), pj.randomized_response(0.5)),
    "renyi": (lambda: F.renyi_filter([2.0, 8.0], [1.0, 3.0]), pj.randomized_response(0.3)),
    "approx_dp": (lambda: F.approx_dp_filter(1.0, 1e-6), (0.1, 1e-8)),
    "natural": (lambda: F.natural_filter(pj.approx_dp_composition(1.0, 1e-6, 1), step=1 / 128),
                pj.randomized_response(0.25, grid=pj.Grid(step=1 / 128))),
    "additive": (lambda: F.additive_profile_filter(1.0, 1e-6, 5), pj.randomized_response(0.25)),
}


@pytest.mark.parametrize("suffix", [".npz", ".json"])
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_save_restore_round_trips_exactly(tmp_path, name, suffix):
    make, query = FILTERS[name]
    f = make()
    state, _ = f.spend(f.init(), query)
    state, _ = f.spend(state, query)
    path = tmp_path / f"state{suffix}"
    pj.io.save_filter_state(path, f, state)
    restored = pj.io.load_filter_state(path, make())
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(restored),
                    strict=True):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        assert np.array_equal(np.asarray(a), np.asarray(b))
    # and the restored filter carries on exactly as the original
    one, ok1 = f.spend(state, query)
    two, ok2 = f.spend(restored, query)
    assert bool(ok1) == bool(ok2)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, one, two))


def test_restore_refuses_another_filter_or_version(tmp_path):
    f = F.pure_dp_filter(1.0)
    path = tmp_path / "state.json"
    pj.io.save_filter_state(path, f, f.init())
    with pytest.raises(ValueError, match="saved for pure_dp"):
        pj.io.load_filter_state(path, F.pure_dp_filter(2.0))
    text = path.read_text().replace('"version": 2', '"version": 99')
    path.write_text(text)
    with pytest.raises(ValueError, match="version"):
        pj.io.load_filter_state(path, f)


@pytest.mark.parametrize("mu, delta_left", [(1000.0, 1e-10), (float("nan"), 1e-10),
                                             (0.5, -1.0), (1.0, 1.0)])
def test_restore_refuses_a_budget_no_spend_reaches(tmp_path, mu, delta_left):
    """A file whose state leaves more budget than a fresh filter, or a NaN or negative one (a
    damaged or edited file), is refused: mu = 1000 on a mu = 1 filter was restored, and then
    accepted a query of 500."""
    from pldjax.adaptive.filters.residue import ResidueState
    from pldjax.core.precision import pack

    f = F.gdp_residue_filter(1.0)
    path = tmp_path / "state.json"
    with jax.enable_x64(True):
        edited = ResidueState(pack(jnp.float64(mu)), pack(jnp.float64(delta_left)))
    pj.io.save_filter_state(path, f, edited)
    with pytest.raises(ValueError, match="no spend reaches"):
        pj.io.load_filter_state(path, f)
    spent, _ = f.spend(f.init(), 0.5)  # a reachable state still loads
    pj.io.save_filter_state(path, f, spent)
    pj.io.load_filter_state(path, f)


@pytest.mark.parametrize("make", [lambda: F.pure_dp_filter(1.0), lambda: F.gdp_residue_filter(1.0),
                                  lambda: F.renyi_filter([2.0, 4.0], [1.0, 2.0])])
def test_batched_filter_states_restore_exactly(tmp_path, make):
    """A vmapped filter's state (one budget per batch element) saves and loads; an element
    edited past a fresh filter's budget is refused."""
    f = make()
    state = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (3, *x.shape)), f.init())
    state, accepted = jax.vmap(f.spend)(state, jnp.asarray([0.1, 0.2, 5.0]))
    assert np.array_equal(accepted, [True, True, False])
    path = tmp_path / "state.npz"
    pj.io.save_filter_state(path, f, state)
    restored = pj.io.load_filter_state(path, f)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, restored, state))
    fresh = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (3, *x.shape)),
                                   make().init())
    edited = jax.tree_util.tree_map(lambda a, b: a.at[1].set(b[1]), state, fresh)
    pj.io.save_filter_state(path, f, edited)  # element 1 given back its budget: reachable
    pj.io.load_filter_state(path, f)
    if f.kind == "pure_dp":  # element 2 edited to a negative spend: more than a fresh budget
        from pldjax.core.precision import pack

        with jax.enable_x64(True):
            negative = pack(jnp.float64(-0.5))
        pj.io.save_filter_state(path, f, state._replace(
            epsilon_spent=state.epsilon_spent.at[2].set(negative)))
        with pytest.raises(ValueError, match="no spend reaches"):
            pj.io.load_filter_state(path, f)


@pytest.mark.parametrize("suffix, damage", [
    (".npz", lambda path: path.write_bytes(path.read_bytes()[:40])),
    (".json", lambda path: path.write_text("[1, 2]")),
    (".json", lambda path: path.write_text(path.read_text().replace('"leaves"', '"other"'))),
    (".json", lambda path: path.write_text(path.read_text().replace('"dtype"', '"other"'))),
    (".json", lambda path: path.write_text(path.read_text()[:30])),
])
def test_restore_refuses_a_damaged_file_by_name(tmp_path, suffix, damage):
    f = F.pure_dp_filter(1.0)
    path = tmp_path / f"state{suffix}"
    pj.io.save_filter_state(path, f, f.init())
    damage(path)
    with pytest.raises(ValueError, match="state"):
        pj.io.load_filter_state(path, f)


def test_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    f = F.pure_dp_filter(1.0)
    path = tmp_path / "state.npz"
    first, _ = f.spend(f.init(), 0.25)
    pj.io.save_filter_state(path, f, first)
    second, _ = f.spend(first, 0.25)

    def broken(stream, **arrays):
        stream.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        pj.io.save_filter_state(path, f, second)
    monkeypatch.undo()
    restored = pj.io.load_filter_state(path, f)
    assert f.remaining(restored)["epsilon"] == 0.75
    assert [p.name for p in tmp_path.iterdir()] == ["state.npz"]


def test_failed_spend_leaves_the_state_usable():
    f = F.gdp_residue_filter(1.0)
    state, _ = f.spend(f.init(), 0.5)
    before = jax.tree_util.tree_map(np.asarray, state)
    with pytest.raises(ValueError, match="pessimistic"):
        f.spend(state, pj.randomized_response(0.5, pessimistic=False))
    with pytest.raises(ValueError, match="number >= 0"):
        f.spend(state, float("nan"))
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, state, before))
    state, accepted = f.spend(state, 0.5)
    assert bool(accepted)


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, mu", [(F.gdp_residue_filter, 1.0), (F.gdp_filter, 1.0),
                                      (F.gdp_residue_filter, 1e-300)])
def test_a_free_query_keeps_the_budget_to_the_bit(make, mu):
    """A cost of 0 left mu 2 ulps lower a spend (a tiny budget, whose square underflows, at 0)."""
    f = make(mu)
    state = f.init()
    for _ in range(5):
        state, accepted = f.spend(state, 0.0)
        assert bool(accepted)
    assert float(f.remaining(state)["mu"]) == mu


def test_bad_input_is_refused_with_the_argument_named():
    with pytest.raises(ValueError, match="mu"):
        F.gdp_residue_filter(-1.0)
    with pytest.raises(ValueError, match="epsilon"):
        F.pure_dp_filter(float("nan"))
    with pytest.raises(ValueError, match="delta"):
        F.approx_dp_filter(1.0, 1.5)
    with pytest.raises(ValueError, match="delta"):
        F.additive_profile_filter(1.0, 0.3, 10)
    for orders in ([0.5], [], [[2.0, 3.0]], "2"):  # an empty list of orders would accept anything
        with pytest.raises(ValueError, match="orders"):
            F.renyi_filter(orders, 1.0)
    with pytest.raises(ValueError, match="number >= 0"):
        F.pure_dp_filter(1.0).spend(F.pure_dp_filter(1.0).init(), -0.1)
    for state in (None, (1, 2, 3), F.pure_dp_filter(1.0).init()):
        with pytest.raises(ValueError, match="state must be this gdp_residue filter's state"):
            F.gdp_residue_filter(1.0).spend(state, pj.randomized_response(0.5))
    with pytest.raises(ValueError, match="one query"):
        f = F.gdp_filter(1.0)
        f.spend(f.init(), pj.randomized_response(np.array([0.1, 0.2])))
    with pytest.raises(ValueError, match="symmetric"):
        f = F.additive_profile_filter(1.0, 1e-6, 4)
        f.spend(f.init(), pj.gaussian(2.0, sampling_prob=0.1))
    with pytest.raises(ValueError, match="query: natural would re-grid .* grid.MAX_SIZE"):
        f = F.natural_filter(pj.approx_dp_composition(1.0, 1e-6, 1), step=2.0**-20)
        f.spend(f.init(), pj.gdp(2.0))  # 2048 points on the step 1/32: 2^26 points at 2^-20
    with pytest.raises(ValueError, match="mu"):
        pj.gdp_residue(-0.5, pj.randomized_response(0.5))


# -- degenerate queries: never accepted, state untouched ---------------------------------
def _pld(probs, inf_mass=0.0, offset=-1, step=0.5):
    """A query PLD whose parts no constructor checked, as a caller's jit hands one over (the
    constructor refuses such parts when they are concrete)."""
    return unchecked_pld(jnp.asarray(probs, jnp.float64), jnp.asarray(inf_mass, jnp.float64),
                         jnp.asarray(offset, jnp.int64), jnp.asarray(step, jnp.float64))


DEGENERATE = {
    "nan mass": (lambda: _pld([np.nan, 0.5]), "NaN"),
    "nan atom": (lambda: _pld([0.5, 0.5], np.nan), "NaN"),
    "negative mass": (lambda: _pld([1.2, -0.2]), "negative"),
    "mass deficit": (lambda: _pld([0.5, 0.4]), "total mass"),
    "empty": (lambda: _pld([0.0, 0.0]), "total mass"),
    "zero step": (lambda: _pld([0.5, 0.5], step=0.0), "step"),
    "infinite step": (lambda: _pld([0.5, 0.5], step=np.inf), "step"),
    "negative step": (lambda: _pld([0.5, 0.5], step=-0.5), "step"),
    "only negative losses": (lambda: _pld([1.0]), "Q mass"),
}
ALL_FILTERS = {
    "pure_dp": lambda: F.pure_dp_filter(1e300, delta=1.0),
    "gdp": lambda: F.gdp_filter(1e6, delta=1.0),
    "gdp_residue": lambda: F.gdp_residue_filter(10.0, delta=1.0),
    "renyi": lambda: F.renyi_filter([2.0, 8.0], [1e300, 1e300]),
    "approx_zcdp": lambda: F.approx_zcdp_filter(1e300, 1.0),
    "approx_dp": lambda: F.approx_dp_filter(1e3, 0.5),
    "additive_profile": lambda: F.additive_profile_filter(1.0, 1e-6, 5),
}


def _same(a, b):
    return jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, a, b))


@pytest.mark.parametrize("name", sorted(ALL_FILTERS))
def test_degenerate_query_plds_raise_on_the_host(name):
    f = ALL_FILTERS[name]()
    for case, (make, reason) in DEGENERATE.items():
        with pytest.raises(ValueError, match=f"{f.kind}: the query PLD is degenerate.*{reason}"):
            f.spend(f.init(), make())
            pytest.fail(case)


def test_query_checks_agree_on_the_host_and_in_the_spend():
    """The checks of a concrete query run in NumPy on the host, those in the spend traced: they
    flag the same rules for degenerate and valid queries alike."""
    from pldjax.core.pld import pld_problems

    def traced(query):
        return jnp.stack([bad for *_, bad in pld_problems(query)])

    degenerate = [make() for make, _ in DEGENERATE.values()]
    valid = [pj.randomized_response(0.5), pj.gaussian(1.0, sampling_prob=0.1)]
    for i, query in enumerate(degenerate + valid):
        on_host = [bool(bad) for *_, bad in pld_problems(query)]
        assert on_host == np.asarray(jax.jit(traced)(query)).tolist()
        assert any(on_host) == (i < len(degenerate))


@pytest.mark.parametrize("name", ["pure_dp", *(pytest.param(name, marks=pytest.mark.slow)
                                            for name in ("renyi", "gdp"))])
def test_degenerate_query_plds_are_rejected_under_jit_and_vmap(name):
    f = ALL_FILTERS[name]()
    spend = jax.jit(f.spend)
    for make, _ in DEGENERATE.values():
        state, accepted = spend(f.init(), make())
        assert not bool(accepted) and _same(state, f.init())
    batch = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *(m() for m, _ in
                                                             list(DEGENERATE.values())[:5]))
    states, accepted = jax.vmap(f.spend, in_axes=(None, 0))(f.init(), batch)
    assert not np.any(np.asarray(accepted))
    assert _same(states, jax.tree_util.tree_map(lambda x: jnp.stack([x] * 5), f.init()))


@pytest.mark.parametrize("name", ["pure_dp", pytest.param("gdp", marks=pytest.mark.slow)])
def test_query_plds_closed_over_by_a_callers_jit(name):
    """A PLD closed over by the caller's jit (not passed as an argument) is concrete, but its
    checks run under the caller's trace: spend raised TracerBoolConversionError. Now a good query
    spends as when passed as an argument, and a degenerate one is refused in the spend."""
    f = ALL_FILTERS[name]()
    good = pj.gaussian(1.0, sampling_prob=0.1)
    want = f.spend(f.init(), good)
    got = jax.jit(lambda state: f.spend(state, good))(f.init())
    assert bool(got[1]) and bool(want[1])
    # the budgets to round-off (the eager spend runs in NumPy, the traced one compiled)
    for key, value in f.remaining(want[0]).items():
        np.testing.assert_allclose(f.remaining(got[0])[key], value, rtol=1e-12, atol=0)
    for make, _ in DEGENERATE.values():
        bad = make()
        state, accepted = jax.jit(lambda state, bad=bad: f.spend(state, bad))(f.init())
        assert not bool(accepted) and _same(state, f.init())


def test_degenerate_queries_cost_nothing_no_more():
    # pure_dp accepted laplace(1e-5) (NaN masses) again and again at zero cost
    f = F.pure_dp_filter(1.0)
    tiny = pj.laplace(1e-5)
    state = f.init()
    for _ in range(3):
        try:
            state, accepted = f.spend(state, tiny)
        except ValueError:
            accepted = False
        assert not bool(accepted)
    assert f.remaining(state)["epsilon"] == 1.0
    # a Rényi filter recorded spent = -inf for RR(0.5, delta=1) composed twice, then took anything
    r = F.renyi_filter([2.0, 8.0], [1.0, 1.0])
    state = r.init()
    try:
        state, accepted = r.spend(state, pj.randomized_response(0.5, 1.0).self_compose(2))
    except ValueError:
        accepted = False
    assert not bool(accepted)
    assert np.all(r.remaining(state)["budget"] == 1.0)
    _, accepted = r.spend(state, 1e9)
    assert not bool(accepted)


@pytest.mark.parametrize("cost", [np.nan, -1e-300, -1.0])
def test_nan_or_negative_costs_raise_on_the_host_and_are_rejected_under_jit(cost):
    for f, wrap in ((F.pure_dp_filter(1.0), float), (F.gdp_filter(1.0), float),
                    (F.gdp_residue_filter(1.0), float),
                    (F.renyi_filter([2.0, 4.0], 1.0), lambda c: [0.1, c]),
                    (F.approx_dp_filter(1.0, 1e-6), lambda c: (0.1, c)),
                    (F.additive_profile_filter(1.0, 1e-6, 5), float)):
        with pytest.raises(ValueError, match=f"{f.kind}: a query cost must be a number >= 0"):
            f.spend(f.init(), wrap(cost))
        state, accepted = jax.jit(f.spend)(f.init(), jax.tree_util.tree_map(
            jnp.asarray, wrap(cost)))
        assert not bool(accepted) and _same(state, f.init())


@pytest.mark.parametrize("cost", [0.5j, 0.5 + 5j, 0.5 + 0j, np.complex64(0.25), True, np.bool_(False)])
def test_complex_and_boolean_costs_raise_on_the_host_and_are_rejected_under_jit(cost):
    """pure_dp_filter(1.0) charged 0.5j as 0 and 0.5 + 5j as 0.5: a complex cost had its
    imaginary part dropped; and True as 1. Costs are real numbers."""
    for f, wrap in ((F.pure_dp_filter(1.0), lambda c: c), (F.gdp_filter(1.0), lambda c: c),
                    (F.gdp_residue_filter(1.0), lambda c: c),
                    (F.renyi_filter([2.0, 4.0], 1.0), lambda c: [0.1, c]),
                    (F.renyi_filter([2.0, 4.0], 1.0), lambda c: np.array([c, c])),
                    (F.approx_zcdp_filter(1.0, 1e-6), lambda c: (c, 0.0)),
                    (F.approx_dp_filter(1.0, 1e-6), lambda c: (0.1, c)),
                    (F.approx_dp_filter(1.0, 1e-6), lambda c: c),
                    (F.additive_profile_filter(1.0, 1e-6, 5), lambda c: c)):
        with pytest.raises(ValueError, match=f"{f.kind}: a query cost must be a real number"):
            f.spend(f.init(), wrap(cost))
        state, accepted = jax.jit(f.spend)(f.init(), jax.tree_util.tree_map(
            jnp.asarray, wrap(cost)))
        assert not bool(accepted) and _same(state, f.init())


def test_a_sensitivity_outside_zero_to_one_is_rejected_by_the_residue_table():
    """table_spend compared a complex sensitivity 0.5j by its real part (0) and charged it a cost
    for c = 0.25, and read c = -0.5 as the node c = 0 (free)."""
    from pldjax.adaptive.filters.residue import ResidueTable, table_spend

    with jax.enable_x64(True):
        # the lookup's checks do not depend on the costs: a small table of costs 0.1 c
        c_nodes = np.linspace(0.0, 1.0, 5)
        table = ResidueTable(*(jnp.asarray(a, jnp.float64) for a in (
            [0.0, 0.5, 1.0, 2.0], c_nodes, np.tile(0.1 * c_nodes, (4, 1)),
            np.where(c_nodes > 0, 1e-9, 0.0), 1.0, 0.01)))
        mu, left = jnp.ones(4), jnp.full(4, 1e-6)
        for bad in ([0.5j, 0.5 + 0j, 1j, -1j], [-0.5, -1e-300, np.nan, 1.5]):
            new_mu, new_left, accepted = table_spend(table, mu, left, jnp.asarray(bad))
            assert not np.any(np.asarray(accepted)), bad
            assert np.array_equal(new_mu, mu) and np.array_equal(new_left, left)
        _, _, accepted = table_spend(table, mu, left, jnp.asarray([0.0, 0.25, 0.5, 1.0]))
    assert np.all(np.asarray(accepted))


def test_an_infinite_cost_is_valid_and_rejected():
    for f, query in ((F.pure_dp_filter(1.0), np.inf), (F.approx_dp_filter(1.0, 1e-6), (0.1, np.inf)),
                     (F.renyi_filter([2.0], 1.0), np.inf)):
        state, accepted = f.spend(f.init(), query)
        assert not bool(accepted) and _same(state, f.init())


def test_malformed_queries_and_budgets_name_the_argument():
    r = F.renyi_filter([2.0, 4.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="renyi: the query must be a pessimistic PLD or a cost"):
        r.spend(r.init(), None)
    with pytest.raises(ValueError, match="renyi: the query must be"):
        r.spend(r.init(), "0.1")
    with pytest.raises(ValueError, match=r"renyi: a query cost must have shape \(2,\)"):
        r.spend(r.init(), [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"budget must be one number or one per order \(3"):
        F.renyi_filter([2.0, 4.0, 8.0], [1.0, 1.0])
    a = F.approx_dp_filter(1.0, 1e-6)
    with pytest.raises(ValueError, match="approx_dp: a query cost is a pair"):
        a.spend(a.init(), (0.1, 1e-8, 0.0))
    z = F.approx_zcdp_filter(1.0, 1e-6)
    with pytest.raises(ValueError, match="approx_zcdp: a query cost is a pair .* of numbers"):
        z.spend(z.init(), (pj.gdp(0.5), 0.0))
    p = F.pure_dp_filter(1.0)
    with pytest.raises(ValueError, match="pure_dp: the query must be"):
        p.spend(p.init(), None)
    with pytest.raises(ValueError, match="pure_dp: spend takes one query PLD"):
        p.spend(p.init(), pj.randomized_response(np.array([0.1, 0.2])))


# -- x64 off in the caller -------------------------------------------------------------
def test_states_are_bit_identical_with_x64_on_and_off():
    runs = {}
    for flag in (True, False):
        jax.config.update("jax_enable_x64", flag)
        try:
            runs[flag] = {}
            for name, (make, query) in FILTERS.items():
                f = make()
                state, _ = f.spend(f.init(), query)
                state, _ = f.spend(state, query)
                runs[flag][name] = jax.tree_util.tree_map(np.asarray, state)
        finally:
            jax.config.update("jax_enable_x64", True)
    for name in FILTERS:
        assert _same(runs[True][name], runs[False][name]), name


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_restored_state_keeps_its_budget_exactly_with_x64_off(x64_off, tmp_path, suffix):
    f = F.pure_dp_filter(1.0)
    state, _ = f.spend(f.init(), 0.9)
    path = tmp_path / f"s{suffix}"
    pj.io.save_filter_state(path, f, state)
    restored = pj.io.load_filter_state(path, f)
    assert _same(state, restored)
    assert not bool(f.spend(restored, 0.1000000001)[1])
    assert bool(f.spend(restored, 0.0999999999)[1])
    assert f.remaining(restored)["epsilon"] == 1.0 - 0.9


def test_jitted_spend_with_python_floats_stays_sound_with_x64_off(x64_off):
    f = F.pure_dp_filter(1.0)
    spend = jax.jit(f.spend)
    state, accepted = spend(f.init(), 0.9)  # rounded to float32 at the caller's jit boundary
    assert bool(accepted)
    spent = 1.0 - float(f.remaining(state)["epsilon"])
    low, high = np.float32(0.9), np.nextafter(np.float32(0.9), np.float32(1))
    assert spent >= (float(low) + float(high)) / 2  # the top of 0.9's float32 interval
    assert not bool(spend(state, 0.10000001)[1])
    assert not bool(spend(state, 0.1)[1])  # documented: rejected by < 3e-8 relative
    assert bool(spend(state, 0.0999999)[1])


def test_vmapped_spend_takes_jax_and_numpy_costs_with_x64_off(x64_off):
    f = F.gdp_filter(1.0)
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (3,) + x.shape), f.init())
    _, one = jax.vmap(f.spend)(states, jnp.array([0.1, 0.5, 2.0]))
    _, two = jax.vmap(f.spend)(states, np.array([0.1, 0.5, 2.0]))
    assert np.asarray(one).tolist() == np.asarray(two).tolist() == [True, True, False]


def test_float32_query_plds_are_refused_inside_a_jit_with_x64_off(x64_off):
    f = F.gdp_filter(1.0)
    rr = pj.randomized_response(0.5)
    numpy_leaves = pj.PLD(np.asarray(rr.probs), np.asarray(rr.inf_mass), np.asarray(rr.offset),
                          np.asarray(rr.step))  # NumPy float64 becomes float32 at the boundary
    with pytest.raises(ValueError, match="gdp: the query PLD's probs arrived as float32"):
        jax.jit(f.spend)(f.init(), numpy_leaves)
    _, accepted = jax.jit(f.spend)(f.init(), rr)  # JAX float64 arrays pass unchanged
    assert bool(accepted)


def test_upper_of_rounded_is_the_top_of_the_float32_rounding_interval():
    from pldjax.core.precision import lower_of_rounded, upper_of_rounded

    values = np.array([0.1, 0.9, 1.0, 2.0, 3.0, 1e-30, 1e30, 65504.0], np.float32)
    up = np.asarray(upper_of_rounded(jnp.asarray(values)))
    above = np.nextafter(values, np.float32(np.inf))
    np.testing.assert_array_equal(up, (values.astype(np.float64) + above) / 2)  # exact midpoint
    assert np.all(np.asarray(lower_of_rounded(jnp.asarray(values))) < values)
    assert float(upper_of_rounded(jnp.float32(np.finfo(np.float32).max))) == np.inf
    tiny = float(np.finfo(np.float32).tiny)
    assert float(upper_of_rounded(jnp.float32(0.0))) == tiny  # subnormals included
    assert float(upper_of_rounded(jnp.asarray(0.1, jnp.float64))) == 0.1  # float64: exact


@pytest.mark.slow
def test_residue_filter_never_below_the_gdp_filter_at_large_mu():
    rr = pj.randomized_response(0.5)
    nu = float(pj.gdp_mu(rr))
    for mu in (300.0, 1e4, 1e6):
        f = F.gdp_residue_filter(mu)
        state, accepted = f.spend(f.init(), rr)
        assert bool(accepted)
        assert f.remaining(state)["mu"] >= np.sqrt(mu * mu - nu * nu) * (1 - 1e-15)


def test_version_1_files_with_64_bit_leaves_still_load(tmp_path):
    import json

    f = F.pure_dp_filter(1.0)
    leaf = {"dtype": "<f8", "shape": [], "values": [(0.25).hex()]}
    zero = {"dtype": "<f8", "shape": [], "values": [(0.0).hex()]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "pldjax-state", "version": 1, "kind": "pure_dp",
                                "params": {"epsilon": 1.0, "delta": 0.0},
                                "leaves": [leaf, zero]}))
    restored = pj.io.load_filter_state(path, f)
    assert f.remaining(restored)["epsilon"] == 0.75
    assert _same(restored, f.spend(f.init(), 0.25)[0])


def test_natural_filter_window_size_is_capped():
    with pytest.raises(ValueError, match="size"):
        pj.filters.natural_filter(pj.gdp(1.0, pessimistic=False), size=2**40)


def test_additive_filter_names_what_is_out_of_range():
    with pytest.raises(ValueError, match="epsilon = 1e-300 is too small"):
        F.additive_profile_filter(1e-300, 1e-6, 10)
    for rounds in [10**18, 10**400]:  # not a bare OverflowError
        with pytest.raises(ValueError, match=r"rounds must be an integer in \[1, 2\^53\]"):
            F.additive_profile_filter(1.0, 1e-6, rounds)


def test_subnormal_costs_are_never_charged_as_zero():
    """XLA on a CPU flushes subnormal numbers to 0: a pure-DP filter of budget 0 accepted a cost
    of 5e-324, and filters of budget 1e-310 accepted any number of costs of 1e-310 (the budget
    itself flushed to 0, or the charge: approx-DP halves a square of the smallest normal). A
    positive cost is now charged at least the smallest normal."""
    f = F.pure_dp_filter(0.0)
    assert not bool(f.spend(f.init(), 5e-324)[1])
    for f, query in ((F.pure_dp_filter(1e-310), 1e-310), (F.renyi_filter([2.0], 1e-310), [1e-310]),
                     (F.approx_zcdp_filter(1e-310, 1e-6), 1e-310),
                     (F.approx_dp_filter(1e-310, 1e-6), (1e-310, 0.0))):
        state, accepted = f.spend(f.init(), query)
        assert not bool(accepted)
    # tiny normal costs still add up exactly where they fit
    f = F.pure_dp_filter(1e-300)
    state = f.init()
    for _ in range(5):
        state, accepted = f.spend(state, 1e-310)
        assert bool(accepted)


def test_natural_filter_step_must_fit_the_memory_guard():
    """step = 1e-300 overflowed int64 into a filter of 2 points (warnings only); a step whose
    budget window needs more than grid.MAX_SIZE points, or above grid.MAX_STEP, names step."""
    budget = pj.approx_dp_composition(1.0, 1e-6, 1)
    for step in (1e-300, 1e-9, 1e300):
        with pytest.raises(ValueError, match="step"):
            F.natural_filter(budget, step=step)
