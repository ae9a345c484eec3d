"""Drift of a candidate configuration from a baseline run.

The baseline's outputs are teacher-forced under both configurations (prompt +
output in one prefill each), and at every output position the two full
next-token distributions are compared as llama.cpp's perplexity tool does
(KL divergence, same top token, Δp of the token in the text). Where the
candidate also has a run over the same items, its greedy outputs are compared
with the baseline's: how many are identical and where the others first diverge.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from evals.results import EvalRun
from evals.stats import DriftStats, GreedyAgreement, drift_from_positions, greedy_agreement

if TYPE_CHECKING:  # torch is imported only by the callers that score (the dashboard reads reports)
    from evals.teacher_forcing import EngineScorer


@dataclass
class WorstPosition:
    item_id: str
    position: int  # index into the output tokens
    token_id: int  # the baseline's output token there
    kl: float
    baseline_top: int
    candidate_top: int
    # the same three tokens as text (the tokenizer's piece for each ID), so a report reads without a vocab
    token: str = ""
    baseline_top_token: str = ""
    candidate_top_token: str = ""


@dataclass
class DriftReport:
    items: int
    stats: DriftStats | None = None
    greedy: GreedyAgreement | None = None
    # share of output positions where the baseline config, teacher-forced, puts the baseline run's own
    # token first: ~1.0 means the run really came from this config (greedy), so the KL is meaningful
    baseline_reproduction: float | None = None
    worst: list[WorstPosition] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.greedy is not None:
            d["greedy"]["divergence_positions"] = self.greedy.divergence_positions[:50]
        return d


def _sequences(runs: list[EvalRun]) -> tuple[list[str], list[list[int]], list[int]]:
    ids, seqs, starts = [], [], []
    for run in runs:
        for item in run.items:
            if not item.input_token_ids or not item.output_token_ids:
                continue  # errored items have nothing to teacher-force
            ids.append(f"{run.run.suite}/{item.item_id}")
            seqs.append(list(item.input_token_ids) + list(item.output_token_ids))
            starts.append(len(item.input_token_ids))
    return ids, seqs, starts


def _piece_of(scorer):
    """token id -> its text, from the scorer's tokenizer (the ID in brackets where there is none)."""
    tok = getattr(getattr(scorer, "engine", None), "tokenizer", None)
    if tok is None:
        return lambda i: f"<{i}>"
    return tok.piece if hasattr(tok, "piece") else (lambda i: tok.decode([i]))


def _teacher_forcing_bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc="teacher-forcing (baseline + candidate)", unit="seq",
                dynamic_ncols=True)


def logit_drift(baseline_runs: list[EvalRun], baseline: EngineScorer, candidate: EngineScorer,
                worst: int = 5, progress: bool = False) -> tuple[DriftStats, float, list[WorstPosition]]:
    """Teacher-force the baseline runs' outputs under both scorers and summarise the drift (a progress
    bar per scored sequence when `progress`)."""
    if baseline.vocab_size != candidate.vocab_size:
        raise ValueError(f"baseline and candidate vocabularies differ ({baseline.vocab_size} vs "
                         f"{candidate.vocab_size}): they cannot be compared position by position")
    names, seqs, starts = _sequences(baseline_runs)
    if not seqs:
        raise ValueError("the baseline runs hold no output tokens to teacher-force")
    kls, same, dps, repro = [], [], [], []
    candidates: list[WorstPosition] = []
    bar = _teacher_forcing_bar(len(seqs), progress)
    for (i, p), (j, q) in zip(baseline.logprobs(seqs, starts), candidate.logprobs(seqs, starts)):
        assert i == j
        bar.update(1)
        tok = np.asarray(seqs[i][starts[i]:])
        rows = np.arange(len(tok))
        kl = np.sum(np.exp(p) * (p - q), axis=-1)
        ptop, qtop = p.argmax(-1), q.argmax(-1)
        kls.append(kl)
        same.append(ptop == qtop)
        dps.append(np.exp(q[rows, tok]) - np.exp(p[rows, tok]))
        repro.append(ptop == tok)
        k = int(kl.argmax())
        candidates.append(WorstPosition(names[i], k, int(tok[k]), float(kl[k]), int(ptop[k]), int(qtop[k])))
    bar.close()
    stats = drift_from_positions(np.concatenate(kls), np.concatenate(same), np.concatenate(dps))
    candidates.sort(key=lambda w: -w.kl)
    piece = _piece_of(baseline)
    for w in candidates[:worst]:
        w.token, w.baseline_top_token, w.candidate_top_token = (piece(w.token_id), piece(w.baseline_top),
                                                                piece(w.candidate_top))
    return stats, float(np.mean(np.concatenate(repro))), candidates[:worst]


def output_agreement(baseline_runs: list[EvalRun], candidate_runs: list[EvalRun]) -> GreedyAgreement:
    """Greedy agreement over the items both sides ran (matched by suite and item id)."""
    cand = {(r.run.suite, i.item_id): i.output_token_ids for r in candidate_runs for i in r.items}
    pairs = [(i.output_token_ids, cand[(r.run.suite, i.item_id)]) for r in baseline_runs for i in r.items
             if (r.run.suite, i.item_id) in cand]
    if not pairs:
        raise ValueError("the baseline and candidate runs share no items")
    return greedy_agreement([a for a, _ in pairs], [b for _, b in pairs])


def compute_drift(baseline_runs: list[EvalRun], baseline: EngineScorer | None = None,
                  candidate: EngineScorer | None = None, candidate_runs: list[EvalRun] | None = None,
                  progress: bool = False) -> DriftReport:
    report = DriftReport(items=sum(len(r.items) for r in baseline_runs))
    if baseline is not None and candidate is not None:
        report.stats, report.baseline_reproduction, report.worst = logit_drift(baseline_runs, baseline, candidate,
                                                                               progress=progress)
    if candidate_runs:
        report.greedy = output_agreement(baseline_runs, candidate_runs)
    return report
