"""`infersight eval run | drift | gate` through the real CLI entry point, exit codes included."""

from __future__ import annotations

import json

import pytest

from dashboards.console.cli import main
from evals.results import EvalRun


def _policy(tmp_path, suite, extra=""):
    p = tmp_path / "policy.toml"
    p.write_text(f'[run]\nsuites = ["{suite}"]\nper_task = 2\n{extra}')
    return str(p)


@pytest.mark.slow  # four engine runs and a store through the CLI (~10-15 s)
def test_run_then_gate_pass_and_fail(tmp_path, target_dir, damaged_dir, heldout_path, capsys):
    base = tmp_path / "base.json"
    rc = main(["eval", "run", "--suite", str(heldout_path), "--model", str(target_dir), "--per-task", "2",
               "--num-kv-blocks", "64", "--out", str(base), "--store", str(tmp_path / "store"), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "overall" in out and "stored in eval_runs" in out
    run = EvalRun.load(base)
    assert len(run.items) == 12 and json.loads(run.run.config_json)["num_kv_blocks"] == 64

    # bf16 candidate from the baseline's own model dir: passes -> exit 0, reports written
    md, js = tmp_path / "gate.md", tmp_path / "gate.json"
    rc = main(["eval", "gate", "--baseline", str(base), "--candidate", str(target_dir),
               "--candidate-set", "dtype=bfloat16", "--candidate-set", "num_kv_blocks=64",
               "--policy", _policy(tmp_path, heldout_path), "--report-md", str(md), "--report-json", str(js),
               "--no-progress"])
    assert rc == 0, capsys.readouterr().out
    assert md.read_text().startswith("# Eval gate: **PASS**")
    result = json.loads(js.read_text())
    assert result["verdict"] == "pass" and result["drift"]["stats"]["positions"] > 12

    # the damaged checkpoint: fails -> exit 1
    toml = tmp_path / "damaged.toml"
    toml.write_text(f'model = "{damaged_dir}"\nnum_kv_blocks = 64\n')
    rc = main(["eval", "gate", "--baseline", str(base), "--candidate", str(toml),
               "--policy", _policy(tmp_path, heldout_path), "--no-progress"])
    assert rc == 1
    assert "# Eval gate: **FAIL**" in capsys.readouterr().out

    # the baseline run id through the store works as well
    rc = main(["eval", "drift", "--baseline", run.run_id, "--store", str(tmp_path / "store"),
               "--candidate", str(target_dir), "--candidate-set", "quantization=int8",
               "--json", str(tmp_path / "d.json")])
    assert rc == 0
    drift = json.loads((tmp_path / "d.json").read_text())
    assert 0 < drift["stats"]["kl_mean"] < 0.01 and drift["greedy"] is None


def test_errors_exit_2_with_the_reason(tmp_path, target_dir, heldout_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\n')
    assert main(["eval", "run", "--suite", str(bad), "--model", str(target_dir), "--no-progress"]) == 2
    assert f"{bad}:1: 'reference'" in capsys.readouterr().err
    assert main(["eval", "gate", "--baseline", str(tmp_path / "nope.json"), "--candidate", str(target_dir),
                 "--policy", _policy(tmp_path, heldout_path)]) == 2
    assert "neither a run file" in capsys.readouterr().err
    assert main(["eval", "gate", "--baseline", str(target_dir), "--candidate", str(target_dir),
                 "--policy", _policy(tmp_path, heldout_path, "[drift]\nmax_kl = 1\n")]) == 2
    assert "unknown key 'max_kl'" in capsys.readouterr().err
    assert main(["eval", "run", "--suite", str(heldout_path), "--endpoint", "http://127.0.0.1:9",
                 "--quantization", "int8"]) == 2
    assert "do not apply to --endpoint" in capsys.readouterr().err
