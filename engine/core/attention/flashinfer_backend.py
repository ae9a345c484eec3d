"""Paged attention with flashinfer's kernels (CUDA only), on the same NHD cache as the torch backend.

Imported only when CUDA and flashinfer are present (see `get_backend`). Per step,
`prepare` builds flashinfer's CSR page table (indptr / indices / last page
lengths) once; the first layer's call plans the kernel (it needs the head
counts, dtype and scale, which only the layer knows) and every later layer
reuses that plan. A batch of pure decodes goes to the decode wrapper, anything
else to the prefill wrapper with a causal mask aligned to the end of each
sequence (flashinfer's convention, and ours). What flashinfer's kernels do not
cover (float32, unusual head sizes) falls back to the torch backend.

A decode step replayed as a CUDA graph (engine/core/cuda_graph.py) runs a decode wrapper of that graph's
batch size made with `use_cuda_graph=True`: its page table lives in buffers of fixed size that `plan`
rewrites before each replay (`prepare_static_decode`), and `run` inside the graph reads them. The first
plan needs the head counts, dtype and scale, which only a layer knows: the graph's warm-up forward (eager,
before the capture) plans it, and every later replay is planned by the runner's call.
"""

from __future__ import annotations

import torch

from engine.core.attention import static_decode
from engine.core.attention.base import AttentionBackend, AttentionMetadata
from engine.core.attention.torch_backend import TorchAttentionBackend

_SCRATCH_KEY = "flashinfer_plan"
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, device: str | torch.device = "cuda"):
        import flashinfer

        self.device = torch.device(device)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.fallback = TorchAttentionBackend()
        self._planned = None  # (step state, shape key) the wrappers were last planned for
        # CUDA-graph decode: a wrapper per captured batch size, the page table each was last given
        # (its plan waits for the first forward's shape key), and that key once a graph's forward met it
        self._graph_wrappers: dict[int, object] = {}
        self._graph_tables: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = {}
        self._graph_key: tuple | None = None

    def prepare(self, metadata: AttentionMetadata) -> None:
        if _SCRATCH_KEY in metadata.scratch or static_decode.SCRATCH_KEY in metadata.scratch:
            return
        kv_indptr, kv_indices, kv_last_page_len = self._page_table(metadata)
        metadata.scratch[_SCRATCH_KEY] = {
            "is_decode": all(q == 1 for q in metadata.query_lens),
            "qo_indptr": torch.tensor([0] + _cumsum(metadata.query_lens), dtype=torch.int32),
            "kv_indptr": kv_indptr, "kv_indices": kv_indices, "kv_last_page_len": kv_last_page_len,
        }

    def _page_table(self, metadata: AttentionMetadata, pad_rows: int = 0, pad_block: int = 0):
        """flashinfer's CSR page table of the step: (indptr, page ids, last page lengths), int32; the indptr and
        lengths stay on the host (plan() reads them there). `pad_rows` more rows of one page each (`pad_block`,
        one key): a CUDA graph's padding."""
        bs = metadata.block_size
        pages = [(c + bs - 1) // bs for c in metadata.context_lens]
        indices = [b for table, n in zip(metadata.block_tables, pages) for b in table[:n]] + [pad_block] * pad_rows
        last = [c - (n - 1) * bs for c, n in zip(metadata.context_lens, pages)] + [1] * pad_rows
        return (torch.tensor([0] + _cumsum(pages + [1] * pad_rows), dtype=torch.int32),
                torch.tensor(indices, dtype=torch.int32, device=self.device), torch.tensor(last, dtype=torch.int32))

    def _plan(self, state: dict, metadata: AttentionMetadata, num_heads: int, num_kv_heads: int,
              head_dim: int, dtype: torch.dtype, scale: float) -> None:
        # a plan lives in the wrapper: replan when another step (or model) planned it since
        key = (num_heads, num_kv_heads, head_dim, dtype, scale)
        if self._planned is not None and self._planned[0] is state and self._planned[1] == key:
            return
        if state["is_decode"]:
            self.decode.plan(state["kv_indptr"], state["kv_indices"], state["kv_last_page_len"],
                             num_heads, num_kv_heads, head_dim, metadata.block_size,
                             q_data_type=dtype, kv_data_type=dtype, sm_scale=scale)
        else:
            self.prefill.plan(state["qo_indptr"], state["kv_indptr"], state["kv_indices"],
                              state["kv_last_page_len"], num_heads, num_kv_heads, head_dim,
                              metadata.block_size, causal=True, sm_scale=scale,
                              q_data_type=dtype, kv_data_type=dtype)
        self._planned = (state, key)

    def static_decode_reads_table(self, k_cache: torch.Tensor) -> bool:
        # its kernels read the page table planned below; what they do not cover falls back to the torch path
        return not (k_cache.dtype in SUPPORTED_DTYPES and k_cache.shape[-1] in SUPPORTED_HEAD_DIMS)

    def prepare_static_decode(self, metadata: AttentionMetadata, static, batch: int) -> None:
        """The graph of `batch` rows replays the step `metadata` describes: its pages, then one page (the
        pad block, one key) per padding row, planned into that graph's wrapper."""
        self._graph_tables[batch] = (*self._page_table(metadata, batch - metadata.num_seqs, static.pad_block),
                                     metadata.block_size)
        if self._graph_key is not None:
            self._plan_graph(batch)

    def _graph_wrapper(self, batch: int, max_pages: int):
        wrapper = self._graph_wrappers.get(batch)
        if wrapper is None:
            import flashinfer

            i32 = dict(dtype=torch.int32, device=self.device)
            wrapper = self._graph_wrappers[batch] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(batch + 1, **i32),
                paged_kv_indices_buffer=torch.zeros(max_pages, **i32),
                paged_kv_last_page_len_buffer=torch.zeros(batch, **i32))
        return wrapper

    def _plan_graph(self, batch: int) -> None:
        indptr, indices, last, bs = self._graph_tables[batch]
        num_heads, num_kv_heads, head_dim, dtype, scale, pages_per_row = self._graph_key
        wrapper = self._graph_wrapper(batch, batch * pages_per_row)
        wrapper.plan(indptr, indices, last, num_heads, num_kv_heads, head_dim, bs,
                     q_data_type=dtype, kv_data_type=dtype, sm_scale=scale)

    def _static_forward(self, q, k, v, k_cache, v_cache, static, slot_mapping, scale):
        batch, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)
        # the indices buffer has room for every row at the longest table: what any replay may plan
        key = (num_heads, num_kv_heads, head_dim, q.dtype, scale, static.max_blocks)
        if self._graph_key != key and not torch.cuda.is_current_stream_capturing():
            self._graph_key = key  # the warm-up forward: plan with what the layers know
            self._plan_graph(batch)
        return self._graph_wrapper(batch, batch * static.max_blocks).run(q.contiguous(), (k_cache, v_cache))

    def forward(self, q, k, v, k_cache, v_cache, metadata, scale):
        head_dim = q.shape[-1]
        if q.dtype not in SUPPORTED_DTYPES or head_dim not in SUPPORTED_HEAD_DIMS:
            return self.fallback.forward(q, k, v, k_cache, v_cache, metadata, scale)
        static = metadata.scratch.get(static_decode.SCRATCH_KEY)
        if static is not None:
            return self._static_forward(q, k, v, k_cache, v_cache, static, metadata.slot_mapping, scale)
        self.prepare(metadata)
        state = metadata.scratch[_SCRATCH_KEY]
        num_kv_heads = k.shape[1]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, metadata.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, metadata.slot_mapping, v)
        self._plan(state, metadata, q.shape[1], num_kv_heads, head_dim, q.dtype, scale)
        wrapper = self.decode if state["is_decode"] else self.prefill
        return wrapper.run(q.contiguous(), (k_cache, v_cache))


def _cumsum(values: list[int]) -> list[int]:
    out, total = [], 0
    for v in values:
        total += v
        out.append(total)
    return out
