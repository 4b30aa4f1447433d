"""Command line.

* ``pldjax epsilon|delta --noise-multiplier S [--sampling-prob Q] --steps T --delta D|--epsilon E``:
  one DP-SGD configuration (the Gaussian mechanism, Poisson-subsampled when Q < 1).
* ``pldjax sweep configs.csv [--output out.csv]``: epsilon (or delta) for every row of a CSV file
  with columns ``noise_multiplier, sampling_prob, steps`` and ``delta`` (or ``epsilon``), in one
  batched computation, with a progress bar on long sweeps.

Values printed are pessimistic (upper bounds on the truth) with the optimistic estimate beside
them, to show how tight they are.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence

#: Sweeps with more rows than this show a progress bar.
PROGRESS_ROWS = 64
_NEIGHBORING = ("add_remove", "replace_one")


def _add_mechanism_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--noise-multiplier",
        type=float,
        required=True,
        help="Gaussian noise standard deviation divided by the L2 sensitivity (sigma > 0)",
    )
    parser.add_argument(
        "--sampling-prob",
        type=float,
        default=1.0,
        help="Poisson sampling probability q in [0, 1] of each record per step (default 1)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=1,
        help="number of times the mechanism runs (composition count, >= 0; default 1)",
    )
    _add_neighboring(parser)


def _add_neighboring(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--neighboring", choices=_NEIGHBORING, default="add_remove", help="adjacency relation"
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pldjax",
        description=(
            "Privacy accounting with privacy loss distributions. Prints the pessimistic value "
            "(a guarantee: an upper bound) and, beside it, the optimistic value (a lower bound "
            "on the truth, to show how tight the guarantee is)."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    eps = sub.add_parser(
        "epsilon",
        help="epsilon at a given delta",
        description="Smallest epsilon such that the composition is (epsilon, delta)-DP.",
    )
    _add_mechanism_options(eps)
    eps.add_argument("--delta", type=float, required=True, help="target delta, in [0, 1]")
    dlt = sub.add_parser(
        "delta",
        help="delta at a given epsilon",
        description="Smallest delta such that the composition is (epsilon, delta)-DP.",
    )
    _add_mechanism_options(dlt)
    dlt.add_argument("--epsilon", type=float, required=True, help="target epsilon, >= 0")
    sweep = sub.add_parser(
        "sweep",
        help="epsilon (or delta) for every row of a CSV file",
        description=(
            "Reads a CSV file with a header and columns noise_multiplier, sampling_prob, steps and "
            "delta (or epsilon); writes the same rows with epsilon (or delta) and its optimistic "
            "estimate appended."
        ),
    )
    sweep.add_argument("configs", help="input CSV file")
    sweep.add_argument("--output", help="output CSV file (default: standard output)")
    _add_neighboring(sweep)
    return parser


def _single(args) -> str:
    import pldjax as pj

    fn = pj.dpsgd_epsilon if args.command == "epsilon" else pj.dpsgd_delta
    target = args.delta if args.command == "epsilon" else args.epsilon
    bounds = [
        fn(args.noise_multiplier, args.sampling_prob, args.steps, target,
           neighboring=args.neighboring, pessimistic=pessimistic)
        for pessimistic in (True, False)
    ]
    return f"{args.command} = {bounds[0]:.6g}  (optimistic {bounds[1]:.6g})"


def _read_configs(path: str):
    import numpy as np

    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{path}: no rows")
    header = list(rows[0])
    targets = [name for name in ("delta", "epsilon") if name in header]
    missing = [c for c in ("noise_multiplier", "sampling_prob", "steps") if c not in header]
    if missing or len(targets) != 1:
        raise ValueError(
            f"{path}: needs columns noise_multiplier, sampling_prob, steps and exactly one of "
            f"delta, epsilon; found {header}"
        )

    def column(name):
        try:
            return np.array([float(r[name]) for r in rows])
        except ValueError as err:
            raise ValueError(f"{path}: column {name}: {err}") from None

    columns = [column(c) for c in ("noise_multiplier", "sampling_prob", "steps", targets[0])]
    return rows, header, targets[0], columns


def _sweep(args) -> int:
    import pldjax as pj

    rows, header, target_name, (sigma, q, steps, target) = _read_configs(args.configs)
    fn = pj.dpsgd_epsilon if target_name == "delta" else pj.dpsgd_delta
    result_name = "epsilon" if target_name == "delta" else "delta"
    progress = len(rows) > PROGRESS_ROWS
    upper = fn(sigma, q, steps, target, neighboring=args.neighboring, progress=progress)
    lower = fn(sigma, q, steps, target, neighboring=args.neighboring, pessimistic=False)
    out = open(args.output, "w", newline="") if args.output else sys.stdout
    try:
        writer = csv.writer(out)
        writer.writerow(header + [result_name, f"{result_name}_optimistic"])
        for row, up, lo in zip(rows, upper, lower, strict=True):
            writer.writerow([row[c] for c in header] + [repr(float(up)), repr(float(lo))])
    finally:
        if args.output:
            out.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    from pldjax.compilation import enable_compilation_cache

    enable_compilation_cache()
    try:
        if args.command == "sweep":
            return _sweep(args)
        print(_single(args))
    except (ValueError, OSError) as err:
        print(f"pldjax: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
