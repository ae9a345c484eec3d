"""A continuous-batching replica simulated step by step: requests and steps whose queues come from
the replica's own speed, for the tests of load control (offered load, not the replica's queue).

Each step admits waiting requests up to `max_seqs` (their prompts are prefilled in that step) and
decodes one token for every running one; it takes slow * (STEP_BASE + STEP_PER_TOKEN * tokens)
seconds with a log-normal jitter. A replica `slow` times slower per token queues more at the same
arrivals: that queue is a consequence of its slowness, which is what the tests need.
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
          jitter: float = 0.1, prompts: list[int] | None = None):
    """(requests, steps) of replica `rid` serving `arrivals` (sorted epoch seconds) to the end;
    `prompts`: each arrival's prompt length (default len(PROMPT))."""
    lengths = prompts if prompts is not None else [len(PROMPT)] * len(arrivals)
    rng = random.Random(seed)
    reqs, steps = [], []
    waiting: list[int] = []  # indices into arrivals
    running: dict[int, dict] = {}  # index -> {"scheduled": t, "times": [token times]}
    nxt, t, i = 0, arrivals[0] if arrivals else 0.0, 0
    while nxt < len(arrivals) or waiting or running:
        while nxt < len(arrivals) and arrivals[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not running:  # idle until the next arrival: no step
            t = arrivals[nxt]
            continue
        admitted = waiting[:max(0, max_seqs - len(running))]
        waiting = waiting[len(admitted):]
        for j in admitted:
            running[j] = {"scheduled": t, "times": []}
        prefill = sum(lengths[j] for j in admitted)
        tokens = prefill + len(running)
        duration = slow * (STEP_BASE + STEP_PER_TOKEN * tokens) * rng.lognormvariate(0.0, jitter)
        phase = "mixed" if admitted and len(running) > len(admitted) else "prefill" if admitted else "decode"
        steps.append(step(rid, i, t, duration=duration, forward=0.7 * duration, num_seqs=len(running), phase=phase,
                          num_tokens=tokens, num_prefill_tokens=prefill, num_decode_tokens=len(running),
                          num_waiting=len(waiting), num_running=len(running)))
        i += 1
        t += duration
        for j in list(running):
            r = running[j]
            r["times"].append(t - arrivals[j])
            if len(r["times"]) == len(OUTPUT):
                del running[j]
                reqs.append(_record(rid, j, arrivals[j], r, lengths[j]))
    return reqs, steps


def _record(rid: str, j: int, arrival: float, r: dict, prompt: int):
    times = r["times"]
    queue = r["scheduled"] - arrival
    ids = PROMPT if prompt == len(PROMPT) else [20 + k % 200 for k in range(prompt)]
    rec = request(rid, j, arrival, queue=queue, ttft=times[0], prompt_ids=ids, output_ids=OUTPUT)
    return dataclasses.replace(rec, token_times=list(times), e2e_seconds=times[-1], finish_time=arrival + times[-1])
