"""DP-SGD accounting: pldjax against dp-accounting and prv-accountant, side by side in one run.

Part 1, one configuration (sigma = 1, q = 0.01, T = 10,000, delta = 1e-5): epsilon (pessimistic
and optimistic where a method has both), the first call in a fresh process (compile included;
for pldjax also with its persistent compilation cache already filled), the warm time (median of
repeats), the peak resident memory of that process, and pldjax's warm time over a bare float64
rfft + irfft of its composition window (how close to the FFT limit it runs).

Part 2, a sweep of N random configurations (sigma in [0.5, 3], q log-uniform in [1e-3, 0.05],
T log-uniform in [1e2, 1e5], delta = 1e-5): pldjax in one batched call (fresh process, then warm);
the peers loop over a random subset of K configurations and their throughput is extrapolated.
Accuracy on the subset: pldjax's pessimistic epsilon against dp-accounting's.

    python bench/dpsgd.py            # N = 1024, K = 12 (about half an hour on 2 CPU cores)
    python bench/dpsgd.py --quick    # N = 64, K = 4

Needs: pip install '.[bench]'. Not part of CI. Writes bench/results/dpsgd_<backend>_<time>.{json,txt}.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import resource
import statistics
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

SIGMA, Q, STEPS, DELTA = 1.0, 0.01, 10_000, 1e-5


# -- methods: each returns (pessimistic eps, optimistic eps or None) for arrays of configurations
def _pldjax(sigmas, qs, steps, optimistic=True):
    import pldjax as pj

    up = pj.dpsgd_epsilon(sigmas, qs, steps, DELTA)
    lo = pj.dpsgd_epsilon(sigmas, qs, steps, DELTA, pessimistic=False) if optimistic else None
    return up, lo


def _dp_accounting(interval):
    def run(sigmas, qs, steps, optimistic=True):
        from dp_accounting.pld import privacy_loss_distribution as pld_lib

        logging.disable(logging.WARNING)  # its optimistic estimate warns that it uses buckets
        ups, los = [], []
        for sigma, q, count in zip(np.atleast_1d(sigmas), np.atleast_1d(qs), np.atleast_1d(steps),
                                   strict=True):
            kinds = (True, False) if optimistic else (True,)
            eps = [
                pld_lib.from_gaussian_mechanism(
                    float(sigma), sampling_prob=float(q), value_discretization_interval=interval,
                    pessimistic_estimate=kind,
                ).self_compose(int(count)).get_epsilon_for_delta(DELTA)
                for kind in kinds
            ]
            ups.append(eps[0])
            los.append(eps[1] if optimistic else np.nan)
        return np.array(ups), (np.array(los) if optimistic else None)

    return run


def _prv(sigmas, qs, steps, optimistic=True):
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import PoissonSubsampledGaussianMechanism

    ups, los = [], []
    for sigma, q, count in zip(np.atleast_1d(sigmas), np.atleast_1d(qs), np.atleast_1d(steps),
                               strict=True):
        acc = PRVAccountant(
            prvs=[PoissonSubsampledGaussianMechanism(float(q), float(sigma))],
            max_self_compositions=[int(count)], eps_error=0.01, delta_error=DELTA / 1000,
        )
        low, _, up = acc.compute_epsilon(delta=DELTA, num_self_compositions=[int(count)])
        ups.append(up)
        los.append(low)
    return np.array(ups), np.array(los)


METHODS = {
    "pldjax": _pldjax,
    "dp_accounting(1e-4)": _dp_accounting(1e-4),
    "dp_accounting(1e-3)": _dp_accounting(1e-3),
    "prv_accountant(0.01)": _prv,
}


def _measure(method, configs, repeats, cache_dir, queue):
    try:
        if cache_dir is not None:
            import pldjax as pj

            pj.enable_compilation_cache(cache_dir)
        fn = METHODS[method]
        t0 = time.perf_counter()
        fn(*configs, optimistic=False)
        first = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(*configs, optimistic=False)
            times.append(time.perf_counter() - t0)
        up, lo = fn(*configs, optimistic=True)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        queue.put(dict(first_s=first, warm_s=statistics.median(times) if times else None,
                       peak_mb=peak_mb, upper=np.asarray(up).tolist(),
                       lower=None if lo is None else np.asarray(lo).tolist()))
    except Exception as err:  # a library failing is a result, not a crash
        queue.put(dict(error=f"{type(err).__name__}: {err}"))


def measure(method, configs, repeats, timeout, cache_dir=None):
    """Run one method in a fresh process: first call, median warm call, peak memory, values."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(method, configs, repeats, cache_dir, queue))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        return dict(error=f"timeout after {timeout}s")
    return queue.get() if not queue.empty() else dict(error="no result")


def _bare_fft_seconds(size: int) -> float:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    fft = jax.jit(lambda x: jnp.fft.irfft(jnp.fft.rfft(x), size))
    x = jnp.ones(size)
    fft(x).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(20):
        fft(x).block_until_ready()
    return (time.perf_counter() - t0) / 20


def _sweep_configs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sigmas = rng.uniform(0.5, 3.0, n)
    qs = np.exp(rng.uniform(np.log(1e-3), np.log(0.05), n))
    steps = np.round(np.exp(rng.uniform(np.log(1e2), np.log(1e5), n))).astype(np.int64)
    return sigmas, qs, steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 64 configurations, K = 4")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    args = parser.parse_args()
    n_sweep, k_subset = (64, 4) if args.quick else (1024, 12)
    lines, record = [], dict(sigma=SIGMA, q=Q, steps=STEPS, delta=DELTA)

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    # -- part 1 ---------------------------------------------------------------------------------
    single = (np.array([SIGMA]), np.array([Q]), np.array([STEPS]))
    say(f"Part 1: sigma={SIGMA}, q={Q}, T={STEPS}, delta={DELTA}")
    say(f"{'method':<28} {'eps_upper':>10} {'eps_lower':>10} {'first s':>8} {'warm s':>8} "
        f"{'peak MB':>8} {'dp-acc(1e-4) warm / warm':>25}")
    results = {}
    cache = tempfile.mkdtemp(prefix="pldjax-bench-cache-")
    runs = [(m, m, None) for m in METHODS]
    runs.insert(1, ("pldjax (compilation cache)", "pldjax", cache))
    for label, method, cache_dir in runs:
        if cache_dir is not None:
            measure(method, single, 0, args.timeout, cache_dir)  # fill the cache
        results[label] = measure(method, single, 5, args.timeout, cache_dir)
    reference = results["dp_accounting(1e-4)"].get("warm_s")
    for label, res in results.items():
        if "error" in res:
            say(f"{label:<28} {res['error']}")
            continue
        lower = "" if res["lower"] is None else f"{res['lower'][0]:10.6f}"
        ratio = f"{reference / res['warm_s']:25.1f}" if reference else ""
        say(f"{label:<28} {res['upper'][0]:10.6f} {lower:>10} {res['first_s']:8.3f} {res['warm_s']:8.3f} "
            f"{res['peak_mb']:8.0f} {ratio}")
    import pldjax as pj

    size = pj.gaussian(SIGMA, sampling_prob=Q).self_compose(STEPS).size
    bare = _bare_fft_seconds(size)
    if "warm_s" in results["pldjax"]:
        say(f"pldjax composition window {size} points: bare rfft+irfft {bare * 1e3:.2f} ms; "
            f"pldjax warm / bare FFT = {results['pldjax']['warm_s'] / bare:.0f}")
    record["single"] = results
    record["bare_fft"] = dict(size=size, seconds=bare)

    # -- part 2 ---------------------------------------------------------------------------------
    sigmas, qs, steps = _sweep_configs(n_sweep)
    subset = np.random.default_rng(1).choice(n_sweep, k_subset, replace=False)
    say()
    say(f"Part 2: sweep of {n_sweep} configurations; peers on a subset of {k_subset}")
    say(f"{'method':<28} {'configs':>8} {'first s':>8} {'warm s':>8} {'configs/s':>10} {'peak MB':>8}")
    sweep = {"pldjax": measure("pldjax", (sigmas, qs, steps), 1, args.timeout)}
    sub = (sigmas[subset], qs[subset], steps[subset])
    for method in ("dp_accounting(1e-4)", "prv_accountant(0.01)"):
        sweep[method] = measure(method, sub, 0, args.timeout)
    for method, res in sweep.items():
        count = n_sweep if method == "pldjax" else k_subset
        if "error" in res:
            say(f"{method:<28} {res['error']}")
            continue
        warm = res["warm_s"] if res["warm_s"] is not None else res["first_s"]
        say(f"{method:<28} {count:8d} {res['first_s']:8.2f} {warm:8.2f} {count / warm:10.2f} "
            f"{res['peak_mb']:8.0f}")
    if all("error" not in sweep[m] for m in ("pldjax", "dp_accounting(1e-4)")):
        ours = np.asarray(sweep["pldjax"]["upper"])[subset]
        theirs = np.asarray(sweep["dp_accounting(1e-4)"]["upper"])
        rel = (ours - theirs) / theirs
        throughput = {m: (n_sweep if m == "pldjax" else k_subset)
                      / (r["warm_s"] if r.get("warm_s") is not None else r["first_s"])
                      for m, r in sweep.items() if "error" not in r}
        say(f"on the subset: (pldjax - dp_accounting)/dp_accounting median {np.median(rel):.2e}, "
            f"max {np.max(rel):.2e}; pldjax <= dp_accounting on {np.mean(ours <= theirs):.0%}")
        for m, value in throughput.items():
            if m != "pldjax":
                say(f"throughput pldjax / {m} = {throughput['pldjax'] / value:.1f}")
    record["sweep"] = dict(n=n_sweep, subset=subset.tolist(), results=sweep)

    import jax

    machine = dict(platform=platform.platform(), processor=platform.processor() or platform.machine(),
                   cpus=os.cpu_count(), python=platform.python_version(),
                   jax_backend=jax.default_backend(), jax=jax.__version__,
                   devices=[str(d) for d in jax.devices()])
    record["machine"] = machine
    say(f"machine: {machine}")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        f"dpsgd_{machine['jax_backend']}_{stamp}")
    with open(base + ".json", "w") as fh:
        json.dump(record, fh, indent=1, default=float)
    with open(base + ".txt", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"saved {base}.json and .txt")


if __name__ == "__main__":
    main()
