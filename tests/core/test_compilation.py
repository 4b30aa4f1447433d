"""What a fresh process pays before its first answer: the import's cost, and the
exported kernels kept beside the compilation cache. The cache policy itself is tested in
test_api.py, the compiled-program count in test_dpsgd.py."""

import functools
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled_programs import compiled_programs

import pldjax as pj
from pldjax.core import compilation
from pldjax.kernels import discretize


def test_import_leaves_scipy_out():
    """``import pldjax`` loads no SciPy (0.1-0.4 s of every fresh process): the few host-side
    users (Mixture.binomial, gdp_tail_epsilon, the optional adapters) import it where they need it."""
    code = "import sys, pldjax; print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux only")
def test_compiled_kernels_are_released_before_the_mapping_limit(monkeypatch):
    # every compiled CPU kernel holds memory mappings; a 1,024-configuration sweep reached Linux's
    # limit and died of a segfault inside XLA. Past the threshold the sweep's kernels drop their
    # programs, and nothing else: the mappings go back down, the caller's own jitted function
    # stays compiled, and a sweep that drops them after every chunk gets the same values
    square = jax.jit(lambda x: x * x)
    square(jnp.ones(3))
    kernels = discretize.MECHANISM_KERNELS  # the discretization's, among the sweep's
    compilation.release_compiled_kernels(kernels, limit=0)  # none held from earlier tests
    before = compilation.mapping_count()
    sigmas, steps = np.linspace(0.6, 3.0, 4), np.geomspace(100, 3000, 4).round()
    whole = pj.dpsgd_epsilon(sigmas, 0.01, steps, 1e-5)
    assert not compilation.release_compiled_kernels(kernels, limit=10**9)
    assert compilation.compiled_count(kernels) > 0
    during = compilation.mapping_count()
    assert during > before  # compiled kernels add mappings ...
    assert compilation.release_compiled_kernels(kernels, limit=0)
    assert compilation.compiled_count(kernels) == 0
    assert compilation.mapping_count() < during  # ... which dropping gives back
    assert compilation.compiled_count([square]) == 1
    monkeypatch.setattr(compilation, "MAPPING_FRACTION", 0.0)  # drop after every chunk
    check = compilation.MappingGuard.check

    def after_every_chunk(guard):  # the sweep's guard, reading the mappings every time
        monkeypatch.setattr(guard, "first", 0)
        monkeypatch.setattr(guard, "every", 0)
        return check(guard)

    monkeypatch.setattr(compilation.MappingGuard, "check", after_every_chunk)
    drops, release = [], compilation.release_compiled_kernels
    monkeypatch.setattr(compilation, "release_compiled_kernels",
                        lambda chosen: drops.append(release(chosen)) or drops[-1])
    np.testing.assert_array_equal(pj.dpsgd_epsilon(sigmas, 0.01, steps, 1e-5), whole)
    assert sum(drops) >= 2  # chunks of several mechanism sizes, each after a drop


def test_mapping_guard_reads_the_mappings_only_every_so_many_new_kernels(monkeypatch):
    """A read of /proc/self/maps costs milliseconds once a process holds many kernels: the guard
    looks at `first` compiled shapes, then after every `every` more, and again from `first` once
    the caches were dropped (by it or by anyone)."""
    from pldjax.core import compilation

    class Kernel:
        shapes = 0

        def _cache_size(self):
            return self.shapes

    kernel, reads, answer = Kernel(), [], [False]

    def release(kernels):
        reads.append(kernel.shapes)
        if answer[0]:
            kernel.shapes = 0
        return answer[0]

    monkeypatch.setattr(compilation, "release_compiled_kernels", release)
    guard = compilation.MappingGuard([kernel], first=4, every=3)
    for shapes in range(12):
        kernel.shapes = shapes
        guard.check()
    assert reads == [4, 7, 10]
    answer[0] = True
    kernel.shapes = 13
    assert guard.check() and kernel.shapes == 0
    for shapes in (1, 3):
        kernel.shapes = shapes
        assert not guard.check()
    kernel.shapes = 4
    assert guard.check()
    assert reads == [4, 7, 10, 13, 4]


def _accounting_values():
    # the pessimistic path's kernels (curve, masses with windows) on a batch at rtol's step, the
    # optimistic path's (masses, windows) with the other target and relation
    return [pj.dpsgd_epsilon(np.array([0.8, 2.0]), 0.02, 500, 1e-6, rtol=1e-2),
            pj.dpsgd_delta(1.0, 0.05, 200, 2.0, neighboring="replace_one", pessimistic=False)]


def _exporting_to(directory: Path, monkeypatch) -> Path:
    """Exported kernels on, kept in ``directory`` (a new one: nothing read from it is in memory
    yet, as in a new process)."""
    monkeypatch.setattr(compilation, "exported_dir", directory)
    return directory


@pytest.fixture
def exported_to(tmp_path, monkeypatch):
    """Exported kernels on, kept in tmp_path."""
    return _exporting_to(tmp_path, monkeypatch)


@pytest.mark.slow
def test_exported_kernels_give_the_values_of_jit(exported_to, monkeypatch):
    """The kernels' programs exported to disk (jax.export) and read back give the values of the
    jitted kernels, bit for bit; an unreadable entry is exported again."""
    written = _accounting_values()
    copy = _exporting_to(shutil.copytree(exported_to, exported_to.parent / "copy"), monkeypatch)
    files = sorted(copy.glob("*.jaxexport"))
    assert len(files) >= 5
    files[0].write_bytes(b"not a program")
    read = _accounting_values()  # read back from disk
    monkeypatch.setattr(compilation, "exported_dir", None)  # the jitted kernels themselves
    plain = _accounting_values()
    for a, b, c in zip(written, read, plain, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)
    assert files[0].read_bytes() != b"not a program"


def test_exported_kernel_falls_back_to_jit_where_it_cannot_export(exported_to):
    """Inside a trace, or with a static argument that has no description stable across
    processes (an object's repr holds its address), the kernel runs as a plain jitted function."""
    from pldjax.core.compilation import exported_jit

    @exported_jit(static_argnames=("scale",))
    def scaled(x, *, scale):
        return x * (scale() if callable(scale) else scale)

    assert float(scaled(jnp.ones(()), scale=2.0)) == 2.0
    assert len(list(exported_to.glob("scaled-*"))) == 1
    assert float(jax.jit(lambda x: scaled(x, scale=3.0))(jnp.ones(()))) == 3.0
    holder = type("Holder", (), {"__call__": lambda self: 4.0})()
    assert float(scaled(jnp.ones(()), scale=holder)) == 4.0
    assert len(list(exported_to.glob("scaled-*"))) == 1


def test_exported_programs_are_kept_apart_by_the_x64_setting(exported_to, monkeypatch):
    """A kernel called without jax_enable_x64 (float32 programs for float64 NumPy inputs) and
    then with it gets two programs: the float32 one, read back from disk, failed the float64
    call with a dtype mismatch in every later process."""
    from pldjax.core.compilation import exported_jit

    @exported_jit()
    def doubled(x):
        return 2 * x

    argument = np.ones(3, np.float64)
    with jax.enable_x64(False):
        assert doubled(argument).dtype == jnp.float32
    # a later process: reads what the first one wrote from disk
    later = _exporting_to(shutil.copytree(exported_to, exported_to.parent / "later"), monkeypatch)
    with jax.enable_x64(True):
        assert doubled(argument).dtype == jnp.float64
    assert len(list(later.glob("doubled-*"))) == 2


@pytest.mark.parametrize("exported", [False, True], ids=["jitted", "exported"])
def test_a_kernel_knows_which_programs_it_has_without_compiling(exported, tmp_path, monkeypatch):
    """``stored``: whether a call on these arguments (arrays or their shapes) finds its program
    without compiling it: one compiled in this process, or (exported kernels) one a process
    exported to disk before, which compiled it; never a program of other shapes or static
    arguments."""
    from pldjax.core.compilation import exported_jit

    monkeypatch.setattr(compilation, "exported_dir", tmp_path if exported else None)

    def scaled(x, *, scale):
        return x * scale

    kernel = exported_jit(static_argnames=("scale",))(scaled)
    shape = jax.ShapeDtypeStruct((3,), jnp.float64)
    assert not kernel.stored(shape, scale=2.0)
    kernel(np.ones(3), scale=2.0)
    assert kernel.stored(shape, scale=2.0) and kernel.stored(np.ones(3), scale=2.0)
    assert not kernel.stored(shape, scale=3.0)
    assert not kernel.stored(jax.ShapeDtypeStruct((4,), jnp.float64), scale=2.0)
    # a later process: the same kernel, nothing in its memory
    later = exported_jit(static_argnames=("scale",))(scaled)
    assert later.stored(shape, scale=2.0) == exported


@pytest.mark.parametrize("exported", [False, True], ids=["jitted", "exported"])
def test_compiling_ahead_gives_the_shapes_and_the_call_compiles_nothing_more(exported, tmp_path,
                                                                             monkeypatch):
    """Under compiling_ahead a kernel call returns its outputs' shapes and starts its compile in
    a worker thread (a pipeline's next kernel starts from the shapes alone); the real calls on
    arrays of those shapes wait for those programs: each is compiled once."""
    from pldjax.core.compilation import compiling_ahead, exported_jit

    monkeypatch.setattr(compilation, "exported_dir", tmp_path if exported else None)

    @exported_jit(static_argnames=("power",))
    def powers(x, *, power):
        return jnp.cumsum(x**power), jnp.sum(x)

    @exported_jit()
    def scaled(running, total):
        return running / total

    x = np.linspace(0.0, 1.0, 1001)

    def ahead_then_run():
        with compiling_ahead():
            shapes = powers(x, power=3)
            after = scaled(*shapes)
        assert [(a.shape, a.dtype) for a in (*shapes, after)] == [
            ((1001,), jnp.float64), ((), jnp.float64), ((1001,), jnp.float64)]
        return scaled(*powers(x, power=3))

    with jax.enable_x64(True):
        got, names = compiled_programs(ahead_then_run)
    # (and the one-op probe of the CPU compiler options, where this process had not run it yet)
    programs = sorted(name for name in names if name != "jit(option_probe)")
    assert programs == ["jit(powers)", "jit(scaled)"]  # exported programs under their kernels' names
    np.testing.assert_allclose(got, np.cumsum(x**3) / np.sum(x), rtol=1e-14)
    assert len(list(tmp_path.glob("*.jaxexport"))) == (2 if exported else 0)


def test_threads_calling_a_new_program_at_once_export_and_compile_it_once(exported_to):
    """A program's first calls from several threads at once (the accounting's composition
    workers): one exports and compiles it, the others wait for it and share it."""
    from pldjax.core.compilation import exported_jit

    @exported_jit()
    def shifted(x):
        return jnp.sort(x) + 1.0

    x = np.linspace(1.0, 0.0, 777)
    callers = 4
    together = threading.Barrier(callers)

    def call(_):
        together.wait()
        with jax.enable_x64(True):  # the switch is each thread's own
            return np.asarray(shifted(x))

    def at_once():
        with ThreadPoolExecutor(callers) as pool:
            return list(pool.map(call, range(callers)))

    got, names = compiled_programs(at_once)
    assert [name for name in names if name != "jit(option_probe)"] == ["jit(shifted)"]
    for values in got:
        np.testing.assert_array_equal(values, np.sort(x) + 1.0)
    assert len(list(exported_to.glob("shifted-*"))) == 1


@pytest.mark.slow
def test_a_new_process_reads_the_exported_kernels(tmp_path):
    """Two fresh processes with pldjax's cache in one directory: the second finds every kernel
    program the first exported (no entry is written again) and gives the same epsilon."""
    code = textwrap.dedent("""
        import pldjax as pj
        print(repr(pj.dpsgd_epsilon(1.0, 0.01, 1000, 1e-5)))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["PLDJAX_COMPILATION_CACHE"] = str(tmp_path / "xla")
    run = functools.partial(subprocess.run, [sys.executable, "-c", code], capture_output=True,
                            text=True, timeout=600, env=env)
    first = run()
    assert first.returncode == 0, first.stderr
    entries = {p: p.stat().st_mtime_ns for p in (tmp_path / "xla-exported").glob("*.jaxexport")}
    assert len(entries) == 3  # the three kernels of one configuration (its sizing runs in NumPy)
    second = run()
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "xla-exported").glob("*")} == entries


def test_exported_programs_depend_on_every_module_of_the_package(monkeypatch, tmp_path):
    """An exported program is traced through functions all over pldjax (the discretization's in
    pldjax/kernels, the mechanisms' tails): a change to any module must retire it. Only
    pldjax/core was read, so a fixed kernel kept running the old programs from the cache."""
    root = compilation.package_root()
    assert (root / "kernels" / "discretize.py").is_file()
    assert (root / "mechanisms" / "subsampling.py").is_file()
    copy = tmp_path / "pldjax"
    for source in root.rglob("*.py"):
        target = copy / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    monkeypatch.setattr(compilation, "package_root", lambda: copy)
    version = compilation.program_version.__wrapped__  # the digest itself, not the cached one
    before = version()
    assert before == version()
    kernel = copy / "kernels" / "discretize.py"
    kernel.write_text(kernel.read_text() + "\n# changed\n")
    assert version() != before


def test_kernels_compile_with_their_cpu_options_only_where_xla_knows_them():
    """A kernel given ``cpu_options`` compiles with them on a CPU; with an option this XLA does
    not know (a later jaxlib may drop one) it compiles as a plain jitted kernel, same values."""
    def curve(x):
        return jnp.exp(-x) * jnp.log1p(x)

    fast = compilation.exported_jit(cpu_options=compilation.FAST_COMPILE)(curve)
    unknown = compilation.exported_jit(cpu_options={"xla_no_such_option": True})(curve)
    assert jax.default_backend() == "cpu"
    assert fast.compiler_options == dict(compilation.FAST_COMPILE)
    assert unknown.compiler_options is None
    x = jnp.linspace(0.0, 5.0, 101)
    np.testing.assert_allclose(fast(x), unknown(x), rtol=1e-15)
    np.testing.assert_allclose(fast(x), np.exp(-np.asarray(x)) * np.log1p(np.asarray(x)),
                               rtol=1e-14)


def test_kernels_compile_with_their_backends_options(monkeypatch):
    """On a CPU a kernel compiles with its ``cpu_options`` (none: XLA's defaults); on a GPU every
    kernel compiles with GPU_FAST_COMPILE (matrix products not autotuned while compiling); on
    another backend with XLA's defaults."""
    def curve(x):
        return jnp.exp(-x) * jnp.log1p(x)

    fast = compilation.kernel_jit(curve)
    defaults = compilation.kernel_jit(curve, cpu_options=None)
    assert fast.compiler_options == dict(compilation.FAST_COMPILE)
    assert defaults.compiler_options is None
    x = jnp.linspace(0.0, 5.0, 101)
    np.testing.assert_allclose(fast(x), defaults(x), rtol=1e-15)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert fast.compiler_options == defaults.compiler_options == dict(compilation.GPU_FAST_COMPILE)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert fast.compiler_options is None and defaults.compiler_options is None


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


#: Host computations repeated in a fresh process: an accounting call, and a PLD's composition.
_REPEATED_ON_HOST = {
    "accounting": "pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)",
    "composition": "pj.gaussian(1.0, sampling_prob=0.01).self_compose(1000).epsilon(1e-5)",
}


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc thresholds")
@pytest.mark.parametrize("call", _REPEATED_ON_HOST.values(), ids=_REPEATED_ON_HOST.keys())
def test_repeated_host_computations_keep_the_memory_they_free(call):
    """A DP-SGD epsilon, or a PLD composed and read, computed on the host again in the same
    process faults no memory in: glibc keeps the window-sized arrays each call frees (4,192 and
    3,000-4,200 page faults a call before, about 6 ms of 17 and 9 ms of 24)."""
    code = textwrap.dedent(f"""
        import resource
        import pldjax as pj
        first = {call}
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        again = {call}
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        assert float(first) == float(again)
    """)
    settings = ("MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_")
    env = {key: value for key, value in os.environ.items() if key not in settings}
    env.update(PLDJAX_QUIET="1", PLDJAX_COMPILATION_CACHE="0")
    env.pop("PLDJAX_HOST_WORK", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[0]) < 400


def test_values_computed_once_are_unchanged_and_not_recomputed_per_use():
    """computed_once leaves its values in place (batched, and a tuple of more values than it
    sorts, too), and the 128 x 128 matrices of 128 powers of the blocked recurrence (on every grid
    evaluation's path, here through its tail sums) compute each power once: XLA's CPU fusion put
    the pow into the gather that places the powers, 16,384 of them."""
    from pldjax.core.compilation import computed_once
    from pldjax.kernels.hockey_stick import tail_sums

    values = jnp.asarray([[3.0, -1.0, jnp.nan, 2.0], [0.5, 0.5, -jnp.inf, 7.0]])
    np.testing.assert_array_equal(jax.jit(computed_once)(values), values)
    np.testing.assert_array_equal(jax.jit(jax.vmap(computed_once))(values), values)
    many = jnp.tile(values, (1, 100)), -jnp.tile(values, (1, 100))  # a tuple, past the sort's 256
    for got, want in zip(jax.jit(jax.vmap(computed_once))(many), many, strict=True):
        np.testing.assert_array_equal(got, want)
    # R_k = sum_{i >= k} e^{-(i - k) h} p_i of 8 blocks of unit masses, for a batch of steps h:
    # geometric sums of the n - k masses from k on
    recurrences = jax.jit(jax.vmap(lambda probs, step: tail_sums(probs, step)[1][:-1]))
    probs, steps = jnp.ones((4, 8 * 128)), jnp.linspace(0.1, 0.7, 4)
    h, terms = np.asarray(steps)[:, None], 8 * 128 - np.arange(8 * 128)
    np.testing.assert_allclose(recurrences(probs, steps), np.expm1(-terms * h) / np.expm1(-h),
                               rtol=1e-13)
    if jax.default_backend() == "cpu":
        program = recurrences.lower(probs, steps).compile().as_text()
        fused = [part for part in program.split("\n\n") if part.startswith("%fused")]
        assert not [part for part in fused if " power(" in part and " gather(" in part]


@pytest.mark.parametrize("divisor", [1, 3, 7, 2048])
def test_quotient_and_remainder_of_non_negative_integers_are_floor_division(divisor):
    """quotient and remainder agree with // and % on non-negative integers, in NumPy and in a
    kernel, with the divisor a traced array or an int known when tracing (a power of two: a
    shift and a mask); in a kernel they compile to one operation each, not floor division's
    corrections for negative operands (a sign, a compare and a select around each)."""
    from pldjax.core.compilation import quotient, remainder

    a = np.arange(0, 5000, 13, dtype=np.int64)
    want = (a // divisor, a % divisor)
    np.testing.assert_array_equal(quotient(a, divisor), want[0])
    np.testing.assert_array_equal(remainder(a, divisor), want[1])
    with jax.enable_x64(True):
        both = jax.jit(lambda x, d: (quotient(x, d), remainder(x, d)))
        known = jax.jit(lambda x: (quotient(x, divisor), remainder(x, divisor)))
        for got in (both(a, np.int64(divisor)), known(a)):
            for value, expected in zip(got, want, strict=True):
                np.testing.assert_array_equal(value, expected)
        program = both.lower(a, np.int64(divisor)).as_text()
    assert " sign " not in program and "stablehlo.sign" not in program


@pytest.mark.parametrize("rows", [1, 3])
def test_rows_mapped_on_the_host_are_each_rows_outputs_stacked_and_never_an_inputs_memory(rows):
    """map_rows on NumPy rows gives each row's outputs stacked (pytrees, scalars and arrays alike,
    with their dtypes), as vmap does in a kernel; an output that is an input (or a view of one)
    comes back as a copy, so that writing to it leaves the caller's arrays as they were."""
    from pldjax.core.compilation import map_rows

    def fn(row, scale):
        return {"same": row, "view": row[:2], "new": row * scale, "sum": np.sum(row),
                "flag": bool(scale > 1), "count": int(row.shape[0])}

    table = np.arange(rows * 4, dtype=np.float64).reshape(rows, 4)
    scales = np.linspace(0.5, 2.0, rows)
    got = map_rows(fn)(table, scales)
    with jax.enable_x64(True):
        want = jax.vmap(lambda r, s: {
            "same": r, "view": r[:2], "new": r * s, "sum": jnp.sum(r), "flag": s > 1,
            "count": jnp.full((), r.shape[0])})(jnp.asarray(table), jnp.asarray(scales))
    assert got.keys() == want.keys()
    for key, value in got.items():
        assert isinstance(value, np.ndarray) and value.shape[0] == rows
        np.testing.assert_array_equal(value, np.asarray(want[key]))
    assert got["flag"].dtype == bool and got["count"].dtype == np.int64
    before = table.copy()
    for value in got.values():
        value[...] = -1
    np.testing.assert_array_equal(table, before)


def test_work_beside_a_thread_runs_in_another_only_where_a_core_is_spare(monkeypatch):
    """side_thread's executor runs its calls in a thread of their own where the process has a
    core to spare and the work is worth it; in the caller's thread otherwise, inside
    map_in_threads' workers (which keep the cores busy) and inside a side thread; an error comes
    back from result()."""
    from pldjax.core.compilation import map_in_threads, side_thread

    def where(worth_it=True):
        with side_thread("pldjax-test", worth_it) as side:
            return side.submit(threading.current_thread).result()

    def fails():
        raise ValueError("from the side")

    here = threading.current_thread()
    monkeypatch.setattr(compilation, "cores", lambda: 2)
    assert where() is not here
    assert where(worth_it=False) is here
    workers = list(map_in_threads(lambda _: (threading.current_thread(), where()), range(2), 2,
                                  "pldjax-test-workers"))
    assert all(worker is beside and worker is not here for worker, beside in workers)
    with side_thread("pldjax-test") as side:  # a side thread's own side work stays in it
        outer, inner = side.submit(lambda: (threading.current_thread(), where())).result()
    assert outer is inner and outer is not here
    monkeypatch.setattr(compilation, "cores", lambda: 1)
    assert where() is here
    for worth_it in (True, False):
        with side_thread("pldjax-test", worth_it) as side:
            with pytest.raises(ValueError, match="from the side"):
                side.submit(fails).result()


@pytest.mark.skipif(jax.default_backend() == "cpu", reason="needs an accelerator")
def test_small_computations_on_an_accelerator_run_on_the_host():
    """PLDs and filter states live on the accelerator; their small compositions, readings and
    spends copy them to the host and run the host's NumPy code: nothing to compile, the values
    of the same work on CPU arrays."""
    def work():
        pld = pj.gaussian(sigma=1.0)
        f = pj.filters.gdp_residue_filter(mu=1.0)
        state = f.init()
        placed = {d.platform for leaf in (pld.probs, jax.tree_util.tree_leaves(state)[0])
                  for d in leaf.devices()}

        def run():
            composed = pld.self_compose(10_000)
            pair = pj.compose([pj.gdp(mu=0.5), pj.laplace(scale=2.0)])
            _, accepted = f.spend(state, pj.randomized_response(0.5))
            return (composed.epsilon(1e-5), composed.delta([1.0, 2.0]), pair.epsilon(1e-6),
                    accepted)

        values, names = compiled_programs(run)
        return placed, [np.asarray(v) for v in values], names

    placed, values, names = work()
    assert placed == {jax.default_backend()} and names == []
    with jax.default_device(jax.devices("cpu")[0]):
        on_cpu, cpu_values, _ = work()
    assert on_cpu == {"cpu"}
    for got, want in zip(values, cpu_values, strict=True):
        np.testing.assert_array_equal(got, want)
