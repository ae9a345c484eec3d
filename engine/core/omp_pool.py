"""Free the calling thread's OpenMP pool: for a thread that ran torch's parallel work and hands the steps to
another thread.

torch's CPU ops run their parallel regions on an OpenMP pool that belongs to the thread that ran them. A
served replica loads its model in one thread and steps in another (`infersight-engine`,
engine/core/async_engine.py), so the loading thread's pool stays behind, idle. Once libgomp manages more
threads than there are CPUs it throttles its spin-wait, and every short parallel region of the stepping
thread pays a wake-up: on a 2-core machine, decode steps ran at 0.49x (reference model) and 0.59x (135M)
the speed of the same steps in the loading thread, and 0.88x and 0.97x with the idle pool freed
(`python -m engine.benchmarks.second_thread [--free-idle-pool]`). A freed pool is made again if the
thread runs parallel work later.
"""

from __future__ import annotations

import ctypes
import os

OMP_PAUSE_SOFT = 1  # OpenMP 5.0: release the pool's threads, keep the settings


def free_this_threads_pool() -> bool:
    """Release the calling thread's OpenMP pool; False where torch brings no libgomp of its own (another
    OpenMP runtime, or none) or the runtime refused."""
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    if not os.path.exists(path):
        return False
    try:
        pause = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):  # a libgomp older than OpenMP 5.0
        return False
    return pause(OMP_PAUSE_SOFT) == 0
