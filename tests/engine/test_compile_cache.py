"""Where compiled decode steps persist (engine/core/compile_cache.py), and that a decode graph is traced once:
a restarted trace is one whose first attempt misses the AOTAutograd cache at every start."""

from __future__ import annotations

import pytest
import torch

from engine.core import compile_cache


@pytest.fixture(autouse=True)
def _dynamo_config_restored():
    """use_persistent_compile_cache sets dynamo's config for the whole process: put it back after each test."""
    import torch._dynamo

    saved = torch._dynamo.config.specialize_float
    yield
    torch._dynamo.config.specialize_float = saved


def _fresh_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("INFERSIGHT_CACHE", str(tmp_path))


def test_the_caches_live_in_the_users_cache_directory_per_torch_version(monkeypatch, tmp_path):
    _fresh_environment(monkeypatch, tmp_path)
    chosen = compile_cache.use_persistent_compile_cache()
    assert chosen == str(tmp_path / "compile" / f"torch-{torch.__version__}")
    assert (tmp_path / "compile" / f"torch-{torch.__version__}").is_dir()


def test_a_directory_the_operator_chose_is_kept(monkeypatch, tmp_path):
    _fresh_environment(monkeypatch, tmp_path)
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "theirs"))
    assert compile_cache.use_persistent_compile_cache() == str(tmp_path / "theirs")


def test_torchs_own_default_in_the_variable_is_not_a_choice(monkeypatch, tmp_path):
    """Inductor writes its /tmp default into TORCHINDUCTOR_CACHE_DIR when first asked (importing torch._dynamo
    asks): a process that imported it before its first compile still gets the persistent directory."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    _fresh_environment(monkeypatch, tmp_path)
    monkeypatch.setenv(compile_cache.ENV, default_cache_dir())
    chosen = compile_cache.use_persistent_compile_cache()
    assert chosen == str(tmp_path / "compile" / f"torch-{torch.__version__}")
    assert cache_dir() == chosen  # where inductor's FX graph and AOTAutograd caches now read and write


def test_each_decode_graph_is_traced_and_lowered_once(tiny_llama, monkeypatch, tmp_path):
    """With float constants traced as inputs, dynamo ran AOTAutograd on a graph it then threw away and traced
    again (2 AOTAutograd runs for 1 graph). aot_eager: AOTAutograd without inductor's build."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import engine.core.model_runner as model_runner
    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams

    _fresh_environment(monkeypatch, tmp_path)
    compile_cache.use_persistent_compile_cache()  # what the runner calls before its first inductor compile
    monkeypatch.setattr(model_runner, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    # one step per schedule: the one-step function's graphs are counted (auto multi-step compiles its own too)
    llm = LLM(tiny_llama, compile_decode=True, block_size=4, num_kv_blocks=64, num_scheduler_steps=1)
    out = llm.generate([[5, 9, 17, 3], [7, 7, 1]],
                       [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)] * 2, use_tqdm=False)
    assert [len(o.token_ids) for o in out] == [6, 6]
    assert llm.engine.runner._compiled is not None  # decode steps took the compiled path
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert counters["aot_autograd"]["total"] == 1, dict(counters["aot_autograd"])
    torch._dynamo.reset()
