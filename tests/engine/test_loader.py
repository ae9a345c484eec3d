"""Loading a Hugging Face directory: shards, hashes, eos ids, and clear errors for broken checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.core.models import ModelLoadError, allocate_kv_cache, kv_bytes_per_block, load_model


@pytest.fixture
def model_copy(tiny_llama, tmp_path) -> Path:
    """A private copy of the tiny Llama, free to break."""
    return Path(shutil.copytree(tiny_llama, tmp_path / "broken-llama"))


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_attributes_describe_the_model(tiny_llama):
    loaded = load_model(tiny_llama)
    cfg = json.loads((tiny_llama / "config.json").read_text())
    assert loaded.architecture == "LlamaForCausalLM"
    assert loaded.model_name == tiny_llama.name
    assert (loaded.num_layers, loaded.num_heads, loaded.num_kv_heads, loaded.head_dim) == (2, 4, 2, 16)
    assert loaded.hidden_size == cfg["hidden_size"] and loaded.vocab_size == cfg["vocab_size"]
    assert loaded.max_model_len == cfg["max_position_embeddings"]
    assert loaded.eos_token_ids == [cfg["eos_token_id"]] and loaded.bos_token_id == cfg["bos_token_id"]
    assert loaded.hf_config == cfg
    assert loaded.dtype == torch.float32 and loaded.device == torch.device("cpu")
    assert len(loaded.weights_hash) == 64
    # projections are plain nn.Linear with Hugging Face names (quantization swaps them)
    names = dict(loaded.model.named_modules())
    for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        assert type(names[f"model.layers.1.{proj}"]) is torch.nn.Linear
    assert type(names["lm_head"]) is torch.nn.Linear
    assert not any(p.requires_grad for p in loaded.model.parameters())


def test_weights_equal_the_checkpoint(tiny_llama):
    loaded = load_model(tiny_llama)
    state = load_file(tiny_llama / "model.safetensors")
    ours = loaded.model.state_dict()
    assert set(state) == set(ours)
    for name, tensor in state.items():
        assert torch.equal(ours[name], tensor), name


def test_multi_shard_checkpoint_loads_identically(tiny_model_factory, tiny_llama):
    sharded = tiny_model_factory("llama", max_shard_size="50KB", tokenizer_dir=tiny_llama)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    one, many = load_model(tiny_llama), load_model(sharded)
    for (name, a), (_, b) in zip(one.model.state_dict().items(), many.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert one.weights_hash == many.weights_hash  # the hash does not depend on sharding


def test_weights_hash_changes_with_any_weight(model_copy, tiny_llama):
    state = load_file(model_copy / "model.safetensors")
    state["model.layers.1.mlp.up_proj.weight"][3, 5] += 1e-3
    save_file(state, model_copy / "model.safetensors", metadata={"format": "pt"})
    assert load_model(model_copy).weights_hash != load_model(tiny_llama).weights_hash


def test_tied_embeddings_share_storage(tiny_model_factory, tiny_llama):
    path = tiny_model_factory("llama", tie_word_embeddings=True, tokenizer_dir=tiny_llama)
    assert "lm_head.weight" not in load_file(path / "model.safetensors")
    loaded = load_model(path)
    assert loaded.model.lm_head.weight.data_ptr() == loaded.model.model.embed_tokens.weight.data_ptr()


def test_generation_config_eos_list_is_honoured(model_copy):
    edit_json(model_copy / "generation_config.json", eos_token_id=[1, 7, 1])
    assert load_model(model_copy).eos_token_ids == [1, 7]
    (model_copy / "generation_config.json").unlink()
    edit_json(model_copy / "config.json", eos_token_id=[4, 5])
    assert load_model(model_copy).eos_token_ids == [4, 5]


def test_bfloat16_parameters_and_cache(tiny_llama):
    loaded = load_model(tiny_llama, dtype="bfloat16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    kv = allocate_kv_cache(loaded, num_blocks=3, block_size=8)
    assert len(kv) == loaded.num_layers
    assert kv[0][0].shape == (3, 8, loaded.num_kv_heads, loaded.head_dim) and kv[0][1].dtype == torch.bfloat16
    per_block = kv_bytes_per_block(loaded, 8)
    assert per_block == sum(k.nbytes + v.nbytes for k, v in kv) // 3
    assert kv_bytes_per_block(load_model(tiny_llama), 8) == 2 * per_block


def test_unknown_dtype_is_rejected(tiny_llama):
    with pytest.raises(ValueError, match="int3"):
        load_model(tiny_llama, dtype="int3")


def test_unsupported_architecture(model_copy):
    edit_json(model_copy / "config.json", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelLoadError, match=r"config\.json.*GPT2LMHeadModel"):
        load_model(model_copy)


def test_unsupported_rope_type(model_copy):
    edit_json(model_copy / "config.json", rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    with pytest.raises(ModelLoadError, match=r"config\.json.*yarn"):
        load_model(model_copy)


def test_missing_config(model_copy):
    (model_copy / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json: file not found"):
        load_model(model_copy)


def test_missing_shard_names_file_and_tensor(tiny_model_factory, tiny_llama, tmp_path):
    sharded = Path(shutil.copytree(tiny_model_factory("llama", max_shard_size="50KB", tokenizer_dir=tiny_llama),
                                   tmp_path / "sharded"))
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    name, shard = sorted(index["weight_map"].items())[-1]
    (sharded / shard).unlink()
    with pytest.raises(ModelLoadError) as err:
        load_model(sharded)
    assert shard in str(err.value) and "shard missing" in str(err.value) and "'" in str(err.value)


def test_missing_tensor_is_named(model_copy):
    state = load_file(model_copy / "model.safetensors")
    del state["model.layers.1.self_attn.k_proj.weight"]
    save_file(state, model_copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"lacks tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(model_copy)


def test_unexpected_tensor_is_named(model_copy):
    state = load_file(model_copy / "model.safetensors")
    state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(16)
    save_file(state, model_copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: unexpected tensor 'model\.layers\.0\.self_attn\.q_norm"):
        load_model(model_copy)


def test_shape_mismatch_names_file_and_tensor(model_copy):
    edit_json(model_copy / "config.json", intermediate_size=96)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.down_proj"
                                             r"\.weight' has shape \(64, 128\).*expects \(64, 96\)"):
        load_model(model_copy)


def test_corrupt_safetensors(model_copy):
    (model_copy / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: cannot read safetensors"):
        load_model(model_copy)


def test_no_weights(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(model_copy)


def test_older_rope_keys_load_like_rope_parameters(tiny_model_factory, tiny_llama, tmp_path):
    """Configs written before transformers 5 keep rope_theta and rope_scaling at the top level."""
    from engine.core.attention import get_backend
    from engine.core.attention.simple_batch import SimplePagedBatcher

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    new = tiny_model_factory("llama", rope_scaling=scaling, tokenizer_dir=tiny_llama)
    old = Path(shutil.copytree(new, tmp_path / "old-style"))
    cfg = json.loads((old / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = {"type" if k == "rope_type" else k: v for k, v in params.items()}
    (old / "config.json").write_text(json.dumps(cfg))

    def logits(path):
        loaded = load_model(path)
        kv = allocate_kv_cache(loaded, 8, 16)
        ids, pos, md = SimplePagedBatcher(8, 16).step([(0, list(range(3, 60)))])
        with torch.inference_mode():
            return loaded.model.compute_logits(loaded.model(ids, pos, md, kv, get_backend("torch")))

    default = tiny_llama
    assert torch.equal(logits(new), logits(old))
    assert not torch.allclose(logits(new), logits(default), atol=1e-3)  # the scaling did change something


def test_index_naming_a_tensor_its_shard_lacks(tiny_model_factory, tiny_llama, tmp_path):
    sharded = Path(shutil.copytree(tiny_model_factory("llama", max_shard_size="50KB", tokenizer_dir=tiny_llama),
                                   tmp_path / "sharded"))
    index_path = sharded / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = "model.norm.weight"
    wrong = next(s for s in shards if s != index["weight_map"][name])
    index["weight_map"][name] = wrong
    index_path.write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=rf"{wrong}: tensor 'model\.norm\.weight' listed in"):
        load_model(sharded)
