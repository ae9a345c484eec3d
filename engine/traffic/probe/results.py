"""What one probe round did, per replica: every probe's outcome, what was skipped and why.

The client's view only (status, lengths, finish reason): the token IDs are in the store, where the
replica recorded each probe under its request id, and that is what diagnostics and pins read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.traffic.probe.budget import Skipped


@dataclass
class ProbeResult:
    probe_id: str
    mode: str
    request_id: str
    ok: bool
    status: int  # HTTP status; 0: no answer (connection refused, timeout)
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    seconds: float | None = None  # client-side end to end
    adapted: str = ""  # how it was changed for the replica's chat template (engine.traffic.loadgen.client), "" if not


@dataclass
class ReplicaRound:
    url: str
    replica: str = ""  # the id it reported on /health ("" when it did not answer)
    model: str = ""
    error: str = ""  # why the replica was given up on in this round ("" when it answered throughout)
    results: list[ProbeResult] = field(default_factory=list)
    not_sent: list[Skipped] = field(default_factory=list)  # planned, but the replica was gone by then
    fillers_sent: int = 0
    fillers_failed: int = 0

    @property
    def ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)

    def solo_ok(self) -> list[str]:
        """The probe ids answered in solo mode: the rows a pin of this replica expects."""
        return [r.probe_id for r in self.results if r.ok and r.mode == "solo"]


@dataclass
class ProbeRound:
    round_id: str
    started: float  # epoch seconds
    seconds: float = 0.0
    replicas: list[ReplicaRound] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)  # by the plan: budget, context (on every replica)
    planned_tokens: int = 0  # estimated prompt + output tokens of the whole round
    token_budget: int | None = None

    @property
    def all_ok(self) -> bool:
        return bool(self.replicas) and all(not r.error and not r.failed for r in self.replicas)

    def replica(self, replica_id: str) -> ReplicaRound | None:
        return next((r for r in self.replicas if r.replica == replica_id), None)

    def to_dict(self) -> dict:
        return asdict(self)

    def format_table(self) -> str:
        budget = f" of a {self.token_budget}-token budget" if self.token_budget is not None else ""
        lines = [f"probe round {self.round_id}: {len(self.replicas)} replica(s), {self.seconds:.1f} s, "
                 f"~{self.planned_tokens} tokens{budget}",
                 f"  {'replica':<12} {'url':<28} {'ok':>4} {'failed':>6} {'skipped':>7}  error"]
        for r in self.replicas:
            skipped = len(self.skipped) + len(r.not_sent)
            lines.append(f"  {r.replica or '?':<12} {r.url:<28} {r.ok:>4} {r.failed:>6} {skipped:>7}  {r.error}")
        reasons: dict[str, int] = {}
        for s in self.skipped:
            reasons[s.reason] = reasons.get(s.reason, 0) + 1
        lines += [f"  skipped on every replica: {n} x {reason}" for reason, n in reasons.items()]
        for r in self.replicas:
            lines += [f"  {r.replica or r.url}: {p.probe_id}.{p.mode} failed (status {p.status}): {p.error}"
                      for p in r.results if not p.ok][:5]
        return "\n".join(lines)

    def one_line(self) -> str:
        """The scheduled prober's log line."""
        parts = [f"{r.replica or r.url} {r.ok} ok {r.failed} failed {len(self.skipped) + len(r.not_sent)} skipped"
                 + (f" ({r.error})" if r.error else "") for r in self.replicas]
        return f"round {self.round_id} ({self.seconds:.1f} s): " + "; ".join(parts)
