"""pj.opacus: pldjax as an Opacus accountant, against real Opacus (its conventions, its PrivacyEngine,
its RDP and PRV accountants) and dp_accounting. Needs the `opacus` extra (torch); run by
`.ci/run` as its own command (`pytest tests/test_opacus_accountant.py`)."""

import math
import time

import dp_accounting as dpa
import numpy as np
import pytest

opacus = pytest.importorskip("opacus")
torch = pytest.importorskip("torch")

from opacus.accountants import RDPAccountant, create_accountant  # noqa: E402
from opacus.accountants.utils import get_noise_multiplier  # noqa: E402

import pldjax as pj  # noqa: E402

DELTA = 1e-5


def _dp_accounting_rdp(segments, delta):
    acct = dpa.rdp.RdpAccountant()
    for sigma, q, steps in segments:
        acct.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    return acct.get_epsilon(delta)


def test_follows_opacus_history_conventions():
    acct = pj.opacus.PLDAccountant()
    assert isinstance(acct, opacus.accountants.IAccountant)
    assert len(acct) == 0 and acct.get_epsilon(DELTA) == 0.0
    for _ in range(3):
        acct.step(noise_multiplier=1.0, sample_rate=0.01)
    acct.step(noise_multiplier=0.8, sample_rate=0.01)
    rdp = RDPAccountant()
    for sigma in (1.0, 1.0, 1.0, 0.8):
        rdp.step(noise_multiplier=sigma, sample_rate=0.01)
    assert acct.history == rdp.history == [(1.0, 0.01, 3), (0.8, 0.01, 1)]
    assert len(acct) == 4  # steps taken (IAccountant's docstring)
    eps = acct.get_epsilon(DELTA)
    assert acct.history == [(1.0, 0.01, 3), (0.8, 0.01, 1)]  # reading does not change it
    assert eps == acct.get_epsilon(DELTA)
    expected = pj.compose_schedule([(1.0, 0.01, 3), (0.8, 0.01, 1)]).epsilon(DELTA)
    assert eps == pytest.approx(float(expected), rel=1e-12)
    assert acct.mechanism() == "pldjax"

    state = acct.state_dict()
    assert state["mechanism"] == "pldjax" and state["history"] == acct.history

    restored = pj.opacus.PLDAccountant()
    restored.load_state_dict(state)
    assert restored.get_epsilon(DELTA) == eps and len(restored) == 4
    with pytest.raises(ValueError, match="rdp"):
        restored.load_state_dict(rdp.state_dict())


def test_steps_given_as_tensors_are_recorded_on_their_safe_side():
    """Opacus's own accountants take a tensor noise multiplier; a float32 one is recorded on its
    pessimistic side (sigma down, the sampling rate up), a tensor of several values refused."""
    acct = pj.opacus.PLDAccountant()
    acct.step(noise_multiplier=torch.tensor(1.0, dtype=torch.float64), sample_rate=0.01)
    acct.step(noise_multiplier=torch.tensor(0.7), sample_rate=torch.tensor(0.01))
    (sigma, q, steps), (low, high, _) = acct.history
    assert (sigma, q, steps) == (1.0, 0.01, 1)
    assert low < float(np.float32(0.7)) and high > float(np.float32(0.01))
    for got, stored in ((low, np.float32(0.7)), (high, np.float32(0.01))):  # within half an ulp
        assert abs(got - float(stored)) <= float(np.spacing(stored)) / 2
    with pytest.raises(ValueError, match="noise_multiplier must be a single number"):
        acct.step(noise_multiplier=torch.tensor([1.0, 2.0]), sample_rate=0.01)
    assert len(acct.history) == 2


def test_bad_steps_are_refused_and_change_nothing():
    acct = pj.opacus.PLDAccountant()
    acct.step(noise_multiplier=1.0, sample_rate=0.1)
    for kwargs, name in [(dict(noise_multiplier=-1.0, sample_rate=0.1), "noise_multiplier"),
                         (dict(noise_multiplier=float("nan"), sample_rate=0.1), "noise_multiplier"),
                         (dict(noise_multiplier=1.0, sample_rate=1.5), "sample_rate")]:
        with pytest.raises(ValueError, match=name):
            acct.step(**kwargs)
    assert acct.history == [(1.0, 0.1, 1)]
    with pytest.raises(ValueError, match="delta"):
        acct.get_epsilon(-1e-3)
    acct.step(noise_multiplier=0.0, sample_rate=0.1)  # no noise: not private
    assert acct.get_epsilon(DELTA) == math.inf


def test_registry_and_noise_calibration():
    pj.opacus.register()
    pj.opacus.register()  # idempotent
    assert isinstance(create_accountant("pldjax"), pj.opacus.PLDAccountant)
    sigma = get_noise_multiplier(target_epsilon=3.0, target_delta=DELTA, sample_rate=0.01,
                                 steps=1000, accountant="pldjax", epsilon_tolerance=0.01)
    assert float(pj.dpsgd_epsilon(sigma, 0.01, 1000, DELTA)) <= 3.0
    # pldjax's tighter epsilon needs less noise than Opacus's RDP accountant
    assert sigma <= get_noise_multiplier(target_epsilon=3.0, target_delta=DELTA, sample_rate=0.01,
                                         steps=1000, accountant="rdp", epsilon_tolerance=0.01)


def test_privacy_engine_trains_and_checkpoints_with_it(tmp_path):
    pj.opacus.register()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 5), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model = torch.nn.Linear(5, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = opacus.PrivacyEngine(accountant="pldjax")
    model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer,
                                                   data_loader=loader, noise_multiplier=1.1,
                                                   max_grad_norm=1.0)
    assert isinstance(engine.accountant, pj.opacus.PLDAccountant)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    steps = len(engine.accountant)
    assert steps == len(loader) and engine.accountant.history == [(1.1, 0.25, steps)]
    eps = engine.get_epsilon(DELTA)
    # the same accounting up to discretization: dpsgd_epsilon's mechanism windows follow T and
    # delta (a finer grid: 2e-5 relative tighter here), the accountant's PLD keeps the default ones
    assert eps == pytest.approx(float(pj.dpsgd_epsilon(1.1, 0.25, steps, DELTA)), rel=1e-4)
    assert eps >= float(pj.dpsgd_epsilon(1.1, 0.25, steps, DELTA, pessimistic=False))
    path = tmp_path / "checkpoint.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=optimizer)
    other = opacus.PrivacyEngine(accountant="pldjax")
    other.load_checkpoint(path=path, module=model, optimizer=optimizer)
    assert other.get_epsilon(DELTA) == eps


@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.0, 0.01, 10_000), (0.6, 0.05, 2_000)])
def test_near_opacus_prv_and_below_rdp(sigma, q, steps):
    ours = pj.opacus.PLDAccountant()
    ours.history = [(sigma, q, steps)]
    prv = create_accountant("prv")
    prv.history = [(sigma, q, steps)]
    rdp = create_accountant("rdp")
    rdp.history = [(sigma, q, steps)]
    eps = ours.get_epsilon(DELTA)
    assert eps <= rdp.get_epsilon(DELTA)
    assert eps == pytest.approx(prv.get_epsilon(DELTA), abs=0.05)


@pytest.mark.parametrize(("sigma", "q", "steps", "delta"), [
    (1.0, 0.01, 10_000, 1e-18),   # PRV's domain breaks at tiny delta
    (0.8, 0.1, 1_000, 1e-12),
    (0.3, 0.5, 1_000, 1e-5),      # epsilon in the hundreds: PRV hangs or fails here
    (0.5, 1.0, 200, 1e-10),
])
def test_prv_failure_cases_are_answered_soundly_and_quickly(sigma, q, steps, delta):
    acct = pj.opacus.PLDAccountant()
    acct.history = [(sigma, q, steps)]
    start = time.perf_counter()
    eps = acct.get_epsilon(delta)
    elapsed = time.perf_counter() - start
    assert 0 < eps < math.inf and elapsed < 30
    # an upper bound: at or above pldjax's optimistic (lower) estimate; at or below RDP's bound
    lower = float(pj.dpsgd_epsilon(sigma, q, steps, delta, pessimistic=False))
    assert lower <= eps <= _dp_accounting_rdp([(sigma, q, steps)], delta)
    if delta >= 1e-12:  # where the PLD resolves delta, get_delta inverts get_epsilon
        assert acct.get_delta(eps) <= delta * (1 + 1e-9)
    assert 0 <= acct.get_delta(eps) <= 1


def test_tiny_privacy_loss_is_never_negative():
    acct = pj.opacus.PLDAccountant()
    acct.history = [(20.0, 1e-4, 100)]
    eps = acct.get_epsilon(DELTA)
    assert 0.0 <= eps <= 1e-2
    assert eps >= float(pj.dpsgd_epsilon(20.0, 1e-4, 100, DELTA, pessimistic=False))


def test_large_delta_gives_epsilon_zero_not_below():
    """Opacus's RDP conversion is negative for delta near 1 (-3.29 at delta = 1 for sigma = 3);
    epsilon is never negative."""
    from reference import gaussian_delta

    acct = pj.opacus.PLDAccountant()
    acct.history = [(3.0, 1.0, 1)]
    for delta in [0.5, 0.9, 0.999999, 1.0]:
        eps = acct.get_epsilon(delta)
        assert eps >= 0.0 and gaussian_delta(1 / 3, eps) <= delta


def test_delta_of_a_gaussian_is_never_zero():
    """sigma = 5, one step: delta(10) is 6.4e-546 (mpmath), below float64's range; the sound
    float is the smallest positive one, not 0 (the RDP bound's exp underflowed)."""
    acct = pj.opacus.PLDAccountant()
    acct.history = [(5.0, 1.0, 1)]
    for eps in [6.0, 8.0, 10.0, 1e3]:
        assert acct.get_delta(eps) > 0.0


def test_a_composition_too_wide_for_a_grid_is_still_answered():
    """10^9 steps at sigma = 1e3 (q = 1): the PLD composition asks for a coarser Grid, which an
    Opacus user cannot pass; the RDP and Chernoff bounds answer, above the closed form."""
    from reference import gaussian_delta, gaussian_epsilon

    acct = pj.opacus.PLDAccountant()
    acct.history = [(1e3, 1.0, 10**9)]
    mu = math.sqrt(1e9) / 1e3
    eps = acct.get_epsilon(DELTA)
    assert gaussian_epsilon(mu, DELTA) <= eps <= 1.1 * gaussian_epsilon(mu, DELTA)
    assert gaussian_delta(mu, 600.0) <= acct.get_delta(600.0) < 1.0
    # only a composition too wide is answered so: a bad history entry is still an error
    acct.history.append((1.0, 0.1, 2.5))
    with pytest.raises(ValueError, match=r"history\[1\] num_steps"):
        acct.get_epsilon(DELTA)


def test_true_positive_rates_bound_the_attacker():
    """One step at sigma sqrt 3 with q = 1, three times, is G_1: TPR = Phi(Phi^-1(FPR) + 1)."""
    from scipy.stats import norm

    acc = pj.opacus.PLDAccountant()
    assert acc.get_true_positive_rates(0.1) == pytest.approx(0.1, abs=1e-12)
    for _ in range(3):
        acc.step(noise_multiplier=math.sqrt(3), sample_rate=1.0)
    fprs = np.array([1e-4, 0.1])
    tpr = acc.get_true_positive_rates(fprs)
    exact = norm.cdf(norm.ppf(fprs) + 1.0)
    assert np.all(tpr >= exact) and np.all(tpr - exact <= 1e-4)
    acc.step(noise_multiplier=0.0, sample_rate=0.5)
    assert acc.get_true_positive_rates(0.1) == 1.0
    with pytest.raises(ValueError, match="false_positive_rates"):
        acc.get_true_positive_rates(-0.1)
