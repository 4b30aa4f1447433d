"""Composed Gaussian mechanisms: pldjax against dp-accounting and prv-accountant, with the exact value.

For each (sigma, T): epsilon at delta = 1e-5 of the T-fold composition of the Gaussian mechanism
of noise sigma (sensitivity 1) from pldjax (pessimistic and optimistic), dp-accounting's PLD at
value discretization 1e-3 and 1e-4 (pessimistic connect-the-dots and optimistic) and
prv-accountant (upper and lower bound, eps_error 0.01), next to the exact value (the composition
is G_mu with mu = sqrt(T) / sigma; its epsilon by bisection in mpmath at 40 digits). Each
measurement runs in a fresh process: the first call (compilation included), a second (warm) call,
and the process's peak resident memory. dp-accounting is skipped where its grid would exceed
3e7 points (about (mu^2 / 2 + 20 mu) / interval).
"""

from __future__ import annotations

from bench import harness

QUICK = "sigma 1, T = 1 and 100"
DELTA = 1e-5
DP_ACCOUNTING_MAX_POINTS = 3e7


def add_arguments(parser) -> None:
    parser.add_argument("--sigmas", default="0.5,1,2,5", help="noise multipliers")
    parser.add_argument("--counts", default="1,100,1000,10000,100000", help="numbers of compositions T")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per fresh process")


# -- the calls (fresh processes build them by name): each returns (upper, lower) -------------------
def pldjax_call(sigma, count):
    import pldjax as pj

    def call():
        up = float(pj.gaussian(sigma).self_compose(count).epsilon(DELTA))
        lo = float(pj.gaussian(sigma, pessimistic=False).self_compose(count).epsilon(DELTA))
        return up, lo

    return call


def dp_accounting_call(sigma, count, interval):
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    def call():
        out = []
        for pessimistic in (True, False):
            pld = pld_lib.from_gaussian_mechanism(standard_deviation=sigma,
                                                  value_discretization_interval=interval,
                                                  pessimistic_estimate=pessimistic)
            out.append(pld.self_compose(count).get_epsilon_for_delta(DELTA))
        return tuple(out)

    return call


def prv_call(sigma, count):
    from prv_accountant import PRVAccountant
    from prv_accountant.privacy_random_variables import GaussianMechanism

    def call():
        acc = PRVAccountant(prvs=[GaussianMechanism(noise_multiplier=sigma)], max_self_compositions=[count],
                            eps_error=0.01, delta_error=DELTA / 1000)
        low, _, up = acc.compute_epsilon(delta=DELTA, num_self_compositions=[count])
        return float(up), float(low)

    return call


# label -> (library, setting, import timed apart, factory, its extra kwargs)
METHODS = {
    "pldjax": ("pldjax", "default grid", "import pldjax", "pldjax_call", {}),
    "dpa 1e-3": ("dp-accounting", "PLD 1e-3", "from dp_accounting.pld import privacy_loss_distribution",
                 "dp_accounting_call", {"interval": 1e-3}),
    "dpa 1e-4": ("dp-accounting", "PLD 1e-4", "from dp_accounting.pld import privacy_loss_distribution",
                 "dp_accounting_call", {"interval": 1e-4}),
    "prv": ("prv-accountant", "eps_error 0.01", "import prv_accountant", "prv_call", {}),
}


def run(args, report) -> None:
    sigmas = [1.0] if args.quick else [float(s) for s in args.sigmas.split(",")]
    counts = [1, 100] if args.quick else [int(float(c)) for c in args.counts.split(",")]
    rows = report.table(["sigma", "T", "library", "setting", "eps upper", "eps lower", "exact",
                         "upper / exact - 1", "lower / exact - 1", "first s", "warm s", "peak MB"])
    for sigma in sigmas:
        for count in counts:
            mu = count**0.5 / sigma
            exact = harness.gaussian_epsilon_exact(mu, DELTA)
            for library, setting, imports, factory, kwargs in METHODS.values():
                head = [f"{sigma:g}", f"{count:,}", library, setting]
                interval = kwargs.get("interval")
                if interval and (mu * mu / 2 + 20 * mu) / interval > DP_ACCOUNTING_MAX_POINTS:
                    rows.append(head + ["skipped: grid too large"] + [None] * 7)
                    continue
                harness.log(f"composed_gaussians: sigma={sigma:g} T={count} {library} {setting}")
                res = harness.fresh_process("bench.composed_gaussians", factory,
                                            dict(sigma=sigma, count=count, **kwargs), imports=imports,
                                            calls=2, timeout=args.timeout)
                if "error" in res:
                    rows.append(head + [res["error"]] + [None] * 7)
                    continue
                upper, lower = res["value"]
                rows.append(head + [harness.fmt(upper, ".5f"), harness.fmt(lower, ".5f"), f"{exact:.5f}",
                                    harness.fmt(None if upper is None else upper / exact - 1, "+.2e"),
                                    harness.fmt(None if lower is None else lower / exact - 1, "+.2e"),
                                    f"{res['wall_s'][0]:.3f}", f"{res['wall_s'][1]:.3f}",
                                    f"{res['peak_mb']:.0f}"])
                report.flush()
    report.text(f"delta = {DELTA:g}. first s: the first call in a fresh process "
                f"({harness.compilation_note()}); warm s: a second call there; peak MB: that process's "
                "peak RSS. A sound upper bound has "
                "upper / exact - 1 >= 0, a sound lower bound lower / exact - 1 <= 0.")
