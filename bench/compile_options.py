"""What pldjax's CPU compiler options (``pj.compilation.FAST_COMPILE``) buy: compile and warm time.

Two tables, each comparing XLA's defaults with FAST_COMPILE (``xla_cpu_use_fusion_emitters=False``):

* ``--kernels`` (one process): runs a set of public calls once to find every kernel they use and
  its first inputs, then compiles each kernel both ways (``jit(...).trace().lower().compile()``)
  and times the compilation and the warm run of each executable (median of ``--repeats`` runs,
  the two executables alternating). This is how the
  kernels that keep XLA's defaults (``cpu_options=None``) were chosen.
* default: public calls in fresh processes, alternating XLA's defaults (pldjax's options switched
  off) and pldjax as shipped: each call's first time (compilation included; caches off) and its
  warm time (median of 3). The calls run in the table's order in one process, so a first time
  counts only the kernels that the calls before it had not compiled.

    python bench/compile_options.py                # first calls, 2 processes per setting
    python bench/compile_options.py --rounds 3
    python bench/compile_options.py --kernels
    python bench/compile_options.py --kernels --repeats 41 --only _residue_pairs gdp_mu_kernel

Not part of CI. CPU only (on an accelerator pldjax uses no options).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CALLS = {
    "dpsgd_epsilon": "pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)",
    "gaussian self_compose epsilon":
        "pj.gaussian(1.0, sampling_prob=0.01).self_compose(1000).epsilon(1e-5)",
    "compose three, delta": "pj.compose([pj.laplace(1.0), pj.gaussian(2.0), "
                            "pj.randomized_response(0.5)]).delta(1.0)",
    "calibrate_noise_multiplier": "pj.calibrate_noise_multiplier(2.0, 1e-5, 0.01, 1000)",
    "gdp_residue, 32 gauss pairs": "pj.gdp_residue(MUS, GAUSS)",
    "gdp_residue, 32 rr pairs": "pj.gdp_residue(MUS, RR)",
    "gdp_mu": "pj.gdp_mu(pj.gaussian(1.5, sampling_prob=0.1))",
    "natural_filter_free, 4 x 4":
        "pj.natural_filter_free(QUERIES, budget=pj.gdp(2.0, pessimistic=False), rounds=4)",
}

SETUP = """
import numpy as np, jax, jax.numpy as jnp
import pldjax as pj
rng = np.random.default_rng(0)
MUS = jnp.asarray(rng.uniform(0.75, 1, 32))
GAUSS = pj.gaussian(jnp.asarray(rng.uniform(1, 2, 32)), sampling_prob=0.1)
RR = pj.randomized_response(jnp.asarray(rng.uniform(0.1, 0.5, 32)))
QUERIES = [pj.gdp(m, grid=pj.Grid(step=32 / 4096, size=4096)) for m in (0.5, 0.7, 0.9, 1.1)]
"""

WORKER = SETUP + """
import json, sys, time
if sys.argv[1] == "defaults":
    from pldjax import compilation
    compilation._supported = lambda options: False  # every kernel with XLA's defaults
out = {}
for name, code in json.loads(sys.argv[2]).items():
    start = time.perf_counter(); jax.block_until_ready(eval(code)); first = time.perf_counter() - start
    warm = []
    for _ in range(3):
        start = time.perf_counter(); jax.block_until_ready(eval(code))
        warm.append(time.perf_counter() - start)
    out[name] = (first, sorted(warm)[1])
print(json.dumps(out))
"""


def first_calls(rounds: int) -> None:
    env = dict(os.environ, PLDJAX_COMPILATION_CACHE="0")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    runs = {"defaults": [], "pldjax": []}
    for _ in range(rounds):
        for setting in runs:
            done = subprocess.run([sys.executable, "-c", WORKER, setting, json.dumps(CALLS)],
                                  capture_output=True, text=True, env=env, check=True)
            runs[setting].append(json.loads(done.stdout.splitlines()[-1]))
    print(f"first call (compilation included, caches off) and warm call; medians of {rounds} "
          "fresh processes per setting, alternating")
    print(f"{'call':32s} {'first: XLA defaults':>20s} {'pldjax':>8s} {'ratio':>6s}   "
          f"{'warm ms: XLA defaults':>21s} {'pldjax':>8s}")
    for name in CALLS:
        first = {s: statistics.median(r[name][0] for r in runs[s]) for s in runs}
        warm = {s: statistics.median(r[name][1] for r in runs[s]) * 1e3 for s in runs}
        print(f"{name:32s} {first['defaults']:18.2f} s {first['pldjax']:6.2f} s "
              f"{first['pldjax'] / first['defaults']:6.2f}   {warm['defaults']:21.2f} "
              f"{warm['pldjax']:8.2f}")


KERNELS = """
import jax
# every jax.jit pldjax creates (its kernels with FAST_COMPILE and with XLA's defaults alike) is
# wrapped, before pldjax is imported, to record the function, its jit options and first inputs
seen, plain_jit = {}, jax.jit
class Recorded:
    def __init__(self, fn, options):
        self.fn, self.options, self.jitted = fn, options, plain_jit(fn, **options)
    def __call__(self, *args, **kwargs):
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        if not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            entry = seen.setdefault(self.fn, [self.options, args, kwargs, x64(), "defaults"])
            if "compiler_options" in self.options:
                entry[4] = "FAST"
        return self.jitted(*args, **kwargs)
    def __getattr__(self, name):
        return getattr(self.jitted, name)
def x64():
    return jax.config.jax_enable_x64
def recording_jit(fn=None, **options):
    return (lambda f: Recorded(f, options)) if fn is None else Recorded(fn, options)
jax.jit = recording_jit
""" + SETUP + """
import statistics, time
for code in CALLS.values():
    jax.block_until_ready(eval(code))
jax.jit = plain_jit
print(f"{'kernel':30s} {'compile s: defaults':>19s} {'FAST':>6s}   {'warm ms: defaults':>17s} "
      f"{'FAST':>8s}   shipped with")
for fn, (options, args, kwargs, enable_x64, shipped) in seen.items():
    name = getattr(fn, "__name__", type(fn).__name__)
    if ONLY and name not in ONLY:
        continue
    jax.config.update("jax_enable_x64", enable_x64)
    options = {k: v for k, v in options.items() if k not in ("compiler_options", "donate_argnames")}
    static = options.get("static_argnames", ())
    static = {static} if isinstance(static, str) else set(static)
    kernel = plain_jit(fn, **options)
    compile_s, executables = [], []
    for fusion in (True, False):
        jax.clear_caches()  # no executable compiled by the calls above
        start = time.perf_counter()
        executables.append(kernel.trace(*args, **kwargs).lower().compile(
            compiler_options={"xla_cpu_use_fusion_emitters": fusion}))
        compile_s.append(time.perf_counter() - start)
    dynamic = {k: v for k, v in kwargs.items() if k not in static}
    warm = [[], []]
    try:
        for executable in executables:
            jax.block_until_ready(executable(*args, **dynamic))
        for _ in range(REPEATS):  # alternating, so that load spreads over both
            for times, executable in zip(warm, executables):
                start = time.perf_counter(); jax.block_until_ready(executable(*args, **dynamic))
                times.append(time.perf_counter() - start)
        warm_ms = [statistics.median(times) * 1e3 for times in warm]
    except Exception:  # donated inputs: no second run
        warm_ms = [float("nan")] * 2
    print(f"{name:30s} {compile_s[0]:19.3f} {compile_s[1]:6.3f}   {warm_ms[0]:17.3f} "
          f"{warm_ms[1]:8.3f}   {shipped}")
"""


def kernels(repeats: int, only: tuple) -> None:
    env = dict(os.environ, PLDJAX_COMPILATION_CACHE="0")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    code = KERNELS.replace("CALLS", repr(CALLS)).replace("REPEATS", str(repeats)).replace(
        "ONLY", repr(only))
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--repeats", type=int, default=21, help="warm runs per kernel (--kernels)")
    parser.add_argument("--only", nargs="*", default=[], help="these kernels only (--kernels)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")
    kernels(args.repeats, tuple(args.only)) if args.kernels else first_calls(args.rounds)


if __name__ == "__main__":
    main()
