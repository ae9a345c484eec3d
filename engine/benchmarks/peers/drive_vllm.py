"""vLLM's side (its CPU build): `LLM.generate` on TokensPrompt, greedy, ignore_eos, exact max_tokens.

Runs in vLLM's interpreter (.venv-vllm). The engine core stays in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the peak RSS the parent reads is all of vLLM; no tokenizer,
no detokenizing (token IDs in, token IDs out); eager mode, 1 GiB KV cache, no plugins.
"""

from __future__ import annotations

import json
import os
import time

import _driver_io as io


def main() -> None:
    req, out_path = io.read_request()
    io.set_threads(req["threads"])
    os.environ.update(VLLM_CPU_KVCACHE_SPACE=str(io.KV_CACHE_GIB), VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_PLUGINS="",
                      VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    cfg = json.load(open(os.path.join(req["model_dir"], "config.json")))
    start = time.perf_counter()
    llm = LLM(model=req["model_dir"], dtype="float32", skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=cfg["max_position_embeddings"], max_num_seqs=128, max_num_batched_tokens=2048, seed=0)
    load_s = time.perf_counter() - start
    io.mark_answering()

    def generate(prompts, output_lens):
        params = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n, detokenize=False)
                  for n in output_lens]
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    generate(*io.warmup_workload(cfg["vocab_size"]))
    results = {}
    for w in req["workloads"]:  # prefix caching is on by default in vLLM; empty it like every side does
        llm.reset_prefix_cache()
        results.update(io.run_workloads([w], generate))
    io.write_result(out_path, peer="vllm", variant=req["variant"], version=vllm.__version__, load_s=load_s,
                    results=results)


if __name__ == "__main__":
    main()
