"""Accountant APIs: pldjax next to dp-accounting's, Opacus's and prv-accountant's, on the same events.

Events (add/remove adjacency; Poisson-subsampled Gaussian unless noted): ``dpsgd`` sigma = 1,
q = 0.01, T = 10,000, delta = 1e-5 (a typical DP-SGD run); ``tiny-delta`` the same at delta =
1e-18 (where PRV's domain breaks); ``delta-1e-12`` sigma = 0.8, q = 0.1, T = 1,000, delta = 1e-12;
``large-eps`` sigma = 0.3, q = 0.5, T = 1,000, delta = 1e-5 (epsilon in the thousands);
``laplace`` 50 Laplace mechanisms of scale 2, delta = 1e-5 (not a DP-SGD event: Opacus's
accountants do not take it). Methods: pldjax through ``pj.dp_accounting.PLDAccountant`` and
``pj.opacus.PLDAccountant``; dp-accounting's PLD (discretization 1e-4) and RDP accountants;
Opacus's RDP and PRV accountants; prv-accountant's ``PRVAccountant`` (eps_error 0.01). Each
(event, method) runs in a fresh process with a time limit: import time apart, then the call
(compilation included). All are upper bounds on epsilon; "above tightest" is each one over the
smallest finite epsilon of its event, minus 1. A failure, NaN, negative epsilon or time-out is
recorded as such.
"""

from __future__ import annotations

from bench import harness

QUICK = "the laplace event only, 30 s per call"

EVENTS = {
    "dpsgd": dict(sigma=1.0, q=0.01, steps=10_000, delta=1e-5),
    "tiny-delta": dict(sigma=1.0, q=0.01, steps=10_000, delta=1e-18),
    "delta-1e-12": dict(sigma=0.8, q=0.1, steps=1_000, delta=1e-12),
    "large-eps": dict(sigma=0.3, q=0.5, steps=1_000, delta=1e-5),
    "laplace": dict(scale=2.0, steps=50, delta=1e-5),
}


def _dpa_event(event):
    import dp_accounting as dpa

    p = EVENTS[event]
    if event == "laplace":
        return dpa.LaplaceDpEvent(p["scale"])
    return dpa.PoissonSampledDpEvent(p["q"], dpa.GaussianDpEvent(p["sigma"]))


# -- the calls (fresh processes build them by name) -------------------------------------------------
def pldjax_dp_accounting(event):
    import pldjax as pj

    p, inner = EVENTS[event], _dpa_event(event)
    return lambda: pj.dp_accounting.PLDAccountant().compose(inner, p["steps"]).get_epsilon(p["delta"])


def pldjax_opacus(event):
    import pldjax as pj

    p = EVENTS[event]

    def call():
        acct = pj.opacus.PLDAccountant()
        acct.history = [(p["sigma"], p["q"], p["steps"])]
        return acct.get_epsilon(p["delta"])

    return call


def dp_accounting_pld(event):
    import dp_accounting as dpa

    p, inner = EVENTS[event], _dpa_event(event)
    return lambda: dpa.pld.PLDAccountant().compose(inner, p["steps"]).get_epsilon(p["delta"])


def dp_accounting_rdp(event):
    import dp_accounting as dpa

    p, inner = EVENTS[event], _dpa_event(event)
    return lambda: dpa.rdp.RdpAccountant().compose(inner, p["steps"]).get_epsilon(p["delta"])


def opacus(event, kind):
    import warnings

    warnings.simplefilter("ignore")
    from opacus.accountants import PRVAccountant, RDPAccountant

    p = EVENTS[event]

    def call():
        acct = RDPAccountant() if kind == "rdp" else PRVAccountant()
        acct.history = [(p["sigma"], p["q"], p["steps"])]
        return acct.get_epsilon(p["delta"])

    return call


def prv_accountant(event):
    from prv_accountant import LaplaceMechanism, PoissonSubsampledGaussianMechanism, PRVAccountant

    p = EVENTS[event]
    if event == "laplace":
        prv = LaplaceMechanism(mu=1 / p["scale"])
    else:
        prv = PoissonSubsampledGaussianMechanism(noise_multiplier=p["sigma"], sampling_probability=p["q"])

    def call():
        acct = PRVAccountant(prvs=prv, max_self_compositions=p["steps"], eps_error=0.01,
                             delta_error=p["delta"] / 1000)
        return acct.compute_epsilon(delta=p["delta"], num_self_compositions=[p["steps"]])[2]

    return call


# label -> (the modules it needs, import timed apart, factory, its extra kwargs, DP-SGD events only)
METHODS = {
    "pldjax (dp_accounting API)": ("dp_accounting", "import dp_accounting, pldjax", "pldjax_dp_accounting",
                                   {}, False),
    "pldjax (Opacus API)": ("opacus", "import pldjax; pldjax.opacus", "pldjax_opacus", {}, True),
    "dp-accounting PLD 1e-4": ("dp_accounting", "import dp_accounting", "dp_accounting_pld", {}, False),
    "dp-accounting RDP": ("dp_accounting", "import dp_accounting", "dp_accounting_rdp", {}, False),
    "Opacus RDP": ("opacus", "import opacus.accountants", "opacus", {"kind": "rdp"}, True),
    "Opacus PRV": ("opacus", "import opacus.accountants", "opacus", {"kind": "prv"}, True),
    "prv-accountant": ("prv_accountant", "import prv_accountant", "prv_accountant", {}, False),
}


def add_arguments(parser) -> None:
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per fresh process")
    parser.add_argument("--events", default=",".join(EVENTS), help="comma-separated events")


def run(args, report) -> None:
    events = ["laplace"] if args.quick else [e for e in args.events.split(",") if e]
    timeout = min(args.timeout, 30.0) if args.quick else args.timeout
    rows = report.table(["event", "method", "epsilon", "above tightest", "import s", "call s", "note"])
    for event in events:
        p = EVENTS[event]
        results = {}
        for label, (library, imports, factory, kwargs, dpsgd_only) in METHODS.items():
            if dpsgd_only and event == "laplace":
                results[label] = dict(note="n/a: Opacus accounts DP-SGD steps only")
            elif not harness.installed(library):
                results[label] = dict(note=f"not run: {library} is not installed")
            else:
                harness.log(f"accountants: {event}, {label}")
                results[label] = harness.fresh_process("bench.accountants", factory,
                                                       dict(event=event, **kwargs), imports=imports,
                                                       timeout=timeout)
        finite = [r["value"] for r in results.values()
                  if isinstance(r.get("value"), float) and r["value"] > 0]
        tightest = min(finite, default=None)
        for label, res in results.items():
            name = f"{event}: " + ", ".join(f"{k} {v:g}" for k, v in p.items())
            if "value" not in res:
                rows.append([name, label, None, None, None, None, res.get("note") or f"FAIL: {res['error']}"])
                continue
            eps = res["value"]
            note = ("inf or NaN" if eps is None else "NEGATIVE" if eps < 0 else None)
            above = None if eps is None or tightest is None or eps <= 0 else eps / tightest - 1
            rows.append([name, label, harness.fmt(eps, ".4f"), harness.fmt(above, ".1e"),
                         f"{res['import_s']:.2f}", f"{res['first_s']:.2f}", note])
        report.flush()
    report.text(f"call s: the call in a fresh process ({harness.compilation_note()}); import s: the "
                f"imports before it; time limit {timeout:g} s per process.")
