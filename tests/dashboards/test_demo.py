"""`infersight demo`, short: a report with a row per replica from the store, the canary's fault caught, no
process left behind, and a dashboard command that works as printed: its Requests page decodes the token IDs
with the tokenizer each replica recorded (no --model given)."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from dashboard_process import running_dashboard

from dashboards.console.demo import canary_port
from dashboards.console.demo_fault import canary_fleet
from engine.serving.processes import infersight_command
from engine.util import free_port
from tests.fleet.test_fleet_live import processes_mentioning


@pytest.fixture(scope="module")
def demo_run(tiny_llama, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("demo_run") / "demo"
    r = subprocess.run(infersight_command("demo", "--duration", "6", "--replicas", "2", "--rate", "3",
                                          "--model", str(tiny_llama), "--run-dir", str(run_dir)),
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout, run_dir


@pytest.mark.slow
def test_short_demo_reports_per_replica_and_cleans_up(demo_run):
    out, run_dir = demo_run
    report = out[out.index("per replica (from the store"):]
    rows = {line.split()[0]: line.split() for line in report.splitlines()[3:] if re.match(r"^r\d ", line)}
    assert set(rows) == {"r0", "r1"}
    assert all(int(row[1]) > 0 for row in rows.values())  # requests per replica, from the store
    held = re.search(r"the store holds (\d+) of the (\d+) requests sent", out)
    assert held and held.group(1) == held.group(2)
    # act two: the canary on a lowercasing tokenizer is named above info, and the probes' answers are shown
    assert "probe answers (greedy, decoded from the stored token IDs)" in out
    loud = out[out.index("findings above info"):out.index("open the dashboard")]
    subjects = [line.split()[3] for line in loud.splitlines() if re.match(r"^(warning|critical) ", line)]
    assert subjects and set(subjects) == {"canary"}, loud  # the healthy replicas are never the subject
    assert " dashboard --store " in out
    assert processes_mentioning(str(run_dir)) == []
    assert not (run_dir / "state.json").exists()


def _printed_dashboard_command(out: str) -> list[str]:
    after = out[out.index("open the dashboard on what was recorded with"):].splitlines()[1]
    return shlex.split(after.strip())


def _decoded_prompts(store_dir: str, model: Path) -> set[str]:
    """Every stored prompt as the Requests page shows it with the right tokenizer (the canary's lowercasing
    copy decodes the same IDs to the same text)."""
    from dashboards.tokens import visible
    from engine.core.tokenization import Tokenizer
    from telemetry.store import open_store

    tokenizer = Tokenizer(model)
    with open_store(store_dir) as store:
        rows = store.query_df("SELECT prompt_token_ids FROM requests")
    return {visible(tokenizer.decode(list(ids), skip_special_tokens=False)) for ids in rows["prompt_token_ids"]}


@pytest.mark.slow
def test_printed_dashboard_command_decodes_tokens_in_chromium(demo_run, tiny_llama, tmp_path):
    from test_dashboard_in_chromium import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, VIEWPORT

    out, _ = demo_run
    command = _printed_dashboard_command(out)
    assert "--model" not in command and "--tokenizer" not in command
    store_dir = command[command.index("--store") + 1]
    assert Path(store_dir).is_absolute()
    expected = _decoded_prompts(store_dir, tiny_llama)
    port = free_port()  # the one addition: the default port may be taken on a shared machine
    with running_dashboard([*command, "--port", str(port)], port, tmp_path / "dashboard.log") as url:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport=VIEWPORT)
            try:
                page = context.new_page()
                page.goto(f"{url}/requests", wait_until="domcontentloaded")
                page.get_by_text("Steps it took part in", exact=False).first.wait_for(timeout=TIMEOUT_MS)
                page.wait_for_function("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0",
                                       timeout=TIMEOUT_MS)
                assert page.get_by_text("No tokenizer for replica", exact=False).count() == 0
                shown = page.locator('[data-testid="stCode"] code').first.inner_text(timeout=TIMEOUT_MS).strip()
            finally:
                context.close()
    # the prompt panel's text is the selected request's prompt decoded with its replica's tokenizer
    assert shown in {p.strip() for p in expected}, shown[:200]


def test_demo_canary_listens_after_the_base_ports(tmp_path, tiny_llama):
    args = argparse.Namespace(base_port=9100, replicas=2)
    assert canary_port(args) == 9102
    assert canary_port(argparse.Namespace(base_port=0, replicas=2)) == 0  # free ports
    config = canary_fleet("none", tiny_llama, tmp_path, "http://127.0.0.1:1", {}, "0", "127.0.0.1",
                          port=canary_port(args))
    assert [r.port for r in config.replicas] == [9102]
