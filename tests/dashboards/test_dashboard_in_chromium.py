"""The dashboard as people use it: `infersight dashboard --store DIR` (a sidecar on the directory,
Streamlit over its read-only user) visited page by page in a real headless Chromium (Debian's
/usr/bin/chromium driven by Playwright). Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import free_port

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# page path -> texts that only show when the page rendered its content from the store
PAGES = {
    "": ["Replicas: identity and placement", "NUMA mismatch", "Latency percentiles per replica over time"],
    "requests": ["Steps it took part in", "Per-token timing", "Prompt"],
    "compare": ["Regression verdict", "Identity", "B (candidate)"],
    "scheduler": ["Step timeline", "Host overhead", "Latest steps"],
    "kv_cache": ["Per replica", "Prefix cache hit rate"],
    "evals": ["first diverge at output token", "Per-item drift", "Baseline accuracy"],
    "findings": ["same prompt, different token IDs on r0 and r2", "Token IDs in the evidence"],
    "profiles": ["Flame graph", "distinct stacks, 1,000 samples"],
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory, tokenizer_dir):
    """A seeded data directory served by `infersight dashboard` (which starts its own sidecar)."""
    from tokenizers import Tokenizer

    from dashboard_seed import seed
    from telemetry.schema import migrate
    from telemetry.store import open_store

    directory = tmp_path_factory.mktemp("browser_store")
    store = open_store(directory)
    try:
        migrate(store)
        seed(store, Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")))
    finally:
        store.close()  # release the directory: the dashboard's sidecar takes it
    port = free_port()
    log_path = directory.parent / "dashboard.log"
    log = open(log_path, "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "dashboard", "--store", str(directory), "--port", str(port),
         "--model", str(tokenizer_dir)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the dashboard did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)  # the CLI stops Streamlit and its sidecar
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run .ci/setup (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium_profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()


@pytest.mark.parametrize("path", list(PAGES), ids=lambda p: p or "fleet")
def test_page_renders_its_content(dashboard_url, browser, path):
    page = browser.new_page()
    try:
        page.goto(f"{dashboard_url}/{path}", wait_until="domcontentloaded")
        for text in PAGES[path]:
            page.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=90_000)
        # the script has finished (no "Running" status) and every element has replaced its skeleton
        page.wait_for_selector('[data-testid="stStatusWidgetRunningIcon"]', state="detached", timeout=90_000)
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0",
                               timeout=90_000)
        assert page.locator('[data-testid="stException"]').count() == 0
        # the app scrolls inside its main container: grow the viewport to show all of it
        height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
        page.set_viewport_size({"width": 1400, "height": min(int(height) + 50, 8000)})
        page.wait_for_timeout(1000)  # plotly redraws at the new size
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{path or 'fleet'}.png"))
    finally:
        page.close()

