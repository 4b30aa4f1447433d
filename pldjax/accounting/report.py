"""Privacy reports: the numbers a privacy review reads, each as a bracket.

A report reads a mechanism's pessimistic PLD (every value an upper bound on the truth: what may
be claimed) and its optimistic PLD (every value a lower bound: how much the claim could still
tighten), and gives both for

* epsilon at a grid of deltas and delta at a grid of epsilons (the privacy profile);
* the membership-inference attacker's true-positive rate at a grid of false-positive rates,
  TPR = 1 - beta(FPR), beta the f-DP tradeoff curve (the worse direction of the neighbouring
  relation; Dong, Roth and Su's f-DP). Where the run is known to be one mechanism (one event
  run once, or Gaussian events without sampling) the TPR is also read from that mechanism's exact
  loss tails (:func:`~pldjax.kernels.divergences.tradeoff_from_tails`, a bracket 2e-12 wide),
  and the tighter of each bound is reported;
* the Gaussian-DP mu: the smallest mu with the mechanism mu-GDP (up to the pessimistic PLD's
  atom at +inf and 1e-14 of round-off, reported as ``gdp_delta``), and a mu it provably needs at
  least;
* Rényi divergences at standard orders (Rényi DP). A pessimistic PLD's atom at +inf makes its
  own infinite; where the run is known (an event, an accountant state, a dp_accounting ledger of
  events) the report also sums each event's bound: the closed form for Gaussian events (with or
  without Poisson sampling; Mironov, Talwar and Zhang's), the event's own PLD's otherwise.

``privacy_report(pld, optimistic)`` takes the two PLDs; ``privacy_report(event, count=T)`` builds
them for T runs of a :class:`~pldjax.mechanisms.events.Event`, ``privacy_report(state)`` for the
run a :mod:`pldjax.accountant` state recorded, ``privacy_report(accountant)`` for the ledger of a
``pj.dp_accounting.PLDAccountant``. Without an optimistic PLD the lower bounds are the trivial
ones (0, and TPR = FPR).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from pldjax.accounting import accountant
from pldjax.accounting.planner import event_renyi_bound
from pldjax.core.grid import Grid
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD
from pldjax.core.precision import six_digits
from pldjax.core.validation import check_count, check_range
from pldjax.kernels import chernoff
from pldjax.kernels.divergences import tradeoff_from_tails
from pldjax.kernels.dominance import ROUNDOFF
from pldjax.kernels.gaussian_dp import gdp_mu, gdp_mu_below
from pldjax.mechanisms.events import Event
from pldjax.mechanisms.noise import GAUSSIAN
from pldjax.mechanisms.subsampling import ADD, REMOVE

DELTAS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8, 1e-10)
EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
FPRS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5)
ORDERS = (1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
#: Deltas at which the optimistic profile is read for the GDP lower bound (one point each).
_GDP_DELTAS = np.geomspace(0.5, 1e-12, 45)
#: The largest GDP mu searched for the upper bound (a mechanism beyond it reads inf).
_GDP_MU_MAX = 1e4


@dataclasses.dataclass(frozen=True)
class PrivacyReport:
    """A mechanism's privacy in the terms reviewers use, as brackets [lower, upper] around the
    truth (see the module). Arrays are NumPy float64; nats throughout."""

    deltas: np.ndarray
    epsilon_upper: np.ndarray  # pessimistic epsilon at each delta
    epsilon_lower: np.ndarray  # optimistic
    epsilons: np.ndarray
    delta_upper: np.ndarray  # pessimistic delta at each epsilon
    delta_lower: np.ndarray
    fprs: np.ndarray
    tpr_upper: np.ndarray  # the attacker's best TPR at each FPR is at most this
    tpr_lower: np.ndarray  # and at least this
    gdp_mu_upper: float  # the mechanism is mu-GDP up to gdp_delta (inf: beyond _GDP_MU_MAX)
    gdp_delta: float  # the pessimistic PLD's atom at +inf and 1e-14 of round-off, beside G_mu
    gdp_mu_lower: float  # every mu-GDP guarantee of the mechanism has mu at least this
    orders: np.ndarray
    renyi_upper: np.ndarray  # Rényi divergence (the RDP epsilon) at each order
    renyi_lower: np.ndarray
    assumptions: Mapping[str, object]  # what the numbers are of (mechanism, sampling, steps...)

    def to_dict(self) -> dict:
        """Plain Python values (lists of floats; infinities as the strings "inf" and "-inf", so
        that the result is strict JSON)."""
        def plain(value):
            if isinstance(value, np.ndarray):
                return [plain(v) for v in value.tolist()]
            if isinstance(value, float) and not math.isfinite(value):
                return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
            if isinstance(value, Mapping):
                return {str(k): plain(v) for k, v in value.items()}
            return value

        return {field.name: plain(getattr(self, field.name)) for field in dataclasses.fields(self)}

    def to_json(self, **dumps_options) -> str:
        """:meth:`to_dict` as JSON text (``dumps_options`` go to :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), allow_nan=False, **dumps_options)

    def to_markdown(self) -> str:
        """The report as Markdown: what it is of, then one table per measure (bounds to six
        digits, each rounded to its safe side)."""
        lines = ["# Privacy report", ""]
        lines += [f"- {key}: {value}" for key, value in self.assumptions.items()]
        lines += ["", "Every value is bracketed: the truth lies between lower (optimistic PLD) and "
                  "upper (pessimistic PLD).", ""]
        lines += _table(("delta", "epsilon lower", "epsilon upper"),
                        (self.deltas, self.epsilon_lower, self.epsilon_upper))
        lines += _table(("epsilon", "delta lower", "delta upper"),
                        (self.epsilons, self.delta_lower, self.delta_upper))
        lines += _table(("attacker FPR", "TPR lower", "TPR upper"),
                        (self.fprs, self.tpr_lower, self.tpr_upper))
        lines += _table(("Rényi order", "RDP epsilon lower", "RDP epsilon upper"),
                        (self.orders, self.renyi_lower, self.renyi_upper))
        lines += [f"Gaussian DP: mu in [{six_digits(self.gdp_mu_lower, up=False)}, "
                  f"{six_digits(self.gdp_mu_upper, up=True)}] (the upper bound holds up to delta "
                  f"{six_digits(self.gdp_delta, up=True)})", ""]
        return "\n".join(lines)


def _number(value: float) -> str:
    return f"{value:.6g}"


def _table(header: Sequence[str], columns: Sequence[np.ndarray]) -> list[str]:
    """A Markdown table of (grid, lower bounds, upper bounds), each bound printed to six digits
    rounded to its safe side (down, up)."""
    grid, lower, upper = columns
    rows = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    rows += [f"| {_number(float(g))} | {six_digits(float(lo), up=False)} | "
             f"{six_digits(float(hi), up=True)} |" for g, lo, hi in zip(grid, lower, upper,
                                                                        strict=True)]
    return rows + [""]


def true_positive_rates(pld: PLD | None, false_positive_rates) -> np.ndarray:
    """The membership-inference attacker's best true-positive rate at each false-positive rate
    (in [0, 1]): 1 - beta(FPR) on ``pld``'s tradeoff curve, the worse direction; an upper bound
    for a pessimistic PLD, a lower bound for an optimistic one. None (no PLD: not private, or no
    grid holds it) reads 1."""
    fprs = np.asarray(false_positive_rates, np.float64)
    check_range("false_positive_rates", fprs, 0.0, 1.0)
    if pld is None:
        return np.ones_like(fprs)
    return 1.0 - np.asarray(pld.tradeoff(fprs), np.float64)


def _one_mechanism(run, pessimistic: bool):
    """(mechanism, params) of a run of (event, count) pairs that is one mechanism, as
    :func:`~pldjax.kernels.divergences.tradeoff_from_tails` takes them: one event run once whose
    sampling scheme is one mechanism, or Gaussian events without sampling in any numbers (they
    compose to the Gaussian of mu = sqrt(sum count mu_i^2)). None for any other run."""
    described = [(event.directions(pessimistic), count) for event, count in run
                 if event.sampling is None or event.sampling.one_mechanism]
    if len(described) != len(run) or not described:
        return None
    params = [tuple(np.asarray(p, np.float64).reshape(-1) for p in directions.params)
              for directions, _ in described]
    if any(p.size != 1 for row in params for p in row):
        return None
    if all(d.mechanism is GAUSSIAN and not d.both for d, _ in described):
        mu = math.sqrt(sum(count * float(row[0][0]) ** 2
                           for (_, count), row in zip(described, params, strict=True)))
        return GAUSSIAN, (np.array([mu]),)
    if len(described) > 1 or described[0][1] != 1:
        return None
    (mechanism, _, both), _ = described[0]
    if not both:
        return mechanism, params[0]
    return mechanism, tuple(np.repeat(p, 2) for p in params[0]) + (np.array([REMOVE, ADD]),)


def _tpr_from_tails(run, fprs: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(lower, upper) bounds on the attacker's TPR at ``fprs`` read from the exact loss tails of
    a run that is one mechanism (see :func:`_one_mechanism`): within 1e-12 of the truth,
    whatever the grid. None for any other run."""
    pessimistic, optimistic = _one_mechanism(run, True), _one_mechanism(run, False)
    if pessimistic is None or optimistic is None:
        return None
    beta_lower, _ = tradeoff_from_tails(*pessimistic, fprs)
    _, beta_upper = tradeoff_from_tails(*optimistic, fprs)
    return 1.0 - beta_upper, 1.0 - beta_lower


def _describe(record) -> str:
    """A noise or sampling record as its name and numbers, e.g. "Poisson(sampling_prob=0.01)"."""
    if not dataclasses.is_dataclass(record):
        return repr(record)
    parts = []
    for field in dataclasses.fields(record):
        value = np.asarray(getattr(record, field.name))
        parts.append(f"{field.name}={value.tolist() if value.ndim else value.item()}")
    return f"{type(record).__name__}({', '.join(parts)})"


def _grid(name: str, values, low: float, high: float, **bounds) -> np.ndarray:
    values = np.atleast_1d(np.asarray(values, np.float64))
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {values.shape}")
    check_range(name, values, low, high, **bounds)
    return values


def _run_description(run) -> dict:
    """What a report of (event, count) pairs assumed."""
    return {"events": "; ".join(f"{_describe(e.noise)}, {_describe(e.sampling)}, "
                                f"{e.neighboring.value} x {steps}" for e, steps in run),
            "runs": sum(steps for _, steps in run)}


def _run_renyi(run, orders: np.ndarray) -> np.ndarray:
    """An upper bound on the Renyi divergence of a run of (event, count) pairs at ``orders``:
    the sum of count times each event's bound (Renyi divergences add under composition, each
    direction's; the larger direction of each event bounds the sum's). An event's bound is its
    closed form (:func:`~pldjax.accounting.planner.event_renyi_bound`) or, where that has none,
    its own pessimistic PLD's divergence."""
    total = np.zeros(orders.shape)
    for event, count in run:
        bound = event_renyi_bound(event, orders)
        if not np.all(np.isfinite(bound)):
            bound = np.minimum(bound, np.asarray(event.pld().renyi(orders), np.float64))
        total = total + count * bound
    return total


def _is_dp_accounting_ledger(mechanism) -> bool:
    """Whether ``mechanism`` is a ``pj.dp_accounting.PLDAccountant`` (without importing the
    adapter, and dp_accounting, when it was never used)."""
    adapter = sys.modules.get("pldjax.integrations.dp_accounting_adapter")
    return adapter is not None and isinstance(mechanism, adapter.PLDAccountant)


@announces_slow_calls("pldjax.privacy_report")
def privacy_report(mechanism: PLD | Event | accountant.AccountantState,
                   optimistic: PLD | None = None, *,
                   count: int | None = None, grid: Grid | None = None,
                   deltas: Sequence[float] = DELTAS, epsilons: Sequence[float] = EPSILONS,
                   fprs: Sequence[float] = FPRS, orders: Sequence[float] = ORDERS,
                   assumptions: Mapping[str, object] | None = None) -> PrivacyReport:
    """The :class:`PrivacyReport` of a mechanism.

    Args:
      mechanism: its pessimistic PLD (one, not a batch), an
        :class:`~pldjax.mechanisms.events.Event` run ``count`` times (both PLDs are then built
        on ``grid``, automatic by default, and composed), a :mod:`pldjax.accountant` state
        (the run it recorded, both PLDs), or a ``pj.dp_accounting.PLDAccountant`` (its ledger:
        both PLDs where it holds events only, else the pessimistic one).
      optimistic: its optimistic PLD, for the lower bounds (built for an event). Only with a
        PLD ``mechanism``; None (default) there: the trivial lower bounds (0, and TPR = FPR).
      count: the number of runs of an event (>= 1); only with an event, which needs it.
      grid: the mechanism :class:`~pldjax.core.grid.Grid` both PLDs of an event are built on;
        only with an event; None (default): automatic.
      deltas: where the privacy profile's epsilon is read, a non-empty 1-D sequence of deltas in
        [0, 1]; default ``DELTAS``.
      epsilons: where the privacy profile's delta is read, a non-empty 1-D sequence of epsilons
        >= 0 (nats, finite); default ``EPSILONS``.
      fprs: the attacker's false-positive rates (in [0, 1]); a non-empty 1-D sequence, default
        ``FPRS``.
      orders: Rényi orders (> 0, finite); a non-empty 1-D sequence, default ``ORDERS``.
      assumptions: what the report is of (added to what an event describes itself, its entries
        taking precedence); None (default): only that description.

    Returns:
      A :class:`PrivacyReport` whose grids and bounds are NumPy float64 arrays (one value per
      grid point) and whose Gaussian-DP values are floats, each pair of bounds a bracket around
      the truth. Its upper values come from the pessimistic PLD (upper bounds: what may be
      claimed), its lower values from the optimistic one (lower bounds), or are the trivial
      lower bounds without one.
    """
    described = {} if assumptions is None else dict(assumptions)
    run = None  # the (event, count) pairs composed, where known
    if isinstance(mechanism, accountant.AccountantState):
        if optimistic is not None or count is not None or grid is not None:
            raise ValueError("an accountant state's report reads its own run: pass no "
                             "optimistic, count or grid")
        run = accountant.events(mechanism)
        described = {**_run_description(run), **described}
        pessimistic = accountant.pld(mechanism)
        optimistic = accountant.pld(mechanism, pessimistic=False)
    elif _is_dp_accounting_ledger(mechanism):
        if optimistic is not None or count is not None or grid is not None:
            raise ValueError("a dp_accounting accountant's report reads its own ledger: pass no "
                             "optimistic, count or grid")
        run = mechanism.events()
        described = {**({} if run is None else _run_description(run)), **described}
        pessimistic = mechanism.pld()
        optimistic = None if run is None else mechanism.pld(pessimistic=False)
    elif isinstance(mechanism, Event):
        if optimistic is not None:
            raise ValueError("an event's report builds its own optimistic PLD: pass no optimistic")
        count = check_count("count", count, minimum=1)
        run = [(mechanism, count)]
        described = {"mechanism": _describe(mechanism.noise),
                     "sampling": _describe(mechanism.sampling),
                     "neighboring": str(mechanism.neighboring.value), "runs": count,
                     **described}
        pessimistic = mechanism.pld(grid=grid).self_compose(count)
        optimistic = mechanism.pld(pessimistic=False, grid=grid).self_compose(count)
    elif isinstance(mechanism, PLD):
        if count is not None or grid is not None:
            raise ValueError("count and grid are for an event: a PLD's report reads it as given")
        pessimistic = mechanism
    else:
        raise TypeError("mechanism must be a PLD, an Event, an accountant state or a "
                        f"pj.dp_accounting.PLDAccountant, got {type(mechanism).__name__}")
    if not pessimistic.pessimistic:
        raise ValueError("mechanism must be a pessimistic PLD (its values are the upper bounds)")
    if optimistic is not None and optimistic.pessimistic:
        raise ValueError("optimistic must be an optimistic PLD (pessimistic=False)")
    for name, pld in (("mechanism", pessimistic), ("optimistic", optimistic)):
        if pld is not None and pld.batch_shape:
            raise ValueError(f"{name} must be one PLD, got batch shape {pld.batch_shape}: "
                             "report each element on its own")
    deltas = _grid("deltas", deltas, 0.0, 1.0)
    epsilons = _grid("epsilons", epsilons, 0.0, np.inf)
    fprs = _grid("fprs", fprs, 0.0, 1.0)
    orders = _grid("orders", orders, 0.0, np.inf, low_open=True)

    # the pessimistic PLD's atom at +inf makes its Renyi divergences inf: the run's, summed
    closed_form_renyi = np.full(orders.shape, np.inf) if run is None else _run_renyi(run, orders)

    def read(pld: PLD, method: str, points: np.ndarray) -> np.ndarray:
        return np.asarray(getattr(pld, method)(points), np.float64)

    atom = max(float(np.max(np.asarray(d.inf_mass))) for d in pessimistic.directions())
    upper = dict(epsilon=read(pessimistic, "epsilon", deltas),
                 delta=read(pessimistic, "delta", epsilons),
                 tpr=true_positive_rates(pessimistic, fprs),
                 renyi=np.minimum(read(pessimistic, "renyi", orders), closed_form_renyi),
                 mu=float(gdp_mu(pessimistic, delta_slack=atom, mu_max=_GDP_MU_MAX)))
    gdp_delta = atom + ROUNDOFF  # what gdp_mu certifies beside G_mu
    if optimistic is None:
        lower = dict(epsilon=np.zeros_like(deltas), delta=np.zeros_like(epsilons), tpr=fprs.copy(),
                     renyi=np.zeros_like(orders), mu=0.0)
    else:
        profile = read(optimistic, "epsilon", _GDP_DELTAS)
        lower = dict(epsilon=read(optimistic, "epsilon", deltas),
                     delta=read(optimistic, "delta", epsilons),
                     tpr=true_positive_rates(optimistic, fprs),
                     renyi=read(optimistic, "renyi", orders),
                     mu=gdp_mu_below(optimistic, profile[np.isfinite(profile) & (profile >= 0)]))
    if run is not None and np.any(deltas == 0):
        # pure DP: the runs' largest losses add up, where the composed PLD's window may have
        # cut them off to its atom at +inf
        def pure(pessimistic: bool) -> float:
            return chernoff.pure_epsilon([(event.pld(pessimistic=pessimistic, grid=grid), steps)
                                          for event, steps in run], pessimistic=pessimistic)

        upper["epsilon"] = np.where(deltas == 0, np.minimum(upper["epsilon"], pure(True)),
                                    upper["epsilon"])
        if optimistic is not None:
            lower["epsilon"] = np.where(deltas == 0, np.maximum(lower["epsilon"], pure(False)),
                                        lower["epsilon"])
    exact = None if run is None else _tpr_from_tails(run, fprs)
    if exact is not None:  # both are bounds: the tighter of each (NaN from neither)
        lower["tpr"], upper["tpr"] = np.fmax(lower["tpr"], exact[0]), np.fmin(upper["tpr"], exact[1])
    return PrivacyReport(
        deltas=deltas, epsilon_upper=upper["epsilon"], epsilon_lower=lower["epsilon"],
        epsilons=epsilons, delta_upper=upper["delta"], delta_lower=lower["delta"],
        fprs=fprs, tpr_upper=upper["tpr"], tpr_lower=lower["tpr"],
        gdp_mu_upper=upper["mu"], gdp_delta=gdp_delta, gdp_mu_lower=lower["mu"],
        orders=orders, renyi_upper=upper["renyi"], renyi_lower=lower["renyi"],
        assumptions=described)
