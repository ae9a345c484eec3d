"""LLMEngine: requests in, one scheduler step at a time, outputs out.

    add_request(...)  tokenize, validate, queue          (ValueError on bad input; a Prompt,
                      engine.core.prompt, comes tokenized and checked: taken as it is)
    step()            schedule -> prepare -> forward -> sample -> postprocess
    abort(...)        drop a request wherever it is

A request that fails on its own (parameters the sampler cannot hold, its grammar, a logits
processor, detokenization or stop strings, its prompt logprobs) ends alone, with finish reason
"error", its error text and its KV blocks freed; the rest of the batch goes on. A failure of the
step itself (the forward pass) fails the step's requests.

Every path of a step (one forward and the sampler, speculative decoding, multi-step decode) hands
`_postprocess` one StepResult (engine/core/step_result.py), the one place tokens and logprobs go into a
sequence. Each step is timed in five phases (engine/core/phase_timer.py) and, when an observer listens,
reported as one StepRecord per forward; a finished request is reported as one RequestRecord
(EngineTelemetry, engine/core/engine_records.py). With nobody listening no record is built at all.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import torch

from engine.core.attention import get_backend, with_block_size
from engine.core.config import EngineConfig
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.generation_defaults import generation_defaults
from engine.core.engine_records import EngineTelemetry, build_replica_record, identity_sections, request_metrics
from engine.core.kv_cache import KVCacheManager, kv_pool_blocks
from engine.core.heap_trim import release_free_heap
from engine.core.model_runner import ModelRunner
from engine.core.models import allocate_kv_cache, kv_bytes_per_block, load_model
from engine.core.models.packed_linear import choose_min_rows
from engine.core.outputs import RequestOutput, error_text
from engine.core.phase_timer import PhaseTimer
from engine.core.prompt import Prompt, chat_prompt, ids_prompt, invalid_token_ids, is_token_ids, text_prompt
from engine.core.sampler import Sampler, token_logprobs
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import Sequence
from engine.core.step_result import StepResult
from engine.core.structured_output import StructuredOutput, backend_identity
from engine.core.tokenization import Tokenizer, load_chat_template
from telemetry.contract.hooks import EngineObserver, guarded

log = logging.getLogger(__name__)


def make_config(config: EngineConfig | str | Path, overrides: dict) -> EngineConfig:
    if isinstance(config, EngineConfig):
        return dataclasses.replace(config, **overrides) if overrides else config
    return EngineConfig(model=str(config), **overrides)


class LLMEngine:
    def __init__(self, config: EngineConfig | str | Path, observer: EngineObserver | None = None,
                 **config_overrides):
        config = make_config(config, config_overrides)
        if config.deploy_time is None:  # deployed now, before the model loads (a label: not in the config hash)
            config = dataclasses.replace(config, deploy_time=time.time())
        observer = guarded(observer)
        self.device = torch.device(config.device)

        self.loaded = load_model(config.model, config.dtype, config.device)
        # what the config leaves open (the block size) decided once, for this model: the config the engine runs
        self.config = config = with_block_size(config, kv_bytes_per_block(self.loaded, 1) // self.loaded.num_layers)
        self.quantization = "none"
        if config.quantization not in ("none", "", None):
            from engine.core.quantization import quantize_model

            report = quantize_model(self.loaded.model, config.quantization, config.quant_group_size,
                                    config.quant_skip_layers)
            self.quantization = report.label
        pack = getattr(self.loaded.model, "pack_weights", None)
        if config.pack_weights is None:  # auto: on the CPU, where a model has packed projections (config.py)
            self.config = config = dataclasses.replace(config, pack_weights=self.device.type == "cpu"
                                                       and pack is not None)
        if config.pack_weights:  # after quantization: what stayed float32 (models/packed_linear.py)
            if pack is None:
                raise ValueError(f"pack_weights: {type(self.loaded.model).__name__} has no packed projections")
            matmuls = pack()
            if matmuls:
                rows = choose_min_rows(matmuls)
                # one row too: the packed copies are the weights, the plain ones go (memory in proportion)
                dropped = self.loaded.model.drop_plain_weights() if rows == 1 else 0
                log.info("pack_weights: %d projections take oneDNN's packed weights from %d row(s); %d plain "
                         "copies freed", len(matmuls), rows, dropped)
        self.tokenizer = Tokenizer(config.model, config.tokenization_cache_size, observer)
        if config.chat_template is not None:
            self.tokenizer.use_chat_template(load_chat_template(config.chat_template))
        self.model_name = config.served_model_name or self.loaded.model_name
        self.vocab_size = self.loaded.vocab_size
        self.generation_defaults = generation_defaults(config.model, config.generation_config)
        self.eos_token_ids = set(self.loaded.eos_token_ids) or (
            {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set())

        model_len = self.loaded.max_model_len
        if config.max_model_len is not None and config.max_model_len > model_len:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({model_len})")
        self.max_model_len = config.max_model_len or model_len

        self.backend = get_backend(config.attention_backend, config.device)
        block_size = config.block_size
        num_blocks = kv_pool_blocks(kv_bytes_per_block(self.loaded, block_size), block_size, config.max_num_seqs,
                                    self.max_model_len, config.kv_cache_memory_bytes, config.num_kv_blocks)
        if num_blocks < 1:
            raise ValueError(f"kv_cache_memory_bytes={config.kv_cache_memory_bytes} is smaller than one "
                             f"KV block ({kv_bytes_per_block(self.loaded, block_size)} bytes)")
        self.kv_cache = KVCacheManager(num_blocks, block_size, config.enable_prefix_caching)
        # the config reaches each part the same way: the part's from_config (or constructor) takes it whole
        self.scheduler = Scheduler.from_config(config, self.kv_cache, self.max_model_len)
        # CUDA graphs pad their batches into one block past the manager's (engine/core/cuda_graph.py)
        kv = allocate_kv_cache(self.loaded, num_blocks + int(config.cuda_graphs), block_size)
        release_free_heap()  # what loading and packing freed (engine/core/heap_trim.py), before any build thread
        self.runner = ModelRunner.from_config(config, self.loaded.model, kv, self.backend)
        if config.cuda_graphs:
            self.runner.use_cuda_graphs(config.max_num_seqs, self.max_model_len, pad_block=num_blocks)
        self.sampler = Sampler(config.seed, self.device)
        # response_format's grammars (xgrammar loads on the first constrained request)
        self.structured_output = StructuredOutput(self.tokenizer.hf, self.vocab_size, self.eos_token_ids)
        self.speculator = None
        if config.speculative_mode not in ("none", "", None):
            if config.num_scheduler_steps not in (None, 1):
                raise ValueError("speculative decoding and multi-step decode (num_scheduler_steps > 1) exclude "
                                 "each other: both put several tokens in one step")
            from engine.core.spec_decode.speculator import Speculator

            self.speculator = Speculator(config, self.loaded, self.kv_cache, self.sampler,
                                         self.scheduler.max_seq_len)
            self.scheduler.num_lookahead_tokens = self.speculator.k

        self.requests: dict[str, Sequence] = {}  # unfinished requests by id
        self.step_id = 0
        self.telemetry = EngineTelemetry(observer, config.replica_id, self.model_name, self.kv_cache,
                                         self.scheduler, self.speculator)
        self.replica_record = build_replica_record(
            config, model_name=self.model_name, weights_hash=self.loaded.weights_hash,
            tokenizer_hash=self.tokenizer.tokenizer_hash, chat_template_hash=self.tokenizer.chat_template_hash,
            quantization=self.quantization, attention_backend=self.backend.name,
            sections=identity_sections(config, self.generation_identity()))
        self.telemetry.notify("on_replica_start", self.replica_record)

    @property
    def observer(self) -> EngineObserver:
        """Who listens (a guarded EngineObserver; `enabled` False: nobody, and no record is built)."""
        return self.telemetry.observer

    @observer.setter
    def observer(self, observer: EngineObserver) -> None:
        self.telemetry.observer = observer

    # --- requests --------------------------------------------------------------

    def generation_identity(self) -> dict:
        """What the model directory says about where answers start and stop (its generation_config /
        config eos and bos ids): part of the replica's identity, as the diagnostics compare it."""
        return {"eos_token_ids": sorted(self.eos_token_ids), "bos_token_id": self.loaded.config.bos_token_id,
                "structured_output": backend_identity(),  # response_format's backend: "xgrammar 0.2.9"
                "sampling_defaults": self.generation_defaults.identity()}  # what unset request fields get

    def prepare_prompt(self, prompt: str | list[int] | Prompt) -> Prompt:
        """Any prompt as a `Prompt`, checked: text is tokenized (once, through the tokenization cache),
        token IDs are checked against the vocabulary, both against the context. A `Prompt` is taken as
        it is: whoever made it (the server's admission, `chat_prompt`) tokenized and checked it already."""
        if isinstance(prompt, Prompt):
            return prompt
        if isinstance(prompt, str):
            prepared = text_prompt(self.tokenizer, prompt)
        elif isinstance(prompt, (list, tuple)):
            if not is_token_ids(prompt):
                raise ValueError("a token-ID prompt must be a list of ints")
            bad = invalid_token_ids(prompt, self.vocab_size)
            if bad:
                raise ValueError(f"token id {bad[0]} is out of the vocabulary [0, {self.vocab_size})")
            prepared = ids_prompt(prompt)
        else:
            raise ValueError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")
        self.scheduler.check_prompt(len(prepared.token_ids))
        return prepared

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> Prompt:
        """A conversation as a `Prompt`: rendered with the chat template, tokenized once, its hashes made."""
        return chat_prompt(self.tokenizer, messages, add_generation_prompt, **template_kwargs)

    def make_sequence(self, request_id: str, prompt: str | list[int] | Prompt,
                      sampling_params: SamplingParams | None = None, arrival_time: float | None = None,
                      workload: str = "", trace_context: dict | None = None, stream: bool = True) -> Sequence:
        """Tokenize and validate a request without touching engine state (safe from another thread)."""
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params.check_token_ids(self.vocab_size)  # its fields were checked when it was made: ValueError names it
        prompt = self.prepare_prompt(prompt)
        seq = Sequence(str(request_id), prompt.token_ids, params,
                       arrival_time if arrival_time is not None else time.time(),
                       prompt_text=prompt.text, workload=workload, trace_context=trace_context, stream=stream,
                       prompt_text_hash=prompt.text_hash, rendered_prompt_hash=prompt.rendered_hash)
        if params.seed is not None:
            seq.generator = self.sampler.make_generator(params.seed)
        seq.grammar = self.structured_output.grammar_for(params.response_format)  # None: unconstrained
        if stream or params.stop:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer.decode, params.stop)
        return seq

    def add_sequence(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in flight")
        self.scheduler.add(seq)
        self.requests[seq.request_id] = seq
        self.telemetry.notify("on_request_arrival", seq.request_id, seq.arrival_time, seq.num_prompt_tokens,
                              seq.workload, seq.trace_context)

    def add_request(self, request_id: str, prompt: str | list[int] | Prompt,
                    sampling_params: SamplingParams | None = None, arrival_time: float | None = None,
                    workload: str = "", trace_context: dict | None = None, stream: bool = True) -> None:
        """Queue a request: a prompt text, token IDs, or a `Prompt` (engine.core.prompt) already tokenized.
        `stream=False`: `step()` returns its output only once, when it finishes."""
        self.add_sequence(self.make_sequence(request_id, prompt, sampling_params, arrival_time, workload,
                                             trace_context, stream))

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request; returns its final output (finish_reason "abort"), None if unknown/finished."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.abort(seq)
        seq.finish_time = time.time()
        self.scheduler.remove_finished()
        out = self._output(seq)
        if self.observer.enabled:
            self.telemetry.request_finished(seq, out.text)
        return out

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # --- the step ----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; outputs of streaming requests that progressed and of finished ones."""
        timer = PhaseTimer()
        batch = self.scheduler.schedule()
        timer.lap("schedule")
        if not batch.seqs:
            return []
        for seq in batch.newly_scheduled:
            self.telemetry.notify("on_request_scheduled", seq.request_id, seq.scheduled_time)
        sampling = [s for s, samples in zip(batch.seqs, batch.samples) if samples]
        try:
            result, context_lens = self._compute(batch, sampling, timer)
        except Exception as e:  # noqa: BLE001 - fail this batch's requests, keep serving the others
            return self._fail_step(batch, e)
        outputs, finished = self._postprocess(batch, sampling, result)
        timer.lap("postprocess")
        self.scheduler.observe_step(batch, timer.elapsed)  # auto multi-step's measure
        if self.observer.enabled:
            self.telemetry.steps(self.step_id, batch, timer, result, finished, context_lens)
        self.step_id += len(result.forward_seconds) or 1  # one per forward
        return outputs

    def _compute(self, batch: ScheduledBatch, sampling: list[Sequence],
                 timer: PhaseTimer) -> tuple[StepResult, list[int]]:
        """The step's tokens, whichever path computes them, and the context lengths its attention read."""
        if batch.stepped:  # K greedy sub-steps, each token chosen on the device (engine/core/multi_step.py)
            steps = self.runner.prepare_steps(batch)
            timer.lap("prepare")
            result = self.runner.forward_steps(steps)
            timer.lap("forward")
            return result, steps[0].metadata.context_lens
        if self.speculator is not None:  # drafts join the batch: 1 + k tokens per decode sequence
            # a draft model's forwards count as forward time, not host overhead
            timer.move(self.speculator.propose(batch, self.requests.keys()), "prepare", "forward")
        inputs = self.runner.prepare(batch)
        timer.lap("prepare")
        out = self.runner.forward(inputs)
        timer.lap("forward")
        if self.speculator is not None and sampling:
            result = self.speculator.sample(batch, sampling, out.sample_logits)
        elif sampling:
            result = self.sampler(out.sample_logits, sampling).as_step_result()
        else:
            result = StepResult([], [], [])
        result.prompt_logits = out.prompt_logits
        timer.lap("sample")
        return result, inputs.metadata.context_lens

    def _postprocess(self, batch: ScheduledBatch, sampling: list[Sequence],
                     result: StepResult) -> tuple[list[RequestOutput], list[tuple[Sequence, RequestOutput]]]:
        """The one place a step's tokens and logprobs go into their sequences."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.kv_cache.cache_full_blocks(seq)
        outputs: list[RequestOutput] = []
        if result.prompt_logits:  # only requests that asked for prompt logprobs
            self._add_prompt_logprobs(batch, result.prompt_logits, outputs)
        finished: list[tuple[Sequence, RequestOutput]] = []
        now = time.time()
        for i, seq in enumerate(sampling):
            if seq.is_finished:  # failed above
                continue
            if i in result.errors:  # the sampler or the speculator could not choose its tokens
                self._fail_alone(seq, result.errors[i], outputs)
                continue
            before = len(seq.token_ids)
            # a try costs nothing until it raises: a detokenizer, stop-string or output failure ends this
            # request alone
            try:
                self._append_tokens(seq, result.token_ids[i], result.raw_logprobs[i], result.logprobs[i], now,
                                    outputs, finished)
            except Exception as e:  # noqa: BLE001
                self._fail_alone(seq, error_text(e), outputs)
            result.kept[i] = len(seq.token_ids) - before
        if finished:
            self.scheduler.remove_finished()
        return outputs, finished

    def _append_tokens(self, seq: Sequence, tokens: list[int], raw: list[float], logprobs: list | None, now: float,
                       outputs: list[RequestOutput], finished: list) -> None:
        """One sequence's tokens into it, up to a stop; its output into `outputs` (and `finished`)."""
        params = seq.sampling_params
        reason = None
        for j, token in enumerate(tokens):
            seq.token_ids.append(token)
            seq.token_times.append(now)
            seq.output_logprobs.append(raw[j])
            if logprobs is not None:
                seq.logprobs.append(logprobs[j])
            if seq.first_token_time == 0.0:
                seq.first_token_time = now
                self.telemetry.notify("on_first_token", seq.request_id, now)
            # under a grammar EOS is allowed only once the JSON is complete: it ends the request, ignore_eos or not
            stop_token = (token in self.eos_token_ids and (not params.ignore_eos or seq.grammar is not None)) \
                or token in params.stop_token_ids
            if stop_token or (seq.detokenizer is not None and seq.detokenizer.add_tokens([token]) is not None):
                reason = "stop"
            elif seq.num_output_tokens >= params.max_tokens or len(seq.token_ids) >= self.scheduler.max_seq_len:
                reason = "length"
            if reason is not None:
                self.scheduler.finish(seq, reason)
                seq.finish_time = now
                del self.requests[seq.request_id]
                out = self._output(seq, stop_token)
                outputs.append(out)
                finished.append((seq, out))
                return
        if len(tokens) > 1 or self.speculator is not None:  # accepted drafts, sub-steps: their KV is written
            self.kv_cache.compute_all_but_last(seq)
        if seq.stream:
            outputs.append(self._output(seq))

    def _fail_step(self, batch: ScheduledBatch, error: Exception) -> list[RequestOutput]:
        """The step itself failed (the forward pass): its requests fail, the engine goes on serving."""
        log.exception("step %d failed; failing its %d requests", self.step_id, len(batch.seqs))
        if self.speculator is not None:
            self.speculator.discard(batch)  # unverified drafts must not become output tokens
        self.step_id += 1
        return self._fail(batch.seqs, error_text(error))

    def _fail_alone(self, seq: Sequence, error: str, outputs: list[RequestOutput]) -> None:
        """A request failed on its own (its parameters, grammar, processors, detokenization): end it with
        finish reason "error" and its blocks freed; the rest of the batch goes on."""
        log.warning("request %s failed on its own; the batch goes on: %s", seq.request_id, error)
        outputs += self._fail([seq], error)

    def _fail(self, seqs: list[Sequence], error: str) -> list[RequestOutput]:
        """End `seqs` with finish_reason "error" (their blocks go back to the pool)."""
        now = time.time()
        outputs = []
        for seq in seqs:
            self.scheduler.finish(seq, "error")
            seq.error, seq.finish_time = error, now
            self.requests.pop(seq.request_id, None)
            try:
                out = self._output(seq)
            except Exception:  # noqa: BLE001 - its text cannot be made (the failure may be the detokenizer's)
                out = RequestOutput(seq.request_id, seq.prompt_token_ids, seq.output_token_ids, "",
                                    finished=True, finish_reason="error", error=error, metrics=request_metrics(seq))
            outputs.append(out)
            if self.observer.enabled:
                self.telemetry.request_finished(seq, out.text)
        self.scheduler.remove_finished()
        return outputs

    def _add_prompt_logprobs(self, batch: ScheduledBatch, prompt_logits: dict[int, torch.Tensor],
                             outputs: list[RequestOutput]) -> None:
        """Each asking prompt chunk's logprobs into its sequence; one that cannot be made fails its request
        alone (which then samples nothing this step)."""
        for i, logits in prompt_logits.items():
            try:
                self._add_chunk_prompt_logprobs(batch.seqs[i], batch.num_new_tokens[i], logits)
            except Exception as e:  # noqa: BLE001
                self._fail_alone(batch.seqs[i], error_text(e), outputs)

    def _add_chunk_prompt_logprobs(self, seq: Sequence, num_new: int, logits: torch.Tensor) -> None:
        # rows predict the tokens after each computed position; the chunk started at
        # num_computed - num_new (already advanced above)
        start = seq.num_computed_tokens - num_new
        # after a preemption the prompt is computed again: skip positions already reported
        skip = len(seq.prompt_logprobs) - (start + 1)
        if skip > 0:
            logits, start = logits[skip:], start + skip
        if logits.shape[0] == 0:
            return
        targets = torch.tensor(seq.token_ids[start + 1:start + 1 + logits.shape[0]], device=logits.device)
        n = seq.sampling_params.prompt_logprobs
        seq.prompt_logprobs.extend(token_logprobs(logits, targets, [n] * len(targets)))

    # --- outputs -------------------------------------------------------------------

    def _output(self, seq: Sequence, stop_token: bool = False) -> RequestOutput:
        """The request's output: its tokens and text since the last one it was handed and, once it has finished,
        everything (`stop_token`: its last token is the stop token, whose text is not output)."""
        detok, finished = seq.detokenizer, seq.is_finished
        if detok is not None:
            if finished and seq.finish_reason not in ("abort", "error"):
                detok.finish()
            new_text = detok.take_new_text(final=finished)
            text = detok.text[:detok.num_emitted_chars]
        else:  # a request that neither streams nor has stop strings: output once, finished
            ids = seq.output_token_ids
            text = new_text = self.tokenizer.decode(ids[:-1] if stop_token else ids)
        new_ids = seq.token_ids[seq.num_prompt_tokens + seq.num_streamed_tokens:]
        seq.num_streamed_tokens = seq.num_output_tokens
        return RequestOutput(
            seq.request_id, seq.prompt_token_ids, seq.output_token_ids, text, new_token_ids=new_ids,
            new_text=new_text, finished=finished, finish_reason=seq.finish_reason, error=seq.error,
            # a streamed increment holds a copy: the sequence goes on appending to its own list
            logprobs=seq.logprobs if finished or seq.logprobs is None else list(seq.logprobs),
            prompt_logprobs=seq.prompt_logprobs if finished else None,
            metrics=request_metrics(seq) if finished else None)

    def close(self) -> None:
        """Flush the observers (the engine holds no other resource worth releasing)."""
        if self.observer.enabled:
            self.observer.close()
