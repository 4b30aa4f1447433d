"""Gaussian DP: gdp_mu's certificate holds with its documented slack against an
independent mpmath evaluation, and the GDP residue is never NaN (-inf for a query that does not
fit) and never below the naive update sqrt(mu^2 - nu^2), for mu over its whole practical range."""

import functools
import json

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from compiled_programs import accounting_on_the_host, compiled_programs, programs_of_a_new_process
from reference import gaussian_delta_mp

import pldjax as pj
from pldjax.kernels import gaussian_dp
from pldjax.kernels.dominance import ROUNDOFF
from pldjax.kernels.gaussian_dp import newton_search


def _exact_delta0(direction) -> mp.mpf:
    """delta at eps = 0 of a grid PLD, from its masses in 40-digit arithmetic."""
    probs = np.asarray(direction.probs)
    z = (int(direction.offset) + np.arange(probs.size)) * float(direction.step)
    total = mp.mpf(float(direction.inf_mass))
    for p, loss in zip(probs, z, strict=True):
        if loss > 0 and p > 0:
            total += mp.mpf(float(p)) * -mp.expm1(-mp.mpf(float(loss)))
    return total


@pytest.mark.parametrize("size", [None, pytest.param(2**14, marks=pytest.mark.slow)])
def test_gdp_mu_certificate_holds_at_eps_0_by_mpmath(size):
    mp.mp.dps = 40
    grid = None if size is None else pj.Grid(size=size)
    worst = -np.inf
    for eps in np.geomspace(1e-3, 20.0, 12 if size is None else 5):
        for delta in (0.0, 1e-8):
            query = pj.randomized_response(float(eps), delta, grid=grid)
            mu = float(pj.gdp_mu(query))
            gdp0 = 2 * mp.ncdf(mp.mpf(mu) / 2) - 1  # delta of G_mu at eps = 0
            for direction in query.directions():
                worst = max(worst, float(_exact_delta0(direction) - gdp0))
    assert worst <= ROUNDOFF


@pytest.mark.slow
@pytest.mark.parametrize("query", ["rr", "gaussian"])
def test_gdp_residue_is_finite_and_at_least_naive_for_all_mu(query):
    q = pj.randomized_response(0.5) if query == "rr" else pj.gaussian(2.0)
    mus = np.geomspace(1e-3, 1e6, 19)
    nu = float(pj.gdp_mu(q, mu_max=1e7))
    residue = np.asarray(pj.gdp_residue(mus, q))
    fits = mus > nu * (1 + 1e-12)
    assert not np.any(np.isnan(residue))  # never NaN: -inf where the query does not fit
    assert np.all(np.isfinite(residue[fits])) and np.all(residue[mus < nu] == -np.inf)
    naive = np.sqrt(mus[fits] ** 2 - nu**2)
    assert np.all(residue[fits] >= naive * (1 - 1e-15))
    assert np.all(residue[fits] <= mus[fits])
    # the cases: 1e4 fits (it was NaN), 300 at least the naive 299.99935
    if query == "rr":
        assert float(pj.gdp_residue(1e4, q)) >= np.sqrt(1e8 - nu**2) * (1 - 1e-15)
        assert float(pj.gdp_residue(300.0, q)) >= 299.99935


@pytest.mark.slow
def test_gdp_residue_of_a_small_gdp_query_at_least_naive():
    # property finding: gdp_residue(50, gdp(0.05)) was 49.99991 < naive 49.999975
    q = pj.gdp(0.05)
    nu = float(pj.gdp_mu(q, mu_max=50.0))
    got = float(pj.gdp_residue(50.0, q, delta_slack=float(q.inf_mass)))
    assert got >= np.sqrt(2500.0 - nu * nu) * (1 - 1e-15)


def test_residue_window_size_is_capped():
    with pytest.raises(ValueError, match="size"):
        pj.gdp_residue(1.0, pj.randomized_response(0.5), size=2**40)


@pytest.mark.parametrize("mu", [pytest.param(1e11, marks=pytest.mark.slow), 1e50,
                                pytest.param(1e100, marks=pytest.mark.slow)])
def test_residue_for_huge_budgets(mu):
    # found by the long property profile: the coarsening factor overflowed int64 (raw OverflowError)
    residue = float(pj.gdp_residue(mu, pj.gdp(0.05)))
    assert mu * (1 - 1e-12) <= residue <= mu
    with pytest.raises(ValueError, match="mu"):
        pj.gdp_residue(1e200, pj.gdp(0.05))


@pytest.mark.parametrize("xp", ["jax", "numpy"])
def test_gdp_curve_within_its_error_bound_by_mpmath(xp):
    # G_mu's curve from erfc and the Mills ratio (no log_ndtr); the residue and gdp_mu
    # certificates widen it by gdp_error on each side, so that bound must hold, compiled (XLA's
    # erfc) and on the host (SciPy's)
    import jax.numpy as jnp

    from pldjax.kernels.gaussian_dp import gdp_complement_upper, gdp_error, gdp_parts

    xp = jnp if xp == "jax" else np

    mp.mp.dps = 40
    worst = 0.0
    for mu in (1e-3, 0.05, 0.7, 3.0, 40.0, 500.0):
        xs = np.concatenate([np.linspace(-mu * mu - 5 * mu, mu * mu / 2 + 30 * mu, 40),
                             np.linspace(-2.0, 2.0, 9)])
        parts = gdp_parts(np.float64(mu), xp.asarray(xs))
        complement = np.asarray(gdp_complement_upper(np.float64(mu), xp.asarray(xs), parts[1]))
        delta, tail = (np.asarray(v) for v in parts)
        bound = float(gdp_error(mu))
        for x, d, t, c in zip(xs, delta, tail, complement, strict=True):
            m, xm = mp.mpf(mu), mp.mpf(float(x))
            exact_tail = mp.exp(xm) * mp.ncdf(-m / 2 - xm / m)
            exact = mp.ncdf(m / 2 - xm / m) - exact_tail
            # 1 - delta from above, where the bounds near 1 read it
            assert c >= mp.ncdf(-m / 2 + xm / m) + exact_tail
            if exact > mp.mpf(1e-290):
                worst = max(worst, float(abs(d - exact) / exact) / bound)
            else:
                assert d <= 1e-280
            if exact_tail > mp.mpf(1e-290):
                assert abs(t - exact_tail) <= 1e-11 * exact_tail
            else:
                assert t <= 1e-280
    assert worst <= 0.25  # a 4x margin on the bound used


def test_gdp_bounds_hold_where_the_curve_loses_its_digits():
    # delta_mu(x) for mu far below the float's resolution of 1/2 (computed as a difference of
    # two values near 1/2, it reads 0 at mu = 1e-16): the upper bound still holds, and is tight
    # at x = 0 and wherever the curve keeps its digits; the lower bound holds (0 where the digits
    # are lost, loose where few are kept) and is tight beyond, into the subnormal range of the
    # tails
    from pldjax.kernels.gaussian_dp import gdp_delta_lower, gdp_delta_upper

    mp.mp.dps = 50
    for mu in (1e-17, 1e-16, 1e-15, 1e-12, 1e-9, 1e-3, 0.7, 40.0, 1e6):
        xs = np.concatenate([[0.0], mu * np.array([0.1, 1.0, 3.0, 10.0]),
                             mu * mu / 2 + mu * np.array([5.0, 37.0, 38.5])])
        upper = np.asarray(gdp_delta_upper(np.float64(mu), xs))
        lower = np.asarray(gdp_delta_lower(np.float64(mu), xs))
        for x, u, lo in zip(xs, upper, lower, strict=True):
            m, xm = mp.mpf(mu), mp.mpf(float(x))
            exact = mp.ncdf(m / 2 - xm / m) - mp.exp(xm) * mp.ncdf(-m / 2 - xm / m)
            assert lo <= exact <= u + 1e-300, (mu, x)
            if x == 0.0 or mu >= 1e-3:
                assert u <= exact * (1 + 1e-6), (mu, x)
            if mu >= 1e-3:  # the relative error bound is 2^-32 (1 + 1/mu)
                assert lo >= exact * (1 - 1e-6) - 2e-300, (mu, x)


@pytest.mark.parametrize("boundary", [0.987115, 0.85, 0.8388])
def test_newton_search_closes_on_a_kinked_score_in_a_few_tests(boundary):
    # A subsampled-Gaussian query's score is a flat comparison's below the boundary and
    # the binding, near linear one's above it (shape and slopes from the bench's pair 0); a secant
    # through the last two points stalled next to the passing end and used every test. Newton
    # steps from the failing end, with the active comparison's slope, land on the boundary.
    tests = []

    def evaluate(s):
        jax.debug.callback(lambda value: tests.append(float(value)), s)
        steep = 26.0 * (s - boundary)
        flat = -0.004 - 0.5 * (boundary - s)
        binding = (s > boundary) | (steep > flat)
        return (s <= boundary, jnp.where(binding, steep, flat), jnp.where(binding, 26.0, 0.5),
                s)

    found = float(newton_search(evaluate, (0.8387, 0.8387), 1.0, 0.8387 + 0.3 * (1 - 0.8387), 5,
                                lambda good: 1e-5 * good + 1e-7))
    assert boundary - 2e-5 <= found <= boundary
    assert len(tests) <= 5 and tests[0] == pytest.approx(0.8387 + 0.3 * (1 - 0.8387))
    tests.clear()
    # only a value that passed is returned: with no steps after the first test, its value or the
    # start
    assert float(newton_search(evaluate, (0.8387, 0.8387), 1.0, 0.9, 0,
                               lambda good: 1e-5 * good)) == (0.9 if boundary >= 0.9 else 0.8387)
    assert tests == [0.9]


@pytest.mark.slow  # two compilations of the residue kernel each, 5-15 s
@pytest.mark.parametrize("sigmas, sampling_prob, mu", [
    ([1.2, 1.5, 1.9], 0.1, [0.8, 0.9, 1.0]),
    # the per-example table's: sigma = 8 sets a fine grid, so the batch is coarsened 16-fold and
    # chords bind (a slope taken at the worst point instead of the worst chord took 12-15 tests)
    ([2.0, 1.6, 1.0, 8.0], 0.05, [0.2155, 0.3536, 2.0, 2.0]),
])
def test_residue_search_of_subsampled_gaussian_queries_converges_in_a_few_tests(
        sigmas, sampling_prob, mu):
    # 6 tests give what 41 give
    query = pj.gaussian(np.array(sigmas), sampling_prob=sampling_prob)
    mu = np.array(mu)
    few = np.asarray(pj.gdp_residue(mu, query, steps=5))
    many = np.asarray(pj.gdp_residue(mu, query, steps=40))
    assert np.all(np.abs(few - many) <= 1e-5 * mu)
    naive = np.sqrt(mu**2 - np.asarray(pj.gdp_mu(query)) ** 2)
    assert np.all(few >= naive * (1 - 1e-15)) and np.all(many <= mu)


@pytest.mark.slow  # each chunk size compiles the search once: 25-30 s from an empty cache
def test_gdp_residue_does_not_depend_on_its_batch_size_and_numpy_agrees(monkeypatch):
    """Pairs are searched in chunks (4 on a CPU by default, where a chunk runs as long as its
    slowest pair): every chunking gives the same residues, bit for bit. At most HOST_ROWS pairs
    in host memory are searched in NumPy instead (no program to compile): the same certificates
    and search steps, so the same residues up to round-off and the search's path; gdp_mu
    likewise."""
    from pldjax.core import pld as pld_module

    sigmas = jnp.linspace(1.0, 2.0, 5)
    queries = pj.gaussian(sigmas, sampling_prob=0.1)
    mus = np.linspace(0.75, 1.0, 5)
    host, host_mu = np.asarray(pj.gdp_residue(mus, queries)), np.asarray(pj.gdp_mu(queries))
    monkeypatch.setattr(gaussian_dp, "HOST_ROWS", 0)  # the compiled searches from here on
    monkeypatch.setattr(pld_module, "HOST_ROWS", 0)
    default = np.asarray(pj.gdp_residue(mus, queries))  # two chunks of 4, the last padded
    # three chunks, the last padded
    np.testing.assert_array_equal(np.asarray(pj.gdp_residue(mus, queries, batch_size=2)), default)
    np.testing.assert_allclose(host, default, rtol=1e-6)
    np.testing.assert_allclose(host_mu, np.asarray(pj.gdp_mu(queries)), rtol=1e-12)
    assert np.all(host >= np.sqrt(mus**2 - host_mu**2) * (1 - 1e-15))


def test_many_residue_pairs_run_on_the_host_until_their_window_is_compiled(monkeypatch):
    """More pairs than HOST_ROWS are searched in NumPy while the process's host work lasts and
    their window's rent (HOST_RESIDUE_PAIRS) is not spent; then the window's program runs. Both
    give the residues of the same certificates and search, up to round-off and the search's
    path, above the naive update."""
    from pldjax.core.compilation import host_work

    accounting_on_the_host(monkeypatch)
    monkeypatch.setattr(gaussian_dp, "HOST_RESIDUE_PAIRS", 30)
    query = pj.randomized_response(0.3)
    mus = np.linspace(0.5, 2.0, 20)  # one window, more pairs than HOST_ROWS
    host = np.asarray(pj.gdp_residue(mus, query))
    rented = host_work.done
    assert rented > 0 and len(host_work.rents) == 1
    compiled = np.asarray(pj.gdp_residue(mus, query))  # 40 pairs would pass the rent of 30
    assert host_work.done == rented
    np.testing.assert_allclose(host, compiled, rtol=1e-6)
    naive = np.sqrt(mus**2 - float(pj.gdp_mu(query)) ** 2)
    assert np.all(host >= naive * (1 - 1e-15)) and np.all(host <= mus)


@pytest.mark.slow
def test_gdp_residue_of_a_pair_does_not_depend_on_the_other_pairs_of_its_call():
    """Each query's own grid step (and largest budget) sets its check window, so a call
    mixing fine and coarse grids gives each pair what a call of its own gives, bit for bit (the
    whole batch was checked on the finest grid's window: the coarse query here over 32 times the
    reach it needs)."""
    queries = pj.randomized_response(jnp.asarray([0.1, 2.0]))  # steps 2^-10 and 2^-5
    mus = np.array([1.0, 2.5])
    together = np.asarray(pj.gdp_residue(mus, queries))
    alone = [float(pj.gdp_residue(mus[i], queries[i])) for i in range(2)]
    np.testing.assert_array_equal(together, alone)
    assert np.all(together > np.sqrt(mus**2 - np.asarray(pj.gdp_mu(queries)) ** 2))


@pytest.mark.slow
def test_gdp_residue_calls_of_other_counts_share_their_programs(monkeypatch):
    """The numbers of queries and of pairs are padded to a power of two of chunks, whose chunks
    past the count are not run: a call with a new count compiled every kernel of the call anew
    (11-14 s for 60, 63 and 64 subsampled-Gaussian queries on a 2-core CPU); 5, 7 and 8
    queries of one window now share them, and each pair gets the residue of a call of its own."""
    monkeypatch.setattr(gaussian_dp, "HOST_ROWS", 0)  # the compiled search, not NumPy's

    def residues(count):
        return np.asarray(pj.gdp_residue(np.full(count, 1.0),
                                         pj.randomized_response(jnp.full(count, 0.3))))

    five = residues(5)
    # 8: two whole chunks, nothing padded
    (seven, eight), names = compiled_programs(lambda: (residues(7), residues(8)))
    assert not {"jit(_queries_nu)", "jit(_residue_pairs)"} & set(names)
    np.testing.assert_array_equal(seven, np.full(7, five[0]))
    np.testing.assert_array_equal(eight, np.full(8, five[0]))
    # on the batch's automatic grid (one query alone is built on its lattice)
    alone = float(pj.gdp_residue(1.0, pj.randomized_response(0.3, grid=pj.Grid())))
    np.testing.assert_array_equal(five, np.full(5, alone))


def test_chunks_past_the_count_are_not_run():
    """map_chunks runs the chunks that hold the first ``count`` rows (the last one whole) and
    gives the fill value for the rest."""
    from pldjax.kernels.gaussian_dp import map_chunks

    calls = []

    def double(x):
        jax.debug.callback(lambda: calls.append(1))
        return 2 * x, x > 0

    got, positive = jax.jit(functools.partial(map_chunks, double, fill=(-1.0, False),
                                              batch_size=4))(jnp.arange(1.0, 13.0), 5)
    np.testing.assert_array_equal(got, [2, 4, 6, 8, 10, 12, 14, 16, -1, -1, -1, -1])
    np.testing.assert_array_equal(positive, [True] * 8 + [False] * 4)
    assert len(calls) == 2  # once a chunk (no arguments: not batched), for two chunks


def test_gdp_residue_batch_size_is_a_positive_count():
    """4 pairs a chunk on a CPU by default; a bad size is refused before any search."""
    assert gaussian_dp.residue_batch_size() == gaussian_dp.RESIDUE_BATCH_CPU
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="batch_size"):
            pj.gdp_residue(1.0, pj.randomized_response(0.5), batch_size=bad)


@pytest.mark.slow
def test_gdp_residue_chunks_are_no_wider_than_their_pairs(monkeypatch):
    """A vmapped chunk computes its padding too: one pair was searched four times over on a CPU
    (15 ms against 5 for a subsampled Gaussian). A chunk now holds at most the next power of two
    of its call's queries or its group's pairs, and the residue does not depend on it."""
    from pldjax.core import compilation

    widths, run = [], compilation.Kernel.__call__

    def spy(kernel, *args, **kwargs):  # the chunk widths of the residue's two chunked kernels
        if "batch_size" in kwargs:
            widths.append((kernel.__name__, kwargs["batch_size"]))
        return run(kernel, *args, **kwargs)

    monkeypatch.setattr(compilation.Kernel, "__call__", spy)
    monkeypatch.setattr(gaussian_dp, "HOST_ROWS", 0)  # the compiled search, not NumPy's
    grid = pj.Grid()  # the automatic grid for one and for a batch (one alone gets its lattice)
    one = pj.gdp_residue(1.0, pj.randomized_response(0.3, grid=grid))
    assert widths == [("_queries_nu", 1), ("_residue_pairs", 1)]
    three = pj.gdp_residue(np.full(3, 1.0), pj.randomized_response(jnp.full(3, 0.3), grid=grid))
    assert widths[2:] == [("_queries_nu", 4), ("_residue_pairs", 4)]
    np.testing.assert_array_equal(three, np.full(3, one))


@pytest.mark.slow
def test_gdp_residue_searches_each_query_once_for_all_its_budgets():
    """A query batch broadcast against a column of budgets (as a residue table is built): each
    query's nu = gdp_mu, the naive update's, is searched once, up to its largest budget, and every
    pair gets its own query's residue, as the pair searched on its own gives it, up to the
    search's path (nu's search starts from another bracket; where round-off interleaves passing
    and failing tests near the boundary, the path decides which pass is found: here the
    broadcast call found one 4e-5 higher for mu = 0.6), and no lower."""
    queries = pj.gaussian(jnp.array([1.2, 1.9]), sampling_prob=0.1)
    mus = np.array([[0.6], [0.9], [1.5]])
    broadcast = np.asarray(pj.gdp_residue(mus, queries))
    # the same queries as six distinct ones, a budget each: the residues of pairs alone
    repeated = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (3,) + a.shape), queries)
    alone = np.asarray(pj.gdp_residue(mus, repeated))
    assert np.all(broadcast >= alone - 1e-4 * mus)
    assert np.all(np.abs(broadcast - alone) <= 1e-3 * mus)
    naive = np.sqrt(np.maximum(mus**2 - np.asarray(pj.gdp_mu(queries)) ** 2, 0.0))
    assert np.all(broadcast >= naive * (1 - 1e-15)) and np.all(broadcast <= mus)


def test_gdp_residue_chunks_fill_an_accelerator(monkeypatch):
    """Elsewhere than on a CPU a chunk holds a power of two of pairs whose transforms fill about
    RESIDUE_POINTS points, at most RESIDUE_BATCH."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    size = gaussian_dp.residue_batch_size
    assert size(0) == size(15_360) == gaussian_dp.RESIDUE_BATCH == 2048  # randomized response
    assert size(2 * 16_384) == 1024  # a subsampled Gaussian's two directions
    assert size(2 * 2**17) == 128
    assert size(2**40) == 1


@pytest.mark.parametrize("sigma", [0.07, 0.01, 1e-4])
def test_gdp_mu_of_a_revealing_gaussian_is_finite_and_above_its_mu(sigma):
    """pj.gaussian(sigma) is exactly (1 / sigma)-GDP. Where both curves round to 1 (eps far below
    mu^2 / 2) the widened budget fell short of them, and every mu above about 12 read inf; the
    bound is now 1 where 1 - G_mu, computed without cancellation, is below ROUNDOFF / 2, and the
    tangents between points thousands of nats apart stay finite."""
    got = float(pj.gdp_mu(pj.gaussian(sigma), mu_max=1e6))
    assert 1 / sigma <= got <= 1.25 / sigma


def test_gdp_mu_does_not_depend_on_a_large_mu_max():
    """The search's floor was mu_max * 1e-30 at least: gaussian(1) at mu_max = 1e31 read 10 (and
    a ladder odometer, which passes its top rung, 1.3e27 for one G_0.001 step)."""
    want = float(pj.gdp_mu(pj.gaussian(1.0)))
    assert 1.0 <= want <= 1.0001
    for mu_max in (1e31, 1e100, 1e300):
        assert float(pj.gdp_mu(pj.gaussian(1.0), mu_max=mu_max)) == pytest.approx(want, rel=1e-12)
    odometer = pj.odometers.gdp_ladder_odometer(1e-3, delta=1e-6, growth=2.0, rungs=200)
    state, _ = odometer.step(odometer.init(), pj.gaussian(1000.0))
    assert float(odometer.bound(state)["mu"]) <= 2e-3


@pytest.mark.slow
def test_a_slack_of_exactly_the_atom_covers_it():
    """The curve's round-off allowance raised the atom at +inf too (exact, it needs none): a
    query with an atom of 0.1 was inf at a slack of 0.1, and the GDP filters, which charge the
    atom, refused every query whose atom exceeded about 5e-3, whatever their budget."""
    query = pj.randomized_response(1.0, 0.1)
    exact = float(pj.gdp_mu(query, delta_slack=0.1))
    assert exact == pytest.approx(float(pj.gdp_mu(query, delta_slack=0.1 + 1e-9)), rel=1e-6)
    for make in (pj.filters.gdp_filter, pj.filters.gdp_residue_filter):
        f = make(10.0, delta=0.5)
        _, accepted = f.spend(f.init(), query)
        assert bool(accepted)
        with pytest.raises(ValueError, match="mu"):
            make(1e200)  # squared beyond float64: an OverflowError deep inside before


@jax.jit
def _certificate(probs, inf_mass, offset, step, mu, slack):
    # a search up to mu_max = mu finds a value (finite) exactly where mu passes the test on the
    # whole curve: it tests mu_max there before it gives up (inf); at a coarse resolution (rtol
    # 0.5), since only whether it finds one counts
    return jnp.isfinite(gaussian_dp.gdp_mu_kernel(probs, inf_mass, offset, step, slack, mu, 0.5))


def _certified(direction, mu, slack):
    """Whether gdp_mu's certificate (the whole curve below G_mu plus the slack) holds at mu."""
    return bool(_certificate(direction.probs, direction.inf_mass, direction.offset,
                             direction.step, mu, slack))


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [None, 1, 2])
def test_gdp_mu_is_the_smallest_certified_mu(monkeypatch, rounds):
    """gdp_mu searches a working set of the curve's intervals and tests its answer on the whole
    curve: the answer is certified on the whole curve (to 1e-14: this jit's round-off differs in
    the last bits) and 1e-12 less is not, for queries whose
    binding intervals are few (subsampled Gaussian), many (G_nu, nearly tangent to its bound)
    or shifted by a slack; also when the rounds run out (``rounds``: 1 tests mu_max at once,
    2 after one search) and bisection on the whole curve finishes."""
    if rounds is not None:
        monkeypatch.setattr(gaussian_dp, "_MU_ROUNDS", rounds)
    # a new function, so traced here with the patched rounds (jit caches by function)
    kernel = jax.jit(lambda *args: gaussian_dp.gdp_mu_kernel(*args))
    queries = [(pj.gaussian(1.3, sampling_prob=0.1), 0.0), (pj.gdp(1.0), 0.0),
               (pj.gaussian(1.0, sampling_prob=0.01).self_compose(50), 0.0),
               (pj.randomized_response(1.0, 1e-3), 1e-3)]
    found = [(direction, slack, float(kernel(direction.probs, direction.inf_mass,
                                             direction.offset, direction.step, slack, 64.0)))
             for query, slack in queries for direction in query.directions()]
    monkeypatch.undo()  # the certificate with the rounds the kernel has
    for direction, slack, mu in found:
        assert 0.0 < mu < 64.0
        assert _certified(direction, mu * (1 + 1e-14), slack)
        assert not _certified(direction, mu * (1 - 1e-12), slack)


def _atom_query(atom: float, last: float = 0.0) -> pj.PLD:
    """gaussian(1)'s masses scaled by 1 - atom, an atom at +inf, 2,048 empty points after them
    and a mass ``last`` at the last one (a prober's query)."""
    base = pj.gaussian(1.0).directions()[0]
    probs = np.concatenate([(1 - atom) * np.asarray(base.probs), np.zeros(2048)])
    probs[-1] = last
    return pj.PLD(jnp.asarray(probs), jnp.asarray(atom), jnp.asarray(int(base.offset), jnp.int64),
                  jnp.asarray(float(base.step)), True)


def _worst_excess(query: pj.PLD, mu: float, slack: float, low: float, high: float) -> float:
    """Largest delta_L(eps) - delta_mu(eps) - slack - ROUNDOFF over eps in [low, high] (8 points
    between every two grid points), in 40-digit arithmetic from the query's masses."""
    mp.mp.dps = 40
    (direction,) = query.directions()
    probs = np.asarray(direction.probs)
    z = (int(direction.offset) + np.arange(probs.size)) * float(direction.step)
    keep = np.nonzero(probs)[0]
    mass = [mp.mpf(float(p)) for p in probs[keep]]
    weighted = [p * mp.exp(-mp.mpf(float(x))) for p, x in zip(mass, z[keep], strict=True)]
    worst = -mp.inf
    for eps in np.linspace(low, high, int((high - low) / float(direction.step)) * 8 + 1):
        e = mp.mpf(float(eps))
        above = keep[z[keep] > eps].size  # masses past eps: delta = sum p (1 - e^(eps - z)) + atom
        tail = slice(len(keep) - above, None)
        curve = mp.fsum(mass[tail]) - mp.exp(e) * mp.fsum(weighted[tail]) + mp.mpf(float(direction.inf_mass))
        worst = max(worst, curve - gaussian_delta_mp(mu, e) - mp.mpf(slack) - mp.mpf(ROUNDOFF))
    return float(worst)


@pytest.mark.slow
def test_gdp_mu_and_the_residue_with_a_large_slack():
    """A slack covering a large atom held every ratio of curve to bound near 1 whatever mu, and
    the searches took that for the boundary: gdp_mu stopped where it started (a prober's query:
    mu_max itself, 1.5 or 3.0 for about 0.99) and the residue of an approximate-DP query after
    its first tests (0.8% low). Scores now compare what exceeds the slack. At such tight answers
    the sums' rounding (an ulp of 0.5) let that query's curve exceed its bound by 1e-17 between
    eps = 7.7 and 7.9, beyond the certificate's ROUNDOFF: bounds are now lowered by 4 ulps."""
    for query, slack in [(_atom_query(0.5), 0.5), (pj.randomized_response(1.0, 0.5), 0.5),
                         (pj.randomized_response(1.0, 0.1), 0.1)]:
        got = [float(pj.gdp_mu(query, delta_slack=slack, mu_max=top)) for top in (1.5, 3.0, 64.0)]
        assert got[0] < 1.5 and got == pytest.approx([got[2]] * 3, rel=1e-12)
    edge = _atom_query(0.5, last=1e-14 - 2e-16)
    mu = float(pj.gdp_mu(edge, delta_slack=0.5))
    assert np.isfinite(mu)
    assert _worst_excess(edge, mu, 0.5, 7.5, 8.2) <= 0.0
    plain = float(pj.gdp_residue(1.0, pj.randomized_response(0.5)))
    for atom in (1e-6, 1e-3):
        residue = float(pj.gdp_residue(1.0, pj.randomized_response(0.5, atom), delta_slack=atom))
        assert residue == pytest.approx(plain, rel=2e-3) and residue >= plain * (1 - 1e-5)


def _exact_composed_excess(query, mu_residue, mu, count=3):
    """The largest delta_{G_mu'} (+) query minus (delta_{G_mu} + ROUNDOFF) over the check points
    eps = j h >= 0 of the query's grid: candidates from direct float64 sums of non-negative terms
    (scipy's log_ndtr, not the FFT or the erfc of the code under test), the ``count`` largest
    then in 30-digit arithmetic."""
    from scipy.special import log_ndtr

    def delta(m, x):  # G_m's curve, float64
        return np.maximum(np.exp(log_ndtr(m / 2 - x / m)) - np.exp(x + log_ndtr(-m / 2 - x / m)), 0)

    mp.mp.dps = 30
    worst = -np.inf
    for direction in query.directions():
        probs, h, offset = np.asarray(direction.probs), float(direction.step), int(direction.offset)
        n, count_eps = probs.size, int((mu * mu / 2 + 12 * mu) / h)
        z, eps = (offset + np.arange(n)) * h, np.arange(count_eps) * h
        # eps_j - z_i = (k - (n - 1) - offset) h with k = j - i + n - 1: one full convolution
        lags = (np.arange(-(n - 1), count_eps) - offset) * h
        curve = np.convolve(probs, delta(mu_residue, lags))[n - 1:n - 1 + count_eps]
        excess = curve + float(direction.inf_mass) - delta(mu, eps) - ROUNDOFF
        for j in np.argsort(excess)[-count:]:
            exact = sum(mp.mpf(float(p)) * gaussian_delta_mp(mu_residue, eps[j] - loss)
                        for p, loss in zip(probs, z, strict=True) if p > 0)
            exact += mp.mpf(float(direction.inf_mass)) - gaussian_delta_mp(mu, eps[j]) - ROUNDOFF
            worst = max(worst, float(exact))
    return worst


@pytest.mark.slow
def test_residue_certificate_holds_in_the_far_tail_despite_fft_round_off():
    """A subsampled Gaussian's residue binds where its composed curve is about 1e-12 (eps ~ 7),
    while an FFT computes every output to a few 1e-16 of the largest: this pair's residue passed
    with its exact curve 5e-17 above G_mu + ROUNDOFF (in a batch whose finest grid set a window
    of 12,288 points). The test's convolution is now tilted (its round-off shrinks like
    e^(-lambda eps)) and raised by its round-off estimate."""
    query = pj.gaussian(1.0335855753054644, sampling_prob=0.1)
    mu = 0.998774126308831
    residue = float(pj.gdp_residue(mu, query, size=12288))
    naive = np.sqrt(mu**2 - float(pj.gdp_mu(query)) ** 2)
    assert residue >= naive * (1 + 0.05)  # a real gain over the naive update, not a loss of one
    assert _exact_composed_excess(query, residue, mu) <= 0.0


@pytest.mark.slow
def test_residues_on_their_own_windows_are_certified_to_twelve_sigmas():
    """Each query's check window now comes from its own step and reaches 8.5 sigmas
    (it was the batch's finest step's, to 11): the coarse query here is no longer coarsened to
    its neighbour's window, and its residue rose 2.6% (1.642 -> 1.685). The exact composed curve
    stays below G_mu + ROUNDOFF at every check point out to 12 sigmas, past the window, where
    the flat check stands in."""
    queries = pj.gaussian(jnp.asarray([0.8, 3.0]), sampling_prob=jnp.asarray([0.5, 0.01]))
    mus = np.array([2.0, 2.0])
    residues = np.asarray(pj.gdp_residue(mus, queries))
    assert residues[0] >= 1.68
    for i in range(2):
        assert _exact_composed_excess(queries[i], residues[i], mus[i]) <= 0.0


def test_size_classes_are_the_smallest_five_smooth_sizes_above():
    """The residue's windows and transforms: the smallest m 2^k >= n (and >= 16), m in {8, 9, 10,
    12, 15}, elementwise on arrays (per-query windows) as on ints, and exact past 2^31."""
    from pldjax.kernels.gaussian_dp import size_class

    def smallest(n):
        return min(m << k for m in (8, 9, 10, 12, 15) for k in range(60) if (m << k) >= max(n, 16))

    counts = np.concatenate([np.arange(0, 3000), [12289, 2**31 + 1, 2**40 + 1, 10**15]])
    np.testing.assert_array_equal(size_class(counts), [smallest(int(n)) for n in counts])
    assert size_class(17) == 18 and isinstance(size_class(17), int)


def test_the_residue_of_a_free_query_at_budget_zero_is_zero():
    """G_0 is the identity: a query revealing nothing fits it, with residue 0 (the search of
    the query's mu starts at 1e-300 and read -inf); one that reveals anything does not."""
    for query in (pj.identity(), pj.randomized_response(0.0)):
        assert float(pj.gdp_residue(0.0, query)) == 0.0
        np.testing.assert_array_equal(pj.gdp_residue(np.array([0.0, 0.5]), query)[:1], [0.0])
    assert float(pj.gdp_residue(0.0, pj.randomized_response(0.1))) == -np.inf
    # a slack covers an atom of delta(0): RR_0 with delta 1e-9 fits G_0 given 2e-9
    assert float(pj.gdp_residue(0.0, pj.randomized_response(0.0, 1e-9), delta_slack=2e-9)) == 0.0
    assert float(pj.gdp_residue(0.0, pj.randomized_response(0.0, 1e-9))) == -np.inf


def test_a_few_queries_against_many_budgets_compile_only_the_residue_search(tmp_path):
    # more pairs than run on the host, one query: its nu is searched in NumPy, the pairs in the
    # one program of their window (no host work to rent it with)
    names, printed = programs_of_a_new_process("""
        import json
        import os
        os.environ["PLDJAX_HOST_WORK"] = "0"
        import numpy as np
        import pldjax as pj
        mus = np.linspace(0.5, 2.0, 20)
        print(json.dumps(np.asarray(pj.gdp_residue(mus, pj.randomized_response(0.5))).tolist()))
    """, cache=tmp_path / "xla")  # empty: every program compiles
    assert names == ["jit(option_probe)", "jit(_residue_pairs)"]
    query = pj.randomized_response(0.5)
    # the same budgets a few at a time: searched in NumPy, to round-off
    alone = [float(pj.gdp_residue(mu, query)) for mu in np.linspace(0.5, 2.0, 20)]
    np.testing.assert_allclose(json.loads(printed.splitlines()[-1]), alone, rtol=1e-9)

