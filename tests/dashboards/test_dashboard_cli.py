"""`infersight dashboard`: argument checks and the one-process-per-directory rule (the happy path,
a sidecar on the directory with Streamlit over its read-only user, runs in the browser test)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dashboards import cli


def dashboard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dashboards.console.cli", "dashboard", *args], capture_output=True,
                          text=True, timeout=120)


def test_tokenizer_arguments(tokenizer_dir, tmp_path):
    assert cli.tokenizers(str(tokenizer_dir), []) == {"*": str(tokenizer_dir.resolve())}
    assert cli.tokenizers(None, [f"m1={tokenizer_dir}"]) == {"m1": str(tokenizer_dir.resolve())}
    with pytest.raises(ValueError, match="MODEL=DIR"):
        cli.tokenizers(None, ["no-equals-sign"])
    with pytest.raises(ValueError, match="no tokenizer.json"):
        cli.tokenizers(str(tmp_path), [])


def test_missing_directory_is_a_clear_error(tmp_path):
    result = dashboard("--store", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "no store at" in result.stderr


def test_a_directory_held_by_another_process_asks_for_its_url(seeded):
    store, _ = seeded  # this test process holds the directory, as a sidecar would
    assert cli.directory_holder(store.path) is None  # our own lock is re-entrant
    result = dashboard("--store", store.path)
    assert result.returncode == 2
    assert f"in use by pid {os.getpid()}" in result.stderr and "--store http://" in result.stderr


def test_streamlit_command_is_headless_on_the_given_address():
    command = cli.streamlit_command("127.0.0.1", 8599)
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4].endswith("dashboards/app.py")
    assert command[command.index("--server.address") + 1] == "127.0.0.1"
    assert command[command.index("--server.headless") + 1] == "true"


def test_the_dashboard_reads_through_read_only_sessions(seeded):
    """Even a statement that slipped past the allow-list could not write: the embedded store's
    sessions the dashboard uses are read-only (over HTTP, the sidecar's read-only user is)."""
    from dashboards import data
    from telemetry.store import StoreError

    store, _ = seeded
    data.use_store(store)
    try:
        assert int(data._run("SELECT count() AS n FROM findings", None)["n"][0]) > 0
        with pytest.raises(StoreError, match="(?i)readonly"):
            data._run("INSERT INTO findings (finding_id) VALUES ('x')", None)
    finally:
        data.use_store(None)
