"""The XLA programs an accelerator's accounting compiles, counted on a CPU.

On one accelerator the accounting keeps its chunks on the device (``_keeps_chunks_on_device``),
gathers each composition call's rows there and calls the tile kernels with the accelerator's
tiles a call; everything else it decides as on a CPU. This tool makes those choices on the CPU
and runs ``python -m bench compile``'s paths in this process (persistent compilation cache
off), printing for each path's first call the programs compiled, by name, with XLA's compile
seconds on this CPU, and its warm time. Program counts and shapes are the accelerator's; the
seconds and the times are the CPU's (an H200 compiled the masses kernel in about 6 s where a
2-core CPU took 1.5 s). Paths run one after another in one process, as in a notebook: a later
path counts only what the earlier ones did not compile. The GDP-residue filter's batch size is
the CPU's.

    python -m bench.tools.accelerator_programs --paths sweep_1024,random_256
    python -m bench.tools.accelerator_programs --paths random_256 --compiled
                      # every call compiled (PLDJAX_HOST_WORK=0: no first calls on the host)
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default="sweep_1024", help="bench/compile.py's paths, comma-separated")
    parser.add_argument("--compiled", action="store_true",
                        help="no accounting on the host (PLDJAX_HOST_WORK=0)")
    args = parser.parse_args()
    os.environ["PLDJAX_COMPILATION_CACHE"] = "0"
    os.environ.setdefault("PLDJAX_QUIET", "1")
    if args.compiled:
        os.environ["PLDJAX_HOST_WORK"] = "0"
    from bench import compile as compile_bench

    compile_bench.listen()  # before pldjax is imported
    from bench import internals

    internals.engine._keeps_chunks_on_device = lambda: True
    internals.discretize.CALL_TILES = internals.discretize.ACCELERATOR_CALL_TILES
    for path in args.paths.split(","):
        if path not in compile_bench.PATHS:
            raise SystemExit(f"unknown path {path}; the paths: {', '.join(compile_bench.PATHS)}")
        call = compile_bench.path_call(path)
        start = time.perf_counter()
        first = call()
        first_seconds = time.perf_counter() - start
        start = time.perf_counter()
        warm = call()
        warm_seconds = time.perf_counter() - start
        print(f"{path}: first call {first_seconds:.2f} s, {first['compiled']} programs, XLA "
              f"{first['seconds']['compile']:.2f} s; warm {warm_seconds:.2f} s, "
              f"{warm['compiled']} programs; values {first['values']}", flush=True)
        for name, (count, seconds) in first["names"].items():
            print(f"  {count:4d} {seconds:7.2f} s  {name}", flush=True)


if __name__ == "__main__":
    main()
