"""The calling thread's NUMA memory policy, through libnuma's get_mempolicy / set_mempolicy (ctypes).

libnuma is optional: without it (or where the kernel lacks NUMA) every function
returns None and callers fall back to /proc's Mems_allowed_list.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# <linux/mempolicy.h>
MODES = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local", 5: "preferred_many",
         6: "weighted_interleave"}
MPOL_DEFAULT = 0
MPOL_BIND = 2
_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)  # static / relative nodes, numa balancing
_MAX_NODES = 1024
_WORD_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
_WORDS = _MAX_NODES // _WORD_BITS


@functools.cache
def _libnuma():
    name = ctypes.util.find_library("numa")
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.get_mempolicy.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_ulong), ctypes.c_ulong,
                                  ctypes.c_void_p, ctypes.c_uint]
    lib.set_mempolicy.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulong), ctypes.c_ulong]
    return lib


def available() -> bool:
    return _libnuma() is not None


def get_mempolicy() -> tuple[str, list[int]] | None:
    """(mode name, nodes) of the calling thread's policy; nodes is [] for default/local. None if unknown."""
    lib = _libnuma()
    if lib is None:
        return None
    mode = ctypes.c_int(0)
    mask = (ctypes.c_ulong * _WORDS)()
    if lib.get_mempolicy(ctypes.byref(mode), mask, _MAX_NODES, None, 0) != 0:
        return None
    nodes = [w * _WORD_BITS + b for w in range(_WORDS) for b in range(_WORD_BITS) if mask[w] >> b & 1]
    return MODES.get(mode.value & ~_MODE_FLAGS, f"mode{mode.value}"), nodes


def set_mempolicy(mode: int, nodes: list[int]) -> str | None:
    """Set the calling thread's policy (and that of threads it starts later). Returns an error text or None."""
    lib = _libnuma()
    if lib is None:
        return "libnuma not found"
    mask = (ctypes.c_ulong * _WORDS)()
    for node in nodes:
        if not 0 <= node < _MAX_NODES:
            return f"node {node} out of range"
        mask[node // _WORD_BITS] |= 1 << (node % _WORD_BITS)
    if lib.set_mempolicy(mode, mask if nodes else None, _MAX_NODES + 1 if nodes else 0) != 0:
        errno = ctypes.get_errno()
        return f"set_mempolicy failed: errno {errno}"
    return None
