"""A persistent cache of compiled kernels, so that a new process does not compile them again.

pldjax's kernels take a few seconds to compile on a CPU (the first call of a session); JAX can keep
the compiled executables on disk and load them in a fraction of that. Policy: the cache is on by
default -- ``import pldjax`` calls :func:`enable_default_cache` -- with three ways out:

* ``PLDJAX_COMPILATION_CACHE=0`` in the environment: pldjax leaves JAX's cache settings alone;
* a cache directory you configured for JAX (``JAX_COMPILATION_CACHE_DIR`` or
  ``jax.config.update("jax_compilation_cache_dir", ...)`` before the import) wins, untouched;
* ``PLDJAX_COMPILATION_CACHE=/some/dir`` picks another directory than ``~/.cache/pldjax/xla``.

Turning it on sets three global JAX options (the directory, and caching every compiled executable
whatever its compile time or size), which then apply to the rest of the process's JAX code too. A
directory that cannot be created leaves the cache off (a warning, never a failed import).

With the cache on, the accounting kernels (:func:`exported_jit`) also keep their traced and lowered
programs on disk (``jax.export``, in ``<cache directory>-exported``), so that a later process
skips Python tracing and lowering too: a warm cache answered ``pj.dpsgd_epsilon(1.0, 0.01,
10_000, 1e-5)`` in a new process in 0.46-0.55 s instead of 1.2-1.4 s (2-core CPU). An entry is
keyed by the kernel, its static arguments, the shapes and dtypes of its inputs, and a digest of
pldjax's source, the jax and jaxlib versions, the device and the x64 setting; a stale or
unreadable entry is exported again. Like jit's own trace cache, an entry does not see module
constants changed at run time (tests that patch them run with the cache off). Calls inside a
trace (``jit``, ``vmap``), with several devices, or without the ``flatbuffers`` package run the
kernels as plain ``jax.jit`` functions.

Every kernel is jitted by :func:`kernel_jit` (or :func:`exported_jit`), which on a CPU compiles it
with :data:`FAST_COMPILE` unless the kernel runs slower with it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import functools
import gc
import hashlib
import importlib.util
import os
import threading
import types
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import export

from pldjax.core.validation import is_traced

#: Where :func:`exported_jit` kernels keep their programs: set by
#: :func:`enable_compilation_cache`; None (nowhere: the kernels run as plain jitted functions)
#: until then, with the cache off, or where the directory cannot be created.
exported_dir: Path | None = None


def default_cache_dir() -> Path:
    """``$PLDJAX_COMPILATION_CACHE`` if set, else ``$XDG_CACHE_HOME/pldjax/xla`` (~/.cache/...)."""
    configured = os.environ.get("PLDJAX_COMPILATION_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pldjax" / "xla"


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Keep compiled kernels in ``path`` (default :func:`default_cache_dir`) across processes.

    Does nothing and returns None when JAX already has a cache directory configured (yours wins)
    or when ``PLDJAX_COMPILATION_CACHE`` is ``0``. Returns the directory in use otherwise.

    Args:
      path: the cache directory (str or path-like), created with its parents if missing (an
        OSError where it cannot be); None (default): :func:`default_cache_dir`. Exported
        programs go to a sibling directory of the same name with ``-exported`` appended.

    Returns:
      The cache directory in use, a :class:`pathlib.Path`, or None where nothing was done.
    """
    if os.environ.get("PLDJAX_COMPILATION_CACHE") == "0" or jax.config.jax_compilation_cache_dir:
        return None
    global exported_dir
    directory = Path(path) if path is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    exported = directory.with_name(directory.name + "-exported")
    try:
        exported.mkdir(exist_ok=True)
        exported_dir = exported
    except OSError:  # the kernels are then traced in every process, as without the cache
        exported_dir = None
    return directory


def enable_default_cache() -> Path | None:
    """What ``import pldjax`` does: :func:`enable_compilation_cache` at the default directory,
    warning instead of raising when that directory cannot be created (a read-only home)."""
    try:
        return enable_compilation_cache()
    except OSError as error:
        warnings.warn(f"pldjax: persistent compilation cache left off ({error}); set "
                      "PLDJAX_COMPILATION_CACHE to a writable directory, or to 0", stacklevel=2)
        return None


def package_root() -> Path:
    """The pldjax package's directory: every module under it is source an exported program may
    have been traced from (a kernel calls functions of other modules: the discretization's, the
    mechanisms' tails)."""
    return Path(__file__).resolve().parent.parent


@functools.cache
def program_version() -> str | None:
    """What an exported program depends on besides its kernel and inputs: pldjax's source, the
    jax and jaxlib versions, the backend and device; None where the source cannot be read (no
    exports then: nothing would tell an upgraded pldjax's programs from the old ones)."""
    digest = hashlib.sha256()
    root = package_root()
    sources = sorted(root.rglob("*.py"))
    if not sources:
        return None
    for source in sources:
        digest.update(source.relative_to(root).as_posix().encode() + b"\0" + source.read_bytes())
    device = jax.devices()[0]
    digest.update(f"{jax.__version__} {jax.lib.__version__} {device.platform} "
                  f"{device.device_kind}".encode())
    return digest.hexdigest()


@functools.cache
def _can_serialize() -> bool:
    return importlib.util.find_spec("flatbuffers") is not None


class _Unstable(Exception):
    """A static argument with no description that holds across processes."""


def _code_digest(code: types.CodeType) -> str:
    """A digest of a code object's bytecode and constants (nested code objects by their own
    digests: their repr holds an address)."""
    consts = [_code_digest(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return hashlib.sha256(code.co_code + repr(consts).encode()).hexdigest()


def _stable_token(value) -> str:
    """A description of a static argument that is the same in every process running the same
    source (functions by module, name and line, with their closures and defaults; records by
    their fields), or _Unstable: repr shows a function's address, which changes every run."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, enum.Enum)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({','.join(map(_stable_token, value))})"
    if isinstance(value, dict):
        return f"dict({','.join(f'{_stable_token(k)}:{_stable_token(v)}' for k, v in value.items())})"
    if isinstance(value, functools.partial):
        return (f"partial({_stable_token(value.func)},{_stable_token(value.args)},"
                f"{_stable_token(value.keywords)})")
    if isinstance(value, types.FunctionType):
        code = value.__code__
        cells = tuple(cell.cell_contents for cell in value.__closure__ or ())
        body = _code_digest(code)[:12]
        return (f"{value.__module__}.{value.__qualname__}:{code.co_firstlineno}:{body}"
                f"({_stable_token(cells)},{_stable_token(value.__defaults__)})")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = tuple(getattr(value, field.name) for field in dataclasses.fields(value))
        return f"{type(value).__module__}.{type(value).__qualname__}{_stable_token(fields)}"
    raise _Unstable(type(value).__name__)


def _signature(leaf) -> tuple | str:
    """Shape and dtype of an input (what its program depends on), cheaper than jax.typeof (whose
    string took 7 us, for every Python-float step of a call)."""
    if isinstance(leaf, np.ndarray | np.generic):
        return leaf.shape, leaf.dtype.str, False
    if isinstance(leaf, jax.Array | jax.ShapeDtypeStruct):  # the same program for either
        return leaf.shape, leaf.dtype.str, bool(leaf.weak_type)
    if type(leaf) in (bool, int, float, complex):
        return type(leaf).__name__  # weakly typed: its dtype follows jax_enable_x64 (in the key)
    return str(jax.typeof(leaf))


#: Most values along its last axis that :func:`computed_once` materializes by a sort.
_SORTED_VALUES = 256


def computed_once(values):
    """``values`` (an array, or a tuple of arrays of one shape) computed once, before their
    uses: XLA's CPU fusion can move an expensive element-wise op (a pow, an expm1, G_mu's erfc)
    into each consumer that reads its values (a gather that reads each many times, or slices of
    it), and then computes it once per read (a 128 x 128 matrix of 128 powers placed along its
    diagonals took 16,384 pows). ``jax.lax.optimization_barrier`` does not stop this on a CPU
    (XLA removes it before fusion). A sort by an iota key, which leaves the values in place,
    does, for up to _SORTED_VALUES values along the last axis (it cost 41 ms for 8 x 16,384);
    more go through a while loop that runs once and whose body XLA cannot prove to be the
    identity (which slowed the DP-SGD composition's 128-value matrices by 15%). Elsewhere (an
    accelerator) the values as they are."""
    leaves, tree = jax.tree_util.tree_flatten(values)
    if jax.default_backend() != "cpu" or array_module(*leaves) is np:  # NumPy: computed already
        return values
    shape = leaves[0].shape
    if shape[-1] <= _SORTED_VALUES:
        keys = jax.lax.broadcasted_iota(np.int32, shape, len(shape) - 1)
        return tree.unflatten(jax.lax.sort((keys, *leaves), dimension=len(shape) - 1,
                                           num_keys=1)[1:])

    def once(carry):
        count, held = carry
        return count + 1, [jnp.where(count < 0, 0, a) for a in held]

    # a start of 0 that XLA cannot fold: with a constant one it removes the loop
    first = leaves[0].reshape(-1)[0]
    start = jnp.minimum((first != first).astype(jnp.int32), 0)
    return tree.unflatten(jax.lax.while_loop(lambda carry: carry[0] < 1, once,
                                             (start, leaves))[1])


def early_exit_on_cpu(args, *, cpu: Callable, elsewhere: Callable):
    """``cpu(*args)`` where the default backend is a CPU, ``elsewhere(*args)`` on other
    platforms: chosen as the kernel is traced, so that only one of them is traced and lowered
    (``jax.lax.platform_dependent`` traces both: a DP-SGD sweep's first call spent 0.6 s more
    tracing on a 2-core CPU). Both compute the same values; a program lowered for another
    platform than the default backend's (inputs placed there by hand) runs ``elsewhere``'s, which
    works everywhere.

    For a branch or a loop that stops early: on a GPU, XLA runs a conditional, and a loop whose
    trip count it cannot read from the program, by copying the predicate to the host and waiting
    for the device to finish all the work queued before it, at every branch and every iterate;
    the host then cannot queue the next call while the device works (a sweep's chunks wait for
    each other's compositions). ``elsewhere`` does the same work without such control flow; the
    CPU, which runs a program's steps from the host anyway, keeps the early exit.
    """
    return (cpu if jax.default_backend() == "cpu" else elsewhere)(*args)


#: XLA's CPU element-wise code from its older emitters instead of its fusion emitters: the
#: default of :func:`kernel_jit`. Measured kernel by kernel on a 2-core CPU against XLA's
#: defaults, most of pldjax's kernels compile in 60-80% of the time and run as fast (DP-SGD's
#: composition: 1.38 -> 0.95 s). The filters' spends, gdp_mu and the residue compile in half
#: the time (a first GDP-residue spend 3.4 -> 2.3 s, a first batch of 256 residues 20 -> 14 s)
#: and run 0-6% slower. Those that ran much slower keep XLA's defaults: the discretization's
#: curve (2.9x) and V_k's levels (3-8%, in loops of thousands of calls).
FAST_COMPILE = types.MappingProxyType({"xla_cpu_use_fusion_emitters": False})

#: On a GPU, every kernel's matrix products take cuBLAS's own choice of algorithm instead of
#: XLA timing each candidate while it compiles (autotuning; its timer also warned on stderr).
#: Side by side on an H200, in fresh processes: 10,000 DP-SGD configurations' first call
#: 20.3 -> 12.1 s with empty caches, warm 0.525 and 0.529 s; epsilons agree to 1e-16 relative
#: (the products' sums in another order).
GPU_FAST_COMPILE = types.MappingProxyType({"xla_gpu_autotune_level": 0})


_probed: dict[tuple, bool] = {}
_probing = threading.Lock()


def _supported(options: tuple) -> bool:
    """Whether this process's XLA compiles with ``options`` ((name, value) pairs): a later
    jaxlib may drop an option, and its kernels then compile without any. Probed once a process
    (threads that ask at once wait for the one probe)."""
    def option_probe(x):
        return x + 1

    with _probing:
        if options not in _probed:
            try:
                jax.jit(option_probe, compiler_options=dict(options)).trace(0.0).lower().compile()
                _probed[options] = True
            except Exception:
                _probed[options] = False
        return _probed[options]


_ahead = threading.local()
_pool: ThreadPoolExecutor | None = None


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def map_in_threads(fn: Callable, items: Iterable, workers: int, name: str) -> Iterator:
    """``fn`` of each of ``items``, in order, computed in up to ``workers`` threads named
    ``name`` (in this thread where ``workers`` is 1). An error, or an interrupt, or a caller that
    stops reading, cancels the items not yet begun."""
    if workers <= 1:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(workers, name, initializer=_mark_worker)
    try:
        yield from pool.map(fn, items)
    finally:
        pool.shutdown(cancel_futures=True)


_thread = threading.local()


def _mark_worker() -> None:
    _thread.worker = True


class _InThisThread(Executor):
    """An executor that runs each call at once, in the caller's thread."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        done = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as error:  # held for result(), as a thread's future holds it
            done.set_exception(error)
        return done


@contextlib.contextmanager
def side_thread(name: str, worth_it: bool = True) -> Iterator[Executor]:
    """An executor for work beside this thread's own: one thread named ``name`` where the
    process has a core to spare (more than one, and this thread is neither one of
    :func:`map_in_threads`' workers, which keep them all busy, nor a side thread itself) and the
    work is ``worth_it``; else each call runs at once, in this thread."""
    if worth_it and cores() > 1 and not getattr(_thread, "worker", False):
        with ThreadPoolExecutor(1, name, initializer=_mark_worker) as pool:
            yield pool
    else:
        yield _InThisThread()


#: Most programs compiled at once (each compile holds a few hundred MB while it runs).
COMPILE_WORKERS = 8


def _compile_pool() -> ThreadPoolExecutor:
    """The worker threads that compile ahead, one a core up to COMPILE_WORKERS (XLA's compiler
    releases the GIL: four of the discretization's programs compiled in 2.7 s on 2 cores, 4.5 s
    one after another)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=min(cores(), COMPILE_WORKERS),
                                   thread_name_prefix="pldjax-compile")
    return _pool


def _finished(pending: Future | None):
    """A compile started ahead, once done: its result, or None where there was none or it failed
    (the call then compiles as it would have, and raises what it raises)."""
    if pending is None:
        return None
    try:
        return pending.result()
    except Exception:
        return None


@contextlib.contextmanager
def compiling_ahead():
    """Within it, pldjax's exported kernels called at top level start compiling their programs
    in worker threads and return their outputs' shapes (``jax.ShapeDtypeStruct``) instead of
    computing them: a dry run of a pipeline of kernels (each one's shapes follow from the one
    before) starts every program it will need at once. The calls of the real run, on the same
    shapes and static arguments, then wait for their program instead of compiling it."""
    before = getattr(_ahead, "on", False)
    _ahead.on = True
    try:
        yield
    finally:
        _ahead.on = before


def compiles_started() -> int:
    """How many programs this thread's :func:`compiling_ahead` runs have started compiling (or
    loading from the persistent cache): unchanged by a dry run whose programs were all there."""
    return getattr(_ahead, "started", 0)


def _start_compile(*args) -> Future:
    """A compile started in the worker threads, counted (:func:`compiles_started`)."""
    _ahead.started = compiles_started() + 1
    return _compile_pool().submit(_lower_and_compile, *args)


class Kernel:
    """``jax.jit(fn, **jit_options)`` that compiles with XLA options of its backend where that
    XLA knows them: ``cpu_options`` on a CPU, :data:`GPU_FAST_COMPILE` on a GPU; except inside a
    trace, where it runs as a nested jit (which takes no options of its own). The options change
    how XLA turns the program into machine code, not the program: values agree to the last few
    bits."""

    def __init__(self, fn, cpu_options: Mapping[str, object] | None = FAST_COMPILE,
                 **jit_options):
        self._jitted = jax.jit(fn, **jit_options)
        options = {"cpu": dict(cpu_options or {}), "gpu": dict(GPU_FAST_COMPILE)}
        self._options = {backend: (option, tuple(sorted(option.items())))  # (for _supported)
                         for backend, option in options.items() if option}
        self._tuned = {backend: jax.jit(fn, compiler_options=option, **jit_options)
                       for backend, (option, _) in self._options.items()}
        static = jit_options.get("static_argnames", ())
        self.static_argnames = frozenset((static,) if isinstance(static, str) else static)
        functools.update_wrapper(self, fn)

    @property
    def compiler_options(self) -> dict | None:
        """The XLA options this kernel compiles with here: its options for the default backend
        where that backend's XLA knows them (:func:`_supported`), else None."""
        backend = jax.default_backend()
        if backend not in self._options:
            return None
        options, key = self._options[backend]
        return options if _supported(key) else None

    @property
    def kernel(self):
        """The jitted kernel for a call at top level (compiled with :attr:`compiler_options`)."""
        if self.compiler_options is None:
            return self._jitted
        return self._tuned[jax.default_backend()]

    def _cache_size(self) -> int:
        """Compiled shapes held in memory (for :func:`compiled_count`)."""
        return sum(jitted._cache_size() for jitted in (self._jitted, *self._tuned.values())) + sum(
            getattr(call, "_cache_size", lambda: 0)() for call in self._programs())

    def _programs(self) -> Iterable:
        """Further jitted programs this kernel holds (an exported kernel's)."""
        return ()

    def clear_cache(self) -> None:
        """Drop this kernel's compiled programs (and their memory mappings); the next call
        compiles again, or loads from the persistent cache."""
        for jitted in (self._jitted, *self._tuned.values(), *self._programs()):
            # (an exported kernel's program jax could not export is a partial of the kernel)
            getattr(jitted, "clear_cache", lambda: None)()

    def __call__(self, *args, **kwargs):
        if is_traced((args, kwargs)):
            return self._jitted(*args, **kwargs)
        return self.kernel(*args, **kwargs)


def kernel_jit(fn: Callable | None = None, *,
               cpu_options: Mapping[str, object] | None = FAST_COMPILE,
               **jit_options) -> Callable:
    """``jax.jit`` for pldjax's kernels (a :class:`Kernel`; also a decorator with options):
    ``cpu_options`` None for a kernel that runs slower with :data:`FAST_COMPILE`, which then
    compiles with XLA's defaults on a CPU."""
    if fn is None:
        return functools.partial(kernel_jit, cpu_options=cpu_options, **jit_options)
    return Kernel(fn, cpu_options, **jit_options)


class ExportedKernel(Kernel):
    """A :class:`Kernel` whose programs (one per static arguments and input shapes) are exported
    with ``jax.export`` and kept on disk while the compilation cache is on (see the module
    docstring); otherwise, and inside traces, the jitted kernel itself. Same values either way:
    the program is the one ``jit`` would compile."""

    def __init__(self, fn, static_argnames: Iterable[str] = (),
                 cpu_options: Mapping[str, object] | None = FAST_COMPILE):
        static_argnames = tuple(static_argnames)
        super().__init__(fn, cpu_options, static_argnames=static_argnames)
        self._calls: dict = {}
        self._tokens: dict = {}
        self._pending: dict[tuple, Future] = {}  # compiles started by compiling_ahead
        self._shapes: dict[tuple, object] = {}  # programs' outputs' shapes, by slot
        self._jitted_slots: set[tuple] = set()  # the jitted kernel's programs compiled
        self._first_calls: dict[tuple, threading.Lock] = {}  # see __call__

    def _programs(self) -> Iterable:
        return list(self._calls.values())  # a copy: other threads may add programs

    def clear_cache(self) -> None:
        super().clear_cache()
        self._jitted_slots.clear()

    def __call__(self, *args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten(args)
        if is_traced((leaves, kwargs)):  # a nested jit, which takes no compiler options
            return self._jitted(*args, **kwargs)
        slot = self._slot(leaves, tree, kwargs)
        if getattr(_ahead, "on", False):
            return self._compile_ahead(slot, args, kwargs)
        if slot is None or slot[0] is None:
            _finished(None if slot is None else self._pending.pop(slot, None))
            out = self.kernel(*args, **kwargs)
            if slot is not None:
                self._jitted_slots.add(slot)
            return out
        call = self._calls.get(slot)
        if call is not None:
            return call(*args)
        # the first call of a program, one thread at a time (the others wait for its compile
        # instead of exporting and compiling it again)
        with self._first_calls.setdefault(slot, threading.Lock()):
            call = self._calls.get(slot)
            if call is not None:
                return call(*args)
            call = (_finished(self._pending.pop(slot, None))
                    or self._program(*slot, args, kwargs))
            out = call(*args)
            self._calls[slot] = call
            return out

    def _slot(self, leaves, tree, kwargs) -> tuple | None:
        """(directory, key) of a call's program: the exported programs' directory (None when
        they are not kept: the jitted kernel's program) and what the program depends on; None
        for a call with static arguments that have no stable description."""
        directory = exported_dir
        if (directory is None or not self.static_argnames.issuperset(kwargs)
                or not _can_serialize() or len(jax.devices()) != 1 or program_version() is None):
            directory = None
        statics = self._static_tokens(kwargs)
        if statics is None:
            return None
        # the x64 setting decides the program's dtypes for the same NumPy inputs
        key = (tree, tuple(map(_signature, leaves)), statics, jax.config.jax_enable_x64)
        # remembered with the directory it was read from or written to: another directory (a
        # cache enabled elsewhere) gets its own entry
        return directory, key

    def _compile_ahead(self, slot, args, kwargs):
        """A call under :func:`compiling_ahead`: its outputs' shapes, its program's compile
        started in a worker. Tracing and lowering hold Python's lock wherever they run; the
        compile, most of the time, does not. An exported program already on disk is read, not
        traced."""
        x64 = bool(jax.config.jax_enable_x64)
        if slot is None:
            return self.kernel.trace(*args, **kwargs).out_info
        shapes = self._shapes.get(slot)
        if slot[0] is None:  # the jitted kernel's program
            if shapes is None or (slot not in self._jitted_slots and slot not in self._pending):
                traced = self.kernel.trace(*args, **kwargs)
                shapes = self._shapes[slot] = traced.out_info
                self._pending[slot] = _start_compile(traced, x64)
            return shapes
        if shapes is None:
            program = self._exported(*slot, args, kwargs)
            if program is None:  # a program jax cannot export: no compiling ahead
                return self._jitted.trace(*args, **kwargs).out_info
            # on the device, as the call's outputs will be: a program compiled for inputs placed
            # there (a next kernel's) is another than for NumPy inputs
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            shapes = self._shapes[slot] = jax.tree.unflatten(program.out_tree, [
                jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type, sharding=device)
                for a in program.out_avals])
            # (a first call of the program, in another thread, compiles it already)
            if slot not in self._first_calls and slot not in self._pending:
                call = self._exported_call(program)
                self._pending[slot] = _start_compile(call.trace(*args), x64, call)
        return shapes

    def stored(self, *args, **kwargs) -> bool:
        """Whether a call on these arguments (arrays or ``jax.ShapeDtypeStruct``) finds its
        program ready without compiling it here: compiled in this process, or exported to disk
        by an earlier one (which compiled it into the persistent cache: loaded, not compiled)."""
        leaves, tree = jax.tree_util.tree_flatten(args)
        slot = self._slot(leaves, tree, kwargs)
        if slot is None:
            return False
        if slot in self._calls or slot in self._jitted_slots:
            return True
        return slot[0] is not None and self._path(*slot).exists()

    def _path(self, directory: Path, key) -> Path:
        """Where the exported program for ``key`` is kept in ``directory``."""
        name = f"{self.__module__}.{self.__qualname__}"
        digest = hashlib.sha256(f"{program_version()} {name} {key}".encode()).hexdigest()[:40]
        return directory / f"{self.__name__}-{digest}.jaxexport"

    def _static_tokens(self, kwargs) -> tuple | None:
        """The static arguments' :func:`_stable_token` (None if one has none), remembered for
        equal values, as jit remembers its traces (a mechanism's token takes 0.25 ms)."""
        statics = tuple(sorted(kwargs.items()))
        if statics not in self._tokens:
            try:
                self._tokens[statics] = tuple((name, _stable_token(value)) for name, value in statics)
            except _Unstable:
                self._tokens[statics] = None
        return self._tokens[statics]

    def _program(self, directory: Path, key, args, statics) -> Callable:
        """The exported program's call for ``key`` (see :meth:`_exported`); the jitted kernel for
        a program jax cannot export, as without the cache."""
        program = self._exported(directory, key, args, statics)
        if program is None:
            return functools.partial(self.kernel, **statics)
        return self._exported_call(program)

    def _exported_call(self, program: export.Exported) -> Callable:
        """An exported program's call, jitted with this kernel's compiler options under the
        kernel's name (what ``jax_log_compiles`` and JAX's monitoring report it as, rather than
        ``call``)."""
        def run(*args):
            return program.call(*args)

        run.__name__ = run.__qualname__ = self.__name__
        return jax.jit(run, compiler_options=self.compiler_options)

    def _exported(self, directory: Path, key, args, statics) -> export.Exported | None:
        """The exported program for ``key``, read from ``directory`` or exported now (and
        written there); None where jax cannot export it."""
        path = self._path(directory, key)
        try:
            return export.deserialize(bytearray(path.read_bytes()))
        except Exception:  # absent, unreadable or stale: exported again below
            pass
        try:
            program = export.export(self._jitted)(*args, **statics)
            data = program.serialize()
        except Exception:
            return None
        pending = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            pending.write_bytes(data)
            os.replace(pending, path)  # atomic: readers see the whole entry or none
        except OSError:
            pending.unlink(missing_ok=True)
        return program


def _lower_and_compile(traced, x64: bool, result=None):
    """In a worker: lower and compile a traced program (jit then holds it), return ``result``."""
    with jax.enable_x64(x64):
        traced.lower().compile()
    return result


def exported_jit(*, static_argnames: Iterable[str] = (),
                 cpu_options: Mapping[str, object] | None = FAST_COMPILE) -> Callable:
    """Decorator: :func:`kernel_jit` with ``static_argnames``, as an :class:`ExportedKernel`
    (static arguments by keyword, the others by position)."""
    def wrap(fn):
        return ExportedKernel(fn, static_argnames, cpu_options)

    return wrap


@functools.cache
def _mapping_limit() -> int | None:
    """Linux's per-process limit on memory mappings (vm.max_map_count), None elsewhere."""
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as file:
            return int(file.read())
    except (OSError, ValueError):
        return None


#: Fraction of vm.max_map_count at which :func:`release_compiled_kernels` drops pldjax's compiled
#: kernels: below it there is room for the kernels one more chunk of a sweep compiles.
MAPPING_FRACTION = 0.6


def compiled_count(kernels: Iterable) -> int:
    """How many compiled shapes the jitted functions ``kernels`` hold in JAX's in-memory caches
    (cheap: no system call)."""
    return sum(kernel._cache_size() for kernel in kernels)


def mapping_count() -> int | None:
    """How many memory mappings this process holds (Linux), None where it cannot be read. It
    costs about 0.1-0.7 ms, more once a process holds many compiled programs."""
    try:
        with open("/proc/self/maps", "rb") as file:
            return file.read().count(b"\n")
    except OSError:
        return None


def above_mapping_limit(limit: int | None = None) -> bool:
    """Whether this process holds more than ``limit`` memory mappings (default:
    MAPPING_FRACTION of Linux's vm.max_map_count); False where either cannot be read."""
    if limit is None:
        system = _mapping_limit()
        if system is None:
            return False
        limit = int(MAPPING_FRACTION * system)
    mappings = mapping_count()
    return mappings is not None and mappings > limit


def release_compiled_kernels(kernels: Iterable, limit: int | None = None) -> bool:
    """Drop the compiled programs of pldjax's ``kernels`` (jitted functions, :class:`Kernel`)
    when this process holds more than ``limit`` memory mappings (see
    :func:`above_mapping_limit`); returns whether it did. Elsewhere than on Linux it does
    nothing. No other cache is touched: the caller's own compiled functions stay compiled.

    Every executable XLA compiles for the CPU keeps its code in memory mappings (about 250 for
    one of pldjax's composition kernels) until its jitted function releases it. A sweep of 1,024
    DP-SGD configurations compiles over 250 kernels and reached the default limit of 65,530:
    mmap then fails inside XLA's compiler and the process dies of a segfault. Dropped kernels are
    compiled again when next called (from the persistent cache when it is on). Callers on a hot
    path check :func:`compiled_count` first.
    """
    if not above_mapping_limit(limit):
        return False
    for kernel in kernels:
        kernel.clear_cache()
    gc.collect()
    return True


class MappingGuard:
    """:func:`release_compiled_kernels` for code that compiles many shapes (a sweep): reads the
    mappings once ``kernels`` hold ``first`` compiled shapes, then again only after ``every``
    more (a read costs about 3 ms once a process holds a hundred kernels, and a sweep asks after
    every chunk). Each kernel adds about 250 mappings, far below the limit's remaining 40%."""

    def __init__(self, kernels: Iterable, *, first: int, every: int):
        self.kernels, self.first, self.every = tuple(kernels), first, every
        self._read_at: int | None = None  # compiled shapes at the last read, if it released none

    def check(self) -> bool:
        """Release the compiled kernels if it is time to look and the mappings are many."""
        count = compiled_count(self.kernels)
        if self._read_at is not None and count < self._read_at:  # the caches were dropped since
            self._read_at = None
        if count < (self.first if self._read_at is None else self._read_at + self.every):
            return False
        released = release_compiled_kernels(self.kernels)
        self._read_at = None if released else count
        return released


def on_host(array) -> bool:
    """True for a concrete array in host memory (NumPy, or a JAX array on one CPU device): glue
    on it can run in NumPy, without copies and without compiling a program per operation."""
    if is_traced(array):
        return False
    if isinstance(array, jax.Array):
        devices = array.devices()
        return len(devices) == 1 and next(iter(devices)).platform == "cpu"
    return True


def to_device(array):
    """A JAX array of ``array`` (NumPy: ``jax.device_put``, which unlike ``jnp.asarray`` compiles
    no program; a JAX array or tracer unchanged)."""
    return jax.device_put(array) if isinstance(array, np.ndarray | np.generic) else array


#: The most grid points (rows x points) and rows of a small computation on PLDs in host memory
#: that runs in NumPy, row by row, instead of in a compiled kernel (see
#: :func:`pldjax.core.pld.computed_on_host`): NumPy answers such readings and pairwise
#: compositions in milliseconds, where each new shape of a kernel took 0.2-1.2 s to compile.
HOST_POINTS = 2**20
HOST_ROWS = 16

def readable_on_host(array) -> bool:
    """True where a small computation may read ``array`` in NumPy: :func:`on_host`, or a concrete
    array of at most HOST_POINTS elements on one accelerator, which NumPy then copies to the
    host. A PLD's small composition or reading, or a filter's spend, on a machine with an
    accelerator thus runs the host's NumPy code and compiles nothing, where it compiled a
    program for the device (seconds each: the Quickstart's few calls compiled 22 programs on an
    H200, one filter spend 3.9 s)."""
    if on_host(array):
        return True
    return (isinstance(array, jax.Array) and not is_traced(array)
            and len(array.devices()) == 1 and array.size <= HOST_POINTS)


#: Grid points (rows x points, of the mechanisms discretized and the windows composed) of
#: accounting calls that a process runs in NumPy on the host before it compiles the accounting
#: kernels (see :class:`HostWork`): NumPy does about 5 million of them a second on 2 cores, about
#: 4x slower than the compiled kernels but with nothing to compile, where each new shape of a
#: kernel takes 1-3 s to compile there. A first DP-SGD epsilon (sigma 1, q 0.01, T 10^4: 229,376
#: points) takes 0.2-0.35 s in a fresh process instead of 5-7 s; 256 random configurations (41
#: million points) 8 s instead of 27-30 s. This many points are about 13 s of NumPy work, about
#: what the programs of a sweep take to compile: a loop of many calls spends at most that on the
#: host before it compiles, a session of a few calls never compiles.
HOST_WORK = 2**26


class HostWork:
    """The grid points of accounting calls this process has run in NumPy on the host
    (``done``), against its budget: HOST_WORK, or ``$PLDJAX_HOST_WORK`` where set (a whole
    number; 0: every accounting call compiles its kernels, from the first); and of that, the
    points run in place of each compiled program (``rents``), until the program is compiled
    (``bought``: no more work runs on the host in its place)."""

    def __init__(self):
        self.done = 0
        self.rents: collections.Counter = collections.Counter()
        self.bought: set[Hashable] = set()
        self._lock = threading.Lock()

    @property
    def budget(self) -> int:
        configured = os.environ.get("PLDJAX_HOST_WORK")
        if configured is None:
            return HOST_WORK
        if not configured.strip().isdigit():
            raise ValueError(f"PLDJAX_HOST_WORK must be a whole number >= 0 (grid points), got "
                             f"{configured!r}")
        return int(configured)

    def claim(self, points: int, program: Hashable = None, price: int = 0) -> bool:
        """Count ``points`` grid points to be run on the host, if they fit in what is left and,
        for work done in place of a compiled ``program``, in its ``price`` (the most points run
        in its place, as long as it is not bought: a ski rental); whether they did."""
        with self._lock:
            if not self.fits(points, program, price):
                return False
            self.done += points
            if program is not None:
                self.rents[program] += points
            return True

    def fits(self, points: int, program: Hashable = None, price: int = 0) -> bool:
        """Whether :meth:`claim` would take these ``points`` now (counting nothing)."""
        if self.done + points > self.budget:
            return False
        return program is None or (program not in self.bought
                                   and self.rents[program] + points <= price)

    def buy(self, program: Hashable) -> None:
        """Record that ``program`` is compiled (or compiling): :meth:`claim` no longer rents it."""
        self.bought.add(program)


#: This process's :class:`HostWork`.
host_work = HostWork()


#: Bytes of the block :func:`keep_freed_host_memory` allocates and frees: just under glibc's
#: largest dynamic mmap threshold (32 MiB on 64-bit systems), which a freed block moves only
#: where it is no larger.
_THRESHOLD_BLOCK = (32 << 20) - (8 << 10)

#: glibc's environment variables that set its thresholds (and turn their adjustment off).
_MALLOC_SETTINGS = frozenset({"MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                              "MALLOC_MMAP_MAX_"})


@functools.cache
def keep_freed_host_memory() -> None:
    """Once a process, before its first accounting call or computation on PLDs in host memory:
    allocate and free one block of just under 32 MiB, so that glibc's malloc keeps the memory
    that host computations free for the next ones instead of giving it back to the system at
    every call.

    glibc maps a block above its mmap threshold (128 KiB at first) on its own, and gives the
    free memory at its heap's top back to the system once more than its trim threshold (twice
    the mmap threshold) lies there; a freed mapped block raises the mmap threshold to its size
    (up to 32 MiB). An accounting call on the host allocates and frees window-sized arrays
    (about 1 MB each) at every step; with the thresholds those arrays set, each call gave the
    heap's top back and faulted it in again: 2,800-3,700 page faults, 6-8 ms of a 17-19 ms
    call (DP-SGD, sigma 1, q 0.01, T 10^4, on a 2-core CPU). With the thresholds at 32 and
    64 MiB the same call takes 11 ms with no page faults, at the same peak memory (and that
    Gaussian's 1000-fold self-composition, read at one delta, 14-15 ms against 23-25 ms). Any
    process that frees an array of 32 MiB gets these thresholds; the cost is up to 64 MiB of
    freed memory kept by the process. Nothing is done where the user set glibc's thresholds
    (by ``MALLOC_TOP_PAD_`` and the like) or under another C library."""
    if _MALLOC_SETTINGS & os.environ.keys():
        return
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not a POSIX system, or not glibc
        return
    if libc and libc.startswith("glibc"):
        np.empty(_THRESHOLD_BLOCK, np.uint8)  # mapped, then freed at once


def array_module(*arrays):
    """NumPy for NumPy arrays or scalars, ``jax.numpy`` where any of ``arrays`` is something
    else (a JAX array, a tracer; Python numbers go with the others, and alone give
    ``jax.numpy``): for the kernels that also run on the host, where one small evaluation costs
    less in NumPy than compiling its program."""
    found = False
    for a in arrays:
        if isinstance(a, np.ndarray | np.generic):
            found = True
        elif not isinstance(a, int | float | bool):
            return jnp
    return np if found else jnp


def map_rows(fn: Callable) -> Callable:
    """``jax.vmap(fn)`` over the first axis of its arguments (pytrees), or for NumPy ones (as
    the first leaf says: see :func:`array_module`) ``fn`` on each row in turn, its outputs
    stacked."""
    def mapped(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        if array_module(leaves[0]) is not np:
            return jax.vmap(fn)(*args)
        if leaves[0].shape[0] == 1:  # one row (one configuration): no window-long copies
            return _one_row(fn(*tree.unflatten([leaf[0] for leaf in leaves])), leaves)
        rows = [fn(*tree.unflatten([leaf[i] for leaf in leaves]))
                for i in range(leaves[0].shape[0])]
        return jax.tree.map(lambda *column: np.stack(column), *rows)

    return mapped


def _one_row(outputs, inputs):
    """The outputs of ``fn`` on the one row of :func:`map_rows`'s ``inputs`` (their leaves),
    each with a leading axis of one: a view of its own memory, or a copy where it holds the
    memory of an input (as ``numpy.stack`` would give)."""
    def owner(a):
        return a if a.base is None else a.base

    held = {id(owner(leaf)) for leaf in inputs if isinstance(leaf, np.ndarray)}
    flat, tree = jax.tree_util.tree_flatten(outputs)
    flat = [np.asarray(leaf) for leaf in flat]
    return tree.unflatten([leaf[None].copy() if id(owner(leaf)) in held else leaf[None]
                           for leaf in flat])


def while_loop(cond: Callable, body: Callable, carry):
    """``jax.lax.while_loop(cond, body, carry)``, or for a carry of NumPy values (as its leaves
    say: see :func:`array_module`) the same loop in Python, on the host."""
    if array_module(*jax.tree_util.tree_leaves(carry)) is not np:
        return jax.lax.while_loop(cond, body, carry)
    while bool(cond(carry)):
        carry = body(carry)
    return carry


#: Most multiply-adds of one BLAS product on the host (see :func:`matmul`).
HOST_PRODUCT = 2**17


def matmul(a, b):
    """``a @ b`` for a 2-D ``a``: XLA's product, or for NumPy operands BLAS's, on row blocks of
    ``a`` of at most HOST_PRODUCT multiply-adds each. OpenBLAS (NumPy's BLAS) runs a product
    above about 2^18 multiply-adds in worker threads, which then spin on every core for tens of
    milliseconds: on the host, where each row's work calls such products (a composition's
    evaluation, a window's placement), they kept a core busy throughout (a (17, 128) x (128, 128)
    product cost 10.8 ms of CPU, a (15, 128) one 0.1 ms; 256 DP-SGD configurations on the host
    took 15 s of CPU in 9.0-9.5 s, in blocks 10-11 s in 7.4-8.0 s, on 2 cores)."""
    if array_module(a, b) is not np:
        return a @ b
    rows = max(1, HOST_PRODUCT // max(1, a.shape[-1] * (b.shape[-1] if b.ndim == 2 else 1)))
    if a.shape[0] <= rows:
        return a @ b
    return np.concatenate([a[begin:begin + rows] @ b for begin in range(0, a.shape[0], rows)])


def cumulative_sum(values, reverse: bool = False):
    """Running sums of the 1-D ``values``: sum_{i <= k}, or sum_{i >= k} when ``reverse``;
    NumPy's for NumPy values, else ``jax.lax.cumsum``. (Products with a triangular matrix of
    ones over blocks compiled faster on a CPU, but their additions' order changed with the
    number of rows vmapped together: a configuration's epsilon then moved by 1e-11 between a
    batch and a call of its own.)"""
    if array_module(values) is np:
        return np.cumsum(values[::-1])[::-1] if reverse else np.cumsum(values)
    return jax.lax.cumsum(values, reverse=reverse)


def _power_of_two(b) -> bool:
    """Whether ``b`` is a Python int power of two (a divisor known when tracing)."""
    return isinstance(b, int) and b > 0 and b & (b - 1) == 0


def quotient(a, b):
    """a // b of non-negative integers (arrays or numbers, broadcast together): NumPy's for NumPy
    operands, else one truncating division (``jax.lax.div``), which agrees with floor division
    there, or a shift for a power of two known when tracing. ``//`` on traced integers adds
    floor division's corrections for negative operands, which XLA's CPU fusion then repeats in
    every fused loop that reads the quotient (a tiled masses program held 800 such remainders:
    7,940 instructions, 4,543 without)."""
    if array_module(a, b) is np:
        return np.floor_divide(a, b)
    if _power_of_two(b):
        return jnp.right_shift(jnp.asarray(a, jnp.int64), b.bit_length() - 1)
    a, b = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.int64) for v in (a, b)))
    return jax.lax.div(a, b)


def remainder(a, b):
    """a % b of non-negative integers (see :func:`quotient`)."""
    if array_module(a, b) is np:
        return np.remainder(a, b)
    if _power_of_two(b):
        return jnp.bitwise_and(jnp.asarray(a, jnp.int64), b - 1)
    a, b = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.int64) for v in (a, b)))
    return jax.lax.rem(a, b)


def glue_module(arrays):
    """The array module for reshaping ``arrays``: NumPy for concrete arrays in host memory, or
    small ones on an accelerator (:func:`readable_on_host`; an eager ``jnp`` operation compiles
    a program of its own), ``jax.numpy`` elsewhere."""
    return np if all(readable_on_host(a) for a in arrays) else jnp
