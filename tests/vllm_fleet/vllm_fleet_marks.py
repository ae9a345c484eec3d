"""What the vLLM tests here share: their marks (`vllm`, and a skip with the reason where no vLLM
environment is built; engine/serving/vllm_adapter/launch.py starts the servers)."""

from __future__ import annotations

import pytest

from engine.serving.vllm_adapter.launch import vllm_missing


def vllm_marks() -> list:
    why = vllm_missing()
    return [pytest.mark.vllm, pytest.mark.skipif(why is not None, reason=why or "")]
