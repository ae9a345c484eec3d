"""Several choices in one response: `n`, `best_of` and a list of prompts, fanned out to engine requests.

One API request becomes `len(prompts) * best_of` independent engine requests
(as vLLM's parallel sampling does): sample j of prompt i is the engine request
`<request id>-<i * best_of + j>`, with seed `seed + j` when a seed is given
(vLLM's child seeds), so a seeded request is reproducible and its samples
differ. Their outputs are merged into one stream of `GroupOutput`s; when all
are done, `best_of > n` keeps per prompt the n samples of highest cumulative
logprob (as vLLM's best_of), and choice i * n + j is prompt i's j-th kept sample
(OpenAI's indexes). Closing the merged stream aborts the samples still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from engine.core.outputs import RequestOutput


@dataclasses.dataclass
class GroupOutput:
    """One increment of one sample, and every sample's final output so far."""

    index: int  # the sample this increment is of
    out: RequestOutput
    finals: list[RequestOutput | None]

    @property
    def finished(self) -> bool:
        return all(f is not None for f in self.finals)

    @property
    def finish_reason(self) -> str | None:  # "error" if any sample failed (the server reports it)
        if any(f is not None and f.finish_reason == "error" for f in self.finals):
            return "error"
        return self.out.finish_reason

    @property
    def error(self) -> str | None:
        return next((f.error for f in self.finals if f is not None and f.error), None)

    @property
    def prompt_token_ids(self) -> list[int]:  # the access log counts tokens over all samples
        return [t for f in self.finals if f is not None for t in f.prompt_token_ids]

    @property
    def token_ids(self) -> list[int]:
        return [t for f in self.finals if f is not None for t in f.token_ids]


def cumulative_logprob(out: RequestOutput) -> float:
    return sum(item.logprob for item in out.logprobs or [])


def kept_choices(finals: list[RequestOutput], best_of: int, n: int) -> list[RequestOutput]:
    """Per prompt (each `best_of` consecutive samples) the n of highest cumulative logprob, best first;
    all of them, in order, when best_of == n."""
    kept = []
    for start in range(0, len(finals), best_of):
        samples = finals[start:start + best_of]
        if best_of > n:
            samples = sorted(samples, key=cumulative_logprob, reverse=True)[:n]
        kept.extend(samples)
    return kept


async def merged(engine, requests, request_id: str, **kwargs):
    """Run `requests` ([(prompt, params)]) as engine requests `<request_id>-<k>`; yield GroupOutputs."""
    finals: list[RequestOutput | None] = [None] * len(requests)
    gens = [engine.generate(p, sp, f"{request_id}-{k}", **kwargs) for k, (p, sp) in enumerate(requests)]
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(k, gen):
        try:
            async for out in gen:
                await queue.put((k, out, None))
                if out.finished:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((k, None, e))

    tasks = [asyncio.ensure_future(pump(k, g)) for k, g in enumerate(gens)]
    try:
        while not all(f is not None for f in finals):
            k, out, error = await queue.get()
            if error is not None:
                raise error
            if out.finished:
                finals[k] = out
            yield GroupOutput(k, out, finals)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for k, gen in enumerate(gens):
            if finals[k] is None:
                with contextlib.suppress(Exception):
                    await engine.abort(f"{request_id}-{k}")
            with contextlib.suppress(BaseException):
                await gen.aclose()
