"""Sample a running process with py-spy and read what it wrote (folded stacks, "root;...;leaf COUNT").

`py-spy record --format raw --nonblocking` samples without pausing the process (the engine keeps
serving at full speed; a sample may now and then be torn). It needs ptrace rights over the target:
root, the same user with kernel.yama.ptrace_scope <= 1, or CAP_SYS_PTRACE in a container.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path


class ProfileError(RuntimeError):
    pass


def py_spy_binary() -> str:
    """py-spy next to this Python (the venv's), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    if here.is_file():
        return str(here)
    found = shutil.which("py-spy")
    if not found:
        raise ProfileError("py-spy is not installed (pip install py-spy)")
    return found


def parse_folded(text: str) -> Counter:
    """Folded stacks -> Counter(stack -> samples); malformed lines are skipped."""
    stacks: Counter = Counter()
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


def record(pid: int, seconds: float, rate: int = 100, native: bool = False, timeout_margin: float = 30.0) -> Counter:
    """Sample `pid` for `seconds` at `rate` Hz; returns Counter(folded stack -> samples)."""
    with tempfile.TemporaryDirectory(prefix="infersight-pyspy-") as tmp:
        out = Path(tmp) / "stacks.txt"
        cmd = [py_spy_binary(), "record", "--format", "raw", "--pid", str(pid),
               "--duration", str(max(1, round(seconds))), "--rate", str(rate), "--nonblocking", "--output", str(out)]
        if native:
            cmd.append("--native")
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + timeout_margin)
        except subprocess.TimeoutExpired:
            raise ProfileError(f"py-spy did not finish within {seconds + timeout_margin:.0f} s") from None
        if result.returncode != 0 or not out.is_file():
            detail = (result.stderr or result.stdout).strip().splitlines()
            hint = ""
            text = " ".join(detail).lower()
            if "permission" in text or "operation not permitted" in text:
                hint = (" (py-spy needs ptrace rights over the process: run as root or as its user with "
                        "kernel.yama.ptrace_scope <= 1, or add CAP_SYS_PTRACE to the container)")
            raise ProfileError(f"py-spy failed on pid {pid} (exit {result.returncode}): "
                               f"{' '.join(detail[-3:]) or 'no output'}{hint}")
        return parse_folded(out.read_text(errors="replace"))
