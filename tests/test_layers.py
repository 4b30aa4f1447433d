"""The package's layers, read from its source: each layer imports only from the layers below it,
no private name crosses modules, and no module is named like a standard-library module or a
package that pldjax wraps."""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pldjax"

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
