"""What one diagnostic run is asked: the scope, an optional baseline / candidate pair, and where
the replicas' tokenizers live. Every diagnostic is `run(store, request) -> list[Finding]`."""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnostics.scope import Scope


@dataclass(frozen=True)
class DiagnosticRequest:
    scope: Scope
    baseline: Scope | None = None  # with `candidate`: compare these two sides (regression, drift, speculative)
    candidate: Scope | None = None
    model_dirs: dict[str, str] = field(default_factory=dict)  # replica id or model name -> tokenizer directory

    @property
    def comparison(self) -> tuple[Scope, Scope] | None:
        """(baseline, candidate) when both are given."""
        return (self.baseline, self.candidate) if self.baseline is not None and self.candidate is not None else None
