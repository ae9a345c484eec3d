"""Shared fixtures: the committed reference models, small engine configs, a damaged checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "evals" / "reference" / "models" / "target"
DRAFT = ROOT / "evals" / "reference" / "models" / "draft"
HELDOUT = ROOT / "evals" / "suites" / "reference_heldout.jsonl"
SMALL = dict(num_kv_blocks=64, max_num_seqs=64)  # tiny KV pool: the suites' sequences are short


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def target_dir() -> Path:
    assert (TARGET / "model.safetensors").is_file(), "the reference target model is committed in evals/reference/models"
    return TARGET


@pytest.fixture(scope="session")
def heldout_path() -> Path:
    return HELDOUT


@pytest.fixture(scope="session")
def heldout_subset():
    from evals.suite import load_suite

    return load_suite(HELDOUT).subset(per_task=4)  # 24 items, every task


@pytest.fixture(scope="session")
def engine_config(target_dir):
    from engine.core.config import EngineConfig

    def make(**overrides):
        return EngineConfig(model=str(overrides.pop("model", target_dir)), **{**SMALL, **overrides})

    return make


@pytest.fixture(scope="session")
def damaged_dir(tmp_path_factory, target_dir) -> Path:
    """A copy of the target with gaussian noise (half of each tensor's own std) on every attention and
    MLP projection: the kind of damage a bad conversion or a corrupted upload does."""
    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("damaged")
    for f in target_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    weights = load_file(target_dir / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    for name, w in weights.items():
        if name.endswith("_proj.weight"):
            weights[name] = w + 0.5 * w.float().std() * torch.randn(w.shape, generator=gen).to(w.dtype)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def baseline_run(engine_config, heldout_subset):
    """The fp32 engine's run of the subset (shared by the gate tests as their baseline)."""
    from evals.backends import EngineBackend
    from evals.runner import run_suite

    backend = EngineBackend(engine_config())
    try:
        return run_suite(heldout_subset, backend, progress=False)
    finally:
        backend.close()
