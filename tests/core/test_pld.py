"""The PLD type: its directions, and where small computations on it run."""

import numpy as np
import pytest
from compiled_programs import compiled_programs
from reference import gaussian_delta

import pldjax as pj
from pldjax.core import pld as pld_module
from pldjax.core.pld import PLD
from pldjax.kernels import discretize


def test_direction_helpers():
    gauss = pj.gaussian(1.0)  # symmetric: one direction stands for both
    assert gauss.forward is gauss and gauss.backward is gauss and gauss.directions() == (gauss,)
    assert gauss.map_directions(lambda d: d) is gauss

    sub = pj.gaussian(1.0, sampling_prob=0.1)  # remove and add directions differ
    forward, backward = sub.directions()
    assert forward.reverse is None and backward is sub.reverse and sub.backward is sub.reverse
    rebuilt = PLD.from_directions(forward, backward)
    np.testing.assert_array_equal(rebuilt.probs, sub.probs)
    assert rebuilt.reverse is backward
    swapped = sub.map_directions(lambda d: d.swap())  # one-direction swaps change nothing
    np.testing.assert_array_equal(swapped.reverse.probs, sub.reverse.probs)

    probs, inf_mass, offset, step = sub.stack_directions()
    n = max(forward.size, backward.size)
    assert probs.shape == (2, n) and inf_mass.shape == offset.shape == step.shape == (2,)
    np.testing.assert_array_equal(probs[1, :backward.size], backward.probs)
    assert np.all(np.asarray(probs[1, backward.size:]) == 0)
    batch = pj.gaussian(np.array([1.0, 2.0]))
    assert batch.stack_directions()[0].shape == (2, 1, batch.size)


def _parts(probs=(0.2, 0.3, 0.5), inf_mass=0.0, offset=-1, step=0.5):
    return np.asarray(probs, np.float64), inf_mass, offset, step


BAD_PARTS = {  # what a caller can get wrong, and the part the error names
    "nan mass": (_parts(probs=(0.2, np.nan, 0.8)), "probs, inf_mass: a mass is NaN"),
    "nan atom": (_parts(inf_mass=np.nan), "probs, inf_mass: a mass is NaN"),
    "negative mass": (_parts(probs=(0.6, -0.1, 0.5)), "probs, inf_mass: a mass is negative"),
    "surplus": (_parts(probs=(0.5, 0.5, 0.5)), "probs, inf_mass: the total mass is not 1"),
    "deficit": (_parts(probs=(0.2, 0.3, 0.4)), "probs, inf_mass: the total mass is not 1"),
    "zero step": (_parts(step=0.0), "step: the step is not finite and > 0"),
    "negative step": (_parts(step=-0.5), "step: the step is not finite and > 0"),
    "infinite step": (_parts(step=np.inf), "step: the step is not finite and > 0"),
    "impossible losses": (_parts(probs=(0.5, 0.0, 0.5), offset=-10, step=1.0),
                          "offset, step: the losses imply a Q mass above 1"),
    "fractional offset": (_parts(offset=-1.5), "offset must be whole numbers"),
    "float32 masses": ((np.float32([0.25, 0.25, 0.5]), 0.0, -1, 0.5), "probs must be float64"),
    "float32 step": ((*_parts()[:3], np.float32(0.5)), "step must be float64"),
    "complex masses": ((np.array([0.2, 0.3, 0.5], complex), 0.0, -1, 0.5),
                       "probs must be real numbers"),
    "no grid point": ((np.zeros((2, 0)), 0.0, 0, 0.5), "at least one grid point"),
    "atom of another batch": ((np.full((2, 2), 0.5), np.zeros(3), 0, 0.5),
                              "inf_mass must broadcast to the batch shape"),
}


@pytest.mark.parametrize("case", BAD_PARTS)
def test_a_pld_from_bad_parts_is_refused_naming_them(case):
    """Before the checks, a NaN mass read epsilon NaN, a zero step or losses no pair of
    distributions has (sum p e^-z > 1) read epsilon 0, and float32 masses (a caller's jnp arrays
    with x64 off) composed to a delta several times the truth."""
    parts, message = BAD_PARTS[case]
    with pytest.raises(ValueError, match=message):
        PLD(*parts)


def test_a_pld_from_good_parts_is_built_as_given():
    assert float(PLD(*_parts()).epsilon(1e-3)) == pytest.approx(0.498, abs=1e-3)
    optimistic = PLD(*_parts(probs=(0.2, 0.3, 0.4)), pessimistic=False)  # 0.1 dropped to -inf
    assert float(optimistic.total_mass()) == pytest.approx(0.9)
    batch = PLD(np.array([[0.5, 0.5], [0.0, 0.9]]), np.array([0.0, 0.1]), 0, 0.5)
    assert batch.batch_shape == (2,)
    with pytest.raises(ValueError, match=r"total mass is not 1.*batch row \(1,\)"):
        PLD(np.array([[0.5, 0.5], [0.0, 0.9]]), 0.0, 0, 0.5)
    allocation = pj.Event(pj.noise.Gaussian(2.0), pj.sampling.RandomAllocation(100, 10))
    for made in (pj.gaussian(1.0, sampling_prob=0.1), pj.laplace(2.0, pessimistic=False),
                 pj.gaussian(np.array([0.5, 2.0])).self_compose(100),
                 # optimistic: mass moved to the window's bottom (Q mass 1 + 1e-7)
                 pj.gaussian(1.0, sampling_prob=0.01, pessimistic=False).self_compose(10_000),
                 # upper bounds on lattice masses held to a Q mass of 1, lower bounds at 1 + 1e-8
                 allocation.pld(), allocation.pld(pessimistic=False),
                 pj.shuffling_lower_bound(1.0, 100)):
        for d in made.directions():  # pldjax's own PLDs pass the checks, as parts
            rebuilt = PLD(np.asarray(d.probs), np.asarray(d.inf_mass), np.asarray(d.offset),
                          np.asarray(d.step), d.pessimistic)
            np.testing.assert_array_equal(rebuilt.probs, d.probs)


PESSIMISTIC_BUILDS = {
    "subsampled gaussian": lambda: pj.gaussian(1.0, sampling_prob=0.01),
    "replace-one gaussian": lambda: pj.gaussian(1.0, sampling_prob=0.01,
                                                neighboring="replace_one"),
    "subsampled laplace": lambda: pj.laplace(0.5, sampling_prob=0.05),
    "randomized response": lambda: pj.randomized_response(1.0, 1e-6),
    "discrete gaussian": lambda: pj.discrete_gaussian(1.0),
    "fixed batch": lambda: pj.Event(pj.noise.Laplace(2.0), pj.sampling.FixedBatch(0.05),
                                    "replace_one").pld(),
    "mixture": lambda: pj.Event(pj.noise.Gaussian(1.0), pj.sampling.Mixture.binomial(0.01, 10),
                                "replace_special").pld(),
    "random allocation": lambda: pj.Event(pj.noise.Gaussian(2.0),
                                          pj.sampling.RandomAllocation(100, 10)).pld(),
    "composed": lambda: pj.gaussian(1.0, sampling_prob=0.01).self_compose(10_000),
}


@pytest.mark.parametrize("build", PESSIMISTIC_BUILDS)
def test_pessimistic_plds_pldjax_builds_are_pairs_a_filter_accepts(build):
    """Total mass 1 and a Q mass (sum p e^-z) at most 1, to MASS_TOLERANCE: the rules of a
    filter's query."""
    pld = PESSIMISTIC_BUILDS[build]()
    assert not [reason for *_, reason, bad in pld_module.pld_problems(pld) if bool(bad)]


def test_parts_under_jit_are_not_checked_and_leaves_round_trip():
    import jax

    @jax.jit
    def rebuilt(probs, step):
        return PLD(probs, 0.0, -1, step).probs

    np.testing.assert_array_equal(rebuilt(np.array([0.2, 0.3, 0.5]), 0.5), [0.2, 0.3, 0.5])
    sub = pj.gaussian(1.0, sampling_prob=0.1)
    leaves, tree = jax.tree_util.tree_flatten(sub)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert again.reverse is not None and again.pessimistic
    batch = pj.gaussian(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(jax.vmap(lambda p: p)(batch).probs, batch.probs)
    axes = PLD(0, 0, 0, 0)  # an axis specification, not parts
    eps = jax.vmap(lambda p: p.epsilon(1e-5), in_axes=(axes,))(batch)
    np.testing.assert_allclose(eps, batch.epsilon(1e-5), rtol=1e-12)


def _compiled_path(monkeypatch):
    """Small PLDs are built and go through the compiled kernels, as large ones do."""
    monkeypatch.setattr(pld_module, "HOST_ROWS", 0)
    monkeypatch.setattr(discretize, "HOST_ROWS", 0)


#: Small PLDs (pessimistic, and optimistic below) of the mechanisms whose tails also run in NumPy.
SMALL_ON_HOST = (
    lambda: pj.gaussian(1.0),
    lambda: pj.gaussian(0.8, sampling_prob=0.1),
    lambda: pj.gaussian(np.array([0.5, 3.0]), sampling_prob=1e-3),
    lambda: pj.laplace(2.0),
    lambda: pj.laplace(0.5, sampling_prob=0.05),
    lambda: pj.randomized_response(1.0, 1e-6),
    lambda: pj.gaussian(1.0, sampling_prob=0.05, neighboring="replace_one"),
    lambda: pj.Event(pj.noise.DiscreteLaplace(0.7)).pld(),
    lambda: pj.Event(pj.noise.DiscreteLaplace(0.7), pj.sampling.Poisson(0.1)).pld(),
    lambda: pj.gaussian(1.0, pessimistic=False),
    lambda: pj.gaussian(0.8, sampling_prob=0.1, pessimistic=False),
    lambda: pj.laplace(2.0, pessimistic=False),
    lambda: pj.randomized_response(1.0, 1e-6, pessimistic=False),
    lambda: pj.gaussian(1.0, sampling_prob=0.05, neighboring="replace_one", pessimistic=False),
    lambda: pj.Event(pj.noise.DiscreteLaplace(0.7), pj.sampling.Poisson(0.1)).pld(
        pessimistic=False),
)


def test_small_plds_are_built_on_the_host_without_compiling():
    _, names = compiled_programs(lambda: [make() for make in SMALL_ON_HOST])
    assert names == []


#: One PLD of each path through the host discretization (pessimistic and optimistic, bounded
#: noise, subsampling) in the default run; every one of SMALL_ON_HOST with the slow tests (each
#: compiles kernels of its own).
HOST_PATHS = {1, 4, 10, 12}


@pytest.mark.parametrize("index", [
    index if index in HOST_PATHS else pytest.param(index, marks=pytest.mark.slow)
    for index in range(len(SMALL_ON_HOST))])
def test_plds_built_on_the_host_are_the_compiled_kernels_to_round_off(monkeypatch, index):
    """The same grids, and masses within their round-off, 64 ulps over the step each (masses
    are second differences of the curve over the step; NumPy's and XLA's erfc, logs and sums
    round differently)."""
    host = SMALL_ON_HOST[index]()
    _compiled_path(monkeypatch)
    kernel = SMALL_ON_HOST[index]()
    for a, b in zip(host.directions(), kernel.directions(), strict=True):
        np.testing.assert_array_equal(a.offset, b.offset)
        np.testing.assert_array_equal(a.step, b.step)
        roundoff = 64 * np.finfo(np.float64).eps / np.asarray(a.step)[..., None]
        assert np.all(np.abs(np.asarray(a.probs) - np.asarray(b.probs)) <= 1e-14 + roundoff)
        np.testing.assert_allclose(a.inf_mass, b.inf_mass, rtol=1e-9, atol=1e-15)


def test_small_plds_in_host_memory_are_read_and_composed_without_compiling():
    gauss, sub = pj.gaussian(1.0), pj.gaussian(0.8, sampling_prob=0.1)
    optimistic = pj.gaussian(1.0, pessimistic=False)
    assert pld_module.computed_on_host([gauss, sub], 2 * sub.size)

    def work():
        composed = pj.compose([gauss, sub]).self_compose(50)
        low = optimistic.self_compose(50)
        return (composed.epsilon(1e-6), composed.delta([0.5, 2.0]), composed.tradeoff(0.01),
                composed.renyi(2.0), low.log_mgf(-1.0), low.epsilon([1e-3, 1e-6]))

    _, names = compiled_programs(work)
    assert names == []


def test_plds_on_the_host_and_in_compiled_kernels_agree_and_bracket_the_gaussian(monkeypatch):
    """G(1) composed 100 times is 10-GDP: both paths' pessimistic delta at or above the closed
    form, the optimistic at or below, and the two paths within round-off of each other."""
    eps = np.array([10.0, 40.0, 70.0])
    exact = np.array([gaussian_delta(10.0, e) for e in eps])

    def readings():
        upper = pj.compose([pj.gaussian(1.0)] * 4).self_compose(25)
        lower = pj.gaussian(1.0, pessimistic=False).self_compose(100)
        return (np.asarray(upper.delta(eps)), np.asarray(lower.delta(eps)),
                upper.epsilon(1e-6), lower.epsilon(1e-6))

    on_host = readings()
    _compiled_path(monkeypatch)
    compiled = readings()
    for host, kernel in zip(on_host, compiled, strict=True):
        np.testing.assert_allclose(host, kernel, rtol=1e-9, atol=1e-300)
    for upper, lower, *_ in (on_host, compiled):
        assert np.all(upper >= exact) and np.all(lower <= exact)
        np.testing.assert_allclose(upper, exact, rtol=1e-2)
        np.testing.assert_allclose(lower, exact, rtol=1e-2)


def test_large_batches_run_in_compiled_kernels():
    batch = pj.gaussian(np.linspace(0.8, 2.0, pld_module.HOST_ROWS + 1))
    assert not pld_module.computed_on_host([batch], batch.size)
    assert pld_module.computed_on_host([pj.gaussian(1.0)], pj.gaussian(1.0).size)


@pytest.mark.parametrize("sigma, q", [(1.0, 0.01), (0.5, 0.01), (2.0, 0.3), (0.8, 0.001)])
def test_swapped_rows_of_a_remove_pld_give_the_add_directions_curve(sigma, q):
    """Poisson subsampling's add pair is its remove pair with P and Q exchanged: the remove
    PLD's rows, exchanged, give the add direction's hockey-stick curve (connect-the-dots
    commutes with the exchange on a mirrored grid)."""
    from pldjax.core.pld import swapped_rows

    remove = pj.gaussian(sigma=sigma, sampling_prob=q)
    probs, atom, offset, step = swapped_rows(
        np.asarray(remove.probs)[None], np.asarray([float(remove.inf_mass)]),
        np.asarray([int(remove.offset)]), np.asarray([float(remove.step)]))
    swapped = pj.PLD(probs[0], atom[0], offset[0], step[0])
    epsilons = [0.0, 0.001, 0.005, 0.01]
    got = np.array([float(swapped.delta(e)) for e in epsilons])
    add = np.array([float(remove.reverse.delta(e)) for e in epsilons])
    assert np.all(got >= add * (1 - 1e-8))  # the atom taken from above
    np.testing.assert_allclose(got, add, rtol=1e-8, atol=1e-13)
