"""`--logprobs-fraction F`: the proxy asks the upstream for the sampled tokens' logprobs on a share F of
requests only, picked by a hash of the request id (the same id: the same choice; nothing else decides),
stores none for the others, and the client receives the same answer either way.

infersight's own server is the upstream (tests/proxy/conftest.py); its own row of each request (replica
`up`) is the truth the proxy's row is held to.
"""

from __future__ import annotations

import argparse
import uuid

import pytest
from proxy_support import rows, sse_payloads, without_volatile

from engine.serving.proxy.background import BackgroundProxy
from engine.serving.proxy.cli import add_arguments, build_proxy
from engine.serving.proxy.extras import UpstreamExtras, asks_logprobs

IDS = [f"req-{i}" for i in range(4000)]


def test_the_share_asked_is_the_fraction_and_an_id_always_gets_the_same_choice():
    assert not any(asks_logprobs(i, 0.0) for i in IDS) and all(asks_logprobs(i, 1.0) for i in IDS)
    half = [asks_logprobs(i, 0.5) for i in IDS]
    assert 1880 <= sum(half) <= 2120  # binomial(4000, 0.5): mean 2000, sd 32
    assert half == [asks_logprobs(i, 0.5) for i in IDS]  # deterministic: a retry gets the same choice
    quarter = [asks_logprobs(i, 0.25) for i in IDS]
    assert 920 <= sum(quarter) <= 1080 and not any(q and not h for q, h in zip(quarter, half))  # nested shares
    extras = UpstreamExtras(0.5)
    for i in IDS[:200]:
        for body, kind in (({"prompt": "x"}, "completion"), ({"messages": []}, "chat")):
            assert ("logprobs" in extras.ask(body, kind, i)[1]) is asks_logprobs(i, 0.5)
            assert "return_token_ids" in extras.ask(body, kind, i)[1]  # token IDs: every request


def _args(*flags):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--upstream", "http://127.0.0.1:9", *flags])


def test_the_setting_and_its_errors(capsys):
    cases = [((), 1.0), (("--logprobs-fraction", "0.25"), 0.25), (("--no-logprobs",), 0.0),
             (("--logprobs-fraction", "0.5", "--logprobs"), 1.0), (("--logprobs-fraction=0",), 0.0)]
    for flags, fraction in cases:
        _, parts, proxy = build_proxy(_args(*flags))
        try:
            assert proxy.extras.logprobs_fraction == fraction, flags
        finally:
            parts.close()
    for bad in ("1.5", "-0.1", "nan", "half"):
        with pytest.raises(SystemExit) as e:
            _args("--logprobs-fraction", bad)
        assert e.value.code == 2 and "between 0 and 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        UpstreamExtras(2.0)


@pytest.fixture(scope="module")
def half_proxy(upstream, tiny_llama, sidecar):
    with BackgroundProxy.start(upstream.url, sidecar.store_url, "px-half", model_dir=tiny_llama,
                               logprobs_fraction=0.5) as p:
        yield p


def _ids(asked: bool, n: int) -> list[str]:
    out = []
    while len(out) < n:
        i = uuid.uuid4().hex
        if asks_logprobs(i, 0.5) is asked:
            out.append(i)
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_asked_requests_store_logprobs_the_others_none_and_the_client_sees_no_difference(
        upstream, half_proxy, store, stream):
    import httpx

    body = {"model": upstream.model, "prompt": "The quick brown fox jumps over", "max_tokens": 8,
            "temperature": 0.9, "seed": 5, "ignore_eos": True, "stream": stream}
    asked, not_asked = _ids(True, 2), _ids(False, 2)
    before = half_proxy.proxy.recorded
    with httpx.Client(base_url=upstream.url, timeout=60) as direct, \
            httpx.Client(base_url=half_proxy.url, timeout=60) as via:
        reference = direct.post("/v1/completions", json=body, headers={"X-Request-Id": uuid.uuid4().hex})
        for request_id in asked + not_asked:
            answer = via.post("/v1/completions", json=body, headers={"X-Request-Id": request_id})
            assert answer.status_code == reference.status_code == 200
            if stream:  # seeded: the same tokens, and no logprobs the client did not ask for
                ours, theirs = sse_payloads(answer.text), sse_payloads(reference.text)
                assert [x if x == "[DONE]" else without_volatile(x) for x in ours] == \
                       [y if y == "[DONE]" else without_volatile(y) for y in theirs]
            else:
                assert without_volatile(answer.json()) == without_volatile(reference.json())
                assert answer.json()["choices"][0]["logprobs"] is None
    half_proxy.wait_recorded(before + 4)
    upstream.flush()
    half_proxy.flush()
    ids = asked + not_asked
    theirs, ours = rows(store, "up", ids), rows(store, "px-half", ids)
    for request_id in asked:
        m, t = ours[request_id], theirs[request_id]
        assert len(m["output_logprobs"]) == len(m["output_token_ids"]) == body["max_tokens"]
        assert list(m["output_logprobs"]) == pytest.approx(list(t["output_logprobs"]), abs=1e-5)
    for request_id in not_asked:
        m = ours[request_id]
        assert len(m["output_logprobs"]) == 0  # not measured: nothing stored, never a placeholder
        assert list(m["output_token_ids"]) == list(theirs[request_id]["output_token_ids"])  # still recorded
    assert "logprobs" not in half_proxy.proxy.extras.refused
