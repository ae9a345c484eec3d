"""How many lines a reader follows through one engine step: the functions `LLMEngine.step` runs, traced.

    python -m engine.benchmarks.step_lines [--list]

Runs the reference model on the default path (a greedy and a sampled request, streamed, one with a stop
string, an observer listening unless `--no-observer`) and on the speculative path (n-gram drafts), and records every function
called inside `LLMEngine.step` from the step's own modules: the engine loop, scheduler, model runner,
sampler, KV cache, speculative decoding and the small modules they share (sequence, outputs, multi-step,
the step's result and timer). The models, attention backends, tokenizer, detokenizer and telemetry records
are not the step's bookkeeping and are left out. A function counts once, with its lines from `def` to its
end less blank lines, comment-only lines and its docstring. `--list` prints each function.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

_ENGINE = Path(__file__).resolve().parents[1]
ENGINE_DIR = _ENGINE / "core" if (_ENGINE / "core").is_dir() else _ENGINE  # trees before engine/core/ count too
# the step's modules, relative to the engine's core (a file missing from a tree is simply not met)
STEP_MODULES = ("engine.py", "scheduler.py", "model_runner.py", "sampler.py", "kv_cache.py", "multi_step.py",
                "sequence.py", "outputs.py", "step_result.py", "phase_timer.py", "spec_decode/")


def _counted(path: str) -> str | None:
    """`path`'s name relative to the core when it is one of the step's modules."""
    try:
        rel = Path(path).resolve().relative_to(ENGINE_DIR).as_posix()
    except ValueError:
        return None
    return rel if any(rel == m or (m.endswith("/") and rel.startswith(m)) for m in STEP_MODULES) else None


def _code_lines(source: list[str], node: ast.AST) -> int:
    """Lines of a function less blank lines, comment-only lines and its docstring."""
    skip = set()
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        skip.update(range(body[0].lineno, body[0].end_lineno + 1))
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return sum(1 for n in range(first, node.end_lineno + 1)
               if n not in skip and source[n - 1].strip() and not source[n - 1].strip().startswith("#"))


def _functions(path: str) -> dict[int, tuple[str, int]]:
    """Each function of a file by the line its code object starts on (its first decorator): (name, lines)."""
    source = Path(path).read_text().splitlines()
    out = {}
    for node in ast.walk(ast.parse("\n".join(source))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[first] = (node.name, _code_lines(source, node))
    return out


def trace_steps(engine, seen: set) -> None:
    """Step `engine` until it is done, adding (file, first line) of every step-module function called."""
    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if not code.co_name.startswith("<") and _counted(code.co_filename):
                seen.add((code.co_filename, code.co_firstlineno))

    while engine.has_unfinished():
        sys.setprofile(profile)
        try:
            engine.step()
        finally:
            sys.setprofile(None)


def run(paths: dict[str, set], listening: bool = True) -> None:
    from engine.core.engine import LLMEngine
    from engine.core.model_refs import REFERENCE_MODEL
    from engine.core.sampling_params import SamplingParams
    from telemetry.contract.hooks import EngineObserver

    class Listening(EngineObserver):
        enabled = True

    requests = [("greedy", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)),
                ("sampled", SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, stop=["\n\n"], ignore_eos=True))]
    prompt = "the cat sat on the mat and the cat sat on the"
    for path, options in (("default", {}), ("speculative", {"speculative_mode": "ngram"})):
        engine = LLMEngine(str(REFERENCE_MODEL), observer=Listening() if listening else None, **options)
        for request_id, params in requests:
            engine.add_request(request_id, prompt, params)
        trace_steps(engine, paths[path])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print every function followed")
    ap.add_argument("--no-observer", action="store_true", help="nobody listens (LLM's default): no records built")
    args = ap.parse_args(argv)
    paths: dict[str, set] = defaultdict(set)
    run(paths, listening=not args.no_observer)
    everything = set().union(*paths.values())
    by_file: dict[str, int] = defaultdict(int)
    rows = []
    for filename, first in sorted(everything):
        name, lines = _functions(filename).get(first, ("?", 0))
        rel = _counted(filename)
        by_file[rel] += lines
        rows.append((rel, first, name, lines, [p for p in paths if (filename, first) in paths[p]]))
    if args.list:
        for rel, first, name, lines, where in rows:
            print(f"{lines:4d}  {rel}:{first} {name}  ({', '.join(where)})")
    for rel, lines in sorted(by_file.items(), key=lambda kv: -kv[1]):
        print(f"{lines:5d}  {rel}")
    for path, fns in paths.items():
        print(f"{sum(_functions(f).get(n, ('', 0))[1] for f, n in fns):5d}  lines on the {path} path alone")
    print(f"{sum(by_file.values()):5d}  lines followed from LLMEngine.step ({len(rows)} functions; "
          "default + speculative paths)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
