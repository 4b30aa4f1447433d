"""Tightness of dpsgd_epsilon's default grid on a spread of configurations (issue 17): the
optimistic and pessimistic values against dp-accounting's PLDAccountant at value discretization
interval 1e-4, and whether the pessimistic value is within the goal (at most 1e-4 relative above
dp-accounting's). Public API only (``PYTHONPATH=<checkout>`` runs it in another checkout).

    PYTHONPATH=. python bench/tightness.py
"""

from __future__ import annotations

import time

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

import pldjax as pj

#: (sigma, q, T, delta): sigma 0.5-3, q 1e-3-0.05, T 1e2-1e5 (bench/dpsgd.py's ranges) and a few
#: deltas.
CONFIGS = [(1, 0.01, 1e4, 1e-5), (0.5, 0.05, 100, 1e-5), (3, 1e-3, 1e5, 1e-10), (2, 0.02, 1000, 1e-6),
           (0.7, 0.004, 3e4, 1e-5), (0.5, 1e-3, 1e5, 1e-5), (3, 0.05, 100, 1e-5),
           (1, 0.05, 1e5, 1e-5), (0.5, 0.05, 1e5, 1e-5), (3, 0.001, 100, 1e-5),
           (1.5, 0.01, 1e3, 1e-7)]


def main() -> None:
    for sigma, q, steps, delta in CONFIGS:
        steps = int(steps)
        upper = pj.dpsgd_epsilon(sigma, q, steps, delta)
        lower = pj.dpsgd_epsilon(sigma, q, steps, delta, pessimistic=False)
        start = time.process_time()
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
        reference = accountant.get_epsilon(delta)
        cpu_ms = 1e3 * (time.process_time() - start)
        verdict = "ok" if upper <= reference * (1 + 1e-4) else "ABOVE 1e-4"
        print(f"sigma={sigma} q={q} T={steps} delta={delta}: optimistic {lower:.7f} <= pessimistic "
              f"{upper:.7f}; dp-accounting(1e-4) {reference:.7f} ({cpu_ms:.0f} CPU ms); "
              f"pessimistic/dpa - 1 = {upper / reference - 1:+.2e} ({verdict})", flush=True)


if __name__ == "__main__":
    main()
