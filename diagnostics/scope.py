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
from datetime import datetime, timezone

FAR_FUTURE = 7.0e9  # inside DateTime64(6)'s range (year 2191)
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIDE_KEYS = {"version": "versions", "versions": "versions", "replica": "replicas", "replicas": "replicas",
              "config_hash": "config_hashes", "config_hashes": "config_hashes", "config": "config_hashes",
              "model": "models", "models": "models"}


def parse_time(text: str | float | None, now: float | None = None) -> float | None:
    """A point in time as epoch seconds (see the module doc for the accepted forms)."""
    if text is None or text == "":
        return None
    if isinstance(text, (int, float)):
        return float(text)
    now = time.time() if now is None else now
    s = str(text).strip()
    if s == "now":
        return now
    if m := _RELATIVE.match(s):
        return now - float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (epoch seconds, ISO 8601, 'now', or relative like 2h / 30m / 7d)")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


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
    model = (f" AND (empty({{{p}models:Array(String)}}) OR has({{{p}models:Array(String)}}, {model_column}))"
             if model_column else "")
    ident = (f"AND (empty({{{p}versions:Array(String)}}) OR has({{{p}versions:Array(String)}}, ri.engine_version)) "
             f"AND (empty({{{p}configs:Array(String)}}) OR has({{{p}configs:Array(String)}}, ri.config_hash))"
             if identity else "")
    return (f"{time_column} >= toDateTime64({{{p}start:Float64}}, 6, 'UTC') "
            f"AND {time_column} < toDateTime64({{{p}end:Float64}}, 6, 'UTC') "
            f"AND (empty({{{p}replicas:Array(String)}}) OR has({{{p}replicas:Array(String)}}, t.replica_id)) "
            + ident + model)


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
_REPLICAS = """
SELECT replica_id, argMax(host, start_time) AS host, argMax(pid, start_time) AS pid,
       max(start_time) AS started, argMax(engine_version, start_time) AS engine_version,
       argMax(model_name, start_time) AS model_name, argMax(weights_hash, start_time) AS weights_hash,
       argMax(tokenizer_hash, start_time) AS tokenizer_hash,
       argMax(chat_template_hash, start_time) AS chat_template_hash,
       argMax(config_json, start_time) AS config_json, argMax(config_hash, start_time) AS config_hash,
       argMax(dtype, start_time) AS dtype, argMax(quantization, start_time) AS quantization,
       argMax(speculative_mode, start_time) AS speculative_mode,
       argMax(attention_backend, start_time) AS attention_backend, argMax(device, start_time) AS device,
       argMax(cpu_affinity, start_time) AS cpu_affinity, argMax(cpu_numa_nodes, start_time) AS cpu_numa_nodes,
       argMax(mem_policy_nodes, start_time) AS mem_policy_nodes, argMax(gpu_numa_node, start_time) AS gpu_numa_node,
       argMax(numa_mismatch, start_time) AS numa_mismatch
FROM (SELECT * FROM replicas
      WHERE start_time < toDateTime64({end:Float64}, 6, 'UTC')
        AND (empty({replicas:Array(String)}) OR has({replicas:Array(String)}, replica_id))
        AND (empty({models:Array(String)}) OR has({models:Array(String)}, model_name)))
GROUP BY replica_id
HAVING (empty({versions:Array(String)}) OR has({versions:Array(String)}, engine_version))
   AND (empty({configs:Array(String)}) OR has({configs:Array(String)}, config_hash))
   AND (started >= toDateTime64({start:Float64}, 6, 'UTC')
        OR replica_id IN (SELECT DISTINCT replica_id FROM requests
                          WHERE arrival_time >= toDateTime64({start:Float64}, 6, 'UTC')
                            AND arrival_time < toDateTime64({end:Float64}, 6, 'UTC'))
        OR replica_id IN (SELECT DISTINCT replica_id FROM steps
                          WHERE start_time >= toDateTime64({start:Float64}, 6, 'UTC')
                            AND start_time < toDateTime64({end:Float64}, 6, 'UTC')))
ORDER BY model_name, replica_id
"""


def replicas_in(store, scope: Scope) -> list[dict]:
    """Identity rows (latest start) of the replicas that ran in the scope's window."""
    rows = store.query_arrow(_REPLICAS, scope.parameters()).to_pylist()
    for r in rows:
        r["cpu_count"] = len(r["cpu_affinity"])
    return rows
