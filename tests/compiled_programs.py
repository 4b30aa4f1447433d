"""The XLA programs a piece of code compiles, read from JAX's compile log (what
``jax_log_compiles`` prints: "Finished XLA compilation of jit(NAME) in ..."), in this process or
in a new one."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax


class _Names(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Finished XLA compilation of"):
            self.names.append(message.split(" of ")[1].split(" in ")[0])


def compiled_programs(fn):
    """(fn's result, the names of the XLA programs compiled while it ran, in order)."""
    handler, log = _Names(), logging.getLogger("jax._src.dispatch")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        with jax.log_compiles(True):
            result = fn()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return result, handler.names


def programs_of_a_new_process(code: str, cache: Path | None = None) -> tuple[list[str], str]:
    """Run ``code`` in a new Python process: (the names of the XLA programs it compiled, in
    order; what it printed). ``cache``: pldjax's compilation cache directory (give an empty one
    to see every program compiled, exported kernels as ``jit(call)``); None: no persistent cache
    at all (every program compiles under its kernel's name). JAX's own cache settings of this
    process are not passed on."""
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
