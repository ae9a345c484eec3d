"""A vLLM replica's identity as a `replicas` row, computed the way infersight's engine computes its own.

- weights hash: the engine loader's digest (engine/core/models/loader.py: name, dtype, shape and bytes of
  every checkpoint tensor, in name order) over the same safetensors, read one tensor at a time;
- tokenizer and chat-template hashes: engine.core.tokenization.Tokenizer on vLLM's tokenizer directory;
  a `--chat-template` given to vLLM's server replaces the tokenizer's template, and is hashed instead;
- config: VllmConfig as JSON and its hash (config_json.py); placement: engine.core.placement.

It reads the weights, so the plugin builds it on a thread of its own, never on vLLM's event loop.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path

from engine.core import cgroup_limits
from engine.core.model_files import SECTION as MODEL_FILES
from engine.core.model_files import model_files
from engine.core.placement import discover_placement
from engine.core.tokenization import Tokenizer, sha256_hex
from engine.serving.vllm_adapter.config_json import config_document, config_hash
from telemetry.contract.records import ReplicaRecord


def weights_hash(model_dir: str | os.PathLike) -> str:
    """The hash infersight's loader returns for `model_dir` (equal on both engines for one checkpoint)."""
    from safetensors import safe_open

    from engine.core.models.loader import _tensor_bytes, weight_map

    mapping = weight_map(Path(model_dir))
    digest = hashlib.sha256()
    handles = {}
    for name in sorted(mapping):
        path = mapping[name]
        if path not in handles:
            handles[path] = safe_open(str(path), framework="pt")
        tensor = handles[path].get_tensor(name)
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(_tensor_bytes(tensor))
        del tensor  # one tensor in memory at a time
    return digest.hexdigest()


def chat_template_argument(argv: list[str]) -> str | None:
    """The value of vLLM's server option `--chat-template` in `argv` (None when not given)."""
    for i, arg in enumerate(argv):
        if arg == "--chat-template" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--chat-template="):
            return arg.split("=", 1)[1]
    return None


def local_dir(name_or_path: str, revision: str | None = None) -> str:
    """A model's local directory: the path itself, or the Hugging Face cache's snapshot of a hub id
    (looked up offline); "" when neither is on this host."""
    if name_or_path and Path(name_or_path).is_dir():
        return str(Path(name_or_path).resolve())
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name_or_path, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached here, or no huggingface_hub: identity stays partial
        return ""


def model_name(served_name: str | None, model: str, model_dir: str) -> str:
    """The served name when one was given, else the directory's name, as infersight's engine names it
    (vLLM's default served name is the model path, which would differ from host to host)."""
    if served_name and served_name != model:
        return served_name
    return Path(model_dir).name if model_dir else model


def _gpu_pci_address(device_type: str) -> str | None:
    """The first visible GPU's PCI address from NVML (never from torch: that would create a CUDA context
    in vLLM's API-server process)."""
    if device_type != "cuda":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(visible)) if visible.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(visible))
            bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
            return bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - placement is best effort
        return None


def _placement(device_type: str) -> dict:
    try:
        return discover_placement(gpu_pci_address=_gpu_pci_address(device_type)).record_fields()
    except Exception:  # noqa: BLE001 - unreadable sysfs / procfs: the affinity alone
        return {"cpu_affinity": sorted(os.sched_getaffinity(0))}


def _backend_name(vllm_config) -> str:
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    return str(getattr(backend, "name", backend)) if backend else "auto"  # vLLM picks it per platform


def replica_record(vllm_config, *, replica_id: str, engine_version: str, chat_template: str | None,
                   chat_template_text: str | None, labels: dict | None = None) -> ReplicaRecord:
    """The row for a vLLM replica. `chat_template` is the `--chat-template` argument (or None),
    `chat_template_text` the template vLLM loaded from it."""
    mc = vllm_config.model_config
    model_dir = local_dir(mc.model_weights or mc.model, getattr(mc, "revision", None))
    tokenizer_dir = local_dir(mc.tokenizer or mc.model, getattr(mc, "tokenizer_revision", None)) or model_dir
    tokenizer = Tokenizer(tokenizer_dir, cache_size=0) if tokenizer_dir else None
    if chat_template_text is not None:
        template_hash = sha256_hex(chat_template_text.encode())
    else:
        template_hash = tokenizer.chat_template_hash if tokenizer is not None else ""
    document = config_document(vllm_config, model_dir=model_dir, tokenizer_dir=tokenizer_dir,
                               chat_template=chat_template)
    if model_dir:  # the model directory's files, as infersight's row holds them (engine/core/model_files.py)
        document[MODEL_FILES] = model_files(model_dir)
    served = mc.served_model_name[0] if isinstance(mc.served_model_name, (list, tuple)) else mc.served_model_name
    spec = vllm_config.speculative_config
    device_type = str(vllm_config.device_config.device_type)
    return ReplicaRecord(
        replica_id=replica_id, host=socket.gethostname(), pid=os.getpid(), start_time=time.time(),
        engine_version=engine_version, model_name=model_name(served, mc.model, model_dir),
        weights_hash=weights_hash(model_dir) if model_dir else "",
        tokenizer_hash=tokenizer.tokenizer_hash if tokenizer is not None else "", chat_template_hash=template_hash,
        config_json=json.dumps({**document, "placement": {"cgroup": cgroup_limits.limits()}}, sort_keys=True,
                               default=str), config_hash=config_hash(document),
        dtype=str(mc.dtype).removeprefix("torch."), quantization=str(mc.quantization or "none"),
        speculative_mode=str(getattr(spec, "method", None) or "none") if spec is not None else "none",
        attention_backend=f"vllm:{_backend_name(vllm_config)}",
        device=device_type, labels_json=json.dumps(labels or {}, sort_keys=True), **deploy_fields(labels or {}),
        **_placement(device_type))


def deploy_fields(labels: dict) -> dict:
    """role and deploy_time of the replica row from the operator's labels (`fleet up` puts them there, as
    INFERSIGHT_LABELS); the deploy time, where none is given, is this process's launch."""
    from engine.core.config import ROLES
    from engine.core.engine_records import process_launch_time

    role = str(labels.get("role") or "")
    try:
        deploy_time = float(labels["deploy_time"]) if labels.get("deploy_time") is not None else process_launch_time()
    except (TypeError, ValueError):
        deploy_time = process_launch_time()
    return {"role": role if role in ROLES else "", "deploy_time": deploy_time}
