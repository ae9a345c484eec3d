"""Speculative decoding inside the engine's step.

Per step, around the target model's one forward:

1. `propose(batch)` - after scheduling. Each decode sequence of the batch gets
   up to k draft tokens (n-gram lookup or the draft model), capped by the KV
   slots the scheduler reserved for it (`Scheduler.num_lookahead_tokens`), by
   its remaining `max_tokens` and by the longest a sequence may grow. The
   drafts are appended to the sequence's tokens for the runner, which then
   computes 1 + k tokens for it: query_len = 1 + k, one forward for the batch.
2. `sample(batch, sampling, outputs)` - after the forward. Drafts are removed
   from the sequences again and verified against the target's logits at all
   1 + k rows (greedy: accept while the argmax agrees; otherwise rejection
   sampling, which keeps the target's distribution). Sequences without a draft
   are sampled by the engine's sampler as usual. Every sequence gets a list
   of tokens (the engine's StepResult): accepted drafts, then one correction or
   bonus token, each with its raw logprob under the target.
3. The engine appends those tokens; for a sequence that goes on, the KV cache
   keeps the accepted drafts' keys/values (they are the sequence's tokens now)
   and drops the rejected drafts' slots: the computed length becomes
   len(tokens) - 1 and blocks past it return to the pool.

Acceptance counters (vLLM's conventions) are kept per step and per request.
"""

from __future__ import annotations

import time

import torch

from engine.core.logits_processors import uses_processors
from engine.core.outputs import error_text
from engine.core.sampler import Sampler, sampled_logprobs, sampling_probs, token_logprobs
from engine.core.spec_decode.metrics import SpecDecodeStats
from engine.core.spec_decode.ngram import NgramProposer
from engine.core.spec_decode.rejection import rejection_sample, verify_greedy
from engine.core.step_result import StepResult

MODES = ("none", "ngram", "draft")


class Speculator:
    def __init__(self, config, target, kv_cache, sampler: Sampler, max_seq_len: int):
        """`target`: the engine's LoadedModel; `kv_cache`: its KVCacheManager."""
        if config.speculative_mode not in MODES[1:]:
            raise ValueError(f"unknown speculative_mode {config.speculative_mode!r}; choose from {MODES}")
        if config.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {config.num_speculative_tokens}")
        self.mode = config.speculative_mode
        self.k = config.num_speculative_tokens
        self.target = target
        self.kv_cache = kv_cache
        self.sampler = sampler
        self.max_seq_len = max_seq_len
        self.vocab_size = target.vocab_size
        if self.mode == "ngram":
            self.ngram = NgramProposer(self.k, config.ngram_min, config.ngram_max)
            self.draft = None
        else:
            self.ngram = None
            self.draft = _build_draft_proposer(config, target, kv_cache)
        self.step_stats = SpecDecodeStats()  # this step's drafts (reset by `propose`)
        self.total_stats = SpecDecodeStats()  # since the engine started
        self._drafts: dict[int, list[int]] = {}  # batch index -> this step's draft tokens
        self._in_sequence: set[int] = set()  # batch indices whose drafts still sit in seq.token_ids

    # -- 1. before the forward ---------------------------------------------------------

    def propose(self, batch, live_request_ids=None) -> float:
        """Give the batch's decode sequences their drafts (see the module docstring).

        Returns the seconds spent in the draft model's forwards (0 for n-gram lookup).
        """
        self.step_stats = SpecDecodeStats()
        self._drafts = {}
        self._in_sequence = set()
        bs = self.kv_cache.block_size
        wanted = []  # (batch index, seq, k)
        for i, seq in enumerate(batch.seqs):
            if not (batch.samples[i] and batch.num_new_tokens[i] == 1 and seq.num_output_tokens > 0):
                continue
            if uses_processors(seq.sampling_params):  # verification scores raw logits: such a request gets no draft
                continue
            n = len(seq.token_ids)
            k = min(self.k,
                    len(seq.block_table) * bs - n,  # reserved slots: positions n-1 .. n-1+k must exist
                    seq.sampling_params.max_tokens - seq.num_output_tokens - 1,  # emits up to k + 1
                    self.max_seq_len - n - 1)
            if k >= 1:
                wanted.append((i, seq, k))
        if not wanted:
            return 0.0
        draft_seconds = 0.0
        if self.ngram is not None:
            proposals = [self.ngram.propose(seq.token_ids, k) for _, seq, k in wanted]
        else:
            if live_request_ids is not None:
                self.draft.retain(live_request_ids)
            t = time.perf_counter()
            proposals = self.draft.propose([(seq.request_id, seq.token_ids, k) for _, seq, k in wanted])
            draft_seconds = time.perf_counter() - t
        for (i, seq, _), drafts in zip(wanted, proposals, strict=True):
            # a draft model with a larger vocabulary may propose ids the target does not have
            drafts = drafts[:next((j for j, t in enumerate(drafts) if t >= self.vocab_size), len(drafts))]
            if not drafts:
                continue
            self._drafts[i] = drafts
            self._in_sequence.add(i)
            seq.token_ids.extend(drafts)
            batch.num_new_tokens[i] += len(drafts)
            batch.num_decode_tokens += len(drafts)
        return draft_seconds

    # -- 2. after the forward ----------------------------------------------------------

    @torch.inference_mode()
    def sample(self, batch, sampling: list, outputs, model) -> StepResult:
        """Tokens for every sampling sequence (`sampling` in batch order, as the runner's
        `sample_logits` rows are); `outputs` is the runner's ModelOutputs."""
        spec_index = {id(batch.seqs[i]): i for i in self._drafts}
        plain = [j for j, seq in enumerate(sampling) if id(seq) not in spec_index]
        if len(plain) == len(sampling):
            return self.sampler(outputs.sample_logits, sampling).as_step_result()
        result = StepResult([[] for _ in sampling], [[] for _ in sampling], [None] * len(sampling))
        if plain:
            rows = torch.tensor(plain, device=outputs.sample_logits.device)
            part = self.sampler(outputs.sample_logits[rows], [sampling[j] for j in plain]).as_step_result()
            for row, j in enumerate(plain):
                result.token_ids[j], result.raw_logprobs[j] = part.token_ids[row], part.raw_logprobs[row]
                result.logprobs[j] = part.logprobs[row]
                if row in part.errors:
                    result.errors[j] = part.errors[row]
        starts = [0]
        for n in batch.num_new_tokens:
            starts.append(starts[-1] + n)
        # all verification rows of all drafted sequences: one lm_head matmul
        spans = [(j, spec_index[id(seq)]) for j, seq in enumerate(sampling) if id(seq) in spec_index]
        row_ids = [r for _, i in spans for r in range(starts[i], starts[i + 1])]
        all_logits = model.compute_logits(outputs.hidden[torch.tensor(row_ids, device=outputs.hidden.device)])
        offset = 0
        for j, i in spans:
            seq, drafts = sampling[j], self._drafts[i]
            logits = all_logits[offset:offset + len(drafts) + 1]
            offset += len(drafts) + 1
            del seq.token_ids[-len(drafts):]  # drafts leave the sequence; accepted ones come back
            self._in_sequence.discard(i)
            batch.num_new_tokens[i] = 1  # the engine counts the committed token, and the accepted drafts
            try:  # a failure here is this request's alone (the engine ends it, the batch goes on)
                result.token_ids[j], result.raw_logprobs[j], result.logprobs[j] = self._verify(seq, drafts, logits)
            except Exception as e:  # noqa: BLE001
                result.errors[j] = error_text(e)
        return result

    def _verify(self, seq, drafts: list[int], logits: torch.Tensor):
        """One drafted sequence's tokens (the accepted drafts and a correction or bonus token), their raw
        logprobs and, when asked, their top-n logprobs; `logits`: the target's rows at the drafts' positions
        and one past."""
        params = seq.sampling_params
        if params.greedy:
            result = verify_greedy(logits, drafts)
        else:
            generator = seq.generator if seq.generator is not None else self.sampler.generator
            # the sampler's own distribution for this request, at each of the rows
            result = rejection_sample(sampling_probs(logits, [params] * len(logits)), drafts, None, generator)
        # raw logprobs of the accepted drafts and the correction / bonus token: the target's
        # logits at those positions (row i scores the token after draft i - 1)
        n = len(result.token_ids)
        emitted = torch.tensor(result.token_ids, device=logits.device)
        raw = sampled_logprobs(logits[:n], emitted).tolist()
        logprobs = token_logprobs(logits[:n], emitted, [params.logprobs] * n) if params.logprobs is not None else None
        seq.spec_proposed += len(drafts)
        seq.spec_accepted += result.num_accepted
        for stats in (self.step_stats, self.total_stats):
            stats.observe(len(drafts), result.num_accepted)
        return result.token_ids, raw, logprobs

    def discard(self, batch) -> None:
        """The step failed between `propose` and `sample`: take the drafts back out of the
        sequences, so that they never show up as output tokens."""
        for i in self._in_sequence:
            del batch.seqs[i].token_ids[-len(self._drafts[i]):]
        self._in_sequence = set()

    @property
    def step_record_fields(self) -> dict:
        s = self.step_stats
        return {"spec_proposed": s.num_draft_tokens, "spec_accepted": s.num_accepted_tokens,
                "spec_accepted_per_pos": list(s.accepted_per_pos), "spec_num_drafts": s.num_drafts}


def _build_draft_proposer(config, target, kv_cache):
    from engine.core.attention import get_backend
    from engine.core.models import load_model
    from engine.core.spec_decode.draft import DraftModelProposer

    if not config.draft_model:
        raise ValueError("speculative_mode 'draft' needs draft_model (a local model directory)")
    check_same_tokenizer(config.model, config.draft_model)
    draft = load_model(config.draft_model, config.dtype, config.device)
    # room for as many tokens as the target's pool, plus k lookahead slots per sequence
    per_seq = -(-(config.num_speculative_tokens + 1) // kv_cache.block_size)
    num_blocks = kv_cache.num_blocks + config.max_num_seqs * per_seq
    return DraftModelProposer(draft, get_backend(config.attention_backend, config.device),
                              config.num_speculative_tokens, kv_cache.block_size, num_blocks)


def check_same_tokenizer(target_dir, draft_dir) -> None:
    """A draft model must map text to the same token ids as the target."""
    from transformers import AutoTokenizer

    try:
        t = AutoTokenizer.from_pretrained(str(target_dir)).get_vocab()
        d = AutoTokenizer.from_pretrained(str(draft_dir)).get_vocab()
    except Exception as e:  # noqa: BLE001 - name the directory, keep the cause
        raise ValueError(f"cannot compare the tokenizers of {target_dir} and {draft_dir}: {e}") from e
    if t != d:
        diff = len(set(t.items()) ^ set(d.items()))
        raise ValueError(f"draft model {draft_dir} does not share the target's tokenizer "
                         f"({diff} vocabulary entries differ); speculative decoding needs the same token ids")
