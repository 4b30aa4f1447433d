"""The suite's shared harness: timing, fresh processes, the machine, Markdown tables, result files.

Nothing here imports jax or pldjax at module level, so that ``python -m bench --list`` is cheap and
a fresh process's import time is the benchmark's own. ``python -m bench.harness`` (the worker of
:func:`fresh_process`) reads a JSON spec on stdin, runs it and prints one ``RESULT`` line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

#: Distributions whose versions a result file states, where installed.
VERSIONS = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "numpy", "scipy", "dp-accounting",
            "prv-accountant", "PLD_accounting", "opacus", "torch", "mpmath")

_START = time.perf_counter()

#: The compilation cache of fresh processes given none: None (off, so that a first call includes
#: its compilation); a --quick run sets a directory kept between smoke runs.
DEFAULT_CACHE: str | None = None

#: Environment variables the suite sets for its own process only (fresh processes do not inherit
#: them, so that they measure what a user's process does).
PARENT_ONLY: set[str] = set()


def log(text: str) -> None:
    """A progress line on stderr, with the seconds since the suite started."""
    print(f"[{time.perf_counter() - _START:7.1f} s] {text}", file=sys.stderr, flush=True)


# -- values ---------------------------------------------------------------------------------------
def jsonable(value):
    """``value`` with NumPy arrays and scalars as lists and floats; NaN and infinities as None."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str):  # NumPy arrays and scalars
        return jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


def fmt(value, spec: str = ".3g") -> str | None:
    """``format(value, spec)``; None stays None (an empty cell), NaN and infinities as words."""
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def sweep_configs(n: int, seed: int = 0):
    """The DP-SGD sweep's seeded configurations: sigma uniform in [0.5, 3], q log-uniform in
    [1e-3, 0.05], T log-uniform integer in [1e2, 1e5]; three arrays of ``n``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sigmas = rng.uniform(0.5, 3.0, n)
    qs = np.exp(rng.uniform(np.log(1e-3), np.log(0.05), n))
    steps = np.round(np.exp(rng.uniform(np.log(1e2), np.log(1e5), n))).astype(np.int64)
    return sigmas, qs, steps


def dp_accounting_dpsgd_epsilon(sigma, q, steps, delta, interval=1e-4, pessimistic=True) -> float:
    """dp-accounting's PLD epsilon of DP-SGD (Poisson-subsampled Gaussian, add/remove) at value
    discretization ``interval``: connect-the-dots when pessimistic, privacy buckets when not."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    pld = pld_lib.from_gaussian_mechanism(
        standard_deviation=float(sigma), sampling_prob=float(q), value_discretization_interval=interval,
        pessimistic_estimate=pessimistic, use_connect_dots=pessimistic)
    return float(pld.self_compose(int(steps)).get_epsilon_for_delta(delta))


def gaussian_epsilon_exact(mu: float, delta: float) -> float:
    """epsilon(delta) of Gaussian DP with parameter ``mu`` in mpmath (bisection to 2^-200 of its
    bracket): delta_mu(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu); the reference of
    the benchmarks that compose Gaussians."""
    import mpmath as mp

    with mp.workdps(50):
        mu = mp.mpf(mu)

        def excess(eps):
            return mp.ncdf(mu / 2 - eps / mu) - mp.e**eps * mp.ncdf(-mu / 2 - eps / mu) - delta

        lo, hi = mp.mpf(0), mu * mu / 2 + 40 * mu + 10
        if excess(lo) <= 0:
            return 0.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
        return float(hi)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    return importlib.util.find_spec(module) is not None


# -- timing in this process -----------------------------------------------------------------------
def _ready(value):
    """``value`` with every jax array in it computed (a no-op where jax was never imported)."""
    jax = sys.modules.get("jax")
    return value if jax is None else jax.block_until_ready(value)


def timed(call):
    """(wall seconds, value) of ``call()``, its jax arrays computed."""
    start = time.perf_counter()
    value = _ready(call())
    return time.perf_counter() - start, value


def cpu_timed(call):
    """(CPU seconds of this process, wall seconds, value) of ``call()``: on a shared machine CPU
    time is less noisy than wall time."""
    cpu, wall = time.process_time(), time.perf_counter()
    value = _ready(call())
    return time.process_time() - cpu, time.perf_counter() - wall, value


#: Calls of :func:`warm_median` go on past their ``repeats`` until they have taken this long
#: (seconds), so that a fast call's median is of its steady state, not of a process's first few
#: calls (one DP-SGD configuration's calls 2-5 took 16-18 ms, later ones 15.7 ms).
WARM_SECONDS = 1.0
#: The most calls :func:`warm_median` makes.
WARM_CALLS = 500


def warm_median(call, repeats: int, budget_s: float = 60.0):
    """(median seconds, the times, value) of ``repeats`` calls after a warm-up call, and more
    until they add up to WARM_SECONDS (at most WARM_CALLS); fewer calls (at least one) where
    ``repeats`` of them would take more than ``budget_s``."""
    first, value = timed(call)
    count = repeats if first * repeats <= budget_s else max(1, int(budget_s // max(first, 1e-9)))
    times = [timed(call)[0] for _ in range(count)]
    while sum(times) < WARM_SECONDS and len(times) < WARM_CALLS:
        times.append(timed(call)[0])
    return statistics.median(times), times, value


def first_and_warm(call, repeats: int):
    """(first seconds, median of ``repeats`` further calls, their times, the last value)."""
    first, value = timed(call)
    times = []
    for _ in range(repeats):
        seconds, value = timed(call)
        times.append(seconds)
    return first, (statistics.median(times) if times else None), times, value


def fft_round_trip(size: int, repeats: int = 20) -> dict:
    """A jitted float64 rfft + irfft of ``size`` points: the median and fastest of ``repeats``
    round trips, in seconds (the unit the kernels' costs are compared with)."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        x = jnp.linspace(0.0, 1.0, size, dtype=jnp.float64)
        round_trip = jax.jit(lambda v: jnp.fft.irfft(jnp.fft.rfft(v), size))
        _ready(round_trip(x))
        times = [timed(lambda: round_trip(x))[0] for _ in range(repeats)]
    return dict(size=size, median=statistics.median(times), min=min(times))


# -- fresh processes ------------------------------------------------------------------------------
def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: VmHWM on Linux (ru_maxrss survives fork + exec,
    so a child would report its parent's peak), ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_env(cache: str | None = None, extra_path: str | None = None) -> dict:
    """The environment of a fresh process: this checkout first on PYTHONPATH, and pldjax's
    persistent compilation cache in the directory ``cache`` or, if None, :data:`DEFAULT_CACHE`
    (off unless a --quick run), so that a first call includes its compilation unless a filled
    cache is what is measured."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR" and k not in PARENT_ONLY}
    cache = cache or DEFAULT_CACHE
    env["PLDJAX_COMPILATION_CACHE"] = str(cache) if cache else "0"
    paths = [str(ROOT), *([extra_path] if extra_path else []), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def compilation_note() -> str:
    """How a fresh process's first call stands with compilation, for a table's notes."""
    if DEFAULT_CACHE is None:
        return "compilation included: pldjax's persistent compilation cache off"
    return "pldjax's compilation cache kept between --quick runs, so compilation may be cached"


def fresh_process(module: str, factory: str, kwargs: dict | None = None, *, imports: str = "",
                  calls: int = 1, timeout: float = 600.0, cache: str | None = None,
                  extra_path: str | None = None, keep_values: bool = False) -> dict:
    """Time ``calls`` calls in a new interpreter: ``imports`` (a statement, timed apart), then
    ``module.factory(**kwargs)`` (untimed) returns the call. Returns import_s, first_s, wall_s and
    cpu_s (one per call), peak_mb (the process's peak RSS), import_mb and call_mb (what the
    imports and the first call added to it), value (the first call's; ``values``: every call's,
    with ``keep_values``); or ``error``, a line saying why there is no result."""
    spec = dict(module=module, factory=factory, kwargs=jsonable(kwargs or {}), imports=imports,
                calls=calls, keep_values=keep_values)
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.harness"], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=timeout,
                              env=worker_env(cache, extra_path), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout:g} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(error=f"exit {proc.returncode}: {tail[:160]}")


def _worker() -> None:
    spec = json.loads(sys.stdin.read())
    rss_start = peak_rss_mb()
    try:
        start = time.perf_counter()
        exec(spec["imports"], {})
        import_s = time.perf_counter() - start
        call = getattr(importlib.import_module(spec["module"]), spec["factory"])(**spec["kwargs"])
        rss_before = peak_rss_mb()
        walls, cpus, values, call_mb = [], [], [], None
        for _ in range(spec["calls"]):
            cpu, wall, value = cpu_timed(call)
            walls.append(wall)
            cpus.append(cpu)
            values.append(value)
            if call_mb is None:
                call_mb = peak_rss_mb() - rss_before
        out = dict(import_s=import_s, first_s=walls[0], wall_s=walls, cpu_s=cpus, peak_mb=peak_rss_mb(),
                   import_mb=rss_before - rss_start, call_mb=call_mb, value=jsonable(values[0]))
        if spec["keep_values"]:
            out["values"] = jsonable(values)
    except Exception as err:  # a library failing is a result, not a crash
        out = dict(error=f"{type(err).__name__}: {str(err)[:160]}")
    print("RESULT " + json.dumps(out), flush=True)


# -- the machine ----------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:")) / 2**20
    except (OSError, StopIteration):
        return None


def _git(*args) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _devices() -> tuple[str | None, list[str]]:
    """jax's default backend and its devices: asked in a short process of its own where this one
    has not imported jax (it must not hold an accelerator that its fresh processes need)."""
    if "jax" in sys.modules:
        jax = sys.modules["jax"]
        return jax.default_backend(), [f"{d.platform}:{d.id} {d.device_kind}" for d in jax.devices()]
    code = ("import jax, json; print(json.dumps([jax.default_backend(), "
            "[f'{d.platform}:{d.id} {d.device_kind}' for d in jax.devices()]]))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env=worker_env(), cwd=ROOT)
        backend, devices = json.loads(out.stdout.strip().splitlines()[-1])
        return backend, devices
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None, []


def load_average() -> float | None:
    """The 1-minute load average, where the platform has one."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def machine() -> dict:
    """The machine, the software and the pldjax commit measured."""
    versions = {}
    for dist in VERSIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    backend, devices = _devices()
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain", "--", "pldjax"):
        commit += " with uncommitted changes to pldjax/"
    return dict(cpu=_cpu_model(), cores=os.cpu_count(), memory_gib=_memory_gib(),
                platform=platform.platform(), python=platform.python_version(), backend=backend,
                devices=devices, versions=versions,
                commit=commit, date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                load_start=load_average())


def machine_lines(m: dict) -> list[str]:
    """The machine as Markdown bullet lines."""
    accelerators = [d for d in m.get("devices", []) if not d.startswith("cpu")]
    memory = f", {m['memory_gib']:.0f} GiB" if m.get("memory_gib") else ""
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    load = m.get("load_start")
    lines = [
        f"- Date: {m['date']}; pldjax commit {m.get('commit') or 'unknown'}",
        f"- CPU: {m['cpu']}, {m['cores']} cores{memory}; {m['platform']}",
        f"- Accelerator: {', '.join(accelerators) if accelerators else 'none'} "
        f"(jax backend {m.get('backend') or 'unknown'})",
        f"- Python {m['python']}; {versions}",
    ]
    if load is not None:
        end = m.get("load_end")
        lines.append(f"- Load average: {load:.1f} at start"
                     + (f", {end:.1f} at end" if end is not None else "")
                     + (f"; {m['wall_s']:.0f} s in all" if m.get("wall_s") is not None else ""))
    return lines


# -- tables and result files ----------------------------------------------------------------------
def _numeric(cell: str) -> bool:
    try:
        float(cell.split(" ")[0].replace(",", "").rstrip("x%"))
        return True
    except ValueError:
        return False


def markdown_table(columns, rows) -> list[str]:
    """A Markdown table: None is an empty cell; columns whose cells are all numbers are
    right-aligned."""
    cells = [["" if c is None else str(c).replace("|", "\\|") for c in row] for row in rows]
    right = [bool(col) and all(_numeric(c) for c in col if c) and any(col)
             for col in ([row[i] for row in cells] for i in range(len(columns)))]
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return lines


#: The heading that opens a result file's record of a run on an accelerator, which a run on a
#: CPU keeps (see :meth:`Report.flush`).
ACCELERATOR_SECTION = "## On a GPU"


class Report:
    """A benchmark's result: a title, the command, the machine, then sections of text and
    tables. :meth:`markdown` renders it; :meth:`flush` rewrites the result file with it (mid-run
    too, so that a run cut short keeps what it measured), after which come the file's record of
    a run on an accelerator, if it had one."""

    def __init__(self, name: str, summary: str, command: str, path: Path | None = None):
        self.name, self.summary, self.command, self.path = name, summary, command, path
        self.blocks: list[tuple] = []
        self.machine: dict | None = None
        self.start = time.perf_counter()

    def heading(self, text: str) -> None:
        self.blocks.append(("text", f"## {text}"))

    def text(self, text: str) -> None:
        self.blocks.append(("text", text))

    def table(self, columns, rows=None) -> list:
        """Add a table; returns its rows list, which may grow (then :meth:`flush`)."""
        rows = [] if rows is None else rows
        self.blocks.append(("table", columns, rows))
        return rows

    def markdown(self) -> str:
        out = [f"# {self.name}", "", self.summary, "", f"Command: `{self.command}`", ""]
        if self.machine:
            m = dict(self.machine)
            m.setdefault("load_end", load_average())
            m.setdefault("wall_s", time.perf_counter() - self.start)
            out += machine_lines(m) + [""]
        for kind, *content in self.blocks:
            out += markdown_table(*content) if kind == "table" else content
            out.append("")
        return "\n".join(out).rstrip() + "\n"

    def flush(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = self._kept_sections()
            self.path.write_text(self.markdown() + ("\n" + kept if kept else ""))

    def _kept_sections(self) -> str:
        """The result file's sections from its ACCELERATOR_SECTION heading on, which record a run
        on an accelerator with its own machine lines: a run without one rewrites the rest of the
        file and keeps them (a run on an accelerator, or one that writes such a section, does
        not)."""
        if self.path is None or not self.path.exists():
            return ""
        devices = (self.machine or {}).get("devices", [])
        if any(not d.startswith("cpu") for d in devices) or any(
                kind == "text" and content[0].startswith(ACCELERATOR_SECTION)
                for kind, *content in self.blocks):
            return ""
        text = self.path.read_text()
        start = text.find("\n" + ACCELERATOR_SECTION)
        return "" if start < 0 else text[start + 1:].rstrip() + "\n"

    def finish(self) -> str:
        if self.machine is not None:
            self.machine["load_end"] = load_average()
            self.machine["wall_s"] = time.perf_counter() - self.start
        self.flush()
        return self.markdown()


if __name__ == "__main__":
    _worker()
