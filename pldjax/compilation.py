"""A persistent cache of compiled kernels, so that a new process does not compile them again.

pldjax's kernels take a few seconds to compile on a CPU (the first call of a session); JAX can keep
the compiled executables on disk and load them in a fraction of that. This changes a global JAX
setting, so the library leaves it to you (``pj.enable_compilation_cache()`` at the top of a notebook
or script); the ``pldjax`` command line turns it on (set ``PLDJAX_COMPILATION_CACHE=0`` to opt out).
"""

from __future__ import annotations

import os
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
