"""OpenAI / vLLM logits processors, batched over the rows of one sampling step.

Applied in vLLM's order (vllm/v1/sample/sampler.py):

1. on the raw logits, before greedy's argmax (they change greedy output too):
   - logit_bias: `logits[token] += bias` (one index_put over all rows' entries);
   - repetition_penalty (HF / CTRL, over prompt + output tokens): a seen token's
     logit is divided by the penalty when > 0, multiplied when <= 0;
   - frequency / presence penalty (OpenAI, over output tokens only):
     `logits -= frequency * count + presence * (count > 0)`;
   - response_format (engine/core/structured_output.py): -inf outside the tokens the request's
     grammar allows next (last, so no bias or penalty can bring a forbidden token back);
2. after temperature (the sampler's job): min_p removes every token whose
   probability is below `min_p * max probability` (then top-k / top-p).

Each step works only on the rows that use it and is skipped when no row does,
so a batch of default requests costs nothing. Token counts are one scatter-add
at `row * V + token` over the rows' token IDs, flattened by numpy (no Python loop
over tokens or the vocabulary).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.core.structured_output import apply_grammar_masks, is_constrained


def needs_raw_processing(p: SamplingParams) -> bool:
    """Whether the request changes the logits before greedy / temperature."""
    return bool(p.logit_bias) or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 \
        or p.frequency_penalty != 0.0 or is_constrained(p.response_format)


def uses_processors(p: SamplingParams) -> bool:
    """Whether any processor here changes the request's distribution (speculative verification, which
    scores drafts on the unprocessed logits, must then leave the request to the sampler)."""
    return needs_raw_processing(p) or p.min_p > 0.0


def apply_raw_processors(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Logit bias, then repetition / frequency / presence penalties, then grammar masks. Returns `logits`
    itself when no row uses any of them, else a new tensor (the raw logits stay untouched for the raw
    logprobs)."""
    params = [s.sampling_params for s in seqs]
    if not any(needs_raw_processing(p) for p in params):
        return logits
    x = logits.clone()
    apply_logit_bias(x, [p.logit_bias for p in params])
    rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if rows:
        penalty = torch.tensor([params[i].repetition_penalty for i in rows], device=x.device, dtype=x.dtype)
        seen = token_counts([seqs[i].token_ids for i in rows], x.shape[-1], x.device) > 0
        apply_repetition_penalty(x, _index(rows, len(seqs)), seen, penalty)
    rows = [i for i, p in enumerate(params) if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0]
    if rows:
        counts = token_counts([seqs[i].output_token_ids for i in rows], x.shape[-1], x.device)
        presence = torch.tensor([params[i].presence_penalty for i in rows], device=x.device, dtype=x.dtype)
        frequency = torch.tensor([params[i].frequency_penalty for i in rows], device=x.device, dtype=x.dtype)
        apply_frequency_presence(x, _index(rows, len(seqs)), counts, frequency, presence)
    rows = [i for i, p in enumerate(params) if is_constrained(p.response_format)]
    if rows:
        states = [_grammar(seqs[i]) for i in rows]
        for i, state in zip(rows, states):  # catch up with the tokens sampled since its last mask
            state.advance(seqs[i].token_ids, seqs[i].num_prompt_tokens)
        apply_grammar_masks(x, states, rows)
    return x


def _grammar(seq: Sequence):
    """The sequence's GrammarState (LLMEngine.make_sequence attaches it)."""
    state = seq.grammar
    if state is None:
        raise RuntimeError(f"request {seq.request_id!r} has a response_format but no grammar "
                           "(it was not made by LLMEngine.make_sequence)")
    return state


def _index(rows: list[int], n: int) -> list[int] | slice:
    """All rows: a slice (a view, no gather / scatter copies of [N, V])."""
    return slice(None) if len(rows) == n else rows


def token_counts(token_lists: list[list[int]], vocab: int, device) -> torch.Tensor:
    """[rows, vocab] float counts of each row's token IDs: one scatter-add at `row * vocab + token`
    (counts are integers, exact in float32 below 2**24, whatever order the adds run in)."""
    lengths = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
    flat = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=int(lengths.sum()))
    flat += np.repeat(np.arange(len(token_lists), dtype=np.int64) * vocab, lengths)
    index = torch.from_numpy(flat).to(device)
    counts = torch.zeros(len(token_lists) * vocab, device=device)
    counts.scatter_add_(0, index, torch.ones(index.shape, device=device))
    return counts.view(len(token_lists), vocab)


def apply_logit_bias(x: torch.Tensor, biases: list[dict[int, float] | None]) -> None:
    """In place: `x[i, token] += bias` for every row's entries."""
    rows, cols, vals = [], [], []
    for i, bias in enumerate(biases):
        if bias:
            rows.extend([i] * len(bias))
            cols.extend(bias.keys())
            vals.extend(bias.values())
    if rows:
        index = (torch.tensor(rows, device=x.device), torch.tensor(cols, device=x.device))
        x.index_put_(index, torch.tensor(vals, device=x.device, dtype=x.dtype), accumulate=True)


def apply_repetition_penalty(x: torch.Tensor, rows: list[int] | slice, seen: torch.Tensor,
                             penalty: torch.Tensor) -> None:
    """In place on `x[rows]`: seen tokens' logits / penalty where > 0, * penalty where <= 0. Kept finite: a
    penalty below the dtype's range (2.7e-201 is 0 in float32) gave x / 0 = inf and 0 / 0 = NaN, and then
    NaN probabilities and an arbitrary token (one a grammar forbids: schemathesis found it); one above it
    (1e300 is inf in float32) gave 0 * inf = NaN."""
    finfo = torch.finfo(x.dtype)
    sub = x[rows]
    factor = torch.where(seen, penalty.clamp(finfo.tiny, finfo.max)[:, None], 1.0)
    x[rows] = torch.where(sub > 0, sub / factor, sub * factor).clamp(finfo.min, finfo.max)


def apply_frequency_presence(x: torch.Tensor, rows: list[int] | slice, counts: torch.Tensor, frequency: torch.Tensor,
                             presence: torch.Tensor) -> None:
    """In place on `x[rows]`: minus frequency * count, minus presence where the count is > 0."""
    x[rows] -= frequency[:, None] * counts + presence[:, None] * (counts > 0).to(x.dtype)


def apply_min_p(x: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """`x` temperature-scaled logits [N, V], `min_p` [N] (0: off): -inf where p < min_p * max p."""
    probs = torch.softmax(x, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return x.masked_fill(probs < threshold, float("-inf"))
