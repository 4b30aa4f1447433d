"""The benchmark suite's entry point.

    python -m bench --list                 # the benchmarks, one line each
    python -m bench NAME [options]         # run one; writes bench/results/NAME.md
    python -m bench NAME --quick           # a smoke run (small work; writes nothing unless --out)
    python -m bench NAME --help            # its options
    python -m bench all --quick            # every benchmark's smoke run, one after another
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from bench import harness

#: The benchmarks, in the order --list shows them: each a module of bench/ with a docstring
#: (first line: what it measures), QUICK (what --quick runs), add_arguments(parser) and
#: run(args, report).
BENCHMARKS = ("dpsgd", "tightness", "accountants", "calibration", "composed_gaussians", "gdp_residue",
              "natural_filter", "report", "batch_selection", "monte_carlo", "compile")


def _module(name: str):
    return importlib.import_module(f"bench.{name}")


def _title(module) -> str:
    """The first line of the module's docstring: what it measures."""
    return module.__doc__.strip().splitlines()[0]


def _summary(module) -> str:
    """The first paragraph of the module's docstring after its title."""
    paragraphs = module.__doc__.strip().split("\n\n")
    return " ".join(paragraphs[1].split()) if len(paragraphs) > 1 else ""


def _parser(name: str, module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m bench {name}", description=_title(module),
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {module.QUICK}")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the result file (default bench/results/{name}.md; a --quick run writes "
                             "none unless given)")
    parser.add_argument("--no-write", action="store_true", help="print the result only")
    module.add_arguments(parser)
    return parser


def run(name: str, argv: list[str]) -> str:
    module = _module(name)
    args = _parser(name, module).parse_args(argv)
    path = args.out
    if path is None and not (args.quick or args.no_write):
        path = harness.RESULTS_DIR / f"{name}.md"
    if args.no_write:
        path = None
    if args.quick:  # smoke runs: a compilation cache kept between runs
        harness.DEFAULT_CACHE = str(Path(tempfile.gettempdir()) / "pldjax-bench-quick-cache")
    # this process's own first calls, as its fresh processes': compilation included (cache off)
    # unless a smoke run; read when pldjax is imported
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    os.environ["PLDJAX_COMPILATION_CACHE"] = harness.DEFAULT_CACHE or "0"
    # this process's warm calls are the compiled kernels' (a process runs its first small
    # accounting calls in NumPy, up to pldjax.core.compilation.HOST_WORK grid points); its fresh
    # processes start as a user's does
    if "PLDJAX_HOST_WORK" not in os.environ:
        os.environ["PLDJAX_HOST_WORK"] = "0"
        harness.PARENT_ONLY.add("PLDJAX_HOST_WORK")
    # on an accelerator, this process allocates memory as it needs it, leaving the rest to its
    # fresh processes (which allocate as a user's process does)
    if "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        harness.PARENT_ONLY.add("XLA_PYTHON_CLIENT_PREALLOCATE")
    command = " ".join(["python -m bench", name, *map(shlex.quote, argv)])
    report = harness.Report(name, f"{_title(module)} {_summary(module)}", command, path)
    harness.log(f"{name}: describing the machine")
    report.machine = harness.machine()
    module.run(args, report)
    text = report.finish()
    print(text, flush=True)
    if path is not None:
        harness.log(f"{name}: written {path}")
    return text


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nbenchmarks: " + ", ".join(BENCHMARKS))
        return
    if argv[0] == "--list":
        for name in BENCHMARKS:
            print(f"{name:20s} {_title(_module(name))}")
        return
    if argv[0] == "all":
        for name in BENCHMARKS:
            start = time.perf_counter()
            run(name, argv[1:])
            harness.log(f"{name}: {time.perf_counter() - start:.0f} s")
        return
    if argv[0] not in BENCHMARKS:
        sys.exit(f"unknown benchmark {argv[0]!r}; python -m bench --list shows them")
    run(argv[0], argv[1:])


if __name__ == "__main__":
    main()
