"""The model's sampling defaults, applied as vLLM applies them (its `--generation-config`).

A model directory's generation_config.json may carry sampling defaults: a request that leaves one
unset is served with the model's value, not the API's. vLLM 0.32 (vllm/config/model.py,
`get_diff_sampling_param`, and the OpenAI entry points' `to_sampling_params` / `get_max_tokens`):
- the parameters: repetition_penalty, presence_penalty, frequency_penalty, temperature, top_k,
  top_p, min_p, and max_new_tokens (Hugging Face's name for max_tokens); a value of null is unset,
  `do_sample` is not read (temperature 0 is what makes a request greedy);
- `generation_config = "auto"` (the default): the model directory's generation_config.json, or,
  without one, those keys of config.json (transformers' GenerationConfig.from_model_config);
  `"vllm"`: none, the API's own defaults; a directory: that directory's generation_config.json;
- a request's own value always wins; max_new_tokens fills max_tokens only where the request's is
  null (a completion's max_tokens defaults to 16 in the API, so only an explicit null lets it in; a
  chat's defaults to null), and never past the context; from a directory it is also a cap on every
  request (vLLM's override_max_tokens).

The values are part of the replica's identity (engine.core.engine_records: `generation.sampling_defaults`),
and each request's record holds the values it was served with (sampling_params_json).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

AUTO, VLLM = "auto", "vllm"
PARAMS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_k", "top_p", "min_p",
          "max_new_tokens")


@dataclass(frozen=True)
class GenerationDefaults:
    source: str = VLLM  # "auto" | "vllm" | the directory the values came from
    values: dict = field(default_factory=dict)  # SamplingParams field -> the model's default (max_tokens included)
    max_tokens_cap: int | None = None  # a directory source's max_new_tokens: no request gets more

    def unset(self, given: set[str] | frozenset[str]) -> dict:
        """The defaults of the sampling fields a request did not give (`given`: the fields it set)."""
        return {k: v for k, v in self.values.items() if k != "max_tokens" and k not in given}

    def max_tokens(self, requested: int | None, room: int | None) -> int | None:
        """The max_tokens a request is served with: its own, else the model's default, else the room left in the
        context; never past the room, nor past a directory's cap. `room` None: the context is not known (a
        recording proxy whose upstream did not say it), and None comes back where nothing bounds the request."""
        value = requested if requested is not None else self.values.get("max_tokens", room)
        bounds = [v for v in (value, room, self.max_tokens_cap) if v is not None]
        return min(bounds) if bounds else None

    def identity(self) -> dict:
        return {"source": self.source, "values": dict(sorted(self.values.items())),
                **({"max_tokens_cap": self.max_tokens_cap} if self.max_tokens_cap is not None else {})}


def _read(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the generation config ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: a generation config is a JSON object")
    return value


def _values(config: dict, where: str) -> dict:
    out = {}
    for name in PARAMS:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {name} must be a number, got {value!r}")
        if name == "max_new_tokens":
            out["max_tokens"] = int(value)
        elif name == "top_k":
            out["top_k"] = -1 if int(value) in (0, -1) else int(value)  # vLLM: 0 or -1 is off
        else:
            out[name] = float(value)
    return out


def generation_defaults(model_dir: str | Path, source: str = AUTO) -> GenerationDefaults:
    """The defaults for `model_dir` under `source` ("auto", "vllm" or a directory); ValueError naming the
    file and the value when they cannot be used."""
    if source == VLLM:
        return GenerationDefaults(VLLM)
    if source == AUTO:
        model_dir = Path(model_dir)
        config = _read(model_dir / "generation_config.json")
        where = model_dir / "generation_config.json"
        if config is None:  # transformers' GenerationConfig.from_model_config: the model config's own keys
            config, where = _read(model_dir / "config.json") or {}, model_dir / "config.json"
        return _checked(GenerationDefaults(AUTO, _values(config, str(where))), where)
    directory = Path(source)
    if not directory.is_dir():
        raise ValueError(f"generation_config {source!r}: expected 'auto', 'vllm' or a directory holding "
                         f"generation_config.json")
    where = directory / "generation_config.json"
    values = _values(_read(where) or {}, str(where))
    return _checked(GenerationDefaults(str(directory), values, values.get("max_tokens")), where)


def _checked(defaults: GenerationDefaults, where) -> GenerationDefaults:
    """The values as one request's parameters, checked now: a bad default is a start-up error naming the file,
    not every request's 400."""
    from engine.core.sampling_params import SamplingParams

    try:
        SamplingParams(**defaults.values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: the sampling defaults cannot be used ({e}); serve with generation_config "
                         f"'vllm' to ignore them") from None
    return defaults
