"""What constrained decoding (response_format, engine/core/structured_output.py) costs, side by side.

    python -m engine.benchmarks.structured_output                # 8 requests x 64 tokens, 3 runs, medians
    python -m engine.benchmarks.structured_output --batch 16 --max-tokens 128 --runs 5 --json out.json

The same greedy chat requests on the shipped reference model (evals/reference/models/target, vocab
463: the forward is tiny, so the mask's host cost shows at its largest share), in one batch, under:
- none:         no response_format, ignore_eos (every request runs max_tokens);
- json_object:  {"type": "json_object"} (this model closes its objects at once: `{}`);
- json_schema:  an object of a bounded string, a bounded integer and an enum (stops at the JSON's end);
- json_long:    an object of one unbounded string (this model never closes it: runs max_tokens, so its
                per-step time is the steady-state cost of the mask against `none`).
Per mode: generated tokens, steps, tokens/s, mean ms per step (wall time around `LLMEngine.step`) and
"mask ms": the part of the step in the sampler's raw logits processors, where the grammar masks are
made and applied (all zero for `none`); the median of `--runs` runs, modes interleaved, after a
warm-up of each. Then grammar compile times on a fresh
StructuredOutput: xgrammar's TokenizerInfo, each schema's first compile, and a compile from the LRU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "color": {"enum": ["red", "green", "blue"]}}, "required": ["name", "age", "color"]}
LONG = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
MODES = {
    "none": None,
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    "json_long": {"type": "json_schema", "json_schema": {"name": "long", "schema": LONG}},
}
QUESTIONS = ["add 12 and 30", "reverse: abc", "sort: 3 1 2", "add 7 and 5", "reverse: hello", "sort: 9 4 6 1",
             "add 101 and 9", "reverse: xyz"]


def run_once(engine, prompts, response_format, max_tokens: int) -> dict:
    from engine.core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=response_format is None,
                            response_format=response_format)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    steps, tokens = [], 0
    _PROCESSORS_SECONDS[0] = 0.0
    start = time.perf_counter()
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        steps.append(time.perf_counter() - t)
        tokens += sum(len(o.token_ids) for o in outs if o.finished)
    wall = time.perf_counter() - start
    return {"tokens": tokens, "steps": len(steps), "tokens_per_s": tokens / wall,
            "ms_per_step": 1000 * statistics.fmean(steps),
            "mask_ms_per_step": 1000 * _PROCESSORS_SECONDS[0] / len(steps)}


_PROCESSORS_SECONDS = [0.0]


def _timed_processors():
    """Time the sampler's raw processors (where the grammar masks are made and applied)."""
    import engine.core.sampler as sampler

    inner = sampler.apply_raw_processors

    def timed(logits, seqs):
        t = time.perf_counter()
        try:
            return inner(logits, seqs)
        finally:
            _PROCESSORS_SECONDS[0] += time.perf_counter() - t

    sampler.apply_raw_processors = timed


def bench_modes(batch: int, max_tokens: int, runs: int) -> dict:
    from engine.core.config import EngineConfig
    from engine.core.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(REFERENCE), num_kv_blocks=16 * batch, max_num_seqs=batch))
    _timed_processors()
    prompts = [engine.chat_prompt([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
               for i in range(batch)]
    for fmt in MODES.values():
        run_once(engine, prompts, fmt, max_tokens)  # warm-up (and the grammar compile)
    measured = {mode: [] for mode in MODES}
    for _ in range(runs):  # modes interleaved: a shared machine's drift hits them alike
        for mode, fmt in MODES.items():
            measured[mode].append(run_once(engine, prompts, fmt, max_tokens))
    return {mode: {k: statistics.median(m[k] for m in ms) for k in ms[0]} for mode, ms in measured.items()}


def bench_compile() -> dict:
    from engine.core.structured_output import StructuredOutput, grammar_spec
    from engine.core.tokenization import Tokenizer

    tok = Tokenizer(REFERENCE)
    so = StructuredOutput(tok.hf, 463, [tok.eos_token_id])
    t = time.perf_counter()
    so._get_compiler()
    out = {"tokenizer_info_ms": 1000 * (time.perf_counter() - t)}
    for mode, fmt in MODES.items():
        if fmt is None:
            continue
        key = grammar_spec(fmt)
        t = time.perf_counter()
        so.compiled(key)
        out[f"{mode}_compile_ms"] = 1000 * (time.perf_counter() - t)
    t = time.perf_counter()
    so.compiled(grammar_spec(MODES["json_schema"]))
    out["lru_hit_ms"] = 1000 * (time.perf_counter() - t)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: as the tests run)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    modes = bench_modes(args.batch, args.max_tokens, args.runs)
    compile_times = bench_compile()
    base = modes["none"]["ms_per_step"]
    print(f"reference model, {args.batch} greedy requests, max_tokens {args.max_tokens}, median of {args.runs}")
    print(f"{'mode':<12} {'tokens':>7} {'steps':>6} {'tokens/s':>9} {'ms/step':>8} {'vs none':>8} {'mask ms':>8}")
    for mode, r in modes.items():
        print(f"{mode:<12} {r['tokens']:>7.0f} {r['steps']:>6.0f} {r['tokens_per_s']:>9.1f} "
              f"{r['ms_per_step']:>8.2f} {r['ms_per_step'] / base:>7.2f}x {r['mask_ms_per_step']:>8.3f}")
    print("grammar compile (fresh StructuredOutput): "
          + ", ".join(f"{k} {v:.2f}" for k, v in compile_times.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"modes": modes, "compile": compile_times}, indent=2))


if __name__ == "__main__":
    main()
