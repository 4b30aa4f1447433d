"""Calibrating DP-SGD's noise multiplier: pldjax against dp-accounting and Opacus.

For each target (epsilon, q, T) at delta = 1e-5, the smallest noise multiplier sigma meeting it,
from: pldjax ``pj.calibrate_noise_multiplier`` (bisection on a batched epsilon, relative bracket
1e-4), and all targets in one vectorized call; dp-accounting's ``calibrate_dp_mechanism``
(bisection, absolute tolerance 1e-3, bracket LowerEndpointAndGuess(0.1, 1.0)) with its PLD
accountant (discretization 1e-4), its RDP accountant and pldjax's adapter
``pj.dp_accounting.PLDAccountant``; Opacus's ``get_noise_multiplier`` (RDP and PRV accountants,
until epsilon is within 0.01 of the target) where Opacus and torch import. Each method runs in a
fresh process per target: import apart, a first call (compilation included) and a second. The
epsilon pldjax computes for each returned sigma (``pj.dpsgd_epsilon``, pessimistic, one
configuration per call) makes the answers comparable: a sigma whose epsilon exceeds the target is
too small by that upper bound.
"""

from __future__ import annotations

import os
import sys

from bench import harness

QUICK = "one small target (1, 0.01, 100), without dp-accounting's PLD (a minute on 2 cores)"
DELTA = 1e-5
FULL = [(1.0, 0.01, 1000), (3.0, 0.01, 10000), (8.0, 0.1, 1000)]
QUICK_TARGETS = [(1.0, 0.01, 100)]
DPA_TOL = 1e-3
DPA_BRACKET = (0.1, 1.0)
OPACUS_TOL = 0.01

# method -> (library, setting, tolerance, calls per process, import timed apart)
METHODS = {
    "pldjax": ("pldjax", "calibrate_noise_multiplier", "rel. 1e-4 on sigma", 2, "import pldjax"),
    "pldjax_dpa": ("pldjax", "adapter + dp-accounting's calibrate_dp_mechanism", f"abs. {DPA_TOL:g} on sigma",
                   2, "import dp_accounting, pldjax"),
    "dpa_pld": ("dp-accounting", "PLD (1e-4) + calibrate_dp_mechanism", f"abs. {DPA_TOL:g} on sigma", 1,
                "import dp_accounting"),
    "dpa_rdp": ("dp-accounting", "RDP + calibrate_dp_mechanism", f"abs. {DPA_TOL:g} on sigma", 2,
                "import dp_accounting"),
    "opacus_rdp": ("opacus", "get_noise_multiplier(rdp)", f"eps within {OPACUS_TOL:g}", 2,
                   "import opacus.accountants"),
    "opacus_prv": ("opacus", "get_noise_multiplier(prv)", f"eps within {OPACUS_TOL:g}", 2,
                   "import opacus.accountants"),
}


def add_arguments(parser) -> None:
    parser.add_argument("--opacus-path", default=os.environ.get("OPACUS_PATH"),
                        help="a directory put on sys.path for Opacus and torch (e.g. a pip --target)")
    parser.add_argument("--no-opacus", action="store_true")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per fresh process")


# -- the call (fresh processes build it by name) ----------------------------------------------------
def calibrate(method, configs):
    """A call returning {"sigmas": [...], "evals": epsilon evaluations in that call}."""
    evals = [0]
    if method in ("pldjax", "pldjax_vec"):
        import numpy as np

        import pldjax as pj
        from bench import internals

        if internals.available("calibrate", "_epsilons"):  # count the bisection's batched evaluations
            inner = internals.calibrate._epsilons

            def counted(*a, **k):
                evals[0] += 1
                return inner(*a, **k)

            internals.calibrate._epsilons = counted
        else:
            evals[0] = None
        eps, q, steps = (np.array(c, float) for c in zip(*configs, strict=True))
        if method == "pldjax":
            eps, q, steps = eps[0], q[0], steps[0]

        def run():
            return np.atleast_1d(pj.calibrate_noise_multiplier(eps, DELTA, q, steps)).tolist()
    elif method in ("pldjax_dpa", "dpa_pld", "dpa_rdp"):
        import dp_accounting as dpa

        if method == "pldjax_dpa":
            import pldjax as pj

            make_accountant = pj.dp_accounting.PLDAccountant
        elif method == "dpa_pld":
            from dp_accounting.pld import PLDAccountant as make_accountant
        else:
            from dp_accounting.rdp import RdpAccountant as make_accountant
        ((target, q, steps),) = configs

        def make_event(sigma):
            evals[0] += 1
            inner = dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
            return dpa.SelfComposedDpEvent(inner, int(steps))

        def run():
            return [float(dpa.calibrate_dp_mechanism(make_accountant, make_event, target, DELTA,
                                                     dpa.LowerEndpointAndGuess(*DPA_BRACKET), tol=DPA_TOL))]
    elif method in ("opacus_rdp", "opacus_prv"):
        import warnings

        warnings.filterwarnings("ignore")
        from opacus.accountants import PRVAccountant, RDPAccountant
        from opacus.accountants.utils import get_noise_multiplier

        for cls in (PRVAccountant, RDPAccountant):
            inner_get = cls.get_epsilon

            def get_epsilon(self, *a, _inner=inner_get, **k):
                evals[0] += 1
                return _inner(self, *a, **k)

            cls.get_epsilon = get_epsilon
        ((target, q, steps),) = configs

        def run():
            return [float(get_noise_multiplier(target_epsilon=target, target_delta=DELTA, sample_rate=q,
                                               steps=int(steps), accountant=method.split("_")[1],
                                               epsilon_tolerance=OPACUS_TOL))]
    else:
        raise ValueError(method)

    def call():
        evals[0] = 0 if evals[0] is not None else None
        return dict(sigmas=run(), evals=evals[0])

    return call


def _opacus_versions(path):
    """(versions, None) where Opacus and torch import in a fresh process, else (None, why)."""
    import subprocess

    code = "import torch, opacus; print(torch.__version__, opacus.__version__)"
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=harness.worker_env(extra_path=path))
    except subprocess.TimeoutExpired:
        return None, "import timed out"
    if res.returncode:
        return None, (res.stderr.strip().splitlines() or ["import failed"])[-1]
    torch_v, opacus_v = res.stdout.split()
    return dict(torch=torch_v, opacus=opacus_v), None


def _fresh(method, configs, calls, args):
    return harness.fresh_process("bench.calibration", "calibrate", dict(method=method, configs=configs),
                                 imports=METHODS.get(method, METHODS["pldjax"])[4], calls=calls,
                                 timeout=args.timeout, extra_path=args.opacus_path, keep_values=True)


def run(args, report) -> None:
    import numpy as np

    import pldjax as pj

    configs = QUICK_TARGETS if args.quick else FULL
    methods = [m for m in METHODS if not (args.quick and m == "dpa_pld")]
    opacus_note = None
    if args.no_opacus:
        opacus_note = "not run (--no-opacus)"
    else:
        versions, why = _opacus_versions(args.opacus_path)
        if versions:
            report.machine["versions"].update(versions)
        else:
            opacus_note = f"not run: Opacus or torch does not import ({why[:80]})"
    if opacus_note:
        methods = [m for m in methods if not m.startswith("opacus")]

    results = {}
    for config in configs:
        for method in methods:
            harness.log(f"calibration: {method} {config}")
            results[(config, method)] = _fresh(method, [list(config)], METHODS[method][3], args)
    harness.log(f"calibration: pldjax vectorized {configs}")
    vec = _fresh("pldjax_vec", [list(c) for c in configs], 2, args)

    rows = report.table(["target (eps, q, T)", "library", "setting", "tolerance", "sigma",
                         "sigma / pldjax's - 1", "pldjax eps of sigma", "<= target", "evals", "import s",
                         "first s", "second s"])
    for config in configs:
        target, q, steps = config
        label = f"({target:g}, {q:g}, {steps:g})"

        def sigma_of(method, config=config):
            res = results[(config, method)]
            return res["values"][0]["sigmas"][0] if "values" in res else float("nan")

        ref = sigma_of("pldjax")
        # one configuration per call: in a batched call the grid is shared by the batch
        eps = {s: float(pj.dpsgd_epsilon(s, q, steps, DELTA))
               for s in map(sigma_of, methods) if np.isfinite(s)}
        for method in methods:
            library, setting, tol, _, _ = METHODS[method]
            res = results[(config, method)]
            if "error" in res:
                rows.append([label, library, setting, tol, res["error"]] + [None] * 7)
                continue
            sigma, e = sigma_of(method), eps[sigma_of(method)]
            times = res["wall_s"] + [None]
            counts = [v["evals"] for v in res["values"]]
            rows.append([label, library, setting, tol, f"{sigma:.6f}", f"{sigma / ref - 1:+.2e}", f"{e:.6f}",
                         "yes" if e <= target else "NO",
                         None if None in counts else "/".join(map(str, counts)), f"{res['import_s']:.2f}",
                         f"{times[0]:.3f}", harness.fmt(times[1], ".3f")])
        if opacus_note:
            rows.append([label, "opacus", "get_noise_multiplier", None, opacus_note] + [None] * 7)
        report.flush()
    report.text("sigma / pldjax's - 1: against pldjax's calibrate_noise_multiplier; pldjax eps of sigma: "
                "pj.dpsgd_epsilon(sigma, q, T, delta), pessimistic; evals: epsilon evaluations in the "
                "first / second call (pldjax: batched dpsgd_epsilon calls of the bisection); first s: the "
                f"first call in a fresh process ({harness.compilation_note()}), second s: the same call "
                "again, import s apart; dp-accounting's PLD: one call only (no compilation to amortize).")

    if "error" in vec:
        report.text(f"pldjax, all targets in one vectorized call: {vec['error']}")
        return
    sigmas = vec["values"][0]["sigmas"]
    single_first = sum(results[(c, "pldjax")].get("wall_s", [np.nan])[0] for c in configs)
    single_second = sum(results[(c, "pldjax")].get("wall_s", [np.nan, np.nan])[1] for c in configs)
    report.heading("All targets in one vectorized call")
    rows = report.table(["target (eps, q, T)", "sigma", "vs the one-target call", "pldjax eps, alone",
                         "<= target", "pldjax eps, in the batch"])
    e_arr, q_arr, t_arr = (np.array(c, float) for c in zip(*configs, strict=True))
    batched = np.atleast_1d(pj.dpsgd_epsilon(np.array(sigmas), q_arr, t_arr, DELTA))
    for i, (target, q, steps) in enumerate(configs):
        s = sigmas[i]
        ref = results[((target, q, steps), "pldjax")].get("values", [{"sigmas": [np.nan]}])[0]["sigmas"][0]
        alone = float(pj.dpsgd_epsilon(s, q, steps, DELTA))
        rows.append([f"({target:g}, {q:g}, {steps:g})", f"{s:.6f}", f"{s / ref - 1:+.2e}", f"{alone:.6f}",
                     "yes" if alone <= target else "NO", f"{batched[i]:.6f}"])
    evals = vec["values"][0]["evals"]
    report.text(f"One vectorized calibrate_noise_multiplier call (fresh process): first "
                f"{vec['wall_s'][0]:.2f} s, second {vec['wall_s'][1]:.2f} s"
                + (f", {evals} batched evaluations" if evals else "")
                + f"; one target per process, summed: first {single_first:.2f} s, second "
                f"{single_second:.2f} s.")
