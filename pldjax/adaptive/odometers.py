"""Privacy odometers: running upper bounds on the privacy loss, valid at every step at once.

A filter needs its budget before the interaction starts; an odometer does not. After each step it
reports a bound U_n on the privacy loss L_{1:n}(x, x') = sum_{m <= n} L_m of the steps run so far,
and all of these bounds hold together: for all neighbours x, x',

    P( exists n >= 1 : L_{1:n}(x, x') > U_n ) <= delta,                                       (*)

even when the mechanisms and their parameters are chosen adaptively from the earlier outputs
(Definition 6 of Whitehouse, Ramdas, Rogers and Wu, "Fully-Adaptive Composition in Differential
Privacy", ICML 2023, after Rogers, Roth, Ullman and Vadhan, "Privacy Odometers and Filters:
Pay-as-you-Go Composition", NeurIPS 2016). An analyst can therefore stop "when the result is good
enough" and read off what was spent; (*) bounds the privacy loss of the whole run, whatever the
stopping rule.

Every odometer is an :class:`Odometer`, a named tuple of pure functions in the style of the
filters (:mod:`pldjax.adaptive.filters`)::

    od = pj.odometers.mixture_odometer(delta=1e-6, gamma=0.1)
    state = od.init()                              # a pytree of arrays
    state, ok = od.step(state, epsilon, delta_n)   # record one step; jit-able, vmappable
    od.bound(state)                                # {"epsilon": U_n}: the current reading
    od.guarantee                                   # what (*) promises, with which delta
    od.state_problem(state)                        # None, or why no sequence of steps reaches it

Families (all readings are pessimistic: upper bounds on the exact formula, rounded up):

* The three families of Whitehouse et al. (§4.2, Theorem 3) for steps that are
  (epsilon_n, delta_n)-**pDP** conditioned on the past (probabilistic DP: P(abs(L_n) > epsilon_n) <=
  delta_n; pure epsilon_n-DP steps such as randomized response qualify, approximate-DP steps in
  general do not): :func:`filter_odometer`, :func:`mixture_odometer`, :func:`stitched_odometer`,
  and the original odometer of Rogers et al. (Theorem 6.5 there; Lemma 3 of Whitehouse et al.) as
  the baseline, :func:`rogers_odometer`. Each reads a function of the intrinsic time
  V_n = sum_{m <= n} epsilon_m^2 and splits delta = delta' + delta'': delta'' (``delta_queries``,
  default delta / 2, as in :func:`pldjax.adaptive.filters.approx_dp_filter`) pays for the steps' delta_n,
  delta' for the martingale bound. The reading is +inf from the first step at which the sum of
  the delta_n exceeds delta'' (the theorem's stopping time N), and stays +inf.
* Beyond the paper, :func:`gdp_ladder_odometer`: a ladder of GDP residue filters
  (:func:`pldjax.adaptive.filters.gdp_residue_filter`) with geometrically growing budgets mu_k and the
  failure probability split across the rungs. Its steps are GDP costs or pessimistic PLDs (any
  mechanism pldjax can describe: Gaussian, subsampled Gaussian, Laplace, ...), no pDP conversion is
  needed, and it reads both a mu (a GDP guarantee per rung, with no failure probability) and an
  epsilon satisfying (*). Its docstring states the guarantee and proves it.

**Steps that are refused.** ``step`` checks its arguments: on the host a NaN, a negative
epsilon_n, a delta_n outside [0, 1] or a degenerate query raise a ValueError naming the argument;
under a caller's jit or vmap (where values cannot raise) the step is refused: ``ok`` is False and
the state is returned unchanged. A refused step is not accounted for, so **call step before
running the mechanism, and run it only when ok is True** (as with a filter's ``spend``). An
infinite epsilon_n is valid: the reading becomes +inf.

**Exact 64-bit states whatever the caller's x64 flag**: float64 leaves are stored as uint32 bit
pairs (:func:`pldjax.core.precision.pack`), as for filters; save and restore them exactly with
:func:`pldjax.core.serialization.save_odometer_state` /
:func:`pldjax.core.serialization.load_odometer_state` (batched states too; a state that no
sequence of steps reaches is refused: ``state_problem``). Costs that arrive in float32 (a
caller's jit with x64 off) are charged the largest real that rounds to them
(:func:`pldjax.core.precision.upper_of_rounded`). Sums are rounded up
(:func:`pldjax.core.precision.add_up`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.adaptive.filters.base import keep_if, state_structure, structure_like
from pldjax.adaptive.filters.residue import GDPState, ResidueState, gdp_filter, gdp_residue_filter
from pldjax.adaptive.filters.whitehouse import residue_epsilon_squared
from pldjax.core.compilation import array_module, kernel_jit
from pldjax.core.namespace import public_dir
from pldjax.core.pld import PLD, pld_problems
from pldjax.core.precision import (
    add_up,
    float64,
    host_result,
    pack,
    square_up,
    unpack,
    upper_of_rounded,
)
from pldjax.core.validation import check_count, check_range, is_traced
from pldjax.kernels.gaussian_dp import RESIDUE_STEPS

#: Relative margin added to every reading computed in floating point: the few roundings of a
#: reading's formula (sqrt, log, products: well under 1e-14 relative) stay below it, so the reported
#: value is above the exact formula at the float64 state.
READING_MARGIN = 1e-12

#: Most rungs a ladder odometer may have (its state holds one filter state per rung).
MAX_RUNGS = 4096


class Odometer(NamedTuple):
    """One privacy odometer: ``init() -> state``, ``step(state, ...) -> (state, ok)``,
    ``bound(state) -> dict`` (the current reading, e.g. ``{"epsilon": U_n}``), plus what the
    readings satisfy (``guarantee``), the parameters that identify it (``kind``, ``params``:
    used to check saved states) and ``state_problem(state) -> str | None``: why no sequence of
    steps reaches a (possibly batched) state, or None (used to check restored states)."""

    init: Callable[[], Any]
    step: Callable[..., tuple[Any, jax.Array]]
    bound: Callable[[Any], dict]
    guarantee: dict
    kind: str
    params: dict
    state_problem: Callable[[Any], str | None]


def _round_up(x):
    """A reading moved above the round-off of its formula (+inf and 0 stay as they are; NaN, which
    only an infinite intermediate can produce, becomes +inf)."""
    xp = array_module(x)
    x = xp.asarray(x, xp.float64)
    return xp.where(xp.isnan(x), xp.inf, x * (1.0 + READING_MARGIN))


@functools.cache
def _guarded_step(core: Callable, structure: tuple) -> Callable:
    """The compiled step of every odometer built from ``core`` with states of ``structure``: a
    step that is not ok changes nothing."""
    like = structure_like(structure)

    def guarded(state, *args):
        new, ok = core(unpack(state, like), *args)
        return keep_if(ok, pack(new), state), ok

    return kernel_jit(guarded)


def _batch_shape(state, single) -> tuple[int, ...]:
    """The batch shape of a packed odometer ``state`` whose one odometer's packed state has the
    shapes of ``single``: () for one odometer."""
    leaf, one = jax.tree_util.tree_leaves(state)[0], jax.tree_util.tree_leaves(single)[0]
    return tuple(np.shape(leaf)[:max(np.ndim(leaf) - np.ndim(one), 0)])


def _make_odometer(kind: str, params: dict, guarantee: dict, *, init: Callable[[], Any],
                   core: Callable, read: Callable[[Any], dict], check: Callable,
                   problem: Callable[[Any], str | None]) -> Odometer:
    """An :class:`Odometer` from float64 parts: ``core(state, *args) -> (state, ok)`` on plain
    states (pure and module-level: its compiled step is shared by every odometer built from it),
    ``check(*args)`` raises on the host and returns the arguments to pass on,
    ``read(state) -> dict`` on plain states, ``problem(state) -> str | None`` on plain states
    with NumPy leaves of any batch shape."""
    with jax.enable_x64(True):
        like = jax.eval_shape(init)
        single = jax.eval_shape(lambda: pack(init()))
    compiled = _guarded_step(core, state_structure(like))

    @float64
    def step(state, *args):
        args = check(*args)
        batch = _batch_shape(state, single)
        for value in args:  # a step of several values would turn one odometer into a batch
            if np.broadcast_shapes(np.shape(value), batch) != batch:
                raise ValueError(f"{kind}: a step's values must have the state's shape {batch} "
                                 f"(or broadcast to it), got shape {np.shape(value)}")
        return compiled(state, *args)

    @float64
    def packed_init():
        return pack(init())

    @float64
    def bound(state):  # concrete states are read in NumPy, traced ones in the trace
        return jax.tree_util.tree_map(host_result, read(unpack(state, like, host=True)))

    @float64
    def state_problem(state):
        return problem(jax.tree_util.tree_map(np.asarray, unpack(state, like)))

    return Odometer(packed_init, step, bound, guarantee, kind, params, state_problem)


# -- the families of Whitehouse et al., Theorem 3 ----------------------------------------------------
class VarianceState(NamedTuple):
    """V_n = sum of epsilon_n^2 and the sum of the delta_n, both rounded up."""

    variance: jax.Array
    delta_spent: jax.Array


def _split(delta, delta_queries) -> tuple[float, float]:
    """(delta', delta'') from the total ``delta`` and ``delta_queries`` (default delta / 2)."""
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    delta_queries = delta / 2 if delta_queries is None else delta_queries
    check_range("delta_queries", delta_queries, 0.0, float(delta), high_open=True)
    return float(delta) - float(delta_queries), float(delta_queries)


def _check_step(kind: str):
    def check(epsilon, delta=0.0):
        for name, value in (("epsilon", epsilon), ("delta", delta)):
            if isinstance(value, PLD):
                raise ValueError(f"{kind}: {name} must be a number, got a PLD (this odometer "
                                 f"takes (epsilon_n, delta_n)-pDP steps)")
        check_range("epsilon", epsilon, 0.0, allow_inf=True)
        check_range("delta", delta, 0.0, 1.0)
        return upper_of_rounded(epsilon), upper_of_rounded(delta)

    return check


def _variance_core(state, epsilon, delta_n):
    ok = (epsilon >= 0) & (delta_n >= 0) & (delta_n <= 1)  # False for NaN
    new = VarianceState(add_up(state.variance, square_up(epsilon)),
                        add_up(state.delta_spent, delta_n))
    return keep_if(ok, new, state), ok


def _variance_odometer(kind: str, params: dict, delta: float, delta_prime: float,
                       delta_queries: float, boundary: Callable) -> Odometer:
    """An odometer reading ``boundary(V_n)`` while the delta_n sum to at most delta''."""

    def init():
        return VarianceState(np.zeros(()), np.zeros(()))

    def read(state):
        xp = array_module(state.variance)
        value = _round_up(boundary(state.variance))
        return {"epsilon": xp.where(state.delta_spent <= delta_queries, value, xp.inf)}

    def problem(state):
        # sums of numbers >= 0 (+inf included): every such value is reached, and nothing else
        for name, value in (("V_n (the sum of the epsilon_n^2)", state.variance),
                            ("the sum of the delta_n", state.delta_spent)):
            if np.any(np.isnan(value) | (value < 0)):
                return f"{name} is NaN or negative ({value})"
        return None

    guarantee = {"delta": delta, "delta_prime": delta_prime, "delta_queries": delta_queries}
    return _make_odometer(kind, params, guarantee, init=init, core=_variance_core, read=read,
                          check=_check_step(kind), problem=problem)


@float64
def filter_odometer(delta: float, *, epsilon: float | None = None, y_star: float | None = None,
                    delta_queries: float | None = None) -> Odometer:
    """The filter odometer (Whitehouse et al., Theorem 3.1): a line in V_n tuned at V_n = y*,

        U_n = sqrt(2 L y*) / 2 + (sqrt(2 L / y*) / 2 + 1/2) V_n,    L = log(1 / delta'),

    Theorem 4 of Whitehouse et al. (the line-crossing bound of Howard et al. 2020) with a = y*,
    b = sqrt(2 L y*): any y* > 0 gives a valid odometer. Give ``y_star`` directly, or a target
    ``epsilon``: then y* = (sqrt(2L + 2 epsilon) - sqrt(2L))^2, the **"+ 2 epsilon" convention**,
    which solves sqrt(2 L y) + y / 2 = epsilon, so that the reading equals ``epsilon`` exactly
    where V_n = y*, touches the pointwise bound sqrt(2 L V) + V / 2 there (same value and slope),
    and is <= epsilon (up to the round-off margin READING_MARGIN) exactly while
    :func:`pldjax.adaptive.filters.approx_dp_filter` (``epsilon``, same delta') would still accept: both
    use the same y*. Theorem 3 as printed has "+ epsilon" under the root, which tunes
    the odometer at a smaller V_n where it reads epsilon / 2: valid, but the parameter then does
    not mean the epsilon it names (the same slip as their eq. (11)).

    Steps: ``step(state, epsilon_n, delta_n=0)`` for an (epsilon_n, delta_n)-pDP step. Reading:
    ``{"epsilon": U_n}``, +inf once the delta_n sum above ``delta_queries`` (default delta / 2).

    Args:
      delta: the failure probability of (*), in (0, 1).
      epsilon: the target epsilon, in nats, finite and > 0 (a ValueError if its y* rounds to 0).
        Give exactly one of ``epsilon`` and ``y_star``.
      y_star: y*, the V_n (squared nats) where the line is tuned, finite and > 0.
      delta_queries: delta'', the budget for the sum of the steps' delta_n, in [0, ``delta``); None
        (default) means delta / 2. The rest, delta' = delta - delta_queries, pays for the martingale
        bound.

    Returns:
      An :class:`Odometer`. ``step(state, epsilon_n, delta_n=0)`` records an (epsilon_n, delta_n)-pDP
      step (epsilon_n >= 0 in nats, inf allowed; delta_n in [0, 1]) and returns the new state and
      whether it was recorded; ``bound(state)`` reads ``{"epsilon": U_n}``, a NumPy float64 in nats:
      the formula above at the recorded V_n, rounded up (an upper bound on it), and +inf once the
      delta_n sum above ``delta_queries``; ``guarantee`` ``{"delta", "delta_prime", "delta_queries"}``
      is the delta with which all the readings hold at once, (*), and its split.
    """
    delta_prime, delta_queries = _split(delta, delta_queries)
    if (epsilon is None) == (y_star is None):
        raise ValueError("filter_odometer: give exactly one of epsilon (the target, tuned with "
                         "the '+ 2 epsilon' convention) and y_star")
    if epsilon is not None:
        check_range("epsilon", epsilon, 0.0, low_open=True)
        y_star = float(residue_epsilon_squared(float(epsilon), delta_prime))
        if not y_star > 0:
            raise ValueError(f"epsilon = {epsilon!r} is too small for delta' = {delta_prime!r}: "
                             f"its tuning point y* rounds to 0")
    check_range("y_star", y_star, 0.0, low_open=True)
    y_star = float(y_star)
    two_log = 2.0 * math.log(1.0 / delta_prime)
    intercept = math.sqrt(two_log * y_star) / 2
    slope = math.sqrt(two_log / y_star) / 2 + 0.5

    def boundary(v):
        return intercept + slope * v

    params = {"delta": float(delta), "delta_queries": delta_queries, "y_star": y_star,
              "epsilon": None if epsilon is None else float(epsilon)}
    return _variance_odometer("filter_odometer", params, float(delta), delta_prime,
                              delta_queries, boundary)


@float64
def mixture_odometer(delta: float, *, gamma: float,
                     delta_queries: float | None = None) -> Odometer:
    """The mixture odometer (Whitehouse et al., Theorem 3.2; Robbins' method of mixtures as in
    Howard et al. 2021):

        U_n = sqrt(2 (gamma + V_n) log(sqrt((V_n + gamma) / gamma) / delta')) + V_n / 2.

    ``gamma`` > 0 sets where it is tightest (about V_n ~ gamma). Steps and reading as in
    :func:`filter_odometer`.

    Args:
      delta: the failure probability of (*), in (0, 1).
      gamma: the mixture's scale, in squared nats (the units of V_n), finite and > 0.
      delta_queries: delta'', the budget for the sum of the steps' delta_n, in [0, ``delta``); None
        (default) means delta / 2. The rest, delta' = delta - delta_queries, pays for the martingale
        bound.

    Returns:
      An :class:`Odometer`. ``step(state, epsilon_n, delta_n=0)`` records an (epsilon_n, delta_n)-pDP
      step (epsilon_n >= 0 in nats, inf allowed; delta_n in [0, 1]) and returns the new state and
      whether it was recorded; ``bound(state)`` reads ``{"epsilon": U_n}``, a NumPy float64 in nats:
      the formula above at the recorded V_n, rounded up (an upper bound on it), and +inf once the
      delta_n sum above ``delta_queries``; ``guarantee`` ``{"delta", "delta_prime", "delta_queries"}``
      is the delta with which all the readings hold at once, (*), and its split.
    """
    delta_prime, delta_queries = _split(delta, delta_queries)
    check_range("gamma", gamma, 0.0, low_open=True)
    gamma = float(gamma)
    log_inv = math.log(1.0 / delta_prime)

    def boundary(v):
        xp = array_module(v)
        return xp.sqrt(2.0 * (gamma + v) * (log_inv + 0.5 * xp.log1p(v / gamma))) + v / 2

    params = {"delta": float(delta), "delta_queries": delta_queries, "gamma": gamma}
    return _variance_odometer("mixture_odometer", params, float(delta), delta_prime,
                              delta_queries, boundary)


@float64
def stitched_odometer(delta: float, *, v0: float,
                      delta_queries: float | None = None) -> Odometer:
    """The stitched odometer (Whitehouse et al., Theorem 3.3; the stitched boundary of Howard et
    al. 2021, Theorem 1):

        U_n = 1.7 sqrt(V_n (log log(2 V_n / v0) + 0.72 log(5.2 / delta'))) + V_n / 2   (V_n >= v0)

    and +inf while V_n < ``v0`` (so a larger epsilon_n that carries V_n past v0 lowers the reading
    from +inf; beyond v0 it is non-decreasing in every epsilon_n). Asymptotically the best of the
    three (rate sqrt(V log log V)). Steps and reading as in :func:`filter_odometer`.

    Args:
      delta: the failure probability of (*), in (0, 1).
      v0: the V_n (squared nats) from which the reading is finite, finite and > 0.
      delta_queries: delta'', the budget for the sum of the steps' delta_n, in [0, ``delta``); None
        (default) means delta / 2. The rest, delta' = delta - delta_queries, pays for the martingale
        bound.

    Returns:
      An :class:`Odometer`. ``step(state, epsilon_n, delta_n=0)`` records an (epsilon_n, delta_n)-pDP
      step (epsilon_n >= 0 in nats, inf allowed; delta_n in [0, 1]) and returns the new state and
      whether it was recorded; ``bound(state)`` reads ``{"epsilon": U_n}``, a NumPy float64 in nats:
      the formula above at the recorded V_n, rounded up (an upper bound on it), and +inf once the
      delta_n sum above ``delta_queries``; ``guarantee`` ``{"delta", "delta_prime", "delta_queries"}``
      is the delta with which all the readings hold at once, (*), and its split.
    """
    delta_prime, delta_queries = _split(delta, delta_queries)
    check_range("v0", v0, 0.0, low_open=True)
    v0 = float(v0)
    log_term = 0.72 * math.log(5.2 / delta_prime)

    def boundary(v):
        xp = array_module(v)
        started = v >= v0
        safe = xp.where(started, v, v0)  # keeps log log finite where the reading is +inf
        value = 1.7 * xp.sqrt(safe * (xp.log(xp.log(2.0 * safe / v0)) + log_term)) + safe / 2
        return xp.where(started, value, xp.inf)

    params = {"delta": float(delta), "delta_queries": delta_queries, "v0": v0}
    return _variance_odometer("stitched_odometer", params, float(delta), delta_prime,
                              delta_queries, boundary)


@float64
def rogers_odometer(delta: float, *, dataset_size: int,
                    delta_queries: float | None = None) -> Odometer:
    """The original odometer of Rogers et al. 2016 (Theorem 6.5 there), in the form of Lemma 3 of
    Whitehouse et al.: with n = ``dataset_size`` (>= 2) and delta' <= 1/e,
    ::

        U_n = sqrt(2 V (log(110 e) + 2 log(log(n) / delta'))) + V / 2         for V in [1/n^2, 1]
        U_n = sqrt(2 (1/n^2 + V)(1 + log(1 + n^2 V) / 2) log log(4 log2(n) / delta')) + V / 2
                                                                               otherwise.

    The baseline the three families improve on (it depends on the dataset size and loosens outside
    [1/n^2, 1]). Implemented as Whitehouse et al. print it, including its drop at V = 1 where the
    two cases meet (so it is not monotone in V there). Steps and reading as in
    :func:`filter_odometer`.

    Args:
      delta: the failure probability of (*), in (0, 1), with delta' = delta - delta_queries <= 1/e
        (ValueError otherwise).
      dataset_size: n, an integer in [2, 10^150].
      delta_queries: delta'', the budget for the sum of the steps' delta_n, in [0, ``delta``); None
        (default) means delta / 2. The rest, delta' = delta - delta_queries, pays for the martingale
        bound.

    Returns:
      An :class:`Odometer`. ``step(state, epsilon_n, delta_n=0)`` records an (epsilon_n, delta_n)-pDP
      step (epsilon_n >= 0 in nats, inf allowed; delta_n in [0, 1]) and returns the new state and
      whether it was recorded; ``bound(state)`` reads ``{"epsilon": U_n}``, a NumPy float64 in nats:
      the formula above at the recorded V_n, rounded up (an upper bound on it), and +inf once the
      delta_n sum above ``delta_queries``; ``guarantee`` ``{"delta", "delta_prime", "delta_queries"}``
      is the delta with which all the readings hold at once, (*), and its split.
    """
    delta_prime, delta_queries = _split(delta, delta_queries)
    if not delta_prime <= math.exp(-1.0):
        raise ValueError(f"rogers_odometer needs delta' = delta - delta_queries <= 1/e, got "
                         f"{delta_prime!r}")
    size = check_count("dataset_size", dataset_size, minimum=2)
    if size > 10**150:  # n^2 must stay a finite float
        raise ValueError(f"dataset_size must be an integer in [2, 1e150], got {size}")
    inner = math.log(110.0 * math.e) + 2.0 * math.log(math.log(size) / delta_prime)
    outer = math.log(math.log(4.0 * math.log2(size) / delta_prime))
    floor = 1.0 / (float(size) * float(size))
    n_squared = float(size) * float(size)

    def boundary(v):
        xp = array_module(v)
        middle = xp.sqrt(2.0 * v * inner)
        other = xp.sqrt(2.0 * (floor + v) * (1.0 + 0.5 * xp.log1p(n_squared * v)) * outer)
        return xp.where((v >= floor) & (v <= 1.0), middle, other) + v / 2

    params = {"delta": float(delta), "delta_queries": delta_queries, "dataset_size": size}
    return _variance_odometer("rogers_odometer", params, float(delta), delta_prime,
                              delta_queries, boundary)


def pointwise_epsilon(variance, delta_prime: float):
    """sqrt(2 log(1/delta') V) + V / 2: the loss bound at ONE intrinsic time V fixed in advance
    (advanced composition with the constants of Whitehouse et al.; the lower envelope of all filter
    odometers, each touching it at its y*). Not an odometer: it holds at a fixed V, not at all
    times at once. For comparisons (Figure 3(b) of Whitehouse et al.).

    Args:
      variance: V, the intrinsic time (a sum of epsilon_m^2, in squared nats): a number or an array,
        not checked (a negative V gives NaN).
      delta_prime: delta', in (0, 1).

    Returns:
      sqrt(2 log(1/delta') V) + V / 2 in nats, as NumPy float64 (a float for one V, an array of V's
      shape for several), computed in floating point and not rounded up: the value of the formula,
      not a certified upper bound on it.
    """
    check_range("delta_prime", delta_prime, 0.0, 1.0, low_open=True, high_open=True)
    v = np.asarray(variance, np.float64)
    return np.sqrt(2.0 * math.log(1.0 / delta_prime) * v) + v / 2


# -- the ladder of GDP residue filters ---------------------------------------------------------------
class LadderState(NamedTuple):
    """One GDP residue filter state per rung (packed, stacked on a leading axis) and whether each
    rung has accepted every step so far."""

    rungs: Any
    alive: jax.Array


def gdp_tail_epsilon(mu, delta, slack=0.0):
    """The smallest t with P_P(L > t) <= delta for every pair (P, Q) whose tradeoff curve is at
    least G_mu - slack: t = log(delta) - log Phi(Phi^-1(delta - slack) - mu) (see
    :func:`gdp_ladder_odometer` for the proof), in float64 and rounded up (relative 1e-9 plus
    1e-12, far above the error of ndtri / log_ndtr). Host-side; +inf where delta <= slack.

    Args:
      mu: the GDP parameter, >= 0 (inf allowed), a number or an array.
      delta: the tail probability, in [0, 1], a number or an array; where it is <= ``slack`` the
        result is +inf.
      slack: the tradeoff slack s, in [0, 1], a number or an array; default 0.

    Returns:
      t in nats, NumPy float64 of the arguments' broadcast shape (a float for numbers), the
      formula rounded up (so an upper bound on the exact t, and at least 1e-12); +inf where
      delta <= slack or where the formula gives NaN.
    """
    from scipy.special import log_ndtr, ndtri  # here: SciPy's 0.1-0.4 s import for its users only

    check_range("mu", mu, 0.0, allow_inf=True)
    check_range("delta", delta, 0.0, 1.0)
    check_range("slack", slack, 0.0, 1.0)
    mu = np.asarray(mu, np.float64)
    delta = np.asarray(delta, np.float64)
    slack = np.asarray(slack, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.log(delta) - log_ndtr(ndtri(delta - slack) - mu)
    t = np.where(delta > slack, t, np.inf)
    return host_result(np.where(np.isnan(t), np.inf, np.maximum(t, 0.0) * (1 + 1e-9) + 1e-12))


@float64
def gdp_ladder_odometer(mu0: float, *, delta: float, growth: float = 2.0 ** 0.25,
                        rungs: int = 64, slack: float | None = None, residue: bool = False,
                        steps: int = RESIDUE_STEPS) -> Odometer:
    """An odometer from a ladder of GDP filters: exact for GDP steps, PLD-based for any mechanism,
    no pDP needed, and it reads a mu as well as an epsilon.

    Rung k = 0, ..., K-1 (K = ``rungs``) is a GDP filter with budget mu_k = ``mu0`` * ``growth``^k
    and hockey-stick slack budget s = ``slack``: a :func:`pldjax.adaptive.filters.gdp_filter` (default; all
    rungs see the same costs nu_n, so they share one filter state and rung k accepts while
    sum nu_n^2 <= mu_k^2), or with ``residue=True`` a :func:`pldjax.adaptive.filters.gdp_residue_filter`
    per rung (never worse; one residue search per rung and PLD step, so costly for PLD steps: about
    a second each on a CPU). Every step is spent on every rung; a rung is *alive* while it has
    accepted every step so far. The reading after step n is that of the lowest alive rung k(n):

        {"mu": mu_{k(n)}, "epsilon": eps_{k(n)}},
        eps_k = log(delta_k) - log Phi(Phi^-1(delta_k - s) - mu_k),   delta_k = delta / K,

    (rounded up; :func:`gdp_tail_epsilon`), and +inf for both once every rung has refused a step.
    Steps: ``step(state, query)`` with a GDP cost nu_n >= 0 (the step is nu_n-GDP conditioned on
    the past; inf is allowed and ends the ladder) or a pessimistic PLD (a subsampled Gaussian step,
    or a whole epoch of them composed), exactly as a filter's ``spend``. ``slack`` defaults to
    delta_k / 1000; a PLD query charges its atom at +inf plus pldjax.kernels.dominance.ROUNDOFF to it (numbers
    charge nothing).

    **Guarantee.** For every pair of neighbours x, x' and every adaptive analyst:

    (G1) for each k, the transcript stopped after T_k, the last step with rung k alive, satisfies
         delta(eps) <= delta_{G_mu_k}(eps) + s at every eps (it is mu_k-GDP up to s), and
    (G2) P( exists n : L_{1:n}(x, x') > eps_{k(n)} ) <= delta: the epsilon readings are a
         delta-privacy odometer in the sense of (*) (Definition 6 of Whitehouse et al.).

    *Proof.* (G1) Rung k accepted steps 1..T_k, and T_k is a stopping time of the transcript (the
    rung refuses step T_k + 1 as a function of the earlier outputs and of that step's PLD or cost,
    chosen from them). A GDP filter, or a GDP residue filter, run until its first refusal is
    mu_k-GDP up to its spent slack (Smith and Thakurta, "Fully Adaptive Composition for Gaussian
    Differential Privacy", 2022; Koskela, Tobaben and Honkela, "Individual Privacy Accounting with
    Gaussian Differential Privacy", ICLR 2023; Regehr, Hu, Leeman, Manurangsi, Tholoniat and
    Lécuyer, "Privacy Filters are Captured by Residues", 2026, §4, Theorems 1 and 5, Remark 2),
    and an analyst that stops earlier only stops the filter earlier.
    (Tail of one rung.) Fix k and the pair (x, x'); let P, Q be the laws of a transcript under x
    and x'. The hockey-stick slack turns into a tradeoff slack: delta(eps) <= delta_G(eps) + s for
    all eps gives, by the convex duality of tradeoff and privacy curves (Dong, Roth and Su,
    "Gaussian Differential Privacy", JRSS-B 2022, §2), T(Q, P) >= G_mu - s, and
    1 - G_mu(alpha) = Phi(Phi^-1(alpha) + mu); so P(A) <= Phi(Phi^-1(Q(A)) + mu) + s for every
    event A. Take A = {L > t}: there Q(A) <= e^-t P(A), so p = P(A) satisfies g(p) >= 0 for
    g(p) = Phi(Phi^-1(e^-t p) + mu) + s - p, a concave function with g(0) = s >= 0. If
    g(delta_k) <= 0 then g < 0 on (delta_k, 1] (delta_k is a convex combination of 0 and any
    p > delta_k, and g is positive just after 0), so P(L > t) <= delta_k; and g(delta_k) <= 0 is
    exactly t >= eps_k.
    (G2) Let F_k = {exists n <= T_k : L_{1:n} > eps_k} and tau the first such n (tau = T_k if
    none). For fixed (x, x') the loss is a function of the transcript, so stopping at tau is an
    analyst's choice and the transcript stopped at tau is covered by (G1); its privacy loss is
    L_{1:tau} (losses add along the transcript, eq. (9) of Whitehouse et al.), which exceeds eps_k
    on F_k. By the tail bound, P(F_k) <= delta_k. If L_{1:n} > eps_{k(n)} for some n, then rung
    k(n) is alive at n, i.e. n <= T_{k(n)}, so F_{k(n)} holds; hence the probability in (G2) is at
    most sum_k P(F_k) <= K * delta / K = delta.  []

    This is the union-bound construction of Rényi odometers (Feldman and Zrnic, "Individual Privacy
    Accounting via a Rényi Filter", NeurIPS 2021; Lécuyer, "Practical Privacy Filters and Odometers
    with Rényi Differential Privacy", 2021) with GDP rungs, turned into a time-uniform loss bound
    (*) by the exact GDP tail above. **Where it beats the paper's odometers**: on Gaussian and
    subsampled Gaussian steps, which are not (epsilon, 0)-pDP for any epsilon. The paper's
    odometers must convert each into an (epsilon_n, delta_n)-pDP step with the delta_n summing to
    delta'' over an unbounded horizon, and their readings grow like sqrt(V log n) or worse; the
    ladder reads about mu sqrt(2 log(K / delta)) at mu within a factor ``growth`` of
    sqrt(sum nu_n^2), the exact GDP composition. On (epsilon, 0)-pDP steps the paper's odometers
    are tighter (the ladder pays log K in delta and up to ``growth`` in mu; randomized response
    with epsilon is 2 Phi^-1(e^epsilon / (1 + e^epsilon))-GDP); see notebooks/04_odometers.ipynb.

    With ``residue=True`` the rungs share one filter object (budget mu_{K-1}): a GDP residue
    filter keeps its remaining budget in its state, so a state started at mu_k is rung k's filter.

    Args:
      mu0: the lowest rung's GDP budget, finite and > 0.
      delta: the failure probability of (G2), in (0, 1); each rung gets delta_k = delta / ``rungs``.
      growth: the ratio of consecutive rungs' budgets, finite and > 1; default 2^(1/4), about 1.19.
      rungs: K, an integer in [1, 4096] (MAX_RUNGS); the top budget mu0 * growth^(K - 1) must be at
        most 1e100, the GDP filters' largest (ValueError otherwise).
      slack: s, every rung's hockey-stick slack budget, in [0, delta_k); None (default) means
        delta_k / 1000.
      residue: False (default): GDP filters; True: GDP residue filters. A bool (ValueError otherwise).
      steps: an integer >= 1 (default RESIDUE_STEPS, 16): with ``residue=True``, each residue search
        makes at most 1 + ``steps`` tests (checked, and unused, with ``residue=False``).

    Returns:
      An :class:`Odometer`. ``step(state, query)`` records a GDP cost nu_n (a number >= 0, inf
      allowed) or a pessimistic PLD and returns the new state and whether it was recorded;
      ``bound(state)`` reads ``{"mu": ..., "epsilon": ...}``, mu_{k(n)} and eps_{k(n)} (nats) of the
      lowest alive rung as NumPy float64 (eps_k rounded up: an upper bound on the exact tail bound),
      both +inf once every rung has refused a step; ``guarantee`` ``{"delta", "slack", "mu",
      "epsilon"}`` holds delta, s, and the rungs' mu_k and eps_k (NumPy float64 arrays).
    """
    check_range("mu0", mu0, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    check_range("growth", growth, 1.0, low_open=True)
    count = check_count("rungs", rungs, minimum=1)
    if count > MAX_RUNGS:
        raise ValueError(f"rungs must be an integer in [1, {MAX_RUNGS}], got {count}")
    steps = check_count("steps", steps, minimum=1)
    if not isinstance(residue, (bool, np.bool_)):
        raise ValueError(f"residue must be True or False, got {residue!r}")
    with np.errstate(over="ignore"):
        mus = float(mu0) * float(growth) ** np.arange(count, dtype=np.float64)
        finite = np.all(np.isfinite(mus * mus))
    if not finite:
        raise ValueError(f"(mu0 * growth^(rungs - 1))^2 overflows: mu0 = {mu0!r}, growth = "
                         f"{growth!r}, rungs = {count}")
    delta_k = float(delta) / count
    slack = delta_k * 1e-3 if slack is None else slack
    check_range("slack", slack, 0.0, delta_k, high_open=True)
    slack = float(slack)
    epsilons = gdp_tail_epsilon(mus, delta_k, slack)
    top = float(mus[-1])
    if residue:
        rung_filter = gdp_residue_filter(top, delta=slack, steps=steps)
    else:
        rung_filter = gdp_filter(top, delta=slack)
        # rung k accepts while the (rounded-up) sum of nu^2 is <= mu_k^2, compared from below
        budgets = np.nextafter(mus * mus, 0.0)
        with jax.enable_x64(True):
            spent_like = jax.eval_shape(lambda: GDPState(jnp.zeros(()), jnp.zeros(())))
    with jax.enable_x64(True):
        residue_like = jax.eval_shape(lambda: ResidueState(jnp.zeros(count), jnp.zeros(count)))

    def init():
        if residue:
            rung_states = pack(ResidueState(mus, np.full((count,), slack)))
        else:
            rung_states = rung_filter.init()
        return pack(LadderState(rung_states, np.ones((count,), bool)))

    def valid_query(query, xp):
        if isinstance(query, PLD):
            return ~xp.any(xp.stack([bad for *_, bad in pld_problems(query)]))
        return xp.all(upper_of_rounded(query) >= 0)  # False for NaN

    @float64
    def step(state, query):
        if not isinstance(query, PLD) and not is_traced(query):
            check_range("query", query, 0.0, allow_inf=True)
        # the alive flags can be read off the rungs' states (state_problem checks it): a dead
        # rung's residue budget is -inf, and once the top rung refuses a step the sum of nu^2
        # spent is +inf, so that rung k is alive exactly while that sum is <= mu_k^2
        if residue:
            rung_states, accepted = jax.vmap(rung_filter.spend, in_axes=(0, None))(
                state.rungs, query)
        else:
            rung_states, taken = rung_filter.spend(state.rungs, query)
        # the glue around the filters' spends: in NumPy where concrete (no compiled program)
        host = not is_traced((state, query, rung_states))
        xp = np if host else jnp
        alive_before = xp.asarray(state.alive)
        if residue:
            plain = unpack(rung_states, residue_like, host=host)
            plain = plain._replace(mu=xp.where(alive_before & xp.asarray(accepted), plain.mu,
                                               -xp.inf))
            rung_states = pack(plain)
        else:
            plain = unpack(rung_states, spent_like, host=host)
            spent = xp.where(xp.asarray(taken), plain.mu_squared_spent, xp.inf)
            rung_states = pack(plain._replace(mu_squared_spent=spent))
            accepted = spent <= budgets
        ok = valid_query(query, xp)
        alive = xp.where(ok, alive_before & accepted, alive_before)
        kept = keep_if(ok, rung_states, state.rungs)
        return pack(LadderState(kept, alive)), pack(ok)

    @float64
    def bound(state):
        alive = np.asarray(state.alive) if not is_traced(state) else state.alive  # (..., K)
        xp = array_module(alive)
        lowest = xp.argmax(alive, axis=-1)  # batched states read one by one
        some = xp.any(alive, axis=-1)
        reading = {"mu": xp.where(some, xp.asarray(mus)[lowest], xp.inf),
                   "epsilon": xp.where(some, xp.asarray(epsilons)[lowest], xp.inf)}
        return jax.tree_util.tree_map(host_result, reading)

    @float64
    def state_problem(state):
        alive = np.asarray(state.alive)  # (..., K)
        alive_rows = np.broadcast_to(np.any(alive, axis=-1, keepdims=True), alive.shape)
        if residue:
            rungs = jax.tree_util.tree_map(np.asarray, unpack(state.rungs, residue_like))
            mu, left = np.broadcast_arrays(rungs.mu, rungs.delta_left)
            fits = (mu >= 0) & (mu <= mus)
            # the alive rungs of a state were charged the same steps from the same delta
            shared = np.max(np.where(alive, left, -np.inf), axis=-1, keepdims=True)
            rules = [  # (where it is broken, the value shown, what is wrong with it)
                (np.isnan(left) | (left < 0) | (left > slack), left,
                 f"delta left is NaN or outside [0, {slack}]"),
                (alive & ~fits, mu, "mu budget is outside [0, mu_k] on a rung marked alive (a "
                                    "dead rung's is -inf)"),
                (~alive & ~fits & (mu != -np.inf), mu, "mu budget is NaN or outside [0, mu_k]"),
                (alive & (left != shared), left,
                 "delta left differs from another alive rung's (all were charged the same "
                 "steps)"),
            ]
        else:
            rungs = jax.tree_util.tree_map(np.asarray, unpack(state.rungs, spent_like))
            spent = np.broadcast_to(rungs.mu_squared_spent[..., None], alive.shape)
            charged = np.broadcast_to(rungs.delta_spent[..., None], alive.shape)
            rules = [
                (np.isnan(spent) | (spent < 0), spent, "sum of nu_n^2 spent is NaN or negative"),
                (np.isnan(charged) | (charged < 0) | (charged > slack), charged,
                 f"delta spent is NaN or outside [0, {slack}]"),
                # rung k is alive exactly while the sum is <= mu_k^2, or none is (the ladder
                # then reads +inf whatever the sum)
                (alive_rows & alive & ~(spent <= budgets), spent,
                 "sum of nu_n^2 spent is above mu_k^2, but the rung is marked alive"),
                (alive_rows & ~alive & (spent <= budgets), spent,
                 "sum of nu_n^2 spent is within mu_k^2, but the rung is marked dead while a "
                 "higher one is alive"),
            ]
        for bad, value, text in rules:
            if np.any(bad):
                at = tuple(int(i) for i in np.argwhere(bad)[0])
                where = f"rung {at[-1]} (mu_k = {float(mus[at[-1]])!r})"
                if len(at) > 1:
                    where += f" of batch element {at[:-1]}"
                return f"{where}: {text} ({float(value[at])!r})"
        return None

    params = {"mu0": float(mu0), "delta": float(delta), "growth": float(growth), "rungs": count,
              "slack": slack, "residue": bool(residue), "steps": steps}
    guarantee = {"delta": float(delta), "slack": slack, "mu": mus, "epsilon": epsilons}
    return Odometer(float64(init), step, bound, guarantee, "gdp_ladder_odometer", params,
                    state_problem)


__all__ = ["GDPState", "LadderState", "MAX_RUNGS", "Odometer", "READING_MARGIN", "ResidueState",
           "VarianceState", "filter_odometer", "gdp_ladder_odometer", "gdp_tail_epsilon",
           "mixture_odometer", "pointwise_epsilon", "rogers_odometer", "stitched_odometer"]
__dir__ = public_dir(__all__)
