"""Eval suites: JSONL files, one item per line (format in evals/SUITES.md).

    {"id": "add-1", "messages": [{"role": "user", "content": "What is 2 + 3?"}],
     "reference": "5", "scorer": "exact", "task": "addition"}

A suite is validated as a whole when loaded; every problem is reported with the
file and line it is on, so a user can fix their file without guessing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from evals.scorers import SCORERS, check_reference

ROLES = ("system", "user", "assistant")
FIELDS = {"id", "prompt", "messages", "reference", "scorer", "task", "max_tokens"}


class SuiteError(ValueError):
    """A suite file that cannot be used; the message names the file and line(s)."""


@dataclass
class SuiteItem:
    id: str
    reference: str
    scorer: str = "exact"
    prompt: str | None = None  # raw text completion (no chat template)
    messages: list[dict] | None = None  # chat: the model's chat template is applied
    task: str = ""
    max_tokens: int | None = None  # per-item generation limit (the run's default otherwise)

    def to_json(self) -> dict:
        d = {"id": self.id}
        d.update({"prompt": self.prompt} if self.prompt is not None else {"messages": self.messages})
        d.update(reference=self.reference, scorer=self.scorer)
        if self.task:
            d["task"] = self.task
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        return d


@dataclass
class Suite:
    name: str
    path: str
    items: list[SuiteItem] = field(default_factory=list)

    def tasks(self) -> list[str]:
        return sorted({i.task for i in self.items})

    def subset(self, max_items: int | None = None, per_task: int | None = None) -> "Suite":
        """The first `per_task` items of every task, then the first `max_items` of those."""
        items = self.items
        if per_task is not None:
            seen: dict[str, int] = {}
            kept = []
            for item in items:
                if seen.get(item.task, 0) < per_task:
                    seen[item.task] = seen.get(item.task, 0) + 1
                    kept.append(item)
            items = kept
        if max_items is not None:
            items = items[:max_items]
        return Suite(self.name, self.path, list(items))


def _item_problems(obj) -> list[str]:
    """What is wrong with one parsed line (empty when it is a valid item)."""
    if not isinstance(obj, dict):
        return [f"expected a JSON object, got {type(obj).__name__}"]
    problems = []
    unknown = sorted(set(obj) - FIELDS)
    if unknown:
        problems.append(f"unknown field(s) {unknown}; allowed: {sorted(FIELDS)}")
    if not isinstance(obj.get("id"), str) or not obj.get("id"):
        problems.append("'id' must be a non-empty string")
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        problems.append("give exactly one of 'prompt' (text) or 'messages' (chat)")
    elif has_prompt and not isinstance(obj["prompt"], str):
        problems.append("'prompt' must be a string")
    elif has_messages:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            problems.append("'messages' must be a non-empty list of {role, content}")
        else:
            for i, m in enumerate(msgs):
                if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                    problems.append(f"messages[{i}] must be {{\"role\": one of {list(ROLES)}, \"content\": string}}")
    ref = obj.get("reference")
    if isinstance(ref, bool) or not isinstance(ref, (str, int, float)):
        problems.append("'reference' must be a string (or a number)")
    scorer = obj.get("scorer", "exact")
    if scorer not in SCORERS:
        problems.append(f"unknown scorer {scorer!r}; choose from {', '.join(SCORERS)}")
    elif isinstance(ref, (str, int, float)) and not isinstance(ref, bool):
        try:
            check_reference(scorer, str(ref))
        except ValueError as e:
            problems.append(str(e))
    if "task" in obj and not isinstance(obj["task"], str):
        problems.append("'task' must be a string")
    mt = obj.get("max_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        problems.append("'max_tokens' must be a positive integer")
    return problems


def parse_suite(text: str, path: str = "<string>", name: str | None = None) -> Suite:
    errors: list[str] = []
    items: list[SuiteItem] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        problems = _item_problems(obj)
        if problems:
            errors.extend(f"{path}:{lineno}: {p}" for p in problems)
            continue
        if obj["id"] in first_line:
            errors.append(f"{path}:{lineno}: duplicate id {obj['id']!r} (first on line {first_line[obj['id']]})")
            continue
        first_line[obj["id"]] = lineno
        items.append(SuiteItem(id=obj["id"], reference=str(obj["reference"]), scorer=obj.get("scorer", "exact"),
                               prompt=obj.get("prompt"), messages=obj.get("messages"), task=obj.get("task", ""),
                               max_tokens=obj.get("max_tokens")))
    if errors:
        shown = errors[:20] + ([f"... and {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise SuiteError(f"invalid suite {path} ({len(errors)} problem(s)):\n  " + "\n  ".join(shown))
    if not items:
        raise SuiteError(f"{path}: the suite has no items")
    return Suite(name or Path(path).stem, str(path), items)


def load_suite(path: str | Path) -> Suite:
    path = Path(path)
    if not path.is_file():
        raise SuiteError(f"suite file not found: {path}")
    return parse_suite(path.read_text(encoding="utf-8"), str(path))


def write_suite(path: str | Path, items: list[SuiteItem]) -> None:
    Path(path).write_text("".join(json.dumps(i.to_json(), ensure_ascii=False) + "\n" for i in items), encoding="utf-8")
