"""The engine itself: config, models, attention, KV cache, scheduler, runner, sampler, speculative decoding, quantization, tokenization, the loop, `LLM` / `AsyncLLM`."""
