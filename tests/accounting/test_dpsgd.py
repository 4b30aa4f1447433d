"""DP-SGD accounting: batched configurations, schedules, sharding, CLI."""

import collections
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import jax
import mpmath as mp
import numpy as np
import pytest
from compiled_programs import (
    accounting_compiled,
    accounting_on_the_host,
    compiled_programs,
    programs_of_a_new_process,
)
from reference import (
    RR_CASES,
    around_atom,
    assert_epsilon_brackets,
    discrete_laplace_epsilon,
    gaussian_delta_mp,
    gaussian_epsilon,
    gaussian_epsilon_mp,
    laplace_epsilon,
    replace_one_gaussian_epsilon,
    rr_kfold_epsilon,
    subsampled_gaussian_two_steps_delta,
)

import pldjax as pj

SIGMAS = np.array([[0.8], [1.5]])
QS = np.array([0.02, 1.0])


def _kernel_calls(monkeypatch) -> dict[str, list]:
    """Every call of an accounting kernel (a pldjax.core.compilation.ExportedKernel) from now
    on, as (kernel, args, kwargs), listed under the name of the kernel's program (as JAX names
    it in its compile log: "jit(NAME)")."""
    from pldjax.core import compilation

    calls = collections.defaultdict(list)
    run = compilation.ExportedKernel.__call__

    def spy(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        # a call that returns shapes only started its program's compile (compiling_ahead)
        if not any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(out)):
            calls[self.__name__].append((self, args, kwargs))
        return out

    monkeypatch.setattr(compilation.ExportedKernel, "__call__", spy)
    return calls


def _configurations_done(err: str) -> list[int]:
    """The counts of configurations done that a progress bar on stderr reported, in order."""
    return [int(report.split("] ")[1].split("/")[0]) for report in err.split("\r")[1:]]


@pytest.mark.slow
def test_arrays_broadcast_and_match_one_at_a_time():
    got = pj.dpsgd_epsilon(SIGMAS, QS, 50, 1e-5)
    assert got.shape == (2, 2)
    for i, sigma in enumerate(SIGMAS[:, 0]):
        for j, q in enumerate(QS):
            # a batch groups configurations by the grid each gets alone: the same values
            assert got[i, j] == pytest.approx(pj.dpsgd_epsilon(sigma, q, 50, 1e-5), rel=1e-9)
            # the public path's window leaves 1e-18 outside, dpsgd's delta / 2^20 (charged to
            # delta, so epsilon rises by about a millionth)
            one = pj.gaussian(sigma, sampling_prob=q).self_compose(50).epsilon(1e-5)
            if q == 1:  # the closed form of G_mu, mu = sqrt(50) / sigma: tighter than any grid
                assert gaussian_epsilon(np.sqrt(50) / sigma, 1e-5) <= got[i, j] <= one
            else:
                assert got[i, j] == pytest.approx(one, rel=1e-6)
    lower = pj.dpsgd_epsilon(SIGMAS, QS, 50, 1e-5, pessimistic=False)
    assert np.all(lower <= got) and np.all(got - lower <= 2e-3 * got)


def test_a_sweep_composed_in_worker_threads_does_not_depend_on_the_callers_x64(x64_off):
    # (test_delta_and_epsilon_are_inverse's sweep: two configurations, four rows)
    with warnings.catch_warnings():  # a float32 truncation warned of in a worker is an error
        warnings.simplefilter("error")
        off = pj.dpsgd_epsilon(1.2, 0.05, [10, 200], 1e-6)
    with jax.enable_x64(True):
        on = pj.dpsgd_epsilon(1.2, 0.05, [10, 200], 1e-6)
    assert off.dtype == np.float64
    np.testing.assert_array_equal(off, on)


def test_a_failed_composition_call_is_raised_and_its_workers_end(monkeypatch):
    accounting_compiled(monkeypatch)
    from pldjax.core import compilation

    run, failed_in = compilation.ExportedKernel.__call__, []

    def failing(self, *args, **kwargs):
        ahead = any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(args))
        if self.__name__ != "_compose_and_evaluate" or ahead:
            return run(self, *args, **kwargs)
        failed_in.append(threading.current_thread().name)
        raise RuntimeError("composition failed")

    monkeypatch.setattr(compilation.ExportedKernel, "__call__", failing)
    with pytest.raises(RuntimeError, match="composition failed"):  # rows enough for workers
        pj.dpsgd_epsilon(1.2, 0.05, [10, 200, 500, 1000], 1e-6)
    assert failed_in and all(name.startswith("pldjax-compose") for name in failed_in)
    assert not [t for t in threading.enumerate() if t.name.startswith("pldjax-compose")]


def test_delta_and_epsilon_are_inverse():
    eps = pj.dpsgd_epsilon(1.2, 0.05, [10, 200], 1e-6)
    back = pj.dpsgd_delta(1.2, 0.05, [10, 200], eps)
    np.testing.assert_allclose(back, 1e-6, rtol=1e-6)
    # both are upper bounds; their windows (and so their round-off bounds, about 1e-15 here)
    # differ, the delta path's charging less tail
    assert np.all(back <= 1e-6 + 1e-14)


def test_optimistic_delta_and_epsilon_are_inverse_at_small_delta(monkeypatch):
    """sigma 0.744, q 1.24e-3, T 184,565 at delta 1e-9: the optimistic epsilon read 7.8598 on
    the host (and 7.8923 compiled at delta 8.6e-10), where the optimistic delta is 1.029e-9:
    its one-step masses summed to 1 + 2^-52, and the composition took the surplus, 4e-11 after
    that many steps, from the highest bins (in the epsilon's window; the delta's summed to 1).
    Both on the host: the compiled kernels share the composition's code."""
    accounting_on_the_host(monkeypatch)
    args = (0.744, 1.24e-3, 184_565)
    eps = pj.dpsgd_epsilon(*args, 1e-9, pessimistic=False)
    assert pj.dpsgd_delta(*args, eps, pessimistic=False) == pytest.approx(1e-9, rel=1e-6)
    assert eps <= pj.dpsgd_epsilon(*args, 1e-9)


@pytest.mark.slow
def test_a_billion_steps_of_a_tiny_sampling_probability_are_bracketed():
    """sigma 1, q 1e-9, T 1e9: the loss of T steps is Gaussian to about 1e-8 relative (its
    first-order correction vanishes), so delta(0) = 2 Phi(mu / 2) - 1 with mu^2 = T q^2
    (e^{1 / sigma^2} - 1) = 1.6537020e-5. The pessimistic value holds (1.65397e-5), and so does
    the optimistic one (1.65239e-5; it read 1.65551e-5 when its curve came from the difference
    of the mixture's tails, which nearly cancel at q = 1e-9)."""
    mu = mp.sqrt(10**9 * mp.mpf(1e-9) ** 2 * mp.expm1(1))
    truth = float(2 * mp.ncdf(mu / 2) - 1)
    assert pj.dpsgd_delta(1.0, 1e-9, 10**9, 0.0) >= truth * (1 - 1e-6)
    assert pj.dpsgd_delta(1.0, 1e-9, 10**9, 0.0, pessimistic=False) <= truth * (1 + 1e-6)


def test_optimistic_epsilon_resolves_a_loss_bulk_within_q_of_zero(monkeypatch):
    """sigma 0.3, q 1e-3: the loss lies within q of 0 but for a sampled record's; on the accuracy
    step (2^-8 nats) connect-the-dots' lower curve collapsed and the privacy buckets' fallback read
    21.88 after 1,000 steps at delta 1e-8, where the upper bound is 28.508. On a step of at most
    q the lower bound is within 1e-3 of it, and at most a finer grid's lower bound (the planner's
    choice of steps, the same on the host as compiled)."""
    accounting_on_the_host(monkeypatch)
    upper = pj.dpsgd_epsilon(0.3, 1e-3, 1000, 1e-8)
    lower = pj.dpsgd_epsilon(0.3, 1e-3, 1000, 1e-8, pessimistic=False)
    finer = pj.dpsgd_epsilon(0.3, 1e-3, 1000, 1e-8, pessimistic=False, grid=pj.Grid(step=2.0**-12))
    assert 0.999 * upper <= lower <= upper and lower <= finer * (1 + 1e-9)


def test_an_optimistic_step_whose_composition_no_window_holds_falls_back_to_the_automatic(
        monkeypatch):
    """A step of 2^-40 nats puts 1,000 steps' losses beyond 2^53 grid points (CompositionTooWide):
    the call is the one on the automatic steps (whose buckets fallback reads 21.88)."""
    import pldjax.accounting.engine as engine

    accounting_on_the_host(monkeypatch)
    refined = pj.dpsgd_epsilon(0.3, 1e-3, 1000, 1e-8, pessimistic=False)
    monkeypatch.setattr(engine, "bulk_resolving_steps", lambda spreads, q, read: np.zeros_like(q))
    automatic = pj.dpsgd_epsilon(0.3, 1e-3, 1000, 1e-8, pessimistic=False)
    monkeypatch.setattr(engine, "bulk_resolving_steps", lambda spreads, q, read: q * 0 + 2.0**-40)
    assert pj.dpsgd_epsilon(0.3, 1e-3, 1000, 1e-8, pessimistic=False) == automatic < refined


def test_one_configuration_too_wide_for_its_automatic_step_is_answered_on_a_coarser_one(
        monkeypatch):
    """Where a configuration's composition on its automatic mechanism step would need more than
    grid.MAX_SIZE points (here made smaller, so that DP-SGD at 10^4 steps needs 1.5x it), the
    call runs on a step twice as coarse: still bounds on each side of the truth (the ones on the
    automatic step bracket it), within 1e-3 of them; up to AUTOMATIC_COARSENING times the step,
    and for one configuration alone (a batch, or 24x, is refused as before)."""
    from pldjax.core import grid
    from pldjax.kernels.compose import CompositionTooWide

    args = (1.0, 0.01, 10_000, 1e-5)
    upper, lower = pj.dpsgd_epsilon(*args), pj.dpsgd_epsilon(*args, pessimistic=False)
    monkeypatch.setattr(grid, "MAX_SIZE", 2**16)
    coarse_upper = pj.dpsgd_epsilon(*args)
    coarse_lower = pj.dpsgd_epsilon(*args, pessimistic=False)
    assert lower <= coarse_upper <= upper * (1 + 1e-3)
    assert lower * (1 - 1e-3) <= coarse_lower <= upper
    with pytest.raises(CompositionTooWide, match="window of 98304"):
        pj.dpsgd_epsilon(np.array([1.0, 1.1]), 0.01, 10_000, 1e-5)
    monkeypatch.setattr(grid, "MAX_SIZE", 2**12)
    with pytest.raises(CompositionTooWide, match="window of 98304"):
        pj.dpsgd_epsilon(*args)


@pytest.mark.slow
def test_a_billion_steps_on_a_coarser_automatic_step_stay_below_renyi_dp():
    """sigma 8, q 0.01, 10^9 steps: 5 x 10^7 points on the automatic step (refused before), on
    twice the step the bounds bracket epsilon within 1e-3 and stay below dp-accounting's RDP
    bound (an upper bound on the truth)."""
    from dp_accounting import dp_event, rdp

    upper = pj.dpsgd_epsilon(8.0, 0.01, 10**9, 1e-5)
    lower = pj.dpsgd_epsilon(8.0, 0.01, 10**9, 1e-5, pessimistic=False)
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(8.0)), 10**9)
    assert lower <= upper <= lower * (1 + 1e-3)
    assert upper <= accountant.get_epsilon(1e-5)


def test_epsilon_at_delta_one_is_zero_however_many_steps():
    """Every mechanism is (0, 1)-DP: no window is needed (10^9 steps of sigma 1e-3 needed one of
    5 x 10^7 points and raised CompositionTooWide), for one mechanism or a mixture of PLDs."""
    assert pj.dpsgd_epsilon(1e-3, 1.0, 10**9, 1.0) == 0.0
    np.testing.assert_array_equal(pj.dpsgd_epsilon(1.0, 0.01, 10**4, np.array([1e-5, 1.0])) > 0,
                                  [True, False])
    event = pj.Event(pj.noise.Gaussian(1e-3), pj.sampling.RandomAllocation(10, 2))
    assert pj.event_epsilon(event, 10**9, 1.0) == 0.0


def test_nothing_spent_without_steps_or_sampling():
    assert pj.dpsgd_epsilon(1.0, 0.01, 0, 1e-5) == 0.0
    assert pj.dpsgd_epsilon(1.0, 0.0, 100, 1e-5) == 0.0
    assert pj.dpsgd_delta(1.0, 0.01, 0, 0.0) == 0.0


@pytest.mark.parametrize("args,match", [
    ((0.0, 0.01, 10, 1e-5), "noise_multiplier"),
    ((1.0, 1.5, 10, 1e-5), "sampling_prob"),
    ((1.0, 0.01, 2.5, 1e-5), "steps"),
    ((1.0, 0.01, -1, 1e-5), "steps"),
    ((1.0, 0.01, 10, 2.0), "delta"),
    ((1.0, float("nan"), 10, 1e-5), "sampling_prob"),
])
def test_bad_input_names_the_argument(args, match):
    with pytest.raises(ValueError, match=match):
        pj.dpsgd_epsilon(*args)


@pytest.mark.parametrize("call,match", [
    (lambda: pj.dpsgd_epsilon(np.ones(3), np.full(2, 0.01), 100, 1e-5),
     r"noise_multiplier \(3,\), sampling_prob \(2,\), steps \(\), delta \(\)"),
    (lambda: pj.dpsgd_delta(1.0, 0.01, np.array([10, 20]), np.ones(3)),
     r"steps \(2,\), epsilon \(3,\)"),
    (lambda: pj.calibrate_noise_multiplier(1.0, 1e-5, np.full(2, 0.01), np.array([10, 20, 30])),
     r"sampling_prob \(2,\), steps \(3,\)"),
    (lambda: pj.event_epsilon(pj.dpsgd_event(np.ones(2), 0.01), np.array([10, 20, 30]), 1e-5),
     r"parameter 0 \(2,\).*steps \(3,\)"),
    (lambda: pj.compose([pj.gdp(np.ones(3)), pj.gdp(np.ones(2))]),
     r"plds\[0\] \(batch\) \(3,\), plds\[1\] \(batch\) \(2,\)"),
    (lambda: pj.gaussian(np.ones(2), sensitivity=np.ones(3)), r"sigma \(2,\), sensitivity \(3,\)"),
    (lambda: pj.calibrate_noise_multiplier(1.0, 1e-5, 0.01, 2.5), "steps must be whole numbers"),
    (lambda: pj.compose_schedule(5), "segments must be a sequence"),
    (lambda: pj.compose_schedule([5]), r"segments\[0\] must be"),
    (lambda: pj.compose_schedule([(np.ones(2), 0.01, 10)]),
     r"segments\[0\] noise_multiplier must be a single number"),
])
def test_arguments_of_the_wrong_shape_or_kind_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_batch_names_the_configuration_no_window_holds():
    # sigma 0.31, q 0.5, 10^10 steps needs 2^27.6 points, beyond grid.MAX_SIZE: the error says
    # which of the batch's configurations it is
    with pytest.raises(ValueError, match=r"at steps 1e\+10 and delta 1e-05, the mechanism's "
                                         r"parameters \(3\.22581, 0\.5\)"):
        pj.dpsgd_epsilon(np.array([1.0, 0.31]), np.array([0.01, 0.5]), np.array([1000, 10**10]),
                         1e-5)


def test_schedule_composes_segments_exactly():
    whole = pj.dpsgd_epsilon(1.0, 0.02, 300, 1e-5)
    split = pj.compose_schedule([(1.0, 0.02, 100), (1.0, 0.02, 200)]).epsilon(1e-5)
    assert split == pytest.approx(whole, rel=1e-6)
    mixed = pj.compose_schedule([(1.0, 0.02, 100), (0.7, 0.05, 20), (2.0, 0.5, 0)])
    assert not mixed.symmetric
    assert mixed.epsilon(1e-5) > pj.dpsgd_epsilon(1.0, 0.02, 100, 1e-5)
    assert mixed.epsilon(1e-5) > pj.dpsgd_epsilon(0.7, 0.05, 20, 1e-5)
    assert pj.compose_schedule([(1.0, 0.5, 0)]).epsilon(1e-5) == 0.0
    with pytest.raises(ValueError, match="segments\\[1\\]"):
        pj.compose_schedule([(1.0, 0.02, 100), (1.0, 0.02)])
    with pytest.raises(ValueError, match="sampling_prob"):
        pj.compose_schedule([(1.0, -0.1, 100)])


# five configurations on four devices (one chunk padded); alike, so that they share few kernels
_SWEEP = [[1.0, 1.1, 0.9, 1.0, 1.2], [0.02, 0.02, 0.025, 0.03, 0.02], [100, 50, 300, 200, 10]]


@pytest.mark.slow
def test_sharded_sweep_agrees_with_unsharded():
    """Four CPU devices (XLA_FLAGS), configuration axis sharded over a device mesh; on the
    automatic grid and at rtol (each configuration on its own grid step)."""
    code = textwrap.dedent(f"""
        import json, jax, pldjax as pj
        assert len(jax.devices()) == 4, jax.devices()
        print(json.dumps([pj.dpsgd_epsilon(*{_SWEEP!r}, 1e-5, rtol=rtol).tolist()
                          for rtol in (None, 1e-2)]))
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    sharded = np.array(json.loads(out.stdout.strip().splitlines()[-1]))
    # same grids and kernels; only the FFT batch per device differs (round-off level)
    for got, rtol in zip(sharded, (None, 1e-2), strict=True):
        np.testing.assert_allclose(got, pj.dpsgd_epsilon(*_SWEEP, 1e-5, rtol=rtol), rtol=1e-7)


def test_first_call_compiles_only_the_kernels(monkeypatch):
    """A new process's first dpsgd_epsilon on the compiled kernels (no host work, no persistent
    cache) compiles its three kernels (the curve, its masses with their windows placed, the
    composition) and the one-op probe of their XLA options, and nothing else: host glue in NumPy
    (the windows' sizes too), no small program per eager jnp operation (each costs tens of ms to
    compile, and a cache look-up, in every new process)."""
    accounting_compiled(monkeypatch)  # the new process inherits the setting
    names, _ = programs_of_a_new_process("""
        import pldjax as pj
        pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)
    """)
    assert sorted(names) == sorted(["jit(_curve_kernel)", "jit(_tiled_masses_kernel)",
                                    "jit(_compose_and_evaluate)", "jit(option_probe)"]), names


#: Small accounting calls that run on the host where the process has host work left, each with
#: what it exercises there: both directions, one (replace-one), the optimistic estimate, delta,
#: a grid step from rtol, an exact lattice (integer noise), bounded noise read at delta = 0 and
#: above, configurations on mechanism grids of different sizes, and a configuration without steps.
_HOST_CALLS = {
    "dpsgd epsilon": lambda: pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5),
    "optimistic delta, two sizes": lambda: pj.dpsgd_delta(
        [0.6, 2.0], 0.01, [1000, 0], 2.0, pessimistic=False),
    "replace-one at rtol": lambda: pj.dpsgd_epsilon(1.5, 0.02, 500, 1e-6, neighboring="replace_one",
                                                    rtol=1e-2),
    "lattice": lambda: pj.event_delta(pj.Event(pj.noise.DiscreteLaplace([2.0, 3.0])), 10, 1.0),
    "laplace, pure and not": lambda: pj.event_epsilon(
        pj.Event(pj.noise.Laplace(2.0), pj.sampling.Poisson(0.1)), 20, [0.0, 1e-6]),
}


@pytest.mark.parametrize("call", [
    name if name == "dpsgd epsilon" else pytest.param(name, marks=pytest.mark.slow)
    for name in _HOST_CALLS])
def test_small_calls_on_the_host_give_the_compiled_values(monkeypatch, call):
    """While the process has host work left, a small accounting call runs in NumPy and compiles
    nothing (no accounting kernel is called): the same windows, grids and steps as its compiled
    kernels, so the same values to round-off."""
    compiled = _HOST_CALLS[call]()
    accounting_on_the_host(monkeypatch)
    calls = _kernel_calls(monkeypatch)
    on_host = _HOST_CALLS[call]()
    assert not calls, list(calls)
    np.testing.assert_allclose(on_host, compiled, rtol=1e-9, atol=1e-300)


def test_steps_that_reveal_the_record_half_the_time_compose_to_inf_not_an_error(monkeypatch):
    """At sigma 1e-6 or 1e-3 and q = 0.5 a step's finite losses hold about half of P's mass, the
    rest at +inf: after 100 steps the finite part holds 0.5^100 = 8e-31, below any window's tail
    (its Chernoff bounds had crossed, hi < lo, and the call raised). Nothing finite is certified
    at delta 1e-5, and delta at any epsilon is at least the chance that the record's batch was
    drawn at all, 1 - (1 - q)^T. In NumPy (the compiled kernels place windows with the same
    function)."""
    accounting_on_the_host(monkeypatch)
    eps = pj.dpsgd_epsilon(np.array([1e-6, 1e-3, 1.0]), 0.5, 100, 1e-5)
    assert np.all(np.isinf(eps[:2]))
    np.testing.assert_allclose(eps[2], pj.dpsgd_epsilon(1.0, 0.5, 100, 1e-5), rtol=1e-9)
    assert pj.gaussian(1e-6, sampling_prob=0.5).self_compose(100).epsilon(1e-5) == np.inf
    assert pj.dpsgd_delta(1e-6, 0.5, 100, 1.0) == 1.0
    assert pj.dpsgd_delta(1e-3, 0.5, 3, 1.0) >= 1 - 0.5**3
    assert 0.0 <= pj.dpsgd_epsilon(1e-3, 0.5, 100, 1e-5, pessimistic=False) < np.inf


def test_host_work_is_spent_then_the_kernels_compile(monkeypatch):
    """Host work is counted in grid points (the mechanisms' and the composition windows'): once
    the budget is spent, calls compile their kernels, with the same values to round-off."""
    from pldjax.core import compilation

    # two directions of 16,384 mechanism points; the remove one composed on a window of 98,304,
    # which bounds the add direction too
    accounting_on_the_host(monkeypatch, points=2 * 16_384 + 98_304)
    calls = _kernel_calls(monkeypatch)
    on_host = pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)
    assert not calls
    assert compilation.host_work.done == compilation.host_work.budget
    compiled = pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)
    assert calls["_tiled_masses_kernel"] and calls["_compose_and_evaluate"]
    assert compiled == pytest.approx(on_host, rel=1e-9)


def test_a_call_larger_than_the_host_work_left_compiles(monkeypatch):
    # one point short of two mechanism rows and the remove row's window (see above)
    accounting_on_the_host(monkeypatch, points=2 * 16_384 + 98_304 - 1)
    calls = _kernel_calls(monkeypatch)
    pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)
    assert calls["_compose_and_evaluate"]


def test_on_an_accelerator_small_calls_run_on_the_host_too(monkeypatch):
    from pldjax.accounting import engine

    compiled = pj.dpsgd_epsilon([1.0, 2.0], 0.01, 1000, 1e-5)
    accounting_on_the_host(monkeypatch)
    monkeypatch.setattr(engine, "_keeps_chunks_on_device", lambda: True)
    calls = _kernel_calls(monkeypatch)
    on_host = pj.dpsgd_epsilon([1.0, 2.0], 0.01, 1000, 1e-5)
    assert not calls
    np.testing.assert_allclose(on_host, compiled, rtol=1e-9)


def test_on_the_host_a_batch_gives_each_single_calls_value(monkeypatch):
    accounting_on_the_host(monkeypatch)
    sigmas, steps = [0.8, 2.0, 1.0], [10_000, 300, 10_000]
    batch = pj.dpsgd_epsilon(sigmas, 0.01, steps, 1e-5)
    alone = [pj.dpsgd_epsilon(s, 0.01, t, 1e-5) for s, t in zip(sigmas, steps, strict=True)]
    np.testing.assert_array_equal(batch, alone)


def test_a_tiny_delta_on_the_host_reads_a_finite_epsilon_as_the_compiled_kernels_do(monkeypatch):
    """On the host the add rows are exchanged from the remove rows, whose pair leaves a +inf atom
    of about 3e-15 (the round-off bound of Q's mass): composed 10,000 times it read epsilon = inf
    at delta 1e-11 and below. Where it could move the reading the add rows are discretized
    themselves: finite, below Renyi DP's bound and near the compiled kernels' value."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    deltas = np.array([1e-5, 1e-11, 1e-12, 1e-14])
    compiled = pj.dpsgd_epsilon(1.0, 0.01, 10_000, deltas)
    accounting_on_the_host(monkeypatch)
    calls = _kernel_calls(monkeypatch)
    on_host = np.array([pj.dpsgd_epsilon(1.0, 0.01, 10_000, delta) for delta in deltas])
    assert not calls
    renyi = rdp.RdpAccountant()
    renyi.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0)), 10_000)
    assert np.all(on_host <= [renyi.get_epsilon(delta) for delta in deltas])
    np.testing.assert_allclose(on_host, compiled, rtol=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("neighboring", ["add_remove", "replace_one", "replace_special"])
@pytest.mark.parametrize("pessimistic", [True, False])
def test_host_and_compiled_accounting_agree_at_every_relation_down_to_tiny_delta(
        neighboring, pessimistic, monkeypatch):
    """Four configurations (sigma 0.6 to 4, q 0.003 to 0.2, 100 to 10,000 steps), each bound,
    each relation: the host's values are the compiled kernels' to 1e-9 at delta 1e-5 and to 1e-4
    at delta 1e-12 (where the round-off charges, about 1e-15 of delta, move epsilon by a grid
    step or two), all finite."""
    sigmas, qs, steps = [0.6, 1.0, 2.0, 4.0], [0.05, 0.01, 0.003, 0.2], [1000, 10_000, 3000, 100]
    options = dict(neighboring=neighboring, pessimistic=pessimistic)
    compiled = [pj.dpsgd_epsilon(sigmas, qs, steps, delta, **options) for delta in (1e-5, 1e-12)]
    accounting_on_the_host(monkeypatch)
    calls = _kernel_calls(monkeypatch)
    on_host = [np.array([pj.dpsgd_epsilon(s, q, t, delta, **options)
                         for s, q, t in zip(sigmas, qs, steps, strict=True)])
               for delta in (1e-5, 1e-12)]
    assert not calls
    assert np.all(np.isfinite(on_host))
    np.testing.assert_allclose(on_host[0], compiled[0], rtol=1e-9)
    np.testing.assert_allclose(on_host[1], compiled[1], rtol=1e-4)


def test_host_work_without_a_budget_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("PLDJAX_HOST_WORK", "lots")
    with pytest.raises(ValueError, match="PLDJAX_HOST_WORK must be a whole number"):
        pj.dpsgd_epsilon(1.0, 0.01, 100, 1e-5)


def test_accounting_on_the_host_ignores_the_callers_x64(monkeypatch):
    accounting_on_the_host(monkeypatch)
    with_x64 = pj.dpsgd_epsilon([1.0, 3.0], 0.01, 1000, 1e-5)
    jax.config.update("jax_enable_x64", False)
    try:
        without = pj.dpsgd_epsilon([1.0, 3.0], 0.01, 1000, 1e-5)
    finally:
        jax.config.update("jax_enable_x64", True)
    np.testing.assert_array_equal(without, with_x64)


def test_a_new_process_answers_its_first_small_calls_without_compiling(monkeypatch):
    monkeypatch.delenv("PLDJAX_HOST_WORK", raising=False)
    names, printed = programs_of_a_new_process("""
        import pldjax as pj
        print(pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5), pj.dpsgd_delta(2.0, 0.02, 100, 1.0))
    """)
    assert names == []
    epsilon, delta = map(float, printed.split())
    assert epsilon == pytest.approx(6.1879, abs=1e-4) and 0 < delta < 1e-3


def test_a_composition_size_compiles_once_the_host_has_composed_its_share(monkeypatch):
    """Each composition size is composed in NumPy until the process has composed
    engine.HOST_SIZE_POINTS points at it (here one call's), then by its compiled program: a
    loop of one call pays at most that before it compiles."""
    from pldjax.accounting import engine

    accounting_on_the_host(monkeypatch)
    monkeypatch.setattr(engine, "HOST_SIZE_POINTS", 98_304)  # the remove row's window
    calls = _kernel_calls(monkeypatch)
    first = pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)
    assert not calls
    second = pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)
    assert calls["_compose_and_evaluate"] and not calls["_tiled_masses_kernel"]
    assert second == pytest.approx(first, rel=1e-9)


def test_many_rows_on_few_grid_sizes_compile_their_discretization(monkeypatch):
    """More rows per mechanism grid size than engine.HOST_ROWS_PER_SIZE (here 9
    configurations of two directions on one size, against 8) are discretized by the compiled
    kernels, whatever the host work left: a row takes milliseconds in NumPy, a size's program
    seconds to compile."""
    from pldjax.accounting import engine

    accounting_on_the_host(monkeypatch)
    monkeypatch.setattr(engine, "HOST_ROWS_PER_SIZE", 8)
    calls = _kernel_calls(monkeypatch)
    pj.dpsgd_epsilon(np.linspace(1.0, 1.01, 9), 0.01, 1000, 1e-5)
    assert calls["_tiled_masses_kernel"]


def _composed_sizes(calls) -> set[int]:
    """The window sizes the compiled composition ran at, from :func:`_kernel_calls`' record."""
    return {args[0].shape[1] for _, args, _ in calls["_compose_and_evaluate"]}


#: (sigmas, sampling rate, steps) of three configurations on three composition sizes.
_THREE_SIZES = ([0.8, 2.0, 1.0], 0.01, [10_000, 300, 10_000])


def _three_sizes_compiled(monkeypatch):
    """(the kernel-call record, cleared; a call's epsilons and window sizes, compiled throughout)
    of three configurations composed at three window sizes, then every accounting call run on
    the host where it may (:func:`accounting_on_the_host`)."""
    accounting_compiled(monkeypatch)
    calls = _kernel_calls(monkeypatch)
    compiled = pj.dpsgd_epsilon(*_THREE_SIZES, 1e-5)
    every_size = _composed_sizes(calls)
    accounting_on_the_host(monkeypatch)
    calls.clear()
    return calls, compiled, every_size


def test_a_host_call_composes_its_large_sizes_compiled(monkeypatch):
    """A call discretized on the host composes in NumPy only the window sizes of at most
    engine.HOST_SIZE_POINTS points; the others run the compiled composition, with the
    values of a call compiled throughout (to round-off)."""
    from pldjax.accounting import engine

    calls, compiled, every_size = _three_sizes_compiled(monkeypatch)
    monkeypatch.setattr(engine, "HOST_SIZE_POINTS", 50_000)
    mixed = pj.dpsgd_epsilon(*_THREE_SIZES, 1e-5)
    assert not calls["_tiled_masses_kernel"]
    assert set() < _composed_sizes(calls) < every_size
    np.testing.assert_allclose(mixed, compiled, rtol=1e-9)


def test_a_compiled_call_composes_its_sparse_sizes_on_the_host_until_their_share(monkeypatch):
    """A call discretized by the compiled kernels on a CPU composes in NumPy the window sizes it
    has no compiled program for, while the process has composed at most
    engine.HOST_SIZE_POINTS points at each (a sweep's few rows of a size compile nothing);
    a size whose rows go beyond compiles, and is not composed on the host again. The values
    are those of a call compiled throughout, to round-off."""
    from pldjax.accounting import engine

    calls, compiled, every_size = _three_sizes_compiled(monkeypatch)
    monkeypatch.setattr(engine, "HOST_ROWS_PER_SIZE", 0)  # discretized by the compiled kernels
    # one row of the smallest size (12,288 points: the remove row's window) in the share
    monkeypatch.setattr(engine, "HOST_SIZE_POINTS", 20_000)
    mixed = pj.dpsgd_epsilon(*_THREE_SIZES, 1e-5)
    assert calls["_tiled_masses_kernel"]
    assert set() < _composed_sizes(calls) < every_size
    np.testing.assert_allclose(mixed, compiled, rtol=1e-9)
    calls.clear()
    assert pj.dpsgd_epsilon(*_THREE_SIZES, 1e-5) == pytest.approx(mixed, rel=1e-9)
    assert _composed_sizes(calls) == every_size  # each share spent, or its program there
    monkeypatch.setattr(engine, "HOST_SIZE_POINTS", 10**9)
    calls.clear()
    pj.dpsgd_epsilon(*_THREE_SIZES, 1e-5)
    assert _composed_sizes(calls) == every_size  # bought: not rented again, whatever the share


def test_a_cold_compiled_sweep_rents_or_compiles_each_size_for_the_whole_call(monkeypatch):
    """A compiled sweep on a CPU decides from its survey which window sizes it composes in
    NumPy: those whose program is not there to load and whose rows, summed over all its groups
    (one a mechanism grid size), fit in the process's share (engine.HOST_SIZE_POINTS). The
    others start compiling before the first chunk, even where each group's rows of them alone
    would fit, and none of their rows is composed on the host: no size is paid for twice. The
    values are those of a sweep compiled throughout, to round-off."""
    from pldjax.accounting import engine
    from pldjax.core import compilation

    sweep = (np.linspace(0.6, 3.0, 32), 0.01, 3000, 1e-5)
    accounting_compiled(monkeypatch)
    compiled = pj.dpsgd_epsilon(*sweep)
    accounting_on_the_host(monkeypatch)
    monkeypatch.setattr(engine, "HOST_ROWS_PER_SIZE", 0)  # discretized by the compiled kernels
    monkeypatch.setattr(engine, "HOST_SIZE_POINTS", 500_000)  # ten rows of 49,152 points
    # a cold process: every dry run starts new programs, none is there to load
    started = iter(range(10**6))
    monkeypatch.setattr("pldjax.accounting.engine.compiles_started", lambda: next(started))
    monkeypatch.setattr(compilation.ExportedKernel, "stored", lambda *args, **kwargs: False)
    calls = _kernel_calls(monkeypatch)
    mixed = pj.dpsgd_epsilon(*sweep)
    rented = {key[1] for key, points in compilation.host_work.rents.items() if points}
    assert rented and _composed_sizes(calls)
    assert not rented & _composed_sizes(calls)
    np.testing.assert_allclose(mixed, compiled, rtol=1e-9)


def test_a_configuration_alone_after_a_sweep_rents_its_own_program(monkeypatch):
    """A sweep compiles full calls of rows for its window sizes; a configuration alone runs in a
    program of two rows, which it rents on the host (composes in NumPy) until its share is
    spent, as in a process without the sweep, instead of compiling it because the sweep
    compiled another program of its size. The values agree to round-off."""
    from pldjax.accounting import engine

    accounting_on_the_host(monkeypatch)
    calls = _kernel_calls(monkeypatch)
    sigmas = np.linspace(2.0, 2.1, 8)  # one window size
    defaults = {name: getattr(engine, name) for name in ("HOST_ROWS_PER_SIZE",
                                                         "HOST_SIZE_POINTS")}
    for name in defaults:  # the sweep compiled throughout
        monkeypatch.setattr(engine, name, 0)
    sweep = pj.dpsgd_epsilon(sigmas, 0.01, 300, 1e-5)
    assert min(args[0].shape[0] for _, args, _ in calls["_compose_and_evaluate"]) > 2
    for name, value in defaults.items():
        monkeypatch.setattr(engine, name, value)
    calls.clear()
    alone = pj.dpsgd_epsilon(sigmas[3], 0.01, 300, 1e-5)
    assert not calls["_compose_and_evaluate"]
    assert alone == pytest.approx(sweep[3], rel=1e-9)


def test_a_cold_sweep_starts_its_composition_sizes_before_its_first_chunk(monkeypatch):
    """In a process that has just compiled a sweep's discretization programs, a sample of its
    configurations is placed in NumPy first, and the window sizes they meet start compiling
    before the first chunk is composed (here every size the sweep composes, where its first
    chunk alone meets one of three), with the values of a sweep that met each size as its
    chunk was placed."""
    from pldjax.core import compilation

    accounting_compiled(monkeypatch)
    monkeypatch.setattr("pldjax.accounting.engine.CHUNK", 2)  # a chunk meets few sizes
    sweep = (np.linspace(0.6, 3.0, 16), 0.01, 3000, 1e-5)
    monkeypatch.setattr("pldjax.accounting.engine.compiles_started", lambda: 0)
    warm = pj.dpsgd_epsilon(*sweep)  # as in a warm process: no sample placed
    compositions = []  # ("ahead" or "run", window size), in order
    run = compilation.ExportedKernel.__call__

    def spy(self, *args, **kwargs):
        out = run(self, *args, **kwargs)
        if self.__name__ == "_compose_and_evaluate":
            shapes_only = any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(out))
            compositions.append(("ahead" if shapes_only else "run", args[0].shape[1]))
        return out

    started = iter(range(10**6))  # every dry run starts new programs: a cold process
    monkeypatch.setattr("pldjax.accounting.engine.compiles_started", lambda: next(started))
    monkeypatch.setattr(compilation.ExportedKernel, "__call__", spy)
    cold = pj.dpsgd_epsilon(*sweep)
    first_run = compositions.index(next(c for c in compositions if c[0] == "run"))
    started_first = {size for _, size in compositions[:first_run]}
    composed = {size for kind, size in compositions if kind == "run"}
    assert len(composed) > 1 and started_first == composed
    np.testing.assert_array_equal(cold, warm)


def test_composition_shapes_follow_the_window_not_the_mechanism(monkeypatch):
    """The composition kernel compiles once per (rows, window size): each PMF is wrapped to its
    window on the host first, so mechanisms on grids of different lengths share its shapes (a
    sweep met 336 shapes before, one per mechanism size too)."""
    accounting_compiled(monkeypatch)
    from pldjax.accounting import engine as dpsgd

    wraps, wrap = [], dpsgd.wrap_rows

    def spy_wrap(xp, probs, size, centers):
        wraps.append((probs.shape[1], size))
        return wrap(xp, probs, size, centers)

    monkeypatch.setattr(dpsgd, "wrap_rows", spy_wrap)
    calls = _kernel_calls(monkeypatch)
    # sigma 0.6 and 2.0 at q = 0.01, T = 1000: mechanism grids of 16,384 and 4,096 points, both
    # composed on windows of 20,480
    got, names = compiled_programs(lambda: pj.dpsgd_epsilon([0.6, 2.0], 0.01, 1000, 1e-5))
    shapes = {args[0].shape for _, args, _ in calls["_compose_and_evaluate"]}
    assert 0 < len(shapes) < len(set(wraps))
    assert names.count("jit(_compose_and_evaluate)") <= len(shapes)
    np.testing.assert_allclose(got, [pj.dpsgd_epsilon(s, 0.01, 1000, 1e-5) for s in (0.6, 2.0)],
                               rtol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["epsilon", "delta"])
def test_accelerator_path_gives_the_host_path_values(monkeypatch, target):
    """On an accelerator a chunk stays on the device, its masses in tiles of one shape whatever
    the grid (one compiled program), and each composition call's rows are gathered and wrapped
    there (a kernel of its own), always a full call of rows (or, for a call of few
    configurations, the power of two of their rows) on a window of a power of two (one compiled
    composition per octave); forced here on a CPU, it must give the values of the host path,
    for a repeated configuration and rows of several window sizes and grids (with the slow
    tests: each target compiles its own kernels, about 25 s from an empty cache)."""
    from pldjax.accounting import engine as dpsgd

    # sigma 1e-6: windows of 2 and 64 points (a full call of 2-point rows once asked for 567 GB)
    sigma, q, steps = [1.0, 1.0, 1.0, 1e-6], [0.02, 0.02, 0.02, 0.01], [1000, 10, 1000, 1000]
    account, at = ((pj.dpsgd_epsilon, 1e-5) if target == "epsilon" else (pj.dpsgd_delta, 1.0))
    want = account(sigma, q, steps, at)
    monkeypatch.setattr(dpsgd, "_keeps_chunks_on_device", lambda: True)
    calls = _kernel_calls(monkeypatch)
    got = account(sigma, q, steps, at)
    composed = [args[0].shape for _, args, _ in calls["_compose_and_evaluate"]]
    gathered = calls["_gather_rows"] + calls["_gather_tiled_rows"]
    assert len(gathered) == len(composed)  # each call's rows gathered on the device
    masses = {tuple(a.shape for a in jax.tree.leaves(args))
              for _, args, _ in calls["_tiled_masses_kernel"]}
    grids = {int(args[1]) for _, args, _ in calls["_gather_tiled_rows"]}
    assert len(masses) == 1 and len(grids) > 1 and not calls["_masses_kernel"]
    assert len({size for _, size in composed}) > 2
    # 4 configurations, 8 rows: every call a full one of them (the most a call of these windows
    # takes is far more)
    assert all(rows == 8 for rows, _ in composed)
    # there windows are rounded up to powers of two: a wider window leaves less of the tail
    # (charged to delta) outside, which moves epsilon by about 1e-8 and a tiny delta by round-off
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-14)


def _host_round_trips_on_a_gpu(kernel, args, kwargs) -> list[str]:
    """The conditionals, and the loops without a trip count XLA knows, of ``kernel``'s program
    lowered for CUDA and optimized by this machine's XLA (its loop analysis is the one a GPU's
    compiler runs): each would make a GPU wait for the host (see compilation.early_exit_on_cpu)."""
    import re

    from jax.extend import backend

    client = backend.get_backend("cpu")
    compile_ = getattr(client, "compile_and_load", None)
    if compile_ is None:
        pytest.skip("this jaxlib's client has no compile_and_load")
    text = kernel.kernel.trace(*args, **kwargs).lower(lowering_platforms=("cuda",)).as_text()
    hlo = compile_(text, client.devices()[:1]).hlo_modules()[0].to_string()
    return [line.strip()[:100] for line in hlo.splitlines()
            if re.search(r" conditional\(", line)
            or (re.search(r" while\(", line) and "known_trip_count" not in line)]


@pytest.mark.slow
@pytest.mark.parametrize("rtol", [None, 5e-2])
def test_the_sweeps_gpu_programs_never_wait_for_the_host(rtol, monkeypatch):
    """Every program a DP-SGD epsilon runs on an accelerator (the windows' sizes, the curve,
    the masses and window placement in tiles, the gather, the composition), lowered for CUDA:
    no conditional and no loop of unknown length, so the host queues a sweep's chunks while the
    device works (on the CPU the same kernels keep their early exits, as this check shows)."""
    from pldjax.accounting import engine as dpsgd

    monkeypatch.setattr(dpsgd, "_keeps_chunks_on_device", lambda: True)
    calls = _kernel_calls(monkeypatch)
    pj.dpsgd_epsilon([1.0, 2.0], [0.01, 0.1], [1000, 30], 1e-5, rtol=rtol)
    monkeypatch.undo()
    assert set(calls) == {"_curve_kernel", "_tiled_masses_kernel", "_gather_tiled_rows",
                          "_compose_and_evaluate"}
    for name, (first, *_) in calls.items():
        assert _host_round_trips_on_a_gpu(*first) == [], name
    # the check sees them where they are: the composition's power width on the CPU (a window
    # too small for the short width has none)
    assert any(" conditional(" in kernel.kernel.trace(*args, **kwargs).lower().compile().as_text()
               for kernel, args, kwargs in calls["_compose_and_evaluate"])


def test_cli_dpsgd_and_sweep(tmp_path, capsys, monkeypatch):
    from pldjax.cli import main

    accounting_on_the_host(monkeypatch)  # the command line's reading and writing, nothing to compile
    assert main(["epsilon", "--noise-multiplier", "1.0", "--sampling-prob", "0.05", "--steps", "30",
                 "--delta", "1e-5"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("epsilon = ") and "optimistic" in line
    assert float(line.split()[2]) == pytest.approx(pj.dpsgd_epsilon(1.0, 0.05, 30, 1e-5), rel=1e-5)
    configs = tmp_path / "configs.csv"
    configs.write_text("noise_multiplier,sampling_prob,steps,delta\n1.0,0.05,30,1e-5\n2.0,0.1,5,1e-6\n")
    out = tmp_path / "out.csv"
    assert main(["sweep", str(configs), "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "noise_multiplier,sampling_prob,steps,delta,epsilon,epsilon_optimistic"
    second = lines[2].split(",")
    assert float(second[4]) == pytest.approx(pj.dpsgd_epsilon(2.0, 0.1, 5, 1e-6), rel=1e-6)
    assert float(second[5]) <= float(second[4])
    configs.write_text("noise_multiplier,steps,delta\n1.0,30,1e-5\n")
    assert main(["sweep", str(configs)]) == 2
    assert "sampling_prob" in capsys.readouterr().err


def _one_step_exact_epsilon(sigma, q, delta):
    """epsilon(delta) of one Poisson-subsampled Gaussian step (both directions), by bisection on the
    closed-form curve (laplace-transform-dp.txt Thm 5.1 with mpmath Gaussian tails)."""
    from reference import gaussian_delta, subsampled_add_delta, subsampled_remove_delta

    base = lambda e: gaussian_delta(1 / sigma, e)  # noqa: E731
    curve = lambda e: max(subsampled_remove_delta(base, q, e), subsampled_add_delta(base, q, e))  # noqa: E731
    lo, hi = 0.0, 1e4
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if curve(mid) > delta else (lo, mid)
    return lo, hi


@pytest.mark.slow
def test_small_noise_brackets_exact_one_step():
    """sigma = 0.05, q = 0.5: the optimistic value was 284.73 above the exact 280.547."""
    lo, hi = _one_step_exact_epsilon(0.05, 0.5, 1e-5)
    assert pj.dpsgd_epsilon(0.05, 0.5, 1, 1e-5) >= lo
    assert pj.dpsgd_epsilon(0.05, 0.5, 1, 1e-5, pessimistic=False) <= hi


@pytest.mark.slow
def test_two_steps_of_a_tiny_sampling_probability_at_small_delta_are_tight():
    """sigma 0.3, q 1e-6, two steps: delta(4.06662) is 1.0000e-10 (mpmath). All but 4e-3 of a
    step's mass lies in a few bins near 0, next to which the FFT's error comes in spikes; charged
    by their norm, the upper bound is within 5% above (the largest spike charged to each of the
    2^20 bins of the window read 2.05e-10, and epsilon(1e-10) 4.37 for the exact 4.0666)."""
    truth = subsampled_gaussian_two_steps_delta(0.3, 1e-6, 4.06662)
    assert truth * (1 - 1e-4) <= pj.dpsgd_delta(0.3, 1e-6, 2, 4.06662) <= truth * 1.05
    assert pj.dpsgd_delta(0.3, 1e-6, 2, 4.06662, pessimistic=False) <= truth * (1 + 1e-4)


def test_a_million_steps_of_a_tiny_sampling_probability_stay_near_dp_accounting():
    """sigma 0.5, q 1e-6, 10^6 steps, delta 1e-9. Every frequency of a step's spectrum lies
    within about q of its total mass, where the FFT's absolute error is a large relative one,
    which the power multiplies by the count: computed from the deviation from the total mass
    instead, the upper bound is within 2% of dp-accounting's connect-the-dots PLD on 1e-3 nats
    (0.5582); computed directly, the error spread over the window was charged as round-off and
    epsilon read 0.75 (0.88 compiled)."""
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    peer = pldlib.from_gaussian_mechanism(0.5, sampling_prob=1e-6,
                                          value_discretization_interval=1e-3).self_compose(10**6)
    assert pj.dpsgd_epsilon(0.5, 1e-6, 10**6, 1e-9) <= peer.get_epsilon_for_delta(1e-9) * 1.02


@pytest.mark.parametrize("delta, within", [(1e-12, 5e-5), (1e-15, 2e-2)])
def test_one_step_has_no_fft_round_off_to_charge(delta, within):
    """One step is the mechanism's PMF itself, with no FFT round-off to charge: both bounds
    bracket the exact epsilon (mpmath) within 5e-5 at delta = 1e-12 (the upper bound was 2.088
    against the exact 2.075, held up by the round-off of a one-step power) and within 2% at
    1e-15 (5.08 against 3.005). What is left is the round-off of the masses' sum, an ulp or two
    of 1 depending on the compiled program's rounding, which the upper bound charges to its +inf
    atom and the lower one takes off its top: 1e-16 of delta, which at 1e-12, where the curve
    falls by 7e-12 a nat, moves epsilon by 1.5e-5 nats (7e-6 relative)."""
    lo, hi = _one_step_exact_epsilon(1.0, 0.01, delta)
    upper = pj.dpsgd_epsilon(1.0, 0.01, 1, delta)
    lower = pj.dpsgd_epsilon(1.0, 0.01, 1, delta, pessimistic=False)
    assert lo <= upper <= hi * (1 + within), (upper, lo)
    assert lo * (1 - within) <= lower <= hi, (lower, lo)


@pytest.mark.slow
@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
def test_tiny_noise_is_finite_and_sound(q):
    """sigma <= 0.03 gave NaN: the add direction's window missed its loss (the default run keeps
    sigma = 0.02 in test_alone_and_in_a_batch_at_small_noise)."""
    lo, hi = _one_step_exact_epsilon(0.02, q, 1e-5)
    upper = pj.dpsgd_epsilon(0.02, q, 1, 1e-5)
    lower = pj.dpsgd_epsilon(0.02, q, 1, 1e-5, pessimistic=False)
    assert np.isfinite(upper) and upper >= lo
    assert not np.isnan(lower) and 0 <= lower <= hi


@pytest.mark.slow
def test_optimistic_at_a_tiny_sampling_probability_finishes_and_is_below_the_upper_bound():
    """q = 1e-6 over 1e9 steps: four optimistic curves of 2^20 + 1 nearly collinear candidates,
    whose hull the peeling does not settle, so the monotone chain finishes it. A version that
    ran the chain inside vmap took quadratic time here (not done in 300 s); about 10 s now."""
    lower = pj.dpsgd_epsilon(0.6, 1e-6, 10**9, 1e-5, pessimistic=False)
    upper = pj.dpsgd_epsilon(0.6, 1e-6, 10**9, 1e-5)
    assert 0 <= lower <= upper


def test_alone_and_in_a_batch_at_small_noise():
    """NaN alone and finite in a batch: both finite and sound now (a batch shares one
    grid size, so the two can differ within the discretization error)."""
    lo, _ = _one_step_exact_epsilon(0.02, 0.01, 1e-5)
    alone = pj.dpsgd_epsilon(0.02, 0.01, 1, 1e-5)
    batch = pj.dpsgd_epsilon(np.array([0.02, 1.0]), 0.01, 1, 1e-5)
    assert lo <= alone == pytest.approx(batch[0], rel=1e-4) and batch[0] >= lo


@pytest.mark.slow
@pytest.mark.parametrize("pessimistic", [True, False])
def test_an_event_without_sampling_alone_and_in_a_batch_agree_bit_for_bit(pessimistic):
    # a configuration alone was discretized as a batch of one row, which XLA compiles with other
    # reductions than a batch of several: its masses were an ulp away, its epsilon 1e-12
    sigmas = np.array([0.5, 1.0, 2.113234373467543, 3.0])
    steps = np.array([100, 10, 100, 1000])
    event = lambda s: pj.Event(pj.noise.Gaussian(s))  # noqa: E731
    batch = pj.event_epsilon(event(sigmas), steps, 1e-6, pessimistic=pessimistic)
    alone = [pj.event_epsilon(event(s), t, 1e-6, pessimistic=pessimistic)
             for s, t in zip(sigmas, steps, strict=True)]
    np.testing.assert_array_equal(batch, alone)


@pytest.mark.slow
def test_delta_one_costs_nothing_and_delta_at_most_one():
    assert pj.dpsgd_epsilon(0.5, 0.05, 1000, 1.0) == 0.0
    assert pj.dpsgd_delta(1.1, 0.05, 100788, 0.0) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("rtol", [1e-2, 1e-3])
def test_rtol_is_sound_and_about_as_accurate_as_asked_closed_form(rtol):
    # q = 1: T steps of the Gaussian mechanism are G_{sqrt(T) / sigma} exactly
    sigma, steps, delta = 2.0, 100, 1e-5
    truth = gaussian_epsilon(np.sqrt(steps) / sigma, delta)
    upper = pj.dpsgd_epsilon(sigma, 1.0, steps, delta, rtol=rtol)
    lower = pj.dpsgd_epsilon(sigma, 1.0, steps, delta, rtol=rtol, pessimistic=False)
    assert lower <= truth <= upper <= truth * (1 + 3 * rtol)
    back = pj.dpsgd_delta(sigma, 1.0, steps, truth, rtol=rtol)
    assert delta <= back <= 1.0


@pytest.mark.parametrize("sigma,q,count", [
    (1.0, 0.01, 1000), pytest.param(0.8, 0.05, 100, marks=pytest.mark.slow)])
def test_rtol_coarse_is_sound_against_dp_accounting(sigma, q, count):
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    lower_ref = pldlib.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-4, pessimistic_estimate=False
    ).self_compose(count).get_epsilon_for_delta(1e-5)
    upper_ref = pldlib.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-4
    ).self_compose(count).get_epsilon_for_delta(1e-5)
    coarse = pj.dpsgd_epsilon(sigma, q, count, 1e-5, rtol=1e-2)
    assert lower_ref <= coarse <= upper_ref * (1 + 3e-2)
    both = pj.dpsgd_epsilon([sigma, sigma], q, count, 1e-5, rtol=1e-2)
    np.testing.assert_allclose(both, coarse, rtol=1e-12)  # batched: the same grid as alone


@pytest.mark.slow
@pytest.mark.parametrize("sigma,q,count", [(1.147, 0.00104, 139), (2.659, 0.00101, 157)])
def test_rtol_is_about_as_accurate_as_asked_at_small_epsilon(sigma, q, count):
    """Few steps at a small sampling probability: epsilon is tiny (0.05, 0.013) and Renyi DP
    overestimates it 10-17x; a step sized from that estimate was 4x rtol off (bench/dpsgd.py's
    sweep: 85 of 1,024 configurations beyond rtol). Against dp-accounting at 1e-5."""
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    upper_ref = pldlib.from_gaussian_mechanism(
        sigma, sampling_prob=q, value_discretization_interval=1e-5
    ).self_compose(count).get_epsilon_for_delta(1e-5)
    got = pj.dpsgd_epsilon(sigma, q, count, 1e-5, rtol=1e-2)
    lower = pj.dpsgd_epsilon(sigma, q, count, 1e-5, rtol=1e-2, pessimistic=False)
    assert lower <= upper_ref * (1 + 1e-9)
    assert upper_ref * (1 - 1e-3) <= got <= upper_ref * (1 + 1e-2)


def test_renyi_estimate_behind_rtol_matches_dp_accounting():
    """rtol sizes its steps from an epsilon estimate by Renyi DP (never reported): at each of its
    orders the Renyi divergence is dp-accounting's, and the conversion the standard one; the
    extremes (q = 1, q = 0, sigma 1e-6 and 1e17) give numbers, never NaN."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from pldjax.accounting.planner import RDP_ORDERS, rdp_epsilon

    cases = [(1.0, 0.01, 10_000, 1e-5), (2.659, 0.00101, 157, 1e-5), (0.6, 0.05, 100_000, 1e-9),
             (5.0, 1.0, 10, 1e-3), (1.147, 0.3, 1, 0.5)]
    sigma, q, steps, delta = (np.array(column) for column in zip(*cases, strict=True))
    got = rdp_epsilon(sigma, q, steps, delta)
    for (s, p, t, d), value in zip(cases, got, strict=True):
        divergence = rdp._compute_rdp_poisson_subsampled_gaussian(p, s, np.array(RDP_ORDERS))
        expected = np.min(t * divergence + np.log(1 / d) / (np.array(RDP_ORDERS) - 1))
        np.testing.assert_allclose(value, expected, rtol=1e-10)
    extremes = rdp_epsilon(np.array([1.0, 1.0, 1e-6, 1e17]), np.array([1.0, 0.0, 0.01, 0.01]),
                            np.full(4, 1e9), np.full(4, 1e-5))
    assert not np.any(np.isnan(extremes)) and np.all(extremes >= 0)


@pytest.mark.slow
def test_rtol_configurations_of_one_size_share_a_chunk_across_grid_steps(monkeypatch, capsys):
    """rtol gives each configuration its own grid step; those of one mechanism grid size share
    a chunk whatever their steps (one discretization, each row on its own step; a chunk of one
    step each was many small chunks, on a GPU each a few ms of launches), and each gets its
    single call's value."""
    calls = _kernel_calls(monkeypatch)
    sigma, q = np.array([0.8, 1.0, 1.0, 2.0, 1.5]), np.array([0.01, 0.01, 0.02, 0.05, 0.003])
    steps = np.array([100, 1000, 10000, 300, 3000])
    got = pj.dpsgd_epsilon(sigma, q, steps, 1e-5, rtol=1e-2, progress=True)
    monkeypatch.undo()
    # two chunks (a progress report after each), each one discretization: its curves' grid steps
    assert _configurations_done(capsys.readouterr().err) == [1, 5]
    grid_steps = [np.unique(np.asarray(args[2])) for _, args, _ in calls["_curve_kernel"]]
    assert [len(chunk) for chunk in grid_steps] == [1, 3]
    singles = [pj.dpsgd_epsilon(*config, 1e-5, rtol=1e-2)
               for config in zip(sigma, q, steps, strict=True)]
    np.testing.assert_allclose(got, singles, rtol=1e-12)


@pytest.mark.slow
def test_rtol_sets_the_step_and_schedules_take_it():
    coarse, fine = (pj.compose_schedule([(1.0, 0.02, 300)], rtol=r) for r in (1e-1, 1e-3))
    assert float(coarse.step) >= 8 * float(fine.step)
    assert coarse.epsilon(1e-5) >= fine.epsilon(1e-5) * (1 - 1e-3)  # both upper bounds


@pytest.mark.parametrize("rtol", [0.0, -1e-3, 1.5, float("nan"), [1e-2, 1e-3]])
def test_bad_rtol_is_refused(rtol):
    with pytest.raises(ValueError, match="rtol"):
        pj.dpsgd_epsilon(1.0, 0.01, 10, 1e-5, rtol=rtol)


def _max_statistic_epsilon(sigma, q, steps, delta):
    """A lower bound on the true epsilon of ``steps`` Poisson-subsampled Gaussian steps (remove
    direction), from the events S = {some step's output exceeds c}: delta >= P(S) - e^eps Q(S)
    at the true epsilon, so eps >= log((P(S) - delta) / Q(S)) for every c (closed form, SciPy)."""
    from scipy.stats import norm

    c = np.linspace(0.0, 10.0 * sigma + 1.0, 4001)
    base = norm.sf(c / sigma)
    mixed = (1 - q) * base + q * norm.sf((c - 1) / sigma)
    q_s = -np.expm1(steps * np.log1p(-base))
    p_s = -np.expm1(steps * np.log1p(-mixed))
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds = np.log((p_s - delta) / q_s)
    return np.max(bounds[np.isfinite(bounds)])


@pytest.mark.slow
def test_optimistic_value_at_a_coarse_rtol_does_not_collapse():
    # rtol = 1e-2 picks a step coarser than -log(1 - q): the optimistic epsilon read 0, then
    # 198.4 (the pessimistic 314.2); on its own, finer steps it is within 3 rtol
    args = (0.5, 0.05, 10_000, 1e-5)
    lower = float(pj.dpsgd_epsilon(*args, rtol=1e-2, pessimistic=False))
    upper = float(pj.dpsgd_epsilon(*args, rtol=1e-2))
    assert (1 - 3e-2) * upper <= lower <= float(pj.dpsgd_epsilon(*args)) <= upper


@pytest.mark.slow
@pytest.mark.parametrize("sigma,q,steps", [(0.5, 1e-6, 10**7), (0.5, 1e-8, 10**9)])
def test_rtol_answers_where_the_default_grid_does(sigma, q, steps):
    """A tiny sampling probability over many steps: one step's loss spread (q sqrt(e^(1/sigma^2)
    - 1), 7e-6 and 7e-8 nats) asked for steps on which the mechanism's window (2.4 nats wide)
    could not fit the largest mechanism grid; it was placed around its centre, far from the mass
    near 0, and the composition was refused even at rtol = 1, where the default grid answers.
    rtol's step is now never finer than the one on which the window fits."""
    lower = _max_statistic_epsilon(sigma, q, steps, 1e-5)
    default = pj.dpsgd_epsilon(sigma, q, steps, 1e-5)
    default_schedule = pj.compose_schedule([(sigma, q, steps)]).epsilon(1e-5)
    assert lower > 0.03 if q == 1e-6 else lower > 0.0
    for rtol in (1e-2, 1.0):
        got = pj.dpsgd_epsilon(sigma, q, steps, 1e-5, rtol=rtol)
        assert lower <= got <= default * (1 + 1e-9)
        schedule = pj.compose_schedule([(sigma, q, steps)], rtol=rtol).epsilon(1e-5)
        assert lower <= schedule <= default_schedule * (1 + 1e-9)


def test_rtol_too_fine_for_the_composition_names_rtol():
    """rtol = 1e-8 asks 10^6 steps at q = 0.5 for a composition window of 2^27 points (more than
    grid.MAX_SIZE): the refusal says to raise rtol (a fixed Grid cannot be passed with it), as
    does a schedule's of the Gaussian (at q = 1 dpsgd_epsilon reads its closed form, on no grid).
    A step too fine for the mechanism's own window is raised to the finest that fits instead
    (test_rtol_answers_where_the_default_grid_does): 100 subsampled steps answer at rtol = 1e-8."""
    with pytest.raises(ValueError, match="use a larger rtol"):
        pj.dpsgd_epsilon(2.0, 0.5, 10**6, 1e-5, rtol=1e-8)
    with pytest.raises(ValueError, match=r"rtol=1e-08 .* segments\[0\]"):
        pj.compose_schedule([(2.0, 1.0, 10**6)], rtol=1e-8)
    assert pj.dpsgd_epsilon(1.0, 0.01, 100, 1e-5, rtol=1e-8) == pytest.approx(
        pj.dpsgd_epsilon(1.0, 0.01, 100, 1e-5), rel=1e-4)


@pytest.mark.parametrize("sigma,q", [(1e13, 0.01), *(pytest.param(*case, marks=pytest.mark.slow)
                                                    for case in ((1e12, 1.0), (1e17, 1.0)))])
def test_rtol_for_a_loss_narrower_than_min_spread(sigma, q):
    """sigma = 1e13: rtol asked for steps of 2^-46 nats, on which the curve's round-off outweighed
    its masses and the call reported inf; its steps stopped at 2^-43, where the Gaussian without
    sampling (q = 1) still reported inf (delta(0) = 1); they now stop at MIN_SPREAD, 2^-40. The
    truth is 0 (delta(0) = 2 Phi(mu / 2) - 1 <= 1.3e-11 here), as the default grid says."""
    # below: the Gaussian's delta(0) without sampling, erf(mu / sqrt 8) (a subsampled one's is
    # smaller)
    below = math.erf(np.sqrt(1000) / sigma / np.sqrt(8)) if q == 1 else 0.0
    for rtol in (1e-3, 0.1):
        assert pj.dpsgd_epsilon(sigma, q, 1000, 1e-5, rtol=rtol) == 0.0
        assert below <= pj.dpsgd_delta(sigma, q, 1000, 0.0, rtol=rtol) <= 1e-7
    assert pj.dpsgd_epsilon(sigma, q, 1000, 1e-5) == 0.0


@pytest.mark.slow
def test_rtol_optimistic_answers_where_its_window_would_span_too_far():
    """The optimistic estimate's window spans at most grid.OPTIMISTIC_SPAN nats: rtol's step is
    kept within what that allows (these were refused with an error about a Grid.step nobody
    passed). The Gaussian of sigma = 0.05 once is G_20: the closed form lies between the two."""
    truth = gaussian_epsilon(20.0, 1e-5)
    lower = pj.dpsgd_epsilon(0.05, 1.0, 1, 1e-5, rtol=1e-2, pessimistic=False)
    upper = pj.dpsgd_epsilon(0.05, 1.0, 1, 1e-5, rtol=1e-2)
    assert 0.0 < lower <= truth <= upper
    lower, upper = (pj.dpsgd_epsilon(1e-6, 0.01, 100, 1e-5, rtol=1e-2, pessimistic=pessimistic)
                    for pessimistic in (False, True))
    assert 0.0 <= lower <= upper and not np.isnan(lower)


def test_rtol_and_a_fixed_step_are_exclusive():
    with pytest.raises(ValueError, match="rtol"):
        pj.dpsgd_epsilon(1.0, 0.01, 10, 1e-5, rtol=1e-2, grid=pj.Grid(step=2.0**-10))
    with pytest.raises(ValueError, match="rtol"):
        pj.compose_schedule([(1.0, 0.01, 10)], rtol=1e-2, grid=pj.Grid(step=2.0**-10))


@pytest.mark.slow
@pytest.mark.parametrize("delta", [1e-2, 1e-10])
def test_window_tail_follows_delta_and_stays_sound_closed_form(delta):
    # dpsgd_epsilon's windows leave delta / 2^20 outside (charged to delta): still bounds on
    # both sides of the exact value (q = 1: G_{sqrt(T) / sigma}), at the default accuracy
    sigma, steps = 3.0, 300
    truth = gaussian_epsilon(np.sqrt(steps) / sigma, delta)
    upper = pj.dpsgd_epsilon(sigma, 1.0, steps, delta)
    lower = pj.dpsgd_epsilon(sigma, 1.0, steps, delta, pessimistic=False)
    assert lower <= truth <= upper <= truth * (1 + 1e-4)


def test_repeated_configurations_match_single_calls():
    # a configuration given twice is composed once; every row gets its single call's value
    sigmas, steps = [1.0, 2.0, 1.0, 1.0, 2.0], [300, 300, 300, 1000, 300]
    got = pj.dpsgd_epsilon(sigmas, 0.01, steps, 1e-5)
    singles = [pj.dpsgd_epsilon(s, 0.01, t, 1e-5) for s, t in zip(sigmas, steps, strict=True)]
    np.testing.assert_allclose(got, singles, rtol=1e-9)


def test_half_octave_sizes_add_at_most_half_the_points():
    from pldjax.core.grid import half_octave_size

    n = np.arange(1, 5000)
    sizes = np.array([half_octave_size(int(k)) for k in n])
    assert np.all(sizes >= n) and np.all(sizes <= 1.5 * n)
    odd = sizes // (sizes & -sizes)  # the odd factor: 1 or 3 (fast FFT sizes)
    assert set(np.unique(odd)) == {1, 3}
    # two sizes an octave
    assert len(np.unique(sizes[(n > 1024) & (n <= 2048)])) == 2


def test_composition_windows_come_from_a_short_ladder():
    """Few compiled shapes: powers of two up to SMALL_WINDOW points (where padding is cheap),
    two sizes an octave above."""
    from pldjax.accounting.engine import SMALL_WINDOW, composition_size
    from pldjax.core.grid import half_octave_size

    widths = np.arange(1, 4 * SMALL_WINDOW)
    sizes = np.array([composition_size(int(w)) for w in widths])
    small = widths <= SMALL_WINDOW
    assert np.all(sizes >= widths) and np.all(sizes[small] & (sizes[small] - 1) == 0)
    assert len(np.unique(sizes[small])) == int(np.log2(SMALL_WINDOW)) + 1
    np.testing.assert_array_equal(sizes[~small], [half_octave_size(int(w)) for w in widths[~small]])
    assert len(np.unique(sizes[~small])) == 4  # two octaves above SMALL_WINDOW


# -- any event ------------------------------------------------------------------------------------
def test_dpsgd_is_the_accounting_of_its_event():
    event = pj.dpsgd_event(0.8, 0.02, "replace_one")
    assert pj.event_epsilon(event, 50, 1e-5) == pj.dpsgd_epsilon(0.8, 0.02, 50, 1e-5,
                                                                 neighboring="replace_one")


def test_event_matches_laplace_closed_form():
    # one Laplace release: epsilon(delta) = 1/b + 2 log(1 - delta), the loss bounded by 1/b
    scales = np.array([0.5, 2.0])
    got = pj.event_epsilon(pj.Event(pj.noise.Laplace(scales)), 1, 1e-5)
    exact = 1 / scales + 2 * np.log1p(-1e-5)
    assert np.all(got >= exact) and np.all(got <= exact + 1e-3)


@pytest.mark.parametrize("epsilon0, delta0", [
    pytest.param(*case, marks=pytest.mark.slow) if case in ((0.1, 1e-9), (1.3, 0.0)) else case
    for case in RR_CASES])
@pytest.mark.parametrize("steps", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_event_epsilon_of_randomized_response_brackets_its_exact_inverse(epsilon0, delta0, steps):
    # optimistic: a lower bound at the composed atom too (inf there for R_{0.5, 1e-3} when the
    # atom of one step, 1 - (1 - delta_0)^1 in logarithms, rounded above delta_0)
    atom = float(1 - (1 - mp.mpf(delta0)) ** steps)
    targets = around_atom(atom)
    exact = [rr_kfold_epsilon(epsilon0, delta0, steps, t) for t in targets]
    event = pj.Event(pj.noise.RandomizedResponse(epsilon0, delta0))
    lower, upper = (pj.event_epsilon(event, steps, np.array(targets), pessimistic=pe)
                    for pe in (False, True))
    assert_epsilon_brackets(lower, exact, upper)


@pytest.mark.parametrize("noise, exact", [
    (pj.noise.Laplace(0.3), lambda t: laplace_epsilon(1 / 0.3, t)),
    pytest.param(pj.noise.Laplace(7.3), lambda t: laplace_epsilon(1 / 7.3, t),
                 marks=pytest.mark.slow),
    pytest.param(pj.noise.DiscreteLaplace(0.7, 3), lambda t: discrete_laplace_epsilon(1 / 0.7, 3, t),
                 marks=pytest.mark.slow),
    pytest.param(pj.noise.DiscreteLaplace(5.0, 2), lambda t: discrete_laplace_epsilon(1 / 5.0, 2, t),
                 marks=pytest.mark.slow),
])
def test_event_epsilon_of_laplace_noise_brackets_its_exact_inverse(noise, exact):
    targets = np.array([0.0, 1e-300, 1e-12, 1e-6, 0.05, 0.3])
    lower, upper = (pj.event_epsilon(pj.Event(noise), 1, targets, pessimistic=pe)
                    for pe in (False, True))
    assert_epsilon_brackets(lower, [exact(t) for t in targets], upper)


@pytest.mark.parametrize("q", [0.5, 0.99, pytest.param(1.0, marks=pytest.mark.slow)])
def test_replace_one_dpsgd_brackets_the_exact_single_step(q):
    # the mechanism window holds the loss for every q (at q = 1 it left the top out, and
    # sigma = 0.05 raised "steps = 1 is too large"); at q = 1 the truth is G_{2 / sigma}
    sigmas = np.array([0.05, 0.1, 0.15, 0.25, 1.0, 2.0])
    if q == 1.0:
        exact = np.array([gaussian_epsilon(2 / s, 1e-5) for s in sigmas])
    else:
        exact = np.array([replace_one_gaussian_epsilon(1 / s, q, 1e-5) for s in sigmas])
    upper = pj.dpsgd_epsilon(sigmas, q, 1, 1e-5, neighboring="replace_one")
    assert np.all(upper >= exact * (1 - 1e-9)) and np.all(upper <= exact * (1 + 1e-3)), (upper, exact)
    lower = pj.dpsgd_epsilon(sigmas, q, 1, 1e-5, neighboring="replace_one", pessimistic=False)
    assert np.all(lower <= exact * (1 + 1e-9)), (lower, exact)


@pytest.mark.slow
def test_subsampled_event_batch_matches_its_plds():
    # both directions: a batch gives each configuration's own PLD's values
    scales = np.array([0.5, 2.0])
    event = pj.Event(pj.noise.Laplace(scales), pj.sampling.Poisson(0.05))
    eps = pj.event_epsilon(event, 30, 1e-5)
    delta = pj.event_delta(event, 30, eps)
    for i, b in enumerate(scales):
        one = pj.Event(pj.noise.Laplace(b), pj.sampling.Poisson(0.05)).pld().self_compose(30)
        # rel 1e-6: the event path's windows leave delta / 2^20 outside (charged to delta)
        assert eps[i] == pytest.approx(float(one.epsilon(1e-5)), rel=1e-6)
    assert np.all(delta <= 1e-5 * (1 + 1e-6))


def test_integer_noise_batch_gets_each_ones_exact_lattice():
    scales = np.array([2.0, 3.0])
    got = pj.event_delta(pj.Event(pj.noise.DiscreteLaplace(scales)), 10, 1.0)
    for i, b in enumerate(scales):
        one = pj.Event(pj.noise.DiscreteLaplace(b)).pld().self_compose(10)
        # to round-off: the event path's windows are dpsgd.composition_size points,
        # self_compose's powers of two
        assert got[i] == pytest.approx(float(one.delta(1.0)), rel=1e-12)


def test_event_edges_refused_clearly():
    laplace = pj.Event(pj.noise.Laplace(1.0), pj.sampling.Poisson(0.1))
    with pytest.raises(ValueError, match="rtol needs"):
        pj.event_epsilon(laplace, 10, 1e-5, rtol=1e-2)
    with pytest.raises(ValueError, match="rtol needs every segment"):
        pj.compose_schedule([(1.0, 0.1, 10), (laplace, 10)], rtol=1e-2)
    with pytest.raises(ValueError, match="event must be a pldjax.Event"):
        pj.event_epsilon((1.0, 0.1), 10, 1e-5)
    with pytest.raises(ValueError, match="cannot run under jit"):
        jax.jit(lambda s: pj.event_epsilon(pj.Event(pj.noise.Laplace(s)), 1, 1e-5))(1.0)
    with pytest.raises(ValueError, match="scalars"):
        pj.compose_schedule([(pj.Event(pj.noise.Laplace(np.array([1.0, 2.0]))), 3)])
    with pytest.raises(ValueError, match="steps"):
        pj.event_epsilon(laplace, -1, 1e-5)
    # nothing sampled, nothing spent
    assert pj.event_epsilon(pj.Event(pj.noise.Laplace(1.0), pj.sampling.Poisson(0.0)), 5, 0.0) == 0


@pytest.mark.slow
def test_schedule_takes_event_segments():
    laplace = pj.Event(pj.noise.Laplace(2.0))
    mixed = pj.compose_schedule([(laplace, 3), (1.0, 0.5, 2)])
    parts = pj.compose([laplace.pld().self_compose(3), pj.gaussian(1.0, sampling_prob=0.5)
                        .self_compose(2)])
    assert float(mixed.epsilon(1e-5)) == float(parts.epsilon(1e-5))


TRUNCATED = pj.Event(pj.noise.Gaussian(1.0), pj.sampling.TruncatedPoisson(0.05, 1000, 55),
                     "replace_special")


def test_truncated_poisson_events_are_accounted_through_their_pld():
    """TruncatedPoisson's PLD is built by its sampling's pld(), not from one mechanism: the
    batched accounting refused it ("not one mechanism"), although it takes any event."""
    one = TRUNCATED.pld()
    steps = np.array([[0], [1], [5]])
    deltas = np.array([1e-5, 1e-3])
    got = pj.event_epsilon(TRUNCATED, steps, deltas)
    assert got.shape == (3, 2) and np.all(got[0] == 0.0)
    for i, count in enumerate((1, 5)):
        assert np.array_equal(got[i + 1], np.asarray(one.self_compose(count).epsilon(deltas)))
    assert pj.event_delta(TRUNCATED, 5, 1.0) == float(one.self_compose(5).delta(1.0))
    # a batch of noise multipliers: each its own PLD
    batch = pj.Event(pj.noise.Gaussian(np.array([1.0, 2.0])), TRUNCATED.sampling, "replace_special")
    two = pj.Event(pj.noise.Gaussian(2.0), TRUNCATED.sampling, "replace_special").pld()
    assert np.array_equal(pj.event_epsilon(batch, 5, 1e-5),
                          [float(one.self_compose(5).epsilon(1e-5)),
                           float(two.self_compose(5).epsilon(1e-5))])
    with pytest.raises(ValueError, match="rtol needs"):
        pj.event_epsilon(TRUNCATED, 5, 1e-5, rtol=1e-2)


@pytest.mark.slow
def test_truncated_poisson_event_epsilon_is_at_or_below_dp_accounting():
    """At or below dp_accounting's PLD accountant (the tighter of two analyses), within 1e-3,
    after five steps (its PLD takes about 7 s to build; the default run compares the truncated
    Poisson PLD with it in test_truncated_poisson.py)."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import privacy_loss_distribution as dpa_pld

    theirs = dpa_pld.from_truncated_subsampled_gaussian_mechanism(
        1000, 0.05, 55, 1.0, neighboring_relation=NeighboringRelation.REPLACE_SPECIAL)
    assert pj.event_epsilon(TRUNCATED, 5, 1e-5) <= (
        theirs.self_compose(5).get_epsilon_for_delta(1e-5) + 1e-3)


def test_schedule_takes_truncated_poisson_segments():
    mixed = pj.compose_schedule([(TRUNCATED, 3), (1.0, 0.05, 2)], neighboring="replace_special")
    parts = pj.compose([TRUNCATED.pld().self_compose(3),
                        pj.gaussian(1.0, sampling_prob=0.05, neighboring="replace_special")
                        .self_compose(2)])
    assert float(mixed.epsilon(1e-5)) == float(parts.epsilon(1e-5))
    batch = pj.Event(pj.noise.Gaussian(np.array([1.0, 2.0])), TRUNCATED.sampling)
    with pytest.raises(ValueError, match="scalars"):
        pj.compose_schedule([(batch, 3)])


def test_event_accounting_ignores_the_callers_x64(x64_off):
    event = pj.Event(pj.noise.Laplace(np.array([0.5, 2.0])))
    off = pj.event_epsilon(event, 1, 1e-5)
    jax.config.update("jax_enable_x64", True)
    try:
        on = pj.event_epsilon(event, 1, 1e-5)
    finally:
        jax.config.update("jax_enable_x64", False)
    assert np.array_equal(off, on) and off.dtype == np.float64


def test_rows_of_different_chunks_share_a_composition_call(monkeypatch):
    """Rows wait for others of their window size across chunks (a call of fewer rows than
    cores costs a CPU as much as a full one): with one configuration a chunk, a call is padded
    with repeats only at the end, at most once per window size (it was once per chunk)."""
    accounting_compiled(monkeypatch)
    from pldjax.accounting import engine as dpsgd

    calls = _kernel_calls(monkeypatch)
    monkeypatch.setattr(dpsgd, "CHUNK", 1)
    # two rows a call: the points of two windows of 16,384
    monkeypatch.setattr(dpsgd, "COMPOSE_ELEMENTS", 2 * 16_384)
    # q = 0.3: the two directions need windows of different sizes (10,240 and 14,336 points)
    sigmas = np.array([1.0, 1.001, 1.002, 1.003, 1.004])
    got = pj.dpsgd_epsilon(sigmas, 0.3, 100, 1e-5)
    rows = [args[0].shape[0] for _, args, _ in calls["_compose_and_evaluate"]]
    sizes = {args[0].shape[1] for _, args, _ in calls["_compose_and_evaluate"]}
    assert len(sizes) == 2 and max(rows) == 2
    assert sum(rows) - 2 * sigmas.size <= len(sizes)
    np.testing.assert_allclose(got, [pj.dpsgd_epsilon(s, 0.3, 100, 1e-5) for s in sigmas],
                               rtol=1e-12)


def test_progress_counts_every_configuration_once(capsys):
    """``progress=True``: a bar on stderr after each chunk, ending at all configurations (here
    three mechanism grids, so three chunks; zero steps count as nothing to do)."""
    pj.dpsgd_epsilon([0.6, 2.0, 8.0, 1.0], 0.01, [1000, 100, 10, 0], 1e-5, progress=True)
    err = capsys.readouterr().err
    assert err.endswith("] 3/3 configurations\n")
    done = _configurations_done(err)
    assert done == sorted(done)


def test_add_rows_left_out_or_composed_afterwards_give_the_values_of_both_rows(monkeypatch):
    """Poisson subsampling's add pair is its remove pair swapped, so the remove direction's
    composition bounds the add direction too: epsilon's add rows are left out where that bound
    is likely to settle them, and composed afterwards where it does not. Forced here to leave
    out every add row (also where the remove row's window misses the add row's, and at
    q = 0.3 or delta 1e-12, where the bound cannot settle it) or none, the values are those of
    composing both rows, as are those of the rows it chooses."""
    from pldjax.accounting import engine

    accounting_on_the_host(monkeypatch)  # the host's first phase chooses which add rows to leave out
    sigmas, qs, steps = [1.0, 0.5, 1.0, 2.0, 1.0], [0.01, 0.01, 0.3, 0.01, 0.01], 10_000
    deltas = [1e-5, 1e-5, 1e-5, 1e-5, 1e-12]
    chosen = pj.dpsgd_epsilon(sigmas, qs, steps, deltas)
    for leave_out in (np.zeros, np.ones):
        asked = []

        def settled(sizes, *args, fill=leave_out, asked=asked):
            asked.append(len(sizes))
            return fill(len(sizes) // 2, bool)

        monkeypatch.setattr(engine, "_settled_by_remove", settled)
        forced = pj.dpsgd_epsilon(sigmas, qs, steps, deltas)
        assert asked
        np.testing.assert_allclose(forced, chosen, rtol=1e-12)


# the optimistic call runs the same split on kernels of its own (14 s of compiling)
@pytest.mark.parametrize("pessimistic", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_compiled_accounting_composes_the_add_rows_the_remove_bound_leaves_open(pessimistic,
                                                                                monkeypatch):
    """Compiled, Poisson subsampling's remove rows are discretized and composed alone first
    (their composition bounds the add direction, or estimates it in an optimistic call); the
    configurations whose bound stays above delta (delta 1e-12) have their add rows discretized
    and composed afterwards. The values are those of composing both rows of every
    configuration, or (pessimistic) below by round-off."""
    from pldjax.accounting import engine

    accounting_compiled(monkeypatch)
    sigmas, qs, steps = [1.0, 0.5, 1.0, 2.0, 1.0], [0.01, 0.01, 0.3, 0.01, 0.01], 10_000
    deltas = [1e-5, 1e-5, 1e-5, 1e-5, 1e-12]
    calls = _kernel_calls(monkeypatch)
    chosen = np.asarray(pj.dpsgd_epsilon(sigmas, qs, steps, deltas, pessimistic=pessimistic))
    # the rows composed, each known by its grid offset and its delta (a call's padding repeats)
    rows = {row for _, args, _ in calls["_compose_and_evaluate"]
            for row in zip(np.asarray(args[3]).tolist(), np.asarray(args[6]).tolist(),
                           strict=True)}
    assert len(rows) < 2 * len(sigmas)
    assert sum(target == 1e-12 for _, target in rows) == 2  # remove, then add
    monkeypatch.setattr(engine, "_one_direction", lambda compositions, both: False)
    monkeypatch.setattr(engine, "_settled_by_remove",
                        lambda sizes, *args: np.zeros(len(sizes) // 2, bool))
    both = np.asarray(pj.dpsgd_epsilon(sigmas, qs, steps, deltas, pessimistic=pessimistic))
    if pessimistic:
        assert np.all(chosen <= both * (1 + 1e-12))
    np.testing.assert_allclose(chosen, both, rtol=1e-9)


# both windows of one size, and the add window smaller (24,576 and 16,384 points)
@pytest.mark.parametrize("q, steps, delta, compositions", [(0.1, 1000, 1e-5, 1), (0.01, 10, 1e-9, 2)])
def test_a_lone_configuration_discretizes_its_add_row_with_its_remove_row(q, steps, delta,
                                                                           compositions,
                                                                           monkeypatch):
    """Compiled, a call of one configuration discretizes its add row with its remove row (in the
    place of the repeat that pads a discretization to two rows), and composes it in the remove
    row's call where their windows have one size, or alone afterwards, where the remove row's
    bound leaves the add direction open: one discretization instead of two (a batch discretizes
    the add rows afterwards), with the batch's values."""
    accounting_compiled(monkeypatch)
    calls = _kernel_calls(monkeypatch)
    alone = pj.dpsgd_epsilon(1.0, q, steps, delta)
    assert len(calls["_tiled_masses_kernel"]) == 1
    assert len(calls["_compose_and_evaluate"]) == compositions
    # the rows composed, each known by its grid offset: the remove row's and the add row's
    offsets = {offset for _, args, _ in calls["_compose_and_evaluate"]
               for offset in np.asarray(args[3]).tolist()}
    assert len(offsets) == 2
    calls.clear()
    batch = pj.dpsgd_epsilon([1.0, 1.0], q, steps, delta)
    assert len(calls["_tiled_masses_kernel"]) == 2
    np.testing.assert_array_equal(batch, [alone, alone])


@pytest.mark.parametrize("neighboring, shift", [("add_remove", 1.0), ("replace_one", 2.0)])
@pytest.mark.parametrize("sigma, steps, delta", [
    (1.0, 100, 1e-5), (0.5, 1, 1e-10), (1000.0, 10**9, 1e-5), (1e-6, 10**9, 1e-5),
    (3.0, 10**18, 1e-250), (1e17, 1, 1e-5)])
def test_full_batch_steps_are_the_gaussian_closed_form(sigma, steps, delta, neighboring, shift):
    """At sampling probability 1 the steps compose to G_mu, mu = shift sqrt(T) / sigma: both
    bounds bracket its epsilon and delta (mpmath) within 1e-9, on no grid, at any count (10^9
    steps at sigma 1000 took 4.6 s on a grid, 633.95 for 633.93; a calibration there took 41 s
    to refuse)."""
    mu = shift * mp.sqrt(steps) / sigma
    exact = gaussian_epsilon_mp(mu, delta)
    upper = pj.dpsgd_epsilon(sigma, 1.0, steps, delta, neighboring=neighboring)
    lower = pj.dpsgd_epsilon(sigma, 1.0, steps, delta, neighboring=neighboring, pessimistic=False)
    assert lower <= exact <= upper
    assert float(upper - exact) <= 1e-9 * float(exact) + 1e-300
    assert float(exact - lower) <= 1e-9 * float(exact) + 1e-300
    eps = float(exact) / 2
    exact_delta = gaussian_delta_mp(mu, eps)
    upper_delta = pj.dpsgd_delta(sigma, 1.0, steps, eps, neighboring=neighboring)
    lower_delta = pj.dpsgd_delta(sigma, 1.0, steps, eps, neighboring=neighboring,
                                 pessimistic=False)
    assert lower_delta <= exact_delta <= upper_delta <= exact_delta * (1 + 1e-9) + 2e-300
    if mu > 1e-6:  # below, the lower bound's difference of two terms has lost its digits: 0
        assert lower_delta >= exact_delta * (1 - 1e-9) - 2e-300


def test_gaussian_without_sampling_is_read_exactly_alone_in_a_batch_and_calibrated():
    """The event without sampling reads the same closed form as sampling probability 1, alone
    and in a batch with subsampled configurations; delta 0 gives inf (no pure DP), delta 1 and
    zero steps 0; a calibration at 10^9 full-batch steps refuses at once by name, and one it
    can meet holds the target exactly."""
    sigmas, steps = np.array([0.7, 2.0, 5.0]), np.array([10, 1, 10**6])
    alone = pj.event_epsilon(pj.Event(pj.noise.Gaussian(sigmas)), steps, 1e-6)
    batch = pj.dpsgd_epsilon(sigmas, np.array([1.0, 0.01, 1.0]), steps, 1e-6)
    full = pj.dpsgd_epsilon(sigmas, 1.0, steps, 1e-6)
    np.testing.assert_array_equal(alone, full)
    np.testing.assert_array_equal(batch[[0, 2]], full[[0, 2]])
    for (sigma, count), value in zip(zip(sigmas, steps, strict=True), full, strict=True):
        assert value >= gaussian_epsilon_mp(mp.sqrt(count) / sigma, 1e-6)
    assert pj.dpsgd_epsilon(1.0, 1.0, 10, 0.0) == np.inf
    assert pj.dpsgd_epsilon(1.0, 1.0, 10, 1.0) == 0.0 == pj.dpsgd_epsilon(1.0, 1.0, 0, 1e-5)
    assert pj.dpsgd_delta(1.0, 1.0, 10, np.inf) == 0.0
    with pytest.raises(ValueError, match="sigma_max"):
        pj.calibrate_noise_multiplier(1.0, 1e-5, 1.0, 10**9)
    sigma = pj.calibrate_noise_multiplier(1.0, 1e-5, 1.0, 1000)
    assert 0.999 <= gaussian_epsilon_mp(mp.sqrt(1000) / sigma, 1e-5) <= 1.0


def test_full_batch_extremes_are_sound_and_quiet():
    """mu = sqrt(T) / sigma beyond float64's range (sigma 1e-300, 10^15 steps: epsilon about
    mu^2 / 2, past 1e614) reads inf as the upper bound and about the largest float as the lower one;
    mu of 3e-300 reads delta(0) = erf(mu / sqrt 8) between 0 and it plus 1e-300; none warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pj.dpsgd_epsilon(1e-300, 1.0, 10**15, 1e-5) == np.inf
        assert pj.dpsgd_epsilon(1e-300, 1.0, 10**15, 1e-5, pessimistic=False) >= 1e308
        mu = math.sqrt(10) / 1e300
        exact = float(mp.erf(mp.mpf(mu) / mp.sqrt(8)))
        assert 0.0 == pj.dpsgd_delta(1e300, 1.0, 10, 0.0, pessimistic=False) <= exact
        assert exact <= pj.dpsgd_delta(1e300, 1.0, 10, 0.0) <= exact + 1.01e-300
