"""DP-SGD as optax gradient transformations with the privacy accounting in the optimizer state.

* :func:`dpsgd`: per-example clipping, then Gaussian noise by optax's own
  ``differentially_private_aggregate`` (noise standard deviation ``l2_norm_clip *
  noise_multiplier`` on the sum of clipped per-example gradients, divided by the batch size), then
  SGD. The number of steps the budget allows is
  calibrated once, on the host, when the transformation is built (:func:`calibrate_steps`); inside
  the jitted step the state counts steps and records them in a :mod:`pldjax.accounting.accountant` state, and
  once another step would exceed the budget the updates become zeros (and nothing more is
  recorded).
* :func:`individual_dpsgd`: full-batch DP gradient descent with per-example (individual)
  accounting: one GDP residue filter per example, charged each step its own clipped gradient norm
  (an example whose clipped norm is c contributes a Gaussian mechanism G_nu with
  nu = c / (l2_norm_clip * noise_multiplier)); an example whose filter rejects leaves training (its
  gradient is zeroed from then on, before clipping and noise). With ``sampling_prob`` it is
  Poisson-sampled DP-SGD with per-example GDP residue filters: each step costs every active
  example the subsampled-Gaussian PLD at its own sensitivity c_i = min(||g_i||, C) / C, read from
  a :class:`pldjax.adaptive.filters.residue.ResidueTable` built once on the host.

Noise keys are explicit: both take a ``key`` and have no default.

Clipping is pldjax's in both (:func:`_clipped`; optax's, applied again after it, can only
scale down): a clipped gradient's norm stays at most ``l2_norm_clip`` after rounding to the
model's precision (bfloat16 included), and an example whose gradient is not finite (NaN or inf)
is left out of the sum and, with per-example budgets, charged as a zero gradient. Rounding in the
sum over examples and in the noise itself is not accounted for, as in other DP-SGD libraries.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax as _optax
from optax import contrib as _contrib

from pldjax.accounting import accountant as _accountant
from pldjax.accounting.calibration import calibrate_steps
from pldjax.accounting.dpsgd import dpsgd_event
from pldjax.adaptive import filters as _filters
from pldjax.core.namespace import public_dir
from pldjax.core.notice import announces_slow_calls
from pldjax.core.precision import float64, pack, unpack
from pldjax.core.validation import check_count, check_range
from pldjax.kernels.gaussian_dp import MAX_MU


class DPSGDState(NamedTuple):
    aggregate: _optax.OptState
    sgd: _optax.OptState
    accountant: _accountant.AccountantState
    steps: jax.Array  # steps taken (with non-zero updates): int64, packed (pldjax.core.precision.pack)
    max_steps: jax.Array  # steps the budget allows: int64, packed


def _check_key(key) -> None:
    if key is None:
        raise ValueError("key must be a jax.random key (no default noise key is ever used)")


def _one_program(update):
    """A transformation's ``update`` as one jitted program, run in float64: called outside a jit
    (a notebook's loop) it compiles once for its shapes, where its operations one by one compiled
    a program each (DP-SGD's update: 46 programs and 2.3 s, then 4 ms a step, against 0.5 s and
    0.1 ms); inside the caller's jit it is traced inline."""
    return float64(jax.jit(update))


@float64
@announces_slow_calls("pldjax.optax.dpsgd")
def dpsgd(learning_rate, l2_norm_clip: float, noise_multiplier: float, sampling_prob: float, *,
          key, epsilon_budget: float, delta: float,
          neighboring: str = "add_remove") -> _optax.GradientTransformation:
    """DP-SGD over per-example gradients (leading batch axis), stopping at the budget.

    ``sampling_prob``: the Poisson sampling rate the caller uses to form batches (the accounting
    assumes it). ``steps(state)[1]`` is the number of steps the budget allows; after that many
    updates the transformation returns zeros. ``epsilon(state, delta)`` reads the privacy spent so far.

    Args:
      learning_rate: the SGD learning rate, given to ``optax.sgd`` (a number or an optax schedule).
      l2_norm_clip: C, the per-example clipping norm, finite and > 0.
      noise_multiplier: sigma, finite and > 0: the noise on the sum of clipped gradients has standard
        deviation C * sigma.
      sampling_prob: in [0, 1].
      key: a ``jax.random`` key for the noise; required (None raises a ValueError).
      epsilon_budget: the epsilon (nats) the run may reach at ``delta``, finite and > 0; a budget that
        one step already exceeds raises a ValueError.
      delta: in (0, 1].
      neighboring: "add_remove" (default), "replace_one" or "replace_special" (zero-out), the
        relation the accounting uses (:class:`pldjax.neighboring.Neighboring`).

    Returns:
      An optax ``GradientTransformation``. Its ``update(grads, state, params=None)`` takes
      per-example gradients; its state is a ``DPSGDState``, read by :func:`steps` and
      :func:`epsilon`. The steps allowed are calibrated by :func:`pldjax.calibrate_steps` with its
      default ``max_steps`` (so at most 10**7), from a pessimistic estimate of epsilon.
    """
    _check_key(key)
    check_range("l2_norm_clip", l2_norm_clip, 0.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    check_range("epsilon_budget", epsilon_budget, 0.0, low_open=True)
    try:
        allowed = int(calibrate_steps(epsilon_budget, delta, noise_multiplier, sampling_prob,
                                      neighboring=neighboring))
    except ValueError as error:  # in this function's names
        raise ValueError(str(error).replace("target_epsilon", "epsilon_budget")) from None
    # the recorded events carry the neighbouring relation, which epsilon() then reads them under
    event = dpsgd_event(noise_multiplier, sampling_prob, neighboring)
    aggregate = _contrib.differentially_private_aggregate(l2_norm_clip, noise_multiplier, key)
    sgd = _optax.sgd(learning_rate)

    @float64
    def init(params):
        return DPSGDState(aggregate.init(params), sgd.init(params),
                          _accountant.init(capacity=1, event=event), pack(np.int64(0)),
                          pack(np.int64(allowed)))

    @_one_program
    def update(grads, state, params=None):
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        batch = leaves[0].shape[0] if leaves and jnp.ndim(leaves[0]) else 0
        clipped = _clipped(leaves, _norms(leaves, batch), l2_norm_clip, True)
        noised, aggregate_state = aggregate.update(jax.tree_util.tree_unflatten(treedef, clipped),
                                                   state.aggregate)
        updates, sgd_state = sgd.update(noised, state.sgd, params)
        count = jax.ShapeDtypeStruct((), jnp.int64)
        taken, allowed_steps = unpack((state.steps, state.max_steps), (count, count))
        go = taken < allowed_steps
        updates = jax.tree_util.tree_map(lambda u: jnp.where(go, u, jnp.zeros_like(u)), updates)
        recorded = _accountant.step(state.accountant, event, steps=go.astype(jnp.int64))
        return updates, DPSGDState(aggregate_state, sgd_state, recorded,
                                   pack(taken + go.astype(jnp.int64)), state.max_steps)

    return _optax.GradientTransformation(init, update)


def epsilon(state: DPSGDState, delta: float) -> float:
    """Privacy spent so far by the steps taken (an upper bound).

    Args:
      state: a ``DPSGDState`` of a :func:`dpsgd` transformation.
      delta: in [0, 1].

    Returns:
      The smallest epsilon (nats, a Python float) with the steps taken (epsilon, delta)-DP, read from
      a pessimistic PLD: an upper bound on the true epsilon.
    """
    return _accountant.epsilon(state.accountant, delta)


@float64
def steps(state: DPSGDState) -> tuple[int, int]:
    """(steps taken, steps the budget allows), read from the packed state.

    Args:
      state: a ``DPSGDState`` of a :func:`dpsgd` transformation.

    Returns:
      A tuple of two Python ints, (steps taken, steps the budget allows).
    """
    count = jax.ShapeDtypeStruct((), jnp.int64)
    taken, allowed = unpack((state.steps, state.max_steps), (count, count))
    return int(taken), int(allowed)


class IndividualState(NamedTuple):
    aggregate: _optax.OptState
    sgd: _optax.OptState
    filters: _filters.residue.ResidueState  # one per example (leading axis), packed
    active: jax.Array  # (examples,) bool: still training


class SampledIndividualState(NamedTuple):
    """Poisson-sampled DP-SGD with per-example budgets (float64 leaves packed)."""

    sgd: _optax.OptState
    mu: jax.Array  # (examples, 2): each example's remaining GDP budget, packed float64
    delta_left: jax.Array  # (examples, 2): its remaining delta, packed float64
    active: jax.Array  # (examples,) bool: still training
    charged: jax.Array  # (examples,) int32: steps charged to it (steps it took part in)
    key: jax.Array  # raw key data of the next step's sampling and noise


@announces_slow_calls("pldjax.optax.individual_dpsgd")
@float64
def individual_dpsgd(learning_rate, l2_norm_clip: float, noise_multiplier: float, *, key,
                     mu_budget: float, num_examples: int, delta_slack: float = 0.0,
                     sampling_prob: float | None = None, accounting: str = "residue",
                     table: _filters.residue.ResidueTable | None = None,
                     ) -> _optax.GradientTransformation:
    """DP gradient descent with a privacy budget per example; per-example gradients of the WHOLE
    dataset (leading axis of size ``num_examples``) are expected at every step.

    ``sampling_prob`` None: full-batch steps, one GDP residue filter per example (GDP costs in
    closed form; each example's interaction is mu_budget-GDP).

    ``sampling_prob`` = q: Poisson-sampled DP-SGD. Each step every example still training is
    charged the step's PLD at its own sensitivity c_i = min(||g_i||, C) / C, L_{c_i} =
    ``pj.gaussian(noise_multiplier / c_i, sampling_prob=q)`` (the sampling is secret, so the
    charge is the same whether or not it is sampled); an example whose budget cannot pay leaves
    training for good (its gradient is zeroed from this step on). The batch is then drawn
    inside the transformation (each example with probability q, from ``key``), the sampled
    clipped gradients summed, Gaussian noise of standard deviation C * noise_multiplier added
    and the sum divided by the expected batch size q * num_examples. Charges come from a
    :class:`pldjax.adaptive.filters.residue.ResidueTable` (``table``, built by
    ``gdp_residue_table(noise_multiplier, q, mu_budget)``, or built here): ``accounting="residue"``
    uses the GDP residue filter's costs, ``"gdp"`` the naive GDP filter's (nu = gdp_mu(L_c) per
    step, the table's budget-0 row), so one table serves both.

    Guarantee (sampled): each example's interaction with the training run is mu_budget-GDP up to
    the delta it was charged: delta_i(eps) <= delta_{G_mu_budget}(eps) + (delta charged to i)
    at every eps, and the charges never exceed ``delta_slack`` (each step charges the step PLD's
    tail mass at +inf plus ROUNDOFF, so ``delta_slack`` must be > 0 here).

    Args:
      learning_rate: the SGD learning rate, given to ``optax.sgd`` (a number or an optax schedule).
      l2_norm_clip: C, the per-example clipping norm, finite and > 0.
      noise_multiplier: sigma, finite and > 0: the noise's standard deviation is C * sigma.
      key: a ``jax.random`` key for the noise (and, with ``sampling_prob``, the sampling); required
        (None raises a ValueError).
      mu_budget: each example's GDP budget, finite and > 0; at most 1e100 for full-batch steps (the
        GDP residue filter's limit), and at most 1e6 when the table is built here.
      num_examples: the number of examples, an integer >= 1; the gradients' leading axis.
      delta_slack: each example's slack budget: in [0, 1] for full-batch steps (the default 0 is
        enough there: closed-form GDP costs charge nothing), in (0, 1] with ``sampling_prob`` (the
        default 0 then raises a ValueError).
      sampling_prob: None (default) for full-batch steps, else the Poisson sampling probability q,
        in (0, 1].
      accounting: "residue" (default) or "gdp"; read with ``sampling_prob`` only (full-batch steps
        always use GDP residue filters).
      table: with ``sampling_prob`` only (ValueError otherwise): a ``ResidueTable`` built for this
        ``noise_multiplier`` and ``sampling_prob`` exactly (ValueError otherwise); None (default)
        builds one here.

    Returns:
      An optax ``GradientTransformation``. Its ``update(grads, state, params=None)`` takes the
      per-example gradients of all ``num_examples`` examples; its state is an ``IndividualState``
      (full-batch steps) or a ``SampledIndividualState`` (``sampling_prob``), from which
      :func:`remaining_mu` reads each example's remaining budget.
    """
    _check_key(key)
    check_range("l2_norm_clip", l2_norm_clip, 0.0, low_open=True)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    num_examples = check_count("num_examples", num_examples, minimum=1)
    # the range of what takes it: the residue filter (full batches), or the table built here
    built = sampling_prob is not None and table is None
    check_range("mu_budget", mu_budget, 0.0, _filters.residue.MAX_TABLE_MU if built else MAX_MU,
                low_open=True)
    if accounting not in ("residue", "gdp"):
        raise ValueError(f"accounting must be 'residue' or 'gdp', got {accounting!r}")
    if sampling_prob is None:
        check_range("delta_slack", delta_slack, 0.0, 1.0)
        if table is not None:
            raise ValueError("table is for Poisson-sampled steps (sampling_prob); full-batch "
                             "steps are charged their closed-form GDP costs")
        return _full_batch_individual(learning_rate, l2_norm_clip, noise_multiplier, key,
                                      mu_budget, num_examples, delta_slack)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0, low_open=True)
    check_range("delta_slack", delta_slack, 0.0, 1.0, low_open=True)
    if table is not None and not isinstance(table, _filters.residue.ResidueTable):
        raise ValueError(f"table must be a ResidueTable (from gdp_residue_table) or None, got "
                         f"{table!r}")
    if table is None:
        table = _filters.residue.gdp_residue_table(noise_multiplier, sampling_prob, mu_budget,
                                                   residue=accounting == "residue")
    built_for = tuple(float(np.asarray(a, np.float64))
                      for a in (table.noise_multiplier, table.sampling_prob))
    if built_for != (float(noise_multiplier), float(sampling_prob)):
        raise ValueError(
            f"table was built for noise_multiplier = {built_for[0]!r}, sampling_prob = "
            f"{built_for[1]!r}; its costs do not hold for this transformation's noise_multiplier "
            f"= {noise_multiplier!r}, sampling_prob = {sampling_prob!r}"
        )
    if accounting == "gdp":  # the naive costs: the table's row at budget 0, at every budget
        table = table._replace(cost=jax.device_put(np.broadcast_to(np.asarray(table.cost)[:1],
                                                                   table.cost.shape)))
    sgd = _optax.sgd(learning_rate)
    scale = 1.0 / (sampling_prob * num_examples)
    threshold = np.uint32(np.floor(sampling_prob * 2.0**32)) if sampling_prob < 1 else None

    @float64
    def init(params):  # in NumPy, placed on the device: no program compiled
        full = np.ones(num_examples)
        return SampledIndividualState(
            sgd.init(params), pack(full * mu_budget), pack(full * delta_slack),
            jax.device_put(np.ones(num_examples, bool)),
            jax.device_put(np.zeros(num_examples, np.int32)), jax.random.key_data(key))

    @_one_program
    def update(grads, state, params=None):
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        _check_per_example(leaves, num_examples)
        like = jax.ShapeDtypeStruct((num_examples,), jnp.float64)
        mu, delta_left = unpack((state.mu, state.delta_left), (like, like))
        norms = _norms(leaves, num_examples)
        c = _sensitivities(norms, l2_norm_clip)
        new_mu, new_delta, accepted = _filters.residue.table_spend(table, mu, delta_left, c)
        active = state.active & accepted
        next_key, sample_key, noise_key = jax.random.split(jax.random.wrap_key_data(state.key), 3)
        # P(bits < floor(q 2^32)) = floor(q 2^32) / 2^32 <= q: never above the accounted rate
        sampled = active if threshold is None else active & (
            jax.random.bits(sample_key, (num_examples,), jnp.uint32) < threshold)
        noise_keys = jax.random.split(noise_key, len(leaves))
        noised = []
        for g, k in zip(_clipped(leaves, norms, l2_norm_clip, sampled), noise_keys, strict=True):
            total = jnp.sum(g, axis=0)
            noise = jax.random.normal(k, total.shape, g.dtype) * (l2_norm_clip * noise_multiplier)
            noised.append((total + noise) * scale)
        updates, sgd_state = sgd.update(jax.tree_util.tree_unflatten(treedef, noised), state.sgd,
                                        params)
        keep = state.active  # examples that had left keep their (unchanged) budgets
        return updates, SampledIndividualState(
            sgd_state, pack(jnp.where(keep, new_mu, mu)), pack(jnp.where(keep, new_delta, delta_left)),
            active, state.charged + active.astype(jnp.int32), jax.random.key_data(next_key))

    return _optax.GradientTransformation(init, update)


def _check_per_example(leaves, num_examples: int) -> None:
    shapes = [jnp.shape(g) for g in leaves]
    if not leaves or any(shape[:1] != (num_examples,) for shape in shapes):
        raise ValueError(f"grads must hold per-example gradients of all num_examples = "
                         f"{num_examples} examples (leading axis), got leaf shapes {shapes}")


def _norms(leaves, num_examples: int):
    """Per-example gradient norms in float64 whatever the model's precision (a privacy cost)."""
    return jnp.sqrt(sum(jnp.sum(jnp.asarray(g, jnp.float64).reshape(num_examples, -1) ** 2, axis=1)
                        for g in leaves))


def _sensitivities(norms, l2_norm_clip):
    """Each example's sensitivity min(norm, C) / C in [0, 1]; 0 where its gradient is not finite
    (:func:`_clipped` leaves it out of the sum)."""
    return jnp.where(jnp.isfinite(norms), jnp.minimum(norms, l2_norm_clip) / l2_norm_clip, 0.0)


def _clipped(leaves, norms, l2_norm_clip, keep):
    """Per-example gradients ``leaves`` (leading example axis, ``norms`` their float64 norms)
    clipped to norm at most ``l2_norm_clip``, each in its own dtype; zero where ``keep`` (a bool
    per example, or True) is False or the gradient is not finite (a where, not a product:
    0 * NaN is NaN). A gradient above the norm is scaled by C / norm less 4 units of round-off of
    the coarsest leaf dtype, the product taken in float64 and rounded once to the leaf's dtype,
    so that rounding cannot take it above C (bfloat16 gradients scaled by C / norm in their own
    dtype reached 1.004 C; a float16 factor below 6e-5 is subnormal, and reached 1.001 C); one
    within the norm is kept exactly.
    """
    unit = max((float(jnp.finfo(g.dtype).eps) for g in leaves), default=0.0) / 2
    over = norms > l2_norm_clip
    factor = jnp.where(over, l2_norm_clip / jnp.where(over, norms, 1.0) * (1.0 - 4.0 * unit), 1.0)
    kept = jnp.asarray(keep) & jnp.isfinite(norms)
    out = []
    for g in leaves:
        shape = (-1,) + (1,) * (g.ndim - 1)
        scaled = (g.astype(jnp.float64) * factor.reshape(shape)).astype(g.dtype)
        out.append(jnp.where(kept.reshape(shape), scaled, jnp.zeros((), g.dtype)))
    return out


def _full_batch_individual(learning_rate, l2_norm_clip, noise_multiplier, key, mu_budget,
                           num_examples, delta_slack):
    """Full-batch steps with one GDP residue filter per example (closed-form GDP costs)."""
    budget = _filters.gdp_residue_filter(mu_budget, delta=delta_slack)
    aggregate = _contrib.differentially_private_aggregate(l2_norm_clip, noise_multiplier, key)
    sgd = _optax.sgd(learning_rate)

    @float64
    def init(params):
        states = jax.tree_util.tree_map(  # in NumPy, placed on the device: no program compiled
            lambda x: jax.device_put(np.broadcast_to(np.asarray(x), (num_examples,) + x.shape)),
            budget.init())
        return IndividualState(aggregate.init(params), sgd.init(params), states,
                               jax.device_put(np.ones(num_examples, bool)))

    @_one_program
    def update(grads, state, params=None):
        leaves, treedef = jax.tree_util.tree_flatten(grads)
        _check_per_example(leaves, num_examples)
        norms = _norms(leaves, num_examples)
        nu = jnp.where(state.active, _sensitivities(norms, l2_norm_clip) / noise_multiplier, 0.0)
        filters, accepted = jax.vmap(budget.spend)(state.filters, nu)
        active = state.active & accepted
        # clipped here: optax's own clipping, applied again, can only scale them down (its
        # rounding included, within _clipped's margin)
        masked = jax.tree_util.tree_unflatten(treedef, _clipped(leaves, norms, l2_norm_clip,
                                                                active))
        noised, aggregate_state = aggregate.update(masked, state.aggregate)
        updates, sgd_state = sgd.update(noised, state.sgd, params)
        return updates, IndividualState(aggregate_state, sgd_state, filters, active)

    return _optax.GradientTransformation(init, update)


@float64
def remaining_mu(state: IndividualState | SampledIndividualState) -> jax.Array:
    """Each example's remaining GDP budget (float64).

    Args:
      state: an ``IndividualState`` or ``SampledIndividualState`` of an :func:`individual_dpsgd`
        transformation.

    Returns:
      Each example's GDP budget left, a JAX float64 array of shape (num_examples,) (an example
      that has left training keeps the budget it had then).
    """
    if isinstance(state, SampledIndividualState):
        return unpack(state.mu, jax.ShapeDtypeStruct(state.mu.shape[:-1], jnp.float64))
    return unpack(state.filters.mu, jax.ShapeDtypeStruct((), jnp.float64))


__all__ = ["DPSGDState", "IndividualState", "SampledIndividualState", "dpsgd", "epsilon",
           "individual_dpsgd", "remaining_mu", "steps"]
__dir__ = public_dir(__all__)
