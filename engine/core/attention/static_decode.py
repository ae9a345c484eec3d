"""Decode attention with every shape fixed ahead: what a captured CUDA graph replays (engine/core/cuda_graph.py).

A graph replays the same kernels on the same memory, so nothing of a step may be decided on the host
while it runs: not the batch size, not the longest context, not which rows are padding. The torch
backend's own decode plans all of that in Python per step (torch_backend.py); this path takes it from
tensors that the graph runner rewrites in place before each replay (`StaticDecode`):
- `block_table` [B, W]: each row's block ids, padded with any valid block id (the runner's pad block),
  W a width bucket the runner chose (a graph per bucket: the gather below costs B * W * block_size keys);
- `context_lens` [B]: keys per row after this step's write. Positions past it are masked, so a padded
  table entry or a padding row (context 1, its one key in the pad block) reads nothing that counts.
The keys and values of a row are gathered through its table into [B, KVH, W * block_size, D] and the
query heads sharing a kv head act as that head's query rows (as the backend's eager decode does), one SDPA
call with a length mask. Reading W * block_size keys per row where the eager path reads the longest
context is the price of fixed shapes; the width buckets keep it under 2x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# metadata.scratch key: a step whose metadata carries a StaticDecode attends through `attend` below
SCRATCH_KEY = "static_decode"


@dataclass
class StaticDecode:
    """Leading views of the graph runner's buffers for one captured (batch, width)."""
    block_table: torch.Tensor  # [B, W] int64
    context_lens: torch.Tensor  # [B] int64
    key_offsets: torch.Tensor  # [block_size] int64: 0 .. block_size - 1
    key_positions: torch.Tensor  # [W * block_size] int64: 0 .. W * block_size - 1
    pad_block: int  # where padding rows write and what pads a table (the runner's spare block)
    max_blocks: int  # the longest table a row can have (max_model_len's blocks): the widest graph


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           slot_mapping: torch.Tensor, static: StaticDecode, scale: float) -> torch.Tensor:
    """Write this step's keys and values at `slot_mapping`, attend each row over its table.
    q [B, H, D], k / v [B, KVH, D]; returns [B, H, D]."""
    b, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, slot_mapping, k)
    v_flat.index_copy_(0, slot_mapping, v)
    block_size = k_cache.shape[1]
    slots = (static.block_table[:, :, None] * block_size + static.key_offsets).view(b, -1)  # [B, L]
    ks = k_flat[slots].transpose(1, 2)  # [B, KVH, L, D]
    vs = v_flat[slots].transpose(1, 2)
    mask = (static.key_positions[None, :] < static.context_lens[:, None])[:, None, None, :]
    qs = q.view(b, num_kv_heads, num_heads // num_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
    return o.reshape(b, num_heads, head_dim)
