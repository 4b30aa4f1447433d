"""The PLD type: a privacy loss distribution on a fixed, uniform grid, as an immutable pytree.

A PLD describes the privacy loss L = log(P(x)/Q(x)) for x ~ P. Its finite part sits on the grid
``z_i = (offset + i) * step`` for ``i = 0 .. n-1`` with masses ``probs[..., i]``; ``inf_mass`` is the
atom at L = +inf (outputs that P can produce and Q cannot). ``offset`` and ``step`` are data, so
``vmap`` can batch PLDs that sit at different places and on different scales; ``n`` (the trailing
length of ``probs``) is static. The flag ``pessimistic`` (static) says whether the arrays describe a
pessimistic estimate (its hockey-stick curve is an upper bound on the true one) or an optimistic
estimate (a lower bound, reported only to show tightness).

Asymmetric mechanisms (add/remove adjacency, Poisson subsampling) keep both directions: ``reverse``
holds the PLD of the other direction, or is ``None`` for symmetric PLDs (whose two directions
coincide). Every guarantee reported by a two-direction PLD is the worse of the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from pldjax.core.compilation import (
    HOST_POINTS,
    HOST_ROWS,
    glue_module,
    keep_freed_host_memory,
    readable_on_host,
)
from pldjax.core.notice import slow_call_notice
from pldjax.core.precision import float64
from pldjax.core.validation import check_flag, is_traced

#: Largest |total mass - 1| of a PLD (its masses plus its atom at +inf) accepted as round-off; an
#: optimistic PLD may hold less (mass it dropped), never more. Also the most by which the mass of
#: Q its losses imply (sum p e^-z) may exceed 1 in a filter's query.
MASS_TOLERANCE = 1e-9
#: The same for a pessimistic PLD built from its parts: room for a caller's own upper bounds on
#: masses, whose slack implies a Q mass above 1 (random allocation's lattice bounds imply up to
#: 2e-7 before pldjax moves mass up to hold them to 1). An optimistic PLD's Q mass is not
#: checked: mass it moves to lower losses (to its window's bottom) raises it, and losses lower
#: than possible only lower a lower bound.
PARTS_Q_TOLERANCE = 1e-6


@jax.tree_util.register_pytree_node_class
class PLD:
    """A privacy loss distribution on the grid ``(offset + i) * step`` plus an atom at +inf.

    Attributes:
      probs: float64 array ``(..., n)``, the masses of the finite losses (under P).
      inf_mass: float64 array ``(...)``, the mass at loss +inf.
      offset: int64 array ``(...)``, the grid index of ``probs[..., 0]``.
      step: float64 array ``(...)``, the grid spacing in nats.
      pessimistic: static bool; True for an upper (pessimistic) estimate of the true PLD.
      reverse: the PLD of the other adjacency direction, or None when both coincide.
    """

    __slots__ = ("probs", "inf_mass", "offset", "step", "pessimistic", "reverse")

    def __init__(self, probs, inf_mass, offset, step, pessimistic: bool = True, reverse=None):
        """A PLD from its parts (see the class attributes; ``inf_mass``, ``offset`` and ``step``
        broadcast to the batch shape of ``probs``). Concrete parts are checked, and a ValueError
        names what is wrong: they must be real numbers, the masses and step in float64 (with
        ``jax_enable_x64`` off, ``jnp`` arrays are float32: pass NumPy arrays), the masses
        finite and >= 0, summing with the atom to 1 within MASS_TOLERANCE (an optimistic PLD's
        to at most 1), the offsets whole numbers, the step finite and > 0, and a pessimistic
        PLD's losses possible (sum p e^-z, the mass of Q, at most 1 within PARTS_Q_TOLERANCE:
        losses all below 0 would claim epsilon = 0). Traced parts (inside ``jit``) are not
        checked, nor parts that are all Python ints or None (a ``vmap`` axis specification,
        ``in_axes=pj.PLD(0, None, 0, 0)``)."""
        _fill(self, probs, inf_mass, offset, step, check_flag("pessimistic", pessimistic),
              reverse)
        parts = (probs, inf_mass, offset, step)
        axes = all(part is None or type(part) is int for part in parts)
        if not axes and not is_traced(parts):
            _check_parts(self)

    # -- pytree -----------------------------------------------------------------------------
    def tree_flatten(self):
        return (self.probs, self.inf_mass, self.offset, self.step, self.reverse), self.pessimistic

    @classmethod
    def tree_unflatten(cls, pessimistic, children):
        return unchecked_pld(*children[:4], pessimistic, children[4])

    def __setattr__(self, name, value):
        if hasattr(self, "reverse"):  # all slots set: the object is frozen
            raise AttributeError("PLD is immutable")
        object.__setattr__(self, name, value)

    # -- shape ------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of finite grid points (static)."""
        return int(self.probs.shape[-1])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(self.probs.shape[:-1])

    @property
    def symmetric(self) -> bool:
        return self.reverse is None

    # -- directions -------------------------------------------------------------------------
    def directions(self) -> tuple[PLD, ...]:
        """The one or two single-direction PLDs this object stands for."""
        if self.reverse is None:
            return (self,)
        return (self.forward, self.reverse)

    @property
    def forward(self) -> PLD:
        """The first direction, PLD(P || Q), alone (without ``reverse``)."""
        if self.reverse is None:
            return self
        return unchecked_pld(self.probs, self.inf_mass, self.offset, self.step, self.pessimistic)

    @property
    def backward(self) -> PLD:
        """The second direction, PLD(Q || P); the PLD itself when both coincide."""
        return self.forward if self.reverse is None else self.reverse

    @staticmethod
    def from_directions(forward: PLD, backward: PLD | None = None) -> PLD:
        """The PLD whose directions are ``forward`` and ``backward`` (None: symmetric)."""
        return unchecked_pld(forward.probs, forward.inf_mass, forward.offset, forward.step,
                             forward.pessimistic, backward)

    def map_directions(self, fn: Callable[[PLD], PLD]) -> PLD:
        """``fn`` applied to each direction, the results joined again (once if symmetric)."""
        if self.reverse is None:
            return fn(self)
        return PLD.from_directions(fn(self.forward), fn(self.reverse))

    def where_valid(self, valid) -> PLD:
        """This PLD where ``valid`` (a boolean array broadcasting with the batch shape) holds, and
        elsewhere the PLD that claims nothing (the rule for invalid traced input, see
        :mod:`pldjax.core.validation`): pessimistic, all of the mass at +inf (delta = 1 at every
        epsilon); optimistic, the identity (all of the mass at loss 0). Either way on offset 0
        and, when this one's step is not a positive number, step 1."""
        valid = jnp.asarray(valid, bool)

        def one(d: PLD) -> PLD:
            ok = jnp.broadcast_to(valid, d.batch_shape)
            empty = jnp.zeros(d.size, jnp.float64)
            nothing = empty if d.pessimistic else empty.at[0].set(1.0)
            step = jnp.asarray(d.step, jnp.float64)
            usable = ok | (jnp.isfinite(step) & (step > 0))
            return unchecked_pld(jnp.where(ok[..., None], d.probs, nothing),
                                 jnp.where(ok, d.inf_mass, 1.0 if d.pessimistic else 0.0),
                                 jnp.where(ok, d.offset, jnp.zeros((), jnp.asarray(d.offset).dtype)),
                                 jnp.where(usable, step, 1.0), d.pessimistic)

        return self.map_directions(one)

    def stack_directions(self) -> tuple:
        """(probs, inf_mass, offset, step) with a direction axis (length 1 or 2) right after the
        batch axes; the shorter direction is padded with zero mass above its window. NumPy
        arrays for a PLD of concrete arrays in host memory."""
        directions = self.directions()
        n = max(d.size for d in directions)
        nb = len(self.batch_shape)
        # NumPy for concrete arrays in host memory (no eager jnp operation, no program)
        xp = glue_module(jax.tree_util.tree_leaves(self))

        def pad(d: PLD):
            return xp.pad(d.probs, [(0, 0)] * nb + [(0, n - d.size)])

        return (xp.stack([pad(d) for d in directions], axis=nb),
                xp.stack([xp.asarray(d.inf_mass, xp.float64) for d in directions], axis=nb),
                xp.stack([xp.asarray(d.offset, xp.int64) for d in directions], axis=nb),
                xp.stack([xp.asarray(d.step, xp.float64) for d in directions], axis=nb))

    def __getitem__(self, index) -> PLD:
        """Index the batch axes (``pld[2]``, ``pld[:, 0]``)."""
        if not self.batch_shape:
            raise IndexError("this PLD has no batch axes")
        index = index if isinstance(index, tuple) else (index,)
        reverse = None if self.reverse is None else self.reverse[index]
        return unchecked_pld(
            self.probs[index + (Ellipsis, slice(None))],
            self.inf_mass[index],
            self.offset[index],
            self.step[index],
            self.pessimistic,
            reverse,
        )

    def __len__(self) -> int:
        if not self.batch_shape:
            raise TypeError("len() of an unbatched PLD")
        return self.batch_shape[0]

    def __repr__(self) -> str:
        kind = "pessimistic" if self.pessimistic else "optimistic"
        sym = "symmetric" if self.symmetric else "two directions"
        return f"PLD({kind}, {sym}, batch_shape={self.batch_shape}, size={self.size})"

    # -- derived quantities -----------------------------------------------------------------
    @property
    @float64
    def losses(self) -> jax.Array:
        """The finite loss values ``(offset + i) * step`` (nats), shape ``(..., n)``."""
        idx = jnp.arange(self.size, dtype=jnp.float64)
        off = jnp.asarray(self.offset, jnp.float64)[..., None]
        return (off + idx) * jnp.asarray(self.step)[..., None]

    @float64
    def total_mass(self) -> jax.Array:
        """Finite mass plus the +inf atom; 1 up to round-off for every valid PLD."""
        return jnp.sum(self.probs, axis=-1) + self.inf_mass

    # -- the API (implemented in the kernel modules) ----------------------------------------
    def delta(self, epsilon) -> jax.Array:
        """Hockey-stick divergence delta(epsilon); an upper bound if the PLD is pessimistic.

        ``epsilon`` is a scalar or array (nats, >= 0, inf allowed: a negative epsilon is a
        ValueError); the result has shape ``batch_shape + shape(epsilon)``, NumPy float64 (a
        float for a scalar) on the host. For a two-direction PLD it is the larger direction.
        """
        from pldjax.kernels.hockey_stick import delta

        return delta(self, epsilon)

    def epsilon(self, delta) -> jax.Array:
        """Smallest epsilon >= 0 with delta(epsilon) <= ``delta`` (inf if the +inf atom exceeds it).

        Exact on this discrete PLD up to its evaluation's round-off (a few ulps of the logarithms
        it takes), which is charged on the estimate's side: an upper bound on the true epsilon if
        the PLD is pessimistic, a lower bound if optimistic.
        ``delta`` is a scalar or array in [0, 1]; result shape ``batch_shape + shape(delta)``.
        """
        from pldjax.kernels.hockey_stick import epsilon

        return epsilon(self, delta)

    def tradeoff(self, alpha) -> jax.Array:
        """The f-DP tradeoff curve: beta(alpha), the smallest type II error of a test of P against
        Q with type I error ``alpha`` in [0, 1]. A lower bound on the true beta if pessimistic;
        the smaller of the two directions for a two-direction PLD."""
        from pldjax.kernels.divergences import tradeoff

        return tradeoff(self, alpha)

    def renyi(self, order) -> jax.Array:
        """Rényi divergence D_order(P || Q) (nats; order > 0, 1 gives KL): the Rényi-DP epsilon.

        An upper bound if pessimistic; inf for orders >= 1 when there is an atom at +inf (as
        pessimistic discretizations of unbounded losses have); the larger of two directions.
        """
        from pldjax.kernels.divergences import renyi

        return renyi(self, order)

    def dominated_by(self, budget: PLD, *, delta_slack: float = 0.0) -> bool:
        """True only if this (pessimistic) PLD is dominated by ``budget`` (an optimistic PLD) for
        the exact distributions, up to an additive ``delta_slack`` (see
        :func:`pldjax.kernels.dominance.dominated_by`)."""
        from pldjax.kernels.dominance import dominated_by

        return dominated_by(self, budget, delta_slack=delta_slack)

    def log_mgf(self, t) -> jax.Array:
        """log E_P[e^{t L}], the log moment generating function of the loss (the PLD's two-sided
        Laplace transform at -t); D_a = log_mgf(a - 1) / (a - 1). An upper bound for t >= 0 if
        pessimistic; inf for t > 0 when there is an atom at +inf."""
        from pldjax.kernels.divergences import log_mgf

        return log_mgf(self, t)

    def swap(self) -> PLD:
        """PLD(Q || P): the directions exchanged (a symmetric PLD is its own swap)."""
        return swap(self)

    def compose(self, other: PLD, *, size: int | None = None) -> PLD:
        """The PLD of running both mechanisms (independent composition), by FFT convolution; on
        different steps the grids are aligned on the safe side (see
        :func:`pldjax.kernels.compose.compose`)."""
        from pldjax.kernels.compose import compose

        return compose([self, other], size=size)

    def self_compose(self, count: int, *, size: int | None = None) -> PLD:
        """The ``count``-fold composition with itself in one FFT power (cost independent of count)."""
        from pldjax.kernels.compose import self_compose

        with slow_call_notice("pldjax.PLD.self_compose"):
            return self_compose(self, count, size=size)


def _fill(pld: PLD, probs, inf_mass, offset, step, pessimistic: bool, reverse) -> None:
    for name, value in (("probs", probs), ("inf_mass", inf_mass), ("offset", offset),
                        ("step", step), ("pessimistic", pessimistic), ("reverse", reverse)):
        object.__setattr__(pld, name, value)


def unchecked_pld(probs, inf_mass, offset, step, pessimistic: bool = True,
                  reverse: PLD | None = None) -> PLD:
    """A PLD from parts that pldjax computed itself (its kernels' outputs, a pytree's leaves):
    the constructor's checks of a caller's parts skipped (they would read device arrays back to
    the host)."""
    pld = object.__new__(PLD)
    _fill(pld, probs, inf_mass, offset, step, pessimistic, reverse)
    return pld


def log_q_mass(probs, offset, step, xp=jnp):
    """log sum_i p_i e^{-z_i}, the log mass of Q where P > 0 (NaN-free for any finite masses;
    -inf when all are 0), with the array module ``xp`` (jax.numpy, or NumPy on the host)."""
    z = (xp.asarray(offset) + xp.arange(probs.shape[-1])) * step
    positive = probs > 0
    log_p = xp.log(xp.where(positive, probs, 1.0))
    terms = xp.where(positive, log_p - z, -np.inf)
    if xp is jnp:
        return logsumexp(terms)
    top = np.max(terms, initial=-np.inf)  # as jax's logsumexp: shifted by the largest if finite
    top = top if np.isfinite(top) else 0.0
    # the terms far below the largest add nothing; no mass at all: log 0 = -inf
    with np.errstate(under="ignore", divide="ignore"):
        return np.log(np.sum(np.exp(terms - top))) + top


def swapped_rows(probs, inf_mass, offset, step):
    """Rows of PLD(Q || P) from rows of PLD(P || Q) (NumPy, each row on its grid (offset, step)
    of the rows' common number of points): the same step and number of points, mirrored. A PLD
    is its pair of distributions: Q's mass at loss z is e^-z times P's, and the rest of Q, where
    P has none, is the swapped pair's +inf atom; P's +inf atom, where Q has none, is the swapped
    pair's loss -inf, which a PLD leaves out (``inf_mass`` is not read). Exchanging the
    distributions of a pair that dominates another gives one that dominates the other's
    exchange, so pessimistic rows give pessimistic rows: the atom is taken from above, by the
    round-off of the sum it is the rest of, and a surplus over 1 off the lowest losses.
    Returns (probs, inf_mass, offset, step)."""
    from pldjax.core.mass import settle

    points = probs.shape[-1]
    losses = (offset[:, None] + np.arange(points)) * step[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.where(probs > 0, np.exp(-losses) * probs, 0.0)
    total = np.sum(q, axis=-1)
    # pairwise summation's round-off, at most this many units of the sum
    slack = 2.0 * (math.log2(max(points, 2)) + 8.0) * np.finfo(np.float64).eps / 2
    atom = np.maximum(1.0 - total, 0.0) + slack * total
    rows = [settle(row[::-1], a, 0.0, 0.0, True, np) for row, a in zip(q, atom, strict=True)]
    swapped = np.stack([row for row, _ in rows]) if rows else q
    atoms = np.array([float(a) for _, a in rows])
    return swapped, atoms, -(np.asarray(offset) + points - 1), np.asarray(step)


@np.errstate(all="ignore")  # on the host: NaN and inf are what the rules look for
def pld_problems(pld: PLD, q_tolerance: float | None = MASS_TOLERANCE
                 ) -> list[tuple[str, str, jax.Array]]:
    """(parts, reason, bad) for each rule a PLD of one row must obey, ``bad`` True where it
    fails: traced where the PLD is, else computed in NumPy on the host (no compiled program).
    ``q_tolerance``: how far above 1 the mass of Q its losses imply may lie (None: unchecked)."""
    xp = jnp if is_traced(pld) else np
    rules = []
    for d in pld.directions():
        probs = xp.asarray(d.probs)
        inf_mass = xp.asarray(d.inf_mass)
        step = xp.asarray(d.step)
        total = xp.sum(xp.where(xp.isfinite(probs), probs, 0.0)) + inf_mass
        short = -MASS_TOLERANCE if pld.pessimistic else -np.inf
        rules += [
            ("probs, inf_mass", "a mass is NaN or infinite",
             ~(xp.all(xp.isfinite(probs)) & xp.isfinite(inf_mass))),
            ("probs, inf_mass", "a mass is negative", xp.any(probs < 0) | (inf_mass < 0)),
            ("probs, inf_mass", f"the total mass is not 1 (within {MASS_TOLERANCE}"
             + ("" if pld.pessimistic else "; an optimistic PLD's may be less") + ")",
             ~((total - 1.0 <= MASS_TOLERANCE) & (total - 1.0 >= short))),
            ("step", "the step is not finite and > 0", ~(xp.isfinite(step) & (step > 0))),
        ]
        if q_tolerance is not None:
            # E_P[e^-L] is the mass of Q where P > 0: at most 1 for any pair of distributions
            rules.append(("offset, step",
                          f"the losses imply a Q mass above 1 (sum of p e^-z > 1 + {q_tolerance})",
                          ~(log_q_mass(probs, d.offset, step, xp) <= xp.log1p(q_tolerance))))
    return rules


def _kind(value) -> np.dtype:
    dtype = getattr(value, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.asarray(value).dtype


def _check_parts(pld: PLD) -> None:
    """The constructor's checks of concrete parts (see :meth:`PLD.__init__`)."""
    for name in ("probs", "inf_mass", "offset", "step"):
        dtype = _kind(getattr(pld, name))
        if dtype.kind not in "biuf":
            raise ValueError(f"PLD {name} must be real numbers, got dtype {dtype}")
        if dtype.kind == "f" and dtype.itemsize < 8 and name != "offset":
            raise ValueError(
                f"PLD {name} must be float64, got {dtype} (with jax_enable_x64 off, jnp arrays "
                f"are float32 and have lost digits before pldjax sees them): pass NumPy arrays "
                f"or enable jax_enable_x64")
    shape = np.shape(pld.probs)
    if len(shape) == 0 or shape[-1] == 0:
        raise ValueError(f"PLD probs must have a last axis of at least one grid point, got shape "
                         f"{shape}")
    for name in ("inf_mass", "offset", "step"):
        part = np.shape(getattr(pld, name))
        try:
            fits = np.broadcast_shapes(part, shape[:-1]) == shape[:-1]
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"PLD {name} must broadcast to the batch shape {shape[:-1]} of "
                             f"probs, got shape {part}")
    if pld.reverse is not None and (not isinstance(pld.reverse, PLD)
                                    or pld.reverse.pessimistic != pld.pessimistic
                                    or pld.reverse.batch_shape != shape[:-1]):
        raise ValueError("PLD reverse must be None or a PLD of the same batch shape and the same "
                         "pessimistic flag (the other direction)")
    offset = np.asarray(pld.offset)
    if offset.dtype.kind == "f" and not np.all(np.isfinite(offset) & (offset == np.round(offset))):
        raise ValueError("PLD offset must be whole numbers (grid indices)")
    rows = np.reshape(np.asarray(pld.probs, np.float64), (-1, shape[-1]))
    parts = [np.broadcast_to(np.asarray(getattr(pld, name), dtype), shape[:-1]).reshape(-1)
             for name, dtype in (("inf_mass", np.float64), ("offset", np.float64),
                                 ("step", np.float64))]
    for index, (row, inf_mass, row_offset, step) in enumerate(zip(rows, *parts, strict=True)):
        one = unchecked_pld(row, inf_mass, row_offset, step, pld.pessimistic)
        for names, reason, bad in pld_problems(one, PARTS_Q_TOLERANCE if pld.pessimistic else None):
            if bool(bad):
                row_index = tuple(int(i) for i in np.unravel_index(index, shape[:-1]))
                where = f" (batch row {row_index})" if shape[:-1] else ""
                raise ValueError(f"PLD {names}: {reason}{where}")


def swap(pld: PLD) -> PLD:
    """PLD(Q || P) from PLD(P || Q): the two directions exchanged (a symmetric PLD is unchanged)."""
    if pld.reverse is None:
        return pld
    return PLD.from_directions(pld.reverse, pld.forward)


def check_same_kind(plds: Sequence[PLD]) -> bool:
    """Raise unless all PLDs are pessimistic or all optimistic; return the common flag."""
    kinds = {p.pessimistic for p in plds}
    if len(kinds) > 1:
        raise ValueError(
            "cannot compose a pessimistic PLD with an optimistic one: the result would be "
            "neither an upper nor a lower bound; build both with the same `pessimistic=` flag"
        )
    return kinds.pop()


def batched(kernel: Callable, n_batch_dims: int) -> Callable:
    """vmap ``kernel`` over ``n_batch_dims`` leading axes of all its array arguments."""
    for _ in range(n_batch_dims):
        kernel = jax.vmap(kernel)
    return kernel


def broadcast_rows(pld: PLD, shape: tuple[int, ...]) -> PLD:
    """Broadcast a single-direction PLD's arrays to the batch ``shape`` and flatten the batch."""
    flat = int(np.prod(shape)) if shape else 1
    leaves = (pld.probs, pld.inf_mass, pld.offset, pld.step)
    xp = glue_module(leaves)
    shapes = (shape + (pld.size,), shape, shape, shape)
    rows = [xp.broadcast_to(xp.asarray(a), s).reshape((flat,) + s[len(shape):])
            for a, s in zip(leaves, shapes, strict=True)]
    return unchecked_pld(*rows, pld.pessimistic)


def computed_on_host(plds: Sequence[PLD], points: int) -> bool:
    """Whether a computation on ``plds`` of ``points`` grid points a row runs in NumPy on the
    host (see :data:`~pldjax.core.compilation.HOST_POINTS`): every array concrete (in host
    memory, or on an accelerator, copied: :func:`~pldjax.core.compilation.readable_on_host`), at
    most HOST_ROWS rows and HOST_POINTS points in all. The first time it does, the
    host's allocator is readied (:func:`~pldjax.core.compilation.keep_freed_host_memory`)."""
    rows = max(math.prod(p.batch_shape) for p in plds)
    host = (rows <= HOST_ROWS and rows * points <= HOST_POINTS
            and all(readable_on_host(a) for p in plds for direction in p.directions()
                    for a in (direction.probs, direction.inf_mass, direction.offset,
                              direction.step)))
    if host:
        keep_freed_host_memory()
    return host


def from_rows(probs, inf_mass, offset, step, shape, pessimistic) -> PLD:
    """The flat rows of a batch as a PLD of batch ``shape`` (JAX arrays)."""
    leaves = (probs, inf_mass, offset, step)
    xp = glue_module(leaves)
    shapes = (shape + probs.shape[-1:], shape, shape, shape)
    leaves = [xp.asarray(a).reshape(s) for a, s in zip(leaves, shapes, strict=True)]
    if xp is np:  # device_put compiles nothing
        leaves = [jax.device_put(a) for a in leaves]
    return unchecked_pld(*leaves, pessimistic)
