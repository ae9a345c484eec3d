"""CTranslate2's side: the HF model converted once (TransformersConverter; int8 weights for "int8"),
then `Generator.generate_batch` with greedy search (sampling_topk=1), no end token (end_token=[]:
EOS is generated like any token and ends nothing, as ignore_eos elsewhere; min_length would instead
forbid EOS and change the greedy tokens), max_length = the requested tokens, the prompt left out.

generate_batch takes one max_length per call, so requests go in groups of similar output length
(`length_sorted_batches`, 16 at a time), each generated to its longest; only the requested tokens
count (the extra ones are CTranslate2's cost, as for transformers).
"""

from __future__ import annotations

import json
import os
import time

import _driver_io as io

BATCH_SIZE = 16


def main() -> None:
    req, out_path = io.read_request()
    io.set_threads(req["threads"])
    import ctranslate2

    quant = "int8" if req["variant"] == "int8" else None
    path = io.converted_path(req, f"ct2-{req['variant']}")
    if not os.path.exists(os.path.join(path, "model.bin")):
        ctranslate2.converters.TransformersConverter(req["model_dir"]).convert(path, quantization=quant, force=True)
    start = time.perf_counter()
    gen = ctranslate2.Generator(path, device="cpu", compute_type="int8" if quant else "float32",
                                inter_threads=1, intra_threads=req["threads"])
    load_s = time.perf_counter() - start
    io.mark_answering()
    # generate_batch takes token strings: map through the converted model's own vocabulary
    vocab_file = next(f for f in ("vocabulary.json", "vocabulary.txt") if os.path.exists(os.path.join(path, f)))
    with open(os.path.join(path, vocab_file)) as f:
        vocab = json.load(f) if vocab_file.endswith(".json") else f.read().split("\n")

    def generate(prompts, output_lens):
        outs: list = [None] * len(prompts)
        for batch in io.length_sorted_batches(output_lens, BATCH_SIZE):
            n = max(output_lens[i] for i in batch)
            res = gen.generate_batch([[vocab[t] for t in prompts[i]] for i in batch], max_length=n, end_token=[],
                                     sampling_topk=1, beam_size=1, include_prompt_in_result=False)
            for i, r in zip(batch, res):
                outs[i] = list(r.sequences_ids[0])[:output_lens[i]]
        return outs

    generate(*io.warmup_workload(len(vocab)))
    io.write_result(out_path, peer="ctranslate2", variant=req["variant"], version=ctranslate2.__version__,
                    load_s=load_s, results=io.run_workloads(req["workloads"], generate))


if __name__ == "__main__":
    main()
