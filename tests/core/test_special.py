"""pldjax.core.special (log_ndtr, log_ndtr_pair, binomial_pmf) against mpmath (references never from the
code under test)."""

import jax
import mpmath
import numpy as np
import pytest

from pldjax.core import special
from pldjax.core.precision import float64
from pldjax.core.special import binomial_pmf, log_ndtr, log_ndtr_pair

mpmath.mp.dps = 40


def _reference(x: float) -> float:
    x = mpmath.mpf(x)
    return float(mpmath.log(mpmath.ncdf(x)) if x < 0 else mpmath.log1p(-mpmath.ncdf(-x)))


def test_log_ndtr_matches_mpmath_across_branches():
    # both sides of 0, the log1p / log switch (Phi(-a) = 1/4 at a = 0.674), the series at 30,
    # and points where jax.scipy.special.log_ndtr loses digits (x = 5, 8)
    xs = np.array([-1e4, -300.0, -37.5, -30.5, -30.0, -29.5, -10.0, -3.0, -0.675, -0.674, -0.3,
                   -1e-8, 0.0, 1e-8, 0.3, 0.674, 0.675, 1.4, 5.0, 8.0, 10.0, 30.0])
    got = np.asarray(jax.jit(float64(log_ndtr))(xs))
    want = np.array([_reference(x) for x in xs])
    # XLA's erfc is good to 7e-15 relative up to 10, 6e-14 at 21 (x = 30 on the positive side,
    # where the result is -erfc / 2; on the negative side its log dilutes the error)
    np.testing.assert_allclose(got[:-1], want[:-1], rtol=1e-14, atol=0)
    np.testing.assert_allclose(got[-1], want[-1], rtol=1e-13, atol=0)


def test_log_ndtr_extremes_are_not_nan():
    got = np.asarray(float64(log_ndtr)(np.array([-np.inf, -1e200, 1e200, np.inf, 40.0])))
    assert got[0] == -np.inf and got[1] == -np.inf
    assert got[2] == 0.0 and got[3] == 0.0
    assert -1e-300 <= got[4] <= 0.0


def test_log_ndtr_pair_matches_mpmath_on_both_sides():
    # (log Phi(x), log Phi(-x)) from one erfc: both against mpmath, across the same branch points
    xs = np.array([-1e4, -37.5, -30.0, -10.0, -3.0, -0.675, -0.674, -0.3, -1e-8, 0.0, 1e-8, 0.3,
                   0.674, 0.675, 1.4, 5.0, 8.0, 10.0, 29.5, 30.0, 300.0])
    plus, minus = (np.asarray(v) for v in jax.jit(float64(log_ndtr_pair))(xs))
    for got, signed in ((plus, xs), (minus, -xs)):
        want = np.array([_reference(x) for x in signed])
        small = np.abs(signed) < 20  # where log Phi is -erfc / 2 beyond, see above
        np.testing.assert_allclose(got[small | (signed < 0)], want[small | (signed < 0)],
                                   rtol=1e-14, atol=0)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    ends = np.asarray(float64(log_ndtr_pair)(np.array([-np.inf, np.inf]))[0])
    assert ends[0] == -np.inf and ends[1] == 0.0


def test_log_ndtr_complement_side_is_accurate_on_a_dense_grid():
    # x >= 0 takes log(1 - Phi(-x)) from one log with Goldberg's correction for the rounding of
    # 1 - Phi(-x): relative accuracy also where the result is tiny (x = 8: -6e-16) and near
    # Phi(-x) = 1/4 (x = 0.674), where XLA's log1p lost digits; what is left is erfc's error
    # (9e-15 at x = 8.3, as with log1p)
    xs = np.concatenate([np.geomspace(1e-10, 9.0, 300), np.linspace(0.6, 0.75, 50)])
    got = np.asarray(jax.jit(float64(log_ndtr))(xs))
    want = np.array([_reference(x) for x in xs])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
    pair = np.asarray(jax.jit(float64(log_ndtr_pair))(-xs)[1])
    np.testing.assert_allclose(pair, want, rtol=1e-14, atol=0)


def test_stirling_error_table_matches_mpmath():
    for k, value in enumerate(special.STIRLING_ERRORS, start=1):
        exact = mpmath.loggamma(k + 1) - (k + mpmath.mpf(0.5)) * mpmath.log(k) + k \
            - mpmath.log(2 * mpmath.pi) / 2
        assert value == pytest.approx(float(exact), rel=2e-16, abs=0)


#: Outcomes k at which test_binomial_pmf_matches_mpmath reads each binomial (at most 30 + 101 + 3).
_BINOMIAL_KS = 136


@pytest.mark.parametrize("xp", [np, jax.numpy])
@pytest.mark.parametrize(("n", "p"), [(1, 0.3), (7, 1e-3), (40, 0.5), (5000, 0.4999750000000208),
                                      (5000, 4.5397868702434395e-05), (10**5, 0.01),
                                      (16_000_000, 0.5)])
def test_binomial_pmf_matches_mpmath(xp, n, p):
    """A few ulps relative where the log of the mass is small, growing with |log pmf| only (the
    exponential of a large log): log-gamma masses were 8e-12 off at the centre for n = 5000. The
    reference is Binomial(n, p) for the float p, with q = 1 - p exactly (the float q is its
    nearest double: a rounding of q alone moves q^n by up to n ulps)."""
    q = float(1 - mpmath.mpf(p))
    ks = np.unique(np.concatenate([np.arange(min(n, 30) + 1), np.linspace(0, n, 101).round(),
                                   [n // 2, n - 1, n]]))
    # one length for every case (the last k repeated): jax.numpy compiles one program, not one
    # per n
    ks = np.concatenate([ks, np.full(_BINOMIAL_KS - ks.size, ks[-1])])
    with jax.enable_x64(True):
        got = np.asarray(binomial_pmf(ks, n, p, q, xp=xp))
    for k, value in zip(ks.astype(int), got, strict=True):
        exact = mpmath.binomial(n, k) * mpmath.mpf(p) ** k * (1 - mpmath.mpf(p)) ** (n - k)
        if exact < 1e-300:
            assert value < 1e-290
            continue
        scale = 8 + abs(float(mpmath.log(exact)))
        assert abs(value - float(exact)) <= 16 * scale * 2.0**-52 * float(exact)


def test_binomial_pmf_with_certain_outcomes():
    np.testing.assert_array_equal(binomial_pmf(np.arange(4.0), 3, 0.0, 1.0, xp=np), [1, 0, 0, 0])
    np.testing.assert_array_equal(binomial_pmf(np.arange(4.0), 3, 1.0, 0.0, xp=np), [0, 0, 0, 1])
