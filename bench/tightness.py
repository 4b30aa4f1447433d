"""Tightness of dpsgd_epsilon's default grid against dp-accounting on a spread of configurations.

For each DP-SGD configuration (sigma 0.5-3, q 1e-3-0.05, T 1e2-1e5, a few deltas; add/remove
adjacency): pldjax's optimistic and pessimistic epsilon (``pj.dpsgd_epsilon``, default grid) and
dp-accounting's PLD at value discretization 1e-4 (pessimistic, connect-the-dots), whether
pldjax's pessimistic value is within the goal (at most 1e-4 relative above dp-accounting's), and
the seconds of each call in this process (pldjax: a second, warm call; dp-accounting: its one
call).
"""

from __future__ import annotations

from bench import harness

QUICK = "the first two configurations"

#: (sigma, q, T, delta): the sweep's ranges (sigma 0.5-3, q 1e-3-0.05, T 1e2-1e5) and a few deltas.
CONFIGS = [(1, 0.01, 1e4, 1e-5), (0.5, 0.05, 100, 1e-5), (3, 1e-3, 1e5, 1e-10), (2, 0.02, 1000, 1e-6),
           (0.7, 0.004, 3e4, 1e-5), (0.5, 1e-3, 1e5, 1e-5), (3, 0.05, 100, 1e-5),
           (1, 0.05, 1e5, 1e-5), (0.5, 0.05, 1e5, 1e-5), (3, 0.001, 100, 1e-5),
           (1.5, 0.01, 1e3, 1e-7)]
GOAL = 1e-4


def add_arguments(parser) -> None:
    parser.add_argument("--goal", type=float, default=GOAL,
                        help="the largest relative excess of pldjax's pessimistic value allowed")


def run(args, report) -> None:
    import pldjax as pj

    configs = CONFIGS[:2] if args.quick else CONFIGS
    rows = report.table(["sigma", "q", "T", "delta", "pldjax optimistic", "pldjax pessimistic",
                         "dp-accounting 1e-4", "pessimistic / dp-accounting - 1", "within goal",
                         "pldjax s (warm)", "dp-accounting s"])
    for sigma, q, steps, delta in configs:
        steps = int(steps)
        harness.log(f"tightness: sigma={sigma} q={q} T={steps} delta={delta}")
        upper = float(pj.dpsgd_epsilon(sigma, q, steps, delta))
        lower = float(pj.dpsgd_epsilon(sigma, q, steps, delta, pessimistic=False))
        seconds = harness.timed(lambda s=sigma, q=q, t=steps, d=delta: pj.dpsgd_epsilon(s, q, t, d))[0]
        peer_s, reference = harness.timed(
            lambda s=sigma, q=q, t=steps, d=delta: harness.dp_accounting_dpsgd_epsilon(s, q, t, d, 1e-4))
        excess = upper / reference - 1
        rows.append([f"{sigma:g}", f"{q:g}", f"{steps:,}", f"{delta:g}", f"{lower:.7f}", f"{upper:.7f}",
                     f"{reference:.7f}", f"{excess:+.2e}", "yes" if excess <= args.goal else "NO",
                     f"{seconds:.3f}", f"{peer_s:.2f}"])
        report.flush()
    report.text(f"within goal: pldjax's pessimistic epsilon at most {args.goal:g} relative above "
                "dp-accounting's (1e-4); the optimistic value is a lower bound, the pessimistic an upper "
                "bound, so the true epsilon lies between them.")
