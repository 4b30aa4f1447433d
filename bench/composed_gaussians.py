"""Composed Gaussian mechanisms: pldjax against dp-accounting and prv-accountant, side by side.

For each (sigma, T) it reports epsilon at delta = 1e-5 from every method with its pessimistic /
optimistic (or lower / upper) values, the exact value (G_mu closed form, mu = sqrt(T)/sigma, by
bisection in mpmath), the first-call and warm times, and the peak resident memory of a fresh
process doing that one computation. Prints a table and writes JSON to bench/results/.

    python bench/composed_gaussians.py            # the full grid (minutes)
    python bench/composed_gaussians.py --quick    # a smaller grid

Needs: pip install '.[bench]' mpmath. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import time
from datetime import datetime, timezone

DELTA = 1e-5
# dp-accounting is skipped where its grid would exceed this many points (about 20 mu / interval)
DP_ACCOUNTING_MAX_POINTS = 3e7


def _exact(mu: float) -> float:
    import mpmath

    mpmath.mp.dps = 40
    mu = mpmath.mpf(mu)
    f = lambda e: mpmath.ncdf(mu / 2 - e / mu) - mpmath.e**e * mpmath.ncdf(-mu / 2 - e / mu) - DELTA
    lo, hi = mpmath.mpf(0), mu * mu / 2 + 30 * mu + 10
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return float(hi)


def _run_pldjax(sigma, count):
    import pldjax as pj

    def once():
        up = float(pj.gaussian(sigma).self_compose(count).epsilon(DELTA))
        lo = float(pj.gaussian(sigma, pessimistic=False).self_compose(count).epsilon(DELTA))
        return up, lo

    return once


def _run_dp_accounting(interval):
    def make(sigma, count):
        from dp_accounting.pld import privacy_loss_distribution as pld_lib

        def once():
            out = []
            for pessimistic in (True, False):
                p = pld_lib.from_gaussian_mechanism(
                    standard_deviation=sigma,
                    value_discretization_interval=interval,
                    pessimistic_estimate=pessimistic,
                )
                out.append(p.self_compose(count).get_epsilon_for_delta(DELTA))
            return tuple(out)

        return once

    return make


def _run_prv(sigma, count):
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import GaussianMechanism

    def once():
        acc = PRVAccountant(
            prvs=[GaussianMechanism(noise_multiplier=sigma)],
            max_self_compositions=[count],
            eps_error=0.01,
            delta_error=DELTA / 1000,
        )
        low, _, up = acc.compute_epsilon(delta=DELTA, num_self_compositions=[count])
        return float(up), float(low)

    return once


METHODS = {
    "pldjax": _run_pldjax,
    "dp_accounting(1e-3)": _run_dp_accounting(1e-3),
    "dp_accounting(1e-4)": _run_dp_accounting(1e-4),
    "prv_accountant": _run_prv,
}


def _measure(method, sigma, count, queue):
    try:
        once = METHODS[method](sigma, count)
        t0 = time.perf_counter()
        upper, lower = once()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        once()
        warm = time.perf_counter() - t0
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        queue.put(dict(upper=upper, lower=lower, first_s=first, warm_s=warm, peak_mb=peak_mb))
    except Exception as err:  # a peer library failing is a result, not a crash
        queue.put(dict(error=f"{type(err).__name__}: {err}"))


def measure(method, sigma, count, timeout):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(method, sigma, count, queue))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        return dict(error=f"timeout after {timeout}s")
    return queue.get() if not queue.empty() else dict(error="no result")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller grid")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per measurement")
    args = parser.parse_args()
    sigmas = [0.5, 1.0, 5.0] if args.quick else [0.5, 1.0, 2.0, 5.0]
    counts = [1, 100, 10_000] if args.quick else [1, 100, 1000, 10_000, 100_000]
    rows = []
    header = (
        f"{'sigma':>5} {'T':>7} {'method':<20} {'eps_upper':>11} {'eps_lower':>11} "
        f"{'upper/exact-1':>13} {'first s':>8} {'warm s':>8} {'peak MB':>8}"
    )
    print(header)
    for sigma in sigmas:
        for count in counts:
            mu = count**0.5 / sigma
            exact = _exact(mu)
            for method in METHODS:
                if method.startswith("dp_accounting"):
                    interval = 1e-3 if "1e-3" in method else 1e-4
                    if (mu * mu / 2 + 20 * mu) / interval > DP_ACCOUNTING_MAX_POINTS:
                        rows.append(dict(sigma=sigma, count=count, method=method, exact=exact,
                                         error="skipped: grid too large"))
                        print(f"{sigma:5.1f} {count:7d} {method:<20} skipped (grid too large)")
                        continue
                res = measure(method, sigma, count, args.timeout)
                rows.append(dict(sigma=sigma, count=count, method=method, exact=exact, **res))
                if "error" in res:
                    print(f"{sigma:5.1f} {count:7d} {method:<20} {res['error']}")
                    continue
                print(
                    f"{sigma:5.1f} {count:7d} {method:<20} {res['upper']:11.5f} {res['lower']:11.5f} "
                    f"{res['upper'] / exact - 1:13.2e} {res['first_s']:8.3f} {res['warm_s']:8.3f} "
                    f"{res['peak_mb']:8.0f}"
                )
    machine = dict(
        platform=platform.platform(),
        processor=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
    )
    import jax

    machine["jax_backend"] = jax.default_backend()
    machine["jax"] = jax.__version__
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = f"composed_gaussians_{machine['jax_backend']}_{stamp}.json"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", name)
    with open(path, "w") as fh:
        json.dump(dict(delta=DELTA, machine=machine, rows=rows), fh, indent=1)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
