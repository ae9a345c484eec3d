"""Train a reference model (target or draft) on the synthetic corpus, seeded and on CPU.

Llama architecture (transformers' LlamaForCausalLM), loss only on the answer
tokens, AdamW with linear warmup and cosine decay. Given the seed, the step
count and the thread count, the run is deterministic.

    python -m evals.reference.train --size target --out evals/reference/models/target
    python -m evals.reference.train --size draft --out evals/reference/models/draft \
        --tokenizer evals/reference/models/target
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from evals.reference.corpus import TASKS, TRAIN_SEED, TRAIN_WEIGHTS, heldout_items, stream

# architecture presets: the target is the model under test, the draft its speculator
SIZES = {
    "target": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=384),
    "draft": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                  intermediate_size=192),
}
# each fits the 30-minute budget on the 2-core machine: the target with both cores
# (1.6x the steps per minute of one), the draft with one
TRAIN_DEFAULTS = {
    "target": dict(steps=5400, batch_size=16, lr=3e-3, threads=2),
    "draft": dict(steps=3000, batch_size=16, lr=3e-3, threads=1),
}
MAX_POSITIONS = 256


def encode(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """(input ids, labels): the chat prompt is masked (-100), the answer and its EOS are learned."""
    from evals.reference.hf_generate import chat_prompt_ids

    p = chat_prompt_ids(tokenizer, prompt)
    a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p + a, [-100] * len(p) + a


def batches(tokenizer, seed: int, rows: int, row_len: int = 128, weights: dict[str, int] | None = None):
    """Endless packed batches: examples laid end to end in rows of `row_len` tokens, each attending
    only to itself (a block-diagonal causal mask, positions restarting at 0), so there is almost no
    padding and every batch mixes all tasks.

    Yields (input_ids [B, L], labels [B, L], position_ids [B, L], attention mask [B, 1, L, L] bool).
    """
    examples = stream(seed, weights=weights)
    pad = tokenizer.pad_token_id
    pending = None
    while True:
        ids = torch.full((rows, row_len), pad)
        labels = torch.full((rows, row_len), -100)
        pos = torch.zeros((rows, row_len), dtype=torch.long)
        seg = torch.full((rows, row_len), -1)
        for r in range(rows):
            used, k = 0, 0
            while True:
                if pending is None:
                    ex = next(examples)
                    pending = encode(tokenizer, ex.prompt, ex.answer)
                x, y = pending
                if len(x) > row_len:
                    raise ValueError(f"an example of {len(x)} tokens does not fit a row of {row_len}")
                if used + len(x) > row_len:
                    break
                ids[r, used:used + len(x)] = torch.tensor(x)
                labels[r, used:used + len(x)] = torch.tensor(y)
                pos[r, used:used + len(x)] = torch.arange(len(x))
                seg[r, used:used + len(x)] = k
                used, k, pending = used + len(x), k + 1, None
        causal = torch.ones(row_len, row_len, dtype=torch.bool).tril()
        mask = (seg[:, :, None] == seg[:, None, :]) & causal & (seg[:, :, None] >= 0)
        # padding rows attend to themselves only, so no softmax row is empty
        mask |= torch.eye(row_len, dtype=torch.bool)
        yield ids, labels, pos, mask[:, None]


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))  # cosine down to 10% of peak


def build_model(tokenizer, size: str, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, **SIZES[size])
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def quick_accuracy(model, tokenizer, per_task: int = 20) -> dict[str, float]:
    """Greedy exact match on a few held-out items per task (progress check, not the model card)."""
    from evals.reference.hf_generate import chat_prompt_ids, greedy_generate

    items = heldout_items(per_task)
    outs = greedy_generate(model, tokenizer, [chat_prompt_ids(tokenizer, ex.prompt) for ex in items])
    acc: dict[str, list[int]] = {}
    for ex, ids in zip(items, outs):
        acc.setdefault(ex.task, []).append(int(tokenizer.decode(ids, skip_special_tokens=True).strip() == ex.answer))
    model.train()
    return {t: sum(v) / len(v) for t, v in acc.items()}


def train(out: Path, size: str, steps: int, batch_size: int, lr: float, seed: int, tokenizer_dir: str | None,
          threads: int, log_every: int = 50, eval_every: int = 500, init_from: str | None = None,
          weights: dict[str, int] | None = None) -> dict:
    """Train and save to `out`. `init_from`: continue from that model's weights (a second phase)
    instead of a random initialisation; its tokenizer comes along."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from evals.reference.train_tokenizer import train_tokenizer

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = tokenizer_dir or init_from
    if tokenizer_dir:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        tokenizer.save_pretrained(out)
    else:
        tokenizer = train_tokenizer(out)
    if init_from:
        torch.manual_seed(seed)
        model = LlamaForCausalLM.from_pretrained(init_from, dtype=torch.float32)
    else:
        model = build_model(tokenizer, size, seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{size}: {n_params / 1e6:.2f}M parameters, vocab {len(tokenizer)}, {steps} steps x {batch_size}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.98), eps=1e-8)
    warmup = max(1, steps // 20)
    model.train()
    weights = weights or TRAIN_WEIGHTS
    data = batches(tokenizer, seed + TRAIN_SEED, batch_size, weights=weights)
    t0, cpu0 = time.time(), time.process_time()
    tokens = 0
    running = None
    for step in range(steps):
        ids, labels, pos, mask = next(data)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        loss = model(input_ids=ids, position_ids=pos, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += int((labels != -100).sum())
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if (step + 1) % log_every == 0 or step == 0:
            dt = time.time() - t0
            print(f"step {step + 1}/{steps} loss {running:.4f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{tokens / dt:.0f} answer tok/s elapsed {dt / 60:.1f} min", flush=True)
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            acc = quick_accuracy(model, tokenizer)
            print("  held-out (20/task):", json.dumps({k: round(v, 2) for k, v in acc.items()}), flush=True)
    minutes = (time.time() - t0) / 60
    cpu_minutes = (time.process_time() - cpu0) / 60
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    gen = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": [tokenizer.eos_token_id],
           "pad_token_id": tokenizer.pad_token_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    info = {"size": size, "parameters": n_params, "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
            "threads": threads, "train_minutes": round(minutes, 1), "cpu_minutes": round(cpu_minutes, 1),
            "final_loss": round(running, 4), "answer_tokens": tokens, "init_from": init_from or "",
            "task_weights": weights}
    previous = Path(init_from or "") / "training.json"
    if init_from and previous.is_file():  # a second phase keeps the record of the first
        info["previous"] = json.loads(previous.read_text())
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"done in {minutes:.1f} min ({cpu_minutes:.1f} min CPU); saved to {out}", flush=True)
    return info


def parse_weights(text: str) -> dict[str, int] | None:
    """"kv_recall=5,brackets=3" -> the default weights with those changed (None when empty)."""
    if not text:
        return None
    weights = dict(TRAIN_WEIGHTS)
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in TASKS or not value.strip().isdigit():
            raise SystemExit(f"--task-weights: {part!r} must be TASK=INT with TASK one of {sorted(TASKS)}")
        weights[name.strip()] = int(value)
    return weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="rows of 128 packed tokens per step")
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", help="reuse this tokenizer directory (the draft must share the target's)")
    p.add_argument("--threads", type=int,
                   help="torch threads (default: the preset's; on cores busy with other jobs, 1 is faster)")
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--init-from", help="continue from this model directory (a second training phase)")
    p.add_argument("--task-weights", default="", metavar="TASK=W,...",
                   help="share of each task in the training stream (default: corpus.TRAIN_WEIGHTS)")
    a = p.parse_args()
    d = TRAIN_DEFAULTS[a.size]
    train(Path(a.out), a.size, a.steps or d["steps"], a.batch_size or d["batch_size"], a.lr or d["lr"], a.seed,
          a.tokenizer, a.threads or d["threads"], eval_every=a.eval_every, init_from=a.init_from,
          weights=parse_weights(a.task_weights))


if __name__ == "__main__":
    main()
