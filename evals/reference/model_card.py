"""Measure the reference models and write their MODEL_CARD.md files.

Accuracy per task on the held-out suite, with transformers' greedy generate and
with the engine (the two must agree); the draft's acceptance against the target
(a greedy speculative-decoding simulation with transformers, and the engine's
own speculative decoding counters when it has them); the drift of bf16 / int8 /
int4 against fp32 on the target; training facts from training.json.

    python -m evals.reference.model_card --target evals/reference/models/target \
        --draft evals/reference/models/draft
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from evals.reference.hf_generate import greedy_generate
from evals.stats import wilson_interval
from evals.suite import load_suite

SUITE = Path(__file__).resolve().parents[1] / "suites" / "reference_heldout.jsonl"
SPEC_K = 4


def _acc_table(per_task: dict[str, list[float]]) -> dict:
    rows = {}
    allv = [x for v in per_task.values() for x in v]
    for name, v in [("overall", allv)] + sorted(per_task.items()):
        k = int(sum(v))
        lo, hi = wilson_interval(k, len(v))
        rows[name] = {"correct": k, "n": len(v), "accuracy": k / len(v), "ci95": [lo, hi]}
    return rows


def hf_accuracy(model_dir: Path, suite) -> tuple[dict, list[list[int]], list[list[int]]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evals.scorers import score

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = [list(tok.apply_chat_template(i.messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]) for i in suite.items]
    outs = greedy_generate(model, tok, prompts, max_new_tokens=24)
    per_task: dict[str, list[float]] = {}
    for item, ids in zip(suite.items, outs):
        per_task.setdefault(item.task, []).append(score(item.scorer, tok.decode(ids, skip_special_tokens=True),
                                                        item.reference))
    return _acc_table(per_task), prompts, outs


def engine_run(model_dir: Path, suite, **overrides):
    from engine.core.config import EngineConfig
    from evals.backends import EngineBackend
    from evals.runner import run_suite

    backend = EngineBackend(EngineConfig(model=str(model_dir), num_kv_blocks=512, **overrides))
    try:
        t0 = time.perf_counter()
        run = run_suite(suite, backend, progress=False)
        seconds = time.perf_counter() - t0
    finally:
        backend.close()
    per_task: dict[str, list[float]] = {}
    for item in run.items:
        per_task.setdefault(item.task, []).append(item.score)
    return run, _acc_table(per_task), seconds


@torch.no_grad()
def simulated_acceptance(target_dir: Path, draft_dir: Path, prompts: list[list[int]],
                         target_outputs: list[list[int]], k: int = SPEC_K, max_new_tokens: int = 24) -> dict:
    """Greedy speculative decoding replayed with transformers: at every verification step the draft
    proposes k tokens greedily from the accepted prefix; the target keeps the longest prefix that
    equals its own greedy continuation (EOS included), plus one token of its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    eos = tok.eos_token_id
    proposed = accepted = steps = 0
    per_pos = [0] * k  # accepted at draft position i
    offered = [0] * k  # proposed at draft position i
    agree = total = 0
    for prompt, out in zip(prompts, target_outputs):
        full = out + [eos]  # the target's greedy tokens, EOS included
        # per-token agreement: the draft's argmax given the target's own prefix
        logits = draft(torch.tensor([prompt + full[:-1]])).logits[0, len(prompt) - 1:]
        agree += int((logits.argmax(-1) == torch.tensor(full)).sum())
        total += len(full)
        pos = 0
        while pos < len(full):
            n = min(k, max_new_tokens - pos)  # the draft does not know where the answer ends
            ctx = prompt + full[:pos]
            guess = []
            for _ in range(n):
                guess.append(int(draft(torch.tensor([ctx + guess])).logits[0, -1].argmax()))
            a = 0
            while a < n and pos + a < len(full) and guess[a] == full[pos + a]:
                per_pos[a] += 1
                a += 1
            for i in range(n):
                offered[i] += 1
            proposed += n
            accepted += a
            steps += 1
            pos += a + 1  # the accepted drafts, then one token of the target's own
    return {"k": k, "proposed": proposed, "accepted": accepted, "acceptance_rate": accepted / max(proposed, 1),
            "accepted_per_position": [p / max(o, 1) for p, o in zip(per_pos, offered)],
            "mean_tokens_per_target_step": sum(len(o) + 1 for o in target_outputs) / max(steps, 1),
            "per_token_agreement": agree / max(total, 1)}


def engine_acceptance(target_dir: Path, draft_dir: Path, suite) -> dict:
    """Acceptance from the engine's own speculative decoding (speculative_mode="draft"): its per-request
    counters of proposed and accepted draft tokens, and whether greedy outputs stay identical."""
    from engine.core.config import EngineConfig
    from evals.backends import EngineBackend

    try:
        backend = EngineBackend(EngineConfig(model=str(target_dir), num_kv_blocks=512, speculative_mode="draft",
                                             draft_model=str(draft_dir), num_speculative_tokens=SPEC_K))
    except Exception as e:  # noqa: BLE001 - the card says why it is missing
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        gens = backend.generate(suite.items, 24, progress=False)
    finally:
        backend.close()
    proposed = sum(g.spec_proposed for g in gens)
    accepted = sum(g.spec_accepted for g in gens)
    return {"k": SPEC_K, "proposed": proposed, "accepted": accepted, "acceptance_rate": accepted / max(proposed, 1),
            "outputs": [g.output_token_ids for g in gens]}


def drift_rows(target_dir: Path, suite, base_run) -> dict:
    from engine.core.config import EngineConfig
    from evals.backends import EngineBackend
    from evals.logit_drift import compute_drift
    from evals.runner import run_suite
    from evals.teacher_forcing import EngineScorer

    rows = {}
    base = EngineBackend(EngineConfig(model=str(target_dir), num_kv_blocks=512))
    try:
        for name, overrides in [("bfloat16", {"dtype": "bfloat16"}), ("int8", {"quantization": "int8"}),
                                ("int4-g32", {"quantization": "int4", "quant_group_size": 32}),
                                ("int4-g128", {"quantization": "int4", "quant_group_size": 128})]:
            cand = EngineBackend(EngineConfig(model=str(target_dir), num_kv_blocks=512, **overrides))
            try:
                run = run_suite(suite, cand, progress=False)
                d = compute_drift([base_run], EngineScorer(base.engine), EngineScorer(cand.engine), [run])
            finally:
                cand.close()
            rows[name] = {"accuracy": run.accuracy(), **{k: getattr(d.stats, k) for k in (
                "kl_mean", "kl_p99", "same_top_p")}, "greedy_agreement": d.greedy.agreement}
    finally:
        base.close()
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _acc_md(hf: dict, eng: dict) -> list[str]:
    out = ["| task | items | transformers greedy | engine greedy (95% Wilson CI) |", "|---|---|---|---|"]
    for name in hf:
        h, e = hf[name], eng[name]
        out.append(f"| {name} | {h['n']} | {_pct(h['accuracy'])} | {_pct(e['accuracy'])} "
                   f"({_pct(e['ci95'][0])} - {_pct(e['ci95'][1])}) |")
    return out


def write_card(model_dir: Path, role: str, measured: dict) -> None:
    info = json.loads((model_dir / "training.json").read_text())
    cfg = json.loads((model_dir / "config.json").read_text())
    size_mb = (model_dir / "model.safetensors").stat().st_size / 1e6
    extra = "" if role == "target" else " --tokenizer evals/reference/models/target"
    lines = [
        f"# infersight reference {role} model", "",
        f"A Llama-architecture model trained from scratch by `evals/reference/train.py` on the synthetic "
        f"multi-task corpus of `evals/reference/corpus.py` (answers scored exactly). It exists so quality "
        f"drift (quantization, speculative decoding, a damaged checkpoint) can be measured for real on a CPU.", "",
        "## Architecture", "",
        f"- LlamaForCausalLM: hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']} heads ({cfg['num_key_value_heads']} KV heads), MLP {cfg['intermediate_size']}, "
        f"vocab {cfg['vocab_size']}, context {cfg['max_position_embeddings']}",
        f"- {info['parameters'] / 1e6:.2f}M parameters, float32 safetensors ({size_mb:.1f} MB)",
        "- tokenizer: byte-level BPE (`evals/reference/train_tokenizer.py`), digits, punctuation and one-letter "
        "words split into single tokens; specials `<|bos|>` `<|eos|>` `<|pad|>` and role markers; chat template "
        "`<|bos|><|user|>...<|eos|><|assistant|>`; generation stops at `<|eos|>`", "",
        "## Training", "",
        f"- {info['steps']} steps of {info['batch_size']} rows x 128 packed tokens (each example attends only to "
        f"itself), loss on the answer tokens only, AdamW (betas 0.9/0.98, weight decay 0.01), peak lr {info['lr']}, "
        f"5% warmup then cosine to 10%; seed {info['seed']}, {info['threads']} torch thread(s)",
        f"- final training loss (answer tokens, smoothed): {info['final_loss']}",
        f"- wall time: {info['train_minutes']} min, CPU time: {info.get('cpu_minutes', '?')} min, on the "
        "2-core development machine", "",
        "Retrain exactly (deterministic given seed, steps and thread count):", "", "```bash",
        f"python -m evals.reference.train --size {role} --out evals/reference/models/{role}{extra}", "```", "",
    ]
    lines += measured[role]
    (model_dir / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--suite", type=Path, default=SUITE)
    p.add_argument("--json", type=Path, help="also write every number measured as JSON")
    a = p.parse_args()
    torch.set_num_threads(1)
    suite = load_suite(a.suite)
    results: dict = {}
    measured: dict[str, list[str]] = {"target": [], "draft": []}
    hf_t, prompts, outs = hf_accuracy(a.target, suite)
    run_t, eng_t, secs_t = engine_run(a.target, suite)
    results["target"] = {"transformers": hf_t, "engine": eng_t, "engine_seconds": secs_t}
    hf_d, _, _ = hf_accuracy(a.draft, suite)
    run_d, eng_d, secs_d = engine_run(a.draft, suite)
    results["draft"] = {"transformers": hf_d, "engine": eng_d, "engine_seconds": secs_d}
    sim = simulated_acceptance(a.target, a.draft, prompts, outs)
    eng_spec = engine_acceptance(a.target, a.draft, suite)
    spec_lines = [f"- simulated greedy speculative decoding (transformers, k = {sim['k']}): acceptance rate "
                  f"{_pct(sim['acceptance_rate'])} ({sim['accepted']}/{sim['proposed']} draft tokens), "
                  f"accepted per position {', '.join(_pct(x) for x in sim['accepted_per_position'])}, "
                  f"{sim['mean_tokens_per_target_step']:.2f} tokens per target forward",
                  f"- per-token greedy agreement (draft argmax given the target's prefix): "
                  f"{_pct(sim['per_token_agreement'])}"]
    if "outputs" in eng_spec:
        outputs = eng_spec.pop("outputs")
        same = sum(a_ == b.output_token_ids for a_, b in zip(outputs, run_t.items))
        eng_spec["identical_outputs"] = same
        spec_lines.append(f"- the engine's speculative decoding (speculative_mode = \"draft\", k = {SPEC_K}): "
                          f"acceptance rate {_pct(eng_spec['acceptance_rate'])} ({eng_spec['accepted']}/"
                          f"{eng_spec['proposed']} draft tokens, the engine's own counters); {same}/{len(outputs)} "
                          f"outputs identical to plain greedy decoding")
    else:
        spec_lines.append(f"- the engine's speculative decoding could not be measured: {eng_spec['error']}")
    results["acceptance"] = {"simulated": sim, "engine": eng_spec}
    drift = drift_rows(a.target, suite, run_t)
    results["drift"] = drift
    n = len(suite.items)
    measured["target"] = [
        "## Measured accuracy (exact match, held-out suite)", "",
        f"`evals/suites/reference_heldout.jsonl`: {n} prompts never seen in training, greedy decoding, float32.", "",
        *_acc_md(hf_t, eng_t), "",
        "## Drift of other configurations (engine, same suite)", "",
        "| configuration | accuracy | mean KL | p99 KL | same top p | greedy outputs identical |",
        "|---|---|---|---|---|---|",
        f"| float32 (baseline) | {_pct(eng_t['overall']['accuracy'])} | 0 | 0 | 100% | 100% |",
        *[f"| {k} | {_pct(v['accuracy'])} | {v['kl_mean']:.5f} | {v['kl_p99']:.5f} | {_pct(v['same_top_p'])} | "
          f"{_pct(v['greedy_agreement'])} |" for k, v in drift.items()], "",
        "## Draft model", "", "The draft (`evals/reference/models/draft`) against this target:", "", *spec_lines, "",
        "Measured with `python -m evals.reference.model_card --target evals/reference/models/target "
        "--draft evals/reference/models/draft`.",
    ]
    measured["draft"] = [
        "## Measured accuracy (exact match, held-out suite)", "", *_acc_md(hf_d, eng_d), "",
        "## Acceptance against the target", "", *spec_lines, "",
        "Measured with `python -m evals.reference.model_card --target evals/reference/models/target "
        "--draft evals/reference/models/draft`.",
    ]
    write_card(a.target, "target", measured)
    write_card(a.draft, "draft", measured)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in results.items()}, indent=1, default=str)[:6000])


if __name__ == "__main__":
    main()
