"""`infersight generate`: offline generation from the command line; prints outputs and throughput.

    infersight generate --prompt "The quick brown fox" --max-tokens 32
    infersight generate --model path/to/model --prompts-file prompts.txt --temperature 0.8 --seed 1
    infersight generate --chat --prompt "What is 12 + 35?"

Without --model a small random Llama is built once into ~/.cache/infersight
(random weights: the text is gibberish, the machinery is real).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

def add_arguments(parser) -> None:
    parser.add_argument("--model", help="local Hugging Face model directory (default: a tiny random Llama)")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    parser.add_argument("--prompts-file", help="a file with one prompt per line")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt as a user message (chat template)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--logprobs", type=int, default=None, help="print the top-N logprobs of each token")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="one JSON object per output instead of text")


def json_row(prompt: str, out, tokenizer) -> dict:
    """One output as `--json` prints it. With --logprobs N: `logprobs` (the sampled tokens' own, one per
    token) and `top_logprobs` (per token: the top N as [{token_id, token, logprob}], best first)."""
    row = {"prompt": prompt, "text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
           "logprobs": None, "top_logprobs": None}
    if out.logprobs:
        row["logprobs"] = [lp.logprob for lp in out.logprobs]
        row["top_logprobs"] = [[{"token_id": t, "token": tokenizer.decode([t]), "logprob": v}
                                for t, v in sorted(lp.top.items(), key=lambda kv: -kv[1])]
                               for lp in out.logprobs]
    return row


def run(args) -> int:
    import torch

    from engine.core.llm import LLM
    from engine.core.model_refs import tiny_random_model
    from engine.core.models import ModelLoadError
    from engine.core.sampling_params import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = list(args.prompt)
    if args.prompts_file:
        prompts += [line for line in Path(args.prompts_file).read_text().splitlines() if line.strip()]
    if not prompts:
        prompts = ["The quick brown fox"]
    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                max_tokens=args.max_tokens, seed=args.seed, stop=args.stop,
                                ignore_eos=args.ignore_eos, logprobs=args.logprobs)
        model = args.model or tiny_random_model("llama")
        llm = LLM(model, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs)
        start = time.perf_counter()
        if args.chat:
            outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
        else:
            outs = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
    except (ValueError, OSError, ModelLoadError) as e:
        print(f"infersight generate: {e}", file=sys.stderr)
        return 2

    for prompt, out in zip(prompts, outs):
        if args.json:
            print(json.dumps(json_row(prompt, out, llm.tokenizer)))
            continue
        print(f"--- {prompt!r}\n{out.text!r}\n    [{len(out.token_ids)} tokens, {out.finish_reason}]")
        if out.logprobs:
            for lp in out.logprobs:
                top = ", ".join(f"{llm.tokenizer.decode([t])!r}:{v:.2f}" for t, v in lp.top.items())
                print(f"    {llm.tokenizer.decode([lp.token_id])!r} {lp.logprob:.3f}  [{top}]")
    n_out = sum(len(o.token_ids) for o in outs)
    n_in = sum(len(o.prompt_token_ids) for o in outs)
    print(f"{len(outs)} requests, {n_in} prompt + {n_out} output tokens in {elapsed:.2f} s: "
          f"{n_out / elapsed:.1f} output tok/s, {(n_in + n_out) / elapsed:.1f} total tok/s", file=sys.stderr)
    return 0
