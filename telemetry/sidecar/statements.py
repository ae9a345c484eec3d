"""What a request asks for: an INSERT with data in the body, or one statement to run.

The statement path lets ClickHouse's own parser (formatQuerySingleLine, fed the text as a bound
parameter) reject syntax errors and multi-statements before anything runs, then checks the
canonical text: the statement kind (read-only users: SELECT / SHOW / DESCRIBE / EXISTS ...)
and functions that would reach outside the store (files, URLs, other servers, Python objects).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# an INSERT whose data follows in the body: INSERT INTO [db.]table [(cols)] FORMAT name <data>
_IDENT = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`\\\n]+`)"
INSERT_HEAD = re.compile(
    rf"\s*INSERT\s+INTO\s+(?:TABLE\s+)?(?P<table>{_IDENT}(?:\.{_IDENT})?)\s*"
    rf"(?P<columns>\(\s*{_IDENT}(?:\s*,\s*{_IDENT})*\s*\))?\s*FORMAT\s+(?P<format>[A-Za-z][A-Za-z0-9_]*)",
    re.I,
)
LOOKS_LIKE_INSERT = re.compile(rb"\s*INSERT\b", re.I)

READ_KINDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})
NO_OP_KINDS = frozenset({"SET", "USE"})  # per-session state: the HTTP endpoint is stateless

# functions (and table engines) that read or write outside the store
DENIED_FUNCTIONS = frozenset(name.lower() for name in (
    "file", "fileCluster", "url", "urlCluster", "s3", "s3Cluster", "gcs", "oss", "cosn", "azureBlobStorage",
    "azureBlobStorageCluster", "hdfs", "hdfsCluster", "remote", "remoteSecure", "cluster", "clusterAllReplicas",
    "mysql", "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc", "executable", "executablePool", "input",
    "python", "hive", "arrowFlight", "ytsaurus", "deltaLake", "deltaLakeCluster", "hudi", "hudiCluster",
    "iceberg", "icebergS3", "icebergAzure", "icebergHDFS", "icebergLocal", "icebergCluster", "icebergS3Cluster",
    "paimon", "dataLakeCatalog", "http", "clickhouse",  # the last two: dictionary sources
))
_FILE_CLAUSE = re.compile(r"\b(INTO\s+OUTFILE|FROM\s+INFILE)\b", re.I)
_STRING_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'", re.S)
_CALL = re.compile(r"(?<![\w.`])`?([A-Za-z_][A-Za-z0-9_]*)`?\s*\(")
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*$", re.I)


@dataclass(frozen=True)
class InsertHead:
    sql: str  # INSERT INTO table (cols) -- what the store runs, rebuilt from validated tokens
    table: str  # unqualified, unquoted (for metrics)
    format: str
    data_offset: int  # where the data starts in the text the head was found in


def parse_insert_head(text: str) -> InsertHead | None:
    """The INSERT ... FORMAT head at the start of `text` (latin-1 decoded bytes), or None."""
    m = INSERT_HEAD.match(text)
    if not m:
        return None
    end = m.end()
    while end < len(text) and text[end] in " \t\f":  # ClickHouse: data starts after the first newline,
        end += 1                                    # or after the whitespace when there is none
    if text.startswith("\r", end):
        end += 1
    if text.startswith("\n", end):
        end += 1
    columns = f" {m['columns']}" if m["columns"] else ""
    table = m["table"].split(".")[-1].strip("`")
    return InsertHead(f"INSERT INTO {m['table']}{columns}", table, m["format"], end)


def statement_kind(canonical: str) -> str:
    return canonical.split(None, 1)[0].upper() if canonical.strip() else ""


def denied_function(canonical: str) -> str | None:
    """The first function/engine call in `canonical` that reaches outside the store, if any."""
    code = _STRING_LITERAL.sub("''", canonical)
    for name in _CALL.findall(code):
        if name.lower() in DENIED_FUNCTIONS:
            return name
    clause = _FILE_CLAUSE.search(code)
    return " ".join(clause.group(1).split()) if clause else None


def output_format(canonical: str, default: str) -> str:
    m = _TRAILING_FORMAT.search(canonical.strip())
    return m.group(1) if m else default
