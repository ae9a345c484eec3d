"""The streaming engine: increments add up to the offline result, abort, bad input, drain on shutdown."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch

from engine.core.async_engine import AsyncLLM
from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams

torch.set_num_threads(1)  # tiny models on a shared 2-core machine

PARAMS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def offline(tiny_llama):
    return LLM(tiny_llama, block_size=4, num_kv_blocks=256)


def make_engine(model, **kw):
    return AsyncLLM(model, block_size=4, num_kv_blocks=256, **kw)


async def collect(engine, prompt, params=PARAMS, request_id=None):
    outs = []
    async for out in engine.generate(prompt, params, request_id):
        outs.append(out)
    return outs


def test_concurrent_streams_add_up_to_the_offline_result(tiny_llama, offline):
    prompts = ["The quick brown fox", "Unicode: café 日本語 🚀", "def add(a, b):"]
    expected = offline.generate(prompts, PARAMS, use_tqdm=False)

    async def main():
        engine = make_engine(tiny_llama)
        try:
            return await asyncio.gather(*(collect(engine, p, request_id=f"r{i}") for i, p in enumerate(prompts)))
        finally:
            await engine.shutdown()

    for outs, ref in zip(asyncio.run(main()), expected):
        assert len(outs) > 1  # really streamed
        assert [t for o in outs for t in o.new_token_ids] == ref.token_ids == outs[-1].token_ids
        assert "".join(o.new_text for o in outs) == ref.text == outs[-1].text
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert not any(o.finished for o in outs[:-1])


def test_stop_strings_while_streaming(tiny_llama, offline):
    full = offline.generate(["Inference engineers"], PARAMS, use_tqdm=False)[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])

    async def main():
        engine = make_engine(tiny_llama)
        try:
            return await collect(engine, "Inference engineers", params)
        finally:
            await engine.shutdown()

    outs = asyncio.run(main())
    assert "".join(o.new_text for o in outs) == full[:full.index(stop)]
    assert outs[-1].finish_reason == "stop"


def test_abort_and_walking_away_free_the_request(tiny_llama):
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        engine = make_engine(tiny_llama)
        try:
            aborted = []
            async for out in engine.generate("abort me", long, "a"):
                aborted.append(out)
                if len(aborted) == 3:
                    await engine.abort("a")
            # a caller that stops listening aborts its request too
            async with contextlib.aclosing(engine.generate("walk away", long, "w")) as stream:
                async for out in stream:
                    if len(out.token_ids) >= 2:
                        break
            for _ in range(200):
                if not engine.engine.has_unfinished():
                    break
                await asyncio.sleep(0.01)
            return aborted, engine
        finally:
            await engine.shutdown()

    aborted, engine = asyncio.run(main())
    assert aborted[-1].finished and aborted[-1].finish_reason == "abort"
    assert len(aborted[-1].token_ids) < 200
    assert not engine.engine.has_unfinished()
    assert engine.engine.kv_cache.num_used_blocks == 0


def test_bad_input_raises_in_generate_and_the_engine_keeps_serving(tiny_llama):
    async def main():
        engine = make_engine(tiny_llama)
        try:
            with pytest.raises(ValueError, match="vocabulary"):
                await collect(engine, [0, 10**9])
            first = engine.generate("dup", PARAMS, "same")
            await first.__anext__()
            with pytest.raises(ValueError, match="already in flight"):
                await collect(engine, "dup", request_id="same")
            await first.aclose()
            return await collect(engine, "still here")
        finally:
            await engine.shutdown()

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 20


def test_shutdown_drains_requests_in_flight(tiny_llama):
    async def main():
        engine = make_engine(tiny_llama)
        tasks = [asyncio.create_task(collect(engine, f"prompt {i}")) for i in range(3)]
        await asyncio.sleep(0)  # let them submit
        while not engine.engine.has_unfinished():
            await asyncio.sleep(0.001)
        await engine.shutdown()
        with pytest.raises(RuntimeError, match="shutting down"):
            await collect(engine, "too late")
        return await asyncio.gather(*tasks), engine

    results, engine = asyncio.run(main())
    assert all(outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 20 for outs in results)
    assert not engine.is_running
