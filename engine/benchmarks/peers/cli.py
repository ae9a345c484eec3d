"""`infersight bench peers`: interleaved runs of every available side over the same workloads.

For each model: measure the roofline, build the workloads, then for each of `--repeats` rounds run
every side once (a fresh subprocess per side and round, all workloads inside it; the side order
rotates each round so that no side always runs first or last on a drifting machine). Reported per
workload and side: the median output tokens/s over rounds, its ratio to infersight's default (what
`LLM(model)` and `serve` run without flags; fp32 where "default" is not among the variants), the peak RSS
(max over rounds), and how many of the first requests' greedy tokens equal the default's; per workload the
default's ratio to the best peer; per side its ready-to-serve time (process start to the first timed
workload, median over rounds) and peak RSS. Every side must produce exactly the requested token counts,
else its numbers are marked invalid.
"""

from __future__ import annotations

import os

import json
import statistics
import time
from pathlib import Path

from engine.benchmarks.peers import models, roofline, workloads
from engine.benchmarks.peers.runner import run_side
from engine.benchmarks.peers.sides import PEERS, availability


def add_arguments(parser) -> None:
    parser.add_argument("--models", default="reference,135m", help="reference, 135m, or model directories")
    parser.add_argument("--workloads", default=",".join(workloads.NAMES), help=f"of {','.join(workloads.NAMES + workloads.OPTIONAL)} (prefill: prompt tokens/s)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"of {','.join(PEERS)}")
    parser.add_argument("--variants", default="default,fp32,int8,compile,int8-compile,compile-steps,int8-compile-steps",
                        help="default (infersight as it comes: no speed option given), fp32, int8 (for the peers that have it), compile and int8-compile (infersight's "
                             "compile_decode, fp32 or int8), compile-steps and int8-compile-steps (the same with "
                             "multi-step decode, num_scheduler_steps 8); packed, compile-packed and "
                             "compile-steps-packed: fp32 with pack_weights (oneDNN's packed weights)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small workloads, reference model, 1 repeat: a smoke run")
    parser.add_argument("--peer-python", action="append", default=[], metavar="PEER=PYTHON",
                        help="interpreter for a peer (default: .venv-peers/bin/python; vllm: .venv-vllm/bin/python)")
    parser.add_argument("--cache-dir", default=str(models.CACHE), help="built and converted models")
    parser.add_argument("--side-timeout", type=float, default=1800.0, help="seconds per side and round")
    parser.add_argument("--json", help="also write every result to this file")


def _split(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def run(args) -> int:
    started = time.perf_counter()
    # a relative path is the caller's: the sides run in a directory of their own
    overrides = {name: os.path.abspath(py) if os.sep in py else py
                 for name, py in (kv.split("=", 1) for kv in args.peer_python)}
    model_names = ["reference"] if args.quick and args.models == "reference,135m" else _split(args.models)
    repeats = 1 if args.quick and args.repeats == 3 else args.repeats
    sides, report = [], dict(models={}, skipped=[])
    for name in _split(args.peers):
        peer = PEERS.get(name)
        why = f"{name}: unknown peer (choose from {', '.join(PEERS)})" if peer is None else availability(peer, overrides)
        if why:
            print(f"skipped {why}", flush=True)
            report["skipped"].append(why)
            continue
        wanted = _split(args.variants)
        # a peer's "default" is its fp32 (only infersight has variants of its own defaults)
        sides += [(peer, v) for v in peer.variants
                  if v in wanted or (v == "fp32" and "default" in wanted and peer.name != "infersight")]
    for model_name in model_names:
        report["models"][model_name] = _run_model(args, model_name, sides, overrides, repeats)
    report["wall_s"] = time.perf_counter() - started
    print(f"\ntotal wall time {report['wall_s']:.0f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def _run_model(args, model_name: str, sides, overrides, repeats: int) -> dict:
    path = models.resolve(model_name, Path(args.cache_dir))
    info = models.describe(path)
    roof = roofline.measure_in_subprocess(args.threads)
    ceil = roofline.ceilings(roof, info["weight_bytes"], info["params"])
    wls = workloads.build(_split(args.workloads), info["vocab_size"], info["context"], args.quick, args.seed)
    print(f"\n== model {model_name} ({path}): {info['params'] / 1e6:.1f}M params, {info['weight_bytes'] / 2**20:.1f} MiB "
          f"fp32, context {info['context']}\nroofline ({args.threads} threads): read {roof['read_gb_s']:.1f} GB/s, "
          f"copy {roof['copy_gb_s']:.1f} GB/s, fp32 GEMM {roof['gemm_gflop_s']:.0f} GFLOP/s -> fp32 batch-1 decode "
          f"<= {ceil['decode_b1_tok_s']:.0f} tok/s, prefill <= {ceil['prefill_tok_s']:.0f} tok/s", flush=True)
    for w in wls:
        print("  " + w.describe(), flush=True)
    request = dict(model_dir=str(path), threads=args.threads, cache_dir=str(Path(args.cache_dir) / "converted"),
                   workloads=[w.to_json() for w in wls])
    runs: dict[str, list] = {}
    for r in range(repeats):
        order = sides[r % len(sides):] + sides[:r % len(sides)] if sides else []
        for peer, variant in order:
            key = f"{peer.name}/{variant}"
            side_run = run_side(peer, str(peer.python(overrides)), dict(request, variant=variant), args.side_timeout)
            runs.setdefault(key, []).append(side_run)
            state = "ok" if side_run.ok else "FAILED: " + side_run.error
            print(f"  round {r + 1}/{repeats} {key}: {side_run.wall_s:.0f} s wall, peak RSS "
                  f"{side_run.peak_rss_mib:.0f} MiB, {state}", flush=True)
    table = _summarize(wls, runs)
    _print_table(table)
    starts = _starts(runs)
    _print_starts(starts)
    return dict(starts=starts, path=str(path), info={k: v for k, v in info.items() if k != "config"}, roofline=roof, ceilings=ceil,
                workloads=[dict(name=w.name, describe=w.describe()) for w in wls], rows=table,
                raw={k: [dict(ok=s.ok, result=s.result, peak_rss_mib=s.peak_rss_mib, wall_s=s.wall_s, error=s.error)
                         for s in v] for k, v in runs.items()})


def _summarize(wls, runs: dict[str, list]) -> list[dict]:
    rows = []
    for w in wls:
        base_tps, base_first = None, None
        for key, side_runs in runs.items():
            good = [s for s in side_runs if s.ok and w.name in s.result["results"]]
            if not good:
                rows.append(dict(workload=w.name, side=key, ok=False, note=(side_runs[0].error.splitlines() or [""])[0]))
                continue
            res = [s.result["results"][w.name] for s in good]
            exact = all(x["output_counts"] == w.output_lens for x in res)
            tps = statistics.median(w.rated_tokens / x["seconds"] for x in res)
            row = dict(workload=w.name, side=key, ok=exact, tokens_per_s=tps, rounds=len(res),
                       all_tokens_per_s=[w.rated_tokens / x["seconds"] for x in res],
                       peak_rss_mib=max(s.peak_rss_mib for s in good), version=good[0].result.get("version"),
                       first_tokens=res[0]["first_tokens"],
                       note="" if exact else "WRONG output token counts: numbers invalid")
            if key == base_key(runs):
                base_tps, base_first = tps, res[0]["first_tokens"]
            rows.append(row)
        mine = [r for r in rows if r["workload"] == w.name]
        peers = [r for r in mine if r.get("tokens_per_s") and r["ok"] and not r["side"].startswith("infersight/")]
        best = max(peers, key=lambda r: r["tokens_per_s"], default=None)
        for row in mine:
            if row.get("tokens_per_s") and base_tps:
                row["ratio_to_infersight"] = row["tokens_per_s"] / base_tps
                row["greedy_agree"] = f"{sum(a == b for a, b in zip(row['first_tokens'], base_first))}/{len(base_first)}"
            if row.get("tokens_per_s") and best is not None:
                row["ratio_to_best_peer"] = row["tokens_per_s"] / best["tokens_per_s"]
                row["best_peer"] = best["side"]
    return rows


def base_key(runs: dict) -> str:
    """The side every ratio is to: infersight's default where it ran, else its fp32."""
    return "infersight/default" if "infersight/default" in runs else "infersight/fp32"


def _starts(runs: dict[str, list]) -> list[dict]:
    """Per side: seconds to its first possible answer and to ready-to-serve (medians over rounds), and peak RSS
    (max over rounds)."""
    out = []
    for key, side_runs in runs.items():
        good = [s for s in side_runs if s.ok]
        ready = [s.result["ready_s"] for s in good if s.result.get("ready_s") is not None]
        answers = [s.result["answers_s"] for s in good if s.result.get("answers_s") is not None]
        out.append(dict(side=key, answers_s=statistics.median(answers) if answers else None,
                        ready_s=statistics.median(ready) if ready else None,
                        load_s=statistics.median([s.result.get("load_s") or 0.0 for s in good]) if good else None,
                        peak_rss_mib=max((s.peak_rss_mib for s in good), default=None)))
    return out


def _print_starts(starts: list[dict]) -> None:
    # answers from: process start to loaded (could serve a first request); ready to serve: to the first timed
    # workload, warm-up and compile included (infersight's compiled steps build while it serves eager ones)
    print(f"\n  {'side':24} {'answers from':>12} {'ready to serve':>14} {'peak RSS':>10}")
    for s in starts:
        answers = f"{s['answers_s']:.1f} s" if s.get("answers_s") is not None else "-"
        ready = f"{s['ready_s']:.1f} s" if s["ready_s"] is not None else "-"
        rss = f"{s['peak_rss_mib']:.0f} MiB" if s["peak_rss_mib"] is not None else "-"
        print(f"  {s['side']:24} {answers:>12} {ready:>14} {rss:>10}")


def _print_table(rows: list[dict]) -> None:
    print(f"\n  {'workload':8} {'side':24} {'tok/s':>9} {'x default':>10} {'x best peer':>11} {'peak RSS':>9}  "
          f"greedy=default  note")
    for r in rows:
        if r.get("tokens_per_s") is None:
            print(f"  {r['workload']:8} {r['side']:24} {'-':>9} {'-':>10} {'-':>11} {'-':>9}  {'-':14}  {r['note']}")
            continue
        ratio = f"{r['ratio_to_infersight']:.2f}x" if "ratio_to_infersight" in r else "-"
        to_best = f"{r['ratio_to_best_peer']:.2f}x" if "ratio_to_best_peer" in r else "-"
        print(f"  {r['workload']:8} {r['side']:24} {r['tokens_per_s']:9.1f} {ratio:>10} {to_best:>11} "
              f"{r['peak_rss_mib']:7.0f} MiB  {r.get('greedy_agree', '-'):14}  {r['note']}")


if __name__ == "__main__":
    import argparse
    import sys

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    sys.exit(run(p.parse_args()))
