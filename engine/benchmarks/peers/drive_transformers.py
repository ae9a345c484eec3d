"""transformers' side: `generate`, driven exactly as `bench throughput` drives it (its code, reused).

Runs in infersight's interpreter (transformers is there) and imports `engine.benchmarks.throughput`
for the batching rule (requests in order, batches of up to B and 2048 padded tokens, left-padded,
each batch generated to its longest requested output, only the requested tokens kept).
"""

from __future__ import annotations

import time

import _driver_io as io

BATCH_SIZE = 16  # `bench throughput` sweeps 8-64 and usually lands here on CPU; the sweep is not repeated


def main() -> None:
    req, out_path = io.read_request()
    io.set_threads(req["threads"])
    import torch
    import transformers

    from engine.benchmarks.throughput import Workload, _hf_generate, hf_batches

    torch.set_num_threads(req["threads"])
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(req["model_dir"], dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore EOS: exactly the requested tokens
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    load_s = time.perf_counter() - start
    io.mark_answering()

    def generate(prompts, output_lens):
        w = Workload(prompts, output_lens)
        outs: list = [None] * len(prompts)
        for batch in hf_batches(w, req.get("batch_size") or BATCH_SIZE):
            for i, row in zip(batch, _hf_generate(model, w, batch, pad_id)):
                outs[i] = row
        return outs

    generate(*io.warmup_workload(model.config.vocab_size))
    io.write_result(out_path, peer="transformers", variant=req["variant"], version=transformers.__version__,
                    load_s=load_s, results=io.run_workloads(req["workloads"], generate))


if __name__ == "__main__":
    main()
