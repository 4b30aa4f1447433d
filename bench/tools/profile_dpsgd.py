"""Where the time of one warm ``pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)`` goes, stage by stage.

Times the call, then each of its stages on the same inputs (the remove direction, whose
composition also bounds the add direction, in the two rows of a lone configuration's calls, as the
call computes them), each stage as its own jitted function, and the "FFT floor": a bare jitted
rfft, pointwise power and irfft of the composition window for those two rows. The call is timed
on the compiled kernels, as the stages are (``PLDJAX_HOST_WORK=0``: a process's first calls would
otherwise run in NumPy, see pldjax.core.compilation.HostWork). Rounds run every
stage once in turn (so that load from other processes spreads over all of them); the table gives
the median over rounds, in milliseconds, and each stage over the FFT floor. Stages are measured
alone, so the parts of the fused composition call need not add up to it exactly (XLA fuses them);
"host and dispatch" is the total minus the two timed calls (discretization with window placement,
composition and evaluation). The stages are pldjax internals (bench/internals.py).

    python -m bench.tools.profile_dpsgd              # 15 rounds
    python -m bench.tools.profile_dpsgd --rounds 31 --json out.json
    python -m bench.tools.profile_dpsgd --total      # only the call, the FFT floor, the optimistic
                                                     # and the rtol=1e-2 and 5e-2 calls, alternated
    python -m bench.tools.profile_dpsgd --total --peer 5   # and dp-accounting (1e-4) 5 times after
    python -m bench.tools.profile_dpsgd --total --sync     # with jax_cpu_enable_async_dispatch off
    python -m bench.tools.profile_dpsgd --consecutive --rounds 3   # default, rtol=1e-2 and 5e-2
                                                     # calls, 50 in a row each (a search's pattern)

``--total`` uses the public API only, for before/after comparisons: run it back to back in two
checkouts, a few times each, and compare the "x floor" ratios (its calls are a process's first,
which run in NumPy until its host work is spent, unless ``PLDJAX_HOST_WORK=0`` is set). Its
floor is the window of ``pj.gaussian(...).self_compose(T)`` (131,072 points), wider than
dpsgd_epsilon's own (the table's floor, 98,304 points). ``--peer K`` then times dp-accounting's
PLD (value discretization 1e-4) K times on the same event, in the same process.

``--sync`` turns JAX's asynchronous dispatch on a CPU off before the first computation: each
call of a small kernel then runs on the calling thread instead of waking one of XLA's workers,
which a call of four kernels pays four times. It is a process-wide setting, fixed when JAX starts
its CPU backend, so pldjax leaves it to its users.

Fresh-process times (import, first call with and without the compilation cache) are part 1 of
``python -m bench dpsgd``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import pldjax as pj
from bench import harness, internals

compose_lib = internals.compose
engine_lib = internals.engine
planner_lib = internals.planner
mechanisms_lib = internals.mechanisms
profile_lib = internals.profile

SIGMA, Q, STEPS, DELTA = 1.0, 0.01, 10_000, 1e-5
DISCRETIZE = "discretize the remove direction + window placement"
#: The accuracy settings --total times beside the default grid.
COARSE_RTOLS = (1e-2, 5e-2)


def stages(rtol=None):
    """(name, thunk) pairs; every thunk returns device arrays (blocked on by the timer).
    ``rtol``: the stages of ``pj.dpsgd_epsilon(..., rtol=rtol)`` (its grid step)."""
    mechanism, params, _ = pj.dpsgd_event(SIGMA, Q).directions(True)
    # the remove direction alone, twice: a lone configuration's rows (see the engine's chunks)
    directions = mechanisms_lib.Directions(
        mechanism, tuple(np.full(2, p, np.float64) for p in params) + (np.zeros(2),), False)
    # the windows dpsgd_epsilon asks for (each step may leave delta 2^-20 / T outside)
    steps, delta = np.array([STEPS], np.float64), np.array([DELTA])
    mechanism_tail = float(planner_lib.mechanism_tail(steps, delta, "epsilon")[0])
    grid = None
    if rtol is not None:
        step = planner_lib.accuracy_steps(np.array([SIGMA]), np.array([Q]), steps, delta, "delta",
                                         "add_remove", rtol)[0]
        grid = pj.Grid(step=float(step))

    count = np.full((2,), float(STEPS))
    target = np.full((2,), DELTA)

    def discretize():
        return mechanisms_lib.direction_arrays(directions, grid, True, mechanism_tail,
                                               then=engine_lib._placement(1, "epsilon"),
                                               extra=(count, target))

    probs, inf_mass, offset, step, lo, hi, chernoff, summary = jax.tree_util.tree_map(
        jnp.asarray, discretize())
    summary = compose_lib.PMFSummary(*summary)
    count, target = jnp.asarray(count), jnp.asarray(target)
    tail = float(planner_lib.composition_tail(target, "epsilon")[0])
    windows = jax.jit(functools.partial(engine_lib._placement_rows, evaluate="epsilon"))
    widths = compose_lib.window_widths(summary, offset, count, lo, hi, "steps")
    size = engine_lib.composition_size(int(np.max(widths)))

    def wrap():
        return compose_lib.wrap_rows(np, np.asarray(probs), size, np.asarray(summary.center))

    folded = wrapped = jnp.asarray(wrap())
    exponents = jax.jit(jax.vmap(compose_lib.chernoff_exponents))
    spectrum = jax.jit(jax.vmap(compose_lib._spectrum))
    rfft = jax.jit(jnp.fft.rfft)

    @jax.jit
    def power_irfft(spec, low):
        powered = compose_lib._powered(spec, low, jnp.zeros(2), count, jnp.zeros(2, jnp.int64),
                                       width=spec.shape[1], size=size)
        return jnp.fft.irfft(powered, size)

    @jax.jit
    def fft_floor(p):
        return jnp.fft.irfft(jnp.fft.rfft(p, size) ** STEPS, size)

    spec, low, _ = spectrum(folded)
    raw = power_irfft(spec, low)
    settle = jax.jit(jax.vmap(lambda r, m: compose_lib.settle(
        jnp.maximum(r, 0.0), m, compose_lib.fft_roundoff(r), tail, True)))
    evaluate = jax.jit(jax.vmap(
        lambda p, m, o, h, t: profile_lib.epsilon_kernel(p, m, o, h, t[None])[0]))
    composed = settle(raw, inf_mass)[0]

    def fused():
        return engine_lib._compose_and_evaluate(
            wrapped, summary, inf_mass, offset, step, count, target, chernoff,
            pessimistic=True, evaluate="epsilon", swapped=True)

    return size, [
        ("total: pj.dpsgd_epsilon", lambda: pj.dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, rtol=rtol)),
        (DISCRETIZE, lambda: discretize()[0]),
        ("  part: window placement (Chernoff)", lambda: windows(probs, offset, step, count, target)),
        ("wrap to the window (host, NumPy)", wrap),
        ("compose + evaluate (one fused call)", fused),
        ("  part: Chernoff exponents (now in window placement)",
         lambda: exponents(probs, offset, step, count)),
        ("  part: _spectrum (2 rfft, tail sums)", lambda: spectrum(folded)),
        ("  part: of which rfft", lambda: rfft(folded)),
        ("  part: log, exp(T log P) + irfft, every frequency", lambda: power_irfft(spec, low)),
        ("  part: settle + round-off bound", lambda: settle(raw, inf_mass)),
        ("  part: evaluate (epsilon_kernel)",
         lambda: evaluate(composed, inf_mass, offset, step, target)),
        ("FFT floor: rfft, P**T, irfft", lambda: fft_floor(probs)),
    ]


def total(rounds: int, peer: int = 0) -> None:
    """The warm call and the FFT floor alternated in one process: medians and their ratio."""
    with jax.enable_x64(True):  # public API only, so that it runs in older checkouts too
        pld = pj.gaussian(SIGMA, sampling_prob=Q)
        size = int(pld.self_compose(STEPS).size)
        probs = jnp.stack([d.probs for d in pld.directions()])
        fft_floor = jax.jit(lambda p: jnp.fft.irfft(jnp.fft.rfft(p, size) ** STEPS, size))

        def call():
            return pj.dpsgd_epsilon(SIGMA, Q, STEPS, DELTA)

        def floor():
            return fft_floor(probs)

        def optimistic():
            return pj.dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, pessimistic=False)

        coarse = [functools.partial(pj.dpsgd_epsilon, SIGMA, Q, STEPS, DELTA, rtol=rtol)
                  for rtol in COARSE_RTOLS]
        # the accuracy setting, where the checkout has it
        thunks = (call, floor, optimistic)
        if "rtol" in (pj.dpsgd_epsilon.__doc__ or ""):
            thunks += tuple(coarse)
        times = tuple([] for _ in thunks)
        cpu = tuple([] for _ in thunks)  # CPU seconds of this process: less noisy under load
        for thunk in thunks:
            jax.block_until_ready(thunk())
        for _ in range(rounds):
            for thunk, got, got_cpu in zip(thunks, times, cpu, strict=True):
                start, start_cpu = time.perf_counter(), time.process_time()
                jax.block_until_ready(thunk())
                got.append(time.perf_counter() - start)
                got_cpu.append(time.process_time() - start_cpu)
    call_ms, floor_ms, optimistic_ms, *coarse_ms = (1e3 * float(np.median(t)) for t in times)
    call_cpu, floor_cpu, optimistic_cpu, *coarse_cpu = (1e3 * float(np.median(t)) for t in cpu)
    print(f"{pj.__file__}: call {call_ms:.1f} ms, FFT floor ({size} points x 2) {floor_ms:.2f} ms, "
          f"{call_ms / floor_ms:.1f} x floor; CPU time: call {call_cpu:.1f} ms, floor "
          f"{floor_cpu:.2f} ms, {call_cpu / floor_cpu:.1f} x; median of {rounds}; "
          f"load {harness.load_average():.1f}")
    print(f"  pessimistic=False: {optimistic_ms:.1f} ms ({optimistic_ms / call_ms:.1f}x the default; "
          f"CPU time {optimistic_cpu:.1f} ms), epsilon {optimistic():.6f}")
    for rtol, ms, cpu_ms, coarse_call in zip(COARSE_RTOLS, coarse_ms, coarse_cpu, coarse,
                                             strict=False):
        print(f"  rtol={rtol:g}: {ms:.2f} ms ({call_ms / ms:.2f}x faster than the default; CPU "
              f"time {cpu_ms:.2f} ms, {call_cpu / cpu_ms:.2f}x), epsilon {coarse_call():.6f} "
              f"(default {call():.6f})")
    if peer:
        peer_s = []
        for _ in range(peer):
            start = time.perf_counter()
            peer_epsilon = harness.dp_accounting_dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, 1e-4)
            peer_s.append(time.perf_counter() - start)
        peer_ms = 1e3 * float(np.median(peer_s))
        print(f"  dp-accounting PLD (1e-4): {peer_ms:.0f} ms (median of {peer}; "
              f"{', '.join(f'{1e3 * t:.0f}' for t in peer_s)}), epsilon {peer_epsilon:.6f}: "
              f"the default call is {peer_ms / call_ms:.1f}x faster")


def consecutive(rounds: int, calls: int = 50, warmup: int = 20) -> None:
    """The default call and each of COARSE_RTOLS, ``calls`` in a row each (after ``warmup``), as a
    hyperparameter search repeats one kind of call: median milliseconds and the ratio to the
    default, ``rounds`` times."""
    def median_ms(rtol):
        for _ in range(warmup):
            pj.dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, rtol=rtol)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            pj.dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, rtol=rtol)
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times))

    for _ in range(rounds):
        default = median_ms(None)
        parts = [f"default {default:.2f} ms"]
        for rtol in COARSE_RTOLS:
            ms = median_ms(rtol)
            parts.append(f"rtol={rtol:g} {ms:.2f} ms ({default / ms:.2f}x)")
        print("  ".join(parts), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="also write the table as JSON here")
    parser.add_argument("--cpu", action="store_true",
                        help="time stages by this process's CPU time (less noisy on a loaded "
                             "machine) instead of wall clock")
    parser.add_argument("--rtol", type=float, default=None,
                        help="the stages of a call with this rtol (default: none, the automatic grid)")
    parser.add_argument("--peer", type=int, default=0,
                        help="with --total: time dp-accounting (1e-4) this many times too")
    parser.add_argument("--total", action="store_true",
                        help="instead: only the call and the FFT floor (see the module docstring)")
    parser.add_argument("--consecutive", action="store_true",
                        help="instead: the default and rtol calls, 50 in a row each, --rounds times")
    parser.add_argument("--sync", action="store_true",
                        help="run with jax_cpu_enable_async_dispatch off (see the module docstring)")
    args = parser.parse_args()
    if args.sync:
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    if args.total:
        total(args.rounds, args.peer)
        return
    if args.consecutive:
        consecutive(args.rounds)
        return
    os.environ["PLDJAX_HOST_WORK"] = "0"  # the call on the compiled kernels, as its stages
    with jax.enable_x64(True):
        size, named = stages(args.rtol)
        for _, thunk in named:  # compile and warm every stage first
            jax.block_until_ready(thunk())
        times = {name: [] for name, _ in named}
        clock = time.process_time if args.cpu else time.perf_counter
        for _ in range(args.rounds):
            for name, thunk in named:
                start = clock()
                jax.block_until_ready(thunk())
                times[name].append(clock() - start)
    median = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
    device = median[DISCRETIZE] + median["compose + evaluate (one fused call)"]
    floor = median["FFT floor: rfft, P**T, irfft"]
    print(f"pj.dpsgd_epsilon({SIGMA}, {Q}, {STEPS}, {DELTA}, rtol={args.rtol}) = "
          f"{pj.dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, rtol=args.rtol):.6f}; composition window "
          f"{size} points, the remove direction's 2 rows; median of {args.rounds} rounds, "
          f"{'CPU' if args.cpu else 'wall'} time")
    print(f"{'stage':<52} {'ms':>8} {'/ FFT floor':>12}")
    for name, value in median.items():
        print(f"{name:<52} {value:8.2f} {value / floor:12.1f}")
    host = median["total: pj.dpsgd_epsilon"] - device
    print(f"{'host and dispatch (total - the two calls)':<52} {host:8.2f} {host / floor:12.1f}")
    machine = harness.machine()
    print("\n".join(harness.machine_lines(machine)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median_ms": median, "size": size, "machine": machine}, f, indent=1)


if __name__ == "__main__":
    main()
