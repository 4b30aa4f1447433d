"""The optax transformations (pj.optax): DP-SGD with its budget, per-example filters (full batch
and Poisson-sampled, with the residue table), noise, sampling, checkpoints, x64."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_programs import compiled_programs, programs_of_a_new_process
from scipy import stats

import pldjax as pj

DELTA = 1e-5


def loss(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def per_example_grads(params, x, y):
    return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x[:, None, :], y[:, None])


def test_dpsgd_stops_exactly_where_the_accountant_says():
    tx = pj.optax.dpsgd(0.1, 1.0, 2.0, 0.05, key=jax.random.key(0), epsilon_budget=1.0,
                        delta=DELTA)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    state = tx.init(params)
    allowed = pj.optax.steps(state)[1]
    assert allowed == pj.calibrate_steps(1.0, DELTA, 2.0, 0.05)
    x = jax.random.normal(jax.random.key(1), (8, 3))
    y = jnp.ones(8)
    update = jax.jit(tx.update)
    moved = []
    for _ in range(allowed + 3):
        updates, state = update(per_example_grads(params, x, y), state, params)
        moved.append(bool(jnp.any(updates["w"] != 0)))
    assert moved == [True] * allowed + [False] * 3
    assert pj.optax.epsilon(state, DELTA) <= 1.0
    assert float(pj.dpsgd_epsilon(2.0, 0.05, allowed + 1, DELTA)) > 1.0
    with pytest.raises(ValueError, match="key"):
        pj.optax.dpsgd(0.1, 1.0, 1.0, 0.05, key=None, epsilon_budget=1.0, delta=DELTA)


def test_dpsgd_state_stays_64_bit_with_x64_off(x64_off):
    tx = pj.optax.dpsgd(0.1, 1.0, 2.0, 0.05, key=jax.random.key(0), epsilon_budget=1.0,
                        delta=DELTA)
    params = {"w": jnp.ones(3, jnp.float32)}
    state = tx.init(params)
    grads = {"w": jnp.ones((4, 3), jnp.float32)}
    updates, state = jax.jit(tx.update)(grads, state, params)
    assert updates["w"].dtype == jnp.float32  # the model keeps its own precision
    assert pj.optax.steps(state) == (1, pj.calibrate_steps(1.0, DELTA, 2.0, 0.05))
    assert pj.accountant.segments(state.accountant) == [(2.0, 0.05, 1)]
    one_step = pj.accountant.step(pj.accountant.init(), noise_multiplier=2.0, sampling_prob=0.05)
    assert pj.optax.epsilon(state, DELTA) == pj.accountant.epsilon(one_step, DELTA)


@pytest.mark.slow
def test_noise_has_the_right_scale():
    """Zero gradients: the update is -lr * N(0, (C sigma)^2) / batch; a KS test against that
    normal accepts it and rejects the scale without the clipping norm."""
    clip, sigma, lr, batch = 2.0, 1.5, 0.5, 4
    tx = pj.optax.dpsgd(lr, clip, sigma, 0.1, key=jax.random.key(3), epsilon_budget=2.0,
                        delta=DELTA)
    params = {"w": jnp.zeros(20000)}
    grads = {"w": jnp.zeros((batch, 20000))}
    updates, _ = tx.update(grads, tx.init(params), params)
    sample = np.asarray(updates["w"])
    right = lr * clip * sigma / batch
    assert stats.kstest(sample, "norm", args=(0, right)).pvalue > 1e-3
    assert stats.kstest(sample, "norm", args=(0, lr * sigma / batch)).pvalue < 1e-6


def test_dpsgd_state_checkpoint_round_trip(tmp_path):
    tx = pj.optax.dpsgd(0.1, 1.0, 1.0, 0.05, key=jax.random.key(0), epsilon_budget=2.0,
                        delta=DELTA)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    x, y = jax.random.normal(jax.random.key(1), (8, 3)), jnp.ones(8)
    state = tx.init(params)
    trail = []
    for i in range(6):
        if i == 3:
            pj.io.save(tmp_path / "opt.npz", state, kind="dpsgd", params={})
            restored = pj.io.load(tmp_path / "opt.npz", tx.init(params), kind="dpsgd", params={})
        updates, state = tx.update(per_example_grads(params, x, y), state, params)
        trail.append(updates)
    for i in range(3, 6):
        updates, restored = tx.update(per_example_grads(params, x, y), restored, params)
        assert np.array_equal(np.asarray(updates["w"]), np.asarray(trail[i]["w"]))
    assert pj.optax.epsilon(restored, DELTA) == pj.optax.epsilon(state, DELTA)


def test_individual_filters_retire_examples_by_their_own_norms():
    clip, sigma, mu = 1.0, 2.0, 1.0
    tx = pj.optax.individual_dpsgd(0.1, clip, sigma, key=jax.random.key(0), mu_budget=mu,
                                   num_examples=3)
    params = {"w": jnp.zeros(2)}
    # per-example gradients of norms 5 (clipped to 1), 0.5 and 0.25: nu = clipped / (C sigma)
    grads = {"w": jnp.array([[3.0, 4.0], [0.3, 0.4], [0.15, 0.2]])}
    state = tx.init(params)
    update = jax.jit(tx.update)
    active_for = np.zeros(3, int)
    for _ in range(80):
        _, state = update(grads, state, params)
        active_for += np.asarray(state.active)
    nus = np.array([1.0, 0.5, 0.25]) / (clip * sigma)
    expected = np.floor(mu**2 / nus**2 * (1 + 1e-12)).astype(int)
    assert np.all(np.abs(active_for - expected) <= 1)
    assert active_for[0] < active_for[1] < active_for[2]
    assert np.all(np.asarray(pj.optax.remaining_mu(state)) >= 0)


# -- x64 off in the caller -------------------------------------------------------------


def test_individual_dpsgd_with_x64_off_and_a_wrong_batch(x64_off):
    tx = pj.optax.individual_dpsgd(0.1, 1.0, 1.0, key=jax.random.key(0), mu_budget=1.0,
                                   num_examples=4)
    params = {"w": jnp.ones(3, jnp.float32)}
    state = tx.init(params)
    grads = {"w": jnp.full((4, 3), 0.3, jnp.float32)}
    _, state = jax.jit(tx.update)(grads, state, params)
    nu = float(np.sqrt(np.sum(np.float64(np.float32(0.3)) ** 2 * 3)))  # norm in float64
    expected = np.sqrt(1.0 - nu * nu)
    np.testing.assert_allclose(np.asarray(pj.optax.remaining_mu(state)), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="grads must hold per-example gradients of all "
                                         "num_examples = 4"):
        tx.update({"w": jnp.ones((5, 3), jnp.float32)}, state, params)


# -- per-example budgets for Poisson-sampled DP-SGD ------------------------------------
def _hand_table(sigma=1.0, q=0.5):
    """A ResidueTable with known costs: budgets {0, 0.5, 1}, sensitivities {0, 0.5, 1}, said to
    be for the step (sigma, q) (made up: it tests the lookups' mechanics)."""
    from pldjax.adaptive.filters.residue import ResidueTable

    cost = jnp.array([[0.0, 0.3, 0.6], [0.0, 0.2, 0.5], [0.0, 0.1, 0.4]])
    return ResidueTable(jnp.array([0.0, 0.5, 1.0]), jnp.array([0.0, 0.5, 1.0]), cost,
                        jnp.array([0.0, 1e-3, 1e-3]), np.float64(sigma), np.float64(q))


@pytest.mark.slow
def test_table_spend_rounds_budgets_down_and_sensitivities_up():
    from pldjax.adaptive.filters.residue import table_spend

    table = _hand_table()
    mu = jnp.array([1.0, 0.99, 0.5, 0.49, 1.0, 1.0, 0.3, 1.0])
    c = jnp.array([1.0, 1.0, 0.5, 0.5, 0.2, 0.0, 1.0, 0.5])
    new_mu, new_delta, ok = table_spend(table, mu, jnp.full(8, 1e-2), c)
    cost = np.array([0.4, 0.5, 0.2, 0.3, 0.1, 0.0, 0.6, 0.1])  # (node <= mu, node >= c)
    fits = cost <= np.asarray(mu)
    np.testing.assert_array_equal(np.asarray(ok), fits)
    expected = np.where(fits, np.sqrt(np.maximum(np.asarray(mu) ** 2 - cost**2, 0)), np.asarray(mu))
    assert np.all(np.asarray(new_mu) <= expected) and np.allclose(new_mu, expected, rtol=1e-15)
    charged = np.where(fits, np.where(np.asarray(c) > 0, 1e-3, 0.0), 0.0)
    np.testing.assert_allclose(np.asarray(new_delta), 1e-2 - charged, rtol=1e-15)
    # a delta budget that cannot pay rejects and keeps the budgets
    new_mu, new_delta, ok = table_spend(table, mu[:1], jnp.array([5e-4]), c[:1])
    assert not bool(ok[0]) and float(new_mu[0]) == 1.0 and float(new_delta[0]) == 5e-4


def test_sampled_individual_dpsgd_charges_each_example_by_its_own_norm():
    table = _hand_table()
    tx = pj.optax.individual_dpsgd(0.1, 2.0, 1.0, key=jax.random.key(0), mu_budget=1.0,
                                   num_examples=3, delta_slack=1.0, sampling_prob=0.5,
                                   table=table)
    params = {"w": jnp.zeros(2)}
    # norms 5 (c = 1), 0.6 (c = 0.3 -> node 0.5) and 0 (c = 0: free)
    grads = {"w": jnp.array([[3.0, 4.0], [0.36, 0.48], [0.0, 0.0]])}
    state = tx.init(params)
    update = jax.jit(tx.update)
    for _ in range(12):
        _, state = update(grads, state, params)
    # host replay of the lookups: c = 1 costs 0.4 at mu >= 1, then 0.5 from mu >= 0.5, 0.6 below
    mu, steps = 1.0, 0
    while True:
        cost = 0.4 if mu >= 1.0 else 0.5 if mu >= 0.5 else 0.6
        if cost > mu:
            break
        mu, steps = np.sqrt(mu * mu - cost * cost), steps + 1
    charged = np.asarray(state.charged)
    assert charged[0] == steps and charged[2] == 12 and steps < charged[1] <= 12
    assert list(np.asarray(state.active)) == [False, charged[1] == 12, True]
    remaining = np.asarray(pj.optax.remaining_mu(state))
    assert remaining[2] == 1.0 and np.all(remaining >= 0)
    with pytest.raises(ValueError, match="delta_slack"):
        pj.optax.individual_dpsgd(0.1, 1.0, 1.0, key=jax.random.key(0), mu_budget=1.0,
                                  num_examples=3, sampling_prob=0.5, table=table)
    with pytest.raises(ValueError, match="accounting"):
        pj.optax.individual_dpsgd(0.1, 1.0, 1.0, key=jax.random.key(0), mu_budget=1.0,
                                  num_examples=3, delta_slack=1e-6, sampling_prob=0.5,
                                  table=table, accounting="rdp")


@pytest.mark.slow
def test_sampled_individual_dpsgd_noise_and_sampling_with_x64_off(x64_off):
    """Zero gradients: the update is -lr N(0, (C sigma)^2) / (q N); all examples active; float32
    model; the sampled fraction (seen through unit gradients) is about q."""
    clip, sigma, lr, q, n = 1.0, 2.0, 0.5, 0.25, 400
    zero = _hand_table(sigma, q)._replace(cost=jnp.zeros((3, 3)), delta=jnp.zeros(3))
    tx = pj.optax.individual_dpsgd(lr, clip, sigma, key=jax.random.key(3), mu_budget=1.0,
                                   num_examples=n, delta_slack=1e-6, sampling_prob=q, table=zero)
    params = {"w": jnp.zeros(5000, jnp.float32)}
    updates, state = jax.jit(tx.update)({"w": jnp.zeros((n, 5000), jnp.float32)}, tx.init(params),
                                        params)
    assert updates["w"].dtype == jnp.float32
    right = lr * clip * sigma / (q * n)
    assert stats.kstest(np.asarray(updates["w"]), "norm", args=(0, right)).pvalue > 1e-3
    # unit gradients along one coordinate: the update's first coordinate counts the sample
    small = pj.optax.individual_dpsgd(1.0, 1.0, 1e-9, key=jax.random.key(4), mu_budget=1.0,
                                      num_examples=n, delta_slack=1e-6, sampling_prob=q,
                                      table=zero._replace(noise_multiplier=np.float64(1e-9)))
    grads = {"w": jnp.zeros((n, 2), jnp.float32).at[:, 0].set(1.0)}
    updates, _ = jax.jit(small.update)(grads, small.init({"w": jnp.zeros(2)}), {"w": jnp.zeros(2)})
    sampled = -float(updates["w"][0]) * q * n
    assert abs(sampled - q * n) < 4 * np.sqrt(n * q * (1 - q))


@pytest.mark.slow
def test_residue_table_is_sound_against_direct_residues_and_monotone():
    """The residue of one Poisson-subsampled Gaussian step is non-decreasing in the budget mu and
    non-increasing in the sensitivity c (direct pj.gdp_residue calls), and a table lookup (mu
    rounded down, c up) is at most the direct residue at (mu, c) (to the searches' resolution)
    and never below the naive update at c's node."""
    from pldjax.adaptive.filters.residue import gdp_residue_table, table_spend

    sigma, q = 1.0, 0.05  # one step at c = 1 is 0.578-GDP: every pair below fits
    table = gdp_residue_table(sigma, q, 1.0, mu_nodes=3, c_nodes=3, mu_min=0.5)
    mus = np.array([0.6, 0.8, 1.0])
    cs = np.array([0.3, 0.5, 0.8, 1.0])
    steps = pj.gaussian(jnp.asarray(sigma / cs), sampling_prob=q)
    slack = float(np.max([np.max(np.asarray(d.inf_mass)) for d in steps.directions()]))
    direct = np.asarray(pj.gdp_residue(jnp.asarray(mus[:, None]), steps, delta_slack=slack))
    assert np.all(np.isfinite(direct))
    assert np.all(np.diff(direct, axis=0) >= 0) and np.all(np.diff(direct, axis=1) <= 0)
    m, c = np.meshgrid(mus, cs, indexing="ij")
    looked, _, ok = table_spend(table, jnp.asarray(m.ravel()), jnp.ones(m.size), jnp.asarray(c.ravel()))
    assert np.all(np.asarray(ok))
    # both are certified lower bounds on the true residue, found on check windows that depend on
    # the batch (about 1e-4 relative for subsampled Gaussians), and the table's cost at a node is
    # the best certificate of the nodes below it (composition): a lookup may beat a direct call
    # by that much, never by more
    assert np.all(np.asarray(looked).reshape(m.shape) <= direct * (1 + 2e-4))
    naive_nu = np.asarray(pj.gdp_mu(pj.gaussian(jnp.asarray(sigma / np.array([0.5, 0.5, 1.0, 1.0])),
                                                sampling_prob=q), delta_slack=slack))
    naive = np.sqrt(np.maximum(m**2 - naive_nu[None, :] ** 2, 0.0))
    assert np.all(np.asarray(looked).reshape(m.shape) >= naive * (1 - 1e-12))
    assert np.all(np.diff(np.asarray(table.cost), axis=0) <= 0)
    assert np.all(np.diff(np.asarray(table.cost), axis=1) >= 0)


# -- found by an adversarial review --------------------------------------------------


@pytest.mark.slow
def test_dpsgd_reads_epsilon_under_its_own_neighbouring_relation():
    """Replace-one DP-SGD: a Gaussian of sensitivity 2 C, so q = 1 and 3 steps are
    (2 sqrt(3) / sigma)-GDP; epsilon used to be read add/remove (1.70 against the truth 3.71)."""
    from reference import gaussian_epsilon

    sigma, steps = 4.0, 3
    tx = pj.optax.dpsgd(0.1, 1.0, sigma, 1.0, key=jax.random.key(0), epsilon_budget=10.0,
                        delta=DELTA, neighboring="replace_one")
    params = jnp.zeros(3)
    state = tx.init(params)
    for _ in range(steps):
        _, state = tx.update(jnp.ones((4, 3)), state, params)
    truth = gaussian_epsilon(2.0 * np.sqrt(steps) / sigma, DELTA)
    assert truth <= pj.optax.epsilon(state, DELTA) <= truth * (1 + 1e-3)


def test_individual_dpsgd_refuses_a_table_of_other_parameters():
    from pldjax.adaptive.filters.residue import gdp_residue_table

    table = gdp_residue_table(20.0, 0.01, 1.0, mu_nodes=2, c_nodes=2, residue=False)
    kwargs = dict(key=jax.random.key(0), mu_budget=1.0, num_examples=4, delta_slack=1e-6)
    for sigma, q in [(1.0, 0.01), (20.0, 0.5)]:
        with pytest.raises(ValueError, match="table was built for noise_multiplier = 20"):
            pj.optax.individual_dpsgd(0.1, 1.0, sigma, sampling_prob=q, table=table, **kwargs)
    pj.optax.individual_dpsgd(0.1, 1.0, 20.0, sampling_prob=0.01, table=table, **kwargs)
    with pytest.raises(ValueError, match="table"):  # full-batch steps have closed-form costs
        pj.optax.individual_dpsgd(0.1, 1.0, 20.0, table=table, **kwargs)
    with pytest.raises(ValueError, match="accounting"):
        pj.optax.individual_dpsgd(0.1, 1.0, 20.0, accounting="bogus", **kwargs)
    with pytest.raises(ValueError, match="table must be a ResidueTable"):
        pj.optax.individual_dpsgd(0.1, 1.0, 20.0, sampling_prob=0.01, table="x", **kwargs)
    # a budget beyond what takes it is named as the caller's mu_budget
    kwargs.pop("mu_budget")
    with pytest.raises(ValueError, match="mu_budget must lie in"):
        pj.optax.individual_dpsgd(0.1, 1.0, 20.0, mu_budget=1e101, **kwargs)
    with pytest.raises(ValueError, match="mu_budget must lie in"):
        pj.optax.individual_dpsgd(0.1, 1.0, 20.0, sampling_prob=0.01, mu_budget=2e6, **kwargs)


def test_building_and_initializing_the_transformations_compile_no_glue(tmp_path):
    # a table of naive costs is built, and read into individual_dpsgd, in NumPy; so is the
    # initial state of dpsgd
    _, printed = programs_of_a_new_process("""
        import json
        import os
        os.environ["PLDJAX_HOST_WORK"] = str(10**15)  # dpsgd's calibration on the host: quick
        import jax
        import numpy as np
        from compiled_programs import compiled_programs
        import pldjax as pj
        key = jax.random.key(0)
        params = {"w": jax.device_put(np.zeros(3, np.float32))}
        _, names = compiled_programs(lambda: pj.optax.individual_dpsgd(
            0.1, 1.0, 20.0, sampling_prob=0.01, accounting="gdp", key=key, mu_budget=1.0,
            num_examples=4, delta_slack=1e-6, table=pj.filters.residue.gdp_residue_table(
                20.0, 0.01, 1.0, mu_nodes=2, c_nodes=2, residue=False)))
        tx = pj.optax.dpsgd(learning_rate=0.1, l2_norm_clip=1.0, noise_multiplier=1.1,
                            sampling_prob=0.01, key=key, epsilon_budget=3.0, delta=1e-5)
        _, more = compiled_programs(lambda: tx.init(params))
        print(json.dumps(names + more))
    """, cache=tmp_path / "xla")  # empty: every program compiles
    assert json.loads(printed.splitlines()[-1]) == []


@pytest.mark.parametrize("name", ["dpsgd", "full batch", "sampled"])
def test_an_update_outside_jit_is_one_program(name):
    # a notebook's loop calls update eagerly: one program for its shapes, none at the next step;
    # the initial state is built without compiling
    tx = _transformations()[name]
    params = {"w": jnp.zeros(3, jnp.float32)}
    grads = {"w": jnp.ones((4, 3), jnp.float32)}
    state, at_init = compiled_programs(lambda: tx.init(params))
    (updates, state), first = compiled_programs(lambda: tx.update(grads, state, params))
    (again, _), second = compiled_programs(lambda: tx.update(grads, state, params))
    assert (at_init, first, second) == ([], ["jit(update)"], [])
    jitted, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    np.testing.assert_array_equal(jitted["w"], updates["w"])


def _transformations():
    """DP-SGD, full-batch and Poisson-sampled per-example DP-SGD (q = 1, so every example is in
    the batch) on 4 examples, with the same key."""
    key = jax.random.key(5)
    table = pj.filters.residue.gdp_residue_table(1.0, 1.0, 2.0, mu_nodes=2, c_nodes=2,
                                                 residue=False)
    return {
        "dpsgd": pj.optax.dpsgd(1.0, 1.0, 1.0, 1.0, key=key, epsilon_budget=50.0, delta=DELTA),
        "full batch": pj.optax.individual_dpsgd(1.0, 1.0, 1.0, key=key, mu_budget=2.0,
                                                num_examples=4),
        "sampled": pj.optax.individual_dpsgd(1.0, 1.0, 1.0, key=key, mu_budget=2.0,
                                             num_examples=4, sampling_prob=1.0,
                                             delta_slack=1e-3, table=table),
    }


@pytest.mark.parametrize("bad", [pytest.param(np.nan, marks=pytest.mark.slow), np.inf])
def test_a_non_finite_gradient_contributes_nothing_and_costs_nothing(bad):
    """An example whose gradient is not finite is left out of the sum (its contribution is 0):
    the update is the one without it, never NaN (0 * NaN made the released update a function
    of that example alone), and its budget is untouched."""
    params = jnp.zeros(3)
    grads = np.ones((4, 3), np.float32)
    grads[3, 0] = bad
    without = grads.copy()
    without[3] = 0.0
    for name, tx in _transformations().items():
        state = tx.init(params)
        got, after = tx.update(jnp.asarray(grads), state, params)
        want, after_without = tx.update(jnp.asarray(without), state, params)
        assert np.all(np.isfinite(np.asarray(got))), name
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)
        if name != "dpsgd":  # charged as a zero gradient (c = 0)
            assert bool(after.active[3]), name
            assert (pj.optax.remaining_mu(after)[3] == pj.optax.remaining_mu(after_without)[3]
                    > 2.0 * (1 - 1e-15)), name


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_clipped_gradients_stay_within_the_clip_norm_after_rounding(dtype):
    """One example, noise 1e-20 C, learning rate 1: the update is its clipped gradient, whose
    norm (exact, in float64) must not exceed C. Scaled by C / norm in the model's precision, a
    bfloat16 gradient reached 1.004 C, a float32 one 1 + 6e-8, and a float16 one of norm 2.4e5
    1.001 C (its factor 4e-6 is subnormal in float16)."""
    rng = np.random.default_rng(1)
    key = jax.random.key(0)
    table = _hand_table(1e-20, 1.0)._replace(cost=jnp.zeros((3, 3)), delta=jnp.zeros(3))
    transformations = [  # (pj.optax.dpsgd clips by the same function, but cannot run at 1e-20)
        pj.optax.individual_dpsgd(1.0, 1.0, 1e-20, key=key, mu_budget=1e30, num_examples=1),
        pj.optax.individual_dpsgd(1.0, 1.0, 1e-20, key=key, mu_budget=2.0, num_examples=1,
                                  sampling_prob=1.0, delta_slack=1.0, table=table),
    ]
    # norms to 3e5 (a float16 factor below 6e-5 is subnormal), entries below float16's 65504
    scales = np.concatenate([rng.uniform(1, 10, 290), rng.uniform(1e4, 1.5e4, 10)])
    normal = np.clip(rng.normal(size=(300, 1, 50)), -4, 4)
    grads = jnp.asarray(normal * scales[:, None, None], dtype)
    params = jnp.zeros(50, dtype)
    for tx in transformations:
        state = tx.init(params)
        updates = jax.jit(jax.vmap(lambda g, s=state, t=tx: t.update(g, s, params)[0]))(grads)
        norms = np.linalg.norm(np.asarray(updates, np.float64), axis=-1)
        assert np.max(norms) <= 1.0 and np.min(norms) > 0.98


def test_dpsgd_names_its_own_arguments():
    kwargs = dict(key=jax.random.key(0), delta=DELTA)
    with pytest.raises(ValueError, match="epsilon_budget must be"):
        pj.optax.dpsgd(0.1, 1.0, 1.0, 0.01, epsilon_budget=float("nan"), **kwargs)
    with pytest.raises(ValueError, match="no number of steps reaches epsilon_budget"):
        pj.optax.dpsgd(0.1, 1.0, 1.0, 0.01, epsilon_budget=1e-9, **kwargs)
