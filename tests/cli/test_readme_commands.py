"""The README names files that exist and lists every `bench` benchmark."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gate_example_files_exist():
    readme = (ROOT / "README.md").read_text()
    for line in readme.splitlines():
        if "eval gate" in line:
            for path in re.findall(r"--(?:baseline|candidate|policy) (\S+\.toml)", line):
                assert (ROOT / path).is_file(), path


def test_every_benchmark_is_in_the_readme():
    from dashboards.console.bench_cli import BENCHMARKS

    readme = (ROOT / "README.md").read_text()
    for name in BENCHMARKS:
        assert f"bench {name}" in readme or f"\\|{name}" in readme, name
