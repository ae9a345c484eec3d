"""A one-row float32 projection inside a compiled graph is a reduction over the weight (inductor
streams it on all threads) where the BLAS call runs on one, measured once per process before the first
compile; elsewhere it stays F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import engine.core.models.gemv as gemv
from engine.core.models.gemv import linear


def _traced_ops(fn, *args) -> tuple[set, torch.Tensor]:
    import torch._dynamo

    seen: set = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, dynamic=False)(*args)
    torch._dynamo.reset()
    return seen, out


def test_one_row_in_a_compiled_graph_is_a_reduction_not_a_blas_call(monkeypatch):
    monkeypatch.setattr(gemv, "rows_as_reduction", True)  # a BLAS whose sgemv runs on one thread
    w, b = torch.randn(48, 32), torch.randn(48)
    x = torch.randn(1, 32)
    ops, out = _traced_ops(linear, x, w, b)
    assert not any("linear" in op or "mm" in op for op in ops), ops
    assert any("sum" in op for op in ops), ops
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_one_row_stays_the_blas_call_where_sgemv_streams(monkeypatch):
    monkeypatch.setattr(gemv, "rows_as_reduction", False)
    monkeypatch.setattr(gemv, "CACHED_WEIGHT_NUMEL", 48 * 32)  # a weight past the cache's size
    monkeypatch.setattr(gemv, "ONEDNN_MIN_NUMEL", 48 * 32)  # an lm_head: eager it would take oneDNN's op,
    w, x = torch.randn(48, 32), torch.randn(1, 32)  # which inductor cannot lower (the compile failed)
    with torch.inference_mode():
        ops, out = _traced_ops(linear, x, w)
    assert any("linear" in op for op in ops) and not any("sum" in op or "mkldnn" in op for op in ops), ops
    torch.testing.assert_close(out, F.linear(x, w))


def test_a_weight_that_stays_in_cache_is_a_reduction_wherever_sgemv_streams(monkeypatch):
    monkeypatch.setattr(gemv, "rows_as_reduction", False)
    w, x = torch.randn(48, 32), torch.randn(1, 32)
    assert w.numel() < gemv.CACHED_WEIGHT_NUMEL
    ops, out = _traced_ops(linear, x, w)
    assert any("sum" in op for op in ops) and not any("linear" in op or "mm" in op for op in ops), ops
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_the_choice_follows_the_measured_sgemv_slowdown(monkeypatch):
    slowdown = gemv.blas_gemv_slowdown(mib=8, repeats=2)  # a real measurement: a finite ratio
    assert 0 < slowdown < float("inf")
    for measured, reduction in ((2.8, True), (1.0, False)):  # the EPYC's one-thread sgemv; a streaming one
        monkeypatch.setattr(gemv, "_chosen", False)
        monkeypatch.setattr(gemv, "blas_gemv_slowdown", lambda *args: measured)
        assert gemv.choose_compiled_rows() is reduction and gemv.rows_as_reduction is reduction
        monkeypatch.setattr(gemv, "blas_gemv_slowdown", lambda *args: 1 / 0)  # chosen: never measured again
        assert gemv.choose_compiled_rows() is reduction


def test_several_rows_and_eager_calls_stay_linear():
    w = torch.randn(48, 32)
    ops, out = _traced_ops(linear, torch.randn(3, 32), w)
    assert any("linear" in op for op in ops), ops
    x = torch.randn(1, 32)
    assert torch.equal(linear(x, w), F.linear(x, w))  # eager: the BLAS call, bit for bit


@pytest.mark.parametrize("slowdown", [2.8, 1.0], ids=["one-thread-sgemv", "streaming-sgemv"])
def test_the_compiled_batch1_decode_step_has_no_blas_projection(tiny_llama, monkeypatch, slowdown):
    """Every projection of the model (fused q/k/v and gate/up, o, down, the lm_head) goes through
    `linear`: where the runner measured a one-thread sgemv, a batch-1 decode graph holds no linear/mm call;
    where sgemv streams, its projections are the BLAS calls."""
    import torch._dynamo

    import engine.core.model_runner as model_runner
    from engine.core.engine import LLMEngine
    from engine.core.sampling_params import SamplingParams

    seen: set = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        return gm.forward

    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", backend)
    monkeypatch.setattr(gemv, "_chosen", False)
    monkeypatch.setattr(gemv, "rows_as_reduction", True)
    monkeypatch.setattr(gemv, "blas_gemv_slowdown", lambda *args: slowdown)
    monkeypatch.setattr(gemv, "CACHED_WEIGHT_NUMEL", 0)  # the tiny model's weights stand for large ones
    torch._dynamo.reset()
    engine = LLMEngine(tiny_llama, block_size=4, num_kv_blocks=64, compile_decode=True)
    engine.add_request("0", [5, 9, 17, 3], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), stream=False)
    while engine.has_unfinished():
        engine.step()
    torch._dynamo.reset()
    blas = any("linear" in op or "mm" in op for op in seen)
    assert seen and blas is (slowdown <= gemv.SLOW_GEMV), seen


def test_eager_one_row_times_a_large_weight_takes_onednn(monkeypatch):
    import engine.core.models.gemv as gemv

    if not gemv._HAS_ONEDNN:
        pytest.skip("this torch build has no oneDNN linear: eager one-row calls stay F.linear")
    calls = []
    real = gemv.onednn_linear
    monkeypatch.setattr(gemv, "onednn_linear", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(gemv, "ONEDNN_MIN_NUMEL", 48 * 32)  # a small weight stands for the lm_head
    w, b, x = torch.randn(48, 32), torch.randn(48), torch.randn(1, 32)
    with torch.inference_mode():
        out = linear(x, w, b)
        linear(torch.randn(2, 32), w)  # two rows: F.linear
    assert calls == [1]
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_the_measurement_reads_the_models_own_large_weights_and_skips_a_model_without_any(monkeypatch):
    """What is measured is the working set a batch-1 step streams (the model's weights at or over
    CACHED_WEIGHT_NUMEL), not a synthetic one whose size decides how much of it a CPU's cache holds;
    a model whose weights all stay in cache takes the reduction whatever is chosen, so it is not measured
    and the choice stays open for a model that has large ones."""
    big, small = torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(8, 8, bias=False)
    model = torch.nn.Sequential(big, small)
    monkeypatch.setattr(gemv, "CACHED_WEIGHT_NUMEL", 64 * 96)
    assert [w is big.weight for w in gemv.large_weights(model)] == [True]
    measured: list = []
    monkeypatch.setattr(gemv, "_chosen", False)
    monkeypatch.setattr(gemv, "rows_as_reduction", True)
    monkeypatch.setattr(gemv, "blas_gemv_slowdown", lambda weights: measured.append(weights) or 1.0)
    assert gemv.choose_compiled_rows(torch.nn.Sequential(small)) is True and measured == [] and not gemv._chosen
    assert gemv.choose_compiled_rows(model) is False and gemv._chosen
    assert len(measured) == 1 and [w is big.weight for w in measured[0]] == [True]


def test_a_real_measurement_over_given_weights_is_a_finite_ratio():
    weights = [torch.randn(256, 512), torch.randn(512, 256)]
    assert 0 < gemv.blas_gemv_slowdown(weights, repeats=1) < float("inf")


def test_the_runner_measures_in_the_thread_that_builds_it_before_any_build_or_step(tiny_llama, monkeypatch):
    """Measured in the background build's thread, beside the engine's eager steps, the read is slower
    (a second OpenMP team) and the choice comes out wrong and varies between starts (models/gemv.py)."""
    import threading

    import engine.core.model_runner as model_runner
    from engine.core.engine import LLMEngine

    threads: list = []
    monkeypatch.setattr(model_runner, "BACKGROUND_COMPILE", True)
    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")  # dynamo's graph, no inductor build
    monkeypatch.setattr(gemv, "_chosen", False)
    monkeypatch.setattr(gemv, "CACHED_WEIGHT_NUMEL", 0)  # the tiny model's weights stand for large ones
    monkeypatch.setattr(gemv, "blas_gemv_slowdown", lambda weights: threads.append(threading.current_thread()) or 1.0)
    engine = LLMEngine(tiny_llama, block_size=4, num_kv_blocks=64, compile_decode=True)
    try:
        assert threads == [threading.current_thread()]  # measured once, here, while the engine was built
    finally:
        engine.runner.wait_compiled(timeout=600)
