"""vLLM's `VllmConfig` as the replica row's `config_json`, and its `config_hash`.

The document is {"engine": "vllm", "model": local model dir, "tokenizer": local tokenizer dir,
"chat_template": the `--chat-template` argument or null, "vllm_config": every field of VllmConfig}.
"model" is where the diagnostics find the tokenizer a replica ran with, as for infersight's own rows.

The hash leaves out what differs between two identical replicas (vLLM's random instance id, ports
and addresses, the served name, which is a label) and keys starting with "_" (vLLM's internals),
so that replicas started the same way share it, as infersight's `EngineConfig.config_hash` does.
The plugin's own options (`additional_config["infersight"]`: the store URL and its password) are
never written.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from pathlib import Path
from typing import Any

# per start or per host, not behaviour (found in ParallelConfig, VllmConfig, ModelConfig)
VOLATILE_KEYS = frozenset({"instance_id", "served_model_name", "master_addr", "master_port", "data_parallel_master_ip",
                           "data_parallel_master_port", "data_parallel_rpc_port"})
MAX_DEPTH = 16


def jsonable(value: Any, depth: int = 0) -> Any:
    """Dataclasses, pydantic models, HF configs, enums, paths and containers as plain JSON values;
    anything else as its str (a type's name where the str would hold a memory address)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > MAX_DEPTH:
        return f"<{type(value).__qualname__}>"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [jsonable(v, depth + 1) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    for method in ("to_dict", "model_dump"):  # transformers' PretrainedConfig, pydantic models
        dump = getattr(value, method, None)
        if callable(dump):
            try:
                return jsonable(dump(), depth + 1)
            except Exception:  # noqa: BLE001 - fall through to the text form
                break
    text = str(value)
    return f"<{type(value).__module__}.{type(value).__qualname__}>" if " at 0x" in text else text


def _without_plugin_options(config: dict) -> dict:
    extra = config.get("additional_config")
    if isinstance(extra, dict) and "infersight" in extra:
        config = {**config, "additional_config": {k: v for k, v in extra.items() if k != "infersight"}}
    return config


def config_document(vllm_config, *, model_dir: str, tokenizer_dir: str, chat_template: str | None) -> dict:
    return {"engine": "vllm", "model": model_dir, "tokenizer": tokenizer_dir, "chat_template": chat_template,
            "vllm_config": _without_plugin_options(jsonable(vllm_config))}


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def config_hash(document: dict) -> str:
    """sha256 (16 hex, as infersight's) of the document without its per-start and per-host fields."""
    return hashlib.sha256(json.dumps(_stable(document), sort_keys=True, default=str).encode()).hexdigest()[:16]
