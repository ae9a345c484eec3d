"""What a replay run says: the share of stored prompts the candidate answers token for token as the
reference did (with its Wilson interval), and where the others first diverge.

Computed from the run alone (a file or the store), so the gate reads the same numbers the replay
printed: each item's `reference` holds the reference's output token IDs (JSON), its
`output_token_ids` the candidate's; an item whose candidate request failed (`[error] ...` as its
output text) counts as not identical and has no divergence position.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from evals.results import EvalRun
from evals.stats import first_divergence, wilson_interval

SUITE_PREFIX = "replay:"
SCORER = "replay_tokens"  # score 1.0: the candidate's output token IDs equal the reference's
ERROR_PREFIX = "[error] "


def is_replay_run(run: EvalRun) -> bool:
    return run.run.suite.startswith(SUITE_PREFIX)


def reference_tokens(reference: str) -> list[int]:
    return [int(t) for t in json.loads(reference or "[]")]


@dataclass
class ReplaySummary:
    run_id: str
    suite: str
    endpoint: str
    items: int
    identical: int
    errors: int  # candidate requests that failed (counted as not identical)
    share: float  # identical / items
    ci: tuple[float, float]
    divergence_positions: list[int] = field(default_factory=list)  # first differing output index, per mismatch
    median_first_divergence: float | None = None
    min_first_divergence: int | None = None

    def lines(self) -> list[str]:
        lo, hi = self.ci
        out = [f"replay {self.run_id} ({self.suite}) against {self.endpoint}:",
               f"  items {self.items}, identical {self.identical} = {self.share:.1%} "
               f"[95% CI {lo:.1%} - {hi:.1%}], errors {self.errors}"]
        if self.divergence_positions:
            out.append(f"  first divergence (output token index): median {self.median_first_divergence:g}, "
                       f"min {self.min_first_divergence}, over {len(self.divergence_positions)} differing items")
        return out


def summarize_replay(run: EvalRun, confidence: float = 0.95) -> ReplaySummary:
    if not is_replay_run(run):
        raise ValueError(f"run {run.run_id} (suite {run.run.suite!r}) is not a replay run")
    identical = sum(1 for i in run.items if i.score >= 0.5)
    errors = sum(1 for i in run.items if i.output_text.startswith(ERROR_PREFIX))
    pos = [d for i in run.items if i.score < 0.5 and not i.output_text.startswith(ERROR_PREFIX)
           for d in [first_divergence(reference_tokens(i.reference), i.output_token_ids)] if d is not None]
    n = len(run.items)
    return ReplaySummary(run.run_id, run.run.suite, run.run.endpoint, n, identical, errors,
                         identical / n if n else float("nan"), wilson_interval(identical, n, confidence), pos,
                         float(np.median(pos)) if pos else None, min(pos) if pos else None)
