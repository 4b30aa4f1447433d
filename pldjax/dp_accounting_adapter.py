"""pldjax as a ``dp_accounting`` privacy accountant, so that code written for Google's dp_accounting
(``calibrate_dp_mechanism``, jax-privacy's event builders and training accountants) accounts with
pldjax's PLDs.

:class:`PLDAccountant` is a subclass of ``dp_accounting.pld.PLDAccountant``, so the checks that
jax-privacy makes for "a PLD accountant" (``isinstance(acct, dp_accounting.pld.PLDAccountant)``)
pass; it overrides the composition and the epsilon / delta queries. Events are recorded when
composed and turned into PLDs when epsilon or delta is read (pessimistic: upper bounds). Each
event's PLD is cached by its parameters, so calibration loops that compose the same event into
fresh accountants build it once.

Events (``relations``: the neighboring relations accepted; RS = REPLACE_SPECIAL, the zero-out
relation, AR = ADD_OR_REMOVE_ONE, RO = REPLACE_ONE):

=========================================== ========== =============================================
event                                       relations  PLD
=========================================== ========== =============================================
NoOpDpEvent                                 all        identity
NonPrivateDpEvent                           all        epsilon = inf, delta = 1
GaussianDpEvent                             all        ``gaussian`` (RS is AR; RO: shift 2)
LaplaceDpEvent                              AR, RS, RO ``laplace`` (RO: shift 2)
DiscreteLaplaceDpEvent                      AR, RS, RO ``discrete_laplace``
PoissonSampledDpEvent(Gaussian)             all        ``gaussian(sampling_prob=)``
PoissonSampledDpEvent(Laplace)              AR, RS     ``laplace(sampling_prob=)``
SampledWithoutReplacementDpEvent(Gaussian)  RO         ``gaussian(sampling="fixed_batch")`` (*)
RandomizedResponseDpEvent (k buckets)       RO, RS     exact tails, :func:`k_randomized_response`
MixtureOfGaussiansDpEvent                   AR, RS     exact tails, :func:`mixture_of_gaussians`
TruncatedSubsampledGaussianDpEvent          all        :mod:`pldjax.truncated_poisson`
SelfComposedDpEvent, ComposedDpEvent        all        composition
=========================================== ========== =============================================

(*) dp_accounting has no PLD for it; its RDP accountant (and jax-privacy's ``fixed_dpsgd_event``,
which scales the noise by the replace-one sensitivity 2C) reads the noise multiplier relative to
the distance between the replaced and the new record's contributions, so the PLD here is that of
a shift of 1 noise multiplier, at or below dp_accounting's RDP bound. Gaussian and
Poisson-sampled Gaussian events under REPLACE_ONE follow dp_accounting's PLD accountant instead
(a record moves from -C to +C: a shift of 2), as its own accountants do.

Anything else (``SampledWithReplacementDpEvent``, ``SingleEpochTreeAggregationDpEvent``,
``RepeatAndSelectDpEvent``, ``ZCDpEvent``, ``UnsupportedDpEvent``, a sampled event around
another kind) is reported as dp_accounting reports it: ``supports`` returns False and
``compose`` raises ``dp_accounting.UnsupportedEventError`` naming the sub-event. Parameters out
of range (a negative noise multiplier, a probability outside [0, 1], NaN) raise ValueError from
both, naming the field. Requires the ``dp-accounting`` package.
"""

from __future__ import annotations

import functools
import math

import dp_accounting as _dpa
import jax.numpy as jnp
import numpy as np
from dp_accounting import dp_event as _ev
from dp_accounting.pld import pld_privacy_accountant as _dpa_pld
from scipy import special

from pldjax.compose import compose as _compose
from pldjax.discretize import hockey_stick, hockey_stick_excess, masses_from_curve
from pldjax.dpsgd import compose_schedule
from pldjax.mechanisms import discrete_laplace, gaussian, identity, laplace
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.truncated_poisson import truncated_poisson_gaussian
from pldjax.validate import check_count, check_range

_NR = _dpa.NeighboringRelation
_RELATION = {_NR.ADD_OR_REMOVE_ONE: "add_remove", _NR.REPLACE_ONE: "replace_one",
             _NR.REPLACE_SPECIAL: "replace_special"}
#: for additive noise without truncation, zero-out (a record's contribution against 0) is add/remove
_NOISE_RELATION = {"add_remove": "add_remove", "replace_special": "add_remove",
                   "replace_one": "replace_one"}


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


def _pld_from_tails(tails, reverse, lo: float, hi: float, points: int = 4096) -> PLD:
    """Connect-the-dots (pessimistic) PLD from exact tails (see :func:`_discrete_tails`) on a
    power-of-two step with about ``points`` points across the losses [lo, hi] (a window of a
    power-of-two size, so that compiled kernels are shared); losses below the window are moved up
    into it, the curve at its top becomes the atom at +inf (both on the safe side). The curve
    below eps = 0 comes from the excess e^eps Q(L <= eps) - P(L <= eps), which keeps the digits
    that 1 - delta loses (as :func:`pldjax.discretize.discretize` does)."""
    step = float(2.0 ** np.floor(np.log2(max(hi - lo, 1e-9) / points)))
    offset = int(np.floor(lo / step)) - 1
    size = 1 << int(np.ceil(np.log2(int(np.ceil(hi / step)) + 2 - offset)))
    z = (offset + np.arange(size)) * step

    def one(fn) -> PLD:
        lsp, lsq, lcp, lcq = (jnp.asarray(t) for t in fn(z))
        zj = jnp.asarray(z)
        probs, inf_mass = masses_from_curve(hockey_stick(lsp, lsq, zj), step,
                                            hockey_stick_excess(lcp, lcq, zj), zj)
        return PLD(probs, inf_mass, jnp.asarray(offset, jnp.int64), jnp.asarray(step), True)

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
@float64
def mixture_of_gaussians(standard_deviation: float, sensitivities: tuple, sampling_probs: tuple) -> PLD:
    """Pessimistic PLD of the Gaussian mechanism with a random sensitivity S (P(S = s_i) = p_i,
    s_i >= 0): P = sum_i p_i N(s_i, sigma^2) against Q = N(0, sigma^2), both directions
    (Poisson subsampling is the case S in {0, 1}). The loss L(x) = log sum_i p_i
    exp((2 s_i x - s_i^2) / (2 sigma^2)) is increasing in x, so {L > eps} = {X > x(eps)} with
    L(x(eps)) = eps, found by bisection to float64 resolution (the other direction is the mirror
    image); exact tails, connect-the-dots on a power-of-two grid of about 4096 points.
    ``standard_deviation`` > 0; ``sensitivities`` >= 0 and ``sampling_probs`` in [0, 1] (summing
    to 1), tuples of one length."""
    check_range("standard_deviation", standard_deviation, 0.0, low_open=True)
    check_range("sensitivities", sensitivities, 0.0)
    check_range("sampling_probs", sampling_probs, 0.0, 1.0)
    if len(sensitivities) != len(sampling_probs) or not sensitivities:
        raise ValueError("sensitivities and sampling_probs must be non-empty and of one length")
    if abs(math.fsum(sampling_probs) - 1.0) > 1e-9:
        raise ValueError(f"sampling_probs must sum to 1, got {math.fsum(sampling_probs)!r}")
    s = np.asarray(sensitivities, np.float64) / float(standard_deviation)
    w = np.asarray(sampling_probs, np.float64)
    keep = w > 0
    s, w = s[keep], w[keep] / np.sum(w[keep])  # round-off only (the sum is 1 within 1e-9)
    if np.all(s == 0):
        return identity()
    log_w = np.log(w)
    edge = 40.0 + s.max()

    def loss(x):
        return special.logsumexp(log_w + s * x[..., None] - s * s / 2, axis=-1)

    def solve(target):  # the x with L(x) = target (L is increasing), to float64 resolution
        lo, hi = np.full_like(target, -edge), np.full_like(target, edge)
        for _ in range(100):
            mid = (lo + hi) / 2
            above = loss(mid) > target
            hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
        return hi

    def mix(x, sign):  # log P(sign X > sign x) under P = sum_i w_i N(s_i, 1)
        return special.logsumexp(log_w + special.log_ndtr(sign * (s - x[..., None])), axis=-1)

    def forward(eps):  # PLD(P || Q): {L > eps} = {X > x}
        x = solve(eps)
        return mix(x, 1.0), special.log_ndtr(-x), mix(x, -1.0), special.log_ndtr(x)

    def back(eps):  # PLD(Q || P), loss -L under Q: {-L > eps} = {X < y}, L(y) = -eps
        y = solve(-eps)
        return special.log_ndtr(y), mix(y, -1.0), special.log_ndtr(-y), mix(y, 1.0)

    reach = 12.0 + s.max()
    top, bottom = (float(v) for v in loss(np.asarray([reach, -12.0])))
    return _pld_from_tails(forward, back, min(bottom, -top), max(top, -bottom))


@functools.lru_cache(maxsize=256)
def _event_pld(kind: str, params: tuple, relation: str) -> PLD:
    """One event's PLD, cached by its (hashable) parameters; ``relation``: a value of _RELATION."""
    noise_relation = _NOISE_RELATION[relation]
    if kind == "laplace":
        return laplace(params[0], neighboring=noise_relation)
    if kind == "poisson_laplace":
        return laplace(params[0], sampling_prob=params[1])
    if kind == "discrete_laplace":
        return discrete_laplace(params[0], sensitivity=params[1], neighboring=noise_relation)
    if kind == "without_replacement":
        # noise multiplier relative to the replace-one distance |v - v'| (dp_accounting's RDP
        # accountant, jax-privacy's fixed_dpsgd_event): pldjax's replace-one moves a record from
        # -sensitivity to +sensitivity, so sensitivity 1/2
        return gaussian(params[0], sensitivity=0.5, sampling_prob=params[1],
                        neighboring="replace_one", sampling="fixed_batch")
    if kind == "randomized_response":
        return k_randomized_response(*params, relation)
    if kind == "mixture_of_gaussians":
        return mixture_of_gaussians(*params)
    if kind == "truncated":
        return truncated_poisson_gaussian(*params, neighboring=relation)
    raise AssertionError(kind)


# -- the accountant -------------------------------------------------------------------------------
def _number(event, field: str, low: float, high: float = math.inf) -> float:
    value = getattr(event, field)
    check_range(f"{type(event).__name__}.{field}", value, low, high)
    return float(value)


def _count(event, field: str) -> int:
    return check_count(f"{type(event).__name__}.{field}", getattr(event, field))


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
        if neighboring_relation not in _RELATION:
            raise ValueError(f"neighboring_relation must be one of {list(_RELATION)}, "
                             f"got {neighboring_relation!r}")
        check_range("value_discretization_interval", value_discretization_interval, 0.0,
                    low_open=True)
        super().__init__(neighboring_relation, value_discretization_interval)
        self._segments: list[tuple[float, float, int]] = []  # Gaussian DP-SGD segments
        self._parts: list[tuple[str, tuple, int]] = []  # (kind, params, count)
        self._composed: PLD | None = None

    # the leaves: an error, None (nothing to account), "non_private", or a part
    def _leaf(self, event):
        rel = self.neighboring_relation
        unsupported = functools.partial(self.CompositionErrorDetails, event)
        if isinstance(event, _ev.NoOpDpEvent):
            return None
        if isinstance(event, _ev.NonPrivateDpEvent):
            return "non_private"
        if isinstance(event, _ev.GaussianDpEvent):
            sigma = _number(event, "noise_multiplier", 0.0)
            return "non_private" if sigma == 0 else ("segment", (sigma, 1.0))
        if isinstance(event, _ev.LaplaceDpEvent):
            b = _number(event, "noise_multiplier", 0.0)
            return "non_private" if b == 0 else ("laplace", (b,))
        if isinstance(event, _ev.DiscreteLaplaceDpEvent):
            a = _number(event, "noise_parameter", 0.0)
            sens = _count(event, "sensitivity")
            if sens == 0:
                return None
            return "non_private" if a == 0 else ("discrete_laplace", (1.0 / a, sens))
        if isinstance(event, _ev.PoissonSampledDpEvent):
            q = _number(event, "sampling_probability", 0.0, 1.0)
            inner = event.event
            if isinstance(inner, _ev.GaussianDpEvent):
                sigma = _number(inner, "noise_multiplier", 0.0)
                if q == 0:
                    return None
                return "non_private" if sigma == 0 else ("segment", (sigma, q))
            if isinstance(inner, _ev.LaplaceDpEvent):
                if rel == _NR.REPLACE_ONE:
                    return unsupported("neighboring_relation must be ADD_OR_REMOVE_ONE or "
                                       "REPLACE_SPECIAL for PoissonSampledDpEvent of a "
                                       f"LaplaceDpEvent. Found {rel}.")
                b = _number(inner, "noise_multiplier", 0.0)
                if q == 0:
                    return None
                return "non_private" if b == 0 else ("poisson_laplace", (b, q))
            return unsupported("Subevent of PoissonSampledDpEvent must be either GaussianDpEvent "
                               f"or LaplaceDpEvent. Found {inner}.")
        if isinstance(event, _ev.SampledWithoutReplacementDpEvent):
            if rel != _NR.REPLACE_ONE:
                return unsupported("SampledWithoutReplacementDpEvent has a PLD under REPLACE_ONE "
                                   f"only (the batch size is fixed). Found {rel}.")
            if not isinstance(event.event, _ev.GaussianDpEvent):
                return unsupported("Subevent of SampledWithoutReplacementDpEvent must be a "
                                   f"GaussianDpEvent. Found {event.event}.")
            n = _count(event, "source_dataset_size")
            m = _count(event, "sample_size")
            if m > n:
                raise ValueError(f"SampledWithoutReplacementDpEvent.sample_size must be at most "
                                 f"source_dataset_size = {n}, got {m}")
            sigma = _number(event.event, "noise_multiplier", 0.0)
            if m == 0:
                return None
            return "non_private" if sigma == 0 else ("without_replacement", (sigma, m / n))
        if isinstance(event, _ev.RandomizedResponseDpEvent):
            if rel == _NR.ADD_OR_REMOVE_ONE:
                return unsupported("neighboring_relation must be REPLACE_ONE or REPLACE_SPECIAL "
                                   f"for RandomizedResponseDpEvent. Found {rel}.")
            p = _number(event, "noise_parameter", 0.0, 1.0)
            k = _count(event, "num_buckets")
            if k == 0:
                raise ValueError("RandomizedResponseDpEvent.num_buckets must be an integer >= 1, "
                                 "got 0")
            if k == 1:
                return None
            return "non_private" if p == 0 else ("randomized_response", (p, k))
        if isinstance(event, _ev.MixtureOfGaussiansDpEvent):
            if rel == _NR.REPLACE_ONE:
                return unsupported("neighboring_relation must be ADD_OR_REMOVE_ONE or "
                                   "REPLACE_SPECIAL for MixtureOfGaussiansDpEvent. Found "
                                   f"{rel}.")
            name = "MixtureOfGaussiansDpEvent"
            sigma = _number(event, "standard_deviation", 0.0)
            sens = tuple(float(x) for x in event.sensitivities)
            probs = tuple(float(x) for x in event.sampling_probs)
            if len(sens) != len(probs) or not sens:
                raise ValueError(f"{name}.sensitivities and sampling_probs must be non-empty and "
                                 "of the same length")
            check_range(f"{name}.sensitivities", sens, 0.0)
            check_range(f"{name}.sampling_probs", probs, 0.0, 1.0)
            if abs(sum(probs) - 1.0) > 1e-9:
                raise ValueError(f"{name}.sampling_probs must sum to 1, got {sum(probs)!r}")
            if all(s == 0 or p == 0 for s, p in zip(sens, probs, strict=True)):
                return None
            return "non_private" if sigma == 0 else ("mixture_of_gaussians", (sigma, sens, probs))
        if isinstance(event, _ev.TruncatedSubsampledGaussianDpEvent):
            n = _count(event, "dataset_size")
            q = _number(event, "sampling_probability", 0.0, 1.0)
            b = _count(event, "truncated_batch_size")
            sigma = _number(event, "noise_multiplier", 0.0)
            if q == 0 or b == 0 or n == 0:
                return None
            return "non_private" if sigma == 0 else ("truncated", (sigma, q, n, b))
        return unsupported("Unsupported event.")

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
        else:
            self._parts.append((leaf[0], leaf[1], count))
        return None

    def compose(self, event, count: int = 1):
        """Account for ``count`` runs of ``event`` (see dp_accounting's ``compose``); returns self.
        ``count``: an integer >= 0."""
        return super().compose(event, check_count("count", count))

    def pld(self) -> PLD:
        """The pessimistic PLD of everything composed so far (for pldjax's own API: ``delta`` at
        many epsilons, ``tradeoff``, ``renyi``); not meaningful after a NonPrivateDpEvent."""
        if self._composed is None:
            relation = _RELATION[self.neighboring_relation]
            parts = []
            if self._segments:
                parts.append(compose_schedule(self._segments, neighboring=_NOISE_RELATION[relation]))
            for kind, params, count in self._parts:
                parts.append(_event_pld(kind, params, relation).self_compose(count))
            self._composed = (identity() if not parts else
                              parts[0] if len(parts) == 1 else _compose(parts))
        return self._composed

    def get_epsilon(self, target_delta: float) -> float:
        """An upper bound on epsilon at ``target_delta`` in [0, 1] (inf after a non-private
        event, or where the PLD's atom at +inf exceeds ``target_delta``)."""
        check_range("target_delta", target_delta, 0.0, 1.0)
        if self._contains_non_dp_event:
            return math.inf
        return float(self.pld().epsilon(target_delta))

    def get_delta(self, target_epsilon: float) -> float:
        """An upper bound on delta at ``target_epsilon`` >= 0 (inf allowed: the atom at +inf);
        1 after a non-private event."""
        check_range("target_epsilon", target_epsilon, 0.0, allow_inf=True)
        if self._contains_non_dp_event:
            return 1.0
        return float(self.pld().delta(target_epsilon))


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


__all__ = ["PLDAccountant", "jax_privacy_config", "k_randomized_response", "mixture_of_gaussians"]
