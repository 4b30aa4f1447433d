"""Command line.

* ``pldjax epsilon|delta --noise-multiplier S [--sampling-prob Q] --steps T --delta D|--epsilon E``:
  one DP-SGD configuration (the Gaussian mechanism, Poisson-subsampled when Q < 1).
* ``pldjax sweep configs.csv [--output out.csv]``: epsilon (or delta) for every row of a CSV file
  with columns ``noise_multiplier, sampling_prob, steps`` and ``delta`` (or ``epsilon``), in one
  batched computation, with a progress bar on long sweeps.
* ``pldjax report --noise-multiplier S [--sampling-prob Q] --steps T [--format json]``: the
  privacy report of one configuration (:func:`pldjax.privacy_report`), Markdown by default.

Both take the mechanism as its parts (a :class:`pldjax.Event`): ``--noise`` (gaussian, laplace,
discrete_laplace, discrete_gaussian; the noise's scale is S times ``--sensitivity``),
``--sampling`` (poisson, fixed_batch, none) and ``--neighboring`` (add_remove, replace_one); the
defaults are DP-SGD's (Gaussian, Poisson, add/remove).

Values printed are pessimistic (upper bounds on the truth) with the optimistic estimate beside
them, to show how tight they are; each is printed to six digits rounded to its safe side (up for
the pessimistic value, down for the optimistic one; the sweep writes every digit). Bad input (a
NaN, a value out of range, a CSV row with a missing or malformed field) is reported on standard
error, naming the argument (and the CSV row and column), with exit code 2; a computation that
fails (a NaN result) exits with code 1, printing no result.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence

#: Sweeps with more rows than this show a progress bar.
PROGRESS_ROWS = 64
_NEIGHBORING = ("add_remove", "replace_one")
#: --noise: the pldjax.mechanisms.noise record each name builds (noise scale, sensitivity).
_NOISES = {"gaussian": "Gaussian", "laplace": "Laplace", "discrete_laplace": "DiscreteLaplace",
           "discrete_gaussian": "DiscreteGaussian"}
_SAMPLINGS = ("poisson", "fixed_batch", "none")
#: The range of each CSV column, as pldjax.core.validation.check_range arguments (low, high, options).
_COLUMN_RANGES = {
    "noise_multiplier": (0.0, float("inf"), {"low_open": True}),
    "sampling_prob": (0.0, 1.0, {}),
    "steps": (0.0, float("inf"), {}),
    "delta": (0.0, 1.0, {}),
    "epsilon": (0.0, float("inf"), {"allow_inf": True}),
}


class ComputationError(RuntimeError):
    """A result that is not a number (a failure of the library, not of the input)."""


def _check_numbers(values, where: str) -> None:
    import numpy as np

    bad = np.isnan(np.asarray(values, np.float64))
    if np.any(bad):
        raise ComputationError(
            f"the computation gave NaN {where(bad)}; no result is printed (please report this "
            "as a bug, with the arguments)"
        )


def _add_mechanism_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--noise-multiplier",
        type=float,
        required=True,
        help="the noise's scale divided by the sensitivity (> 0): for the Gaussian its standard "
        "deviation over the L2 sensitivity, for Laplace its scale b over the L1 sensitivity",
    )
    parser.add_argument(
        "--sampling-prob",
        type=float,
        help="sampling probability q in [0, 1] of each record per step (batch size / dataset "
        "size for fixed_batch); required unless --sampling none",
    )
    parser.add_argument(
        "--steps",
        type=int,
        required=True,
        help="number of times the mechanism runs (training steps: composition count, >= 0)",
    )
    _add_neighboring(parser)


def _add_neighboring(parser: argparse.ArgumentParser) -> None:
    """The options naming the mechanism's parts (besides its numbers)."""
    parser.add_argument(
        "--neighboring", choices=_NEIGHBORING, default="add_remove",
        help="adjacency relation (default add_remove)"
    )
    parser.add_argument("--noise", choices=tuple(_NOISES), default="gaussian",
                        help="noise distribution (default gaussian)")
    parser.add_argument("--sampling", choices=_SAMPLINGS, default="poisson",
                        help="how records are sampled each step: poisson (default), fixed_batch "
                        "(without replacement; needs --neighboring replace_one) or none")
    parser.add_argument("--sensitivity", type=float, default=1.0,
                        help="the query's sensitivity (> 0; a whole number for the discrete "
                        "noises; default 1)")


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
    report = sub.add_parser(
        "report",
        help="a privacy report: epsilon, delta, attacker TPR at low FPR, GDP mu, Renyi DP",
        description=(
            "Brackets what a privacy review reads between the optimistic and the pessimistic "
            "PLD of the composition (see pldjax.privacy_report)."
        ),
    )
    _add_mechanism_options(report)
    report.add_argument("--format", choices=("markdown", "json"), default="markdown",
                        help="output format (default markdown)")
    return parser


def _report(args) -> str:
    import pldjax as pj
    from pldjax.core.validation import check_count, check_range

    sampling_prob = _sampling_prob(args)
    check_range("noise_multiplier", args.noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    check_range("sensitivity", args.sensitivity, 0.0, low_open=True)
    steps = check_count("steps", args.steps, minimum=1)
    report = pj.privacy_report(_event(args, args.noise_multiplier, sampling_prob), count=steps)
    return report.to_json(indent=1) if args.format == "json" else report.to_markdown()


def _event(args, noise_multiplier, sampling_prob):
    """The mechanism the options describe, for arrays of noise multipliers and probabilities."""
    import numpy as np

    import pldjax as pj

    scale = np.asarray(noise_multiplier, np.float64) * args.sensitivity
    noise = getattr(pj.noise, _NOISES[args.noise])(scale, args.sensitivity)
    if args.sampling == "none":
        if np.any(np.asarray(sampling_prob) != 1.0):
            raise ValueError("sampling_prob must be 1 (every record every step) with --sampling none")
        return pj.Event(noise, None, args.neighboring)
    return pj.Event(noise, pj.sampling.from_args(sampling_prob, args.sampling), args.neighboring)


def _evaluate(args, evaluate: str, noise_multiplier, sampling_prob, steps, target, **options):
    """epsilon (``evaluate``) or delta of the configurations: DP-SGD's accounting for the default
    parts, the event's otherwise."""
    import pldjax as pj
    from pldjax.core.validation import check_range
    from pldjax.kernels.compose import COARSER_GRID, CompositionTooWide

    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    check_range("sensitivity", args.sensitivity, 0.0, low_open=True)
    try:
        if args.noise == "gaussian" and args.sampling == "poisson" and args.sensitivity == 1.0:
            fn = pj.dpsgd_epsilon if evaluate == "epsilon" else pj.dpsgd_delta
            return fn(noise_multiplier, sampling_prob, steps, target,
                      neighboring=args.neighboring, **options)
        fn = pj.event_epsilon if evaluate == "epsilon" else pj.event_delta
        return fn(_event(args, noise_multiplier, sampling_prob), steps, target, **options)
    except CompositionTooWide as err:  # its remedy, a coarser Grid(step=...), is Python's
        raise ValueError(
            f"{str(err).removesuffix('; ' + COARSER_GRID)}. The command line cannot choose a "
            f"coarser grid: ask for fewer steps, or more noise (a larger noise multiplier or a "
            f"smaller sampling probability); or compute it in Python on a coarser grid "
            f"(pj.event_epsilon or pj.dpsgd_epsilon with grid=pj.Grid(step=...), or rtol=1e-2 "
            f"for the Gaussian)") from None


def _sampling_prob(args) -> float:
    """--sampling-prob, which --sampling none leaves out (every record every step)."""
    if args.sampling_prob is None:
        if args.sampling != "none":
            raise ValueError(f"--sampling-prob is required with --sampling {args.sampling} (or "
                             "pass --sampling none)")
        return 1.0
    return args.sampling_prob


def _single(args) -> str:
    from pldjax.core.precision import six_digits

    target = args.delta if args.command == "epsilon" else args.epsilon
    args.sampling_prob = _sampling_prob(args)
    bounds = [
        _evaluate(args, args.command, args.noise_multiplier, args.sampling_prob, args.steps,
                  target, pessimistic=pessimistic)
        for pessimistic in (True, False)
    ]
    _check_numbers(bounds, lambda bad: "for these arguments")
    return (f"{args.command} = {six_digits(bounds[0], up=True)}  "
            f"(optimistic {six_digits(bounds[1], up=False)})")


def _read_configs(path: str):
    import numpy as np

    # utf-8-sig: a byte-order mark (spreadsheets write one) is not part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        try:
            rows = list(reader)
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x}: "
                             f"{err.reason})") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    header = list(reader.fieldnames)
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:  # csv.DictReader keeps the last of them and drops the others silently
        raise ValueError(f"{path}: column {repeated[0]!r} appears {header.count(repeated[0])} "
                         f"times in the header; each column must appear once")
    targets = [name for name in ("delta", "epsilon") if name in header]
    missing = [c for c in ("noise_multiplier", "sampling_prob", "steps") if c not in header]
    if missing or len(targets) != 1:
        raise ValueError(
            f"{path}: needs columns noise_multiplier, sampling_prob, steps and exactly one of "
            f"delta, epsilon; found {header}"
        )

    from pldjax.core.validation import check_range

    def cell(number: int, row: dict, name: str) -> float:
        where = f"{path}: row {number} (line {number + 1}), column {name}"
        text = row.get(name)
        if text is None or not text.strip():
            raise ValueError(f"{where}: missing value")
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{where}: not a number: {text!r}") from None
        low, high, options = _COLUMN_RANGES[name]
        try:
            check_range(name, value, low, high, **options)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if name == "steps" and not value.is_integer():
            raise ValueError(f"{where}: steps must be a whole number >= 0, got {text!r}")
        return value

    names = ("noise_multiplier", "sampling_prob", "steps", targets[0])
    for number, row in enumerate(rows, start=1):
        if None in row:  # csv.DictReader's key for fields beyond the header
            raise ValueError(f"{path}: row {number} (line {number + 1}) has more fields than the "
                             f"header ({len(header)})")
    columns = [np.array([cell(i, r, name) for i, r in enumerate(rows, start=1)])
               for name in names]
    return rows, header, targets[0], columns


def _sweep(args) -> int:
    import numpy as np


    rows, header, target_name, (sigma, q, steps, target) = _read_configs(args.configs)
    result_name = "epsilon" if target_name == "delta" else "delta"
    progress = len(rows) > PROGRESS_ROWS
    upper = _evaluate(args, result_name, sigma, q, steps, target, progress=progress)
    lower = _evaluate(args, result_name, sigma, q, steps, target, pessimistic=False)
    _check_numbers([upper, lower], lambda bad: (
        f"in rows {(np.nonzero(bad.any(axis=0))[0] + 1)[:10].tolist()} of {args.configs}"))
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
    from pldjax.core.compilation import enable_compilation_cache

    enable_compilation_cache()
    try:
        if args.command == "sweep":
            return _sweep(args)
        print(_report(args) if args.command == "report" else _single(args))
    except ComputationError as err:
        print(f"pldjax: error: {err}", file=sys.stderr)
        return 1
    except (ValueError, OSError, csv.Error) as err:
        print(f"pldjax: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
