"""Speculative decoding benchmark: tokens/s without and with each proposer, in one run.

    infersight bench spec-decode                       # reference pair if trained, else random models
    infersight bench spec-decode --target T --draft D -k 4 --num-prompts 32 --max-tokens 64
    python -m evals.benchmarks.spec_decode ...        # the same

Same target model, same prompts, greedy, ignore-eos: plain decoding, n-gram
prompt lookup, and the draft model (and, with --draft-is-target, the target
drafting for itself: the acceptance ceiling). For each it prints output
tokens/s, the speedup over plain decoding, the acceptance rate (accepted /
drafted), the mean acceptance length (1 + accepted / drafts) and the
per-position acceptance rates, and checks the outputs equal plain decoding's
token for token (greedy speculation must not change a single token).

The model pair: --target / --draft, else the trained reference pair in
evals/reference/models/{target,draft} when present (a trained pair gives a
meaningful acceptance rate), else random-weight models (acceptance near 0 for
the draft: a lower bound on the overhead, not a forecast).

Prompts: for the reference pair, chat prompts of the held-out eval items
(the tasks it was trained on), generation stopping at EOS as in serving; for
other models, text prompts with the repetition real workloads have, and
ignore-EOS so every request produces --max-tokens tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REFERENCE = Path(__file__).resolve().parents[2] / "evals" / "reference" / "models"

# text with the repetition real workloads have (quoting, code, lists), for n-gram lookup to find
PROMPT_TEXTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog. Repeat exactly: the quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Sort the numbers 5 3 9 1 -> 1 3 5 9. Sort the numbers 8 2 7 4 ->",
    "What is 12 + 35? The answer is 47. What is 20 + 22? The answer is",
    "The key alpha maps to the value 42. The key beta maps to the value 7. What is alpha?",
    "Reverse the string: hello -> olleh. Reverse the string: world ->",
    "Latency doubled on Tuesday because the KV cache was full. Why did latency double on Tuesday?",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
]


def pick_models(args, root: Path) -> tuple[str, str | None, str]:
    """(target, draft or None, where they come from); random models are built under `root`."""
    if args.target:
        return args.target, args.draft, "given"
    if (REFERENCE / "target" / "config.json").is_file():
        draft = REFERENCE / "draft"
        return str(REFERENCE / "target"), str(draft) if (draft / "config.json").is_file() else None, "reference"
    from engine.core.tiny_model import build_random_model

    target = build_random_model(root / "target", "llama", hidden_size=256, num_layers=4, num_heads=8,
                                num_kv_heads=4, intermediate_size=704, seed=0)
    draft = build_random_model(root / "draft", "llama", hidden_size=128, num_layers=1, num_heads=4,
                               num_kv_heads=2, intermediate_size=352, seed=1, tokenizer_dir=target)
    return str(target), str(draft), "random"


def build(target: str, prompts, params, spec: dict, args):
    from engine.core.llm import LLM

    llm = LLM(target, max_num_seqs=args.max_num_seqs, num_speculative_tokens=args.k, **spec)
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm up (allocator, first-call paths)
    return llm


def time_one(llm, prompts, params) -> dict:
    from engine.core.spec_decode.metrics import SpecDecodeStats

    speculator = llm.engine.speculator
    if speculator is not None:
        speculator.total_stats = SpecDecodeStats()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    result = {"tokens": sum(len(o.token_ids) for o in outs), "seconds": wall,
              "token_ids": [o.token_ids for o in outs]}
    if speculator is not None:
        result.update(speculator.total_stats.as_dict())
    return result


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("-k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs per mode, interleaved across modes; the median counts")
    ap.add_argument("--draft-is-target", action="store_true", help="also run the target as its own draft")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="with the reference pair: generate --max-tokens tokens past EOS too")
    ap.add_argument("--json", help="write the results here")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="spec_bench_") as root:
        return _run(args, Path(root))


def _run(args, root: Path) -> int:
    from engine.core.sampling_params import SamplingParams
    from engine.core.tokenization import Tokenizer

    target, draft, source = pick_models(args, root)
    tok = Tokenizer(target)
    if source == "reference":
        from evals.reference.corpus import heldout_items

        items = heldout_items(per_task=-(-args.num_prompts // 6))[:args.num_prompts]
        prompts = [tok.apply_chat_template(ex.messages()) for ex in items]
        ignore_eos = args.ignore_eos
    else:
        prompts = [tok.encode(PROMPT_TEXTS[i % len(PROMPT_TEXTS)]) for i in range(args.num_prompts)]
        ignore_eos = True
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=ignore_eos)
    runs = {"none": {}, "ngram": {"speculative_mode": "ngram"}}
    if draft:
        runs["draft"] = {"speculative_mode": "draft", "draft_model": draft}
    if args.draft_is_target:
        runs["draft=target"] = {"speculative_mode": "draft", "draft_model": target}

    print(f"models ({source}): target {target}, draft {draft}; {len(prompts)} prompts, up to {args.max_tokens} "
          f"tokens{' (ignore EOS)' if ignore_eos else ''}, greedy, k={args.k}, max_num_seqs={args.max_num_seqs}, torch threads {torch.get_num_threads()}, "
          f"median of {args.repeats} interleaved runs")
    engines = {name: build(target, prompts, params, spec, args) for name, spec in runs.items()}
    timings: dict[str, list[dict]] = {name: [] for name in runs}
    for _ in range(args.repeats):  # round robin: load drifting on a shared machine hits every mode alike
        for name, llm in engines.items():
            timings[name].append(time_one(llm, prompts, params))
    results = {}
    for name, runs_of_mode in timings.items():
        median = sorted(runs_of_mode, key=lambda r: r["seconds"])[len(runs_of_mode) // 2]
        results[name] = dict(median, tokens_per_s=median["tokens"] / median["seconds"],
                             all_seconds=[r["seconds"] for r in runs_of_mode])
    base = results["none"]
    print(f"{'mode':<14}{'tok/s':>9}{'speedup':>9}{'accept':>8}{'mean len':>10}  per-position acceptance   identical")
    for name, r in results.items():
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["identical_to_plain"] = r["token_ids"] == base["token_ids"]
        spec_cols = (f"{r['acceptance_rate']:>8.2f}{r['mean_acceptance_length']:>10.2f}  "
                     f"{' '.join(f'{x:.2f}' for x in r['per_position_acceptance_rate']):<24}"
                     if "acceptance_rate" in r else f"{'-':>8}{'-':>10}  {'':<24}")
        print(f"{name:<14}{r['tokens_per_s']:>9.1f}{r['speedup']:>8.2f}x{spec_cols}  {r['identical_to_plain']}")
    if args.json:
        slim = {n: {k: v for k, v in r.items() if k != "token_ids"} for n, r in results.items()}
        Path(args.json).write_text(json.dumps({"source": source, "target": target, "draft": draft,
                                               "k": args.k, "results": slim}, indent=2))
    return 0 if all(r["identical_to_plain"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
