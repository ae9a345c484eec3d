"""Runs the model on a scheduled batch: owns the KV tensors, builds the step's inputs.

Per step, the batch's new tokens lie end to end in one flat tensor (no
padding): input ids, their positions, and for each token the KV slot it
writes (`block_id * block_size + offset`). Everything is built in Python
lists and turned into tensors once per step (three small tensors: at batch 1 this
is ~0.1 ms; the backend's plan is the larger part of `prepare`, and for a decode batch
whose sequences and block tables are unchanged it is reused from the last step, see
attention/torch_backend.py). Keeping positions and slots as persistent tensors bumped
in place would not pay: `torch.tensor` of a short list costs ~7 us, an in-place add ~4 us. The forward returns hidden
states for all tokens; logits are computed only for the rows that need them:
the last token of each sequence that samples, and every row of a prompt whose
logprobs were asked for.

`compile_decode` (EngineConfig) runs pure decode steps through torch.compile, the
attention left eager between compiled parts. Measured on the reference model, batch 1,
1 thread, loaded machine: 147 s to compile, forward p10 4.28 -> 4.11 ms: off by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.base import AttentionBackend, AttentionMetadata
from engine.scheduler import ScheduledBatch


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    metadata: AttentionMetadata
    sample_rows: list[int]  # flat row of each sampling sequence's last token
    # (batch index, first flat row, number of rows) of prompt chunks that want prompt logprobs
    prompt_logprob_spans: list[tuple[int, int, int]]


@dataclass
class ModelOutputs:
    sample_logits: torch.Tensor  # [num sampling seqs, V] float32
    prompt_logits: dict[int, torch.Tensor]  # batch index -> [rows, V] float32
    hidden: torch.Tensor  # [T, H] (speculative decoding reads more rows)


class _EagerAttention:
    """The backend seen by a compiled forward: its calls stay eager (torch.compiler.disable);
    their Python planning would only break the graph or recompile per batch shape."""

    def __init__(self, backend: AttentionBackend):
        self.name = backend.name
        self.prepare = torch.compiler.disable(backend.prepare)
        self.forward = torch.compiler.disable(backend.forward)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, block_size: int, device: torch.device,
                 compile_decode: bool = False):
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.block_size = block_size
        self.device = device
        # EngineConfig.compile_decode: pure decode steps run a torch.compile'd forward (dense
        # parts compiled, attention eager between them). Off by default: see its comment there.
        # A CUDA-graph runner would replace exactly this seam: `_decode_forward` for pure decode
        # steps of a captured batch size, with the backend's prepare() filling static buffers.
        self.compile_decode = compile_decode
        self._compiled = None

    def prepare(self, batch: ScheduledBatch) -> ModelInputs:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        context_lens: list[int] = []
        block_tables: list[list[int]] = []
        sample_rows: list[int] = []
        spans: list[tuple[int, int, int]] = []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start = seq.num_computed_tokens
            end = start + n
            table = seq.block_table
            row = len(input_ids)
            if n == 1:
                input_ids.append(seq.token_ids[start])
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                input_ids.extend(seq.token_ids[start:end])
                positions.extend(range(start, end))
                slots.extend([table[p // bs] * bs + p % bs for p in range(start, end)])
            context_lens.append(end)
            block_tables.append(table)
            if batch.samples[i]:
                sample_rows.append(row + n - 1)
            if seq.wants_prompt_logprobs and start < seq.num_prompt_tokens - 1:
                # rows whose next token is still a prompt token
                last = min(end, seq.num_prompt_tokens - 1)
                spans.append((i, row, last - start))
        dev = self.device
        metadata = AttentionMetadata(
            query_lens=list(batch.num_new_tokens), context_lens=context_lens, block_tables=block_tables,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev), block_size=bs)
        inputs = ModelInputs(torch.tensor(input_ids, dtype=torch.long, device=dev),
                             torch.tensor(positions, dtype=torch.long, device=dev),
                             metadata, sample_rows, spans)
        self.backend.prepare(metadata)
        return inputs

    def _decode_forward(self, inputs: ModelInputs) -> torch.Tensor:
        if self._compiled is None:
            self._compiled = torch.compile(self.model, dynamic=True)
            self._eager_backend = _EagerAttention(self.backend)
        return self._compiled(inputs.input_ids, inputs.positions, inputs.metadata, self.kv_caches,
                              self._eager_backend)

    @torch.inference_mode()
    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        if self.compile_decode and max(inputs.metadata.query_lens) == 1:
            hidden = self._decode_forward(inputs)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.metadata, self.kv_caches,
                                self.backend)
        rows = inputs.sample_rows
        if len(rows) == hidden.shape[0]:
            sample_hidden = hidden
        else:
            sample_hidden = hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)]
        sample_logits = self.model.compute_logits(sample_hidden)
        prompt_logits = {i: self.model.compute_logits(hidden[row:row + n])
                         for i, row, n in inputs.prompt_logprob_spans}
        return ModelOutputs(sample_logits, prompt_logits, hidden)
