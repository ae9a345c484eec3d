"""`infersight bench peers`: the workloads, the GGUF converter, and the transformers driver against infersight's.

Nothing here needs the peers' venvs: the converter needs only `gguf` (a dev extra), the drivers that run
are infersight's and transformers', both in this interpreter.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from engine.benchmarks.peers import cli, models, workloads
from engine.benchmarks.peers.runner import run_side
from engine.benchmarks.peers.sides import PEERS, availability

REF = models.REFERENCE


def test_workloads_are_deterministic_and_fit_the_context():
    a = workloads.build(list(workloads.NAMES), vocab_size=463, context=256)
    b = workloads.build(list(workloads.NAMES), vocab_size=463, context=256)
    assert [w.to_json() for w in a] == [w.to_json() for w in b]
    other = workloads.build(list(workloads.NAMES), vocab_size=463, context=256, seed=1)
    assert [w.prompts for w in a] != [w.prompts for w in other]
    for w in a:
        assert all(6 <= t < 463 for p in w.prompts for t in p)  # no special tokens
        assert max(len(p) + n for p, n in zip(w.prompts, w.output_lens)) <= 256
    by = {w.name: w for w in a}
    assert len(by["mixed"].prompts) == 64 and len(by["prefix"].prompts) == 32 and len(by["batch1"].prompts) == 1
    pre = by["prefix"].spec.shared_prefix
    assert pre > 0 and len({tuple(p[:pre]) for p in by["prefix"].prompts}) == 1
    # a model with room gets the nominal sizes; one workload's IDs do not depend on which others are built
    full = {w.name: w for w in workloads.build(list(workloads.NAMES), 49152, 2048)}
    assert full["batch1"].output_lens == [128] and len(full["prefix"].prompts[0]) == 256 + 32
    assert workloads.build(["decode"], 49152, 2048)[0].prompts == full["decode"].prompts


def test_the_prefill_workload_is_mixeds_prompts_with_one_output_each_rated_in_prompt_tokens():
    for context, quick in ((2048, False), (256, False), (256, True)):
        mixed, prefill = workloads.build(["mixed", "prefill"], 49152, context, quick=quick)
        assert prefill.prompts == mixed.prompts  # the same token IDs, fitted to the same context
        assert prefill.output_lens == [1] * len(mixed.prompts)
        assert prefill.rated_tokens == mixed.prompt_tokens and mixed.rated_tokens == mixed.output_tokens


def test_every_side_gets_the_same_token_ids(monkeypatch, tmp_path):
    seen = []

    def fake_run_side(peer, python, request, timeout_s):
        seen.append((peer.name, request["variant"], json.dumps(request["workloads"])))
        outs = {w["name"]: dict(seconds=1.0, output_counts=list(w["output_lens"]), first_tokens=[[1]])
                for w in request["workloads"]}
        return _ok(outs)

    monkeypatch.setattr(cli, "run_side", fake_run_side)
    monkeypatch.setattr(cli.roofline, "measure_in_subprocess",
                        lambda threads: dict(read_gb_s=1.0, copy_gb_s=1.0, gemm_gflop_s=1.0))
    args = _args(tmp_path, repeats=2)
    sides = [(PEERS["infersight"], "fp32"), (PEERS["transformers"], "fp32"), (PEERS["ctranslate2"], "int8")]
    out = cli._run_model(args, "reference", sides, {}, repeats=2)
    assert len(seen) == 6 and len({s[2] for s in seen}) == 1
    assert [s[0] for s in seen[:3]] != [s[0] for s in seen[3:]]  # the order rotates between rounds
    assert all(r["ok"] for r in out["rows"])


def _ok(outs):
    from engine.benchmarks.peers.runner import SideRun

    return SideRun(True, dict(results=outs), 10.0, 1.0)


def _args(tmp_path, **kw):
    import argparse

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    a = p.parse_args(["--quick", "--cache-dir", str(tmp_path)])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_a_missing_peer_says_how_to_install_it(tmp_path):
    why = availability(PEERS["llama.cpp"], {"llama.cpp": str(tmp_path / "no-python")})
    assert why and "install" in why and "llama-cpp-python" in why


def test_gguf_round_trips_the_hf_weights(tmp_path):
    gguf = pytest.importorskip("gguf")
    from engine.benchmarks.peers import gguf_convert as gc

    cfg = json.loads((REF / "config.json").read_text())
    hf = gc.load_hf_tensors(REF)
    path = gc.convert(REF, tmp_path / "m.gguf", "f32")
    reader = gguf.GGUFReader(str(path))
    got = {t.name: np.array(t.data) for t in reader.tensors}
    assert len(got) == 2 + 1 + 9 * cfg["num_hidden_layers"]  # embeddings, output, final norm, 9 per layer
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    for hf_name, w in hf.items():
        name = gc.gguf_name(hf_name)
        if name is None:
            continue
        t = got[name].reshape(w.shape)
        kind = name.split(".")[-2]
        if kind in heads:
            assert not np.array_equal(t, w)  # really permuted
            t = gc.unpermute(t, heads[kind])
        np.testing.assert_array_equal(t, w, err_msg=name)
    field = reader.fields["tokenizer.ggml.tokens"]
    assert len(field.data) == cfg["vocab_size"]
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "llama"

    q = gguf.GGUFReader(str(gc.convert(REF, tmp_path / "q.gguf", "q8_0")))
    qt = next(t for t in q.tensors if t.name == "blk.0.ffn_down.weight")
    assert qt.tensor_type == gguf.GGMLQuantizationType.Q8_0
    deq = gguf.quants.dequantize(qt.data, qt.tensor_type).reshape(hf["model.layers.0.mlp.down_proj.weight"].shape)
    w = hf["model.layers.0.mlp.down_proj.weight"]
    scale = np.abs(w.reshape(w.shape[0], -1, 32)).max(-1) / 127  # q8_0: one scale per 32 weights
    # half a step from rounding, plus up to 127 steps' worth of the scale's own fp16 rounding (2^-11)
    assert np.all(np.abs(deq - w).reshape(scale.shape + (32,)) <= scale[..., None] * (0.5 + 127 * 2.0**-11))


def _request(variant="fp32"):
    wls = workloads.build(["mixed", "batch1"], 463, 256, quick=True)
    return wls, dict(model_dir=str(REF), threads=1, cache_dir="/nonexistent", variant=variant,
                     workloads=[w.to_json() for w in wls])


@pytest.mark.slow
def test_transformers_driver_gives_exact_counts_and_infersight_greedy_tokens():
    wls, req = _request()
    hf = run_side(PEERS["transformers"], sys.executable, req, timeout_s=600)
    eng = run_side(PEERS["infersight"], sys.executable, req, timeout_s=600)
    assert hf.ok, hf.error
    assert eng.ok, eng.error
    for w in wls:
        assert hf.result["results"][w.name]["output_counts"] == w.output_lens
        assert eng.result["results"][w.name]["output_counts"] == w.output_lens
        assert hf.result["results"][w.name]["first_tokens"] == eng.result["results"][w.name]["first_tokens"]
    assert hf.peak_rss_mib > 50  # the child's own peak RSS (wait4), not this process's
