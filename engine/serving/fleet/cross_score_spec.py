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

from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class CrossScoreSpec:
    """The fleet's table: whether `fleet up` starts the scorer, and what it runs with."""

    enabled: bool = True
    settings: CrossScoreSettings = field(default_factory=CrossScoreSettings)

    def arguments(self) -> list[str]:
        """The prober's options that run it."""
        s = self.settings
        return [CROSS_SCORE_FLAG, "--cross-share", f"{s.share:g}", "--cross-token-share", f"{s.token_share:g}",
                "--cross-interval", f"{s.interval:g}s"]

    def wanted(self, owns_store: bool, replicas: int) -> bool:
        return self.enabled and (owns_store or replicas >= 2)


def parse_cross_score(table, check_keys) -> CrossScoreSpec:
    """`check_keys(table, allowed, where)`: the fleet config's key and type check."""
    if not isinstance(table, dict):
        raise ValueError(f"[cross_score] must be a table (enabled, share, token_share, interval), got {table!r}")
    check_keys(table, CROSS_SCORE_KEYS, "[cross_score]")
    if "enabled" in table and not isinstance(table["enabled"], bool):
        raise ValueError(f"[cross_score]: enabled must be true or false, got {table['enabled']!r}")
    try:
        interval = parse_interval(table.get("interval", DEFAULT_INTERVAL))
        shares = {}
        for key, default in (("share", DEFAULT_SHARE), ("token_share", DEFAULT_TOKEN_SHARE)):
            value = table.get(key, default)
            if isinstance(value, bool):
                raise ValueError(f"{key} must be a number in (0, 1], got {value!r}")
            shares[key] = float(value)
        settings = CrossScoreSettings(interval=interval, **shares)  # the scorer's own checks
    except ValueError as e:
        raise ValueError(f"[cross_score]: {e}") from None
    return CrossScoreSpec(enabled=table.get("enabled", True), settings=settings)
