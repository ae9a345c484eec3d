"""Speculative decoding inside the engine's step.

Per step, around the target model's one forward:

1. `propose(batch)` - after scheduling. Each decode sequence of the batch gets
   up to k draft tokens (n-gram lookup or the draft model), capped by the KV
   slots the scheduler reserved for it (`Scheduler.num_lookahead_tokens`), by
   its remaining `max_tokens` and by the longest a sequence may grow. The
   drafts are appended to the sequence's tokens for the runner, which then
   computes 1 + k tokens for it: query_len = 1 + k, one forward for the batch,
   and the logits of all 1 + k rows (`ScheduledBatch.samples`).
2. `sample(batch, sampling, logits)` - after the forward. Drafts are removed
   from the sequences again and verified against the target's logits at all
   1 + k rows (greedy: accept while the argmax agrees; otherwise rejection
   sampling from the sampler's own distribution, which keeps it). Sequences
   without a draft are sampled by the engine's sampler as usual. Every sequence gets a list
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
        self._drafts: dict[int, list[int]] = {}  # batch index -> this step's drafts, while in seq.token_ids

    # -- 1. before the forward ---------------------------------------------------------

    def propose(self, batch, live_request_ids=None) -> float:
        """Give the batch's decode sequences their drafts (see the module docstring).

        Returns the seconds spent in the draft model's forwards (0 for n-gram lookup).
        """
        self.step_stats = SpecDecodeStats()
        self._drafts = {}
        wanted = []  # (batch index, seq, how many drafts it may take)
        for i, seq in enumerate(batch.seqs):
            k = self._room(batch, i, seq)
            if k >= 1:
                wanted.append((i, seq, k))
        if not wanted:
            return 0.0
        if self.ngram is not None:
            proposals, draft_seconds = [self.ngram.propose(seq.token_ids, k) for _, seq, k in wanted], 0.0
        else:
            proposals, draft_seconds = self._draft_model_proposals(wanted, live_request_ids)
        for (i, seq, _), drafts in zip(wanted, proposals, strict=True):
            # a draft model with a larger vocabulary may propose ids the target does not have
            drafts = drafts[:next((j for j, t in enumerate(drafts) if t >= self.vocab_size), len(drafts))]
            if not drafts:
                continue
            self._drafts[i] = drafts
            seq.token_ids.extend(drafts)
            batch.num_new_tokens[i] += len(drafts)
            batch.samples[i] += len(drafts)  # every draft's row is verified, and the row after the last
            batch.num_decode_tokens += len(drafts)
        return draft_seconds

    def _room(self, batch, i: int, seq) -> int:
        """How many drafts batch sequence `i` may take: none unless it is a decode whose request verification
        can score (it scores raw logits: no logits processors); at most k, and no more than the KV slots the
        scheduler reserved for it, its remaining max_tokens (it emits up to k + 1) and the longest a
        sequence may grow allow."""
        if not (batch.samples[i] and batch.num_new_tokens[i] == 1 and seq.num_output_tokens > 0) \
                or uses_processors(seq.sampling_params):
            return 0
        n = len(seq.token_ids)
        return min(self.k, len(seq.block_table) * self.kv_cache.block_size - n,  # positions n-1 .. n-1+k
                   seq.sampling_params.max_tokens - seq.num_output_tokens - 1, self.max_seq_len - n - 1)

    def _draft_model_proposals(self, wanted: list, live_request_ids) -> tuple[list[list[int]], float]:
        """The draft model's drafts for `wanted` and the seconds its forwards took (after dropping the
        caches of requests no longer live)."""
        if live_request_ids is not None:
            self.draft.retain(live_request_ids)
        t = time.perf_counter()
        proposals = self.draft.propose([(seq.request_id, seq.token_ids, k) for _, seq, k in wanted])
        return proposals, time.perf_counter() - t

    # -- 2. after the forward ----------------------------------------------------------

    @torch.inference_mode()
    def sample(self, batch, sampling: list, logits: torch.Tensor) -> StepResult:
        """Tokens for every sampling sequence (`sampling` in batch order); `logits`: the runner's sample
        logits, one row per sequence without a draft, 1 + its drafts' rows for one with drafts."""
        drafted = self._take_back(batch)
        if not drafted:
            return self.sampler(logits, sampling).as_step_result()
        drafts = [drafted.get(i, []) for i, rows in enumerate(batch.samples) if rows]  # per sampling sequence
        first = [0]  # each sampling sequence's first logits row
        for d in drafts:
            first.append(first[-1] + len(d) + 1)
        result = StepResult([[] for _ in sampling], [[] for _ in sampling], [None] * len(sampling))
        plain = [j for j, d in enumerate(drafts) if not d]
        if plain:  # the sampler's, in one batch
            part = self.sampler(logits[[first[j] for j in plain]], [sampling[j] for j in plain]).as_step_result()
            for row, j in enumerate(plain):
                result.token_ids[j], result.raw_logprobs[j] = part.token_ids[row], part.raw_logprobs[row]
                result.logprobs[j] = part.logprobs[row]
                if row in part.errors:
                    result.errors[j] = part.errors[row]
        for j, d in enumerate(drafts):
            if not d:
                continue
            try:  # a failure here is this request's alone (the engine ends it, the batch goes on)
                result.token_ids[j], result.raw_logprobs[j], result.logprobs[j] = self._verify(
                    sampling[j], d, logits[first[j]:first[j + 1]])
            except Exception as e:  # noqa: BLE001
                result.errors[j] = error_text(e)
        return result

    def _take_back(self, batch) -> dict[int, list[int]]:
        """This step's drafts leave their sequences (the accepted ones come back as output tokens), each
        sequence counted as computing its one committed token; the drafts, by batch index."""
        drafts, self._drafts = self._drafts, {}
        for i, d in drafts.items():
            del batch.seqs[i].token_ids[-len(d):]
            batch.num_new_tokens[i] = batch.samples[i] = 1
        return drafts

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
        """The step failed between `propose` and `sample`: take the drafts back out of the sequences,
        so that they never show up as output tokens."""
        self._take_back(batch)

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
