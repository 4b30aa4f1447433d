"""Batch selection: DP-SGD's epsilon under each way of picking batches, at one expected batch size.

For each run (noise multiplier sigma, T batches an epoch, E epochs, delta 1e-5): Poisson sampling
at q = 1 / T over T E steps (pldjax's optimistic and pessimistic ``pj.dpsgd_epsilon``, and
dp-accounting's PLD at value discretization 1e-4, connect-the-dots), under add/remove, replace-one
and zero-out; sampling with replacement under zero-out (batches of DRAWS draws with replacement
from DRAWS T records, the same expected batch size: ``pj.sampling.WithReplacement(DRAWS T,
DRAWS)`` over T E steps, which neither dp-accounting accountant takes); cyclic Poisson of cycle
length 4 (a record eligible every fourth step, sampled at 4 / T there:
``pj.dp_accounting.batch_selection_event``'s accounting of jax-privacy's ``CyclicPoissonSampling``,
ceil(T E / 4) Poisson steps); balls-in-bins (random allocation: each
record in exactly one of an epoch's T batches, drawn afresh each epoch,
``pj.sampling.RandomAllocation(T)`` composed over E epochs) under add/remove, which dp-accounting's
release has no accountant for: beside it, Feldman and Shenfeld's random-allocation accountant (the
``PLD_accounting`` package, ``gaussian_allocation_epsilon_range`` at its default accuracy: the
epsilons of its dominating and dominated PLDs, and its time; one-epoch runs only); and shuffled
batches, for which only a lower bound exists (``pj.shuffling_lower_bound``, Chua et al.'s input),
under replace-one. Seconds: pldjax's second (warm) call in this process, both bounds (random
allocation's lattices, balls-in-bins' included, as a user's process builds them: in NumPy on a
CPU); a peer's one call. A second table sets random allocation of several steps beside the same peer; a third
times a sweep of random-allocation configurations in one call (``--sweep``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

from bench import harness

QUICK = "the first run, without dp-accounting"
DELTA = 1e-5
#: (sigma, batches an epoch, epochs)
RUNS = [(1.0, 1000, 1), (1.0, 1000, 5), (0.8, 100, 1), (2.0, 100, 10)]
#: Random allocation of k of t steps in one epoch: (sigma, t, k, delta)
ALLOCATIONS = [(2.0, 100, 10, 1e-6), (2.0, 100, 1, 1e-6), (0.5, 100, 10, 1e-5), (0.4, 100, 10, 1e-5),
               (0.35, 100, 10, 1e-5)]
CYCLE = 4
#: Random-allocation configurations of the sweep table (seeded: sigma uniform in [1, 3], t
#: log-uniform integer in [100, 1000], k drawn from SWEEP_SELECTED).
SWEEP = 32
SWEEP_SELECTED = (1, 2, 5, 10)
#: Draws a batch when sampling with replacement (from DRAWS * T records).
DRAWS = 10
#: Most epochs Feldman and Shenfeld's accountant is run for: it took 3.5 minutes for one epoch of
#: 1,000 steps at sigma 1 and had not answered five of them after 15.
PEER_EPOCHS = 1
#: The tables, in order: the schemes side by side, random allocation beside its peer, the sweep.
PARTS = ("schemes", "allocations", "sweep")


def add_arguments(parser) -> None:
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="skip dp-accounting and PLD_accounting")
    parser.add_argument("--sweep", type=int, default=SWEEP,
                        help="random-allocation configurations swept in one call (default "
                             f"{SWEEP}; 1024 on an accelerator)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="which tables, comma-separated, of " + ", ".join(PARTS))


def _dp_accounting_epsilon(sigma, q, steps, relation) -> float:
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pld = pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma, sampling_prob=q, value_discretization_interval=1e-4,
        neighboring_relation={"add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
                              "replace_one": NeighboringRelation.REPLACE_ONE,
                "replace_special": NeighboringRelation.REPLACE_SPECIAL}[relation])
    return float(pld.self_compose(steps).get_epsilon_for_delta(DELTA))


def _pldjax_bounds(sigma, q, steps, relation):
    import pldjax as pj

    return (pj.dpsgd_epsilon(sigma, q, steps, DELTA, neighboring=relation, pessimistic=False),
            pj.dpsgd_epsilon(sigma, q, steps, DELTA, neighboring=relation))


def _with_replacement_bounds(sigma, batches, epochs):
    import pldjax as pj

    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.WithReplacement(DRAWS * batches, DRAWS),
                     "replace_special")
    return (pj.event_epsilon(event, batches * epochs, DELTA, pessimistic=False),
            pj.event_epsilon(event, batches * epochs, DELTA))


def _balls_in_bins_bounds(sigma, batches, epochs):
    import pldjax as pj

    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(batches))
    return (pj.event_epsilon(event, epochs, DELTA, pessimistic=False),
            pj.event_epsilon(event, epochs, DELTA))


def _random_allocation_bounds(sigma, steps, selected, delta):
    import pldjax as pj

    event = pj.Event(pj.noise.Gaussian(sigma), pj.sampling.RandomAllocation(steps, selected))
    return (pj.event_epsilon(event, 1, delta, pessimistic=False),
            pj.event_epsilon(event, 1, delta))


@contextlib.contextmanager
def _lattices_as_a_users():
    """Random allocation's lattices as in a user's process: on a CPU they run in NumPy in every
    process (the steady state: pldjax.mechanisms.random_allocation's ``_laws``), so the suite's
    PLDJAX_HOST_WORK=0 (compiled kernels) is lifted while they are timed; on an accelerator the
    compiled lattices are the steady state, and nothing changes."""
    import jax

    if jax.default_backend() != "cpu" or "PLDJAX_HOST_WORK" not in harness.PARENT_ONLY:
        yield
        return
    os.environ.pop("PLDJAX_HOST_WORK")
    try:
        yield
    finally:
        os.environ["PLDJAX_HOST_WORK"] = "0"


def _random_allocation_peer(sigma, steps, selected, epochs, delta):
    """Feldman and Shenfeld's accountant: (lower, upper) epsilon."""
    from PLD_accounting.random_allocation_api import gaussian_allocation_epsilon_range

    upper, lower = gaussian_allocation_epsilon_range(delta=delta, sigma=sigma, num_steps=steps,
                                                     num_selected=selected, num_epochs=epochs)
    return lower, upper


def _allocation_sweep(count: int):
    """(event, configurations) of the sweep table: ``count`` seeded random-allocation
    configurations as one event of array parameters."""
    import numpy as np

    import pldjax as pj

    rng = np.random.default_rng(0)
    sigmas = rng.uniform(1.0, 3.0, count)
    steps = np.round(np.exp(rng.uniform(np.log(100), np.log(1000), count))).astype(np.int64)
    selected = rng.choice(SWEEP_SELECTED, count)
    return pj.Event(pj.noise.Gaussian(sigmas), pj.sampling.RandomAllocation(steps, selected))


def _swept_epsilons(event, pessimistic: bool):
    """The sweep table's call: every configuration's epsilon at delta 1e-6, one epoch."""
    import pldjax as pj

    return pj.event_epsilon(event, 1, 1e-6, pessimistic=pessimistic)


def sweep_call(count: int, pessimistic: bool):
    """The sweep table's call, for a fresh process (:func:`harness.fresh_process`)."""
    event = _allocation_sweep(count)
    import numpy as np

    return lambda: float(np.sum(_swept_epsilons(event, pessimistic)))


def _shuffled_lower_bound(sigma, batches, epochs):
    import pldjax as pj

    return pj.shuffling_lower_bound(sigma, batches, epochs).epsilon(DELTA)


def run(args, report) -> None:
    parts = {part.strip() for part in args.parts.split(",")}
    unknown = parts - set(PARTS)
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; choose from {', '.join(PARTS)}")
    peer = args.peers and not args.quick
    if "schemes" in parts:
        _schemes(args, report, peer)
    if "allocations" in parts:
        _allocations(args, report, peer)
    if "sweep" in parts:
        _sweep(args, report)


def _schemes(args, report, peer: bool) -> None:
    runs = RUNS[:1] if args.quick else RUNS
    rows = report.table(["sigma", "T", "E", "batch selection", "neighboring", "pldjax lower",
                         "pldjax upper", "dp-accounting 1e-4", "Feldman-Shenfeld [lower, upper]",
                         "pldjax s (warm)", "peer s"])
    for sigma, batches, epochs in runs:
        head = [f"{sigma:g}", f"{batches:,}", f"{epochs}"]
        cases = [("Poisson", relation, 1.0 / batches, batches * epochs)
                 for relation in ("add_remove", "replace_one", "replace_special")]
        cases.append((f"cyclic Poisson, cycle {CYCLE}", "add_remove", CYCLE / batches,
                      math.ceil(batches * epochs / CYCLE)))
        for name, relation, q, steps in cases:
            harness.log(f"batch_selection: {name} {relation} sigma={sigma} T={batches} E={epochs}")
            call = functools.partial(_pldjax_bounds, sigma, q, steps, relation)
            call()
            seconds, (lower, upper) = harness.timed(call)
            peer_s, reference = (harness.timed(functools.partial(
                _dp_accounting_epsilon, sigma, q, steps, relation)) if peer else (None, None))
            rows.append(head + [name, relation, f"{float(lower):.4f}", f"{float(upper):.4f}",
                                harness.fmt(reference, ".4f"), None, f"{seconds:.3f}",
                                harness.fmt(peer_s, ".2f")])
            report.flush()
        harness.log(f"batch_selection: with replacement sigma={sigma} T={batches} E={epochs}")
        call = functools.partial(_with_replacement_bounds, sigma, batches, epochs)
        call()
        seconds, (lower, upper) = harness.timed(call)
        rows.append(head + [f"with replacement, {DRAWS} draws", "replace_special",
                            f"{float(lower):.4f}", f"{float(upper):.4f}", None, None,
                            f"{seconds:.3f}", None])
        report.flush()
        harness.log(f"batch_selection: balls-in-bins sigma={sigma} T={batches} E={epochs}")
        call = functools.partial(_balls_in_bins_bounds, sigma, batches, epochs)
        with _lattices_as_a_users():
            call()
            seconds, (lower, upper) = harness.timed(call)
        peer_s, bracket = (harness.timed(functools.partial(
            _random_allocation_peer, sigma, batches, 1, epochs, DELTA))
            if peer and epochs <= PEER_EPOCHS else (None, None))
        rows.append(head + ["balls-in-bins", "add_remove", f"{float(lower):.4f}",
                            f"{float(upper):.4f}", None,
                            None if bracket is None else f"[{bracket[0]:.4f}, {bracket[1]:.4f}]",
                            f"{seconds:.3f}", harness.fmt(peer_s, ".2f")])
        report.flush()
        harness.log(f"batch_selection: shuffled sigma={sigma} T={batches} E={epochs}")
        call = functools.partial(_shuffled_lower_bound, sigma, batches, epochs)
        call()
        seconds, lower = harness.timed(call)
        rows.append(head + ["shuffled", "replace_one", f"{float(lower):.4f}", "none known", None,
                            None, f"{seconds:.3f}", None])
        report.flush()
    report.text("lower and upper: bounds on the true epsilon at delta 1e-5 (pldjax's optimistic and "
                "pessimistic PLDs; for shuffled batches the lower bound alone: no upper bound is "
                "known, and the Poisson value is not one). At one expected batch size (N / T records), "
                "a shuffled run's epsilon can lie far above its Poisson accounting under the same "
                "relation. Drawing with replacement (replace_special is zero-out) costs far more than "
                "Poisson sampling: a drawn copy of the record also takes the place of another "
                "record's draw, as in sampling without replacement under replace-one; its bounds "
                "lie further apart (the upper holds for every dataset, the lower is one dataset). "
                "Balls-in-bins' lattices are built as in a user's process (on a CPU in NumPy). "
                "Balls-in-bins and sampling with replacement have no dp-accounting value: "
                "its random-allocation accountant is not in the release, and neither its PLD nor "
                "its RDP accountant takes SampledWithReplacementDpEvent. B-min-sep is accounted for "
                "by Monte Carlo alone (`python -m bench monte_carlo`).")


def _allocations(args, report, peer: bool) -> None:
    rows = report.table(["sigma", "t", "k", "delta", "pldjax lower", "pldjax upper",
                         "Feldman-Shenfeld lower", "Feldman-Shenfeld upper", "pldjax s (warm)",
                         "Feldman-Shenfeld s"])
    for sigma, steps, selected, delta in ALLOCATIONS[:1] if args.quick else ALLOCATIONS:
        harness.log(f"batch_selection: random allocation {selected} of {steps}, sigma={sigma}")
        call = functools.partial(_random_allocation_bounds, sigma, steps, selected, delta)
        with _lattices_as_a_users():
            call()
            seconds, (lower, upper) = harness.timed(call)
        peer_s, bracket = (harness.timed(functools.partial(
            _random_allocation_peer, sigma, steps, selected, 1, delta)) if peer
            else (None, (None, None)))
        rows.append([f"{sigma:g}", f"{steps:,}", f"{selected}", f"{delta:g}", f"{float(lower):.4f}",
                     f"{float(upper):.4f}", harness.fmt(bracket[0], ".4f"),
                     harness.fmt(bracket[1], ".4f"), f"{seconds:.3f}", harness.fmt(peer_s, ".2f")])
        report.flush()
    report.text("Random allocation of k of t steps, one epoch, add/remove; pldjax's time is its second "
                "call's, its lattices built as in a user's process (on a CPU in NumPy, see "
                "pldjax.mechanisms.random_allocation.HOST_LATTICE_POINTS). pldjax's bounds hold the "
                "true epsilon between them (for k > 1 the upper bound composes k allocations of one "
                "step in t / k; the lower one reads a statistic of the outputs, for k > 1 sum_i "
                "log(1 + k Z_i / (t - k)) of the steps' likelihood ratios Z_i, joined with the "
                "Gaussian of the outputs' sum). Feldman and Shenfeld's are the epsilons of "
                "their dominating and dominated PLDs at the package's default "
                "accuracy; for k > 1 both are of the same k-fold composition of one-step "
                "allocations, so their lower value bounds that composition, not the true epsilon. "
                "At sigma 0.5 to 0.35 pldjax's lower bound is far below: its statistic misses "
                "what the selected steps' large outputs show.")


def _sweep(args, report) -> None:
    count = min(args.sweep, 8) if args.quick else args.sweep
    harness.log(f"batch_selection: a sweep of {count} random-allocation configurations")
    event = _allocation_sweep(count)
    rows = report.table(["configurations", "bound", "first call s (fresh process)",
                         "first call s, compiled", "warm s", "configurations/s (warm)"])
    for pessimistic, bound in ((True, "upper"), (False, "lower")):
        fresh = harness.fresh_process("bench.batch_selection", "sweep_call",
                                      dict(count=count, pessimistic=pessimistic),
                                      imports="import pldjax")
        call = functools.partial(_swept_epsilons, event, pessimistic)
        first, _ = harness.timed(call)
        warm, _ = harness.timed(call)
        rows.append([f"{count:,}", bound, fresh.get("error") or f"{fresh['first_s']:.2f}",
                     f"{first:.2f}", f"{warm:.2f}", f"{count / warm:.1f}"])
        report.flush()
    report.text("A sweep of random allocation in one call (`pj.event_epsilon` of one event whose "
                "parameters are arrays, delta 1e-6, one epoch): seeded configurations, sigma "
                f"uniform in [1, 3], t log-uniform in [100, 1000], k drawn from {SWEEP_SELECTED}. "
                "Each configuration builds its own lattices (their sizes differ); a few are built "
                "at once, one a CPU core. First call (fresh process): a new process's first call, as a "
                "user's (import apart; on a CPU its lattices are built in NumPy, see "
                "pldjax.mechanisms.random_allocation.HOST_LATTICE_POINTS); first call, compiled: "
                "this process's (PLDJAX_HOST_WORK=0), which compiles the lattice sizes it meets "
                "that the tables above did not; warm: this process's next call.")
