"""The tokenizers a replica ran with, loaded here for the token-level checks.

A replica's identity names its model directory (config_json["model"]); `--model-dir NAME=DIR`
(NAME a replica id or a model name) points elsewhere, e.g. when the diagnostics run on another
host. A tokenizer is used only when the directory's tokenizer hash (computed the engine's way)
equals the hash the replica recorded at start: a directory changed since then would make the
checks accuse the wrong tokenizer.

The tokenizer handed out is the engine's own `engine.core.tokenization.Tokenizer` (the class the replica
served with), so encode, decode and per-token strings here are exactly the engine's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.tokenization import Tokenizer, TokenizerLoadError

log = logging.getLogger(__name__)


def parse_model_dirs(items: list[str] | None) -> dict[str, str]:
    """["r1=/models/a", "tiny-llama=/models/b"] -> {"r1": "/models/a", ...}."""
    out = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--model-dir {item!r}: expected NAME=DIR (NAME: a replica id or a model name)")
        out[name.strip()] = path.strip()
    return out


@dataclass
class TokenizerSource:
    """Loads (once per directory) the tokenizer of each replica identity row."""

    model_dirs: dict[str, str] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # replica -> why no tokenizer

    def directory(self, replica: dict) -> str | None:
        for key in (replica.get("replica_id"), replica.get("model_name")):
            if key and key in self.model_dirs:
                return self.model_dirs[key]
        try:
            return json.loads(replica.get("config_json") or "{}").get("model")
        except json.JSONDecodeError:
            return None

    def _load(self, directory: str) -> Tokenizer | Exception:
        if directory not in self._cache:
            try:
                self._cache[directory] = Tokenizer(directory, cache_size=0)
            except (TokenizerLoadError, OSError) as e:  # a missing or broken directory is reported, not fatal
                self._cache[directory] = e
        return self._cache[directory]

    def for_replica(self, replica: dict) -> Tokenizer | None:
        rid = replica.get("replica_id", "?")
        directory = self.directory(replica)
        if not directory or not Path(directory).is_dir():
            self.problems[rid] = f"model directory {directory!r} is not on this host (use --model-dir {rid}=DIR)"
            return None
        loaded = self._load(directory)
        if isinstance(loaded, Exception):
            self.problems[rid] = f"cannot load the tokenizer in {directory}: {loaded}"
            return None
        recorded = replica.get("tokenizer_hash") or ""
        if recorded and loaded.tokenizer_hash != recorded:
            self.problems[rid] = (f"the tokenizer in {directory} (hash {loaded.tokenizer_hash[:12]}) is not the one "
                                  f"{rid} recorded at start ({recorded[:12]}): not used")
            return None
        return loaded
