"""`infersight serve` refuses at start what cannot work, and caps a defaulted context to the KV cache."""

from __future__ import annotations

import argparse
import logging

import pytest

from engine.core.config import EngineConfig
from engine.serving.server import cli as serve_cli
from engine.serving.server.preflight import PreflightError, _model_config, check_vocabulary, fit_context, preflight

# the tiny llama: 2 layers x 2 KV heads x head_dim 16, float32 -> 2*2*16*2*16*4 = 8192 bytes per block of 16


def _serve_args(model, *extra) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(["--model", str(model), "--port", "0", *extra])  # 0: never "in use" on a shared host


def test_defaulted_context_is_capped_with_a_warning(tiny_llama, caplog):
    caplog.set_level(logging.WARNING, logger="infersight.serve")
    cfg = EngineConfig(model=str(tiny_llama), num_kv_blocks=40, block_size=16)  # 640 tokens < 2048 positions
    fitted = fit_context(cfg, _model_config(cfg.model))
    assert fitted.max_model_len == 640
    assert any("capped at 640" in r.getMessage() for r in caplog.records)


def test_context_that_fits_is_left_alone(tiny_llama, caplog):
    caplog.set_level(logging.WARNING, logger="infersight.serve")
    cfg = EngineConfig(model=str(tiny_llama), num_kv_blocks=200, block_size=16)  # 3200 tokens >= 2048
    assert fit_context(cfg, _model_config(cfg.model)).max_model_len is None
    explicit = EngineConfig(model=str(tiny_llama), num_kv_blocks=40, block_size=16, max_model_len=640)
    assert fit_context(explicit, _model_config(explicit.model)).max_model_len == 640
    assert not [r for r in caplog.records if "capped" in r.getMessage()]


def test_explicit_context_beyond_the_kv_cache_is_refused(tiny_llama):
    cfg = EngineConfig(model=str(tiny_llama), kv_cache_memory_bytes=8192 * 40, max_model_len=1024)
    with pytest.raises(PreflightError) as e:
        fit_context(cfg, _model_config(cfg.model))
    msg = str(e.value)
    assert "holds 640 tokens" in msg and "--max-model-len to at most 640" in msg
    assert f"--kv-cache-memory-bytes to at least {8192 * 64}" in msg  # 1024 tokens = 64 blocks


def test_serve_exits_2_with_the_message(tiny_llama, capsys):
    args = _serve_args(tiny_llama, "--num-kv-blocks", "10", "--max-model-len", "1024")
    assert serve_cli.run(args) == 2
    assert "does not fit the KV cache" in capsys.readouterr().err


def test_vocabulary_checks():
    check_vocabulary(1000, 1000)
    check_vocabulary(151669, 151936)  # Qwen3: embedding padded past the tokenizer, served (with a warning)
    with pytest.raises(PreflightError, match="cannot be embedded"):
        check_vocabulary(1001, 1000)
    with pytest.raises(PreflightError, match="decode to ''"):
        check_vocabulary(32000, 128256)  # a Llama-2 tokenizer on a Llama-3 model


def test_preflight_refuses_another_models_tokenizer(tiny_model_factory, tiny_llama):
    wrong = tiny_model_factory("llama", vocab_size=4096, tokenizer_dir=str(tiny_llama))  # 492 tokens, 4096 rows
    with pytest.raises(PreflightError, match="covers"):
        preflight(EngineConfig(model=str(wrong)))
    assert preflight(EngineConfig(model=str(tiny_llama), num_kv_blocks=200)).max_model_len is None
