"""The files of a model directory that change what the model answers, as the replica's identity holds them.

The weights, tokenizer and chat template each have a hash column of their own; a hash says *that*
something differs, not *what*. So every such file is also kept here, under the replica config's
`model_files` key: JSON files parsed (a RoPE base changed in config.json shows up as
`model_files.config_json.rope_theta`, 10000 vs 100000), the others by their sha256, the weights by
their size (their content is the weights_hash column: hashing gigabytes twice at start is not free).

Keys are the file names with "." as "_" (`config.json` -> `config_json`), so that dotted config keys
stay unambiguous; `file_name` turns one back. A JSON value whose text is longer than MAX_VALUE_CHARS
(a chat template inside tokenizer_config.json, a vocabulary) is kept as {"sha256": ...} instead: the
identity is read and compared often, and such a value has a column or a file of its own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from engine.core.tokenization import TOKENIZER_FILES

SECTION = "model_files"
JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
              "added_tokens.json", "preprocessor_config.json")
HASHED_FILES = tuple(n for n in TOKENIZER_FILES if n not in JSON_FILES)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MAX_VALUE_CHARS = 2000


def key_of(name: str) -> str:
    return name.replace(".", "_")


def file_name(key: str) -> str:
    """`config_json` -> `config.json` (the files this module knows; others as they are)."""
    known = {key_of(n): n for n in (*JSON_FILES, *HASHED_FILES)}
    return known.get(key, key)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def compact(value):
    """`value` with every part whose JSON is longer than MAX_VALUE_CHARS replaced by its sha256."""
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= MAX_VALUE_CHARS:
        return value
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    return {"sha256": _sha256(text.encode())}


def model_files(model_dir: str | Path) -> dict:
    """{file key: parsed JSON | {"sha256"} | {"bytes"}} for the behaviour files present in `model_dir`."""
    directory = Path(model_dir)
    out: dict = {}
    if not directory.is_dir():
        return out
    for name in JSON_FILES:
        path = directory / name
        if path.is_file():
            try:
                out[key_of(name)] = compact(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                out[key_of(name)] = {"sha256": _sha256(path.read_bytes()), "unparsed": True}
    for name in HASHED_FILES:
        path = directory / name
        if path.is_file():
            out[key_of(name)] = {"sha256": _sha256(path.read_bytes())}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.suffix in WEIGHT_SUFFIXES:
            out[key_of(path.name)] = {"bytes": path.stat().st_size}
    return out


def hash_column(file_key: str) -> str | None:
    """The replica row's hash column that also covers this file (its finding says the file's keys), or None
    (config.json, generation_config.json ...: only the config document holds them)."""
    name = file_name(file_key)
    if name.startswith("chat_template"):
        return "chat_template_hash"
    if name in TOKENIZER_FILES:
        return "tokenizer_hash"
    if file_key.endswith(tuple(key_of(s) for s in WEIGHT_SUFFIXES)):
        return "weights_hash"
    return None
