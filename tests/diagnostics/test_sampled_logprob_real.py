"""Real-model evidence for the sampled-logprob diagnostic: two in-process replicas of the shipped
reference model (evals/reference/models/target), each an engine with its Recorder writing to one
store, serve DIFFERENT sampled prompts (the reference tasks, temperature 1.0, answers ending at
<|eos|>); the diagnostic reads only what the replicas recorded.

- a damaged checkpoint (diagnostics.benchmarks.model_faults.noisy_weights at 50% relative noise,
  same path and options) is named, critical or warning, as the canary against the first-served
  baseline;
- a clean pair on the same traffic gives nothing above info.

Measured limits (400 requests per replica, same traffic): 50% noise moves the per-request mean
logprob from -0.073 to -0.132 nats/token (p ~ 1e-38); 5-20% noise and int4 g32 / g128 (mean KL
0.0008 on this model) move it by less than a clean pair differs: a small model that stays sure of
itself while wrong is invisible to its own logprobs, and exact-token probes are the evidence there.
With ignore_eos (text after the answer) the shift at 50% noise is diluted to -14%.
"""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path

import pytest
import torch

from diagnostics import quality
from diagnostics.benchmarks.model_faults import noisy_weights
from diagnostics.request import DiagnosticRequest
from diagnostics.scope import Scope
from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.prompt import chat_prompt
from engine.core.sampling_params import SamplingParams
from evals.reference.corpus import stream
from telemetry.recorder import Recorder
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

N = 300  # requests per replica
NOISE = 0.5


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    path = tmp_path_factory.mktemp("damaged") / "target"
    shutil.copytree(REFERENCE, path)
    noisy_weights(path, relative=NOISE)
    return path


def serve(store, model: Path, replica_id: str, seed: int, seen: set[str], role: str = "") -> None:
    """One replica serving N sampled chat prompts no other replica got."""
    torch.set_num_threads(1)
    recorder = Recorder(store, replica_id, flush_interval=0.1)
    engine = LLMEngine(EngineConfig(model=str(model), max_num_seqs=128, num_kv_blocks=1024, block_size=16,
                                    replica_id=replica_id, seed=seed, role=role), recorder)
    examples = [ex for ex in itertools.islice(stream(seed=seed), 3 * N) if ex.prompt not in seen][:N]
    seen.update(ex.prompt for ex in examples)
    params = SamplingParams(temperature=1.0, max_tokens=24)  # answers end at <|eos|>, as real traffic does
    for i, ex in enumerate(examples):
        engine.add_request(f"{replica_id}-{i}", chat_prompt(engine.tokenizer, ex.messages()), params,
                           workload=ex.task)
    while engine.has_unfinished():
        engine.step()
    recorder.close()


def diagnose(store, t0):
    return quality.run(store, DiagnosticRequest(Scope(start=t0 - 60)))


def test_damaged_checkpoint_is_named_under_sampled_traffic(clean, damaged):
    t0, seen = time.time(), set()
    serve(clean, REFERENCE, "baseline", 1, seen, role="baseline")  # the deploy names its sides
    serve(clean, damaged, "canary", 2, seen, role="candidate")
    hashes = clean.query_df("SELECT replica_id, uniqExact(prompt_text_hash) AS u, count() AS n FROM requests "
                            "GROUP BY replica_id")
    assert list(hashes.n) == [N, N]
    overlap = clean.query_df("SELECT count() AS n FROM (SELECT prompt_text_hash FROM requests "
                             "GROUP BY prompt_text_hash HAVING uniqExact(replica_id) > 1)")
    assert int(overlap.n[0]) == 0  # no identical prompts: exact-token drift has nothing to pair
    found = diagnose(clean, t0)
    hits = [f for f in found if f.severity != "info"]
    assert [f.subject for f in hits] == ["canary"], [f.summary for f in found]
    f = hits[0]
    assert f.kind == "sampled_logprob_shift" and f.evidence["baseline"]["rule"] == "role"  # the recorded roles decide, not start order
    assert f.evidence["metrics"]["mean_logprob"]["ci95"][1] < 0  # less sure of what it samples
    assert "weights_hash" in f.summary


def test_clean_pair_on_the_same_traffic_stays_quiet(clean):
    t0, seen = time.time(), set()
    serve(clean, REFERENCE, "r-a", 3, seen)
    serve(clean, REFERENCE, "r-b", 4, seen)
    found = diagnose(clean, t0)
    assert [f for f in found if f.severity != "info"] == [], [f.summary for f in found]
    assert [f.subject for f in found] == ["r-b"]  # compared, and unchanged
