"""Proof with the real engine: a workload through LLM(observer=Recorder(...)) lands in the store
exactly: every request with the token IDs the engine returned, and step rows that add up."""

from __future__ import annotations

import pytest

from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams
from telemetry.recorder import Recorder


@pytest.mark.slow
def test_workload_lands_in_the_store_exactly(tiny_llama, store, tmp_path):
    recorder = Recorder(store, "engine-r0", spool_dir=tmp_path / "spool", flush_interval=0.2)
    llm = LLM(tiny_llama, observer=recorder, replica_id="engine-r0", max_num_seqs=4)
    prompts = ["hello world", "the quick brown fox", [5, 6, 7, 8, 9], "a", "one two three four five six"]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (3, 8, 5, 12, 1)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    llm.engine.close()  # closes the observer: the recorder flushes
    recorder.close()

    stats = recorder.stats()
    assert stats["requests"]["written"] == len(prompts) and stats["requests"]["dropped"] == 0
    assert stats["replicas"]["written"] == 1
    rows = store.query_df("SELECT request_id, prompt_token_ids, output_token_ids, output_tokens, token_times "
                          "FROM requests WHERE replica_id = {r:String}", {"r": "engine-r0"})
    by_id = {row.request_id: row for row in rows.itertuples()}
    assert sorted(by_id) == sorted(o.request_id for o in outputs)
    for out in outputs:
        row = by_id[out.request_id]
        assert list(row.output_token_ids) == out.token_ids
        assert list(row.prompt_token_ids) == out.prompt_token_ids
        assert row.output_tokens == len(out.token_ids) == len(row.token_times)

    generated = store.query_df("SELECT sum(num_generated_tokens) AS g, count() AS n, max(step_id) AS last "
                               "FROM steps WHERE replica_id = {r:String}", {"r": "engine-r0"})
    assert int(generated["g"][0]) == sum(len(o.token_ids) for o in outputs)
    assert stats["steps"]["written"] == int(generated["n"][0]) > 0
    replica = store.query_df("SELECT model_name, tokenizer_hash FROM replicas WHERE replica_id = 'engine-r0'")
    assert len(replica) == 1 and replica["tokenizer_hash"][0]
