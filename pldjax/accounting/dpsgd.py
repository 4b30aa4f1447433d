"""DP-SGD accounting: epsilon or delta of T steps of the Poisson-subsampled Gaussian
(:func:`dpsgd_epsilon`, :func:`dpsgd_delta`), thin wrappers of the engine's
:func:`~pldjax.accounting.engine.event_epsilon` for the event :func:`dpsgd_event` builds.
"""

from __future__ import annotations

from pldjax.accounting.engine import account
from pldjax.core.grid import Grid
from pldjax.core.precision import float64
from pldjax.core.validation import check_broadcast, check_range, is_traced, refuse_traced
from pldjax.mechanisms import sampling as sampling_lib
from pldjax.mechanisms.events import Event
from pldjax.mechanisms.neighboring import Neighboring
from pldjax.mechanisms.noise import Gaussian


def dpsgd_event(noise_multiplier, sampling_prob, neighboring: Neighboring | str = "add_remove"
                ) -> Event:
    """The event of one DP-SGD step: the Gaussian with noise multiplier ``noise_multiplier`` > 0
    (noise standard deviation / clipping norm) on a Poisson sample of rate ``sampling_prob`` in
    [0, 1] (arrays allowed: a batch). Checks the arguments under these names.

    Args:
      noise_multiplier: > 0 and finite (noise standard deviation / clipping norm); an array for a
        batch.
      sampling_prob: in [0, 1]; an array for a batch (it broadcasts with ``noise_multiplier``).
      neighboring: "add_remove" (default), "replace_one" or "replace_special" (zero-out, which
        for this event is add/remove's pair), or a
        :class:`~pldjax.mechanisms.neighboring.Neighboring`.

    Returns:
      The :class:`~pldjax.mechanisms.events.Event` of the Gaussian of sensitivity 1 with sigma
      ``noise_multiplier`` under Poisson sampling of rate ``sampling_prob``. Traced arguments
      (under jit) are not checked here.
    """
    if not is_traced((noise_multiplier, sampling_prob)):
        check_range("noise_multiplier", noise_multiplier, 0.0, low_open=True)
        check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    return Event(Gaussian(noise_multiplier), sampling_lib.Poisson(sampling_prob),
                 Neighboring.parse(neighboring))


@float64
def dpsgd_epsilon(
    noise_multiplier,
    sampling_prob,
    steps,
    delta,
    *,
    neighboring: str = "add_remove",
    pessimistic: bool = True,
    grid: Grid | None = None,
    progress: bool = False,
    rtol: float | None = None,
):
    """Smallest epsilon such that ``steps`` DP-SGD steps are (epsilon, delta)-DP.

    Each step is the Gaussian mechanism with noise multiplier ``noise_multiplier`` (noise standard
    deviation / clipping norm) on a Poisson sample of rate ``sampling_prob``
    (:func:`event_epsilon` of :func:`dpsgd_event`). All four arguments broadcast; the result has
    their broadcast shape (a float for scalars). Pessimistic: an upper bound on the true epsilon
    (both adjacency directions, the worse reported). At ``sampling_prob`` 1 (full-batch steps)
    the steps compose to Gaussian DP with mu = sqrt(steps) / noise_multiplier (twice that under
    replace-one), read from its closed form on no grid (``grid`` and ``rtol`` do not apply).

    Args:
      noise_multiplier: > 0.
      sampling_prob: in [0, 1] (0: nothing is learned, epsilon 0).
      steps: whole number of steps >= 0.
      delta: in [0, 1].
      neighboring: "add_remove" (default) or "replace_one" ("replace_special", zero-out, is also
        accepted and accounted as add/remove).
      pessimistic: False for the optimistic (lower-bound) estimate.
      grid: optional mechanism :class:`Grid` (a finer step is tighter and slower); None
        (default): the automatic grid.
      progress: print a progress bar to stderr.
      rtol: target relative accuracy of epsilon, in (0, 1]; the grid step follows from it (the
        discretization error of a T-fold composition grows like T step^2). None (default): the
        automatic grid (about 1e-5 relative here). For example 1e-2 (several times faster), or
        5e-2 for hyperparameter searches. Whatever rtol, the pessimistic value stays an upper
        bound; rtol sets how close to the truth it aims to be (a target, not a guarantee). The
        step is never finer than the finest on which one step's loss window fits the largest
        mechanism grid (grid.MAX_MECHANISM_SIZE points); where rtol asks for a finer one (a
        tiny sampling probability, or a very small rtol) it is not met. The optimistic value
        (``pessimistic=False``) stays a lower bound but can be far below the truth, even 0, on
        a step coarser than -log(1 - q), which a coarse rtol can pick (see the README). A
        scalar, and not together with a ``grid`` that sets a step.

    Returns:
      Epsilon in nats, a float for scalar arguments, else a NumPy float64 array of their
      broadcast shape. Pessimistic by default (an upper bound on the true epsilon, the worse
      direction), optimistic (a lower bound) with ``pessimistic=False``. 0 where ``steps`` or
      ``sampling_prob`` is 0; inf where no finite epsilon is certified at ``delta``; never NaN (a
      failed computation reports inf, or 0 when optimistic).
    """
    refuse_traced("dpsgd_epsilon", (noise_multiplier, sampling_prob, steps, delta), _INSIDE_JIT)
    check_broadcast(noise_multiplier=noise_multiplier, sampling_prob=sampling_prob, steps=steps,
                    delta=delta)
    return account(dpsgd_event(noise_multiplier, sampling_prob, neighboring), steps, delta,
                    "delta", pessimistic=pessimistic, grid=grid, evaluate="epsilon",
                    progress=progress, rtol=rtol, function="dpsgd_epsilon")


@float64
def dpsgd_delta(
    noise_multiplier,
    sampling_prob,
    steps,
    epsilon,
    *,
    neighboring: str = "add_remove",
    pessimistic: bool = True,
    grid: Grid | None = None,
    progress: bool = False,
    rtol: float | None = None,
):
    """Smallest delta such that ``steps`` DP-SGD steps are (epsilon, delta)-DP (``epsilon`` >= 0).

    Same conventions as :func:`dpsgd_epsilon`; pessimistic (an upper bound) by default.
    ``rtol``: the grid's target accuracy, as an epsilon-equivalent (the step for which epsilon
    would be accurate to rtol relative near ``epsilon``).

    Args:
      noise_multiplier: > 0.
      sampling_prob: in [0, 1] (0: nothing is learned, delta 0).
      steps: whole number of steps >= 0.
      epsilon: in nats, >= 0 (inf allowed).
      neighboring: "add_remove" (default) or "replace_one" ("replace_special", zero-out, is also
        accepted and accounted as add/remove).
      pessimistic: False for the optimistic (lower-bound) estimate.
      grid: optional mechanism :class:`Grid` (a finer step is tighter and slower); None
        (default): the automatic grid.
      progress: print a progress bar to stderr.
      rtol: in (0, 1], a scalar, as described above; None (default): the automatic grid. Not
        together with a ``grid`` that sets a step.

    Returns:
      Delta in [0, 1], a float for scalar arguments, else a NumPy float64 array of their
      broadcast shape. Pessimistic by default (an upper bound on the true delta, the worse
      direction), optimistic (a lower bound) with ``pessimistic=False``. 0 where ``steps`` or
      ``sampling_prob`` is 0; never NaN (a failed computation reports 1, or 0 when optimistic).
    """
    refuse_traced("dpsgd_delta", (noise_multiplier, sampling_prob, steps, epsilon), _INSIDE_JIT)
    check_broadcast(noise_multiplier=noise_multiplier, sampling_prob=sampling_prob, steps=steps,
                    epsilon=epsilon)
    return account(dpsgd_event(noise_multiplier, sampling_prob, neighboring), steps, epsilon,
                    "epsilon", pessimistic=pessimistic, grid=grid, evaluate="delta",
                    progress=progress, rtol=rtol, function="dpsgd_delta")


_INSIDE_JIT = ("inside jit, build the PLD with pj.gaussian(..., grid=pj.Grid(size=...)) and "
               "self_compose(size=...)")

