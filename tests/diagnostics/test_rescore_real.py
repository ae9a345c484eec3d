"""Real-model evidence for cross-scoring: in-process replicas of the shipped reference model
(evals/reference/models/target), each served over HTTP as `infersight serve` assembles it and
recording into one store, serve DIFFERENT sampled chat prompts (temperature 1.0, answers ending at
<|eos|>); then one rescore round (engine/traffic/probe/rescore.py) sends each replica's requests, teacher-
forced, to every replica, and diagnostics/rescore.py reads only what the replicas recorded.

- int4 with a coarse group (quant_group_size 128) and 5% relative weight noise
  (diagnostics.benchmarks.model_faults.noisy_weights): invisible to the sampled-token logprobs
  (tests/diagnostics/test_sampled_logprob_real.py), named here as the replica that differs from two
  agreeing clean peers;
- the clean pair among them agrees (its pairs do not differ): a clean fleet gives nothing above info.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import time
from pathlib import Path

import httpx
import pytest
import torch

from diagnostics import rescore as rescore_rule
from diagnostics.benchmarks.model_faults import noisy_weights
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.traffic.probe.rescore import run_rescore_round
from evals.reference.corpus import stream
from telemetry.store.waiting import wait_for_requests

REFERENCE = Path(__file__).resolve().parents[2] / "evals" / "reference" / "models" / "target"
N = 32  # sampled requests per replica
PER_REPLICA = 24  # of them rescored by every replica


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    path = tmp_path_factory.mktemp("noisy") / "target"
    shutil.copytree(REFERENCE, path)
    noisy_weights(path, relative=0.05)
    return path


# the reference model's context is 256 tokens: tests/conftest.py served_replica with room for it
ENGINE = {"max_model_len": 256, "num_kv_blocks": 256, "max_num_seqs": 16}


async def _traffic(url: str, examples, replica_id: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(*(client.post("/v1/chat/completions", json={
            "model": REFERENCE.name, "messages": ex.messages(), "temperature": 1.0, "max_tokens": 24},
            headers={"X-Request-Id": f"{replica_id}-{i}", "X-Workload": ex.task})
            for i, ex in enumerate(examples)))


def fleet_round(served_replica, store, replicas: dict[str, tuple[Path, dict]]):
    """Serve each replica its own sampled prompts, then one rescore round; the diagnostic's findings."""
    torch.set_num_threads(1)
    t0, seen = time.time(), set()
    with contextlib.ExitStack() as stack:
        urls = {}
        for k, (rid, (model, options)) in enumerate(replicas.items()):
            urls[rid], _ = stack.enter_context(served_replica(model, rid, store, seed=k, **ENGINE, **options))
        for k, rid in enumerate(replicas):
            examples = [ex for ex in itertools.islice(stream(seed=100 + k), 3 * N) if ex.prompt not in seen][:N]
            seen.update(ex.prompt for ex in examples)
            asyncio.run(_traffic(urls[rid], examples, rid))
        for rid in replicas:
            assert wait_for_requests(store, f"{rid}-", N) == N
        summary = run_rescore_round(list(urls.values()), store, PER_REPLICA)
        assert not summary.failed and summary.sent == len(replicas) ** 2 * PER_REPLICA, summary
        assert wait_for_requests(store, "rescore.", summary.sent) == summary.sent
    return rescore_rule.run(store, DiagnosticRequest(Scope(start=t0 - 60))), summary


def _pairs(found):
    return {(p["served"], p["scorer"]): p for f in found for p in f.evidence.get("pairs", [])}


def _report(found, damaged: str) -> str:
    """The measured deltas (nats/token, mean over requests of the per-request mean |dlogprob|)."""
    pairs = _pairs(found)
    cross = [f"{a}->{b} {p['mean_cross_nats']:.2g} [{p['ci95'][0]:.2g}, {p['ci95'][1]:.2g}]"
             for (a, b), p in sorted(pairs.items()) if damaged in (a, b)]
    clean = [p["mean_cross_nats"] for k, p in pairs.items() if damaged not in k]
    selfs = [p["mean_self_nats"] for p in pairs.values()]
    return (f"{damaged}: cross {'; '.join(cross)}; clean pairs {max(clean):.2g} at most; "
            f"self {min(selfs):.2g}..{max(selfs):.2g}")


@pytest.mark.parametrize("damage", ["int4_g128", "noise_5pct"])
def test_damaged_replica_is_named_by_cross_scoring(served_replica, clean, noisy, damage):
    bad = (REFERENCE, {"quantization": "int4", "quant_group_size": 128}) if damage == "int4_g128" else (noisy, {})
    found, _ = fleet_round(served_replica, clean, {"r-a": (REFERENCE, {}), "r-b": (REFERENCE, {}), "r-x": bad})
    print(_report(found, "r-x"))
    hits = [f for f in found if f.severity != "info"]
    assert [f.subject for f in hits] == ["r-x"], [f.summary for f in found]
    pairs = _pairs(found)
    assert not pairs[("r-a", "r-b")]["differs"] and not pairs[("r-b", "r-a")]["differs"]  # the clean pair agrees


def test_clean_pair_stays_quiet(served_replica, clean):
    found, _ = fleet_round(served_replica, clean, {"r-a": (REFERENCE, {}), "r-b": (REFERENCE, {})})
    assert [f for f in found if f.severity != "info"] == [], [f.summary for f in found]
    assert [f.kind for f in found] == ["cross_scores_agree"]
