"""Every diagnostic has one shape: `run(store, request)`, registered under the name its module declares."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from diagnostics import DIAGNOSTICS

ROOT = Path(__file__).resolve().parents[2] / "diagnostics"


def test_every_run_in_diagnostics_takes_the_store_and_a_request():
    # the package's own `run(names, ...)` and the CLI entry points (`run(args)`) are not diagnostics
    odd = []
    for path in sorted(ROOT.glob("*.py")):
        if path.name == "__init__.py" or path.stem.endswith("cli"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "run":
                params = [a.arg for a in node.args.args[:2]]
                if params != ["store", "request"]:
                    odd.append(f"{path.name}: run({', '.join(params)}, ...)")
    assert not odd, odd


def test_each_registered_diagnostic_is_its_modules_declared_name():
    for name, module in DIAGNOSTICS.items():
        assert module.DIAGNOSTIC == name
        assert list(inspect.signature(module.run).parameters)[:2] == ["store", "request"]
