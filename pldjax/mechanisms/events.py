"""Mechanisms and their PLDs: noise x sampling x neighbouring -> a PLD, by connect-the-dots.

The entry point is :func:`privacy_loss`: a noise record (:mod:`pldjax.mechanisms.noise`), a
sampling scheme (:mod:`pldjax.mechanisms.sampling`, or None) and a neighbouring relation
(:class:`~pldjax.mechanisms.neighboring.Neighboring`, or its string) give the loss tails that
:func:`~pldjax.kernels.discretize.discretize_arrays` turns into a
:class:`~pldjax.core.pld.PLD`, batched over parameter arrays in one jitted, vmapped call (the
parameters are data, so new values never trigger recompilation). :class:`Event` is the same
description as one object, for code that passes it on (accounting, calibration). The named
constructors are in :mod:`pldjax.mechanisms.named`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import on_host, to_device
from pldjax.core.grid import Grid
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.validation import check_flag, is_traced
from pldjax.kernels.discretize import discretize_arrays
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import (
    Noise,
)
from pldjax.mechanisms.sampling import Directions, Sampling
from pldjax.mechanisms.subsampling import ADD, REMOVE


@float64
def _directions(
    noise: Noise,
    sampling: Sampling | None = None,
    neighboring: Neighboring | str = Neighboring.ADD_REMOVE,
    pessimistic: bool = True,
) -> Directions:
    """The mechanism a description stands for, before discretization (arguments as for
    :func:`privacy_loss`)."""
    neighboring = Neighboring.parse(neighboring)
    if sampling is None:
        mechanism, params = noise.pair(neighboring, pessimistic)
        return Directions(mechanism, params, False)
    return sampling.directions(noise, neighboring, pessimistic)


@announces_slow_calls("pldjax.privacy_loss")
@float64
def privacy_loss(
    noise: Noise,
    sampling: Sampling | None = None,
    neighboring: Neighboring | str = Neighboring.ADD_REMOVE,
    *,
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The PLD of ``noise`` under ``sampling`` and ``neighboring``; pessimistic (an upper bound,
    connect-the-dots) by default, optimistic (a lower bound) with ``pessimistic=False``.

    Args:
      noise: a record of :mod:`pldjax.mechanisms.noise`, e.g. ``pj.noise.Gaussian(sigma, sensitivity=1.0)``
        (array parameters give a batch of PLDs; they broadcast with the sampling's).
      sampling: a record of :mod:`pldjax.mechanisms.sampling` (``pj.sampling.Poisson(q)``,
        ``FixedBatch(q)``, ``Mixture(scales, probs)``, ``TruncatedPoisson(q, n, b)``,
        ``RandomAllocation(steps, selected)``), or None
        (default) for none.
      neighboring: "add_remove" (default), "replace_one" or "replace_special" (zero-out), or a
        :class:`Neighboring`.
      pessimistic: True for the connect-the-dots upper estimate (default), False for the
        optimistic lower estimate.
      grid: optional :class:`Grid`; automatic by default (for integer-valued noise without
        sampling, a grid on which the PLD is exact).

    Schemes with two directions (Poisson and mixture sampling under add/remove, sampling without
    replacement) give a PLD with both (remove: the mixture against the base; add: the base
    against the mixture); every reported value is the worse of the two.

    Concrete parameters out of range raise a ValueError when their record is built; traced ones
    (under ``jit`` or ``vmap``) out of range give, element by element, the PLD that claims
    nothing (:meth:`~pldjax.core.pld.PLD.where_valid`: pessimistic, delta = 1 everywhere).

    Returns:
      A :class:`PLD` whose batch shape is the broadcast shape of the noise's and the sampling's
      parameters (a :class:`~pldjax.mechanisms.sampling.Mixture`'s last axis, its components,
      left out; unbatched for scalars), with two directions for the schemes above that have them.
      Pessimistic (``pessimistic=True``, the default): it dominates the true mechanism, an upper
      bound on delta(eps) and on epsilon(delta). Optimistic (``pessimistic=False``): a
      lower bound; there an invalid traced element is the identity (all of the mass at loss 0).
    """
    _check_records(noise, sampling)
    pessimistic = check_flag("pessimistic", pessimistic)
    pld = _privacy_loss(noise, sampling, neighboring, pessimistic, grid)
    if is_traced((noise, sampling)):
        valid = noise.valid() if sampling is None else noise.valid() & sampling.valid()
        pld = pld.where_valid(valid)
    return pld


def _check_records(noise, sampling) -> None:
    """A ValueError naming ``noise`` or ``sampling`` when it is not one of pldjax's records (a
    jax-privacy batch selection strategy, say, is a description of batches, not of a mechanism's
    sampling analysis)."""
    if not isinstance(noise, Noise):
        raise ValueError(f"noise must be a pj.noise record (e.g. pj.noise.Gaussian(sigma)), got "
                         f"{noise!r}")
    if sampling is not None and not isinstance(sampling, Sampling):
        raise ValueError(f"sampling must be None or a pj.sampling record (Poisson, FixedBatch, "
                         f"Mixture, TruncatedPoisson, RandomAllocation), got {type(sampling).__name__}: "
                         f"{sampling!r}")


def _privacy_loss(noise, sampling, neighboring, pessimistic, grid) -> PLD:
    """:func:`privacy_loss` before the rule for invalid traced parameters."""
    if sampling is not None:  # a scheme that builds its PLD itself (a mixture of PLDs)
        built = sampling.pld(noise, Neighboring.parse(neighboring), pessimistic, grid)
        if built is not None:
            return built
    directions = _directions(noise, sampling, neighboring, pessimistic)
    if grid is None:
        grid = lattice(noise, sampling, neighboring, pessimistic)
    return discretize_directions(directions, grid, pessimistic)


def lattice(noise: Noise, sampling: Sampling | None, neighboring: Neighboring | str,
            pessimistic: bool) -> Grid | None:
    """The grid a description's PLD is built on when none is given: for one configuration of
    integer-valued noise without sampling, one on which the PLD is exact; for bounded noise
    (Laplace, randomized response, discrete Laplace; subsampled or not) one that holds its
    largest loss on a grid point, so that epsilon at delta = 0 is exact (see
    :meth:`pldjax.mechanisms.noise.Noise.lattice`, :meth:`pldjax.mechanisms.sampling.Sampling.lattice`);
    None (the automatic grid) otherwise, and for a batch."""
    neighboring = Neighboring.parse(neighboring)
    if sampling is None:
        return noise.lattice(noise.pair(neighboring, pessimistic)[1], pessimistic)
    return sampling.lattice(noise, neighboring, pessimistic)


def direction_arrays(directions: Directions, grid: Grid | None, pessimistic: bool, tail=None,
                     size: int | None = None, then: Callable | None = None,
                     extra: tuple = (), steps=None, host: bool = False,
                     tiles: int | None = None) -> tuple:
    """(probs, inf_mass, offset, step) of each direction of a mechanism before discretization
    (:meth:`Event.directions`) on ``grid`` (None: automatic), stacked on a leading axis (remove
    then add, or the one direction), then the broadcast parameters' axes; both directions in one
    vmapped call (one compiled kernel: the direction is a parameter). ``tail``, ``size``,
    ``then``, ``extra``, ``steps`` (each configuration's grid step, both directions on it),
    ``host`` and ``tiles``: see :func:`pldjax.kernels.discretize.discretize_arrays` (``then`` gets the
    flat rows with the directions innermost: each configuration's remove, then its add). For
    code that discretizes a batch of events itself (:mod:`pldjax.accounting.engine`); concrete results in
    host memory stay NumPy arrays."""
    mechanism, params, both = directions
    # concrete parameters, and results in host memory, are handled in NumPy: no small compiled
    # programs for the staging and the slices
    xp = jnp if is_traced((params, tail)) else np
    if both:
        params = tuple(xp.asarray(p)[..., None] for p in params) + (xp.asarray([REMOVE, ADD]),)
        tail = None if tail is None else xp.asarray(tail)[..., None]
        steps = None if steps is None else np.asarray(steps)[..., None]
    out = discretize_arrays(mechanism, params, grid, pessimistic, tail, size, then, extra, steps,
                            host, tiles)
    if then is not None:
        return out
    probs, *rest = out
    xp = np if on_host(probs) else jnp
    if not both:
        return (xp.asarray(probs)[None], *(xp.asarray(a)[None] for a in rest))
    return (xp.moveaxis(xp.asarray(probs), -2, 0), *(xp.moveaxis(xp.asarray(a), -1, 0) for a in rest))


def discretize_directions(directions: Directions, grid: Grid | None, pessimistic: bool) -> PLD:
    """The PLD of a mechanism before discretization (:meth:`Event.directions`) on ``grid``
    (None: automatic), keeping both directions when it has two (see :func:`direction_arrays`)."""
    rows = direction_arrays(directions, grid, pessimistic)
    remove, *add = (unchecked_pld(*(to_device(a[i]) for a in rows), bool(pessimistic))
                    for i in range(rows[0].shape[0]))
    if not add:
        return remove
    return PLD.from_directions(remove, add[0])


def distinct_configurations(event: Event, shape: tuple[int, ...],
                            indices: np.ndarray | None = None) -> list[tuple[Event, np.ndarray]]:
    """The distinct configurations of ``event``, its parameters broadcast to ``shape`` and
    flattened: each as an event of scalar parameters, with the flat indices (among ``indices``;
    None: all) of the configurations equal to it, in order of first appearance. For accounting
    that builds one PLD or one grid per configuration."""
    leaves, treedef = jax.tree.flatten(event)
    flat = [np.broadcast_to(np.asarray(leaf), shape).reshape(-1) for leaf in leaves]
    if indices is None:
        indices = np.arange(math.prod(shape))
    rows = zip(*(leaf[indices].tolist() for leaf in flat), strict=True) if flat else None
    groups: dict[tuple, list[int]] = {}
    for i, row in zip(indices.tolist(), rows or [()] * len(indices), strict=True):
        groups.setdefault(row, []).append(i)
    return [(jax.tree.unflatten(treedef, row), np.asarray(members, np.int64))
            for row, members in groups.items()]


@dataclasses.dataclass(frozen=True)
class Event:
    """A mechanism's description: ``noise`` (:mod:`pldjax.mechanisms.noise`), ``sampling``
    (:mod:`pldjax.mechanisms.sampling`, or None) and ``neighboring`` (a string is parsed when built).

    A pytree: its leaves are the parameters (arrays allowed: a batch), its structure (the classes,
    the number of mixture components, the neighbouring relation) is static and hashable, so an
    event passes through ``jit`` and ``vmap`` and one compiled kernel serves every parameter
    value. With Python numbers as parameters the event itself is hashable. ``jax.vmap`` maps it
    with every leaf batched (or build the event inside the mapped function); an ``in_axes`` given
    as an event would be a record of axis numbers, which its checks refuse.
    """

    noise: Noise
    sampling: Sampling | None = None
    neighboring: Neighboring = Neighboring.ADD_REMOVE

    def __post_init__(self):
        _check_records(self.noise, self.sampling)
        object.__setattr__(self, "neighboring", Neighboring.parse(self.neighboring))

    def directions(self, pessimistic: bool = True) -> Directions:
        """Its mechanism before discretization: the :class:`~pldjax.kernels.discretize.LossTails`, its
        parameters (float64 arrays that broadcast) and whether it has two directions (then the
        mechanism takes one more parameter, the direction); for code that discretizes many
        events itself (batched accounting)."""
        return _directions(self.noise, self.sampling, self.neighboring, pessimistic)

    def pld(self, *, pessimistic: bool = True, grid: Grid | None = None) -> PLD:
        """Its PLD (:func:`privacy_loss`)."""
        return privacy_loss(self.noise, self.sampling, self.neighboring, pessimistic=pessimistic,
                            grid=grid)


jax.tree_util.register_dataclass(Event, data_fields=["noise", "sampling"], meta_fields=["neighboring"])

__all__ = ["Event", "direction_arrays", "discretize_directions", "distinct_configurations", "lattice",
           "privacy_loss"]
