"""The dependency direction, read from the AST of every module (every import, at any depth).

LAYERS is the README's table "Which way the imports go": each layer names the layers it may import
(a name covers its sub-layers: "telemetry" includes "telemetry.contract"); a module belongs to the
longest layer name it starts with, and may always import its own layer. Every module is in a layer.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "telemetry.contract": (),  # the records, the engine's hooks, derived quantities: stdlib only
    "telemetry": ("telemetry.contract",),
    "engine.util": (),  # small helpers (a free port, durations): stdlib only
    "engine.core": ("engine.util", "telemetry.contract"),
    "engine.serving": ("engine.core", "engine.util", "telemetry"),
    "engine.traffic": ("engine.serving", "engine.core", "engine.util", "telemetry"),
    "engine.benchmarks": ("engine.traffic", "engine.serving", "engine.core", "engine.util", "telemetry"),
    "evals": ("engine", "telemetry"),
    "diagnostics": ("evals", "engine", "telemetry"),
    "dashboards": ("diagnostics", "evals", "engine", "telemetry"),
}
PACKAGES = sorted({layer.split(".")[0] for layer in LAYERS})
STDLIB_ONLY = [layer for layer, allowed in LAYERS.items() if not allowed]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every absolute module name `path` imports, at top level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import module`
    return names


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name: str) -> str | None:
    matches = [layer for layer in LAYERS if within(name, layer)]
    return max(matches, key=len) if matches else None


GRAPH = {module_name(p): imports_of(p) for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def test_every_module_is_in_a_layer():
    # engine/__init__.py holds nothing but a docstring: importing it imports no layer
    outside = [m for m in GRAPH if layer_of(m) is None and m not in PACKAGES]
    assert not outside, f"modules in no layer of LAYERS: {sorted(outside)}"
    assert not [m for m in PACKAGES if layer_of(m) is None and GRAPH.get(m)], "engine/__init__.py imports something"


def test_layers_import_only_what_their_row_allows():
    against = []
    for module, imported in GRAPH.items():
        own = layer_of(module)
        if own is None:
            continue
        for name in imported:
            if name.split(".")[0] not in PACKAGES or name in PACKAGES:
                continue
            target = layer_of(name)
            if target != own and not any(within(target or name, allowed) for allowed in LAYERS[own]):
                against.append(f"{module} ({own}) imports {name} ({target})")
    assert not against, "imports against the layer table:\n" + "\n".join(sorted(against))


@pytest.mark.parametrize("layer", STDLIB_ONLY)
def test_stdlib_only_layers_import_only_the_standard_library(layer):
    outside = [f"{m} imports {n}" for m, imported in GRAPH.items() if layer_of(m) == layer for n in imported
               if n.split(".")[0] not in sys.stdlib_module_names and n.split(".")[0] != "__future__"
               and layer_of(n) != layer]
    assert not outside, "\n".join(sorted(outside))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _edges(group) -> dict[str, set[str]]:
    """module -> the project's modules it imports, each name mapped through `group`."""
    modules = set(GRAPH)
    edges: dict[str, set[str]] = {}
    for module in modules:
        for name in GRAPH[module]:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            a, b = group(module), group(name) if name else None
            if b and a != b and not within(a, b) and not within(b, a):  # a package's own __init__ is its inside
                edges.setdefault(a, set()).add(b)
    return edges


def test_no_modules_import_each_other():
    found = _cycles(_edges(lambda m: m))
    assert not found, found


def test_no_packages_import_each_other():
    # engine.serving.fleet and engine.serving.server: a package is a module's folder
    folders = {module_name(p.parent / "__init__.py") for package in PACKAGES for p in (ROOT / package).rglob("__init__.py")}

    def package(m):
        return m if m in folders else m.rpartition(".")[0]

    found = _cycles(_edges(package))
    assert not found, found


def test_no_dynamic_imports_hide_dependencies():
    hidden = [m for p in ((ROOT / package).rglob("*.py") for package in PACKAGES) for f in p
              if "import_module(" in f.read_text() or "__import__(" in f.read_text()
              for m in [module_name(f)]]
    assert not hidden, hidden


@pytest.mark.parametrize("layer", list(LAYERS))
def test_every_layer_is_seen(layer):
    # guards the walk itself: an empty layer would pass every test above
    assert any(layer_of(m) == layer for m in GRAPH)
