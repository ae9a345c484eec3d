"""Gate policies and what --baseline / --candidate can name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.config import EngineConfig
from evals.policy import load_policy
from evals.results import EvalRun
from evals.sides import config_of_run, load_engine_config, parse_override, resolve_side
from telemetry.contract.records import EvalItemRecord, EvalRunRecord

ROOT = Path(__file__).resolve().parents[2]


def test_default_policy_loads_with_documented_thresholds():
    p = load_policy(ROOT / "evals" / "policies" / "default.toml")
    assert p.paired_test == "mcnemar" and p.alpha == 0.05 and p.max_accuracy_drop == 0.02
    assert (p.max_mean_kl, p.max_p99_kl, p.min_same_top_p, p.min_greedy_agreement) == (0.01, 0.1, 0.98, 0.95)
    assert p.require_logit_drift is True
    assert [Path(s).name for s in p.suites] == ["reference_heldout.jsonl"] and Path(p.suites[0]).is_file()


@pytest.mark.parametrize("text,message", [
    ("[accuracy]\nmax_acuracy_drop = 0.1\n", "unknown key 'max_acuracy_drop'"),
    ("[acuracy]\nalpha = 0.1\n", "unknown section [acuracy]"),
    ("[accuracy]\nalpha = 2.0\n", "alpha must be in (0, 1)"),
    ("[accuracy]\npaired_test = 't-test'\n", "paired_test must be one of"),
    ("[drift]\nmin_same_top_p = 1.5\n", "min_same_top_p must be in [0, 1]"),
    ("[drift\n", "not valid TOML"),
])
def test_bad_policies_are_errors_naming_the_problem(tmp_path, text, message):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{path}.*{__import__('re').escape(message)}"):
        load_policy(path)


def test_false_switches_a_check_off(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[drift]\nmax_p99_kl = false\nrequire_logit_drift = false\n[run]\nper_task = 3\n")
    p = load_policy(path)
    assert p.max_p99_kl is None and p.require_logit_drift is False and p.per_task == 3
    assert p.max_mean_kl == 0.01  # untouched keys keep their defaults


def test_engine_config_from_toml_dir_and_overrides(tmp_path, tiny_llama):
    toml = tmp_path / "cand.toml"
    toml.write_text(f'[engine]\nmodel = "{tiny_llama}"\nquantization = "int8"\nnum_kv_blocks = 32\n')
    c = load_engine_config(toml)
    assert (c.model, c.quantization, c.num_kv_blocks) == (str(tiny_llama), "int8", 32)
    flat = tmp_path / "flat.toml"
    flat.write_text(f'model = "{tiny_llama}"\ndtype = "bfloat16"\n')
    assert load_engine_config(flat, {"seed": 3}).dtype == "bfloat16"
    assert load_engine_config(tiny_llama, {"quantization": "int4"}).quantization == "int4"
    bad = tmp_path / "bad.toml"
    bad.write_text(f'model = "{tiny_llama}"\nquantisation = "int8"\n')
    with pytest.raises(ValueError, match="unknown EngineConfig field.*quantisation"):
        load_engine_config(bad)
    with pytest.raises(ValueError, match="model directory"):
        load_engine_config(tmp_path)


def test_parse_override():
    assert parse_override("quantization=int8") == ("quantization", "int8")
    assert parse_override("num-kv-blocks=64") == ("num_kv_blocks", 64)
    assert parse_override('dtype="bfloat16"') == ("dtype", "bfloat16")
    assert parse_override("enable_prefix_caching=false") == ("enable_prefix_caching", False)
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_override("quant=int8")


def _run(tmp_path, run_id, config: dict, suite="s", endpoint=""):
    run = EvalRun(EvalRunRecord(run_id, suite, 0.0, 1.0, json.dumps(config), "h", "m", "", "none", "none", "", 1, 1.0,
                                endpoint=endpoint),
                  [EvalItemRecord(run_id, "a", suite, "", "exact", 1.0, "x", "x", [1], [2, 3])])
    return run.save(tmp_path / f"{run_id}.json")


def test_a_run_brings_its_configuration_when_it_is_loadable(tmp_path, tiny_llama):
    cfg = json.loads(EngineConfig(model=str(tiny_llama)).to_json())
    side = resolve_side("baseline", [str(_run(tmp_path, "r1", cfg))], overrides={"dtype": "bfloat16"})
    assert list(side.runs) == ["s"] and side.config.model == str(tiny_llama) and side.config.dtype == "bfloat16"
    gone = resolve_side("baseline", [str(_run(tmp_path, "r2", {**cfg, "model": str(tmp_path / "nope")}))])
    assert gone.config is None and "not here" in gone.config_note
    remote = EvalRun.load(_run(tmp_path, "r3", {"endpoint": "http://x"}, endpoint="http://x"))
    assert config_of_run(remote)[0] is None
    with pytest.raises(ValueError, match="neither a run file"):
        resolve_side("candidate", ["r4"])
    with pytest.raises(ValueError, match="two runs of suite"):
        resolve_side("candidate", [str(_run(tmp_path, "r5", cfg)), str(_run(tmp_path, "r6", cfg))])
