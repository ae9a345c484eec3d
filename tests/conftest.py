"""Shared fixtures: small random-weight models of real architectures, built once per session."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# replicas started by tests without --spool-dir spool under $XDG_STATE_HOME: a directory of this
# run's own, so a run cut short never leaves spool files that a later run would replay
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="infersight-test-state-")
# engines (and the replicas tests start) run eager unless a test asks for compile_decode: a compiled engine builds
# its graphs at start, seconds to minutes of CPU each on this machine, and most tests build many engines
os.environ["INFERSIGHT_COMPILE_DECODE"] = "0"


def pytest_configure(config):
    # One torch thread in the test process: on this 2-core shared machine two threads made
    # small linears ~35x slower under load. Benchmarks, not tests, measure threading.
    import torch

    torch.set_num_threads(1)
    # a test that asks for compile_decode compiles each graph on the request path, the first time a step meets
    # its shape, so what it asserts about the graphs a run compiled does not race a build thread; the build off
    # the request path has tests of its own (tests/engine/test_compile_warmup.py)
    from engine.core import model_runner

    model_runner.BACKGROUND_COMPILE = False


def pytest_collection_modifyitems(config, items):
    # the parallel run keeps every vLLM test on one worker by its directory (tests/worker_scheduling.py)
    from worker_scheduling import VLLM_DIRS

    astray = [item.nodeid for item in items
              if item.get_closest_marker("vllm") and not item.nodeid.startswith(VLLM_DIRS)]
    if astray:
        raise pytest.UsageError(f"tests marked vllm belong under {' or '.join(VLLM_DIRS)}: {astray[:3]}")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown to a pytest without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadscope":
        from worker_scheduling import ModulesAndVllm

        return ModulesAndVllm(config, log)
    return None


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """`factory(arch="llama", **overrides) -> Path`: a saved random model, cached per arguments."""
    from engine.core.tiny_model import build_random_model

    cache: dict = {}

    def factory(arch: str = "llama", **overrides):
        key = (arch, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny_{arch}")
            cache[key] = build_random_model(out, arch, **overrides)
        return cache[key]

    return factory


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def migrated_store_dir(tmp_path_factory):
    """A closed embedded store with every migration applied, built once: migrating costs seconds per
    store (a DDL statement at a time), so each store the tests need starts as a copy of this one."""
    from telemetry.schema import migrate
    from telemetry.store import open_store

    path = tmp_path_factory.mktemp("migrated_store")
    with open_store(path) as s:
        migrate(s)
    return path


@pytest.fixture(scope="session")
def migrated_copy(migrated_store_dir):
    """`migrated_copy(directory) -> directory`: a store's data directory made a copy of the migrated one
    (an embedded store or a sidecar then opens it with nothing left to apply)."""
    import shutil

    def copy(directory):
        # the data directory links tables to their parts by relative symlinks: copied as links
        shutil.copytree(migrated_store_dir, directory, symlinks=True, dirs_exist_ok=True)
        return directory

    return copy


@pytest.fixture(scope="module")
def store(tmp_path_factory, migrated_copy):
    """A migrated embedded store per test module (chdb holds one data directory per process at a
    time, so a module's store is closed before the next module opens its own)."""
    from telemetry.store import open_store

    s = open_store(migrated_copy(tmp_path_factory.mktemp("store")))
    yield s
    s.close()


@pytest.fixture(scope="session")
def served_replica():
    """`with served_replica(model, replica_id, store, **engine) as (url, parts)`: one replica in this
    process as `infersight serve` assembles it (engine, app, recorder), its telemetry into `store`."""
    import contextlib
    import time
    from pathlib import Path

    @contextlib.contextmanager
    def serve(model, replica_id: str, store, **engine):
        from engine.core.async_engine import AsyncLLM
        from engine.core.config import EngineConfig
        from engine.serving.server.app import build_app
        from engine.serving.server.background import BackgroundServer
        from engine.serving.server.model_info import ServedModel
        from telemetry.replica_wiring import build_observer

        # small defaults; a caller's engine options win (a model with a shorter context passes its own)
        config = EngineConfig(**{"max_model_len": 512, "num_kv_blocks": 96, "block_size": 16, "max_num_seqs": 8,
                                 **engine, "model": str(model), "replica_id": replica_id})
        observer, parts = build_observer(replica_id, Path(model).name, store_target=store, metrics=False)
        served = ServedModel.from_engine(AsyncLLM(config, observer), created=int(time.time()))
        try:
            with BackgroundServer(build_app(served)) as server:
                yield server.url, parts
        finally:
            parts.close()

    return serve
