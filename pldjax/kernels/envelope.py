"""The tightest pessimistic PLD on a grid below upper bounds on one privacy curve.

Several sound analyses of one mechanism give several upper bounds on its hockey-stick curve
delta(eps); none need be a privacy curve itself (convex in x = e^eps), and none need dominate the
others. The true curve is convex and below each, hence below the lower convex envelope (in x) of
their pointwise minimum: :func:`envelope_masses` builds the PLD of that envelope at a window's grid
points, joined by chords (connect-the-dots' pessimistic PLD of a curve, Doroshenko et al. 2022,
Alg. 1), taking the masses below eps = 0 from the curve's excess over 1 - e^eps, where the curve
itself has lost its digits near 1.
"""

import jax
import jax.numpy as jnp
import numpy as np

from pldjax.core.compilation import array_module, host_work, kernel_jit
from pldjax.core.mass import take_from_bottom
from pldjax.kernels.discretize import lower_hull_rows, masses_at_vertices, masses_from_curve
from pldjax.kernels.hockey_stick import grid_deltas

#: The envelope works in x = e^(z - centre): a window may span at most this many nats either side
#: of its centre (beyond, x overflows); a caller keeps one whole upper bound there instead.
HULL_REACH = 600.0

#: Points (as :class:`pldjax.core.compilation.HostWork` counts them: grid points, about 5 million
#: a second) of envelopes of one window size that a process computes in NumPy, while its host
#: work lasts, before it compiles that size's program (a ski rental): the program took 1.8-2.5 s
#: to trace and compile on 2 cores, where NumPy's envelope of 2^19 points took 0.35-0.7 s
#: against 0.15 s compiled (its lower hull, chords and gathers: ENVELOPE_WORK of those points a
#: window point).
HOST_ENVELOPE_POINTS = 2**23
ENVELOPE_WORK = 6


def envelope_on_host(points: int, program) -> bool:
    """Whether an envelope of ``points`` window points (all its rows) of the compiled ``program``
    (a key: its kernel and static arguments) runs in NumPy (see HOST_ENVELOPE_POINTS)."""
    return host_work.claim(ENVELOPE_WORK * points, program, HOST_ENVELOPE_POINTS)


def excess_on_grid(probs, z, step):
    """delta(z) + expm1(z) (the curve's excess over 1 - e^z, see
    :func:`pldjax.kernels.discretize.hockey_stick_excess`) of one PLD direction whose masses
    ``probs`` sit at the grid points ``z`` (spacing ``step``), at those points:
    sum_{i <= j} p_i expm1(z_j - z_i) + e^(z_j) Q(L = -inf), a sum of terms >= 0. Taken as the
    curve plus expm1(z), it kept the curve's round-off (about 1e-16 where the curve is near 1,
    at z < 0), which the masses' second differences divide by the step: a spurious atom at +inf
    of 3e-9 a step (sigma = 1, q = 0.01, 10^4 records, batches of 120). NumPy or JAX arrays."""
    xp = array_module(probs, z)
    below = xp.cumsum(probs)
    grow, em1 = xp.exp(step), xp.expm1(step)
    # D_j = e^h D_(j-1) + expm1(h) P(L <= z_(j-1))
    if xp is np:  # the same recurrence, run by SciPy's linear filter
        from scipy.signal import lfilter

        rest = lfilter([em1], [1.0, -grow], below[:-1])
    else:
        def next_point(d, cumulative):
            d = grow * d + em1 * cumulative
            return d, d

        _, rest = jax.lax.scan(next_point, jnp.zeros(()), below[:-1])
    spread = xp.concatenate([xp.zeros((1,)), rest])
    # Q's mass left at -inf: 1 less Q's mass on the grid, p_i e^(-z_i)
    held = probs > 0
    q_left = 1.0 - xp.sum(xp.where(held, xp.exp(xp.log(xp.where(held, probs, 1.0)) - z), 0.0))
    return spread + xp.exp(z) * q_left


def envelope_masses(least, least_excess, z, step):
    """One direction's masses and +inf atom (a pessimistic PLD on the grid points ``z``, spacing
    ``step``, in nats) whose hockey-stick curve is the lower convex envelope (in x = e^z) of
    ``least``, values at ``z`` of an upper bound on a privacy curve, joined by chords: an upper
    bound too, since the true curve is convex and below ``least``. ``least_excess`` is the same
    bound as an excess over 1 - e^z (``least`` + expm1(z)), which keeps the digits that ``least``
    loses near 1 at z < 0. The window must span at most HULL_REACH nats either side of its
    centre. NumPy arrays are computed in NumPy."""
    xp = array_module(least, z)
    size = z.shape[0]
    # x relative to the window's centre (scaling x keeps convexity and avoids overflow), with the
    # curve's value 1 at x = 0
    centre = z[size // 2]
    xs = xp.concatenate([xp.zeros((1,)), xp.exp(z - centre)])
    # and the same envelope less the line 1 - e^z (a lower convex envelope commutes with
    # subtracting a line in x): from the excesses, which keep their digits at z < 0; its value
    # at x = 0 is 0. Both hulls in one call (one copy of the hull in the program, not two)
    ys = xp.stack([xp.concatenate([xp.ones((1,)), least]),
                   xp.concatenate([xp.zeros((1,)), least_excess])])
    hulls, kept = lower_hull_rows(xp.broadcast_to(xs, ys.shape), ys)
    curve, excess = hulls[:, 1:]
    excess = xp.where((z < 0) & xp.isfinite(excess), excess, curve + xp.expm1(z))
    # two constructions of the masses, the one left with the smaller atom kept: the curve's
    # second differences at every grid point (at z < 0 the excess's), and the chords' slopes at
    # the hulls' vertices (below 0 the excess's hull, whose line rises as x does, slope
    # e^centre in these units; above 0 the curve's). Along a long chord the second differences
    # are round-off of both signs, and clipped they can leave a surplus that comes back as an
    # atom (3.35e-14 under zero-out with q = 0.01, 10^4 records, batches of 100; 4.8e-16 from the
    # slopes); elsewhere they telescope to the curve more closely (1e-29 to 1e-17)
    differences, differences_inf = masses_from_curve(curve, step, excess, z,
                                                     surplus_from_bottom=True)
    below_zero = xp.concatenate([xp.ones(1, bool), z < 0])
    slopes = masses_at_vertices(xs, ys[0], ys[1], xp.where(below_zero, kept[1], kept[0]),
                                below_zero, xp.exp(xp.minimum(centre, 700.0)))
    outs = xp.stack([differences, slopes])
    infs = xp.stack([differences_inf, xp.clip(curve[-1], 0.0, 1.0)])
    # round-off in the masses may leave the rebuilt curve a little below the envelope: move that
    # much mass from the bottom to +inf, which raises delta by it at every grid point (compared
    # as excesses at z < 0, where the curve near 1 has lost the digits that differ)
    if xp is np:
        rebuilt_excess = np.stack([excess_on_grid(out, z, step) for out in outs])
        rebuilt_curve = np.stack([grid_deltas(out, inf, step)
                                  for out, inf in zip(outs, infs, strict=True)])
    else:
        rebuilt_excess = jax.vmap(excess_on_grid, in_axes=(0, None, None))(outs, z, step)
        rebuilt_curve = jax.vmap(grid_deltas, in_axes=(0, 0, None))(outs, infs, step)
    below = xp.where(z < 0, excess - rebuilt_excess, curve - rebuilt_curve)
    infs = xp.minimum(infs + xp.maximum(xp.max(below, axis=1), 0.0), 1.0)
    chosen = xp.argmin(infs)
    out, out_inf = outs[chosen], infs[chosen]
    # the mass beyond 1 (that moved, and round-off) comes from the bottom; a deficit, round-off
    # of about 1e-16, is spread over the masses as masses_from_curve spreads one (raising delta
    # in proportion): in the +inf atom it was a floor under delta at every epsilon
    finite = xp.sum(out)
    spare = finite + out_inf - 1.0
    scaled = out * ((1.0 - out_inf) / xp.where(finite > 0, finite, 1.0))
    if xp is np:
        return (take_from_bottom(out, spare, np) if spare > 0 else scaled), out_inf
    return xp.where(spare > 0, take_from_bottom(out, spare), scaled), out_inf


@kernel_jit(static_argnames=("size",))
def curve_envelope_kernel(least, least_excess, offset, step, *, size: int):
    """:func:`envelope_masses` on the ``size`` grid points (offset + i) * step (its function,
    ``curve_envelope_kernel.__wrapped__``, runs on NumPy arrays in NumPy)."""
    xp = array_module(least, least_excess)
    z = (offset + xp.arange(size, dtype=xp.float64)) * step
    return envelope_masses(least, least_excess, z, step)
