"""Privacy reports: every bracket holds the truth (closed forms, mpmath) and is tight on the
default grid."""

import json

import jax
import mpmath
import numpy as np
import pytest
from scipy.stats import norm

import pldjax as pj

FPRS = np.geomspace(1e-6, 0.5, 12)


def _gdp_tpr(mu, alpha):
    """TPR of the best test of G_mu at FPR alpha: Phi(Phi^-1(alpha) + mu) (Dong, Roth, Su)."""
    return norm.cdf(norm.ppf(alpha) + mu)


def _gdp_delta(mu, eps):
    """delta_mu(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu), at 40 digits."""
    mpmath.mp.dps = 40
    mu = mpmath.mpf(mu)
    return np.array([float(mpmath.ncdf(mu / 2 - e / mu) - mpmath.exp(e) * mpmath.ncdf(-mu / 2 - e / mu))
                     for e in map(mpmath.mpf, eps)])


def _renyi_divergence(p, q, order) -> float:
    """D_order(P || Q) of two densities on the line, by quadrature at 30 digits."""
    mpmath.mp.dps = 30
    a = mpmath.mpf(order)
    integral = mpmath.quad(lambda x: p(x) ** a * q(x) ** (1 - a), [-mpmath.inf, 0, mpmath.inf])
    return float(mpmath.log(integral) / (a - 1))


def _mixture_tpr(sigma, shifts, weights, alpha):
    """The attacker's best TPR at FPR alpha against one step of a Gaussian whose mean moves by
    shifts[k] / sigma with probability weights[k] (Poisson sampling: shifts (0, 1), weights
    (1 - q, q)), the worse of add and remove, at 40 digits. Remove: P = the mixture against
    Q = N(0, 1), the test rejects P below a threshold t; add: the roles swap."""
    mpmath.mp.dps = 40
    mix = lambda t: sum(w * mpmath.ncdf(t - mpmath.mpf(a) / sigma)  # noqa: E731
                        for a, w in zip(shifts, weights, strict=True))
    # remove: alpha = P(X < t), TPR = 1 - beta = 1 - Q(X >= t) = Phi(t)
    t = mpmath.findroot(lambda t: mix(t) - alpha, mpmath.mpf(norm.ppf(alpha)))
    remove = mpmath.ncdf(t)
    # add: alpha = Q(X > t), TPR = 1 - P(X <= t)
    s = mpmath.findroot(lambda s: 1 - mpmath.ncdf(s) - alpha, mpmath.mpf(norm.isf(alpha)))
    add = 1 - mix(s)
    return float(max(remove, add))


def _laplace_tpr(eps, alpha):
    """Laplace(1 / eps) against its shift by 1 (Dong, Roth and Su's f_eps): beta is
    1 - e^eps a below e^-eps / 2, e^-eps / (4 a) up to 1/2, e^-eps (1 - a) beyond."""
    beta = np.where(alpha < np.exp(-eps) / 2, 1 - np.exp(eps) * alpha,
                    np.where(alpha <= 0.5, np.exp(-eps) / (4 * alpha), np.exp(-eps) * (1 - alpha)))
    return 1 - beta


def _randomized_response_tpr(eps, alpha):
    """R_eps's tradeoff curve is max(0, 1 - e^eps a, e^-eps (1 - a))."""
    return 1 - np.maximum.reduce([np.zeros_like(alpha), 1 - np.exp(eps) * alpha,
                                  np.exp(-eps) * (1 - alpha)])


ONE_MECHANISM = {
    "gdp": ((pj.Event(pj.noise.GDP(1.0)), 1), lambda a: _gdp_tpr(1.0, a)),
    "gaussian_composed": ((pj.Event(pj.noise.Gaussian(2.0)), 4), lambda a: _gdp_tpr(1.0, a)),
    "gaussian_replace_one": ((pj.Event(pj.noise.Gaussian(6.0), None, "replace_one"), 9),
                             lambda a: _gdp_tpr(1.0, a)),
    "subsampled_gaussian": ((pj.Event(pj.noise.Gaussian(0.8), pj.sampling.Poisson(0.2)), 1),
                            lambda a: np.array([_mixture_tpr(0.8, (0, 1), (0.8, 0.2), x)
                                                for x in a])),
    "mixture": ((pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Mixture([0, 1, 2], [0.9, 0.06, 0.04])),
                 1), lambda a: np.array([_mixture_tpr(1.0, (0, 1, 2), (0.9, 0.06, 0.04), x)
                                         for x in a])),
    "laplace": ((pj.Event(pj.noise.Laplace(1.0)), 1), lambda a: _laplace_tpr(1.0, a)),
    "randomized_response": ((pj.Event(pj.noise.RandomizedResponse(1.0)), 1),
                            lambda a: _randomized_response_tpr(1.0, a)),
}


@pytest.mark.parametrize("name", ONE_MECHANISM)
def test_tpr_of_one_mechanism_is_within_round_off_of_the_truth_on_the_default_grid(name):
    """A run that is one mechanism reads its TPR from the mechanism's loss tails: a bracket of
    width 2e-12 around the closed form or mpmath for FPRs in (0, 1] (at 0, the PLDs' bracket),
    whatever the grid."""
    (event, count), truth_of = ONE_MECHANISM[name]
    fprs = np.concatenate([[0.0], FPRS, [0.9, 1.0]])
    report = pj.privacy_report(event, count=count, fprs=fprs)
    truth = np.concatenate([[0.0], truth_of(FPRS), [float(truth_of(np.array([0.9]))[0]), 1.0]])
    assert np.all(report.tpr_lower <= truth) and np.all(truth <= report.tpr_upper)
    assert np.max((report.tpr_upper - report.tpr_lower)[1:]) <= 1e-11


def test_tpr_of_one_mechanism_does_not_depend_on_the_callers_x64(x64_off):
    (event, _), _ = ONE_MECHANISM["mixture"]
    off = pj.privacy_report(event, count=1, fprs=FPRS)
    jax.config.update("jax_enable_x64", True)
    on = pj.privacy_report(event, count=1, fprs=FPRS)
    np.testing.assert_array_equal(off.tpr_lower, on.tpr_lower)
    np.testing.assert_array_equal(off.tpr_upper, on.tpr_upper)


@pytest.mark.parametrize("grid, error", [(None, 1e-4), pytest.param(pj.Grid(step=2**-10), 1e-6,
                                                                   marks=pytest.mark.slow)])
def test_gaussian_dp_report_brackets_the_closed_forms(grid, error):
    """Within 1e-4 of the truth on the default grid (steps of 1/64 nats), 1e-6 on 2^-10."""
    mu = 1.0
    report = pj.privacy_report(pj.gdp(mu, grid=grid), pj.gdp(mu, pessimistic=False, grid=grid),
                               fprs=FPRS)
    truth = _gdp_tpr(mu, FPRS)
    assert np.all(report.tpr_lower <= truth) and np.all(truth <= report.tpr_upper)
    assert np.max(report.tpr_upper - report.tpr_lower) <= error
    deltas = _gdp_delta(mu, report.epsilons)
    assert np.all(report.delta_lower <= deltas) and np.all(deltas <= report.delta_upper)
    assert report.gdp_mu_lower <= mu <= report.gdp_mu_upper
    assert report.gdp_mu_upper - report.gdp_mu_lower <= 10 * error
    # Renyi DP of G_mu at order a is a mu^2 / 2
    assert np.all(report.renyi_lower <= report.orders * mu**2 / 2 * (1 + 1e-12))


def test_randomized_response_pld_tpr_is_exact():
    """Both losses lie on randomized response's lattice, so both PLDs are exact (only round-off
    separates them from the truth); a PLD's report reads its TPR from the PLDs' tradeoff
    curves."""
    eps = 1.0
    report = pj.privacy_report(pj.randomized_response(eps),
                               pj.randomized_response(eps, pessimistic=False), fprs=FPRS)
    truth = _randomized_response_tpr(eps, FPRS)
    assert np.all(report.tpr_lower <= truth) and np.all(truth <= report.tpr_upper)
    np.testing.assert_allclose(report.tpr_upper, truth, rtol=0, atol=1e-11)
    assert np.max(truth - report.tpr_lower) <= 1e-11
    assert np.all(report.epsilon_upper[report.deltas > 0] <= eps * (1 + 1e-12))


@pytest.mark.slow
def test_event_report_reads_the_dpsgd_epsilon_and_renders():
    event = pj.dpsgd_event(1.0, 0.01)
    report = pj.privacy_report(event, count=1000, deltas=[1e-5], assumptions={"model": "a CNN"})
    upper = pj.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)
    lower = pj.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5, pessimistic=False)
    assert report.epsilon_lower[0] <= upper and lower <= report.epsilon_upper[0]
    assert report.epsilon_upper[0] == pytest.approx(upper, rel=1e-4)
    assert 0 < report.gdp_mu_lower <= report.gdp_mu_upper < np.inf
    assert np.all(report.tpr_lower <= report.tpr_upper) and np.all(report.tpr_lower >= report.fprs)
    data = json.loads(report.to_json())
    assert data["assumptions"]["runs"] == 1000 and data["assumptions"]["model"] == "a CNN"
    assert data["epsilon_upper"] == [float(report.epsilon_upper[0])]
    text = report.to_markdown()
    assert "| attacker FPR | TPR lower | TPR upper |" in text and "runs: 1000" in text
    # Renyi DP: the closed form (the pessimistic PLD's atom at +inf makes its own inf), equal to
    # dp-accounting's RDP accountant at integer orders, above it at 1.5 (taken at order 2)
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    rdp = RdpAccountant(orders=list(report.orders))
    rdp.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0)), 1000)
    integer = report.orders == np.round(report.orders)
    np.testing.assert_allclose(report.renyi_upper[integer], rdp._rdp[integer], rtol=1e-9)
    assert np.all(report.renyi_upper >= rdp._rdp)
    assert np.all(report.renyi_lower <= report.renyi_upper)
    # one step's two directions by quadrature: the expansion is the larger
    mixture = lambda x: 0.99 * mpmath.npdf(x) + 0.01 * mpmath.npdf(x, 1)  # noqa: E731
    for order, upper in zip(report.orders[1:3], report.renyi_upper[1:3], strict=True):
        remove = _renyi_divergence(mixture, mpmath.npdf, order)
        add = _renyi_divergence(mpmath.npdf, mixture, order)
        assert upper == pytest.approx(1000 * remove, rel=1e-9) and add <= remove


def test_renyi_dp_of_the_gaussian_is_its_closed_form_and_stays_finite_where_expanded():
    event = pj.Event(pj.noise.Gaussian(2.0), None, "replace_one")  # the output moves by 2
    report = pj.privacy_report(event, count=10, orders=[0.5, 2.0, 8.0])
    orders = np.array([0.5, 2.0, 8.0])
    np.testing.assert_allclose(report.renyi_upper, 10 * orders * 2**2 / (2 * 2.0**2), rtol=1e-12)
    # beyond the largest expanded order the subsampled Gaussian's bound is the PLD's (inf)
    far = pj.privacy_report(pj.dpsgd_event(1.0, 0.01), count=10, orders=[2.0, 5000.0])
    assert np.isfinite(far.renyi_upper[0]) and far.renyi_upper[1] == np.inf


@pytest.mark.slow
def test_report_without_optimistic_pld_has_the_trivial_lower_bounds():
    report = pj.privacy_report(pj.laplace(1.0), fprs=[1e-3, 0.1])
    np.testing.assert_array_equal(report.tpr_lower, [1e-3, 0.1])
    assert report.gdp_mu_lower == 0.0 and np.all(report.epsilon_lower == 0.0)
    # a pure-DP mechanism's infinite orders read as strict JSON
    assert json.loads(report.to_json())["renyi_upper"][0] != "nan"


@pytest.mark.parametrize("call, match", [
    (lambda: pj.privacy_report(pj.gdp(np.array([1.0, 2.0]))), "mechanism must be one PLD"),
    (lambda: pj.privacy_report(pj.gdp(1.0, pessimistic=False)), "pessimistic PLD"),
    (lambda: pj.privacy_report(pj.gdp(1.0), pj.gdp(1.0)), "optimistic must be an optimistic"),
    (lambda: pj.privacy_report(pj.gdp(1.0), fprs=[2.0]), "fprs"),
    (lambda: pj.privacy_report(pj.gdp(1.0), deltas=[np.nan]), "deltas"),
    (lambda: pj.privacy_report(pj.gdp(1.0), orders=[0.0]), "orders"),
    (lambda: pj.privacy_report(pj.dpsgd_event(1.0, 0.01)), "count"),
    (lambda: pj.privacy_report(pj.gdp(1.0), count=3), "count and grid are for an event"),
    (lambda: pj.privacy_report(1.0), "an accountant state or a pj.dp_accounting.PLDAccountant"),
])
def test_bad_report_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_gdp_mu_below_refuses_a_pessimistic_pld():
    from pldjax.kernels.gaussian_dp import gdp_mu_below

    with pytest.raises(ValueError, match="optimistic PLD"):
        gdp_mu_below(pj.gdp(1.0), [1.0])
    assert gdp_mu_below(pj.gdp(1.0, pessimistic=False), []) == 0.0


def test_report_figure_has_both_panels_and_saves(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    report = pj.privacy_report(pj.gdp(1.0), pj.gdp(1.0, pessimistic=False))
    figure = pj.plot.report(report)
    roc, profile = figure.axes
    assert roc.get_xscale() == "log" and roc.get_yscale() == "log"
    assert any("mu" in text.get_text() for text in roc.get_legend().get_texts())
    figure.savefig(tmp_path / "report.png")
    assert (tmp_path / "report.png").stat().st_size > 0


def test_report_of_an_accountant_state_reads_its_run():
    state = pj.accountant.init()
    state = pj.accountant.step(state, 1.0, 0.01, steps=600)
    state = pj.accountant.step(state, 2.0, 0.02, steps=400)
    report = pj.privacy_report(state, deltas=[1e-5])
    upper = pj.accountant.epsilon(state, 1e-5)
    assert report.epsilon_upper[0] == pytest.approx(upper, rel=1e-9)
    assert 0 < report.epsilon_lower[0] <= report.epsilon_upper[0] <= report.epsilon_lower[0] * 1.01
    assert report.assumptions["runs"] == 1000 and " x 600" in report.assumptions["events"]
    # Renyi DP of the two segments, summed: dp-accounting's RDP accountant (at order 2 for 1.5)
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    rdp = RdpAccountant(orders=[max(2.0, a) for a in report.orders])
    for sigma, q, steps in ((1.0, 0.01, 600), (2.0, 0.02, 400)):
        rdp.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    np.testing.assert_allclose(report.renyi_upper, rdp._rdp, rtol=1e-9)
    with pytest.raises(ValueError, match="reads its own run"):
        pj.privacy_report(state, count=3)


def test_profile_figure_labels_its_band_and_leaves_out_round_off(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    figure = pj.plot.profile([("G_1", pj.gdp(1.0), pj.gdp(1.0, pessimistic=False))],
                             epsilons=np.linspace(0.0, 12.0, 49))
    (axes,) = figure.axes
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels == ["G_1 (pessimistic)", "G_1: to the optimistic bound"]
    drawn = axes.get_lines()[0].get_ydata()
    assert np.all(np.isnan(drawn) | (drawn >= 1e-15)) and np.any(np.isnan(drawn))
    figure.savefig(tmp_path / "profile.png")
    assert pj.plot.tradeoff([("G_1", pj.gdp(1.0), pj.gdp(1.0, pessimistic=False))]).axes


def test_a_report_that_runs_for_seconds_says_so_once(monkeypatch, capsys):
    """A first report compiles for seconds: the report speaks, not the calls inside it."""
    import time

    from pldjax.accounting import report as report_module
    from pldjax.core import notice

    upper = pj.gaussian(1.0).self_compose(10)
    lower = pj.gaussian(1.0, pessimistic=False).self_compose(10)
    monkeypatch.delenv("PLDJAX_QUIET", raising=False)
    monkeypatch.setattr(notice, "NOTICE_AFTER", 0.05)
    monkeypatch.setattr(notice, "_POLL", 0.01)
    gdp_mu = report_module.gdp_mu

    def slow_gdp_mu(*args, **kwargs):
        time.sleep(0.3)
        return gdp_mu(*args, **kwargs)

    monkeypatch.setattr(report_module, "gdp_mu", slow_gdp_mu)
    pj.privacy_report(upper, lower)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("pldjax.privacy_report is still running after 0.05 s")
    assert err[1].startswith("pldjax.privacy_report done in ")
