"""The demo's second act: one fault deployed through configuration, beside the healthy replicas.

A canary replica starts on what a person might push by mistake (`--fault`):
- "tokenizer": a copy of the model whose tokenizer.json gained a Lowercase normalizer (the same
  weights; every prompt with a capital letter becomes other token IDs);
- "int4": the same model with int4 weights at the coarsest group size (an engine option);
then a probe round (engine/traffic/probe: the shipped greedy suite, to every replica) and more traffic.
The diagnostics run over the whole run and the report shows what caught the canary, with its
evidence. What is changed is exactly what an operator would change: a file, or an option.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from diagnostics.benchmarks.model_faults import lowercase_normalizer
from engine.serving.fleet.config import FleetConfig, ReplicaSpec, SidecarSpec

FAULTS = {
    "tokenizer": "a copy of the model whose tokenizer.json lowercases text (a Lowercase normalizer)",
    "int4": "the same model with int4 weights, one quantization group per 128-wide row",
    "none": "no fault: a third healthy replica",
}
CANARY = "canary"


def canary_fleet(fault: str, model: Path, run_dir: Path, store_url: str, engine: dict, cpus: str,
                 host: str, port: int = 0) -> FleetConfig:
    """The canary's own fleet (no sidecar of its own: it writes to the demo's store)."""
    engine, baseline_model = dict(engine), model
    if fault == "tokenizer":
        changed = run_dir / "canary-model"
        if changed.exists():
            shutil.rmtree(changed)
        shutil.copytree(model, changed)
        lowercase_normalizer(changed)
        model = changed
    elif fault == "int4":
        engine.update(quantization="int4", quant_group_size=128)
    elif fault != "none":
        raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    # served under the healthy replicas' model name (their directory's), so the two are compared
    engine.setdefault("served_model_name", Path(baseline_model).name)
    replica = ReplicaSpec(id=CANARY, model=str(model), port=port, cpus=cpus, threads=1, engine=engine,
                          drain_timeout=5.0)
    return FleetConfig(name="demo-canary", host=host, run_dir=run_dir / "canary", startup_timeout=120.0,
                       stop_timeout=10.0, sidecar=SidecarSpec(enabled=False, url=store_url), replicas=[replica])


# what each replica answered to a few of the probe suite's questions (greedy, solo), decoded from the
# stored token IDs: healthy replicas answer alike and sensibly; a faulty one may not
ANSWERS = """
SELECT replica_id, splitByChar('.', request_id)[3] AS probe, output_token_ids
FROM requests
WHERE workload = 'probe' AND request_id LIKE {prefix:String}
  AND has({probes:Array(String)}, splitByChar('.', request_id)[3])
ORDER BY probe, replica_id
"""
SHOWN = ("eval_addition", "eval_sort", "eval_word_problem", "chat_uppercase")


def answers(store, round_id: str, model: Path, replicas: list[str]) -> str:
    from engine.traffic.probe.suite import SUITE
    from engine.core.tokenization import Tokenizer

    tokenizer = Tokenizer(model)
    rows = store.query_df(ANSWERS, {"prefix": f"probe.{round_id}.%.solo.%", "probes": list(SHOWN)})
    got = {(r["probe"], r["replica_id"]): " ".join(tokenizer.decode(list(r["output_token_ids"])).split())
           for r in rows.to_dict("records")}
    questions = {p.probe_id: p.messages[-1][1] if p.messages else p.prompt for p in SUITE}
    lines = ["probe answers (greedy, decoded from the stored token IDs)"]
    for probe in SHOWN:
        lines.append(f"  {questions.get(probe, probe)!r}")
        lines += [f"    {rid:8s} {got.get((probe, rid), '(no answer stored)')!r}" for rid in replicas]
    return "\n".join(lines)
