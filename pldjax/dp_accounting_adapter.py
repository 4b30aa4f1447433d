"""pldjax as a ``dp_accounting.PrivacyAccountant``, so that code written for Google's
dp_accounting (jax-privacy, ``dp_accounting.calibrate_dp_mechanism``) can account with pldjax.

Supported events: ``GaussianDpEvent``, ``PoissonSampledDpEvent`` of a Gaussian,
``SelfComposedDpEvent`` and ``ComposedDpEvent`` of those, and ``NoOpDpEvent``. The events are
recorded as DP-SGD segments (noise multiplier, sampling probability, count) and composed exactly by
:func:`pldjax.compose_schedule` when epsilon or delta is read (pessimistic: upper bounds).
Requires the ``dp-accounting`` package.
"""

from __future__ import annotations

import dp_accounting as _dpa

from pldjax.dpsgd import compose_schedule
from pldjax.mechanisms import identity

_RELATIONS = {
    _dpa.NeighboringRelation.ADD_OR_REMOVE_ONE: "add_remove",
    _dpa.NeighboringRelation.REPLACE_ONE: "replace_one",
}


class PLDAccountant(_dpa.PrivacyAccountant):
    """A dp_accounting PrivacyAccountant backed by pldjax's exact PLD composition."""

    def __init__(self, neighboring_relation=_dpa.NeighboringRelation.ADD_OR_REMOVE_ONE):
        if neighboring_relation not in _RELATIONS:
            raise ValueError(f"neighboring_relation must be one of {list(_RELATIONS)}")
        super().__init__(neighboring_relation)
        self._segments: list[tuple[float, float, int]] = []

    def _gaussian(self, event, sampling_prob: float, count: int, do_compose: bool):
        if event.noise_multiplier <= 0:
            return self.CompositionErrorDetails(event, "noise_multiplier must be > 0")
        if do_compose and count > 0 and sampling_prob > 0:
            self._segments.append((float(event.noise_multiplier), float(sampling_prob), count))
        return None

    def _maybe_compose(self, event, count: int, do_compose: bool):
        if isinstance(event, _dpa.NoOpDpEvent):
            return None
        if isinstance(event, _dpa.GaussianDpEvent):
            return self._gaussian(event, 1.0, count, do_compose)
        if isinstance(event, _dpa.PoissonSampledDpEvent):
            inner = event.event
            if isinstance(inner, _dpa.GaussianDpEvent):
                return self._gaussian(inner, event.sampling_probability, count, do_compose)
            return self.CompositionErrorDetails(event, "only Poisson-sampled Gaussian events")
        if isinstance(event, _dpa.SelfComposedDpEvent):
            return self._maybe_compose(event.event, count * event.count, do_compose)
        if isinstance(event, _dpa.ComposedDpEvent):
            for inner in event.events:
                error = self._maybe_compose(inner, count, False)
                if error is not None:
                    return error
            if do_compose:
                for inner in event.events:
                    self._maybe_compose(inner, count, True)
            return None
        return self.CompositionErrorDetails(event, f"unsupported event {type(event).__name__}")

    def _pld(self):
        if not self._segments:
            return identity()
        return compose_schedule(self._segments,
                                neighboring=_RELATIONS[self.neighboring_relation])

    def get_epsilon(self, target_delta: float) -> float:
        return float(self._pld().epsilon(target_delta))

    def get_delta(self, target_epsilon: float) -> float:
        return float(self._pld().delta(target_epsilon))
