"""The filter interface and what every filter shares.

Every filter is built by :func:`make_filter` from a pure, module-level
``core(settings, state, query) -> (state, accepted)`` working on float64 / int64 values, its
numbers (budgets, orders, a budget PLD's arrays) passed in ``settings`` as data. This layer adds,
once for all filters:

* **Query checks.** A query PLD with a NaN, infinite or negative mass, a total mass other than 1
  (beyond :data:`~pldjax.core.pld.MASS_TOLERANCE`), a step that is not finite and > 0 or losses
  that imply a Q mass above 1, and a cost given in numbers that is NaN or negative (inf is a
  valid cost: it is rejected), is never accepted: on the host ``spend`` raises a ValueError
  naming the query; under a caller's jit or vmap (where values cannot raise) the query is
  rejected and the state is returned unchanged. A new state with a NaN anywhere is rejected too,
  so no cost computation can corrupt a state.
* **Exact 64-bit states whatever the caller's x64 flag.** State leaves holding float64 / int64
  values are stored as their bits (:func:`pldjax.core.precision.pack`: uint32 pairs), so a state crosses
  jit, vmap and save/load bit for bit. ``remaining`` unpacks them.
* **Costs rounded by the caller.** A cost that arrives in float32 (with x64 off, a caller's jit
  rounds a Python float argument to float32 before pldjax sees it) is charged the largest real
  number that rounds to it (:func:`pldjax.core.precision.upper_of_rounded`): sound, at the price of
  rejecting a spend that fits by less than about 3e-8 relative. Pass costs as concrete values, or
  enable x64, to have them charged exactly. A query PLD whose arrays arrive in float32 is refused
  (ValueError): guarantees are never computed in 32 bits.
* **One compiled program a spend.** On concrete values the host's part (init, the query checks,
  packing, ``remaining``) runs in NumPy, not in eager jnp operations, each of which compiled a
  program of its own in every new process; the spend is one program (per query structure and
  static options), traced as before under a caller's jit or vmap, and shared by every filter of
  its kind: a new filter (another budget) compiles nothing its kind has compiled.
* **No program at all on the host** for the filters built with ``host=True`` (pure DP, GDP,
  GDP residue): their cores run on NumPy values as well, and a spend of a concrete state and
  query in host memory runs there (a first residue spend in milliseconds instead of seconds of
  compiling; a warm one a few milliseconds slower than the compiled one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import array_module, kernel_jit, readable_on_host
from pldjax.core.notice import slow_call_notice
from pldjax.core.pld import PLD, pld_problems
from pldjax.core.precision import float64, host_result, pack, unpack, upper_of_rounded
from pldjax.core.validation import is_traced


class Filter(NamedTuple):
    """One privacy filter: ``init() -> state``, ``spend(state, query) -> (state, accepted)``,
    ``remaining(state)``, plus what the interaction satisfies (``guarantee``) and the parameters
    that identify it (``kind``, ``params``: used to check saved states)."""

    init: Callable[[], Any]
    spend: Callable[[Any, Any], tuple[Any, jax.Array]]
    remaining: Callable[[Any], Any]
    guarantee: dict
    kind: str
    params: dict


def keep_if(accepted, new, old):
    """``new`` where accepted, else ``old`` (leaf by leaf): a rejected query changes nothing."""
    xp = array_module(accepted)
    return jax.tree_util.tree_map(lambda a, b: xp.where(accepted, a, b), new, old)


def query_directions(query: PLD, filter_name: str):
    """A single (unbatched: vmap batches it) pessimistic query as stacked directions."""
    if not query.pessimistic:
        raise ValueError(
            f"{filter_name}: the query PLD must be pessimistic (an upper bound) for a sound answer")
    if query.batch_shape:
        raise ValueError(
            f"{filter_name}: spend takes one query; vmap spend over a batch of queries")
    return query.stack_directions()


def pld_cost(cost):
    """A cost computed from a valid query PLD, made safe to charge: NaN (a failed computation)
    becomes inf (rejected); a value below 0 (round-off: the true costs here are >= 0) becomes 0."""
    xp = array_module(cost)
    return xp.where(xp.isnan(cost), np.inf, xp.maximum(cost, 0.0))


def _cost_ok(query):
    """True where every number of a native cost is >= 0 (inf allowed, NaN not): traced where the
    cost is, else on the host."""
    xp = jnp if is_traced(query) else np
    ok = xp.asarray(True)
    for leaf in jax.tree_util.tree_leaves(query):
        ok = ok & xp.all(xp.asarray(leaf) >= 0)  # False for NaN
    return ok


def _is_number(leaf) -> bool:
    if isinstance(leaf, (str, bytes)):
        return False
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(leaf).dtype
        except (TypeError, ValueError):
            return False
    return bool(np.issubdtype(dtype, np.number)) or dtype == np.bool_


def _canonical(kind: str, query, cost_shape: tuple[int, ...], cost_pair: bool):
    """The query checked for structure (always) and values (on the host), costs in float64."""
    if isinstance(query, PLD):
        if query.batch_shape:
            raise ValueError(f"{kind}: spend takes one query PLD, got a batch of shape "
                             f"{query.batch_shape}; vmap spend over a batch of queries")
        for d in query.directions():
            for name in ("probs", "inf_mass", "step"):
                value = getattr(d, name)
                dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
                if dtype != jnp.float64:
                    raise ValueError(
                        f"{kind}: the query PLD's {name} arrived as {dtype}, not float64 (with "
                        f"x64 off, a caller's jit converts PLD arguments to float32): build the "
                        f"query inside the jitted function or enable jax_enable_x64")
        if not is_traced(query):
            for _, reason, bad in pld_problems(query):
                # under a caller's jit a closed-over PLD cannot raise (the checks of the jnp
                # version were traced there): the spend refuses such a query itself
                # (``guarded``), as it does a traced one
                if bool(bad) and not _under_trace():
                    raise ValueError(f"{kind}: the query PLD is degenerate ({reason}); such a "
                                     f"query is never accepted")
        return query
    if isinstance(query, tuple) and cost_pair:
        if len(query) != 2 or any(isinstance(part, PLD) for part in query):
            raise ValueError(f"{kind}: a query cost is a pair (cost, delta_n) of numbers, one "
                             f"number, or a PLD alone, got {query!r}")
        return tuple(_canonical(kind, part, cost_shape, False) for part in query)
    if isinstance(query, list):
        if not all(_is_number(v) for v in query):
            raise ValueError(f"{kind}: the query must be a pessimistic PLD or a cost (numbers "
                             f">= 0), got {query!r}")
        # a bool among numbers would become 0 or 1 in the array: refused, or NaN (rejected)
        booleans = [np.dtype(jnp.result_type(v)).kind == "b" for v in query]
        if any(booleans) and not is_traced(query):
            raise ValueError(f"{kind}: a query cost must be a real number >= 0, got {query!r} "
                             f"(a bool is no cost)")
        query = [jnp.full(jnp.shape(v), jnp.nan) if boolean else v
                 for v, boolean in zip(query, booleans, strict=True)]
        query = jnp.asarray(query) if is_traced(query) else np.asarray(query)
    leaves = jax.tree_util.tree_leaves(query)
    if len(leaves) != 1 or leaves[0] is not query or not _is_number(query):
        raise ValueError(f"{kind}: the query must be a pessimistic PLD or a cost (numbers >= 0), "
                         f"got {query!r}")
    if not is_traced(query) and np.dtype(jnp.result_type(query)).kind not in "iuf":
        raise ValueError(f"{kind}: a query cost must be a real number >= 0, got {query!r} "
                         f"(of dtype {jnp.result_type(query)})")
    for leaf in leaves:
        shape = tuple(jnp.shape(leaf))
        try:
            fits = np.broadcast_shapes(shape, cost_shape) == cost_shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{kind}: a query cost must have shape {cost_shape} (or broadcast "
                             f"to it), got shape {shape}")
    cost = jax.tree_util.tree_map(upper_of_rounded, query)
    if is_traced(cost):
        return cost
    if not bool(_cost_ok(cost)):
        raise ValueError(f"{kind}: a query cost must be a number >= 0 (inf is allowed and "
                         f"rejected), got {query!r}")
    return jax.tree_util.tree_map(_normal_or_zero, cost)


def _under_trace() -> bool:
    """Whether this call runs inside a trace (a caller's jit) that stages operations on concrete
    values too: a placed value comes back traced there (no compiled program either way)."""
    return is_traced(jax.device_put(np.bool_(False)))


def _normal_or_zero(cost):
    """A positive cost below the smallest normal float raised to it (an upper bound): XLA on a
    CPU flushes subnormal numbers to 0, and a filter of budget 0 accepted a cost of 5e-324.
    (Under a caller's jit the cost is traced and cannot be looked at: charged as XLA reads it.)"""
    cost = np.asarray(cost, np.float64)
    tiny = np.finfo(np.float64).tiny
    return np.where((cost > 0) & (cost < tiny), tiny, cost)


def state_structure(like) -> tuple:
    """A hashable description of a state's structure (its tree, and each leaf's shape and
    dtype), from the ShapeDtypeStructs of ``init``."""
    leaves, tree = jax.tree_util.tree_flatten(like)
    return tree, tuple((tuple(leaf.shape), np.dtype(leaf.dtype)) for leaf in leaves)


def structure_like(structure: tuple):
    """The ShapeDtypeStructs a :func:`state_structure` describes."""
    tree, leaves = structure
    return jax.tree_util.tree_unflatten(tree, [jax.ShapeDtypeStruct(shape, dtype)
                                               for shape, dtype in leaves])


@functools.cache
def _guarded_spend(core: Callable, static: tuple[str, ...], structure: tuple) -> Callable:
    """The compiled spend of every filter built from ``core`` with states of ``structure``: the
    query checks and the NaN guard around ``core`` (see the module docstring)."""
    like = structure_like(structure)

    def guarded(settings, state, query, **options):
        plain = unpack(state, like)
        new, accepted = core(settings, plain, query, **options)
        if isinstance(query, PLD):
            valid = ~jnp.any(jnp.stack([bad for *_, bad in pld_problems(query)]))
        else:
            valid = _cost_ok(query)
        sane = jnp.asarray(True)
        for leaf in jax.tree_util.tree_leaves(new):
            if jnp.issubdtype(leaf.dtype, jnp.floating):
                sane = sane & ~jnp.any(jnp.isnan(leaf))
        accepted = accepted & valid & sane
        return keep_if(accepted, pack(new), state), accepted

    return kernel_jit(guarded, static_argnames=static)


def _runs_on_host(state, query) -> bool:
    """Whether a spend can run in NumPy: concrete state and query (in host memory, or small on
    an accelerator: :func:`~pldjax.core.compilation.readable_on_host`), outside any trace."""
    leaves = jax.tree_util.tree_leaves((state, query))
    return all(readable_on_host(leaf) for leaf in leaves) and not _under_trace()


@np.errstate(all="ignore")  # NaN and inf are values the searches handle, as XLA's do
def _host_spend(core: Callable, settings: tuple, like, state, query, options: dict):
    """The spend of :func:`_guarded_spend` in NumPy, for a concrete state and a query that
    :func:`_canonical` has checked (a degenerate one raised there): ``core`` on NumPy values,
    a new state with a NaN rejected, the state packed as the compiled spend packs it."""
    plain = unpack(state, like, host=True)
    query = jax.tree_util.tree_map(np.asarray, query)
    new, accepted = core(settings, plain, query, **options)
    sane = all(not np.any(np.isnan(leaf)) for leaf in jax.tree_util.tree_leaves(new)
               if np.issubdtype(np.asarray(leaf).dtype, np.floating))
    accepted = bool(accepted) and sane
    return (pack(new) if accepted else state), jax.device_put(np.bool_(accepted))


def make_filter(kind: str, params: dict, guarantee: dict, *, init: Callable[[], Any],
                core: Callable, remaining: Callable[[Any], Any], settings: tuple = (),
                prepare: Callable | None = None, static: tuple[str, ...] = (),
                cost_shape: tuple[int, ...] = (), cost_pair: bool = False,
                host: bool = False) -> Filter:
    """A :class:`Filter` from its float64 parts.

    ``init() -> state`` and ``core(settings, state, query, **static) -> (state, accepted)`` work on
    plain float64 / int64 states; ``core`` is pure and module-level, and gets the filter's
    numbers as ``settings`` (a tuple of arrays, data): its compiled program is shared by every
    filter built from it (one per state structure, query structure and static options).
    ``remaining(state)`` reads a state. ``prepare(state, query) -> (query, static values)`` may
    adapt a query on the host before tracing. ``cost_shape``: the shape a cost given in numbers
    broadcasts to; ``cost_pair``: such a cost may also be a tuple of two (the filter's cost,
    delta_n). ``host``: ``core`` also runs on NumPy values, and a spend of a concrete state and
    query in host memory runs it there (:func:`_host_spend`), compiling nothing."""
    host_settings = jax.tree_util.tree_map(np.asarray, settings)
    with jax.enable_x64(True):
        like = jax.eval_shape(init)
        settings = jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x)), settings)
    compiled = _guarded_spend(core, tuple(static), state_structure(like))

    @functools.cache
    def state_tree():
        return jax.tree_util.tree_structure(packed_init())

    @float64
    def spend(state, query):
        if jax.tree_util.tree_structure(state) != state_tree():
            raise ValueError(f"state must be this {kind} filter's state (from its init() or a "
                             f"previous spend), got {type(state).__name__}")
        query = _canonical(kind, query, cost_shape, cost_pair)
        options = {}
        if prepare is not None:
            query, options = prepare(state, query)
        if host and _runs_on_host(state, query):
            return _host_spend(core, host_settings, like, state, query, options)
        with slow_call_notice(f"pldjax.filters.{kind}_filter(...).spend"):
            return compiled(settings, state, query, **options)

    @float64
    def packed_init():
        return pack(init())

    @float64
    def read(state):
        # numbers leave as NumPy float64; a PLD (the natural filter's composition) keeps its
        # JAX float64 arrays, which pass a caller's jit unchanged whatever the x64 flag. A
        # concrete state is read on the host (NumPy: no compiled program).
        host = not is_traced(state) and not _under_trace()

        def leave(x):
            if isinstance(x, PLD):  # read on the host: its NumPy arrays placed on the device
                return jax.tree_util.tree_map(jax.device_put, x) if host else x
            return host_result(x)

        return jax.tree_util.tree_map(leave, remaining(unpack(state, like, host=host)),
                                      is_leaf=lambda x: isinstance(x, PLD))

    return Filter(packed_init, spend, read, guarantee, kind, params)

