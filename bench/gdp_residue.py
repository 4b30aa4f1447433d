"""GDP-residue updates per second, batched: pj.gdp_residue and the GDP-residue filter's spend.

An update takes a budget mu and a query PLD L and returns mu', the largest value with G_mu' (+) L
dominated by G_mu (Regehr et al. 2026, Thm 5); the baseline it improves on is the naive GDP update
sqrt(mu^2 - gdp_mu(L)^2) (no other library computes the residue). B (mu, L) pairs are one call:
``function`` is ``pj.gdp_residue(mu, query)`` with mu of shape (B,) and a query of batch shape
(B,); ``filter`` is ``pj.filters.gdp_residue_filter``'s ``spend`` under ``jax.jit`` of
``jax.lax.map`` over the B states (with the check window pj.gdp_residue picks for the same batch).
Queries (seeded; every pair fits): ``rr`` ``pj.randomized_response(eps)``, eps uniform in
[0.1, 0.5]; ``gauss`` ``pj.gaussian(sigma, sampling_prob=0.1)``, sigma uniform in [1, 2] (two
directions); mu uniform in [0.75, 1]. Per (family, form, B): the first call (compilation
included), the warm time (median of further calls), updates per second, rejected pairs, and the
gain over the naive update on the first 256 pairs; "/ fft16" is the time per pair over the
fastest jitted float64 rfft + irfft round trip of 2^16 points. Accuracy: queries G_nu, whose exact
residue is sqrt(mu^2 - nu^2). Coarsening: subsampled-Gaussian queries at q = 0.01 whose grid is
finer than the check window allows, so pj.gdp_residue coarsens them first.
"""

from __future__ import annotations

import functools
import statistics
import time

import numpy as np

from bench import harness, internals

QUICK = "rr queries, both forms, B = 16, one warm call; 2 accuracy points; no coarsening check"
FAMILIES = ("rr", "gauss")
FORMS = ("function", "filter")
GAIN_PAIRS = 256


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", default="100,1000,10000,100000",
                        help="comma-separated numbers of (mu, query) pairs per call")
    parser.add_argument("--families", default=",".join(FAMILIES), help="rr, gauss")
    parser.add_argument("--forms", default=",".join(FORMS), help="function, filter")
    parser.add_argument("--repeats", type=int, default=3, help="warm calls per size (median)")
    parser.add_argument("--max-seconds", type=float, default=300,
                        help="skip a size when the previous one predicts a call above this")
    parser.add_argument("--deadline", type=float, default=None, help="start no new work after this many s")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="pairs per chunk (pj.gdp_residue's batch_size; default: the library's)")
    parser.add_argument("--steps", type=int, default=None, help="search steps (default: the library's)")
    parser.add_argument("--filter-size", type=int, default=None,
                        help="the filter's check window (default: the one pj.gdp_residue picks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", action="store_true", help="also the per-example DP-SGD residue table")
    parser.add_argument("--cost-split", action="store_true",
                        help="also where a batch of gauss pairs spends its time: gdp_mu of the queries "
                             "alone, then gdp_residue with 1, 4 and the default search steps")
    parser.add_argument("--no-accuracy", action="store_true", help="skip the accuracy and coarsening checks")


# -- workloads ------------------------------------------------------------------------------------
def make_pairs(family: str, count: int, seed: int):
    """(mu, query) for ``count`` seeded pairs of one family."""
    import jax.numpy as jnp

    import pldjax as pj

    rng = np.random.default_rng([seed, FAMILIES.index(family), count])
    mu = rng.uniform(0.75, 1.0, count)
    if family == "rr":
        query = pj.randomized_response(jnp.asarray(rng.uniform(0.1, 0.5, count)))
    elif family == "gauss":
        query = pj.gaussian(jnp.asarray(rng.uniform(1.0, 2.0, count)), sampling_prob=0.1)
    else:
        raise ValueError(family)
    return jnp.asarray(mu), query


def plan(mu_max: float, query) -> dict:
    """The check window pj.gdp_residue picks on the host for the query's finest step (an
    internal of pldjax; every entry None where it has moved)."""
    info = dict(n=None, window=None, nfft=None, coarsen=None)
    if not internals.available("gaussian_dp", "residue_plan", "_coarse_points", "_fft_length"):
        return info
    gdp = internals.gaussian_dp
    factor, window = gdp.residue_plan(mu_max, query, None)
    n = gdp._coarse_points(query.size, factor)
    return dict(n=n, window=window, nfft=gdp._fft_length(n, window), coarsen=factor)


def _kw(args):
    """pj.gdp_residue's steps and batch_size where given (else the library's defaults)."""
    return {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size)) if v is not None}


def function_call(mu, query, args):
    import pldjax as pj

    return lambda: pj.gdp_residue(mu, query, **_kw(args))


def filter_call(mu, query, window, args):
    import jax
    import jax.numpy as jnp

    import pldjax as pj

    steps = {} if args.steps is None else {"steps": args.steps}
    f = pj.filters.gdp_residue_filter(1.0, **steps, size=window)
    count = mu.shape[0]
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (count,) + x.shape), f.init())
    with jax.enable_x64(True):  # the states hold their floats as bit pairs
        states = states._replace(mu=internals.precision.pack(jnp.asarray(mu, jnp.float64)))
    batch = args.batch_size or internals.gaussian_dp.residue_batch_size()

    @jax.jit
    def spend_all(states, queries):
        return jax.lax.map(lambda pair: f.spend(*pair), (states, queries), batch_size=batch)

    def call():
        new, accepted = spend_all(states, query)
        return jnp.where(accepted, f.remaining(new)["mu"], -jnp.inf)  # as pj.gdp_residue

    return call


def naive_gain(mu, query, residue):
    """Median and smallest (mu' - naive) / naive over the first GAIN_PAIRS pairs."""
    import pldjax as pj

    k = min(GAIN_PAIRS, mu.shape[0])
    nu = np.asarray(pj.gdp_mu(query[:k]))
    m = np.asarray(mu[:k])
    naive = np.sqrt(np.maximum(m * m - nu * nu, 0.0))
    res = residue[:k]
    ok = np.isfinite(res) & (naive > 0)
    if not ok.any():
        return None, None
    gain = (res[ok] - naive[ok]) / naive[ok]
    return float(np.median(gain)), float(np.min(gain))


# -- parts ----------------------------------------------------------------------------------------
def throughput(args, report, deadline) -> None:
    report.heading("Throughput")
    rows = report.table(["family", "form", "pairs B", "grid n", "window", "nfft", "build s", "first s",
                         "warm s (n)", "updates/s", "ms/pair", "/ fft16", "rejected", "gain med", "gain min",
                         "filter vs function"])
    fft16 = None
    for family in args.families:
        by_form = {}
        for form in args.forms:
            last = None  # (pairs, seconds per call) of the previous size
            for count in args.sizes:
                head = [family, form, count]
                if last is not None:
                    predicted = last[1] * count / last[0]
                    late = time.time() + predicted * (1 + args.repeats) > deadline
                    if predicted > args.max_seconds or late:
                        why = ("past --deadline" if late and predicted <= args.max_seconds
                               else "> --max-seconds")
                        rows.append(head + [None] * 4 + [f"skipped: ~{predicted:.0f} s/call, {why}"]
                                    + [None] * 8)
                        report.flush()
                        break
                harness.log(f"gdp_residue: {family} {form} B={count}: building queries")
                build, (mu, query) = harness.timed(functools.partial(make_pairs, family, count, args.seed))
                info = plan(float(np.max(np.asarray(mu))), query)
                window = info["window"] if args.filter_size is None else args.filter_size
                if form == "filter" and window is None:
                    rows.append(head + [None] * 4 + ["skipped: no check window (give --filter-size)"]
                                + [None] * 8)
                    break
                if form == "function":
                    call = function_call(mu, query, args)
                else:
                    call = filter_call(mu, query, window, args)
                harness.log(f"gdp_residue: {family} {form} B={count}: first call ({info})")
                first, out = harness.timed(call)
                warm_times = []
                for _ in range(args.repeats):
                    budget = args.max_seconds * (1 + args.repeats)
                    if sum(warm_times) + first > budget or time.time() > deadline:
                        break
                    seconds, out = harness.timed(call)
                    warm_times.append(seconds)
                out = np.asarray(out)
                warm = statistics.median(warm_times) if warm_times else None
                rejected = int(np.sum(~np.isfinite(out)))
                gain_med, gain_min = naive_gain(mu, query, out)
                by_form[(form, count)] = out
                other = by_form.get(("function" if form == "filter" else "filter", count))
                diff = None
                if other is not None:
                    both = np.isfinite(other) & np.isfinite(out)
                    diff = float(np.max(np.abs(other - out)[both] / out[both])) if both.any() else None
                if fft16 is None:
                    fft16 = harness.fft_round_trip(2**16, repeats=30)["min"]
                per_pair = warm / count if warm else None
                grid = info["n"] if info["coarsen"] in (1, None) else f"{info['n']} (/{info['coarsen']})"
                rows.append(head + [grid, window if form == "filter" else info["window"], info["nfft"],
                                    harness.fmt(build, ".2f"), harness.fmt(first, ".2f"),
                                    f"{warm:.3f} ({len(warm_times)})" if warm is not None else None,
                                    harness.fmt(count / warm if warm else None, ".1f"),
                                    harness.fmt(per_pair * 1e3 if per_pair else None, ".2f"),
                                    harness.fmt(per_pair / fft16 if per_pair else None, ".1f"), rejected,
                                    harness.fmt(gain_med, ".2e"), harness.fmt(gain_min, ".2e"),
                                    harness.fmt(diff, ".1e")])
                report.flush()
                last = (count, warm if warm is not None else first)
                del mu, query, call, out
    fft16_ms = harness.fmt(fft16 * 1e3 if fft16 else None, ".3f")
    report.text("first s: the first call in this process (compilation included; each B compiles anew); "
                "warm s: median of (n) further calls; updates/s = B / warm s; / fft16: ms/pair over "
                f"{fft16_ms} ms, the fastest jitted float64 rfft + irfft of 2^16 points; rejected: pairs "
                f"not updated (-inf); gain: (mu' - naive) / naive on the first {GAIN_PAIRS} pairs; filter "
                "vs function: max |mu'_filter - mu'_function| / mu'; build s: constructing the B query "
                f"PLDs (not in the update time). steps={args.steps or 'default'}, "
                f"batch_size={args.batch_size or 'default'}.")


def accuracy(args, report) -> None:
    import jax.numpy as jnp

    import pldjax as pj

    report.heading("Accuracy on G_nu (exact residue sqrt(mu^2 - nu^2))")
    rows = report.table(["mu", "nu", "G_nu step", "window", "coarsen", "exact mu'", "pldjax mu'",
                         "rel err", "naive rel err"])
    for mu in args.acc_mus:
        nus = np.array([f * mu for f in args.acc_fractions])
        harness.log(f"gdp_residue: accuracy, mu={mu}")
        query = pj.gdp(jnp.asarray(nus))
        info = plan(mu, query)
        residue = np.asarray(pj.gdp_residue(mu, query, **_kw(args)))
        naive_nu = np.asarray(pj.gdp_mu(query))
        exact = np.sqrt(mu * mu - nus * nus)
        naive = np.sqrt(np.maximum(mu * mu - naive_nu * naive_nu, 0.0))
        steps = np.broadcast_to(np.asarray(query.step), nus.shape)
        for nu, h, e, r, v in zip(nus, steps, exact, residue, naive, strict=True):
            rows.append([f"{mu:g}", f"{nu:.3g}", f"{h:.3g}", info["window"], info["coarsen"],
                         f"{e:.10f}", harness.fmt(float(r), ".10f"), harness.fmt(float((e - r) / e), ".2e"),
                         harness.fmt(float((e - v) / e), ".2e")])
        report.flush()
    report.text("rel err = (exact - mu') / exact: mu' is a sound lower bound, so rel err >= 0; naive = "
                "sqrt(mu^2 - gdp_mu(G_nu)^2).")


def coarsening(args, report) -> None:
    import jax.numpy as jnp

    import pldjax as pj

    report.heading("Coarsening: queries finer than the largest check window")
    rows = report.table(["sigma", "q", "mu", "grid n", "step", "coarsen", "nu = gdp_mu(L)",
                         "naive mu'", "pldjax mu'"])
    harness.log("gdp_residue: coarsening check")
    sigmas = np.array([1.0, 1.5, 2.0])
    query = pj.gaussian(jnp.asarray(sigmas), sampling_prob=0.01)
    nu = np.asarray(pj.gdp_mu(query))
    for mu in (1.0, 2.0):
        info = plan(mu, query)
        residue = np.asarray(pj.gdp_residue(mu, query, **_kw(args)))
        naive = np.sqrt(np.maximum(mu * mu - nu * nu, 0.0))
        for s, h, v, a, r in zip(sigmas, np.asarray(query.step), nu, naive, residue, strict=True):
            rows.append([f"{s:g}", "0.01", f"{mu:g}", query.size, f"{h:.3g}", info["coarsen"],
                         f"{v:.5f}", f"{a:.5f}", harness.fmt(float(r), ".5f")])
        report.flush()
    report.text("pj.gdp_residue coarsens these queries by the factor shown first; mu' must be at least "
                "the naive update.")


def table_call(mu_nodes: int, c_nodes: int):
    """The residue table's build, for a fresh process (:func:`harness.fresh_process`)."""
    import pldjax as pj

    def build():
        table = pj.filters.residue.gdp_residue_table(1.0, 0.05, 2.0, mu_nodes=mu_nodes,
                                                     c_nodes=c_nodes)
        return float(np.asarray(table.cost).sum())

    return build


def residue_table(args, report) -> None:
    """Per-example DP-SGD's residue table (sigma = 1, q = 0.05, mu = 2): build time (a user's
    fresh process, and this process's compiled kernels), then lookups per second on 2e6 random
    (mu, c) pairs, jitted."""
    import jax
    import jax.numpy as jnp

    import pldjax as pj

    report.heading("Residue table of per-example DP-SGD (sigma 1, q 0.05, mu 2)")
    rows = report.table(["mu nodes", "c nodes", "first build s (fresh process)",
                         "first build s, compiled", "warm build s", "lookups/s"])
    for mu_nodes, c_nodes in ((16, 9), (32, 17)):
        harness.log(f"gdp_residue: table {mu_nodes} x {c_nodes}")
        fresh = harness.fresh_process("bench.gdp_residue", "table_call",
                                      dict(mu_nodes=mu_nodes, c_nodes=c_nodes),
                                      imports="import pldjax")
        times, table = [], None
        for _ in range(2):
            seconds, table = harness.timed(lambda m=mu_nodes, c=c_nodes: (
                pj.filters.residue.gdp_residue_table(1.0, 0.05, 2.0, mu_nodes=m, c_nodes=c)))
            times.append(seconds)
        count = 2_000_000
        rng = np.random.default_rng(args.seed)
        with jax.enable_x64(True):
            mu = jnp.asarray(rng.uniform(0.0, 2.0, count))
            c = jnp.asarray(rng.uniform(0.0, 1.0, count))
            left = jnp.full(count, 1e-6)
            spend = jax.jit(pj.filters.residue.table_spend)
            harness.timed(functools.partial(spend, table, mu, left, c))
            best = min(harness.timed(functools.partial(spend, table, mu, left, c))[0] for _ in range(5))
        first = fresh.get("error") or f"{fresh['first_s']:.2f}"
        rows.append([mu_nodes, c_nodes, first, f"{times[0]:.2f}", f"{times[1]:.2f}",
                     f"{count / best:.3g}"])
        report.flush()
    report.text("first build (fresh process): a new process's first build, as a user's (import "
                "apart; compilation included, where it compiles: a process searches a check "
                "window's first HOST_RESIDUE_PAIRS pairs in NumPy, see "
                "pldjax.kernels.gaussian_dp); first build, compiled: this process's first build "
                "with PLDJAX_HOST_WORK=0 (every window's program compiled); lookups/s: "
                "pj.filters.residue.table_spend on 2e6 pairs, fastest of 5 jitted calls.")


def cost_split(args, report) -> None:
    """Where a batch of gauss pairs spends its time: pj.gdp_mu of the queries alone (each update's
    naive floor), then pj.gdp_residue with at most 1 and 4 search steps after its first test, and
    with the default."""
    import pldjax as pj

    pairs = max(args.sizes)
    mu, queries = make_pairs("gauss", pairs, args.seed)
    report.heading(f"Cost split of {pairs} gauss pairs")
    rows = report.table(["computation", "first s", "warm s (best of 3)", "warm s (median)"])
    calls = [("gdp_mu of the queries", lambda: pj.gdp_mu(queries, mu_max=1.0))]
    for steps in (1, 4, None):
        label = "gdp_residue, " + ("default steps" if steps is None else f"steps={steps}")
        kw = {} if steps is None else {"steps": steps}
        calls.append((label, lambda kw=kw: pj.gdp_residue(mu, queries, **kw)))
    for label, call in calls:
        harness.log(f"gdp_residue: cost split, {label}")
        first, median, times, _ = harness.first_and_warm(call, 3)
        rows.append([label, f"{first:.2f}", f"{min(times):.3f}", f"{median:.3f}"])
        report.flush()


def run(args, report) -> None:
    import jax

    if args.quick:
        args.sizes, args.repeats, args.families = "16", min(args.repeats, 1), "rr"
    args.sizes = [int(float(s)) for s in str(args.sizes).split(",") if s]
    args.families = [f for f in args.families.split(",") if f]
    args.forms = [f for f in args.forms.split(",") if f]
    args.acc_mus = [1.0] if args.quick else [0.5, 1.0, 2.0, 4.0]
    args.acc_fractions = [0.2, 0.6] if args.quick else [0.1, 0.3, 0.5, 0.7, 0.9]
    jax.config.update("jax_enable_x64", True)
    deadline = time.time() + (args.deadline if args.deadline else 1e9)
    if not args.no_accuracy:
        accuracy(args, report)
        if not args.quick:
            coarsening(args, report)
    if args.table:
        residue_table(args, report)
    throughput(args, report, deadline)
    if args.cost_split:
        cost_split(args, report)
