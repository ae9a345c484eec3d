"""`infersight demo`, short: a report with a row per replica from the store, the canary's fault caught, and no
process left behind."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from engine.fleet.processes import infersight_command


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_short_demo_reports_per_replica_and_cleans_up(tiny_llama, tmp_path):
    run_dir = tmp_path / "demo"
    r = subprocess.run(infersight_command("demo", "--duration", "6", "--replicas", "2", "--rate", "3",
                                          "--model", str(tiny_llama), "--run-dir", str(run_dir)),
                       capture_output=True, text=True, timeout=400)
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
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
    assert "infersight dashboard --store" in out
    assert _processes_mentioning(str(run_dir)) == []
    assert not (run_dir / "state.json").exists()
