"""Chat requests are compared across replicas too: each keeps the hash of its messages, so the same
conversation on a replica with another chat template or normalizer is named by the tokenizer diagnostic.

The records are the real engine's (LLM.chat on each replica's model directory, through the Recorder):
with empty chat hashes, as chat requests had before, no chat request would be compared and this fails.
"""

from __future__ import annotations

import time

import pytest
from diag_faults import ALTERED_TEMPLATE, with_chat_template, with_normalizer

from diagnostics import tokenizer as tokdiag
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams
from telemetry.contract.records import chat_messages_hash
from telemetry.recorder import Recorder

# capitals in each: the lowercasing normalizer changes every one of them
CONVERSATIONS = [[{"role": "user", "content": f"Why is Replica {i} slower than the Others?"}] for i in range(4)] + [
    [{"role": "system", "content": "Answer Briefly."}, {"role": "user", "content": "What does the KV Cache hold?"}]]


@pytest.fixture(scope="module")
def fleet_dirs(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_faults")
    return {"a": tiny_llama, "b": with_chat_template(tiny_llama, root / "template", ALTERED_TEMPLATE),
            "c": tiny_llama, "d": with_normalizer(tiny_llama, root / "lower", {"type": "Lowercase"})}


def serve_chats(store, replica_id: str, model_dir) -> None:
    """The conversations through a real engine on `model_dir`, its records written by a Recorder."""
    recorder = Recorder(store, replica_id, flush_interval=60)
    try:
        llm = LLM(model_dir, recorder, replica_id=replica_id, served_model_name="tiny", block_size=8,
                  num_kv_blocks=64)
        llm.chat(CONVERSATIONS, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
        recorder.flush()
    finally:
        recorder.close()


def test_the_same_conversation_tokenized_differently_is_named(clean, fleet_dirs):
    t0 = time.time()
    for rid, directory in fleet_dirs.items():
        serve_chats(clean, rid, directory)
    rows = clean.query_df("SELECT replica_id, prompt_text_hash, rendered_prompt_hash FROM requests")
    assert len(rows) == 4 * len(CONVERSATIONS)
    assert set(rows["prompt_text_hash"]) == {chat_messages_hash(c) for c in CONVERSATIONS}  # never ""
    # the same messages, rendered differently only where the template differs
    rendered = rows.groupby("replica_id")["rendered_prompt_hash"].apply(set).to_dict()
    assert rendered["a"] == rendered["c"] == rendered["d"] != rendered["b"]

    found = tokdiag.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    divergent = {f.subject: f for f in found if f.kind == "tokenizer_divergence"}
    assert set(divergent) == {"b", "d"}  # a and c agree: the majority
    for rid in ("b", "d"):
        ev = divergent[rid].evidence
        assert divergent[rid].severity == "critical"
        assert ev["compared"] == ev["divergent"] == len(CONVERSATIONS)
        ex = ev["examples"][0]
        assert ex["prompt_text_hash"] in {chat_messages_hash(c) for c in CONVERSATIONS}
        assert ex["reference_replica"] in ("a", "c")
        pos = ex["first_divergence"]
        assert ex["replica_token_ids"][:pos] == ex["reference_token_ids"][:pos]
        # the same messages rendered differently: the template's divergence, said as such (d: the tokenizer's)
        cause = "chat template" if rid == "b" else "tokenizer"
        assert ev["template_divergent"] == (len(CONVERSATIONS) if rid == "b" else 0)
        assert {e["cause"] for e in ev["examples"]} == {cause}
        assert ("the template's divergence" in divergent[rid].summary) == (rid == "b")
        assert ex["first_divergent_token"]["position"] == pos
    # the template replica is also named for its template; the lowercasing one for its tokenizer (identity)
    from diagnostics import identity as identity_rule

    identity = identity_rule.run(clean, DiagnosticRequest(Scope(start=t0 - 60)))
    assert {f.subject for f in identity if f.kind == "chat_template_mismatch"} == {"b"}
    assert "d" in {f.subject for f in identity if f.kind == "tokenizer_hash_mismatch"}
