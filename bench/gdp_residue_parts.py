"""Where a batch of subsampled-Gaussian residue updates spends its time (issue 18).

The bench's gauss pairs (``pj.gaussian(sigma, sampling_prob=0.1)``, sigma uniform in [1, 2], mu
uniform in [0.75, 1], seeded as in bench/gdp_residue.py): ``pj.gdp_mu`` of the queries alone (one
vmapped call: what each update's naive floor costs), then ``pj.gdp_residue`` with at most 1 and 4
search steps after its first test and with the default. First call (compilation included) and
the best and median of three warm calls, each ended by ``block_until_ready``.

    python bench/gdp_residue_parts.py --pairs 256      # a CPU
    python bench/gdp_residue_parts.py --pairs 10000    # a GPU

Not part of CI; prints its lines only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pldjax as pj  # noqa: E402


def timed(label: str, call) -> None:
    start = time.perf_counter()
    jax.block_until_ready(call())
    first = time.perf_counter() - start
    warm = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(call())
        warm.append(time.perf_counter() - start)
    print(f"{label}: first {first:.2f} s, warm {min(warm):.3f} s (median {np.median(warm):.3f} s)",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng([0, 1, args.pairs])  # bench/gdp_residue.py's gauss pairs
    mu = jnp.asarray(rng.uniform(0.75, 1.0, args.pairs))
    queries = pj.gaussian(jnp.asarray(rng.uniform(1.0, 2.0, args.pairs)), sampling_prob=0.1)
    print(f"{args.pairs} pairs on {jax.devices()[0].device_kind}, jax {jax.__version__}")
    timed("gdp_mu of the queries", lambda: pj.gdp_mu(queries, mu_max=1.0))
    for steps in (1, 4, None):
        label = "gdp_residue, " + ("default steps" if steps is None else f"steps={steps}")
        timed(label, lambda steps=steps: pj.gdp_residue(mu, queries, **({} if steps is None else
                                                                          {"steps": steps})))


if __name__ == "__main__":
    main()
