"""GDP-residue updates per second, batched: ``pj.gdp_residue`` and the GDP-residue filter's spend.

An update takes a budget mu and a query PLD L and returns mu', the largest value with
G_mu' (+) L dominated by G_mu (by ``steps`` = 32 bisection steps, each one FFT convolution of the
query with G_mu''s curve over the check window). B (mu, L) pairs are one call:

* ``function``: ``pj.gdp_residue(mu, query)`` with ``mu`` of shape (B,) and a query PLD of batch
  shape (B,); the library picks the check window on the host and runs ``batch_size`` pairs at a
  time (``jax.lax.map``);
* ``filter``: ``f = pj.filters.gdp_residue_filter(1.0, size=window)``; B states (``f.init()`` broadcast,
  their budgets set to the same mu) and the same queries through ``jax.jit`` of ``jax.lax.map``
  of ``f.spend`` with ``batch_size`` (a ``jax.vmap(f.spend)`` per chunk: a single vmap over all
  B pairs holds B x nfft complex arrays at once). Under jit the filter needs a static check window
  (``size=``); by default it gets the window ``pj.gdp_residue`` chose for the same batch.

Query families (seeded; every pair fits, so every update is a real one):

* ``rr``: ``pj.randomized_response(eps)``, eps uniform in [0.1, 0.5] (pure-DP queries), mu
  uniform in [0.75, 1];
* ``gauss``: ``pj.gaussian(sigma, sampling_prob=0.1)``, sigma uniform in [1, 2] (per-example
  DP-SGD-style queries, add/remove: two directions), mu uniform in [0.75, 1].

Both keep the query grid inside the library's largest check window (no coarsening: see the
coarsening check below). For each (family, form, B): the first call (compilation included) and the
warm time (median of ``--repeats`` further calls, each ended by ``block_until_ready``), updates per
second = B / warm, how many pairs were rejected (-inf; NaN before), and, on the first 256 pairs,
(mu' - naive) / naive with naive = sqrt(mu^2 - gdp_mu(L)^2). A size is skipped when the previous
size predicts one call above ``--max-seconds``. Reference lines give the bare cost of the kernel's
two main ingredients per pair at the same sizes: ``steps`` rfft + irfft of the FFT length, and the
log_ndtr evaluations (G_mu'' curve on the lags and G_mu on the check points, each bisection step).

Accuracy: queries G_nu = ``pj.gdp(nu)``, whose exact residue is sqrt(mu^2 - nu^2); relative error
(exact - mu') / exact of ``pj.gdp_residue`` and of the naive update. Coarsening check: Poisson-
subsampled Gaussian queries at q = 0.01 whose grid is finer than the check window allows, so that
``pj.gdp_residue`` coarsens them first; mu' there against the naive update.

    python bench/gdp_residue.py --quick                       # seconds to a few minutes on a CPU
    python bench/gdp_residue.py --sizes 100,1000,10000        # CPU: 10000 is skipped (too slow)
    python bench/gdp_residue.py --sizes 100,1000,10000,100000 # GPU

Not part of CI. Prints a table and writes bench/results/gdp_residue_<device>_<UTC time>.{txt,json}
(rewritten after every row, so a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# the pldjax measured: the checkout this script lives in (not whichever one the environment has
# installed), or the revision extracted by --baseline
sys.path.insert(0, os.environ.get("PLDJAX_BENCH_ROOT", os.path.dirname(HERE)))
FAMILIES = ("rr", "gauss")
FORMS = ("function", "filter")
GAIN_PAIRS = 256


# -- environment ----------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info():
    import jax

    versions = {}
    for dist in ("pldjax", "jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "numpy"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        commit = (
            subprocess.run(
                ["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
        dirty = subprocess.run(
            ["git", "-C", HERE, "status", "--porcelain", "--", "../pldjax"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if commit and dirty:
            commit += " (pldjax/ modified)"
    except (OSError, subprocess.SubprocessError):
        commit = None
    devices = jax.devices()
    return dict(
        cpu=cpu_model(),
        cpus=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        jax_backend=jax.default_backend(),
        devices=[f"{d.platform}:{d.id} {d.device_kind}" for d in devices],
        device_kind=devices[0].device_kind,
        versions=versions,
        pldjax_commit=commit,
        load_average=os.getloadavg(),
    )


def device_label(machine) -> str:
    if machine["jax_backend"] == "cpu":
        return "cpu"
    kind = re.sub(r"[^a-z0-9]+", "-", machine["device_kind"].lower()).strip("-")
    return f"{machine['jax_backend']}-{kind}"


# -- formatting -----------------------------------------------------------------------------------
def table(header, rows, left=1):
    cells = [header] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        pairs = enumerate(zip(r, widths, strict=True))
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in pairs)

    return [line(r) for r in cells]


def fmt(value, spec):
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return None if value is None else str(value)
    return format(value, spec)


def jsonable(x):
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    return x


# -- workloads ------------------------------------------------------------------------------------
def make_pairs(family: str, count: int, seed: int):
    """(mu, query, description) for ``count`` pairs of one family."""
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
    """The check window pj.gdp_residue picks on the host for the query's finest step (each query's
    own step sets its window: coarser ones get smaller windows)."""
    from pldjax.gaussian_dp import _coarse_points, _fft_length, residue_plan

    factor, window = residue_plan(mu_max, query, None)
    n = _coarse_points(query.size, factor)
    return dict(
        n=n,
        window=window,
        nfft=_fft_length(n, window),
        coarsen=factor,
        directions=len(query.directions()),
        min_step=float(np.min(np.asarray(query.step, np.float64))),
    )


def function_call(mu, query, args):
    import pldjax as pj

    def call():
        return pj.gdp_residue(mu, query, **steps_kw(args), **batch_kw(args))

    return call


def filter_call(mu, query, window, args):
    import jax
    import jax.numpy as jnp

    import pldjax as pj
    from pldjax.precision import pack

    f = pj.filters.gdp_residue_filter(1.0, **steps_kw(args), size=window)
    count = mu.shape[0]
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (count,) + x.shape), f.init())
    with jax.enable_x64(True):
        states = states._replace(mu=pack(jnp.asarray(mu, jnp.float64)))  # states hold bit pairs

    @jax.jit
    def spend_all(states, queries):
        return jax.lax.map(lambda pair: f.spend(*pair), (states, queries),
                           batch_size=args.batch_size or pj.gaussian_dp.residue_batch_size())

    def call():
        new, accepted = spend_all(states, query)
        return jnp.where(accepted, f.remaining(new)["mu"], -jnp.inf)  # as pj.gdp_residue

    return call


def batch_kw(args):
    """pj.gdp_residue's batch_size when --batch-size is given (else the library's default)."""
    return {} if args.batch_size is None else {"batch_size": args.batch_size}


def steps_kw(args):
    return {} if args.steps is None else {"steps": args.steps}


def fft16_seconds(repeats=30):
    """Fastest of ``repeats`` jitted float64 rfft + irfft round trips of 2^16 points (the issue's unit)."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        x = jnp.linspace(0.0, 1.0, 2**16, dtype=jnp.float64)
        fn = jax.jit(lambda v: jnp.fft.irfft(jnp.fft.rfft(v), 2**16))
        jax.block_until_ready(fn(x))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(x))
            times.append(time.perf_counter() - start)
    return min(times)


def timed(call):
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(call())
    return time.perf_counter() - start, np.asarray(out)


def naive_gain(mu, query, residue):
    """Median and min of (mu' - naive) / naive over the first GAIN_PAIRS pairs."""
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
def throughput(args, report, log, deadline):
    import jax

    header = [
        "family",
        "form",
        "pairs B",
        "grid n",
        "window",
        "nfft",
        "build s",
        "first s",
        "warm s (n)",
        "updates/s",
        "ms/pair",
        "/ fft16",
        "rejected",
        "gain med",
        "gain min",
        "filter vs function",
    ]
    rows, records = [], []
    report.part("throughput", header, rows)
    for family in args.families:
        results_by_form = {}
        for form in args.forms:
            last = None  # (pairs, seconds per call) of the previous size
            for count in args.sizes:
                row_id = f"{family} {form} B={count}"
                if last is not None:
                    predicted = last[1] * count / last[0]
                    late = time.time() + predicted * (1 + args.repeats) > deadline
                    if predicted > args.max_seconds or late:
                        why = (
                            "past --deadline" if late and predicted <= args.max_seconds else "> --max-seconds"
                        )
                        log(f"{row_id}: skipped (one call predicted {predicted:.0f} s, {why})")
                        rows.append(
                            [
                                family,
                                form,
                                count,
                                None,
                                None,
                                None,
                                None,
                                f"skipped: ~{predicted:.0f} s/call, {why}",
                                None,
                                None,
                                None,
                                None,
                                None,
                                None,
                                None,
                                None,
                            ]
                        )
                        records.append(dict(family=family, form=form, pairs=count, skipped=predicted))
                        report.write()
                        break
                log(f"{row_id}: building queries")
                start = time.perf_counter()
                mu, query = make_pairs(family, count, args.seed)
                jax.block_until_ready((mu, query))
                build = time.perf_counter() - start
                info = plan(float(np.max(np.asarray(mu))), query)
                window = info["window"] if args.filter_size is None else args.filter_size
                call = (
                    function_call(mu, query, args)
                    if form == "function"
                    else filter_call(mu, query, window, args)
                )
                log(
                    f"{row_id}: first call (n={info['n']}, window={info['window']}, nfft={info['nfft']}, "
                    f"coarsen={info['coarsen']})"
                )
                first, out = timed(call)
                warm_times = []
                for _ in range(args.repeats):
                    if (
                        sum(warm_times) + first > args.max_seconds * (1 + args.repeats)
                        or time.time() > deadline
                    ):
                        break
                    seconds, out = timed(call)
                    warm_times.append(seconds)
                    log(f"{row_id}: warm {seconds:.3f} s")
                warm = statistics.median(warm_times) if warm_times else None
                if not warm_times:
                    log(f"{row_id}: no warm call (past --deadline or --max-seconds)")
                nan = int(np.sum(~np.isfinite(out)))
                gain_med, gain_min = naive_gain(mu, query, out)
                results_by_form[(form, count)] = out
                other = results_by_form.get(("function" if form == "filter" else "filter", count))
                diff = None
                if other is not None:
                    both = np.isfinite(other) & np.isfinite(out)
                    diff = (
                        float(np.max(np.abs(other - out)[both] / out[both])) if both.any() else float("nan")
                    )
                rate = count / warm if warm else None
                fft16 = fft16_seconds()
                per_pair = warm / count if warm else None
                grid = info["n"] if info["coarsen"] == 1 else f"{info['n']} (/{info['coarsen']})"
                rows.append(
                    [
                        family,
                        form,
                        count,
                        grid,
                        window if form == "filter" else info["window"],
                        info["nfft"],
                        fmt(build, ".2f"),
                        fmt(first, ".2f"),
                        f"{warm:.3f} ({len(warm_times)})" if warm is not None else None,
                        fmt(rate, ".1f"),
                        fmt(per_pair * 1e3 if per_pair else None, ".2f"),
                        fmt(per_pair / fft16 if per_pair else None, ".1f"),
                        nan,
                        fmt(gain_med, ".2e"),
                        fmt(gain_min, ".2e"),
                        fmt(diff, ".1e"),
                    ]
                )
                records.append(
                    dict(
                        family=family,
                        form=form,
                        pairs=count,
                        plan=info,
                        window=window,
                        build_s=build,
                        first_s=first,
                        warm_s=warm_times,
                        warm_median_s=warm,
                        updates_per_s=rate,
                        fft16_s=fft16,
                        residue_head=out[:GAIN_PAIRS],
                        nan=nan,
                        gain_median=gain_med,
                        gain_min=gain_min,
                        filter_function_max_abs_diff=diff,
                    )
                )
                report.write()
                last = (count, warm if warm is not None else first)
                del mu, query, call, out
    report.notes.append(
        "first s: first call in this process (compilation included; each B compiles anew); warm s: median "
        "of (n) further calls with block_until_ready; updates/s = B / warm s; rejected: pairs not updated "
        f"(-inf); gain: (mu' - naive) / naive on the first {GAIN_PAIRS} pairs; filter vs function: "
        "max |mu'_filter - mu'_function| / mu' over the pairs; build s: constructing the B query PLDs "
        "(not in the update time)"
    )
    return records


def accuracy(args, report, log):
    import jax.numpy as jnp

    import pldjax as pj

    header = [
        "mu",
        "nu",
        "G_nu step",
        "window",
        "coarsen",
        "exact mu'",
        "pldjax mu'",
        "rel err",
        "naive rel err",
    ]
    rows, records = [], []
    report.part("accuracy", header, rows)
    for mu in args.acc_mus:
        nus = np.array([f * mu for f in args.acc_fractions])
        log(f"accuracy: mu={mu}")
        query = pj.gdp(jnp.asarray(nus))
        info = plan(mu, query)
        residue = np.asarray(pj.gdp_residue(mu, query, **steps_kw(args), **batch_kw(args)))
        naive_nu = np.asarray(pj.gdp_mu(query))
        exact = np.sqrt(mu * mu - nus * nus)
        naive = np.sqrt(np.maximum(mu * mu - naive_nu * naive_nu, 0.0))
        steps = np.broadcast_to(np.asarray(query.step), nus.shape)
        for nu, h, e, r, v in zip(nus, steps, exact, residue, naive, strict=True):
            rel, naive_rel = (e - r) / e, (e - v) / e
            rows.append(
                [
                    f"{mu:g}",
                    f"{nu:.3g}",
                    f"{h:.3g}",
                    info["window"],
                    info["coarsen"],
                    f"{e:.10f}",
                    fmt(float(r), ".10f"),
                    fmt(float(rel), ".2e"),
                    fmt(float(naive_rel), ".2e"),
                ]
            )
            records.append(
                dict(
                    mu=mu,
                    nu=nu,
                    step=h,
                    plan=info,
                    exact=e,
                    residue=r,
                    rel_err=rel,
                    naive=v,
                    naive_rel_err=naive_rel,
                )
            )
        report.write()
    report.notes.append(
        "rel err = (exact - mu') / exact, exact = sqrt(mu^2 - nu^2): mu' is a sound lower bound, "
        "so rel err >= 0; naive = sqrt(mu^2 - gdp_mu(G_nu)^2)"
    )
    return records


def coarsening_check(args, report, log):
    import jax.numpy as jnp

    import pldjax as pj

    header = ["sigma", "q", "mu", "grid n", "step", "coarsen", "nu = gdp_mu(L)", "naive mu'", "pldjax mu'"]
    rows, records = [], []
    report.part("coarsening", header, rows)
    log("coarsening check")
    sigmas = np.array([1.0, 1.5, 2.0])
    query = pj.gaussian(jnp.asarray(sigmas), sampling_prob=0.01)
    nu = np.asarray(pj.gdp_mu(query))
    for mu in (1.0, 2.0):
        info = plan(mu, query)
        residue = np.asarray(pj.gdp_residue(mu, query, **steps_kw(args), **batch_kw(args)))
        naive = np.sqrt(np.maximum(mu * mu - nu * nu, 0.0))
        steps = np.asarray(query.step)
        for s, h, v, a, r in zip(sigmas, steps, nu, naive, residue, strict=True):
            rows.append(
                [
                    f"{s:g}",
                    "0.01",
                    f"{mu:g}",
                    query.size,
                    f"{h:.3g}",
                    info["coarsen"],
                    f"{v:.5f}",
                    f"{a:.5f}",
                    fmt(float(r), ".5f"),
                ]
            )
            records.append(dict(sigma=s, q=0.01, mu=mu, plan=info, nu=v, naive=a, residue=r))
        report.write()
    report.notes.append(
        "coarsening: queries whose grid is finer than the largest check window allows; "
        "pj.gdp_residue coarsens them by the factor shown first (the docstring promises mu' >= naive)"
    )
    return records


def table_part(args, report, log):
    """Per-example DP-SGD's residue table (pj.filters.residue.gdp_residue_table, sigma = 1,
    q = 0.05, mu = 2): build time (first = compilation included, then warm) and
    pj.filters.residue.table_spend lookups per second on 2e6 random (mu, c) pairs, jitted."""
    import jax
    import jax.numpy as jnp

    import pldjax as pj

    header = ["mu nodes", "c nodes", "first build s", "warm build s", "lookups/s"]
    rows, records = [], []
    report.part("residue table (sigma 1, q 0.05, mu 2)", header, rows)
    for mu_nodes, c_nodes in ((16, 9), (32, 17)):
        log(f"table {mu_nodes} x {c_nodes}")
        times = []
        for _ in range(2):
            start = time.perf_counter()
            table = jax.block_until_ready(
                pj.filters.residue.gdp_residue_table(1.0, 0.05, 2.0, mu_nodes=mu_nodes, c_nodes=c_nodes)
            )
            times.append(time.perf_counter() - start)
        count = 2_000_000
        rng = np.random.default_rng(args.seed)
        with jax.enable_x64(True):
            mu = jnp.asarray(rng.uniform(0.0, 2.0, count))
            c = jnp.asarray(rng.uniform(0.0, 1.0, count))
            left = jnp.full(count, 1e-6)
            spend = jax.jit(pj.filters.residue.table_spend)
            jax.block_until_ready(spend(table, mu, left, c))
            best = min(timed(functools.partial(spend, table, mu, left, c))[0] for _ in range(5))
        rows.append([mu_nodes, c_nodes, fmt(times[0], ".2f"), fmt(times[1], ".2f"), f"{count / best:.3g}"])
        records.append(dict(mu_nodes=mu_nodes, c_nodes=c_nodes, build_s=times, lookups_per_s=count / best))
        report.write()
    return records


def baseline(args, report, log):
    """The function form's throughput of ``args.baseline`` (a git revision): its pldjax/ extracted
    into a temporary directory and this script run there in a subprocess (same families and sizes,
    no accuracy part), its rows added to the report as a part of their own."""
    import tarfile
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", os.path.dirname(HERE), "archive", args.baseline, "pldjax"],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        command = [
            sys.executable, os.path.abspath(__file__), "--no-accuracy", "--forms", "function",
            "--families", ",".join(args.families), "--sizes", ",".join(map(str, args.sizes)),
            "--repeats", str(args.repeats),
            *(["--batch-size", str(args.batch_size)] if args.batch_size else []),
            "--max-seconds", str(args.max_seconds), "--seed", str(args.seed), "--out-dir", tmp,
        ]
        log(f"baseline {args.baseline}: {' '.join(command[2:])}")
        env = dict(os.environ, PYTHONPATH=tmp, PLDJAX_BENCH_ROOT=tmp)
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        [result] = [f for f in os.listdir(tmp) if f.endswith(".json")]
        with open(os.path.join(tmp, result)) as fh:
            rows = json.load(fh)["throughput"]
    header = ["family", "pairs B", "warm s", "updates/s", "ms/pair", "/ fft16"]
    table_rows = [
        [r["family"], r["pairs"], fmt(r.get("warm_median_s"), ".3f"), fmt(r.get("updates_per_s"), ".1f"),
         fmt(r["warm_median_s"] / r["pairs"] * 1e3 if r.get("warm_median_s") else None, ".2f"),
         fmt(r["warm_median_s"] / r["pairs"] / r["fft16_s"] if r.get("warm_median_s") else None, ".1f")]
        for r in rows if "skipped" not in r
    ]
    report.part(f"baseline {args.baseline} (function form)", header, table_rows)
    report.write()
    return rows


class Report:
    """Collects the tables and notes; rewrites the .txt and .json after every row."""

    def __init__(self, base, machine, args):
        self.base, self.machine, self.args = base, machine, args
        self.parts, self.notes, self.record = [], [], {}
        self.start = time.perf_counter()

    def part(self, name, header, rows):
        self.parts.append((name, header, rows))

    def lines(self):
        m = self.machine
        out = []
        for name, header, rows in self.parts:
            out.append(f"{name}:")
            out.extend(table(header, rows, left=2 if name == "throughput" else 0))
            out.append("")
        out.extend(self.notes)
        out.append(
            f"machine: {m['cpu']}, {m['cpus']} CPUs, {m['platform']}; jax {m['versions'].get('jax')} "
            f"(jaxlib {m['versions'].get('jaxlib')}) backend {m['jax_backend']} {m['devices']}; "
            f"pldjax {m['pldjax_commit']}; steps={self.args.steps}, "
            f"batch_size={self.args.batch_size or 'default'}, "
            f"repeats={self.args.repeats}; load average {m['load_average'][0]:.1f} at start, "
            f"{os.getloadavg()[0]:.1f} now; {time.perf_counter() - self.start:.0f} s so far"
        )
        out.append("command: python bench/gdp_residue.py " + " ".join(sys.argv[1:]))
        return out

    def write(self):
        os.makedirs(os.path.dirname(self.base), exist_ok=True)
        with open(self.base + ".txt", "w") as fh:
            fh.write("\n".join(self.lines()) + "\n")
        with open(self.base + ".json", "w") as fh:
            json.dump(jsonable(dict(args=vars(self.args), machine=self.machine, **self.record)), fh, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="100,1000,10000,100000",
        help="comma-separated numbers of (mu, query) pairs per call (default %(default)s)",
    )
    parser.add_argument("--families", default=",".join(FAMILIES), help="rr, gauss (default %(default)s)")
    parser.add_argument("--forms", default=",".join(FORMS), help="function, filter (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="warm calls per size (median)")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=300,
        help="skip a size when the previous one predicts a call above this (default %(default)s)",
    )
    parser.add_argument(
        "--deadline", type=float, default=None, help="stop starting new work after this many seconds"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None,
        help="pairs per chunk (pj.gdp_residue batch_size; default: the library's)"
    )
    parser.add_argument("--steps", type=int, default=None, help="search steps (default: the library's)")
    parser.add_argument(
        "--baseline",
        default=None,
        help="also time the function form of this git revision's pldjax (git archive into a temp dir, "
        "this script in a subprocess) before the current tree, in the same run",
    )
    parser.add_argument(
        "--filter-size",
        type=int,
        default=None,
        help="filter check window (default: the window pj.gdp_residue picks for the batch)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", action="store_true", help="also time the per-example DP-SGD residue table")
    parser.add_argument("--no-accuracy", action="store_true", help="skip the accuracy and coarsening checks")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument(
        "--quick",
        action="store_true",
        help="sizes 16,64, one warm repeat, fewer accuracy points (a smoke test)",
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeats = "16,64", min(args.repeats, 1)
    args.sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    args.families = [f for f in args.families.split(",") if f]
    args.forms = [f for f in args.forms.split(",") if f]
    args.acc_mus = [1.0, 3.0] if args.quick else [0.5, 1.0, 2.0, 4.0]
    args.acc_fractions = [0.2, 0.6] if args.quick else [0.1, 0.3, 0.5, 0.7, 0.9]

    import jax

    jax.config.update("jax_enable_x64", True)
    start = time.perf_counter()
    deadline = time.time() + (args.deadline if args.deadline else 1e9)

    def log(text):
        print(f"[{time.perf_counter() - start:7.1f} s] {text}", file=sys.stderr, flush=True)

    machine = machine_info()
    log(f"devices: {machine['devices']}; cpu: {machine['cpu']}")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = os.path.join(args.out_dir, f"gdp_residue_{device_label(machine)}_{stamp}")
    report = Report(base, machine, args)
    if not args.no_accuracy:
        report.record["accuracy"] = accuracy(args, report, log)
        report.record["coarsening"] = coarsening_check(args, report, log)
    if args.table:
        report.record["table"] = table_part(args, report, log)
    if args.baseline:
        report.record["baseline"] = baseline(args, report, log)
    report.record["throughput"] = throughput(args, report, log, deadline)
    for old in report.record.get("baseline", []):
        for new in report.record["throughput"]:
            key = (new.get("family"), new.get("pairs"), new.get("form"))
            same = key == (old.get("family"), old.get("pairs"), "function")
            if same and "residue_head" in old and "residue_head" in new:
                a, b = (np.array([np.nan if v is None else v for v in x["residue_head"]]) for x in (old, new))
                both = np.isfinite(a) & np.isfinite(b)
                report.notes.append(
                    f"{new['family']} B={new['pairs']}: mu' now - mu' at {args.baseline} on the first "
                    f"{int(both.sum())} pairs: max |diff| {np.max(np.abs(b - a)[both]):.2e}, "
                    f"min {np.min((b - a)[both]):.2e}, max {np.max((b - a)[both]):.2e}"
                )
    report.record["wall_s"] = time.perf_counter() - start
    report.write()
    print("\n".join(report.lines()))
    print(f"saved {base}.txt and .json")


if __name__ == "__main__":
    main()
