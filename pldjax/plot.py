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


def _draw(ax, x, entries, evaluate):
    for label, upper, lower in entries:
        top = np.asarray(evaluate(upper))
        (line,) = ax.plot(x, top, label=label)
        if lower is not None:
            ax.fill_between(x, np.asarray(evaluate(lower)), top, color=line.get_color(), alpha=0.25,
                            linewidth=0)


def profile(curves, *, epsilons: Sequence[float] | None = None, log: bool = True, ax=None):
    """delta(eps) of each PLD (a band between pessimistic and optimistic estimates when given).

    ``epsilons``: where to evaluate (nats, >= 0; default 0..10); ``log``: logarithmic delta axis.
    """
    plt = _pyplot()
    x = np.linspace(0.0, 10.0, 201) if epsilons is None else np.asarray(epsilons, np.float64)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5, 3.5))
    _draw(ax, x, _entries(curves), lambda pld: pld.delta(x))
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("delta(epsilon)")
    ax.legend()
    return fig


def tradeoff(curves, *, alphas: Sequence[float] | None = None, ax=None):
    """The f-DP tradeoff curves beta(alpha) (a pessimistic PLD's curve is the lower one)."""
    plt = _pyplot()
    x = np.linspace(0.0, 1.0, 401) if alphas is None else np.asarray(alphas, np.float64)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(4, 4))
    _draw(ax, x, _entries(curves), lambda pld: pld.tradeoff(x))
    ax.plot([0, 1], [1, 0], color="0.7", linestyle=":", linewidth=1)
    ax.set_xlabel("type I error alpha")
    ax.set_ylabel("type II error beta")
    ax.set_aspect("equal")
    ax.legend()
    return fig


__all__ = ["profile", "tradeoff"]
__dir__ = public_dir(__all__)
