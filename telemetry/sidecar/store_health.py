"""Store damage, found and reported loudly: on /health, in the log, on /metrics.

ClickHouse (chdb) keeps serving over damage without a word: at start it detaches a part whose
files do not match their recorded sizes (its rows vanish from every query), a part with wrong
bytes fails the reads that touch it, and a table whose metadata file was deleted is simply gone
while its migration stays recorded as applied (so nothing re-creates it). The sidecar therefore
checks the tables the applied migrations created: in full once at start (`CHECK TABLE`, in a
background thread so ingest does not wait) and again when a read fails on corrupt data; cheaply
(missing tables, parts ClickHouse detached by itself) on every /health and /metrics call.
Nothing is repaired automatically: the log line says what is damaged, the operator decides.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import asdict, dataclass

from telemetry.schema import applied_migrations, load_migrations

log = logging.getLogger(__name__)

# ClickHouse errors a read raises when a part's bytes are wrong. Random bytes where a compressed
# block was give any of them, depending on what the block header now says (measured over 60
# scrambles: UNKNOWN_CODEC 55, TOO_LARGE_SIZE_COMPRESSED 5; a CI run met the second one).
# tests/telemetry/test_store_health_recheck.py checks every name against the running store.
CORRUPTION_ERRORS = {
    3: "UNEXPECTED_END_OF_FILE", 32: "ATTEMPT_TO_READ_AFTER_EOF", 33: "CANNOT_READ_ALL_DATA",
    39: "TOO_LARGE_SIZE_COMPRESSED", 40: "CHECKSUM_DOESNT_MATCH", 89: "UNKNOWN_COMPRESSION_METHOD",
    91: "SIZES_OF_MARKS_FILES_ARE_INCONSISTENT", 117: "INCORRECT_DATA", 246: "CORRUPTED_DATA",
    271: "CANNOT_DECOMPRESS", 432: "UNKNOWN_CODEC", 740: "POTENTIALLY_BROKEN_DATA_PART",
}
CORRUPTION_CODES = frozenset(CORRUPTION_ERRORS)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.I)
# detached parts that name no reason were detached by an operator (ALTER ... DETACH PART): not damage
_DETACHED = ("SELECT table, name, reason FROM system.detached_parts "
             "WHERE database = {db:String} AND reason != '' ORDER BY table, name")
_TABLES = "SELECT name FROM system.tables WHERE database = {db:String}"


@dataclass(frozen=True)
class Damage:
    table: str
    kind: str  # missing_table | detached_part | broken_part | check_failed
    part: str
    detail: str

    def line(self) -> str:
        where = f"table {self.table}" + (f", part {self.part}" if self.part else "")
        return f"store damage: {where}: {self.kind}: {self.detail}"


class StoreHealth:
    """Thread-safe; `status()` and `damage_by_table()` run the cheap checks, `start()` the full one."""

    def __init__(self, store, min_recheck_seconds: float = 300):
        self.store, self.min_recheck_seconds = store, min_recheck_seconds
        self._lock = threading.Lock()
        self._full: list[Damage] = []  # what the latest full check found
        self._full_done = False
        self._running = False
        self._again = False  # a failed read arrived while a check ran: check again when it ends
        self._last_error_check = float("-inf")
        self._logged: set[Damage] = set()

    # the checks --------------------------------------------------------------------------------

    def expected_tables(self) -> list[str]:
        applied = applied_migrations(self.store)
        tables = ["schema_migrations"]
        for migration in load_migrations():
            if migration.version in applied:
                tables += [m.group(1) for s in migration.statements if (m := _CREATE_TABLE.match(s))]
        return list(dict.fromkeys(tables))

    def quick_check(self) -> tuple[list[str], list[Damage]]:
        """(expected tables, damage) from metadata only: milliseconds, whatever the data size."""
        db = {"db": self.store.database}
        try:
            expected = self.expected_tables()
            present = set(self.store.query_arrow(_TABLES, db).column("name").to_pylist())
            detached = self.store.query_arrow(_DETACHED, db).to_pylist()
        except Exception as e:  # the check itself failing is news too
            return [], [Damage("schema_migrations", "check_failed", "", f"cannot read the store's tables: {e}")]
        damage = [Damage(t, "missing_table", "", "the table is gone but its migration is recorded as applied "
                                                 "(deleted metadata?): inserts into it fail")
                  for t in expected if t not in present]
        damage += [Damage(d["table"], "detached_part", d["name"],
                          f"ClickHouse detached the part ({d['reason']}): its rows are missing from every query")
                   for d in detached]
        return expected, damage

    def _check_table(self, table: str) -> list[Damage]:
        try:
            result = self.store.execute(f"CHECK TABLE {self.store.database}.{table}", "JSONEachRow",
                                        settings={"check_query_single_value_result": "0"})
        except Exception as e:
            return [Damage(table, "check_failed", "", str(e).strip())]
        rows = [json.loads(line) for line in result.bytes().decode().splitlines() if line.strip()]
        return [Damage(table, "broken_part", r["part_path"], r["message"] or "CHECK TABLE failed")
                for r in rows if not r["is_passed"]]

    def _full_check(self) -> None:
        while True:
            try:
                expected, damage = self.quick_check()
                missing = {d.table for d in damage if d.kind == "missing_table"}
                for table in expected:
                    if table not in missing:
                        damage += self._check_table(table)
                with self._lock:
                    self._full, self._full_done = damage, True
                self._report(damage)
                if not damage:
                    log.info("store check: %d tables, no damage", len(expected))
            finally:
                with self._lock:
                    again, self._again = self._again, False
                    self._running = again
            if not again:
                return

    # scheduling --------------------------------------------------------------------------------

    def start(self) -> bool:
        """Run the full check in the background (one at a time). Returns whether it started."""
        with self._lock:
            if self._running:
                return False
            self._running = True
        threading.Thread(target=self._full_check, daemon=True, name="store-health").start()
        return True

    def on_error_code(self, code: int | None) -> None:
        """A request failed with `code`: corrupt data schedules a full check (at most one every
        min_recheck_seconds: a damaged table fails every read of it). A check already running may
        have read the table before it went bad, so it runs once more when it ends."""
        if code not in CORRUPTION_CODES:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._last_error_check < self.min_recheck_seconds:
                return
            self._last_error_check = now
            if self._running:
                self._again = True
        log.error("a query failed on corrupt data (ClickHouse code %s): checking every table", code)
        self.start()

    # reporting ---------------------------------------------------------------------------------

    def _current(self) -> tuple[list[str], list[Damage], bool]:
        expected, quick = self.quick_check()
        with self._lock:
            full, done = list(self._full), self._full_done
        # the quick check is the truth for what it covers (a part re-attached is no longer damage)
        damage = quick + [d for d in full if d.kind in ("broken_part", "check_failed")]
        self._report(damage)
        return expected, damage, done

    def status(self) -> dict:
        _, damage, done = self._current()
        state = "damaged" if damage else "ok" if done else "checking"
        return {"status": state, "full_check_done": done, "damage": [asdict(d) for d in damage]}

    def damage_by_table(self) -> dict[str, int]:
        """Every expected table (0 when sound) and any damaged one, with its number of problems."""
        expected, damage, _ = self._current()
        counts = dict.fromkeys(expected, 0)
        for d in damage:
            counts[d.table] = counts.get(d.table, 0) + 1
        return counts

    def _report(self, damage: list[Damage]) -> None:
        with self._lock:
            new = [d for d in damage if d not in self._logged]
            self._logged.update(new)
        for d in new:
            log.error("%s", d.line())
