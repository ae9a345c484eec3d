"""The dashboard as people use it: `infersight dashboard --store DIR` (a sidecar on the directory,
Streamlit over its read-only user) visited page by page in a real headless Chromium (Debian's
/usr/bin/chromium driven by Playwright). Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import free_port
from dashboard_process import running_dashboard

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
    # the finding's one-line heading (its summary is also a table cell, which the grid may draw hidden first)
    "Findings": ["tokenizer divergence · r0 vs r2", "first divergent position"],
    "Profiles": ["Flame graph", "distinct stacks, 1,000 samples"],
}

pytestmark = pytest.mark.slow
TIMEOUT_MS = 300_000  # generous: first visits import scipy / torch, and CI machines are small and shared
VIEWPORT = {"width": 1400, "height": 1000}


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory, tokenizer_dir, migrated_copy):
    """A seeded data directory served by `infersight dashboard` (which starts its own sidecar)."""
    from dashboard_seed import seed
    from tokenizers import Tokenizer

    from telemetry.store import open_store

    directory = migrated_copy(tmp_path_factory.mktemp("browser_store"))
    store = open_store(directory)
    try:
        seed(store, Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")))
    finally:
        store.close()  # release the directory: the dashboard's sidecar takes it
    port = free_port()
    command = [sys.executable, "-m", "dashboards.console.cli", "dashboard", "--store", str(directory), "--port",
               str(port), "--model", str(tokenizer_dir)]
    with running_dashboard(command, port, directory.parent / "dashboard.log") as url:
        yield url


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
        page.wait_for_timeout(1000)  # plotly redraws at the new size, the grids draw their cells
        assert_reads_well(page, title)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
    except Exception:
        page.screenshot(path=str(SCREENSHOTS / f"{name}-failed.png"))
        raise


EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B50\u2B55\uFE0F]")
# the text of every table cell the data grid drew (its accessible table mirrors the canvas)
CELLS_JS = """Array.from(document.querySelectorAll('[data-testid="stDataFrame"] [role="gridcell"], '
    + '[data-testid="stDataFrame"] td')).map(c => c.innerText.trim())"""
RAW_JSON_OUTSIDE_EXPANDERS_JS = """Array.from(document.querySelectorAll('[data-testid="stJson"]'))
    .filter(j => !j.closest('[data-testid="stExpander"]')).length"""


def assert_reads_well(page, where: str) -> None:
    """No emoji (boxes without an emoji font), no "None" cells, no JSON tree outside an expander,
    no Deploy button."""
    text = page.evaluate("document.querySelector('[data-testid=\"stApp\"]').innerText")
    assert not EMOJI.findall(text), f"{where}: emoji {EMOJI.findall(text)[:5]}"
    cells = page.evaluate(CELLS_JS)
    if page.locator('[data-testid="stDataFrame"]').count():
        assert cells, f"{where}: no table cell found (the grid's accessible table moved?)"
    # the accessible table has "" where the canvas draws "None": a missing value must show as "-"
    assert "None" not in cells and "" not in cells, f"{where}: a table cell shows None"
    assert page.evaluate(RAW_JSON_OUTSIDE_EXPANDERS_JS) == 0, f"{where}: raw JSON outside an expander"
    assert page.locator('[data-testid="stAppDeployButton"]').count() == 0, "the Deploy button shows"


# finding id -> its view family and a text only that view shows
FINDING_VIEWS = {
    "f-tok": ("tokens", "first divergent position"),
    "f-lag": ("lagging", "How this replica differs from its peers"),
    "f-cp": ("regression", "Before against after"),
    "f-gap": ("table", "Evidence"),
    "f-new": ("table", "Evidence"),
}


@pytest.mark.parametrize("finding_id", list(FINDING_VIEWS))
def test_each_finding_family_renders_its_view(app_page, dashboard_url, finding_id):
    page, (family, text) = app_page, FINDING_VIEWS[finding_id]
    page.set_viewport_size(VIEWPORT)
    try:
        page.goto(f"{dashboard_url}/findings?finding={finding_id}", wait_until="domcontentloaded")
        page.locator(f'[data-testid="finding-view"][data-family="{family}"]').first.wait_for(
            state="attached", timeout=TIMEOUT_MS)
        page.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=TIMEOUT_MS)
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stSkeleton\"]').length === 0",
                               timeout=TIMEOUT_MS)
        if family != "table":  # the views with a chart draw it
            page.locator('[data-testid="stPlotlyChart"], [data-testid="token-row"]').first.wait_for(timeout=TIMEOUT_MS)
        assert page.locator('[data-testid="stException"]').count() == 0
        height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
        page.set_viewport_size({"width": VIEWPORT["width"], "height": min(int(height) + 50, 8000)})
        page.wait_for_timeout(1000)
        assert_reads_well(page, finding_id)
        page.screenshot(path=str(SCREENSHOTS / f"finding_{family}_{finding_id}.png"))
    except Exception:
        page.screenshot(path=str(SCREENSHOTS / f"finding_{finding_id}-failed.png"))
        raise
