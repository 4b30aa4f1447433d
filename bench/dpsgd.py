"""DP-SGD accounting: pldjax against dp-accounting and prv-accountant on the same work, one run.

The mechanism is the Poisson-subsampled Gaussian (add/remove adjacency, epsilon from both
directions) at delta = 1e-5. Part 1 is one configuration (sigma = 1, q = 0.01, T = 10,000); part 2
a seeded sweep of N configurations; both give each method's epsilon, its accuracy, its time and
its memory.

Part 1, methods: pldjax ``pj.dpsgd_epsilon`` pessimistic (an upper bound) and optimistic (a lower
bound), and the pessimistic first call with pldjax's persistent compilation cache filled;
dp-accounting's PLD at value discretization 1e-4 (pessimistic: connect-the-dots; optimistic:
privacy buckets) and 1e-3 (pessimistic); prv-accountant's ``DPSGDAccountant`` at eps_error 0.01
and 0.001 (delta_error = delta / 1000), an upper and a lower bound in one call. For each: import
time and first call (compilation included) in a fresh process, timed apart; that process's peak
resident memory and what the call added to it; the warm time (median of repeats in this process
after a warm-up call). Accuracy: the true epsilon lies between the table's largest lower bound L*
and its smallest upper bound U*; an upper bound's "vs L*" (upper / L* - 1) bounds how far it can
be above the truth, a lower bound's "vs U*" (1 - lower / U*) how far below. Below the table:
pldjax's warm time over a bare jitted float64 rfft + irfft of its composition window.

Part 2, a sweep: sigma uniform in [0.5, 3], q log-uniform in [1e-3, 0.05], T log-uniform integer
in [1e2, 1e5] (seeded). pldjax answers all N in one batched call, first (compilation included)
and warm in a fresh process. The peers loop over a random subset of K configurations (their
throughput extrapolated; prv-accountant's failures are counted). On the subset, in this process,
warm: pldjax in one call (the like-for-like comparison, as the subset need not cost what the
sweep costs on average), pldjax one call per configuration, and with ``--rtol`` the batched sweep
and the subset at that accuracy setting. Accuracy: each method's epsilon on the subset relative to
dp-accounting (1e-4)'s, median and largest.

Part 3, full-batch steps (q = 1, DP-GD): T steps of the Gaussian compose to Gaussian DP with
mu = sqrt(T) / sigma, whose epsilon is computed here in mpmath (the reference). pldjax's
``pj.dpsgd_epsilon`` reads that closed form; beside it pldjax's PLD on its automatic grid
(``pj.gaussian(sigma).self_compose(T)``) and dp-accounting's PLD at 1e-4 (pessimistic), each in a
fresh process (import apart; a process that runs past the time limit is reported as such).
"""

from __future__ import annotations

import math
import shutil
import tempfile

import numpy as np

from bench import harness

QUICK = ("part 1 at T = 1,000 with 2 warm repeats, without the optimistic rows and prv-accountant at "
         "eps_error 0.001; a sweep of 4 with T capped at 1,000, subset of 1; no rtol rows")
QUICK_SKIP = ("pldjax opt", "dpa 1e-4 opt", "prv 0.001")
SIGMA, Q, STEPS, DELTA = 1.0, 0.01, 10_000, 1e-5
SEED = 0
#: Part 3's (sigma, T): full-batch runs, one of them far past what a grid composes quickly
FULL_BATCH = ((1.0, 100), (10.0, 10_000), (1000.0, 10**9))
#: Part 3's limit on a fresh process (seconds)
FULL_BATCH_TIMEOUT = 300.0


def add_arguments(parser) -> None:
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per fresh process")
    parser.add_argument("--repeats", type=int, default=5, help="warm calls in this process (median)")
    parser.add_argument("--sweep-repeats", type=int, default=3,
                        help="further calls of pldjax's sweep in its fresh process (warm: the fastest)")
    parser.add_argument("--configs", type=int, default=None, help="sweep size N (1,024; 4 with --quick)")
    parser.add_argument("--subset", type=int, default=None, help="peers' subset K (16; 1 with --quick)")
    parser.add_argument("--rtol", type=float, default=1e-2,
                        help="also pldjax at this accuracy setting in part 2 (0: not)")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run")


# -- the computations (fresh processes build them by name): arrays or scalars in, epsilons out -----
def _arrays(sigmas, qs, steps):
    if np.ndim(sigmas) == 0:
        return float(sigmas), float(qs), int(steps)
    return np.asarray(sigmas, float), np.asarray(qs, float), np.asarray(steps, np.int64)


def pldjax_call(sigmas, qs, steps, pessimistic=True, rtol=None):
    import pldjax as pj

    sigmas, qs, steps = _arrays(sigmas, qs, steps)
    accuracy = {} if rtol is None else {"rtol": rtol}
    key = "upper" if pessimistic else "lower"
    return lambda: {key: np.asarray(pj.dpsgd_epsilon(sigmas, qs, steps, DELTA, pessimistic=pessimistic,
                                                     **accuracy))}


def dp_accounting_call(sigmas, qs, steps, interval=1e-4, pessimistic=True):
    sigmas, qs, steps = (np.atleast_1d(a) for a in _arrays(sigmas, qs, steps))
    key = "upper" if pessimistic else "lower"

    def call():
        return {key: np.array([harness.dp_accounting_dpsgd_epsilon(s, q, t, DELTA, interval, pessimistic)
                               for s, q, t in zip(sigmas, qs, steps, strict=True)])}

    return call


def pldjax_grid_call(sigma, steps):
    """pldjax's pessimistic PLD of the Gaussian on its automatic grid, composed ``steps`` times."""
    import pldjax as pj

    return lambda: {"upper": float(pj.gaussian(float(sigma)).self_compose(int(steps)).epsilon(DELTA))}


def prv_call(sigmas, qs, steps, eps_error=0.01, errors=None):
    """prv-accountant's (upper, lower); with ``errors`` a list, a failure gives NaN and a line there."""
    from prv_accountant.dpsgd import DPSGDAccountant

    sigmas, qs, steps = (np.atleast_1d(a) for a in _arrays(sigmas, qs, steps))

    def call():
        ups, lows = [], []
        for sigma, q, count in zip(sigmas.tolist(), qs.tolist(), steps.tolist(), strict=True):
            try:
                acc = DPSGDAccountant(noise_multiplier=sigma, sampling_probability=q, max_steps=count,
                                      eps_error=eps_error, delta_error=DELTA / 1000)
                low, _, up = acc.compute_epsilon(delta=DELTA, num_steps=count)
            except Exception as err:  # a peer failing on a configuration is a result, not a crash
                if errors is None:
                    raise
                errors.append(f"sigma={sigma:.4g} q={q:.4g} T={count}: {type(err).__name__}: {err}")
                low = up = math.nan
            ups.append(up)
            lows.append(low)
        return {"upper": np.array(ups), "lower": np.array(lows)}

    return call


IMPORT_PLDJAX = "import pldjax"
IMPORT_DPA = "from dp_accounting.pld import privacy_loss_distribution"
IMPORT_PRV = "from prv_accountant.dpsgd import DPSGDAccountant"

# label, library, setting, import, factory, kwargs
PART1 = [
    ("pldjax", "pldjax", "pessimistic", IMPORT_PLDJAX, "pldjax_call", {}),
    ("pldjax opt", "pldjax", "optimistic", IMPORT_PLDJAX, "pldjax_call", {"pessimistic": False}),
    ("pldjax cached", "pldjax", "pessimistic, compilation cache filled", IMPORT_PLDJAX, "pldjax_call", {}),
    ("dpa 1e-4", "dp-accounting", "PLD 1e-4 pessimistic", IMPORT_DPA, "dp_accounting_call",
     {"interval": 1e-4}),
    ("dpa 1e-4 opt", "dp-accounting", "PLD 1e-4 optimistic", IMPORT_DPA, "dp_accounting_call",
     {"interval": 1e-4, "pessimistic": False}),
    ("dpa 1e-3", "dp-accounting", "PLD 1e-3 pessimistic", IMPORT_DPA, "dp_accounting_call",
     {"interval": 1e-3}),
    ("prv 0.01", "prv-accountant", "eps_error 0.01", IMPORT_PRV, "prv_call", {"eps_error": 0.01}),
    ("prv 0.001", "prv-accountant", "eps_error 0.001", IMPORT_PRV, "prv_call", {"eps_error": 0.001}),
]


def _scalar(value, key):
    got = (value or {}).get(key)
    if got is None:
        return None
    got = np.ravel(np.asarray(got, dtype=float))[0]
    return float(got) if np.isfinite(got) else None


def part1(args, report) -> None:
    steps = 1_000 if args.quick else STEPS
    single = (SIGMA, Q, steps)
    methods = [m for m in PART1 if not (args.quick and m[0] in QUICK_SKIP)]
    rows = {}
    cache = tempfile.mkdtemp(prefix="pldjax-bench-cache-")
    try:
        for label, library, setting, imports, factory, kwargs in methods:
            harness.log(f"dpsgd part 1: {library} {setting}")
            spec = dict(module="bench.dpsgd", factory=factory,
                        kwargs=dict(sigmas=single[0], qs=single[1], steps=single[2], **kwargs),
                        imports=imports, timeout=args.timeout)
            cached = label == "pldjax cached"
            if cached:  # fill the cache first
                harness.fresh_process(**spec, cache=cache)
            res = harness.fresh_process(**spec, cache=cache if cached else None)
            row = dict(library=library, setting=setting, fresh=res)
            if "error" not in res and not cached:
                call = globals()[factory](*single, **kwargs)
                row["warm_s"], row["warm_times"], _ = harness.warm_median(call, args.repeats)
            rows[label] = row
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    steady = _steady_rows(rows, single, args.repeats)

    values = {label: {k: _scalar(row["fresh"].get("value"), k) for k in ("upper", "lower")}
              for label, row in rows.items()}
    values.update({label: {k: _scalar(row["value"], k) for k in ("upper", "lower")}
                   for label, row in steady.items()})
    lowers = [v["lower"] for v in values.values() if v["lower"] is not None]
    uppers = [v["upper"] for v in values.values() if v["upper"] is not None]
    best_lower, best_upper = max(lowers, default=None), min(uppers, default=None)
    reference = rows.get("dpa 1e-4", {}).get("warm_s")
    table = []
    for label, row in rows.items():
        res = row["fresh"]
        if "error" in res:
            table.append([row["library"], row["setting"], res["error"]] + [None] * 9)
            continue
        up, low = values[label]["upper"], values[label]["lower"]
        warm = row.get("warm_s")
        table.append([
            row["library"], row["setting"], harness.fmt(up, ".6f"), harness.fmt(low, ".6f"),
            harness.fmt(None if up is None or not best_lower else up / best_lower - 1, "+.1e"),
            harness.fmt(None if low is None or not best_upper else 1 - low / best_upper, "+.1e"),
            f"{res['import_s']:.2f}", f"{res['first_s']:.3f}",
            None if warm is None else f"{warm:.3f} ({len(row['warm_times'])})",
            f"{res['peak_mb']:.0f}", f"{res['call_mb']:.0f}",
            None if warm is None or reference is None else f"{reference / warm:.1f}",
        ])
    for label, row in steady.items():
        up, low = values[label]["upper"], values[label]["lower"]
        table.append([
            "pldjax", row["setting"], harness.fmt(up, ".6f"), harness.fmt(low, ".6f"),
            harness.fmt(None if up is None or not best_lower else up / best_lower - 1, "+.1e"),
            harness.fmt(None if low is None or not best_upper else 1 - low / best_upper, "+.1e"),
            None, None, f"{row['warm_s']:.3f} ({len(row['warm_times'])})", None, None,
            None if reference is None else f"{reference / row['warm_s']:.1f}",
        ])
    report.heading(f"Part 1: one configuration (sigma = {SIGMA:g}, q = {Q:g}, T = {steps:,}, "
                   f"delta = {DELTA:g})")
    report.table(["library", "setting", "eps upper", "eps lower", "upper vs L*", "lower vs U*", "import s",
                  "first s", "warm s (n)", "peak MB", "call MB", "dp-accounting 1e-4 warm / warm"], table)
    notes = [f"first s: the call alone in a fresh process (import apart; {harness.compilation_note()}, "
             "except in the cache-filled row); peak MB: that process's peak RSS; call MB: what the first "
             "call added to it; warm s: median of n calls in this process after a warm-up call (at "
             f"least {args.repeats}, and more until they take {harness.WARM_SECONDS:g} s in all; a "
             "process's first calls run in NumPy on the host, see pldjax.core.compilation.HostWork; "
             "the compiled-kernels rows are the same calls once the process has compiled them, as a "
             "loop of calls does after its host work, run here with PLDJAX_HOST_WORK=0). "
             f"L* = {harness.fmt(best_lower, '.6f')} (largest lower bound), "
             f"U* = {harness.fmt(best_upper, '.6f')} (smallest upper bound)."]
    import pldjax as pj

    size = composition_window(lambda: pj.dpsgd_epsilon(SIGMA, Q, steps, DELTA))
    bare = harness.fft_round_trip(size)["median"]
    if rows.get("pldjax", {}).get("warm_s"):
        notes.append(f"pldjax's composition window: {size:,} points; a bare jitted float64 rfft + irfft of "
                     f"it takes {bare * 1e3:.2f} ms; pldjax warm / bare FFT = "
                     f"{rows['pldjax']['warm_s'] / bare:.0f}"
                     + (f" (compiled kernels: {steady['pldjax steady']['warm_s'] / bare:.1f})"
                        if "pldjax steady" in steady else "") + ".")
    report.text(" ".join(notes))
    report.flush()


def composition_window(call) -> int:
    """Points of the largest composition window ``call`` (a pldjax accounting call) composes
    at, as the engine queues its rows (on the host or compiled alike)."""
    from pldjax.accounting import engine

    sizes = []
    add = engine._Compositions.add

    def recorded(self, size, *args, **kwargs):
        sizes.append(int(size))
        return add(self, size, *args, **kwargs)

    engine._Compositions.add = recorded
    try:
        call()
    finally:
        engine._Compositions.add = add
    return max(sizes)


def _steady_rows(rows, single, repeats: int) -> dict:
    """pldjax's pessimistic (and, where part 1 ran it, optimistic) warm calls on the compiled
    kernels, in this process: a loop's steady state once its host work is spent."""
    import os

    steady = {}
    settings = [("pldjax steady", "pldjax", "pessimistic, compiled kernels", {}),
                ("pldjax opt steady", "pldjax opt", "optimistic, compiled kernels",
                 {"pessimistic": False})]
    before = os.environ.get("PLDJAX_HOST_WORK")
    os.environ["PLDJAX_HOST_WORK"] = "0"
    try:
        for label, source, setting, kwargs in settings:
            if source not in rows or "warm_s" not in rows[source]:
                continue
            harness.log(f"dpsgd part 1: pldjax {setting}")
            warm, times, value = harness.warm_median(pldjax_call(*single, **kwargs), repeats)
            steady[label] = dict(setting=setting, warm_s=warm, warm_times=times, value=value)
    finally:
        if before is None:
            del os.environ["PLDJAX_HOST_WORK"]
        else:
            os.environ["PLDJAX_HOST_WORK"] = before
    return steady


def _rel(values, reference):
    """(median, largest) of values / reference - 1 where both are finite."""
    values, reference = np.asarray(values, float), np.asarray(reference, float)
    ok = np.isfinite(values) & np.isfinite(reference)
    if not ok.any():
        return None, None
    rel = values[ok] / reference[ok] - 1
    return float(np.median(rel)), float(np.max(rel))


def part2(args, report) -> None:
    n, k = (4, 1) if args.quick else (1024, 16)
    n, k = args.configs or n, args.subset or k
    rtol = None if args.quick or not args.rtol else args.rtol
    sigmas, qs, steps = harness.sweep_configs(n, SEED)
    if args.quick:
        steps = np.minimum(steps, 1_000)
    subset = np.sort(np.random.default_rng(SEED + 1).choice(n, min(k, n), replace=False))
    sub = (sigmas[subset], qs[subset], steps[subset])

    harness.log(f"dpsgd part 2: pldjax, {n} configurations in one call (fresh process)")
    ours = harness.fresh_process("bench.dpsgd", "pldjax_call", dict(sigmas=sigmas, qs=qs, steps=steps),
                                 imports=IMPORT_PLDJAX, calls=1 + args.sweep_repeats, timeout=args.timeout)
    peers = {}
    for label, factory, kwargs in [("dp-accounting", dp_accounting_call, {"interval": 1e-4}),
                                   ("prv-accountant", prv_call, {"eps_error": 0.01})]:
        harness.log(f"dpsgd part 2: {label} on a subset of {len(subset)}")
        errors = [] if factory is prv_call else None
        times, values = [], []
        for i in range(len(subset)):
            extra = {} if errors is None else {"errors": errors}
            seconds, got = harness.timed(factory(sub[0][i], sub[1][i], sub[2][i], **kwargs, **extra))
            times.append(seconds)
            values.append(float(got["upper"][0]))
        peers[label] = dict(seconds=times, upper=np.array(values), errors=errors or [])
    reference = peers["dp-accounting"]["upper"]

    harness.log(f"dpsgd part 2: pldjax on the subset of {len(subset)} (this process, warm)")
    local = {}  # label -> (setting, configs, warm s, CPU s, upper on the subset)
    settings = [(None, "")] + ([(rtol, f", rtol={rtol:g}")] if rtol else [])
    for accuracy, suffix in settings:
        call = pldjax_call(*sub, rtol=accuracy)
        seconds, _, value = harness.warm_median(call, args.repeats)
        cpu = harness.cpu_timed(call)[0]
        local[f"subset{suffix}"] = (f"pessimistic{suffix}, the subset in one call", len(subset), seconds, cpu,
                                    value["upper"])
        singles = [pldjax_call(*(a[i] for a in sub), rtol=accuracy) for i in range(len(subset))]
        for single in singles:  # compile each configuration's shapes first
            single()
        timings = [harness.cpu_timed(single) for single in singles]
        local[f"singles{suffix}"] = (f"pessimistic{suffix}, one call per configuration", len(subset),
                                     sum(t[1] for t in timings), sum(t[0] for t in timings),
                                     np.array([float(t[2]["upper"]) for t in timings]))
        if accuracy is not None:
            harness.log(f"dpsgd part 2: pldjax, {n} configurations at rtol={accuracy:g} (this process)")
            sweep = pldjax_call(sigmas, qs, steps, rtol=accuracy)
            first = harness.timed(sweep)[0]
            cpu, wall, value = harness.cpu_timed(sweep)
            local[f"sweep{suffix}"] = (f"pessimistic{suffix}, one batched call (first {first:.1f} s, this "
                                       "process)", n, wall, cpu, value["upper"][subset])

    rows = []
    throughput = {}
    if "error" in ours:
        rows.append(["pldjax", "pessimistic, one batched call", n, ours["error"]] + [None] * 7)
    else:
        # the fastest further call: a later call buys the programs the first composed in NumPy
        fastest = min(range(1, len(ours["wall_s"])), key=ours["wall_s"].__getitem__, default=0)
        warm, cpu = ours["wall_s"][fastest], ours["cpu_s"][fastest]
        throughput["pldjax"] = n / warm
        upper = np.array([np.nan if v is None else v for v in ours["value"]["upper"]])[subset]
        med, top = _rel(upper, reference)
        rows.append(["pldjax", "pessimistic, one batched call (fresh process)", n, f"{ours['first_s']:.2f}",
                     f"{warm:.2f}", f"{cpu:.2f}", f"{n / warm:.1f}", f"{ours['peak_mb']:.0f}", "1.0",
                     harness.fmt(med, "+.1e"), harness.fmt(top, "+.1e")])
    for setting, count, wall, cpu, upper in local.values():
        med, top = _rel(upper, reference)
        rows.append(["pldjax", setting, count, None, f"{wall:.2f}", f"{cpu:.2f}", f"{count / wall:.1f}", None,
                     harness.fmt(throughput.get("pldjax", math.nan) / (count / wall), ".2f"),
                     harness.fmt(med, "+.1e"), harness.fmt(top, "+.1e")])
    for label, setting in [("dp-accounting", "PLD 1e-4 pessimistic, loop over the subset"),
                           ("prv-accountant", "eps_error 0.01, loop over the subset")]:
        res = peers[label]
        total = sum(res["seconds"])
        failed = f", {len(res['errors'])} failed" if res["errors"] else ""
        med, top = _rel(res["upper"], reference)
        rows.append([label, setting + failed, len(subset), None, f"{total:.2f}", None,
                     f"{len(subset) / total:.2f}", None,
                     harness.fmt(throughput.get("pldjax", math.nan) / (len(subset) / total), ".1f"),
                     harness.fmt(med, "+.1e"), harness.fmt(top, "+.1e")])
    capped = ", T capped at 1,000" if args.quick else ""
    report.heading(f"Part 2: a sweep of {n:,} configurations (seed {SEED}{capped}); peers on a random "
                   f"subset of {len(subset)}")
    report.table(["library", "setting", "configs", "first s", "warm s", "CPU s", "configs/s", "peak MB",
                  "pldjax batched configs/s / this", "vs dp-accounting 1e-4: median", "largest"], rows)
    notes = [f"warm s: the fastest of the fresh process's {args.sweep_repeats} calls after its "
             "first (batched sweep: a process composes in NumPy at first, and a later call compiles what it "
             "then needs, see pldjax.core.compilation.HostWork; the time in the table is its steady state) "
             "or, in this process, the median of repeats after a warm-up (subset in one call), the sum "
             "over the subset after each configuration's first call (one call per configuration; rtol "
             "sweep: its second call), or the peers' loops (throughput extrapolated from the subset). "
             "CPU s: this process's CPU seconds in the same calls (less noisy on a shared machine). "
             "vs dp-accounting: each method's upper epsilon on the subset over dp-accounting (1e-4)'s, "
             "minus 1."]
    for err in peers["prv-accountant"]["errors"][:3]:
        notes.append(f"prv-accountant failed: {err}.")
    report.text(" ".join(notes))
    report.flush()


def part3(args, report) -> None:
    rows = []
    timeout = min(args.timeout, FULL_BATCH_TIMEOUT)
    for sigma, steps in FULL_BATCH[:2] if args.quick else FULL_BATCH:
        exact = harness.gaussian_epsilon_exact(math.sqrt(steps) / sigma, DELTA)
        methods = [
            ("pldjax", "closed form, upper", "pldjax_call", dict(sigmas=sigma, qs=1.0, steps=steps)),
            ("pldjax", "closed form, lower", "pldjax_call",
             dict(sigmas=sigma, qs=1.0, steps=steps, pessimistic=False)),
            ("pldjax", "PLD on the automatic grid", "pldjax_grid_call", dict(sigma=sigma, steps=steps)),
            ("dp-accounting", "PLD 1e-4 pessimistic", "dp_accounting_call",
             dict(sigmas=sigma, qs=1.0, steps=steps)),
        ]
        for library, setting, factory, kwargs in methods:
            harness.log(f"dpsgd part 3: sigma {sigma:g}, T {steps:,}: {library} {setting}")
            imports = "import pldjax" if library == "pldjax" else "import dp_accounting"
            res = harness.fresh_process("bench.dpsgd", factory, kwargs, imports=imports, calls=3,
                                        timeout=timeout)
            if "error" in res:
                rows.append([f"{sigma:g}", f"{steps:,}", f"{exact:.9g}", library, setting, res["error"],
                             None, None, None])
                continue
            value = _scalar(res["value"], "upper" if "upper" in res["value"] else "lower")
            rows.append([f"{sigma:g}", f"{steps:,}", f"{exact:.9g}", library, setting, f"{value:.9g}",
                         harness.fmt(value / exact - 1, "+.1e"), f"{res['first_s']:.3f}",
                         f"{min(res['wall_s'][1:]):.4f}"])
    report.heading(f"Part 3: full-batch steps (q = 1), delta = {DELTA:g}")
    report.table(["sigma", "T", "exact epsilon", "library", "setting", "epsilon", "vs exact", "first s",
                  "warm s"], rows)
    report.text("exact: Gaussian DP with mu = sqrt(T) / sigma in mpmath. first s: the first call in a fresh "
                f"process (import apart; {harness.compilation_note()}); warm s: the faster of its next two "
                f"calls. A process past {timeout:g} s is stopped.")
    report.flush()


def run(args, report) -> None:
    if args.quick:
        args.repeats = min(args.repeats, 2)
    parts = {p.strip() for p in args.parts.split(",")}
    if "1" in parts:
        part1(args, report)
    if "2" in parts:
        part2(args, report)
    if "3" in parts:
        part3(args, report)
