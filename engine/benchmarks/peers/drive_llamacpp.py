"""llama.cpp's side (llama-cpp-python): the HF model converted once to GGUF by `gguf_convert`
(f32 for "fp32", q8_0 for "int8"), then `Llama.generate` on the token IDs with greedy sampling
(temp 0, top_k 1), taking exactly the requested number of tokens (generate never stops at EOS).

llama-cpp-python's high-level API runs one sequence at a time, so requests run one after another:
the batch-1 workload is its fair case, the batched ones measure it unbatched. Its prompt cache
(the longest common prefix with the previous request is not recomputed) is left on, as a user gets it.
"""

from __future__ import annotations

import json
import os
import time

import _driver_io as io
import gguf_convert


def main() -> None:
    req, out_path = io.read_request()
    io.set_threads(req["threads"])
    import llama_cpp

    qtype = "q8_0" if req["variant"] == "int8" else "f32"
    path = io.converted_path(req, f"model-{qtype}.gguf")
    if not os.path.exists(path):
        gguf_convert.convert(req["model_dir"], path + ".tmp", qtype)
        os.replace(path + ".tmp", path)
    cfg = json.load(open(os.path.join(req["model_dir"], "config.json")))
    start = time.perf_counter()
    llm = llama_cpp.Llama(model_path=path, n_ctx=cfg["max_position_embeddings"], n_batch=512,
                          n_threads=req["threads"], n_threads_batch=req["threads"], logits_all=False, verbose=False)
    load_s = time.perf_counter() - start
    io.mark_answering()

    def one(prompt, n):
        out = []
        for tok in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if len(out) == n:
                break
        return out

    def generate(prompts, output_lens):
        return [one(p, n) for p, n in zip(prompts, output_lens)]

    generate(*io.warmup_workload(cfg["vocab_size"]))
    io.write_result(out_path, peer="llama.cpp", variant=req["variant"], version=llama_cpp.__version__,
                    load_s=load_s, results=io.run_workloads(req["workloads"], generate))


if __name__ == "__main__":
    main()
