"""infersight's side: `engine.core.llm.LLM` as it comes (variant "default": no speed option given), fp32, or its weight-only int8 path (variant "int8", lm_head included),
or decode steps through torch.compile (EngineConfig.compile_decode) in fp32 (variant "compile") or int8
("int8-compile"); the compile happens in the warm-up, `warmup_s`. "-steps" adds multi-step decode
(EngineConfig.num_scheduler_steps = STEPS, engine/core/multi_step.py; the default's is "auto", the others' 1),
"packed" (alone or as a suffix) float32 projections through oneDNN's packed weights (EngineConfig.pack_weights, engine/core/models/packed_linear.py).

Runs in infersight's own interpreter. Engine settings as `bench throughput`'s defaults; the prefix
cache is emptied before each workload, so the shared-prefix workload measures reuse within itself.
"""

from __future__ import annotations

import time

import _driver_io as io

STEPS = 8  # the "-steps" variants' num_scheduler_steps


def main() -> None:
    req, out_path = io.read_request()
    io.set_threads(req["threads"])
    import torch

    import engine
    from engine.core.llm import LLM
    from engine.core.multi_step import K_MAX
    from engine.core.sampling_params import SamplingParams

    torch.set_num_threads(req["threads"])
    start = time.perf_counter()
    variant = req["variant"]
    packed = variant == "packed" or variant.endswith("-packed")
    variant = variant.removesuffix("-packed")
    quant = "int8" if variant.startswith("int8") else "none"
    compiled = "compile" in variant
    steps = STEPS if variant.endswith("-steps") else 1
    # int8 quantizes lm_head too, as llama.cpp's q8_0 does its output matrix: the same weight bytes
    # per step (on the 135M model lm_head is 113 of its 513 MB)
    # "default": no speed option given, what `LLM(model)` and `serve` get (EngineConfig's defaults); the
    # others set each option explicitly. Resources (batch, KV budget) are the same as the peers' for all
    speed = {} if variant == "default" else dict(compile_decode=compiled, num_scheduler_steps=steps,
                                                 pack_weights=packed)
    llm = LLM(req["model_dir"], dtype="float32", quantization=quant, quant_skip_layers=[], max_num_seqs=128,
              max_num_batched_tokens=2048, kv_cache_memory_bytes=io.KV_CACHE_GIB * 2**30, **speed)
    # "auto" K (the default, None) may take up to K_MAX steps once its steps are measured fast
    compiled, steps = llm.engine.config.compile_decode, llm.engine.scheduler.num_scheduler_steps or K_MAX
    load_s = time.perf_counter() - start
    io.mark_answering()

    def generate(prompts, output_lens):
        llm.engine.kv_cache.reset_prefix_cache()
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
        return [list(o.token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    start = time.perf_counter()
    generate(*io.warmup_workload(llm.engine.vocab_size))
    if compiled:  # compile the decode shapes the workloads meet outside their timing (long enough that
        n = 4 + 2 * steps  # a "-steps" variant takes its K steps too): batch 1 (dynamo specializes size 1),
        generate([[7, 8, 9]], [n])  # a batch of equal lengths (no mask: 16 x 256 is one; without it the
        generate([[7, 8, 9], [10, 11, 12]], [n, n])  # first variant to meet it compiled in its timing), then a
        generate([[7, 8, 9], [7, 8, 9, 10, 11, 12]], [n, n])  # length mask. Compiled decodes are one group in
        # batch order (torch_backend.split_decodes), so these are all the decode graphs a workload meets
    llm.engine.runner.wait_compiled()  # compiled decode graphs are built in the background at start
    warmup_s = time.perf_counter() - start
    io.write_result(out_path, peer="infersight", variant=req["variant"], version=getattr(engine, "__version__", "dev"),
                    load_s=load_s, warmup_s=warmup_s, results=io.run_workloads(req["workloads"], generate))


if __name__ == "__main__":
    main()
