"""Is a configuration file's value of the type its key takes? One answer for every TOML file infersight reads
(fleet configs, engine configs, eval policies), and one way to say no: the key, the type it takes, what came.

TOML values arrive typed: `port = "8100"` is a string, not a port, and Python's own complaint about it
later ("invalid literal for int()") names neither the key nor the file.
"""

from __future__ import annotations

KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "an array",
              dict: "a table"}
_VALUE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
                dict: "a table"}


def is_kind(value, kind: type) -> bool:
    """`value` is a TOML value of `kind`: an integer is not a boolean, a number may be an integer."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def value_kind(value) -> str:
    """What TOML calls `value`'s type ("a string", "an integer" ...)."""
    return _VALUE_NAMES.get(type(value), type(value).__name__)


def wrong_type(key: str, value, kinds: type | tuple[type, ...]) -> str | None:
    """None when `value` is one of `kinds`, else "KEY must be an integer, got '8' (a string)"."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if any(is_kind(value, kind) for kind in kinds):
        return None
    return f"{key} must be {' or '.join(KIND_NAMES[k] for k in kinds)}, got {value!r} ({value_kind(value)})"
