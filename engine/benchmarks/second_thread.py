"""Does an engine step slower in a thread that is not the process's first one? Side by side in one process.

A served replica loads its model in the main thread and steps in the `infersight-engine` thread
(engine/core/async_engine.py). On a small machine torch's parallel regions can run slower there: the main
thread's OpenMP pool stays behind, and libgomp throttles its spin-wait once it manages more threads than
there are CPUs, so every short parallel region pays a wake-up. This runs the same decode batch
alternately in the first thread and in a second one, `--rounds` times, and prints tokens/s and the ratio.
With `--free-idle-pool` the thread that just stepped frees its pool (engine/core/omp_pool.py) before the
other one steps: if the ratio closes, the idle pool was the cost. (A served replica frees the loading
thread's pool once, when AsyncLLM is built.)

    python -m engine.benchmarks.second_thread [--model DIR] [--batch 16] [--tokens 48] [--rounds 3] [--free-idle-pool]

Eager steps (compile_decode off), one token a step: the engine's own work, without a background build's
thread in the process.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from engine.core.omp_pool import free_this_threads_pool


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: the shipped reference model)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--free-idle-pool", action="store_true")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams
    from engine.core.model_refs import REFERENCE_MODEL

    llm = LLM(args.model or str(REFERENCE_MODEL), dtype="float32", compile_decode=False, num_scheduler_steps=1)
    prompts = [[(7 * i + j) % 100 + 1 for j in range(12)] for i in range(args.batch)]
    params = [SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)] * args.batch
    rates: dict[str, list[float]] = {"first thread": [], "second thread": []}

    def run(side: str) -> None:
        llm.engine.kv_cache.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        rates[side].append(args.batch * args.tokens / (time.perf_counter() - start))
        if args.free_idle_pool:
            free_this_threads_pool()

    run("first thread")  # warm-up, not counted
    rates["first thread"].clear()
    for _ in range(args.rounds):
        run("first thread")
        other = threading.Thread(target=run, args=("second thread",))
        other.start()
        other.join()
    for side, values in rates.items():
        print(f"{side:14} " + " ".join(f"{v:8.1f}" for v in values) + f"   median {statistics.median(values):8.1f} tok/s")
    ratio = statistics.median(rates["second thread"]) / statistics.median(rates["first thread"])
    print(f"second / first thread: {ratio:.2f}x" + ("  (idle pools freed)" if args.free_idle_pool else ""))


if __name__ == "__main__":
    main()
