"""DP-SGD accounting: pldjax against dp-accounting and prv-accountant, side by side in one run.

The mechanism is the Poisson-subsampled Gaussian (add/remove adjacency), epsilon at delta = 1e-5.

Part 1, one configuration (sigma = 1, q = 0.01, T = 10,000):

* pldjax ``pj.dpsgd_epsilon`` pessimistic (upper bound) and optimistic (lower bound); also the
  first call with pldjax's persistent compilation cache already filled;
* dp-accounting's PLD accountant, ``value_discretization_interval`` 1e-4 (pessimistic and
  optimistic) and 1e-3 (pessimistic, for context);
* prv-accountant's ``DPSGDAccountant`` with eps_error 0.01 and 0.001 (delta_error = delta / 1000),
  which gives a lower and an upper bound in one call.

For each: epsilon; the import time and the first call (compilation included) in a fresh
``python -c`` process, timed separately; the peak resident memory of that process and how much the
call added to it (VmHWM from /proc/self/status: on Linux ru_maxrss survives fork + exec, so a child
would report its parent's peak); the warm time (median of repeats in this process, after a warm-up
call); and dp-accounting(1e-4)'s warm time over it. Below the table: pldjax's warm time over a bare
jitted float64 rfft + irfft of its composition window (how far pldjax is from the FFT alone).

Part 2, a sweep of N random configurations (seeded): sigma uniform in [0.5, 3], q log-uniform in
[1e-3, 0.05], T log-uniform integer in [1e2, 1e5], delta = 1e-5. pldjax answers all of them in one
batched call, timed cold (fresh process) and warm (a second call in that process). The peers loop
over a random subset of K configurations in this process and their throughput (configs/s) is
extrapolated from it; prv-accountant failures are caught and counted. pldjax also answers the
subset alone in one call (warm, this process), the like-for-like comparison, as the subset's
configurations need not be as costly as the sweep's on average. On the subset, pldjax's
pessimistic epsilon is compared with dp-accounting(1e-4)'s, and with pldjax's own values for the
same configurations on their own (a batch shares one grid size, so the values can differ slightly).

    python bench/dpsgd.py --quick    # N = 64, K = 4 (a few minutes on 2 CPU cores)
    python bench/dpsgd.py --timeout 1800    # N = 1024, K = 16 (about 20 minutes on 2 CPU cores)

Needs: pip install '.[bench]'. Not part of CI. Writes a table to stdout and
bench/results/dpsgd_<jax backend>_<UTC time>.{json,txt}.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

SIGMA, Q, STEPS, DELTA = 1.0, 0.01, 10_000, 1e-5
SEED = 0
HERE = os.path.dirname(os.path.abspath(__file__))


# -- the computations: scalars in, a dict of epsilons out (arrays in, arrays out) -------------------
def _configs(sigmas, qs, steps):
    return zip(np.atleast_1d(sigmas).tolist(), np.atleast_1d(qs).tolist(),
               np.atleast_1d(steps).astype(int).tolist(), strict=True)


def _shaped(values, like):
    return float(values[0]) if np.ndim(like) == 0 else np.asarray(values, dtype=float)


def run_pldjax(sigmas, qs, steps, pessimistic=True):
    import pldjax as pj

    eps = pj.dpsgd_epsilon(sigmas, qs, steps, DELTA, pessimistic=pessimistic)
    return {"upper" if pessimistic else "lower": eps}


def run_dp_accounting(sigmas, qs, steps, interval=1e-4, pessimistic=True):
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    out = []
    for sigma, q, count in _configs(sigmas, qs, steps):
        pld = pldlib.from_gaussian_mechanism(
            standard_deviation=sigma, sampling_prob=q, value_discretization_interval=interval,
            pessimistic_estimate=pessimistic, use_connect_dots=pessimistic,  # optimistic: privacy buckets
        )
        out.append(pld.self_compose(count).get_epsilon_for_delta(DELTA))
    return {"upper" if pessimistic else "lower": _shaped(out, sigmas)}


def run_prv(sigmas, qs, steps, eps_error=0.01, errors=None):
    """prv-accountant's (upper, lower) bounds; with ``errors`` a list, failures give nan and are logged."""
    from prv_accountant.dpsgd import DPSGDAccountant

    ups, lows = [], []
    for sigma, q, count in _configs(sigmas, qs, steps):
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
    return {"upper": _shaped(ups, sigmas), "lower": _shaped(lows, sigmas)}


# what a fresh process imports (timed apart from the call)
IMPORT_PLDJAX = "import pldjax"
IMPORT_DPA = "from dp_accounting.pld import privacy_loss_distribution"
IMPORT_PRV = "from prv_accountant.dpsgd import DPSGDAccountant"

# label, library, setting, import, function, kwargs
PART1 = [
    ("pldjax", "pldjax", "pessimistic", IMPORT_PLDJAX, "run_pldjax", {}),
    ("pldjax opt", "pldjax", "optimistic", IMPORT_PLDJAX, "run_pldjax", {"pessimistic": False}),
    ("pldjax cached", "pldjax", "pessimistic, compilation cache filled", IMPORT_PLDJAX, "run_pldjax", {}),
    ("dpa 1e-4", "dp_accounting", "1e-4 pessimistic", IMPORT_DPA, "run_dp_accounting", {"interval": 1e-4}),
    ("dpa 1e-4 opt", "dp_accounting", "1e-4 optimistic", IMPORT_DPA, "run_dp_accounting",
     {"interval": 1e-4, "pessimistic": False}),
    ("dpa 1e-3", "dp_accounting", "1e-3 pessimistic", IMPORT_DPA, "run_dp_accounting", {"interval": 1e-3}),
    ("prv 0.01", "prv_accountant", "eps_error 0.01", IMPORT_PRV, "run_prv", {"eps_error": 0.01}),
    ("prv 0.001", "prv_accountant", "eps_error 0.001", IMPORT_PRV, "run_prv", {"eps_error": 0.001}),
]


# -- a fresh process: import timed, then the first call timed, then optional repeats -----------------
WORKER = r"""
import json, resource, sys, time
def rss():  # peak resident MB of this process: VmHWM (ru_maxrss would inherit the parent's peak)
    try:
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
spec = json.loads(sys.stdin.read())
rss_start = rss()
t0 = time.perf_counter()
exec(spec["imports"])
import_s = time.perf_counter() - t0
import importlib.util
loader = importlib.util.spec_from_file_location("dpsgd_bench", spec["bench"])
bench = importlib.util.module_from_spec(loader)
loader.loader.exec_module(bench)
fn = getattr(bench, spec["fn"])
args = [bench.np.asarray(a) if isinstance(a, list) else a for a in spec["args"]]
rss_before = rss()
t0 = time.perf_counter()
value = fn(*args, **spec["kwargs"])
first_s = time.perf_counter() - t0
call_mb = rss() - rss_before
warm = []
for _ in range(spec["repeats"]):
    t0 = time.perf_counter()
    fn(*args, **spec["kwargs"])
    warm.append(time.perf_counter() - t0)
print(json.dumps(dict(import_s=import_s, first_s=first_s, warm_s=warm, peak_mb=rss(), call_mb=call_mb,
                      import_mb=rss_before - rss_start, value=bench.jsonable(value))))
"""


def jsonable(value):
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray | np.generic):
        return jsonable(value.tolist())
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return None if math.isnan(value) else value
    return value


def fresh_process(imports, fn, args, kwargs, timeout, repeats=0, cache_dir=None):
    """Run ``fn(*args, **kwargs)`` in a new interpreter; its timings, memory and value (or an error)."""
    spec = dict(imports=imports, bench=os.path.abspath(__file__), fn=fn, kwargs=kwargs, repeats=repeats,
                args=[jsonable(a) for a in args])
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a cold start must not find compiled kernels
    # nor pldjax's default cache (on at import): off, or the given directory
    env["PLDJAX_COMPILATION_CACHE"] = str(cache_dir) if cache_dir else "0"
    try:
        proc = subprocess.run([sys.executable, "-c", WORKER], input=json.dumps(spec), capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(error=f"timeout after {timeout:g} s")
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        return dict(error=f"exit {proc.returncode}: {tail[0]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def warm_seconds(fn, args, kwargs, repeats, budget_s=60.0):
    """Median of ``repeats`` calls after a warm-up call (fewer, at least 1, where a call is slow)."""
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    first = time.perf_counter() - t0
    n = repeats if first * repeats <= budget_s else max(1, int(budget_s // max(first, 1e-9)))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, value


def bare_fft_seconds(size, repeats=20):
    """Median time of a jitted float64 rfft + irfft of ``size`` points."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    fft = jax.jit(lambda x: jnp.fft.irfft(jnp.fft.rfft(x), size))
    x = jnp.linspace(0.0, 1.0, size, dtype=jnp.float64)
    assert fft(x).dtype == jnp.float64
    fft(x).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fft(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sweep_configs(n, seed=SEED):
    rng = np.random.default_rng(seed)
    sigmas = rng.uniform(0.5, 3.0, n)
    qs = np.exp(rng.uniform(np.log(1e-3), np.log(0.05), n))
    steps = np.round(np.exp(rng.uniform(np.log(1e2), np.log(1e5), n))).astype(np.int64)
    return sigmas, qs, steps


def table(header, rows):
    """Columns right-aligned to their widest cell, the first two left-aligned."""
    cells = [header] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]


def _f(value, spec):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def machine_info():
    import jax

    versions = {}
    for dist in ("pldjax", "jax", "jaxlib", "numpy", "scipy", "dp-accounting", "prv-accountant"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    try:
        commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--", "../pldjax"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += " (pldjax/ modified)" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = None
    return dict(
        platform=platform.platform(), processor=platform.processor() or platform.machine(),
        cpus=os.cpu_count(), python=platform.python_version(), jax_backend=jax.default_backend(),
        devices=[str(d) for d in jax.devices()], versions=versions, pldjax_commit=commit,
        load_average=os.getloadavg(),
    )


def part1(args, say, log):
    single = (SIGMA, Q, STEPS)
    rows = {}
    cache = tempfile.mkdtemp(prefix="pldjax-bench-cache-")
    try:
        for label, library, setting, imports, fn, kwargs in PART1:
            log(f"part 1: {library} {setting}")
            cache_dir = cache if "cached" in label else None
            if cache_dir:  # fill the cache first
                fresh_process(imports, fn, single, kwargs, args.timeout, cache_dir=cache_dir)
            res = fresh_process(imports, fn, single, kwargs, args.timeout, cache_dir=cache_dir)
            row = dict(library=library, setting=setting, fresh=res)
            if "error" not in res and not cache_dir:
                median, times, value = warm_seconds(globals()[fn], single, kwargs, args.repeats)
                row.update(warm_s=median, warm_times=times, warm_value=jsonable(value))
                if row["warm_value"] != res["value"]:
                    log(f"  note: {label} gave {res['value']} fresh and {row['warm_value']} warm")
            rows[label] = row
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    reference = rows["dpa 1e-4"].get("warm_s")
    out = []
    for row in rows.values():
        res = row["fresh"]
        if "error" in res:
            out.append([row["library"], row["setting"], res["error"]] + [None] * 7)
            continue
        warm = row.get("warm_s")
        out.append([
            row["library"], row["setting"], _f(res["value"].get("upper"), ".6f"),
            _f(res["value"].get("lower"), ".6f"), f"{res['import_s']:.2f}", f"{res['first_s']:.3f}",
            None if warm is None else f"{warm:.3f} ({len(row['warm_times'])})",
            f"{res['peak_mb']:.0f}", f"{res['call_mb']:.0f}",
            None if warm is None or reference is None else f"{reference / warm:.1f}",
        ])
    say(f"Part 1: sigma={SIGMA}, q={Q}, T={STEPS}, delta={DELTA} (add/remove, epsilon from both directions)")
    for line in table(["library", "setting", "eps_upper", "eps_lower", "import s", "first s", "warm s (n)",
                       "peak MB", "call MB", "dpa(1e-4) warm / warm"], out):
        say(line)

    import pldjax as pj

    size = int(pj.gaussian(SIGMA, sampling_prob=Q).self_compose(STEPS).size)
    bare = bare_fft_seconds(size)
    fft = dict(size=size, seconds=bare)
    if "warm_s" in rows["pldjax"]:
        fft["pldjax_over_fft"] = rows["pldjax"]["warm_s"] / bare
        say(f"pldjax composition window {size} points: bare jitted float64 rfft+irfft {bare * 1e3:.2f} ms; "
            f"pldjax warm / bare FFT = {fft['pldjax_over_fft']:.0f}")
    say("first s: the call alone in a fresh process (import s apart); peak MB: that process's peak RSS "
        "(VmHWM); call MB: what the first call added to it; warm s: median of n calls in this process")
    return dict(rows=rows, bare_fft=fft)


def part2(args, say, log):
    n, k = (64, 4) if args.quick else (1024, 16)
    n, k = args.configs or n, args.subset or k
    sigmas, qs, steps = sweep_configs(n)
    subset = np.sort(np.random.default_rng(SEED + 1).choice(n, min(k, n), replace=False))
    sub = (sigmas[subset], qs[subset], steps[subset])

    log(f"part 2: pldjax, {n} configurations in one call (fresh process, cold then warm)")
    ours = fresh_process(IMPORT_PLDJAX, "run_pldjax", (sigmas, qs, steps), {}, args.timeout,
                         repeats=args.sweep_repeats)
    peers = {}
    for label, fn, kwargs in [("dp_accounting", run_dp_accounting, {"interval": 1e-4}),
                              ("prv_accountant", run_prv, {"eps_error": 0.01})]:
        log(f"part 2: {label} on a subset of {len(subset)}")
        errors = [] if fn is run_prv else None
        times, values = [], []
        for i in range(len(subset)):
            one = (sub[0][i : i + 1], sub[1][i : i + 1], sub[2][i : i + 1])
            t0 = time.perf_counter()
            got = fn(*one, **kwargs, **({"errors": errors} if errors is not None else {}))
            times.append(time.perf_counter() - t0)
            values.append(float(got["upper"][0]))
        peers[label] = dict(seconds=times, upper=values, errors=errors or [])
    log(f"part 2: pldjax on the subset of {len(subset)} in one call (this process, warm)")
    sub_s, sub_times, sub_value = warm_seconds(run_pldjax, sub, {}, args.repeats)
    pldjax_subset = dict(seconds=sub_s, times=sub_times, upper=jsonable(sub_value["upper"]))

    out, throughput = [], {}
    if "error" in ours:
        out.append(["pldjax", "batched, one call", ours["error"]] + [None] * 5)
    else:
        warm = statistics.median(ours["warm_s"]) if ours["warm_s"] else ours["first_s"]
        throughput["pldjax"] = n / warm
        out.append(["pldjax", "pessimistic, one batched call", n, f"{ours['first_s']:.2f}", f"{warm:.2f}",
                    f"{n / warm:.2f}", f"{ours['peak_mb']:.0f}", "1.0"])
    settings = {"dp_accounting": "1e-4 pessimistic, loop over subset", "prv_accountant":
                "eps_error 0.01, loop over subset"}
    for label, res in peers.items():
        total = sum(res["seconds"])
        throughput[label] = len(subset) / total
        failed = f", {len(res['errors'])} failed" if res["errors"] else ""
        ratio = throughput.get("pldjax", math.nan) / throughput[label]
        out.append([label, settings[label] + failed, len(subset), None, f"{total:.2f}",
                    f"{throughput[label]:.2f} (extrapolated)", None, _f(ratio, ".1f")])
    throughput["pldjax_subset"] = len(subset) / sub_s
    out.append(["pldjax", "pessimistic, the subset in one call", len(subset), None, f"{sub_s:.2f}",
                f"{throughput['pldjax_subset']:.2f}", None,
                _f(throughput.get("pldjax", math.nan) / throughput["pldjax_subset"], ".1f")])
    say()
    say(f"Part 2: sweep of {n} configurations (seed {SEED}: sigma U[0.5,3], q logU[1e-3,0.05], "
        f"T logU[1e2,1e5], delta={DELTA}); peers on a random subset of {len(subset)}")
    for line in table(["library", "setting", "configs", "first s", "warm s", "configs/s", "peak MB",
                       "pldjax configs/s / this"], out):
        say(line)

    accuracy = {}
    if "error" not in ours:
        mine = np.array([np.nan if v is None else v for v in ours["value"]["upper"]])[subset]
        theirs = np.array(peers["dp_accounting"]["upper"])
        rel = (mine - theirs) / theirs
        accuracy = dict(pldjax=mine.tolist(), dp_accounting=theirs.tolist(), rel=rel.tolist(),
                        median=float(np.median(rel)), max=float(np.max(rel)),
                        pldjax_le_dp_accounting=float(np.mean(mine <= theirs)))
        say(f"on the subset: (pldjax - dp_accounting(1e-4)) / dp_accounting(1e-4): median "
            f"{accuracy['median']:.2e}, max {accuracy['max']:.2e}; pldjax <= dp_accounting on "
            f"{accuracy['pldjax_le_dp_accounting']:.0%} of {len(subset)}")
        prv = np.array(peers["prv_accountant"]["upper"])
        ok = ~np.isnan(prv)
        if ok.any():
            prv_rel = (prv[ok] - theirs[ok]) / theirs[ok]
            accuracy["prv_rel_median"] = float(np.median(prv_rel))
            say(f"  (prv_accountant(0.01) upper - dp_accounting(1e-4)) / dp_accounting(1e-4): median "
                f"{accuracy['prv_rel_median']:.2e} on {int(ok.sum())}")
    say(f"on the subset alone: dp_accounting(1e-4) loop / pldjax one call = "
        f"{sum(peers['dp_accounting']['seconds']) / sub_s:.2f} (time ratio); prv_accountant(0.01) loop / "
        f"pldjax one call = {sum(peers['prv_accountant']['seconds']) / sub_s:.2f}")
    if "error" not in ours:
        alone = np.array(pldjax_subset["upper"], dtype=float)
        pldjax_subset["rel_to_sweep"] = ((alone - mine) / mine).tolist()
        say(f"pldjax on the subset alone vs the same configurations within the sweep: max |relative "
            f"difference| {np.max(np.abs(alone - mine) / mine):.1e}")
    for err in peers["prv_accountant"]["errors"][:3]:
        say(f"  prv_accountant failed: {err}")
    say("pldjax: first s = cold call in a fresh process (compilation included), warm s = a second call "
        "there; subset rows: this process, warm (pldjax: median of repeats after a warm-up)")
    return dict(n=n, seed=SEED, configs=dict(sigma=sigmas.tolist(), q=qs.tolist(), steps=steps.tolist()),
                subset=subset.tolist(), pldjax=ours, peers=peers, pldjax_subset=pldjax_subset,
                throughput=throughput, accuracy=accuracy)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sweep of 64 configurations, subset of 4")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per fresh process")
    parser.add_argument("--repeats", type=int, default=5, help="warm repeats in part 1 (median)")
    parser.add_argument("--sweep-repeats", type=int, default=1, help="warm calls of the pldjax sweep")
    parser.add_argument("--configs", type=int, help="sweep size N (default 1024, 64 with --quick)")
    parser.add_argument("--subset", type=int, help="peers' subset size K (default 16, 4 with --quick)")
    args = parser.parse_args()

    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    start = time.perf_counter()

    def log(text):
        print(f"[{time.perf_counter() - start:7.1f} s] {text}", file=sys.stderr, flush=True)

    machine = machine_info()
    record = dict(args=vars(args), sigma=SIGMA, q=Q, steps=STEPS, delta=DELTA)
    record["part1"] = part1(args, say, log)
    record["part2"] = part2(args, say, log)
    machine["load_average_end"] = os.getloadavg()
    record["machine"] = machine
    record["wall_s"] = time.perf_counter() - start
    say()
    say(f"machine: {machine['processor']}, {machine['cpus']} CPUs, {machine['platform']}; jax "
        f"{machine['versions']['jax']} backend {machine['jax_backend']} {machine['devices']}; "
        f"dp-accounting {machine['versions']['dp-accounting']}, prv-accountant "
        f"{machine['versions']['prv-accountant']}, numpy {machine['versions']['numpy']}; pldjax "
        f"{machine['pldjax_commit']}; load average {machine['load_average'][0]:.1f} at start, "
        f"{machine['load_average_end'][0]:.1f} at end; {record['wall_s']:.0f} s in all")

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = os.path.join(HERE, "results", f"dpsgd_{machine['jax_backend']}_{stamp}")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    with open(base + ".json", "w") as fh:
        json.dump(jsonable(record), fh, indent=1)
    with open(base + ".txt", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"saved {base}.json and .txt")


if __name__ == "__main__":
    main()
