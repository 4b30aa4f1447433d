"""The natural filter's worst case V_k (residue-filters.txt Thm 6): how long pldjax takes.

Four Gaussian queries G_mu (mu = 0.5, 0.75, 1, 1.25 by default), each discretized on
``pj.Grid(step=32 / n, size=n)`` (the same loss range, [-16, 16] around the mean, at n points, so a
larger n is a finer grid), budget ``pj.gdp(2.0, pessimistic=False)``, ``--rounds`` rounds (8 by
default). For each function (``pj.natural_filter_free``, ``pj.natural_filter_bounds``) and each n,
a fresh process makes two identical calls: ``first s`` (compilation included) and ``warm s`` (the
second call), and reports the verdict (free / not free / undecided) or the bracket's gap, the
upper and lower excess over the budget, the recursion's window (grid points per curve), the number
of query multisets (states), and the process's peak RSS.

GDP queries are totally ordered (Cor. 5), so the exact answer is "free". A case that runs past
``--timeout`` seconds (default 300) is recorded as such and the larger sizes of that function are
skipped.

Compilation: each case's process starts with an empty persistent compilation cache of its own (a
temporary directory; ``JAX_COMPILATION_CACHE_DIR`` is not passed on), so ``first s`` includes
every compilation; a second fresh process then makes the first call with that cache filled
(``cached s``; ``--no-cached`` skips it). The workers import the pldjax of this checkout (its root
is put first on ``PYTHONPATH``).

    python bench/natural_filter.py --quick    # n = 4096, 4 rounds (under a minute on 2 cores)
    python bench/natural_filter.py            # n = 4096, 8192, 16384; 8 rounds (4 min on 2 cores)

Not part of CI. Prints a table and writes bench/results/natural_filter_<device>_<UTC time>.txt
(and .json), rewritten after every case so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FUNCTIONS = ("natural_filter_free", "natural_filter_bounds")


def _queries(n: int, mus):
    import pldjax as pj

    grid = pj.Grid(step=32.0 / n, size=n)
    return [pj.gdp(mu, grid=grid) for mu in mus]


def worker(function: str, n: int, rounds: int, mus, budget_mu: float) -> dict:
    """Runs in a fresh process: two calls of ``function``; returns the measurements."""
    import jax

    import pldjax as pj

    queries = _queries(n, mus)
    budget = pj.gdp(budget_mu, pessimistic=False)
    call = getattr(pj, function)
    times, cpu = [], []
    result = None
    for _ in range(2):
        t0, c0 = time.perf_counter(), time.process_time()
        result = call(queries, budget=budget, rounds=rounds)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    row = dict(function=function, n=n, step=32.0 / n, rounds=rounds, first_s=times[0], warm_s=times[1],
               first_cpu_s=cpu[0], warm_cpu_s=cpu[1],
               multisets=math.comb(len(mus) + rounds, rounds),
               peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               jax=jax.__version__, backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
               device_kind=jax.devices()[0].device_kind)
    try:  # the recursion's grid (a private helper, read only)
        from pldjax.adversary import _family, _window

        row["window"] = int(_window(_family(queries), rounds, budget).size)
    except Exception:  # noqa: BLE001 - the helper may move; the column is informative only
        row["window"] = None
    if function == "natural_filter_free":
        row.update(status=result.status, upper_excess=result.upper_excess,
                   lower_excess=result.lower_excess, gap=result.gap)
    else:
        import numpy as np

        row.update(status="-", gap=float(result.gap),
                   upper_at_1=float(np.interp(1.0, result.epsilons, result.upper_deltas)),
                   lower_at_1=float(np.interp(1.0, result.epsilons, result.lower_deltas)))
    return row


def machine_info() -> dict:
    """The host (no jax import here: the parent must not hold the accelerator; the workers
    report jax's version and devices)."""
    info = dict(platform=platform.platform(), machine=platform.machine(), cpus=os.cpu_count(),
                python=platform.python_version())
    try:
        with open("/proc/cpuinfo") as fh:
            models = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu_model"] = platform.processor()
    try:
        info["commit"] = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["commit"] = None
    info["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return info


def device_name(info: dict) -> str:
    if info["backend"] == "cpu":
        return "cpu"
    kind = "".join(c if c.isalnum() else "-" for c in info["device_kind"].lower()).strip("-")
    return f"{info['backend']}-{kind}"


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(rows, info, args) -> str:
    head = (f"{'function':<22}{'n':>6}{'step':>10}{'k':>3}{'states':>7}{'window':>8}{'first s':>9}"
            f"{'warm s':>9}{'cached s':>9}{'cpu first':>10}{'cpu warm':>9}{'peak MB':>9}  {'status':<10}"
            f"{'gap':>9}{'upper exc.':>12}{'lower exc.':>12}")
    lines = [f"natural filter V_k: queries G_mu, mu = {args.mus}, on Grid(step=32/n, size=n); budget "
             f"pj.gdp({args.budget_mu}, pessimistic=False); {args.rounds} rounds", head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['function']:<22}{r['n']:>6}   {r['error']}")
            continue
        lines.append(f"{r['function']:<22}{r['n']:>6}{r['step']:>10.6f}{r['rounds']:>3}"
                     f"{r['multisets']:>7}{fmt(r['window'], 'd'):>8}{r['first_s']:>9.2f}{r['warm_s']:>9.2f}"
                     f"{fmt(r.get('cached_s'), '.2f'):>9}{fmt(r.get('first_cpu_s'), '.2f'):>10}"
                     f"{fmt(r.get('warm_cpu_s'), '.2f'):>9}{r['peak_mb']:>9.0f}  "
                     f"{r['status']:<10}{r['gap']:>9.2e}{fmt(r.get('upper_excess'), '.2e'):>12}"
                     f"{fmt(r.get('lower_excess'), '.2e'):>12}")
    lines.append("first s: first call in a fresh process with an empty compilation cache; warm s: the same "
                 "call again; cached s: the first\ncall in another fresh process with that cache filled; cpu "
                 "first / warm: CPU seconds of the process (all threads)\nin those calls, which other work "
                 "on a shared machine inflates less than wall time; states: query multisets of at most\n"
                 "k queries; window: grid points of each curve; gap: largest difference of the upper and "
                 "lower bracketing curves;\nexc.: largest delta_V - delta_B over the budget "
                 "(natural_filter_free only)")
    lines.append(f"machine: {info['cpu_model']} ({info['machine']}, {info['cpus']} CPUs), "
                 f"{info['platform']}; python {info['python']}, jax {info.get('jax')} backend "
                 f"{info.get('backend')} {info.get('devices')}; pldjax {info['commit']}; load average "
                 f"{info['load_average']} at start, {info.get('load_average_end', '-')} at end")
    return "\n".join(lines)


def run_worker(cmd, env, timeout: float) -> dict:
    """One worker process; its row, or RuntimeError saying why there is none."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"stopped after {timeout:.0f} s (timeout)") from error
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1][:200]
        raise RuntimeError(f"failed (rc {out.returncode}): {tail}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 4096 and 4 rounds only")
    parser.add_argument("--sizes", default="4096,8192,16384", help="grid points per query")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--mus", default="0.5,0.75,1.0,1.25", help="the queries' GDP parameters")
    parser.add_argument("--budget-mu", type=float, default=2.0)
    parser.add_argument("--functions", default=",".join(FUNCTIONS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process (both calls)")
    parser.add_argument("--no-cached", dest="cached", action="store_false",
                        help="skip the second process with the compilation cache filled")
    parser.add_argument("--worker", nargs=2, metavar=("FUNCTION", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    mus = [float(x) for x in args.mus.split(",")]
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker[0], int(args.worker[1]), args.rounds, mus,
                                            args.budget_mu)))
        return
    if args.quick:
        args.sizes, args.rounds = "4096", 4
    sizes = [int(s) for s in args.sizes.split(",")]
    functions = [f for f in args.functions.split(",") if f]
    for f in functions:
        if f not in FUNCTIONS:
            parser.error(f"unknown function {f}")

    info = machine_info()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = None  # named after the device the first worker reports
    rows = []
    start = time.perf_counter()
    for function in functions:
        for n in sizes:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", function, str(n),
                   "--rounds", str(args.rounds), "--mus", args.mus, "--budget-mu", str(args.budget_mu)]
            cache = tempfile.mkdtemp(prefix="pldjax_natural_filter_cache_")
            env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
            env["PLDJAX_COMPILATION_CACHE"] = cache
            env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
            t0 = time.perf_counter()
            try:
                row = run_worker(cmd, env, args.timeout)
                row["process_s"] = time.perf_counter() - t0
                if args.cached:
                    row["cached_s"] = run_worker(cmd, env, args.timeout)["first_s"]
            except RuntimeError as error:
                rows.append(dict(function=function, n=n, error=f"{error}; larger sizes skipped"))
                print(rows[-1], flush=True)
                break
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            rows.append(row)
            if base is None:
                info.update({k: row[k] for k in ("jax", "backend", "devices", "device_kind")})
                base = os.path.join(HERE, "results", f"natural_filter_{device_name(info)}_{stamp}")
                os.makedirs(os.path.dirname(base), exist_ok=True)
            keys = ("function", "n", "first_s", "warm_s", "cached_s", "status", "gap")
            print({k: row.get(k) for k in keys}, flush=True)
            text = table(rows, info, args)
            with open(base + ".txt", "w") as fh:
                fh.write(text + "\n")
            with open(base + ".json", "w") as fh:
                json.dump(dict(args=vars(args), machine=info, rows=rows), fh, indent=1)
    info["load_average_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    text = table(rows, info, args) + f"\n{time.perf_counter() - start:.0f} s in all"
    if base is None:
        print("\n" + text + "\n\nno case finished: nothing written")
        return
    with open(base + ".txt", "w") as fh:
        fh.write(text + "\n")
    with open(base + ".json", "w") as fh:
        json.dump(dict(args=vars(args), machine=info, rows=rows), fh, indent=1)
    print("\n" + text)
    print(f"\nwritten {base}.txt and .json")


if __name__ == "__main__":
    main()
