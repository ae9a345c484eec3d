"""The attack suite, generated: statement forms for both users (the read-only user and the writer,
whose credentials every replica holds), each alone and after an INSERT prefix (VALUES or FORMAT
Values, with every kind of separator: `;`, newlines, comments), in the body, in the URL, or split
between the two; URL settings; request bodies. Whatever the input: no 5xx, no file written
(attacked_sidecar's target and the data directory), no outbound connection (its loopback
listener), no second statement run (neither the prefix's rows nor the form's are stored)."""

from __future__ import annotations

import gzip
import time
import zlib

import httpx
import pytest
from attacked_sidecar import (  # noqa: F401 - the fixtures: target, listener, sidecar, nothing_escaped
    CHANGES, LEAKS, ROLES, WRITER, assert_nothing_escaped, attacks, listener, nothing_escaped, send, sidecar,
    target,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from telemetry.sidecar.policy import INSERT_FORMATS, LIMIT_SETTINGS, URL_SETTINGS

# sized so that the whole file runs in a few minutes on a busy 2-core machine
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# what a second statement would leave behind: rows no test sends otherwise
MARKER = "attack-second"
PREFIX_ID = "attack-prefix"
PLANTED = (f"INSERT INTO steps (replica_id) VALUES ('{MARKER}')",
           f"INSERT INTO requests (replica_id, request_id) SELECT '{MARKER}', toString(number) FROM numbers(3)")
HEADS = ("INSERT INTO requests (replica_id, request_id) VALUES",
         "INSERT INTO requests (replica_id, request_id) FORMAT Values",
         "INSERT INTO requests (replica_id, request_id) FORMAT Values\n",
         "insert into requests (replica_id, request_id) values",
         "INSERT INTO default.requests (replica_id, request_id) VALUES",
         "INSERT INTO TABLE requests (`replica_id`, `request_id`) VALUES")
ROWS = (f"('{PREFIX_ID}', 'r1')", f"('{PREFIX_ID}', 'a;b')", f"('{PREFIX_ID}', 'it''s'), ('{PREFIX_ID}', 'x\\\\')",
        f" ('{PREFIX_ID}', '\\';')")
SEPARATORS = (";", "; ", ";\n", " ;\n\n", ";-- a comment\n", "; /* a comment */ ", ";\r\n", "\n;", ";;", ";\t# c\n",
              "; \n -- c\n ; ")


def forms(target, listener) -> list[str]:
    return [*attacks(target, listener).values(), *CHANGES.values(), *LEAKS.values(), *PLANTED,
            "SELECT 1", "SELECT count() FROM steps", "SET max_execution_time = 0", "SELECT '\\xff'"]


def post(sidecar, who: str, sql: str, where: str) -> httpx.Response:
    """`sql` sent in the body, in the URL's query parameter, or its first line in the URL and the rest
    in the body (ClickHouse reads the two as one text)."""
    if where == "body":
        return send(sidecar, sql, who)
    if where == "query":
        return httpx.post(sidecar.url, params={"query": sql}, auth=ROLES[who], timeout=60)
    head, _, rest = sql.partition("\n")
    return httpx.post(sidecar.url, params={"query": head + "\n"}, content=rest.encode(), auth=ROLES[who], timeout=60)


def assert_no_second_statement(sidecar) -> None:
    r = send(sidecar, f"SELECT (SELECT count() FROM steps WHERE replica_id = '{MARKER}') + (SELECT count() FROM "
                      f"requests WHERE replica_id IN ('{MARKER}', '{PREFIX_ID}'))", "readonly")
    assert r.status_code == 200 and r.text == "0\n", f"a statement ran that must not have: {r.text}"


# every form after an INSERT prefix -------------------------------------------------------------------------

@SETTINGS
@given(data=st.data(), head=st.sampled_from(HEADS), rows=st.sampled_from(ROWS), sep=st.sampled_from(SEPARATORS),
       who=st.sampled_from(["readonly", "writer"]), where=st.sampled_from(["body", "query", "split"]))
def test_no_form_runs_after_an_insert_prefix(sidecar, target, listener, data, head, rows, sep, who, where):
    form = data.draw(st.sampled_from(forms(target, listener)), label="form")
    r = post(sidecar, who, f"{head} {rows}{sep}{form}", where)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    # refused before anything ran: as a write (read-only user), as a second statement (writer)
    assert r.headers["X-ClickHouse-Exception-Code"] == ("164" if who == "readonly" else "62"), r.text
    assert_no_second_statement(sidecar)
    assert_nothing_escaped(target, listener, sidecar)


def test_the_seen_attack_reads_no_file_and_runs_nothing(sidecar):
    """The issue's own: a second statement after the writer's INSERT ... VALUES."""
    for table in ("schema_migrations", "requests"):
        columns, row = (("version, name, checksum, applied_at", "(1, 'x', 'y', '2020-01-01 00:00:00')")
                        if table == "schema_migrations" else ("replica_id, request_id", f"('{PREFIX_ID}', 'seen')"))
        for second in ("SELECT * FROM file('/etc/hostname', 'LineAsString')", "SET max_execution_time = 0",
                       "SELECT 1 INTO OUTFILE 'attack-seen.txt'", "SELECT * FROM executable('x.sh', 'TSV', 'a String')"):
            r = send(sidecar, f"INSERT INTO {table} ({columns}) VALUES {row}; {second}", "writer")
            assert 400 <= r.status_code < 500, r.text
            assert r.headers["X-ClickHouse-Exception-Code"] == ("497" if table == "schema_migrations" else "62")
            assert open("/etc/hostname").read().strip() not in r.text
    assert_no_second_statement(sidecar)
    r = send(sidecar, "SELECT count() FROM schema_migrations WHERE name = 'x'", "readonly")
    assert r.text == "0\n"


def test_values_may_end_with_a_semicolon(sidecar):
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())  # (eval_runs' TTL drops rows of 1970 at once)
    r = send(sidecar, f"INSERT INTO eval_runs (run_id, suite, start_time) VALUES ('semi', 's', '{now}'), "
                      f"('semi', 'a;b', '{now}') ;\n ", "writer")
    assert r.status_code == 200, r.text
    assert send(sidecar, "SELECT count() FROM eval_runs WHERE run_id = 'semi'", "readonly").text == "2\n"


# every form alone, anywhere in the request ---------------------------------------------------------------------

@SETTINGS
@given(data=st.data(), who=st.sampled_from(["readonly", "writer"]), where=st.sampled_from(["body", "query"]),
       around=st.sampled_from(["{}", " {} ", "-- c\n{}", "/* c */ {}", "{};", "{}\n;\n", "({})"]))
def test_no_form_reaches_outside_the_store(sidecar, target, listener, data, who, where, around):
    form = data.draw(st.sampled_from(forms(target, listener)), label="form")
    r = post(sidecar, who, around.format(form), where)
    assert r.status_code < 500, (r.status_code, r.text)
    assert_no_second_statement(sidecar)
    assert_nothing_escaped(target, listener, sidecar)


# token soup: whatever the text, a 4xx at worst ----------------------------------------------------------------

TOKENS = ("SELECT", "INSERT", "INTO", "requests", "steps", "(replica_id)", "VALUES", "FORMAT", "Values", "CSV",
          "Native", "SETTINGS", "max_threads", "=", "100000", "FROM", "numbers(3)", "file(", "url(", "')'", ";", ",",
          "(", ")", "'", '"', "`", "\\", "--", "/*", "*/", "#", "\n", "1", "'\\xff'", "'\\0'", "[", "]", "sleepEachRow(3)",
          "INTO OUTFILE", "'attack-soup'", "EXPLAIN", "AST", "SYNTAX", "WITH", "x AS", "format(", "input(", "UNION ALL",
          "system.one", "SET", "readonly", "0", "$$", "{p:String}", "\t", "\r", "é", "\u2028")


@SETTINGS
@given(tokens=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=14), joiner=st.sampled_from([" ", "", "\n"]),
       who=st.sampled_from(["readonly", "writer"]), where=st.sampled_from(["body", "query", "split"]))
def test_no_text_gets_a_server_error(sidecar, target, listener, tokens, joiner, who, where):
    r = post(sidecar, who, joiner.join(tokens), where)
    assert r.status_code < 500, (r.status_code, r.text)
    assert_no_second_statement(sidecar)
    assert_nothing_escaped(target, listener, sidecar)


@pytest.mark.parametrize("who", ["readonly", "writer"])
def test_client_mistakes_are_4xx_with_clickhouses_code(sidecar, who):
    cases = {
        "SELECT " + "(" * 1200 + "1" + ")" * 1200: "306",  # parser depth
        "SELECT " + "+".join(["1"] * 3000): "167",  # AST depth
        "SELECT sleepEachRow(3) FROM numbers(2)": "160",
        "SELEC 1": "62",
        "SELECT no_such_function(1)": "46",
        "SELECT toUInt8('\\xff\\xfe')": "6",  # ClickHouse's message quotes bytes that are not UTF-8
    }
    for sql, code in cases.items():
        r = send(sidecar, sql, who)
        assert 400 <= r.status_code < 500 and r.headers["X-ClickHouse-Exception-Code"] == code, (sql[:40], r.text)
        assert r.text.startswith(f"Code: {code}. DB::Exception:"), r.text
    r = httpx.post(sidecar.url, content=b"SELECT '\xff\xfe'", auth=ROLES[who], timeout=60)  # not UTF-8
    assert r.status_code == 400 and r.headers["X-ClickHouse-Exception-Code"] == "62"
    r = send(sidecar, "SELECT '\\xff'", who)  # an escape for a byte that is not UTF-8: the byte comes back
    assert r.status_code == 200 and r.content == b"\xff\n", r.text


def test_malformed_insert_data_is_4xx(sidecar):
    native = b"\x02\x01\x01a\x06UInt32\x01\x00\x00\x00\x01b\x0dArray(String)\xff\xff\xff\xff\xff\xff\xff\x7f"
    for fmt, body, code in (("Native", native, "128"), ("Native", b"\x03\x01garbage", None), ("Arrow", b"junk", None),
                            ("Values", b"('x', 1", None), ("CSV", b'"unterminated', None)):
        r = httpx.post(sidecar.url, params={"query": f"INSERT INTO eval_runs (run_id, suite) FORMAT {fmt}"},
                       content=body, auth=WRITER, timeout=60)
        assert 400 <= r.status_code < 500, (fmt, r.status_code, r.text)
        assert code is None or r.headers["X-ClickHouse-Exception-Code"] == code, r.text


# URL settings -----------------------------------------------------------------------------------------------

SETTING_NAMES = (*sorted(URL_SETTINGS), *LIMIT_SETTINGS, "readonly", "allow_experimental_eval_table_function",
                 "allow_introspection_functions", "max_parser_depth", "max_query_size", "input_format_values_"
                 "interpret_expressions", "log_queries", "max_rows_to_read", "custom_x", "no_such_setting")
SETTING_VALUES = st.one_of(st.sampled_from(["0", "1", "-1", "100000", "1e308", "nan", "inf", "18446744073709551616",
                                            "best_effort", "true", "", "' OR 1 --", "a\nb", "tok-1", "x" * 300]),
                           st.text(max_size=12))


@SETTINGS
@given(chosen=st.dictionaries(st.sampled_from(SETTING_NAMES), SETTING_VALUES, min_size=1, max_size=3),
       who=st.sampled_from(["readonly", "writer"]), insert=st.booleans())
def test_url_settings_lift_nothing(sidecar, target, listener, chosen, who, insert):
    if insert:
        r = httpx.post(sidecar.url, params={"query": "INSERT INTO eval_runs (run_id, suite) FORMAT CSV", **chosen},
                       content=b"url-settings,s\n", auth=ROLES[who], timeout=60)
    else:
        r = httpx.post(sidecar.url, params=chosen, content=b"SELECT getSetting('max_threads')", auth=ROLES[who],
                       timeout=60)
    assert r.status_code < 500, (r.status_code, r.text)
    sent = set(chosen) - {"readonly"}  # (a transport switch: it can only narrow a role)
    if r.status_code == 200:  # only the writer's settings, limits only lowered
        assert sent <= URL_SETTINGS | set(LIMIT_SETTINGS) and (who == "writer" or not sent), chosen
        threads = chosen.get("max_threads")
        assert threads is None or 0 < float(threads) <= sidecar_cpus(sidecar)
    assert_nothing_escaped(target, listener, sidecar)


def sidecar_cpus(sidecar) -> float:
    r = send(sidecar, "SELECT getSetting('max_threads')", "readonly")
    return float(r.text.strip().strip("'").removeprefix("auto(").removesuffix(")"))


def test_the_writer_cannot_lift_max_threads(sidecar):
    for value in ("100000", "0", str(int(sidecar_cpus(sidecar)) + 1)):
        r = send(sidecar, "SELECT 1", "writer", {"max_threads": value})
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "497", r.text


# bodies ------------------------------------------------------------------------------------------------------

ENCODINGS = {"identity": ("", lambda b: b), "gzip": ("gzip", gzip.compress), "deflate": ("deflate", zlib.compress),
             "bogus": ("bogus", lambda b: b), "gzip, truncated": ("gzip", lambda b: gzip.compress(b)[:12]),
             "gzip, not gzip": ("gzip", lambda b: b)}


@SETTINGS
@given(fmt=st.sampled_from([*INSERT_FORMATS.values(), "Parquet", "Protobuf", "Template", "LineAsString"]),
       payload=st.binary(max_size=200), encoding=st.sampled_from(sorted(ENCODINGS)),
       who=st.sampled_from(["readonly", "writer"]), inline=st.booleans())
def test_no_body_gets_a_server_error(sidecar, target, listener, fmt, payload, encoding, who, inline):
    head = f"INSERT INTO eval_runs (run_id, suite) FORMAT {fmt}\n"
    body = (head.encode() + payload) if inline else payload
    params = {} if inline else {"query": head}
    name, encode = ENCODINGS[encoding]
    headers = {"Content-Encoding": name} if name else {}
    r = httpx.post(sidecar.url, params=params, content=encode(body), headers=headers,
                   auth=ROLES[who], timeout=60)
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code == 200:
        assert who == "writer" and fmt in INSERT_FORMATS.values()
    assert_nothing_escaped(target, listener, sidecar)


# DDL: the schema's own statements only -----------------------------------------------------------------------------

def test_the_writer_runs_no_ddl_but_the_schemas_own(sidecar):
    for sql in ("CREATE TABLE IF NOT EXISTS requests (a UInt8) ENGINE = MergeTree ORDER BY a",
                "CREATE TABLE IF NOT EXISTS attack_t (a UInt8) ENGINE = MergeTree ORDER BY a",
                "ALTER TABLE requests ADD COLUMN IF NOT EXISTS attack_c UInt8",
                "ALTER TABLE requests MODIFY COLUMN request_id String"):
        r = send(sidecar, sql, "writer")
        assert r.status_code == 403 and r.headers["X-ClickHouse-Exception-Code"] == "497", (sql, r.text)
    r = httpx.post(sidecar.url, params={"query": "INSERT INTO schema_migrations (version, name, checksum) FORMAT CSV"},
                   content=b"999,attack,x\n", auth=WRITER, timeout=60)
    assert r.status_code == 403, r.text  # a forged migration record would stop the sidecar's next start
    r = send(sidecar, "SELECT count() FROM system.columns WHERE table = 'requests' AND name = 'attack_c'", "readonly")
    assert r.text == "0\n"


# form bodies: any charset a part declares, any bytes, any field ------------------------------------------------

CHARSETS = ("utf-8", "latin-1", "unicode_escape", "utf-7", "utf-16", "raw_unicode_escape", "punycode", "idna",
            "rot13", "no-such-codec", "")
PAYLOADS = (b"SELECT 1", b"\\ud800", b"+2D8-", b"\xff\xfe\x00\xd8", b"SELECT '\\ud800'", b"\xed\xa0\x80",
            b"INSERT INTO requests (replica_id) VALUES ('attack-second')")


@SETTINGS
@given(field=st.sampled_from(["query", "user", "password", "param_p", "max_threads", "database", "default_format"]),
       charset=st.sampled_from(CHARSETS), payload=st.sampled_from(PAYLOADS), who=st.sampled_from(["readonly", "writer"]))
def test_no_form_part_gets_a_server_error(sidecar, target, listener, field, charset, payload, who):
    """A multipart part's declared charset is the client's: a codec that makes lone surrogates out of
    bytes (unicode_escape, utf-7) must be refused, never reach an .encode() that raises (a 500)."""
    boundary = "b0undary"
    content_type = f"text/plain; charset={charset}" if charset else "text/plain"
    parts = [("query", "text/plain; charset=utf-8", b"SELECT 1")] if field != "query" else []
    parts.append((field, content_type, payload))
    body = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\nContent-Type: {ctype}\r\n\r\n"
                    .encode() + data + b"\r\n" for name, ctype, data in parts) + f"--{boundary}--\r\n".encode()
    r = httpx.post(sidecar.url, content=body, auth=ROLES[who], timeout=60,
                   headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code < 500, (field, charset, payload, r.status_code, r.text)
    assert_no_second_statement(sidecar)
    assert_nothing_escaped(target, listener, sidecar)
