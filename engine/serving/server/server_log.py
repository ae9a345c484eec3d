"""What the server says while it runs: a start summary, an access line per request, a periodic stats line.

Loggers (the logging module; the CLI's --log-level and handlers apply):
- `infersight.serve`: the start summary (model, architecture, dtype, quantization, KV pool, context,
  speculation, placement, memory (RSS against weights and KV pool), telemetry store with any credentials
  removed, the tool-call parser).
- `infersight.access`: one line per generation request when it ends (id, status, prompt / output tokens,
  TTFT, e2e).
- `infersight.stats`: every --stats-interval seconds, like vLLM's "Avg prompt throughput" line: running,
  waiting, KV use, and the prompt and generation throughput over the interval. The token counts come from
  the engine's step records (StepThroughput, an observer: tokens computed in each step), not from finished
  requests, so a long request counts while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from engine.core.process_memory import memory_at_start
from telemetry.contract.hooks import EngineObserver

log = logging.getLogger("infersight.serve")
access_log = logging.getLogger("infersight.access")
stats_log = logging.getLogger("infersight.stats")


def redact_url(target: str | None) -> str:
    """The store target without user:password or query string (tokens travel there); a path as is."""
    if not target:
        return "none (metrics and tracing only)"
    parts = urlsplit(str(target))
    if not parts.scheme or not parts.netloc:
        return str(target)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def start_summary(core, placement=None, store_target: str | None = None, tools: str | None = None) -> list[str]:
    """The start lines of one replica (core: the LLMEngine); `tools`: the tool-call line
    (engine/serving/server/tool_calls.py `describe`: which parser, or why tool calls are not available)."""
    cfg, loaded, kv = core.config, core.loaded, core.kv_cache
    spec = cfg.speculative_mode if cfg.speculative_mode not in ("none", "", None) else "none"
    if spec != "none":
        spec += f" ({cfg.num_speculative_tokens} tokens" + (f", draft {cfg.draft_model})" if cfg.draft_model else ")")
    if placement is not None:
        where = (f"CPUs {placement.cpu_affinity} (NUMA nodes {placement.cpu_numa_nodes}, "
                 f"memory {placement.mem_policy} {placement.mem_policy_nodes})")
    else:
        where = f"CPUs {sorted(os.sched_getaffinity(0))} (not pinned)"
    return [
        f"model {core.model_name} from {cfg.model}: {loaded.architecture}, dtype {cfg.dtype}, "
        f"quantization {core.quantization}, device {cfg.device}",
        f"KV cache: {kv.num_blocks} blocks of {kv.block_size} = {kv.num_blocks * kv.block_size} tokens; "
        f"max_model_len {core.max_model_len}; max_num_seqs {cfg.max_num_seqs}; prefix caching "
        f"{'on' if cfg.enable_prefix_caching else 'off'}; speculative decoding {spec}",
        f"placement: {where}",
        memory_at_start(core.loaded.model, core.runner.kv_caches).describe(),
        f"replica {cfg.replica_id}; telemetry store: {redact_url(store_target)}",
    ] + ([tools] if tools else [])


def log_access(request_id: str, status: int, out=None, started: float | None = None) -> None:
    """One access line; `out` (the last RequestOutput) gives tokens and timings where there is one."""
    prompt = len(out.prompt_token_ids) if out is not None else 0
    output = len(out.token_ids) if out is not None else 0
    m = getattr(out, "metrics", None)
    ttft = f"{m.ttft_seconds * 1000:.1f}ms" if m is not None and m.first_token_time else "-"
    if m is not None and m.e2e_seconds:
        e2e = f"{m.e2e_seconds * 1000:.1f}ms"
    else:
        e2e = f"{(time.time() - started) * 1000:.1f}ms" if started else "-"
    reason = getattr(out, "finish_reason", None) or "-"
    access_log.info("%s %d prompt_tokens=%d output_tokens=%d ttft=%s e2e=%s finish=%s",
                    request_id, status, prompt, output, ttft, e2e, reason)


class StepThroughput(EngineObserver):
    """Counts prompt tokens computed and tokens generated, per step (runs on the engine thread)."""

    enabled = True

    def __init__(self):
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def on_step(self, record) -> None:
        with self._lock:
            self.prompt_tokens += record.num_prefill_tokens
            self.generation_tokens += record.num_generated_tokens

    def totals(self) -> tuple[int, int]:
        with self._lock:
            return self.prompt_tokens, self.generation_tokens


class StatsLogger:
    """The periodic stats line: `line()` computes one over the time since the previous call."""

    def __init__(self, served, throughput: StepThroughput, interval: float, clock=time.monotonic):
        self.served, self.throughput, self.interval, self.clock = served, throughput, interval, clock
        self._last_time = clock()
        self._last_totals = throughput.totals()

    def line(self) -> str:
        now, totals = self.clock(), self.throughput.totals()
        dt = max(now - self._last_time, 1e-9)
        prompt_rate = (totals[0] - self._last_totals[0]) / dt
        gen_rate = (totals[1] - self._last_totals[1]) / dt
        self._last_time, self._last_totals = now, totals
        state, kv = self.served.engine_state(), self.served.kv_state()
        kv_pct = 100.0 * kv["used"] / kv["total"] if kv["total"] else 0.0
        return (f"Avg prompt throughput: {prompt_rate:.1f} tokens/s, Avg generation throughput: {gen_rate:.1f} "
                f"tokens/s, Running: {state['running']} reqs, Waiting: {state['waiting']} reqs, "
                f"KV cache usage: {kv_pct:.1f}%")

    async def run(self) -> None:
        """Log a line every interval (until cancelled)."""
        while True:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(Exception):  # a log line must never take the server down
                stats_log.info("%s", self.line())
