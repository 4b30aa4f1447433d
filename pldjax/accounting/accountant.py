"""A privacy accountant whose state is a pytree, for use inside jitted training steps.

The state records the run as segments of equal steps (an event, a count): a step whose event
has the same parameters as the last one increments its count, a change opens a new segment.
By default the events are DP-SGD steps (the Poisson-subsampled Gaussian, recorded as
(noise multiplier, sampling probability)); ``init(event=template)`` records any
:class:`~pldjax.mechanisms.events.Event` of the template's structure (its classes, number of mixture
components and neighbouring relation; the parameters vary), so the state keeps fixed shapes.
Recording is pure and jit-able (arrays of fixed capacity, no host calls); reading epsilon or
delta composes the segments exactly (:func:`pldjax.compose_schedule`) on the host, at any time.
Any number of steps fits; only the number of parameter *changes* is bounded by the capacity
(``init(capacity=...)``, default 64). On the host, a step that would need one more segment than
the capacity raises (the state passed in stays as it was); under jit, where nothing can raise,
it sets ``overflow``, after which readings raise instead of reporting a wrong value; so does a
step recorded under jit with invalid values.

The state's 64-bit leaves are stored as exact uint32 bit pairs (:func:`pldjax.core.precision.pack`), so
it crosses a caller's jit, vmap and save/load bit for bit whatever ``jax_enable_x64``. Parameters
that arrive in float32 (with x64 off, a caller's jit rounds Python floats to float32) are recorded
pessimistically, each toward the side on which its mechanism reveals more: noise scales (the
noise multiplier, a Gaussian's sigma, a Laplace scale) as the smallest real number that rounds to
the value received, sensitivities, GDP's mu, randomized response's epsilon as the largest, and
probabilities (sampling, randomized response's delta) as the largest, at most 1. A float32
parameter with no such side (a mixture's scales and probabilities) is not recorded: the state is
marked and readings raise (pass it as a concrete value, or enable x64).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.accounting.dpsgd import dpsgd_event
from pldjax.accounting.schedule import compose_schedule
from pldjax.core import serialization as io
from pldjax.core.compilation import kernel_jit
from pldjax.core.namespace import public_dir
from pldjax.core.precision import float64, lower_of_rounded, pack, unpack, upper_of_rounded
from pldjax.core.validation import check_count, check_range, is_traced
from pldjax.kernels import chernoff
from pldjax.mechanisms.events import Event
from pldjax.mechanisms.named import identity
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import (
    GDP,
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    RandomizedResponse,
)
from pldjax.mechanisms.sampling import FixedBatch, Poisson

CAPACITY = 64
#: Most steps one :func:`step` call records (a segment's total may reach int64's largest value,
#: 2^63 - 1; a step that would pass it marks the state, as an invalid one does).
MAX_STEPS = 2**62

#: How a float32 parameter is widened (the side on which its mechanism reveals more) and the
#: values it may take under jit (low, low_open, high): scales down, the rest up.
_DOWN, _UP, _PROBABILITY, _WHOLE = "down", "up", "probability", "whole"
_FIELDS = {
    (Gaussian, "sigma"): _DOWN, (Gaussian, "sensitivity"): _UP, (GDP, "mu"): _UP,
    (Laplace, "scale"): _DOWN, (Laplace, "sensitivity"): _UP,
    (DiscreteLaplace, "scale"): _DOWN, (DiscreteLaplace, "sensitivity"): _WHOLE,
    (DiscreteGaussian, "sigma"): _DOWN, (DiscreteGaussian, "sensitivity"): _WHOLE,
    (RandomizedResponse, "epsilon"): _UP, (RandomizedResponse, "delta"): _PROBABILITY,
    (Poisson, "sampling_prob"): _PROBABILITY, (FixedBatch, "sampling_prob"): _PROBABILITY,
}


@dataclasses.dataclass(frozen=True)
class AccountantState:
    """Segments (event, steps) of a run; ``count`` are in use. ``rows``: the events' leaves
    (in the order of ``jax.tree.leaves``), each with a leading axis of length capacity (one row
    per segment); ``structure``: the events' tree structure (static). 64-bit leaves are packed
    (uint32 pairs, see the module docstring); :func:`events` and :func:`segments` read them."""

    rows: tuple  # (capacity, ...) float64 each, packed
    steps: jax.Array  # (capacity,) int64, packed
    count: jax.Array  # () int64, packed: segments in use
    overflow: jax.Array  # () bool: a step did not fit, or had invalid values under jit
    structure: Any  # one event's (PyTreeDef, (noise class, sampling class))


jax.tree_util.register_dataclass(AccountantState, data_fields=["rows", "steps", "count", "overflow"],
                                 meta_fields=["structure"])


def _dpsgd_template() -> Event:
    return dpsgd_event(1.0, 0.0)


def _parts(event: Event):
    """(record class, field name, value) of every parameter, in the order of the event's leaves."""
    return [(type(part), field.name, getattr(part, field.name))
            for part in (event.noise, event.sampling) if part is not None
            for field in dataclasses.fields(part)]


def _as_arrays(event: Event) -> Event:
    """The event with every parameter an array (a list would be several pytree leaves): NumPy
    where concrete (no compiled program), traced ones as they are."""
    def array(value):
        return jnp.asarray(value) if is_traced(value) else np.asarray(value)

    def arrays(part):
        return None if part is None else dataclasses.replace(part, **{
            field.name: array(getattr(part, field.name)) for field in dataclasses.fields(part)})
    return Event(arrays(event.noise), arrays(event.sampling), event.neighboring)


def _check_template(event) -> Event:
    if not isinstance(event, Event):
        raise ValueError(f"event must be a pldjax.Event (the template of the recorded events), "
                         f"got {event!r}")
    if is_traced(event):
        raise ValueError("init(event=...) needs a concrete template event (its parameters fix "
                         "the state's shapes)")
    return _as_arrays(event)


def _plain(capacity: int, template: Event) -> AccountantState:
    """The empty run, in NumPy (:func:`pack` places it on the device)."""
    leaves, treedef = jax.tree.flatten(template)
    structure = (treedef, _classes(template))
    rows = tuple(np.broadcast_to(np.asarray(leaf, np.float64), (capacity, *np.shape(leaf)))
                 for leaf in leaves)
    return AccountantState(rows, np.zeros(capacity, np.int64), np.zeros((), np.int64),
                           np.zeros((), bool), structure)


def _row_shape(leaf) -> tuple:
    """The shape of one row of a state's event leaf, packed (uint32 pairs) or not."""
    return tuple(leaf.shape[1:-1] if leaf.dtype == jnp.uint32 else leaf.shape[1:])


def _classes(event: Event) -> tuple:
    # compared beside the PyTreeDef, whose equality does not tell dataclass nodes apart by class
    return type(event.noise), type(event.sampling)


def _structure(state: AccountantState) -> tuple:
    """((tree structure, classes), leaf shapes) of one row of the state's events, packed or not."""
    return state.structure, [_row_shape(leaf) for leaf in state.rows]


def _structure_of(event: Event) -> tuple:
    leaves, treedef = jax.tree.flatten(event)
    return (treedef, _classes(event)), [tuple(np.shape(leaf)) for leaf in leaves]


def _is_dpsgd(state: AccountantState) -> bool:
    """Whether the state records DP-SGD steps (the default template's structure)."""
    return _structure(state) == _structure_of(_dpsgd_template())


def _capacity(state: AccountantState) -> int:
    return int(state.steps.shape[0])


def _unpacked(state: AccountantState, *, host: bool = False) -> AccountantState:
    """The state's 64-bit values (see :func:`pldjax.core.precision.unpack`; ``host``: NumPy)."""
    capacity = _capacity(state)
    _, shapes = _structure(state)
    like = AccountantState(
        tuple(jax.ShapeDtypeStruct((capacity, *shape), jnp.float64) for shape in shapes),
        jax.ShapeDtypeStruct((capacity,), jnp.int64), jax.ShapeDtypeStruct((), jnp.int64),
        jax.ShapeDtypeStruct((), bool), state.structure)
    return unpack(state, like, host=host)


@float64
def init(capacity: int = CAPACITY, *, event: Event | None = None) -> AccountantState:
    """An empty run (no steps: epsilon 0).

    Args:
      capacity: the most segments (runs of steps between parameter changes) the state holds, an
        integer >= 1; default ``CAPACITY`` (64). Any number of steps of one event fits in one
        segment.
      event: a template fixing the structure of the events :func:`step` records (its parameter
        values do not matter; its classes, neighbouring relation and parameter shapes do, and it
        must be concrete, not traced); default (None): DP-SGD steps,
        ``pldjax.accounting.dpsgd.dpsgd_event``.

    Returns:
      The empty :class:`AccountantState`, a pytree of JAX arrays of fixed shapes (its 64-bit
      values packed as uint32 pairs), to pass to :func:`step`.
    """
    capacity = check_count("capacity", capacity, minimum=1)
    template = _dpsgd_template() if event is None else _check_template(event)
    return pack(_plain(capacity, template))


def _recorded(kind: str, value, name: str):
    """(the float64 value to record, whether it is valid) for a parameter received as ``value``."""
    x = jnp.asarray(value)
    low, high = lower_of_rounded(x), upper_of_rounded(x)
    finite = jnp.isfinite(low) & jnp.isfinite(high)
    if kind == _DOWN:
        return low, finite & (low > 0)
    if kind == _UP:
        return high, finite & (low >= 0)
    if kind == _PROBABILITY:
        return jnp.minimum(high, 1.0), finite & (low >= 0) & (low <= 1)
    exact = x.dtype == jnp.float64 or not jnp.issubdtype(x.dtype, jnp.floating)
    wide = x.astype(jnp.float64)
    if kind == _WHOLE:  # a whole number is received exactly (up to 2^24 in float32)
        return wide, finite & (wide >= 1) & (wide == jnp.round(wide))
    # no side is known to be safe: only an exact value is recorded
    return wide, jnp.asarray(exact) & jnp.all(finite) & jnp.all(wide >= 0)


def _step(packed: AccountantState, event: Event, steps) -> AccountantState:
    state = _unpacked(packed)
    recorded = [_recorded(_FIELDS.get((cls, name), "exact"), value, name)
                for cls, name, value in _parts(event)]
    values = [jnp.broadcast_to(v, leaf.shape[1:])
              for (v, _), leaf in zip(recorded, state.rows, strict=True)]
    # compared in float64 before the int64 cast, which saturates a float count beyond it (or
    # NaN); as its own dtype, an int32 count met 2^62 wrapped to 0
    wide = jnp.asarray(steps).astype(jnp.float64)
    in_range = (wide >= 0) & (wide <= MAX_STEPS) & (wide == jnp.floor(wide))
    steps = jnp.asarray(steps, jnp.int64)
    # under jit bad values (a fraction of a step among them) cannot raise: the step is not
    # recorded and the state is marked, so that every later reading raises (NaN fails every
    # comparison here)
    valid = jnp.all(jnp.stack([jnp.all(ok) for _, ok in recorded])) & in_range
    rows = state.rows
    last = jnp.maximum(state.count - 1, 0)
    same = state.count > 0
    for row, value in zip(rows, values, strict=True):
        same = same & jnp.all(row[last] == value)
    capacity = _capacity(state)
    room = state.count < capacity
    slot = jnp.where(same, last, jnp.minimum(state.count, capacity - 1))
    # a segment's total stays within int64 (it wrapped around to a few steps, or to none)
    fits = (same | room) & valid & (steps <= jnp.iinfo(jnp.int64).max - state.steps[slot])
    written = [row.at[slot].set(jnp.where(fits, value, row[slot]))
               for row, value in zip(rows, values, strict=True)]
    new = AccountantState(
        tuple(written),
        state.steps.at[slot].add(jnp.where(fits, steps, 0)),
        jnp.where(same | ~room | ~valid, state.count, state.count + 1),
        state.overflow | ~fits,
        state.structure,
    )
    return pack(new)


_step_jit = kernel_jit(_step)


def _as_event(state: AccountantState, event_or_sigma, sampling_prob) -> Event:
    """The event a :func:`step` call describes, checked against the state's structure."""
    if isinstance(event_or_sigma, Event):
        if sampling_prob is not None:
            raise ValueError("pass either an event or (noise_multiplier, sampling_prob), not both")
        event = _as_arrays(event_or_sigma)
    else:
        if event_or_sigma is None or sampling_prob is None:
            raise ValueError("step needs an event, or a noise_multiplier and a sampling_prob")
        event = dpsgd_event(event_or_sigma, sampling_prob)
    (treedef, shapes), (got, got_shapes) = _structure(state), _structure_of(event)
    if got != treedef:
        raise ValueError(f"the event's structure differs from the accountant's (set by "
                         f"init(event=...)): got {got[0]}, the accountant records {treedef[0]}")
    if got_shapes != shapes:
        raise ValueError(f"the event's parameters must have the template's shapes {shapes}, "
                         f"got {got_shapes}")
    return event


@float64
def step(state: AccountantState, event: Event | float | None = None, sampling_prob=None,
         steps=1, *, noise_multiplier=None) -> AccountantState:
    """Record ``steps`` runs of ``event`` (pure; works under jit). ``event``: an
    :class:`~pldjax.mechanisms.events.Event` of the structure given to :func:`init`, or, for a DP-SGD
    accountant, the noise multiplier with ``sampling_prob`` beside it (``step(state, sigma, q)``,
    or by keyword ``noise_multiplier=``, ``sampling_prob=``).

    Args:
      state: the :class:`AccountantState` to extend (from :func:`init`, :func:`step` or
        :func:`load`).
      event: an :class:`~pldjax.mechanisms.events.Event` with the template's structure and
        parameter shapes, or, for a DP-SGD accountant, the noise multiplier (> 0 and finite) with
        ``sampling_prob`` beside it; None (default) when ``noise_multiplier`` is passed instead.
        Parameters in range only; under jit, float32 parameters are recorded on their pessimistic
        side (see the module docstring).
      sampling_prob: the Poisson sampling probability of a DP-SGD step given by its noise
        multiplier, in [0, 1]; None (default) with an event.
      steps: the number of runs recorded, a whole number in [0, ``MAX_STEPS``] (2^62); default 1.
        0 adds no step to the run (new parameters still open a segment).
      noise_multiplier: the DP-SGD noise multiplier (> 0) by keyword, in place of ``event``;
        None (default): ``event`` is read.

    Returns:
      A new :class:`AccountantState` with the steps recorded (the state passed in is unchanged).
      On the host, a step that cannot be recorded (a value out of range, or one segment more than
      the capacity) raises a ValueError instead; under jit it leaves the run as it was and sets
      ``overflow``, so that every later reading raises.
    """
    if noise_multiplier is not None:
        if event is not None:
            raise ValueError("pass either an event or a noise_multiplier, not both")
        event = noise_multiplier
    event = _as_event(state, event, sampling_prob)
    if not is_traced(steps):
        check_range("steps", steps, 0.0, MAX_STEPS)
        if not float(np.asarray(steps)).is_integer():
            raise ValueError(f"steps must be a whole number >= 0, got {steps!r}")
    if is_traced((state, event, steps)):
        return _step(state, event, steps)
    new = _step_jit(state, event, steps)
    # on the host a step that does not fit raises, and the caller keeps the state it passed in
    if bool(np.asarray(new.overflow)) and not bool(np.asarray(state.overflow)):
        for cls, name, value in _parts(event):  # the cause, named
            kind = _FIELDS.get((cls, name), "exact")
            if not bool(np.all(np.asarray(_recorded(kind, value, name)[1]))):
                dtype = jnp.asarray(value).dtype
                why = (f"is {dtype}, and no rounding of it is known to be safe: pass it in "
                       f"float64" if kind == "exact" and dtype != jnp.float64
                       and jnp.issubdtype(dtype, jnp.floating) else "is out of range")
                raise ValueError(f"this step cannot be recorded (the state passed in is "
                                 f"unchanged): {cls.__name__}.{name} = {value!r} {why}")
        raise ValueError(f"this step cannot be recorded (the state passed in is unchanged): "
                         f"{_limits(state)}")
    return new


def _limits(state: AccountantState) -> str:
    """The limits of what a state records (see :func:`_step`)."""
    return (f"more parameter changes than the accountant's capacity ({_capacity(state)}; use "
            f"init(capacity=...)) or more than 2^63 - 1 steps of one event")


def _read(state: AccountantState) -> tuple[AccountantState, int]:
    state = _unpacked(state)
    count = int(np.asarray(state.count))
    if bool(np.asarray(state.overflow)):
        invalid = ("a step under jit with an invalid noise_multiplier (not finite > 0), "
                   "sampling_prob (not in [0, 1]), steps (not a whole number in [0, 2^62]) or "
                   "other event parameter (out of range, or float32 where no rounding is safe)")
        # a full state only overflows its capacity: below it, the capacity is not the cause
        limits = (_limits(state) if count >= _capacity(state)
                  else "more than 2^63 - 1 steps of one event")
        raise ValueError(f"the accountant's run is not fully recorded: {invalid}, or {limits}")
    return state, count


@float64
def events(state: AccountantState) -> list[tuple[Event, int]]:
    """The recorded run as (event, steps) pairs (scalar parameters), on the host.

    Args:
      state: an :class:`AccountantState` (concrete, not traced).

    Returns:
      A list of (:class:`~pldjax.mechanisms.events.Event`, int) pairs, one per segment in the
      order recorded, segments of zero steps left out. Each event holds one configuration: its
      parameters are Python floats (NumPy arrays for a parameter with several components, such
      as a mixture's). A state whose run is not fully recorded (``overflow``) raises a
      ValueError.
    """
    state, count = _read(state)
    rows = [np.asarray(row) for row in state.rows]
    steps = np.asarray(state.steps)
    return [(jax.tree.unflatten(state.structure[0], [row[i].item() if row.ndim == 1 else row[i]
                                                  for row in rows]),
             int(steps[i])) for i in range(count) if steps[i] > 0]


@float64
def segments(state: AccountantState) -> list[tuple[float, float, int]]:
    """The recorded DP-SGD run as (noise_multiplier, sampling_prob, steps), on the host (a
    ValueError for an accountant of other events: read :func:`events`).

    Args:
      state: the :class:`AccountantState` of a DP-SGD accountant (the default template of
        :func:`init`, every step of sensitivity 1).

    Returns:
      A list of (noise_multiplier, sampling_prob, steps) tuples (float, float, int), one per
      segment in the order recorded, segments of zero steps left out.
    """
    run = events(state)
    if not _is_dpsgd(state) or any(e.noise.sensitivity != 1.0 for e, _ in run):
        raise ValueError("this accountant records events other than DP-SGD steps (noise "
                         "multiplier, sampling probability): read accountant.events(state)")
    return [(e.noise.sigma, e.sampling.sampling_prob, t) for e, t in run]


def pld(state: AccountantState, *, neighboring: str | None = None, pessimistic: bool = True):
    """The run's PLD (both directions; pessimistic, or optimistic with ``pessimistic=False``),
    or the identity for an empty run. ``neighboring``: for a DP-SGD accountant, the relation its
    steps are read under (default "add_remove"); other events carry their own (None).

    Args:
      state: an :class:`AccountantState` (concrete, not traced).
      neighboring: for a DP-SGD accountant, "add_remove" (None, the default), "replace_one" or
        "replace_special"; None for an accountant of other events (anything else raises).
      pessimistic: True (default) for the pessimistic PLD, False for the optimistic one.

    Returns:
      A :class:`~pldjax.core.pld.PLD` of the whole run (:func:`pldjax.compose_schedule` of its
      segments, both adjacency directions): pessimistic (the epsilon and delta read from it are
      upper bounds on the truth) or optimistic (lower bounds); the identity for a run with no
      steps.
    """
    run = events(state)
    if _is_dpsgd(state) and all(e.noise.sensitivity == 1.0 for e, _ in run):
        run = segments(state)
        neighboring = Neighboring.parse(neighboring or Neighboring.ADD_REMOVE)
        return (compose_schedule(run, neighboring=neighboring, pessimistic=pessimistic) if run
                else identity(pessimistic=pessimistic))
    if neighboring is not None:
        raise ValueError("neighboring is read from the recorded events here: leave it None")
    return (compose_schedule(run, pessimistic=pessimistic) if run
            else identity(pessimistic=pessimistic))


@float64
def epsilon(state: AccountantState, delta, *, neighboring: str | None = None):
    """Smallest epsilon with the run (epsilon, delta)-DP: an upper bound (pessimistic PLD).

    Args:
      state: an :class:`AccountantState` (concrete, not traced).
      delta: in [0, 1], a scalar or an array.
      neighboring: as in :func:`pld`: for a DP-SGD accountant, "add_remove" (None, the default),
        "replace_one" or "replace_special"; None for other events.

    Returns:
      Epsilon in nats, a float for a scalar ``delta``, else a NumPy float64 array of its shape
      (inf where no finite epsilon is certified; 0 for a run with no steps); pessimistic, an
      upper bound on the run's true epsilon. At delta = 0 for bounded noise (pure DP), the sum
      of the events' largest losses (:func:`pldjax.kernels.chernoff.pure_epsilon`: exact to
      round-off).
    """
    check_range("delta", delta, 0.0, 1.0)
    eps = pld(state, neighboring=neighboring).epsilon(delta)
    if not np.any(np.asarray(delta) == 0) or _is_dpsgd(state):
        return eps
    run = events(state)
    if not run:
        return eps
    # pure DP: the events' largest losses add up, where the composed PLD's window may have cut
    # them off to its atom at +inf (Gaussian noise, whose loss is unbounded, reads inf either way)
    pure = chernoff.pure_epsilon([(event.pld(), count) for event, count in run])
    return np.where(np.asarray(delta) == 0, np.minimum(eps, pure), eps)[()]


@float64
def delta(state: AccountantState, epsilon, *, neighboring: str | None = None):
    """Smallest delta with the run (epsilon, delta)-DP: an upper bound (pessimistic PLD).

    Args:
      state: an :class:`AccountantState` (concrete, not traced).
      epsilon: in nats, >= 0 and finite, a scalar or an array.
      neighboring: as in :func:`pld`: for a DP-SGD accountant, "add_remove" (None, the default),
        "replace_one" or "replace_special"; None for other events.

    Returns:
      Delta in [0, 1], a float for a scalar ``epsilon``, else a NumPy float64 array of its shape
      (0 for a run with no steps); pessimistic, an upper bound on the run's true delta.
    """
    check_range("epsilon", epsilon, 0.0)
    return pld(state, neighboring=neighboring).delta(epsilon)


def save(path, state: AccountantState) -> None:
    """Write the state (npz or JSON, exact; see :mod:`pldjax.core.serialization`).

    Args:
      path: the file (str or path-like), ending in ``.npz`` or ``.json``; missing parent
        directories are created, and an existing file is replaced in one step (atomically).
      state: the :class:`AccountantState` to write, its capacity and (for an accountant of
        other events than DP-SGD steps) its template's structure named in the header.

    Returns:
      None.
    """
    params = {"capacity": _capacity(state)}
    if not _is_dpsgd(state):  # the DP-SGD layout keeps the header it always had
        params["event"] = str(_structure(state))
    io.save(path, state, kind="accountant", params=params)


class _Legacy(NamedTuple):
    """The DP-SGD state as files before events held it: (sigma, q) rows, no sensitivity."""

    noise_multiplier: jax.Array
    sampling_prob: jax.Array
    steps: jax.Array
    count: jax.Array
    overflow: jax.Array


@float64  # the legacy layout's template holds int64 step counts
def load(path, capacity: int = CAPACITY, *, event: Event | None = None) -> AccountantState:
    """Read a state written by :func:`save` (of this capacity and template ``event``, as given to
    :func:`init`). Files of the DP-SGD accountant written before it recorded events still load.

    Args:
      path: a file written by :func:`save` (``.npz`` or ``.json``).
      capacity: the capacity the saved state was made with, an integer >= 1; default
        ``CAPACITY`` (64).
      event: the template given to :func:`init` for the saved state; None (default) for a DP-SGD
        accountant.

    Returns:
      The :class:`AccountantState` saved, bit for bit. A file saved for another capacity or
      template, or holding a state that no sequence of steps reaches (damaged or edited), raises
      a ValueError.
    """
    fresh = init(capacity, event=event)
    params = {"capacity": _capacity(fresh)}
    if not _is_dpsgd(fresh):
        params["event"] = str(_structure(fresh))
    try:
        state = io.load(path, fresh, kind="accountant", params=params)
    except ValueError:
        if not _is_dpsgd(fresh):
            raise
        old = pack(_Legacy(jnp.ones(capacity), jnp.zeros(capacity),
                           jnp.zeros(capacity, jnp.int64), jnp.zeros((), jnp.int64),
                           jnp.zeros((), bool)))
        state = _from_legacy(io.load(path, old, kind="accountant", params={"capacity": capacity}))
    problem = _state_problem(state)
    if problem is not None:
        raise ValueError(f"{path}: no sequence of steps reaches this accountant state "
                         f"({problem}); the file is damaged")
    return state


@float64
def _state_problem(state: AccountantState) -> str | None:
    """What no sequence of :func:`step` calls leaves in a state (a damaged or edited file), or
    None: segments in use outside [0, capacity], negative step counts, steps in unused slots, or
    a recorded event whose parameters are out of their ranges."""
    plain = _unpacked(state, host=True)
    count, capacity = int(plain.count), _capacity(state)
    if not 0 <= count <= capacity:
        return f"{count} segments in use, outside [0, {capacity}]"
    steps = np.asarray(plain.steps)
    if np.any(steps < 0):
        return f"a negative step count {int(np.min(steps))}"
    if np.any(steps[count:] != 0):
        return f"steps recorded beyond the {count} segments in use"
    if bool(plain.overflow):  # readings raise, and say why
        return None
    try:
        events(state)
    except ValueError as error:
        return f"a recorded event is invalid: {error}"
    return None


@float64
def _from_legacy(legacy: _Legacy) -> AccountantState:
    plain = unpack(legacy, jax.eval_shape(lambda: _Legacy(
        jnp.ones(legacy.steps.shape[0]), jnp.zeros(legacy.steps.shape[0]),
        jnp.zeros(legacy.steps.shape[0], jnp.int64), jnp.zeros((), jnp.int64), jnp.zeros((), bool))))
    rows = (plain.noise_multiplier, jnp.ones_like(plain.noise_multiplier), plain.sampling_prob)
    return pack(AccountantState(rows, plain.steps, plain.count, plain.overflow,
                                _structure_of(_dpsgd_template())[0]))


__all__ = ["AccountantState", "CAPACITY", "MAX_STEPS", "delta", "epsilon", "events", "init",
           "load", "pld", "save", "segments", "step"]
__dir__ = public_dir(__all__)
