"""Runs the model on a scheduled batch: owns the KV tensors, builds the step's inputs.

Per step, the batch's new tokens lie end to end in one flat tensor (no padding): input ids, their
positions, and for each token the KV slot it writes (`block_id * block_size + offset`). They are built
in Python lists and turned into tensors once per step (engine/core/host_tensor.py: one buffer each,
about what an in-place bump of persistent tensors would cost), and a decode batch whose sequences and
block tables are unchanged reuses the backend's plan from the last step (attention/torch_backend.py). The forward returns
hidden states for all tokens; logits are computed only for the rows that need them: the last token of
each sequence that samples (every row of one with speculative drafts to verify), and every row of a
prompt whose logprobs were asked for.

Forward paths, each chosen per step (the measurements behind them: README, "Decode paths, measured"):
- eager: every step the others do not take.
- `compile_decode` (EngineConfig): pure decode steps (every row samples) run one torch.compile'd graph,
  forward and logits, attention included when the backend is traceable (its plan is built by `prepare`,
  outside the graph), because at batch 1 a step is ~180 small ops whose dispatch costs more than their
  math. The graphs are built at start in a thread while decode steps run eager, and taken once built
  (engine/core/compile_warmup.py); a decode shape that build did not meet compiles once, on the request
  path; past dynamo's recompile limit a shape runs eager. Under it
  the torch backend keeps a decode batch in one group in batch order, so length groups and row order add
  no graphs, and on a CPU with inductor it attends the paged pool in place (attention/paged_decode.py).
  The one-row projections are inductor's reduction or the BLAS's sgemv, whichever this CPU runs faster
  (engine/core/models/gemv.py decides before the first compile); int8 matmuls stay opaque ops in the graph
  (engine/core/opaque_matmul.py) so the ops between them still fuse.
- `cuda_graphs` (EngineConfig, CUDA): pure decode steps replay a captured graph (engine/core/cuda_graph.py).
- multi-step (engine/core/multi_step.py): `prepare_steps` builds a batch's K sub-steps at once and
  `forward_steps` runs them back to back, each one forward + logits + greedy argmax + raw logprob
  (`_argmax_step`, its own graph under compile_decode), its token the next one's input.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from engine.core.attention.base import AttentionBackend, AttentionMetadata
from engine.core.compile_cache import use_persistent_compile_cache
from engine.core.compile_warmup import BackgroundCompile, warm_up
from engine.core.compiled_replay import ReplayedFunction, module_tensor_guards_only
from engine.core.cuda_graph import DecodeGraphs
from engine.core.host_tensor import host_tensor
from engine.core.models.gemv import choose_compiled_rows
from engine.core.multi_step import STEP_BUDGET_S, configured_steps
from engine.core.process_memory import memory_at_start
from engine.core.sampler import sampled_logprobs
from engine.core.scheduler import ScheduledBatch
from engine.core.step_result import StepResult
from engine.core.triton_gate import keep_triton_out

log = logging.getLogger(__name__)

# compile_decode's torch.compile backend (tests trace with "eager": dynamo's graph, no inductor build)
COMPILE_BACKEND = "inductor"
# compile_decode builds its graphs in a thread at start while decode steps run eager
# (engine/core/compile_warmup.py); False: each graph compiles on the request path, the first time a step
# meets its shape (tests that assert which graphs a run compiles)
BACKGROUND_COMPILE = True


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    metadata: AttentionMetadata
    sample_rows: list[int]  # flat rows whose logits are sampled (ScheduledBatch.samples: per sequence, in order)
    # (batch index, first flat row, number of rows) of prompt chunks that want prompt logprobs
    prompt_logprob_spans: list[tuple[int, int, int]]
    # the forward `prepare` chose: "graph" (a CUDA graph replay) or "compiled" (compile_decode) for a pure decode
    # step (every row one new token that samples, no prompt logprobs), else "eager"
    path: str = "eager"


@dataclass
class ModelOutputs:
    sample_logits: torch.Tensor  # [len(sample_rows), V] float32
    prompt_logits: dict[int, torch.Tensor]  # batch index -> [rows, V] float32


class _EagerAttention:
    """A backend that is not traceable (flashinfer), as a compiled forward sees it: its calls
    stay eager (torch.compiler.disable); their Python planning would only break the graph or
    recompile per batch shape."""

    def __init__(self, backend: AttentionBackend):
        self.name = backend.name
        self.prepare = torch.compiler.disable(backend.prepare)
        self.forward = torch.compiler.disable(backend.forward)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, block_size: int, device: torch.device,
                 compile_decode: bool = False, steps: int | None = 1):
        """`steps`: the configured multi-step K (engine/core/multi_step.py `configured_steps`): 1 one step per
        schedule, an int K > 1 fixed, None auto."""
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.block_size = block_size
        self.device = device
        # EngineConfig.compile_decode: pure decode steps run one torch.compile'd graph (see its comment there)
        self.compile_decode = compile_decode
        if compile_decode and backend.traceable:  # one decode group, the pool read in place (torch_backend.py)
            backend.for_compiled_decode(kv_caches[0][0], COMPILE_BACKEND == "inductor")
        if compile_decode:  # one-row projections: the reduction or the BLAS call (models/gemv.py), measured
            choose_compiled_rows(model)  # here, before any step and the build thread: measured there, it reads wrong
        self._compiled = None  # _decode_step, compiled
        self._compiled_argmax = None  # _argmax_step, compiled (multi-step decode)
        # auto K (`steps` None) and a compiled decode step slower than the sub-steps' budget: K is 1 for every
        # batch, so the build skips `_argmax_step`'s graphs (see `_build_compiled`); a multi-step batch, should
        # one come, takes the eager sub-step rather than a compile on the request path
        self.argmax_skipped = False
        self._step_backend = None
        self.graphs: DecodeGraphs | None = None  # EngineConfig.cuda_graphs (use_cuda_graphs)
        # the compiled functions' first calls, off the request path; None: made by the first step of each shape
        self.background: BackgroundCompile | None = None
        # may decode steps call the compiled functions now? (always, where they compile on the request path;
        # set by the background build's end otherwise, so a build that fails leaves the steps eager)
        self.compiled_ready = True
        if compile_decode and BACKGROUND_COMPILE and backend.traceable:
            self.compiled_ready = False
            self.background = BackgroundCompile(lambda: self._build_compiled(steps),
                                                memory=lambda: memory_at_start(self.model, self.kv_caches).describe())

    @classmethod
    def from_config(cls, config, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                    backend: AttentionBackend) -> ModelRunner:
        """The engine's runner: block size, device and compile_decode from the (resolved) EngineConfig."""
        return cls(model, kv_caches, backend, config.block_size, torch.device(config.device), bool(config.compile_decode),
                   steps=configured_steps(config))

    @property
    def compile_state(self) -> str:
        """What decode steps run: "off" (compile_decode off), "building" (eager while the background build runs),
        "ready" (the compiled step; a backend that is not traceable has no background build and is ready from the
        start) or "failed" (eager: the build raised). /health shows it, and `fleet up` waits for "building" to
        end before traffic is sent."""
        if not self.compile_decode:
            return "off"
        if self.compiled_ready:
            return "ready"
        return "failed" if self.background is not None and self.background.error is not None else "building"

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for the background build (if any) to end; True if decode steps now take the compiled path."""
        if self.background is not None:
            self.background.wait(timeout)
        return self.compile_decode and self.compiled_ready

    def _build_compiled(self, steps: int | None) -> None:
        """The background build: compile the decode functions the engine's steps will call, by calling them
        on warm-up decodes of their own (engine/core/compile_warmup.py).

        Multi-step's sub-step function is built only where it can be taken. Auto K is
        floor(STEP_BUDGET_S / t), t a step's measured seconds, host included, so at least its forward: where
        the compiled batch-1 forward (the fastest batch) already takes longer than STEP_BUDGET_S, K is 1 for
        every batch and its graphs would never run. On the 135M model those are 2 of the build's 4 graphs,
        about half of a restart's build (dynamo traces each graph again, cache or not)."""
        compiled = self._compile(self._decode_step)
        backend = type(self.backend)()
        inductor = COMPILE_BACKEND == "inductor"
        step_s = warm_up(compiled, self.kv_caches, backend, self.block_size, self.device, inductor, self._decode_step)
        if steps is None and step_s > STEP_BUDGET_S:
            self.argmax_skipped = True
            log.info("multi-step sub-step graphs not built: a compiled batch-1 decode step takes %.1f ms, more "
                     "than the %.0f ms auto K's sub-steps take together, so every batch takes one step",
                     step_s * 1e3, STEP_BUDGET_S * 1e3)
        elif steps != 1:
            argmax = self._compile(self._argmax_step)
            warm_up(argmax, self.kv_caches, type(self.backend)(), self.block_size, self.device, inductor)
            self._compiled_argmax = argmax
        self._compiled = compiled
        self.compiled_ready = True

    def use_cuda_graphs(self, max_batch: int, max_model_len: int, pad_block: int, capture: bool = True) -> None:
        """Pure decode steps of up to `max_batch` rows replay CUDA graphs (engine/core/cuda_graph.py); `pad_block`
        is a KV block the block manager never hands out. `capture=False`: the same static buffers, eager."""
        self.graphs = DecodeGraphs(self.model, self.kv_caches, self.backend, self.block_size, max_batch,
                                   max_model_len, pad_block, self.device, capture)

    def prepare(self, batch: ScheduledBatch) -> ModelInputs:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        context_lens: list[int] = []
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
            # its last row when it samples (and each speculative draft's row before it)
            sample_rows.extend(range(row + n - batch.samples[i], row + n))
            if seq.wants_prompt_logprobs and start < seq.num_prompt_tokens - 1:
                # the rows whose next token is still a prompt token (up to the prompt's last but one)
                spans.append((i, row, min(end, seq.num_prompt_tokens - 1) - start))
        dev = self.device
        metadata = AttentionMetadata(
            query_lens=list(batch.num_new_tokens), context_lens=context_lens,
            block_tables=[seq.block_table for seq in batch.seqs],
            slot_mapping=host_tensor(slots, torch.long, dev), block_size=bs)
        pure_decode = len(input_ids) == len(sample_rows) == len(batch.seqs) and not spans
        if pure_decode and self.graphs is not None and len(input_ids) <= self.graphs.max_batch:
            path = "graph"  # (a graph's attention reads the graph's buffers: no plan)
        else:
            path = "compiled" if pure_decode and self.compile_decode and self.compiled_ready else "eager"
            self.backend.prepare(metadata)
        return ModelInputs(host_tensor(input_ids, torch.long, dev), host_tensor(positions, torch.long, dev), metadata,
                           sample_rows, spans, path)

    def prepare_steps(self, batch: ScheduledBatch) -> list[ModelInputs]:
        """The inputs of a multi-step batch's `batch.num_steps` decode sub-steps (engine/core/multi_step.py):
        sub-step j reads one more cached position and writes the slot after it. Its input ids are the tokens
        the sub-step before chose, so `forward_steps` fills them in."""
        first = self.prepare(batch)
        # multi-step sub-steps do not replay CUDA graphs: plan the first one too (prepare left it to the graph)
        self.backend.prepare(first.metadata)
        steps, bs, md, dev = [first], self.block_size, first.metadata, self.device
        starts = [seq.num_computed_tokens for seq in batch.seqs]
        tables = md.block_tables
        for j in range(1, batch.num_steps):
            # positions and slots from Python ints through host_tensor, as the first sub-step's: a tensor op
            # (positions + j) or torch.tensor each cost as much again, per sub-step
            positions = [p + j for p in starts]
            slots = [table[p // bs] * bs + p % bs for table, p in zip(tables, positions)]
            sub = AttentionMetadata(query_lens=md.query_lens, context_lens=[n + j for n in md.context_lens],
                                    block_tables=tables, block_size=bs,
                                    slot_mapping=host_tensor(slots, torch.long, dev))
            self.backend.prepare(sub)
            # its own input buffer, made here outside inference mode: the compiled step guards on that
            # (an argmax made under inference mode as the input recompiled the graph, 20 s)
            ids = torch.empty_like(first.input_ids)
            steps.append(ModelInputs(ids, host_tensor(positions, torch.long, dev), sub, first.sample_rows, []))
        return steps

    @torch.inference_mode()
    def forward_steps(self, steps: list[ModelInputs]) -> StepResult:
        """Run a multi-step batch: K tokens per sequence (each sub-step's greedy argmax, the next one's input),
        their raw logprobs (the sampler's `sampled_logprobs`), and each sub-step's seconds (its argmax and
        logprob are in the same call, so all of it is forward time)."""
        tokens, logprobs, times = [], [], []
        for j, step in enumerate(steps):
            t0 = time.perf_counter()
            ids = step.input_ids
            if j:
                ids.copy_(tokens[-1])
            self.backend.activate(step.metadata)  # all K were prepared before the first ran
            if self.compile_decode and self.compiled_ready and not self.argmax_skipped:
                if self._compiled_argmax is None:
                    self._compiled_argmax = self._compile(self._argmax_step)
                chosen, logprob = self._compiled_argmax(ids, step.positions, step.metadata, self.kv_caches,
                                                        self._step_backend)
            else:
                chosen, logprob = self._argmax_step(ids, step.positions, step.metadata, self.kv_caches, self.backend)
            tokens.append(chosen)
            logprobs.append(logprob)
            times.append(time.perf_counter() - t0)
        chosen = torch.stack(tokens, 1).tolist()
        return StepResult(chosen, torch.stack(logprobs, 1).tolist(), [None] * len(chosen), forward_seconds=times)

    def _decode_step(self, input_ids, positions, metadata, kv_caches, backend):
        """A pure decode step's hidden states and logits (every row samples): what is compiled."""
        hidden = self.model(input_ids, positions, metadata, kv_caches, backend)
        return hidden, self.model.compute_logits(hidden)

    def _argmax_step(self, input_ids, positions, metadata, kv_caches, backend):
        """A multi-step sub-step: the forward, the logits, the greedy token and its raw logprob (what the
        sampler computes for a greedy row) in one graph. The argmax and logprob ops outside the graph
        cost ~40 us a sub-step at batch 1 on the reference model."""
        logits = self.model.compute_logits(self.model(input_ids, positions, metadata, kv_caches, backend))
        row_max, chosen = logits.max(dim=-1)
        return chosen, sampled_logprobs(logits, chosen, row_max)

    def _compile(self, fn):
        """torch.compile of a decode function (`_decode_step`, `_argmax_step`): each has graphs of its own."""
        if self._step_backend is None:
            keep_triton_out()  # before torch._dynamo's import, which would load it (~65 MiB): engine/core/triton_gate.py
            if COMPILE_BACKEND == "inductor":
                use_persistent_compile_cache()  # a restart replays the built kernels (engine/core/compile_cache.py)
            # the pool never changes shape: static, or dynamo's duck sizing would take a batch of
            # 2 (or 16, 32) for the cache's kv heads (block size, head dim) and compile per batch size
            for k_cache, v_cache in self.kv_caches:
                torch._dynamo.mark_static(k_cache)
                torch._dynamo.mark_static(v_cache)
            # a traceable backend's attention compiles with the rest: one graph per step
            self._step_backend = self.backend if self.backend.traceable else _EagerAttention(self.backend)
        # cpp_wrapper: the graph's kernels are called from C++, not from a Python wrapper
        # (forward 0.71 -> 0.62 ms at batch 1; cold compile ~25 s either way)
        options = {"cpp_wrapper": True} if COMPILE_BACKEND == "inductor" else None
        # torch.compile(fn, dynamic=True), its graphs called directly where dynamo's guards pass
        # (engine/core/compiled_replay.py: 381-389 -> 333-344 us a call at batch 1 on the reference model).
        # The model is frozen once loaded (quantized, packed, eval): nothing sets a module's attributes after
        # this, so dynamo guards only its tensors, not its modules' Python structure (guard check 35-60 -> ~24 us)
        return ReplayedFunction(fn, COMPILE_BACKEND, options, guard_filter=module_tensor_guards_only)

    def _decode_forward(self, input_ids, positions, metadata) -> tuple[torch.Tensor, torch.Tensor]:
        """A pure decode step through the compiled graph, called as a CUDA graph's replay is."""
        if self._compiled is None:
            self._compiled = self._compile(self._decode_step)
        return self._compiled(input_ids, positions, metadata, self.kv_caches, self._step_backend)

    @torch.inference_mode()
    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        if inputs.path != "eager":  # a pure decode: every row samples, no prompt logprobs
            decode = self.graphs.run if inputs.path == "graph" else self._decode_forward
            _, logits = decode(inputs.input_ids, inputs.positions, inputs.metadata)
            return ModelOutputs(logits, {})
        rows = inputs.sample_rows
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.metadata, self.kv_caches, self.backend)
        if len(rows) == hidden.shape[0]:
            sample_hidden = hidden
        else:
            sample_hidden = hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)]
        sample_logits = self.model.compute_logits(sample_hidden)
        prompt_logits = {i: self.model.compute_logits(hidden[row:row + n])
                         for i, row, n in inputs.prompt_logprob_spans}
        return ModelOutputs(sample_logits, prompt_logits)
