"""Where compiled decode steps persist between starts: inductor's caches in the user's cache directory.

torch.compile keeps two caches on disk, both on by default: inductor's FX graph cache (the generated C++
and its built library, keyed by the graph, which holds the model's shapes and the batch's symbolic sizes,
the inductor config, the torch version and the CPU's ISA) and AOTAutograd's cache above it. Their default
home is `/tmp/torchinductor_<user>`: a fresh host, a container restart or a cleaned /tmp compiles again
from nothing, minutes on a small CPU. Under the user's cache directory (`$INFERSIGHT_CACHE`, else
`~/.cache/infersight`, as the other built artifacts) they outlive those, so a restart with the same model
and torch replays the built kernels and only traces.

A decode step's float constants (RMSNorm's eps, the attention scale, the embedding's norm type) are
specialized, not traced as inputs: with dynamic shapes dynamo first lifts each into a 0-d tensor, runs
AOTAutograd on that graph, finds the floats must be Python numbers, and restarts the whole trace with them
specialized. That first attempt is thrown away, yet it was most of a start: on the reference model, with
both caches warm, 124 of 164 s of compile time (its AOTAutograd key never matches a saved entry, so it
misses the cache every start). Nothing in a compiled step takes a float that changes between calls.

The directory is per torch version: a new torch never reads an old one's files, and removing a version's
directory is the whole cleanup. A `TORCHINDUCTOR_CACHE_DIR` the operator set is kept as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"  # inductor reads it on every cache access (torch/_inductor/runtime/cache_dir_utils.py)


def user_cache_root() -> Path:
    return Path(os.environ.get("INFERSIGHT_CACHE") or Path.home() / ".cache" / "infersight")


def compile_cache_dir() -> Path:
    import torch

    return user_cache_root() / "compile" / f"torch-{torch.__version__}"


def _torch_default_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def use_persistent_compile_cache() -> str:
    """Point inductor's caches at the persistent directory unless the operator chose one, and specialize
    float constants (above); returns the directory in use. Call before the first compile. (Whether the
    caches are on stays torch's default, on, or the operator's TORCHINDUCTOR_FX_GRAPH_CACHE /
    TORCHINDUCTOR_AUTOGRAD_CACHE.)

    TORCHINDUCTOR_CACHE_DIR holding torch's own default (`/tmp/torchinductor_<user>`) is not a choice:
    inductor writes its default into the variable the first time it asks for the directory, and
    importing torch._dynamo asks (its precompile cache's path), so in a process that imported it first the
    variable is already set, and the persistent directory would never be used."""
    chosen = os.environ.get(ENV)
    if not chosen or os.path.abspath(chosen) == _torch_default_dir():
        path = compile_cache_dir()
        path.mkdir(parents=True, exist_ok=True)
        os.environ[ENV] = str(path)
    import torch._dynamo  # after the variable: its import reads (and, unset, writes) it

    torch._dynamo.config.specialize_float = True
    return os.environ[ENV]
