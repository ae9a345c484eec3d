"""The attention interface: one metadata object per step, one backend per engine.

KV cache layout (per layer): two tensors, key and value, each
`[num_blocks, block_size, num_kv_heads, head_dim]` (flashinfer's "NHD" paged
layout, so both backends share the pool). A token's slot is
`block_id * block_size + offset_in_block`.

The batch is flattened: the tokens of all sequences of a step lie end to end
(`query_lens` says how many belong to each sequence, in order). A prefill
chunk and a decode token are the same thing here: `query_len` new tokens
whose keys go after `context_len - query_len` tokens already in the cache.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from engine.core.config import DEFAULT_BLOCK_SIZE


@dataclass
class AttentionMetadata:
    query_lens: list[int]  # new tokens per sequence this step
    context_lens: list[int]  # tokens in the KV cache per sequence after this step's writes
    block_tables: list[list[int]]  # block ids per sequence, in order
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each new token's k/v goes
    block_size: int
    # backends cache per-step derived state here (index tensors, flashinfer plans)
    scratch: dict = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.numel())


class AttentionBackend(ABC):
    name: str = "abstract"
    # can torch.compile trace forward() (its plan built by prepare() before the forward)?
    # If not, compile_decode keeps its calls eager, between compiled parts
    traceable: bool = False

    @classmethod
    def default_block_size(cls, kv_row_bytes: int, device: torch.device, compiled: bool) -> int:
        """Tokens per KV block when the config leaves it open. `kv_row_bytes`: one token's keys and values
        in one layer; `compiled`: compile_decode is on and inductor compiles the decode steps."""
        return DEFAULT_BLOCK_SIZE

    def for_compiled_decode(self, k_cache: torch.Tensor, inductor: bool) -> None:
        """compile_decode is on and this backend is traceable: the runner says so once, with a layer's
        key pool (its shape, dtype and device) and whether inductor compiles, before the first step (the
        torch backend changes its decode plan for it)."""

    @abstractmethod
    def prepare(self, metadata: AttentionMetadata) -> None:
        """Once per step, before the forward: build whatever all layers share."""

    def activate(self, metadata: AttentionMetadata) -> None:
        """A step prepared ahead of others (multi-step decode's sub-steps) is about to run: a backend that
        keeps per-step state in buffers shared across steps puts this step's there (the torch backend's
        in-place decode block lists). A no-op for the others: flashinfer plans in its forward."""

    def static_decode_reads_table(self, k_cache: torch.Tensor) -> bool:
        """Does a captured decode graph's attention on this cache (its dtype, head size) read the runner's block
        table (engine/core/cuda_graph.py fills it per step and captures a graph per table width), or a page table of
        the backend's own (flashinfer's kernels)?"""
        return True

    def prepare_static_decode(self, metadata: AttentionMetadata, static, batch: int) -> None:
        """A captured decode graph (engine/core/cuda_graph.py) of `batch` rows is about to replay, or to be captured,
        for the step `metadata` describes (its real rows; the graph's metadata carries `static`, an
        attention/static_decode.StaticDecode, whose buffers the runner has filled). A backend whose graph reads
        state of its own puts this step's there (flashinfer plans its graph wrapper). The torch backend reads
        the runner's buffers alone: a no-op."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Write k/v into the cache at `slot_mapping`, then attend causally.

        Returns [num_tokens, num_heads, head_dim].
        """
