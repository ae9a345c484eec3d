"""The ClickHouse HTTP protocol details the sidecar speaks: errors, statuses, content types, params."""

from __future__ import annotations

import re

import chdb

SERVER_VERSION = chdb.engine_version  # the embedded ClickHouse's version, e.g. 26.9.2.1

# URL parameters that steer the HTTP exchange itself and are not ClickHouse settings
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "user", "password", "query_id", "session_id", "session_timeout",
    "session_check", "compress", "decompress", "buffer_size", "wait_end_of_query", "client_protocol_version",
    "quota_key", "role", "stacktrace", "readonly", "enable_http_compression", "send_progress_in_http_headers",
    "http_headers_progress_interval_ms", "cancel_http_readonly_queries_on_client_close", "http_wait_end_of_query",
    "http_response_buffer_size", "add_http_cors_header", "http_native_compression_disable_checksumming_on_decompress",
})

# error codes used by the sidecar itself
SYNTAX_ERROR = 62
UNKNOWN_SETTING = 115
READONLY = 164
BAD_ARGUMENTS = 36
UNKNOWN_FORMAT = 73
ACCESS_DENIED = 497
AUTHENTICATION_FAILED = 516
UNKNOWN_EXCEPTION = 1002

_ERROR_NAMES = {SYNTAX_ERROR: "SYNTAX_ERROR", UNKNOWN_SETTING: "UNKNOWN_SETTING", READONLY: "READONLY",
                BAD_ARGUMENTS: "BAD_ARGUMENTS", UNKNOWN_FORMAT: "UNKNOWN_FORMAT", ACCESS_DENIED: "ACCESS_DENIED",
                AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED", UNKNOWN_EXCEPTION: "UNKNOWN_EXCEPTION"}

# ClickHouse's exception code -> HTTP status mapping (HTTPHandler's exceptionCodeToHTTPStatus), abridged
_STATUS_BY_CODE = {
    194: 401,  # REQUIRED_PASSWORD
    192: 403, 193: 403, 516: 403,  # UNKNOWN_USER, WRONG_PASSWORD, AUTHENTICATION_FAILED
    164: 403, 497: 403,  # READONLY, ACCESS_DENIED
    **dict.fromkeys((6, 25, 26, 27, 32, 36, 38, 41, 42, 43, 44, 53, 62, 69, 70, 72, 73, 115, 117, 456, 457, 472), 400),
    **dict.fromkeys((16, 46, 47, 50, 56, 60, 81, 83), 404),  # UNKNOWN_TABLE, UNKNOWN_FUNCTION, UNKNOWN_DATABASE ...
    159: 408,  # TIMEOUT_EXCEEDED
    396: 400,  # TOO_MANY_ROWS_OR_BYTES: the query asked for more than the per-query limits allow (ClickHouse says
              # 500; a client's own query over a limit is a 4xx here, so that no attack reads as a server fault)
    48: 501,  # NOT_IMPLEMENTED
    202: 503,  # TOO_MANY_SIMULTANEOUS_QUERIES
}

# codes that mean the server, not the request, failed: out of memory, disk, descriptors, slots; an
# error of its own. Any other ClickHouse code raised by a client's statement or data is about that
# statement or data (syntax, parse depth 306 / 167, sleepEachRow's 160, a malformed body's 128 / 33 ...):
# a 4xx with ClickHouse's message, so no input can make the sidecar look broken (and a writer does
# not retry what can never succeed). Reads of corrupt parts: handler.py answers those 500.
SERVER_FAULT_CODES = frozenset({
    49,  # LOGICAL_ERROR
    74, 75, 76, 77,  # CANNOT_READ_FROM / WRITE_TO_FILE_DESCRIPTOR, CANNOT_OPEN_FILE, CANNOT_CLOSE_FILE
    173, 241, 243,  # CANNOT_ALLOCATE_MEMORY, MEMORY_LIMIT_EXCEEDED (server-wide), NOT_ENOUGH_SPACE
    202, 209, 210, 236, 394, 425,  # TOO_MANY_SIMULTANEOUS_QUERIES, SOCKET_TIMEOUT, NETWORK_ERROR, ABORTED,
                                   # QUERY_WAS_CANCELLED, SYSTEM_ERROR
    1000, 1001, 1002,  # POCO_EXCEPTION, STD_EXCEPTION, UNKNOWN_EXCEPTION
})

_CODE_IN_MESSAGE = re.compile(r"^Code: (\d+)\. ")


def http_status(code: int | None) -> int:
    if code in _STATUS_BY_CODE:
        return _STATUS_BY_CODE[code]
    return 500 if code is None or code in SERVER_FAULT_CODES else 400


def error_text(message: str, code: int) -> str:
    """An error body as ClickHouse writes it: `Code: N. DB::Exception: ... (NAME) (version X)`."""
    message = message.strip()
    if not _CODE_IN_MESSAGE.match(message):
        message = f"Code: {code}. DB::Exception: {message}. ({_ERROR_NAMES.get(code, 'UNKNOWN_EXCEPTION')})"
    return f"{message} (version {SERVER_VERSION})\n"


_TEXT = "text/plain; charset=UTF-8"
_CONTENT_TYPES = {
    "tabseparated": "text/tab-separated-values; charset=UTF-8", "tsv": "text/tab-separated-values; charset=UTF-8",
    "csv": "text/csv; charset=UTF-8; header=absent", "csvwithnames": "text/csv; charset=UTF-8; header=present",
    "json": "application/json; charset=UTF-8", "jsoncompact": "application/json; charset=UTF-8",
    "jsoneachrow": "application/x-ndjson; charset=UTF-8", "xml": "application/xml; charset=UTF-8",
}
_BINARY = ("native", "rowbinary", "arrow", "arrowstream", "parquet", "orc", "avro", "msgpack", "protobuf", "capnproto")


def content_type(fmt: str) -> str:
    lower = fmt.lower()
    if lower.startswith(_BINARY):
        return "application/octet-stream"
    if lower.startswith(("tabseparated", "tsv")):
        return _CONTENT_TYPES["tsv"]
    return _CONTENT_TYPES.get(lower, _TEXT)
