"""A continuous-batching replica simulated step by step: requests and steps whose queues come from
the replica's own speed, for the tests of load control (offered load, not the replica's queue).

Each step admits waiting requests up to `max_seqs` (their prompts are prefilled in that step, or in
chunks over several under a token `budget`) and decodes one token for every running one; it takes
slow * (STEP_BASE + per_token * tokens) seconds with a log-normal jitter. A replica `slow` times
slower per token queues more at the same arrivals: that queue is a consequence of its slowness,
which is what the tests need.
"""

from __future__ import annotations

import dataclasses
import random

from diag_records import request, step

STEP_BASE = 0.010  # seconds per step
STEP_PER_TOKEN = 0.002  # seconds per token in the step
PROMPT = list(range(20, 36))  # 16 prompt tokens
OUTPUT = list(range(40, 56))  # 16 output tokens


def poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    out, t = [], start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return out
        out.append(t)


def serve(rid: str, arrivals: list[float], slow: float = 1.0, max_seqs: int = 4, seed: int = 0,
          jitter: float = 0.1, prompts: list[int] | None = None, budget: int | None = None,
          per_token: float = STEP_PER_TOKEN, cached: list[int] | None = None, output_len: int = len(OUTPUT)):
    """(requests, steps) of replica `rid` serving `arrivals` (sorted epoch seconds) to the end;
    `prompts`: each arrival's prompt length (default len(PROMPT)); `cached`: its prompt tokens served
    from the prefix cache (not computed; default 0). `budget` (max_num_batched_tokens; None: no limit):
    the tokens a step may compute, decodes first, then prefill chunks (a prompt longer than what is left
    is split over steps, chunked prefill); a request's first token comes with its last chunk.
    `per_token`: seconds per token in a step (STEP_PER_TOKEN; a step-overhead-bound CPU engine is ~1e-4);
    `output_len`: tokens generated per request."""
    lengths = prompts if prompts is not None else [len(PROMPT)] * len(arrivals)
    hits = cached if cached is not None else [0] * len(arrivals)
    limit = budget if budget is not None else float("inf")
    rng = random.Random(seed)
    reqs, steps = [], []
    waiting: list[int] = []  # indices into arrivals
    running: dict[int, dict] = {}  # index -> {"scheduled": t, "times": [token times], "left": prompt to compute}
    nxt, t, i = 0, arrivals[0] if arrivals else 0.0, 0
    while nxt < len(arrivals) or waiting or running:
        while nxt < len(arrivals) and arrivals[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not running:  # idle until the next arrival: no step
            t = arrivals[nxt]
            continue
        decoding = [j for j, r in running.items() if r["left"] == 0]
        room = limit - len(decoding)
        chunks: dict[int, int] = {}  # index -> prompt tokens computed this step
        for j, r in running.items():  # partly prefilled prompts continue first
            if r["left"] and room > 0:
                chunks[j] = min(r["left"], room)
                room -= chunks[j]
        while waiting and len(running) < max_seqs and room > 0:
            j = waiting.pop(0)
            running[j] = {"scheduled": t, "times": [], "left": lengths[j] - hits[j]}
            chunks[j] = min(running[j]["left"], room)
            room -= chunks[j]
        prefill = sum(chunks.values())
        for j, n in chunks.items():
            running[j]["left"] -= n
        emitting = decoding + [j for j in chunks if running[j]["left"] == 0]  # a token from each
        tokens = prefill + len(emitting)
        duration = slow * (STEP_BASE + per_token * tokens) * rng.lognormvariate(0.0, jitter)
        phase = "mixed" if prefill and decoding else "prefill" if prefill else "decode"
        steps.append(step(rid, i, t, duration=duration, forward=0.7 * duration, num_seqs=len(running), phase=phase,
                          num_tokens=tokens, num_prefill_tokens=prefill, num_decode_tokens=len(emitting),
                          num_waiting=len(waiting), num_running=len(running)))
        i += 1
        t += duration
        for j in emitting:
            r = running[j]
            r["times"].append(t - arrivals[j])
            if len(r["times"]) == output_len:
                del running[j]
                reqs.append(_record(rid, j, arrivals[j], r, lengths[j], hits[j]))
    return reqs, steps


def _record(rid: str, j: int, arrival: float, r: dict, prompt: int, cached: int = 0):
    times = r["times"]
    queue = r["scheduled"] - arrival
    ids = PROMPT if prompt == len(PROMPT) else [20 + k % 200 for k in range(prompt)]
    out = OUTPUT if len(times) == len(OUTPUT) else [40 + k % 200 for k in range(len(times))]
    rec = request(rid, j, arrival, queue=queue, ttft=times[0], prompt_ids=ids, output_ids=out, cached_tokens=cached)
    return dataclasses.replace(rec, token_times=list(times), e2e_seconds=times[-1], finish_time=arrival + times[-1])
