"""An eval run's results: one EvalRunRecord plus its EvalItemRecords.

Kept as the telemetry contract's records, so the same object goes to the store
(`eval_runs` / `eval_items`) and to a JSON file (`--out run.json`, handy in CI
artifacts and when no store is around), and comes back from either.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from telemetry.contract.records import EvalItemRecord, EvalRunRecord


@dataclass
class EvalRun:
    run: EvalRunRecord
    items: list[EvalItemRecord] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def scores(self) -> dict[str, float]:
        return {i.item_id: i.score for i in self.items}

    def accuracy(self) -> float:
        return sum(i.score for i in self.items) / len(self.items) if self.items else float("nan")

    def by_task(self) -> dict[str, list[EvalItemRecord]]:
        out: dict[str, list[EvalItemRecord]] = {}
        for item in self.items:
            out.setdefault(item.task, []).append(item)
        return dict(sorted(out.items()))

    def config(self) -> dict:
        return json.loads(self.run.config_json or "{}")

    # --- JSON files ------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"run": dataclasses.asdict(self.run), "items": [dataclasses.asdict(i) for i in self.items]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict()) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "EvalRun":
        return cls(EvalRunRecord(**d["run"]), [EvalItemRecord(**i) for i in d["items"]])

    @classmethod
    def load(cls, path: str | Path) -> "EvalRun":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"eval run file not found: {path}")
        try:
            return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not an eval run file ({type(e).__name__}: {e})") from None

    # --- the store -------------------------------------------------------------

    def write_to_store(self, store) -> None:
        # items first: a run row in eval_runs means its items are all there
        store.insert_records("eval_items", self.items, dedup_token=f"eval_items-{self.run_id}")
        store.insert_records("eval_runs", [self.run], dedup_token=f"eval_runs-{self.run_id}")

    @classmethod
    def from_store(cls, store, run_id: str) -> "EvalRun":
        runs = store.query_df("SELECT * FROM eval_runs WHERE run_id = {run_id:String} LIMIT 1", {"run_id": run_id})
        if runs.empty:
            raise ValueError(f"no eval run {run_id!r} in the store")
        items = store.query_df("SELECT * FROM eval_items WHERE run_id = {run_id:String} ORDER BY item_id",
                               {"run_id": run_id})
        return cls(_record(EvalRunRecord, runs.iloc[0].to_dict()),
                   [_record(EvalItemRecord, row) for row in items.to_dict("records")])


def _record(cls, row: dict):
    """A record from a store row: times back to epoch seconds, arrays back to lists."""
    import pandas as pd

    values = {}
    for f in dataclasses.fields(cls):
        v = row[f.name]
        if isinstance(v, pd.Timestamp):  # the store's times are UTC, with or without a zone attached
            v = (v if v.tzinfo is not None else v.tz_localize("UTC")).timestamp()
        elif hasattr(v, "tolist"):
            v = v.tolist()
        if isinstance(v, tuple):
            v = list(v)
        values[f.name] = v
    return cls(**values)
