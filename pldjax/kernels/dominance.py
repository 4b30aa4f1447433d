"""The Blackwell order of PLDs and suprema of families.

* Order (Regehr et al. 2026, Prop. 10): L is dominated by B iff delta_L(eps) <= delta_B(eps) for
  every real eps. On grids both curves are piecewise linear in e^eps between their points, so the
  comparison at the union of both grids' points is exact (below both grids both curves are linear
  from (x = 0, 1); above both they are constant).
* Supremum (Prop. 11): the pointwise maximum of the curves at the points of a common grid, joined by
  chords (connect-the-dots): a convex curve above every member's, turned back into masses.

Both directions of a two-direction PLD must be dominated.

Pessimistic discretizations of mechanisms with unbounded loss (the Gaussian) and compositions keep
the mass beyond their window as a small atom at +inf (1e-24 .. 1e-15): delta never reaches 0, so no
smooth curve that tends to 0 can dominate them exactly. :func:`dominated_by` and
:mod:`pldjax.kernels.gaussian_dp` therefore take an additive ``delta_slack``: they certify
delta_L <= delta_B + delta_slack + ROUNDOFF (1e-14) at every eps, which a filter must account as
an extra delta.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.align import align, regrid
from pldjax.core.compilation import array_module, kernel_jit, map_rows, to_device
from pldjax.core.mass import settle
from pldjax.core.pld import PLD, batched, broadcast_rows, check_same_kind, computed_on_host, unchecked_pld
from pldjax.core.precision import float64, host_result
from pldjax.core.validation import check_range, is_traced
from pldjax.kernels.discretize import masses_from_curve
from pldjax.kernels.hockey_stick import delta_kernel, grid_deltas

# -- order ----------------------------------------------------------------------------------------
#: Absolute round-off of delta values computed from grid masses (sums of up to 2^25 terms near 1):
#: comparisons certify delta_L <= delta_B + delta_slack + ROUNDOFF.
ROUNDOFF = 1e-14


def dominance_excess_kernel(l_probs, l_inf, l_off, l_step, b_probs, b_inf, b_off, b_step):
    """max over every real eps of delta_L(eps) - delta_B(eps), single directions: both curves are
    piecewise linear in e^eps between their grid points, so the union of the two grids suffices.
    NumPy arrays are compared in NumPy."""
    xp = array_module(l_probs, b_probs)

    def points(probs, off, step):
        return (off + xp.arange(probs.shape[-1], dtype=xp.float64)) * step

    union = xp.concatenate([points(l_probs, l_off, l_step), points(b_probs, b_off, b_step)])
    return xp.max(
        delta_kernel(l_probs, l_inf, l_off, l_step, union)
        - delta_kernel(b_probs, b_inf, b_off, b_step, union)
    )


_dominance_excess_jit = kernel_jit(dominance_excess_kernel)


def _unbatched(pld: PLD, what: str) -> None:
    if pld.batch_shape:
        raise ValueError(f"{what} takes unbatched PLDs (index the batch: pld[i])")


@float64
def dominated_by(query: PLD, budget: PLD, *, delta_slack: float = 0.0):
    """True only if delta_query(eps) <= delta_budget(eps) + delta_slack at every eps for the exact
    distributions (L is dominated by B in the Blackwell order when delta_slack = 0).

    ``query`` must be pessimistic (its curve is above the truth) and ``budget`` optimistic (below
    the truth): then the exact comparison of the two grid PLDs is a proof. The answer may be False
    although the exact relation holds by less than the budget's optimistic gap (build the budget
    on a finer grid to shrink it); it is never True when the relation fails by more than
    ``delta_slack`` plus ROUNDOFF. Both directions must be dominated. Batched over the query's
    batch axes (the budget is one PLD); works under jit (the result is then a traced bool array).
    The two may sit on any grid steps, eager or under jit: both curves are compared at the union
    of their grids' points, which is exact, so nothing is re-gridded (no alignment is needed).
    """
    _unbatched(budget, "dominated_by (budget)")
    if not query.pessimistic:
        raise ValueError("the query PLD must be pessimistic (an upper bound) for a sound answer")
    if budget.pessimistic:
        raise ValueError(
            "the budget PLD must be optimistic (pessimistic=False: a lower bound on its curve) "
            "for a sound answer"
        )
    check_range("delta_slack", delta_slack, 0.0, 1.0)
    pairs = [(query, budget)] if query.reverse is None and budget.reverse is None else list(
        zip((query.forward, query.backward), (budget.forward, budget.backward), strict=True))
    excess = None
    for q, b in pairs:
        if computed_on_host([q, b], q.size + b.size):
            budget_arrays = [np.asarray(a) for a in (b.probs, b.inf_mass, b.offset, b.step)]

            def excess_of(*row, budget=budget_arrays):
                return dominance_excess_kernel(*row, *budget)

            rows = broadcast_rows(q, q.batch_shape)
            with np.errstate(all="ignore"):  # as in XLA: exp(-inf) = 0 and the like
                out = map_rows(excess_of)(*(np.asarray(a) for a in (rows.probs, rows.inf_mass,
                                                                    rows.offset, rows.step)))
            out = out.reshape(q.batch_shape)
        else:
            fn = batched(
                lambda p, m, o, h, b=b: _dominance_excess_jit(p, m, o, h, b.probs, b.inf_mass,
                                                              b.offset, b.step),
                len(q.batch_shape),
            )
            out = fn(q.probs, q.inf_mass, q.offset, q.step)
            out = out if is_traced(out) else np.asarray(out)  # compared on the host
        excess = out if excess is None else (jnp if is_traced(out) else np).maximum(excess, out)
    result = host_result(excess <= delta_slack + ROUNDOFF)
    return bool(result) if not query.batch_shape and not is_traced(result) else result


# -- supremum -------------------------------------------------------------------------------------
def sup_kernel(probs, inf_mass, offset, step, *, size: int):
    """The sup of a family (arrays with a leading family axis, one step) on ``size`` grid points
    from the lowest member offset: (probs, inf_mass, offset). NumPy arrays are computed in
    NumPy."""
    xp = array_module(probs)
    low = xp.min(offset)
    points = (low + xp.arange(size, dtype=xp.float64)) * step
    if xp is np:
        curve = np.max([delta_kernel(*member, step, points)
                        for member in zip(probs, inf_mass, offset, strict=True)], axis=0)
    else:
        curve = jnp.max(jax.vmap(delta_kernel, in_axes=(0, 0, 0, None, None))(
            probs, inf_mass, offset, step, points), axis=0)
    out, out_inf = masses_from_curve(curve, step, curve + xp.expm1(points), points)
    # round-off in the masses may leave the rebuilt curve a few 1e-13 below the maximum: move that
    # much mass from the bottom to +inf, which raises delta by it at every grid point
    shortfall = xp.max(curve - grid_deltas(out, out_inf, step))
    out, out_inf = settle(out, out_inf, 0.0, xp.maximum(shortfall, 0.0), True, xp)
    return out, out_inf, low


_sup_jit = kernel_jit(sup_kernel, static_argnames=("size",))


@float64
def sup(plds, *, size: int | None = None) -> PLD:
    """The least upper bound of a family in the Blackwell order, as a pessimistic PLD (Prop. 11).

    ``plds``: one PLD whose leading batch axis is the family (one compiled call; works under
    jit, where ``size`` must be given), or a list of unbatched PLDs. All must be pessimistic.
    Members on different steps are first aligned on the safe side (:func:`pldjax.core.align.align`):
    exactly onto the finest step when the steps are integer multiples of it and the result fits
    grid.MAX_SIZE, otherwise onto the coarsest step by connect-the-dots (each member's curve
    raised to its chords there: still an upper bound); under jit onto the largest step. The
    result's curve is the maximum of the members' curves at the common grid's points joined by
    chords: above every member, and the tightest such PLD on the grid; the sup of an ordered
    family is its largest member. ``size``: number of grid points of the result from the lowest
    member's first point (default: up to the highest member's last point).

    Args:
      plds: one :class:`PLD` with exactly one batch axis (the family), or a non-empty list of
        unbatched PLDs; all pessimistic (else a ValueError).
      size: a whole number of grid points of the result, or None (default: from the lowest
        member's first point up to the highest member's last); required under ``jit`` (else a
        ValueError).

    Returns:
      An unbatched, pessimistic :class:`PLD` on the common step, an upper bound on every member
      (it dominates each), with two directions when any member has two (each direction the
      supremum of the members' in that direction).
    """
    family = _as_family(plds)
    if not family.pessimistic:
        raise ValueError("sup needs pessimistic PLDs: the maximum of lower bounds bounds nothing")
    traced = is_traced(family)
    if traced and size is None:
        raise ValueError("sup under jit needs size=")
    if size is not None:
        size = grid_lib.check_size("size", size, minimum=1, maximum=grid_lib.MAX_SIZE)

    def one(direction: PLD) -> PLD:
        n = size
        if n is None:
            offsets = np.asarray(direction.offset)
            n = int(offsets.max() - offsets.min()) + direction.size
            if n > grid_lib.MAX_SIZE:
                raise ValueError(f"plds: their sup spans {n} grid points from the lowest member's "
                                 f"first to the highest's last (more than grid.MAX_SIZE = "
                                 f"{grid_lib.MAX_SIZE}, a memory guard); pass a smaller size=")
        if not traced and computed_on_host([direction], n):
            step = np.asarray(direction.step, np.float64)[0]
            with np.errstate(all="ignore"):  # as in XLA: exp(-inf) = 0 and the like
                parts = sup_kernel(*(np.asarray(a) for a in (direction.probs, direction.inf_mass,
                                                             direction.offset)), step, size=n)
            return unchecked_pld(*(to_device(np.asarray(a)) for a in (*parts, step)), True)
        step = direction.step[0] if traced else to_device(np.asarray(direction.step)[0])
        probs, inf_mass, offset = _sup_jit(
            direction.probs, direction.inf_mass, direction.offset, step, size=n
        )
        return unchecked_pld(probs, inf_mass, offset, step, True)

    return family.map_directions(one)


def _as_family(plds) -> PLD:
    """A list of unbatched PLDs (or a PLD with one batch axis) as one PLD with a family axis,
    each direction on one step (aligned, see :func:`sup`)."""
    if isinstance(plds, PLD):
        if len(plds.batch_shape) != 1:
            raise ValueError("sup takes a PLD with exactly one batch axis (the family), or a list")
        if is_traced(plds.step):  # the largest step of the family: a static size
            def widest(d: PLD) -> PLD:
                return regrid(d, jnp.max(d.step), d.size + 2)

            return plds.map_directions(widest)
        members = [plds[i] for i in range(len(plds))]
    else:
        members = list(plds)
        if not members or not all(isinstance(m, PLD) for m in members):
            raise ValueError("plds must be a non-empty list of PLDs")
        for m in members:
            _unbatched(m, "sup (a list of unbatched PLDs or one PLD with one batch axis)")
    check_same_kind(members)
    two = any(m.reverse is not None for m in members)

    def stack(directions: list[PLD]) -> PLD:
        directions = align(directions, "sup")
        n = max(d.size for d in directions)  # zero mass appended above a window changes nothing
        xp = jnp if is_traced(directions) else np  # NumPy: no program compiled per member
        parts = (xp.stack([xp.pad(xp.asarray(d.probs), (0, n - d.size)) for d in directions]),
                 xp.stack([xp.asarray(d.inf_mass) for d in directions]),
                 xp.stack([xp.asarray(d.offset, np.int64) for d in directions]),
                 xp.stack([xp.asarray(d.step, np.float64) for d in directions]))
        return unchecked_pld(*(to_device(a) for a in parts), members[0].pessimistic)

    forward = stack([m.forward for m in members])
    return PLD.from_directions(forward, stack([m.backward for m in members]) if two else None)

