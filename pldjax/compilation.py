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
"""

from __future__ import annotations

import functools
import gc
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import jax


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
    """
    if os.environ.get("PLDJAX_COMPILATION_CACHE") == "0" or jax.config.jax_compilation_cache_dir:
        return None
    directory = Path(path) if path is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
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


@functools.cache
def _mapping_limit() -> int | None:
    """Linux's per-process limit on memory mappings (vm.max_map_count), None elsewhere."""
    try:
        with open("/proc/sys/vm/max_map_count", "rb") as file:
            return int(file.read())
    except (OSError, ValueError):
        return None


#: Fraction of vm.max_map_count at which :func:`release_compiled_kernels` drops JAX's compiled
#: kernels: below it there is room for the kernels one more chunk of a sweep compiles.
MAPPING_FRACTION = 0.6


def compiled_count(kernels: Iterable) -> int:
    """How many compiled shapes the jitted functions ``kernels`` hold in JAX's in-memory caches
    (cheap: no system call)."""
    return sum(kernel._cache_size() for kernel in kernels)


def release_compiled_kernels(limit: int | None = None) -> bool:
    """Drop JAX's in-memory compiled kernels (``jax.clear_caches()``) when this process holds more
    than ``limit`` memory mappings (default: MAPPING_FRACTION of Linux's vm.max_map_count);
    returns whether it did. Elsewhere than on Linux it does nothing.

    Every executable XLA compiles for the CPU keeps its code in memory mappings (about 250 for
    one of pldjax's composition kernels) until JAX's caches release it. A sweep of 1,024 DP-SGD
    configurations compiles over 250 kernels and reached the default limit of 65,530: mmap then
    fails inside XLA's compiler and the process dies of a segfault. Dropped kernels are compiled
    again when next called (from the persistent cache when it is on). Reading the mappings costs
    about 0.1-0.7 ms: callers on a hot path check :func:`compiled_count` first.
    """
    if limit is None:
        system = _mapping_limit()
        if system is None:
            return False
        limit = int(MAPPING_FRACTION * system)
    try:
        with open("/proc/self/maps", "rb") as file:
            mappings = file.read().count(b"\n")
    except OSError:
        return False
    if mappings <= limit:
        return False
    jax.clear_caches()
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
        released = release_compiled_kernels()
        self._read_at = None if released else count
        return released
