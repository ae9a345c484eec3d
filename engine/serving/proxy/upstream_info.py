"""What the proxy learns about its upstream, and the replica row it writes for it.

`/v1/models` gives the served model name, its context length (`max_model_len`, which fills a
request's unset max_tokens as the servers fill it) and who serves it (`owned_by`: "vllm" means
unasked fields are written as null); `/version` (vLLM) the engine's version.

The replica row (`--replica-row`, the default) is for an upstream nothing else describes: its
identity as far as the proxy can see it (model name, engine and version, and the tokenizer and
chat-template hashes of `--model-dir`, computed the engine's way; the weights hash and the
placement are the upstream's own and stay empty). Where the engine writes its own replica row
(infersight, or vLLM with infersight's stat-logger plugin), run the proxy with `--no-replica-row`.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass

import httpx

from telemetry.contract.records import ReplicaRecord


@dataclass
class UpstreamInfo:
    model: str = ""
    max_model_len: int | None = None
    owned_by: str = ""
    version: str = ""

    @property
    def engine_version(self) -> str:
        name = self.owned_by or "unknown"
        return f"{name}-{self.version}" if self.version else name


async def fetch_info(client: httpx.AsyncClient, upstream: str, headers: dict) -> UpstreamInfo:
    """Raises httpx.HTTPError / ValueError while the upstream is not answering yet."""
    resp = await client.get(upstream + "/v1/models", headers=headers, timeout=10)
    resp.raise_for_status()
    cards = resp.json().get("data") or [{}]
    card = cards[0]
    info = UpstreamInfo(model=str(card.get("id", "")), owned_by=str(card.get("owned_by", "")),
                        max_model_len=int(card["max_model_len"]) if card.get("max_model_len") else None)
    try:
        version = await client.get(upstream + "/version", headers=headers, timeout=10)
        if version.status_code == 200:
            info.version = str(version.json().get("version", ""))
    except (httpx.HTTPError, ValueError, AttributeError):
        pass  # not every server has /version
    return info


def replica_record(replica_id: str, upstream: str, info: UpstreamInfo, tokenizer=None, role: str = "",
                   deploy_time: float | None = None) -> ReplicaRecord:
    config = {"model": str(tokenizer.directory) if tokenizer is not None else "", "served_model_name": info.model,
              "max_model_len": info.max_model_len, "upstream": upstream, "recorded_by": "infersight-proxy"}
    config_json = json.dumps(config, sort_keys=True)
    return ReplicaRecord(
        replica_id=replica_id, host=socket.gethostname(), pid=os.getpid(), start_time=time.time(),
        engine_version=info.engine_version, model_name=info.model, weights_hash="",
        tokenizer_hash=tokenizer.tokenizer_hash if tokenizer is not None else "",
        chat_template_hash=tokenizer.chat_template_hash if tokenizer is not None else "",
        config_json=config_json, config_hash=hashlib.sha256(config_json.encode()).hexdigest(),
        dtype="unknown", quantization="unknown", speculative_mode="unknown", attention_backend="unknown",
        device="unknown", labels_json=json.dumps({"recorded_by": "infersight-proxy", "upstream": upstream}),
        # the proxy's own launch says nothing of when the upstream was deployed (a restarted proxy in front of a
        # long-running baseline would look like the newer deploy): unknown (0) unless given
        role=role, deploy_time=deploy_time if deploy_time is not None else 0.0)
