"""First calls: the XLA programs pldjax compiles, and how long a new process takes to answer.

Each path is a piece of user code (a string, below), run in a fresh process with pldjax's
persistent compilation cache in a new, empty directory: the import timed apart, then the path
(compilation included), then the same path again a few times (warm: the fastest); then a second
fresh process runs it with that cache filled. JAX's own monitoring counts the work:
``/jax/core/compile/backend_compile_duration`` comes once per XLA program, but also for a program
loaded from the persistent cache (checked: a filled cache gives as many of these events as an
empty one), so a program counts as compiled only where no ``/jax/compilation_cache/cache_hits``
event came with it, and as loaded where one did; ``jaxpr_trace_duration`` and
``jaxpr_to_mlir_module_duration`` give the tracing and lowering time (their sums). A program's name
is the ``fun_name`` of its event (what ``jax_log_compiles`` prints: "Finished XLA compilation of
jit(NAME)"; pldjax's kernels compile under their own names, exported or not). dp-accounting's PLD
accountant (value discretization 1e-4) runs the same work in a fresh process where it has an
equivalent; a loop over many configurations is timed on a subset and scaled, as the table says.
The "goal" column holds the project's targets for these first calls.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

from bench import harness

QUICK = "paths dpsgd_epsilon and filter_spend only, 2 warm repeats, without dp-accounting"
DELTA = 1e-5
SEED = 0
RANDOM_CONFIGS = 256
ACCELERATOR_CONFIGS = 10_000

#: The paths: name -> (setup, untimed; the code, timed). Expression statements' values are
#: computed (block_until_ready) before the clock stops.
PATHS = {
    "quickstart": ("", """\
import jax.numpy as jnp
import pldjax as pj
p = pj.gaussian(sigma=1.0); c = p.self_compose(10_000); c.epsilon(1e-5); c.delta([1.0, 2.0, 5.0])
pj.gaussian(1.0, pessimistic=False).self_compose(10_000).epsilon(1e-5)
q = pj.compose([pj.gdp(mu=0.5), pj.laplace(scale=2.0), pj.randomized_response(1.0, 1e-6)]); q.epsilon(1e-6)
batch = pj.gaussian(sigma=jnp.array([0.8, 1.0, 2.0])); batch.self_compose(100).epsilon(1e-5)
"""),
    "dpsgd_epsilon": ("", "pj.dpsgd_epsilon(1.0, 0.01, 10_000, 1e-5)\n"),
    "sweep_1024": ("", "pj.dpsgd_epsilon(jnp.linspace(0.5, 3, 1024), 0.01, 10_000, 1e-5)\n"),
    "random_256": (f"from bench.harness import sweep_configs\n"
                   f"sigmas, qs, steps = sweep_configs({RANDOM_CONFIGS}, seed={SEED})\n",
                   "pj.dpsgd_epsilon(sigmas, qs, steps, 1e-5)\n"),
    "random_10000": (f"from bench.harness import sweep_configs\n"
                     f"sigmas, qs, steps = sweep_configs({ACCELERATOR_CONFIGS}, seed={SEED})\n",
                     "pj.dpsgd_epsilon(sigmas, qs, steps, 1e-5)\n"),
    "calibrate": ("", "pj.calibrate_noise_multiplier(2.0, 1e-5, 0.01, 10_000)\n"),
    "filter_spend": ("", "f = pj.filters.gdp_residue_filter(mu=1.0); s = f.init(); "
                         "f.spend(s, pj.randomized_response(0.5))\n"),
    "sweep_1024_optimistic": ("", "pj.dpsgd_epsilon(jnp.linspace(0.5, 3, 1024), 0.01, 10_000, 1e-5, "
                                  "pessimistic=False)\n"),
}
FIRST_ROW_PARTS = ("quickstart", "dpsgd_epsilon", "sweep_1024", "calibrate", "filter_spend")
PATHS["first_row"] = ("", "".join(PATHS[name][1] for name in FIRST_ROW_PARTS))
QUICK_PATHS = ("dpsgd_epsilon", "filter_spend")
#: The paths run unless --paths names others: all but the accelerator's (random_10000, minutes on a
#: CPU).
DEFAULT_PATHS = tuple(name for name in PATHS if name != "random_10000")

#: The project's targets: path -> (text, check(row) -> list of (what, met) or None where unmeasured).
GOALS = {
    "first_row": "<= 8 s and <= 25 programs (empty cache); <= 3 s (cache filled)",
    "sweep_1024": "<= 6 s (empty cache)",
    "random_256": ">= 15x dp-accounting's configs/s",
    "filter_spend": "<= 1.5 s (empty cache)",
    "random_10000": "on a GPU: <= 15 s (empty cache); warm <= 0.58 s",
}

IMPORTS = "from bench.compile import listen; listen(); import jax.numpy as jnp; import pldjax as pj"

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND = "/jax/core/compile/backend_compile_duration"
HIT = "/jax/compilation_cache/cache_hits"


def add_arguments(parser) -> None:
    parser.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                        help=f"which paths, comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--repeats", type=int, default=4, help="warm calls after the first (fastest)")
    parser.add_argument("--subset", type=int, default=16,
                        help="configurations dp-accounting's loops time (then scaled)")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="skip dp-accounting")
    parser.add_argument("--names", action="store_true",
                        help="also list each path's compiled programs by name")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per fresh process")


# -- in the fresh process -------------------------------------------------------------------------
class Monitor:
    """JAX's compilation events since the last :meth:`take`: programs compiled and loaded from the
    persistent cache (by name), traces and lowerings, and their seconds."""

    def __init__(self):
        self._clear()

    def _clear(self):
        self.compiled, self.loaded = Counter(), Counter()
        self.compile_seconds = Counter()  # by name
        self.counts = Counter()
        self.seconds = dict(compile=0.0, load=0.0, trace=0.0, lower=0.0)
        self._hit = False  # a cache hit since the last program

    def event(self, event, **kwargs):
        if event == HIT:
            self._hit = True

    def duration(self, event, seconds, **kwargs):
        name = str(kwargs.get("fun_name", "?"))
        if event == TRACE:
            self.counts["traces"] += 1
            self.seconds["trace"] += seconds
        elif event == LOWER:
            self.counts["lowerings"] += 1
            self.seconds["lower"] += seconds
        elif event == BACKEND:
            kind = "load" if self._hit else "compile"
            (self.loaded if self._hit else self.compiled)[name] += 1
            self.seconds[kind] += seconds
            if not self._hit:
                self.compile_seconds[name] += seconds
            self._hit = False

    def take(self) -> dict:
        """The events since the last take, as a JSON-able dict; then starts afresh."""
        out = dict(compiled=sum(self.compiled.values()), loaded=sum(self.loaded.values()),
                   traces=self.counts["traces"], lowerings=self.counts["lowerings"],
                   seconds=dict(self.seconds),
                   names={name: [count, self.compile_seconds[name]] for name, count in sorted(
                       self.compiled.items(), key=lambda item: (-item[1], -self.compile_seconds[item[0]]))},
                   loaded_names=dict(self.loaded.most_common()))
        self._clear()
        return out


_MONITOR: Monitor | None = None


def listen() -> None:
    """Register the monitor with JAX (in the fresh process, before pldjax is imported)."""
    global _MONITOR
    from jax import monitoring

    _MONITOR = Monitor()
    monitoring.register_event_listener(_MONITOR.event)
    monitoring.register_event_duration_secs_listener(_MONITOR.duration)


def _program(name: str, code: str):
    """``code`` compiled, each expression statement's value passed to ``_keep``."""
    import ast

    tree = ast.parse(code)
    tree.body = [ast.Expr(ast.Call(ast.Name("_keep", ast.Load()), [node.value], []))
                 if isinstance(node, ast.Expr) else node for node in tree.body]
    return compile(ast.fix_missing_locations(tree), f"<{name}>", "exec")


def _summary(value):
    """A few numbers of a value, for a glance at the answer (its type where it has none)."""
    import numpy as np

    try:
        flat = np.ravel(np.asarray(value, dtype=float))
        return [round(float(v), 6) for v in flat[:3]] + (["..."] if flat.size > 3 else [])
    except (TypeError, ValueError):
        return type(value).__name__


def path_call(path: str):
    """The call running ``path``'s code; it returns the compilation events of that call (the
    first call's ``import`` also holds those of the import and the setup)."""
    import jax
    import jax.numpy as jnp

    import pldjax as pj

    setup, code = PATHS[path]
    names = dict(pj=pj, jnp=jnp)
    exec(setup, names)
    program = _program(path, code)
    before = _MONITOR.take() if _MONITOR else None

    def call():
        kept = []
        exec(program, dict(names, _keep=kept.append))
        jax.block_until_ready(kept)
        out = _MONITOR.take() if _MONITOR else {}
        out["values"] = [_summary(v) for v in kept]
        nonlocal before
        out["import"], before = before, None
        return out

    return call


# -- in the suite's process -----------------------------------------------------------------------
def _fresh(path, cache, calls, args):
    return harness.fresh_process("bench.compile", "path_call", dict(path=path), imports=IMPORTS, calls=calls,
                                 cache=cache, timeout=args.timeout, keep_values=True)


def _measure(path, args) -> dict:
    """The empty-cache process (first call and warm repeats) and the filled-cache process."""
    root = tempfile.mkdtemp(prefix="pldjax-bench-compile-")
    cache = str(Path(root) / "xla")  # pldjax keeps its exported programs beside it, in xla-exported
    try:
        harness.log(f"compile: {path}, empty cache")
        empty = _fresh(path, cache, 1 + args.repeats, args)
        filled = {}
        if "error" not in empty:
            harness.log(f"compile: {path}, cache filled")
            filled = _fresh(path, cache, 1, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return dict(empty=empty, filled=filled)


def dp_accounting_subset(path: str, subset: int):
    """(configurations timed, configurations of the path, the sigmas, qs, steps timed) of the
    dp-accounting loop standing in for ``path``; None where it has no equivalent."""
    import numpy as np

    if path == "dpsgd_epsilon":
        return 1, 1, ([1.0], [0.01], [10_000])
    if path == "sweep_1024":
        sigmas = np.linspace(0.5, 3, 1024)
        pick = np.unique(np.round(np.linspace(0, 1023, min(subset, 1024))).astype(int))
        return len(pick), 1024, (sigmas[pick], np.full(len(pick), 0.01), np.full(len(pick), 10_000))
    if path == "random_256":
        sigmas, qs, steps = harness.sweep_configs(RANDOM_CONFIGS, SEED)
        pick = np.sort(np.random.default_rng(SEED + 1).choice(RANDOM_CONFIGS, min(subset, RANDOM_CONFIGS),
                                                              replace=False))
        return len(pick), RANDOM_CONFIGS, (sigmas[pick], qs[pick], steps[pick])
    return None


def _peer(path, args) -> dict | None:
    """dp-accounting's fresh-process time on ``path``'s work: seconds (scaled to the whole path),
    what was timed, and the raw result; None where it has no equivalent."""
    if path == "calibrate":
        harness.log("compile: dp-accounting, calibrate_dp_mechanism")
        res = harness.fresh_process("bench.calibration", "calibrate",
                                    dict(method="dpa_pld", configs=[[2.0, 0.01, 10_000]]),
                                    imports="import dp_accounting", timeout=args.timeout)
        return dict(res=res, timed=1, total=1, seconds=res.get("first_s"))
    spec = dp_accounting_subset(path, args.subset)
    if spec is None:
        return None
    timed, total, (sigmas, qs, steps) = spec
    harness.log(f"compile: dp-accounting, {timed} of {total} configurations of {path}")
    res = harness.fresh_process("bench.dpsgd", "dp_accounting_call", dict(sigmas=sigmas, qs=qs, steps=steps),
                                imports="from dp_accounting.pld import privacy_loss_distribution",
                                timeout=args.timeout)
    seconds = res.get("first_s")
    scaled = None if seconds is None else seconds * total / timed
    return dict(res=res, timed=timed, total=total, seconds=scaled)


def _first_row_peer(peers) -> dict | None:
    """dp-accounting's times of first_row's parts that have an equivalent, summed (each measured in
    a process of its own), where all of them were measured."""
    parts = [peers.get(name) for name in ("dpsgd_epsilon", "sweep_1024", "calibrate")]
    if any(part is None or part.get("seconds") is None for part in parts):
        return None
    return dict(res={}, timed=1, total=1, seconds=sum(part["seconds"] for part in parts),
                note="dpsgd_epsilon, sweep_1024 and calibrate summed")


def _goal_met(path, m, peer_ratio) -> str | None:
    """Whether ``path``'s measurements meet its goal, criterion by criterion."""
    first = m["empty"].get("first_s")
    programs = m["empty"]["values"][0]["compiled"] if "values" in m["empty"] else None
    checks = []
    if path == "first_row":
        checks = [(first, 8.0, "s"), (programs, 25, "programs"),
                  (m["filled"].get("first_s"), 3.0, "s cached")]
    elif path == "sweep_1024":
        checks = [(first, 6.0, "s")]
    elif path == "filter_spend":
        checks = [(first, 1.5, "s")]
    elif path == "random_10000":
        warm = min(m["empty"]["wall_s"][1:]) if len(m["empty"].get("wall_s", [])) > 1 else None
        checks = [(first, 15.0, "s"), (warm, 0.58, "s warm")]
    elif path == "random_256":
        if peer_ratio is None:
            return "not measured"
        return f"{'yes' if peer_ratio >= 15 else 'no'} ({peer_ratio:.1f}x)"
    if not checks:
        return None
    if any(value is None for value, _, _ in checks):
        return "not measured"
    return ", ".join(f"{'yes' if value <= limit else 'no'} ({harness.fmt(value, '.3g')} {unit})"
                     for value, limit, unit in checks)


def run(args, report) -> None:
    if args.quick:
        args.paths, args.repeats, args.peers = ",".join(QUICK_PATHS), min(args.repeats, 2), False
    paths = [p for p in args.paths.split(",") if p]
    for p in paths:
        if p not in PATHS:
            raise SystemExit(f"unknown path {p}; the paths: {', '.join(PATHS)}")
    report.text("The paths (each runs in fresh processes of its own; `jnp` is `jax.numpy`, `pj` is pldjax):")
    report.text("\n".join(["```python"] + [f"# {p}\n{PATHS[p][1].rstrip()}" for p in paths
                                          if p != "first_row"] + ["```"]))
    if "first_row" in paths:
        report.text(f"first_row: {', '.join(FIRST_ROW_PARTS)} in one process, in that order.")
    if "random_256" in paths or "random_10000" in paths:
        report.text(f"random_256, random_10000: {RANDOM_CONFIGS} or {ACCELERATOR_CONFIGS} seeded "
                    "configurations (`harness.sweep_configs`, "
                    f"seed {SEED}: sigma uniform in [0.5, 3], q log-uniform in [1e-3, 0.05], T log-uniform "
                    "integer in [1e2, 1e5]), delta 1e-5, in one call.")
    rows = report.table(["path", "import s", "first s", "programs compiled", "XLA compile s", "trace s",
                         "lower s", "cached: first s", "cached: compiled / loaded", "warm s",
                         "dp-accounting s", "goal", "met"])
    detail = []
    results, peers = {}, {}
    for path in paths:
        m = results[path] = _measure(path, args)
        peer = None
        if args.peers:
            peer = peers[path] = _first_row_peer(peers) if path == "first_row" else _peer(path, args)
        empty, filled = m["empty"], m["filled"]
        if "error" in empty:
            rows.append([path, empty["error"]] + [None] * 9 + [GOALS.get(path), None])
            report.flush()
            continue
        first = empty["values"][0]
        cached = filled.get("values", [{}])[0]
        warm = min(empty["wall_s"][1:]) if len(empty["wall_s"]) > 1 else None
        ratio = None
        if path == "random_256" and peer and peer.get("seconds"):
            ratio = (RANDOM_CONFIGS / empty["first_s"]) / (RANDOM_CONFIGS / peer["seconds"])
        if peer is None:
            peer_cell = "-" if args.peers and path != "first_row" else None
        elif peer["seconds"] is None:
            peer_cell = peer["res"].get("error", "?")
        else:
            scaled = (f" ({peer['timed']} of {peer['total']}, scaled)" if peer["timed"] != peer["total"]
                      else "")
            note = f" ({peer['note']})" if "note" in peer else ""
            peer_cell = f"{peer['seconds']:.2f}{scaled}{note}"
        rows.append([path, f"{empty['import_s']:.2f}", f"{empty['first_s']:.2f}", first["compiled"],
                     f"{first['seconds']['compile']:.2f}", f"{first['seconds']['trace']:.2f}",
                     f"{first['seconds']['lower']:.2f}",
                     harness.fmt(filled.get("first_s"), ".2f") if "error" not in filled else filled["error"],
                     f"{cached['compiled']} / {cached['loaded']}" if cached else None,
                     harness.fmt(warm, ".3f"), peer_cell, GOALS.get(path), _goal_met(path, m, ratio)])
        for label, res in (("empty", empty), ("filled", filled)):
            if "values" not in res:
                continue
            v = res["values"][0]
            rewarm = [w["compiled"] for w in res["values"][1:]]
            detail.append([path, label, f"{res['first_s']:.2f}", f"{res['cpu_s'][0]:.2f}", v["compiled"],
                           v["loaded"], v["traces"], v["lowerings"], f"{v['seconds']['compile']:.2f}",
                           f"{v['seconds']['load']:.2f}", f"{v['seconds']['trace']:.2f}",
                           f"{v['seconds']['lower']:.2f}",
                           "/".join(map(str, rewarm)) if rewarm else None, f"{res['peak_mb']:.0f}"])
        report.flush()
    import_programs = {p: r["empty"]["values"][0]["import"]["compiled"] for p, r in results.items()
                       if "values" in r["empty"]}
    report.text(
        "first s: the path's first call in a fresh process with pldjax's persistent compilation cache in a "
        "new, empty directory (compilation included; import s apart, jax and pldjax); programs compiled: XLA "
        "programs compiled in that call (JAX's backend-compile events without a persistent-cache hit); XLA "
        "compile s, trace s, lower s: the sums of JAX's compile, trace and lowering events in it; cached: "
        "the first call in another fresh process with that cache filled, programs compiled there / loaded "
        "from the cache; warm s: the fastest of the path run again in the first process "
        f"({args.repeats} repeats: a process runs accounting calls in NumPy on the host until it has "
        "done pldjax.core.compilation.HOST_WORK grid points of them, or a composition size its share, "
        "so that a path's first repeats may still be such calls, or compile, before the compiled "
        "kernels answer; the repeats of dpsgd_epsilon and calibrate are all host calls); met: the "
        "goal's criteria, the first call's time against the time goals (import apart). "
        + ("dp-accounting s: its PLD accountant (value discretization 1e-4) in a fresh process, import "
           "apart: "
           f"dpsgd_epsilon one configuration; sweep_1024 and random_256 a loop over {args.subset} of the "
           "configurations (evenly spaced sigmas; a seeded random subset), its time scaled to all; "
           "calibrate `dp_accounting.calibrate_dp_mechanism` with its PLD accountant (bisection, absolute "
           "tolerance 1e-3 on sigma, bracket LowerEndpointAndGuess(0.1, 1.0)); \"-\": no equivalent (the "
           "Quickstart's compositions, pldjax's filter; in first_row, the parts that have one are "
           "summed, each from its own process)."
           if args.peers else "dp-accounting not run."))
    if any(import_programs.values()):
        report.text("Programs compiled by the import and the setup, before the first call: "
                    + ", ".join(f"{p} {n}" for p, n in import_programs.items()) + ".")

    if "random_256" in results and peers.get("random_256") and "values" in results["random_256"]["empty"]:
        _throughput(report, results["random_256"], peers["random_256"])

    report.heading("Both processes, in detail")
    report.table(["path", "cache", "first s", "CPU s", "compiled", "loaded", "traces", "lowerings",
                  "XLA compile s", "cache load s", "trace s", "lower s", "compiled in warm calls", "peak MB"],
                 detail)
    report.text("cache: the persistent compilation cache empty (the first process) or filled (the second); "
                "CPU s: the process's CPU seconds in the first call (all threads); compiled: programs XLA "
                "compiled; loaded: programs read from the persistent cache (JAX still reports a "
                "backend-compile event for each, counted here instead); traces, lowerings: JAX's trace "
                "and lowering events (top-level jit traces; pldjax's exported kernels are traced and "
                "lowered for export, and their exported program traced and lowered again); cache load s: "
                "the backend-compile events of loaded programs; compiled in warm calls: programs compiled "
                "by each repeat (0: none).")
    report.flush()
    if args.names:
        _names(report, results)


def _throughput(report, m, peer) -> None:
    empty, filled = m["empty"], m["filled"]
    res = peer["res"]
    report.heading("random_256: configurations per second, first calls included")
    rows = report.table(["method", "configs", "timed s", "configs/s", "pldjax / dp-accounting"])
    peer_rate = peer["timed"] / res["first_s"] if "first_s" in res else None
    entries = [("pldjax, one call, fresh process, empty cache", RANDOM_CONFIGS, empty["first_s"]),
               ("pldjax, one call, fresh process, cache filled", RANDOM_CONFIGS, filled.get("first_s")),
               ("pldjax, one call, warm (fastest)", RANDOM_CONFIGS,
                min(empty["wall_s"][1:]) if len(empty["wall_s"]) > 1 else None)]
    for label, count, seconds in entries:
        rate = None if seconds is None else count / seconds
        rows.append([label, count, harness.fmt(seconds, ".2f"), harness.fmt(rate, ".1f"),
                     harness.fmt(None if rate is None or not peer_rate else rate / peer_rate, ".1f")])
    rows.append(["dp-accounting PLD 1e-4, loop over a seeded random subset, fresh process", peer["timed"],
                 harness.fmt(res.get("first_s"), ".2f"), harness.fmt(peer_rate, ".2f"), "1.0"])
    report.text("Times are of the call alone (import apart). dp-accounting's configurations/s is measured on "
                f"the subset of {peer['timed']} (its loop costs each configuration separately) and stands "
                f"for all {RANDOM_CONFIGS}; the subset need not cost what the whole set costs on average.")


def _names(report, results) -> None:
    report.heading("Compiled programs by name (empty cache, first call)")
    report.text("Most compiled first. `jit(NAME)`: a jitted function (one of pldjax's kernels, "
                "exported or not, a jax.numpy function) or a lax operation run eagerly, outside any "
                "jit (add, log, ...), compiled on its own for its shapes; `jit(option_probe)`: "
                "pldjax's check that XLA knows its compiler options (FAST_COMPILE on a CPU, "
                "GPU_FAST_COMPILE on a GPU). XLA compile s: the backend-compile events' sum for "
                "that name.")
    for path, m in results.items():
        if "values" not in m["empty"]:
            continue
        names = m["empty"]["values"][0]["names"]
        report.text(f"{path}: {sum(count for count, _ in names.values())} programs, {len(names)} names.")
        report.table(["program", "compiled", "XLA compile s"],
                     [[name, count, f"{seconds:.2f}"] for name, (count, seconds) in names.items()])
