"""The shipped probe suite (ids, categories, greedy bodies), the round's token budget, and a replica
that stops answering mid-round (a real refused connection, no server needed)."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from engine.traffic.loadgen.runner import Endpoint
from engine.traffic.probe.budget import FILLER_RUN_TOKENS, Measured, filler_max_tokens, filler_run_tokens, plan_round, send_cost
from engine.util import parse_interval
from engine.traffic.probe.runner import probe_replica
from engine.traffic.probe.schedule import probe_every
from engine.traffic.probe.suite import CATEGORIES, CHAT, COMPLETIONS, SUITE, Probe, check_suite
from telemetry.contract.probes import MODES, parse_probe_request_id, probe_request_id, round_id

HEADER_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")  # what engine/serving/server/headers.py accepts
# what the suite must probe (the list): every one of these categories is present
REQUIRED = {"whitespace", "numbers", "code", "mixed_scripts", "fullwidth_ligatures", "combining_marks", "zwj_emoji",
            "rtl", "special_tokens", "uppercase", "near_context_limit", "long_output", "eval_like"}


def _text(p: Probe) -> str:
    return p.prompt + p.fill + "".join(c for _, c in p.messages)


def test_ids_are_valid_request_ids_for_every_mode():
    check_suite(SUITE)
    rid = round_id(1_800_000_000.123)
    for p in SUITE:
        for mode in MODES:
            request_id = probe_request_id(rid, p.probe_id, mode, "replica-with-a-long-name-0")
            assert HEADER_ID.match(request_id), request_id
            parsed = parse_probe_request_id(request_id)
            assert (parsed.round_id, parsed.probe_id, parsed.mode) == (rid, p.probe_id, mode)


def test_categories_and_apis_are_covered():
    assert REQUIRED <= set(CATEGORIES), REQUIRED - set(CATEGORIES)
    assert {p.api for p in SUITE} == {COMPLETIONS, CHAT}
    assert 20 <= len(SUITE) <= 30
    text = "".join(_text(p) for p in SUITE)
    for needle in ("\ufb01", "\uff21", "e\u0301", "\u200d", "\u0645", "\u05e9", "\u4e16", "\u043c", "\u03ba",
                   "<s>", "</s>", "<|eos|>", "[INST]", "\t", "  ", "\n\n"):
        assert needle in text, repr(needle)
    assert any(sum(c.isupper() for c in _text(p)) > 20 for p in SUITE)  # what a Lowercase normalizer changes
    long = [p for p in SUITE if p.category == "long_output"]
    assert len(long) == 1 and long[0].max_tokens > 4 * max(p.max_tokens for p in SUITE if p.category != "long_output")
    near = [p for p in SUITE if p.category == "near_context_limit"]
    assert len(near) == 1 and near[0].fill and not near[0].prompt  # built at round time from the context


def test_bodies_are_greedy_and_of_fixed_length():
    for p in SUITE:
        body = p.body("x") if p.fill else p.body()
        assert body["temperature"] == 0.0 and body["ignore_eos"] is True and body["max_tokens"] == p.max_tokens
        assert ("messages" in body) == (p.api == CHAT)


@pytest.mark.parametrize("probe, words", [
    (Probe("Bad-Id", COMPLETIONS, "x", prompt="p"), ["Bad-Id", "lowercase"]),
    (Probe("filler_7", COMPLETIONS, "x", prompt="p"), ["filler_"]),
    (Probe("chat_empty", CHAT, "x"), ["messages"]),
    (Probe("no_prompt", COMPLETIONS, "x"), ["prompt"]),
])
def test_bad_probes_are_named(probe, words):
    with pytest.raises(ValueError) as e:
        check_suite([probe])
    assert all(w in str(e.value) for w in words)
    with pytest.raises(ValueError, match="twice"):
        check_suite([SUITE[0], SUITE[0]])


def _measured(prompt_tokens: int = 10) -> list[Measured]:
    return [Measured(p, p.body("x" * 50) if p.fill else p.body(), prompt_tokens) for p in SUITE]


def test_without_a_budget_everything_is_sent():
    plan = plan_round(_measured(), replicas=2, batch_fillers=4, filler_prompt_tokens=20)
    assert len(plan.sends) == 2 * len(SUITE) and not plan.skipped
    expected = sum(send_cost(p, 10, m, 4, 20) for p in SUITE for m in MODES)
    assert plan.tokens_per_replica == expected and plan.tokens == 2 * expected
    batched = send_cost(SUITE[0], 10, "batched", 4, 20)
    assert batched == 10 + SUITE[0].max_tokens + 4 * (20 + filler_max_tokens(SUITE[0]))


@pytest.mark.parametrize("max_model_len", [0, 64, 256, 100_000])
def test_fillers_run_as_long_as_the_context_allows_and_never_shorter_than_planned(max_model_len):
    # long, so that a filler is still decoding when its probe is admitted a round trip later (the runner
    # stops it once the probe is answered); within the context, so that the replica accepts it
    probe = SUITE[0]
    tokens = filler_run_tokens(probe, 20, max_model_len)
    assert tokens >= filler_max_tokens(probe)
    assert tokens <= FILLER_RUN_TOKENS or tokens == filler_max_tokens(probe)
    if max_model_len - 20 > filler_max_tokens(probe):
        assert tokens == min(FILLER_RUN_TOKENS, max_model_len - 20)
    if not max_model_len:
        assert tokens == FILLER_RUN_TOKENS


@pytest.mark.parametrize("budget", [1, 300, 1000, 5000])
def test_a_budget_caps_the_round_and_every_send_is_accounted_for(budget):
    replicas = 3
    plan = plan_round(_measured(), replicas=replicas, token_budget=budget, batch_fillers=4, filler_prompt_tokens=20)
    assert plan.tokens <= budget
    sent = [(s.probe.probe_id, s.mode) for s in plan.sends]
    skipped = [(s.probe_id, s.mode) for s in plan.skipped]
    assert sorted(sent + skipped) == sorted((p.probe_id, m) for p in SUITE for m in MODES)  # none lost silently
    assert all("budget" in s.reason or "solo send was skipped" in s.reason for s in plan.skipped)
    assert all((pid, "solo") in sent for pid, mode in sent if mode == "batched")  # never batched without solo
    if budget == 1:
        assert not plan.sends
    # first fit in suite order: the cheap eval-like and tokenizer probes come before the long ones
    if plan.sends:
        assert plan.sends[0].probe.probe_id == SUITE[0].probe_id


def test_context_and_unbuilt_probes_are_skipped_with_their_reason():
    measured = _measured(prompt_tokens=40)
    near = next(i for i, m in enumerate(measured) if m.probe.fill)
    measured[near] = Measured(measured[near].probe, {}, None, "r0 reports no context length")
    plan = plan_round(measured, replicas=1, modes=("solo",), max_model_len=64)
    reasons = {s.probe_id: s.reason for s in plan.skipped}
    assert reasons["near_context"] == "r0 reports no context length"
    assert "exceed the 64-token context" in reasons["long_output"]
    assert all(40 + s.probe.max_tokens <= 64 for s in plan.sends) and {s.mode for s in plan.sends} == {"solo"}


def test_a_replica_that_stops_answering_is_given_up_with_the_rest_counted():
    plan = plan_round(_measured()[:3], replicas=1)
    ghost = Endpoint("http://127.0.0.1:1", "ghost", "m")  # nothing listens on port 1: connection refused

    async def go():
        async with httpx.AsyncClient() as client:
            return await probe_replica(client, ghost, plan.sends, round_id(1.0), request_timeout=5)

    out = asyncio.run(go())
    assert len(out.results) == 1 and out.results[0].status == 0 and not out.results[0].ok
    assert "stopped answering" in out.error
    assert len(out.not_sent) == len(plan.sends) - 1


def test_scheduled_rounds_run_on_the_interval_until_stopped():
    seen = []

    async def go(**kw):
        return await probe_every(0.05, lambda: ["http://127.0.0.1:1"], seen.append, **kw)

    assert asyncio.run(go(max_rounds=2)) == 2
    assert len({r.round_id for r in seen}) == 2 and all(r.replicas[0].error for r in seen)

    async def stopped_by_the_first_report():
        stop = asyncio.Event()
        return await probe_every(0.05, lambda: ["http://127.0.0.1:1"], lambda r: stop.set(), stop=stop)

    assert asyncio.run(stopped_by_the_first_report()) == 1


@pytest.mark.parametrize("value, seconds", [("60s", 60.0), ("2m", 120.0), ("500ms", 0.5), (3, 3.0), ("1.5", 1.5),
                                            ("1h", 3600.0)])
def test_intervals(value, seconds):
    assert parse_interval(value) == seconds


@pytest.mark.parametrize("value", ["0s", "soon", "-1", True, "5 minutes"])
def test_bad_intervals_are_named(value):
    with pytest.raises(ValueError, match="interval"):
        parse_interval(value)
