"""The fault matrix's checks of a finding: the key said with both values (either order, as explanations and
identity events say them), the mechanism cited only where a finding looked for one."""

from __future__ import annotations

from diagnostics.benchmarks import finding_checks
from diagnostics.findings import Finding
from diagnostics.scope import Scope


def _finding(subject: str, summary: str, severity: str = "warning", kind: str = "config_mismatch", **evidence):
    return Finding(kind, severity, subject, summary, "test", Scope(), evidence)


def test_a_key_is_named_only_with_both_of_its_values():
    said = finding_checks.said_with_values
    assert said("other options: rope_parameters.rope_theta 100000.0 vs 10000.0 in config.json", "rope_theta",
                10000.0, 100000.0)
    assert said("r1 since 05:01:10 UTC, when max_num_seqs went 16 → 2", "max_num_seqs", 16, 2)
    assert said("eos_token_id [4] vs [1] in generation_config.json", "eos_token_id", [1], [4])
    assert not said("max_model_len 64 vs unset", "max_model_len", 64, 256)
    assert not said("differs in config_hash", "rope_theta", 10000.0, 100000.0)
    assert not said("cpu_quota_cpus 0.3 vs 1 in placement", "cpu_quota_cpus", 0.3, "max")


def test_the_key_must_be_said_on_the_candidate_above_info_or_as_its_identity_change():
    on_peer = [_finding("r0", "max_num_seqs 2 vs 8")]
    assert not finding_checks.key_named(on_peer, "r1", "max_num_seqs", 2, 8)
    info = [_finding("r1", "max_num_seqs 2 vs 8", severity="info")]
    assert not finding_checks.key_named(info, "r1", "max_num_seqs", 2, 8)
    event = [_finding("r1", "r1 restarted with another identity: max_num_seqs went 16 → 2", severity="info",
                      kind="identity_changed")]
    assert finding_checks.key_named(event, "r1", "max_num_seqs", 16, 2)


def test_a_mechanism_is_asked_only_of_a_finding_that_looked_for_one():
    assert finding_checks.mechanism_cited([_finding("r1", "max_num_seqs 2 vs 8")], "r1", "preemptions") is None
    lag = _finding("r1", "lagging", kind="lagging_replica", mechanisms=[{"mechanism": "kv_pressure"}])
    assert finding_checks.mechanism_cited([lag], "r1", "preemptions") is False
    lag.evidence["mechanisms"].append({"mechanism": "preemptions"})
    assert finding_checks.mechanism_cited([lag], "r1", "preemptions") is True
    assert finding_checks.mechanism_cited([lag], "r1", ("cpu_throttling", "kv_pressure")) is True
    assert finding_checks.mechanism_cited([lag], "r1", ("cpu_throttling", "host_time")) is False
