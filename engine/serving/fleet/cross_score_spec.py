"""The fleet's `[cross_score]` table: continuous cross-scoring (engine/traffic/probe/cross_scoring.py), on by default.

```toml
[cross_score]
enabled = true        # false: off (the one setting)
share = 0.05          # of each replica's finished requests, scored by a peer and by itself
token_share = 0.1     # most rescore tokens per token the fleet served
interval = "15s"      # between passes
```
`fleet up` starts it (as the prober process, `infersight probe --fleet ... --cross-score`) where the
fleet owns its store (it then also scores the fleets that write there, engine/traffic/probe/cross_targets.py)
or has two or more replicas; a fleet with one replica and no store of its own is scored by the
store's owner.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.util import parse_interval

DEFAULT_SHARE = 0.05  # of each replica's finished requests
DEFAULT_TOKEN_SHARE = 0.1  # rescore tokens (both scorers) per token served: a prefill token costs less than a served one
DEFAULT_INTERVAL = 15.0  # seconds between passes
SETTLE_SECONDS = 8.0  # a finished request's row reaches the store within the recorder's flush interval
CROSS_SCORE_FLAG = "--cross-score"  # in a prober's command: that fleet cross-scores itself


@dataclass(frozen=True)
class CrossScoreSettings:
    """What the scorer runs with (the prober's --cross-* options); defined beside the fleet's table so the
    fleet, which starts the scorer, and the scorer, which imports serving, read one definition."""

    share: float = DEFAULT_SHARE
    token_share: float = DEFAULT_TOKEN_SHARE
    interval: float = DEFAULT_INTERVAL
    settle: float = SETTLE_SECONDS

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"cross-scoring share must be in (0, 1], got {self.share!r}")
        if not 0 < self.token_share <= 1:
            raise ValueError(f"cross-scoring token share must be in (0, 1], got {self.token_share!r}")
        if not self.interval > 0:
            raise ValueError(f"cross-scoring interval must be positive seconds, got {self.interval!r}")


CROSS_SCORE_KEYS = {"enabled": bool, "share": float, "token_share": float, "interval": (str, float)}


@dataclass
class CrossScoreSpec:
    enabled: bool = True
    share: float = DEFAULT_SHARE
    token_share: float = DEFAULT_TOKEN_SHARE
    interval: float = DEFAULT_INTERVAL

    def arguments(self) -> list[str]:
        """The prober's options that run it."""
        return [CROSS_SCORE_FLAG, "--cross-share", f"{self.share:g}", "--cross-token-share", f"{self.token_share:g}",
                "--cross-interval", f"{self.interval:g}s"]

    def wanted(self, owns_store: bool, replicas: int) -> bool:
        return self.enabled and (owns_store or replicas >= 2)


def parse_cross_score(table, check_keys) -> CrossScoreSpec:
    """`check_keys(table, allowed, where)`: the fleet config's key and type check."""
    if not isinstance(table, dict):
        raise ValueError(f"[cross_score] must be a table (enabled, share, token_share, interval), got {table!r}")
    check_keys(table, CROSS_SCORE_KEYS, "[cross_score]")
    if "enabled" in table and not isinstance(table["enabled"], bool):
        raise ValueError(f"[cross_score]: enabled must be true or false, got {table['enabled']!r}")
    spec = CrossScoreSpec(enabled=table.get("enabled", True))
    try:
        spec.interval = parse_interval(table.get("interval", DEFAULT_INTERVAL))
        for key in ("share", "token_share"):
            value = table.get(key, getattr(spec, key))
            if isinstance(value, bool):
                raise ValueError(f"{key} must be a number in (0, 1], got {value!r}")
            setattr(spec, key, float(value))
        CrossScoreSettings(spec.share, spec.token_share, spec.interval)  # the same checks as the scorer's
    except ValueError as e:
        raise ValueError(f"[cross_score]: {e}") from None
    return spec
