"""The dashboard as people use it: `infersight dashboard --store DIR` (a sidecar on the directory,
Streamlit over its read-only user) visited page by page in a real headless Chromium (Debian's
/usr/bin/chromium driven by Playwright). Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import os
import re
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

# page title (its sidebar link and heading) -> texts that only show once the page rendered its
# content from the store
PAGES = {
    "Fleet": ["Replicas: identity and placement", "NUMA mismatch", "Latency percentiles per replica over time"],
    "Requests": ["Steps it took part in", "Per-token timing", "Output tokens"],
    "Compare": ["Regression verdict", "B (candidate)", re.compile("no significant regression|no regression")],
    "Scheduler": ["Step timeline", "Host overhead", "Latest steps"],
    "KV cache": ["Per replica", "Prefix cache hit rate"],
    "Evals": ["first diverge at output token", "Per-item drift", "Baseline accuracy"],
    "Findings": ["same prompt, different token IDs on r0 and r2", "Token IDs in the evidence"],
    "Profiles": ["Flame graph", "distinct stacks, 1,000 samples"],
}

pytestmark = pytest.mark.slow
TIMEOUT_MS = 300_000  # generous: first visits import scipy / torch, and CI machines are small and shared
VIEWPORT = {"width": 1400, "height": 1000}


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory, tokenizer_dir):
    """A seeded data directory served by `infersight dashboard` (which starts its own sidecar)."""
    from dashboard_seed import seed
    from tokenizers import Tokenizer

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
        [sys.executable, "-m", "dashboards.console.cli", "dashboard", "--store", str(directory), "--port", str(port),
         "--model", str(tokenizer_dir)],
        stdout=log, stderr=subprocess.STDOUT)  # same process group: Ctrl-C or a killed job reaches it
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
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
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def app_page(tmp_path_factory, dashboard_url):
    """One tab on the dashboard; the tests move through the pages with the sidebar, as a person
    does (one session, the app's JavaScript loaded once)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run .ci/setup (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium_profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport=VIEWPORT)
        try:
            page = context.new_page()
            page.goto(dashboard_url, wait_until="domcontentloaded")
            page.get_by_role("heading", name="Fleet", exact=True).first.wait_for(timeout=TIMEOUT_MS)
            yield page
        finally:
            context.close()


@pytest.mark.parametrize("title", list(PAGES))
def test_page_renders_its_content(app_page, title):
    page, name = app_page, title.lower().replace(" ", "_")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(VIEWPORT)
    try:
        page.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click(timeout=TIMEOUT_MS)
        page.get_by_role("heading", name=title, exact=True).first.wait_for(timeout=TIMEOUT_MS)
        for text in PAGES[title]:
            page.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=TIMEOUT_MS)
        if title == "Compare":  # and a person's next step: compare the two versions instead
            page.get_by_text("engine version", exact=True).click(timeout=TIMEOUT_MS)
            page.get_by_text("time to first token regression", exact=False).first.wait_for(timeout=TIMEOUT_MS)
        # every element has replaced its skeleton (the script has sent everything)
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0",
                               timeout=TIMEOUT_MS)
        assert page.locator('[data-testid="stException"]').count() == 0
        # the app scrolls inside its main container: grow the viewport to show all of it
        height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
        page.set_viewport_size({"width": VIEWPORT["width"], "height": min(int(height) + 50, 8000)})
        page.wait_for_timeout(1000)  # plotly redraws at the new size
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
    except Exception:
        page.screenshot(path=str(SCREENSHOTS / f"{name}-failed.png"))
        raise
