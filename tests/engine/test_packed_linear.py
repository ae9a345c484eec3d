"""EngineConfig.pack_weights (engine/core/models/packed_linear.py): float32 projections of `min_rows`+ rows go
through oneDNN's matmul over a weight reordered once, fewer rows through F.linear on the plain weight, one row
through models/gemv.py; the row threshold is measured once per process; a weight written in place is reordered
again; a compiled graph sees one opaque op; a CPU engine packs by default; an engine with packed weights gives
the tokens of one without."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import engine.core.models.packed_linear as packed_linear
from engine.core.models.packed_linear import PACKED_MIN_NUMEL, PACKED_MIN_ROWS, PackedLinear, PackedMatmul, pack_linear

pytestmark = pytest.mark.skipif(not packed_linear._HAS_ONEDNN, reason="this torch has no oneDNN")

OUT, IN = 600, 512  # 307,200 weights: past PACKED_MIN_NUMEL


@pytest.fixture(autouse=True)
def _threshold_as_without_measuring(monkeypatch):
    """Each test starts from the unmeasured threshold (an engine built earlier in the process measured it)."""
    monkeypatch.setattr(packed_linear, "min_rows", PACKED_MIN_ROWS)
    monkeypatch.setattr(packed_linear, "_chosen", False)


def _count_packed_products(monkeypatch) -> list[int]:
    """Spy: the rows of every product that took the packed weight."""
    calls, product = [], packed_linear._packed_product

    def spy(x, packed, bias):
        calls.append(x.shape[0])
        return product(x, packed, bias)

    monkeypatch.setattr(packed_linear, "_packed_product", spy)
    return calls


def test_many_rows_take_the_packed_weight_fewer_the_plain_one(monkeypatch):
    assert OUT * IN >= PACKED_MIN_NUMEL
    calls = _count_packed_products(monkeypatch)
    w, b = torch.randn(OUT, IN) * 0.05, torch.randn(OUT)
    mm = PackedMatmul(w, b)
    with torch.inference_mode():
        for rows in (PACKED_MIN_ROWS, 40, 700):
            x = torch.randn(rows, IN)
            torch.testing.assert_close(mm(x), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
        x = torch.randn(40, 2 * IN)[:, ::2]  # a strided view: oneDNN takes it as F.linear does
        torch.testing.assert_close(mm(x), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
        assert calls == [PACKED_MIN_ROWS, 40, 700, 40]
        x = torch.randn(PACKED_MIN_ROWS - 1, IN)
        assert torch.equal(mm(x), F.linear(x, w, b))  # the plain weight, bit for bit
    assert len(calls) == 4


def test_a_weight_written_in_place_is_packed_again():
    w = torch.randn(OUT, IN) * 0.05
    mm = PackedMatmul(w, None)
    x = torch.randn(32, IN)
    with torch.inference_mode():
        before = mm(x)
    with torch.no_grad():
        w.mul_(-2.0)
    with torch.inference_mode():
        torch.testing.assert_close(mm(x), F.linear(x, w), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(mm(x), -2.0 * before, rtol=1e-5, atol=1e-4)


def test_what_is_packed():
    big, small = nn.Linear(IN, OUT), nn.Linear(64, 64)
    assert not pack_linear(small) and type(small) is nn.Linear  # oneDNN's ~25 us a call would cost more
    half = nn.Linear(IN, OUT).to(torch.bfloat16)
    assert not pack_linear(half) and type(half) is nn.Linear
    weight, keys = big.weight, set(big.state_dict())
    assert pack_linear(big) and type(big) is PackedLinear and isinstance(big, nn.Linear)  # quantization finds it
    assert big.weight is weight and set(big.state_dict()) == keys  # same parameters: ties and names hold
    assert not pack_linear(big)  # once


def test_a_packed_linear_follows_its_parameters(monkeypatch):
    calls = _count_packed_products(monkeypatch)
    lin = nn.Linear(IN, OUT)
    pack_linear(lin)
    with torch.inference_mode():
        x1 = torch.randn(1, IN)
        assert torch.equal(lin(x1), F.linear(x1, lin.weight, lin.bias))  # one row: models/gemv.py's path
        assert calls == []
        lin.weight = nn.Parameter(torch.randn(OUT, IN), requires_grad=False)  # replaced, not written
        x = torch.randn(24, IN)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-4)
    assert calls == [24]


def test_a_compiled_graph_calls_one_opaque_op_that_chooses_at_run_time(monkeypatch):
    import torch._dynamo

    calls = _count_packed_products(monkeypatch)
    targets: list[set] = []

    def backend(gm, example_inputs):  # dynamo traces with fake tensors: the op's registered shape
        targets.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    w = torch.randn(OUT, IN) * 0.05
    mm = PackedMatmul(w, None)
    fn = torch.compile(lambda x: torch.relu(mm(x)), backend=backend, dynamic=True)
    torch._dynamo.reset()
    with torch.inference_mode():
        for rows in (40, 3, 90):  # one graph on both sides of PACKED_MIN_ROWS: no guard on the batch size
            x = torch.randn(rows, IN)
            torch.testing.assert_close(fn(x), torch.relu(F.linear(x, w)), rtol=1e-5, atol=1e-4)
    torch._dynamo.reset()
    assert len(targets) == 1 and "infersight.packed_linear" in targets[0], targets
    assert calls == [40, 90]


@pytest.fixture(scope="module")
def packable_llama(tiny_model_factory):
    # every projection past PACKED_MIN_NUMEL (o_proj: 512 x 512), the rest of the shape small
    return tiny_model_factory("llama", hidden_size=512, num_heads=8, num_kv_heads=4, intermediate_size=1024,
                              vocab_size=1024)


@pytest.mark.parametrize("one_row_gain", [1.0, 3.0], ids=["plain-kept", "packed-only"])
@pytest.mark.parametrize("compile_decode", [False, True], ids=["eager", "compiled"])
def test_an_engine_with_packed_weights_gives_the_same_tokens(packable_llama, monkeypatch, compile_decode,
                                                              one_row_gain):
    import torch._dynamo

    import engine.core.model_runner as model_runner
    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams

    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "eager")  # dynamo's graph; inductor is torch's to test
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(5 + i % 7)] for i in range(20)]  # 20 decode rows
    one = [[11, 12, 13, 14]]  # and one row at a time
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    kw = dict(num_kv_blocks=128, block_size=16, max_num_seqs=32)
    plain = LLM(str(packable_llama), pack_weights=False, **kw)
    assert type(plain.engine.loaded.model.lm_head) is nn.Linear
    plain = plain.generate(prompts, params, use_tqdm=False) + plain.generate(one, params, use_tqdm=False)
    calls = _count_packed_products(monkeypatch)
    torch._dynamo.reset()
    # the measured gains: 1.0 (a Xeon: rows of 4+, the plain copies kept), 3.0 (the EPYC: every row, freed)
    monkeypatch.setattr(packed_linear, "packed_gain", lambda matmuls, rows: one_row_gain if rows == 1 else 1.0)
    llm = LLM(str(packable_llama), compile_decode=compile_decode, **kw)  # the default: packed on the CPU
    assert llm.engine.config.pack_weights is True  # auto, written back (the replica's identity shows it)
    model = llm.engine.loaded.model
    gate_up = model.model.layers[0].mlp._gate_up
    assert type(model.lm_head) is PackedLinear and gate_up._packed is not None
    packed_only = one_row_gain > packed_linear.ONE_ROW_GAIN
    assert gate_up._packed.packed_only is packed_only and model.lm_head.matmul().packed_only is packed_only
    freed = [p.device.type == "meta" for p in model.parameters()]
    # per layer q, k, v, o, gate, up, down (the lm_head is not tied here: freed too)
    assert sum(freed) == (7 * 2 + 1 if packed_only else 0), freed
    packed = llm.generate(prompts, params, use_tqdm=False) + llm.generate(one, params, use_tqdm=False)
    torch._dynamo.reset()
    assert [o.token_ids for o in packed] == [o.token_ids for o in plain]
    for a, b in zip(packed, plain):
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            assert la.token_id == lb.token_id and abs(la.logprob - lb.logprob) < 1e-4
    # the prefill (all prompts in one step) and the decode steps (20 rows) took the packed weights:
    # per layer qkv, o, gate/up, down, then the lm_head; one row only where the plain copies went
    assert calls.count(20) >= 5 * 2 * 4 + 5 and max(calls) > 20, calls
    assert (calls.count(1) >= 5 * 2 * 4 + 5) is packed_only, calls


def test_a_tied_lm_head_keeps_its_plain_weight(tiny_model_factory, monkeypatch):
    from engine.core.llm import LLM

    path = tiny_model_factory("llama", hidden_size=512, num_heads=8, num_kv_heads=4, intermediate_size=1024,
                              vocab_size=1024, tie_word_embeddings=True)
    monkeypatch.setattr(packed_linear, "packed_gain", lambda matmuls, rows: 3.0)
    model = LLM(str(path), num_kv_blocks=32).engine.loaded.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the embedding's rows are read by lookup
    assert model.lm_head.weight.device.type == "cpu" and not model.lm_head.matmul().packed_only
    assert model.model.layers[0].mlp.down_proj.weight.device.type == "meta"


def test_pack_weights_leaves_quantized_projections_alone(packable_llama):
    from engine.core.llm import LLM
    from engine.core.quantization.int8 import Int8Linear

    llm = LLM(str(packable_llama), pack_weights=True, quantization="int8", num_kv_blocks=32)
    model = llm.engine.loaded.model
    assert type(model.model.layers[0].mlp.down_proj) is Int8Linear
    assert model.model.layers[0].mlp._gate_up._packed is None  # int8: its own kernel
    assert type(model.lm_head) is PackedLinear  # quant_skip_layers keeps lm_head in float32 by default


def test_the_row_threshold_is_measured_once_and_follows_the_gains(monkeypatch):
    mms = [PackedMatmul(torch.randn(OUT, IN), None)]
    gains = {}
    monkeypatch.setattr(packed_linear, "packed_gain", lambda matmuls, rows: gains[rows])
    gains.update({1: 1.0, 2: 3.0})
    assert packed_linear.choose_min_rows(mms) == 2  # MKL's generic path for few rows, sgemv kept for one
    gains.update({1: 3.0})
    assert packed_linear.choose_min_rows(mms) == 2  # once per process: not measured again
    monkeypatch.setattr(packed_linear, "_chosen", False)
    assert packed_linear.choose_min_rows(mms) == 1  # one row too (the EPYC: sgemv on one thread)
    monkeypatch.setattr(packed_linear, "_chosen", False)
    gains.update({1: packed_linear.ONE_ROW_GAIN * 0.9, 2: packed_linear.FEW_ROWS_GAIN * 0.9})
    assert packed_linear.choose_min_rows(mms) == PACKED_MIN_ROWS  # MKL keeps 2-3 rows (a Xeon)
    calls = _count_packed_products(monkeypatch)
    monkeypatch.setattr(packed_linear, "min_rows", 2)
    with torch.inference_mode():
        for rows in (1, 2, 3):
            x = torch.randn(rows, IN)
            torch.testing.assert_close(mms[0](x), F.linear(x, mms[0].weight), rtol=1e-5, atol=1e-4)
    assert calls == [2, 3]


def test_the_gains_are_measured_over_real_products(monkeypatch):
    calls = _count_packed_products(monkeypatch)
    mm = PackedMatmul(torch.randn(OUT, IN), torch.randn(OUT))
    for rows in (1, 2):
        assert 0.01 < packed_linear.packed_gain([mm], rows, repeats=2) < 100.0
    assert calls == [1] * 3 + [2] * 3  # a warm-up pass and `repeats` timed ones, each through the packed weight


def test_a_packed_only_matmul_serves_every_row_from_its_packed_copy(monkeypatch):
    calls = _count_packed_products(monkeypatch)
    w, b = torch.randn(OUT, IN) * 0.05, torch.randn(OUT)
    lin = nn.Linear(IN, OUT)
    with torch.no_grad():
        lin.weight.copy_(w), lin.bias.copy_(b)
    pack_linear(lin)
    lin.drop_plain()
    assert lin.weight.device.type == "meta" and lin.weight.shape == (OUT, IN)  # names and shapes stay
    with torch.inference_mode():
        for rows in (1, 2, 40):
            x = torch.randn(rows, IN)
            torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    assert calls == [1, 2, 40]
