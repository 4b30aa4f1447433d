"""DP-SGD as optax gradient transformations with the privacy accounting in the optimizer state.

* :func:`dpsgd`: clipping and Gaussian noise by optax's own ``differentially_private_aggregate``
  (noise standard deviation ``l2_norm_clip * noise_multiplier`` on the sum of clipped per-example
  gradients, divided by the batch size), then SGD. The number of steps the budget allows is
  calibrated once, on the host, when the transformation is built (:func:`calibrate_steps`); inside
  the jitted step the state counts steps and records them in a :mod:`pldjax.accountant` state, and
  once another step would exceed the budget the updates become zeros (and nothing more is
  recorded).
* :func:`individual_dpsgd`: full-batch DP gradient descent with per-example (individual)
  accounting: one GDP residue filter per example, charged each step its own clipped gradient norm
  (an example whose clipped norm is c contributes a Gaussian mechanism G_nu with
  nu = c / (l2_norm_clip * noise_multiplier)); an example whose filter rejects leaves training (its
  gradient is zeroed from then on, before clipping and noise).

Noise keys are explicit: both take a ``key`` and have no default.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax as _optax
from optax import contrib as _contrib

from pldjax import accountant as _accountant
from pldjax import filters as _filters
from pldjax.calibrate import calibrate_steps
from pldjax.precision import float64, pack, unpack
from pldjax.validate import check_count, check_range


class DPSGDState(NamedTuple):
    aggregate: _optax.OptState
    sgd: _optax.OptState
    accountant: _accountant.AccountantState
    steps: jax.Array  # steps taken (with non-zero updates): int64, packed (pldjax.precision.pack)
    max_steps: jax.Array  # steps the budget allows: int64, packed


def _check_key(key) -> None:
    if key is None:
        raise ValueError("key must be a jax.random key (no default noise key is ever used)")


@float64
def dpsgd(learning_rate, l2_norm_clip: float, noise_multiplier: float, sampling_prob: float, *,
          key, epsilon_budget: float, delta: float,
          neighboring: str = "add_remove") -> _optax.GradientTransformation:
    """DP-SGD over per-example gradients (leading batch axis), stopping at the budget.

    ``sampling_prob``: the Poisson sampling rate the caller uses to form batches (the accounting
    assumes it). ``steps(state)[1]`` is the number of steps the budget allows; after that many
    updates the transformation returns zeros. ``epsilon(state, delta)`` reads the privacy spent so far.
    """
    _check_key(key)
    check_range("l2_norm_clip", l2_norm_clip, 0.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    allowed = int(calibrate_steps(epsilon_budget, delta, noise_multiplier, sampling_prob,
                                  neighboring=neighboring))
    aggregate = _contrib.differentially_private_aggregate(l2_norm_clip, noise_multiplier, key)
    sgd = _optax.sgd(learning_rate)

    @float64
    def init(params):
        return DPSGDState(aggregate.init(params), sgd.init(params),
                          _accountant.init(capacity=1), pack(jnp.zeros((), jnp.int64)),
                          pack(jnp.asarray(allowed, jnp.int64)))

    @float64
    def update(grads, state, params=None):
        noised, aggregate_state = aggregate.update(grads, state.aggregate)
        updates, sgd_state = sgd.update(noised, state.sgd, params)
        count = jax.ShapeDtypeStruct((), jnp.int64)
        taken, allowed_steps = unpack((state.steps, state.max_steps), (count, count))
        go = taken < allowed_steps
        updates = jax.tree_util.tree_map(lambda u: jnp.where(go, u, jnp.zeros_like(u)), updates)
        recorded = _accountant.step(state.accountant, noise_multiplier, sampling_prob,
                                    go.astype(jnp.int64))
        return updates, DPSGDState(aggregate_state, sgd_state, recorded,
                                   pack(taken + go.astype(jnp.int64)), state.max_steps)

    return _optax.GradientTransformation(init, update)


def epsilon(state: DPSGDState, delta: float) -> float:
    """Privacy spent so far by the steps taken (an upper bound)."""
    return _accountant.epsilon(state.accountant, delta)


@float64
def steps(state: DPSGDState) -> tuple[int, int]:
    """(steps taken, steps the budget allows), read from the packed state."""
    count = jax.ShapeDtypeStruct((), jnp.int64)
    taken, allowed = unpack((state.steps, state.max_steps), (count, count))
    return int(taken), int(allowed)


class IndividualState(NamedTuple):
    aggregate: _optax.OptState
    sgd: _optax.OptState
    filters: _filters.residue.ResidueState  # one per example (leading axis), packed
    active: jax.Array  # (examples,) bool: still training


@float64
def individual_dpsgd(learning_rate, l2_norm_clip: float, noise_multiplier: float, *, key,
                     mu_budget: float, num_examples: int,
                     delta_slack: float = 0.0) -> _optax.GradientTransformation:
    """Full-batch DP gradient descent with one GDP residue filter per example (each example's
    interaction is mu_budget-GDP). Per-example gradients of the WHOLE dataset (leading axis of
    size ``num_examples``) are expected at every step."""
    _check_key(key)
    check_range("l2_norm_clip", l2_norm_clip, 0.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    num_examples = check_count("num_examples", num_examples, minimum=1)
    budget = _filters.gdp_residue_filter(mu_budget, delta=delta_slack)
    aggregate = _contrib.differentially_private_aggregate(l2_norm_clip, noise_multiplier, key)
    sgd = _optax.sgd(learning_rate)

    @float64
    def init(params):
        states = jax.tree_util.tree_map(
            lambda x: jnp.broadcast_to(x, (num_examples,) + x.shape), budget.init())
        return IndividualState(aggregate.init(params), sgd.init(params), states,
                               jnp.ones((num_examples,), bool))

    @float64
    def update(grads, state, params=None):
        leaves = jax.tree_util.tree_leaves(grads)
        shapes = [jnp.shape(g) for g in leaves]
        if not leaves or any(shape[:1] != (num_examples,) for shape in shapes):
            raise ValueError(f"grads must hold per-example gradients of all num_examples = "
                             f"{num_examples} examples (leading axis), got leaf shapes {shapes}")
        # norms in float64 whatever the model's precision: nu is a privacy cost
        norms = jnp.sqrt(sum(jnp.sum(jnp.asarray(g, jnp.float64).reshape(num_examples, -1) ** 2,
                                     axis=1) for g in leaves))
        nu = jnp.minimum(norms, l2_norm_clip) / (l2_norm_clip * noise_multiplier)
        nu = jnp.where(state.active, nu, 0.0)
        filters, accepted = jax.vmap(budget.spend)(state.filters, nu)
        active = state.active & accepted
        masked = jax.tree_util.tree_map(
            lambda g: g * active.reshape((-1,) + (1,) * (g.ndim - 1)).astype(g.dtype), grads)
        noised, aggregate_state = aggregate.update(masked, state.aggregate)
        updates, sgd_state = sgd.update(noised, state.sgd, params)
        return updates, IndividualState(aggregate_state, sgd_state, filters, active)

    return _optax.GradientTransformation(init, update)


@float64
def remaining_mu(state: IndividualState) -> jax.Array:
    """Each example's remaining GDP budget (float64)."""
    return unpack(state.filters.mu, jax.ShapeDtypeStruct((), jnp.float64))
