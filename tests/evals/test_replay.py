"""`infersight replay` on real parts: replicas of the tiny Llama served by the app `infersight serve` runs
(AsyncLLM + build_app, each recording into the real embedded store through its Recorder), production
traffic from the load generator, the replay through the CLI and the library, and the gate on its run.

- greedy production requests replayed against a replica of the same model: 100% identical, and
  the run (suite replay:<window>:chat) is in eval_runs / eval_items with its token IDs;
- against int4 weights: the identical share drops, and `eval gate --replay` fails on it (and
  passes with the same-model replay, all else equal);
- sampled production requests: an error saying to add --greedy --baseline-url, and with them the
  comparison is greedy against the baseline's answers;
- a candidate nobody serves: a clear error, exit 2, nothing written.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from dashboards.console.cli import main
from engine.util import free_port
from engine.traffic.loadgen.arrivals import parse_arrival
from engine.traffic.loadgen.runner import run_load
from engine.traffic.loadgen.workloads import make_workload
from evals.replay.runner import ReplayError, ReplayOptions, replay
from evals.replay.summary import reference_tokens, summarize_replay
from evals.replay.window import parse_window
from evals.results import EvalRun
from telemetry.store.waiting import wait_for_replicas, wait_for_requests

MAX_TOKENS = 8
PER_WORKLOAD = 8


@pytest.fixture(scope="module")
def fleet(tiny_llama, store, served_replica):
    """Production (recording), a same-model candidate and an int4 candidate (both recording too, as
    canaries in the fleet do); production served greedy chat traffic and sampled batch traffic."""
    replica = served_replica
    with replica(tiny_llama, "replay-prod", store) as (prod, prod_parts), \
            replica(tiny_llama, "replay-same", store) as (same, same_parts), \
            replica(tiny_llama, "replay-int4", store, quantization="int4", quant_group_size=32) as (int4, int4_parts):
        start = time.time()
        for name, greedy in (("chat", 1.0), ("batch", 0.0)):
            load = asyncio.run(run_load([prod], make_workload(name, seed=3, scale=0.3, max_tokens=MAX_TOKENS,
                                                              greedy_share=greedy),
                                        parse_arrival("closed:2"), num_requests=PER_WORKLOAD, seed=3,
                                        run_id=f"prod-{name}"))
            assert all(r.ok for r in load.results), [r.error for r in load.results]
        for parts in (prod_parts, same_parts, int4_parts):
            parts.recorder.flush()
        assert wait_for_requests(store, "prod-", 2 * PER_WORKLOAD) == 2 * PER_WORKLOAD
        # the candidates' identity (quantization) is read from their replicas rows: wait for them too
        assert wait_for_replicas(store, ["replay-prod", "replay-same", "replay-int4"]) == 3
        window = f"{start:.6f}..{time.time():.6f}"
        yield {"prod": prod, "same": same, "int4": int4, "window": window}


def stored_production(store) -> dict:
    df = store.query_df("SELECT request_id, prompt_token_ids, output_token_ids, sampling_params_json FROM requests "
                        "WHERE startsWith(request_id, 'prod-chat')")
    return {r["request_id"]: r for r in df.to_dict("records")}


def test_greedy_production_replayed_on_the_same_model_is_identical(fleet, store):
    run, notes = replay(store, ReplayOptions(window=fleet["window"], to=fleet["same"], workload="chat"))
    assert run.run.suite == f"replay:{fleet['window']}:chat" and run.run.endpoint == fleet["same"]
    assert run.run.quantization == "none"  # the candidate's identity, from its replicas row
    prod = stored_production(store)
    assert sorted(i.item_id for i in run.items) == sorted(prod) and len(prod) == PER_WORKLOAD
    for item in run.items:
        row = prod[item.item_id]
        assert json.loads(row["sampling_params_json"])["temperature"] == 0.0
        assert item.input_token_ids == list(row["prompt_token_ids"]) and item.input_token_ids
        assert item.output_token_ids == list(row["output_token_ids"]) == reference_tokens(item.reference)
        assert item.score == 1.0 and item.task == "chat" and len(item.output_token_ids) == MAX_TOKENS
    summary = summarize_replay(run)
    assert (summary.items, summary.identical, summary.share, summary.errors) == (PER_WORKLOAD, PER_WORKLOAD, 1.0, 0)
    assert summary.ci[0] > 0.6 and summary.median_first_divergence is None
    back = EvalRun.from_store(store, run.run_id)  # written into eval_runs / eval_items
    assert back.run.suite == run.run.suite and back.run.accuracy == 1.0
    assert {i.item_id: i.output_token_ids for i in back.items} == {i.item_id: i.output_token_ids for i in run.items}

    # without --workload the sampled batch requests are left out, and the notes say how to include them
    run_all, notes = replay(store, ReplayOptions(window=fleet["window"], to=fleet["same"]), write=False)
    assert len(run_all.items) == PER_WORKLOAD and all(i.score == 1.0 for i in run_all.items)
    assert any(f"{PER_WORKLOAD} sampled" in n and "--greedy --baseline-url" in n for n in notes), notes
    # the replayed requests were recorded by the candidate (tag "replay"), and are never replayed again
    assert wait_for_requests(store, "replay-", 2 * PER_WORKLOAD) >= 2 * PER_WORKLOAD


def test_int4_candidate_drops_agreement_and_fails_the_gate(fleet, store, tmp_path, heldout_subset, capsys):
    good, _ = replay(store, ReplayOptions(window=fleet["window"], to=fleet["same"], workload="chat"))
    bad, _ = replay(store, ReplayOptions(window=fleet["window"], to=fleet["int4"], workload="chat"))
    summary = summarize_replay(bad)
    assert bad.run.quantization.startswith("int4")  # "int4-g32": the replicas row says what it runs
    assert summary.share < 0.95 and summary.errors == 0 and summary.divergence_positions
    assert all(0 <= d < MAX_TOKENS for d in summary.divergence_positions)

    # the gate: the same eval run on both sides (every other check passes), the replay decides
    from evals.backends import HttpBackend
    from evals.runner import run_suite

    backend = HttpBackend(fleet["same"])
    try:
        suite_run = run_suite(heldout_subset.subset(max_items=3), backend, max_tokens=4, progress=False)
    finally:
        backend.close()
    base = suite_run.save(tmp_path / "base.json")
    policy = tmp_path / "policy.toml"
    policy.write_text("[drift]\nrequire_logit_drift = false\n[replay]\nmin_replay_agreement = 0.95\n")

    def gate(replay_spec: str) -> tuple[int, dict]:
        report = tmp_path / "gate.json"
        rc = main(["eval", "gate", "--baseline", str(base), "--candidate", str(base), "--policy", str(policy),
                   "--store", store.path, "--replay", replay_spec, "--report-json", str(report), "--no-progress"])
        return rc, (json.loads(report.read_text()) if rc in (0, 1) else {})

    rc, report = gate(good.run_id)
    assert rc == 0 and report["verdict"] == "pass", report
    check = next(c for c in report["checks"] if c["name"] == "replay agreement")
    assert check["value"] == 1.0 and check["passed"] and report["run_ids"]["replay"] == [good.run_id]

    bad_file = bad.save(tmp_path / "replay-int4.json")
    rc, report = gate(str(bad_file))
    assert rc == 1 and report["verdict"] == "fail"
    failed = [c["name"] for c in report["checks"] if not c["passed"]]
    assert failed == ["replay agreement"], failed
    assert report["replays"][0]["share"] == pytest.approx(summary.share)
    markdown = capsys.readouterr().out
    assert "replay agreement" in markdown  # in the markdown report's checks
    with capsys.disabled():
        print("\n".join(line for line in markdown.splitlines() if "replay" in line or line.startswith("# ")))

    rc, _ = gate(str(base))  # an eval run that is not a replay
    assert rc == 2 and "not a replay" in capsys.readouterr().err


def test_sampled_production_needs_greedy_and_a_baseline(fleet, store, tmp_path, capsys):
    common = ["replay", "--store", store.path, "--window", "1h", "--workload", "batch", "--no-progress"]
    assert main(common + ["--to", fleet["same"]]) == 2
    err = capsys.readouterr().err
    assert f"{PER_WORKLOAD} stored request(s)" in err and "sampled" in err and "--greedy --baseline-url" in err

    assert main(common + ["--to", fleet["same"], "--greedy"]) == 2
    err = capsys.readouterr().err
    assert "were sampled" in err and "--baseline-url URL" in err

    out = tmp_path / "replay.json"
    assert main(common + ["--to", fleet["int4"], "--greedy", "--baseline-url", fleet["same"], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    run = EvalRun.load(out)
    assert run.run.suite == "replay:1h:batch" and len(run.items) == PER_WORKLOAD
    assert json.loads(run.run.config_json)["replay"]["reference"] == fleet["same"]
    assert f"items {PER_WORKLOAD}" in printed and run.run_id in printed
    # the reference is the baseline's greedy answer, not production's sampled one
    prod = {r["request_id"]: list(r["output_token_ids"]) for r in store.query_df(
        "SELECT request_id, output_token_ids FROM requests WHERE startsWith(request_id, 'prod-batch')")
        .to_dict("records")}
    assert any(reference_tokens(i.reference) != prod[i.item_id] for i in run.items)
    assert summarize_replay(run).share < 0.95  # int4 against the baseline's greedy answers

    # same model on both sides, greedy: identical
    assert main(common + ["--to", fleet["same"], "--greedy", "--baseline-url", fleet["same"], "--out", str(out)]) == 0
    assert all(i.score == 1.0 for i in EvalRun.load(out).items)


def test_unreachable_candidate_is_a_clear_error(fleet, store, capsys):
    before = int(store.query_df("SELECT count() AS n FROM eval_runs")["n"].iloc[0])
    down = f"http://127.0.0.1:{free_port()}"
    rc = main(["replay", "--store", store.path, "--window", "1h", "--workload", "chat", "--to", down, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot reach the candidate" in err and down in err
    assert int(store.query_df("SELECT count() AS n FROM eval_runs")["n"].iloc[0]) == before


def test_nothing_to_replay_and_bad_windows(fleet, store):
    with pytest.raises(ReplayError, match="no replayable request"):
        replay(store, ReplayOptions(window="1h", to=fleet["same"], workload="no-such-workload"))
    for bad in ("", "yesterday", "5..1", "2h..x"):
        with pytest.raises(ValueError):
            parse_window(bad)
    assert parse_window("2h", now=10_000.0).start == 10_000.0 - 7200
