"""pldjax as a ``dp_accounting`` privacy accountant, so that code written for Google's dp_accounting
(``calibrate_dp_mechanism``, jax-privacy's event builders and training accountants) accounts with
pldjax's PLDs.

:class:`PLDAccountant` is a subclass of ``dp_accounting.pld.PLDAccountant``, so the checks that
jax-privacy makes for "a PLD accountant" (``isinstance(acct, dp_accounting.pld.PLDAccountant)``)
pass; it overrides the composition and the epsilon / delta queries. Events are recorded when
composed and turned into PLDs when epsilon or delta is read (pessimistic: upper bounds). Each
event's PLD is cached by its parameters, so calibration loops that compose the same event into
fresh accountants build it once.

Each leaf event is read as a :class:`pldjax.Event` (noise x sampling x neighbouring), public as
:func:`to_event`; its PLD is ``Event.pld()``. Events (``relations``: the neighboring relations
accepted; RS = REPLACE_SPECIAL, the zero-out relation, AR = ADD_OR_REMOVE_ONE, RO = REPLACE_ONE):

=========================================== ========== =============================================
event                                       relations  pldjax
=========================================== ========== =============================================
NoOpDpEvent                                 all        identity
NonPrivateDpEvent                           all        epsilon = inf, delta = 1
GaussianDpEvent                             all        ``noise.Gaussian`` (RS pairs as AR; RO: shift 2)
LaplaceDpEvent                              AR, RS, RO ``noise.Laplace`` (RO: shift 2)
DiscreteLaplaceDpEvent                      AR, RS, RO ``noise.DiscreteLaplace``
PoissonSampledDpEvent(Gaussian)             all        ``sampling.Poisson``
PoissonSampledDpEvent(Laplace)              AR, RS     ``sampling.Poisson``
SampledWithoutReplacementDpEvent(Gaussian)  RO         ``sampling.FixedBatch`` (*)
SampledWithReplacementDpEvent(Gaussian)     RS, RO     ``sampling.WithReplacement(n, B)`` (**)
RandomizedResponseDpEvent (k buckets)       RO, RS     exact tails, :func:`k_randomized_response`
MixtureOfGaussiansDpEvent                   AR, RS     ``sampling.Mixture``
TruncatedSubsampledGaussianDpEvent          all        ``sampling.TruncatedPoisson``
SingleEpochTreeAggregationDpEvent           RS         ``noise.Gaussian`` of sensitivity sqrt(depth)
EpsilonDeltaDpEvent, ExponentialMechanism.. all        ``noise.RandomizedResponse(epsilon, delta)``
PermuteAndFlipDpEvent                       all        ``noise.Laplace(1 / epsilon)``
ZCDpEvent                                   all        (xi, rho) summed, then :func:`pldjax.zcdp`
SelfComposedDpEvent, ComposedDpEvent        all        composition
=========================================== ========== =============================================

(*) dp_accounting has no PLD for it; its RDP accountant (and jax-privacy's ``fixed_dpsgd_event``,
which scales the noise by the replace-one sensitivity 2C) reads the noise multiplier relative to
the distance between the replaced and the new record's contributions, so the PLD here is that of
a shift of 1 noise multiplier, at or below dp_accounting's RDP bound. Gaussian and
Poisson-sampled Gaussian events under REPLACE_ONE follow dp_accounting's PLD accountant instead
(a record moves from -C to +C: a shift of 2), as its own accountants do.

(**) dp_accounting has no accountant for it. A batch of B draws with replacement from n records
holds the record Binomial(B, 1 / n) times, and the other draws depend on that number, so the
pair is not the copies against none: the upper bound of :mod:`pldjax.mechanisms.with_replacement`
holds for every choice of the other records (RO: a record moves from -C to +C, as for the
Gaussian event).

A noise multiplier or standard deviation of +inf (infinite noise) makes an event the identity: it
releases nothing.

Tiny delta: an FFT composition charges its round-off (about 1e-19 a bin) on the safe side, so it
cannot resolve delta much below 1e-12 and reads epsilon = inf or a loose value there; below
``chernoff.RESOLVED_DELTA`` (1e-10) the accountant also reads the Chernoff bound of
:mod:`pldjax.kernels.chernoff` from the events' single-run PLDs (no FFT) and returns the smaller of the
two upper bounds: delta = 1e-18 gets a finite epsilon.

The newer releases' events (EpsilonDelta, ExponentialMechanism, PermuteAndFlip) are recognised
by class name. :func:`batch_selection_event` gives the event of DP-SGD on a jax-privacy batch
selection strategy.

Anything else (``SampledWithReplacementDpEvent`` under add/remove,
``RepeatAndSelectDpEvent``,
``UnsupportedDpEvent``, a sampled event around
another kind, or an event whose PLD pldjax cannot build, such as a mixture of more than
``sampling.MAX_COMPONENTS`` Gaussians) is reported as dp_accounting reports it: ``supports``
returns False and ``compose`` raises ``dp_accounting.UnsupportedEventError`` naming the
sub-event, leaving the accountant as it was. Parameters out
of range (a negative noise multiplier, a probability outside [0, 1], NaN) raise ValueError from
both, naming the field. Requires the ``dp-accounting`` package.
"""

from __future__ import annotations

import functools
import math
import warnings

import dp_accounting as _dpa
import jax.numpy as jnp
import numpy as np
from dp_accounting import dp_event as _ev
from dp_accounting.pld import pld_privacy_accountant as _dpa_pld
from scipy import special

from pldjax.accounting.dpsgd import dpsgd_event
from pldjax.accounting.report import true_positive_rates
from pldjax.accounting.schedule import compose_schedule
from pldjax.core.compilation import kernel_jit
from pldjax.core.namespace import public_dir
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD, unchecked_pld
from pldjax.core.precision import float64
from pldjax.core.validation import check_count, check_range
from pldjax.kernels import chernoff
from pldjax.kernels.compose import CompositionTooWide
from pldjax.kernels.compose import compose as _compose
from pldjax.kernels.discretize import hockey_stick, hockey_stick_excess, masses_from_curve
from pldjax.mechanisms import noise, sampling
from pldjax.mechanisms.events import Event
from pldjax.mechanisms.named import gaussian, identity, zcdp, zcdp_window
from pldjax.mechanisms.neighboring import Neighboring

_NR = _dpa.NeighboringRelation
_RELATION = {_NR.ADD_OR_REMOVE_ONE: Neighboring.ADD_REMOVE, _NR.REPLACE_ONE: Neighboring.REPLACE_ONE,
             _NR.REPLACE_SPECIAL: Neighboring.REPLACE_SPECIAL}


def _check_relation(name: str, value) -> None:
    """A ValueError naming ``name`` unless ``value`` is a ``dp_accounting.NeighboringRelation``."""
    if value not in _RELATION:
        raise ValueError(f"{name} must be one of {list(_RELATION)}, got {value!r}")


# -- small exact PLDs -----------------------------------------------------------------------------
def _discrete_tails(losses, masses):
    """Tails of a PLD with finitely many losses L_i of P-masses m_i (Q-masses m_i e^{-L_i}):
    eps -> log P(L > eps), log Q(L > eps), log P(L <= eps), log Q(L <= eps)."""
    losses, masses = np.asarray(losses, np.float64), np.asarray(masses, np.float64)
    log_p = np.log(masses)
    log_q = log_p - losses

    def tails(eps):
        above = losses > eps[..., None]
        return tuple(special.logsumexp(np.where(mask, logs, -np.inf), axis=-1)
                     for mask, logs in ((above, log_p), (above, log_q), (~above, log_p),
                                        (~above, log_q)))

    return tails


@kernel_jit
def _connect_the_dots(log_sf_p, log_sf_q, log_cdf_p, log_cdf_q, z, step):
    """(probs, inf_mass) of the curve and excess given by exact tails at the grid points ``z``."""
    return masses_from_curve(hockey_stick(log_sf_p, log_sf_q, z), step,
                             hockey_stick_excess(log_cdf_p, log_cdf_q, z), z)


def _pld_from_tails(tails, reverse, lo: float, hi: float, points: int = 4096) -> PLD:
    """Connect-the-dots (pessimistic) PLD from exact tails (see :func:`_discrete_tails`) on a
    power-of-two step with about ``points`` points across the losses [lo, hi] (a window of a
    power-of-two size, so that compiled kernels are shared); losses below the window are moved up
    into it, the curve at its top becomes the atom at +inf (both on the safe side). The curve
    below eps = 0 comes from the excess e^eps Q(L <= eps) - P(L <= eps), which keeps the digits
    that 1 - delta loses (as :func:`pldjax.kernels.discretize.discretize` does)."""
    step = float(2.0 ** np.floor(np.log2(max(hi - lo, 1e-9) / points)))
    offset = int(np.floor(lo / step)) - 1
    size = 1 << int(np.ceil(np.log2(int(np.ceil(hi / step)) + 2 - offset)))
    z = (offset + np.arange(size)) * step

    def one(fn) -> PLD:
        probs, inf_mass = _connect_the_dots(*fn(z), z, step)
        return unchecked_pld(probs, inf_mass, jnp.asarray(offset, jnp.int64), jnp.asarray(step),
                             True)

    return PLD.from_directions(one(tails), None if reverse is None else one(reverse))


#: grid points across randomized response's few losses: connect-the-dots splits each atom between
#: two grid points, which costs about a step of epsilon per composition factor of ten
_RR_POINTS = 2**14


@functools.lru_cache(maxsize=256)
@float64
def k_randomized_response(noise_parameter: float, num_buckets: int, neighboring: str) -> PLD:
    """Pessimistic PLD of k-ary randomized response: the true bucket with probability 1 - p, else
    a uniform one of the k (p = ``noise_parameter`` in (0, 1], k = ``num_buckets`` >= 2).

    "replace_one" (x against x'): losses +-L, L = log(1 + k (1 - p) / p), with masses
    1 - p + p/k and p/k, and 0 with mass (k - 2) p / k; symmetric. "replace_special" (x against a
    special input answered uniformly): losses log(k (1 - p) + p) and log p with masses
    1 - p + p/k and (k - 1) p / k, and the other direction (uniform against R(x)) their negatives
    with masses 1/k and (k - 1)/k. The tails are exact; the grid (a power-of-two step, about 16384
    points across the losses) is connect-the-dots, the tightest pessimistic PLD on it."""
    check_range("noise_parameter", noise_parameter, 0.0, 1.0, low_open=True)
    k = check_count("num_buckets", num_buckets, minimum=2)
    if neighboring not in ("replace_one", "replace_special"):
        raise ValueError("neighboring must be 'replace_one' or 'replace_special', "
                         f"got {neighboring!r}")
    p = float(noise_parameter)
    if p == 1.0:
        return identity()
    if neighboring == "replace_one":
        top = math.log1p(k * (1.0 - p) / p)
        losses, masses = [top, 0.0, -top], [1.0 - p + p / k, (k - 2) * p / k, p / k]
        keep = [m > 0 for m in masses]
        tails = _discrete_tails(np.compress(keep, losses), np.compress(keep, masses))
        return _pld_from_tails(tails, None, -top, top, _RR_POINTS)
    high, low = math.log(k * (1.0 - p) + p), math.log(p)
    forward = _discrete_tails([high, low], [1.0 - p + p / k, (k - 1) * p / k])
    back = _discrete_tails([-high, -low], [1.0 / k, (k - 1) / k])
    return _pld_from_tails(forward, back, min(low, -high), max(high, -low), _RR_POINTS)


@functools.lru_cache(maxsize=256)
def event_pld(key, relation: Neighboring) -> PLD:
    """One event's PLD, cached by its description (a hashable :class:`pldjax.Event`, or k-ary
    randomized response's parameters)."""
    if isinstance(key, Event):
        return key.pld()
    return k_randomized_response(*key, relation.value)


def _added(total: tuple[float, float], part: tuple[float, float], count: int):
    """A zCDP total (rho, xi) with ``count`` times ``part`` added: zCDP composes by addition."""
    return tuple(t + count * p for t, p in zip(total, part, strict=True))


@functools.lru_cache(maxsize=64)
def _zcdp_pld(rho: float, xi: float) -> PLD:
    """The PLD that dominates every (xi, rho)-zCDP mechanism (one per total)."""
    return zcdp(rho, xi)


@functools.lru_cache(maxsize=256)
def _step_pld(sigma: float, q: float, relation: Neighboring) -> PLD:
    """One step of a DP-SGD segment (for the Chernoff bound at tiny delta)."""
    return gaussian(sigma, sampling_prob=q, neighboring=relation)


# -- DpEvent -> pj.Event ----------------------------------------------------------------------------
class _Unsupported(str):
    """The reason an event has no PLD here (dp_accounting's message)."""


@float64
def _unbuildable(event: Event) -> str | None:
    """Why the PLD of ``event`` could not be built when epsilon or delta is read (its mechanism
    before discretization is refused: a Mixture beyond sampling.MAX_COMPONENTS), or None. Checked
    by ``supports`` and ``compose``, so that whatever is composed can be read."""
    if not getattr(event.sampling, "one_mechanism", True):
        return None  # built by its sampling from checked scalars (TruncatedPoisson)
    try:
        event.directions()
    except ValueError as error:
        return f"pldjax cannot build its PLD: {error}"
    return None


def _number(event, field: str, low: float, high: float = math.inf, *,
            allow_inf: bool = False) -> float:
    value = getattr(event, field)
    check_range(f"{type(event).__name__}.{field}", value, low, high, allow_inf=allow_inf)
    return float(value)


def _noise_scale(event, field: str) -> float:
    """A noise multiplier or standard deviation, >= 0; +inf (infinite noise: the output says
    nothing) is allowed, and the event is then the identity."""
    return _number(event, field, 0.0, allow_inf=True)


def _count(event, field: str) -> int:
    return check_count(f"{type(event).__name__}.{field}", getattr(event, field))


def _describe(event, rel: _NR):
    """A leaf event as pldjax sees it: None (nothing released), "non_private", a
    :class:`pldjax.Event`, ("randomized_response", p, k), or an _Unsupported reason. Parameters out
    of range raise ValueError naming the field."""
    relation = _RELATION[rel]
    if isinstance(event, _ev.NoOpDpEvent):
        return None
    if isinstance(event, _ev.NonPrivateDpEvent):
        return "non_private"
    if isinstance(event, _ev.GaussianDpEvent):
        sigma = _noise_scale(event, "noise_multiplier")
        if sigma == math.inf:
            return None
        return "non_private" if sigma == 0 else Event(noise.Gaussian(sigma), None, relation)
    if isinstance(event, _ev.LaplaceDpEvent):
        b = _noise_scale(event, "noise_multiplier")
        if b == math.inf:
            return None
        return "non_private" if b == 0 else Event(noise.Laplace(b), None, relation)
    if isinstance(event, _ev.DiscreteLaplaceDpEvent):
        a = _number(event, "noise_parameter", 0.0)
        sens = _count(event, "sensitivity")
        if sens == 0:
            return None
        return "non_private" if a == 0 else Event(noise.DiscreteLaplace(1.0 / a, sens), None, relation)
    if isinstance(event, _ev.PoissonSampledDpEvent):
        q = _number(event, "sampling_probability", 0.0, 1.0)
        inner = event.event
        if isinstance(inner, _ev.LaplaceDpEvent) and rel == _NR.REPLACE_ONE:
            return _Unsupported("neighboring_relation must be ADD_OR_REMOVE_ONE or REPLACE_SPECIAL "
                                f"for PoissonSampledDpEvent of a LaplaceDpEvent. Found {rel}.")
        if not isinstance(inner, _ev.GaussianDpEvent | _ev.LaplaceDpEvent):
            return _Unsupported("Subevent of PoissonSampledDpEvent must be either GaussianDpEvent "
                                f"or LaplaceDpEvent. Found {inner}.")
        scale = _noise_scale(inner, "noise_multiplier")
        if q == 0 or scale == math.inf:
            return None
        if scale == 0:
            return "non_private"
        kind = noise.Gaussian if isinstance(inner, _ev.GaussianDpEvent) else noise.Laplace
        return Event(kind(scale), sampling.Poisson(q), relation)
    if isinstance(event, _ev.SampledWithoutReplacementDpEvent):
        if rel != _NR.REPLACE_ONE:
            return _Unsupported("SampledWithoutReplacementDpEvent has a PLD under REPLACE_ONE only "
                                f"(the batch size is fixed). Found {rel}.")
        if not isinstance(event.event, _ev.GaussianDpEvent):
            return _Unsupported("Subevent of SampledWithoutReplacementDpEvent must be a "
                                f"GaussianDpEvent. Found {event.event}.")
        n = _count(event, "source_dataset_size")
        m = _count(event, "sample_size")
        if m > n:
            raise ValueError(f"SampledWithoutReplacementDpEvent.sample_size must be at most "
                             f"source_dataset_size = {n}, got {m}")
        sigma = _noise_scale(event.event, "noise_multiplier")
        if m == 0 or sigma == math.inf:
            return None
        if sigma == 0:
            return "non_private"
        # noise multiplier relative to the replace-one distance |v - v'| (dp_accounting's RDP
        # accountant, jax-privacy's fixed_dpsgd_event): pldjax's replace-one moves a record from
        # -sensitivity to +sensitivity, so sensitivity 1/2
        return Event(noise.Gaussian(sigma, 0.5), sampling.FixedBatch(m / n), relation)
    if isinstance(event, _ev.SampledWithReplacementDpEvent):
        return _with_replacement(event, rel, relation)
    if isinstance(event, _ev.RandomizedResponseDpEvent):
        if rel == _NR.ADD_OR_REMOVE_ONE:
            return _Unsupported("neighboring_relation must be REPLACE_ONE or REPLACE_SPECIAL for "
                                f"RandomizedResponseDpEvent. Found {rel}.")
        p = _number(event, "noise_parameter", 0.0, 1.0)
        k = _count(event, "num_buckets")
        if k == 0:
            raise ValueError("RandomizedResponseDpEvent.num_buckets must be an integer >= 1, got 0")
        if k == 1:
            return None
        return "non_private" if p == 0 else ("randomized_response", p, k)
    if isinstance(event, _ev.MixtureOfGaussiansDpEvent):
        if rel == _NR.REPLACE_ONE:
            return _Unsupported("neighboring_relation must be ADD_OR_REMOVE_ONE or REPLACE_SPECIAL "
                                f"for MixtureOfGaussiansDpEvent. Found {rel}.")
        name = "MixtureOfGaussiansDpEvent"
        sigma = _noise_scale(event, "standard_deviation")
        sens = tuple(float(x) for x in event.sensitivities)
        probs = tuple(float(x) for x in event.sampling_probs)
        if len(sens) != len(probs) or not sens:
            raise ValueError(f"{name}.sensitivities and sampling_probs must be non-empty and of "
                             "the same length")
        check_range(f"{name}.sensitivities", sens, 0.0)
        check_range(f"{name}.sampling_probs", probs, 0.0, 1.0)
        if abs(sum(probs) - 1.0) > 1e-9:
            raise ValueError(f"{name}.sampling_probs must sum to 1, got {sum(probs)!r}")
        if sigma == math.inf or all(s == 0 or p == 0 for s, p in zip(sens, probs, strict=True)):
            return None
        if sigma == 0:
            return "non_private"
        return Event(noise.Gaussian(sigma), sampling.Mixture(sens, probs), relation)
    if isinstance(event, _ev.TruncatedSubsampledGaussianDpEvent):
        n = _count(event, "dataset_size")
        q = _number(event, "sampling_probability", 0.0, 1.0)
        b = _count(event, "truncated_batch_size")
        sigma = _noise_scale(event, "noise_multiplier")
        if q == 0 or b == 0 or n == 0 or sigma == math.inf:
            return None
        if sigma == 0:
            return "non_private"
        return Event(noise.Gaussian(sigma), sampling.TruncatedPoisson(q, n, b), relation)
    if isinstance(event, _ev.SingleEpochTreeAggregationDpEvent):
        return _tree_aggregation(event, rel, relation)
    return _newer_event(event)


def _with_replacement(event, rel: _NR, relation: Neighboring):
    """SampledWithReplacementDpEvent of a Gaussian under zero-out or replace-one: a batch of
    ``sample_size`` draws with replacement from ``source_dataset_size`` records,
    :class:`pldjax.sampling.WithReplacement`. Under add/remove the dataset's size, hence every
    draw's law, changes: no PLD here."""
    name = "SampledWithReplacementDpEvent"
    if rel == _NR.ADD_OR_REMOVE_ONE:
        return _Unsupported(f"{name} has a PLD under REPLACE_SPECIAL (zero-out) or REPLACE_ONE "
                            f"only, where both datasets hold source_dataset_size records. "
                            f"Found {rel}.")
    if not isinstance(event.event, _ev.GaussianDpEvent):
        return _Unsupported(f"Subevent of {name} must be a GaussianDpEvent. Found {event.event}.")
    n = check_count(f"{name}.source_dataset_size", event.source_dataset_size, minimum=1)
    m = _count(event, "sample_size")
    sigma = _noise_scale(event.event, "noise_multiplier")
    if m == 0 or sigma == math.inf:
        return None
    if sigma == 0:
        return "non_private"
    return Event(noise.Gaussian(sigma), sampling.WithReplacement(n, m), relation)


def _tree_aggregation(event, rel: _NR, relation: Neighboring):
    """SingleEpochTreeAggregationDpEvent (Kairouz et al. 2021, appendix D), under
    REPLACE_SPECIAL as dp_accounting's RDP accountant reads it: a record reaches at most one node
    per level of the deepest tree, ceil(log2(steps + 1)) nodes, so the release is the Gaussian
    mechanism of sensitivity sqrt(depth) at the nodes' noise multiplier."""
    if rel != _NR.REPLACE_SPECIAL:
        return _Unsupported("neighboring_relation must be REPLACE_SPECIAL for "
                            f"SingleEpochTreeAggregationDpEvent. Found {rel}.")
    sigma = _noise_scale(event, "noise_multiplier")
    counts = event.step_counts
    counts = [counts] if np.ndim(counts) == 0 else list(counts)
    if not counts:
        raise ValueError("SingleEpochTreeAggregationDpEvent.step_counts must be a count or a "
                         "non-empty list of counts")
    steps = max(check_count("SingleEpochTreeAggregationDpEvent.step_counts", c) for c in counts)
    if steps == 0 or sigma == math.inf:
        return None
    if sigma == 0:
        return "non_private"
    depth = math.ceil(math.log2(steps + 1))
    return Event(noise.Gaussian(sigma, math.sqrt(depth)), None, relation)


def _newer_event(event):
    """Events of newer dp_accounting releases, recognised by their names (an older dp_accounting
    has no class to test against), else _Unsupported. ZCDpEvent is ("zcdp", rho, xi): the
    accountant adds them up ((xi, rho)-zCDP composes by addition) and reads the total through
    :func:`pldjax.mechanisms.named.zcdp`. EpsilonDeltaDpEvent and
    ExponentialMechanismDpEvent (as dp_accounting's PLD accountant reads it: an epsilon-DP black
    box) are the (epsilon, delta) guarantee's own curve, randomized response R_{epsilon,delta},
    whatever the relation; PermuteAndFlipDpEvent is the Laplace mechanism of scale 1/epsilon
    (McKenna and Sheldon 2020)."""
    name = type(event).__name__
    if name == "ZCDpEvent":
        rho = _number(event, "rho", 0.0, allow_inf=True)
        xi = _number(event, "xi", 0.0, allow_inf=True)
        if math.inf in (rho, xi):
            return "non_private"
        return None if rho == xi == 0.0 else ("zcdp", rho, xi)
    if name in ("EpsilonDeltaDpEvent", "ExponentialMechanismDpEvent"):
        epsilon = _number(event, "epsilon", 0.0, allow_inf=True)
        delta = _number(event, "delta", 0.0, 1.0) if name == "EpsilonDeltaDpEvent" else 0.0
        if epsilon == math.inf or delta == 1.0:
            return "non_private"
        if epsilon == 0.0 and delta == 0.0:
            return None
        return Event(noise.RandomizedResponse(epsilon, delta), None, Neighboring.ADD_REMOVE)
    if name == "PermuteAndFlipDpEvent":
        epsilon = _number(event, "epsilon", 0.0, allow_inf=True)
        if epsilon == 0.0:
            return None
        if epsilon == math.inf:
            return "non_private"
        return Event(noise.Laplace(1.0 / epsilon), None, Neighboring.ADD_REMOVE)
    return _Unsupported("Unsupported event.")


def to_event(event, neighboring_relation: _NR = _NR.ADD_OR_REMOVE_ONE) -> Event:
    """The :class:`pldjax.Event` (noise x sampling x neighbouring) of a leaf ``DpEvent`` under
    ``neighboring_relation``, as :class:`PLDAccountant` reads it (``to_event(e, rel).pld()`` is
    the event's PLD there; an event that releases nothing is the identity, ``noise.GDP(0)``).

    Raises ``dp_accounting.UnsupportedEventError`` for an event without a PLD here (see the module
    docstring), for composed events (compose their leaves) and for k-ary randomized response (no
    pldjax noise: the accountant builds its PLD with :func:`k_randomized_response`); ValueError
    for a non-private event and for parameters out of range (naming the field).
    """
    _check_relation("neighboring_relation", neighboring_relation)
    if isinstance(event, _ev.ComposedDpEvent | _ev.SelfComposedDpEvent):
        raise _dpa.UnsupportedEventError(f"{type(event).__name__} is a composition, not one event")
    described = _describe(event, neighboring_relation)
    if isinstance(described, Event):
        return described
    if described is None:
        return Event(noise.GDP(0.0), None, _RELATION[neighboring_relation])
    if described == "non_private":
        raise ValueError(f"{event} is not private (epsilon = inf): it has no PLD")
    if isinstance(described, tuple):
        builder = ("pj.zcdp" if described[0] == "zcdp"
                   else "pj.dp_accounting.k_randomized_response")
        raise _dpa.UnsupportedEventError(f"{event} has no pldjax.Event form; its PLD is "
                                         f"{builder}")
    raise _dpa.UnsupportedEventError(f"{event}: {described}")


# -- the accountant -------------------------------------------------------------------------------
class PLDAccountant(_dpa_pld.PLDAccountant):
    """A dp_accounting ``PrivacyAccountant`` (and ``dp_accounting.pld.PLDAccountant``) backed by
    pldjax's PLDs: epsilon and delta are upper bounds, within about 1e-3 of dp_accounting's own
    PLD accountant at its default discretization where both use the same analysis.

    Args:
      neighboring_relation: ``dp_accounting.NeighboringRelation``; ADD_OR_REMOVE_ONE (default),
        REPLACE_ONE or REPLACE_SPECIAL (zero-out).
      value_discretization_interval: accepted for compatibility with dp_accounting's signature
        (jax-privacy passes it), > 0; pldjax chooses its grids itself (power-of-two steps fitted
        to each mechanism and composition), so it does not change the result.
    """

    def __init__(self, neighboring_relation: _NR = _NR.ADD_OR_REMOVE_ONE,
                 value_discretization_interval: float = 1e-4):
        _check_relation("neighboring_relation", neighboring_relation)
        check_range("value_discretization_interval", value_discretization_interval, 0.0,
                    low_open=True)
        super().__init__(neighboring_relation, value_discretization_interval)
        self._segments: list[tuple[float, float, int]] = []  # Gaussian DP-SGD segments
        self._parts: list[tuple[object, int]] = []  # (Event or randomized response, count)
        self._zcdp = (0.0, 0.0)  # the zCDP events' (rho, xi), summed
        self._composed: PLD | None = None

    def _leaf(self, event):
        """An error, None (nothing to account), "non_private", ("segment", (sigma, q)) for the
        Gaussian and Poisson-sampled Gaussian (composed as DP-SGD segments), or ("part", key)."""
        described = _describe(event, self.neighboring_relation)
        if isinstance(described, _Unsupported):
            return self.CompositionErrorDetails(event, str(described))
        if not isinstance(described, Event):
            if described in (None, "non_private"):
                return described
            return ("zcdp", described[1:]) if described[0] == "zcdp" else ("part", described[1:])
        gaussian_noise = type(described.noise) is noise.Gaussian and described.noise.sensitivity == 1.0
        if gaussian_noise and described.sampling is None:
            return "segment", (float(described.noise.sigma), 1.0)
        if gaussian_noise and type(described.sampling) is sampling.Poisson:
            return "segment", (float(described.noise.sigma), float(described.sampling.sampling_prob))
        reason = _unbuildable(described)
        if reason is not None:
            return self.CompositionErrorDetails(event, reason)
        return "part", described

    def _maybe_compose(self, event, count: int, do_compose: bool):
        if isinstance(event, _ev.SelfComposedDpEvent):
            return self._maybe_compose(event.event, count * _count(event, "count"), do_compose)
        if isinstance(event, _ev.ComposedDpEvent):
            for inner in event.events:
                error = self._maybe_compose(inner, count, do_compose)
                if error is not None:
                    return error
            return None
        leaf = self._leaf(event)
        if isinstance(leaf, self.CompositionErrorDetails):
            return leaf
        if not do_compose or leaf is None or count == 0:
            return None
        self._composed = None
        if leaf == "non_private":
            self._contains_non_dp_event = True
        elif leaf[0] == "segment":
            self._segments.append((*leaf[1], count))
        elif leaf[0] == "zcdp":
            self._zcdp = _added(self._zcdp, leaf[1], count)
        else:
            self._parts.append((leaf[1], count))
        return None

    def _zcdp_of(self, event, count: int) -> tuple[float, float]:
        """The (rho, xi) that ``count`` runs of ``event`` add to the zCDP total."""
        if isinstance(event, _ev.SelfComposedDpEvent):
            return self._zcdp_of(event.event, count * _count(event, "count"))
        if isinstance(event, _ev.ComposedDpEvent):
            total = (0.0, 0.0)
            for inner in event.events:
                total = _added(total, self._zcdp_of(inner, count), 1)
            return total
        leaf = self._leaf(event)
        if isinstance(leaf, tuple) and leaf[0] == "zcdp":
            return _added((0.0, 0.0), leaf[1], count)
        return (0.0, 0.0)

    def compose(self, event, count: int = 1):
        """Account for ``count`` runs of ``event`` (see dp_accounting's ``compose``); returns self.
        ``count``: an integer >= 0. A zCDP total too large for :func:`pldjax.zcdp` is refused
        here (a ValueError), before anything is composed, not when epsilon is read."""
        count = check_count("count", count)
        added = self._zcdp_of(event, count)
        if added != (0.0, 0.0):
            zcdp_window(*_added(self._zcdp, added, 1))
        return super().compose(event, count)

    def _single_steps(self) -> list[tuple[PLD, int]]:
        """(one run's PLD, count) of everything composed so far."""
        relation = _RELATION[self.neighboring_relation]
        steps = [(_step_pld(sigma, q, relation), count) for sigma, q, count in self._segments]
        if self._zcdp != (0.0, 0.0):
            steps.append((_zcdp_pld(*self._zcdp), 1))
        return steps + [(event_pld(key, relation), count) for key, count in self._parts]

    def events(self) -> list[tuple[Event, int]] | None:
        """Everything composed so far as (pldjax event, count) pairs (the DP-SGD segments as
        :func:`pldjax.dpsgd_event`); None where a part is not an event (a zCDP total, k-ary
        randomized response)."""
        if self._zcdp != (0.0, 0.0) or not all(isinstance(key, Event) for key, _ in self._parts):
            return None
        relation = _RELATION[self.neighboring_relation]
        return ([(dpsgd_event(sigma, q, relation), count) for sigma, q, count in self._segments]
                + list(self._parts))

    def pld(self, pessimistic: bool = True) -> PLD:
        """The PLD of everything composed so far (for pldjax's own API: ``delta`` at many
        epsilons, ``tradeoff``, ``renyi``, ``pj.privacy_report``); not meaningful after a
        NonPrivateDpEvent. Pessimistic (upper bounds), or with ``pessimistic=False`` optimistic
        (lower bounds), which only a composition of :meth:`events` has (else a ValueError: a
        zCDP total stands for every mechanism of that guarantee, and k-ary randomized response
        is built pessimistic only)."""
        if pessimistic:
            if self._composed is None:
                self._composed = self._composition(pessimistic=True)
            return self._composed
        if self.events() is None:
            raise ValueError("this composition has no optimistic PLD: it holds a zCDP total or "
                             "k-ary randomized response (pldjax builds pessimistic PLDs of those)")
        return self._composition(pessimistic=False)

    def _composition(self, *, pessimistic: bool) -> PLD:
        """The composed PLD of the DP-SGD segments, the zCDP total (pessimistic only) and the
        other parts."""
        relation = _RELATION[self.neighboring_relation]
        parts = []
        if self._segments:
            parts.append(compose_schedule(self._segments, neighboring=relation,
                                          pessimistic=pessimistic))
        if self._zcdp != (0.0, 0.0):
            parts.append(_zcdp_pld(*self._zcdp))
        for key, count in self._parts:
            single = event_pld(key, relation) if pessimistic else key.pld(pessimistic=False)
            parts.append(single.self_compose(count))
        if not parts:
            return identity(pessimistic=pessimistic)
        return parts[0] if len(parts) == 1 else _compose(parts)

    def _composed_if_it_fits(self) -> PLD | None:
        """:meth:`pld`, or None where no grid holds the composition (10^9 runs of
        GaussianDpEvent(1e3): the CompositionTooWide error asks for a coarser Grid, which this
        interface cannot pass); the Chernoff bound answers then."""
        try:
            return self.pld()
        except CompositionTooWide:
            return None

    @announces_slow_calls("pldjax.dp_accounting.PLDAccountant.get_epsilon")
    def get_epsilon(self, target_delta: float) -> float:
        """An upper bound on epsilon at ``target_delta`` in [0, 1] (inf after a non-private
        event, or where the PLD's atom at +inf exceeds ``target_delta``). Below
        ``chernoff.RESOLVED_DELTA``, where the composed PLD reads inf, or where no grid holds
        the composition, the smaller of its epsilon and the Chernoff bound of
        :mod:`pldjax.kernels.chernoff` (both upper bounds), so delta = 1e-18 gets a finite answer."""
        check_range("target_delta", target_delta, 0.0, 1.0)
        if self._contains_non_dp_event:
            return math.inf
        composed = self._composed_if_it_fits()
        eps = math.inf if composed is None else float(composed.epsilon(target_delta))
        if target_delta < chernoff.RESOLVED_DELTA or math.isinf(eps):
            eps = min(eps, chernoff.epsilon(self._single_steps(), target_delta))
        return eps

    @announces_slow_calls("pldjax.dp_accounting.PLDAccountant.get_delta")
    def get_delta(self, target_epsilon: float) -> float:
        """An upper bound on delta at ``target_epsilon`` >= 0 (inf allowed: the atom at +inf);
        1 after a non-private event. Below ``chernoff.RESOLVED_DELTA``, or where no grid holds the
        composition, also the Chernoff bound (the smaller)."""
        check_range("target_epsilon", target_epsilon, 0.0, allow_inf=True)
        if self._contains_non_dp_event:
            return 1.0
        composed = self._composed_if_it_fits()
        delta = 1.0 if composed is None else float(composed.delta(target_epsilon))
        if composed is None or delta < chernoff.RESOLVED_DELTA:
            delta = min(delta, chernoff.delta(self._single_steps(), target_epsilon))
        return delta


    @announces_slow_calls("pldjax.dp_accounting.PLDAccountant.get_true_positive_rates")
    def get_true_positive_rates(self, false_positive_rates, deltas=None):
        """An upper bound on the membership-inference attacker's true-positive rate at each
        false-positive rate in [0, 1] (dp_accounting's meaning): 1 - beta(FPR) on the composed
        PLD's tradeoff curve (the worse direction), which is every (epsilon, delta) pair's bound
        at once, so it is at or below dp_accounting's for any ``deltas``; ``deltas`` (in
        [0, 1]) are accepted for its signature and checked, not needed. A float for a number,
        an array otherwise; 1 after a non-private event or where no grid holds the composition.
        """
        if deltas is not None:
            check_range("deltas", deltas, 0.0, 1.0)
        composed = None if self._contains_non_dp_event else self._composed_if_it_fits()
        tpr = true_positive_rates(composed, false_positive_rates)
        return float(tpr) if tpr.ndim == 0 else tpr

    def get_gdp_parameter_estimate(self, false_positive_rates=None, deltas=None) -> float:
        """dp_accounting's estimate of the Gaussian-DP mu: the largest
        Phi^-1(TPR) - Phi^-1(FPR) over ``false_positive_rates`` up to 1/2 (default 500 from 1e-12
        to 0.5, log-spaced), TPR from :meth:`get_true_positive_rates`; inf where the PLD's atom
        at +inf (either direction) exceeds the smallest of them. An estimate, neither bound
        (the grid may miss where mu binds); :func:`pldjax.gdp_mu` of :meth:`pld` is a certified
        upper bound."""
        if false_positive_rates is None:
            fprs = np.logspace(-12.0, np.log10(0.5), 500)
        else:
            fprs = np.atleast_1d(np.asarray(false_positive_rates, np.float64))
            check_range("false_positive_rates", fprs, 0.0, 1.0)
            fprs = fprs[fprs <= 0.5]
            if fprs.size == 0:
                raise ValueError("false_positive_rates must hold a rate at most 0.5")
        tpr = self.get_true_positive_rates(fprs, deltas)
        composed = None if self._contains_non_dp_event else self._composed_if_it_fits()
        if composed is None or any(float(np.max(np.asarray(d.inf_mass))) > np.min(fprs)
                                   for d in composed.directions()):
            return math.inf
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.max(special.ndtri(tpr) - special.ndtri(fprs)))


@functools.cache
def _jax_privacy_config_class():
    from jax_privacy.accounting import PldAccountantConfig

    class PldjaxAccountantConfig(PldAccountantConfig):
        """jax-privacy's ``PldAccountantConfig`` creating pldjax's accountant (add/remove, as
        jax-privacy's own)."""

        def create_accountant(self) -> PLDAccountant:
            return PLDAccountant(_NR.ADD_OR_REMOVE_ONE, self.value_discretization_interval)

    return PldjaxAccountantConfig


def jax_privacy_config(value_discretization_interval: float = 1e-4):
    """A ``jax_privacy.accounting.PldAccountantConfig`` whose accountants are pldjax's: pass it as
    ``dp_accountant_config`` to jax-privacy's ``DpsgdTrainingAccountant`` (and the calibration
    functions built on it). An instance of jax-privacy's own class, so its type checks pass.
    Requires the ``jax-privacy`` package."""
    return _jax_privacy_config_class()(value_discretization_interval=value_discretization_interval)


def batch_selection_event(strategy, noise_multiplier: float, dataset_size: int,
                          neighboring=_NR.ADD_OR_REMOVE_ONE) -> _ev.DpEvent:
    """The dp_accounting event of DP-SGD (fresh Gaussian noise at every step, of standard
    deviation ``noise_multiplier`` times the clip norm, as jax-privacy trains) trained on
    ``dataset_size`` records with batches from ``strategy``, a ``jax_privacy.batch_selection``
    strategy, for an accountant with ``neighboring`` (a ``dp_accounting.NeighboringRelation``);
    built with jax-privacy's own event builders. Compose it into :class:`PLDAccountant`.

    * ``CyclicPoissonSampling(q, T, truncated_batch_size, cycle_length=b, partition_type)``: a
      record is eligible at every b-th step only (its group's), and each step's noise is fresh,
      so the steps where it is not eligible do not depend on it: ``dpsgd_event(sigma, ceil(T / b),
      sampling_prob=q)``, or ``truncated_dpsgd_event`` on its group of dataset_size // b records.
      With b > 1 an EQUAL_SPLIT partition (jax-privacy's default) is refused under add/remove,
      where it does not hold (the groups change with the dataset), and an INDEPENDENT one with
      truncation (its groups' sizes are random).
    * ``FixedBatchSampling(batch_size, T, replace=False)`` under replace-one: jax-privacy's
      ``fixed_dpsgd_event`` of noise_multiplier / 2 (dp_accounting's
      ``SampledWithoutReplacementDpEvent`` takes the noise over the replace-one sensitivity,
      twice the clip norm); refused under add/remove and zero-out.
    * ``FixedBatchSampling(batch_size=B, T, replace=True)`` under zero-out (REPLACE_SPECIAL) or
      replace-one: ``SampledWithReplacementDpEvent(dataset_size, B,
      GaussianDpEvent(noise_multiplier))`` composed T times (noise standard deviation over the
      clip norm, as for Poisson sampling; :class:`pldjax.sampling.WithReplacement`); refused under
      add/remove.

    Refused by name with a ValueError: b-min-sep (Monte Carlo bounds only:
    :func:`pldjax.accounting.monte_carlo.monte_carlo_epsilon`), balls-in-bins (no dp_accounting
    event: :func:`batch_selection_accounting` accounts for it), and any other object. The event
    does not carry ``neighboring`` (dp_accounting's events hold none): compose it only into an
    accountant of that relation (jax-privacy's ``DpsgdTrainingAccountant`` is add/remove).
    Requires the ``jax-privacy`` package."""
    from jax_privacy import batch_selection
    from jax_privacy.experimental import accounting as events

    _check_relation("neighboring", neighboring)
    check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
    dataset_size = check_count("dataset_size", dataset_size, minimum=1)
    name = type(strategy).__name__
    if isinstance(strategy, batch_selection.CyclicPoissonSampling):
        cycle = check_count("strategy.cycle_length", strategy.cycle_length, minimum=1)
        steps = -(-check_count("strategy.iterations", strategy.iterations, minimum=0) // cycle)
        independent = strategy.partition_type == batch_selection.PartitionType.INDEPENDENT
        if cycle > 1 and not independent and neighboring == _NR.ADD_OR_REMOVE_ONE:
            raise ValueError(f"{name} with cycle_length {cycle} and an EQUAL_SPLIT partition "
                             "holds under replace-one or zero-out (REPLACE_SPECIAL) neighbours "
                             "only (the groups change with the dataset): pass one of those as "
                             "neighboring, or use PartitionType.INDEPENDENT")
        if strategy.truncated_batch_size is None:
            return events.dpsgd_event(noise_multiplier, steps, sampling_prob=strategy.sampling_prob)
        if cycle > 1 and independent:
            raise ValueError(f"{name} with truncation and an INDEPENDENT partition has no "
                             "analysis here: its groups' sizes, on which truncation depends, "
                             "are random; use an EQUAL_SPLIT partition")
        return events.truncated_dpsgd_event(
            noise_multiplier, steps, sampling_prob=strategy.sampling_prob,
            num_examples=dataset_size // cycle,
            truncated_batch_size=strategy.truncated_batch_size)
    if isinstance(strategy, batch_selection.FixedBatchSampling) and not strategy.replace:
        if neighboring != _NR.REPLACE_ONE:
            raise ValueError(f"{name} without replacement is accounted for under REPLACE_ONE "
                             "neighbours only (both datasets hold dataset_size records, and "
                             "dp_accounting analyses it there): pass that as neighboring")
        # the event's Gaussian is over the replace-one sensitivity, twice the clip norm (as
        # jax-privacy's DpsgdTrainingAccountant counts fixed batches: "the sensitivity
        # doubled"); its fixed_dpsgd_event passes the noise multiplier on unchanged
        return events.fixed_dpsgd_event(noise_multiplier / 2, strategy.iterations,
                                        dataset_size=dataset_size,
                                        batch_size=strategy.batch_size)
    if isinstance(strategy, batch_selection.FixedBatchSampling):
        if neighboring == _NR.ADD_OR_REMOVE_ONE:
            raise ValueError(f"{name} with replace=True (sampling with replacement) is "
                             "accounted for under zero-out (REPLACE_SPECIAL) or REPLACE_ONE "
                             "neighbours, where both datasets hold dataset_size records; pass "
                             "one of those as neighboring")
        batch = check_count("strategy.batch_size", strategy.batch_size, minimum=0)
        iterations = check_count("strategy.iterations", strategy.iterations, minimum=0)
        return _ev.SelfComposedDpEvent(_ev.SampledWithReplacementDpEvent(
            dataset_size, batch, _ev.GaussianDpEvent(float(noise_multiplier))), iterations)
    reasons = {
        "BallsInBinsSampling": "dp_accounting has no event for random allocation: account "
                               "for it with pj.dp_accounting.batch_selection_accounting",
        "BMinSepSampling": "b-min-sep sampling has no PLD analysis, only Monte Carlo ones, "
                           "which give high-probability bounds rather than events (without "
                           "truncation: pj.monte_carlo_epsilon(noise_multiplier, "
                           "strategy.sampling_prob, strategy.iterations, strategy.min_sep, "
                           "delta, warm_start=strategy.warm_start))",
    }
    reason = reasons.get(name, "not a batch selection strategy pldjax accounts for")
    raise ValueError(f"strategy {name}: {reason}; accounted for are CyclicPoissonSampling and "
                     "FixedBatchSampling")


def batch_selection_accounting(strategy, noise_multiplier: float, dataset_size: int,
                               neighboring=_NR.ADD_OR_REMOVE_ONE) -> tuple[Event, int]:
    """(event, count): the pldjax accounting of DP-SGD trained with batches from ``strategy`` (a
    ``jax_privacy.batch_selection`` strategy), Gaussian noise of ``noise_multiplier`` times the
    clip norm and ``dataset_size`` records, under ``neighboring`` (a
    ``dp_accounting.NeighboringRelation``): ``pj.event_epsilon(event, count, delta)`` reads it.

    * ``BallsInBinsSampling(T, cycle_length=b)``: each record's bin is drawn once and used in
      every cycle, so the record's E = ceil(T / b) uses of its bin add up to one Gaussian of
      sensitivity sqrt(E) (exactly when b divides T; above it otherwise, the bins with fewer
      uses being a post-processing: then the event's pessimistic readings bound the run from
      above, but its optimistic ones are no lower bounds, and a UserWarning says so; those of
      the event of sensitivity sqrt(floor(T / b)) are, every bin being used that often); the pair
      is random allocation of one of b steps
      (:class:`pldjax.mechanisms.sampling.RandomAllocation`, count 1), under add/remove or
      zero-out: the mixture over the bins of the shifted outputs against none, the pair
      jax-privacy's Monte Carlo accounting of this strategy samples.
    * Every other strategy: :func:`batch_selection_event`'s accounting (the same refusals, by
      name), as its event and count.
    """
    from jax_privacy import batch_selection

    _check_relation("neighboring", neighboring)
    if isinstance(strategy, batch_selection.BallsInBinsSampling):
        check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
        check_count("dataset_size", dataset_size, minimum=1)
        bins = check_count("strategy.cycle_length", strategy.cycle_length, minimum=1)
        iterations = check_count("strategy.iterations", strategy.iterations, minimum=0)
        if neighboring not in (_NR.ADD_OR_REMOVE_ONE, _NR.REPLACE_SPECIAL):
            raise ValueError("BallsInBinsSampling is accounted for under add/remove or zero-out "
                             "(REPLACE_SPECIAL) neighbours, not replace-one: random allocation's "
                             "pair covers a record against none")
        uses = max(-(-iterations // bins), 1)
        if iterations % bins:
            fewer = iterations // bins
            warnings.warn(f"BallsInBinsSampling: cycle_length {bins} does not divide iterations "
                          f"{iterations}, so some bins are used {fewer} times, not {uses}: the "
                          f"event's pessimistic readings bound the run from above, its "
                          f"optimistic ones (pessimistic=False, a report's lower bounds) are no "
                          + (f"lower bounds; those of the same event with sensitivity "
                             f"sqrt({fewer}) are (every bin is used at least that often)"
                             if fewer else "lower bounds (with a bin never used, only 0 is)"),
                          UserWarning, stacklevel=2)
        event = Event(noise.Gaussian(float(noise_multiplier), sensitivity=math.sqrt(uses)),
                      sampling.RandomAllocation(bins), _RELATION[neighboring])
        return event, int(iterations > 0)
    dp_event = batch_selection_event(strategy, noise_multiplier, dataset_size, neighboring)
    if isinstance(dp_event, _ev.SelfComposedDpEvent):
        return to_event(dp_event.event, neighboring), int(dp_event.count)
    return to_event(dp_event, neighboring), 1


__all__ = ["PLDAccountant", "batch_selection_accounting", "batch_selection_event",
           "jax_privacy_config", "k_randomized_response", "to_event"]
__dir__ = public_dir(__all__)
