"""Monte Carlo accounting: high-probability bounds for batch selections that have no PLD analysis.

b-min-sep sampling (jax-privacy's ``BMinSepSampling``; "Scaling up the banded matrix factorization
mechanism", arXiv:2602.09338): in each of T steps a record takes part with probability p, unless
it took part in one of the previous b - 1 steps; with a warm start the process begins in its
stationary law (eligible with probability 1 / (1 + (b - 1) p), each of the b - 1 steps of
cooldown with probability p / (1 + (b - 1) p)). Each step adds Gaussian noise of standard
deviation sigma times the clip norm (mu = 1 / sigma). Under add/remove or zero-out the run is
dominated by the pair P = the mixture over the record's participation pattern x (the law above) of
N(mu x, I_T) against Q = N(0, I_T) (the same reduction to a non-adaptive pair as for random
allocation, which is b-min-sep with p = 1: balls-in-bins over b steps).

Its privacy loss L(y) = log E_x[exp(mu <x, y> - mu^2 |x| / 2)] is a hidden Markov model's
likelihood ratio, computed by the forward recursion over the cooldown state: O(T) per sample,
since a cooldown state only passes its weight on to the next, and only the eligible state's
weight is computed at each step (the states' weights are kept in a buffer of b - 1 steps).
Samples of y are drawn on the accelerator (vmapped over samples, keyed): under P for the remove
direction, delta(eps) = E_P[(1 - e^{eps - L})_+], and under Q for the add direction,
delta(eps) = E_Q[(1 - e^{eps + L})_+] (the two directions share their Gaussian noise, which leaves
each direction's samples independent of one another). Each is the mean of variables in [0, 1], so
its one-sided Chernoff bound (P(mean <= a) <= exp(-m KL(a || d)) when the true mean is d > a, the
Bernoulli case being the worst) gives an upper bound that holds with probability at least
1 - beta / 2 in each direction: the reported delta, the larger of the two, fails with probability
at most beta (a union bound, whatever the directions' dependence). Read at a delta, epsilon is the
smallest with both bounds at most delta; the bounds fall with epsilon, so it too fails with
probability at most beta.

These are high-probability bounds, not certified ones: they come back as :class:`MonteCarloBound`
records, with their failure probability, and are never composed with PLDs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import rel_entr

from pldjax.core.compilation import cores, kernel_jit, map_in_threads
from pldjax.core.namespace import public_dir
from pldjax.core.notice import announces_slow_calls
from pldjax.core.precision import float64
from pldjax.core.validation import check_count, check_noise_multiplier, check_range, check_single

#: Samples drawn per compiled call in each direction on a CPU and on an accelerator (a fixed
#: shape: one program per min_sep; see chunk_size), and the bytes that a call's cooldown buffer
#: stays under on each (the chunk halves as min_sep grows). On a CPU a chunk's block of weights
#: stays in cache: 2^11 samples took 20-24 ns a sample and step, 2^12 22-29 ns, 2^16 38-76 ns
#: (2 cores; min_sep 1 to 100). An accelerator's steps take about as long for 2^20 samples as
#: for 2^16 (their kernels' launches), so it draws more at once.
CHUNK = 1 << 11
ACCELERATOR_CHUNK = 1 << 20
_BUFFER_BYTES = 1 << 28
_ACCELERATOR_BUFFER_BYTES = 1 << 30
#: Most chunks drawn at once on a CPU, in threads, one a core (XLA keeps 2 cores about 75% busy
#: with one chunk).
CHUNK_WORKERS = 4
#: The fewest steps whose noise is drawn at once (blocks shorter than this are drawn in
#: groups), and a block's steps when min_sep = 1 (Poisson sampling: no cooldown sets the block).
_DRAWN_STEPS = 8
#: Guards on memory and time: most samples a direction (8 bytes each, kept), most steps times
#: samples (a few hours of a CPU's time, seconds of a GPU's), largest min_sep (the steps a
#: sample's state spans, and a call's chunk shrinks as it grows).
MAX_SAMPLES = 10**8
MAX_WORK = 10**11
MAX_MIN_SEP = 4096
#: What a long call says it does (pldjax.core.notice).
_SAMPLING = ("it draws privacy-loss samples, about 25 ns a sample and step on a two-core CPU (its "
             "first call in a process also compiles)")
#: Bisection steps of the confidence bound and of epsilon.
_BISECTIONS = 100


class MonteCarloBound(NamedTuple):
    """A high-probability bound from Monte Carlo samples.

    Attributes:
      epsilon: the epsilon read (at ``delta`` for :func:`monte_carlo_epsilon`; the one asked for
        :func:`monte_carlo_delta`).
      delta: an upper bound on delta(epsilon) that holds with probability at least
        1 - failure_probability (for :func:`monte_carlo_epsilon`, the delta asked for).
      estimate: the plain Monte Carlo estimate of delta(epsilon) (the larger direction's), with
        no guarantee.
      failure_probability: the probability that ``delta`` is below the truth (over the samples).
      samples: the number of samples in each direction.
    """

    epsilon: float
    delta: float
    estimate: float
    failure_probability: float
    samples: int


def chunk_size(min_sep: int, accelerator: bool = False) -> int:
    """Samples a compiled call draws in each direction: CHUNK (ACCELERATOR_CHUNK on an
    ``accelerator``), halved until a call's cooldown buffer (min_sep - 1 rows of 2 x chunk
    losses) stays under 256 MiB (1 GiB)."""
    size = ACCELERATOR_CHUNK if accelerator else CHUNK
    budget = _ACCELERATOR_BUFFER_BYTES if accelerator else _BUFFER_BYTES
    while size > 1 and (min_sep - 1) * 2 * size * 8 >= budget:
        size //= 2
    return size


@kernel_jit(static_argnames=("min_sep", "size", "log_space"))
def _loss_samples(seed, chunk, mu, sampling_prob, steps, warm_start, *, min_sep: int,
                  size: int, log_space: bool = False):
    """Privacy losses L(y) of b-min-sep sampling, shape (2, size): row 0 with y drawn under P
    (the remove direction), row 1 with y drawn under Q (add); the ``chunk``-th chunk of
    ``size`` samples of the integer ``seed``'s draws (keys made here, not by eager operations);
    and whether :func:`forward_losses` underflowed (then the same draws again in
    ``log_space``).

    Both rows share their Gaussian noise z (y = z + mu x under P, y = z under Q). A row's
    samples are independent of one another, which is all its confidence bound needs, and the
    two bounds are joined by a union bound, which holds whatever their dependence; the sampler
    then draws half the normals.

    Steps are drawn a block at a time (:func:`forward_losses`), a block being min_sep - 1
    steps (one participation at most), in groups of at least ``_DRAWN_STEPS`` steps. The
    participation under P takes one uniform draw a record and block rather than one a step:
    from the offset at which the record is eligible, its next participation comes after a
    geometric number of steps (the trials until a success of probability p), and one that falls
    past the block's end is drawn afresh in the next (the geometric law is memoryless). With
    min_sep = 1 (Poisson sampling) each step's participation is drawn on its own."""
    cooldown = min_sep - 1
    block, group = block_and_group(min_sep)
    log_p, log_q = jnp.log(sampling_prob), jnp.log1p(-sampling_prob)
    stationary = 1.0 + cooldown * sampling_prob
    log_eligible = jnp.where(warm_start, -jnp.log(stationary), 0.0)
    log_cooling = jnp.where(warm_start, log_p - jnp.log(stationary), -jnp.inf)
    key = jax.random.fold_in(jax.random.key(seed), chunk)
    start, key = jax.random.split(key)
    # the chain's state under P: the offset in the block from which the record is eligible
    # (0: eligible; c > 0: c steps of cooldown left)
    logits = jnp.concatenate([log_eligible[None], jnp.full(cooldown, log_cooling)])
    eligible_from = jax.random.categorical(start, logits, shape=(size,)).astype(jnp.float64)
    offsets = jnp.arange(block)

    def draw(first, eligible_from, live):
        noise_key, choice_key = jax.random.split(jax.random.fold_in(key, first))
        z = jax.random.normal(noise_key, (group, block, size), jnp.float64)
        live = live[..., None]
        if cooldown == 0:
            u = jax.random.uniform(choice_key, (group, block, size), jnp.float64)
            return z, live & (u < sampling_prob), eligible_from
        u = jax.random.uniform(choice_key, (group, size), jnp.float64)
        # failures before the first success: P(wait >= k) = P(1 - u <= q^k) = q^k
        wait = jnp.where(sampling_prob > 0, jnp.floor(jnp.log1p(-u) / log_q), jnp.inf)

        def participation(eligible_from, wait):
            at = eligible_from + wait
            return jnp.where(at < block, at + 1.0, 0.0), at

        eligible_from, at = jax.lax.scan(participation, eligible_from, wait)
        return z, live & (offsets[:, None] == at[:, None, :]), eligible_from

    return forward_losses(draw, eligible_from, mu, sampling_prob, steps, log_eligible,
                          log_cooling, size=size, min_sep=min_sep, log_space=log_space)


def block_and_group(min_sep: int) -> tuple[int, int]:
    """(steps of a block, blocks of a group) of :func:`forward_losses` for ``min_sep``."""
    block = min_sep - 1 or _DRAWN_STEPS
    return block, -(-_DRAWN_STEPS // block)


#: A block's total weight, relative to the weights it started with, below which the linear
#: recursion of :func:`forward_losses` may have lost digits to underflow: above it, every term
#: within 2^-53 of the total is at least 2^-1013, a normal float64, and so is each weight it
#: came from (a step only multiplies by factors <= 1 and adds). Below it the chunk is drawn
#: again in log space.
_SMALLEST_TOTAL = 2.0**-960


def forward_losses(draw, state, mu, sampling_prob, steps, log_eligible, log_cooling, *,
                   size: int, min_sep: int, log_space: bool = False):
    """The losses L(y) (2, size) of ``size`` samples in each of two rows, by the forward
    recursion over the cooldown state, and whether the linear recursion underflowed (a bool;
    always False in ``log_space``). ``draw(first, state, live)`` gives the noise z of the group
    of blocks that begins at block ``first`` (group, block, size; see :func:`block_and_group`),
    each row-0 sample's participation in them (the same shape; 0 where ``live``, (group,
    block), is False: past the last step) and the next ``state``; row 0's outputs are
    y = z + mu x, row 1's y = z. ``log_eligible`` and ``log_cooling``: the log weights that the
    eligible state and each step of cooldown start with.

    The recursion carries the weight of the eligible state; the weight that enters cooldown at
    a step (participation) becomes eligible again min_sep - 1 steps later. Blocks are that many
    steps long: a block reads, row by row, the weights the previous block sent into cooldown
    and writes its own (each buffer read or written whole, so none is copied at every step); a
    step past the last (padding of the last group) lets the weight returning at it into the
    eligible state, where the result sums it. Without a cooldown (min_sep = 1) each step
    multiplies the eligible weight by q + p e^{r}, r = mu y - mu^2/2 being the step's log
    likelihood ratio.

    The weights are kept linear, each block's relative to the total it started with (a log
    scale carried beside them): a step then costs one exponential, of r less the block's
    largest r (never above 0, so nothing overflows), and a block one logarithm. A block whose
    total falls below _SMALLEST_TOTAL of its start (a likelihood ratio of e^-665 in one block,
    as for mu near 40 at p near 1) is flagged, and its caller recomputes the chunk with
    ``log_space``: every weight a logarithm, one logaddexp a step (about 3x slower on a CPU).
    """
    cooldown = min_sep - 1
    block, group = block_and_group(min_sep)
    offsets = jnp.arange(block)
    p, log_p, log_q = sampling_prob, jnp.log(sampling_prob), jnp.log1p(-sampling_prob)
    q = 1.0 - p

    def log_block(weights, rows):
        scale, eligible, previous, low = weights
        ratio, live = rows
        if cooldown == 0:
            factor = jnp.where(live[:, None, None], jnp.logaddexp(log_q, log_p + ratio), 0.0)
            return (scale, eligible + jnp.sum(factor, axis=0), previous, low), None

        def step(eligible, row):
            ratio, live, returning = row
            entering = jnp.where(live, log_p, -jnp.inf) + ratio + eligible
            stays = jnp.logaddexp(jnp.where(live, log_q, 0.0) + eligible, returning)
            return stays, entering

        eligible, entering = jax.lax.scan(step, eligible, (ratio, live, previous))
        return (scale, eligible, entering, low), None

    def linear_block(weights, rows):
        scale, eligible, previous, low = weights
        ratio, live = rows
        if cooldown == 0:
            # q + p e^r, divided by e^max(r, 0): at most 1, with one exponential
            small = jnp.exp(-jnp.abs(ratio))
            factor = jnp.where(ratio > 0, q * small + p, q + p * small)
            total = jnp.prod(jnp.where(live[:, None, None], factor, 1.0), axis=0)
            top = jnp.sum(jnp.maximum(ratio, 0.0), axis=0)
            return (scale + top + jnp.log(total), eligible, previous,
                    low | ~jnp.all(total >= _SMALLEST_TOTAL)), None
        # the weights entering cooldown are kept relative to e^top, the block's largest ratio
        # (at least 1): each at most 1, as the block starts with weights summing to 1
        top = jnp.maximum(jnp.max(ratio, axis=0), 0.0)
        gain = p * jnp.exp(ratio - top)
        stay = jnp.where(live, q, 1.0)

        def step(eligible, row):
            gain, stay, returning = row
            return stay * eligible + returning, gain * eligible

        eligible, entering = jax.lax.scan(step, eligible, (gain, stay, previous))
        eligible = eligible * jnp.exp(-top)
        total = eligible + jnp.sum(entering, axis=0)
        return (scale + top + jnp.log(total), eligible / total, entering / total,
                low | ~jnp.all(total >= _SMALLEST_TOTAL)), None

    def run_group(index, carry):
        weights, state = carry
        live = (index * group + jnp.arange(group))[:, None] * block + offsets < steps
        z, taken, state = draw(index * group, state, live)
        # each step's log dP/dQ of its y in the two rows, mu y - mu^2 / 2 with y = z + mu x and
        # y = z (mu times a sum: mu^2 overflows first for a tiny sigma, and inf - inf is NaN);
        # -inf past the last step: nothing enters
        half = 0.5 * mu
        ratio = mu * jnp.stack([z + jnp.where(taken, half, -half), z - half], axis=-2)
        ratio = jnp.where(live[..., None, None], ratio, -jnp.inf)
        weights, _ = jax.lax.scan(log_block if log_space else linear_block, weights,
                                  (ratio, live))
        return weights, state

    # with min_sep = 1 nothing waits: one row, never read
    previous = jnp.full((block if cooldown else 1, 2, size), log_cooling if cooldown else -jnp.inf)
    eligible = jnp.full((2, size), log_eligible)
    if not log_space:
        eligible, previous = jnp.exp(eligible), jnp.exp(previous)
    weights = (jnp.zeros((2, size)), eligible, previous, jnp.asarray(False))
    groups = -(-steps // (block * group))
    (scale, eligible, previous, low), _ = jax.lax.fori_loop(0, groups, run_group,
                                                            (weights, state))
    if log_space:
        return jax.nn.logsumexp(jnp.concatenate([eligible[None], previous]), axis=0), low
    return scale + jnp.log(eligible + jnp.sum(previous, axis=0)), low


def draws(mu, sampling_prob, steps, min_sep, warm_start, samples, key) -> np.ndarray:
    """``samples`` privacy losses L(y) of b-min-sep sampling in each direction, a NumPy array
    of shape (2, samples): row 0 with y drawn under P, row 1 under Q (see
    :func:`_loss_samples`), from the integer seed ``key``, chunk_size(min_sep) at a time
    (the same samples every time on one kind of device: a CPU's chunks are smaller than an
    accelerator's); ``mu``: the clip norm over the noise's standard deviation
    (1 / noise_multiplier)."""
    on_cpu = jax.default_backend() == "cpu"
    size = chunk_size(min_sep, accelerator=not on_cpu)
    chunks = -(-samples // size)

    @float64  # in each worker thread: JAX's 64-bit switch is the thread's own
    def chunk(i: int) -> np.ndarray:
        arguments = (np.int64(key), np.int64(i), np.float64(mu), np.float64(sampling_prob),
                     np.int64(steps), np.bool_(warm_start))
        losses, underflowed = _loss_samples(*arguments, min_sep=min_sep, size=size)
        if underflowed:
            losses, _ = _loss_samples(*arguments, min_sep=min_sep, size=size, log_space=True)
        return np.asarray(losses)

    workers = min(chunks, cores(), CHUNK_WORKERS) if on_cpu else 1
    drawn = map_in_threads(chunk, range(chunks), workers, "pldjax-monte-carlo")
    return np.concatenate(list(drawn), axis=1)[:, :samples]


def _estimate(losses, sign, epsilon) -> float:
    """Mean of (1 - e^{eps - sign L})_+ over the samples."""
    return float(np.mean(-np.expm1(np.minimum(epsilon - sign * losses, 0.0))))


def _upper_confidence(estimate, samples: int, failure: float):
    """The largest d >= estimate with samples * KL(estimate || d) <= log(1 / failure)."""
    estimate = np.asarray(estimate, np.float64)
    budget = math.log(1.0 / failure) / samples
    low, high = estimate.copy(), np.ones_like(estimate)

    def divergence(d):
        return rel_entr(estimate, d) + rel_entr(1.0 - estimate, 1.0 - d)

    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        inside = divergence(middle) <= budget
        low, high = np.where(inside, middle, low), np.where(inside, high, middle)
    return high


#: The smallest failure probability taken (half of it, each direction's, stays a normal float).
SMALLEST_FAILURE_PROBABILITY = 1e-300


def _checked(function, target, noise_multiplier, sampling_prob, steps, min_sep, samples,
             failure_probability, key, warm_start):
    """The arguments of ``function`` (``target``: its epsilon or delta, (name, value)) checked,
    as (mu, sampling_prob, steps, min_sep, samples, key) in Python numbers."""
    if jax.dtypes.issubdtype(getattr(key, "dtype", np.float64), jax.dtypes.prng_key):
        raise ValueError("key must be an integer seed in [-2^63, 2^63), got a JAX random key "
                         "(the samples are drawn in chunks from the seed)")
    for name, value in (target, ("noise_multiplier", noise_multiplier),
                        ("sampling_prob", sampling_prob), ("steps", steps), ("min_sep", min_sep),
                        ("samples", samples), ("failure_probability", failure_probability),
                        ("key", key)):
        check_single(function, name, value)
    if not isinstance(warm_start, bool | np.bool_):
        raise ValueError(f"warm_start must be True or False, got {warm_start!r}")
    check_noise_multiplier(noise_multiplier)
    check_range("sampling_prob", sampling_prob, 0.0, 1.0)
    # each direction's bound fails with half of it: a half that rounds to 0 is no probability
    check_range("failure_probability", failure_probability, SMALLEST_FAILURE_PROBABILITY, 1.0,
                high_open=True)
    steps, min_sep = check_count("steps", steps, minimum=1), check_count("min_sep", min_sep, minimum=1)
    samples = check_count("samples", samples, minimum=1)
    if min_sep > MAX_MIN_SEP:
        raise ValueError(f"min_sep must be an integer in [1, {MAX_MIN_SEP}] (a memory guard: the "
                         f"cooldown buffer holds min_sep - 1 rows of samples), got {min_sep}")
    refusal = f"key must be an integer seed in [-2^63, 2^63), got {key!r}"
    try:
        key = check_count("key", key, minimum=-2**63)
    except ValueError:
        raise ValueError(refusal) from None
    if key >= 2**63:
        raise ValueError(refusal)
    # the work done: whole chunks of samples, each over every step
    size = chunk_size(min_sep, accelerator=jax.default_backend() != "cpu")
    drawn = -(-samples // size) * size
    if samples > MAX_SAMPLES or drawn * steps > MAX_WORK:
        raise ValueError(f"samples = {samples} over steps = {steps} is more than this sampler "
                         f"takes (at most {MAX_SAMPLES:.0e} samples, and {MAX_WORK:.0e} samples "
                         f"drawn times steps, the samples drawn {size} at a time here): pass "
                         f"fewer samples or steps")
    return 1.0 / float(noise_multiplier), float(sampling_prob), steps, min_sep, samples, key


def _directions(mu, sampling_prob, steps, min_sep, warm_start, samples, key):
    """(losses, sign) of the remove direction (drawn under P) and of the add direction (under
    Q, whose loss is -L)."""
    remove, add = draws(mu, sampling_prob, steps, min_sep, bool(warm_start), samples, key)
    return [(remove, 1.0), (add, -1.0)]


def _read(directions, samples: int, failure_probability: float, epsilon) -> tuple[float, float]:
    """(upper confidence bound, plain estimate) of delta(``epsilon``): the larger direction's,
    each direction's bound failing with probability failure_probability / 2."""
    estimates = [_estimate(losses, sign, epsilon) for losses, sign in directions]
    bound = max(float(_upper_confidence(e, samples, failure_probability / 2)) for e in estimates)
    return bound, max(estimates)


@announces_slow_calls("pldjax.monte_carlo_delta", _SAMPLING)
@float64
def monte_carlo_delta(noise_multiplier: float, sampling_prob: float, steps: int, min_sep: int,
                      epsilon: float, *, samples: int = 10**6, failure_probability: float = 1e-3,
                      warm_start: bool = True, key: int = 0) -> MonteCarloBound:
    """A high-probability upper bound on delta(``epsilon``) of DP-SGD with b-min-sep sampling
    (jax-privacy's ``BMinSepSampling(sampling_prob, steps, min_sep, warm_start)``, without
    truncation), Gaussian noise of ``noise_multiplier`` times the clip norm, add/remove or
    zero-out: it is below the truth with probability at most ``failure_probability`` over the
    ``samples`` draws in each direction (``key`` seeds them). See the module docstring.

    Args:
      noise_multiplier: the noise standard deviation over the clip norm, finite and at least
        1e-100 (see :data:`pldjax.core.validation.SMALLEST_NOISE_MULTIPLIER`).
      sampling_prob: the probability p that an eligible record takes part in a step, in [0, 1].
      steps: the number of steps T, an integer >= 1.
      min_sep: b, the separation between a record's participations (after one it sits out the
        next b - 1 steps), an integer in [1, ``MAX_MIN_SEP``] (4096); 1 is Poisson sampling.
      epsilon: in nats, >= 0 and finite.
      samples: draws in each direction, an integer >= 1; at most ``MAX_SAMPLES`` (10^8), and
        samples (drawn in whole chunks of :func:`chunk_size`) times steps at most ``MAX_WORK``
        (10^11); default 10^6.
      failure_probability: in [1e-300, 1): the probability, over the draws, that the bound fails
        (half of it for each direction); default 1e-3.
      warm_start: True (default): the process starts in its stationary law; False: every record
        starts eligible.
      key: integer seed of the draws, in [-2^63, 2^63) (default 0); a key gives the same samples
        every time.

    Returns:
      A :class:`MonteCarloBound` with ``epsilon`` as given and ``delta`` an upper bound on the
      true delta(epsilon) with probability at least 1 - ``failure_probability`` (high-probability,
      not certified: never compose it with PLDs), beside the plain ``estimate`` (no guarantee),
      ``failure_probability`` and ``samples``; plain Python numbers.
    """
    mu, p, steps, min_sep, samples, key = _checked(
        "monte_carlo_delta", ("epsilon", epsilon), noise_multiplier, sampling_prob, steps,
        min_sep, samples, failure_probability, key, warm_start)
    check_range("epsilon", epsilon, 0.0)
    directions = _directions(mu, p, steps, min_sep, warm_start, samples, key)
    bound, estimate = _read(directions, samples, failure_probability, float(epsilon))
    return MonteCarloBound(float(epsilon), bound, estimate, float(failure_probability), samples)


@announces_slow_calls("pldjax.monte_carlo_epsilon", _SAMPLING)
@float64
def monte_carlo_epsilon(noise_multiplier: float, sampling_prob: float, steps: int, min_sep: int,
                        delta: float, *, samples: int = 10**6, failure_probability: float = 1e-3,
                        warm_start: bool = True, key: int = 0) -> MonteCarloBound:
    """The smallest epsilon whose high-probability delta bound (:func:`monte_carlo_delta`, on
    one set of samples) is at most ``delta``: an upper bound on the true epsilon(delta) with
    probability at least 1 - ``failure_probability``; inf when no epsilon's bound reaches
    ``delta`` (too few samples for so small a delta: about log(2 / failure_probability) / delta
    are needed).

    Args:
      noise_multiplier: the noise standard deviation over the clip norm, finite and at least
        1e-100 (see :data:`pldjax.core.validation.SMALLEST_NOISE_MULTIPLIER`).
      sampling_prob: the probability p that an eligible record takes part in a step, in [0, 1].
      steps: the number of steps T, an integer >= 1.
      min_sep: b, the separation between a record's participations (after one it sits out the
        next b - 1 steps), an integer in [1, ``MAX_MIN_SEP``] (4096); 1 is Poisson sampling.
      delta: in (0, 1].
      samples: draws in each direction, an integer >= 1; at most ``MAX_SAMPLES`` (10^8), and
        samples (drawn in whole chunks of :func:`chunk_size`) times steps at most ``MAX_WORK``
        (10^11); default 10^6.
      failure_probability: in [1e-300, 1): the probability, over the draws, that the bound fails
        (half of it for each direction); default 1e-3.
      warm_start: True (default): the process starts in its stationary law; False: every record
        starts eligible.
      key: integer seed of the draws, in [-2^63, 2^63) (default 0); a key gives the same samples
        every time.

    Returns:
      A :class:`MonteCarloBound` with ``epsilon`` in nats, the smallest found (by bisection, the
      end whose bound meets ``delta``): an upper bound on the true epsilon(delta) with
      probability at least 1 - ``failure_probability`` (high-probability, not certified), or
      inf; ``delta`` as given; ``estimate`` the plain estimate of delta at that epsilon (at the
      largest epsilon searched when inf, no guarantee); ``failure_probability`` and ``samples``;
      plain Python numbers.
    """
    mu, p, steps, min_sep, samples, key = _checked(
        "monte_carlo_epsilon", ("delta", delta), noise_multiplier, sampling_prob, steps,
        min_sep, samples, failure_probability, key, warm_start)
    check_range("delta", delta, 0.0, 1.0, low_open=True)
    directions = _directions(mu, p, steps, min_sep, warm_start, samples, key)

    def result(eps):
        return MonteCarloBound(eps, float(delta), _read(directions, samples, failure_probability,
                                                         eps)[1],
                               float(failure_probability), samples)

    def meets(eps) -> bool:
        return _read(directions, samples, failure_probability, eps)[0] <= delta

    if meets(0.0):
        return result(0.0)
    high = max(float(np.max(np.abs(losses[np.isfinite(losses)]), initial=0.0))
               for losses, _ in directions) + 1.0
    if not meets(high):
        return result(high)._replace(epsilon=math.inf)
    low = 0.0
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if meets(middle) else (middle, high)
    return result(high)


__all__ = ["MonteCarloBound", "monte_carlo_delta", "monte_carlo_epsilon"]
__dir__ = public_dir(__all__)
