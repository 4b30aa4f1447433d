"""Calibrating DP-SGD's noise multiplier: pldjax against dp-accounting and opacus.

For each target (epsilon, q, T) at delta = 1e-5, the smallest noise multiplier sigma meeting the
target, from

* pldjax ``calibrate_noise_multiplier`` (bisection on a batched epsilon, relative bracket 1e-4),
  one target per fresh process (first call: compilation included; second call: warm), and all
  targets in one vectorized call (its own fresh process);
* dp-accounting's ``calibrate_dp_mechanism`` (bisection, absolute tol 1e-3, bracket
  LowerEndpointAndGuess(0.1, 1.0)) with its PLD accountant (default discretization 1e-4),
  its RDP accountant, and pldjax's dp_accounting adapter ``pj.dp_accounting.PLDAccountant``;
* opacus' ``get_noise_multiplier`` (RDP and PRV accountants; bisection until epsilon is within
  0.01 of the target), when opacus (and torch) can be imported.

Every method runs in a fresh subprocess (import time apart). The epsilon pldjax computes for
each returned sigma (``pj.dpsgd_epsilon``, pessimistic) makes the answers comparable: a sigma
whose pldjax epsilon exceeds the target is too small by pldjax's (upper-bound) accounting.

    python bench/calibration.py --quick          # 2 small targets (about 2-3 minutes on 2 cores)
    python bench/calibration.py                  # 3 targets (about 6-8 minutes on 2 cores)
    python bench/calibration.py --opacus-path /tmp/opacus_pkgs   # where opacus + torch live

Writes ``results/calibration_<backend>_<UTC stamp>.txt`` (table + machine) and ``.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
DELTA = 1e-5
FULL = [(1.0, 0.01, 1000), (3.0, 0.01, 10000), (8.0, 0.1, 1000)]
QUICK = [(1.0, 0.01, 1000), (3.0, 0.05, 300)]
DPA_TOL = 1e-3
DPA_BRACKET = (0.1, 1.0)
OPACUS_TOL = 0.01

# method -> (library, setting, tolerance, calls per process)
METHODS = {
    "pldjax": ("pldjax", "calibrate_noise_multiplier", "rel. 1e-4 on sigma", 2),
    "pldjax_dpa": ("pldjax", "adapter + dpa.calibrate_dp_mechanism", f"abs. {DPA_TOL:g} on sigma", 2),
    "dpa_pld": ("dp_accounting", "PLD (1e-4) + calibrate_dp_mechanism", f"abs. {DPA_TOL:g} on sigma", 1),
    "dpa_rdp": ("dp_accounting", "RDP + calibrate_dp_mechanism", f"abs. {DPA_TOL:g} on sigma", 2),
    "opacus_rdp": ("opacus", "get_noise_multiplier(rdp)", f"eps within {OPACUS_TOL:g}", 2),
    "opacus_prv": ("opacus", "get_noise_multiplier(prv)", f"eps within {OPACUS_TOL:g}", 2),
}


# -- worker (runs in a fresh process) -------------------------------------------------------------
def worker(spec):
    method, configs, calls = spec["method"], spec["configs"], spec["calls"]
    if spec.get("opacus_path"):
        sys.path.insert(0, spec["opacus_path"])
    evals = [0]
    t0 = time.perf_counter()
    if method in ("pldjax", "pldjax_vec"):
        import numpy as np

        import pldjax as pj
        import pldjax.calibrate as cal

        inner = cal._epsilons

        def counted(*a, **k):  # count the (batched) epsilon evaluations of the bisection
            evals[0] += 1
            return inner(*a, **k)

        cal._epsilons = counted
        eps, q, steps = (np.array(c, float) for c in zip(*configs, strict=True))
        if method == "pldjax":
            assert len(configs) == 1
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
        (target, q, steps), = configs

        def make_event(sigma):
            evals[0] += 1
            return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)),
                                           int(steps))

        def run():
            return [float(dpa.calibrate_dp_mechanism(make_accountant, make_event, target, DELTA,
                                                     dpa.LowerEndpointAndGuess(*DPA_BRACKET),
                                                     tol=DPA_TOL))]
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
        (target, q, steps), = configs

        def run():
            return [float(get_noise_multiplier(target_epsilon=target, target_delta=DELTA,
                                               sample_rate=q, steps=int(steps),
                                               accountant=method.split("_")[1],
                                               epsilon_tolerance=OPACUS_TOL))]
    else:
        raise ValueError(method)
    import_s = time.perf_counter() - t0
    times, sigmas, counts = [], None, []
    for _ in range(calls):
        evals[0] = 0
        t = time.perf_counter()
        sigmas = run()
        times.append(time.perf_counter() - t)
        counts.append(evals[0])
    return dict(import_s=import_s, times=times, sigmas=sigmas, evals=counts)


def fresh(method, configs, calls, args):
    spec = dict(method=method, configs=configs, calls=calls, opacus_path=args.opacus_path)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    start = time.perf_counter()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timeout after {args.timeout} s")
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT "):])
            out["process_s"] = time.perf_counter() - start
            return out
    tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(error=tail[:200])


# -- driver ---------------------------------------------------------------------------------------
def machine_info():
    import jax

    versions = {}
    for dist in ("pldjax", "jax", "jaxlib", "numpy", "dp-accounting", "opacus", "torch"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    try:
        commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", HERE, "status", "--porcelain", "--", "../pldjax"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += " (pldjax/ modified)" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = None
    return dict(platform=platform.platform(), processor=platform.processor() or platform.machine(),
                cpus=os.cpu_count(), python=platform.python_version(), jax_backend=jax.default_backend(),
                devices=[str(d) for d in jax.devices()], versions=versions, pldjax_commit=commit,
                load_average=os.getloadavg())


def opacus_versions(path):
    code = "import torch, opacus; print(torch.__version__, opacus.__version__)"
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=env)
    except subprocess.TimeoutExpired:
        return None, "import timed out"
    if res.returncode:
        return None, (res.stderr.strip().splitlines() or ["import failed"])[-1]
    torch_v, opacus_v = res.stdout.split()
    return dict(torch=torch_v, opacus=opacus_v), None


def table(header, rows):
    cells = [header] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in cells]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small targets")
    parser.add_argument("--opacus-path", default=os.environ.get("OPACUS_PATH"),
                        help="a directory to prepend to sys.path for opacus and torch (e.g. a pip --target)")
    parser.add_argument("--no-opacus", action="store_true")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per fresh process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return

    import numpy as np

    import pldjax as pj

    start = time.perf_counter()
    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    def log(text):
        print(f"[{time.perf_counter() - start:7.1f} s] {text}", file=sys.stderr, flush=True)

    machine = machine_info()
    configs = QUICK if args.quick else FULL
    methods = list(METHODS)
    opacus_note = None
    if args.no_opacus:
        opacus_note = "not run (--no-opacus)"
    else:
        versions, why = opacus_versions(args.opacus_path)
        if versions:
            machine["versions"].update(versions)
        else:
            opacus_note = f"not available ({why})"
    if opacus_note:
        methods = [m for m in methods if not m.startswith("opacus")]

    results = {}
    for config in configs:
        for method in methods:
            log(f"{method} {config}")
            results[(config, method)] = fresh(method, [list(config)], METHODS[method][3], args)
    log(f"pldjax vectorized {configs}")
    vec = fresh("pldjax_vec", [list(c) for c in configs], 2, args)

    header = ["target (eps, q, T)", "library", "setting", "tolerance", "sigma", "sigma/pldjax-1",
              "pldjax eps", "<= target", "evals", "import s", "first s", "second s"]
    rows = []
    record = dict(delta=DELTA, configs=configs, dpa_tol=DPA_TOL, dpa_bracket=DPA_BRACKET,
                  opacus_tol=OPACUS_TOL, quick=args.quick, rows=[], vectorized=vec)
    for config in configs:
        target, q, steps = config
        ref = results[(config, "pldjax")].get("sigmas", [float("nan")])[0]
        sigmas = [results[(config, m)].get("sigmas", [float("nan")])[0] for m in methods]
        # one configuration per call: in a batched call the grid is shared by the batch, so a
        # configuration's epsilon depends (slightly) on its batch-mates
        eps = {s: float(pj.dpsgd_epsilon(s, q, steps, DELTA)) for s in sigmas if np.isfinite(s)}
        for method, sigma in zip(methods, sigmas, strict=True):
            library, setting, tol, _ = METHODS[method]
            res = results[(config, method)]
            label = f"({target:g}, {q:g}, {steps:g})"
            if "error" in res:
                rows.append([label, library, setting, tol, res["error"]] + [None] * 7)
                record["rows"].append(dict(config=config, method=method, **res))
                continue
            times = res["times"] + [None]
            e = eps[sigma]
            rows.append([label, library, setting, tol, f"{sigma:.6f}", f"{sigma / ref - 1:+.2e}",
                         f"{e:.6f}", "yes" if e <= target else "NO", "/".join(map(str, res["evals"])),
                         f"{res['import_s']:.2f}", f"{times[0]:.3f}",
                         None if times[1] is None else f"{times[1]:.3f}"])
            record["rows"].append(dict(config=config, method=method, pldjax_epsilon=e, **res))
        if opacus_note:
            rows.append([f"({target:g}, {q:g}, {steps:g})", "opacus", "get_noise_multiplier", "",
                         opacus_note] + [None] * 7)

    say(f"Calibrating the noise multiplier of DP-SGD (Poisson-subsampled Gaussian, add/remove) at "
        f"delta = {DELTA:g}")
    say("sigma: the returned noise multiplier; pldjax eps: pj.dpsgd_epsilon(sigma, q, T, delta) "
        "(pessimistic; one configuration per call);")
    say("evals: epsilon evaluations per call (pldjax: batched dpsgd_epsilon calls of the bisection; "
        "first/second call);")
    say("first s: first call in a fresh process (pldjax: compilation included), second s: the same call "
        "again; import s apart")
    say(f"dp_accounting bracket LowerEndpointAndGuess{DPA_BRACKET}; dp_accounting PLD: one call only "
        f"(no compilation to amortize)")
    say()
    for line in table(header, rows):
        say(line)
    say()
    if "error" in vec:
        say(f"pldjax vectorized call: {vec['error']}")
    else:
        single_first = sum(results[(c, "pldjax")].get("times", [np.nan])[0] for c in configs)
        single_second = sum(results[(c, "pldjax")].get("times", [np.nan, np.nan])[1] for c in configs)
        say(f"pldjax, all {len(configs)} targets in one vectorized calibrate_noise_multiplier call (fresh "
            f"process): first {vec['times'][0]:.2f} s, second {vec['times'][1]:.2f} s, "
            f"{vec['evals'][0]} batched evaluations; one target per process, summed: first "
            f"{single_first:.2f} s, second {single_second:.2f} s")
        e_arr, q_arr, t_arr = (np.array(c, float) for c in zip(*configs, strict=True))
        batched = np.atleast_1d(pj.dpsgd_epsilon(np.array(vec["sigmas"]), q_arr, t_arr, DELTA))
        vec["pldjax_epsilon_single"], vec["pldjax_epsilon_batched"] = [], batched.tolist()
        for i, config in enumerate(configs):
            s = vec["sigmas"][i]
            ref = results[(config, "pldjax")].get("sigmas", [np.nan])[0]
            single = float(pj.dpsgd_epsilon(s, config[1], config[2], DELTA))
            vec["pldjax_epsilon_single"].append(single)
            say(f"  {config}: sigma {s:.6f} ({s / ref - 1:+.2e} vs the one-target call); pldjax eps of "
                f"it evaluated alone {single:.6f} ({'<=' if single <= config[0] else 'EXCEEDS'} target), "
                f"evaluated in the batch of all targets {batched[i]:.6f}")
    machine["load_average_end"] = os.getloadavg()
    record["machine"] = machine
    record["wall_s"] = time.perf_counter() - start
    v = machine["versions"]
    say()
    say(f"machine: {machine['processor']}, {machine['cpus']} CPUs, {machine['platform']}; python "
        f"{machine['python']}; jax {v['jax']} backend {machine['jax_backend']} {machine['devices']}; "
        f"dp-accounting {v['dp-accounting']}, opacus {v.get('opacus')}, torch {v.get('torch')}, numpy "
        f"{v['numpy']}; pldjax {machine['pldjax_commit']}; load average {machine['load_average'][0]:.1f} "
        f"at start, {machine['load_average_end'][0]:.1f} at end; {record['wall_s']:.0f} s in all")

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = os.path.join(HERE, "results", f"calibration_{machine['jax_backend']}_{stamp}")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    record["configs"] = [list(c) for c in configs]
    with open(base + ".json", "w") as fh:
        json.dump(record, fh, indent=1, default=str)
    with open(base + ".txt", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"saved {base}.txt and .json")


if __name__ == "__main__":
    main()
