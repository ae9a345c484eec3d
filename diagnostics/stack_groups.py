"""Where a sampled stack spends its time: scheduler, input_preparation, forward, sampling, telemetry,
server or other, decided by the engine modules and functions in the stack.

Frames are read from the root towards the leaf and the first frame that belongs to an engine
phase decides: a sample taken in an attention kernel's metadata code called from
`ModelRunner.prepare` is input preparation, not forward. Stacks that never enter an engine phase
are the engine loop's own bookkeeping (other) when they pass through the engine, else serving
work (HTTP, asyncio, tokenization, detokenization) when they pass through the server, else other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GROUPS = ("scheduler", "input_preparation", "forward", "sampling", "telemetry", "server", "other")

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int | None = None

    @property
    def path(self) -> str:
        return "/" + self.file.replace("\\", "/").lstrip("/")

    def label(self) -> str:
        return f"{self.function} ({self.file}{f':{self.line}' if self.line else ''})"


def parse_frame(text: str) -> Frame:
    m = _FRAME.match(text.strip())
    if not m:
        return Frame(text.strip(), "")
    return Frame(m["func"], m["file"], int(m["line"]) if m["line"] else None)


def parse_stack(stack: str) -> list[Frame]:
    """A folded stack "root;...;leaf" as frames, root first."""
    return [parse_frame(part) for part in stack.split(";") if part.strip()]


# (group, path fragments, function names or substrings (None: any)), tried in order on each frame
_PHASES: list[tuple[str, tuple[str, ...], tuple[str, ...] | None]] = [
    ("telemetry", ("/telemetry/", "/opentelemetry/", "/prometheus_client/", "/clickhouse_connect/",
                   "/engine/core/engine_records.py"), None),
    ("telemetry", ("/engine/core/engine.py",), ("_notify", "_report_step", "_report_finished")),
    ("scheduler", ("/engine/core/scheduler.py", "/engine/core/kv_cache.py"), None),
    ("input_preparation", ("/engine/core/model_runner.py",), ("prepare",)),
    ("input_preparation", ("/engine/core/spec_decode/ngram.py",), None),
    ("forward", ("/engine/core/model_runner.py",), ("forward",)),
    ("forward", ("/engine/core/models/", "/engine/core/attention/", "/engine/core/quantization/", "/engine/core/spec_decode/draft.py",
                 "/torch/nn/"), None),
    ("sampling", ("/engine/core/sampler.py", "/engine/core/spec_decode/rejection.py"), None),
    ("sampling", ("/engine/core/spec_decode/speculator.py",), ("sample",)),
]
_ENGINE = ("/engine/core/engine.py", "/engine/core/model_runner.py", "/engine/core/sequence.py", "/engine/core/llm.py")
_SERVER = ("/engine/serving/server/", "/engine/core/async_engine.py", "/engine/core/tokenization.py", "/engine/core/detokenizer.py",
           "/uvicorn/", "/starlette/", "/fastapi/", "/anyio/", "/h11/", "/httptools/", "/asyncio/", "/tokenizers/",
           "/transformers/")


def _matches(frame: Frame, paths: tuple[str, ...], functions: tuple[str, ...] | None) -> bool:
    if not any(p in frame.path for p in paths):
        return False
    return functions is None or any(f in frame.function for f in functions)


def classify(frames: list[Frame]) -> str:
    for frame in frames:  # root first
        for group, paths, functions in _PHASES:
            if _matches(frame, paths, functions):
                return group
    if any(any(p in f.path for p in _ENGINE) for f in frames):
        return "other"
    if any(any(p in f.path for p in _SERVER) for f in frames):
        return "server"
    return "other"


def classify_stack(stack: str) -> str:
    return classify(parse_stack(stack))


# leaves where a thread waits without working: with --nonblocking py-spy cannot see that a thread is
# blocked in a syscall, so these samples would otherwise count as time spent
_WAITS = {("selectors.py", "select"), ("threading.py", "wait"), ("threading.py", "join"),
          ("threading.py", "_wait_for_tstate_lock"), ("queue.py", "get")}


def is_idle(frames: list[Frame]) -> bool:
    if not frames:
        return False
    leaf = frames[-1]
    name = leaf.function.rsplit(".", 1)[-1]
    return any(leaf.path.endswith("/" + f) and name == fn for f, fn in _WAITS)
