"""A property check's outcome every replica of a model shares is one fleet-level info on the model;
a replica whose outcome differs keeps its warning (diagnostics.shared_outcomes)."""

from __future__ import annotations

import time

import pytest
from diag_faults import with_normalizer
from diag_records import replica, request

from diagnostics import shared_outcomes
from diagnostics import tokenizer as tokdiag
from diagnostics.findings import Finding
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.core.tokenization import Tokenizer
from telemetry.contract.probes import PROBE_WORKLOAD

SIGNATURE = {"k": lambda f: f.evidence.get("sig")}


def _f(rid: str, sig, kind: str = "k") -> Finding:
    return Finding(kind, "warning", rid, f"{rid}: outcome {sig}", "tokenizer", Scope(start=0.0), {"sig": sig})


def _kinds(found: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.kind, f.severity, f.subject) for f in found}


def test_an_outcome_every_replica_shares_is_one_fleet_info():
    found = shared_outcomes.fold([_f("r0", 1), _f("r1", 1)], {"m": ["r0", "r1"]}, SIGNATURE)
    assert _kinds(found) == {("k_fleet_wide", "info", "model=m")}
    assert found[0].evidence["every_replica"] and found[0].evidence["replicas"] == ["r0", "r1"]


def test_a_replica_whose_outcome_differs_keeps_its_warning():
    # r0 is clean (no finding), r1 fails: not shared
    assert _kinds(shared_outcomes.fold([_f("r1", 1)], {"m": ["r0", "r1"]}, SIGNATURE)) == {("k", "warning", "r1")}
    # two replicas, two outcomes: no side shares with the other
    assert _kinds(shared_outcomes.fold([_f("r0", 1), _f("r1", 2)], {"m": ["r0", "r1"]}, SIGNATURE)) == {
        ("k", "warning", "r0"), ("k", "warning", "r1")}
    # three: the majority's outcome is the model's, the odd one is named
    found = shared_outcomes.fold([_f("r0", 1), _f("r1", 1), _f("r2", 2)], {"m": ["r0", "r1", "r2"]}, SIGNATURE)
    assert _kinds(found) == {("k_fleet_wide", "info", "model=m"), ("k", "warning", "r2")}


def test_no_signature_is_never_folded_and_other_kinds_pass():
    found = shared_outcomes.fold([_f("r0", None), _f("r1", None), _f("r0", 1, "other")], {"m": ["r0", "r1"]},
                                 SIGNATURE)
    assert _kinds(found) == {("k", "warning", "r0"), ("k", "warning", "r1"), ("other", "warning", "r0")}


# -- in the tokenizer diagnostic --------------------------------------------------------------------

@pytest.fixture(scope="module")
def dirs(tiny_llama, tmp_path_factory):
    return {"clean": tiny_llama,
            "lower": with_normalizer(tiny_llama, tmp_path_factory.mktemp("shared") / "lower", {"type": "Lowercase"})}


def _fleet(store, dirs, kinds: dict[str, str], t0: float) -> dict[str, Tokenizer]:
    toks = {rid: Tokenizer(dirs[k]) for rid, k in kinds.items()}
    store.insert_records("replicas", [replica(rid, t0 - 600 + 60 * i, model_dir=str(dirs[kinds[rid]]),
                                              tokenizer_hash=toks[rid].tokenizer_hash)
                                      for i, rid in enumerate(toks)])
    return toks


def _probe_round(store, toks: dict, t0: float) -> None:
    """The prober's special-token probe on every replica: a typed BOS string after the tokenizer's BOS."""
    for rid, tok in toks.items():
        ids = tok.encode(tok.piece(tok.bos_token_id) + "Hello there")
        assert ids[:2] == [tok.bos_token_id] * 2
        store.insert_records("requests", [request(rid, 900 + i, t0 + i, prompt_ids=ids, workload=PROBE_WORKLOAD,
                                                  prompt_text="<bos> probe") for i in range(3)]
                             + [request(rid, i, t0 + 10 + i, prompt_ids=tok.encode("a plain prompt"))
                                for i in range(20)])


def _run(store, t0, toks):
    return tokdiag.run(store, DiagnosticRequest(Scope(start=t0 - 60),
                                                model_dirs={rid: t.directory for rid, t in toks.items()}))


def test_the_probers_double_bos_on_every_replica_is_one_info(clean, dirs):
    t0 = time.time() - 300
    toks = _fleet(clean, dirs, {"r0": "clean", "r1": "clean"}, t0)
    _probe_round(clean, toks, t0)
    found = _run(clean, t0, toks)
    assert not [f for f in found if f.severity != "info"]
    [fleet] = [f for f in found if f.kind == "double_bos_probe_fleet_wide"]
    assert fleet.subject == "model=tiny" and fleet.evidence["replicas"] == ["r0", "r1"]


def test_client_double_bos_on_one_replica_is_still_its_warning(clean, dirs):
    t0 = time.time() - 300
    toks = _fleet(clean, dirs, {"r0": "clean", "r1": "clean"}, t0)
    _probe_round(clean, toks, t0)
    bos = toks["r1"].bos_token_id
    clean.insert_records("requests", [request("r1", 500 + i, t0 + 50 + i, prompt_ids=[bos, bos, 20, 21, 22])
                                      for i in range(4)])
    found = _run(clean, t0, toks)
    [warned] = [f for f in found if f.severity != "info"]
    assert (warned.kind, warned.subject) == ("double_bos", "r1") and warned.evidence["count"] == 4
    assert warned.evidence["source"] == "client"
    assert [f.subject for f in found if f.kind == "double_bos_probe_fleet_wide"] == ["model=tiny"]


def test_a_replica_whose_tokenizer_alone_parses_the_probes_bos_is_named(clean, dirs):
    t0 = time.time() - 300
    toks = _fleet(clean, dirs, {"r0": "clean", "r1": "clean"}, t0)
    _probe_round(clean, {"r1": toks["r1"]}, t0)
    # r0 got the same probe, its tokenizer kept the typed string as text: one BOS
    bos = toks["r0"].bos_token_id
    clean.insert_records("requests", [request("r0", 900 + i, t0 + i, prompt_ids=[bos, 30, 31, 32],
                                              workload=PROBE_WORKLOAD) for i in range(3)])
    found = _run(clean, t0, toks)
    assert [(f.kind, f.subject) for f in found if f.severity != "info"] == [("double_bos_probe", "r1")]


def test_a_tokenizer_every_replica_loads_fails_its_round_trips_as_one_info(clean, dirs):
    t0 = time.time() - 300
    toks = _fleet(clean, dirs, {"r0": "lower", "r1": "lower"}, t0)
    _probe_round(clean, toks, t0)
    found = _run(clean, t0, toks)
    assert not [f for f in found if f.kind == "tokenizer_unicode_roundtrip"]
    [fleet] = [f for f in found if f.kind == "tokenizer_unicode_roundtrip_fleet_wide"]
    assert fleet.severity == "info" and fleet.evidence["every_replica"]


def test_one_replica_whose_tokenizer_fails_round_trips_is_still_named(clean, dirs):
    t0 = time.time() - 300
    toks = _fleet(clean, dirs, {"r0": "clean", "r1": "lower"}, t0)
    _probe_round(clean, toks, t0)
    found = _run(clean, t0, toks)
    assert "tokenizer_unicode_roundtrip" in {f.kind for f in found if f.subject == "r1" and f.severity != "info"}
    assert not [f for f in found if f.subject == "r0" and f.severity != "info"]
