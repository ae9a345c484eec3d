"""What a replica that does not compile keeps out of its process: torch._dynamo and inductor (with sympy,
triton and torch.onnx behind them, ~140 MB of RSS) are imported only when compile_decode asks for them (it does
by default: an eager replica is one started with --no-compile-decode)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "triton")

CHILD = """
import json, sys
from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams
llm = LLM({model!r}, compile_decode=False)
out = llm.generate([[5, 9, 17, 3], [7, 7, 1]], [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)] * 2,
                   use_tqdm=False)
print(json.dumps(dict(tokens=[len(o.token_ids) for o in out],
                      imported=[m for m in {modules!r} if m in sys.modules])))
"""


def test_an_eager_engine_never_imports_the_compiler(tiny_llama):
    # its own process: the test session has imported torch._dynamo long before (other tests compile)
    code = CHILD.format(model=str(tiny_llama), modules=COMPILER_MODULES)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["tokens"] == [6, 6]  # prefills and decodes ran (the rope table is made on the first forward)
    assert result["imported"] == []


COMPILED_CHILD = """
import json, sys
import engine.core.model_runner as model_runner
model_runner.COMPILE_BACKEND = "eager"  # dynamo's trace (its import probes for triton), no inductor build
from engine.core.llm import LLM
from engine.core.sampling_params import SamplingParams
llm = LLM({model!r}, compile_decode=True)
assert llm.engine.runner.wait_compiled(timeout=600), llm.engine.runner.background.error
out = llm.generate([[5, 9, 17, 3], [7, 7, 1]], [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)] * 2,
                   use_tqdm=False)
print(json.dumps(dict(tokens=[len(o.token_ids) for o in out], dynamo="torch._dynamo" in sys.modules,
                      triton=sys.modules.get("triton") is not None)))
"""


def test_a_compiled_engine_on_a_cpu_keeps_triton_out(tiny_llama):
    """Triton (a dependency of xgrammar, ~65 MiB resident) runs nothing without an accelerator: importing
    torch._dynamo would load it (engine/core/triton_gate.py)."""
    import torch

    if torch.accelerator.is_available():
        pytest.skip("an accelerator's compiled kernels are triton's")
    code = COMPILED_CHILD.format(model=str(tiny_llama))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result == dict(tokens=[6, 6], dynamo=True, triton=False)
