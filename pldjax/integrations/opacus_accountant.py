"""pldjax as an Opacus accountant (``opacus.accountants.IAccountant``), registered as "pldjax".

Opacus's ``PrivacyEngine`` names its accountant by a string and builds it through Opacus's
registry; :func:`register` adds pldjax there::

    import pldjax as pj
    pj.opacus.register()
    engine = opacus.PrivacyEngine(accountant="pldjax")   # or engine.accountant = pj.opacus.PLDAccountant()

The history follows Opacus's conventions (those of its RDP and PRV accountants): a list of
``(noise_multiplier, sample_rate, num_steps)`` segments, consecutive equal steps merged, saved and
restored by ``state_dict`` / ``load_state_dict``. ``get_epsilon(delta)`` composes the history with
:func:`pldjax.compose_schedule` (Poisson subsampling, add/remove neighbours, both directions: an
upper bound) and does not change it; the composed PLD is cached by the history, so repeated reads
are cheap. Where pldjax's composed PLD cannot resolve delta (FFT round-off is charged on the safe
side at about 1e-19 a bin, so below about 1e-12 it reads a loose epsilon or inf), the Chernoff
bound of :mod:`pldjax.kernels.chernoff` (from the single steps' PLDs, no FFT) and Opacus's RDP bound are
read too, and the smallest of these upper bounds is returned. Unlike Opacus's PRV accountant,
every delta in [0, 1] is answered (delta = 1e-18 too), epsilon can be in the hundreds or
thousands, and the answer is never negative or NaN.
Requires ``opacus`` (and torch): ``pip install 'pldjax[opacus]'``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from opacus.accountants import IAccountant
from opacus.accountants.analysis import rdp as opacus_rdp
from opacus.accountants.registry import _ACCOUNTANTS, register_accountant

from pldjax.accounting.report import true_positive_rates
from pldjax.accounting.schedule import compose_schedule
from pldjax.core.namespace import public_dir
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD
from pldjax.core.precision import lower_of_rounded, upper_of_rounded
from pldjax.core.validation import check_count, check_range
from pldjax.kernels import chernoff
from pldjax.kernels.compose import CompositionTooWide
from pldjax.mechanisms.named import gaussian, identity

MECHANISM = "pldjax"
#: Rényi orders of the fallback bound (Opacus's defaults, extended for tiny delta)
_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 128, 256, 512, 1024]


#: :meth:`PLDAccountant._composed` where the history's composition does not fit a grid
_TOO_WIDE = object()


def _number(name: str, value, up: bool):
    """``value`` as a Python float where it is a torch tensor (Opacus's own accountants take one),
    on its pessimistic side where its dtype rounded it (``up``: the largest real that rounds to it,
    else the smallest); anything else as it is, for check_range to judge."""
    if type(value).__module__.split(".")[0] != "torch" or not hasattr(value, "numpy"):
        return value
    array = value.detach().cpu().numpy()
    if array.ndim != 0:
        raise ValueError(f"{name} must be a single number, got a tensor of shape {array.shape}")
    if array.dtype.kind != "f":
        return array
    return float(upper_of_rounded(array) if up else lower_of_rounded(array))


class PLDAccountant(IAccountant):
    """Opacus accountant backed by pldjax's PLDs (pessimistic: epsilon is an upper bound)."""

    def __init__(self):
        super().__init__()
        self._cache: tuple[tuple, PLD] | None = None

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one optimizer step; ``noise_multiplier`` >= 0 (0: no noise, epsilon = inf),
        ``sample_rate`` in [0, 1]. Invalid values are a ValueError and leave the history as it was."""
        noise_multiplier = _number("noise_multiplier", noise_multiplier, up=False)
        sample_rate = _number("sample_rate", sample_rate, up=True)
        check_range("noise_multiplier", noise_multiplier, 0.0)
        check_range("sample_rate", sample_rate, 0.0, 1.0)
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, q, steps = self.history[-1]
            self.history[-1] = (sigma, q, steps + 1)
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    def _segments(self) -> list[tuple[float, float, int]]:
        segments = []
        for i, entry in enumerate(self.history):
            if len(entry) != 3:
                raise ValueError(f"history[{i}] must be (noise_multiplier, sample_rate, num_steps), "
                                 f"got {entry!r}")
            sigma, q, steps = entry
            check_range(f"history[{i}] noise_multiplier", sigma, 0.0)
            check_range(f"history[{i}] sample_rate", q, 0.0, 1.0)
            segments.append((float(sigma), float(q), check_count(f"history[{i}] num_steps", steps)))
        return segments

    def pld(self) -> PLD | None:
        """The pessimistic PLD of the history (None when a step had no noise: not private)."""
        segments = self._segments()
        key = tuple(segments)
        if self._cache is None or self._cache[0] != key:
            live = [s for s in segments if s[1] > 0 and s[2] > 0]
            if any(sigma == 0 for sigma, _, _ in live):
                pld = None
            elif live:
                pld = compose_schedule(live)
            else:
                pld = identity()
            self._cache = (key, pld)
        return self._cache[1]

    def _composed(self) -> PLD | object | None:
        """:meth:`pld`, or _TOO_WIDE where no grid holds the composition (10^9 steps at
        sigma = 1e3: the CompositionTooWide error asks for a coarser Grid, which Opacus cannot
        pass); the RDP and Chernoff bounds answer then. A bad history raises its ValueError."""
        try:
            return self.pld()
        except CompositionTooWide:
            return _TOO_WIDE

    @announces_slow_calls("pldjax.opacus.PLDAccountant.get_epsilon")
    def get_epsilon(self, delta: float, **kwargs) -> float:
        """An upper bound on epsilon at ``delta`` in [0, 1] for the steps taken so far (0 before the
        first step, inf after a step without noise). Extra keyword arguments (Opacus passes
        accountant-specific ones such as ``eps_error``) are accepted and ignored."""
        check_range("delta", delta, 0.0, 1.0)
        pld = self._composed()
        if pld is None:
            return math.inf
        eps = min(self.rdp_epsilon(delta), math.inf if pld is _TOO_WIDE else float(pld.epsilon(delta)))
        if delta < chernoff.RESOLVED_DELTA or math.isinf(eps):
            eps = min(eps, chernoff.epsilon(self._single_steps(), delta))
        # RDP's conversion goes below 0 for delta near 1; epsilon 0 is then an upper bound
        return max(eps, 0.0)

    def _single_steps(self) -> list[tuple[PLD, int]]:
        """(one step's PLD, steps) of each live segment, for :mod:`pldjax.kernels.chernoff`."""
        return [(gaussian(sigma, sampling_prob=q), steps)
                for sigma, q, steps in self._segments() if q > 0 and steps > 0]

    def rdp_epsilon(self, delta: float) -> float:
        """Opacus's own RDP bound (also an upper bound; the smallest of upper bounds is one)."""
        live = [s for s in self._segments() if s[1] > 0 and s[2] > 0]
        if delta <= 0 or not live:
            return math.inf if live else 0.0
        rdp = sum(opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=_ORDERS)
                  for sigma, q, steps in live)
        with warnings.catch_warnings():  # "optimal order is the largest alpha": still a bound
            warnings.simplefilter("ignore")
            eps, _ = opacus_rdp.get_privacy_spent(orders=_ORDERS, rdp=rdp, delta=delta)
        return float(eps) if eps == eps else math.inf  # never NaN

    @announces_slow_calls("pldjax.opacus.PLDAccountant.get_delta")
    def get_delta(self, epsilon: float) -> float:
        """An upper bound on delta at ``epsilon`` >= 0 (inf allowed): the smaller of the PLD's and
        the RDP bound's."""
        check_range("epsilon", epsilon, 0.0, allow_inf=True)
        pld = self._composed()
        if pld is None:
            return 1.0
        live = [s for s in self._segments() if s[1] > 0 and s[2] > 0]
        rdp_delta = 1.0
        if live and math.isfinite(epsilon):  # RDP to (epsilon, delta): exp((a - 1)(rdp_a - eps))
            orders = np.asarray(_ORDERS)
            rdp = sum(opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps,
                                             orders=_ORDERS) for sigma, q, steps in live)
            with np.errstate(over="ignore", invalid="ignore"):
                exponents = (orders - 1) * (np.asarray(rdp) - epsilon)
            rdp_delta = float(np.exp(np.nanmin(np.append(exponents, 0.0))))
        delta = min(1.0 if pld is _TOO_WIDE else float(pld.delta(epsilon)), rdp_delta)
        if delta < chernoff.RESOLVED_DELTA:
            delta = min(delta, chernoff.delta(self._single_steps(), epsilon))
        if live and math.isfinite(epsilon):
            # a noisy Gaussian's delta is positive at every finite epsilon: one step up rounds
            # exp's last bit up, and where a bound underflowed to 0 (6e-546 at sigma = 5,
            # epsilon = 10) gives the smallest positive float
            delta = float(np.nextafter(delta, 1.0))
        return delta

    @announces_slow_calls("pldjax.opacus.PLDAccountant.get_true_positive_rates")
    def get_true_positive_rates(self, false_positive_rates):
        """An upper bound on the membership-inference attacker's true-positive rate at each
        false-positive rate in [0, 1] after the steps taken so far (the meaning of
        dp_accounting's method of that name): see :func:`pldjax.accounting.report.
        true_positive_rates`; 1 after a step without noise or where no grid holds the
        composition. A float for a number, an array otherwise."""
        pld = self._composed()
        tpr = true_positive_rates(None if pld is _TOO_WIDE else pld, false_positive_rates)
        return float(tpr) if tpr.ndim == 0 else tpr

    def __len__(self) -> int:
        """The number of optimizer steps taken so far."""
        return sum(int(steps) for _, _, steps in self.history)

    @classmethod
    def mechanism(cls) -> str:
        return MECHANISM


def register() -> None:
    """Make ``PrivacyEngine(accountant="pldjax")`` (and Opacus's ``get_noise_multiplier(...,
    accountant="pldjax")``) use :class:`PLDAccountant`; calling it again does nothing."""
    if _ACCOUNTANTS.get(MECHANISM) is not PLDAccountant:
        register_accountant(MECHANISM, PLDAccountant, force=True)


__all__ = ["MECHANISM", "PLDAccountant", "register"]
__dir__ = public_dir(__all__)
