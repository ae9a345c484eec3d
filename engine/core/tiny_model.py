"""Small random-weight models of real architectures, with a real trained tokenizer.

Tests and benchmarks need models of several architectures and sizes, and the
hubs are out of reach. This builds one with transformers' own model
classes, so the checkpoint is exactly what `save_pretrained` writes, and trains
a small byte-level BPE tokenizer with `tokenizers` for it.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, "<|user|>", "<|assistant|>", "<|system|>"]

# role markers are special tokens; a prompt ends with the assistant marker when asked to generate
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Inference engineers run replicas of large language models.",
    "What is 12 + 35? The answer is 47.",
    "Reverse the string: hello -> olleh",
    "Sort the numbers 5 3 9 1 -> 1 3 5 9",
    "The key alpha maps to the value 42. What is alpha? 42",
    "Latency doubled on Tuesday because the KV cache was full.",
    "Unicode: café, naïve, 日本語, emoji 🚀 and math ∑ x² ≤ 10.",
    "def add(a, b):\n    return a + b\n",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000",
]


def build_bpe_tokenizer(out_dir: str | Path, texts: list[str] | None = None, vocab_size: int = 512,
                        chat_template: str = CHAT_TEMPLATE, model_max_length: int = 2048):
    """Train a byte-level BPE tokenizer and save it in Hugging Face format.

    Returns the `PreTrainedTokenizerFast`. Byte-level means every string
    round-trips; specials are BOS / EOS / PAD plus chat-role markers.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = texts or _CORPUS * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # a BOS is added when encoding with special tokens (like Llama); the chat template adds its own
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
        additional_special_tokens=SPECIAL_TOKENS[3:], model_max_length=model_max_length,
    )
    fast.chat_template = chat_template
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


ARCHITECTURES = ("llama", "qwen2", "qwen3")


def build_random_model(out_dir: str | Path, arch: str = "llama", *, hidden_size: int = 64,
                       num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                       intermediate_size: int = 128, vocab_size: int = 512,
                       max_position_embeddings: int = 2048, tie_word_embeddings: bool = False,
                       rope_scaling: dict | None = None, seed: int = 0, dtype: str = "float32",
                       max_shard_size: str | None = None, tokenizer_dir: str | Path | None = None) -> Path:
    """Save a random-weight `arch` model plus tokenizer to `out_dir`; return the path.

    `rope_scaling` e.g. {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 256}.
    `max_shard_size` (e.g. "50KB") forces several safetensors shards plus an index.
    `tokenizer_dir` reuses an existing tokenizer instead of training one.
    """
    import torch
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose from {ARCHITECTURES}")
    out_dir = Path(out_dir)
    if tokenizer_dir is not None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
        tokenizer.save_pretrained(out_dir)
    else:
        tokenizer = build_bpe_tokenizer(out_dir, vocab_size=vocab_size)
    vocab_size = max(vocab_size, len(tokenizer))

    common = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rms_norm_eps=1e-6,
    )
    if arch == "llama":
        config = transformers.LlamaConfig(**common)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**common)
    else:
        config = transformers.Qwen3Config(head_dim=hidden_size // num_heads, **common)
    if rope_scaling is not None:
        # transformers 5 keeps rope settings in `rope_parameters` (with rope_theta inside)
        params = dict(getattr(config, "rope_parameters", None) or {"rope_theta": 10000.0})
        params.update(rope_scaling)
        config.rope_parameters = params
    torch.manual_seed(seed)
    model_cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[arch]
    model = model_cls(config)
    with torch.no_grad():  # random weights large enough that logits are far from uniform
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model = model.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, safe_serialization=True, **kwargs)
    gen = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": [tokenizer.eos_token_id]}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return out_dir
