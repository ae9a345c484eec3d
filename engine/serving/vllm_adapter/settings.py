"""The plugin's switch and options: environment variables, or vLLM's own `--additional-config`.

The plugin is installed with infersight and loaded by every vLLM that sees the distribution; it
records only when a store is named. Either

    INFERSIGHT_STORE=http://user:pass@sidecar:8123/infersight  INFERSIGHT_REPLICA_ID=vllm-0  vllm serve ...

or, in vLLM's own arguments (they win over the environment, key by key):

    vllm serve ... --additional-config '{"infersight": {"store": "http://...", "replica_id": "vllm-0"}}'

| key (`infersight` object) | variable | meaning |
|---|---|---|
| `store` | `INFERSIGHT_STORE` | ClickHouse HTTP URL of the store (the sidecar or a cluster); unset: the plugin does nothing |
| `replica_id` | `INFERSIGHT_REPLICA_ID` | the replica's id in every row (default `vllm-<host>-<pid>`); engine index k > 0 of a data-parallel vLLM gets `<id>-engine<k>` |
| `spool_dir` | `INFERSIGHT_SPOOL_DIR` | where the Recorder spools while the store is down; a directory that survives a restart is replayed by the next start (default: a fresh temporary directory) |
| `labels` | `INFERSIGHT_LABELS` | JSON object of operator labels for the replica row (fleet, zone ...) |
| `request_rows` | `INFERSIGHT_REQUEST_ROWS` | `false` / `0`: no `requests` rows (a recording proxy in front writes them, with token IDs: two rows per request would count it twice); the engine's timing of each request goes to `engine_request_timings` instead, under the proxy's request id, so the two join |
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

ENV = {"store": "INFERSIGHT_STORE", "replica_id": "INFERSIGHT_REPLICA_ID", "spool_dir": "INFERSIGHT_SPOOL_DIR",
       "labels": "INFERSIGHT_LABELS", "request_rows": "INFERSIGHT_REQUEST_ROWS"}
CONFIG_KEY = "infersight"  # the key in vLLM's --additional-config


class SettingsError(ValueError):
    """The plugin's options cannot be read (the message says which and why)."""


@dataclass(frozen=True)
class PluginSettings:
    store: str = ""  # "" = switched off
    replica_id: str = ""
    spool_dir: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    request_rows: bool = True  # False: a recording proxy in front writes the requests rows

    @property
    def enabled(self) -> bool:
        return bool(self.store)

    def replica_for_engine(self, engine_index: int) -> str:
        return self.replica_id if engine_index == 0 else f"{self.replica_id}-engine{engine_index}"


def _labels(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as e:
            raise SettingsError(f"{where}: labels must be a JSON object ({e})") from None
    if not isinstance(value, dict):
        raise SettingsError(f"{where}: labels must be a JSON object, got {type(value).__name__}")
    return value


def read_settings(additional_config: Any = None, environ: Mapping[str, str] | None = None) -> PluginSettings:
    """The options from vLLM's `additional_config` (a dict; its "infersight" object) over the environment."""
    environ = os.environ if environ is None else environ
    ours = additional_config.get(CONFIG_KEY, {}) if isinstance(additional_config, dict) else {}
    if not isinstance(ours, dict):
        raise SettingsError(f"--additional-config {CONFIG_KEY!r} must be an object, got {type(ours).__name__}")
    unknown = sorted(set(ours) - set(ENV))
    if unknown:
        raise SettingsError(f"--additional-config {CONFIG_KEY!r}: unknown keys {unknown}; known: {sorted(ENV)}")
    value = {key: ours[key] if key in ours else environ.get(variable) for key, variable in ENV.items()}
    store = str(value["store"] or "").strip()
    if store and not store.startswith(("http://", "https://")):
        raise SettingsError(f"infersight store {store!r}: expected a ClickHouse HTTP URL "
                            "(http(s)://user:password@host:port/database)")
    return PluginSettings(
        store=store,
        replica_id=str(value["replica_id"] or f"vllm-{socket.gethostname()}-{os.getpid()}"),
        spool_dir=str(value["spool_dir"]) if value["spool_dir"] else None,
        labels=_labels(value["labels"] or {}, "infersight labels"),
        request_rows=_flag(value["request_rows"], "infersight request_rows"),
    )


def _flag(value: Any, where: str) -> bool:
    """True unless switched off; unset means on."""
    if value is None or value is True or value is False:
        return value is not False
    text = str(value).strip().lower()
    if text in ("", "1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{where}: expected true or false, got {value!r}")
