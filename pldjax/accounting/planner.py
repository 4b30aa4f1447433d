"""Grid planning for the accounting engine: host code (NumPy) that chooses, for each
configuration, the tail mass its windows may leave out, its mechanism grid size and, under
``rtol``, its grid step.

The step for a target relative accuracy ``rtol`` follows a model of connect-the-dots' error
(:func:`accuracy_step`) applied to an estimate of the epsilon sought: the smaller of a Rényi-DP
bound of the Poisson-subsampled Gaussian (:func:`rdp_epsilon`, used only to size grids, never
reported) and a Gaussian approximation of the composed loss. None of these choices affects
soundness: every grid gives a pessimistic upper bound (or an optimistic lower bound); the plan
only decides how tight and how fast.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.compilation import array_module
from pldjax.core.grid import Grid
from pldjax.core.validation import check_range
from pldjax.kernels.discretize import mechanism_half_widths, mechanism_sizes
from pldjax.mechanisms import sampling as sampling_lib
from pldjax.mechanisms.events import Event, distinct_configurations, lattice
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import Gaussian, Noise
from pldjax.mechanisms.subsampling import REMOVE

#: The smallest mechanism grid of a configuration whose step is given (rtol's, a lattice's): its
#: window alone sets the size (grid.MECHANISM_SIZE, the automatic step's floor, held four times
#: the 511 points sigma = 1, q = 0.01 needs at rtol=5e-2).
STEPPED_MECHANISM_SIZE = 256


#: A composition read at delta (dpsgd_epsilon) may leave this fraction of delta outside its window:
#: Chernoff-bounded and charged to delta (the +inf atom of a pessimistic PLD, the bottom of an
#: optimistic one), so delta(eps) moves by at most delta / 2^20 and epsilon by about 1e-6 over
#: -d log(delta) / d eps nats (4e-8 relative at sigma = 0.8, q = 0.02, T = 50, delta = 1e-5).
#: The window then spans sqrt(log(2 / tail)) instead of sqrt(log(2 / grid.TAIL_MASS)) standard
#: deviations of the composed loss: 0.79x at delta = 1e-5. The mechanisms' windows get the same
#: fraction (:func:`mechanism_tail`, T steps of delta / (2^20 T) each): half the mechanism grid at
#: sigma = 1, q = 0.01, T = 1e4, delta = 1e-5, and epsilon 2e-11 relative higher.
TAIL_FRACTION = 2.0**-20


def mechanism_tail(steps, target, evaluate: str):
    """The mass of P each step's mechanism window may leave outside (see
    :func:`pldjax.kernels.discretize.window`): a fraction TAIL_FRACTION / steps of the delta that
    ``evaluate == "epsilon"`` reads at, so delta moves by at most delta / 2^20 more; 0 (the
    default windows) where delta is the unknown result."""
    if evaluate != "epsilon":
        return np.zeros_like(target)
    return target * TAIL_FRACTION / np.maximum(steps, 1.0)


def composition_tail(target, evaluate: str):
    """The mass each composition's window may leave outside (see TAIL_FRACTION): a fraction of
    the delta that ``evaluate == "epsilon"`` reads at (never below grid.TAIL_MASS), and
    grid.TAIL_MASS where delta is the unknown result."""
    xp = array_module(target)
    if evaluate != "epsilon":
        return xp.full_like(target, grid_lib.TAIL_MASS)
    return xp.maximum(target * TAIL_FRACTION, grid_lib.TAIL_MASS)


def loss_spread(sigma, q):
    """Rough standard deviation (nats) of one step's privacy loss: q sqrt(chi^2) for small q,
    at most the unsubsampled loss's 1 / sigma."""
    mu = 1.0 / sigma
    return np.minimum(q * np.sqrt(np.expm1(np.minimum(mu, np.sqrt(700.0)) ** 2)), mu)


def mechanism_points(sigma, q):
    """Rough relative grid size a configuration needs (used to sort configurations into chunks;
    +inf for a loss too narrow to measure against a wide tail)."""
    mu = np.minimum(1.0 / sigma, 1e150)  # squared below float64's largest
    top = np.logaddexp(np.log1p(-np.minimum(q, 1 - 1e-16)), np.log(q) + mu**2 / 2 + 10 * mu)
    # a spread that underflows to 0 (huge noise, tiny q) divided by: 0 / 0 and x / 0 warned
    spread = np.maximum(loss_spread(sigma, q), np.finfo(np.float64).tiny)
    with np.errstate(over="ignore"):  # a ratio beyond float64 sorts last, as +inf
        return top / spread


#: Integer Renyi orders of :func:`rdp_epsilon` (a coarse set: it only sizes grids).
RDP_ORDERS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256)


@functools.lru_cache(maxsize=16)
def _rdp_terms(orders: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The terms k = 0 .. a of the binomial expansion at each integer order a of ``orders``,
    flat (944 terms for RDP_ORDERS, not 18 x 257): for each term log C(a, k) and the
    coefficients a - k, k and k^2 - k of log(1 - q), log q and 1 / (2 sigma^2); and where each
    order's terms start."""
    counts = np.asarray(orders) + 1
    order = np.repeat(orders, counts).astype(np.float64)
    k = np.concatenate([np.arange(a + 1) for a in orders]).astype(np.float64)
    log_binomial = np.array([math.lgamma(a + 1.0) - math.lgamma(j + 1.0) - math.lgamma(a - j + 1.0)
                             for a, j in zip(order, k, strict=True)])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return log_binomial, order - k, k, k * k - k, starts


#: Configurations per block of :func:`poisson_gaussian_rdp` (each takes 944 terms for
#: RDP_ORDERS; 32 to 128 were alike).
_RDP_BLOCK = 64


def poisson_gaussian_rdp(sigma, q, orders: tuple[int, ...]) -> np.ndarray:
    """The Renyi divergence (nats) of one step of the Poisson-subsampled Gaussian (noise
    multiplier ``sigma``, sampling probability ``q``; flat arrays of one length) at each integer
    order >= 2 of ``orders``: Mironov, Talwar and Zhang's binomial expansion of
    D_a((1 - q) N(0, sigma^2) + q N(1, sigma^2) || N(0, sigma^2)), exact up to round-off, which
    they show is the larger of the two directions. Shape (configurations, orders). Every term
    combines three logarithms per configuration with constant coefficients."""
    log_binomial, misses, k, square, starts = _rdp_terms(tuple(orders))
    counts = np.asarray(orders) + 1
    with np.errstate(divide="ignore"):
        # -inf (q = 1, or 0) made finite: times a count of 0 it must give 0, not NaN
        log_miss = np.maximum(np.log1p(-q), -1e300)[:, None]
        log_hit = np.maximum(np.log(q), -1e300)[:, None]
    twice_variance = (2 * sigma**2)[:, None]
    out = np.empty((sigma.size, len(orders)))
    for begin in range(0, sigma.size, _RDP_BLOCK):
        part = slice(begin, begin + _RDP_BLOCK)
        with np.errstate(over="ignore"):  # a term beyond float64 makes the divergence inf
            terms = (log_binomial + misses * log_miss[part] + k * log_hit[part]
                     + square / twice_variance[part])
        top = np.maximum.reduceat(terms, starts, axis=-1)
        with np.errstate(invalid="ignore"):
            spread = np.exp(terms - np.repeat(top, counts, axis=-1))
        out[part] = (top + np.log(np.add.reduceat(spread, starts, axis=-1))) / (
            np.asarray(orders, np.float64) - 1)
    return np.where(np.isnan(out), np.inf, out)


#: The largest integer order :func:`event_renyi_bound` expands (a + 1 terms each).
_MAX_EXPANDED_ORDER = 4096
#: Relative allowance for the expansion's round-off (lgamma and a sum of at most 4,097 terms in
#: float64, a few ulps each), added so that the bound stays above the exact divergence.
_EXPANSION_ROUNDOFF = 1e-10


def event_renyi_bound(event: Event, orders: np.ndarray) -> np.ndarray:
    """An upper bound on the Renyi divergence (nats, the larger direction) of one run of
    ``event`` at each of ``orders`` (> 0) from closed forms; inf where none applies. The Gaussian
    without sampling: a / (2 s^2) with s = sigma / sensitivity (halved under replace-one, where
    the output moves by twice the sensitivity). Poisson-subsampled under add/remove or zero-out:
    :func:`poisson_gaussian_rdp` at the integer order max(2, ceil(a)) (the divergence does not
    decrease with the order), up to _MAX_EXPANDED_ORDER. Each is raised by its round-off. Any
    other event (or a batch of parameters): inf."""
    orders = np.asarray(orders, np.float64)
    unbounded = np.full(orders.shape, np.inf)
    try:
        parameters = gaussian_poisson_parameters(event, ())
    except ValueError:  # a batch of parameters
        return unbounded
    if parameters is None:
        return unbounded
    sigma, q = parameters
    if q[0] == 1.0:
        if event.neighboring == Neighboring.REPLACE_ONE:
            sigma = sigma / 2
        return orders / (2 * sigma[0] ** 2) * (1 + 4 * np.finfo(np.float64).eps)
    if event.neighboring == Neighboring.REPLACE_ONE:
        return unbounded
    integer = np.maximum(2.0, np.ceil(orders))
    expanded = integer <= _MAX_EXPANDED_ORDER
    chosen = tuple(int(a) for a in np.unique(integer[expanded]))
    if not chosen:
        return unbounded
    divergence = poisson_gaussian_rdp(sigma, q, chosen)[0] * (1 + _EXPANSION_ROUNDOFF)
    return np.where(expanded, divergence[np.searchsorted(chosen, np.where(expanded, integer, 2))],
                    np.inf)


def rdp_epsilon(sigma, q, steps, delta):
    """An estimate of epsilon (nats) from :func:`poisson_gaussian_rdp` at RDP_ORDERS and the
    standard conversion: an upper bound, about 10% loose, used only to choose a grid step (never
    reported); flat."""
    sigma, q, steps, delta = (a.reshape(-1) for a in np.broadcast_arrays(
        *(np.asarray(a, np.float64) for a in (sigma, q, steps, delta))))
    orders = np.asarray(RDP_ORDERS, np.float64)
    divergence = poisson_gaussian_rdp(sigma, q, RDP_ORDERS)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        eps = steps[:, None] * divergence + np.log(1.0 / delta[:, None]) / (orders - 1)
    return np.nan_to_num(np.min(eps, axis=-1), nan=np.inf)


def accuracy_step(rtol, steps, epsilon, spread, z):
    """The grid step (a power of two, nats) for a target relative accuracy ``rtol`` of an
    ``epsilon`` (an estimate, nats) after ``steps`` compositions of a loss whose standard
    deviation is ``spread``, at ``z`` standard deviations of the composed loss above its mean.

    Connect-the-dots adds up to h^2 / 4 of variance per composition (a two-point split across
    one step; measured errors are about half of this rule's, `python -m bench tightness`). For a
    Gaussian-like composed loss of variance v = T spread^2 (mean v / 2), epsilon = v / 2 +
    z sqrt(v) moves by (1/2 + z / (2 sqrt v)) T h^2 / 4. So h is the largest power of two with
    that at most rtol epsilon, kept at most ``spread`` (the rule needs several points across one
    step's loss) and at least grid.MIN_SPREAD: on finer steps a near-identity loss's curve loses
    its masses to round-off (sigma 1e12, q = 1, 1,000 steps: delta(0) 1.5e-8 on steps of 2^-40,
    2.9e-7 on 2^-41, 1 and so epsilon inf on 2^-42 and below; the truth is 1.3e-11).
    """
    sd = np.sqrt(np.maximum(steps, 1.0)) * spread
    slope = 0.5 + np.maximum(z, 0.0) / (2.0 * np.maximum(sd, 1e-300))
    wanted = np.sqrt(4.0 * rtol * np.maximum(epsilon, 0.0) / (np.maximum(steps, 1.0) * slope))
    wanted = np.clip(np.minimum(wanted, spread), grid_lib.MIN_SPREAD, grid_lib.MAX_STEP)
    return np.ldexp(1.0, np.floor(np.log2(wanted)).astype(np.int64))


def rtol_remedy(rtol, step) -> str:
    """What a composition too wide for float64 at ``rtol``'s grid ``step`` tells its caller."""
    return (f"rtol={float(rtol):.3g} asks for grid steps down to {float(step):.3g} nats here, too "
            "fine: use a larger rtol (or the default grid, rtol=None)")


def check_rtol(rtol, grid: Grid | None) -> None:
    if rtol is None:
        return
    check_range("rtol", rtol, 0.0, 1.0, low_open=True)
    if np.ndim(rtol) != 0:
        raise ValueError(f"rtol must be a scalar, got shape {np.shape(rtol)}")
    if grid is not None and grid.step is not None:
        raise ValueError("pass either rtol (the step follows from it) or a Grid(step=...), not both")


def accuracy_steps(sigma, q, steps, target, target_name, neighboring, rtol):
    """Each configuration's grid step for ``rtol`` (see :func:`accuracy_step`); the epsilon it
    aims at is given (dpsgd_delta) or estimated (dpsgd_epsilon) by the smaller of Renyi DP and
    the Gaussian estimate sd (z + sd / 2) of a composed loss with standard deviation sd (Renyi
    DP alone overestimated tiny epsilons 10-17x, and so the step: 85 of bench/dpsgd.py's 1,024
    configurations were up to 4x rtol off; now 2, at most 1.7x), and never taken below sd."""
    shift_sigma = sigma / 2 if neighboring == "replace_one" else sigma
    spread = loss_spread(shift_sigma, q)
    sd = np.sqrt(steps) * spread
    if target_name == "delta":
        z = np.sqrt(2.0 * np.log(1.0 / np.maximum(target, 1e-300)))
        estimate = np.minimum(rdp_epsilon(shift_sigma, q, steps, np.maximum(target, 1e-300)),
                              sd * (z + sd / 2))
    else:
        estimate = target
        z = (target - sd**2 / 2) / np.maximum(sd, 1e-300)
    # never below one standard deviation of the composed loss (a large delta's tiny epsilon)
    estimate = np.maximum(np.where(np.isfinite(estimate), estimate, sd), sd)
    return accuracy_step(rtol, steps, estimate, spread, np.nan_to_num(z, posinf=0.0))


def configuration_sizes(mechanism, params, both, grid, tail, half_widths=None):
    """The mechanism grid size each configuration gets alone (see discretize.mechanism_sizes):
    with a given step (rtol's, a lattice's), from STEPPED_MECHANISM_SIZE up. ``half_widths``:
    their windows' half-widths in nats (:func:`half_widths_nats`) where the caller has them
    (then no compiled call)."""
    if half_widths is not None and grid is not None and grid.step is not None:
        return sizes_on_steps(half_widths, grid.step, grid)
    smallest = grid_lib.MECHANISM_SIZE if grid is None or grid.step is None else STEPPED_MECHANISM_SIZE
    return mechanism_sizes(mechanism, tuple(params) + ((REMOVE,) if both else ()), grid, tail,
                           smallest)


def sizes_on_steps(half_widths, steps, grid: Grid | None) -> np.ndarray:
    """The mechanism grid sizes of windows of ``half_widths`` nats on the given ``steps`` (see
    :func:`configuration_sizes`): from STEPPED_MECHANISM_SIZE up, or ``grid.size`` when set."""
    if grid is not None and grid.size is not None:
        return np.full(np.shape(half_widths), grid.size)
    return grid_lib.sizes_for_half_widths(half_widths / steps, STEPPED_MECHANISM_SIZE)


def half_widths_nats(mechanism, params, both, tail) -> Callable[[], np.ndarray]:
    """Each configuration's mechanism window half-width (nats; flat), as configuration_sizes
    measures it (the remove direction's when there are two): the function that reads them once
    computed (see discretize.mechanism_half_widths)."""
    return mechanism_half_widths(mechanism, tuple(params) + ((REMOVE,) if both else ()), tail,
                                 1.0)


def covering_steps(half_widths):
    """rtol's finest steps (nats): on a finer one a window of ``half_widths`` nats no longer
    fits the largest mechanism grid (MAX_MECHANISM_SIZE points), and the loss beyond the grid
    goes to its ends (a tiny sampling probability over many steps: a loss spread of 7e-8 nats
    asked for steps of 6e-8, on which a window of 2.4 nats was 2^25 points, and the composition
    could not be placed even at rtol = 1, where the automatic grid answers)."""
    return grid_lib.cover_step(np.nan_to_num(half_widths, nan=0.0), grid_lib.MAX_MECHANISM_SIZE,
                               np)


#: The optimistic estimate at ``rtol`` takes steps this many times finer than the pessimistic
#: one: its tangents lose more than connect-the-dots' chords add (bench/dpsgd.py's 1,024
#: configurations at rtol 1e-2 on the same steps: 102 below 1 - 3 rtol of the pessimistic value,
#: one at 0; at 5e-2: 96, 51 at 0). A quarter leaves none below 1 - 3 rtol (lowest ratios 0.974
#: and 0.930) for at most 1.9x the optimistic sweep's time.
OPTIMISTIC_REFINEMENT = 4


def optimistic_steps(steps, half_widths, grid: Grid | None):
    """rtol's ``steps`` (the pessimistic estimate's) for the optimistic one:
    OPTIMISTIC_REFINEMENT times finer, but never finer than grid.MIN_SPREAD or than a window of
    ``half_widths`` nats allows (:func:`covering_steps`); and, as its window spans at most
    grid.OPTIMISTIC_SPAN nats, each at most the limit of the size its window then gets (a finer
    step is only more accurate; the estimate is 0 beyond its window, still a lower bound). A
    coarser one was refused with an error about a Grid.step the caller never gave (sigma = 1e-6,
    or sigma = 0.05 with q = 1). Sizes grow as steps shrink, so this repeats until they agree."""
    floor = np.maximum(grid_lib.MIN_SPREAD, covering_steps(half_widths))
    return _within_optimistic_limits(
        np.minimum(steps, np.maximum(steps / OPTIMISTIC_REFINEMENT, floor)), half_widths, grid)


def _within_optimistic_limits(steps, half_widths, grid: Grid | None):
    """``steps`` lowered to the optimistic construction's limit for the sizes their windows of
    ``half_widths`` nats get (:func:`pldjax.core.grid.optimistic_step_limit`); sizes grow as steps
    shrink, so this repeats until they agree."""
    while True:
        limits = grid_lib.optimistic_step_limit(sizes_on_steps(half_widths, steps, grid))
        if np.all(steps <= limits):
            return steps
        steps = np.minimum(steps, limits)


#: The largest sampling probability whose optimistic rows :func:`bulk_resolving_steps` refines:
#: below it all but a sampled record's losses lie within q of 0.
BULK_SAMPLING_PROB = 0.01
#: The most points of a mechanism window that :func:`bulk_resolving_steps` refines to (sigma 0.3,
#: q 1e-4: 2^19 points on 2^-14 nats took 2.0 s against 0.35 s, for 1.7% of epsilon).
BULK_MAX_SIZE = 2**16


def bulk_resolving_steps(spreads, sampling_probs, read_half_widths: Callable[[], np.ndarray]
                         ) -> np.ndarray:
    """For optimistic Gaussian-Poisson rows on the automatic grid: a step that resolves the bulk
    of the loss, which lies within q of 0 for q <= BULK_SAMPLING_PROB, where the accuracy step
    (:func:`pldjax.core.grid.fine_step` of the loss's ``spreads``) is coarser than q by at most
    OPTIMISTIC_REFINEMENT: the largest power of two at most q, if the window of
    ``read_half_widths()`` nats (:func:`half_widths_nats`, read only where a step is refined)
    allows it (:func:`optimistic_steps`' limits) in at most BULK_MAX_SIZE points; 0 (the
    automatic step) elsewhere.
    Connect-the-dots' lower curve is 0 from eps = 0 on when the bulk lies within a step of 0
    (sigma 0.3, q 1e-3, 1,000 steps, delta 1e-8: 21.88 from the privacy buckets fallback, 28.502
    on 2^-10 nats, where the upper bound is 28.508); a finer bulk than a quarter step is left to
    that fallback."""
    q = np.asarray(sampling_probs, np.float64)
    accurate = grid_lib.fine_step(np.asarray(spreads, np.float64))
    bulk = np.exp2(np.floor(np.log2(np.where((q > 0) & (q <= BULK_SAMPLING_PROB), q, np.inf))))
    wanted = (bulk < accurate) & (bulk >= accurate / OPTIMISTIC_REFINEMENT)
    steps = np.where(wanted, bulk, 0.0)
    if not np.any(wanted):
        return steps
    half_widths = read_half_widths()[wanted]
    refined = _within_optimistic_limits(
        np.maximum(steps[wanted], np.maximum(grid_lib.MIN_SPREAD, covering_steps(half_widths))),
        half_widths, None)
    small = sizes_on_steps(half_widths, refined, None) <= BULK_MAX_SIZE
    steps[wanted] = np.where((refined < accurate[wanted]) & small, refined, 0.0)
    return steps


def gaussian_poisson_parameters(event: Event, shape) -> tuple[np.ndarray, np.ndarray] | None:
    """(noise multiplier sigma / sensitivity, sampling probability), flat, for an event that is
    the Gaussian without sampling (q = 1) or Poisson-subsampled, whose closed forms (loss
    spread, Renyi DP) order chunks and size rtol's grids; None for any other event."""
    sampling = event.sampling
    if type(event.noise) is not Gaussian or not (sampling is None
                                                or type(sampling) is sampling_lib.Poisson):
        return None
    noise = event.noise
    sigma = np.asarray(noise.sigma, np.float64) / np.asarray(noise.sensitivity, np.float64)
    q = 1.0 if sampling is None else np.asarray(sampling.sampling_prob, np.float64)
    return tuple(np.broadcast_to(a, shape).reshape(-1) for a in (sigma, q))


def spends(event: Event, shape) -> np.ndarray:
    """Where a configuration can reveal anything (flat): False where its sampling probability
    is 0 (its PLD is the identity)."""
    q = getattr(event.sampling, "sampling_prob", 1.0)
    return np.broadcast_to(np.asarray(q, np.float64) > 0, shape).reshape(-1)


def lattice_steps(event: Event, shape, pessimistic: bool) -> np.ndarray | None:
    """Each configuration's lattice step (0: the automatic grid), as
    :func:`~pldjax.mechanisms.events.privacy_loss` picks it for each alone
    (:func:`~pldjax.mechanisms.events.lattice`; flat, ``shape``: the batch's); None when the
    event's noise and sampling offer none (Gaussian noise, say)."""
    noise, sampling = event.noise, event.sampling
    if type(noise).lattice is Noise.lattice and type(noise).top_loss is Noise.top_loss:
        return None
    if sampling is not None and type(sampling).lattice is sampling_lib.Sampling.lattice:
        return None
    steps = np.zeros(math.prod(shape))
    for one, members in distinct_configurations(event, shape):
        grid = lattice(one.noise, one.sampling, one.neighboring, pessimistic)
        steps[members] = 0.0 if grid is None else grid.step
    return steps
