"""The identity diagnostic on a real store: replicas of one model that differ in weights, tokenizer,
chat template, engine version or config are named (the later-started side of a canary, the odd one
of a fleet), with both values; labels, placement and other models are never a finding."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from diag_faults import ALTERED_TEMPLATE, with_chat_template, with_normalizer
from diag_records import replica, request

from diagnostics import identity
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.core.tokenization import Tokenizer
from telemetry.contract.records import chat_messages_hash, text_sha256

CONFIG = {"model": "/models/tiny", "enable_prefix_caching": True, "max_num_batched_tokens": 2048, "max_num_seqs": 64,
          "dtype": "float32", "quantization": "none", "quant_group_size": 128, "speculative_mode": "none",
          "device": "cpu", "replica_id": "x", "served_model_name": "tiny",
          "generation": {"eos_token_ids": [2], "bos_token_id": 1}}
# kind -> what the odd replica has instead (record fields)
FAULTS = {
    "weights_mismatch": {"weights_hash": "w-other"},
    "tokenizer_hash_mismatch": {"tokenizer_hash": "tok-b"},
    "chat_template_mismatch": {"chat_template_hash": "tmpl-b"},
    "engine_version_mismatch": {"engine_version": "0.2.0"},
    "config_mismatch": {"config": {"max_num_batched_tokens": 512}, "config_hash": "cfg-b"},
}


def rep(rid: str, start: float, config: dict | None = None, **overrides):
    config = {**CONFIG, "replica_id": rid, **(config or {})}
    return replica(rid, start, config_json=json.dumps(config), **overrides)


def diagnose(store, t0: float, **request) -> list:
    return identity.run(store, DiagnosticRequest(Scope(start=t0 - 300), **request))


def loud(findings) -> dict:
    """(subject, kind) -> finding, above info."""
    return {(f.subject, f.kind): f for f in findings if f.severity != "info"}


@pytest.mark.parametrize("kind", FAULTS)
def test_a_canary_that_differs_is_named_not_its_baseline(clean, kind):
    t0 = time.time() - 600
    clean.insert_records("replicas", [rep("base", t0 - 100), rep("canary", t0 - 10, **FAULTS[kind])])
    found = loud(diagnose(clean, t0))
    assert set(found) == {("canary", kind)}
    ev = found["canary", kind].evidence
    assert ev["reference"]["rule"] == "first_served" and ev["baseline"]["replicas"] == ["base"]
    assert ev["baseline"]["identity"]["weights_hash"] == "w"  # the baseline as choose_baseline describes it
    assert ev["reference_replicas"] == ["base"]


@pytest.mark.parametrize("kind", FAULTS)
def test_the_odd_one_of_three_is_named_even_when_it_started_first(clean, kind):
    t0 = time.time() - 600
    clean.insert_records("replicas", [rep("odd", t0 - 100, **FAULTS[kind]), rep("r1", t0 - 50), rep("r2", t0 - 10)])
    found = loud(diagnose(clean, t0))
    assert set(found) == {("odd", kind)}
    ev = found["odd", kind].evidence
    assert ev["reference"]["rule"] == "majority" and ev["reference_replicas"] == ["r1", "r2"]


def test_a_requested_baseline_names_the_other_side(clean):
    t0 = time.time() - 600
    clean.insert_records("replicas", [rep("early", t0 - 100, engine_version="0.2.0"), rep("late", t0 - 10)])
    found = loud(diagnose(clean, t0, baseline=Scope(replicas=("late",))))
    assert set(found) == {("early", "engine_version_mismatch")}
    assert found["early", "engine_version_mismatch"].evidence["reference"]["rule"] == "requested"


def test_other_weights_under_the_same_config_hash_are_critical(clean):
    t0 = time.time() - 600
    # the same path and options (config hash), other tensors: the engine hashes the tensors themselves
    clean.insert_records("replicas", [rep("base", t0 - 100, weights_hash="w1"),
                                      rep("noisy", t0 - 10, weights_hash="w2")])
    f = loud(diagnose(clean, t0))["noisy", "weights_mismatch"]
    assert f.severity == "critical"
    assert f.evidence["value"] == "w2" and f.evidence["reference_value"] == "w1"
    assert f.evidence["config_hash_equal"] is True and "same config hash" in f.summary


def test_config_differences_list_every_key_with_both_values(clean):
    t0 = time.time() - 600
    other = {"enable_prefix_caching": False, "max_num_seqs": 8, "quantization": "int4", "quant_group_size": 32,
             "speculative_mode": "ngram", "generation": {"eos_token_ids": [2, 7], "bos_token_id": 1}}
    clean.insert_records("replicas", [rep("base", t0 - 100), rep("canary", t0 - 10, other, config_hash="cfg-b")])
    f = loud(diagnose(clean, t0))["canary", "config_mismatch"]
    diffs = {d["key"]: (d["replica"], d["reference"]) for d in f.evidence["differences"]}
    assert diffs == {"enable_prefix_caching": (False, True), "max_num_seqs": (8, 64), "quantization": ("int4", "none"),
                     "quant_group_size": (32, 128), "speculative_mode": ("ngram", "none"),
                     "generation.eos_token_ids": ([2, 7], [2])}
    assert "enable_prefix_caching false vs true" in f.summary  # JSON values, as the config holds them


def test_labels_and_placement_are_not_a_finding(clean):
    t0 = time.time() - 600
    clean.insert_records("replicas", [
        rep("r0", t0 - 100, {"device": "cuda:0", "served_model_name": "a"}, host="h1", cpus=(0, 1), config_hash="c0"),
        rep("r1", t0 - 10, {"device": "cuda:1", "served_model_name": "b"}, host="h2", cpus=(2, 3), config_hash="c1",
            gpu_numa_node=1, labels_json='{"zone": "b"}')])
    found = diagnose(clean, t0)
    # the check ran and says so, once, as info
    assert [(f.kind, f.severity, f.subject) for f in found] == [("identity_consistent", "info", "tiny")]
    assert "r0, r1 share one identity" in found[0].summary


def test_a_path_difference_alone_is_info(clean):
    t0 = time.time() - 600
    clean.insert_records("replicas", [rep("r0", t0 - 100), rep("r1", t0 - 10, {"model": "/mnt/tiny"})])
    found = diagnose(clean, t0)
    assert [(f.subject, f.kind, f.severity) for f in found] == [("r1", "model_path_differs", "info")]


def test_replicas_of_two_models_are_never_compared(clean):
    t0 = time.time() - 600
    clean.insert_records("replicas", [rep("a", t0 - 100, model_name="m1"),
                                      rep("b", t0 - 10, {"model": "/m2", "max_num_seqs": 1}, model_name="m2",
                                          weights_hash="w-other", tokenizer_hash="tok-b", engine_version="9.9")])
    assert diagnose(clean, t0) == []


def test_two_engines_compare_hashes_not_versions_or_options(clean):
    t0 = time.time() - 600
    vllm_doc = {"engine": "vllm", "model": "/models/tiny", "vllm_config": {"cache_config": {"block_size": 16}}}
    clean.insert_records("replicas", [
        rep("r0", t0 - 100),
        replica("v0", t0 - 50, config_json=json.dumps(vllm_doc), engine_version="vllm-0.11.0"),
        replica("v1", t0 - 10, engine_version="vllm-0.11.0", config_hash="cfg-b",
                config_json=json.dumps({**vllm_doc, "vllm_config": {"cache_config": {"block_size": 32}}}))])
    found = loud(diagnose(clean, t0))
    # r0 is the only infersight replica: its version and options have no peer; v1 differs from v0
    assert set(found) == {("v1", "config_mismatch")}
    diffs = found["v1", "config_mismatch"].evidence["differences"]
    assert diffs == [{"key": "vllm_config.cache_config.block_size", "replica": 32, "reference": 16}]


def test_unknown_values_are_not_differences(clean):
    t0 = time.time() - 600
    # a recording proxy cannot see the weights: "" is unknown
    clean.insert_records("replicas", [rep("r0", t0 - 100), rep("p0", t0 - 10, weights_hash="")])
    assert loud(diagnose(clean, t0)) == {}


# -- real tokenizer files -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dirs(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("identity_faults")
    return {"clean": tiny_llama, "lower": with_normalizer(tiny_llama, root / "lower", {"type": "Lowercase"}),
            "template": with_chat_template(tiny_llama, root / "template", ALTERED_TEMPLATE)}


def real(rid: str, directory, start: float):
    tok = Tokenizer(directory)
    return rep(rid, start, {"model": str(directory)}, tokenizer_hash=tok.tokenizer_hash,
               chat_template_hash=tok.chat_template_hash), tok


def chats(rid: str, tok: Tokenizer, t0: float) -> list:
    """Chat requests as the engine records them: messages hash, rendered text hash, rendered token IDs."""
    out = []
    for i, content in enumerate(["Why is Replica 3 slower?", "What does the KV Cache hold?"]):
        messages = [{"role": "user", "content": content}]
        text = tok.apply_chat_template(messages, tokenize=False)
        out.append(dataclasses.replace(request(rid, i, t0 + i, prompt_ids=tok.encode(text, add_special_tokens=False)),
                                       prompt_text_hash=chat_messages_hash(messages),
                                       rendered_prompt_hash=text_sha256(text)))
    return out


def test_a_changed_tokenizer_is_named_with_the_files_that_differ(clean, model_dirs):
    t0 = time.time() - 600
    reps = [real("r0", model_dirs["clean"], t0 - 100)[0], real("r1", model_dirs["clean"], t0 - 50)[0],
            real("r2", model_dirs["lower"], t0 - 10)[0]]
    clean.insert_records("replicas", reps)
    found = loud(diagnose(clean, t0))
    assert {k for k in found if k[1] == "tokenizer_hash_mismatch"} == {("r2", "tokenizer_hash_mismatch")}
    ev = found["r2", "tokenizer_hash_mismatch"].evidence
    assert ev["reference_replicas"] == ["r0", "r1"]
    sections = ev["file_differences"][0]["sections"]
    assert sections["normalizer"] == {"replica": {"type": "Lowercase"}, "reference": None}


def test_a_changed_chat_template_shows_the_diff_and_the_first_divergent_rendered_token(clean, model_dirs):
    t0 = time.time() - 600
    (base, base_tok), (canary, canary_tok) = real("base", model_dirs["clean"], t0 - 100), \
        real("canary", model_dirs["template"], t0 - 10)
    clean.insert_records("replicas", [base, canary])
    clean.insert_records("requests", chats("base", base_tok, t0) + chats("canary", canary_tok, t0))
    f = loud(diagnose(clean, t0))["canary", "chat_template_mismatch"]
    ev = f.evidence
    assert {d["file"] for d in ev["file_differences"]} == {"chat_template.jinja"}
    removed = [line for line in ev["template_diff"] if line.startswith("-") and not line.startswith("---")]
    added = [line for line in ev["template_diff"] if line.startswith("+") and not line.startswith("+++")]
    assert len(removed) == len(added) == 2  # two tags changed: after each role marker, a newline
    assert all("|>\\n'" in line for line in added) and not any("|>\\n'" in line for line in removed)

    rendered = ev["rendered"]
    assert rendered["chats_compared"] == rendered["chats_rendered_differently"] == 2
    ex = rendered["examples"][0]
    pos = ex["first_divergence"]
    assert ex["replica_token_ids"][:pos] == ex["reference_token_ids"][:pos]
    assert ex["replica_token_ids"][pos] != ex["reference_token_ids"][pos]
    mine = next(t for t in ex["replica_tokens_at_divergence"] if t["position"] == pos)
    theirs = next(t for t in ex["reference_tokens_at_divergence"] if t["position"] == pos)
    assert mine["text"] == canary_tok.piece(ex["replica_token_ids"][pos]) and "\n" in mine["text"]
    assert theirs["text"] == base_tok.piece(ex["reference_token_ids"][pos])
    assert f"token {pos}: {mine['id']} {mine['text']!r} vs {theirs['id']} {theirs['text']!r}" in f.summary


# -- who is named when the replicas started together ------------------------------------------------

@pytest.mark.parametrize("kind", FAULTS)
def test_two_replicas_started_together_get_one_symmetric_finding(clean, kind):
    t0 = time.time() - 600
    # one fleet start; the faulty one's row came first (it loaded faster): start order decides nothing
    clean.insert_records("replicas", [rep("r0", t0 - 99.9, deploy_time=t0 - 130),
                                      rep("r1", t0 - 100, deploy_time=t0 - 130, **FAULTS[kind])])
    found = loud(diagnose(clean, t0))
    assert set(found) == {("r0 vs r1", kind)}  # one finding on the pair, none on either side
    f = found["r0 vs r1", kind]
    assert f.severity == "warning" and "no baseline" in f.summary and "`role`" in f.summary
    assert f.evidence["symmetric"] and f.evidence["baseline"]["rule"] == "none"
    assert [s["replicas"] for s in f.evidence["sides"]] == [["r0"], ["r1"]]
    if kind == "config_mismatch":
        assert "max_num_batched_tokens 2048 vs 512" in f.summary


def test_a_recorded_role_names_the_candidate_when_started_together(clean):
    t0 = time.time() - 600
    clean.insert_records("replicas", [rep("r0", t0 - 99.9, deploy_time=t0 - 130),
                                      rep("r1", t0 - 100, deploy_time=t0 - 130, role="candidate",
                                          **FAULTS["config_mismatch"])])
    found = loud(diagnose(clean, t0))
    assert set(found) == {("r1", "config_mismatch")}
    assert found["r1", "config_mismatch"].evidence["reference"]["rule"] == "role"


# -- the whole identity, from real engines ---------------------------------------------------------

def _engine_row(model_dir, replica_id: str, start: float, **config):
    from engine.core.config import EngineConfig
    from engine.core.engine import LLMEngine
    from telemetry.contract.hooks import EngineObserver

    class Rows(EngineObserver):
        enabled, rows = True, []

        def on_replica_start(self, record):
            self.rows.append(record)

    observer = Rows()
    LLMEngine(EngineConfig(model=str(model_dir), num_kv_blocks=10, replica_id=replica_id, **config), observer)
    return dataclasses.replace(observer.rows[-1], start_time=start, deploy_time=start - 30)


def _set_rope(model_dir, theta: float) -> str:
    """RoPE base changed in config.json in place; -> the dotted key it lives under."""
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    if isinstance(cfg.get("rope_parameters"), dict):
        cfg["rope_parameters"]["rope_theta"] = theta
        key = "rope_parameters.rope_theta"
    else:
        cfg["rope_theta"] = theta
        key = "rope_theta"
    path.write_text(json.dumps(cfg))
    return key


def test_a_rope_base_changed_in_config_json_at_the_same_path_is_named_with_both_values(clean, tiny_llama, tmp_path):
    import shutil

    model = shutil.copytree(tiny_llama, tmp_path / "tiny")
    t0 = time.time() - 600
    _set_rope(model, 10000.0)
    base = _engine_row(model, "r0", t0 - 100)
    key = _set_rope(model, 100000.0)  # the same directory: only the file's content says it
    canary = _engine_row(model, "r1", t0 - 10, serve_options={"max_queue": 8})
    assert base.weights_hash == canary.weights_hash and base.config_hash != canary.config_hash
    clean.insert_records("replicas", [base, canary])
    found = loud(diagnose(clean, t0))
    assert set(found) == {("r1", "config_mismatch")}
    f = found["r1", "config_mismatch"]
    # the most specific first: the model file's key, then the serve flag; no hash where keys say it
    assert f"{key} 100000.0 vs 10000.0 in config.json" in f.summary
    assert f.summary.index("config.json") < f.summary.index("max_queue 8 vs unset in serve flags")
    assert "config_hash" not in f.summary
    assert f"model_files.config_json.{key}" in f.evidence["keys"]


def test_a_cpu_quota_is_named_and_cpus_every_replica_shares_are_not():
    from diagnostics.replicas import identity_differences

    def row(rid, quota):
        doc = {"max_num_seqs": 16, "placement": {"cgroup": {"version": "v2", "cpu_quota_cpus": quota}}}
        return {"replica_id": rid, "config_json": json.dumps(doc), "cpu_affinity": [0, 1], "config_hash": "c"}

    diffs = identity_differences(row("r1", 0.3), [row("r0", "max")])
    assert [d["said"] for d in diffs] == ["cgroup.cpu_quota_cpus 0.3 vs max in placement"]
    # a replica alone on shared CPUs while its peers are not: that is a difference of its own
    crowded = identity_differences(row("r1", "max"), [row("r0", "max"), {**row("r2", "max"), "cpu_affinity": [2]},
                                                      {**row("r3", "max"), "cpu_affinity": [3]}])
    assert [d["field"] for d in crowded] == ["cpus_shared_with"]


def test_a_changed_generation_default_is_named_with_both_values(clean, tiny_llama, tmp_path):
    import shutil

    model = shutil.copytree(tiny_llama, tmp_path / "tiny")
    t0 = time.time() - 600
    base = _engine_row(model, "g0", t0 - 100)
    path = model / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "repetition_penalty": 1.3}))
    canary = _engine_row(model, "g1", t0 - 10)  # the same path: the file changed, and what unset requests get
    clean.insert_records("replicas", [base, canary])
    f = loud(diagnose(clean, t0))["g1", "config_mismatch"]
    assert f.summary.index("repetition_penalty 1.3 vs unset in generation_config.json") < \
        f.summary.index("sampling_defaults.values.repetition_penalty 1.3 vs unset")


# -- changes in time ---------------------------------------------------------------------------------

def test_a_restart_with_another_config_is_an_event_that_findings_on_the_replica_cite(clean):
    import diagnostics

    t0 = time.time() - 600
    restarted = t0 - 50
    clean.insert_records("replicas", [rep("e0", t0 - 200), rep("e1", t0 - 200, {"max_num_seqs": 16}),
                                      rep("e1", restarted, {"max_num_seqs": 2}, config_hash="cfg-2")])
    request = DiagnosticRequest(Scope(start=t0 - 300, replicas=("e0", "e1")))
    found = diagnostics.run(["identity"], clean, request, write=False)
    (event,) = [f for f in found if f.kind == "identity_changed"]
    assert event.subject == "e1" and event.severity == "info"
    assert "max_num_seqs went 16 → 2" in event.summary
    assert event.evidence["changes"] == [{"key": "max_num_seqs", "before": 16, "after": 2}]
    # the difference from its peer now cites when it began and from what
    mismatch = next(f for f in found if f.kind == "config_mismatch")
    clock = time.strftime("%H:%M:%S", time.gmtime(restarted))
    assert f"e1 since {clock} UTC, when max_num_seqs went 16 → 2" in mismatch.summary
    assert mismatch.evidence["identity_events"][0]["time"] == pytest.approx(restarted)
    # a restart with the same identity is no event
    clean.insert_records("replicas", [rep("e0", t0 - 20)])
    found = diagnostics.run(["identity"], clean, request, write=False)
    assert [f.subject for f in found if f.kind == "identity_changed"] == ["e1"]
