"""Verifying draft tokens against the target model.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): with target
distribution p and draft distribution q at each draft position, accept draft
token x with probability min(1, p(x) / q(x)); at the first rejection emit a
token sampled from normalize(max(0, p - q)) and stop; if all k drafts are
accepted, emit a bonus token sampled from p at position k + 1. Every emitted
token is then distributed exactly as if sampled from p directly.

Deterministic proposers (n-gram, greedy draft model) have a one-hot q: x is
accepted with probability p(x), and the residual is p without x, renormalized.
Greedy decoding (temperature 0) reduces to: accept while the draft equals the
target's argmax, then emit the argmax.

Each call returns the emitted tokens: the accepted drafts plus exactly one
more (the correction or the bonus), so a verification step always advances
the sequence by 1 + num_accepted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VerifyResult:
    token_ids: list[int]  # accepted drafts, then the correction / bonus token
    num_accepted: int  # accepted draft tokens (len(token_ids) - 1)


def verify_greedy(target_logits: torch.Tensor, draft_token_ids: list[int]) -> VerifyResult:
    """target_logits [k + 1, V]: row i scores the token after draft i - 1."""
    _check(target_logits, draft_token_ids)
    argmax = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft_token_ids) and draft_token_ids[accepted] == argmax[accepted]:
        accepted += 1
    return VerifyResult(draft_token_ids[:accepted] + [argmax[accepted]], accepted)


def rejection_sample(target_probs: torch.Tensor, draft_token_ids: list[int],
                     draft_probs: torch.Tensor | None = None,
                     generator: torch.Generator | None = None) -> VerifyResult:
    """target_probs [k + 1, V] (the target's sampling distribution at each position,
    after temperature / top-k / top-p); draft_probs [k, V] or None for a one-hot
    (deterministic) proposer."""
    _check(target_probs, draft_token_ids)
    k = len(draft_token_ids)
    if draft_probs is not None and draft_probs.shape != (k, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be [{k}, {target_probs.shape[1]}], got {list(draft_probs.shape)}")
    rows = torch.arange(k, device=target_probs.device)
    drafted = torch.tensor(draft_token_ids, dtype=torch.long, device=target_probs.device)
    p_x = target_probs[rows, drafted].tolist()
    q_x = draft_probs[rows, drafted].tolist() if draft_probs is not None else [1.0] * k
    # one uniform per draft position, drawn up front so the stream of random numbers
    # does not depend on where the first rejection falls
    device = generator.device if generator is not None else target_probs.device
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64, device=device).tolist()
    for i, x in enumerate(draft_token_ids):
        if q_x[i] <= 0.0 or uniforms[i] * q_x[i] < p_x[i]:  # accept with prob min(1, p/q), no division
            continue
        p = target_probs[i].to(torch.float64)
        # max(0, p - q); a one-hot q takes only x away. A rejection means p(x) < q(x), so either way x is out
        residual = p.clone() if draft_probs is None else (p - draft_probs[i].to(torch.float64)).clamp_(min=0.0)
        residual[x] = 0.0
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: a rejection is impossible in exact math
            residual = p
        token = int(torch.multinomial(residual, 1, generator=generator))
        return VerifyResult(list(draft_token_ids[:i]) + [token], i)
    bonus = int(torch.multinomial(target_probs[k].to(torch.float64), 1, generator=generator))
    return VerifyResult(list(draft_token_ids) + [bonus], k)


def _check(target: torch.Tensor, draft_token_ids: list[int]) -> None:
    if target.dim() != 2 or target.shape[0] != len(draft_token_ids) + 1:
        raise ValueError(f"target rows must be len(draft) + 1 = {len(draft_token_ids) + 1}, "
                         f"got shape {list(target.shape)}")
    vocab = target.shape[1]
    bad = [t for t in draft_token_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"draft token ids {bad} outside the vocabulary [0, {vocab})")
