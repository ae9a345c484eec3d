"""A minimal Hugging Face Llama -> GGUF converter (f32 or q8_0), for the llama.cpp peer.

llama.cpp's own convert_hf_to_gguf.py is not on PyPI; this writes what it writes for a plain Llama:
the `llama.*` hyper-parameters, the byte-level BPE tokenizer as `tokenizer.ggml.*` metadata (tokens,
merges, types; padded with unused tokens up to the model's vocab_size), and the tensors under
llama.cpp's names (blk.N.attn_q.weight, ...). Two transformations, as upstream:
  - q and k projections are permuted from transformers' rotate-half rope layout to llama.cpp's
    interleaved one (`permute`; `unpermute` is its inverse, for the round-trip test);
  - in q8_0, 2-D weights are quantized in blocks of 32 (gguf.quants.quantize); norms stay f32.
A tied model (tie_word_embeddings) gets no output.weight: llama.cpp then reuses token_embd.
Imports numpy, safetensors and gguf only (it runs in the peer's interpreter).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAMES = {  # transformers suffix -> llama.cpp name, per layer
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_hf_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return {k: v.astype(np.float32) for k, v in tensors.items()}


def gguf_name(hf_name: str) -> str | None:
    if hf_name in GLOBAL:
        return GLOBAL[hf_name]
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"]:
        return f"blk.{parts[2]}." + NAMES[".".join(parts[3:])]
    return None  # rotary inv_freq buffers and the like


def gguf_tensors(model_dir: Path, cfg: dict) -> dict[str, np.ndarray]:
    """The float tensors under their GGUF names, q/k already permuted."""
    out = {}
    for hf_name, w in load_hf_tensors(model_dir).items():
        name = gguf_name(hf_name)
        if name is None or (name == "output.weight" and cfg.get("tie_word_embeddings")):
            continue
        if name.endswith("attn_q.weight"):
            w = permute(w, cfg["num_attention_heads"])
        elif name.endswith("attn_k.weight"):
            w = permute(w, cfg["num_key_value_heads"])
        out[name] = np.ascontiguousarray(w)
    return out


def _tokenizer(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    special = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
    tokens, types = [], []
    for i in range(vocab_size):  # 1 normal, 3 control, 5 unused (padding up to the embedding rows)
        if i in by_id:
            tokens.append(by_id[i])
            types.append(3 if i in special else 1)
        else:
            tokens.append(f"<|unused_{i}|>")
            types.append(5)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    return tokens, types, merges


def convert(model_dir: str | Path, out_path: str | Path, qtype: str = "f32") -> Path:
    import gguf

    model_dir, out_path = Path(model_dir), Path(out_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(f"only Llama is supported, not {cfg.get('model_type')!r}")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(str(out_path), "llama")
    w.add_name(model_dir.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "q8_0" else gguf.LlamaFileType.ALL_F32)

    tokens, types, merges = _tokenizer(model_dir, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("pad_token_id", w.add_pad_token_id)):
        if isinstance(cfg.get(key), int):
            add(cfg[key])
    w.add_add_bos_token(False)

    for name, t in gguf_tensors(model_dir, cfg).items():
        if qtype == "q8_0" and t.ndim == 2 and t.shape[1] % 32 == 0:
            w.add_tensor(name, gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
