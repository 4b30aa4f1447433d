"""Mechanisms and their PLDs, discretized by connect-the-dots on an automatic grid.

Each mechanism is described by pure functions of its parameters: the log-survival functions of its
privacy loss under P and Q (which give the hockey-stick curve exactly), the spread of the loss (which
sets the step), and the window's centre and half-width.
:func:`~pldjax.discretize.discretize_mechanism` turns these into a :class:`~pldjax.pld.PLD`,
batched over parameter arrays in one jitted, vmapped call; the parameters are data, so new values
never trigger recompilation.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import log_ndtr

from pldjax import grid as grid_lib
from pldjax import subsampling
from pldjax.discretize import Mechanism, discretize_mechanism, masses_from_curve
from pldjax.grid import Grid
from pldjax.pld import PLD
from pldjax.precision import float64
from pldjax.validate import check_range


def _gaussian_tails(params, eps):
    (mu,) = params
    pos = mu > 0
    safe = jnp.where(pos, mu, 1.0)
    sf = jnp.where(eps < 0, 0.0, -jnp.inf)  # mu = 0: the loss is 0 with certainty
    cdf = jnp.where(eps < 0, -jnp.inf, 0.0)
    return (
        jnp.where(pos, log_ndtr(safe / 2 - eps / safe), sf),
        jnp.where(pos, log_ndtr(-safe / 2 - eps / safe), sf),
        jnp.where(pos, log_ndtr(eps / safe - safe / 2), cdf),
        jnp.where(pos, log_ndtr(eps / safe + safe / 2), cdf),
    )


def _positive_or_one(x):
    return jnp.where(x > 0, x, 1.0)


GAUSSIAN = Mechanism(
    tails=_gaussian_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=lambda p: p[0] ** 2 / 2,
    half_width=lambda p: 10.0 * _positive_or_one(p[0]),
    chi2=lambda p: jnp.expm1(p[0] ** 2),
)


def _laplace_tails(params, eps):
    # P = Lap(0, b), Q = Lap(1, b), eps0 = 1/b: L = eps0 for x <= 0, eps0 (1 - 2x) on (0, 1),
    # -eps0 for x >= 1; so L > eps iff x < (1 - eps/eps0) / 2 for eps in [-eps0, eps0).
    (eps0,) = params
    inside = (eps >= -eps0) & (eps < eps0)
    below = eps < -eps0
    half = -jnp.log(2.0)
    sf = jnp.where(below, 0.0, -jnp.inf)
    cdf = jnp.where(below, -jnp.inf, 0.0)
    return (
        jnp.where(inside, jnp.log1p(-0.5 * jnp.exp(-(eps0 - eps) / 2)), sf),
        jnp.where(inside, half - (eps0 + eps) / 2, sf),
        jnp.where(inside, half - (eps0 - eps) / 2, cdf),
        jnp.where(inside, jnp.log1p(-0.5 * jnp.exp(-(eps0 + eps) / 2)), cdf),
    )


LAPLACE = Mechanism(
    tails=_laplace_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=lambda p: jnp.zeros_like(p[0]),
    half_width=lambda p: 1.01 * _positive_or_one(p[0]),
    # E_Q[(P/Q)^2] = (2/3) e^eps0 + (1/3) e^(-2 eps0), integrating over the three pieces of L
    chi2=lambda p: (2 * jnp.expm1(p[0]) + jnp.expm1(-2 * p[0])) / 3,
)


def _rr_tails(params, eps):
    e, d = params
    low = (1 - d) * jax.nn.sigmoid(-e)  # mass at loss -e under P (and at +e under Q)
    high = (1 - d) * jax.nn.sigmoid(e)  # mass at loss +e under P (and at -e under Q)
    above_low, above_high = eps < -e, eps < e
    return (
        jnp.log(d + high * above_high + low * above_low),
        jnp.log(low * above_high + high * above_low),
        jnp.log(low * ~above_low + high * ~above_high),
        jnp.log(d + high * ~above_low + low * ~above_high),
    )


RANDOMIZED_RESPONSE = Mechanism(
    tails=_rr_tails,
    spread=lambda p: _positive_or_one(p[0]),
    center=lambda p: jnp.zeros_like(p[0]),
    half_width=lambda p: 1.01 * _positive_or_one(p[0]),
    log_q_finite=lambda p: jnp.log1p(-p[1]),
)


NEIGHBORING = ("add_remove", "replace_one")
SAMPLING = ("poisson", "fixed_batch")


def _check_choice(name: str, value, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _noise_mechanism(
    base: Mechanism,
    shift,
    sampling_prob,
    neighboring: str,
    sampling: str,
    pessimistic: bool,
    grid: Grid | None,
    replace_one_subsampled: Mechanism | None,
    name: str,
) -> PLD:
    """An additive-noise mechanism whose base pair is ``base`` at loss parameter ``shift`` (output
    distributions shifted by one sensitivity), under the adjacency and sampling asked for."""
    _check_choice("neighboring", neighboring, NEIGHBORING)
    _check_choice("sampling", sampling, SAMPLING)
    replace_one = neighboring == "replace_one"
    if replace_one:
        doubled = 2 * shift  # a record's contribution goes from -sensitivity to +sensitivity
    if sampling_prob is None:
        if sampling != "poisson":
            raise ValueError("sampling='fixed_batch' needs a sampling_prob (batch size / dataset size)")
        return discretize_mechanism(base, (doubled if replace_one else shift,), grid, pessimistic)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    q = jnp.asarray(sampling_prob, jnp.float64)
    if sampling == "fixed_batch":
        if not replace_one:
            raise ValueError(
                "sampling='fixed_batch' (without replacement) has a PLD under "
                "neighboring='replace_one' only: with add/remove neighbours the dataset size, "
                "hence the batch, changes"
            )
        shift = doubled
    elif replace_one:
        if replace_one_subsampled is None:
            raise ValueError(
                f"{name}: Poisson subsampling with neighboring='replace_one' is available for the "
                "Gaussian only; use sampling='fixed_batch' or neighboring='add_remove'"
            )
        return discretize_mechanism(replace_one_subsampled, (shift, q), grid, pessimistic)
    directions = jnp.asarray([subsampling.REMOVE, subsampling.ADD])
    both = discretize_mechanism(
        subsampling.poisson(base), (shift[..., None], q[..., None], directions), grid, pessimistic
    )
    remove, add = (
        PLD(both.probs[..., i, :], both.inf_mass[..., i], both.offset[..., i], both.step[..., i],
            both.pessimistic)
        for i in (0, 1)
    )
    return PLD(remove.probs, remove.inf_mass, remove.offset, remove.step, remove.pessimistic, add)


_ADJACENCY_DOC = """
      sampling_prob: probability q in [0, 1] that a record takes part (Poisson subsampling), or the
        batch fraction for ``sampling="fixed_batch"``; None (default) for no subsampling.
      neighboring: "add_remove" (default; one record added or removed) or "replace_one" (one
        record's contribution replaced by another, both of norm at most ``sensitivity``).
      sampling: "poisson" (default) or "fixed_batch" (sampling without replacement; replace-one
        adjacency only).
      pessimistic: True for the connect-the-dots upper estimate (default), False for the
        optimistic lower estimate.
      grid: optional :class:`Grid`; automatic by default.

    With Poisson subsampling and add/remove adjacency the PLD has two directions (remove: the
    mixture against the base; add: the base against the mixture, laplace-transform-dp.txt Thm 5.1);
    every reported value is the worse of the two.
"""


@float64
def gaussian(
    sigma,
    *,
    sensitivity=1.0,
    sampling_prob=None,
    neighboring: str = "add_remove",
    sampling: str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The Gaussian mechanism N(f(x), sigma^2), optionally subsampled.

    Without subsampling and with add/remove neighbours it is G_{sensitivity/sigma}.

    Args:
      sigma: noise standard deviation, > 0 (scalar or array: a batch of PLDs; all array arguments
        broadcast).
      sensitivity: L2 sensitivity (the largest norm of one record's contribution), > 0.
    """
    check_range("sigma", sigma, 0.0, low_open=True)
    check_range("sensitivity", sensitivity, 0.0, low_open=True)
    mu = jnp.asarray(sensitivity, jnp.float64) / jnp.asarray(sigma, jnp.float64)
    return _noise_mechanism(
        GAUSSIAN, mu, sampling_prob, neighboring, sampling, pessimistic, grid,
        subsampling.GAUSSIAN_REPLACE_ONE, "gaussian",
    )


gaussian.__doc__ += _ADJACENCY_DOC


@float64
def gdp(mu, *, pessimistic: bool = True, grid: Grid | None = None) -> PLD:
    """G_mu = PLD(N(0, 1) || N(mu, 1)), the mu-GDP curve; ``mu`` >= 0 (mu = 0 is the identity)."""
    check_range("mu", mu, 0.0)
    return discretize_mechanism(GAUSSIAN, (mu,), grid, pessimistic)


@float64
def laplace(
    scale,
    *,
    sensitivity=1.0,
    sampling_prob=None,
    neighboring: str = "add_remove",
    sampling: str = "poisson",
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """The Laplace mechanism with noise scale ``scale`` > 0 and L1 sensitivity ``sensitivity`` > 0.

    Without subsampling its loss lies in [-s/b, s/b] (s = sensitivity, b = scale) and
    delta(eps) = 1 - exp((eps - s/b)/2).

    Args:
      scale: noise scale b, > 0 (scalar or array).
      sensitivity: L1 sensitivity, > 0.
    """
    check_range("scale", scale, 0.0, low_open=True)
    check_range("sensitivity", sensitivity, 0.0, low_open=True)
    eps0 = jnp.asarray(sensitivity, jnp.float64) / jnp.asarray(scale, jnp.float64)
    return _noise_mechanism(
        LAPLACE, eps0, sampling_prob, neighboring, sampling, pessimistic, grid, None, "laplace"
    )


laplace.__doc__ += _ADJACENCY_DOC


@float64
def randomized_response(
    epsilon,
    delta=0.0,
    *,
    pessimistic: bool = True,
    grid: Grid | None = None,
) -> PLD:
    """R_{epsilon,delta} (residue-filters.txt Def. 5): the PLD of an (epsilon, delta)-DP guarantee.

    Losses +epsilon and -epsilon with masses (1-delta) e^eps/(1+e^eps) and (1-delta)/(1+e^eps), and
    an atom delta at +inf. Exact when epsilon is a multiple of the grid step (e.g. dyadic epsilon on
    the automatic grid); otherwise connect-the-dots gives the pessimistic (or optimistic) estimate.
    """
    check_range("epsilon", epsilon, 0.0)
    check_range("delta", delta, 0.0, 1.0)
    return discretize_mechanism(RANDOMIZED_RESPONSE, (epsilon, delta), grid, pessimistic)


def _curve_to_pld(delta_fn, step: float, offset: int, size: int, name: str) -> PLD:
    z = (offset + np.arange(size)) * step
    curve = np.asarray(delta_fn(z), np.float64)
    if curve.shape != z.shape:
        raise ValueError(f"{name} must map an array of epsilons to an array of the same shape")
    if np.any(~np.isfinite(curve)) or np.any(curve < 0) or np.any(curve > 1):
        raise ValueError(f"{name} must return values in [0, 1]")
    x = np.exp(z - z[size // 2])
    tol = 1e-9
    if np.any(np.diff(curve) > tol) or np.any(curve < -np.expm1(z) - tol):
        raise ValueError(
            f"{name} is not a privacy curve: it must be non-increasing with delta(eps) >= 1 - e^eps"
        )
    slopes = np.diff(curve) / np.diff(x)
    if size > 2 and np.any(np.diff(slopes) < -tol * np.maximum(1.0, np.abs(slopes[1:]))):
        raise ValueError(f"{name} is not a privacy curve: it must be convex in e^eps")
    excess = curve + np.expm1(z)
    probs, inf_mass = masses_from_curve(jnp.asarray(curve), step, jnp.asarray(excess), jnp.asarray(z))
    return PLD(probs, inf_mass, jnp.asarray(offset, jnp.int64), jnp.asarray(step, jnp.float64), True)


@float64
def from_privacy_curve(
    delta: Callable,
    *,
    epsilon_min: float,
    epsilon_max: float,
    step: float,
    reverse: Callable | None = None,
) -> PLD:
    """The pessimistic PLD of any mechanism, from its hockey-stick curve(s) (connect-the-dots Alg. 1).

    Args:
      delta: vectorized function eps (NumPy array, nats) -> delta(eps) of PLD(P || Q): the exact
        privacy curve, or an upper bound on it that is itself a privacy curve (non-increasing,
        convex in e^eps, delta(eps) >= 1 - e^eps). The result's curve interpolates it at the grid
        points and lies above it in between: an upper bound, and the tightest on this grid.
      epsilon_min, epsilon_max: the loss window (nats); losses below it are moved up into its
        lowest point, and delta(epsilon_max) becomes the atom at +inf.
      step: grid spacing (nats); a power of two composes with the automatic grids.
      reverse: the curve of PLD(Q || P) when the mechanism is not symmetric (e.g. add/remove
        adjacency); the result then has both directions.
    """
    check_range("step", step, 0.0, low_open=True)
    check_range("epsilon_min", epsilon_min)
    check_range("epsilon_max", epsilon_max, float(epsilon_min), low_open=True)
    offset = int(np.floor(epsilon_min / step))
    size = int(np.ceil(epsilon_max / step)) - offset + 1
    if size > grid_lib.MAX_MECHANISM_SIZE:
        raise ValueError(
            f"the window [{epsilon_min}, {epsilon_max}] at step {step} needs {size} points "
            f"(more than {grid_lib.MAX_MECHANISM_SIZE}); use a larger step"
        )
    forward = _curve_to_pld(delta, step, offset, size, "delta")
    if reverse is None:
        return forward
    back = _curve_to_pld(reverse, step, offset, size, "reverse")
    return PLD(forward.probs, forward.inf_mass, forward.offset, forward.step, True, back)


@float64
def identity(*, pessimistic: bool = True) -> PLD:
    """The PLD of a mechanism that reveals nothing: all mass at loss 0 (neutral for composition)."""
    one = jnp.ones((1,), jnp.float64)
    return PLD(one, jnp.zeros(()), jnp.zeros((), jnp.int64), jnp.ones(()), pessimistic)


__all__ = ["from_privacy_curve", "gaussian", "gdp", "identity", "laplace", "randomized_response"]
