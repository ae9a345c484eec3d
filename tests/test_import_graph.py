"""The dependency direction, read from the AST of every module (every import, at any depth).

    telemetry.contract  (records + engine hooks: stdlib only; everything may import it)
    telemetry           (recorder, store, sidecar, metrics, tracing: never the engine)
    engine              (the core imports nothing above telemetry.contract; server, fleet,
                         loadgen and benchmarks wire the core with telemetry)
    evals -> diagnostics -> dashboards (dashboards.console: the infersight CLI, the demo)

Each package may import only packages before it in LAYERS.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("telemetry", "engine", "evals", "diagnostics", "dashboards")
# engine modules that assemble running processes (they may use telemetry's stack); the rest is the core
ENGINE_ASSEMBLY = ("engine.serving.server", "engine.serving.fleet", "engine.traffic.loadgen", "engine.benchmarks", "engine.core.cli_generate",
                   # the recording proxy: forwards to any OpenAI server and records through telemetry's Recorder
                   "engine.serving.proxy",
                   # the prober: sends the probe suite with the loadgen's client, pins rounds into the store
                   "engine.traffic.probe",
                   # the vLLM stat-logger plugin: the engine's hashing and placement with telemetry's Recorder
                   "engine.serving.vllm_adapter")
CONTRACT = "telemetry.contract"


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


GRAPH = {module_name(p): imports_of(p) for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}


def test_packages_import_only_the_layers_below_them():
    upward = []
    for module, imported in GRAPH.items():
        own = LAYERS.index(module.split(".")[0])
        for name in imported:
            top = name.split(".")[0]
            if top in LAYERS and LAYERS.index(top) > own:
                upward.append(f"{module} imports {name}")
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(upward))


def test_engine_core_imports_only_the_contract():
    leaks = []
    for module, imported in GRAPH.items():
        if not within(module, "engine") or any(within(module, a) for a in ENGINE_ASSEMBLY):
            continue
        for name in imported:
            if any(within(name, a) for a in ENGINE_ASSEMBLY):
                leaks.append(f"{module} imports {name} (engine assembly)")
            elif within(name, "telemetry") and not within(name, CONTRACT) and name != "telemetry":
                leaks.append(f"{module} imports {name} (telemetry's stack)")
    assert not leaks, "\n".join(sorted(leaks))


def test_contract_is_stdlib_only():
    outside = []
    for module, imported in GRAPH.items():
        if not within(module, CONTRACT):
            continue
        for name in imported:
            top = name.split(".")[0]
            if top == "telemetry":
                if not within(name, CONTRACT) and name != "telemetry":
                    outside.append(f"{module} imports {name}")
            elif top not in sys.stdlib_module_names and top != "__future__":
                outside.append(f"{module} imports {name}")
    assert not outside, "\n".join(sorted(outside))


def test_no_dynamic_imports_hide_dependencies():
    hidden = [m for p in ((ROOT / layer).rglob("*.py") for layer in LAYERS) for f in p
              if "import_module(" in f.read_text() or "__import__(" in f.read_text()
              for m in [module_name(f)]]
    assert not hidden, hidden


@pytest.mark.parametrize("layer", LAYERS)
def test_every_layer_is_seen(layer):
    # guards the walk itself: an empty graph would pass every test above
    assert any(within(m, layer) for m in GRAPH)
