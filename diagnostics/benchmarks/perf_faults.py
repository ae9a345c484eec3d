"""The faults the performance and quality rules must catch from sampled, load-balanced traffic alone.

Each is deployed the ordinary way (an engine option, a file at the model's path, a neighbour on the
candidate's CPU) and run by diagnostics.benchmarks.fault_matrix with `--matrix perf`: no prober, no
broadcast, loadgen's default mix; identity findings still run, but a fault counts as caught only
by one of its `detectors` here, the rules that compare the same work at the same unit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from diagnostics.benchmarks.model_faults import noisy_weights
from engine.core.model_refs import REFERENCE_MODEL

DRAFT_MODEL = REFERENCE_MODEL.parent / "draft"
SPECULATIVE = {"speculative_mode": "draft", "num_speculative_tokens": 4}
NEIGHBOUR_CPU = 1  # the CPU the starved candidate is pinned to, beside a busy loop


@contextmanager
def busy_neighbour(cpu: int = NEIGHBOUR_CPU):
    """A process spinning on `cpu` for as long as the block runs (bounded: it is killed on exit)."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    spinner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


# The reference draft (DRAFT_MODEL, a random model of its own) guesses the target's tokens almost never:
# 0 of 928 drafted tokens accepted on the matrix's served traffic, so no damage to it can show. The good
# draft is the served checkpoint itself (74% accepted, in-process, sampled at 0.8, k 4); the damaged one a
# copy of it with 50% weight noise (17%; 100% noise: 6%).
DRAFT_NOISE = 0.5


def damaged_draft(work: Path, model: Path, relative: float = DRAFT_NOISE) -> str:
    """A copy of the served checkpoint `model` with weight noise (a corrupted draft checkpoint): it
    still runs, its guesses match the target's far less often."""
    import shutil

    path = work / "damaged_draft"
    shutil.copytree(model, path)
    noisy_weights(path, relative=relative, seed=1)
    return str(path)


def good_draft(model: Path) -> str:
    """The served checkpoint as its own draft: the best-matched draft there is."""
    return str(model)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))
