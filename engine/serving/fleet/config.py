"""fleet.toml -> FleetConfig: the sidecar and the replicas of a local fleet.

```toml
[fleet]
name = "local"                 # the run directory is .infersight/fleets/<name> unless run_dir is set
host = "127.0.0.1"
base_port = 8100               # replica i listens on base_port + i unless it sets port (0: any free port)
restart = false                # default restart policy for replicas that die

[sidecar]                      # the telemetry store; `url = "http://..."` uses an existing one instead
port = 8123                    # 0: any free port

[defaults]                     # every replica starts from these
model = "reference"            # a directory, "reference" or "tiny-random:llama"
engine = { max_num_seqs = 16, kv_cache_memory_bytes = "32MiB" }

[[replica]]
id = "r0"
cpus = "0"                     # CPU pinning; or numa_node = 0
role = "baseline"              # or "candidate": which side a disagreement blames (diagnostics/baseline.py)
engine = { quantization = "int8" }   # merged over defaults.engine

[[replica]]                    # a vLLM replica behind a recording proxy (engine/serving/fleet/vllm_replica.py)
id = "v0"
engine = "vllm"
vllm = { max_model_len = 256 } # vLLM server options, merged over defaults.vllm
logprobs = 0.25                # the share of requests its proxy asks for sampled-token logprobs (true, false, F)

[probe]                        # optional: the scheduled prober (`infersight probe --every`, engine/traffic/probe/)
interval = "60s"               # a duration ("60s", "5m") or seconds
token_budget = 20000           # most prompt + output tokens per round (default: the whole suite)
batched = true                 # also send each probe inside a busy batch
enabled = true

[cross_score]                  # on by default (engine/serving/fleet/cross_score_spec.py); enabled = false turns it off
share = 0.05
```
Every key is checked: an unknown one is an error naming it and the valid ones.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.config import ROLES
from engine.core.config_values import wrong_type
from engine.serving.fleet.cross_score_spec import CrossScoreSpec, parse_cross_score
from engine.serving.fleet.vllm_replica import DEFAULT_LOGPROBS_FRACTION
from engine.serving.fleet.vllm_replica import check_spec as check_vllm_spec
from engine.util import parse_interval
from engine.serving.server.engine_args import engine_cli_args

# each table's keys and the TOML types each takes (float: an integer or a float; `cpus = 0` is "0")
_FLEET_KEYS = {"name": str, "host": str, "base_port": int, "run_dir": str, "restart": bool,
               "startup_timeout": float, "stop_timeout": float, "max_restarts": int, "log_level": str}
_SIDECAR_KEYS = {"enabled": bool, "port": int, "data_dir": str, "url": str, "args": list}
_REPLICA_KEYS = {"id": str, "model": str, "port": int, "cpus": (str, int), "numa_node": int, "threads": int,
                 "engine": (dict, str), "restart": bool, "api_key": str, "tracing": str, "otlp_endpoint": str,
                 "args": list, "env": dict, "drain_timeout": float, "vllm": dict, "vllm_python": str,
                 "plugin": bool, "logprobs": (bool, float), "role": str}
_PROBE_KEYS = {"interval": (str, float), "token_budget": int, "batched": bool, "enabled": bool, "rescore": int}
ENGINE_KINDS = ("infersight", "vllm")


@dataclass
class ReplicaSpec:
    id: str
    model: str
    port: int = 0
    cpus: str | None = None
    numa_node: int | None = None
    threads: int | None = None
    engine: dict = field(default_factory=dict)
    restart: bool = False
    api_key: str | None = None
    tracing: str = "none"
    otlp_endpoint: str | None = None
    drain_timeout: float = 10.0
    args: list[str] = field(default_factory=list)  # any further `infersight serve` (or `vllm serve`) options
    env: dict = field(default_factory=dict)
    kind: str = "infersight"  # `engine = "vllm"`: a vLLM replica behind a recording proxy
    vllm: dict = field(default_factory=dict)  # `vllm serve` options of a vLLM replica
    vllm_python: str | None = None  # the interpreter that has vLLM (default: .venv-vllm's)
    plugin: bool = True  # a vLLM replica records steps and identity through infersight's plugin
    # the share of a vLLM replica's requests its proxy asks for the sampled tokens' logprobs (the sampled-traffic
    # quality rule reads them; producing them is most of the attachment's cost on a small CPU): true 1, false 0
    logprobs: float = DEFAULT_LOGPROBS_FRACTION
    # "baseline" | "candidate" | "" (none): recorded in the replica's row; a recorded role decides which side of a
    # disagreement is the baseline (diagnostics/baseline.py), where start order cannot (`fleet up` starts all at once)
    role: str = ""


@dataclass
class SidecarSpec:
    enabled: bool = True
    port: int = 0
    data_dir: str | None = None  # default: <run_dir>/store
    url: str | None = None  # an existing store; no sidecar is started
    args: list[str] = field(default_factory=list)


@dataclass
class ProbeSpec:
    """The fleet's scheduled prober: one more process, `infersight probe --fleet ... --every ...`."""

    interval: float = 60.0  # seconds between round starts
    token_budget: int | None = None
    batched: bool = True
    enabled: bool = True
    rescore: int = 0  # requests per replica cross-scored after each round (engine/traffic/probe/rescore.py); 0: off


@dataclass
class FleetConfig:
    name: str
    host: str = "127.0.0.1"
    run_dir: Path = Path(".infersight/fleets/local")
    startup_timeout: float = 180.0
    stop_timeout: float = 15.0
    max_restarts: int = 5
    log_level: str = "warning"
    sidecar: SidecarSpec = field(default_factory=SidecarSpec)
    replicas: list[ReplicaSpec] = field(default_factory=list)
    source: Path | None = None
    probe: ProbeSpec | None = None  # a [probe] table: the scheduled prober runs beside the replicas
    cross_score: CrossScoreSpec = field(default_factory=CrossScoreSpec)  # continuous cross-scoring, on by default


def _check_keys(table: dict, allowed: dict[str, type | tuple], where: str, tables: bool = False) -> None:
    """Every key known, every value of its key's TOML type: else a ValueError naming the key
    (`tables`: the keys are the file's tables, named as TOML writes them, `[probe]`)."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}")
    for key, value in table.items():
        name = (f"[[{key}]]" if allowed[key] is list else f"[{key}]") if tables else key
        problem = wrong_type(name, value, allowed[key])
        if problem:
            raise ValueError(f"{where}: {problem}")


def _engine_kind(value, where: str) -> str:
    """`engine = { ... }` (infersight's options) or `engine = "vllm"` (the replica's kind)."""
    if isinstance(value, dict):
        return "infersight"
    if value in ENGINE_KINDS:
        return str(value)
    raise ValueError(f"{where}: engine must be a table of infersight engine options or one of "
                     f"{', '.join(repr(k) for k in ENGINE_KINDS)}, got {value!r}")


def _options(value) -> dict:
    return dict(value) if isinstance(value, dict) else {}


def parse_probe(table) -> ProbeSpec:
    if not isinstance(table, dict):
        raise ValueError(f"[probe] must be a table (interval, token_budget, batched, enabled, rescore), got {table!r}")
    _check_keys(table, _PROBE_KEYS, "[probe]")
    for key in ("batched", "enabled"):
        if key in table and not isinstance(table[key], bool):
            raise ValueError(f"[probe]: {key} must be true or false, got {table[key]!r}")
    budget = table.get("token_budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ValueError(f"[probe]: token_budget must be a positive number of tokens, got {budget!r}")
    try:
        interval = parse_interval(table.get("interval", 60.0))
    except ValueError as e:
        raise ValueError(f"[probe]: {e}") from None
    rescore = table.get("rescore", 0)
    if isinstance(rescore, bool) or not isinstance(rescore, int) or rescore < 0:
        raise ValueError(f"[probe]: rescore must be 0 (off) or a number of requests per replica, got {rescore!r}")
    return ProbeSpec(interval=interval, token_budget=budget, batched=table.get("batched", True),
                     enabled=table.get("enabled", True), rescore=rescore)


def default_run_dir(name: str) -> Path:
    return Path(".infersight") / "fleets" / name


def parse_fleet(data: dict, source: Path | None = None) -> FleetConfig:
    _check_keys(data, {"fleet": dict, "sidecar": dict, "defaults": dict, "replica": list, "probe": dict,
                        "cross_score": dict},
                "fleet config", tables=True)
    fleet = dict(data.get("fleet", {}))
    _check_keys(fleet, _FLEET_KEYS, "[fleet]")
    name = str(fleet.get("name", source.stem if source else "local"))
    sidecar = dict(data.get("sidecar", {}))
    _check_keys(sidecar, _SIDECAR_KEYS, "[sidecar]")
    defaults = dict(data.get("defaults", {}))
    _check_keys(defaults, {k: t for k, t in _REPLICA_KEYS.items() if k not in ("id", "port")}, "[defaults]")
    replicas_raw = data.get("replica", [])
    if not isinstance(replicas_raw, list) or not replicas_raw:
        raise ValueError("fleet config: at least one [[replica]] table is needed")

    base_port = int(fleet.get("base_port", 0))
    default_restart = bool(fleet.get("restart", False))
    replicas: list[ReplicaSpec] = []
    for i, raw in enumerate(replicas_raw):
        where = f"[[replica]] #{i + 1}"
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: must be a table ([[replica]]), got {raw!r}")
        _check_keys(raw, _REPLICA_KEYS, where)
        merged = {**defaults, **raw}
        kind = _engine_kind(raw.get("engine", defaults.get("engine", {})), where)
        merged["kind"] = kind
        merged["engine"] = {**_options(defaults.get("engine")), **_options(raw.get("engine"))} if kind == "infersight" else {}
        merged["vllm"] = {**defaults.get("vllm", {}), **raw.get("vllm", {})}
        merged["env"] = {**defaults.get("env", {}), **raw.get("env", {})}
        merged.setdefault("id", f"replica-{i}")
        merged.setdefault("restart", default_restart)
        if "model" not in merged:
            raise ValueError(f"{where} ({merged['id']}): no model (set it here or in [defaults])")
        if "port" not in merged:
            merged["port"] = base_port + i if base_port else 0
        spec = ReplicaSpec(**merged)
        spec.id, spec.model, spec.port = str(spec.id), str(spec.model), int(spec.port)
        if spec.cpus is not None:
            spec.cpus = str(spec.cpus)
        stray = sorted({"vllm", "vllm_python", "logprobs"} & set(raw)) if spec.kind == "infersight" else []
        if stray:
            raise ValueError(f"{where} ({spec.id}): {', '.join(stray)} only apply to engine = \"vllm\" replicas")
        try:
            if spec.kind == "vllm":
                check_vllm_spec(spec)
            else:
                engine_cli_args(spec.engine)  # unknown engine options fail now, not in a child process
        except ValueError as e:
            raise ValueError(f"{where} ({spec.id}): {e}") from None
        if spec.role not in ROLES:
            raise ValueError(f"{where} ({spec.id}): role must be \"baseline\" or \"candidate\", got {spec.role!r}")
        for key in ("role", "deploy_time"):
            if key in spec.engine or key.replace("_", "-") in spec.engine:
                raise ValueError(f"{where} ({spec.id}): set the role with the replica's `role`, not engine.{key} "
                                 f"(the fleet stamps the deploy time)")
        if "replica_id" in spec.engine or "replica-id" in spec.engine:
            raise ValueError(f"{where} ({spec.id}): set the replica id with `id`, not engine.replica_id")
        replicas.append(spec)

    ids = [r.id for r in replicas]
    dupes = sorted({x for x in ids if ids.count(x) > 1})
    if dupes:
        raise ValueError(f"fleet config: duplicate replica id(s) {', '.join(dupes)}")
    ports = [r.port for r in replicas if r.port]
    dupes_p = sorted({p for p in ports if ports.count(p) > 1})
    if dupes_p:
        raise ValueError(f"fleet config: several replicas on port(s) {', '.join(map(str, dupes_p))}")

    run_dir = Path(fleet["run_dir"]) if "run_dir" in fleet else default_run_dir(name)
    return FleetConfig(
        name=name, host=str(fleet.get("host", "127.0.0.1")), run_dir=run_dir,
        startup_timeout=float(fleet.get("startup_timeout", 180.0)),
        stop_timeout=float(fleet.get("stop_timeout", 15.0)), max_restarts=int(fleet.get("max_restarts", 5)),
        log_level=str(fleet.get("log_level", "warning")),
        sidecar=SidecarSpec(**sidecar), replicas=replicas, source=source,
        probe=parse_probe(data["probe"]) if "probe" in data else None,
        cross_score=parse_cross_score(data.get("cross_score", {}), _check_keys))


def load_fleet(path: str | Path) -> FleetConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such fleet config") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    try:
        return parse_fleet(data, source=path)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def override_ports(config: FleetConfig, host: str | None = None, base_port: int | None = None,
                   sidecar_port: int | None = None) -> FleetConfig:
    """Command-line choices over the TOML's (in place): `host` for every process, `base_port` + i for
    replica i where the TOML left its port 0, `sidecar_port` for the sidecar. Ports stay unique."""
    if host:
        config.host = host
    if sidecar_port is not None:
        config.sidecar.port = sidecar_port
    if base_port:
        for i, spec in enumerate(config.replicas):
            if not spec.port:
                spec.port = base_port + i
    ports = [r.port for r in config.replicas if r.port] + ([config.sidecar.port] if config.sidecar.port else [])
    dupes = sorted({p for p in ports if ports.count(p) > 1})
    if dupes:
        raise ValueError(f"fleet config: several processes on port(s) {', '.join(map(str, dupes))} "
                         f"(--base-port gives replica i base+i)")
    return config
