"""Where a warm sweep's time goes: the DP-SGD sweep's seeded configurations in one call.

``pj.dpsgd_epsilon`` on ``python -m bench dpsgd``'s sweep distribution, with each stage's device
calls timed (block_until_ready after each, so the stages do not overlap: the total is a little
above an untimed call's). Stages: discretize (``direction_arrays``, with each row's window
placement in the same call), wrap (``wrap_rows`` on the host; on an accelerator ``_gather_rows``
or, for masses in tiles, ``_gather_tiled_rows``, on the device; also the points composed),
compose (``_compose_and_evaluate``); "other" is the rest of the call (host glue). The stages are
pldjax internals (bench/internals.py).

    python -m bench.tools.profile_sweep --configs 1024 --calls 2 [--save eps.npy] [--progress]
    python -m bench.tools.profile_sweep --configs 1024 --calls 2 --profile 25
                      # and the last call's 25 costliest functions (cProfile, cumulative)
    python -m bench.tools.profile_sweep --configs 1024 --calls 2 --untimed 3
                      # then 3 calls without the stage timers (the host queues ahead)
    python -m bench.tools.profile_sweep --configs 10000 --calls 0 --untimed 3 --trace 12
                      # and a traced call: device busy time, idle gaps and the 12 costliest
                      # programs and kernels (an accelerator's, chiefly)
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import glob
import os
import pstats
import tempfile
import time
import warnings

import jax
import numpy as np

import pldjax as pj
from bench import harness, internals
from bench.dpsgd import DELTA

dpsgd = internals.engine
MECHANISM_KERNELS = internals.discretize.MECHANISM_KERNELS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=2, help="calls in this process (the first compiles)")
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--save", help="save the last call's epsilons here (.npy)")
    parser.add_argument("--progress", action="store_true", help="progress bars on stderr")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the last call and print its N costliest functions")
    parser.add_argument("--untimed", type=int, default=0, metavar="N",
                        help="then N calls without the stage timers, whose blocks keep the host "
                             "from queueing a chunk while the device works on the last one")
    parser.add_argument("--trace", type=int, default=0, metavar="N",
                        help="then one call under jax.profiler: each device's busy time and idle "
                             "gaps, and its N costliest programs and kernels")
    args = parser.parse_args()
    seconds = collections.defaultdict(float)

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            out = jax.block_until_ready(fn(*a, **k))
            seconds[name] += time.perf_counter() - start
            return out
        # a kernel's function itself, which the host's compositions call in NumPy
        wrapper.__wrapped__ = getattr(fn, "__wrapped__", fn)
        return wrapper

    untimed = {name: getattr(dpsgd, name) for name in
               ("direction_arrays", "_compose_and_evaluate", "wrap_rows", "_gather_rows",
                "_gather_tiled_rows")}
    dpsgd.direction_arrays = timed("discretize", dpsgd.direction_arrays)
    dpsgd._compose_and_evaluate = timed("compose", dpsgd._compose_and_evaluate)
    wrap = timed("wrap", dpsgd.wrap_rows)
    points = [0]

    def counted_wrap(xp, probs, size, centers):
        points[0] += probs.shape[0] * size
        return wrap(xp, probs, size, centers)

    dpsgd.wrap_rows = counted_wrap
    # on an accelerator rows are gathered and wrapped on the device
    gather = timed("wrap", dpsgd._gather_rows)

    def counted_gather(probs, index, scalars, *, size):
        points[0] += len(index) * size
        return gather(probs, index, scalars, size=size)

    dpsgd._gather_rows = counted_gather
    gather_tiled = timed("wrap", dpsgd._gather_tiled_rows)

    def counted_tiled_gather(masses, grid_points, index, scalars, *, size, folds):
        points[0] += len(index) * size
        return gather_tiled(masses, grid_points, index, scalars, size=size, folds=folds)

    dpsgd._gather_tiled_rows = counted_tiled_gather
    sigmas, qs, steps = harness.sweep_configs(args.configs)
    print(f"pldjax from {os.path.dirname(os.path.abspath(pj.__file__))}", flush=True)
    profiler = cProfile.Profile()
    for call in range(args.calls):
        seconds.clear()
        points[0] = 0
        profiled = args.profile and call == args.calls - 1
        if profiled:
            profiler.enable()
        start = time.perf_counter()
        eps = pj.dpsgd_epsilon(sigmas, qs, steps, DELTA, rtol=args.rtol, progress=args.progress)
        total = time.perf_counter() - start
        if profiled:
            profiler.disable()
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
        print(f"call {call}: {total:.2f} s: {stages}, other {total - sum(seconds.values()):.2f} s; "
              f"{points[0] / 1e6:.1f} M points composed", flush=True)
    for name, kernel in untimed.items():
        setattr(dpsgd, name, kernel)
    for call in range(args.untimed):
        start = time.perf_counter()
        eps = pj.dpsgd_epsilon(sigmas, qs, steps, DELTA, rtol=args.rtol)
        print(f"untimed call {call}: {time.perf_counter() - start:.2f} s", flush=True)
    if args.trace:
        with tempfile.TemporaryDirectory() as log_dir:
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0
            start = time.perf_counter()
            with jax.profiler.trace(log_dir, profiler_options=options):
                pj.dpsgd_epsilon(sigmas, qs, steps, DELTA, rtol=args.rtol)
            print(f"traced call: {time.perf_counter() - start:.2f} s", flush=True)
            (path,) = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
            print_device_activity(jax.profiler.ProfileData.from_file(path), args.trace)
    kernels = (*MECHANISM_KERNELS, untimed["_compose_and_evaluate"], untimed["_gather_rows"],
               untimed["_gather_tiled_rows"])
    print("compiled shapes: " + ", ".join(f"{k.__name__} {k._cache_size()}" for k in kernels
                                          if hasattr(k, "_cache_size")), flush=True)
    if args.profile:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
    if args.save:
        np.save(args.save, eps)


def _busy_and_gaps(intervals) -> tuple[int, list[int]]:
    """Length of the union of (start, end) intervals and the gaps between them, in ns."""
    intervals = sorted(intervals)
    gaps, reach = [], intervals[0][1]
    for start, end in intervals[1:]:
        if start > reach:
            gaps.append(start - reach)
        reach = max(reach, end)
    return reach - intervals[0][0] - sum(gaps), gaps


def print_device_activity(profile, top: int) -> None:
    """Each device plane of a trace: its streams' event counts and busy time (union of their
    events), the idle gaps between events, and the costliest programs (``hlo_module``) and kernels
    by summed duration."""
    # jaxlib 0.11's event stats type warns on Python 3.12 when it is iterated
    warnings.filterwarnings("ignore", "builtin type event_stats", DeprecationWarning)
    for plane in profile.planes:
        if not plane.name.startswith("/device:"):
            continue
        intervals, programs, kernels = [], collections.Counter(), collections.Counter()
        for line in plane.lines:
            events = list(line.events)
            if not events:
                continue
            spans = [(e.start_ns, e.end_ns) for e in events]
            print(f"{plane.name} {line.name}: {len(events)} events, "
                  f"busy {_busy_and_gaps(spans)[0] / 1e6:.1f} ms", flush=True)
            if line.name.startswith(("XLA", "Launch", "Steps", "Framework")):
                continue  # derived lines repeat the streams' events
            intervals += spans
            for event in events:
                stats = dict(event.stats)
                programs[str(stats.get("hlo_module", "?"))] += event.duration_ns
                kernels[event.name[:70]] += event.duration_ns
        if not intervals:
            continue
        busy, gaps = _busy_and_gaps(intervals)
        long_gaps = [g for g in gaps if g > 50_000]
        print(f"{plane.name}: first to last event {(busy + sum(gaps)) / 1e6:.1f} ms, busy "
              f"{busy / 1e6:.1f} ms; {len(long_gaps)} idle gaps over 50 us, "
              f"{sum(long_gaps) / 1e6:.1f} ms in all (largest {max(gaps, default=0) / 1e6:.1f} ms)")
        for title, counter in (("programs", programs), ("kernels", kernels)):
            print(f"  costliest {title}: " + "; ".join(
                f"{name} {ns / 1e6:.1f} ms" for name, ns in counter.most_common(top)), flush=True)


if __name__ == "__main__":
    main()
