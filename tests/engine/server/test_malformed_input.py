"""Malformed input is a 4xx that says what is wrong, and the replica keeps serving; strange but valid
text (the Unicode torture corpus) is served as it came.

- a lone surrogate, in JSON escape form or as raw bytes: 400 naming the field and the character;
- a body that is not UTF-8: 400;
- NUL, controls, combining marks, ZWJ, RTL, noncharacters, astral characters: 200, the same tokens
  the tokenizer makes of the text here, on completions, chat and streaming;
- a prompt too long to ever fit (28.5 MB): 400 naming the limit, without tokenizing it;
- tokenizing runs off the event loop: /health answers while a prompt is being tokenized;
and afterwards the engine holds no request and no KV block, as /metrics says.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from engine.serving.server.app import build_app
from engine.serving.server.background import BackgroundServer
from engine.serving.server.text_check import TOKENIZE_HEADROOM
from metrics_scrape import scraped_metric

TORTURE = {
    "combining marks": "e\u0301\u0302\u0303 Z\u0334\u0321\u0322\u031b\u0317\u0353 a\u0308\u0308\u0308",
    "zwj sequences": "\U0001F469\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 \U0001F3F3\ufe0f\u200d\U0001F308"
                     " a\u200db\u200cc",
    "rtl": "\u202eabc\u202c \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd \u200f!\u200e",
    "controls": "".join(chr(c) for c in range(1, 32)) + "\x7f\x85\x9f",
    "nul": "before\x00after\x00",
    "bom and noncharacters": "\ufeffx\ufffe\uffff\ufdd0",
    "astral": "\U0001F600\U00010348\U0010FFFD\U000E0041",
    "replacement char": "\ufffd\ufffd",
}


def _model(live) -> str:
    return live.served.name


def _post(url: str, path: str, body: dict, ascii_escapes: bool, timeout: float = 60) -> httpx.Response:
    """The body as JSON: with \\uXXXX escapes for everything non-ASCII, or as raw UTF-8."""
    raw = json.dumps(body, ensure_ascii=ascii_escapes).encode("utf-8", "surrogatepass")
    return httpx.post(url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=timeout)


@pytest.fixture(scope="module")
def observed(live):
    """A second app on the live engine whose /metrics gauges are read from the engine at each scrape."""
    app = build_app(live.served, metrics_registry=live.parts.registry, metrics_observer=live.parts.metrics,
                    manage_engine=False)
    with BackgroundServer(app) as server:
        yield server.url


# ------------------------------------------------------------------ valid, if strange, text


@pytest.mark.parametrize("name", sorted(TORTURE))
@pytest.mark.parametrize("ascii_escapes", [True, False], ids=["json-escapes", "raw-utf8"])
def test_torture_corpus_is_served_as_it_came(live, observed, name, ascii_escapes):
    text = TORTURE[name]
    model = _model(live)
    expected = live.served.tokenizer.encode(text)
    tokens = _post(observed, "/tokenize", {"model": model, "prompt": text}, ascii_escapes)
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["tokens"] == expected  # the server got exactly this text
    common = {"model": model, "max_tokens": 3, "temperature": 0, "stop": [text[:2] or "x"]}
    completion = _post(observed, "/v1/completions", {**common, "prompt": text, "return_token_ids": True},
                       ascii_escapes)
    assert completion.status_code == 200, completion.text
    assert completion.json()["prompt_token_ids"] == expected
    chat = _post(observed, "/v1/chat/completions",
                 {**common, "messages": [{"role": "user", "content": text, "name": text}]}, ascii_escapes)
    assert chat.status_code == 200, chat.text
    for path, body in [("/v1/completions", {**common, "prompt": text, "stream": True}),
                       ("/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}],
                                                 "stream": True})]:
        r = _post(observed, path, body, ascii_escapes)
        assert r.status_code == 200, r.text
        assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text


# ------------------------------------------------------------------ invalid Unicode


def _surrogate_cases(model: str):
    """(path, body, the field named, the character position)."""
    bad = "x \ud800 y"  # position 2
    msg = lambda content, **kw: {"role": "user", "content": content, **kw}  # noqa: E731
    return [
        ("/v1/completions", {"model": model, "prompt": bad}, "prompt", 2),
        ("/v1/completions", {"model": model, "prompt": bad, "stream": True}, "prompt", 2),
        ("/v1/completions", {"model": model, "prompt": ["ok", "ok", "ab\udc00"]}, "prompt[2]", 2),
        ("/v1/completions", {"model": model, "prompt": "fine", "stop": ["ok", "\udfff"]}, "stop[1]", 0),
        ("/v1/completions", {"model": model, "prompt": "fine", "user": "abc\ud83d"}, "user", 3),
        ("/v1/completions", {"model": "tiny\ude00\ud83d", "prompt": "fine"}, "model", 4),
        ("/v1/chat/completions", {"model": model, "messages": [msg(bad)]}, "messages[0].content", 2),
        ("/v1/chat/completions", {"model": model, "messages": [msg(bad)], "stream": True},
         "messages[0].content", 2),
        ("/v1/chat/completions", {"model": model, "messages": [msg("hi"), msg([{"type": "text", "text": bad}])]},
         "messages[1].content[0].text", 2),
        ("/v1/chat/completions", {"model": model, "messages": [msg("hi", name=bad)]}, "messages[0].name", 2),
        ("/v1/chat/completions", {"model": model, "messages": [msg("hi")], "logit_bias": {bad: 1.0}},
         'logit_bias["x \\ud800 y"]', 2),
        ("/tokenize", {"model": model, "prompt": bad}, "prompt", 2),
        ("/tokenize", {"model": model, "messages": [msg(bad)]}, "messages[0].content", 2),
    ]


@pytest.mark.parametrize("raw_bytes", [False, True], ids=["json-escape", "raw-bytes"])
def test_lone_surrogates_are_400s_naming_the_field_and_position(live, observed, raw_bytes):
    for path, body, field, position in _surrogate_cases(_model(live)):
        # JSON escapes ("\ud800"), or the surrogate's own UTF-8-style bytes (ED A0 80), which Python's
        # json decodes to the same lone surrogate
        r = _post(observed, path, body, ascii_escapes=not raw_bytes)
        assert r.status_code == 400, (path, body, r.text)
        error = r.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_unicode", field), (path, error)
        assert f"invalid Unicode at character {position}" in error["message"], error
    assert httpx.get(observed + "/health", timeout=10).json()["status"] == "ok"


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "prompt": "\xff"}',  # a byte that never occurs in UTF-8
    '{"model": "m", "prompt": "caf\u00e9"}'.encode("latin-1"),  # another encoding
    b'{"model": "m", "prompt": "\xe2\x82"}',  # a truncated sequence
    b'{"model": "m", "prompt": "\xc0\xaf"}',  # an overlong encoding of "/"
], ids=["ff", "latin-1", "truncated", "overlong"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_bodies_that_are_not_utf8_are_400s(observed, raw, path):
    r = httpx.post(observed + path, content=raw, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_encoding" and "not valid UTF-8" in error["message"], error


# ------------------------------------------------------------------ too long to fit, and the event loop


def test_a_prompt_too_long_to_fit_is_refused_without_tokenizing(live, observed, monkeypatch):
    served = live.served
    encoded = []
    real = served.tokenizer.hf.encode
    monkeypatch.setattr(served.tokenizer.hf, "encode", lambda *a, **k: encoded.append(1) or real(*a, **k))
    limit = served.max_model_len * served.chars_per_token
    huge = "x" * 28_500_000  # the size seen in the attack: 46 s on the event loop, before
    countable = TOKENIZE_HEADROOM * limit  # /tokenize measures texts that do not fit (the loadgen sizes prompts so)
    cases = [("/v1/completions", {"prompt": "y" * (limit + 1)}, "prompt", limit + 1, f"at most {limit} characters"),
             ("/v1/completions", {"prompt": huge, "stream": True}, "prompt", len(huge), f"at most {limit} characters"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}, "messages", len(huge),
              f"at most {limit} characters"),
             ("/tokenize", {"prompt": huge}, "prompt", len(huge), f"counts at most {countable}")]
    for path, body, param, chars, bound in cases:
        r = _post(observed, path, {"model": served.name, **body}, ascii_escapes=True, timeout=120)
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert (error["param"], error["code"]) == (param, "context_length_exceeded")
        assert f"the text is {chars} characters" in error["message"]
        assert bound in error["message"]
    assert encoded == []  # none of them reached the tokenizer
    # under the limits the text is tokenized: at the context's bound, and /tokenize past it (counted, not run)
    r = _post(observed, "/tokenize", {"model": served.name, "prompt": "y" * limit}, ascii_escapes=True)
    assert r.status_code == 200 and encoded == [1]
    r = _post(observed, "/tokenize", {"model": served.name, "prompt": "y " * limit}, ascii_escapes=True)
    assert r.status_code == 200 and r.json()["count"] > served.max_model_len and encoded == [1, 1]


def test_health_answers_while_a_prompt_is_being_tokenized(live, observed, monkeypatch):
    """The tokenizer is held inside one request's admission until /health has answered: were tokenizing on
    the event loop, /health could not answer and its (generous) timeout would fail the test."""
    hf = live.served.tokenizer.hf
    real = hf.encode
    inside, release = threading.Event(), threading.Event()

    def held_encode(*args, **kwargs):
        inside.set()
        release.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(hf, "encode", held_encode)
    result: dict = {}
    body = {"model": live.served.name, "prompt": "a prompt held in the tokenizer " * 50, "max_tokens": 2}
    worker = threading.Thread(target=lambda: result.update(r=httpx.post(observed + "/v1/completions", json=body,
                                                                          timeout=180)))
    worker.start()
    try:
        assert inside.wait(60), "the request never reached the tokenizer"
        health = httpx.get(observed + "/health", timeout=30)
        assert health.status_code == 200 and health.json()["status"] == "ok"
    finally:
        release.set()
        worker.join(180)
    assert result["r"].status_code == 200, result["r"].text


def test_nothing_is_left_behind(live, observed):
    """After all of the above (run last in this module): no request, no KV block, and /metrics agrees."""
    idle = live.wait_idle()
    assert (idle["running"], idle["waiting"], idle["kv_blocks_used"], idle["in_flight"]) == (0, 0, 0, 0)
    labels = {"replica": live.served.replica_id}
    assert scraped_metric(observed, "infersight_num_requests_running", **labels) == 0
    assert scraped_metric(observed, "infersight_kv_cache_blocks", state="used", **labels) == 0
    assert scraped_metric(observed, "infersight_kv_cache_usage_ratio", **labels) == 0.0
