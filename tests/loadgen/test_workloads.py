"""Workloads and arrival processes: seeded, shaped as the field's classes, parsed strictly."""

from __future__ import annotations

import itertools
import statistics

import pytest

from engine.traffic.loadgen.arrivals import parse_arrival
from engine.traffic.loadgen.client import RequestResult
from engine.traffic.loadgen.stats import format_table, summarize
from engine.traffic.loadgen.workloads import make_workload


def _take(workload, n):
    return [workload.next() for _ in range(n)]


@pytest.mark.parametrize("name", ["chat", "agent", "batch", "mixed"])
def test_same_seed_same_requests(name):
    a, b = _take(make_workload(name, seed=3), 20), _take(make_workload(name, seed=3), 20)
    assert [x.body for x in a] == [x.body for x in b]
    c = _take(make_workload(name, seed=4), 20)
    assert [x.body for x in a] != [x.body for x in c]


def test_chat_shares_one_system_prompt_and_streams():
    reqs = _take(make_workload("chat"), 10)
    assert all(r.api == "chat" and r.stream for r in reqs)
    assert len({r.body["messages"][0]["content"] for r in reqs}) == 1
    assert len({r.body["messages"][1]["content"] for r in reqs}) == 10


def test_agent_prompts_grow_and_reuse_their_prefix():
    reqs = _take(make_workload("agent", seed=1), 40)
    by_session: dict = {}
    for r in reqs:
        by_session.setdefault(r.session, []).append(r.body["messages"])
    reused = 0
    for turns in by_session.values():
        for before, after in itertools.pairwise(turns):
            if len(after) > len(before):  # the same task, one step further: the old prompt is a prefix
                assert after[:len(before)] == before
                reused += 1
    assert reused >= 20
    chat = _take(make_workload("chat"), 40)
    size = lambda rs: statistics.mean(sum(len(m["content"]) for m in r.body["messages"]) for r in rs)  # noqa: E731
    assert size(reqs) > 4 * size(chat)  # long prompts
    assert statistics.mean(r.body["max_tokens"] for r in reqs) > statistics.mean(r.body["max_tokens"] for r in chat)


def test_batch_is_not_streamed_and_mixed_mixes():
    assert all(r.api == "completions" and not r.stream for r in _take(make_workload("batch"), 10))
    kinds = {r.workload for r in _take(make_workload("mixed"), 60)}
    assert kinds == {"chat", "agent", "batch"}


def test_overrides():
    w = make_workload("chat", max_tokens=5, ignore_eos=False)
    assert all(r.body["max_tokens"] == 5 and r.body["ignore_eos"] is False for r in _take(w, 5))
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("video")


def test_arrivals():
    poisson = parse_arrival("poisson:4")
    gaps = [b - a for a, b in itertools.pairwise(itertools.islice(poisson.offsets(seed=1), 4001))]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.1)
    assert list(itertools.islice(poisson.offsets(seed=1), 5)) == list(itertools.islice(poisson.offsets(seed=1), 5))
    burst = parse_arrival("burst:3@2.5")
    assert list(itertools.islice(burst.offsets(), 7)) == [0, 0, 0, 2.5, 2.5, 2.5, 5.0]
    closed = parse_arrival("closed:4")
    assert (closed.concurrency, closed.open_loop) == (4, False)
    for bad in ["poisson:0", "poisson:x", "burst:3", "burst:0@1", "closed:0", "uniform:3", ""]:
        with pytest.raises(ValueError, match="poisson:RATE"):
            parse_arrival(bad)


def test_summary_percentiles_per_workload_and_replica():
    results = []
    for i in range(100):
        r = RequestResult(f"x-{i}", "chat" if i % 2 else "batch", "http://a", "r0" if i < 50 else "r1",
                          "chat", True, 0.0, ok=i != 7, ttft=i / 100, e2e=1 + i / 100, itl=[0.01, 0.02],
                          output_tokens=3)
        results.append(r)
    s = summarize(results, wall_seconds=10.0)
    assert s["all"]["requests"] == 100 and s["all"]["errors"] == 1
    assert s["all"]["output_tokens"] == 99 * 3
    assert s["all"]["ttft"]["p50"] == pytest.approx(0.5, abs=0.011)
    assert set(s["by_workload_replica"]) == {"chat/r0", "chat/r1", "batch/r0", "batch/r1"}
    table = format_table(s)
    assert "chat/r1" in table and "ttft p99" in table
