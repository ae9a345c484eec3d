"""What the dashboard process is pointed at: the store and the tokenizers.

`infersight dashboard` passes these to the Streamlit process in environment variables
(Streamlit owns the command line of its script); tests set them the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

STORE_ENV = "INFERSIGHT_DASHBOARD_STORE"
TOKENIZERS_ENV = "INFERSIGHT_DASHBOARD_TOKENIZERS"  # JSON {model_name or "*": tokenizer dir}


@dataclass(frozen=True)
class Settings:
    store: str = ""
    tokenizers: dict[str, str] = field(default_factory=dict)

    def tokenizer_dir(self, model_name: str) -> str | None:
        return self.tokenizers.get(model_name) or self.tokenizers.get("*")


def from_env(environ=os.environ) -> Settings:
    raw = environ.get(TOKENIZERS_ENV, "").strip()
    try:
        tokenizers = json.loads(raw) if raw else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{TOKENIZERS_ENV} is not JSON ({e}): {raw!r}") from None
    if not isinstance(tokenizers, dict):
        raise ValueError(f"{TOKENIZERS_ENV} must be a JSON object of model name -> tokenizer dir")
    return Settings(store=environ.get(STORE_ENV, "").strip(), tokenizers={str(k): str(v) for k, v in tokenizers.items()})


def to_env(settings: Settings) -> dict[str, str]:
    return {STORE_ENV: settings.store, TOKENIZERS_ENV: json.dumps(settings.tokenizers)}
