"""`infersight serve --store-text` stores the prompt and output text of completions and chats in the
store (through a real sidecar); without the flag none is stored. The hashes are stored either way."""

from __future__ import annotations

import json
import signal
import subprocess

import httpx
import pytest

from engine.serving.processes import infersight_command, process_ref, wait_healthy
from engine.util import free_port
from engine.core.tokenization import Tokenizer
from telemetry.contract.records import chat_messages_hash, text_sha256

PROMPT = "Store me, if the operator allows it"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Store this chat too"}]


def _start(model, store_url: str, replica: str, *flags: str):
    port = free_port()
    cmd = infersight_command("serve", "--model", str(model), "--port", str(port), "--replica-id", replica,
                             "--store", store_url, "--threads", "1", "--log-level", "warning", *flags)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), f"http://127.0.0.1:{port}"


def _traffic(url: str, model: str, replica: str) -> dict:
    """A completion (one response) and a chat (streamed): request id -> the text the client got."""
    common = {"model": model, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json={**common, "prompt": PROMPT}, timeout=120,
                   headers={"X-Request-Id": f"{replica}-completion"})
    assert r.status_code == 200, r.text
    got = {f"{replica}-completion": r.json()["choices"][0]["text"]}
    r = httpx.post(url + "/v1/chat/completions", json={**common, "messages": MESSAGES, "stream": True}, timeout=120,
                   headers={"X-Request-Id": f"{replica}-chat"})
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    got[f"{replica}-chat"] = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return got


@pytest.mark.slow
def test_store_text_stores_prompt_and_output_text_and_its_absence_stores_none(tiny_llama, sidecar_url, store):
    servers = {"text-on": _start(tiny_llama, sidecar_url, "text-on", "--store-text"),
               "text-off": _start(tiny_llama, sidecar_url, "text-off")}
    answers = {}
    try:
        for replica, (proc, url) in servers.items():
            try:
                wait_healthy(url, process_ref(proc.pid), 180)
            except RuntimeError:
                proc.kill()
                raise AssertionError(proc.communicate()[0][-3000:]) from None
            answers[replica] = _traffic(url, tiny_llama.name, replica)
        for proc, _ in servers.values():  # a clean drain flushes the recorder
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers.values():
            assert proc.wait(60) == 0, proc.communicate()[0][-3000:]
    finally:
        for proc, _ in servers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    rows = store.query_df("SELECT request_id, prompt_text, output_text, prompt_text_hash, rendered_prompt_hash "
                          "FROM requests WHERE replica_id IN ('text-on', 'text-off')").set_index("request_id")
    assert len(rows) == 4, rows
    rendered = Tokenizer(tiny_llama).apply_chat_template(MESSAGES, tokenize=False)
    for replica in servers:
        completion, chat = rows.loc[f"{replica}-completion"], rows.loc[f"{replica}-chat"]
        # what each request came as is hashed, text stored or not
        assert (completion["prompt_text_hash"], completion["rendered_prompt_hash"]) == (text_sha256(PROMPT), "")
        assert chat["prompt_text_hash"] == chat_messages_hash(MESSAGES) != ""
        assert chat["rendered_prompt_hash"] == text_sha256(rendered)
    on = answers["text-on"]
    assert rows.loc["text-on-completion", "prompt_text"] == PROMPT
    assert rows.loc["text-on-completion", "output_text"] == on["text-on-completion"] != ""
    assert rows.loc["text-on-chat", "prompt_text"] == rendered  # what the tokenizer encoded
    assert rows.loc["text-on-chat", "output_text"] == on["text-on-chat"] != ""
    off = rows.loc[["text-off-completion", "text-off-chat"]]
    assert set(off["prompt_text"]) == set(off["output_text"]) == {""}
