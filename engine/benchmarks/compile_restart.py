"""Start-up of a compiled engine: first start on an empty compile cache vs a restart on it.

Each start is a fresh process (as a replica restart is) that builds `LLM(model)` with the given options and
runs one decode of each shape a workload meets (batch 1, a batch of equal lengths, a length mask): "ready"
is when those are served (compile_decode builds its graphs in a thread at start and serves eager steps until
they are built: engine/core/compile_warmup.py), "compiled" when the build is done and decode steps run the
compiled graphs (wall seconds, and the process's CPU seconds, which a busy machine disturbs less). Starts:
eager (no compile), compiled on an empty
cache directory (first start on a fresh host), compiled again on that directory (a restart), in that order,
`--rounds` times with a new empty directory each round. Prints each start's seconds and the ratios.

    python -m engine.benchmarks.compile_restart [--model DIR|reference|135m] [--rounds 1] [--restarts-only DIR]
        [--options '{"pack_weights": true}']

Each start also reports its RSS once its build is done (and its peak): what compile costs a replica in memory.
`--restarts-only DIR`: only compiled restarts, on the compile cache under DIR (made by an earlier run: an
empty DIR makes the first one a first start).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys, time
start = time.perf_counter()
import torch
torch.set_num_threads({threads})
from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams
llm = LLM({model!r}, **json.loads({options!r}))
built = time.perf_counter() - start
def gen(prompts, n):
    llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)] * len(prompts),
                 use_tqdm=False)
gen([[7, 8, 9]], 12)
gen([[7, 8, 9], [10, 11, 12]], 12)
gen([[7, 8, 9], [7, 8, 9, 10, 11, 12]], 12)
ready = time.perf_counter() - start
llm.engine.runner.wait_compiled()
compiled = time.perf_counter() - start
rss = {{}}
for line in open("/proc/self/status"):  # after the build (and the requests): what a serving replica holds
    key, _, value = line.partition(":")
    if key in ("VmRSS", "VmHWM"):
        rss[key] = int(value.split()[0]) / 1024
caches = {{}}
if "torch._dynamo" in sys.modules:  # which caches a compiled start hit (a restart should miss none)
    from torch._dynamo.utils import counters
    caches = {{k: v for group in ("aot_autograd", "inductor") for k, v in counters[group].items() if "cache" in k}}
print(json.dumps(dict(built_s=built, ready_s=ready, compiled_s=compiled, caches=caches,
                      rss_mib=rss.get("VmRSS", 0), peak_mib=rss.get("VmHWM", 0))))
"""


def start_once(model: str, options: dict, cache_root: str, threads: int) -> dict:
    env = dict(os.environ, INFERSIGHT_CACHE=cache_root)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the engine's own choice (engine/core/compile_cache.py) is measured
    code = CHILD.format(threads=threads, model=model, options=json.dumps(options))
    wall, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - wall
    result["cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return result


def rss_line(start: dict) -> str:
    return f"{start['rss_mib']:.0f} MiB ({start['peak_mib']:.0f})"


def main() -> int:
    from engine.benchmarks.peers.models import resolve

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="reference", help="a model directory, 'reference' or '135m' (SmolLM2's shape, "
                   "random weights: engine/benchmarks/peers/models.py)")
    p.add_argument("--restarts-only", metavar="DIR", help="compiled starts only, on this persistent cache root")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--options", default="{}", help="EngineConfig fields (JSON) for every start; compile_decode is set per start")
    args = p.parse_args()
    options = json.loads(args.options)
    args.model = str(resolve(args.model))
    print(f"model {args.model}, options {options}, {args.threads} threads", flush=True)
    if args.restarts_only:
        for r in range(args.rounds):
            warm = start_once(args.model, dict(options, compile_decode=True), args.restarts_only, args.threads)
            print(f"restart {r + 1}: ready (served) {warm['ready_s']:.1f} s, decode graphs built {warm['compiled_s']:.1f} s, "
                  f"process {warm['process_s']:.1f} s, CPU {warm['cpu_s']:.1f} s; {rss_line(warm)}; caches {warm['caches']}",
                  flush=True)
        return 0
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="infersight-compile-cache-") as root:
            eager = start_once(args.model, dict(options, compile_decode=False), root, args.threads)
            cold = start_once(args.model, dict(options, compile_decode=True), root, args.threads)
            warm = start_once(args.model, dict(options, compile_decode=True), root, args.threads)
        print(f"round {r + 1}: ready (served) in eager {eager['ready_s']:.1f} s | compiled, empty cache "
              f"{cold['ready_s']:.1f} s | compiled, restart {warm['ready_s']:.1f} s; decode graphs built: empty "
              f"cache {cold['compiled_s']:.1f} s, restart {warm['compiled_s']:.1f} s; process: eager "
              f"{eager['process_s']:.1f} s | empty cache {cold['process_s']:.1f} s | restart {warm['process_s']:.1f} s "
              f"(restart / first start {warm['process_s'] / cold['process_s']:.2f}x); CPU seconds: eager "
              f"{eager['cpu_s']:.1f} | empty cache {cold['cpu_s']:.1f} | restart {warm['cpu_s']:.1f} "
              f"(restart / eager {warm['cpu_s'] / eager['cpu_s']:.2f}x); caches: empty {cold['caches']}, "
              f"restart {warm['caches']}", flush=True)
        print(f"  RSS after the build (peak): eager {rss_line(eager)} | empty cache {rss_line(cold)} | restart "
              f"{rss_line(warm)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
