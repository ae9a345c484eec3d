"""py-spy on a real engine process: folded stacks parsed, grouped by engine phase, stored, reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dashboards.console import cli
from diagnostics import profile, pyspy
from diagnostics.stack_groups import classify_stack, is_idle, parse_frame, parse_stack
from telemetry.store import open_store

E = "/work/engine"  # any prefix: classification looks at the path's package part
C, S = f"{E}/core", f"{E}/serving"

STACKS = {
    f"<module> (serve.py:1);_loop ({C}/async_engine.py:140);step ({C}/engine.py:199);prepare ({C}/model_runner.py:60);"
    f"build ({C}/attention/torch_backend.py:30)": "input_preparation",
    f"step ({C}/engine.py:201);forward ({C}/model_runner.py:90);forward ({C}/models/llama.py:80);"
    f"_call_impl (/venv/torch/nn/modules/module.py:1700)": "forward",
    f"step ({C}/engine.py:204);__call__ ({C}/sampler.py:45);_sample ({C}/sampler.py:60)": "sampling",
    f"step ({C}/engine.py:185);schedule ({C}/scheduler.py:90);allocate ({C}/kv_cache.py:50)": "scheduler",
    f"step ({C}/engine.py:216);_report_step ({C}/engine.py:380);on_step (/x/telemetry/recorder.py:90)": "telemetry",
    "run (/usr/lib/python3.11/threading.py:975);_flush (/x/telemetry/recorder.py:200);"
    "insert (/venv/clickhouse_connect/driver/client.py:10)": "telemetry",
    f"step ({C}/engine.py:212);_postprocess ({C}/engine.py:240);step ({C}/detokenizer.py:30)": "other",
    "run (/venv/uvicorn/server.py:60);app (/venv/starlette/routing.py:70);"
    f"chat ({S}/server/app.py:120);encode ({C}/tokenization.py:90)": "server",
    "<module> (script.py:1);helper (script.py:5)": "other",
}


@pytest.mark.parametrize("stack,group", list(STACKS.items()))
def test_stack_groups(stack, group):
    stack = stack.replace(E, "/work/main/engine")
    assert classify_stack(stack) == group


def test_waiting_threads_are_left_out_and_working_ones_kept():
    loop = "run (uvicorn/server.py:60);BaseEventLoop._run_once (asyncio/base_events.py:1884)"
    assert is_idle(parse_stack(loop + ";EpollSelector.select (selectors.py:468)"))
    assert is_idle(parse_stack("Thread.run (threading.py:982);Condition.wait (threading.py:327)"))
    assert not is_idle(parse_stack(loop + ";BaseSelectorEventLoop._write_to_self (asyncio/selector_events.py:139)"))
    assert not is_idle(parse_stack("step (engine/core/engine.py:1);forward (engine/core/models/llama.py:30)"))
    records, idle = profile.profile_records({loop + ";EpollSelector.select (selectors.py:468)": 7,
                                             "step (engine/core/engine.py:1);forward (engine/core/models/llama.py:30)": 3},
                                            "r", 1, 0.0, 1.0)
    assert idle == 7 and [(r.group, r.samples) for r in records] == [("forward", 3)]


def test_frame_parsing_and_folded_lines():
    f = parse_frame("forward (/a/b/engine/core/models/llama.py:80)")
    assert (f.function, f.file, f.line, f.path) == ("forward", "/a/b/engine/core/models/llama.py", 80,
                                                    "/a/b/engine/core/models/llama.py")
    assert parse_frame("<native frame>").function == "<native frame>"
    stacks = pyspy.parse_folded("a (x.py:1);b (x.py:2) 7\nbroken line\na (x.py:1) 3\na (x.py:1) 2\n")
    assert stacks == {"a (x.py:1);b (x.py:2)": 7, "a (x.py:1)": 5}


@pytest.fixture
def engine_process(tiny_llama):
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("engine_loop.py")), str(tiny_llama)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.strip() == "ready":
                break
        else:
            pytest.fail(f"the engine process exited ({proc.wait()})")
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_profile_a_running_engine_and_store_it(engine_process, tmp_path, capsys):
    store_dir = tmp_path / "store"
    code = cli.main(["profile", "--replica", "loop", "--pid", str(engine_process.pid), "--seconds", "3",
                     "--store", str(store_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "forward" in out and "stored profile" in out
    with open_store(store_dir) as store:
        rows = store.query_df("SELECT stack, samples, `group`, replica_id, pid FROM profiles").to_dict("records")
    assert rows and {r["replica_id"] for r in rows} == {"loop"} and {r["pid"] for r in rows} == {engine_process.pid}
    by_group: dict[str, int] = {}
    for r in rows:
        assert r["group"] == classify_stack(r["stack"])
        by_group[r["group"]] = by_group.get(r["group"], 0) + r["samples"]
    # a busy engine: the forward pass and the host-side phases all show up in 3 s of samples
    assert by_group.get("forward", 0) > 0.2 * sum(by_group.values())
    assert {"forward", "scheduler", "input_preparation"} <= set(by_group)
    # py-spy names files relative to sys.path ("engine/core/models/llama.py") and qualifies methods
    assert any("ModelRunner.forward (engine/core/model_runner.py" in r["stack"] for r in rows)
    top = profile.top_functions([profile.ProfileRecord("p", "loop", 1, 0, 3, r["stack"], r["samples"], r["group"])
                                 for r in rows])
    assert top["forward"]["top"][0]["samples"] <= top["forward"]["samples"]


def test_profile_target_errors_are_clear(capsys):
    assert cli.main(["profile", "--replica", "r1", "--seconds", "1"]) == 1
    assert "give --pid, --run-dir" in capsys.readouterr().err
    assert cli.main(["profile", "--replica", "r1", "--pid", "999999999", "--seconds", "1"]) == 1
    assert "is not running" in capsys.readouterr().err
