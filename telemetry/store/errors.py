"""Store errors: ClickHouse's error code when there is one, and whether a retry can help."""

from __future__ import annotations

import re

_CODE = re.compile(r"Code: (\d+)\.")

# ClickHouse error codes that mean "this data (or query) is wrong": retrying the same batch
# cannot succeed, so a writer drops it (and counts it) instead of spooling it forever.
PERMANENT_CODES = frozenset({
    6,    # CANNOT_PARSE_TEXT
    16,   # NO_SUCH_COLUMN_IN_TABLE
    27,   # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    33,   # CANNOT_READ_ALL_DATA
    36,   # BAD_ARGUMENTS
    41, 42, 43, 44,  # cannot parse datetime / wrong number of arguments / illegal type / illegal column
    47,   # UNKNOWN_IDENTIFIER
    53,   # TYPE_MISMATCH
    62,   # SYNTAX_ERROR
    69,   # ARGUMENT_OUT_OF_BOUND
    70,   # CANNOT_CONVERT_TYPE
    73,   # UNKNOWN_FORMAT
    117,  # INCORRECT_DATA
    164,  # READONLY
    497,  # ACCESS_DENIED
    516,  # AUTHENTICATION_FAILED
})


class StoreError(Exception):
    """A query or insert failed; `code` is ClickHouse's error code (None when unknown)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code if code is not None else error_code(message)

    @property
    def permanent(self) -> bool:
        """True when retrying the same request cannot succeed."""
        return self.code in PERMANENT_CODES


class StoreUnavailableError(StoreError):
    """The store could not be reached (connection refused, timeout, overloaded): retry later."""

    @property
    def permanent(self) -> bool:
        return False


class InsertNotStoredError(StoreError):
    """The engine answered an insert as done but did not store it (chdb's insert stream reports the
    rows it read as written even when writing the part failed): retry it with the same dedup token."""

    @property
    def permanent(self) -> bool:
        return False


class StoreLockedError(StoreError):
    """Another process holds the embedded store's data directory."""


def error_code(message: str) -> int | None:
    match = _CODE.search(message or "")
    return int(match.group(1)) if match else None
