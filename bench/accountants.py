"""pldjax next to the accountants of dp_accounting, Opacus and prv-accountant, on the same events.

Events (add/remove adjacency, Poisson-subsampled Gaussian unless noted):

* ``dpsgd``: sigma = 1, q = 0.01, T = 10,000, delta = 1e-5 (a typical DP-SGD run);
* ``tiny-delta``: sigma = 1, q = 0.01, T = 10,000, delta = 1e-18 (where PRV's domain breaks);
* ``delta-1e-12``: sigma = 0.8, q = 0.1, T = 1,000, delta = 1e-12;
* ``large-eps``: sigma = 0.3, q = 0.5, T = 1,000, delta = 1e-5 (epsilon in the hundreds);
* ``laplace``: 50 Laplace mechanisms of scale 2, delta = 1e-5 (dp_accounting and pldjax only).

Methods: pldjax through ``pj.dp_accounting.PLDAccountant`` and ``pj.opacus.PLDAccountant``;
dp_accounting's PLD accountant (discretization 1e-4) and RDP accountant; Opacus's RDP and PRV
accountants; prv-accountant's ``PRVAccountant`` (eps_error 0.01). Each (event, method) runs in a
fresh process with a time limit (``--timeout``); the time is that of the call (import excluded,
compilation included: the first call of a session), and a failure, NaN, negative epsilon or a
time-out is recorded as such.

    pip install '.[bench]'
    python bench/accountants.py --timeout 120

Writes a table to stdout and bench/results/accountants_<backend>_<UTC time>.{json,txt}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

EVENTS = {
    "dpsgd": dict(sigma=1.0, q=0.01, steps=10_000, delta=1e-5),
    "tiny-delta": dict(sigma=1.0, q=0.01, steps=10_000, delta=1e-18),
    "delta-1e-12": dict(sigma=0.8, q=0.1, steps=1_000, delta=1e-12),
    "large-eps": dict(sigma=0.3, q=0.5, steps=1_000, delta=1e-5),
    "laplace": dict(scale=2.0, steps=50, delta=1e-5),
}

# each snippet defines eps from the event's parameters (names as in EVENTS)
METHODS = {
    "pldjax (dp_accounting API)": """
import dp_accounting as dpa, pldjax as pj
acct = pj.dp_accounting.PLDAccountant()
inner = dpa.LaplaceDpEvent(scale) if laplace else dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
eps = acct.compose(inner, steps).get_epsilon(delta)
""",
    "pldjax (Opacus API)": """
if laplace: raise NotImplementedError("Opacus accounts DP-SGD steps only")
import pldjax as pj
acct = pj.opacus.PLDAccountant(); acct.history = [(sigma, q, steps)]
eps = acct.get_epsilon(delta)
""",
    "dp_accounting PLD 1e-4": """
import dp_accounting as dpa
inner = dpa.LaplaceDpEvent(scale) if laplace else dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
eps = dpa.pld.PLDAccountant().compose(inner, steps).get_epsilon(delta)
""",
    "dp_accounting RDP": """
import dp_accounting as dpa
inner = dpa.LaplaceDpEvent(scale) if laplace else dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
eps = dpa.rdp.RdpAccountant().compose(inner, steps).get_epsilon(delta)
""",
    "Opacus RDP": """
if laplace: raise NotImplementedError("Opacus accounts DP-SGD steps only")
from opacus.accountants import RDPAccountant
acct = RDPAccountant(); acct.history = [(sigma, q, steps)]
eps = acct.get_epsilon(delta)
""",
    "Opacus PRV": """
if laplace: raise NotImplementedError("Opacus accounts DP-SGD steps only")
from opacus.accountants import PRVAccountant
acct = PRVAccountant(); acct.history = [(sigma, q, steps)]
eps = acct.get_epsilon(delta)
""",
    "prv-accountant": """
from prv_accountant import PRVAccountant, PoissonSubsampledGaussianMechanism, LaplaceMechanism
prv = LaplaceMechanism(mu=1 / scale) if laplace else PoissonSubsampledGaussianMechanism(
    noise_multiplier=sigma, sampling_probability=q)
acct = PRVAccountant(prvs=prv, max_self_compositions=steps, eps_error=0.01, delta_error=delta / 1000)
eps = acct.compute_epsilon(delta=delta, num_self_compositions=[steps])[2]
""",
}


def _run(method: str, event: str, timeout: float) -> dict:
    params = dict(EVENTS[event])
    params.setdefault("sigma", None)
    params.setdefault("q", None)
    params.setdefault("scale", None)
    params["laplace"] = event == "laplace"
    code = "\n".join([
        "import json, math, time, warnings",
        "warnings.simplefilter('ignore')",
        *(f"{k} = {v!r}" for k, v in params.items()),
        "start = time.perf_counter()",
        "try:",
        *("    " + line for line in METHODS[method].strip().splitlines()),
        "    out = dict(eps=float(eps))",
        "except NotImplementedError as e:",
        "    out = dict(na=str(e))",
        "except Exception as e:",
        "    out = dict(error=f'{type(e).__name__}: {str(e)[:80]}')",
        "out['seconds'] = time.perf_counter() - start",
        "print('RESULT' + json.dumps(out))",
    ])
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=os.environ)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout:.0f} s")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT"):
            return json.loads(line[len("RESULT"):])
    return dict(error=(proc.stderr.strip().splitlines() or ["no output"])[-1][:80])


def _cell(result: dict) -> str:
    if "na" in result:
        return "n/a"
    if "error" in result:
        return f"FAIL ({result['error']})"
    eps = result["eps"]
    flag = "  NEGATIVE" if eps < 0 else ("  NaN" if eps != eps else "")
    return f"{eps:.4f} ({result['seconds']:.2f} s){flag}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    parser.add_argument("--events", nargs="*", default=list(EVENTS))
    args = parser.parse_args()
    import jax

    backend = jax.default_backend()
    results = {}
    lines = [f"epsilon (seconds of the call, compilation included); {platform.machine()}, "
             f"{os.cpu_count()} cores, jax {jax.__version__} ({backend}), timeout {args.timeout:.0f} s"]
    for event in args.events:
        lines.append(f"\n{event}: {EVENTS[event]}")
        for method in METHODS:
            result = _run(method, event, args.timeout)
            results[f"{event} | {method}"] = result
            lines.append(f"  {method:28s} {_cell(result)}")
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(__file__).parent / "results" / f"accountants_{backend}_{stamp}"
    out.with_suffix(".json").write_text(json.dumps(dict(events=EVENTS, results=results), indent=1))
    out.with_suffix(".txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
