"""The PLD of a run whose mechanism changes (:func:`compose_schedule`): segments of (event,
steps), each composed in one FFT power, then composed with each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from pldjax.accounting.dpsgd import dpsgd_event
from pldjax.accounting.planner import (
    accuracy_step,
    check_rtol,
    covering_steps,
    gaussian_poisson_parameters,
    half_widths_nats,
    loss_spread,
    rtol_remedy,
    spends,
)
from pldjax.core.grid import Grid
from pldjax.core.notice import announces_slow_calls
from pldjax.core.pld import PLD
from pldjax.core.precision import float64
from pldjax.core.validation import check_count, check_range, refuse_traced
from pldjax.kernels.compose import (
    CompositionTooWide,
    compose,
)
from pldjax.mechanisms.events import Event
from pldjax.mechanisms.named import identity
from pldjax.mechanisms.neighboring import Neighboring


@announces_slow_calls("pldjax.compose_schedule")
@float64
def compose_schedule(
    segments: Sequence[tuple[float, float, int] | tuple[Event, int]],
    *,
    neighboring: str = "add_remove",
    pessimistic: bool = True,
    grid: Grid | None = None,
    rtol: float | None = None,
) -> PLD:
    """The PLD of a run whose mechanism changes: segments (event, steps), or (sigma, q, steps)
    for DP-SGD steps (:func:`dpsgd_event` under ``neighboring``; an event carries its own).

    Each segment is ``steps`` runs of its event (scalar parameters) composed in one FFT power;
    the segments are then composed by FFT convolution (:func:`pldjax.kernels.compose.compose`, which
    aligns their grids on the safe side: exactly onto the finest step when the automatic
    power-of-two steps allow it within grid.MAX_SIZE, otherwise onto the coarsest,
    pessimistically or optimistically as the PLDs are). Both adjacency directions are kept.
    Returns a :class:`~pldjax.core.pld.PLD`: read ``.epsilon(delta)`` or ``.delta(epsilon)`` from it.
    ``rtol``: target relative accuracy of the epsilons read from it, as in :func:`dpsgd_epsilon`
    (one step for every segment, from their total count and the composed loss's spread; the
    Gaussian's closed form, so every segment must be a Gaussian event, else a ValueError).

    Args:
      segments: a non-empty sequence of (event, steps) pairs, each event an
        :class:`~pldjax.mechanisms.events.Event` with scalar parameters, or of (noise_multiplier,
        sampling_prob, steps) triples for DP-SGD steps (noise_multiplier > 0 and finite,
        sampling_prob in [0, 1]); steps a whole number >= 0. Segments of zero steps, or of an
        event with sampling probability 0, add nothing.
      neighboring: the relation of the (noise_multiplier, sampling_prob, steps) triples:
        "add_remove" (default), "replace_one" or "replace_special"; an event carries its own.
      pessimistic: True (default) for the pessimistic PLD, False for the optimistic one.
      grid: optional mechanism :class:`Grid`, used for every segment; None (default): each
        segment's automatic grid.
      rtol: target relative accuracy, in (0, 1] and a scalar, as described above; None
        (default): no target. Not together with a ``grid`` that sets a step.

    Returns:
      A :class:`~pldjax.core.pld.PLD` of the whole run with both adjacency directions,
      pessimistic (the epsilon and delta read from it are upper bounds on the truth) by default,
      optimistic (lower bounds) with ``pessimistic=False``; the identity where no segment adds
      anything.
    """
    try:
        segments = list(segments)
    except TypeError:
        raise ValueError(f"segments must be a sequence of (event, steps) or (noise_multiplier, "
                         f"sampling_prob, steps), got {segments!r}") from None
    refuse_traced("compose_schedule", segments, "inside jit, build each segment's PLD with "
                  "grid=pj.Grid(size=...), self_compose(size=...) and pj.compose them")
    if not segments:
        raise ValueError("segments must hold at least one (event, steps) or (noise_multiplier, "
                         "sampling_prob, steps)")
    check_rtol(rtol, grid)
    parts, checked = [], []
    for i, segment in enumerate(segments):
        if not isinstance(segment, tuple | list):
            raise ValueError(f"segments[{i}] must be (event, steps) or (noise_multiplier, "
                             f"sampling_prob, steps), got {segment!r}")
        if len(segment) == 2 and isinstance(segment[0], Event):
            event, steps = segment
            params = (event.directions(pessimistic).params
                      if getattr(event.sampling, "one_mechanism", True) else jax.tree.leaves(event))
            if any(np.size(p) != 1 for p in params):
                raise ValueError(f"segments[{i}]: the event's parameters must be scalars (one "
                                 f"segment, one mechanism), got {event!r}")
        elif len(segment) == 3:
            sigma, q, steps = segment
            for name, value in (("noise_multiplier", sigma), ("sampling_prob", q)):
                if np.ndim(value) != 0:
                    raise ValueError(f"segments[{i}] {name} must be a single number (one "
                                     f"segment, one mechanism), got shape {np.shape(value)}")
            check_range(f"segments[{i}] noise_multiplier", sigma, 0.0, low_open=True)
            check_range(f"segments[{i}] sampling_prob", q, 0.0, 1.0)
            event = dpsgd_event(float(sigma), float(q), neighboring)
        else:
            raise ValueError(f"segments[{i}] must be (event, steps) or (noise_multiplier, "
                             f"sampling_prob, steps), got {segment!r}")
        steps = check_count(f"segments[{i}] steps", steps)
        if steps > 0 and spends(event, ()).item():
            checked.append((event, steps))
    if rtol is not None and checked:
        sigma, q, steps = [], [], []
        for i, (event, count) in enumerate(checked):
            closed_form = gaussian_poisson_parameters(event, ())
            if closed_form is None:
                raise ValueError(f"rtol needs every segment to be a Gaussian event (without "
                                 f"sampling or Poisson-subsampled), segments[{i}] is not; pass "
                                 f"grid=pj.Grid(step=...) instead")
            replace = event.neighboring == Neighboring.REPLACE_ONE
            sigma.append(closed_form[0].item() / (2 if replace else 1))
            q.append(closed_form[1].item())
            steps.append(count)
        shift_sigma, q, steps = (np.array(column, np.float64) for column in (sigma, q, steps))
        spread = loss_spread(shift_sigma, q)
        # no delta here: a Gaussian-like composed loss read at delta about 1e-5 (z = 4.8)
        sd = np.sqrt(np.sum(steps * spread**2))
        count = np.sum(steps)
        step = accuracy_step(float(rtol), count, sd**2 / 2 + 4.8 * sd, sd / np.sqrt(count), 4.8)
        half_widths = np.concatenate([half_widths_nats(*event.directions(pessimistic), None)()
                                      for event, _ in checked])
        step = max(float(step), float(np.max(covering_steps(half_widths))))
        grid = dataclasses.replace(grid or Grid(), step=step)
    for i, (event, steps) in enumerate(checked):
        try:
            parts.append(event.pld(pessimistic=pessimistic, grid=grid).self_compose(steps))
        except CompositionTooWide as error:
            if rtol is None:
                raise
            raise CompositionTooWide(f"{rtol_remedy(rtol, grid.step)}, for segments[{i}] ({error})"
                                     ) from error
    if not parts:
        return identity(pessimistic=pessimistic)
    return compose(parts) if len(parts) > 1 else parts[0]

