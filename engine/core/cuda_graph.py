"""Pure decode steps replayed as CUDA graphs (EngineConfig.cuda_graphs).

On a GPU a decode step's forward is a few hundred small kernels, and launching them from Python
(a few us each, plus the torch dispatcher) takes longer than the GPU takes to run them at small
batch: the step waits on the host. A CUDA graph records the kernels of one step once and launches
them all with one call. The algorithm (as nano-vllm and SGLang do it):

1. Fixed shapes. A graph replays the same kernels on the same memory, so a step of b rows runs the
   graph of the smallest captured batch size B >= b (`batch_sizes`: 1, 2, 4, 8, then multiples of 16,
   up to max_num_seqs), and, where the attention reads each row's keys through our block table of fixed
   width, of the smallest width W >= its longest context (powers of two of blocks, at least
   `MIN_WIDTH_BLOCKS`, at most what max_model_len needs): one graph per (B, W) met, so a row reads under
   twice the keys it has (attention/static_decode.py).
2. Static inputs. One set of buffers at the largest (B, W): input ids, positions, KV slots, block table,
   context lengths. A graph reads leading views of them; a step copies its rows in before the replay.
3. Padding rows b..B: token 0 at position 0, its key and value written into the pad block (one block
   past the ones the block manager hands out, allocated by the engine for this), attending that one key.
   They compute and nothing reads them; no real sequence's cache is touched.
4. Lazy capture. The first step of a (B, W) runs eagerly over the buffers (that is its result, and it
   warms cuBLAS and the allocator up), then the forward is captured into one memory pool shared by all
   graphs; later steps of that (B, W) replay it. (A capture costs a synchronize and a garbage collection:
   a stall the first time a shape is met. Capturing every shape at start, largest first, is the
   alternative: it would pay them all before serving, most of them for shapes a deployment never meets.)
5. Outputs: every graph writes its rows into one pair of [max batch, H] / [max batch, vocab] buffers,
   and a step's rows are copied out of them before the next replay overwrites them. A backend that
   attends through a page table of its own (flashinfer) does not read ours: one width, no table filled.

Only single decode steps take graphs: prefills, mixed steps, prompt logprobs, speculative verification
and multi-step sub-steps run as before. With `capture=False` the same buffers and padding run eagerly
(what the CPU runs in tests and in `gpu_check --device cpu`): only the capture itself is CUDA's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.attention.base import AttentionBackend, AttentionMetadata
from engine.core.attention.static_decode import SCRATCH_KEY, StaticDecode

MIN_WIDTH_BLOCKS = 4  # 64 keys at block size 16: a narrower graph saves nothing measurable


def batch_sizes(max_batch: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, 8, then every 16, the last one `max_batch`."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch] + list(range(16, max_batch, 16))
    return sizes + [max_batch]


def width_for(blocks: int, max_blocks: int) -> int:
    """The table width (in blocks) of the graph for a step whose longest table needs `blocks`."""
    width = MIN_WIDTH_BLOCKS
    while width < blocks:
        width *= 2
    return min(width, max_blocks)


@dataclass
class _Graph:
    metadata: AttentionMetadata  # the static metadata the graph was captured with
    graph: object | None  # torch.cuda.CUDAGraph (None: capture=False)


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, block_size: int, max_batch: int, max_model_len: int,
                 pad_block: int, device: torch.device, capture: bool = True):
        if capture and torch.device(device).type != "cuda":
            raise ValueError(f"cuda_graphs needs a CUDA device, not {str(device)!r}")
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.block_size, self.pad_block, self.capture = block_size, pad_block, capture
        self.sizes = batch_sizes(max_batch)
        self.max_blocks = max(1, -(-max_model_len // block_size))
        # a backend that attends through its own page table (flashinfer) reads neither the table nor its
        # width: one width, nothing to fill
        self.reads_table = backend.static_decode_reads_table(kv_caches[0][0])
        b, w = self.sizes[-1], width_for(self.max_blocks, self.max_blocks)
        long = dict(dtype=torch.long, device=device)
        self.input_ids = torch.zeros(b, **long)
        self.positions = torch.zeros(b, **long)
        self.slot_mapping = torch.full((b,), pad_block * block_size, **long)
        self.context_lens = torch.ones(b, **long)
        # the table of a (B, W) graph is the first B * W entries, contiguous: one copy from the host's
        self.block_table = torch.full((b * w,), pad_block, **long)
        pinned = torch.device(device).type == "cuda"
        self._host_table = torch.full((b * w,), pad_block, dtype=torch.long, pin_memory=pinned)
        self._host_lens = torch.ones(b, dtype=torch.long, pin_memory=pinned)
        self.key_offsets = torch.arange(block_size, **long)
        self.key_positions = torch.arange(w * block_size, **long)
        # every graph writes its rows of these (the first forward sizes them): outputs kept per graph
        # would hold a [B, vocab] float32 tensor for each (batch, width) met
        self.hidden_out: torch.Tensor | None = None
        self.logits_out: torch.Tensor | None = None
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = None  # the graphs' shared memory pool (CUDA)

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """The (batch, width) of every graph made so far (captured, or with capture=False, planned)."""
        return sorted(self._graphs)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """A pure decode step of b <= max_batch rows: (hidden [b, H], logits [b, V]), copies."""
        b = len(metadata.query_lens)
        size = next(s for s in self.sizes if s >= b)
        blocks = -(-max(metadata.context_lens) // self.block_size) if self.reads_table else 1
        width = width_for(blocks, self.max_blocks)
        self._fill(input_ids, positions, metadata, b, size, width)
        key = (size, width)
        entry = self._graphs.get(key)
        if entry is None:  # its first step: run eagerly (this step's result), then capture
            entry = self._graphs[key] = self._capture(size, width, metadata)
        else:
            self.backend.prepare_static_decode(metadata, entry.metadata.scratch[SCRATCH_KEY], size)
            if entry.graph is None:
                self._forward(entry.metadata)
            else:
                entry.graph.replay()
        return self.hidden_out[:b].clone(), self.logits_out[:b].clone()

    def _fill(self, input_ids, positions, metadata: AttentionMetadata, b: int, size: int, width: int) -> None:
        """Copy the step's rows into the buffers; rows b..size become padding (see the module's 3.).
        The tables and lengths go through host buffers (pinned on CUDA, copied without waiting): the engine
        reads each step's tokens back before it fills the next step, so a copy in flight is never overwritten."""
        self.input_ids[:b].copy_(input_ids)
        self.positions[:b].copy_(positions)
        self.slot_mapping[:b].copy_(metadata.slot_mapping)
        lens = self._host_lens.numpy()
        lens[:b] = metadata.context_lens
        lens[b:size] = 1
        self.context_lens[:size].copy_(self._host_lens[:size], non_blocking=True)
        if size > b:
            self.input_ids[b:size].zero_()
            self.positions[b:size].zero_()
            self.slot_mapping[b:size].fill_(self.pad_block * self.block_size)
        if self.reads_table:
            # past a row's blocks (and in padding rows) the pad block: masked, past the context length.
            # A row's own blocks are written each step (B rows of numpy, ~1 us + its length each); a table
            # may run past its context (blocks held for tokens to come): cut at the width
            table = self._host_table.numpy()[:size * width].reshape(size, width)
            table.fill(self.pad_block)
            for row, t in zip(table, metadata.block_tables):
                n = min(len(t), width)
                row[:n] = t[:n]
            self.block_table[:size * width].copy_(self._host_table[:size * width], non_blocking=True)

    def _static_metadata(self, size: int, width: int) -> AttentionMetadata:
        static = StaticDecode(self.block_table[:size * width].view(size, width), self.context_lens[:size],
                              self.key_offsets, self.key_positions[:width * self.block_size], self.pad_block,
                              self.max_blocks)
        # the lists are what the shapes are planned from; the values the graph reads are the tensors
        return AttentionMetadata(query_lens=[1] * size, context_lens=[1] * size,
                                 block_tables=[[self.pad_block]] * size, block_size=self.block_size,
                                 slot_mapping=self.slot_mapping[:size], scratch={SCRATCH_KEY: static})

    def _forward(self, metadata: AttentionMetadata) -> None:
        """The step over the buffers, its rows written into the shared outputs."""
        size = metadata.num_seqs
        hidden = self.model(self.input_ids[:size], self.positions[:size], metadata, self.kv_caches, self.backend)
        logits = self.model.compute_logits(hidden)
        if self.logits_out is None:  # the first forward of all (eager: never inside a capture)
            self.hidden_out = hidden.new_empty(self.max_batch, hidden.shape[1])
            self.logits_out = logits.new_empty(self.max_batch, logits.shape[1])
        self.hidden_out[:size].copy_(hidden)
        self.logits_out[:size].copy_(logits)

    def _capture(self, size: int, width: int, step: AttentionMetadata) -> _Graph:
        metadata = self._static_metadata(size, width)
        self.backend.prepare_static_decode(step, metadata.scratch[SCRATCH_KEY], size)
        if not self.capture:
            self._forward(metadata)
            return _Graph(metadata, None)
        # warm-up on a side stream (what torch.cuda.graph asks): it computes this step's outputs
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(metadata)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):  # records, runs nothing: the outputs stay the warm-up's
            self._forward(metadata)
        self._pool = graph.pool()
        return _Graph(metadata, graph)
