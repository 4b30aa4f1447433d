"""Monte Carlo accounting: privacy-loss samples of b-min-sep sampling, pldjax against jax-privacy.

For each run (noise multiplier sigma, sampling probability p, T steps, min_sep b, warm start),
draws N privacy-loss samples of the dominating pair under P and under Q with pldjax (the sampler
of ``pj.monte_carlo_delta``: compiled chunks of 2,048 samples on a CPU and 2^20 on an
accelerator, keyed) and with jax-privacy's
``experimental.monte_carlo.sample_generation.get_privacy_loss_sample`` (NumPy), and reads each
one's plain estimate of delta at one epsilon (the larger direction's, with its standard error):
the same pair, different draws, so the two agree within their errors. Seconds: both directions'
samples; pldjax's first call in this process (it compiles) and its second. ``--no-peers``
leaves jax-privacy out (a machine without it); ``--peer-samples`` draws fewer of its samples where
pldjax's count would take it hours (the accelerator's goal is 10^7 samples of the 1,000-step run,
``--samples 10000000``), and the speed ratio is then of samples a second.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from bench import harness

QUICK = "the first run, 2^16 samples"
#: (sigma, p, T, b, epsilon)
RUNS = [(1.0, 0.1, 100, 5, 1.0), (1.0, 0.02, 1000, 20, 1.0), (0.8, 0.05, 200, 10, 2.0)]
SAMPLES = 2**17  # two compiled chunks


def add_arguments(parser) -> None:
    parser.add_argument("--samples", type=int, default=SAMPLES, help="samples per direction")
    parser.add_argument("--peer-samples", type=int, default=None,
                        help="jax-privacy's samples per direction (default: --samples)")
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="skip jax-privacy's sampler")


def _estimate(losses, epsilon):
    values = -np.expm1(np.minimum(epsilon - losses, 0.0))
    return values.mean(), values.std() / math.sqrt(len(values))


def _pldjax(sigma, p, steps, min_sep, samples, key):
    import jax

    from pldjax.accounting import monte_carlo

    with jax.enable_x64(True):
        remove, add = monte_carlo.draws(1.0 / sigma, p, steps, min_sep, True, samples, key)
    return [remove, -add]


def _jax_privacy(sigma, p, steps, min_sep, samples):
    from jax_privacy import batch_selection
    from jax_privacy.experimental.monte_carlo import sample_generation

    strategy = batch_selection.BMinSepSampling(p, steps, min_sep)
    return [sample_generation.get_privacy_loss_sample(strategy, sigma, np.array([1.0]), seed=seed,
                                                      positive_sample=positive,
                                                      num_samples=samples)[0]
            for seed, positive in ((1, True), (2, False))]


def _worse(directions, epsilon):
    return max((_estimate(losses, epsilon) for losses in directions), key=lambda pair: pair[0])


def run(args, report) -> None:
    runs = RUNS[:1] if args.quick else RUNS
    samples = 2**16 if args.quick else args.samples
    peer_samples = min(samples, args.peer_samples or samples)
    rows = report.table(["sigma", "p", "T", "b", "samples", "epsilon", "pldjax delta",
                         "jax-privacy samples", "jax-privacy delta", "pldjax s (first)",
                         "pldjax s (warm)", "jax-privacy s", "pldjax samples/s over jax-privacy's"])
    for sigma, p, steps, min_sep, epsilon in runs:
        harness.log(f"monte_carlo: sigma={sigma} p={p} T={steps} b={min_sep}")
        run_args = (sigma, p, steps, min_sep, samples)
        first, _ = harness.timed(functools.partial(_pldjax, *run_args, 0))
        warm, ours = harness.timed(functools.partial(_pldjax, *run_args, 1))
        ours_mean, ours_error = _worse(ours, epsilon)
        peer = ["-", "-", "-", "-"]
        if args.peers:
            peer_s, theirs = harness.timed(functools.partial(
                _jax_privacy, sigma, p, steps, min_sep, peer_samples))
            theirs_mean, theirs_error = _worse(theirs, epsilon)
            peer = [f"{peer_samples:,}", f"{theirs_mean:.5f} ± {theirs_error:.5f}", f"{peer_s:.2f}",
                    f"{(samples / warm) / (peer_samples / peer_s):.1f}x"]
        rows.append([f"{sigma:g}", f"{p:g}", f"{steps:,}", f"{min_sep}", f"{samples:,}",
                     f"{epsilon:g}", f"{ours_mean:.5f} ± {ours_error:.5f}", *peer[:2],
                     f"{first:.2f}", f"{warm:.2f}", *peer[2:]])
        report.flush()
    report.text("delta: the plain estimate of the larger direction's delta(epsilon) ± one standard "
                "error (pj.monte_carlo_delta and monte_carlo_epsilon add a one-sided confidence "
                "bound on top). Samples: per direction.")
