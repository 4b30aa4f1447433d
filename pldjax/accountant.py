"""A DP-SGD privacy accountant whose state is a pytree, for use inside jitted training steps.

The state records the run as segments of equal steps (noise multiplier, sampling probability,
count): a step with the same parameters as the last one increments its count, a change opens a new
segment. Recording is pure and jit-able (arrays of fixed capacity, no host calls); reading
epsilon or delta composes the segments exactly (:func:`pldjax.compose_schedule`) on the host, at
any time. Any number of steps fits; only the number of parameter *changes* is bounded by the
capacity (``init(capacity=...)``, default 64). A step that would need one more segment than the
capacity sets ``overflow``, after which readings raise instead of reporting a wrong value; so does
a step recorded under jit with invalid values (which cannot raise there).

The state's 64-bit leaves are stored as exact uint32 bit pairs (:func:`pldjax.precision.pack`), so
it crosses a caller's jit, vmap and save/load bit for bit whatever ``jax_enable_x64``. Parameters
that arrive in float32 (with x64 off, a caller's jit rounds Python floats to float32) are recorded
pessimistically: the noise multiplier as the smallest real number and the sampling probability as
the largest (at most 1) that round to the value received.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax import io
from pldjax.dpsgd import compose_schedule
from pldjax.mechanisms import identity
from pldjax.precision import float64, lower_of_rounded, pack, unpack, upper_of_rounded
from pldjax.validate import check_count, check_range, is_traced

CAPACITY = 64


class AccountantState(NamedTuple):
    """Segments (noise_multiplier, sampling_prob, steps) of a DP-SGD run; ``count`` are in use.
    64-bit leaves are packed (uint32 pairs, see the module docstring); :func:`segments` reads them."""

    noise_multiplier: jax.Array  # (capacity,) float64, packed
    sampling_prob: jax.Array  # (capacity,) float64, packed
    steps: jax.Array  # (capacity,) int64, packed
    count: jax.Array  # () int64, packed: segments in use
    overflow: jax.Array  # () bool: a step did not fit


def _plain(capacity: int) -> AccountantState:
    return AccountantState(jnp.ones(capacity), jnp.zeros(capacity),
                           jnp.zeros(capacity, jnp.int64), jnp.zeros((), jnp.int64),
                           jnp.zeros((), bool))


def _unpacked(state: AccountantState) -> AccountantState:
    capacity = state.noise_multiplier.shape[0]
    return unpack(state, jax.eval_shape(lambda: _plain(capacity)))


@float64
def init(capacity: int = CAPACITY) -> AccountantState:
    """An empty run (no steps: epsilon 0)."""
    capacity = check_count("capacity", capacity, minimum=1)
    return pack(_plain(capacity))


def _step(packed: AccountantState, noise_multiplier, sampling_prob, steps) -> AccountantState:
    state = _unpacked(packed)
    sigma = lower_of_rounded(noise_multiplier)
    q = jnp.minimum(upper_of_rounded(sampling_prob), 1.0)
    steps = jnp.asarray(steps, jnp.int64)
    # under jit bad values cannot raise: the step is not recorded and the state is marked, so
    # that every later reading raises (NaN fails every comparison here)
    valid = (jnp.isfinite(sigma) & (sigma > 0) & (lower_of_rounded(sampling_prob) >= 0)
             & (lower_of_rounded(sampling_prob) <= 1) & (steps >= 0))
    last = jnp.maximum(state.count - 1, 0)
    same = (state.count > 0) & (state.noise_multiplier[last] == sigma) & (
        state.sampling_prob[last] == q)
    capacity = state.steps.shape[0]
    room = state.count < capacity
    slot = jnp.where(same, last, jnp.minimum(state.count, capacity - 1))
    fits = (same | room) & valid
    new = AccountantState(
        state.noise_multiplier.at[slot].set(jnp.where(fits, sigma, state.noise_multiplier[slot])),
        state.sampling_prob.at[slot].set(jnp.where(fits, q, state.sampling_prob[slot])),
        state.steps.at[slot].add(jnp.where(fits, steps, 0)),
        jnp.where(same | ~room | ~valid, state.count, state.count + 1),
        state.overflow | ~fits,
    )
    return pack(new)


_step_jit = jax.jit(_step)


@float64
def step(state: AccountantState, noise_multiplier, sampling_prob, steps=1) -> AccountantState:
    """Record ``steps`` DP-SGD steps with these parameters (pure; works under jit)."""
    if not is_traced((noise_multiplier, sampling_prob, steps)):
        check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
        check_range("sampling_prob", sampling_prob, 0.0, 1.0)
        check_range("steps", steps, 0.0)
        if not float(np.asarray(steps)).is_integer():
            raise ValueError(f"steps must be a whole number >= 0, got {steps!r}")
    kernel = _step if is_traced((state, noise_multiplier, sampling_prob, steps)) else _step_jit
    return kernel(state, noise_multiplier, sampling_prob, steps)


@float64
def segments(state: AccountantState) -> list[tuple[float, float, int]]:
    """The recorded run as (noise_multiplier, sampling_prob, steps), on the host."""
    state = _unpacked(state)
    if bool(np.asarray(state.overflow)):
        raise ValueError(
            f"the accountant's run is not fully recorded: more parameter changes than its "
            f"capacity ({state.steps.shape[0]}; use init(capacity=...)), or a step under jit with "
            f"an invalid noise_multiplier (not finite > 0), sampling_prob (not in [0, 1]) or "
            f"steps (< 0)")
    count = int(np.asarray(state.count))
    return [(float(s), float(q), int(t)) for s, q, t in zip(
        np.asarray(state.noise_multiplier)[:count], np.asarray(state.sampling_prob)[:count],
        np.asarray(state.steps)[:count], strict=True) if t > 0]


def pld(state: AccountantState, *, neighboring: str = "add_remove"):
    """The run's PLD (pessimistic; both directions), or the identity for an empty run."""
    run = segments(state)
    return compose_schedule(run, neighboring=neighboring) if run else identity()


@float64
def epsilon(state: AccountantState, delta, *, neighboring: str = "add_remove") -> float:
    """Smallest epsilon with the run (epsilon, delta)-DP: an upper bound (pessimistic PLD)."""
    check_range("delta", delta, 0.0, 1.0)
    return float(pld(state, neighboring=neighboring).epsilon(delta))


@float64
def delta(state: AccountantState, epsilon, *, neighboring: str = "add_remove") -> float:
    """Smallest delta with the run (epsilon, delta)-DP: an upper bound (pessimistic PLD)."""
    check_range("epsilon", epsilon, 0.0)
    return float(pld(state, neighboring=neighboring).delta(epsilon))


def save(path, state: AccountantState) -> None:
    """Write the state (npz or JSON, exact; see :mod:`pldjax.io`)."""
    io.save(path, state, kind="accountant", params={"capacity": int(state.steps.shape[0])})


def load(path, capacity: int = CAPACITY) -> AccountantState:
    """Read a state written by :func:`save` (of this capacity)."""
    return io.load(path, init(capacity), kind="accountant", params={"capacity": capacity})
