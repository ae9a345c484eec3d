"""What every peer driver shares (stdlib only: drivers run in the peers' own interpreters).

Protocol: `python drive_X.py REQUEST.json RESULT.json`. The request holds `model_dir`, `threads`,
`variant` ("fp32" | "int8"), `cache_dir` (for converted models) and `workloads`: a list of
{"name", "prompts": [[token ids]], "output_lens": [n]}. The driver warms up, then times each
workload's generation alone (conversion and loading excluded), and writes
{"peer", "variant", "version", "load_s", "results": {name: {"seconds", "output_counts",
"first_tokens"}}, "vm_hwm_mib", "answers_s", "ready_s"}: the driver's own peak RSS, read from /proc at the
end; when it could answer a first request (`answers_s`: from the process's start through interpreter, imports,
conversion and loading, before any warm-up); and its ready-to-serve time (`ready_s`: from the process's start,
warm-up and any compile included, to the first timed workload). The two differ where a side serves while it
still builds: infersight's compiled decode steps are built in the background while it serves eager ones, and
its driver waits for them so that the timed workloads measure the compiled path.
"""

from __future__ import annotations

import json
import os
import sys
import time

FIRST_REQUESTS, FIRST_TOKENS = 4, 16  # greedy tokens returned for cross-checking between sides
# the KV cache budget of the engines that take one (vLLM's VLLM_CPU_KVCACHE_SPACE, infersight's pool): the
# same for both. At 512 MiB infersight's pool held ~11k tokens of the 135M model and the mixed workload
# (64 x up to 768) preempted 19 requests, recomputing them, while vLLM had 1 GiB
KV_CACHE_GIB = 1


def read_request() -> tuple[dict, str]:
    req_path, out_path = sys.argv[1], sys.argv[2]
    with open(req_path) as f:
        return json.load(f), out_path


def set_threads(threads: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)


_ready = {}


def seconds_since_process_start() -> float | None:
    """From /proc: the process's start time (clock ticks after boot) against the uptime now."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command name
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def mark_answering() -> None:
    """The side could answer its first request from now on (`answers_s` in the result)."""
    if "answers_s" not in _ready:
        _ready["answers_s"] = seconds_since_process_start()


def run_workloads(workloads: list[dict], generate) -> dict:
    """`generate(prompts, output_lens) -> list of generated token-id lists`, timed per workload. The side
    is ready to serve when the first one starts (`ready_s` in the result)."""
    _ready.setdefault("ready_s", seconds_since_process_start())
    mark_answering()
    results = {}
    for w in workloads:
        start = time.perf_counter()
        outs = generate(w["prompts"], w["output_lens"])
        seconds = time.perf_counter() - start
        results[w["name"]] = dict(seconds=seconds, output_counts=[len(o) for o in outs],
                                  first_tokens=[list(map(int, o[:FIRST_TOKENS])) for o in outs[:FIRST_REQUESTS]])
    return results


def warmup_workload(vocab_size: int) -> tuple[list[list[int]], list[int]]:
    return [[7 % vocab_size, 8 % vocab_size, 9 % vocab_size]] * 2, [4, 4]


def vm_hwm_mib() -> float | None:
    """This process's own peak RSS (VmHWM belongs to the address space exec made, so unlike ru_maxrss
    it does not start at the parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def write_result(out_path: str, **fields) -> None:
    with open(out_path, "w") as f:
        json.dump(dict(fields, vm_hwm_mib=vm_hwm_mib(), answers_s=_ready.get("answers_s"),
                       ready_s=_ready.get("ready_s")), f)


def converted_path(req: dict, kind: str) -> str:
    """Where a converted copy of the model lives: cache_dir/<model dir name>-<size+mtime key>/<kind>."""
    import hashlib

    model_dir = os.path.abspath(req["model_dir"])
    stamp = [(f, os.stat(os.path.join(model_dir, f)).st_mtime_ns) for f in sorted(os.listdir(model_dir))
             if f.endswith((".safetensors", ".json"))]
    key = hashlib.sha256(json.dumps([model_dir, stamp]).encode()).hexdigest()[:12]
    path = os.path.join(req["cache_dir"], f"{os.path.basename(model_dir)}-{key}", kind)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def length_sorted_batches(output_lens: list[int], batch_size: int) -> list[list[int]]:
    """Request indices grouped by output length (longest first), batch_size at a time: a peer without
    per-request lengths generates each group to its longest and keeps only the requested tokens."""
    order = sorted(range(len(output_lens)), key=lambda i: -output_lens[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
