"""Calibration: the parameter of a one-parameter family of mechanisms (:func:`calibrate_event`: any
``make_event(x) -> pj.Event``), or DP-SGD's noise multiplier, number of steps or sampling
probability, that meets a target (epsilon, delta), vectorized over arrays of targets.

Each is a bisection in which every iteration evaluates all configurations in one call of
:func:`pldjax.event_epsilon` (pessimistic: an upper bound on the true epsilon; the family's
events for all targets are one batched event). The answer is the
conservative end of the final bracket, so its computed epsilon is <= the target, and the bracket
is narrower than ``rtol`` (relative) so a value 0.1% worse exceeds the target.

Where there are several targets, each answer is then checked alone, as a caller evaluates one
configuration (:func:`_each_alone`): a batch's epsilon may differ from a single call's by
round-off (XLA compiles a batch's reductions in another order), and an answer that met its target
in a batch could exceed it alone by 1e-11 (relative).

One predicate decides everywhere whether a configuration meets its target (:func:`_meets`): a
computed epsilon that is NaN or +inf never does, so a numerical failure can only make an answer
more conservative (or raise), never accept a configuration. Every loop is bounded by a count that
follows from the validated limits and tolerance (:func:`iterations`); running past it raises
RuntimeError instead of hanging.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import numpy as np

from pldjax.accounting.dpsgd import dpsgd_event
from pldjax.accounting.engine import event_epsilon
from pldjax.core.notice import announces_slow_calls
from pldjax.core.precision import float64
from pldjax.core.validation import (
    broadcast_arguments,
    check_count,
    check_range,
    check_whole,
    refuse_traced,
)
from pldjax.mechanisms.events import Event
from pldjax.mechanisms.neighboring import Neighboring

#: Relative width of the final bracket.
RTOL = 1e-4
#: Narrowest relative bracket a caller may ask for: well above float64's relative spacing (2.2e-16),
#: so the geometric midpoint of a bracket always lies strictly inside it.
MIN_RTOL = 1e-12
#: Largest max_steps of :func:`calibrate_steps`: step counts stay exact in float64.
MAX_STEPS = 2**53


def _span(values) -> str:
    values = np.asarray(values, np.float64)
    return f"{values.min():.6g}" if values.min() == values.max() else (
        f"{values.min():.6g} to {values.max():.6g}")


def _epsilons(event: Event, steps, delta) -> np.ndarray:
    try:
        eps = event_epsilon(event, steps, delta)
    except ValueError as err:
        where = ", ".join(f"{name} {_span(value)}" for part in (event.noise, event.sampling)
                          if part is not None for name, value in vars(part).items())
        raise ValueError(f"calibration could not evaluate epsilon at {where}, steps "
                         f"{_span(steps)} (narrow the search: the limits of the parameter, or "
                         f"max_steps): {err}") from err
    return np.asarray(eps, np.float64)


def _family(make_event: Callable, x: np.ndarray) -> Event:
    event = make_event(x)
    if not isinstance(event, Event):
        raise ValueError(f"make_event must return a pldjax.Event, got {event!r}")
    return event


def _meets(epsilons, target) -> np.ndarray:
    """Where a computed epsilon is finite and <= its target (NaN and +inf never meet one)."""
    return np.isfinite(epsilons) & (epsilons <= target)


def _fail(name: str, bad, targets, epsilons, reason: str) -> None:
    if np.any(bad):
        shown = np.asarray(targets)[bad].ravel()[:3].tolist()
        costs = np.broadcast_to(epsilons, np.shape(bad))[bad].ravel()[:3].tolist()
        raise ValueError(f"no {name} reaches target_epsilon {shown} (epsilon there: {costs}): "
                         f"{reason}")


def iterations(limit: int, what: str):
    """range(limit), then RuntimeError: the loop it drives cannot hang."""
    yield from range(limit)
    raise RuntimeError(f"{what} did not converge in {limit} iterations (a bug: please report it)")


def _bisection_limit(low: float, high: float, rtol: float) -> int:
    """Geometric bisections that shrink the ratio high / low to 1 + rtol, plus slack."""
    spread = max(math.log(high) - math.log(low), 1e-300)
    return max(math.ceil(math.log2(spread / math.log1p(rtol))), 0) + 4  # low = high: none


def _configuration(event: Event, shape: tuple, index: int) -> Event | None:
    """Configuration ``index`` (flat) of ``event`` batched to ``shape``: its parameters alone, as
    a caller builds one; None where the event's batch is not ``shape``."""
    leaves, tree = jax.tree_util.tree_flatten(event)
    if np.broadcast_shapes(shape, *(np.shape(leaf) for leaf in leaves)) != shape:
        return None
    return jax.tree_util.tree_unflatten(
        tree, [np.broadcast_to(np.asarray(leaf), shape).reshape(-1)[index] for leaf in leaves])


def _each_alone(answers, target, alone: Callable, toward_less: Callable, limit, moves: int, *,
                name: str, hint: str) -> np.ndarray:
    """``answers`` (the shape of ``target``) each checked alone, as a caller evaluates one
    configuration: ``alone(i, x)`` is the epsilon of configuration i (flat) at x. One that does
    not meet its target moves ``toward_less(x, k)`` (the k-th move, k = 0, 1, ...) until it does;
    at ``limit`` a ValueError naming ``name``, with ``hint``. A single target's search evaluated
    it alone already."""
    answers = np.array(answers)
    if answers.size <= 1:
        return answers
    flat, goals = answers.reshape(-1), np.broadcast_to(target, answers.shape).reshape(-1)
    for i in range(flat.size):
        for k in iterations(moves, f"calibration of the {name} (each answer alone)"):
            eps = alone(i, flat[i])
            if _meets(eps, goals[i]):
                break
            _fail(name, np.array([flat[i] == limit]), goals[i:i + 1], eps, hint)
            flat[i] = toward_less(flat[i], k)
    return answers


def _check_rtol(rtol: float) -> None:
    check_range("rtol", rtol, MIN_RTOL, 1.0, high_open=True)


def _search(epsilons: Callable, target, low: float, high: float, *, increasing: bool, start,
            factor: float, rtol: float, name: str, hint: str, alone: Callable) -> np.ndarray:
    """The parameter x in [low, high] (to ``rtol``, relative) as far toward more privacy loss as
    meets each target: the largest x if epsilon increases with x, the smallest if it decreases.

    From ``start``, x moves by ``factor`` toward less loss until it meets the target (else a
    ValueError naming ``name``, with ``hint``), or, where ``start`` already meets it, toward more
    loss until it does not (or reaches that limit: the answer); then a geometric bisection keeps
    one end that meets the target and one that does not, and returns the former, each checked
    alone (:func:`_each_alone`; ``alone(i, x)``: the epsilon of configuration i at x)."""
    def toward_less(x):
        return np.maximum(x / factor, low) if increasing else np.minimum(x * factor, high)

    def toward_more(x):
        return np.minimum(x * factor, high) if increasing else np.maximum(x / factor, low)

    safe_limit, loss_limit = (low, high) if increasing else (high, low)
    moves = math.ceil((math.log(high) - math.log(low)) / math.log(factor)) + 2
    good = np.full(np.shape(target), min(max(start, low), high))
    eps = epsilons(good)
    ok = _meets(eps, target)
    moved = np.zeros(np.shape(target), bool)
    bad = good.copy()
    for _ in iterations(moves, f"calibration of the {name} (bracket)"):
        if np.all(ok):
            break
        _fail(name, ~ok & (good == safe_limit), target, eps, hint)
        moved |= ~ok
        bad = np.where(ok, bad, good)
        good = np.where(ok, good, toward_less(good))
        eps = epsilons(good)
        ok = ok | _meets(eps, target)
    # where start met the target: toward more loss until a value does not
    bad = np.where(moved, bad, toward_more(good))
    bad_ok = np.zeros(np.shape(target), bool)
    probe = ~moved & (bad != good)
    if np.any(probe):
        bad_ok = probe & _meets(epsilons(bad), target)
    for _ in iterations(moves, f"calibration of the {name} (bracket towards more loss)"):
        if not np.any(bad_ok & (bad != loss_limit)):
            break
        good = np.where(bad_ok, bad, good)
        bad = np.where(bad_ok, toward_more(bad), bad)
        bad_ok = bad_ok & _meets(epsilons(bad), target)
    good = np.where(bad_ok, bad, good)  # the limit meets the target
    bad = np.where(bad_ok, good, bad)
    for _ in iterations(_bisection_limit(low, high, rtol), f"calibration of the {name} (bisection)"):
        if not np.any(np.maximum(good, bad) / np.minimum(good, bad) > 1 + rtol):
            break
        mid = np.sqrt(good) * np.sqrt(bad)
        ok = _meets(epsilons(mid), target)
        good, bad = np.where(ok, mid, good), np.where(ok, bad, mid)

    def farther(x, k):  # (1 + rtol)^(2^k) toward less loss: a few moves cross [low, high]
        grown = math.exp(min(2.0**k * math.log1p(rtol), 700.0))
        return max(x / grown, low) if increasing else min(x * grown, high)

    good = _each_alone(good, target, alone, farther, safe_limit,
                       _bisection_limit(low, high, rtol) + 2, name=name, hint=hint)
    return good[()] if good.ndim == 0 else good


#: A calibration searches on the host: its result is what a jitted function takes instead.
_CALIBRATE_OUTSIDE = "calibrate outside jit and pass the parameter it returns in"


@announces_slow_calls("pldjax.calibrate_event")
@float64
def calibrate_event(make_event: Callable[[np.ndarray], Event], target_epsilon, delta, *, low: float,
              high: float, increasing: bool, steps=1, rtol: float = RTOL) -> np.ndarray:
    """The parameter x in [``low``, ``high``] of the family ``make_event(x)`` whose ``steps``-fold
    composition is as far toward more privacy loss as meets (``target_epsilon``, ``delta``): the
    largest x (to ``rtol``) if epsilon increases with x (``increasing=True``: a sampling
    probability, a sensitivity, 1 / scale), the smallest if it decreases (a noise scale).

    ``make_event`` maps a float64 array of parameters (one per target) to a
    :class:`~pldjax.mechanisms.events.Event` whose parameters broadcast with it, e.g.
    ``lambda b: pj.Event(pj.noise.Laplace(b), pj.sampling.Poisson(0.01))`` (decreasing), so each
    iteration evaluates every target in one batched call of :func:`pldjax.event_epsilon`
    (pessimistic). Epsilon must be monotone in x in the stated direction.

    The answer meets its target (computed epsilon finite and <= target) and x one ``rtol`` step
    toward more loss does not, unless x is the limit ``high`` (increasing) or ``low``
    (decreasing); raises where even the other limit exceeds a target. ``target_epsilon`` > 0,
    ``delta`` in (0, 1] and ``steps`` (whole, >= 1) broadcast; 0 < ``low`` < ``high`` < inf;
    ``rtol`` in [MIN_RTOL, 1).

    Args:
      make_event: a function from a float64 NumPy array of parameters (one per target) to a
        :class:`~pldjax.mechanisms.events.Event` whose parameters broadcast with it.
      target_epsilon: in nats, > 0 and finite.
      delta: in (0, 1].
      low: the smallest parameter searched, > 0 and finite.
      high: the largest parameter searched, > ``low`` and finite.
      increasing: True if epsilon increases with the parameter, False if it decreases.
      steps: compositions of the event, a whole number >= 1; default 1.
      rtol: relative width of the final bracket, in [``MIN_RTOL``, 1) (``MIN_RTOL`` = 1e-12);
        default ``RTOL`` (1e-4).

    Returns:
      The parameter for each target, a float for scalar arguments, else a NumPy float64 array
      of the broadcast shape of ``target_epsilon``, ``delta`` and ``steps``. On the safe side: its
      computed epsilon (pessimistic, an upper bound on the truth) is at most the target, so the
      true epsilon is too.
    """
    if not callable(make_event):
        raise ValueError(f"make_event must be a function of the parameter, got {make_event!r}")
    refuse_traced("calibrate_event", (target_epsilon, delta, steps, low, high), _CALIBRATE_OUTSIDE)
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    check_whole("steps", steps, 1.0)
    check_range("low", low, 0.0, low_open=True)
    check_range("high", high, float(low), low_open=True)
    _check_rtol(rtol)
    target, delta, steps = broadcast_arguments(target_epsilon=target_epsilon, delta=delta,
                                               steps=steps)

    def alone(i, x):
        xs = np.full(target.shape, x)
        one = _configuration(_family(make_event, xs), target.shape, i)
        if one is None:  # parameters beyond the targets' shape: a caller's call is a batch too
            return _epsilons(_family(make_event, xs), steps, delta).reshape(-1)[i]
        return _epsilons(one, steps.reshape(-1)[i], delta.reshape(-1)[i])

    return _search(lambda x: _epsilons(_family(make_event, x), steps, delta), target,
                   float(low), float(high), increasing=bool(increasing),
                   start=math.sqrt(low) * math.sqrt(high), factor=2.0, rtol=rtol,
                   name="parameter in [low, high]", hint="widen [low, high] or lower steps",
                   alone=alone)


@announces_slow_calls("pldjax.calibrate_noise_multiplier")
@float64
def calibrate_noise_multiplier(target_epsilon, delta, sampling_prob, steps, *,
                               neighboring: str = "add_remove", sigma_min: float = 0.05,
                               sigma_max: float = 1e3, rtol: float = RTOL) -> np.ndarray:
    """Smallest noise multiplier (to ``rtol``) with epsilon(sigma) <= ``target_epsilon``.

    All arguments broadcast. The returned sigma lies in [``sigma_min``, ``sigma_max``] and meets
    the target (computed epsilon finite and <= target); sigma / (1 + rtol) does not. Raises when
    even ``sigma_max`` does not reach a target; returns ``sigma_min`` where that already does.
    ``rtol`` must lie in [MIN_RTOL, 1), and 0 < ``sigma_min`` < ``sigma_max`` < inf.
    (:func:`calibrate_event` of :func:`pldjax.accounting.dpsgd.dpsgd_event`, bracketed by doubling from 1: few
    distinct grids to compile.)

    Args:
      target_epsilon: in nats, > 0 and finite.
      delta: in (0, 1].
      sampling_prob: in [0, 1].
      steps: whole number of steps >= 0.
      neighboring: "add_remove" (default), "replace_one" or "replace_special" (zero-out).
      sigma_min: the smallest noise multiplier searched, > 0 and finite; default 0.05.
      sigma_max: the largest noise multiplier searched, > ``sigma_min`` and finite; default 1e3.
      rtol: relative width of the final bracket, in [``MIN_RTOL``, 1) (``MIN_RTOL`` = 1e-12);
        default ``RTOL`` (1e-4).

    Returns:
      The noise multiplier for each target, a float for scalar arguments, else a NumPy float64
      array of their broadcast shape. On the safe side: its computed epsilon (pessimistic, an
      upper bound on the truth) is at most the target, so the true epsilon is too.
    """
    refuse_traced("calibrate_noise_multiplier", (target_epsilon, delta, sampling_prob, steps),
                  _CALIBRATE_OUTSIDE)
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    Neighboring.parse(neighboring)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    check_whole("steps", steps)
    check_range("sigma_min", sigma_min, 0.0, low_open=True)
    check_range("sigma_max", sigma_max, float(sigma_min), low_open=True)
    _check_rtol(rtol)
    target, delta, q, steps = broadcast_arguments(target_epsilon=target_epsilon, delta=delta,
                                                  sampling_prob=sampling_prob, steps=steps)
    return _search(lambda sigma: _epsilons(dpsgd_event(sigma, q, neighboring), steps, delta),
                   target, float(sigma_min), float(sigma_max), increasing=False, start=1.0,
                   factor=2.0, rtol=rtol, name="noise multiplier <= sigma_max",
                   hint=f"raise sigma_max (now {sigma_max}) or lower steps / sampling_prob",
                   alone=lambda i, sigma: _epsilons(
                       dpsgd_event(sigma, q.reshape(-1)[i], neighboring), steps.reshape(-1)[i],
                       delta.reshape(-1)[i]))


@announces_slow_calls("pldjax.calibrate_steps")
@float64
def calibrate_steps(target_epsilon, delta, noise_multiplier=None, sampling_prob=None, *,
                    event: Event | None = None, neighboring: str = "add_remove",
                    max_steps: int = 10**7) -> np.ndarray:
    """Largest number of steps T <= ``max_steps`` with epsilon(T) <= ``target_epsilon``.

    Each step is a DP-SGD step (``noise_multiplier``, ``sampling_prob``, ``neighboring``), or
    ``event`` (a :class:`~pldjax.mechanisms.events.Event`, in place of those three). All arguments
    broadcast. The answer T meets the target (computed epsilon finite and <= target) and T + 1
    does not, unless T = ``max_steps`` (epsilon is non-decreasing in T, so this is the largest
    such T). ``max_steps`` is an integer in [1, MAX_STEPS]. Raises where even one step exceeds a
    target.

    Args:
      target_epsilon: in nats, > 0 and finite.
      delta: in (0, 1].
      noise_multiplier: > 0 and finite, for DP-SGD steps; None (default) with ``event``.
      sampling_prob: in [0, 1], for DP-SGD steps; None (default) with ``event``.
      event: the :class:`~pldjax.mechanisms.events.Event` of one step (array parameters are a
        batch, joining the broadcast), in place of the DP-SGD arguments; None (default): DP-SGD
        steps.
      neighboring: the relation of DP-SGD steps, "add_remove" (default), "replace_one" or
        "replace_special" (zero-out); not read with ``event``, which carries its own.
      max_steps: the largest number of steps searched, an integer in [1, ``MAX_STEPS``]
        (2^53); default 10^7.

    Returns:
      The number of steps T for each target, a NumPy int64 for scalar arguments, else a NumPy
      int64 array of the broadcast shape of the arguments (and the event's batch). On the safe
      side: the computed epsilon of T steps (pessimistic, an upper bound on the truth) is at
      most the target, so the true epsilon is too.
    """
    refuse_traced("calibrate_steps", (target_epsilon, delta, noise_multiplier, sampling_prob, event),
                  _CALIBRATE_OUTSIDE)
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    if event is None:
        Neighboring.parse(neighboring)
        check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
        check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    elif not isinstance(event, Event) or noise_multiplier is not None or sampling_prob is not None:
        raise ValueError("pass either event (a pldjax.Event) or noise_multiplier and "
                         "sampling_prob, not both")
    max_steps = check_count("max_steps", max_steps, minimum=1)
    if max_steps > MAX_STEPS:
        raise ValueError(f"max_steps must be an integer in [1, {MAX_STEPS}], got {max_steps}")
    if event is None:
        target, delta, sigma, q = broadcast_arguments(
            target_epsilon=target_epsilon, delta=delta, noise_multiplier=noise_multiplier,
            sampling_prob=sampling_prob)
        event = dpsgd_event(sigma, q, neighboring)
    else:
        # the event's batch shape joins the broadcast (its parameters, as it discretizes them)
        batch = np.broadcast_shapes(*(np.shape(p) for p in event.directions().params))
        target, delta, _ = broadcast_arguments(target_epsilon=target_epsilon, delta=delta,
                                               event=np.zeros(batch))

    def meets(steps):
        return _meets(_epsilons(event, steps, delta), target)

    low = np.ones(target.shape, np.int64)  # meets the target
    one_step = _epsilons(event, low, delta)
    _fail("number of steps", ~_meets(one_step, target), target, one_step,
          "one step already exceeds it; raise noise_multiplier or lower sampling_prob")
    limit = max_steps.bit_length() + 2
    high = np.full(target.shape, min(2, max_steps), np.int64)
    for _ in iterations(limit, "calibrate_steps (doubling)"):
        high_ok = meets(high)  # double until high exceeds the target (or reaches max_steps)
        grow = high_ok & (high < max_steps)
        if not np.any(grow):
            break
        low = np.where(grow, high, low)
        high = np.where(grow, np.minimum(2 * high, max_steps), high)
    low = np.where(high_ok, high, low)  # max_steps within the target
    high = np.where(high_ok, high + 1, high)
    for _ in iterations(limit, "calibrate_steps (bisection)"):
        if not np.any(high - low > 1):
            break
        mid = (low + high) // 2
        ok = meets(mid)
        low, high = np.where(ok, mid, low), np.where(ok, high, mid)

    def alone(i, count):
        one = _configuration(event, target.shape, i)
        if one is None:  # not expected: the event's batch is part of the targets' shape
            return _epsilons(event, np.full(target.shape, count), delta).reshape(-1)[i]
        return _epsilons(one, count, delta.reshape(-1)[i])

    low = _each_alone(low, target, alone, lambda count, k: max(count - 2**k, 1), 1, limit,
                      name="number of steps",
                      hint="one step already exceeds it; raise noise_multiplier or lower "
                           "sampling_prob")
    return low[()] if low.ndim == 0 else low


@announces_slow_calls("pldjax.calibrate_sampling_prob")
@float64
def calibrate_sampling_prob(target_epsilon, delta, noise_multiplier, steps, *,
                            neighboring: str = "add_remove", q_min: float = 1e-8,
                            rtol: float = RTOL) -> np.ndarray:
    """Largest sampling probability (to ``rtol``) with epsilon <= ``target_epsilon`` (1 if q = 1
    meets it). All arguments broadcast. The answer lies in [``q_min``, 1] and meets the target
    (computed epsilon finite and <= target); q (1 + rtol) does not. Raises where even ``q_min``
    exceeds a target. ``q_min`` in (0, 1], ``rtol`` in [MIN_RTOL, 1). (:func:`calibrate_event` of
    :func:`pldjax.accounting.dpsgd.dpsgd_event`, bracketed downwards from q = 1 by factors of 10: a tiny q
    needs a very fine (large) grid, so q_min is only evaluated where nothing larger meets the
    target.)

    Args:
      target_epsilon: in nats, > 0 and finite.
      delta: in (0, 1].
      noise_multiplier: > 0 and finite.
      steps: whole number of steps >= 0.
      neighboring: "add_remove" (default), "replace_one" or "replace_special" (zero-out).
      q_min: the smallest sampling probability searched, in (0, 1]; default 1e-8.
      rtol: relative width of the final bracket, in [``MIN_RTOL``, 1) (``MIN_RTOL`` = 1e-12);
        default ``RTOL`` (1e-4).

    Returns:
      The sampling probability for each target, a float for scalar arguments, else a NumPy
      float64 array of their broadcast shape. On the safe side: its computed epsilon
      (pessimistic, an upper bound on the truth) is at most the target, so the true epsilon is
      too.
    """
    refuse_traced("calibrate_sampling_prob", (target_epsilon, delta, noise_multiplier, steps),
                  _CALIBRATE_OUTSIDE)
    check_range("target_epsilon", target_epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    Neighboring.parse(neighboring)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_whole("steps", steps)
    target, delta, sigma, steps = broadcast_arguments(
        target_epsilon=target_epsilon, delta=delta, noise_multiplier=noise_multiplier, steps=steps)
    check_range("q_min", q_min, 0.0, 1.0, low_open=True)
    _check_rtol(rtol)
    return _search(lambda q: _epsilons(dpsgd_event(sigma, q, neighboring), steps, delta),
                   target, float(q_min), 1.0, increasing=True, start=1.0, factor=10.0,
                   rtol=rtol, name="sampling probability >= q_min",
                   hint="raise noise_multiplier or lower steps",
                   alone=lambda i, q: _epsilons(
                       dpsgd_event(sigma.reshape(-1)[i], q, neighboring), steps.reshape(-1)[i],
                       delta.reshape(-1)[i]))
