"""What the engine tells its observer: replica identity, request lifecycles, one consistent record per step."""

from __future__ import annotations

import json

import pytest
import torch

import engine.core.engine_records as engine_records
from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.engine_records import identity_sections
from telemetry.contract.hooks import EngineObserver
from engine.core.sampling_params import SamplingParams
from telemetry.contract.records import canonical_chat_json, chat_messages_hash, text_sha256

torch.set_num_threads(1)  # tiny models on a shared 2-core machine


class Recording(EngineObserver):
    enabled = True

    def __init__(self):
        self.events = []

    def __getattribute__(self, name):
        if name.startswith("on_") or name == "close":
            events = object.__getattribute__(self, "events")
            return lambda *args: events.append((name, args))
        return object.__getattribute__(self, name)

    def of(self, hook):
        return [args for name, args in self.events if name == hook]


def drive(engine, prompts, params):
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params, workload="batch",
                           trace_context={"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"})
    while engine.has_unfinished():
        engine.step()


def test_replica_request_and_step_records(tiny_llama):
    observer = Recording()
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), block_size=4, num_kv_blocks=10,
                                    max_num_batched_tokens=16, replica_id="rep-7"), observer)
    (replica,), = observer.of("on_replica_start")
    assert replica is engine.replica_record and replica.replica_id == "rep-7"
    sections = identity_sections(engine.config, engine.generation_identity())
    assert replica.config_hash == engine.config.config_hash(sections)
    assert json.loads(replica.config_json)["model_files"]["config_json"] == json.loads(
        (engine.loaded.model_dir / "config.json").read_text())
    assert json.loads(replica.config_json)["block_size"] == 4
    assert replica.tokenizer_hash == engine.tokenizer.tokenizer_hash != ""
    assert replica.chat_template_hash == engine.tokenizer.chat_template_hash != ""
    assert replica.weights_hash == engine.loaded.weights_hash
    assert replica.engine_version and replica.attention_backend == "torch" and replica.device == "cpu"
    assert replica.cpu_affinity  # placement: at least the affinity

    prompts = ["The quick brown fox jumps", "The quick brown fox sleeps", list(range(10, 30))]
    drive(engine, prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))

    steps = [args[0] for args in observer.of("on_step")]
    assert [s.step_id for s in steps] == list(range(len(steps)))
    for s in steps:
        assert s.num_seqs == s.num_prefill_seqs + s.num_decode_seqs
        assert s.num_tokens == s.num_prefill_tokens + s.num_decode_tokens <= 16
        assert s.num_decode_tokens == s.num_decode_seqs
        assert s.kv_blocks_used + s.kv_blocks_free == s.kv_blocks_total == 10
        assert s.kv_blocks_cached <= s.kv_blocks_free
        assert s.phase == {(True, False): "prefill", (False, True): "decode", (True, True): "mixed"}[
            (s.num_prefill_seqs > 0, s.num_decode_seqs > 0)]
        parts = (s.schedule_seconds, s.prepare_seconds, s.forward_seconds, s.sample_seconds,
                 s.postprocess_seconds)
        assert all(p >= 0 for p in parts) and s.duration_seconds == pytest.approx(sum(parts))
        assert s.telemetry_seconds >= 0
    assert sum(s.num_generated_tokens for s in steps) == 30
    assert sum(s.num_preempted for s in steps) == engine.scheduler.total_preemptions > 0  # 10 blocks: tight
    assert sum(s.evictions for s in steps) == engine.kv_cache.evictions
    assert steps[-1].kv_blocks_used == 0 and steps[-1].num_running == 0 and steps[-1].num_waiting == 0

    requests = {r.request_id: r for (r,) in observer.of("on_request_finished")}
    assert set(requests) == {"r0", "r1", "r2"}
    for i, r in enumerate(requests[f"r{i}"] for i in range(3)):
        assert r.replica_id == "rep-7" and r.workload == "batch" and r.trace_id == "ab" * 16
        assert r.arrival_time <= r.scheduled_time <= r.first_token_time <= r.finish_time
        assert r.ttft_seconds == pytest.approx(r.queue_seconds + r.prefill_seconds)
        assert r.output_tokens == len(r.output_token_ids) == len(r.token_times) == 10
        assert r.token_times == sorted(r.token_times) and r.token_times[0] == pytest.approx(r.ttft_seconds)
        assert r.finish_reason == "length" and r.prompt_tokens == len(r.prompt_token_ids)
        assert json.loads(r.sampling_params_json)["max_tokens"] == 10
    assert requests["r0"].prompt_text == "The quick brown fox jumps" and requests["r0"].output_text
    assert len(requests["r0"].prompt_text_hash) == 64 and requests["r2"].prompt_text_hash == ""
    # the records always carry the text (the Recorder alone decides what is stored); completions have no rendering
    assert requests["r0"].prompt_text_hash == text_sha256("The quick brown fox jumps")
    assert requests["r2"].prompt_text == "" and {r.rendered_prompt_hash for r in requests.values()} == {""}
    assert sum(r.preemptions for r in requests.values()) == engine.scheduler.total_preemptions

    lifecycle = [name for name, args in observer.events if args and args[0] == "r1"]
    assert lifecycle[:3] == ["on_request_arrival", "on_request_scheduled", "on_first_token"]
    arrival = observer.of("on_request_arrival")[0]
    assert arrival[0] == "r0" and arrival[3] == "batch" and arrival[4]["traceparent"].startswith("00-")


def test_prefix_hits_are_counted_per_step_and_per_request(tiny_llama):
    observer = Recording()
    engine = LLMEngine(tiny_llama, observer, block_size=4, num_kv_blocks=64)
    shared = list(range(10, 30))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    drive(engine, [shared + [40]], params)
    drive(engine, [shared + [41, 42]], params)
    steps = [a[0] for a in observer.of("on_step")]
    assert sum(s.prefix_hit_tokens for s in steps) == 20
    assert sum(s.prefix_query_tokens for s in steps) == 21 + 22
    finished = [a[0] for a in observer.of("on_request_finished")]
    assert [r.cached_tokens for r in finished] == [0, 20]


def test_an_abort_yields_a_record_and_frees_everything(tiny_llama):
    observer = Recording()
    engine = LLMEngine(tiny_llama, observer, block_size=4, num_kv_blocks=64)
    engine.add_request("x", "abort me", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    out = engine.abort("x")
    assert out.finished and out.finish_reason == "abort" and len(out.token_ids) == 2
    (record,), = observer.of("on_request_finished")
    assert record.finish_reason == "abort" and record.output_tokens == 2
    assert engine.abort("x") is None and not engine.has_unfinished()
    assert engine.kv_cache.num_used_blocks == 0


def test_a_failing_observer_never_breaks_the_engine(tiny_llama):
    class Broken(EngineObserver):
        enabled = True

        def on_step(self, record):
            raise RuntimeError("boom")

        def on_request_finished(self, record):
            raise RuntimeError("boom")

    engine = LLMEngine(tiny_llama, Broken(), block_size=4, num_kv_blocks=64)
    drive(engine, ["hello"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert engine.observer.failures >= 5


def test_no_records_are_built_when_nobody_listens(tiny_llama, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a record was built with no observer listening")

    # the engine's telemetry (EngineTelemetry) builds them, beside the builders
    monkeypatch.setattr(engine_records, "build_step_record", forbidden)
    monkeypatch.setattr(engine_records, "build_request_record", forbidden)
    engine = LLMEngine(tiny_llama, block_size=4, num_kv_blocks=64)
    drive(engine, ["hello", [5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert engine.step_id > 0


def test_a_failing_forward_fails_only_that_batch(tiny_llama, monkeypatch):
    observer = Recording()
    engine = LLMEngine(tiny_llama, observer, block_size=4, num_kv_blocks=64)
    real_forward = engine.runner.forward
    calls = []

    def flaky(inputs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("device fell over")
        return real_forward(inputs)

    monkeypatch.setattr(engine.runner, "forward", flaky)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    engine.add_request("a", "first", params)
    engine.step()
    outs = engine.step()  # the failing step
    assert [(o.request_id, o.finish_reason) for o in outs] == [("a", "error")]
    assert "device fell over" in outs[0].error
    assert engine.kv_cache.num_used_blocks == 0 and not engine.has_unfinished()
    (record,), = observer.of("on_request_finished")
    assert record.finish_reason == "error" and "device fell over" in record.error
    drive(engine, ["second"], params)  # and the engine keeps serving
    assert observer.of("on_request_finished")[-1][0].finish_reason == "length"


def test_a_chat_keeps_its_messages_hash_and_rendered_text_and_is_encoded_once(tiny_llama, monkeypatch):
    observer = Recording()
    engine = LLMEngine(tiny_llama, observer, block_size=4, num_kv_blocks=64)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello there"}]
    encodes = []
    real_encode = engine.tokenizer.hf.encode
    monkeypatch.setattr(engine.tokenizer.hf, "encode", lambda *a, **k: encodes.append(a) or real_encode(*a, **k))
    prompt = engine.chat_prompt(messages)
    assert len(encodes) == 1 and prompt.kind == "chat"
    engine.add_request("c", prompt, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert len(encodes) == 1  # the engine took the Prompt as it was
    (record,), = observer.of("on_request_finished")
    rendered = engine.tokenizer.apply_chat_template(messages, tokenize=False)
    assert record.prompt_token_ids == engine.tokenizer.apply_chat_template(messages) == prompt.token_ids
    assert record.prompt_text == rendered and record.rendered_prompt_hash == text_sha256(rendered)
    # the canonical messages JSON: role and content (parts joined, other keys left out), keys sorted, compact
    assert canonical_chat_json(messages) == ('[{"content":"be brief","role":"system"},'
                                             '{"content":"Hello there","role":"user"}]')
    parts = [{"role": "system", "content": "be brief", "name": "ops"},
             {"content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}], "role": "user"}]
    assert canonical_chat_json(parts) == canonical_chat_json(messages)
    assert record.prompt_text_hash == chat_messages_hash(messages) == text_sha256(canonical_chat_json(messages))
    assert chat_messages_hash(messages, add_generation_prompt=False) != record.prompt_text_hash
    assert len(observer.of("on_tokenization")) == 2  # one cache lookup for the chat, one in apply_chat_template above


def test_eos_ids_from_generation_config_are_part_of_the_identity(tiny_llama, tmp_path):
    """A generation_config.json with other eos ids changes where every answer stops: the identity
    (config_json's "generation", config_hash) says so, though no engine option changed - even when
    the new file is deployed at the same path."""
    import shutil

    model = shutil.copytree(tiny_llama, tmp_path / "model")
    records = []
    for eos in (None, 7):
        if eos is not None:  # the same directory, its generation_config.json changed in place
            gen_path = model / "generation_config.json"
            gen_path.write_text(json.dumps({**json.loads(gen_path.read_text()), "eos_token_id": eos}))
        observer = Recording()
        LLMEngine(EngineConfig(model=str(model), num_kv_blocks=10), observer)
        (replica,), = observer.of("on_replica_start")
        records.append(replica)
    base, cand = (json.loads(r.config_json)["generation"] for r in records)
    assert cand["eos_token_ids"] == [7] and base["eos_token_ids"] != [7]
    assert records[0].config_hash != records[1].config_hash


def test_the_role_and_the_deploy_time_are_in_the_replica_row_not_in_its_config(tiny_llama):
    """A role is who a replica is in a deploy, not how it computes: its own column, the config hash unchanged;
    without a deploy time given, when the engine started building (before the model loaded) is recorded."""
    import time

    rows = []
    for kw in ({}, {"role": "candidate", "deploy_time": 1_700_000_000.5}):
        observer = Recording()
        LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=10, **kw), observer)
        (replica,), = observer.of("on_replica_start")
        rows.append(replica)
    plain, candidate = rows
    assert (candidate.role, candidate.deploy_time) == ("candidate", 1_700_000_000.5)
    assert plain.role == "" and 0 < plain.deploy_time <= plain.start_time <= time.time()
    assert plain.config_hash == candidate.config_hash and plain.config_json == candidate.config_json
    assert "role" not in json.loads(candidate.config_json)
    with pytest.raises(ValueError, match="role must be one of"):
        EngineConfig(model=str(tiny_llama), role="canary")


def test_an_unset_max_model_len_is_recorded_as_it_takes_effect(tiny_llama):
    """A replica given max_model_len 64 beside one left at the model's context: both values in the identity
    (the model's max_position_embeddings for the unset one), so a difference reads `64 vs N`, not `vs unset`."""
    documents = []
    for kw in ({}, {"max_model_len": 64}):
        observer = Recording()
        LLMEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=10, **kw), observer)
        (replica,), = observer.of("on_replica_start")
        documents.append(json.loads(replica.config_json))
    positions = json.loads((tiny_llama / "config.json").read_text())["max_position_embeddings"]
    assert [d["max_model_len"] for d in documents] == [positions, 64]
