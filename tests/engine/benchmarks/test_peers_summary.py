"""`bench peers`' summary: ratios to infersight's default and to the best peer, ready-to-serve time and RSS per side."""

from __future__ import annotations

from engine.benchmarks.peers import _driver_io, cli, workloads
from engine.benchmarks.peers.runner import SideRun


def _run(tps_by_workload: dict, wls, ready_s: float, rss: float) -> SideRun:
    results = {w.name: dict(seconds=w.rated_tokens / tps_by_workload[w.name], output_counts=list(w.output_lens),
                            first_tokens=[[1, 2]]) for w in wls}
    return SideRun(True, dict(results=results, ready_s=ready_s, load_s=1.0), rss, 10.0)


def test_ratios_are_to_the_default_and_to_the_best_peer_and_starts_are_per_side():
    wls = workloads.build(["batch1"], 463, 256, quick=True)
    runs = {
        "infersight/default": [_run({"batch1": 100.0}, wls, 3.0, 300), _run({"batch1": 100.0}, wls, 5.0, 310)],
        "infersight/fp32": [_run({"batch1": 50.0}, wls, 2.0, 290)],
        "vllm/fp32": [_run({"batch1": 80.0}, wls, 40.0, 1800)],
        "ctranslate2/fp32": [_run({"batch1": 200.0}, wls, 1.0, 60)],
    }
    rows = {r["side"]: r for r in cli._summarize(wls, runs)}
    assert abs(rows["infersight/fp32"]["ratio_to_infersight"] - 0.5) < 1e-9  # to the default, not to fp32
    assert abs(rows["infersight/default"]["ratio_to_best_peer"] - 0.5) < 1e-9  # ctranslate2 is the best peer
    assert rows["infersight/default"]["best_peer"] == "ctranslate2/fp32"
    starts = {s["side"]: s for s in cli._starts(runs)}
    assert starts["infersight/default"]["ready_s"] == 4.0 and starts["infersight/default"]["peak_rss_mib"] == 310
    assert starts["vllm/fp32"]["ready_s"] == 40.0


def test_without_the_default_variant_ratios_are_to_fp32():
    assert cli.base_key({"infersight/fp32": [], "vllm/fp32": []}) == "infersight/fp32"


def test_a_driver_knows_how_long_its_process_has_run():
    age = _driver_io.seconds_since_process_start()
    assert age is not None and 0 < age < 24 * 3600


def test_a_side_that_answers_before_it_is_ready_reports_both(tmp_path, monkeypatch):
    """infersight serves eager steps while its compiled ones build; the driver waits for the build, so
    `answers_s` (loaded) comes before `ready_s` (first timed workload), and the summary keeps both."""
    ages = iter([2.0, 30.0])
    monkeypatch.setattr(_driver_io, "_ready", {})
    monkeypatch.setattr(_driver_io, "seconds_since_process_start", lambda: next(ages))
    _driver_io.mark_answering()
    _driver_io.run_workloads([], lambda prompts, lens: [])
    out = tmp_path / "result.json"
    _driver_io.write_result(str(out), peer="infersight")
    import json

    result = json.loads(out.read_text())
    assert (result["answers_s"], result["ready_s"]) == (2.0, 30.0)
    runs = {"infersight/default": [SideRun(True, dict(results={}, load_s=1.0, **result), 300, 10.0)]}
    start = cli._starts(runs)[0]
    assert (start["answers_s"], start["ready_s"]) == (2.0, 30.0)
