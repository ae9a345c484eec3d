"""What a diagnostic looks at: a time window, replicas, versions, config hashes, models.

A Scope becomes SQL filters with bound parameters (`{name:Type}`, never spliced). Versions and
config hashes belong to a replica *start*, so requests and steps are matched to the start of
their replica that was running at the time (ASOF JOIN on the replica's start_time): a replica
upgraded in place shows up under each version for the time it ran it.

Side specs (`--baseline` / `--candidate`): `version=0.1.0`, `replica=r1,r2`, `config_hash=ab12`,
`model=tiny`, `window=START..END`; several may be combined with spaces or '&'. Times are epoch
seconds, ISO 8601 (UTC unless a zone is given), `now`, or relative to now (`90s`, `30m`, `2h`, `7d`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass

from telemetry.contract.derived import latest_starts_sql, replica_filter_sql, selected_sql, window_sql
from telemetry.contract.times import parse_time

FAR_FUTURE = 7.0e9  # inside DateTime64(6)'s range (year 2191)
_SIDE_KEYS = {"version": "versions", "versions": "versions", "replica": "replicas", "replicas": "replicas",
              "config_hash": "config_hashes", "config_hashes": "config_hashes", "config": "config_hashes",
              "model": "models", "models": "models"}


def _items(values) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, str):
        values = values.split(",")
    return tuple(sorted({str(v).strip() for v in values if str(v).strip()}))


@dataclass(frozen=True)
class Scope:
    start: float | None = None  # epoch seconds; None: from the beginning
    end: float | None = None  # None: up to now
    replicas: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    config_hashes: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    window_spec: str = ""  # the window as the user gave it ("24h", "2h..1h"): a stable part of the key
    name: str = ""  # for people: "version=0.1.0"

    def __post_init__(self):
        for f in ("replicas", "versions", "config_hashes", "models"):
            object.__setattr__(self, f, _items(getattr(self, f)))
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise ValueError(f"empty window: start {self.start} is not before end {self.end}")

    @classmethod
    def window(cls, since=None, until=None, now: float | None = None, **filters) -> Scope:
        """A scope from user-given times (relative ones are resolved against `now`)."""
        now = time.time() if now is None else now
        spec = f"{since or ''}..{until or ''}" if (since or until) else ""
        return cls(start=parse_time(since, now), end=parse_time(until, now), window_spec=spec, **filters)

    def narrowed(self, **changes) -> Scope:
        return dataclasses.replace(self, **changes)

    def with_side(self, spec: str, now: float | None = None) -> Scope:
        """This scope narrowed by a side spec such as `version=0.2.0` or `window=2h..1h`."""
        changes: dict = {}
        parts = [p for p in re.split(r"[\s&]+", spec.strip()) if p]
        if not parts:
            raise ValueError("empty side spec (examples: version=0.1.0, replica=r1, config_hash=ab12, window=2h..1h)")
        for part in parts:
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep or not value:
                raise ValueError(f"side spec {part!r}: expected key=value")
            if key == "window":
                since, dots, until = value.partition("..")
                if not dots:
                    raise ValueError(f"window {value!r}: expected START..END (either may be empty)")
                now_ = time.time() if now is None else now
                changes.update(start=parse_time(since, now_) if since else self.start,
                               end=parse_time(until, now_) if until else self.end, window_spec=value)
            elif key in _SIDE_KEYS:
                changes[_SIDE_KEYS[key]] = _items(value)
            else:
                raise ValueError(f"side spec {part!r}: unknown key {key!r}; use version, replica, config_hash, "
                                 f"model or window")
        return dataclasses.replace(self, name=spec.strip(), **changes)

    # -- identity ---------------------------------------------------------------------------------

    def key(self) -> str:
        """Stable across re-runs over the same scope (a relative window keys by its spec, not its times)."""
        window = self.window_spec or [self.start, self.end]
        return json.dumps({"window": window, "replicas": self.replicas, "versions": self.versions,
                           "config_hashes": self.config_hashes, "models": self.models}, sort_keys=True)

    def describe(self) -> dict:
        d = {"start": self.start, "end": self.end}
        for f in ("replicas", "versions", "config_hashes", "models"):
            if getattr(self, f):
                d[f] = list(getattr(self, f))
        if self.window_spec:
            d["window"] = self.window_spec
        if self.name:
            d["name"] = self.name
        return d

    def label(self) -> str:
        if self.name:
            return self.name
        parts = [f"{k}={','.join(getattr(self, f))}" for k, f in
                 (("replica", "replicas"), ("version", "versions"), ("config_hash", "config_hashes"),
                  ("model", "models")) if getattr(self, f)]
        return " ".join(parts) or "all"

    def bounds(self, now: float | None = None) -> tuple[float, float]:
        now = time.time() if now is None else now
        return (self.start if self.start is not None else 0.0), (self.end if self.end is not None else now)

    # -- SQL --------------------------------------------------------------------------------------

    def parameters(self, prefix: str = "") -> dict:
        return {f"{prefix}start": self.start if self.start is not None else 0.0,
                f"{prefix}end": self.end if self.end is not None else FAR_FUTURE,
                f"{prefix}replicas": list(self.replicas), f"{prefix}versions": list(self.versions),
                f"{prefix}configs": list(self.config_hashes), f"{prefix}models": list(self.models)}


def _filters(time_column: str, p: str, model_column: str | None, identity: bool = True) -> str:
    # the window and list filters are telemetry.contract.derived's (the dashboards use the same)
    model = f" AND {selected_sql(model_column, f'{p}models')}" if model_column else ""
    ident = (f"AND {selected_sql('ri.engine_version', f'{p}versions')} "
             f"AND {selected_sql('ri.config_hash', f'{p}configs')}"
             if identity else "")
    return (f"{window_sql(time_column, p)} AND {replica_filter_sql('t.replica_id', p)} " + ident + model)


_IDENTITY = ("ri.engine_version AS engine_version, ri.config_hash AS config_hash, "
             "ri.quantization AS quantization, ri.speculative_mode AS speculative_mode, "
             "ri.tokenizer_hash AS tokenizer_hash")


def requests_in(columns: str, prefix: str = "", scope: Scope | None = None) -> str:
    """A subquery: the scope's requests (`columns` of `requests`, qualified `t.`), each with the
    identity of the replica start that served it. Given a `scope` that filters on no version or
    config hash, the identity join is left out (it costs a pass over the rows), and so are the
    identity columns: pass no scope when the query reads them."""
    if scope is not None and not scope.versions and not scope.config_hashes:
        where = _filters("t.arrival_time", prefix, "t.model_name", identity=False)
        return f"(SELECT {columns} FROM requests AS t WHERE {where})"
    return (f"(SELECT {columns}, {_IDENTITY} FROM requests AS t "
            f"ASOF LEFT JOIN replicas AS ri ON t.replica_id = ri.replica_id AND t.arrival_time >= ri.start_time "
            f"WHERE {_filters('t.arrival_time', prefix, 't.model_name')})")


def steps_in(columns: str, prefix: str = "") -> str:
    """A subquery: the scope's steps (`columns` qualified `t.`), with their replica start's identity
    (steps carry no model name: the model filter goes through the identity)."""
    return (f"(SELECT {columns}, {_IDENTITY}, ri.model_name AS model_name FROM steps AS t "
            f"ASOF LEFT JOIN replicas AS ri ON t.replica_id = ri.replica_id AND t.start_time >= ri.start_time "
            f"WHERE {_filters('t.start_time', prefix, 'ri.model_name')})")


# the latest start of every replica that ran in the window (started in it, or served / stepped in it)
_IDENTITY_COLUMNS = ("host", "pid", "engine_version", "model_name", "weights_hash", "tokenizer_hash",
                     "chat_template_hash", "config_json", "config_hash", "dtype", "quantization", "speculative_mode",
                     "attention_backend", "device", "cpu_affinity", "cpu_numa_nodes", "mem_policy_nodes",
                     "gpu_numa_node", "numa_mismatch", "role", "deploy_time")
_REPLICAS = latest_starts_sql(
    _IDENTITY_COLUMNS,
    where=f"start_time < toDateTime64({{end:Float64}}, 6, 'UTC') AND {replica_filter_sql()} "
          f"AND {selected_sql('model_name', 'models')}") + f"""
HAVING {selected_sql('engine_version', 'versions')}
   AND {selected_sql('config_hash', 'configs')}
   AND (started >= toDateTime64({{start:Float64}}, 6, 'UTC')
        OR replica_id IN (SELECT DISTINCT replica_id FROM requests WHERE {window_sql('arrival_time')})
        OR replica_id IN (SELECT DISTINCT replica_id FROM steps WHERE {window_sql('start_time')}))
ORDER BY model_name, replica_id
"""


def replicas_in(store, scope: Scope) -> list[dict]:
    """Identity rows (latest start) of the replicas that ran in the scope's window."""
    rows = store.query_arrow(_REPLICAS, scope.parameters()).to_pylist()
    for r in rows:
        r["cpu_count"] = len(r["cpu_affinity"])
    return rows
