"""Side-by-side sweep timing for issue 17: one batched pldjax call on bench/dpsgd.py's seeded
configurations against single calls on a few of them, in this process's CPU time (the machine is
shared: CPU time is less noisy than wall clock), with the accuracy setting where the checkout has
it. Public API only, so that it runs in older checkouts (``PYTHONPATH=<checkout>``).

    PYTHONPATH=. python bench/sweep_speed.py --n 32 --singles 8
    PYTHONPATH=. python bench/sweep_speed.py --n 32 --singles 32 --peer 8   # and a dp-accounting
                                         # (1e-4) loop over the first 8 of the same configurations
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import pldjax as pj


def sweep_configs(n: int, seed: int = 0):
    """bench/dpsgd.py's sweep: sigma U[0.5, 3], q log-U[1e-3, 0.05], T log-U[1e2, 1e5]."""
    rng = np.random.default_rng(seed)
    sigmas = rng.uniform(0.5, 3.0, n)
    qs = np.exp(rng.uniform(np.log(1e-3), np.log(0.05), n))
    steps = np.round(np.exp(rng.uniform(np.log(1e2), np.log(1e5), n))).astype(np.int64)
    return sigmas, qs, steps


def cpu_seconds(fn):
    """(CPU seconds of this process, wall seconds, result)."""
    start, wall = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - start, time.perf_counter() - wall, out


def dp_accounting_loop(sigmas, qs, steps, delta: float = 1e-5) -> list[float]:
    """Wall seconds of dp-accounting's PLDAccountant (value_discretization_interval 1e-4), one
    configuration at a time."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    seconds = []
    for sigma, q, count in zip(sigmas, qs, steps, strict=True):
        start = time.perf_counter()
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)),
                           int(count))
        accountant.get_epsilon(delta)
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--singles", type=int, default=8)
    parser.add_argument("--peer", type=int, default=0,
                        help="then a dp-accounting (1e-4) loop over this many of the configurations")
    args = parser.parse_args()
    sigmas, qs, steps = sweep_configs(args.n)
    settings = [{}]
    if "rtol" in (pj.dpsgd_epsilon.__doc__ or ""):
        settings.append({"rtol": 1e-2})
    for kw in settings:
        pj.dpsgd_epsilon(sigmas, qs, steps, 1e-5, **kw)  # compile
        batch_s, batch_wall, eps = cpu_seconds(
            lambda kw=kw: pj.dpsgd_epsilon(sigmas, qs, steps, 1e-5, **kw))
        idx = range(args.singles)
        for i in idx:  # compile each single's sizes
            pj.dpsgd_epsilon(sigmas[i], qs[i], steps[i], 1e-5, **kw)
        singles = [cpu_seconds(lambda i=i, kw=kw: pj.dpsgd_epsilon(
            sigmas[i], qs[i], steps[i], 1e-5, **kw))[:2] for i in idx]
        single_s, single_wall = (sum(column) for column in zip(*singles, strict=True))
        print(f"{pj.__file__} {kw or 'default'}: batch of {args.n} {batch_s:.2f} CPU s "
              f"({1e3 * batch_s / args.n:.1f} ms/config, wall {1e3 * batch_wall / args.n:.1f}); "
              f"{args.singles} single calls {1e3 * single_s / args.singles:.1f} ms/config (wall "
              f"{1e3 * single_wall / args.singles:.1f}); median epsilon {np.median(eps):.6f}; "
              f"load {os.getloadavg()[0]:.1f}")
    if args.peer:
        wall = dp_accounting_loop(sigmas[:args.peer], qs[:args.peer], steps[:args.peer])
        print(f"dp-accounting (1e-4) loop over the first {args.peer} of the {args.n} sweep "
              f"configurations: {1e3 * np.mean(wall):.1f} ms/config wall (min "
              f"{1e3 * min(wall):.0f}, max {1e3 * max(wall):.0f})")


if __name__ == "__main__":
    main()
