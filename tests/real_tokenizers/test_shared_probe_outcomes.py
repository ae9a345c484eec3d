"""On a real SentencePiece tokenizer (Mistral 7B v0.1's, from mistral-common) the prober's own
special-token probe starts with BOS twice and the Unicode corpus does not round-trip, on every
replica alike: the model's outcomes, one fleet-level info each, not a warning on every healthy replica.
A replica that alone differs (it parses the typed BOS where its peers keep it as text) is still named."""

from __future__ import annotations

import time

from diag_records import replica, request

from diagnostics import tokenizer as tokdiag
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.traffic.probe.suite import by_id
from telemetry.contract.probes import PROBE_WORKLOAD
from telemetry.contract.records import RECORD_TYPES

CLIENT_TEXTS = ["Why is the KV cache full on Tuesday?", "Sort these numbers: 3 1 2.", "What does NUMA mean?"]


def _fleet(store, model, tokenizer_of, replicas=("r0", "r1", "r2"), typed_bos_parsed=None) -> DiagnosticRequest:
    for table in RECORD_TYPES:
        store.command(f"TRUNCATE TABLE {table}")
    tok = tokenizer_of(model)
    t0 = time.time() - 300
    probe = by_id()["special_tokens"].prompt
    store.insert_records("replicas", [replica(rid, t0 - 600, model_dir=str(model), model_name="mistral",
                                              tokenizer_hash=tok.tokenizer_hash) for rid in replicas])
    rows = []
    for rid in replicas:
        ids = tok.encode(probe)
        if typed_bos_parsed is not None and rid not in typed_bos_parsed:  # this one keeps "<s>" as text
            ids = [tok.bos_token_id] + tok.encode(probe.replace("<s>", "< s>"), add_special_tokens=False)
        rows += [request(rid, 100 + k, t0 + k, prompt_ids=ids, workload=PROBE_WORKLOAD, model_name="mistral",
                         prompt_text=probe) for k in range(3)]
        rows += [request(rid, k, t0 + 10 + k, prompt_ids=tok.encode(CLIENT_TEXTS[k % 3]), model_name="mistral",
                         prompt_text=CLIENT_TEXTS[k % 3]) for k in range(30)]
    store.insert_records("requests", rows)
    return DiagnosticRequest(Scope(start=t0 - 60), model_dirs={rid: str(model) for rid in replicas})


def test_what_every_replica_shares_is_one_info_on_the_model(store, real_models, tokenizer_of):
    model = real_models("sentencepiece")
    tok = tokenizer_of(model)
    assert tok.encode(by_id()["special_tokens"].prompt)[:2] == [tok.bos_token_id] * 2  # as seen on the fleet
    found = tokdiag.run(store, _fleet(store, model, tokenizer_of))
    assert [(f.kind, f.subject) for f in found if f.severity != "info"] == []
    fleet = {f.kind: f for f in found if f.kind.endswith("_fleet_wide")}
    assert set(fleet) == {"double_bos_probe_fleet_wide", "tokenizer_unicode_roundtrip_fleet_wide"}
    assert all(f.subject == "model=mistral" and f.evidence["every_replica"] for f in fleet.values())


def test_the_replica_that_alone_parses_the_typed_bos_is_named(store, real_models, tokenizer_of):
    model = real_models("sentencepiece")
    found = tokdiag.run(store, _fleet(store, model, tokenizer_of, typed_bos_parsed={"r2"}))
    assert [(f.kind, f.subject) for f in found if f.severity != "info"] == [("double_bos_probe", "r2")]
