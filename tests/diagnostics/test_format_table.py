"""`infersight diagnose` prints summaries whole: wrapped to the terminal, one line each when piped / --wide."""

from __future__ import annotations

import io

from diagnostics.cli import table_width
from diagnostics.findings import Finding, format_table
from diagnostics.scope import Scope

LONG = ("replica r2 TTFT is 2.41x the fleet's (95% CI 2.10-2.77, per-request Mann-Whitney U vs r0,r1, "
        "Holm-corrected p=1e-12, n=100 vs 200, controlled for prompt length and workload)")


def _finding(summary=LONG):
    return Finding(kind="replica_latency", severity="warning", subject="r2", diagnostic="replicas",
                   summary=summary, scope=Scope())


def test_wrapped_to_the_width_with_nothing_cut():
    table = format_table([_finding()], width=100)
    lines = table.splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    assert len(lines) > 2  # header, the row, continuation lines
    assert " ".join(line.strip() for line in table.split("r2", 1)[1].splitlines()).split() == LONG.split()
    assert "…" not in table


def test_unwrapped_keeps_each_summary_on_its_row():
    lines = format_table([_finding(), _finding("short")]).splitlines()
    assert len(lines) == 3 and lines[1].endswith(LONG)


def test_width_follows_the_terminal_only_on_a_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert table_width(False, io.StringIO()) is None  # piped: full lines
    assert table_width(True, Tty()) is None  # --wide
    assert isinstance(table_width(False, Tty()), int)
