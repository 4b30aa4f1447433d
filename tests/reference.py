"""Reference values computed independently of pldjax (mpmath, closed forms)."""

from __future__ import annotations

import mpmath as mp
import numpy as np

mp.mp.dps = 50


def gaussian_delta_mp(mu, eps) -> mp.mpf:
    """delta(eps) of G_mu in mpmath (at the caller's precision): Phi(mu/2 - eps/mu) -
    e^eps Phi(-mu/2 - eps/mu)."""
    mu, eps = mp.mpf(mu), mp.mpf(eps)
    return mp.ncdf(mu / 2 - eps / mu) - mp.e**eps * mp.ncdf(-mu / 2 - eps / mu)


def gaussian_delta(mu: float, eps: float) -> float:
    """delta(eps) of G_mu: Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
    return float(gaussian_delta_mp(mu, eps))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """:func:`gaussian_epsilon_mp` as a float."""
    return float(gaussian_epsilon_mp(mu, delta))


def gaussian_epsilon_mp(mu, delta) -> mp.mpf:
    """epsilon(delta) of G_mu in mpmath, to 2^-300 of its bracket: any mu (an mpf for a large
    one), delta in (0, 1] down to 1e-300; 0 where delta_mu(0) <= delta."""
    mu, delta = mp.mpf(mu), mp.mpf(delta)
    f = lambda e: gaussian_delta_mp(mu, e) - delta  # noqa: E731
    if f(0) <= 0:
        return mp.mpf(0)
    lo, hi = mp.mpf(0), mu * mu / 2 + 40 * mu + 10
    with mp.workdps(80):
        for _ in range(300):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return hi


def laplace_delta(eps0: float, eps: float) -> float:
    """delta(eps) of the Laplace mechanism with eps0 = sensitivity / scale, eps >= 0."""
    return float(max(0.0, -mp.expm1((mp.mpf(eps) - eps0) / 2))) if eps < eps0 else 0.0


def rr_kfold_delta(eps: float, delta: float, k: int, t: float) -> float:
    """laplace-transform-dp.txt Cor. 4.7: k-fold composition of R_{eps,delta} at t."""
    eps, t = mp.mpf(eps), mp.mpf(t)
    p = mp.e**eps / (1 + mp.e**eps)
    expect = mp.mpf(0)
    for y in range(k + 1):
        weight = mp.binomial(k, y) * p**y * (1 - p) ** (k - y)
        expect += weight * max(mp.mpf(0), 1 - mp.e ** (t - eps * (2 * y - k)))
    return float(1 - (1 - mp.mpf(delta)) ** k * (1 - expect))


def rr_kfold_delta_mp(eps, delta, k: int, t) -> mp.mpf:
    """:func:`rr_kfold_delta` in mpmath, unrounded."""
    eps, t = mp.mpf(eps), mp.mpf(t)
    p = mp.e**eps / (1 + mp.e**eps)
    expect = mp.fsum(mp.binomial(k, y) * p**y * (1 - p) ** (k - y)
                     * max(mp.mpf(0), 1 - mp.e ** (t - eps * (2 * y - k))) for y in range(k + 1))
    return 1 - (1 - mp.mpf(delta)) ** k * (1 - expect)


def epsilon_of_curve(delta_of, target, atom, top) -> float:
    """The smallest eps >= 0 with delta_of(eps) <= target, for a non-increasing curve delta_of
    (mpmath) that tends to ``atom`` (its mass at +inf) and is at most the target at ``top`` (its
    largest finite loss, or any eps far enough) when the target is at least the atom: inf where
    the target is below the atom, else by bisection to mpmath's precision."""
    target = mp.mpf(target)
    if target < atom:
        return float("inf")
    if delta_of(mp.mpf(0)) <= target:
        return 0.0
    lo, hi = mp.mpf(0), mp.mpf(top)
    for _ in range(mp.mp.prec + 10):
        mid = (lo + hi) / 2
        if delta_of(mid) > target:
            lo = mid
        else:
            hi = mid
    return float(hi)


def rr_kfold_epsilon(eps: float, delta: float, k: int, target: float) -> float:
    """epsilon(target) of the k-fold composition of R_{eps,delta} (exact, from Cor. 4.7)."""
    atom = 1 - (1 - mp.mpf(delta)) ** k
    return epsilon_of_curve(lambda t: rr_kfold_delta_mp(eps, delta, k, t), target, atom, k * eps)


def laplace_epsilon(eps0: float, target: float) -> float:
    """epsilon(target) of the Laplace mechanism with eps0 = sensitivity / scale: the inverse of
    delta(eps) = 1 - exp((eps - eps0) / 2) on [0, eps0], and 0 past delta(0)."""
    eps0, target = mp.mpf(eps0), mp.mpf(target)
    return float(max(mp.mpf(0), eps0 + 2 * mp.log1p(-target))) if target < 1 else 0.0


def discrete_laplace_delta_mp(t, sensitivity: int, eps) -> mp.mpf:
    """delta(eps) of the discrete Laplace mechanism, P(K = k) = tanh(t/2) e^{-t |k|}, shift
    ``sensitivity`` = D, by exact enumeration: the loss t(|k - D| - |k|) is tD for every k <= 0
    (mass 1 / (1 + e^-t)), -tD for k >= D, and takes each value between at one k."""
    t, eps = mp.mpf(t), mp.mpf(eps)
    mass = mp.tanh(t / 2)
    total = max(mp.mpf(0), 1 - mp.e ** (eps - t * sensitivity)) / (1 + mp.e**-t)
    for k in range(1, sensitivity):
        loss = t * (abs(k - sensitivity) - k)
        total += mass * mp.e ** (-t * k) * max(mp.mpf(0), 1 - mp.e ** (eps - loss))
    return total


def discrete_laplace_epsilon(t: float, sensitivity: int, target: float) -> float:
    """epsilon(target) of the discrete Laplace mechanism (see :func:`discrete_laplace_delta_mp`)."""
    return epsilon_of_curve(lambda e: discrete_laplace_delta_mp(t, sensitivity, e), target, 0,
                            mp.mpf(t) * sensitivity)


def replace_one_gaussian_delta_mp(mu, q, eps) -> mp.mpf:
    """delta(eps) of the Poisson-subsampled Gaussian under replace-one adjacency: P = (1 - q)
    N(0, 1) + q N(-mu, 1) against Q = (1 - q) N(0, 1) + q N(mu, 1) (mu = sensitivity / sigma).
    Its loss log((1 - q + q c v) / (1 - q + q c / v)), v = e^(-mu x), c = e^(-mu^2/2), decreases
    in the output x, so delta = P(X < x*) - e^eps Q(X < x*) at the x* where the loss is eps: the
    positive root v of q c v^2 + (1 - q)(1 - e^eps) v - q c e^eps = 0."""
    mu, q, eps = mp.mpf(mu), mp.mpf(q), mp.mpf(eps)
    x = _replace_one_threshold_mp(mu, q, eps)
    p = (1 - q) * mp.ncdf(x) + q * mp.ncdf(x + mu)
    return p - mp.e**eps * ((1 - q) * mp.ncdf(x) + q * mp.ncdf(x - mu))


def _replace_one_threshold_mp(mu, q, eps):
    """The output x* of :func:`replace_one_gaussian_delta_mp`: its quadratic's positive root,
    in the form without cancellation for the sign of b."""
    c, b = mp.e ** (-mu**2 / 2), (1 - q) * (1 - mp.e**eps)
    root = mp.sqrt(b**2 + 4 * q**2 * c**2 * mp.e**eps)
    v = (root - b) / (2 * q * c) if b <= 0 else 2 * q * c * mp.e**eps / (root + b)
    return -mp.log(v) / mu


def replace_one_gaussian_curve_mp(mu, q, eps) -> mp.mpf:
    """delta(eps) of :func:`replace_one_gaussian_delta_mp` where eps >= 0, and below its excess
    delta(eps) - (1 - e^eps) = e^eps Q(X >= x*) - P(X >= x*), each from its own side's normal
    tails (no 1 - (a value near 1))."""
    mu, q, eps = mp.mpf(mu), mp.mpf(q), mp.mpf(eps)
    if eps >= 0:
        return replace_one_gaussian_delta_mp(mu, q, eps)
    x = _replace_one_threshold_mp(mu, q, eps)
    p = (1 - q) * mp.ncdf(-x) + q * mp.ncdf(-x - mu)
    return mp.e**eps * ((1 - q) * mp.ncdf(-x) + q * mp.ncdf(-x + mu)) - p


def replace_one_gaussian_epsilon(mu: float, q: float, target: float) -> float:
    """epsilon(target) of :func:`replace_one_gaussian_delta_mp` (target > 0)."""
    top = 2 * mp.mpf(mu) ** 2 + 40 * mp.mpf(mu) + 50  # the loss at q = 1 is N(2 mu^2, 4 mu^2)
    return epsilon_of_curve(lambda e: replace_one_gaussian_delta_mp(mu, q, e), target, 0, top)


def rr_mixed_delta(pairs: list[tuple[float, float]], t: float) -> float:
    """laplace-transform-dp.txt Thm 4.6: composition of R_{eps_i, delta_i}, by its recursion."""

    def rec(level: int, x):
        if level == 0:
            return max(mp.mpf(0), 1 - mp.e**x)
        e, d = (mp.mpf(v) for v in pairs[level - 1])
        return d + (1 - d) / (mp.e**e + 1) * (mp.e**e * rec(level - 1, x - e) + rec(level - 1, x + e))

    return float(rec(len(pairs), mp.mpf(t)))


def brute_force_delta(losses, probs, inf_mass, eps: float) -> float:
    """delta(eps) of a finite PLD by direct summation in mpmath."""
    total = mp.mpf(inf_mass)
    for z, p in zip(losses, probs, strict=True):
        if z > eps:
            total += mp.mpf(p) * (1 - mp.e ** (mp.mpf(eps) - mp.mpf(z)))
    return float(total)




def subsampled_remove_delta(base_delta, q: float, eps: float) -> float:
    """laplace-transform-dp.txt Thm 5.1: delta of (q A + (1-q) B || B) from delta of (A || B)."""
    q, eps = mp.mpf(q), mp.mpf(eps)
    if q < 1 and eps <= mp.log(1 - q):
        return float(-mp.expm1(eps))
    return float(q * base_delta(float(mp.log(1 + mp.expm1(eps) / q))))


def subsampled_add_delta(base_delta, q: float, eps: float) -> float:
    """delta of (B || q A + (1-q) B) for a symmetric base (delta(A||B) = delta(B||A)):
    B - e^eps (q A + (1-q) B) = c (B - e^eps' A) with c = 1 - (1-q) e^eps, e^eps' = q e^eps / c."""
    q, eps = mp.mpf(q), mp.mpf(eps)
    c = 1 - (1 - q) * mp.e**eps
    if c <= 0:
        return 0.0
    return float(c * base_delta(float(eps + mp.log(q) - mp.log(c))))


def subsampled_gaussian_curve_mp(sigma, q, eps, add: bool) -> mp.mpf:
    """delta(eps) where eps >= 0, and its excess delta(eps) - (1 - e^eps) below, of one
    Poisson-subsampled Gaussian step (noise sigma, sensitivity 1), from the mixture's own tails at
    the output threshold (mpmath, at the caller's precision): remove, P = (1 - q) N(0, sigma^2)
    + q N(1, sigma^2) against Q = N(0, sigma^2), whose loss exceeds eps above the output
    x = sigma^2 log((e^eps - 1 + q) / q) + 1/2; add, the swap, whose loss exceeds eps below the
    output of e^-eps."""
    sigma, q, eps = mp.mpf(sigma), mp.mpf(q), mp.mpf(eps)
    grows = mp.e ** (-eps if add else eps) - 1 + q
    if grows <= 0:  # no loss beyond eps (add) or none at or below it (remove)
        above = (mp.mpf(0),) * 2 if add else (mp.mpf(1),) * 2
        below = (mp.mpf(1),) * 2 if add else (mp.mpf(0),) * 2
    else:
        x = sigma**2 * mp.log(grows / q) + mp.mpf(1) / 2
        # each tail from its own side's normal tail: no 1 - (a value near 1)
        low, low_shifted = mp.ncdf(x / sigma), mp.ncdf((x - 1) / sigma)
        high, high_shifted = mp.ncdf(-x / sigma), mp.ncdf(-(x - 1) / sigma)
        if add:  # the loss exceeds eps below x
            above = (low, (1 - q) * low + q * low_shifted)
            below = (high, (1 - q) * high + q * high_shifted)
        else:
            above = ((1 - q) * high + q * high_shifted, high)
            below = ((1 - q) * low + q * low_shifted, low)
    if eps >= 0:
        return above[0] - mp.e**eps * above[1]
    return mp.e**eps * below[1] - below[0]


def subsampled_gaussian_two_steps_delta(sigma: float, q: float, eps: float) -> float:
    """delta(eps) of two Poisson-subsampled Gaussian steps under remove (P the mixture, Q the
    normal; the larger direction wherever eps > 0 and q is small), as the first step's output x
    weighted by P and the one-step curve at eps less x's loss: integral of
    P(x) delta_1(eps - L(x)) dx (mpmath quadrature at 25 digits, about 1e-5 relative)."""
    with mp.workdps(25):
        sigma, q, eps = mp.mpf(sigma), mp.mpf(q), mp.mpf(eps)

        def weighted(x):
            rest = eps - mp.log(1 - q + q * mp.e ** ((2 * x - 1) / (2 * sigma**2)))
            one = subsampled_gaussian_curve_mp(sigma, q, rest, add=False)
            if rest < 0:  # the curve's excess over 1 - e^eps there
                one += 1 - mp.e**rest
            return ((1 - q) * mp.npdf(x, 0, sigma) + q * mp.npdf(x, 1, sigma)) * one

        # the loss leaves 0 where q e^((2x - 1) / (2 sigma^2)) reaches 1: breakpoints through it
        top = 1 + 12 * sigma + 3 * eps * sigma**2
        return float(mp.quad(weighted, [-mp.inf, *mp.linspace(-10 * sigma, top, 40), mp.inf]))


def gaussian_tradeoff(mu: float, alpha: float) -> float:
    """beta(alpha) of G_mu: Phi(Phi^-1(1 - alpha) - mu)."""
    alpha = mp.mpf(alpha)
    if alpha <= 0:
        return 1.0
    if alpha >= 1:
        return 0.0
    with mp.workdps(60 + int(-mp.log10(alpha))):  # 2 alpha - 1 must not round to -1
        return float(mp.ncdf(-mp.sqrt(2) * mp.erfinv(2 * alpha - 1) - mu))


def rr_renyi(eps: float, order: float) -> float:
    """Rényi divergence of R_{eps,0} (laplace-transform-dp.txt Thm 3.5)."""
    eps, a = mp.mpf(eps), mp.mpf(order)
    p = mp.e**eps / (1 + mp.e**eps)
    if a == 1:  # KL: p log(p / (1-p)) + (1-p) log((1-p) / p)
        return float((2 * p - 1) * eps)
    return float(mp.log(p**a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1))


#: (epsilon_0, delta_0) of randomized responses checked against their exact curves.
RR_CASES = [(0.1, 1e-9), (0.5, 1e-3), (1.0, 1e-6), (1.3, 0.0), (3.0, 0.05)]
#: Relative round-off of epsilon(delta) read off an exact PLD (a logarithm of a ratio of sums).
EPSILON_ROUNDOFF = 1e-13


def around_atom(atom: float) -> list[float]:
    """Targets delta below, at, an ulp above, just above and well above ``atom`` (a mass at
    +inf), and two large ones."""
    targets = {atom / 2, atom, float(np.nextafter(atom, 1.0)), atom * (1 + 1e-9),
               1.5 * atom + 1e-12, 0.01, 0.2}
    return sorted(t for t in targets if 0.0 <= t <= 1.0)


def assert_epsilon_brackets(lower, exact, upper) -> None:
    """Optimistic ``lower`` <= ``exact`` <= pessimistic ``upper``, elementwise, up to
    EPSILON_ROUNDOFF (lower is inf only where exact is)."""
    lower, exact, upper = (np.asarray(a, np.float64) for a in (lower, exact, upper))
    assert np.all(lower <= np.where(np.isinf(exact), np.inf, exact * (1 + EPSILON_ROUNDOFF))), (
        lower, exact)
    assert np.all(upper >= exact * (1 - EPSILON_ROUNDOFF)), (upper, exact)


def mixture_delta_mp(sigma, scales, probs, eps, add):
    """delta(eps) of sum_k p_k N(a_k, 1) against N(0, 1) (remove) or the swap (add), a_k =
    scale_k / sigma, in mpmath: the loss log sum_k p_k e^{a_k (x - a_k / 2)} increases in x, so
    the optimal set is a half-line whose end is found by bisection at 50 digits."""
    with mp.workdps(50):
        a = [mp.mpf(s) / sigma for s in scales]
        p = [mp.mpf(v) for v in probs]
        eps = mp.mpf(eps)
        loss = lambda x: mp.log(sum(pk * mp.e ** (ak * (x - ak / 2)) for ak, pk in zip(a, p, strict=True)))  # noqa: E731
        target = -eps if add else eps
        lo, hi = mp.mpf(-100), mp.mpf(100) + max(a)
        for _ in range(250):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if loss(mid) > target else (mid, hi)
        if add:  # P = N(0, 1), L > eps  <=>  x < hi
            value = mp.ncdf(hi) - mp.e**eps * sum(pk * mp.ncdf(hi - ak) for ak, pk in zip(a, p, strict=True))
        else:
            value = sum(pk * mp.ncdf(ak - hi) for ak, pk in zip(a, p, strict=True)) - mp.e**eps * mp.ncdf(-hi)
        return float(value)


def gaussian_mixtures_delta_mp(p_means, q_means, eps) -> float:
    """delta(eps) of P = mean_i N(p_means[i], 1) against Q = mean_j N(q_means[j], 1) (equal
    weights; repeat a mean for a larger weight): the integral of (P - e^eps Q)_+, exact between
    the sign changes of P - e^eps Q (the loss need not be monotone), found on a float scan of step
    1/64 (where both densities underflow the sign is taken as negative: the mass missed is below
    1e-300) and refined in mpmath by a bracketing root search (Anderson-Bjorck, verified to a
    residual of 2^-62; the integral is stationary in each sign change, where the integrand
    vanishes: an edge off by e moves it by about e^2); the masses in mpmath."""
    means, counts = np.unique(np.concatenate([p_means, q_means]), return_inverse=True)
    p_weights = np.bincount(counts[:len(p_means)], minlength=len(means)) / len(p_means)
    q_weights = np.bincount(counts[len(p_means):], minlength=len(means)) / len(q_means)
    scale = float(np.exp(eps))
    low, high = means.min() - 40, means.max() + 40
    ys = np.linspace(low, high, int(64 * (high - low)) + 1)
    densities = np.exp(-0.5 * (ys[:, None] - means[None, :]) ** 2)
    signs = densities @ p_weights - scale * (densities @ q_weights) > 0
    mp_means = [mp.mpf(float(m)) for m in means]
    mp_p, mp_q = ([mp.mpf(float(w)) for w in weights] for weights in (p_weights, q_weights))
    mp_scale = mp.e ** mp.mpf(eps)

    def gap(y):
        dens = [mp.npdf(y - m) for m in mp_means]
        return (mp.fsum(w * d for w, d in zip(mp_p, dens, strict=True))
                - mp_scale * mp.fsum(w * d for w, d in zip(mp_q, dens, strict=True)))

    edges = [-mp.inf]
    for i in np.flatnonzero(signs[1:] != signs[:-1]):
        edges.append(mp.findroot(gap, (mp.mpf(float(ys[i])), mp.mpf(float(ys[i + 1]))),
                                 solver="anderson", tol=mp.mpf(2) ** -124))
    edges.append(mp.inf)
    positive = [bool(signs[0])]
    for _ in edges[2:]:
        positive.append(not positive[-1])
    value = mp.mpf(0)
    for a, b, keep in zip(edges[:-1], edges[1:], positive, strict=True):
        if keep:
            cells = [mp.ncdf(b - m) - mp.ncdf(a - m) for m in mp_means]
            value += mp.fsum((wp - mp_scale * wq) * c for wp, wq, c in zip(mp_p, mp_q, cells, strict=True))
    return float(max(value, 0))
