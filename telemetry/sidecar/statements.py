"""What a request asks for: an INSERT with its data, or one statement, as ClickHouse parses it.

An INSERT with data (`INSERT INTO t [(cols)] FORMAT f <data>` or `... VALUES <data>`) is split
into its head and its data here: the head is checked on ClickHouse's parse like any statement,
and the data goes to the store's insert stream as data, never through the SQL parser (chdb runs
every statement of a text, and ClickHouse's parse of an INSERT ends where its data begins, so
the raw text of an INSERT is never what runs). VALUES data ends at a `;` for ClickHouse:
`values_data_end` finds it, so that anything after it is refused as a second statement rather than
dropped. Anything else is one statement, and the sidecar decides on two answers of ClickHouse's
own parser, never on the text it was sent:

- `formatQuerySingleLine`, fed the text as a bound parameter: a syntax error or a second
  statement fails here, before anything runs; its canonical text names the statement's targets;
- `EXPLAIN AST` of that same (now known single) statement: the parse tree, one node a line,
  its depth in the indentation (`Statement.nodes`).

EXPLAIN AST prints identifiers and aliases unescaped, so a quoted name with a newline in it
becomes extra lines that look like nodes. The rules in policy.py are written so that a line can
only ever refuse a statement, never let one through: such a name can cost a refusal, never open a
door. A real node always starts its own line at its own depth, whatever text came before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# an INSERT with data: INSERT INTO [db.]table [(cols)] FORMAT name <data> | VALUES <data>
_IDENT = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`\\\n]+`)"
INSERT_HEAD = re.compile(
    rf"\s*INSERT\s+INTO\s+(?:TABLE\s+)?(?:(?P<database>{_IDENT})\.)?(?P<table>{_IDENT})\s*"
    rf"(?P<columns>\(\s*{_IDENT}(?:\s*,\s*{_IDENT})*\s*\))?\s*"
    rf"(?:FORMAT\s+(?P<format>[A-Za-z][A-Za-z0-9_]*)|(?P<values>VALUES)\b)",
    re.I,
)
LOOKS_LIKE_INSERT = re.compile(rb"\s*INSERT\b", re.I)
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*$", re.I)
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# a write's target in ClickHouse's canonical text (which backquotes any name that is not a plain word)
_TARGET = {
    "insert": re.compile(rf"^INSERT INTO (?:(?P<database>{_NAME})\.)?(?P<table>{_NAME})(?: |$)"),
    "create_table": re.compile(rf"^CREATE TABLE (?:IF NOT EXISTS )?(?:(?P<database>{_NAME})\.)?(?P<table>{_NAME}) \("),
    "alter_table": re.compile(rf"^ALTER TABLE (?:(?P<database>{_NAME})\.)?(?P<table>{_NAME}) \("),
}
_SHOW_LISTS = re.compile(r"^SHOW (?:FULL )?(?:TEMPORARY )?(?:TABLES|DATABASES)\b")

# EXPLAIN AST root nodes of statements that only read
# (not SHOW COLUMNS: its tree does not name the table it reads)
READ_ROOTS = frozenset({"SelectWithUnionQuery", "SelectIntersectExceptQuery", "DescribeQuery", "ExistsTableQuery",
                        "ShowCreateTableQuery", "ShowTables", "Explain"})


@dataclass(frozen=True)
class InsertHead:
    text: str  # the head as sent, through FORMAT name or VALUES: what ClickHouse parses and the policy checks
    format: str  # "Values" for VALUES
    data_offset: int  # where the data starts in the text the head was found in


def parse_insert_head(text: str) -> InsertHead | None:
    """The INSERT ... FORMAT / VALUES head at the start of `text` (latin-1 decoded bytes), or None."""
    m = INSERT_HEAD.match(text)
    if not m:
        return None
    end = m.end()
    if m["values"]:  # the Values format skips the whitespace before its first row itself
        return InsertHead(text[:end], "Values", end)
    while end < len(text) and text[end] in " \t\f":  # ClickHouse: data starts after the first newline,
        end += 1                                    # or after the whitespace when there is none
    if text.startswith("\r", end):
        end += 1
    if text.startswith("\n", end):
        end += 1
    return InsertHead(text[:m.end()], m["format"], end)


def values_data_end(data: bytes) -> int | None:
    """Where ClickHouse's Values format stops reading `data`: the offset of the first `;` outside a
    quoted string, or None when there is none. Quotes as the format reads them (backslash escapes,
    a doubled quote); with expressions off (VALUES_AS_DATA) rows hold only literals."""
    quote = None
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        if quote is not None:
            if c == 0x5C:  # backslash: the next byte is escaped
                i += 1
            elif c == quote:
                quote = None  # a doubled quote closes and reopens: the same as one escaped quote
        elif c in (0x27, 0x22, 0x60):  # ' " `
            quote = c
        elif c == 0x3B:  # ;
            return i
        i += 1
    return None


def without_format(canonical: str) -> str:
    """`INSERT INTO t (a, b) FORMAT Values` -> `INSERT INTO t (a, b)`: the statement the insert stream runs."""
    return _TRAILING_FORMAT.sub("", canonical).rstrip()


@dataclass(frozen=True)
class Node:
    depth: int
    kind: str  # the node's type: SelectWithUnionQuery, Function, TableIdentifier, Literal, Set ...
    text: str  # the rest of its line: a name, a literal, "(alias ...)", "(children N)"

    @property
    def name(self) -> str:
        """The node's name (a function's, a table's), without alias and children count."""
        return self.text.split(" (", 1)[0].strip()


@dataclass(frozen=True)
class Statement:
    canonical: str  # formatQuerySingleLine of the statement
    nodes: tuple[Node, ...]  # EXPLAIN AST, in order: nodes[0] is the root

    @property
    def sql(self) -> bytes:
        """The canonical text as the bytes ClickHouse printed it (a literal's bytes that are not UTF-8
        included: `canonical` holds them as surrogates): what runs."""
        return self.canonical.encode("utf-8", "surrogateescape")

    @property
    def root(self) -> str:
        return self.nodes[0].kind if self.nodes else ""

    @property
    def kind(self) -> str:
        """read, insert, create_table, alter_table, set, use; otherwise the root node's type."""
        if self.root in READ_ROOTS:
            if self.root == "ShowTables" and not _SHOW_LISTS.match(self.canonical):
                return "ShowTables"  # SHOW SETTINGS / CLUSTERS / CACHES ... share the node
            if self.root == "Explain" and (len(self.nodes) < 2 or self.nodes[1].kind not in READ_ROOTS):
                return "Explain"  # EXPLAIN of anything but a query
            return "read"
        return {"InsertQuery": "insert", "CreateQuery": "create_table" if _TARGET["create_table"].match(
            self.canonical) else "CreateQuery", "AlterQuery": "alter_table", "Set": "set",
            "UseQuery": "use"}.get(self.root, self.root)

    def target(self) -> tuple[str | None, str] | None:
        """(database or None, table) a write names, read from the canonical text; None when its
        target is not a plain table name (a table function, a quoted name ...)."""
        pattern = _TARGET.get(self.kind)
        m = pattern.match(self.canonical) if pattern else None
        return (m["database"], m["table"]) if m else None

    def of_kind(self, *kinds: str) -> list[Node]:
        return [n for n in self.nodes if n.kind in kinds]


def parse_ast(explain: str) -> tuple[Node, ...]:
    """EXPLAIN AST's text (TSVRaw) as nodes. Split on "\\n" only: that is all EXPLAIN writes."""
    nodes = []
    for line in explain.split("\n"):
        body = line.lstrip(" ")
        if body:
            kind, _, text = body.partition(" ")
            nodes.append(Node(len(line) - len(body), kind, text.strip()))
    return tuple(nodes)


def output_format(canonical: str, default: str) -> str:
    m = _TRAILING_FORMAT.search(canonical.strip())
    return m.group(1) if m else default
