"""The plugin's mapping of vLLM's own stats objects, its entry point as vLLM loads it, the switch, and the
config hash, checked inside the vLLM environment (vllm_side_checks.py) against the engine's identity."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engine.core.models import load_model
from engine.core.tokenization import Tokenizer
from engine.serving.vllm_adapter.launch import REPO, vllm_missing, vllm_python
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(vllm_missing() is not None, reason=vllm_missing() or "")]


@pytest.fixture(scope="module")
def checked():
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERSIGHT_")}
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false",
               VLLM_CPU_KVCACHE_SPACE="1")
    done = subprocess.run([str(vllm_python()), str(Path(__file__).with_name("vllm_side_checks.py")), str(REFERENCE)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_finished_request_timing(checked):
    r = checked["finished"]
    assert (r["request_id"], r["prompt_tokens"], r["output_tokens"], r["cached_tokens"]) == ("cmpl-a-0", 10, 5, 4)
    assert (r["finish_reason"], r["preemptions"], json.loads(r["sampling_params_json"])) == ("length", 1,
                                                                                            {"max_tokens": 5})
    assert r["finish_time"] == 1000.0 and r["arrival_time"] == pytest.approx(998.0)
    assert r["first_token_time"] == pytest.approx(998.5) and r["scheduled_time"] == pytest.approx(998.2)
    assert r["ttft_seconds"] == pytest.approx(0.5) and r["e2e_seconds"] == pytest.approx(2.0)
    assert r["queue_seconds"] + r["prefill_seconds"] == pytest.approx(r["ttft_seconds"])
    assert r["prompt_token_ids"] == r["output_token_ids"] == r["token_times"] == []  # the proxy's to fill


def test_aborted_request_without_a_token_has_no_first_token(checked):
    r = checked["aborted"]
    assert (r["finish_reason"], r["output_tokens"], r["first_token_time"], r["scheduled_time"]) == ("abort", 0, 0, 0)
    assert (r["queue_seconds"], r["prefill_seconds"], r["ttft_seconds"]) == (0, 0, 0)
    assert r["e2e_seconds"] == pytest.approx(0.5)


def test_step_with_iteration_details(checked):
    s = checked["step"]
    assert (s["phase"], s["num_seqs"], s["num_prefill_seqs"], s["num_decode_seqs"]) == ("mixed", 3, 1, 2)
    assert (s["num_tokens"], s["num_prefill_tokens"], s["num_decode_tokens"], s["num_generated_tokens"]) == (106, 100,
                                                                                                            6, 5)
    assert s["duration_seconds"] == pytest.approx(0.0125) and s["start_time"] == pytest.approx(1000.0 - 0.0125)
    assert (s["kv_blocks_total"], s["kv_blocks_used"], s["kv_blocks_free"]) == (400, 100, 300)
    assert (s["prefix_query_tokens"], s["prefix_hit_tokens"], s["num_running"], s["num_waiting"]) == (100, 64, 3, 2)
    assert (s["num_preempted"], s["spec_proposed"], s["spec_accepted"], s["spec_num_drafts"]) == (1, 6, 2, 2)
    assert s["spec_accepted_per_pos"] == [1, 1, 0]


def test_step_without_iteration_details(checked):
    s = checked["step_plain"]
    assert (s["phase"], s["num_prefill_seqs"], s["num_decode_seqs"], s["num_prefill_tokens"]) == ("mixed", 1, 1, 9)
    assert (s["num_generated_tokens"], s["duration_seconds"], s["num_running"]) == (2, 0.0, 2)


def test_entry_point_loads_as_a_stat_logger_and_stays_off_without_a_store(checked):
    assert "engine.serving.vllm_adapter.plugin.InfersightStatLogger" in checked["factories"]
    assert checked["subclass"]
    assert checked["off"] == {"enabled": False, "recorder": False, "failures": 0, "misconfigured_enabled": False}


def test_identity_is_the_engines_and_the_config_hash_is_stable(checked):
    i = checked["identity"]
    tokenizer = Tokenizer(REFERENCE)
    assert i["weights_hash"] == load_model(REFERENCE).weights_hash
    assert (i["tokenizer_hash"], i["chat_template_hash"]) == (tokenizer.tokenizer_hash, tokenizer.chat_template_hash)
    assert (i["model_name"], i["dtype"], i["device"]) == ("target", "float32", "cpu")
    assert i["model_in_json"] == str(REFERENCE.resolve())
    assert i["instance_ids"][0] != i["instance_ids"][1]
    # same configuration: same hash (vLLM's random instance id left out); the plugin's options never stored
    assert i["config_hashes"][0] == i["config_hashes"][1] == i["config_hashes"][2]
    assert not i["secret_in_json"]
