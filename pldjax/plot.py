"""Figures of privacy profiles and tradeoff curves (needs matplotlib: ``pip install 'pldjax[plot]'``).

Each function takes PLDs (or ``(label, pessimistic, optimistic)`` triples, whose two estimates are
drawn as a band around the truth) and returns a matplotlib Figure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pldjax.core.namespace import public_dir
from pldjax.core.pld import PLD


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("pldjax.plot needs matplotlib: pip install 'pldjax[plot]'") from err
    return plt


def _entries(curves) -> list[tuple[str, PLD, PLD | None]]:
    """Normalize PLDs / (label, upper) / (label, upper, lower) into (label, upper, lower)."""
    if isinstance(curves, PLD):
        curves = [curves]
    entries = []
    for i, item in enumerate(curves):
        if isinstance(item, PLD):
            entries.append((f"PLD {i}", item, None))
        elif len(item) == 2:
            entries.append((item[0], item[1], None))
        elif len(item) == 3:
            entries.append((item[0], item[1], item[2]))
        else:
            raise ValueError(f"curves[{i}] must be a PLD, (label, pld) or (label, pessimistic, optimistic)")
    return entries


#: delta below this is round-off of the grid's sums (a curve read there is a plateau of noise,
#: then a cliff to 0): :func:`profile` leaves it out on a log axis.
_RESOLVED_DELTA = 1e-15


def _draw(ax, x, entries, evaluate, floor=None):
    """Each entry's upper curve, and the band down to its lower one (labelled once)."""
    for label, upper, lower in entries:
        top = np.asarray(evaluate(upper), np.float64)
        if floor is not None:
            top = np.where(top >= floor, top, np.nan)
        (line,) = ax.plot(x, top, label=f"{label} (pessimistic)" if lower is not None else label)
        if lower is not None:
            bottom = np.asarray(evaluate(lower), np.float64)
            if floor is not None:
                bottom = np.where(bottom >= floor, bottom, np.nan)
            ax.fill_between(x, bottom, top, color=line.get_color(), alpha=0.25, linewidth=0,
                            label=f"{label}: to the optimistic bound")


def _figure(plt, ax, size):
    """A new figure laid out so that its labels fit a default ``savefig``, or ``ax``'s."""
    if ax is not None:
        return ax.figure, ax
    return plt.subplots(figsize=size, layout="constrained")


def profile(curves, *, epsilons: Sequence[float] | None = None, log: bool = True, ax=None):
    """delta(eps) of each PLD (a band between pessimistic and optimistic estimates when given).

    ``epsilons``: where to evaluate (nats, >= 0; default 0..10); ``log``: logarithmic delta axis,
    on which values below 1e-15 (the grid's round-off) are left out.

    Args:
      curves: a PLD, or a sequence of PLDs, ``(label, pld)`` pairs and ``(label, pessimistic,
        optimistic)`` triples (a band is drawn between a triple's two PLDs).
      epsilons: a sequence of epsilons in nats, each >= 0 (inf allowed); None (default) means 201
        points from 0 to 10.
      log: True (default) for a logarithmic delta axis, False for a linear one.
      ax: a matplotlib Axes to draw on; None (default) draws on a new figure.

    Returns:
      The matplotlib Figure (that of ``ax`` when given).
    """
    plt = _pyplot()
    x = np.linspace(0.0, 10.0, 201) if epsilons is None else np.asarray(epsilons, np.float64)
    fig, ax = _figure(plt, ax, (5, 3.5))
    _draw(ax, x, _entries(curves), lambda pld: pld.delta(x), _RESOLVED_DELTA if log else None)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(r"$\varepsilon$ (nats)")
    ax.set_ylabel(r"$\delta(\varepsilon)$")
    ax.legend(fontsize="small")
    return fig


def tradeoff(curves, *, alphas: Sequence[float] | None = None, ax=None):
    """The f-DP tradeoff curves beta(alpha) (a pessimistic PLD's curve is the lower one).

    Args:
      curves: a PLD, or a sequence of PLDs, ``(label, pld)`` pairs and ``(label, pessimistic,
        optimistic)`` triples (a band is drawn between a triple's two PLDs).
      alphas: a sequence of type I errors, each in [0, 1]; None (default) means 401 points from 0
        to 1.
      ax: a matplotlib Axes to draw on; None (default) draws on a new figure.

    Returns:
      The matplotlib Figure (that of ``ax`` when given).
    """
    plt = _pyplot()
    x = np.linspace(0.0, 1.0, 401) if alphas is None else np.asarray(alphas, np.float64)
    fig, ax = _figure(plt, ax, (4.2, 4.2))
    _draw(ax, x, _entries(curves), lambda pld: pld.tradeoff(x))
    ax.plot([0, 1], [1, 0], color="0.7", linestyle=":", linewidth=1)
    ax.set_xlabel(r"type I error $\alpha$")
    ax.set_ylabel(r"type II error $\beta(\alpha)$")
    ax.set_aspect("equal")
    ax.legend(fontsize="small")
    return fig


def report(privacy_report, *, gdp_points: int = 200):
    """A :class:`~pldjax.accounting.report.PrivacyReport` as two panels: the attacker's TPR
    against its FPR on log axes (the band between the report's bounds, G_mu's curve at the
    report's upper mu, dashed, and guessing, dotted), and epsilon against delta (the band).
    ``gdp_points``: points of G_mu's curve, 1 - beta(alpha) = Phi(Phi^-1(alpha) + mu).

    Args:
      privacy_report: a :class:`~pldjax.accounting.report.PrivacyReport`, as from
        :func:`pldjax.privacy_report`.
      gdp_points: the number of points of G_mu's curve (default 200; not checked).

    Returns:
      A new matplotlib Figure with the two panels; G_mu's curve is drawn only when the report's upper
      mu is finite.
    """
    from scipy.special import ndtr, ndtri

    plt = _pyplot()
    fig, (roc, prof) = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
    fprs = privacy_report.fprs
    positive = fprs > 0
    (line,) = roc.plot(fprs[positive], privacy_report.tpr_upper[positive], marker="o",
                       markersize=3, label="upper bound (pessimistic)")
    roc.fill_between(fprs[positive], privacy_report.tpr_lower[positive],
                     privacy_report.tpr_upper[positive], color=line.get_color(), alpha=0.25,
                     linewidth=0, label="to the lower bound (optimistic)")
    alphas = np.geomspace(np.min(fprs[positive]), 1.0, gdp_points)
    mu = privacy_report.gdp_mu_upper
    if np.isfinite(mu):
        roc.plot(alphas, ndtr(ndtri(alphas) + mu), linestyle="--", color="0.3", linewidth=1,
                 label=rf"$G_\mu$, $\mu = {mu:.4g}$")
    roc.plot(alphas, alphas, linestyle=":", color="0.6", linewidth=1, label="guessing")
    roc.set_xscale("log")
    roc.set_yscale("log")
    roc.set_xlabel(r"attacker's false-positive rate $\alpha$")
    roc.set_ylabel(r"true-positive rate $1 - \beta(\alpha)$")
    roc.legend(fontsize="small")
    deltas = privacy_report.deltas
    (line,) = prof.plot(deltas, privacy_report.epsilon_upper, marker="o", markersize=3,
                        label="upper bound (pessimistic)")
    prof.fill_between(deltas, privacy_report.epsilon_lower, privacy_report.epsilon_upper,
                      color=line.get_color(), alpha=0.25, linewidth=0,
                      label="to the lower bound (optimistic)")
    prof.set_xscale("log")
    prof.set_xlabel(r"$\delta$")
    prof.set_ylabel(r"$\varepsilon(\delta)$ (nats)")
    prof.legend(fontsize="small")
    return fig


__all__ = ["profile", "report", "tradeoff"]
__dir__ = public_dir(__all__)
