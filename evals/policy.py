"""Gate policies: which suites to run and the thresholds a candidate must meet (TOML).

See evals/policies/default.toml for every key with its meaning; unknown keys
are errors, so a typo never silently turns a check off.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.config_values import wrong_type

PAIRED_TESTS = ("mcnemar", "bootstrap")


@dataclass
class Policy:
    # what to run when a side is given as a configuration
    suites: list[str] = field(default_factory=list)
    max_items: int | None = None  # per suite, None: all
    per_task: int | None = None  # first N items of every task, None: all
    max_tokens: int = 32
    # accuracy: per suite
    max_accuracy_drop: float = 0.02  # fail when baseline - candidate accuracy exceeds this
    alpha: float = 0.05  # fail when the paired test finds the candidate worse at this level
    paired_test: str = "mcnemar"  # "mcnemar" (mid-p) | "bootstrap"
    bootstrap_resamples: int = 10000
    confidence: float = 0.95  # of the Wilson and bootstrap intervals
    # drift: pooled over all suites' teacher-forced output positions (None: not checked)
    max_mean_kl: float | None = 0.01
    max_p99_kl: float | None = 0.1
    min_same_top_p: float | None = 0.98
    min_greedy_agreement: float | None = 0.95
    require_logit_drift: bool = True  # error (exit 2) when KL statistics cannot be computed
    # replay (`--replay`): share of stored production prompts the candidate answers token for token
    min_replay_agreement: float | None = 0.95
    seed: int = 0
    path: str = ""

    def validate(self) -> None:
        where = self.path or "policy"
        if self.paired_test not in PAIRED_TESTS:
            raise ValueError(f"{where}: paired_test must be one of {PAIRED_TESTS}, got {self.paired_test!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"{where}: alpha must be in (0, 1), got {self.alpha}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"{where}: confidence must be in (0, 1), got {self.confidence}")
        if not 0 <= self.max_accuracy_drop <= 1:
            raise ValueError(f"{where}: max_accuracy_drop must be in [0, 1], got {self.max_accuracy_drop}")
        for name in ("min_same_top_p", "min_greedy_agreement", "min_replay_agreement"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1:
                raise ValueError(f"{where}: {name} must be in [0, 1], got {v}")
        for name in ("max_mean_kl", "max_p99_kl"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{where}: {name} must be >= 0, got {v}")
        if self.max_tokens < 1:
            raise ValueError(f"{where}: max_tokens must be >= 1")


_SECTIONS = {"run": ("suites", "max_items", "per_task", "max_tokens"),
             "accuracy": ("max_accuracy_drop", "alpha", "paired_test", "bootstrap_resamples", "confidence"),
             "drift": ("max_mean_kl", "max_p99_kl", "min_same_top_p", "min_greedy_agreement", "require_logit_drift"),
             "replay": ("min_replay_agreement",),
             "": ("seed",)}


# each field's TOML type, from its annotation ("float | None" -> float: None is written as false)
_FIELD_KINDS = {f.name: {"list": list, "int": int, "float": float, "str": str, "bool": bool}[
                    str(f.type).split("|")[0].split("[")[0].strip()] for f in dataclasses.fields(Policy)}


def load_policy(path: str | Path) -> Policy:
    """Read a policy TOML; suite paths are resolved relative to the current directory, else the policy file,
    else infersight's source tree (`_resolve`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"policy file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    values: dict = {}
    for section, keys in _SECTIONS.items():
        table = data if section == "" else data.get(section, {})
        if section and not isinstance(table, dict):
            raise ValueError(f"{path}: [{section}] must be a table")
        for key, v in table.items():
            if section == "" and isinstance(v, dict):
                if key not in _SECTIONS:
                    raise ValueError(f"{path}: unknown section [{key}]; known: {sorted(s for s in _SECTIONS if s)}")
                continue
            if key not in keys:
                raise ValueError(f"{path}: unknown key {key!r} in [{section or 'top level'}]; known: {list(keys)}")
            values[key] = v
    # a threshold set to false turns its check off (TOML has no null)
    for key in ("max_mean_kl", "max_p99_kl", "min_same_top_p", "min_greedy_agreement", "min_replay_agreement",
                "max_items", "per_task"):
        if values.get(key) is False:
            values[key] = None
    for key, value in values.items():  # typed as Policy's fields, so a "0.02" is named, not compared
        if value is not None and (problem := wrong_type(key, value, _FIELD_KINDS[key])):
            raise ValueError(f"{path}: {problem}")
    if not all(isinstance(suite, str) for suite in values.get("suites", [])):
        raise ValueError(f"{path}: suites must be an array of suite files (strings), got {values['suites']!r}")
    policy = Policy(**values, path=str(path))
    policy.suites = [_resolve(s, path) for s in policy.suites]
    policy.validate()
    return policy


# the source tree the shipped suites are in: a policy's `evals/suites/...` finds them from any directory
_SOURCE_ROOT = Path(__file__).resolve().parents[1]


def _resolve(suite: str, policy_path: Path) -> str:
    """A suite path as written, else beside the policy file, else in infersight's source tree (the shipped
    suites); as written when none exists (the error then names it)."""
    p = Path(suite)
    if p.is_absolute() or p.exists():
        return str(p)
    for base in (policy_path.parent, _SOURCE_ROOT):
        if (base / p).exists():
            return str(base / p)
    return str(p)


def policy_dict(policy: Policy) -> dict:
    return dataclasses.asdict(policy)
