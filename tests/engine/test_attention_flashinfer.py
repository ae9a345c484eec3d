"""The flashinfer backend agrees with the torch backend (needs CUDA and flashinfer; skipped otherwise)."""

from __future__ import annotations

import pytest
import torch

from engine.core.attention import flashinfer_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not flashinfer_available(), reason="needs a CUDA device and flashinfer")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(128, 8, 2), (64, 4, 4)])
def test_flashinfer_matches_torch_backend(dtype, head_dim, heads, kv_heads):
    from engine.benchmarks.gpu_check import ATTENTION_CASES, attention_diff

    for name, steps in ATTENTION_CASES:
        assert attention_diff("cuda", dtype, head_dim, heads, kv_heads, steps) < 2e-2, name


def test_model_on_cuda_matches_cpu():
    from engine.benchmarks.gpu_check import model_diff

    diff, agree = model_diff("cuda", "bfloat16", "auto")
    assert diff < 0.5 and agree >= 0.9

