"""One forward for the Llama family: Llama, Qwen2 (qkv bias), Qwen3 (per-head q/k RMSNorm).

Module names match the Hugging Face state dict (model.layers.N.self_attn.q_proj, ...),
so weights load name for name and projections are plain `nn.Linear` modules that
quantization can swap. The batch is flat: T tokens of all sequences end to end;
the attention backend handles where each sequence's keys live in the paged cache.

At small batch a step is all per-op host cost, so a layer runs few ops: after loading,
q/k/v and gate/up are one matmul each over concatenated weights (`FusedLinear`; the
modules keep their names and views of those weights; int8 projections fuse into one
int8 matmul, other quantized modules fall back to one call each), q and k are rotated together, RMSNorm is `F.rms_norm`, and our own
modules are called through `.forward` (no hook dispatch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.attention.base import AttentionBackend, AttentionMetadata
from engine.core.models.gemv import linear, project
from engine.core.models.model_config import ModelConfig
from engine.core.models.packed_linear import PackedLinear, PackedMatmul, can_pack, pack_linear
from engine.core.models.rope import RotaryEmbedding, apply_rotary
from engine.core.quantization.int8 import Int8Linear, Int8Matmul


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalize in float32 and scale after casting back, exactly as transformers does.
        # F.rms_norm is one op instead of seven and bit-identical in float32 (checked); for
        # half types the weight must multiply after the cast, as transformers does
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


class FusedLinear:
    """Several nn.Linear on the same input as one matmul over their concatenated weights.

    `fuse()` (after loading) concatenates the weights and re-points each module's weight at
    its slice of the result, so the state dict, the module names and the memory stay as
    they were. Int8Linear modules (after `quantize_model`, which fuses again) fuse the same way
    into one int8 matmul. Calling returns the concatenated output, or None when the owner's
    modules are no longer those modules viewing that storage (quantization swapped them,
    `.to()` moved them): the caller then runs them one by one, and the fused tensor is dropped.
    Saves 2 of 3 projection calls per attention and 1 of 2 per MLP.
    `pack()` (EngineConfig.pack_weights) lets products of many rows take oneDNN's packed weight
    (models/packed_linear.py); a later `fuse()` drops it.
    Not an nn.Module on purpose: quantization must not see (and swap) it.
    """

    def __init__(self, owner: nn.Module, *names: str):
        self.owner, self.names = owner, names
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._int8: Int8Matmul | None = None  # the fused kernel when the modules are Int8Linear
        self._packed: PackedMatmul | None = None  # many rows, float32: oneDNN's packed weight (`pack`)
        self._expected: list[tuple[nn.Module, int]] = []  # (module, weight data_ptr) at fuse time

    def fuse(self) -> None:
        mods = [getattr(self.owner, n) for n in self.names]
        self.weight = self.bias = self._int8 = self._packed = None
        self._expected = []
        if all(type(m) is Int8Linear and not m.exact for m in mods):
            return self._fuse_int8(mods)
        if not all(type(m) is nn.Linear for m in mods) or mods[0].weight.device.type == "meta":
            return
        if len({m.bias is None for m in mods}) != 1:
            return
        sizes = [m.out_features for m in mods]
        with torch.no_grad():
            weight = torch.cat([m.weight for m in mods])
            bias = torch.cat([m.bias for m in mods]) if mods[0].bias is not None else None
            for i, m in enumerate(mods):
                m.weight = nn.Parameter(weight.split(sizes)[i], requires_grad=False)
                if bias is not None:
                    m.bias = nn.Parameter(bias.split(sizes)[i], requires_grad=False)
        self.weight, self.bias = weight, bias
        self._expected = [(m, m.weight.data_ptr()) for m in mods]

    def _fuse_int8(self, mods: list[Int8Linear]) -> None:
        """Quantized projections: one int8 matmul over the concatenated int8 rows and their scales
        (one activation rounding instead of three; the 135M model at batch 1: -2 kernel calls a layer)."""
        if len({m.bias is None for m in mods}) != 1:
            return
        sizes = [m.out_features for m in mods]
        q = torch.cat([m.qweight for m in mods])
        scale = torch.cat([m.scale for m in mods])
        bias = torch.cat([m.bias for m in mods]) if mods[0].bias is not None else None
        for i, m in enumerate(mods):  # views: an in-place write reaches the fused copy (and re-packs it)
            m.qweight, m.scale = q.split(sizes)[i], scale.split(sizes)[i]
            if bias is not None:
                m.bias = bias.split(sizes)[i]
        self._int8 = Int8Matmul(q, scale, bias)
        self._expected = [(m, m.qweight.data_ptr()) for m in mods]

    def pack(self) -> PackedMatmul | None:
        """Products of many rows through the packed weight, where that pays; its matmul, or None."""
        if self.weight is None or not can_pack(self.weight):
            return None
        self._packed = PackedMatmul(self.weight, self.bias)
        return self._packed

    def drop_plain(self) -> bool:
        """The packed copy serves every row count (models/packed_linear.py `choose_min_rows`): free the fused
        plain weight; the modules' weights become meta views of its shape. Whether there was one to free."""
        if self._packed is None or self._packed.packed_only:
            return False
        self.weight = self._packed.drop_plain()
        mods = [getattr(self.owner, n) for n in self.names]
        for m, part in zip(mods, self.weight.split([m.out_features for m in mods])):
            m.weight = nn.Parameter(part, requires_grad=False)
        return True

    def _stale(self) -> bool:
        # straight through the modules' dicts: nn.Module.__getattr__ costs ~0.5 us a lookup, 6 a
        # call (a loop here was ~3% of a batch-1 step)
        mods = self.owner._modules
        if torch.compiler.is_compiling():  # data_ptr() would break a compiled graph
            return any(mods[n] is not m for n, (m, _) in zip(self.names, self._expected))
        tensors, name = ("_buffers", "qweight") if self._int8 is not None else ("_parameters", "weight")
        for n, (m, ptr) in zip(self.names, self._expected):
            if mods[n] is not m:
                return True
            w = getattr(m, tensors).get(name)
            if w is None or w.data_ptr() != ptr:
                return True
        return False

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        if self._packed is not None and self._packed.packed_only:  # the packed copy is the weight (`drop_plain`)
            return self._packed(x)
        if self.weight is None and self._int8 is None:
            return None
        if self._stale():
            self.weight = self.bias = self._int8 = self._packed = None  # stale: free it, run the modules now
            self._expected = []
            return None
        if self._int8 is not None:
            return self._int8(x)
        if self._packed is not None and x.shape[0] > 1:
            return self._packed(x)
        return linear(x, self.weight, self.bias)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

        self._qkv = FusedLinear(self, "q_proj", "k_proj", "v_proj")

    def forward(self, x, cos, sin, kv_cache, metadata, backend):
        t, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self._qkv(x)
        if qkv is not None and self.q_norm is None:
            # one projection and one rotary for q and k together: the rotary's 8 ops run once
            # per layer instead of twice
            qkv = qkv.view(t, h + 2 * kvh, d)
            qk = apply_rotary(qkv[:, :h + kvh], cos, sin)
            q, k, v = qk[:, :h], qk[:, h:], qkv[:, h + kvh:]
        else:
            if qkv is not None:
                q, k, v = qkv.split((h * d, kvh * d, kvh * d), dim=-1)
            else:  # swapped (quantized) projections: one call each
                q, k, v = project(self.q_proj, x), project(self.k_proj, x), project(self.v_proj, x)
            q, k, v = q.reshape(t, h, d), k.reshape(t, kvh, d), v.reshape(t, kvh, d)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = backend.forward(q, k, v, kv_cache[0], kv_cache[1], metadata, self.scale)
        return project(self.o_proj, o.reshape(t, h * d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self._gate_up = FusedLinear(self, "gate_proj", "up_proj")

    def forward(self, x):
        gate_up = self._gate_up(x)
        if gate_up is None:
            return project(self.down_proj, F.silu(project(self.gate_proj, x)) * project(self.up_proj, x))
        gate, up = gate_up.chunk(2, dim=-1)
        return project(self.down_proj, F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv_cache, metadata, backend):
        # our own modules are called through .forward: nn.Module.__call__'s hook checks cost
        # ~1-2 us each, 6 per layer (the swappable projections keep the normal call)
        h = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, kv_cache, metadata, backend)
        x = x + h
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # the checkpoint fills the table (load_model builds on the meta device): no random init, whose
        # meta-device normal_ is a Python decomposition that imports torch._dynamo (~140 MB of RSS) into
        # every replica, compiled or not
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """`model(input_ids[T], positions[T], metadata, kv_caches, backend) -> hidden [T, H]`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.packed_matmuls: list[PackedMatmul] = []  # `pack_weights`; the start summary counts their copies
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        """Once the weights are loaded: q/k/v and gate/up become one matmul each (see FusedLinear)."""
        for layer in self.model.layers:
            layer.self_attn._qkv.fuse()
            layer.mlp._gate_up.fuse()

    def pack_weights(self) -> list[PackedMatmul]:
        """EngineConfig.pack_weights, after loading and quantization: float32 projections of many rows take
        oneDNN's packed weights (models/packed_linear.py). The matmuls that do."""
        packed = []
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for group in (attn._qkv, mlp._gate_up):  # a group that did not fuse runs its modules one by one
                fused = group.pack()
                packed += [fused] if fused else [pack_linear(getattr(group.owner, n)) for n in group.names]
            packed += [pack_linear(attn.o_proj), pack_linear(mlp.down_proj)]
        packed.append(pack_linear(self.lm_head))
        self.packed_matmuls = [mm for mm in packed if mm is not None]
        return self.packed_matmuls

    def drop_plain_weights(self) -> int:
        """Once the packed copies serve every row count (`packed_linear.min_rows` 1): free the plain weights of
        the packed projections, all but a lm_head tied to the embedding (whose rows a lookup reads). How many."""
        dropped = 0
        for layer in self.model.layers:
            dropped += layer.self_attn._qkv.drop_plain() + layer.mlp._gate_up.drop_plain()
        for m in self.modules():
            if type(m) is PackedLinear and not m.matmul().packed_only \
                    and m.weight is not self.model.embed_tokens.weight:
                m.drop_plain()
                dropped += 1
        return dropped

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], backend: AttentionBackend) -> torch.Tensor:
        backend.prepare(metadata)  # idempotent: shared index tensors for all layers
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer.forward(x, cos, sin, kv_cache, metadata, backend)
        return self.model.norm.forward(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in float32 for the given final hidden states [N, H]."""
        return project(self.lm_head, hidden).float()
