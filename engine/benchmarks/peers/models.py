"""The benchmark's models: the shipped reference model, and a random-weight 135M Llama of SmolLM2's shape.

The 135M one (hidden 576, intermediate 1536, 30 layers, 9 heads / 3 KV heads, vocab 49152, tied
embeddings, 2048 positions, seed 0) is built once with transformers (engine.core.tiny_model) into
~/.cache/infersight/peers/ and reused.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

CACHE = Path.home() / ".cache" / "infersight" / "peers"
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                    vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048, seed=0)


def resolve(name: str, cache: Path = CACHE) -> Path:
    if name == "reference":
        return REFERENCE
    if name == "135m":
        path = cache / "llama-135m-smollm2-shape-seed0"
        if not (path / "config.json").exists():  # in a child, to keep this process's peak RSS small
            import subprocess
            import sys

            path.mkdir(parents=True, exist_ok=True)
            code = ("import sys; from engine.core.tiny_model import build_random_model; "
                    "from engine.benchmarks.peers.models import SMOLLM2_135M; "
                    "build_random_model(sys.argv[1], 'llama', **SMOLLM2_135M)")
            subprocess.run([sys.executable, "-c", code, str(path)], check=True)
        return path
    path = Path(name)
    if not (path / "config.json").exists():
        raise ValueError(f"model {name!r}: not 'reference', '135m' or a model directory")
    return path


def describe(path: Path) -> dict:
    """config.json plus the weight bytes and parameter count (float32 safetensors)."""
    cfg = json.loads((path / "config.json").read_text())
    weight_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return dict(config=cfg, weight_bytes=weight_bytes, params=weight_bytes // 4,
                context=cfg["max_position_embeddings"], vocab_size=cfg["vocab_size"])
