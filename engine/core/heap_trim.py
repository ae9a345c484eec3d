"""Give the heap's free pages back to the OS after the two moments a replica frees much at once.

glibc's malloc keeps what Python and torch free in its arenas (one per thread that allocated: the loading
thread, the compile-decode build thread) and returns only the free top of each heap. Loading a model
(reading files, packing weights, freeing the plain copies) and building compiled decode steps (tracing,
lowering, the compiler's Python objects) leave tens to hundreds of MiB free inside the arenas, still
resident: the replica's RSS then reads that much above what it holds. `malloc_trim(0)` walks every arena
and releases each whole free page (glibc >= 2.8). It costs milliseconds, so it runs at those two moments,
not per step.
"""

from __future__ import annotations

import ctypes
import ctypes.util


_trim = None  # malloc_trim, or False where the C library has none (musl, macOS)


def release_free_heap() -> bool:
    """Return the heaps' free pages to the OS; False where the C library cannot (not glibc)."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _trim = False
    if _trim is False:
        return False
    _trim(0)
    return True
