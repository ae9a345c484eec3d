"""A prompt as the engine runs it: its token IDs, and what the request came as.

Every request becomes one `Prompt`, once, where it is admitted: the HTTP server's admission
(engine/serving/server/admission.py) for API requests, the engine's own `prepare_prompt` for the
offline and async APIs. Text is tokenized there, once, through the engine's tokenization cache;
the engine takes a `Prompt` as it is and never encodes it again.

    text_prompt(tokenizer, text)               a completion's prompt text
    chat_prompt(tokenizer, messages, ...)      chat messages, rendered by the chat template, then encoded
    ids_prompt(ids)                            token IDs as the client gave them

A `Prompt` carries what telemetry records of it (telemetry/contract/records.py says exactly what
each hash is of): the text the tokenizer encoded (a completion's text, a chat's rendered prompt),
`text_hash` (the request's `prompt_text_hash`: of the completion's text, of the chat's canonical
messages JSON) and, for chat, `rendered_hash` (of the rendered prompt text).

Its token IDs are in the vocabulary: the tokenizer made them, or whoever made an `ids_prompt`
checked them first (`invalid_token_ids`, the one vocabulary check: admission with the API's
error, `LLMEngine.prepare_prompt` with the engine's).
"""

from __future__ import annotations

from dataclasses import dataclass

from telemetry.contract.records import chat_messages_hash, text_sha256

TEXT, CHAT, TOKEN_IDS = "text", "chat", "token_ids"


@dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    kind: str = TOKEN_IDS  # "text" | "chat" | "token_ids": what the request came as
    text: str | None = None  # the text the tokenizer encoded; None for token IDs
    text_hash: str = ""  # RequestRecord.prompt_text_hash
    rendered_hash: str = ""  # RequestRecord.rendered_prompt_hash (chat only)

    def __len__(self) -> int:
        return len(self.token_ids)


def text_prompt(tokenizer, text: str) -> Prompt:
    """A completion's prompt: `text` encoded once (special tokens added, as for any text prompt)."""
    return Prompt(tokenizer.encode(text), TEXT, text, text_sha256(text))


def chat_prompt(tokenizer, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> Prompt:
    """A chat request: the messages rendered by the chat template, the rendered text encoded once
    (no special tokens added: the template writes its own). ValueError when the template refuses."""
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **template_kwargs)
    return Prompt(tokenizer.encode(rendered, add_special_tokens=False), CHAT, rendered,
                  chat_messages_hash(messages, add_generation_prompt), text_sha256(rendered))


def is_token_ids(ids) -> bool:
    return isinstance(ids, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)


def invalid_token_ids(ids: list[int], vocab_size: int) -> list[int]:
    """The IDs of `ids` outside [0, vocab_size) (the vocabulary check, wherever a prompt is admitted)."""
    if not ids or (0 <= min(ids) and max(ids) < vocab_size):
        return []
    return [t for t in ids if not 0 <= t < vocab_size]


def ids_prompt(ids) -> Prompt:
    """Token IDs as given (checked by the caller: `is_token_ids`, `invalid_token_ids`)."""
    return Prompt(list(ids))
