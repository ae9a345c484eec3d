"""What a statement may do through the sidecar, decided on ClickHouse's parse of it (statements.py).

ClickHouse enforces what it can: the read-only user's statements run in sessions set to
`readonly = 1` after the per-query limits (so no SET, no SETTINGS clause, no write, no DDL, and no
table function that needs a temporary table, e.g. file / url / executable), and every statement
runs under max_execution_time, max_result_bytes and max_memory_usage. What ClickHouse does not
refuse on its own (chdb writes `INTO OUTFILE` even in readonly mode, the scalar `file()` reads
files, system tables answer anyone) is refused here, for every user, from the parse tree:

- a node of a kind outside NODE_KINDS: EXPLAIN AST leaves some content out (APPLY's function, a
  SETTINGS clause's values), so only kinds that print all that matters may pass;
- `INTO OUTFILE` / `FROM INFILE`: a literal directly under the root;
- a table function outside ALLOWED_TABLE_FUNCTIONS (every other name in system.table_functions,
  so a new chdb's new functions are refused too), anywhere; `file()` and `disk()` as functions;
- a SETTINGS clause (a `Set` node) anywhere but in a CREATE TABLE, whose settings must be numbers;
- system tables outside ALLOWED_SYSTEM_TABLES, and information_schema;
- for the full user (the writer, whose credentials every replica holds): statement kinds other than
  reads, INSERT into WRITABLE_TABLES (the contract's tables) in INSERT_FORMATS or INSERT ... SELECT,
  and, of DDL, only the schema's own statements: a CREATE TABLE / ALTER TABLE whose canonical text
  is one of the shipped migrations' (`schema_statements`). The sidecar applies its migrations itself
  when it starts (chdb: one process per data directory, so the sidecar owns the schema); what
  `infersight migrate --store <sidecar URL>` sends is then exactly those idempotent statements, and
  nothing of another schema (a forged table, a dropped column) can be created through the writer.
  No INSERT into schema_migrations either: a forged migration record would stop the next start.

Settings in the URL: the read-only user may send none (as ClickHouse's readonly = 1); the full user
only URL_SETTINGS, each value checked (`_URL_VALUES`), and a limit (max_threads among them) only
below the sidecar's own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from telemetry.contract.records import RECORD_TYPES
from telemetry.sidecar import protocol as p
from telemetry.sidecar.statements import Statement

# the contract's tables
WRITABLE_TABLES = frozenset(RECORD_TYPES)
# the formats the writer's data may come in: the recorder's and the migrator's (Arrow, via
# clickhouse-connect), clickhouse-connect's own insert (Native), and the plain ones a person types;
# none that reads a schema or template file (Protobuf, CapnProto, Template ...). name.lower() -> name
INSERT_FORMATS = {f.lower(): f for f in ("Arrow", "ArrowStream", "Native", "RowBinary", "Values", "JSONEachRow",
                                         "CSV", "CSVWithNames", "TabSeparated", "TSV", "TabSeparatedWithNames")}
# generators of rows from their arguments alone: the benchmarks and tests seed with numbers();
# `format` is also a scalar function (format('{}-{}', a, b)), and both share one name in the tree
ALLOWED_TABLE_FUNCTIONS = frozenset({"numbers", "numbers_mt", "zeros", "zeros_mt", "generateSeries",
                                     "generate_series", "values", "format"})
# functions that reach outside the store and are not table functions: file() reads a file,
# disk() (a dynamic disk) puts a table's data anywhere on the filesystem
DENIED_FUNCTIONS = frozenset({"file", "disk"})
# one / numbers / zeros: the table forms of the generators above; databases / tables / columns:
# Grafana's query builder; settings: clickhouse-connect's handshake (`SELECT name, value, readonly
# FROM system.settings`): the session's own settings, the sidecar's limits among them
ALLOWED_SYSTEM_TABLES = frozenset({"one", "numbers", "numbers_mt", "zeros", "zeros_mt", "databases", "tables",
                                   "columns", "settings"})
CATALOG_DATABASES = ("system", "information_schema")  # information_schema: views of system tables
# the parse-tree nodes a statement may consist of: those whose EXPLAIN AST line (or children) shows
# everything in them that could reach outside the store. Not ColumnsApplyTransformer (`* APPLY(file)`
# prints no function name) and no kind this list does not know (a new ClickHouse's new nodes)
NODE_KINDS = frozenset({
    # queries
    "SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "ExpressionList", "Identifier",
    "TableIdentifier", "Literal", "Function", "Asterisk", "QualifiedAsterisk", "ColumnsListMatcher",
    "ColumnsRegexpMatcher", "QualifiedColumnsListMatcher", "QualifiedColumnsRegexpMatcher", "ColumnsTransformerList",
    "ColumnsExceptTransformer", "ColumnsReplaceTransformer", "ColumnsReplaceTransformer::Replacement",
    "TablesInSelectQuery", "TablesInSelectQueryElement", "TableExpression", "TableJoin", "ArrayJoin", "Subquery",
    "WithElement", "OrderByElement", "InterpolateElement", "WindowDefinition", "WindowListElement", "SampleRatio",
    "DataType",
    # the other reads
    "Explain", "DescribeQuery", "ExistsTableQuery", "ShowTables", "ShowCreateTableQuery",
    # the writes (policy below), and a Set checked on its own
    "InsertQuery", "CreateQuery", "Columns", "ColumnDeclaration", "Storage", "Index", "TTLElement", "AlterQuery",
    "AlterCommand", "Set",
})
# a CREATE TABLE's own settings as ClickHouse prints them at its end: names = numbers (no disk(...))
_TABLE_SETTINGS = re.compile(r" SETTINGS [a-z_]+ = \d+(?:, [a-z_]+ = \d+)*$")
# settings the full user may send in the URL: insert deduplication (the recorder), the two
# clickhouse-connect sets on every request, its Arrow string switch, and max_threads
_BOOL = re.compile(r"^(?:0|1|true|false)$", re.I)
_URL_VALUES = {
    "insert_deduplication_token": re.compile(r"^[A-Za-z0-9_.:\-]{1,256}$"),  # as telemetry/store/base.py's
    "insert_deduplicate": _BOOL,
    "date_time_input_format": re.compile(r"^(?:basic|best_effort|best_effort_us)$"),
    "cast_string_to_dynamic_use_inference": _BOOL,
    "output_format_arrow_string_as_string": _BOOL,
}
URL_SETTINGS = frozenset(_URL_VALUES)
LIMIT_SETTINGS = ("max_execution_time", "max_result_bytes", "max_memory_usage", "max_threads")  # lowered only


class Refused(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class QueryPolicy:
    def __init__(self, table_functions: Iterable[str], database: str, limits: Mapping[str, str],
                 schema_statements: Iterable[str] = ()):
        """`table_functions`: every name in system.table_functions; `limits`: the per-query limits
        (max_threads defaults to the CPUs); `schema_statements`: the canonical text of every DDL
        statement of the shipped migrations, the only DDL the full user may run."""
        allowed = {name.lower() for name in ALLOWED_TABLE_FUNCTIONS}
        self.denied_functions = frozenset(n.lower() for n in table_functions if n.lower() not in allowed) \
            | DENIED_FUNCTIONS
        self.database = database
        self.limits = {"max_threads": str(os.cpu_count() or 1), **limits}
        self.schema_statements = frozenset(schema_statements)

    # URL ------------------------------------------------------------------------------------------

    def check_url_settings(self, settings: Mapping[str, str], readonly: bool) -> None:
        for name, value in settings.items():
            if readonly:
                raise Refused(f"Cannot modify '{name}' setting in readonly mode", p.READONLY)
            if name in LIMIT_SETTINGS:
                self._check_lowered(name, value)
            elif name not in URL_SETTINGS:
                raise Refused(f"setting '{name}' is not accepted by the sidecar (the full user may send "
                              f"{', '.join(sorted(URL_SETTINGS | set(LIMIT_SETTINGS)))})", p.ACCESS_DENIED)
            elif not _URL_VALUES[name].match(value):
                raise Refused(f"'{value[:80]}' is not a value the sidecar accepts for {name} "
                              f"(pattern {_URL_VALUES[name].pattern})", p.BAD_ARGUMENTS)

    def _check_lowered(self, name: str, value: str) -> None:
        limit = float(self.limits[name])
        try:
            wanted = float(value)
        except ValueError:
            raise Refused(f"cannot parse '{value}' as the value of {name}", p.BAD_ARGUMENTS) from None
        if not 0 < wanted <= limit:
            raise Refused(f"setting '{name}' may only be lowered, to more than 0 and at most the sidecar's "
                          f"limit of {self.limits[name]} (0 would lift it)", p.ACCESS_DENIED)

    def check_database(self, database: str | None) -> None:
        if database is not None and database != self.database:
            raise Refused(f"the sidecar serves database {self.database} only, not {database}", p.ACCESS_DENIED)

    # INSERT with data -----------------------------------------------------------------------------------

    def check_insert(self, head: Statement, fmt: str, readonly: bool) -> str:
        """`head`: ClickHouse's parse of `INSERT INTO t [(cols)] FORMAT fmt` (its data apart). Returns
        the format's name as ClickHouse spells it."""
        if readonly:
            raise Refused("Cannot execute query in readonly mode", p.READONLY)
        if head.kind != "insert":  # the head regex and ClickHouse disagree: never run it
            raise Refused(f"{head.root} is not an INSERT's head", p.ACCESS_DENIED)
        if fmt.lower() not in INSERT_FORMATS:
            raise Refused(f"INSERT data in format {fmt} is not accepted by the sidecar (formats: "
                          f"{', '.join(INSERT_FORMATS.values())})", p.ACCESS_DENIED)
        self.check(head, readonly)
        return INSERT_FORMATS[fmt.lower()]

    # statements ----------------------------------------------------------------------------------

    def check(self, statement: Statement, readonly: bool) -> None:
        """Raises Refused unless `statement` may run (readonly: the read-only user, or a GET)."""
        kind = statement.kind
        if kind == "set":
            raise Refused("SET is not accepted: each HTTP request is a session of its own (settings go in the "
                          "URL, and the per-query limits cannot be lifted)", p.READONLY if readonly else p.ACCESS_DENIED)
        if readonly and kind != "read":
            raise Refused(f"Cannot execute query in readonly mode ({statement.root} is not a read)", p.READONLY)
        if kind not in ("read", "insert", "create_table", "alter_table"):
            raise Refused(f"{statement.root} is not allowed through the sidecar: it runs reads, INSERT into the "
                          "contract tables and the schema migrations' CREATE TABLE / ALTER TABLE", p.ACCESS_DENIED)
        self._check_nodes(statement)
        self._check_output(statement)
        self._check_functions(statement)
        self._check_settings(statement)
        self._check_catalog(statement)
        if kind != "read":
            self._check_write(statement)

    def _check_nodes(self, statement: Statement) -> None:
        for node in statement.nodes:
            if node.kind not in NODE_KINDS:
                raise Refused(f"{node.kind} is not accepted by the sidecar (its parse does not show what it would "
                              "run)", p.ACCESS_DENIED)

    def _check_output(self, statement: Statement) -> None:
        # out_file / in_file / their compression are the only literals a statement's root holds,
        # except a CREATE TABLE's COMMENT (the migrations write none)
        if any(n.depth == 1 and n.kind == "Literal" for n in statement.nodes):
            raise Refused("INTO OUTFILE and FROM INFILE are not available through the sidecar: they reach "
                          "outside the store", p.ACCESS_DENIED)

    def _check_functions(self, statement: Statement) -> None:
        for node in statement.of_kind("Function"):
            if node.name.lower() in self.denied_functions:
                raise Refused(f"{node.name} is not available through the sidecar: it reaches outside the store "
                              f"(table functions allowed: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})",
                              p.ACCESS_DENIED)

    def _check_settings(self, statement: Statement) -> None:
        if statement.kind == "create_table":  # a table's own SETTINGS (MergeTree's), not a query's
            if statement.of_kind("SelectWithUnionQuery"):
                raise Refused("CREATE TABLE ... AS SELECT is not allowed through the sidecar", p.ACCESS_DENIED)
            sets = statement.of_kind("Set")  # EXPLAIN AST shows no values: read them from the canonical text
            if len(sets) > 1 or (sets and not _TABLE_SETTINGS.search(statement.canonical)):
                raise Refused("a CREATE TABLE's SETTINGS may only set numbers (name = 123, ...)", p.ACCESS_DENIED)
            return
        if statement.of_kind("Set"):
            raise Refused("a SETTINGS clause is not accepted: the per-query limits cannot be lifted (the full "
                          "user may lower them, and send the settings it may, in the URL)", p.ACCESS_DENIED)

    def _check_catalog(self, statement: Statement) -> None:
        for node in statement.of_kind("Identifier", "TableIdentifier"):
            database, dot, table = node.name.partition(".")
            if database.lower() not in CATALOG_DATABASES:
                if node.kind == "TableIdentifier" and dot:  # db.table: only the store's own tables
                    self.check_database(database)
                continue
            if not dot or database.lower() != "system" or table.split(".")[0] not in ALLOWED_SYSTEM_TABLES:
                raise Refused(f"{node.name} is not readable through the sidecar (system tables: "
                              f"{', '.join(sorted(ALLOWED_SYSTEM_TABLES))})", p.ACCESS_DENIED)

    def _check_write(self, statement: Statement) -> None:
        verb = _VERBS[statement.kind]
        if statement.kind != "insert":  # DDL: the schema's own statements, word for word
            if statement.canonical not in self.schema_statements:
                raise Refused(f"{verb} is allowed only as one of the schema migrations' own statements (the "
                              "sidecar applies them itself when it starts)", p.ACCESS_DENIED)
            return
        target = statement.target()
        if target is None or target[1] not in WRITABLE_TABLES:
            name = ".".join(filter(None, target)) if target else "that target"
            raise Refused(f"{verb} {name} is not allowed: only {', '.join(sorted(WRITABLE_TABLES))}", p.ACCESS_DENIED)
        self.check_database(target[0])
        # the root's own names agree (a quoted name that prints as several lines shows up here too)
        for node in statement.nodes:
            if node.depth == 1 and node.kind == "Identifier" and node.name not in WRITABLE_TABLES | {self.database}:
                raise Refused(f"{verb} {node.name} is not allowed: only {', '.join(sorted(WRITABLE_TABLES))}",
                              p.ACCESS_DENIED)


_VERBS = {"insert": "INSERT into", "create_table": "CREATE TABLE", "alter_table": "ALTER TABLE"}
