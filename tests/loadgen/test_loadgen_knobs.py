"""The load generator's sampling and duplicate knobs: --greedy-share, --temperature, --duplicate-share.

Shares are seeded draws, so for a seed they are exact; across seeds they are binomial, and the tests
allow four standard deviations. Duplicates run against two real replicas (the app `infersight serve`
runs, recording into the real embedded store): the stored rows of a pair show the same prompt and
sampling parameters on two replica ids.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math

import pytest

from dashboards.console.cli import main
from engine.traffic.loadgen.arrivals import parse_arrival
from engine.traffic.loadgen.runner import DUPLICATE_SUFFIX, run_load
from engine.traffic.loadgen.workloads import make_workload


def _take(workload, n):
    return [workload.next() for _ in range(n)]


def _within_binomial(k: int, n: int, p: float) -> bool:
    return abs(k - n * p) <= 4 * math.sqrt(n * p * (1 - p))


# what the default traffic was before the knobs existed (seed 5, first 30 bodies): it must not change
DEFAULT_BODIES_SHA = {"chat": "07ad0bb5a574325c", "agent": "d075337b326d7ed4", "batch": "f073e6076f704258",
                      "mixed": "f844a33221e0a95d"}


@pytest.mark.parametrize("name", list(DEFAULT_BODIES_SHA))
def test_default_traffic_is_unchanged(name):
    bodies = [s.body for s in _take(make_workload(name, seed=5), 30)]
    assert hashlib.sha256(json.dumps(bodies, sort_keys=True).encode()).hexdigest()[:16] == DEFAULT_BODIES_SHA[name]


def test_default_requests_as_they_were():
    first, second = _take(make_workload("chat", seed=5), 2)
    assert first.body["messages"][1]["content"].startswith("question 907920: cpu result alpha prefix")
    assert (first.body["max_tokens"], first.body["seed"], first.body["temperature"], first.body["top_p"]) == \
        (20, 1955615903, 0.8, 0.95)
    assert (second.body["max_tokens"], second.body["seed"]) == (18, 945819339)
    batch = make_workload("batch", seed=5).next()
    assert batch.body["prompt"].endswith("alpha socket gamma\nSummary:")
    assert (batch.body["max_tokens"], batch.body["seed"], batch.body["temperature"]) == (20, 1590371580, 0.8)
    assert not any(s.greedy for s in _take(make_workload("mixed", seed=5), 200))  # default: no greedy request


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("name", ["chat", "mixed"])
def test_greedy_share_is_respected(name, share):
    n = 2000
    specs = _take(make_workload(name, seed=11, greedy_share=share), n)
    k = sum(s.greedy for s in specs)
    assert _within_binomial(k, n, share), (k, n, share)
    # the same seed draws the same requests greedy
    assert [s.greedy for s in specs[:200]] == [s.greedy for s in _take(make_workload(name, seed=11,
                                                                                     greedy_share=share), 200)]
    greedy = next(s for s in specs if s.greedy)
    assert greedy.body["temperature"] == 0.0 and "seed" not in greedy.body and "top_p" not in greedy.body
    assert all(s.body["temperature"] == 0.8 for s in specs if not s.greedy)


def test_all_or_none_greedy_and_the_temperature():
    assert all(s.greedy for s in _take(make_workload("agent", seed=2, greedy_share=1.0), 50))
    sampled = _take(make_workload("batch", seed=2, temperature=1.3), 50)
    assert all(s.body["temperature"] == 1.3 and not s.greedy for s in sampled)
    mixed = _take(make_workload("mixed", seed=2, greedy_share=0.5, temperature=0.3), 400)
    assert {s.body["temperature"] for s in mixed} == {0.0, 0.3}


def test_the_greedy_share_never_changes_the_prompts():
    def shape(specs):
        return [(s.workload, s.body.get("prompt"), s.body.get("messages"), s.body["max_tokens"]) for s in specs]

    base = shape(_take(make_workload("mixed", seed=4), 100))
    assert shape(_take(make_workload("mixed", seed=4, greedy_share=0.4, temperature=1.0), 100)) == base
    rescaled = make_workload("chat", seed=4, greedy_share=0.4, temperature=0.5).rescaled(0.5)
    assert (rescaled.scale, rescaled.greedy_share, rescaled.temperature) == (0.5, 0.4, 0.5)


def test_knobs_out_of_range_are_clear_errors():
    for kw, match in [({"greedy_share": 1.5}, "greedy share must be a share of requests in \\[0, 1\\]"),
                      ({"greedy_share": -0.1}, "greedy share"), ({"temperature": -0.5}, "temperature must be in"),
                      ({"temperature": 101.0}, "temperature must be in")]:
        with pytest.raises(ValueError, match=match):
            make_workload("chat", **kw)
    workload = make_workload("chat")
    nobody = "http://127.0.0.1:9"  # never contacted: the knobs are checked before any traffic
    with pytest.raises(ValueError, match="duplicate share must be a share"):
        asyncio.run(run_load([nobody, nobody + "0"], workload, parse_arrival("closed:1"), num_requests=1,
                             duplicate_share=2.0))
    with pytest.raises(ValueError, match="needs two endpoints at least"):
        asyncio.run(run_load([nobody], workload, parse_arrival("closed:1"), num_requests=1, duplicate_share=0.5))


def test_cli_refuses_knobs_out_of_range(capsys):
    common = ["loadgen", "--endpoints", "http://127.0.0.1:9", "--num-requests", "1", "--no-progress"]
    for flags, match in [(["--greedy-share", "2"], "greedy share"), (["--temperature", "-1"], "temperature"),
                         (["--duplicate-share", "0.5"], "needs two endpoints at least")]:
        assert main(common + flags) == 2
        assert match in capsys.readouterr().err


def test_duplicates_go_to_two_replicas_with_identical_bodies(tiny_llama, store, tmp_path, served_replica):
    replica = served_replica
    out = tmp_path / "load.json"
    with replica(tiny_llama, "dup-a", store) as (a, parts_a), replica(tiny_llama, "dup-b", store) as (b, parts_b):
        rc = main(["loadgen", "--endpoints", f"{a},{b}", "--workload", "chat", "--arrival", "closed:2",
                   "--num-requests", "16", "--max-tokens", "4", "--prompt-scale", "0.3", "--seed", "5",
                   "--greedy-share", "1", "--duplicate-share", "0.5", "--out", str(out), "--no-progress"])
        assert rc == 0
        parts_a.recorder.flush()
        parts_b.recorder.flush()
    data = json.loads(out.read_text())
    assert {k: data["config"][k] for k in ("greedy_share", "temperature", "duplicate_share")} == \
        {"greedy_share": 1.0, "temperature": 0.8, "duplicate_share": 0.5}
    by_id = {r["request_id"]: r for r in data["requests"]}
    twins = [rid for rid in by_id if rid.endswith(DUPLICATE_SUFFIX)]
    assert len(by_id) == 16 + len(twins) and all(r["ok"] for r in by_id.values())
    assert _within_binomial(len(twins), 16, 0.5) and twins
    rows = store.query_df("SELECT request_id, replica_id, workload, prompt_token_ids, output_token_ids, "
                          "sampling_params_json FROM requests WHERE replica_id IN ('dup-a', 'dup-b')")
    stored = {r["request_id"]: r for r in rows.to_dict("records")}
    assert set(stored) == set(by_id)
    for twin in twins:
        first, second = stored[twin[:-len(DUPLICATE_SUFFIX)]], stored[twin]
        assert first["replica_id"] != second["replica_id"]  # two replicas
        assert by_id[twin]["endpoint"] != by_id[twin[:-len(DUPLICATE_SUFFIX)]]["endpoint"]
        for column in ("workload", "sampling_params_json"):  # one body
            assert first[column] == second[column]
        assert list(first["prompt_token_ids"]) == list(second["prompt_token_ids"])
        assert json.loads(first["sampling_params_json"])["temperature"] == 0.0
        assert list(first["output_token_ids"]) == list(second["output_token_ids"])  # greedy, one model
