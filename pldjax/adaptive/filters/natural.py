"""The natural filter (Regehr et al. 2026, Alg. 2) and the additive discretized profile filter
(Alg. 3, §7).

The natural filter accepts a query when the composition of everything accepted so far with it is
still dominated by the budget B. It is NOT free in general (§6: its worst-case cost V_k can exceed
B); for (epsilon, delta) budgets and symmetric queries Thm 9 bounds the damage, and the additive
profile filter is the filter that proof runs on: it keeps a budget for each band of privacy loss
and reports the (chi (epsilon + 1), chi delta) guarantee with the constants of the proof.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.adaptive.filters.base import Filter, keep_if, make_filter, query_directions
from pldjax.core.align import STEP_RTOL, onto_step, regrid_kernel
from pldjax.core.grid import MAX_SIZE, MAX_STEP, check_size, next_pow2
from pldjax.core.pld import PLD, unchecked_pld
from pldjax.core.precision import add_up, float64
from pldjax.core.validation import check_count, check_range, is_traced
from pldjax.kernels.compose import convolve_kernel
from pldjax.kernels.dominance import ROUNDOFF, dominance_excess_kernel


# -- natural filter -------------------------------------------------------------------------------
class NaturalState(NamedTuple):
    """The composition of the accepted queries, both directions, on a fixed window."""

    probs: jax.Array  # (2, size)
    inf_mass: jax.Array  # (2,)


def _into_window(probs, inf_mass, offset, window_offset, size: int):
    """Masses re-indexed onto ``size`` points from ``window_offset``: mass below moves up to the
    first point, mass above goes to +inf (both pessimistic)."""
    index = jnp.clip(offset + jnp.arange(probs.shape[-1]) - window_offset, 0, size)
    kept = jax.ops.segment_sum(probs, index, num_segments=size + 1)
    return kept[:size], inf_mass + kept[size]


def _natural_core(settings, state, query, aligned: bool):
    step, window, budget_arrays, delta_slack = settings
    size = state.probs.shape[-1]
    probs, inf_mass, offset, q_step = query_directions(query, "natural")
    fits = jnp.asarray(True)
    if not aligned:  # traced steps (a caller's jit): coarsen onto the filter's step if finer
        fits = jnp.all(q_step <= step * (1 + STEP_RTOL))
        probs, offset = jax.vmap(functools.partial(
            regrid_kernel, size=probs.shape[-1] + 2, pessimistic=True))(
                probs, offset, q_step, jnp.full(q_step.shape, step))
    if probs.shape[0] == 1:
        probs, inf_mass, offset = (jnp.concatenate([a, a]) for a in (probs, inf_mass, offset))

    def one(s_probs, s_inf, w_off, q_probs, q_inf, q_off, bp, bi, bo, bh):
        c_probs, c_inf, c_off = convolve_kernel(s_probs, s_inf, w_off, q_probs, q_inf, q_off,
                                                step, pessimistic=True)
        c_probs, c_inf = _into_window(c_probs, c_inf, c_off, w_off, size)
        excess = dominance_excess_kernel(c_probs, c_inf, w_off, step, bp, bi, bo, bh)
        return c_probs, c_inf, excess

    new_probs, new_inf, excess = jax.vmap(one)(state.probs, state.inf_mass, window, probs,
                                               inf_mass, offset, *budget_arrays)
    # the identity, the unit of composition, is accepted and keeps the state exactly
    # (composed, it would add the convolution's per-bin round-off allowance)
    identity = jnp.all((inf_mass == 0) & jnp.all(
        probs == jnp.where(jnp.arange(probs.shape[-1]) == -offset[:, None], 1.0, 0.0), axis=-1))
    accepted = fits & (identity | jnp.all(excess <= delta_slack + ROUNDOFF))
    composed = keep_if(~identity, NaturalState(new_probs, new_inf), state)
    return keep_if(accepted, composed, state), accepted


@float64
def natural_filter(budget: PLD, *, step: float | None = None, size: int | None = None,
            delta_slack: float = 0.0) -> Filter:
    """The natural filter: accept L when (accepted so far) (+) L is dominated by ``budget``.

    The comparison is exact between the grid PLDs (the budget is taken as given: build it with
    ``pessimistic=False`` to compare with an under-estimate of a mechanism's true curve) up to
    ``delta_slack`` + ROUNDOFF. The composition lives on ``size`` points (default: the budget's
    loss range) at ``step`` (default: the budget's step); mass falling outside is moved
    pessimistically. The budget may sit on any step (compared at both grids' points, exactly).
    Each query is aligned onto ``step`` on the safe (pessimistic) side
    (:func:`pldjax.core.align.onto_step`): exactly when its step is a multiple of ``step``, otherwise
    by connect-the-dots, which replaces it by a PLD that dominates it. Under jit (traced query
    steps) a query on a step at most ``step`` is coarsened so in the compiled call; one on a
    coarser step is rejected (it cannot be put on the filter's grid in a static shape). The
    interaction is NOT dominated by the budget in general: its worst case is V_k
    (Regehr et al. 2026, Thm 6).

    The composition is an FFT convolution with a per-bin round-off allowance inside its support
    (pessimistic, about 1e-16 a bin): against a budget whose curve falls below what that adds up
    to (a GDP budget far in its tail) while the composition's support reaches there, a
    ``delta_slack`` of about 1e-12 lets the query through.

    Args:
      budget: one unbatched PLD (anything else raises a ValueError), taken as given.
      step: the composition's grid step, in nats: finite, > 0 and at most 256 (grid.MAX_STEP), and
        not so small that the budget's losses need more than 2**25 points on it (ValueError).
        Default: the budget's step (that of its first direction).
      size: the number of points of the composition's window, an integer in [2, 2**25]. Default: the
        smallest power of two at least 2 more than the number of steps of ``step`` that the budget's
        losses span.
      delta_slack: how far, besides ROUNDOFF, the composition's privacy curve may rise above the
        budget's, in [0, 1]; default 0.

    Returns:
      A :class:`Filter`. Its ``spend`` takes a pessimistic PLD (there is no cost in numbers for this
      filter); its ``remaining`` reads the composition of the accepted queries, a pessimistic PLD
      with both directions; its ``guarantee`` ``{"budget", "free"}`` holds the budget and a reminder
      that the interaction is dominated by it only for some query families (V_k, Thm 6; see
      :func:`pldjax.natural_filter_free`): the filter promises no guarantee of its own.
    """
    if not isinstance(budget, PLD) or budget.batch_shape:
        raise ValueError("natural: budget must be one (unbatched) PLD")
    check_range("delta_slack", delta_slack, 0.0, 1.0)
    # the budget's directions stacked on the host (NumPy: no compiled program)
    directions = budget.directions()
    width = max(d.size for d in directions)
    b_probs = np.stack([np.pad(np.asarray(d.probs), (0, width - d.size)) for d in directions])
    b_inf, b_off, b_step = (np.stack([np.asarray(getattr(d, name), dtype) for d in directions])
                            for name, dtype in (("inf_mass", np.float64), ("offset", np.int64),
                                                ("step", np.float64)))
    if len(b_probs) == 1:
        b_probs, b_inf, b_off, b_step = (np.concatenate([a, a]) for a in (b_probs, b_inf, b_off,
                                                                          b_step))
    step = float(b_step[0]) if step is None else float(step)
    check_range("step", step, 0.0, MAX_STEP, low_open=True)
    low, high = (np.floor(b_off * b_step / step),
                 np.ceil((b_off + b_probs.shape[-1] - 1) * b_step / step))
    if not np.max(high - low) + 2 <= MAX_SIZE:  # also where a tiny step overflows float64
        raise ValueError(f"step = {step!r} puts the budget's losses on more than grid.MAX_SIZE "
                         f"= {MAX_SIZE} points (a memory guard); use a larger step")
    low, high = low.astype(np.int64), high.astype(np.int64)
    if size is None:
        size = next_pow2(int(np.max(high - low)) + 2)
    size = check_size("size", size, minimum=2, maximum=MAX_SIZE)

    def init():
        identity = np.zeros((2, size))
        identity[np.arange(2), np.clip(-low, 0, size - 1)] = 1.0
        return NaturalState(identity, np.zeros((2,)))

    def prepare(state, query):
        if not isinstance(query, PLD):
            shown = query.tolist() if isinstance(query, np.ndarray) else query  # (as given)
            raise ValueError(f"natural: the query must be a pessimistic PLD (this filter has no "
                             f"cost in numbers), got {shown!r}")
        if not is_traced(query.step):
            return _filling_the_transform(onto_step(query, step, "natural"), size), {"aligned": True}
        return query, {"aligned": False}

    def remaining(state):
        """The composition so far (a pessimistic PLD); compare it with the budget."""
        # placed, not jnp.asarray (a program of its own on the host; traced alike under jit)
        on_step = jax.device_put(np.float64(step))
        forward, back = (unchecked_pld(state.probs[i], state.inf_mass[i], jax.device_put(low[i]),
                                       on_step, True) for i in (0, 1))
        return PLD.from_directions(forward, back)

    return make_filter("natural", {"step": step, "size": size, "delta_slack": float(delta_slack)},
                       {"budget": budget,
                        "free": "only for some query families: see V_k (Thm 6)"},
                       init=init, core=_natural_core, remaining=remaining, prepare=prepare,
                       settings=(np.float64(step), low, (b_probs, b_inf, b_off, b_step),
                                 np.float64(delta_slack)),
                       static=("aligned",))


def _filling_the_transform(query: PLD, size: int) -> PLD:
    """``query`` with zero masses appended above each direction's window, up to the most points
    that the convolution with a state of ``size`` points takes on the same FFT length
    (:func:`~pldjax.kernels.compose.convolve_kernel`'s): the same values, and one compiled
    spend for all queries convolved on one FFT length, any length up to the state's (each
    query length was a program of its own, about a second each on a CPU)."""
    def padded(d: PLD) -> PLD:
        width = next_pow2(size + d.size - 1) - size + 1
        xp = jnp if is_traced(d.probs) else np
        return unchecked_pld(xp.pad(d.probs, (0, width - d.size)), d.inf_mass, d.offset, d.step,
                             d.pessimistic)

    return query.map_directions(padded)


# -- additive discretized profile filter ----------------------------------------------------------
def _rr_composition_delta(m: int, eps_rr: float, epsilon: float) -> float:
    """H_{e^epsilon} of m compositions of eps_rr-randomized response (binomial closed form)."""
    if m == 0:
        return 0.0
    truthful = 1.0 / (1.0 + math.exp(-eps_rr))
    last = math.ceil((m - epsilon / eps_rr) / 2) - 1  # largest count of flips with loss > epsilon
    if last < 0:
        return 0.0
    from scipy import stats  # here: scipy.stats takes 1-2 s to import, and only this needs it

    under_p = stats.binom.logcdf(last, m, 1.0 - truthful)
    under_q = stats.binom.logcdf(last, m, truthful)
    return float(math.exp(under_p) - math.exp(epsilon + under_q))


def _most_compositions(eps_rr: float, epsilon: float, bound: float) -> int:
    """Largest m with H_{e^epsilon}(RR_eps_rr^{(x) m}) <= bound (the curve grows with m)."""
    # checked first: the search below would take over a hundred binomial tails near 2^62, each
    # slow at such counts (5 s before the refusal of epsilon = 1e-300)
    if _rr_composition_delta(2**62, eps_rr, epsilon) <= bound:
        raise ValueError(
            f"additive_profile: the band of losses up to {eps_rr:.3g} nats would take more than "
            f"2^62 queries: epsilon = {epsilon!r} is too small (or rounds too large) for "
            "Eq. (1)'s bands")
    high = 1
    while _rr_composition_delta(high, eps_rr, epsilon) <= bound:
        high *= 2
    low = high // 2 if high > 1 else 0
    while high - low > 1:
        mid = (low + high) // 2
        if _rr_composition_delta(mid, eps_rr, epsilon) <= bound:
            low = mid
        else:
            high = mid
    return low


def additive_parameters(epsilon: float, delta: float, rounds: int):
    """Eq. (1): band edges eps_1 .. eps_{n-1} (eps_n = inf) and the budgets l*_1 .. l*_n."""
    n = 1 + math.ceil(math.log2(rounds * (epsilon + 2) / epsilon))
    edges = np.array([(epsilon + 2) / 2 ** (n - 1 - i) for i in range(1, n)])
    budgets = np.empty(n)
    budgets[0] = rounds
    for i in range(2, n):
        budgets[i - 1] = 8 * (_most_compositions(edges[i - 2], epsilon, 2 * delta) + 1)
    budgets[n - 1] = 4 * delta
    return edges, budgets


def additive_guarantee(epsilon: float, delta: float, n: int) -> tuple[float, float]:
    """Thm 15's (epsilon', delta') with the proof's constants:
    n 2 ceil(log 1/delta) (9 epsilon + 2) and n (32 ceil(log 1/delta) + 4) delta."""
    logs = math.ceil(math.log(1.0 / delta))
    return n * 2 * logs * (9 * epsilon + 2), n * (32 * logs + 4) * delta


class AdditiveState(NamedTuple):
    spent: jax.Array  # (n,) sum of the accepted queries' discretized profiles
    rounds: jax.Array  # queries accepted so far


def _profile(probs, inf_mass, offset, step, edges):
    """disc_eps(L) of a symmetric grid PLD: P-mass of eps_{i-1} <= |Z| < eps_i, the last band
    also holding |Z| >= eps_{n-1} and the atom at +inf."""
    z = jnp.abs((offset + jnp.arange(probs.shape[-1])) * step)
    band = jnp.searchsorted(edges, z, side="right")
    profile = jax.ops.segment_sum(probs, band, num_segments=edges.shape[0] + 1)
    return profile.at[-1].add(inf_mass)


def _additive_profile_core(settings, state, query):
    edges, budgets, rounds = settings
    if isinstance(query, PLD):
        if query.reverse is not None:
            raise ValueError("additive_profile: queries must be symmetric PLDs (Thm 11); "
                             "this one has two directions")
        probs, inf_mass, offset, step = query_directions(query, "additive_profile")
        profile = _profile(probs[0], inf_mass[0], offset[0], step[0], edges)
    else:
        profile = jnp.broadcast_to(query, budgets.shape)
    new = AdditiveState(add_up(state.spent, profile), state.rounds + 1)
    accepted = (state.rounds < rounds) & jnp.all(new.spent <= budgets)
    return keep_if(accepted, new, state), accepted


@float64
def additive_profile_filter(epsilon: float, delta: float, rounds: int) -> Filter:
    """The additive discretized profile filter (Alg. 3) with the parameters of eq. (1), for up to
    ``rounds`` symmetric queries: a query's profile (its mass in bands of abs(loss)) is subtracted
    from per-band budgets. Accepts at least what the natural (epsilon, delta) filter accepts
    (Thm 14), and the interaction is (epsilon', delta')-DP with the explicit constants of Thm 15
    (``guarantee``; chi (epsilon + 1), chi delta with chi = O((log k + log(1 + 1/epsilon))
    log(1/delta))).

    Query: a symmetric pessimistic PLD (a PLD that dominates the true one has a profile whose
    generalized randomized response still dominates the query, Thm 11), or a profile vector.

    Args:
      epsilon: the epsilon of eq. (1), in nats: finite and > 0 (one so small that a band would take
        more than 2^62 queries raises a ValueError).
      delta: the delta of eq. (1), in (0, 0.25).
      rounds: the most queries the filter accepts, an integer in [1, 2^53].

    Returns:
      A :class:`Filter`. Its ``spend`` takes a symmetric pessimistic PLD (one direction; a PLD with
      two raises a ValueError) or a profile vector (the n bands' masses, each >= 0); its
      ``remaining`` reads ``{"bands": ..., "rounds": ...}``, the budget left in each band and the
      number of queries left; its ``guarantee`` ``{"epsilon", "delta", "bands", "edges", "budgets"}``
      holds epsilon' and delta' (the interaction is (epsilon', delta')-DP, Thm 15), the number n of
      bands, the band edges (nats) and the bands' initial budgets.
    """
    check_range("epsilon", epsilon, 0.0, low_open=True)
    check_range("delta", delta, 0.0, 0.25, low_open=True, high_open=True)
    rounds = check_count("rounds", rounds, minimum=1)
    if rounds > 2**53:
        shown = rounds if rounds < 10**30 else f"an integer of {len(str(rounds))} digits"
        raise ValueError(f"rounds must be an integer in [1, 2^53], got {shown}")
    edges, budgets = additive_parameters(epsilon, delta, rounds)
    n = len(budgets)
    eps_out, delta_out = additive_guarantee(epsilon, delta, n)

    def init():
        return AdditiveState(np.zeros((n,)), np.zeros((), np.int64))

    def remaining(state):
        return {"bands": budgets - state.spent, "rounds": rounds - state.rounds}

    return make_filter("additive_profile",
                       {"epsilon": float(epsilon), "delta": float(delta), "rounds": rounds},
                       {"epsilon": eps_out, "delta": delta_out, "bands": n, "edges": edges,
                        "budgets": budgets},
                       init=init, core=_additive_profile_core, remaining=remaining,
                       settings=(edges, budgets, np.int64(rounds)), cost_shape=(n,))
