"""Read a local Hugging Face model directory: config, safetensors shard(s), generation config.

Weights load name for name into our modules; anything that does not line up (a
missing shard, a missing or unexpected tensor, a shape mismatch) raises
`ModelLoadError` naming the file and the tensor. The weights hash covers tensor
names, dtypes, shapes and bytes in name order, so it does not depend on how the
checkpoint was sharded. Once loaded, a model with `fuse_projections` (Llama) gets its
q/k/v and gate/up weights concatenated, each module's weight a view of its slice.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from engine.core.models.errors import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path, required: bool = True) -> dict | None:
    if not path.is_file():
        if required:
            raise ModelLoadError(f"{path}: file not found")
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return value


def weight_map(model_dir: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file holding it (from the index, or by reading headers)."""
    from safetensors import safe_open

    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        index = read_json(index_path)
        mapping = index.get("weight_map")
        if not isinstance(mapping, dict) or not mapping:
            raise ModelLoadError(f"{index_path}: no 'weight_map'")
        result = {}
        for name, file in mapping.items():
            path = model_dir / file
            if not path.is_file():
                raise ModelLoadError(f"{path}: shard missing (listed in {INDEX_FILE} for tensor {name!r})")
            result[name] = path
        return result
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir}: no *.safetensors weights found")
    result = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name in result:
                        raise ModelLoadError(f"{path}: tensor {name!r} also in {result[name]}")
                    result[name] = path
        except ModelLoadError:
            raise
        except Exception as e:  # a truncated or corrupt file
            raise ModelLoadError(f"{path}: cannot read safetensors: {e}") from None
    return result


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def load_weights(model: nn.Module, model_dir: Path, dtype: torch.dtype,
                 tied: dict[str, str] | None = None) -> str:
    """Copy every checkpoint tensor into `model`'s parameter of the same name; return the weights hash.

    `tied` maps a parameter name that shares another's storage (lm_head.weight ->
    model.embed_tokens.weight): it may be absent from the checkpoint.
    """
    from safetensors import safe_open

    tied = tied or {}
    params = dict(model.named_parameters(remove_duplicate=False))
    mapping = weight_map(model_dir)
    digest = hashlib.sha256()
    handles, loaded = {}, set()
    try:
        for name in sorted(mapping):
            path = mapping[name]
            if path not in handles:
                try:
                    handles[path] = safe_open(str(path), framework="pt")
                except Exception as e:
                    raise ModelLoadError(f"{path}: cannot read safetensors: {e}") from None
            f = handles[path]
            if name not in f.keys():
                raise ModelLoadError(f"{path}: tensor {name!r} listed in {INDEX_FILE} but not in the file")
            if name not in params:
                raise ModelLoadError(f"{path}: unexpected tensor {name!r} (no such parameter in "
                                     f"{type(model).__name__}; wrong architecture in config.json?)")
            tensor = f.get_tensor(name)
            param = params[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ModelLoadError(f"{path}: tensor {name!r} has shape {tuple(tensor.shape)} but the "
                                     f"model built from config.json expects {tuple(param.shape)}")
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
            digest.update(_tensor_bytes(tensor))
            if name in tied:
                continue  # the same storage is filled from the tensor it is tied to
            with torch.no_grad():
                param.copy_(tensor.to(dtype))
            loaded.add(name)
    finally:
        handles.clear()
    missing = sorted(set(params) - loaded - set(tied))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelLoadError(f"{model_dir}: checkpoint lacks tensor(s) {missing[:5]}{more}")
    fuse = getattr(model, "fuse_projections", None)
    if fuse is not None:  # q/k/v and gate/up as one matmul each, same storage (models/llama.py)
        fuse()
    return digest.hexdigest()
