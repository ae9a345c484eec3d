"""Turns logits into tokens, for the whole batch at once.

First the logits processors that change greedy output too (logit_bias,
repetition / frequency / presence penalties: engine/core/logits_processors.py, on a
copy, only when a row uses them). Greedy rows take the argmax of those logits.
Other rows are scaled by their temperature, cut by min_p, then by top-k and
top-p (one sort shared by both), and sampled with the exponential race
`argmax(p / E)`, E ~ Exp(1) - which draws exactly from p. A request with a
seed draws its noise from its own torch.Generator, always a full vocabulary
row per step, so its tokens depend only on its seed and its logits, never on
what else is in the batch.

Logprobs are those of the model (log_softmax of the raw logits, before
penalties, bias, temperature and truncation), as vLLM and transformers report
them. Every row's sampled token gets its raw logprob whether or not the
request asked (`SamplerOutput.sampled_logprobs`, appended by the engine to
`Sequence.output_logprobs`, the store's requests.output_logprobs: quality drift
under sampled traffic reads it); it costs one max-shifted exp-sum over
the batch, `logit[token] - logsumexp(logits)`, no [N, V] output (greedy rows get the
token and the max from one `max`).

A request's failure stays its own: when the batched pass raises, the rows are
sampled one by one and only those that raise alone are failed (`SamplerOutput.errors`;
the engine ends them with finish reason "error").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.host_tensor import host_tensor
from engine.core.logits_processors import apply_min_p, apply_raw_processors
from engine.core.outputs import TokenLogprob, error_text
from engine.core.sequence import Sequence
from engine.core.step_result import StepResult


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]  # per row; None where not asked
    sampled_logprobs: list[float]  # per row: the raw logprob of its token
    # rows whose request failed on its own (its parameters, grammar or processors) -> the error; None: none
    errors: dict[int, str] | None = None

    def as_step_result(self) -> StepResult:
        """These rows (one token each) in the shape every path of a step gives the engine."""
        return StepResult([[t] for t in self.token_ids], [[r] for r in self.sampled_logprobs],
                          [[lp] if lp is not None else None for lp in self.logprobs], self.errors or {})


class Sampler:
    def __init__(self, seed: int = 0, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        # noise for requests without a seed of their own
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        """`logits` [N, V] float32, one row per sequence in `seqs`.

        One request's parameters, grammar or processors must not fail the others: when the batched
        pass raises, each row is sampled alone, and the rows that raise alone are named in `errors`
        (their token is -1, never appended) while the others keep their tokens. Only that rare path pays;
        the batched pass runs as before. A row sampled again gets the token it would have got: greedy rows
        always, seeded rows whenever the batch raised before drawing their noise (parameters, processors
        and grammars all come before it; a raise after it would give them a fresh draw)."""
        try:
            return self._sample_batch(logits, seqs)
        except Exception as e:  # noqa: BLE001 - find the rows that fail on their own
            return self._sample_rows_alone(logits, seqs, e)

    def _sample_rows_alone(self, logits: torch.Tensor, seqs: list[Sequence], error: Exception) -> SamplerOutput:
        """The batched pass raised `error`: each row sampled alone, the rows that raise alone named in `errors`
        (the rare path, kept out of the step's own)."""
        if len(seqs) == 1:
            return SamplerOutput([-1], [None], [float("nan")], {0: error_text(error)})
        token_ids, logprobs, raw, errors = [], [], [], {}
        for i, seq in enumerate(seqs):
            try:
                one = self._sample_batch(logits[i:i + 1], [seq])
            except Exception as e:  # noqa: BLE001
                errors[i] = error_text(e)
                one = SamplerOutput([-1], [None], [float("nan")])
            token_ids += one.token_ids
            logprobs += one.logprobs
            raw += one.sampled_logprobs
        return SamplerOutput(token_ids, logprobs, raw, errors)

    def _sample_batch(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        params = [s.sampling_params for s in seqs]
        processed = apply_raw_processors(logits, seqs)  # `logits` itself when no row uses them
        row_max = None
        if not all(p.greedy for p in params):
            tokens = self._sample(processed, seqs, params)
        elif processed is logits and logits.dtype == torch.float32:
            # one pass gives the token and its logit, which is also the row max that the logsumexp needs
            row_max, tokens = logits.max(dim=-1)
        else:
            tokens = processed.argmax(dim=-1)
        token_ids = tokens.tolist()
        sampled_lps = sampled_logprobs(logits, tokens, row_max).tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(seqs)
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        if wanted:
            rows = host_tensor(wanted, torch.long, logits.device)
            top_n = [params[i].logprobs for i in wanted]
            for i, lp in zip(wanted, token_logprobs(logits[rows], tokens[rows], top_n)):
                logprobs[i] = lp
        return SamplerOutput(token_ids, logprobs, sampled_lps)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], params: list) -> torch.Tensor:
        """`logits`: after the raw processors (the greedy rows' argmax is theirs too); `params`: the rows'."""
        probs = sampling_probs(logits, params)
        noise = torch.empty_like(probs)
        if all(s.generator is None for s in seqs):
            noise.exponential_(generator=self.generator)
        else:
            self._seeded_noise(noise, seqs)
        sampled = (probs / noise).argmax(dim=-1)
        greedy = [p.greedy for p in params]
        if not any(greedy):
            return sampled
        return torch.where(host_tensor(greedy, torch.bool, logits.device), logits.argmax(dim=-1), sampled)

    def _seeded_noise(self, noise: torch.Tensor, seqs: list[Sequence]) -> None:
        """Fill `noise` row by row where a request has its own generator (a full vocabulary row per step,
        whatever else is in the batch); the other rows from the sampler's."""
        unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
        if unseeded:
            idx = host_tensor(unseeded, torch.long, noise.device)
            noise[idx] = torch.empty(len(unseeded), noise.shape[1], device=noise.device,
                                     dtype=noise.dtype).exponential_(generator=self.generator)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                noise[i].exponential_(generator=s.generator)


def sampling_probs(logits: torch.Tensor, params: list) -> torch.Tensor:
    """Each row's sampling distribution under its request's `params`: temperature (1.0 for a greedy row,
    whose argmax is taken apart), then min_p, then top-k / top-p. Speculative verification scores drafts
    against the same distribution."""
    vocab, device = logits.shape[-1], logits.device
    temps = host_tensor([1.0 if p.greedy else p.temperature for p in params], logits.dtype, device)
    x = logits / temps.unsqueeze(1)
    if any(p.min_p > 0.0 for p in params):
        x = apply_min_p(x, host_tensor([p.min_p for p in params], logits.dtype, device))
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = host_tensor([p.top_k if p.top_k > 0 else vocab for p in params], torch.long, device)
        # 2.0 for "off": a cumulative sum that rounds up to 1.0 must not cut the tail
        top_p = host_tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params], logits.dtype, device)
        x = apply_top_k_top_p(x, top_k, top_p)
    return torch.softmax(x, dim=-1)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf everything outside each row's top-k and top-p nucleus (the best token always stays)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    sorted_logits.masked_fill_(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the better tokens
    # rank 0 always stays: a top_p that rounds to 0 in float32 (5e-324) would otherwise cut every token
    sorted_logits[:, 1:].masked_fill_(mass_before[:, 1:] >= top_p[:, None], float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sampled_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                     row_max: torch.Tensor | None = None) -> torch.Tensor:
    """[N] raw log-softmax value of `token_ids[i]` under row i (float32, whatever the logits' dtype).

    `row_max`: each row's max when the caller has it and the tokens are the argmax (greedy),
    so the chosen logit is the max itself. The logsumexp is written out with one [N, V]
    temporary exponentiated in place (torch.logsumexp makes more): with the max merged into
    the argmax, 23.7 -> ~17 ms for greedy N=64, V=32k (1 thread, loaded machine: ~25% less).
    """
    x = logits.float()  # no copy when the logits are float32 already
    # an all -inf row (cannot happen for model logits) would give nan either way
    # (`unsqueeze(1)`: `[:, None]`'s view without the indexing parser, a few us per call at batch 1)
    if row_max is not None:  # the chosen logit is the max: (chosen - max) - lse = -lse, 2 ops fewer
        return (x - row_max.unsqueeze(1)).exp_().sum(dim=-1).log_().neg_()
    row_max = x.amax(dim=-1)
    chosen = x.gather(-1, token_ids.view(-1, 1).long()).squeeze(-1)
    lse = (x - row_max.unsqueeze(1)).exp_().sum(dim=-1).log_()
    return (chosen - row_max) - lse


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, top_n: list[int]) -> list[TokenLogprob]:
    """Logprob of `token_ids[i]` under row i, plus that row's `top_n[i]` most likely tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(-1, token_ids.view(-1, 1).long()).squeeze(-1).tolist()
    k = max(top_n)
    if k > 0:
        top_vals, top_ids = logprobs.topk(k, dim=-1)
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    out = []
    for i, (tok, lp) in enumerate(zip(token_ids.tolist(), chosen)):
        n = top_n[i]
        top = dict(zip(top_ids[i][:n], top_vals[i][:n])) if n > 0 else {}
        out.append(TokenLogprob(int(tok), lp, top))
    return out
