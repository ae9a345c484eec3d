"""Model references a fleet config (or the demo) may use besides a plain directory.

- "reference": the shipped reference model (`evals/reference/models/target`),
  or a tiny random Llama in a copy of the code without it (an installed package);
- "tiny-random:ARCH" (llama | qwen2 | qwen3): a small random-weight model of a
  real architecture, built once into the cache directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE_MODEL = REPO_ROOT / "evals" / "reference" / "models" / "target"


def cache_dir() -> Path:
    root = os.environ.get("INFERSIGHT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "infersight")
    return Path(root)


def reference_model_available() -> bool:
    return (REFERENCE_MODEL / "config.json").is_file()


def tiny_random_model(arch: str = "llama") -> Path:
    """Build (once) and return a tiny random-weight model of `arch` in the cache directory."""
    from engine.core.tiny_model import ARCHITECTURES, build_random_model

    if arch not in ARCHITECTURES:
        raise ValueError(f"tiny-random:{arch}: unknown architecture; choose from {', '.join(ARCHITECTURES)}")
    target = cache_dir() / "models" / f"tiny-random-{arch}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # build beside the target, then rename: a concurrent builder or a crash never leaves half a model
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-random-{arch}-", dir=target.parent))
    try:
        build_random_model(tmp, arch)
        try:
            tmp.rename(target)
        except OSError:  # someone else finished first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(spec: str, base_dir: Path | None = None) -> Path:
    """A model reference -> a local model directory (ValueError when there is none)."""
    if spec == "reference":
        return REFERENCE_MODEL if reference_model_available() else tiny_random_model("llama")
    if spec.startswith("tiny-random:"):
        return tiny_random_model(spec.split(":", 1)[1])
    path = Path(spec).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, REPO_ROOT / path] + (
        [base_dir / path] if base_dir else [])
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate.resolve()
    raise ValueError(f"model {spec!r}: no model directory (config.json) found; looked in "
                     + ", ".join(str(c) for c in candidates)
                     + " (or use 'reference' or 'tiny-random:llama')")
