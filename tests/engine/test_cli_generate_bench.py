"""`infersight generate` end to end, and the throughput benchmark's workload and batching rules."""

from __future__ import annotations

import json

import torch

from engine.benchmarks.throughput import hf_batches, make_workload, run_engine
from dashboards.console.cli import main

torch.set_num_threads(1)  # tiny models on a shared 2-core machine


def test_generate_prints_outputs_and_throughput(tiny_llama, capsys):
    rc = main(["generate", "--model", str(tiny_llama), "--prompt", "The quick", "--prompt", "brown fox",
               "--max-tokens", "5", "--ignore-eos", "--json", "--threads", "1"])
    assert rc == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["prompt"] for r in rows] == ["The quick", "brown fox"]
    assert all(len(r["token_ids"]) == 5 and r["finish_reason"] == "length" for r in rows)
    assert "output tok/s" in captured.err


def test_generate_reports_bad_input_without_a_traceback(tiny_llama, capsys):
    assert main(["generate", "--model", str(tiny_llama), "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_the_workload_is_deterministic_and_within_bounds():
    a = make_workload(50, vocab_size=512, seed=3)
    assert a.prompts == make_workload(50, vocab_size=512, seed=3).prompts
    assert all(16 <= len(p) <= 512 and all(6 <= t < 512 for t in p) for p in a.prompts)
    assert all(16 <= n <= 256 for n in a.output_lens)


def test_transformers_batches_keep_order_and_the_padded_budget():
    w = make_workload(40, vocab_size=512, seed=1)
    for size in (1, 8, 64):
        batches = hf_batches(w, size)
        assert [i for b in batches for i in b] == list(range(40))
        for b in batches:
            assert len(b) <= size
            if len(b) > 1:
                assert max(len(w.prompts[i]) for i in b) + max(w.output_lens[i] for i in b) <= 2048


def test_the_engine_side_produces_exactly_the_requested_tokens(tiny_llama):
    w = make_workload(6, vocab_size=512, seed=2, prompt_lens=(4, 30), output_lens=(2, 9))
    result = run_engine(str(tiny_llama), w, 1, dict(block_size=4, num_kv_blocks=128))
    assert result["output_tokens"] == w.output_tokens and result["seconds"] > 0


def test_generate_json_keeps_the_top_logprobs(tiny_llama, capsys):
    rc = main(["generate", "--model", str(tiny_llama), "--prompt", "The quick", "--max-tokens", "3",
               "--ignore-eos", "--json", "--threads", "1", "--logprobs", "3"])
    assert rc == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(row["logprobs"]) == 3 and len(row["top_logprobs"]) == 3
    for sampled, lp, top in zip(row["token_ids"], row["logprobs"], row["top_logprobs"]):
        assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert all(isinstance(t["token"], str) and isinstance(t["token_id"], int) for t in top)
        assert top[0]["token_id"] == sampled and abs(top[0]["logprob"] - lp) < 1e-5  # greedy: the best one
