"""Triton kept out of a process that has no accelerator: it can run nothing there, yet costs ~65 MiB of RSS.

Importing torch._dynamo probes for the triton package (torch/utils/_triton.py `has_triton_package`, at
import of torch/_dynamo/utils.py) and, when it is installed, imports it: its shared library alone is
~65 MiB resident. xgrammar depends on triton, so it is installed wherever the engine is. Triton compiles
GPU kernels; on a machine without an accelerator inductor generates C++ for the CPU (its default CPU
backend) and never calls triton. A compiled CPU replica only paid for the import.

Marking the package absent (`sys.modules["triton"] = None`: every later `import triton` raises
ImportError, which torch's probes and xgrammar's CUDA-only kernel path read as "not installed") must
happen before torch._dynamo is first imported: `keep_triton_out` is called first thing where the engine
starts the compiler (model_runner.py `_compile`). A process that imported triton already keeps it.
Inductor's FX graph cache keys on triton's version (None here), so graphs a process built with triton
loaded are not read by one without it: one first start, then restarts hit as before.
"""

from __future__ import annotations

import sys

import torch


def keep_triton_out() -> bool:
    """Mark triton absent unless an accelerator is available or triton is imported already; True if it is
    kept out of this process from now on."""
    if "triton" in sys.modules:
        return sys.modules["triton"] is None
    if torch.accelerator.is_available():  # CUDA, ROCm, XPU...: inductor's kernels there are triton's
        return False
    sys.modules["triton"] = None
    return True
