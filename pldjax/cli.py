"""Command line: ``pldjax epsilon ...`` and ``pldjax delta ...`` for composed Gaussian mechanisms."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _add_mechanism_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--noise-multiplier",
        type=float,
        required=True,
        help="Gaussian noise standard deviation divided by the L2 sensitivity (sigma > 0)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=1,
        help="number of times the mechanism runs (composition count, >= 0; default 1)",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    import pldjax as pj

    try:
        bounds = []
        for pessimistic in (True, False):
            pld = pj.gaussian(args.noise_multiplier, pessimistic=pessimistic).self_compose(
                args.steps
            )
            if args.command == "epsilon":
                bounds.append(float(pld.epsilon(args.delta)))
            else:
                bounds.append(float(pld.delta(args.epsilon)))
    except ValueError as err:
        print(f"pldjax: error: {err}", file=sys.stderr)
        return 2
    name = "epsilon" if args.command == "epsilon" else "delta"
    print(f"{name} = {bounds[0]:.6g}  (optimistic {bounds[1]:.6g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
