"""The package's layers, read from its source: each layer imports only from the layers below it,
no private name crosses modules, and no module is named like a standard-library module or a
package that pldjax wraps. The tests, read the same way, reach no private name of pldjax."""

import ast
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "pldjax"

#: Bottom to top. Modules directly in pldjax/ (the package's front, the CLI, plotting) are the top.
LAYERS = ("core", "kernels", "mechanisms", "accounting", "adaptive", "integrations")
TOP = len(LAYERS)

#: The PLD type's methods (``pld.epsilon(delta)``, ``pld.self_compose(n)``, ...) are conveniences
#: that call the kernels when they run; only these imports inside functions may reach upward.
UPWARD_AT_CALL_TIME = {("pldjax.core.pld", "kernels")}

WRAPPED = {"jax", "jaxlib", "numpy", "scipy", "optax", "chex", "dp_accounting", "opacus", "torch",
           "jax_privacy", "prv_accountant", "matplotlib"}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


MODULES = dict(_modules())


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return TOP


def _imports(path: Path):
    """(imported module, names taken from it, whether at module level) for each pldjax import."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pldjax":
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                module = target if target in MODULES else node.module
                yield module, alias.name, alias.asname, id(node) in top_level
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pldjax":
                    yield alias.name, None, alias.asname, id(node) in top_level


def test_every_module_is_in_a_layer_folder_or_at_the_front():
    for module in MODULES:
        parts = module.split(".")
        assert len(parts) <= 2 or parts[1] in LAYERS, module


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_layer_imports_only_from_the_layers_below(module):
    here = _layer(module)
    for target, _, _, at_module_level in _imports(MODULES[module]):
        there = _layer(target)
        allowed = (module, LAYERS[there] if there < TOP else "") in UPWARD_AT_CALL_TIME
        if there > here and not (allowed and not at_module_level):
            pytest.fail(f"{module} (layer {LAYERS[here] if here < TOP else 'front'}) imports "
                        f"{target} from a layer above it")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_crosses_modules(module):
    tree = ast.parse(MODULES[module].read_text())
    module_aliases = set()
    for target, name, asname, _ in _imports(MODULES[module]):
        if name is not None and name.startswith("_"):
            pytest.fail(f"{module} imports the private name {name} from {target}")
        if target in MODULES and target != module and (name is None or target.endswith(name)):
            module_aliases.add(asname or (name or target.split(".")[0]))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            pytest.fail(f"{module} reads the private name {node.value.id}.{node.attr}")


def test_no_module_is_named_like_the_standard_library_or_a_wrapped_package():
    for module in MODULES:
        name = module.split(".")[-1]
        assert name not in sys.stdlib_module_names, module
        assert name not in WRAPPED, module


#: Optional packages of the integrations, which a name may need where it is not installed.
OPTIONAL = {"opacus", "torch"}


def test_every_public_name_resolves():
    import pldjax as pj

    for name in pj.__all__:
        try:  # some are imported on first use
            value = getattr(pj, name)
        except ModuleNotFoundError as missing:
            assert missing.name.split(".")[0] in OPTIONAL, name
        else:
            assert value is not None, name


#: Names with a leading underscore that are public API elsewhere: a NamedTuple's (a state's
#: ``_replace``).
NAMED_TUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in NAMED_TUPLE_API


def _is_pldjax(name) -> bool:
    return isinstance(name, str) and name.split(".")[0] == "pldjax"


def _private_reaches(path: Path) -> list[str]:
    """Where a test file reaches a private name of pldjax ("line: what"): a private name imported
    from pldjax, or an attribute with a private name (read, or by getattr / hasattr with the
    name written out) of anything that comes from pldjax: a module (imported, or by
    importlib.import_module), a name imported from one, and what is derived from those (their
    attributes, items, calls' results, names assigned or looped over, functions they decorate
    or that return them)."""
    tree = ast.parse(path.read_text())
    reached, from_pldjax = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _is_pldjax(node.module):
            for alias in node.names:
                if _private(alias.name):
                    reached.append(f"{node.lineno}: from {node.module} import {alias.name}")
                from_pldjax.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_pldjax(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        reached.append(f"{node.lineno}: import {alias.name}")
                    from_pldjax.add(alias.asname or "pldjax")

    def derived(node) -> bool:
        if isinstance(node, ast.Tuple | ast.List):
            return any(derived(element) for element in node.elts)
        while isinstance(node, ast.Attribute | ast.Subscript | ast.Call | ast.Starred):
            if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                    and _is_pldjax(node.args[0].value)):  # importlib.import_module("pldjax...")
                return True
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id in from_pldjax

    def bound(node):  # (target, value) pairs that bind names
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            for target in getattr(node, "targets", [getattr(node, "target", None)]):
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    yield from zip(target.elts, node.value.elts, strict=False)
                else:
                    yield target, node.value
        elif isinstance(node, ast.For | ast.comprehension):
            values = node.iter.elts if isinstance(node.iter, ast.Tuple | ast.List) else [node.iter]
            yield from ((node.target, value) for value in values)
        elif isinstance(node, ast.FunctionDef):  # decorated by it, or returning it
            yield from ((ast.Name(node.name), decorator) for decorator in node.decorator_list)
            yield from ((ast.Name(node.name), inner.value) for inner in ast.walk(node)
                        if isinstance(inner, ast.Return) and inner.value is not None)

    grown = True
    while grown:  # until no assignment binds another name
        grown = False
        for node in ast.walk(tree):
            for target, value in bound(node):
                if isinstance(target, ast.Name) and target.id not in from_pldjax and derived(value):
                    from_pldjax.add(target.id)
                    grown = True
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and derived(node.value):
            reached.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and derived(node.args[0])):
            reached.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(reached, key=lambda where: int(where.split(":")[0]))


@pytest.mark.parametrize("path", sorted(TESTS.rglob("*.py")), ids=lambda p: str(p.relative_to(TESTS)))
def test_tests_reach_no_private_name_of_pldjax(path):
    """Tests exercise pldjax's public behaviour: a private name they reach (a function, a
    constant, a kernel's internals) ties them to code that may change without notice."""
    reached = _private_reaches(path)
    assert not reached, f"{path.relative_to(TESTS.parent)} reaches private names of pldjax:\n" + \
        "\n".join(reached)


def test_private_reaches_are_found_through_imports_aliases_and_derived_names(tmp_path):
    source = tmp_path / "test_example.py"
    source.write_text(
        "import importlib\n"
        "import pldjax as pj\n"
        "from pldjax.kernels import compose, hockey_stick as profile\n"
        "from pldjax.core.special import _helper\n"
        "module = importlib.import_module('pldjax.kernels.compose')\n"
        "kernel = profile.tail_sums\n"
        "state = pj.accountant.init()\n"
        "def kernels():\n"
        "    return (compose.compose, kernel)\n"
        "for each in kernels():\n"
        "    each._cache_size()\n"
        "module._coarse, kernel._jitted, pj.dp_accounting._event_pld, getattr(profile, '_BLOCK')\n"
        "state._replace(count=1), len(profile.__name__), other._private\n")
    assert sorted(_private_reaches(source)) == [
        "11: each._cache_size", "12: getattr(profile, '_BLOCK')", "12: kernel._jitted",
        "12: module._coarse", "12: pj.dp_accounting._event_pld",
        "4: from pldjax.core.special import _helper"]
