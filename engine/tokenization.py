"""The tokenizer as the engine sees it: transformers' AutoTokenizer plus identity and a cache.

- `tokenizer_hash` / `chat_template_hash`: sha256 of the files that decide how
  text becomes tokens, and of the chat template - part of a replica's identity,
  so that "same model, different answers" can be traced to a tokenizer change.
- An LRU cache of encodings keyed by text (system prompts and agent loops
  repeat a lot), with hit / miss counts reported to the observer.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path

from telemetry.contract.hooks import NOOP_OBSERVER, EngineObserver

# the files that define a tokenizer's behaviour, whichever of them a model ships
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
                   "chat_template.json")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hash_tokenizer_files(directory: str | Path) -> str:
    """sha256 over the (name, content) of every tokenizer file present, in a fixed order."""
    directory = Path(directory)
    h = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        path = directory / name
        if path.is_file():
            found = True
            h.update(name.encode() + b"\0")
            h.update(sha256_hex(path.read_bytes()).encode())
    return h.hexdigest() if found else ""


class Tokenizer:
    def __init__(self, path: str | Path, cache_size: int = 4096, observer: EngineObserver = NOOP_OBSERVER):
        from transformers import AutoTokenizer

        self.path = Path(path)
        try:
            self.hf = AutoTokenizer.from_pretrained(str(path))
        except Exception as e:  # noqa: BLE001 - name the directory, keep the cause
            raise ValueError(f"{path}: cannot load a tokenizer ({type(e).__name__}: {e})") from e
        self.tokenizer_hash = hash_tokenizer_files(path)
        template = getattr(self.hf, "chat_template", None)
        if isinstance(template, dict):  # several named templates
            template = "\n".join(f"{k}\n{v}" for k, v in sorted(template.items()))
        self.chat_template = template
        self.chat_template_hash = sha256_hex(template.encode()) if template else ""
        self.observer = observer
        self.cache_size = cache_size
        self.cache_hits = 0
        self.cache_misses = 0
        self._cache: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()  # the async API encodes from the caller's thread
        # the Rust tokenizer decodes without transformers' per-call Python overhead
        backend = getattr(self.hf, "backend_tokenizer", None)
        cleanup = getattr(self.hf, "clean_up_tokenization_spaces", False)
        self._fast_decode = backend.decode if backend is not None and not cleanup else None

    # --- properties ------------------------------------------------------------

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    # --- text <-> tokens -------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (through the LRU cache)."""
        key = (text, add_special_tokens)
        with self._lock:
            ids = self._cache.get(key)
            if ids is not None:
                self._cache.move_to_end(key)
                self.cache_hits += 1
        hit = ids is not None
        if not hit:
            ids = tuple(self.hf.encode(text, add_special_tokens=add_special_tokens))
            with self._lock:
                self.cache_misses += 1
                if self.cache_size > 0:
                    self._cache[key] = ids
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        if self.observer.enabled:
            self.observer.on_tokenization(hit)
        return list(ids)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._fast_decode is not None:
            return self._fast_decode(token_ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True, **kwargs) -> list[int] | str:
        """Render `messages` with the model's chat template; token ids unless `tokenize=False`.

        The template writes its own special tokens (BOS ...), so none are added
        when encoding the rendered text.
        """
        if not self.chat_template:
            raise ValueError(f"the tokenizer in {self.path} has no chat template")
        try:
            text = self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                               tokenize=False, **kwargs)
        except Exception as e:  # noqa: BLE001 - a bad message list is the caller's error
            raise ValueError(f"cannot apply the chat template: {type(e).__name__}: {e}") from e
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def cache_info(self) -> dict:
        return {"hits": self.cache_hits, "misses": self.cache_misses, "size": len(self._cache),
                "capacity": self.cache_size}
