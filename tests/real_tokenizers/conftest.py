"""Real-tokenizer models, built once per session, and the incident directories made from them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# the fault helpers live beside the diagnostics tests, which may not be collected in this run
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "diagnostics"))


@pytest.fixture(scope="session")
def real_models(tmp_path_factory):
    """`real_models(family) -> Path`: the "sentencepiece" or "tekken" model directory, built on first use."""
    if importlib.util.find_spec("mistral_common") is None:
        pytest.skip("mistral-common (a dev dependency) ships the tokenizer files: pip install -e '.[dev]'")
    from real_models import build_sentencepiece_model, build_tekken_model

    builders = {"sentencepiece": build_sentencepiece_model, "tekken": build_tekken_model}
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = builders[family](tmp_path_factory.mktemp(f"real_{family}"))
        return built[family]

    return get


@pytest.fixture(scope="session")
def incident_dirs(real_models, tmp_path_factory):
    """`incident_dirs(incident) -> (base dir, cand dir)`, made once per session."""
    made: dict[str, tuple[Path, Path]] = {}

    def get(incident) -> tuple[Path, Path]:
        if incident.name not in made:
            made[incident.name] = incident.make(real_models(incident.family),
                                                tmp_path_factory.mktemp(f"incident_{incident.name}"))
        return made[incident.name]

    return get


@pytest.fixture(scope="session")
def tokenizer_of():
    """`tokenizer_of(dir) -> engine.core.tokenization.Tokenizer`, loaded once per directory."""
    from engine.core.tokenization import Tokenizer

    loaded: dict[Path, Tokenizer] = {}

    def get(directory) -> Tokenizer:
        directory = Path(directory)
        if directory not in loaded:
            loaded[directory] = Tokenizer(directory)
        return loaded[directory]

    return get
