"""Speculative-decoding counters, in vLLM's conventions.

A *draft* is one sequence's proposal in one step (counted only when it has
at least one token). Then:
- acceptance rate            = accepted tokens / draft tokens
- mean acceptance length     = 1 + accepted tokens / drafts   (tokens emitted per target forward)
- acceptance rate at pos i   = drafts whose token i was accepted / drafts
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # index 0 = first draft token

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One sequence's verification: `num_accepted` of its `num_draft_tokens` accepted."""
        if not 0 <= num_accepted <= num_draft_tokens:
            raise ValueError(f"accepted {num_accepted} of {num_draft_tokens} draft tokens")
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft_tokens:
            self.accepted_per_pos.extend([0] * (num_draft_tokens - len(self.accepted_per_pos)))
        for pos in range(num_accepted):  # acceptance is a prefix: positions 0..accepted-1
            self.accepted_per_pos[pos] += 1

    def merge(self, other: "SpecDecodeStats") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        if len(self.accepted_per_pos) < len(other.accepted_per_pos):
            self.accepted_per_pos.extend([0] * (len(other.accepted_per_pos) - len(self.accepted_per_pos)))
        for pos, n in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[pos] += n

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance_rate(self) -> list[float]:
        return [n / self.num_drafts for n in self.accepted_per_pos] if self.num_drafts else []

    def as_dict(self) -> dict:
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens, "accepted_per_pos": list(self.accepted_per_pos),
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance_rate": self.per_position_acceptance_rate}
