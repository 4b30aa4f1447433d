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

from pldjax.core.compilation import kernel_jit
from pldjax.core.mass import take_from_bottom
from pldjax.kernels.discretize import lower_hull_rows, masses_at_vertices, masses_from_curve
from pldjax.kernels.hockey_stick import grid_deltas

#: The envelope works in x = e^(z - centre): a window may span at most this many nats either side
#: of its centre (beyond, x overflows); a caller keeps one whole upper bound there instead.
HULL_REACH = 600.0


def excess_on_grid(probs, z, step):
    """delta(z) + expm1(z) (the curve's excess over 1 - e^z, see
    :func:`pldjax.kernels.discretize.hockey_stick_excess`) of one PLD direction whose masses
    ``probs`` sit at the grid points ``z`` (spacing ``step``), at those points:
    sum_{i <= j} p_i expm1(z_j - z_i) + e^(z_j) Q(L = -inf), a sum of terms >= 0. Taken as the
    curve plus expm1(z), it kept the curve's round-off (about 1e-16 where the curve is near 1,
    at z < 0), which the masses' second differences divide by the step: a spurious atom at +inf
    of 3e-9 a step (sigma = 1, q = 0.01, 10^4 records, batches of 120)."""
    below = jnp.cumsum(probs)
    grow, em1 = jnp.exp(step), jnp.expm1(step)

    def next_point(d, cumulative):  # D_j = e^h D_(j-1) + expm1(h) P(L <= z_(j-1))
        d = grow * d + em1 * cumulative
        return d, d

    _, rest = jax.lax.scan(next_point, jnp.zeros(()), below[:-1])
    spread = jnp.concatenate([jnp.zeros((1,)), rest])
    # Q's mass left at -inf: 1 less Q's mass on the grid, p_i e^(-z_i)
    q_left = 1.0 - jnp.sum(jnp.where(probs > 0, jnp.exp(jnp.log(probs) - z), 0.0))
    return spread + jnp.exp(z) * q_left


def envelope_masses(least, least_excess, z, step):
    """One direction's masses and +inf atom (a pessimistic PLD on the grid points ``z``, spacing
    ``step``, in nats) whose hockey-stick curve is the lower convex envelope (in x = e^z) of
    ``least``, values at ``z`` of an upper bound on a privacy curve, joined by chords: an upper
    bound too, since the true curve is convex and below ``least``. ``least_excess`` is the same
    bound as an excess over 1 - e^z (``least`` + expm1(z)), which keeps the digits that ``least``
    loses near 1 at z < 0. The window must span at most HULL_REACH nats either side of its
    centre."""
    size = z.shape[0]
    # x relative to the window's centre (scaling x keeps convexity and avoids overflow), with the
    # curve's value 1 at x = 0
    centre = z[size // 2]
    xs = jnp.concatenate([jnp.zeros((1,)), jnp.exp(z - centre)])
    # and the same envelope less the line 1 - e^z (a lower convex envelope commutes with
    # subtracting a line in x): from the excesses, which keep their digits at z < 0; its value
    # at x = 0 is 0. Both hulls in one call (one copy of the hull in the program, not two)
    ys = jnp.stack([jnp.concatenate([jnp.ones((1,)), least]),
                    jnp.concatenate([jnp.zeros((1,)), least_excess])])
    hulls, kept = lower_hull_rows(jnp.broadcast_to(xs, ys.shape), ys)
    curve, excess = hulls[:, 1:]
    excess = jnp.where((z < 0) & jnp.isfinite(excess), excess, curve + jnp.expm1(z))
    # two constructions of the masses, the one left with the smaller atom kept: the curve's
    # second differences at every grid point (at z < 0 the excess's), and the chords' slopes at
    # the hulls' vertices (below 0 the excess's hull, whose line rises as x does, slope
    # e^centre in these units; above 0 the curve's). Along a long chord the second differences
    # are round-off of both signs, and clipped they can leave a surplus that comes back as an
    # atom (3.35e-14 under zero-out with q = 0.01, 10^4 records, batches of 100; 4.8e-16 from the
    # slopes); elsewhere they telescope to the curve more closely (1e-29 to 1e-17)
    differences, differences_inf = masses_from_curve(curve, step, excess, z,
                                                     surplus_from_bottom=True)
    below_zero = jnp.concatenate([jnp.ones(1, bool), z < 0])
    slopes = masses_at_vertices(xs, ys[0], ys[1], jnp.where(below_zero, kept[1], kept[0]),
                                below_zero, jnp.exp(jnp.minimum(centre, 700.0)))
    outs = jnp.stack([differences, slopes])
    infs = jnp.stack([differences_inf, jnp.clip(curve[-1], 0.0, 1.0)])
    # round-off in the masses may leave the rebuilt curve a little below the envelope: move that
    # much mass from the bottom to +inf, which raises delta by it at every grid point (compared
    # as excesses at z < 0, where the curve near 1 has lost the digits that differ)
    rebuilt_excess = jax.vmap(excess_on_grid, in_axes=(0, None, None))(outs, z, step)
    rebuilt_curve = jax.vmap(grid_deltas, in_axes=(0, 0, None))(outs, infs, step)
    below = jnp.where(z < 0, excess - rebuilt_excess, curve - rebuilt_curve)
    infs = jnp.minimum(infs + jnp.maximum(jnp.max(below, axis=1), 0.0), 1.0)
    chosen = jnp.argmin(infs)
    out, out_inf = outs[chosen], infs[chosen]
    # the mass beyond 1 (that moved, and round-off) comes from the bottom; a deficit, round-off
    # of about 1e-16, is spread over the masses as masses_from_curve spreads one (raising delta
    # in proportion): in the +inf atom it was a floor under delta at every epsilon
    finite = jnp.sum(out)
    spare = finite + out_inf - 1.0
    return (jnp.where(spare > 0, take_from_bottom(out, spare),
                      out * ((1.0 - out_inf) / jnp.where(finite > 0, finite, 1.0))), out_inf)


@kernel_jit(static_argnames=("size",))
def curve_envelope_kernel(least, least_excess, offset, step, *, size: int):
    """:func:`envelope_masses` on the ``size`` grid points (offset + i) * step."""
    z = (offset + jnp.arange(size, dtype=jnp.float64)) * step
    return envelope_masses(least, least_excess, z, step)
