"""The tokenizers a replica ran with, loaded here for the token-level checks.

A replica's identity names its model directory (config_json["model"]); `--model-dir NAME=DIR`
(NAME a replica id or a model name) points elsewhere, e.g. when the diagnostics run on another
host. A tokenizer is used only when the directory's tokenizer hash (computed the engine's way)
equals the hash the replica recorded at start: a directory changed since then would make the
checks accuse the wrong tokenizer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

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
class LoadedTokenizer:
    directory: str
    tokenizer: object  # engine.tokenization.Tokenizer
    tokenizer_hash: str

    @property
    def hf(self):
        return self.tokenizer.hf

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def piece(self, token_id: int) -> str:
        """The text of one token as it decodes on its own ("" for an ID outside the vocabulary)."""
        if token_id >= len(self.hf):
            return ""
        return self.hf.decode([int(token_id)], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def model_vocab_size(self) -> int:
        """Rows of the model's embedding (config.json vocab_size): often padded past the tokenizer's size."""
        try:
            config = json.loads((Path(self.directory) / "config.json").read_text())
            return max(int(config.get("vocab_size") or 0), self.vocab_size)
        except (OSError, ValueError, TypeError):
            return self.vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def special_ids(self) -> list[int]:
        return sorted(set(self.hf.all_special_ids))

    @property
    def post_processor_ids(self) -> list[int]:
        """Specials the tokenizer adds around any text by itself (a BOS, maybe an EOS)."""
        with_specials = self.encode("x", add_special_tokens=True)
        plain = self.encode("x", add_special_tokens=False)
        return sorted(set(with_specials) - set(plain))


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

    def _load(self, directory: str):
        if directory not in self._cache:
            from engine.tokenization import Tokenizer

            try:
                tok = Tokenizer(directory, cache_size=0)
                self._cache[directory] = LoadedTokenizer(directory, tok, tok.tokenizer_hash)
            except Exception as e:  # noqa: BLE001 - a missing or broken directory is reported, not fatal
                self._cache[directory] = e
        return self._cache[directory]

    def for_replica(self, replica: dict) -> LoadedTokenizer | None:
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
