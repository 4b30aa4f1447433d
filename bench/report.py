"""Privacy reports: pldjax's whole report against what dp-accounting gives for the same numbers.

For each mechanism (G_1, and DP-SGD at sigma 1, q 0.01 over 1,000 and 10,000 steps, add/remove):
pldjax's ``pj.privacy_report`` (epsilon at 7 deltas and delta at 6 epsilons, the attacker's TPR at
7 FPRs, the GDP mu, Rényi DP at 7 orders, each bracketed by the pessimistic and optimistic PLD);
and dp-accounting's PLD (value discretization 1e-4, pessimistic connect-the-dots) giving what it
can of the same: the same epsilons and deltas, and the TPR bound of its 2026 releases
(``get_true_positive_rates``: the smallest over 3,001 (epsilon, delta) pairs, delta 0 and 1e-13
to 1 log-spaced, of min(e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR)); computed here from its
``get_epsilon_for_delta``, as dp-accounting 0.6 has no such method). Each runs in a fresh process:
a first call (compilation included) and a second (warm). The TPR at FPR 1e-3 is compared with the
exact value where there is one (G_1: Phi(Phi^-1(FPR) + 1)).
"""

from __future__ import annotations

from bench import harness

QUICK = "G_1 only"
FPR = 1e-3
DELTAS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8, 1e-10)
EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
#: mechanism label -> (noise multiplier, sampling probability, steps), or None for G_1
MECHANISMS = {"G_1": None, "DP-SGD 1, 0.01, 1,000": (1.0, 0.01, 1000),
              "DP-SGD 1, 0.01, 10,000": (1.0, 0.01, 10000)}


def add_arguments(parser) -> None:
    parser.add_argument("--timeout", type=float, default=900, help="seconds per fresh process")


# -- the calls (fresh processes build them by name): each returns (TPR upper, TPR lower, eps) -----
def pldjax_call(mechanism):
    import pldjax as pj

    def call():
        if mechanism is None:
            report = pj.privacy_report(pj.gdp(1.0), pj.gdp(1.0, pessimistic=False), fprs=[FPR])
        else:
            sigma, q, steps = mechanism
            report = pj.privacy_report(pj.dpsgd_event(sigma, q), count=steps, fprs=[FPR])
        return (float(report.tpr_upper[0]), float(report.tpr_lower[0]),
                float(report.epsilon_upper[list(report.deltas).index(1e-5)]))

    return call


def dp_accounting_call(mechanism):
    import numpy as np
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    def call():
        if mechanism is None:  # G_1: the Gaussian mechanism of noise 1
            pld = pld_lib.from_gaussian_mechanism(1.0, value_discretization_interval=1e-4)
        else:
            sigma, q, steps = mechanism
            pld = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q,
                                                  value_discretization_interval=1e-4)
            pld = pld.self_compose(steps)
        epsilons = [pld.get_epsilon_for_delta(d) for d in DELTAS]
        [pld.get_delta_for_epsilon(e) for e in EPSILONS]
        tpr = 1.0
        for delta in np.concatenate([[0.0], np.logspace(-13.0, 0.0, 3000)]):
            eps = pld.get_epsilon_for_delta(delta)
            tpr = min(tpr, np.exp(eps) * FPR + delta, 1.0 + (FPR + delta - 1.0) * np.exp(-eps))
        return float(tpr), None, float(epsilons[DELTAS.index(1e-5)])

    return call


METHODS = {
    "pldjax": ("pldjax", "privacy_report, default grid", "import pldjax", "pldjax_call"),
    "dpa": ("dp-accounting", "PLD 1e-4, 3,001 (eps, delta) pairs",
            "from dp_accounting.pld import privacy_loss_distribution", "dp_accounting_call"),
}


def run(args, report) -> None:
    from scipy.stats import norm

    names = ["G_1"] if args.quick else list(MECHANISMS)
    rows = report.table(["mechanism", "library", "setting", "TPR upper", "TPR lower", "exact TPR",
                         "upper - exact", "eps(1e-5) upper", "first s", "warm s"])
    for name in names:
        mechanism = MECHANISMS[name]
        exact = float(norm.cdf(norm.ppf(FPR) + 1.0)) if mechanism is None else None
        for library, setting, imports, factory in METHODS.values():
            harness.log(f"report: {name} {library}")
            res = harness.fresh_process("bench.report", factory, dict(mechanism=mechanism),
                                        imports=imports, calls=2, timeout=args.timeout)
            head = [name, library, setting]
            if "error" in res:
                rows.append(head + [res["error"]] + [None] * 6)
                continue
            upper, lower, eps = res["value"]
            rows.append(head + [f"{upper:.7f}", harness.fmt(lower, ".7f"), harness.fmt(exact, ".7f"),
                                harness.fmt(None if exact is None else upper - exact, "+.1e"),
                                f"{eps:.5f}", f"{res['wall_s'][0]:.3f}", f"{res['wall_s'][1]:.3f}"])
            report.flush()
    report.text(f"TPR at FPR {FPR:g}: the membership-inference attacker's true-positive rate; upper "
                "bounds from pessimistic PLDs, pldjax's lower bound from its optimistic PLD. "
                f"first s: the first call in a fresh process ({harness.compilation_note()}); warm "
                "s: a second call there. pldjax's call is the whole report (every number above, "
                "both bounds); dp-accounting's the epsilons, deltas and TPR bound it can give.")
