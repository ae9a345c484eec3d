"""The version `/version` answers (as vLLM's {"version": ...}): the installed package's, else the source tree's."""

from __future__ import annotations

from functools import cache


@cache
def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infersight")
    except PackageNotFoundError:
        return "0.0.0+unknown"
