"""infersight's side: `engine.llm.LLM`, fp32, or its weight-only int8 path (variant "int8", lm_head included).

Runs in infersight's own interpreter. Engine settings as `bench throughput`'s defaults; the prefix
cache is emptied before each workload, so the shared-prefix workload measures reuse within itself.
"""

from __future__ import annotations

import time

import _driver_io as io


def main() -> None:
    req, out_path = io.read_request()
    io.set_threads(req["threads"])
    import torch

    import engine
    from engine.llm import LLM
    from engine.sampling_params import SamplingParams

    torch.set_num_threads(req["threads"])
    start = time.perf_counter()
    quant = "int8" if req["variant"] == "int8" else "none"
    # int8 quantizes lm_head too, as llama.cpp's q8_0 does its output matrix: the same weight bytes
    # per step (on the 135M model lm_head is 113 of its 513 MB)
    llm = LLM(req["model_dir"], dtype="float32", quantization=quant, quant_skip_layers=[], max_num_seqs=128,
              max_num_batched_tokens=2048, kv_cache_memory_bytes=512 * 2**20)
    load_s = time.perf_counter() - start

    def generate(prompts, output_lens):
        llm.engine.kv_cache.reset_prefix_cache()
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
        return [list(o.token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    generate(*io.warmup_workload(llm.engine.vocab_size))
    io.write_result(out_path, peer="infersight", variant=req["variant"], version=getattr(engine, "__version__", "dev"),
                    load_s=load_s, results=io.run_workloads(req["workloads"], generate))


if __name__ == "__main__":
    main()
