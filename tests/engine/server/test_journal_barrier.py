"""A replica answers no request before the request's telemetry record is in the journal on disk.

The recorder here never flushes nor checkpoints on its own (an hour's interval), so only the
server's barrier (engine/serving/server/journal_barrier.py) can have written the journal by the time the
client holds the answer, full or streamed.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from engine.core.async_engine import AsyncLLM
from engine.core.config import EngineConfig
from engine.serving.server.app import build_app
from engine.serving.server.background import BackgroundServer
from engine.serving.server.journal_barrier import journaled
from engine.serving.server.model_info import ServedModel
from telemetry.replica_wiring import build_observer


@pytest.fixture(scope="module")
def replica(tiny_llama, tmp_path_factory):
    spool_dir = tmp_path_factory.mktemp("barrier-spool")
    config = EngineConfig(model=str(tiny_llama), max_model_len=256, num_kv_blocks=48, block_size=16, max_num_seqs=4,
                          replica_id="barrier")
    observer, parts = build_observer("barrier", Path(tiny_llama).name, store_target="http://127.0.0.1:9",
                                     metrics=False, recorder_kwargs=dict(spool_dir=spool_dir, journal=True,
                                                                         flush_interval=3600, checkpoint_interval=3600))
    served = ServedModel.from_engine(AsyncLLM(config, observer), created=int(time.time()))
    try:
        with BackgroundServer(journaled(build_app(served), parts.recorder)) as server:
            yield server.url, served.name, spool_dir
    finally:
        parts.close()  # the store is unreachable on purpose: the final flush spools


def _journal_text(spool_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted(spool_dir.glob("journal-*.jsonl")))


@pytest.mark.parametrize("stream", [False, True])
def test_the_record_is_journaled_before_the_answer_arrives(replica, stream):
    url, model, spool_dir = replica
    request_id = f"barrier-{'stream' if stream else 'full'}"
    body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0, "stream": stream}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", url + "/v1/completions", json=body, headers={"X-Request-Id": request_id}) as r:
            assert r.status_code == 200
            text = ""
            for chunk in r.iter_text():
                text += chunk
                if '"finish_reason":"length"' in text.replace(" ", ""):  # the last token's chunk
                    break
            assert '"finish_reason":"length"' in text.replace(" ", "")
            assert f'"{request_id}"' in _journal_text(spool_dir)  # before the rest of the response is read
