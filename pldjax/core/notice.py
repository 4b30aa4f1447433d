"""Saying why a call takes seconds, while it runs.

A pldjax call compiles XLA programs for the shapes its process has not met before (seconds each on
a CPU; loaded from the persistent cache in later processes); calls on shapes met before take
milliseconds. A call that is still running after :data:`NOTICE_AFTER` seconds writes one line to
stderr saying what runs and why (that it compiles, where JAX's monitoring reported a program
traced, lowered or compiled since it began, else that the work itself takes this long), and one
more when it ends, so that a notebook cell or a training script does not sit silent. Calls that
finish sooner print nothing, and only the outermost of nested calls speaks (a calibration, not
each of its evaluations). ``PLDJAX_QUIET=1`` in the environment silences it.

One daemon thread, started by the first call, looks at the running call four times a second; a
call itself only records its name and start (about a microsecond), so hot paths (a filter's spend
in a training loop) pay nothing noticeable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

import jax

#: Seconds a call runs before it says why.
NOTICE_AFTER = 3.0
#: Seconds between the watcher's looks.
_POLL = 0.25


#: Why a call takes seconds, unless it says otherwise: said where it began to make an XLA program
#: before the notice, and COMPUTING said instead where it made none.
COMPILING = ("it compiles XLA programs for shapes this process has not met before; calls on shapes "
             "met before take milliseconds")
#: Added to COMPILING where JAX has a persistent compilation cache (pldjax's by default).
_KEPT = " (the programs are kept in the persistent cache for later processes)"
COMPUTING = "it computes (no new XLA program so far: the work itself takes this long)"
#: JAX's monitoring events of making an XLA program (tracing, lowering, then compiling or loading
#: it from the persistent cache): the first ones arrive before a long compilation ends.
_COMPILE_EVENTS = "/jax/core/compile/"
_compiled = 0  # such events in this process since the watcher started


@dataclasses.dataclass
class _Call:
    what: str
    start: float
    why: str = COMPILING
    said: bool = False
    compiled_before: int = 0


_running: _Call | None = None
_lock = threading.Lock()
_watcher: threading.Thread | None = None


def _quiet() -> bool:
    return os.environ.get("PLDJAX_QUIET", "") not in ("", "0")


def _watch() -> None:
    while True:
        time.sleep(_POLL)
        call = _running
        if call is None or call.said or time.perf_counter() - call.start < NOTICE_AFTER:
            continue
        with _lock:
            if call is _running and not call.said:
                call.said = True
                why = call.why
                if why == COMPILING and _compiled == call.compiled_before:
                    why = COMPUTING
                elif why == COMPILING and jax.config.jax_compilation_cache_dir:
                    why += _KEPT
                print(f"{call.what} is still running after {NOTICE_AFTER:g} s: {why}",
                      file=sys.stderr, flush=True)


def _count_compiles(event: str, duration: float, **_) -> None:
    global _compiled
    if event.startswith(_COMPILE_EVENTS):
        _compiled += 1


def _start_watcher() -> None:
    global _watcher
    with _lock:
        if _watcher is None:  # the first call: count compilations from now on
            jax.monitoring.register_event_duration_secs_listener(_count_compiles)
        if _watcher is None or not _watcher.is_alive():
            _watcher = threading.Thread(target=_watch, name="pldjax-notice", daemon=True)
            _watcher.start()


@contextlib.contextmanager
def slow_call_notice(what: str, why: str = COMPILING) -> Iterator[None]:
    """Within the block: if it still runs after NOTICE_AFTER seconds, a line to stderr naming
    ``what`` (e.g. ``"pldjax.calibrate_noise_multiplier"``) and saying ``why``, and at its end
    the time it took. Silent inside another such block (of any thread) and under
    ``PLDJAX_QUIET``."""
    global _running
    if _running is not None or _quiet():
        yield
        return
    if _watcher is None or not _watcher.is_alive():
        _start_watcher()
    call = _running = _Call(what, time.perf_counter(), why, compiled_before=_compiled)
    try:
        yield
    finally:
        with _lock:
            _running = None
            if call.said:
                print(f"{what} done in {time.perf_counter() - call.start:.1f} s",
                      file=sys.stderr, flush=True)


def announces_slow_calls(name: str, why: str = COMPILING) -> Callable[[Callable], Callable]:
    """Decorator: each call of the function runs in :func:`slow_call_notice` as ``name``."""
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with slow_call_notice(name, why):
                return fn(*args, **kwargs)

        return wrapped

    return decorate
