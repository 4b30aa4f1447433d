"""Sampling schemes: how a record comes to take part in a step; one unit per scheme.

A scheme is a small typed record of its parameters (checked when built; a pytree whose leaves are
the parameters, like the noise records of :mod:`pldjax.mechanisms.noise`) with one method,
:meth:`Sampling.directions`: the map from a noise and a neighbouring relation to the mechanism of
the subsampled pair, one direction (symmetric) or both (remove and add, reported as the worse).
Its kernels, mechanisms whose loss tails are exact, live in :mod:`pldjax.mechanisms.subsampling`.

* :class:`Poisson` (each record independently with probability q; add/remove: both directions;
  replace-one: the Gaussian);
* :class:`FixedBatch` (sampling without replacement, a batch of b out of n, q = b / n; under
  replace-one only: Balle, Barthe and Gaboardi, "Privacy amplification by subsampling: tight
  analyses via couplings and divergences", 2018; the pair is attained by a sum query whose other
  records all sit at -C while one moves from -C to +C, so it is tight);
* :class:`Mixture` (a record's contribution is a random multiple of the sensitivity: several
  contributions per user, dp-accounting's mixture of Gaussians);
* :class:`TruncatedPoisson` (Poisson sampling cut down to a largest batch; a mixture of PLDs,
  built by its :meth:`Sampling.pld`, kernel in :mod:`pldjax.mechanisms.truncated_poisson`);
* :class:`RandomAllocation` (each record in exactly k of an epoch's t steps; balls-in-bins for
  k = 1; built by its :meth:`Sampling.pld`, kernel in :mod:`pldjax.mechanisms.random_allocation`).
* :class:`WithReplacement` (a batch of draws with replacement; built by its :meth:`Sampling.pld`,
  kernel in :mod:`pldjax.mechanisms.with_replacement`).

``sampling=None`` (no sampling: every record every time) is handled by the entry point,
:func:`pldjax.mechanisms.events.privacy_loss`. The wrappers (``pj.gaussian(..., sampling_prob=q,
sampling="poisson")``) name a scheme by string: :func:`from_args`.

To add a scheme: a record class (decorated with :func:`pldjax.mechanisms.noise.record`) subclassing
:class:`Sampling`, whose ``mechanism`` returns :class:`Directions` (its kernel: a
:class:`~pldjax.kernels.discretize.LossTails`, with a last parameter, the direction, when it has two),
in a module of its own if it brings a kernel; export it here. A scheme whose PLD is not one
mechanism (a mixture of PLDs) builds it in :meth:`Sampling.pld` instead.
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar, NamedTuple

import jax.numpy as jnp
import numpy as np

from pldjax.core import grid as grid_lib
from pldjax.core.grid import Grid
from pldjax.core.namespace import public_dir
from pldjax.core.special import binomial_pmf
from pldjax.core.validation import check_count, check_single, is_traced, within
from pldjax.kernels.compose import MAX_COUNT
from pldjax.kernels.discretize import LossTails, window
from pldjax.mechanisms import subsampling
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import (
    Noise,
    Parameters,
    check_parameter,
    record,
    resolvable,
    top_loss_lattice,
)


class Directions(NamedTuple):
    """What a scheme makes of a noise: ``mechanism`` with ``params`` (float64 arrays that
    broadcast); when ``both``, the mechanism takes one more parameter, the direction
    (:data:`pldjax.mechanisms.subsampling.REMOVE` or :data:`~pldjax.mechanisms.subsampling.ADD`), and
    the PLD keeps the two directions."""

    mechanism: LossTails
    params: tuple
    both: bool


class Sampling(Parameters, abc.ABC):
    """Base of the sampling schemes (see the module docstring)."""

    #: False for a scheme whose PLD is not one mechanism but built by :meth:`pld` (a mixture of
    #: PLDs): accounting then composes that PLD instead of discretizing :meth:`mechanism`.
    one_mechanism = True

    @abc.abstractmethod
    def directions(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Directions:
        """The subsampled mechanism of ``noise`` under ``neighboring``; parameters below float64's
        resolution are rounded on the safe side (:func:`pldjax.mechanisms.noise.resolvable`)."""

    def pld(self, noise: Noise, neighboring: Neighboring, pessimistic: bool, grid) -> Any:
        """For a scheme whose PLD is not one discretized mechanism (a mixture of PLDs, or the
        tighter of several analyses): that PLD, built here; None (the default) lets
        :func:`pldjax.mechanisms.events.privacy_loss` discretize :meth:`directions`."""
        return None

    def lattice(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Grid | None:
        """The grid :meth:`directions` is discretized on when none is given (see
        :meth:`pldjax.mechanisms.noise.Noise.lattice`); None (the default): the automatic one."""
        return None


def _everyone_sampled(sampling_prob) -> bool:
    """A concrete sampling probability of 1 everywhere: every record takes part in every step."""
    return not is_traced(sampling_prob) and bool(np.all(np.asarray(sampling_prob) == 1.0))


def _unsampled(base: LossTails, params: tuple, sampling_prob) -> Directions:
    """The mechanism without sampling, with the sampling probability's batch shape: at q = 1 the
    subsampled pair is the base pair itself, whose own kernel reaches losses of any size (the
    subsampled one stops at subsampling.BASE_REACH_MAX)."""
    shape = np.shape(sampling_prob)
    return Directions(base, tuple(p + np.zeros(shape) for p in params), False)


#: The subsampled largest loss is put on a grid point moved up by this much of itself: above
#: the round-off of its float value and of the subsampled tails that place the atom.
TOP_LOSS_MARGIN = 2.0**-40


def _subsampled_lattice(noise: Noise, base: LossTails, base_params: tuple, sampling_prob,
                        pessimistic: bool) -> Grid | None:
    """For bounded noise (:meth:`~pldjax.mechanisms.noise.Noise.top_loss` = t) subsampled with
    probability q (:func:`_poisson_pair`): a grid with the remove direction's largest loss,
    log(1 + q (e^t - 1)), on a grid point (moved up by TOP_LOSS_MARGIN), so that epsilon at
    delta = 0 reads it to that margin from above, and a step no coarser than the automatic
    grid's accuracy step (:func:`pldjax.core.grid.fine_step` of the subsampled spread), so that
    the bounds at delta > 0 are as tight, unless the largest mechanism grid's window would then
    no longer hold a direction's losses (tiny noise at a tiny q). The add direction's largest loss,
    -log(1 + q (e^-t - 1)), is smaller: (1 + q (e^t - 1)) (1 + q (e^-t - 1)) >= 1. None for a
    batch, traced parameters or unbounded noise."""
    if is_traced(sampling_prob):
        return None
    top = noise.top_loss(base_params)
    if top is None or is_traced(top) or np.size(top) != 1 or np.size(sampling_prob) != 1:
        return None
    q, t = (float(np.asarray(x).reshape(())) for x in (resolvable(sampling_prob, pessimistic), top))
    if not (q > 0 and 0 < t < math.inf):
        return None
    # log(1 - q + q e^t), from e^-t beyond where e^t overflows
    subsampled = (math.log1p(q * math.expm1(t)) if t < 700
                  else t + math.log(q + (1 - q) * math.exp(-t)))
    directions = _poisson_pair(noise, base, base_params, q)
    params = tuple(np.full(2, p, np.float64) for p in directions.params)
    params += (np.array([subsampling.REMOVE, subsampling.ADD]),)
    with np.errstate(all="ignore"):  # overflow to inf is the spread's intended limit, as in jnp
        spread = directions.mechanism.spread(params)
        half_width = np.asarray(window(directions.mechanism, params, 0.0)[1])
    accurate = float(np.min(grid_lib.fine_step(spread)))
    # the window of the largest mechanism grid must still hold each direction's losses
    covering = float(np.max(grid_lib.cover_step(np.nan_to_num(half_width, posinf=0.0),
                                                grid_lib.MAX_MECHANISM_SIZE, np)))
    return top_loss_lattice(subsampled * (1 + TOP_LOSS_MARGIN), directions.mechanism, params,
                            pessimistic, step_at_most=accurate, step_at_least=covering)


def _poisson_pair(noise: Noise, base: LossTails, params: tuple, q) -> Directions:
    if base.chi2 is None:
        raise ValueError(f"{type(noise).__name__} has no subsampled form: subsampling needs a noise "
                         "added to a query (Gaussian, Laplace, DiscreteLaplace, DiscreteGaussian)")
    return Directions(subsampling.poisson(base), params + (q,), True)


@record
class Poisson(Sampling):
    """Poisson sampling: each record takes part independently with probability ``sampling_prob``
    in [0, 1] (scalar or array).

    Add/remove and zero-out: both directions (remove: the mixture (1 - q) B + q A against B; add:
    B against the mixture). Replace-one: the pair (1 - q) N(0, 1) + q N(-mu, 1), (1 - q) N(0, 1) + q N(mu, 1)
    (one direction, symmetric), for the Gaussian only."""

    sampling_prob: Any

    ranges: ClassVar[dict] = {"sampling_prob": dict(low=0.0, high=1.0)}

    def directions(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Directions:
        base, params = noise.pair(neighboring, pessimistic)
        if _everyone_sampled(self.sampling_prob):
            return _unsampled(base, params, self.sampling_prob)
        q = resolvable(self.sampling_prob, pessimistic)
        if neighboring != Neighboring.REPLACE_ONE:
            return _poisson_pair(noise, base, params, q)
        kernel = subsampling.REPLACE_ONE.get(base)
        if kernel is None:
            raise ValueError(
                f"{type(noise).__name__}: Poisson subsampling with neighboring='replace_one' is "
                "available for the Gaussian only; use sampling='fixed_batch' or "
                "neighboring='add_remove'"
            )
        undoubled = params[:-1] + (params[-1] / 2,)  # the replace-one kernel takes one shift
        return Directions(kernel, undoubled + (q,), False)

    def lattice(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Grid | None:
        base, params = noise.pair(neighboring, pessimistic)
        if _everyone_sampled(self.sampling_prob):
            return noise.lattice(params, pessimistic)
        if neighboring == Neighboring.REPLACE_ONE:
            return None
        return _subsampled_lattice(noise, base, params, self.sampling_prob, pessimistic)


@record
class FixedBatch(Sampling):
    """Sampling without replacement: a batch of b records out of n, ``sampling_prob`` = b / n in
    [0, 1]. Under replace-one adjacency only (with add/remove neighbours the dataset size, hence
    the batch, changes): the pair (q A + (1 - q) B, B) and its swap, with (A, B) the noise's
    replace-one pair."""

    sampling_prob: Any

    ranges: ClassVar[dict] = {"sampling_prob": dict(low=0.0, high=1.0)}

    def directions(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Directions:
        if neighboring != Neighboring.REPLACE_ONE:
            raise ValueError(
                "sampling='fixed_batch' (without replacement) has a PLD under "
                "neighboring='replace_one' only: with add/remove neighbours the dataset size, "
                f"hence the batch, changes (and {neighboring.value!r} is not offered: the other "
                "records in the batch shift the pair)"
            )
        base, params = noise.pair(Neighboring.REPLACE_ONE, pessimistic)
        if _everyone_sampled(self.sampling_prob):
            return _unsampled(base, params, self.sampling_prob)
        return _poisson_pair(noise, base, params, resolvable(self.sampling_prob, pessimistic))

    def lattice(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Grid | None:
        self.directions(noise, neighboring, pessimistic)  # the relation is checked there
        base, params = noise.pair(Neighboring.REPLACE_ONE, pessimistic)
        if _everyone_sampled(self.sampling_prob):
            return noise.lattice(params, pessimistic)
        return _subsampled_lattice(noise, base, params, self.sampling_prob, pessimistic)


def _built_by_pld(scheme: Sampling) -> ValueError:
    """The error of :meth:`Sampling.directions` for a scheme whose PLD its :meth:`Sampling.pld`
    builds."""
    return ValueError(f"{type(scheme).__name__}'s PLD is not one discretized mechanism: build it "
                      "with pj.privacy_loss or Event.pld")


def _check_gaussian(scheme: Sampling, noise: Noise) -> None:
    """A ValueError unless ``noise`` is :class:`pldjax.mechanisms.noise.Gaussian`."""
    from pldjax.mechanisms.noise import Gaussian

    if not isinstance(noise, Gaussian):
        raise ValueError(f"{type(scheme).__name__} is offered for Gaussian noise "
                         f"(pj.noise.Gaussian), got {type(noise).__name__}")


@record
class WithReplacement(Sampling):
    """Sampling with replacement: a batch of ``batch_size`` draws (an integer >= 0), each uniform
    over the ``dataset_size`` records (an integer >= 1) and independent of the others, so a
    record may be drawn several times (jax-privacy's ``FixedBatchSampling(replace=True)``,
    dp_accounting's ``SampledWithReplacementDpEvent``). For
    :class:`pldjax.mechanisms.noise.Gaussian` noise under zero-out (``"replace_special"``) or
    replace-one, where both datasets hold ``dataset_size`` records; add/remove is refused (the
    dataset's size, hence every draw's law, changes). Parameters are concrete scalars.

    The record's copies in a batch are K ~ Binomial(batch_size, 1 / dataset_size), but the other
    draws depend on K, so the pair is not the mixture of K shifts against none
    (:meth:`Mixture.binomial`, which would understate epsilon several-fold): the pessimistic PLD
    is the tighter of two bounds that hold for every choice of the other records, the optimistic
    one a pair that some choice attains. Derivations in
    :mod:`pldjax.mechanisms.with_replacement`."""

    dataset_size: Any
    batch_size: Any

    one_mechanism = False

    def __post_init__(self):
        for name, minimum in (("dataset_size", 1), ("batch_size", 0)):
            value = getattr(self, name)
            if type(value) is object:
                return  # a pytree placeholder (see pldjax.mechanisms.noise)
            if is_traced(value) or np.ndim(value) != 0:
                raise ValueError(f"{name} must be a single concrete integer, got {value!r}")
            check_count(name, value, minimum=minimum)

    def directions(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Directions:
        raise _built_by_pld(self)

    def pld(self, noise: Noise, neighboring: Neighboring, pessimistic: bool, grid) -> Any:
        from pldjax.mechanisms.noise import Gaussian
        from pldjax.mechanisms.with_replacement import with_replacement_pld

        _check_gaussian(self, noise)
        if neighboring == Neighboring.ADD_REMOVE:
            raise ValueError("WithReplacement is offered under neighboring='replace_special' "
                             "(zero-out) or 'replace_one', not 'add_remove': there the dataset's "
                             "size, hence every draw's law, changes")
        if is_traced(noise) or np.size(noise.sigma) != 1 or np.size(noise.sensitivity) != 1:
            raise ValueError("WithReplacement needs a concrete, scalar noise (its PLD is built on "
                             "the host)")
        noise = Gaussian(float(np.reshape(noise.sigma, ())), float(np.reshape(noise.sensitivity, ())))
        return with_replacement_pld(noise, int(self.dataset_size), int(self.batch_size), neighboring,
                                    pessimistic=pessimistic, grid=grid)


#: Mixture probabilities must add up to 1 within this (they are then divided by their sum).
PROBS_TOLERANCE = 1e-9
#: Most components of a Mixture with probability > 0 (a guard on compilation: each is an input of
#: the discretization's programs: a first epsilon took 5 s with 1,000, 166 s with 10^4).
MAX_COMPONENTS = 1024
#: Largest ``count`` of :meth:`Mixture.binomial`, which holds all count + 1 values of K before the
#: zero ones are dropped (a memory guard: 134 MB at this count).
MAX_BINOMIAL_COUNT = 2**24


@record
class Mixture(Sampling):
    """A record's contribution is ``scales[k]`` times the noise's sensitivity with probability
    ``probs[k]`` (dp-accounting's mixture of Gaussians, ``MixtureGaussianDpEvent``): several
    contributions per user, each sampled, as in user-level DP-SGD. ``scales`` >= 0 and finite,
    ``probs`` in [0, 1] adding up to 1 (within 1e-9; they are divided by their sum); the last
    axis of both holds the components, leading axes are a batch. ``Mixture([0, 1], [1 - q, q])``
    is Poisson sampling. Components of probability 0 are left out; at most MAX_COMPONENTS others
    (a ValueError beyond).

    Add/remove (or zero-out: the same pair) adjacency, both directions (remove:
    sum_k p_k F(. - a_k) against F; add: the swap), for a noise that is a log-concave location
    family (``noise.location``: Gaussian, GDP); its loss threshold is found by bisection, so the
    PLD is exact up to round-off.
    Choquette-Choo, Ganesh, Steinke and Thakurta ("Privacy amplification for matrix mechanisms",
    2023, Cor. 4.7) show the vector-valued mechanism is dominated by this scalar one with each
    contribution replaced by its norm."""

    scales: Any
    probs: Any

    ranges: ClassVar[dict] = {"scales": dict(low=0.0), "probs": dict(low=0.0, high=1.0)}
    #: A list or tuple of components stays one (its length is the event's structure: states
    #: saved for such a template keep loading)
    batch_sequences: ClassVar[bool] = False

    def __post_init__(self):
        if any(type(v) is object for v in (self.scales, self.probs)):
            return  # a pytree placeholder (see pldjax.mechanisms.noise)
        # before the fields' common checks, whose broadcast check would not say why
        if np.ndim(self.scales) == 0 or np.shape(self.scales)[-1:] != np.shape(self.probs)[-1:]:
            raise ValueError(f"scales and probs must have one component per entry of their last "
                             f"axis, got shapes {np.shape(self.scales)} and {np.shape(self.probs)}")
        super().__post_init__()
        if not is_traced(self.probs):
            total = np.sum(np.asarray(self.probs, np.float64), axis=-1)
            if np.any(np.abs(total - 1.0) > PROBS_TOLERANCE):
                raise ValueError(f"probs must add up to 1 (within {PROBS_TOLERANCE}), got sums "
                                 f"{np.ravel(total)[:3]}")

    def valid(self):
        """:meth:`Parameters.valid` for each mixture (the components on the last axis), with
        its probabilities adding up to 1."""
        if not is_traced((self.scales, self.probs)):
            return True
        ok = within(self.scales, 0.0) & within(self.probs, 0.0, 1.0)
        total = jnp.sum(jnp.asarray(self.probs, jnp.float64), axis=-1)
        return jnp.all(ok, axis=-1) & (jnp.abs(total - 1.0) <= PROBS_TOLERANCE)

    @classmethod
    def binomial(cls, sampling_prob: float, count: int) -> Mixture:
        """A user with ``count`` records, each Poisson-sampled with probability ``sampling_prob``
        and each of norm at most the sensitivity: the user's contribution is K sensitivities with
        K ~ Binomial(count, q) (user-level accounting; ``count`` = 1 is Poisson sampling)."""
        count = check_count("count", count, minimum=1)
        if count > MAX_BINOMIAL_COUNT:
            raise ValueError(f"count must be an integer in [1, {MAX_BINOMIAL_COUNT}] (a memory "
                             f"guard: one component a value of K), got {count}")
        check_single("Mixture.binomial", "sampling_prob", sampling_prob)
        check_parameter("sampling_prob", sampling_prob, 0.0, high=1.0)
        q = float(sampling_prob)
        k = np.arange(count + 1, dtype=np.float64)
        probs = binomial_pmf(k, count, q, 1.0 - q, xp=np)
        return cls(k, probs / math.fsum(probs))

    def directions(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Directions:
        if neighboring == Neighboring.REPLACE_ONE:
            raise ValueError("Mixture sampling is offered under neighboring='add_remove' or "
                             "'replace_special' (zero-out, the same pair) only")
        if noise.location is None:
            raise ValueError(f"Mixture sampling needs a noise that is a location family (Gaussian, "
                             f"GDP), got {type(noise).__name__}")
        # the shift is rounded up below float64's resolution: for the Gaussian the mixture of a
        # smaller shift is a post-processing of the larger (x -> c x + N(0, 1 - c^2))
        _, (shift,) = noise.pair(Neighboring.ADD_REMOVE, pessimistic)
        scales, probs = self._present_components()
        # concrete parameters on the host: no small compiled program per operation
        traced = is_traced((scales, probs))
        xp = jnp if traced else np
        scales = xp.asarray(scales, xp.float64)
        probs = xp.asarray(probs, xp.float64)
        probs = probs / xp.sum(probs, axis=-1, keepdims=True)
        # so is the probability q of a shift > 0, as for Poisson sampling: the mixture with a
        # smaller q is a post-processing of the larger (replace the output by a fresh draw of
        # the noise with probability 1 - q/q')
        moves = scales > 0
        q = xp.sum(xp.where(moves, probs, 0.0), axis=-1, keepdims=True)
        rounded = resolvable(q, pessimistic)
        still = xp.where(q < 1, (1 - rounded) / xp.where(q < 1, 1 - q, 1.0), 1.0)
        probs = probs * xp.where(moves, rounded / xp.where(q > 0, q, 1.0), still)
        reveal = xp.zeros(probs.shape[:-1], xp.float64)
        if pessimistic and not traced:
            scales, probs, reveal = _folded(scales, probs)
        count = scales.shape[-1]
        params = (reveal, shift, *(scales[..., k] for k in range(count)),
                  *(probs[..., k] for k in range(count)))
        return Directions(subsampling.mixture(noise.location), params, True)

    def _present_components(self) -> tuple:
        """(scales, probs) without the components whose probability is 0 everywhere in the
        batch (they contribute nothing: Mixture.binomial's far tail underflows to 0; traced
        parameters keep every component); ValueError beyond MAX_COMPONENTS."""
        scales, probs = self.scales, self.probs
        if not is_traced((scales, probs)):
            scales, probs = np.asarray(scales, np.float64), np.asarray(probs, np.float64)
            scales, probs = np.broadcast_arrays(scales, probs)
            present = np.any(probs.reshape(-1, probs.shape[-1]) > 0, axis=0)
            scales, probs = scales[..., present], probs[..., present]
        count = np.shape(probs)[-1]
        if count > MAX_COMPONENTS:
            raise ValueError(f"Mixture has {count} components with probability > 0 (scales and "
                             f"probs), more than MAX_COMPONENTS = {MAX_COMPONENTS} (a guard on "
                             f"compilation); for Mixture.binomial, a smaller count")
        return scales, probs


def _folded(scales, probs) -> tuple:
    """(scales, probs, reveal): the components of a pessimistic mixture that are negligible in
    every element of the batch (probability below subsampling.NEGLIGIBLE_COMPONENT) folded into
    its revealing output, of probability ``reveal`` (see :func:`subsampling.mixture`; the
    remaining probabilities are left as they are): a dominating pair, and the programs evaluate a
    few components where a binomial mixture holds a hundred."""
    scales, probs = np.asarray(scales, np.float64), np.asarray(probs, np.float64)
    negligible = np.all(probs.reshape(-1, probs.shape[-1]) < subsampling.NEGLIGIBLE_COMPONENT,
                        axis=0)
    reveal = np.sum(np.where(negligible, probs, 0.0), axis=-1)
    return scales[..., ~negligible], probs[..., ~negligible], reveal


@record
class TruncatedPoisson(Sampling):
    """Truncated Poisson sampling (jax-privacy's default batch selection, dp-accounting's
    ``TruncatedSubsampledGaussianDpEvent``): each of the ``dataset_size`` records (an integer
    >= 1) is drawn with probability ``sampling_prob`` in [0, 1], and when more than
    ``truncated_batch_size`` (an integer >= 0) are drawn a uniformly random batch of that many is
    kept. For :class:`pldjax.mechanisms.noise.Gaussian` noise, under zero-out (``"replace_special"``, the
    relation jax-privacy uses), replace-one and add/remove (``dataset_size`` counts the dataset
    holding the differing record). Parameters are scalars, concrete (not traced).

    Its PLD is a mixture of Poisson-subsampled PLDs, and the pessimistic one the tighter of two
    analyses (their curves' pointwise minimum, made convex), so it is built by :meth:`pld`, not
    as one mechanism; see :mod:`pldjax.mechanisms.truncated_poisson`. The optimistic PLD is the pair with
    every other record at zero (Poisson sampling at the record's inclusion probability)."""

    sampling_prob: Any
    dataset_size: Any
    truncated_batch_size: Any

    one_mechanism = False
    ranges: ClassVar[dict] = {"sampling_prob": dict(low=0.0, high=1.0)}

    def __post_init__(self):
        super().__post_init__()
        for name in ("dataset_size", "truncated_batch_size"):
            value = getattr(self, name)
            if type(value) is not object and not is_traced(value):
                if np.ndim(value) != 0:
                    raise ValueError(f"{name} must be a single integer (a batch of truncated "
                                     f"Poisson schemes shares it), got shape {np.shape(value)}")
                check_count(name, value, minimum=1 if name == "dataset_size" else 0)

    def directions(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Directions:
        raise ValueError("TruncatedPoisson's PLD is a mixture of PLDs (the tighter of two "
                         "analyses), not one mechanism: build it with pj.privacy_loss or Event.pld")

    def pld(self, noise: Noise, neighboring: Neighboring, pessimistic: bool, grid) -> Any:
        from pldjax.mechanisms.truncated_poisson import truncated_poisson_pld

        return truncated_poisson_pld(noise, self.sampling_prob, self.dataset_size,
                                     self.truncated_batch_size, neighboring,
                                     pessimistic=pessimistic, grid=grid)


@record
class RandomAllocation(Sampling):
    """Random allocation: each record takes part in exactly ``selected`` (an integer >= 1,
    default 1: balls-in-bins) of ``steps`` (an integer >= ``selected``) steps, chosen uniformly
    at random and independently of the other records, as when a dataset is dealt into an epoch's
    batches with each record in ``selected`` of them. One event is one epoch of ``steps`` steps
    (``pj.event_epsilon(event, epochs, delta)`` composes epochs). For
    :class:`pldjax.mechanisms.noise.Gaussian` noise under add/remove or zero-out
    (``"replace_special"``, the same pair); replace-one is refused. Parameters are concrete (not
    traced); ``steps`` and ``selected`` may be integer arrays (broadcasting with the noise's
    parameters) in :func:`pldjax.event_epsilon` and :func:`pldjax.event_delta`, which account
    for each configuration in turn, a sweep in one call; :meth:`Event.pld` takes one of each.

    Pessimistic PLD: the exact pair for one selection, its lattice law made larger in the convex
    order; for more, the composition over ``selected`` blocks of about steps / selected steps with
    one selection each, which dominates. Optimistic: a statistic of the output (a lower bound for
    every ``selected``). Derivations in :mod:`pldjax.mechanisms.random_allocation`."""

    steps: Any
    selected: Any = 1

    one_mechanism = False

    def __post_init__(self):
        if any(type(v) is object or is_traced(v) for v in (self.steps, self.selected)):
            return  # a pytree placeholder (see pldjax.mechanisms.noise), or traced leaves
        try:
            pairs = np.broadcast_arrays(np.asarray(self.steps, object), np.asarray(self.selected,
                                                                                    object))
        except ValueError:
            raise ValueError(f"steps and selected must broadcast together, got shapes "
                             f"{np.shape(self.steps)} and {np.shape(self.selected)}") from None
        for steps, selected in zip(*(a.reshape(-1).tolist() for a in pairs), strict=True):
            steps = check_count("steps", steps, minimum=1)
            selected = check_count("selected", selected, minimum=1)
            if steps > MAX_COUNT:
                raise ValueError(f"steps must be an integer in [1, {MAX_COUNT}] (compositions "
                                 f"count in 64-bit integers), got {steps}")
            if selected > steps:
                raise ValueError(f"selected must be an integer in [1, steps = {steps}] (each "
                                 f"record takes part in that many of the epoch's steps), got "
                                 f"{selected}")

    def directions(self, noise: Noise, neighboring: Neighboring, pessimistic: bool) -> Directions:
        raise _built_by_pld(self)

    def pld(self, noise: Noise, neighboring: Neighboring, pessimistic: bool, grid) -> Any:
        from pldjax.mechanisms.random_allocation import random_allocation_pld

        _check_gaussian(self, noise)
        if neighboring == Neighboring.REPLACE_ONE:
            raise ValueError("RandomAllocation is offered under neighboring='add_remove' or "
                             "'replace_special' (zero-out, the same pair), not 'replace_one': "
                             "there the record's steps move to other values, a pair without an "
                             "analysis here")
        if is_traced((noise, self)):
            raise ValueError("RandomAllocation's parameters (and its noise's) must be concrete, "
                             "not traced")
        if np.size(self.steps) != 1 or np.size(self.selected) != 1:
            raise ValueError(f"a RandomAllocation PLD takes one steps and one selected, got "
                             f"shapes {np.shape(self.steps)} and {np.shape(self.selected)}: "
                             f"pj.event_epsilon and pj.event_delta take arrays of them")
        steps, selected = (int(np.reshape(v, ())) for v in (self.steps, self.selected))
        return random_allocation_pld(noise, steps, selected,
                                     pessimistic=pessimistic, grid=grid)


#: The schemes a string names at the API edge (``sampling="poisson"``), with a sampling_prob.
NAMED = {"poisson": Poisson, "fixed_batch": FixedBatch}


def from_args(sampling_prob=None, sampling: Sampling | str = "poisson") -> Sampling | None:
    """The scheme the named wrappers' arguments describe: ``sampling_prob`` q in [0, 1] (the
    probability that a record takes part, or the batch fraction b / n for ``"fixed_batch"``; None:
    no sampling) with ``sampling`` "poisson" (default) or "fixed_batch" (sampling without
    replacement; replace-one adjacency only). ``sampling`` may also be a :class:`Sampling`
    record, with ``sampling_prob`` None.

    Args:
      sampling_prob: q in [0, 1] (scalar or array; checked when the record is built), or None
        (default): no sampling with "poisson"; "fixed_batch" needs a value (else a ValueError),
        and a record in ``sampling`` needs None (else a ValueError).
      sampling: "poisson" (default), "fixed_batch", or a :class:`Sampling` record; any other
        value is a ValueError.

    Returns:
      ``Poisson(sampling_prob)`` or ``FixedBatch(sampling_prob)`` for a name with a
      ``sampling_prob``, the record itself when ``sampling`` is one, and None (no sampling) for
      "poisson" without a ``sampling_prob``.
    """
    if isinstance(sampling, Sampling):
        if sampling_prob is not None:
            raise ValueError("pass sampling_prob inside the sampling record, not beside it")
        return sampling
    if not isinstance(sampling, str) or sampling not in NAMED:
        raise ValueError(f"sampling must be one of {tuple(NAMED)} or a pj.sampling record, "
                         f"got {sampling!r}")
    if sampling_prob is None:
        if sampling != "poisson":
            raise ValueError(f"sampling={sampling!r} needs a sampling_prob (batch size / dataset size)")
        return None
    return NAMED[sampling](sampling_prob)


__all__ = ["Directions", "FixedBatch", "Mixture", "Poisson", "RandomAllocation", "Sampling",
           "TruncatedPoisson", "WithReplacement", "from_args"]
__dir__ = public_dir(__all__)
