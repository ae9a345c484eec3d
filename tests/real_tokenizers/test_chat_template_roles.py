"""The prober's chat probes and loadgen's chat workloads adapt to a chat template that refuses a system
message and requires user / assistant alternation (Mistral-7B-Instruct-v0.1's, on its real
SentencePiece tokenizer): the request is sent again with the system message folded into the first
user turn, and later ones to that replica go folded at once. A replica whose template takes system
messages gets them as they are."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from engine.traffic.loadgen import client as loadgen_client
from engine.traffic.loadgen.arrivals import parse_arrival
from engine.traffic.loadgen.runner import run_load
from engine.traffic.loadgen.workloads import RequestSpec, make_workload
from engine.traffic.probe.suite import CHAT, SUITE


@pytest.fixture(scope="module")
def mistral(real_models):
    import torch

    from engine.core.async_engine import AsyncLLM
    from engine.core.config import EngineConfig
    from engine.serving.server.app import build_app
    from engine.serving.server.background import BackgroundServer
    from engine.serving.server.model_info import ServedModel

    torch.set_num_threads(1)
    engine = AsyncLLM(EngineConfig(model=str(real_models("sentencepiece")), max_model_len=512, num_kv_blocks=96,
                                   block_size=16, max_num_seqs=8, replica_id="mistral0"))
    served = ServedModel.from_engine(engine, created=int(time.time()))
    with BackgroundServer(build_app(served)) as server:
        yield server.url, served.name


@pytest.fixture(autouse=True)
def _forget_folding():
    loadgen_client._FOLDING.clear()
    yield
    loadgen_client._FOLDING.clear()


def _send(url: str, model: str, spec: RequestSpec, request_id: str):
    async def go():
        async with httpx.AsyncClient() as c:
            return await loadgen_client.send(c, url, "mistral0", model, spec, request_id, timeout=120)
    return asyncio.run(go())


def test_the_template_refuses_a_system_message(mistral):
    url, model = mistral
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": "Hi"}]}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400 and "template" in r.text  # what made loadgen exit 1


def test_every_chat_probe_is_answered_folded_where_it_holds_a_system_message(mistral):
    url, model = mistral
    chats = [p for p in SUITE if p.api == CHAT]
    with_system = {p.probe_id for p in chats if any(role == "system" for role, _ in p.messages)}
    assert with_system  # the multi-turn probe: system, user, assistant, user
    for i, probe in enumerate(chats):
        result = _send(url, model, RequestSpec("probe", CHAT, probe.body(), probe.stream), f"probe-{i}")
        assert result.ok, (probe.probe_id, result.error)
        assert bool(result.adapted) == (probe.probe_id in with_system), probe.probe_id
    assert (url, model) in loadgen_client._FOLDING


@pytest.mark.parametrize("workload", ["chat", "agent", "mixed"])
def test_loadgen_chat_workloads_run_clean_on_the_template(mistral, workload):
    url, model = mistral
    load = asyncio.run(run_load([url], make_workload(workload, seed=1, scale=0.25, max_tokens=4),
                                parse_arrival("closed:2"), num_requests=6, request_timeout=120))
    assert [r.error for r in load.results if not r.ok] == []
    assert any(r.adapted for r in load.results)  # the system message was folded, not dropped


def test_a_request_refused_for_another_reason_keeps_its_own_error(mistral):
    url, model = mistral
    # two user turns in a row: folded or not, the template refuses it; the first refusal is reported
    spec = RequestSpec("chat", CHAT, {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "a"},
                                                   {"role": "user", "content": "b"}], "max_tokens": 2}, False)
    result = _send(url, model, spec, "bad-1")
    assert not result.ok and result.status == 400 and not result.adapted and "template" in result.error
    assert (url, model) not in loadgen_client._FOLDING


def test_fold_system_message():
    fold = loadgen_client.fold_system_message
    assert fold([{"role": "user", "content": "q"}]) is None
    assert fold([{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
                 {"role": "assistant", "content": "a"}]) == [{"role": "user", "content": "S\n\nq"},
                                                             {"role": "assistant", "content": "a"}]
    assert fold([{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "q"}]}]) \
        == [{"role": "user", "content": [{"type": "text", "text": "S\n\n"}, {"type": "text", "text": "q"}]}]
    assert fold([{"role": "system", "content": "S"}]) == [{"role": "user", "content": "S"}]


def test_a_probe_round_on_the_template_answers_every_chat_probe(mistral):
    from engine.traffic.probe.runner import run_probe_round

    url, _ = mistral
    chat_ids = {p.probe_id for p in SUITE if p.api == CHAT}
    probe_round = run_probe_round([url], modes=("solo",), request_timeout=120)
    results = {r.probe_id: r for r in probe_round.replicas[0].results if r.probe_id in chat_ids}
    assert results and all(r.ok for r in results.values()), {k: r.error for k, r in results.items() if not r.ok}
    assert results["chat_multi_turn"].adapted and not results["eval_addition"].adapted

