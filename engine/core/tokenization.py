"""The tokenizer as the engine sees it: transformers' AutoTokenizer plus identity and a cache.

The one tokenizer wrapper of the project: the engine serves with it, the diagnostics check a
replica's tokens with it, the dashboard shows token strings with it, so the same IDs decode to
the same text everywhere.

- `tokenizer_hash` / `chat_template_hash`: sha256 of the files that decide how
  text becomes tokens, and of the chat template - part of a replica's identity,
  so that "same model, different answers" can be traced to a tokenizer change.
- An LRU cache of encodings keyed by text (system prompts and agent loops
  repeat a lot), with hit / miss counts reported to the observer.
- `piece(id)`: how one token renders on its own (special tokens as their text, a byte-level
  piece of a multi-byte character as U+FFFD, an ID the tokenizer does not know as a marker);
  `decode` drops IDs the tokenizer does not know instead of failing on them.
- Loads from a model directory (only its tokenizer files are read, never the weights), a
  directory holding only tokenizer files, or a tokenizer.json file; `TokenizerLoadError` when
  none of these is there.
"""

from __future__ import annotations

import functools
import hashlib
import json
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
    """sha256 over the (name, content) of every tokenizer file present, in a fixed order
    (`directory` may also be one tokenizer.json file: then the hash of a directory holding only it)."""
    directory = Path(directory)
    if directory.is_file():
        directory, names = directory.parent, (directory.name,)
    else:
        names = TOKENIZER_FILES
    h = hashlib.sha256()
    found = False
    for name in names:
        path = directory / name
        if path.is_file():
            found = True
            h.update(name.encode() + b"\0")
            h.update(sha256_hex(path.read_bytes()).encode())
    return h.hexdigest() if found else ""


class TokenizerLoadError(ValueError):
    """A path holds no tokenizer that can be loaded (the message names the path and the cause)."""


def load_hf_tokenizer(path: str | Path):
    """transformers' tokenizer for a model directory, a tokenizer-only directory or a tokenizer.json
    file. Reads only the tokenizer files (and config.json, where the tokenizer class is named there)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(path)
    try:
        if path.is_file():  # a bare tokenizer.json: its vocabulary, added tokens, normalizer and decoder
            return PreTrainedTokenizerFast(tokenizer_file=str(path))
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - name the directory, keep the cause
        raise TokenizerLoadError(f"{path}: cannot load a tokenizer ({type(e).__name__}: {e})") from e


_JINJA_CHARS = "{}\n"


def load_chat_template(given: str) -> str:
    """`--chat-template` as vLLM takes it: a file's path (its text), else the template itself (text holding
    one of "{", "}" or a newline); a name that is neither is an error naming it."""
    try:
        return Path(given).read_text(encoding="utf-8")
    except OSError as e:
        if any(c in given for c in _JINJA_CHARS):
            return given
        raise ValueError(f"chat_template {given!r}: cannot read it as a file ({e.strerror or e}), and it is not "
                         "a template (no '{', '}' or newline)") from None


class Tokenizer:
    def __init__(self, path: str | Path, cache_size: int = 4096, observer: EngineObserver = NOOP_OBSERVER):
        self.path = Path(path)
        self.hf = load_hf_tokenizer(path)
        self.tokenizer_hash = hash_tokenizer_files(path)
        self.use_chat_template(getattr(self.hf, "chat_template", None))
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

    def use_chat_template(self, template: str | dict | None) -> None:
        """The chat template every chat is rendered with (the model directory's, or `--chat-template`'s)
        and its hash, part of the replica's identity."""
        if isinstance(template, dict):  # several named templates
            template = "\n".join(f"{k}\n{v}" for k, v in sorted(template.items()))
        elif template is not None:
            self.hf.chat_template = template
        self.chat_template = template
        self.chat_template_hash = sha256_hex(template.encode()) if template else ""

    # --- properties ------------------------------------------------------------

    @property
    def eos_token_id(self) -> int | None:
        return self.hf.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows (added tokens included): the IDs that have text."""
        return len(self.hf)

    @property
    def directory(self) -> str:
        return str(self.path)

    @property
    def model_vocab_size(self) -> int:
        """Rows of the model's embedding (config.json vocab_size): often padded past the tokenizer's
        size; the tokenizer's size where the directory has no config.json."""
        base = self.path.parent if self.path.is_file() else self.path
        try:
            config = json.loads((base / "config.json").read_text())
            return max(int(config.get("vocab_size") or 0), self.vocab_size)
        except (OSError, ValueError, TypeError, AttributeError):
            return self.vocab_size

    @property
    def special_ids(self) -> list[int]:
        return sorted(set(self.hf.all_special_ids))

    @functools.cached_property
    def _special_set(self) -> frozenset[int]:
        return frozenset(self.hf.all_special_ids)

    @property
    def post_processor_ids(self) -> list[int]:
        """Specials the tokenizer adds around any text by itself (a BOS, maybe an EOS)."""
        with_specials = self.hf.encode("x", add_special_tokens=True)
        plain = self.hf.encode("x", add_special_tokens=False)
        return sorted(set(with_specials) - set(plain))

    def in_vocab(self, token_id: int) -> bool:
        return 0 <= int(token_id) < self.vocab_size

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
        """The text of `token_ids`; IDs the tokenizer does not know (padding rows of the embedding,
        negative or corrupt values) add no text, as the Rust decoder treats unknown IDs."""
        try:
            return self._decode(token_ids, skip_special_tokens)
        except (OverflowError, TypeError, ValueError):  # off the hot path: ints of any kind, out of range
            ids = [int(i) for i in token_ids]
            return self._decode([i for i in ids if 0 <= i < self.vocab_size], skip_special_tokens)

    def _decode(self, token_ids, skip_special_tokens: bool) -> str:
        if self._fast_decode is not None:
            return self._fast_decode(token_ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def piece(self, token_id: int) -> str:
        """One token's text as it decodes on its own, special tokens shown (a byte-level piece of a
        multi-byte character decodes to U+FFFD); `<out of vocabulary: N>` for an ID without text."""
        token_id = int(token_id)
        if not self.in_vocab(token_id):
            return f"<out of vocabulary: {token_id}>"
        if token_id in self._special_set:
            return self.decode([token_id], skip_special_tokens=False)
        # decoded after an anchor token, then the anchor's text cut off: a SentencePiece (Metaspace)
        # decoder strips the leading space of a sequence's first token, so alone '▁[' and '[' would
        # both read '[' - the very difference a `legacy` or template incident is about
        anchor = self._anchor_id()
        if anchor is None:
            return self.decode([token_id], skip_special_tokens=False)
        head = self.decode([anchor], skip_special_tokens=False)
        both = self.decode([anchor, token_id], skip_special_tokens=False)
        return both[len(head):] if both.startswith(head) else self.decode([token_id], skip_special_tokens=False)

    def _anchor_id(self) -> int | None:
        """An ordinary token that decodes to itself ('a'), or None."""
        if not hasattr(self, "_anchor"):
            ids = self.hf.encode("a", add_special_tokens=False)
            self._anchor = ids[-1] if ids and ids[-1] not in self._special_set else None
        return self._anchor

    def pieces(self, token_ids) -> list[str]:
        return [self.piece(i) for i in token_ids]

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
