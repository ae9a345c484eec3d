"""Test models with real tokenizers: the files mistral-common ships, converted to Hugging Face format.

The reference model's small BPE shows none of the real tokenizer incidents (SentencePiece's space
after special tokens, byte-level BPE regexes, whole-word lookups). mistral-common ships real
tokenizer files as package data; these builders convert two of them and save a random-weight Llama
beside each, as a model directory the engine serves:

- `build_sentencepiece_model`: `tokenizer.model.v1` (Mistral 7B v0.1, Llama-2 style SentencePiece
  BPE, 32000 pieces, byte fallback), converted by transformers' LlamaTokenizer, with Mistral 7B
  Instruct v0.1's `[INST]` chat template; tokenizer_class LlamaTokenizer, so the `legacy` flag in
  tokenizer_config.json decides the space after special tokens, as on the hub;
- `build_tekken_model`: `tekken_240911.json` (Mistral NeMo, tiktoken-style byte-level BPE, 1000
  special tokens), its first 32768 tokens (TEKKEN_VOCAB_SIZE: NeMo itself serves 131072 of the
  file's 150000, the same truncation), converted by transformers' MistralConverter (Split regex
  pre-tokenizer, ignore_merges), with a V3-Tekken `[INST]` template; tokenizer_class
  PreTrainedTokenizerFast, so tokenizer.json is loaded as it is.

Under transformers 5 a LlamaTokenizer-class directory rebuilds its normalizer, pre-tokenizer and BPE
options from tokenizer_config.json (legacy, add_prefix_space) and ignores tokenizer.json's; every
class ignores add_bos_token / add_eos_token when tokenizer.json has a post-processor. So the
tokenizer.json incidents (normalizer, regex, ignore_merges) are made on the Tekken model.

The weights are random (tiny dims, tied embeddings: about 1M parameters each): prompt tokenization
does not depend on them.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

SENTENCEPIECE_FILE = "tokenizer.model.v1"
TEKKEN_FILE = "tekken_240911.json"
TEKKEN_SOURCE = "tekken.source.json"  # beside the model, not in it: transformers would load a tekken.json there
# NeMo uses the first 131072 of the file's 150000 tokens; 32768 of them load in 0.3 s instead of 1.7 s
TEKKEN_VOCAB_SIZE = 32768

# Mistral-7B-Instruct-v0.1's template as published (transformers renders with trim_blocks / lstrip_blocks)
INST_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# V3-Tekken: [INST] and [/INST] are special tokens, no spaces around them
TEKKEN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST]' + message['content'] + '[/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def data_file(name: str) -> Path:
    """A tokenizer file from mistral-common's package data (found without importing the package)."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("mistral-common is not installed (a test dependency: pip install -e '.[dev]')")
    path = Path(spec.origin).parent / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in this mistral-common release")
    return path


def _write_config(out_dir: Path, config: dict) -> None:
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def convert_sentencepiece(out_dir: Path, legacy: bool = True, add_bos_token: bool = True,
                          chat_template: str = INST_TEMPLATE):
    """tokenizer.json + tokenizer_config.json from the SentencePiece model, as transformers converts it;
    returns the converted tokenizers.Tokenizer."""
    from transformers import LlamaTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(data_file(SENTENCEPIECE_FILE), Path(tmp) / "tokenizer.model")
        tok = LlamaTokenizer.from_pretrained(tmp, legacy=legacy, add_bos_token=add_bos_token, add_eos_token=False)
    tok.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    # as a hub repo of this tokenizer writes it: the class, the flags, the template. legacy=True encodes
    # '<s>[INST]' as mistral-common does ('<s>', '▁[', ...); the flag decides it under transformers 5
    _write_config(out_dir, {"tokenizer_class": "LlamaTokenizer", "legacy": legacy, "add_bos_token": add_bos_token,
                            "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                            "clean_up_tokenization_spaces": False, "model_max_length": 32768,
                            "chat_template": chat_template})
    return tok.backend_tokenizer


def tekken_source(dst: Path, vocab_size: int = TEKKEN_VOCAB_SIZE) -> Path:
    """The Tekken file as the builders read it: its first `vocab_size` tokens (the truncation
    mistral-common's Tekkenizer applies through config.default_vocab_size; every token kept keeps its
    ID), in the newer layout with a "special_tokens" list (mistral-common's own list for files without
    one), so that transformers' converter needs no particular mistral-common version."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    raw = json.loads(data_file(TEKKEN_FILE).read_text())
    specials = raw["config"]["default_num_special_tokens"]
    raw["config"]["default_vocab_size"] = vocab_size
    raw["vocab"] = raw["vocab"][:vocab_size - specials]
    raw["config"]["num_vocab_tokens"] = len(raw["vocab"])
    if "special_tokens" not in raw:
        raw["special_tokens"] = [{"rank": s["rank"], "token_str": str(getattr(s["token_str"], "value", s["token_str"])),
                                  "is_control": s["is_control"]} for s in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    raw.pop("image", None)
    dst.write_text(json.dumps(raw))
    return dst


def convert_tekken(out_dir: Path, source: Path, chat_template: str = TEKKEN_TEMPLATE):
    """tokenizer.json + tokenizer_config.json from a Tekken file (tekken_source), as transformers'
    MistralConverter makes them (plus a BOS post-processor); returns the converted tokenizers.Tokenizer."""
    from tokenizers import processors
    from transformers.integrations.mistral.tokenizer import MistralConverter

    out_dir.mkdir(parents=True, exist_ok=True)
    backend = MistralConverter(str(source)).converted()
    bos = backend.token_to_id("<s>")
    # a BOS before any text prompt, as Mistral NeMo's tokenizer.json on the hub; chat templates write their own
    backend.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])])
    backend.save(str(out_dir / "tokenizer.json"))
    _write_config(out_dir, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                            "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
                            "model_max_length": 131072, "chat_template": chat_template})
    return backend


def llama_config(vocab_size: int, bos_id: int, eos_id: int, hidden_size: int = 32, num_layers: int = 2) -> dict:
    """config.json of a tiny Llama, as transformers' LlamaConfig writes it (tied embeddings: the
    32000 x 32 embedding is most of its ~1M parameters)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": bos_id, "eos_token_id": eos_id, "dtype": "float32",
            "head_dim": hidden_size // 4, "hidden_act": "silu", "hidden_size": hidden_size,
            "initializer_range": 0.02, "intermediate_size": 2 * hidden_size, "max_position_embeddings": 4096,
            "mlp_bias": False, "num_attention_heads": 4, "num_hidden_layers": num_layers, "num_key_value_heads": 2,
            "pad_token_id": None, "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": True,
            "use_cache": True, "vocab_size": vocab_size}


def random_llama_weights(config: dict, seed: int = 0) -> dict:
    """Checkpoint tensors under transformers' Llama names (no lm_head: tied); weights ~N(0, 0.08) so
    logits are far from uniform, as engine.core.tiny_model makes them. Written directly: importing
    transformers' modeling code costs seconds a test session need not spend."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, inter, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.08

    out = {"model.embed_tokens.weight": rand(config["vocab_size"], h), "model.norm.weight": torch.ones(h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
                p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
                p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
                p + "mlp.down_proj.weight": rand(h, inter), p + "input_layernorm.weight": torch.ones(h),
                p + "post_attention_layernorm.weight": torch.ones(h)}
    return out


def build_model(out_dir: Path, tokenizer_dir: Path, backend, seed: int = 0) -> Path:
    """A random-weight Llama sized to the tokenizer (`backend`, the tokenizers.Tokenizer converted into
    `tokenizer_dir`), saved beside that tokenizer's files as they are."""
    from safetensors.torch import save_file

    bos, eos = backend.token_to_id("<s>"), backend.token_to_id("</s>")
    config = llama_config(backend.get_vocab_size(with_added_tokens=True), bos, eos)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    save_file(random_llama_weights(config, seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for p in tokenizer_dir.iterdir():
        shutil.copy(p, out_dir / p.name)
    gen = {"bos_token_id": bos, "eos_token_id": [eos]}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out_dir


def build_sentencepiece_model(root: Path) -> Path:
    return build_model(root / "mistral-v1", root / "tok-mistral-v1", convert_sentencepiece(root / "tok-mistral-v1"))


def build_tekken_model(root: Path, vocab_size: int = TEKKEN_VOCAB_SIZE) -> Path:
    """The Tekken model; its source file (for mistral-common's own Tekkenizer) is `tekken_source_of(model)`."""
    root.mkdir(parents=True, exist_ok=True)
    source = tekken_source(root / TEKKEN_SOURCE, vocab_size)
    return build_model(root / "mistral-tekken", root / "tok-tekken", convert_tekken(root / "tok-tekken", source))


def tekken_source_of(model_dir: Path) -> Path:
    return model_dir.parent / TEKKEN_SOURCE
