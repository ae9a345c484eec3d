"""The repository is self-contained: no tracked file sends its reader to a document outside it (a design
page beside the checkout, a helpers folder) that a user of the project does not have."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# written in pieces, so that this file does not match itself
OUTSIDE = ["..", "/shared"], ["shared/", "DESIGN"], [".help", "ers/"]
ALLOWED = {".gitignore"}  # it keeps such folders out of the repository


def _tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / n for n in names.decode().split("\0") if n and n not in ALLOWED]


def test_no_tracked_file_references_outside_the_repository():
    patterns = ["".join(parts) for parts in OUTSIDE]
    offenders = []
    for path in _tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # binary files (weights), submodules, files deleted in the work tree
        for lineno, line in enumerate(text.splitlines(), 1):
            offenders += [f"{path.relative_to(ROOT)}:{lineno}: {p}" for p in patterns if p in line]
    assert not offenders, "\n".join(offenders)


def test_the_design_is_in_the_repository():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for document in ("telemetry/CONTRACT.md", "telemetry/METRICS.md", "diagnostics/README.md", "dashboards/README.md",
                     "evals/README.md"):
        assert (ROOT / document).is_file(), document
        assert document in readme, f"README.md does not point to {document}"
