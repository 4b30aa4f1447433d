"""The command line at the edges: bad arguments and bad CSV rows give a clear message naming the
argument (and row and column) with exit code 2; a NaN result is never printed (exit code 1)."""

import math

import numpy as np
import pytest

import pldjax as pj
from pldjax.cli import main

HEADER = "noise_multiplier,sampling_prob,steps,delta\n"

#: The DP-SGD options every epsilon or delta command needs, at values that change nothing.
ONE_STEP = ["--steps", "1", "--sampling-prob", "1"]


@pytest.mark.parametrize(("args", "name"), [
    (["epsilon", "--noise-multiplier", "nan", *ONE_STEP, "--delta", "1e-5"], "noise_multiplier"),
    (["epsilon", "--noise-multiplier", "inf", *ONE_STEP, "--delta", "1e-5"], "noise_multiplier"),
    (["epsilon", "--noise-multiplier", "-1", *ONE_STEP, "--delta", "1e-5"], "noise_multiplier"),
    (["epsilon", "--noise-multiplier", "0", *ONE_STEP, "--delta", "1e-5"], "noise_multiplier"),
    (["epsilon", "--noise-multiplier", "1", *ONE_STEP, "--delta", "nan"], "delta"),
    (["epsilon", "--noise-multiplier", "1", *ONE_STEP, "--delta", "inf"], "delta"),
    (["epsilon", "--noise-multiplier", "1", *ONE_STEP, "--delta", "-0.5"], "delta"),
    (["epsilon", "--noise-multiplier", "1", *ONE_STEP, "--delta", "1.5"], "delta"),
    (["epsilon", "--noise-multiplier", "1", "--steps", "1", "--sampling-prob", "nan", "--delta", "1e-5"],
     "sampling_prob"),
    (["epsilon", "--noise-multiplier", "1", "--steps", "1", "--sampling-prob=-inf", "--delta", "1e-5"],
     "sampling_prob"),
    (["epsilon", "--noise-multiplier", "1", "--steps", "1", "--sampling-prob", "2", "--delta", "1e-5"],
     "sampling_prob"),
    (["epsilon", "--noise-multiplier", "1", "--sampling-prob", "1", "--steps", "-5", "--delta", "1e-5"],
     "steps"),
    (["delta", "--noise-multiplier", "1", *ONE_STEP, "--epsilon", "nan"], "epsilon"),
    (["delta", "--noise-multiplier", "1", *ONE_STEP, "--epsilon=-inf"], "epsilon"),
    (["delta", "--noise-multiplier", "1", *ONE_STEP, "--epsilon", "-1"], "epsilon"),
])
def test_bad_arguments_exit_2_naming_them(capsys, args, name):
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert name in captured.err


@pytest.mark.parametrize("args", [
    ["epsilon", "--noise-multiplier", "1", "--sampling-prob", "1", "--steps", "nan", "--delta", "1e-5"],
    ["epsilon", "--noise-multiplier", "1", "--sampling-prob", "1", "--steps", "1e3", "--delta", "1e-5"],
    ["epsilon", "--noise-multiplier", "1", *ONE_STEP],
])
def test_unparsable_arguments_exit_2(capsys, args):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().out == ""


def test_nan_result_is_never_printed(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(pj, "dpsgd_epsilon", lambda *a, **k: np.full(np.shape(a[0]), np.nan))
    assert main(["epsilon", "--noise-multiplier", "1", "--sampling-prob", "1", "--steps", "1",
                 "--delta", "1e-5"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "NaN" in captured.err
    configs = tmp_path / "configs.csv"
    configs.write_text(HEADER + "1.0,0.05,30,1e-5\n2.0,0.1,5,1e-6\n")
    out = tmp_path / "out.csv"
    assert main(["sweep", str(configs), "--output", str(out)]) == 1
    assert "rows [1, 2]" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("rows", "message"), [
    ("1.0,0.05,30\n", "row 1 (line 2), column delta: missing value"),
    ("1.0,0.05,30,1e-5\n2.0,0.1\n", "row 2 (line 3), column steps: missing value"),
    ("1.0,,30,1e-5\n", "row 1 (line 2), column sampling_prob: missing value"),
    ("1.0,0.05,thirty,1e-5\n", "row 1 (line 2), column steps: not a number: 'thirty'"),
    ("nan,0.05,30,1e-5\n", "row 1 (line 2), column noise_multiplier: noise_multiplier must be"),
    ("1.0,0.05,30,1e-5\n1.0,-0.05,30,1e-5\n", "row 2 (line 3), column sampling_prob"),
    ("1.0,0.05,inf,1e-5\n", "row 1 (line 2), column steps"),
    ("1.0,0.05,2.5,1e-5\n", "row 1 (line 2), column steps: steps must be a whole number"),
    ("1.0,0.05,30,1e-5,7\n", "row 1 (line 2) has more fields than the header (4)"),
])
def test_bad_sweep_rows_name_row_and_column(tmp_path, capsys, rows, message):
    configs = tmp_path / "configs.csv"
    configs.write_text(HEADER + rows)
    assert main(["sweep", str(configs)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_sweep_refuses_a_repeated_column_naming_it(tmp_path, capsys):
    """A repeated column was accepted, the last one silently winning (steps 1000, not 10)."""
    configs = tmp_path / "configs.csv"
    configs.write_text("noise_multiplier,sampling_prob,steps,delta,steps\n1.0,0.01,10,1e-5,1000\n")
    assert main(["sweep", str(configs)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "column 'steps' appears 2 times" in captured.err


@pytest.mark.slow
def test_sweep_reads_a_header_with_a_byte_order_mark(tmp_path, capsys):
    """A UTF-8 byte-order mark (as spreadsheets write) was read into the first column's name,
    which was then reported missing."""
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_text(HEADER + "1.0,0.05,30,1e-5\n", encoding="utf-8")
    marked.write_text(HEADER + "1.0,0.05,30,1e-5\n", encoding="utf-8-sig")
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    assert main(["sweep", str(plain)]) == 0
    expected = capsys.readouterr().out
    assert main(["sweep", str(marked)]) == 0
    assert capsys.readouterr().out == expected


def test_sweep_missing_or_unreadable_file(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "absent.csv")]) == 2
    assert "absent.csv" in capsys.readouterr().err
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER)
    assert main(["sweep", str(empty)]) == 2
    assert "no rows" in capsys.readouterr().err
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 10)
    assert main(["sweep", str(binary)]) == 2
    assert "binary.csv: not UTF-8 text" in capsys.readouterr().err
    latin = tmp_path / "latin.csv"  # a decoding error past the header also names the file
    latin.write_bytes(HEADER.encode() + b"1.0,0.05,30,1e-5\n" * 2000 + b"1.0,0.05,30,1e-5\xe9\n")
    assert main(["sweep", str(latin)]) == 2
    assert "latin.csv: not UTF-8 text (byte 0xe9" in capsys.readouterr().err


@pytest.mark.parametrize(("sigma", "q"), [pytest.param("1e300", "0.5", marks=pytest.mark.slow),
                                        ("1e300", "1e-300"),
                                        ("1e-300", "1e-300")])
def test_extreme_arguments_print_no_runtime_warnings(capsys, sigma, q):
    """Sorting configurations divided a loss spread that underflows to 0: "RuntimeWarning: divide
    by zero encountered in divide" and its like reached standard error."""
    import warnings

    args = ["epsilon", "--noise-multiplier", sigma, "--sampling-prob", q, "--steps", "1",
            "--delta", "1e-5"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("epsilon = ") and captured.err == ""


@pytest.mark.parametrize("args", [
    ["--steps", "1000000000000"],
    ["--noise", "laplace", "--sampling", "none", "--steps", "100000000000"],
])
def test_compositions_too_wide_say_what_a_command_line_user_can_do(capsys, args):
    """The message suggested Grid(step=...), which the command line cannot set."""
    base = ["epsilon", "--noise-multiplier", "1", "--delta", "1e-5"]
    if "--sampling-prob" not in args and "none" not in args:
        base += ["--sampling-prob", "0.01"]
    assert main(base + args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert "steps" in captured.err and "use a coarser Grid" not in captured.err
    assert "The command line cannot choose a coarser grid: ask for fewer steps" in captured.err


# -- the mechanism's parts ------------------------------------------------------------------------
def test_parts_select_the_event(capsys, tmp_path):
    args = ["--noise-multiplier", "2", "--sampling", "none", "--steps", "10", "--delta", "1e-5"]
    assert main(["epsilon", "--noise", "laplace", *args]) == 0
    printed = capsys.readouterr().out
    event = pj.Event(pj.noise.Laplace(2.0))
    expected = pj.event_epsilon(event, 10, 1e-5)
    shown = float(printed.split()[2])
    assert expected <= shown <= expected * (1 + 1e-5)  # six digits, rounded up (see below)
    configs = tmp_path / "configs.csv"
    configs.write_text(HEADER + "2.0,1.0,10,1e-5\n")
    out = tmp_path / "out.csv"
    assert main(["sweep", str(configs), "--output", str(out), "--noise", "laplace",
                 "--sampling", "none", "--sensitivity", "3"]) == 0
    [row] = out.read_text().splitlines()[1:]
    # the same loss (sensitivity / scale = 1/2), so the same epsilon
    assert float(row.split(",")[4]) == pj.event_epsilon(pj.Event(pj.noise.Laplace(6.0, 3.0)), 10,
                                                         1e-5) == expected


@pytest.mark.parametrize(("command", "target", "truth"), [
    # one run of the discrete Laplace (scale 1, sensitivity 1): its loss is +1 with probability
    # 1 / (1 + e^-1), else -1, so delta(eps) = (1 - e^(eps - 1)) / (1 + e^-1) for eps in [0, 1)
    # (the truth rounded to nearest six digits, 0.999986 and 0.433832, lies below it)
    ("epsilon", ["--delta", "1e-5"], 1 + math.log1p(-1e-5 * (1 + math.exp(-1)))),
    pytest.param("delta", ["--epsilon", "0.1"], -math.expm1(0.1 - 1) / (1 + math.exp(-1)),
                 marks=pytest.mark.slow),
])
def test_printed_values_are_rounded_to_their_safe_side(capsys, command, target, truth):
    """Six digits printed: the pessimistic value rounded up, the optimistic one down, so the
    printed numbers still bound the truth."""
    args = ["--noise-multiplier", "1", "--sampling", "none", "--steps", "1", *target,
            "--noise", "discrete_laplace"]
    assert main([command, *args]) == 0
    words = capsys.readouterr().out.split()
    upper, lower = float(words[2]), float(words[4].rstrip(")"))
    assert lower <= truth <= upper <= truth * (1 + 1e-5)


@pytest.mark.parametrize("value", [6.187906790056493, 0.1, 1e-300, 123456789.0, 9.9999996,
                                   5e-324, 1.0])
def test_six_digits_bound_their_value(value):
    from decimal import Decimal

    from pldjax.core.precision import six_digits

    up, down = six_digits(value, up=True), six_digits(value, up=False)
    assert Decimal(down) <= Decimal(value) <= Decimal(up)  # exact decimal comparisons
    assert float(up) <= value * (1 + 1e-5) and float(down) >= value * (1 - 1e-5)


@pytest.mark.parametrize(("args", "message"), [
    (["--sampling", "fixed_batch", "--sampling-prob", "0.1"], "replace_one"),
    (["--sampling", "none", "--sampling-prob", "0.1"], "sampling_prob must be 1"),
    (["--noise", "discrete_laplace", "--sensitivity", "1.5"], "sensitivity"),
    (["--sensitivity", "0"], "sensitivity"),
])
def test_parts_that_do_not_fit_exit_2(capsys, args, message):
    defaults = [] if "--sampling-prob" in args else ["--sampling-prob", "1"]
    assert main(["epsilon", "--noise-multiplier", "1", "--steps", "1", "--delta", "1e-5",
                 *defaults, *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err


def test_python_dash_m_runs_the_command_line():
    """``python -m pldjax`` is the ``pldjax`` command (it had no ``__main__``)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pldjax", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "epsilon" in done.stdout


def test_steps_and_sampling_prob_have_no_silent_default(capsys):
    """A DP-SGD run has a number of steps and a sampling probability: neither defaults to 1."""
    with pytest.raises(SystemExit) as exit_info:
        main(["epsilon", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--delta", "1e-5"])
    assert exit_info.value.code == 2 and "--steps" in capsys.readouterr().err
    assert main(["epsilon", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"]) == 2
    assert "--sampling-prob is required" in capsys.readouterr().err
    assert main(["epsilon", "--noise-multiplier", "1", "--steps", "10", "--sampling", "none",
                 "--delta", "1e-5"]) == 0


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["epsilon", "--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert "default add_remove" in text and "default gaussian" in text


def test_report_prints_markdown_or_json_rounded_to_the_safe_side(capsys):
    import json

    args = ["report", "--noise-multiplier", "1", "--sampling-prob", "0.01", "--steps", "100"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "| attacker FPR | TPR lower | TPR upper |" in text and "runs: 100" in text
    assert main([*args, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = text.splitlines().index("| delta | epsilon lower | epsilon upper |") + 2 + 3  # 1e-5
    lower, upper = (float(v) for v in text.splitlines()[row].strip("|").split("|")[1:])
    assert data["deltas"][3] == 1e-5
    assert lower <= data["epsilon_lower"][3] and data["epsilon_upper"][3] <= upper


@pytest.mark.parametrize(("args", "name"), [
    (["--steps", "0", "--sampling-prob", "0.01"], "steps"),
    (["--steps", "10", "--sampling-prob", "1.5"], "sampling_prob"),
    (["--steps", "10"], "--sampling-prob"),
])
def test_bad_report_arguments_exit_2_naming_them(capsys, args, name):
    assert main(["report", "--noise-multiplier", "1", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and name in captured.err
