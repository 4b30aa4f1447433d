"""The XLA programs a piece of code compiles, as JAX's monitoring reports them (each
``/jax/core/compile/backend_compile_duration`` event names its program, ``jit(NAME)``), in this
process or in a new one. A program loaded from the persistent compilation cache is reported as
one compiled: a first call counts every program it needs, whether compiled or loaded; a call
that needs nothing new reports none. And the switch that lets small accounting calls run in
NumPy on the host, compiling nothing (the default test run compiles them: PLDJAX_HOST_WORK=0; a
run with a large PLDJAX_HOST_WORK runs them on the host wherever they may, and the tests of the
compiled path pin it with :func:`accounting_compiled`)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax

#: JAX's monitoring event of one XLA program compiled (or loaded from the persistent cache).
COMPILED = "/jax/core/compile/backend_compile_duration"


def compiled_programs(fn):
    """(fn's result, the names of the XLA programs compiled while it ran, in order)."""
    names: list[str] = []

    def record(event: str, duration: float, **kwargs) -> None:
        if event == COMPILED:
            names.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(record)
    try:
        result = fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(record)
    return result, names


def programs_of_a_new_process(code: str, cache: Path | None = None) -> tuple[list[str], str]:
    """Run ``code`` in a new Python process: (the names of the XLA programs it compiled, in
    order; what it printed; each kernel's program under the kernel's name). ``cache``: pldjax's
    compilation cache directory (give an empty one to see every program compiled); None: no
    persistent cache at all. JAX's own cache settings of this process are not passed on."""
    script = (f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "import json\nfrom compiled_programs import compiled_programs\n"
              f"_, names = compiled_programs(lambda: exec({textwrap.dedent(code)!r}, {{}}))\n"
              "print(json.dumps(names))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env["PLDJAX_COMPILATION_CACHE"] = "0" if cache is None else str(cache)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    *printed, names = out.stdout.strip().splitlines()
    return json.loads(names), "\n".join(printed)


def accounting_on_the_host(monkeypatch, points: int = 10**15) -> None:
    """Small accounting calls run in NumPy on the host from here on: a budget of ``points`` grid
    points (:class:`pldjax.core.compilation.HostWork`), none spent yet and no program bought."""
    from pldjax.core import compilation

    monkeypatch.setenv("PLDJAX_HOST_WORK", str(points))
    monkeypatch.setattr(compilation.host_work, "done", 0)
    monkeypatch.setattr(compilation.host_work, "rents", collections.Counter())
    monkeypatch.setattr(compilation.host_work, "bought", set())


def accounting_compiled(monkeypatch) -> None:
    """Every accounting call compiles its kernels from here on (PLDJAX_HOST_WORK=0), whatever
    the run's own setting: for tests of the compiled path itself (its programs, shapes and
    calls)."""
    monkeypatch.setenv("PLDJAX_HOST_WORK", "0")
