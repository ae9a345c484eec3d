"""A process that keeps an engine busy (the target of the py-spy tests): prints "ready" once warm."""

import sys

import torch

torch.set_num_threads(1)

from engine.core.llm import LLM  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402

llm = LLM(sys.argv[1], num_kv_blocks=64, max_model_len=256)
params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
llm.generate(["warm up"], params, use_tqdm=False)
print("ready", flush=True)
while True:
    llm.generate(["the replica cache token latency"] * 4, params, use_tqdm=False)
