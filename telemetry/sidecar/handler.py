"""The sidecar's request handling, independent of the HTTP server: ClickHouse HTTP semantics
over the embedded store. Blocking (chdb calls): the server runs it in worker threads."""

from __future__ import annotations

import base64
import hmac
import json
import logging
import re
import socket
import time
import uuid
from dataclasses import dataclass, field

from clickhouse_connect.driver.binding import format_bind_value

from telemetry.sidecar import protocol as p
from telemetry.sidecar.bodies import BadEncoding, BodyTooLarge, decompress
from telemetry.sidecar.forms import FormError, form_fields, is_form
from telemetry.sidecar.metrics import SidecarMetrics
from telemetry.sidecar.policy import QueryPolicy, Refused
from telemetry.sidecar.store_health import CORRUPTION_CODES
from telemetry.sidecar.statements import (
    LOOKS_LIKE_INSERT, InsertHead, Statement, output_format, parse_ast, parse_insert_head, values_data_end,
    without_format,
)
from telemetry.sidecar.write_health import WriteHealth
from telemetry.store.base import IDENTIFIER
from telemetry.store.errors import InsertNotStoredError, StoreError

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # where an INSERT ... FORMAT head must end
_HEADS_CACHED = 1024  # ClickHouse's parse of INSERT heads (a fleet sends the same few over and over)
_QUERY_ID = re.compile(r"^[\w.:\-]{1,128}$")
_SETTING_CHANGE = re.compile(r"Cannot modify '[^']*' setting in readonly mode")
_CHDB_ONLY_FORMATS = {"dataframe", "arrowtable", "datastore", "debug"}  # chdb Python wrappers, not wire formats
MEMORY_LIMIT_EXCEEDED = 241
SUPPORT_IS_DISABLED = 344
# VALUES data stays data: no expression in it is evaluated (file('/etc/passwd') would be), and the
# parse tree a statement is checked on never holds an INSERT's data
VALUES_AS_DATA = {"input_format_values_interpret_expressions": "0",
                  "input_format_values_deduce_templates_of_expressions": "0"}


class RequestError(Exception):
    def __init__(self, message: str, code: int, status: int | None = None):
        super().__init__(message)
        self.code, self.status = code, status or p.http_status(code)


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Users:
    """Who may connect. No user configured: open access (bind to localhost). Otherwise credentials
    must match the user (full access) or the read-only user (SELECT / SHOW / DESCRIBE / EXISTS)."""

    user: str | None = None
    password: str = ""
    readonly_user: str | None = None
    readonly_password: str = ""

    def role(self, user: str | None, password: str) -> str:
        if self.user is None and self.readonly_user is None:
            return "full"
        for name, secret, role in ((self.user, self.password, "full"),
                                   (self.readonly_user, self.readonly_password, "readonly")):
            if name is not None and hmac.compare_digest((user or "default").encode(), name.encode()) \
                    and hmac.compare_digest(password.encode(), secret.encode()):
                return role
        raise RequestError(f"{user or 'default'}: Authentication failed: password is incorrect, "
                           "or there is no user with such name", p.AUTHENTICATION_FAILED)


def credentials(params: dict[str, str], headers: dict[str, str]) -> tuple[str | None, str]:
    """ClickHouse takes credentials from basic auth, X-ClickHouse-User/Key headers, or user/password params."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
            return user, password
        except (ValueError, UnicodeDecodeError):
            raise RequestError("malformed Authorization header", p.AUTHENTICATION_FAILED) from None
    if "x-clickhouse-user" in headers:
        return headers["x-clickhouse-user"], headers.get("x-clickhouse-key", "")
    return params.get("user"), params.get("password", "")


class Sidecar:
    def __init__(self, store, users: Users = Users(), name: str = "sidecar",
                 max_body_bytes: int = 256 << 20, finding_active_window_seconds: float = 3600,
                 query_timeout_seconds: float = 120, max_result_bytes: int = 512 << 20,
                 max_query_memory_bytes: int = 2 << 30):
        self.store, self.users, self.max_body_bytes = store, users, max_body_bytes
        # limits on every statement, so one runaway query cannot take the store (and ingest) down;
        # no one lifts them: read-only sessions are locked with them (readonly = 1), and the full
        # user may only lower them (policy.py)
        self.query_limits = {"max_execution_time": str(query_timeout_seconds),
                             "max_result_bytes": str(max_result_bytes),
                             "max_memory_usage": str(max_query_memory_bytes)}
        self.metrics = SidecarMetrics(store, name, finding_active_window_seconds)
        settings = store.query_arrow("SELECT name FROM system.settings")
        self.known_settings = frozenset(settings.column("name").to_pylist())
        table_functions = store.query_arrow("SELECT name FROM system.table_functions").column("name").to_pylist()
        self.policy = QueryPolicy(table_functions, store.database, self.query_limits,
                                  [self._canonical(sql) for sql in schema_ddl(store.database)])
        self.writes = WriteHealth(self.metrics.failed_writes.labels(name).inc)
        self._heads: dict[str, Statement] = {}
        self.timezone = store.command("SELECT timezone()").strip()
        self.display_name = socket.gethostname()

    # entry point ---------------------------------------------------------------------------------

    def handle_query(self, method: str, params: dict[str, str], headers: dict[str, str], body: bytes) -> Response:
        started = time.perf_counter()
        query_id = params.get("query_id", "")
        if not _QUERY_ID.match(query_id):
            query_id = str(uuid.uuid4())
        try:
            response = self._serve(method, params, headers, body, started)
        except RequestError as e:
            response = self._error(str(e), e.code, e.status)
        except Refused as e:
            response = self._error(str(e), e.code)
        except InsertNotStoredError as e:  # a server fault: 503, so that the writer keeps the rows and retries
            response = self._error(str(e), p.UNKNOWN_EXCEPTION, 503)
            response.headers["Retry-After"] = "1"
        except StoreError as e:
            response = self._error(str(e), e.code or p.UNKNOWN_EXCEPTION, _store_error_status(e))
        except Exception as e:  # a bug here must cost one request, never the server
            log.exception("unexpected error serving a query")
            response = self._error(f"{type(e).__name__}: {e}", p.UNKNOWN_EXCEPTION)
        response.headers.update({"X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": self.timezone,
                                 "X-ClickHouse-Server-Display-Name": self.display_name})
        self.metrics.queries.labels(self.metrics.name).inc()
        self.metrics.duration.labels(self.metrics.name).observe(time.perf_counter() - started)
        return response

    def _error(self, message: str, code: int, status: int | None = None) -> Response:
        self.metrics.errors.labels(self.metrics.name).inc()
        return Response(status or p.http_status(code), p.error_text(message, code).encode(),
                        {"X-ClickHouse-Exception-Code": str(code), "Content-Type": "text/plain; charset=UTF-8"})

    # request -> insert or statement ----------------------------------------------------------------

    def _serve(self, method, params, headers, body, started) -> Response:
        if is_form(headers.get("content-type", "")):
            try:
                params = {**params, **form_fields(headers["content-type"], body)}
            except FormError as e:
                raise RequestError(str(e), p.BAD_ARGUMENTS) from None
            body = b""
        role = self.users.role(*credentials(params, headers))
        readonly = role == "readonly" or method == "GET" or params.get("readonly", "0") not in ("", "0")
        settings = {k: v for k, v in params.items() if k not in p.TRANSPORT_PARAMS and not k.startswith("param_")}
        for name in settings:
            if name not in self.known_settings:
                raise RequestError(f"Setting {name} is neither a builtin setting nor started with the prefix "
                                   "'custom_' registered for user-defined settings", p.UNKNOWN_SETTING)
        self.policy.check_url_settings(settings, readonly)
        query_params = {k[len("param_"):]: v for k, v in params.items() if k.startswith("param_")}
        database = params.get("database") or None
        if database is not None and not IDENTIFIER.match(database):
            raise RequestError(f"invalid database name {database!r}", p.BAD_ARGUMENTS)
        self.policy.check_database(database)
        try:
            body = decompress(body, headers.get("content-encoding", ""), self.max_body_bytes)
        except BodyTooLarge as e:
            raise RequestError(str(e), p.BAD_ARGUMENTS, 413) from None
        except BadEncoding as e:
            raise RequestError(str(e), p.BAD_ARGUMENTS) from None

        query = params.get("query", "")
        if query:
            head = parse_insert_head(query) if LOOKS_LIKE_INSERT.match(query.encode()) else None
            if head:
                data = query[head.data_offset:].encode() + body
                return self._insert(head, data, settings, database, readonly, started)
            text = query + ("\n" + _utf8(body) if body else "")
        else:
            if LOOKS_LIKE_INSERT.match(body):
                head = parse_insert_head(body[:MAX_HEAD_BYTES].decode("latin-1"))
                if head:
                    return self._insert(head, body[head.data_offset:], settings, database, readonly, started)
            text = _utf8(body)
        return self._statement(method, text, query_params, settings, database, readonly, params, started)

    def _insert(self, head: InsertHead, data: bytes, settings, database, readonly, started) -> Response:
        """What runs is ClickHouse's canonical text of the checked head; the data goes to the insert
        stream as data (ClickHouse's parse of an INSERT ends where its data begins: none of the data
        is ever parsed as SQL, so none of it can run as a second statement)."""
        if readonly:
            raise Refused("Cannot execute query in readonly mode (INSERT is not a read)", p.READONLY)
        statement = self._heads.get(head.text)
        if statement is None:
            statement = self._parse(head.text, {})
            if len(self._heads) >= _HEADS_CACHED:
                self._heads.clear()
            self._heads[head.text] = statement
        fmt = self.policy.check_insert(statement, head.format, readonly)
        if fmt == "Values":
            data = _values_alone(data)
        try:
            rows = self.store.insert_stream(without_format(statement.canonical), fmt, [data],
                                            {**settings, **VALUES_AS_DATA}, database)
        except InsertNotStoredError as e:
            self.writes.failed(str(e))
            raise
        except StoreError as e:  # the data's fault (malformed, wrong types, 128, 33, 117 ...) unless the server's
            if e.code is None or e.code in p.SERVER_FAULT_CODES:
                raise
            status = p.http_status(e.code)
            raise RequestError(str(e), e.code, status if status < 500 else 400) from None
        self.writes.stored()
        self.metrics.insert_rows.labels(self.metrics.name, statement.target()[1]).inc(rows)
        return Response(200, b"", {"X-ClickHouse-Summary": _summary(started, written_rows=rows,
                                                                    written_bytes=len(data))})

    def _statement(self, method, text, query_params, settings, database, readonly, params, started) -> Response:
        if not text.strip():
            if method == "GET":
                return Response(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            raise RequestError("Empty query", p.SYNTAX_ERROR)
        statement = self._parse(text, query_params)
        if statement.kind == "use":  # per-session state: each HTTP request is a session of its own
            return Response(200, b"", {"X-ClickHouse-Summary": _summary(started)})
        self.policy.check(statement, readonly)
        if statement.kind == "insert" and output_format(statement.canonical, ""):
            # an INSERT that takes data, not at the very start of the text (a comment before it ...):
            # its data is not in the canonical text, and the raw text never runs
            raise RequestError("an INSERT's data is accepted only after `INSERT INTO <table> [(<columns>)] FORMAT "
                               "<format>` or `... VALUES` at the start of the query", p.SYNTAX_ERROR)
        fmt = output_format(statement.canonical, params.get("default_format") or "TabSeparated")
        if fmt.lower() in _CHDB_ONLY_FORMATS:
            raise RequestError(f"Unknown format {fmt}", p.UNKNOWN_FORMAT)
        # read-only: a session locked (readonly = 1) with the limits; full: the limits, lowered by the URL's
        settings = self.query_limits if readonly else {**self.query_limits, **settings, **VALUES_AS_DATA}
        # what runs is what was checked: the canonical text, and nothing else of the request's
        result = self.store.execute(statement.sql, fmt, query_params, settings, readonly, database)
        out = result.bytes()
        summary = _summary(started, read_rows=result.rows_read(), read_bytes=result.bytes_read(),
                           written_rows=result.rows_written(), written_bytes=result.bytes_written(),
                           result_bytes=len(out))
        return Response(200, out, {"Content-Type": p.content_type(fmt), "X-ClickHouse-Format": fmt,
                                   "X-ClickHouse-Summary": summary})

    def _canonical(self, text: str) -> str:
        """ClickHouse's canonical text of `text` (formatQuerySingleLine, the text passed as a bound
        parameter: one statement or an error, and nothing runs). A string literal may hold bytes that
        are not UTF-8 (`'\\xff'`): they come back as surrogates, and go back out as the same bytes."""
        try:
            result = self.store.execute("SELECT formatQuerySingleLine({q:String})", "TSVRaw",
                                        {"q": format_bind_value(text)}, self.query_limits, readonly=True)
        except StoreError as e:  # keep ClickHouse's words, drop our wrapper query from them
            message = re.sub(r"\s*:?\s*In scope SELECT formatQuerySingleLine\(.*\)\.", "", str(e), flags=re.S)
            raise RequestError(message, e.code or p.SYNTAX_ERROR, _parse_error_status(e.code)) from None
        canonical = result.bytes().decode("utf-8", "surrogateescape").strip()
        if "\n" in canonical:  # one line, by definition: anything else is not this statement's
            log.error("formatQuerySingleLine returned %d lines", canonical.count("\n") + 1)
            raise RequestError("the statement's parse came back malformed", p.UNKNOWN_EXCEPTION)
        return canonical

    def _parse(self, text: str, query_params: dict[str, str]) -> Statement:
        """ClickHouse's own parse of `text`: its canonical text, then its EXPLAIN AST. Both in a
        read-only session: EXPLAIN AST of a SETTINGS clause is refused there already. EXPLAIN AST
        gets the canonical text: one complete statement in ClickHouse's clause order, so nothing of
        it can attach to the EXPLAIN (an EXPLAIN's own INTO OUTFILE would write a file)."""
        canonical = self._canonical(text)
        statement = Statement(canonical, ())
        try:
            explain = self.store.execute(b"EXPLAIN AST " + statement.sql, "TSVRaw", query_params, self.query_limits,
                                         readonly=True).bytes().decode("utf-8", "surrogateescape")
        except StoreError as e:
            refused = _SETTING_CHANGE.search(str(e)) if e.code == p.READONLY else None
            if refused:  # say why, for the full user too (its statements are parsed read-only as well)
                raise RequestError(f"{refused.group(0)}: a SETTINGS clause is not accepted, the per-query "
                                   "limits cannot be lifted", p.READONLY) from None
            raise RequestError(str(e), e.code or p.SYNTAX_ERROR, _parse_error_status(e.code)) from None
        nodes = parse_ast(explain)
        if not nodes:
            log.error("EXPLAIN AST gave nothing for %r", canonical[:200])
            raise RequestError("the statement's parse came back empty", p.SYNTAX_ERROR)
        return Statement(canonical, nodes)


def schema_ddl(database: str) -> list[str]:
    """Every DDL statement of the shipped migrations, as the migrator sends them: the only DDL the
    full user may run (policy.py)."""
    from telemetry.schema import load_migrations, render_migrations
    from telemetry.schema.render import migrations_table_ddl

    return [migrations_table_ddl(database), *render_migrations(load_migrations(), database)]


def _values_alone(data: bytes) -> bytes:
    """VALUES data up to its `;`, where ClickHouse stops reading it; anything after it is refused as
    a second statement (it would never run: it would be dropped without a word)."""
    end = values_data_end(data)
    if end is None:
        return data
    if data[end + 1:].strip():
        raise RequestError("Multi-statements are not allowed: the INSERT's VALUES end at the ';' and the text "
                           "after it would be another statement", p.SYNTAX_ERROR)
    return data[:end]


def _parse_error_status(code: int | None) -> int:
    """Parsing the client's text failed: the text's fault (syntax, depth 306 / 167, a bad bound
    parameter), unless the server ran out of something (memory, slots)."""
    status = p.http_status(code)
    return status if status < 500 or code in p.SERVER_FAULT_CODES else 400


def _store_error_status(e: StoreError) -> int | None:
    """The request's fault, so a 4xx (as a timeout's 408): a statement stopped by its own memory cap
    (the whole server running out of memory is not), an expression in VALUES data (VALUES_AS_DATA),
    and any code protocol.py does not count as the server's. A read of a corrupt part is the
    store's fault: 500 (store_health.py checks the tables then)."""
    if e.code == MEMORY_LIMIT_EXCEEDED and "Query memory limit exceeded" in str(e):
        return 400
    if e.code == SUPPORT_IS_DISABLED:
        return 400
    if e.code in CORRUPTION_CODES:
        return 500
    return None


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the query is not valid UTF-8: {e}", p.SYNTAX_ERROR) from None


def _summary(started: float, read_rows=0, read_bytes=0, written_rows=0, written_bytes=0, result_bytes=0) -> str:
    return json.dumps({
        "read_rows": str(read_rows), "read_bytes": str(read_bytes), "written_rows": str(written_rows),
        "written_bytes": str(written_bytes), "total_rows_to_read": str(read_rows), "result_rows": "0",
        "result_bytes": str(result_bytes), "elapsed_ns": str(int((time.perf_counter() - started) * 1e9)),
    }, separators=(",", ":"))
