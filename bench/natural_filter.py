"""The natural filter's worst case V_k (Regehr et al. 2026, Thm 6): how long pldjax takes.

Four Gaussian queries G_mu (mu = 0.5, 0.75, 1, 1.25 by default), each discretized on
``pj.Grid(step=32 / n, size=n)`` (the same loss range at n points: a larger n is a finer grid),
budget ``pj.gdp(2.0, pessimistic=False)``, 8 rounds. For each function
(``pj.natural_filter_free``, ``pj.natural_filter_bounds``) and each n, a fresh process with an
empty compilation cache of its own makes two identical calls (first: compilation included; warm),
and a second fresh process makes the first call with that cache filled (cached). Reported: the
verdict or the gap between the bracketing curves, the excess over the budget, the recursion's
window (grid points per curve), the number of query multisets (states), CPU seconds and the
process's peak memory. GDP queries are totally ordered (Cor. 5), so the exact answer is "free";
no other library computes V_k. A case past ``--timeout`` is recorded and the larger sizes of that
function are skipped.
"""

from __future__ import annotations

import math
import shutil
import tempfile

from bench import harness, internals

QUICK = "n = 1,024, 3 rounds, natural_filter_free only, no cached process"
FUNCTIONS = ("natural_filter_free", "natural_filter_bounds")


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", default="4096,8192,16384", help="grid points per query")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--mus", default="0.5,0.75,1.0,1.25", help="the queries' GDP parameters")
    parser.add_argument("--budget-mu", type=float, default=2.0)
    parser.add_argument("--functions", default=",".join(FUNCTIONS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process (both calls)")
    parser.add_argument("--no-cached", dest="cached", action="store_false",
                        help="skip the second process with the compilation cache filled")


# -- the call (fresh processes build it by name) ----------------------------------------------------
def natural_filter_call(function, n, rounds, mus, budget_mu):
    import numpy as np

    import pldjax as pj

    grid = pj.Grid(step=32.0 / n, size=n)
    queries = [pj.gdp(mu, grid=grid) for mu in mus]
    budget = pj.gdp(budget_mu, pessimistic=False)
    window = None
    if internals.available("adversary", "_family", "_window"):  # the recursion's grid, read only
        window = int(internals.adversary._window(internals.adversary._family(queries), rounds, budget).size)

    def call():
        result = getattr(pj, function)(queries, budget=budget, rounds=rounds)
        if function == "natural_filter_free":
            return dict(window=window, status=result.status, gap=float(result.gap),
                        upper_excess=float(result.upper_excess), lower_excess=float(result.lower_excess))
        return dict(window=window, status="-", gap=float(result.gap),
                    upper_at_1=float(np.interp(1.0, result.epsilons, result.upper_deltas)),
                    lower_at_1=float(np.interp(1.0, result.epsilons, result.lower_deltas)))

    return call


def run(args, report) -> None:
    if args.quick:
        args.sizes, args.rounds, args.functions, args.cached = "1024", 3, FUNCTIONS[0], False
    sizes = [int(s) for s in args.sizes.split(",")]
    functions = [f for f in args.functions.split(",") if f]
    mus = [float(x) for x in args.mus.split(",")]
    for f in functions:
        if f not in FUNCTIONS:
            raise SystemExit(f"unknown function {f}")
    report.text(f"Queries G_mu, mu = {', '.join(f'{m:g}' for m in mus)}, on Grid(step=32/n, size=n); budget "
                f"pj.gdp({args.budget_mu:g}, pessimistic=False); {args.rounds} rounds.")
    rows = report.table(["function", "n", "step", "k", "states", "window", "first s", "warm s", "cached s",
                         "CPU s first", "CPU s warm", "peak MB", "status", "gap", "upper excess",
                         "lower excess"])
    for function in functions:
        for n in sizes:
            harness.log(f"natural_filter: {function} n={n}")
            kwargs = dict(function=function, n=n, rounds=args.rounds, mus=mus, budget_mu=args.budget_mu)
            spec = dict(module="bench.natural_filter", factory="natural_filter_call", kwargs=kwargs,
                        imports="import pldjax", timeout=args.timeout)
            # an empty cache of its own (a smoke run: the one kept between smoke runs)
            cache = None if args.quick else tempfile.mkdtemp(prefix="pldjax-natural-filter-cache-")
            try:
                res = harness.fresh_process(**spec, calls=2, cache=cache)
                cached = {}
                if args.cached and "error" not in res:
                    cached = harness.fresh_process(**spec, cache=cache)
            finally:
                if cache:
                    shutil.rmtree(cache, ignore_errors=True)
            states = math.comb(len(mus) + args.rounds, args.rounds)
            head = [function, n, f"{32.0 / n:.6f}", args.rounds, states]
            if "error" in res:
                rows.append(head + [f"{res['error']}; larger sizes skipped"] + [None] * 10)
                report.flush()
                break
            v = res["value"]
            rows.append(head + [v["window"], f"{res['wall_s'][0]:.2f}", f"{res['wall_s'][1]:.2f}",
                                harness.fmt(cached.get("first_s"), ".2f"), f"{res['cpu_s'][0]:.2f}",
                                f"{res['cpu_s'][1]:.2f}", f"{res['peak_mb']:.0f}", v["status"],
                                f"{v['gap']:.2e}", harness.fmt(v.get("upper_excess"), ".2e"),
                                harness.fmt(v.get("lower_excess"), ".2e")])
            report.flush()
    report.text(f"first s: the first call in a fresh process ({harness.compilation_note()}); warm s: the "
                "same call again; cached s: the first call in another fresh process with that cache filled; "
                "CPU s: the process's CPU seconds (all threads) in those calls, which other work on a shared "
                "machine inflates less than wall time; states: query multisets of at most k queries; "
                "window: grid points of each curve; gap: largest difference of the upper and lower "
                "bracketing curves; excess: largest delta_V - delta_B over the budget "
                "(natural_filter_free only).")
