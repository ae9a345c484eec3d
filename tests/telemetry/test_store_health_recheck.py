"""A failed read that arrives while a store check is running gets a check of its own.

The running check may already have read the table before its bytes went bad; without the
re-run, damage found by a failing read stayed unreported for min_recheck_seconds (a flaky
CI run showed it: the start-up check was still finishing when the first corrupt read came).
"""

from telemetry.sidecar.store_health import CORRUPTION_ERRORS, StoreHealth


def test_a_corrupt_read_during_a_running_check_runs_the_check_again(store, monkeypatch):
    health = StoreHealth(store)
    checks = []
    monkeypatch.setattr(health, "_check_table", lambda table: checks.append(table) or [])
    health._running = True  # the start-up check is under way ...
    health.on_error_code(40)  # ... when a read fails with CHECKSUM_DOESNT_MATCH
    health._full_check()  # the running check finishes
    tables = health.expected_tables()
    assert checks == tables + tables  # and every table was checked once more after the failed read
    assert health._running is False


def test_errors_that_are_not_corruption_start_no_check(store, monkeypatch):
    health = StoreHealth(store)
    started = []
    monkeypatch.setattr(health, "start", lambda: started.append(1) or True)
    health.on_error_code(62)  # SYNTAX_ERROR
    health.on_error_code(None)
    assert started == []
    health.on_error_code(432)  # UNKNOWN_CODEC: random bytes where a block header was
    health.on_error_code(40)  # within min_recheck_seconds of the last: no second check
    assert started == [1]


def test_every_corruption_code_names_the_error_it_means_in_the_running_store(store):
    codes = sorted(CORRUPTION_ERRORS)
    names = store.query_arrow("SELECT errorCodeToName(c) AS name FROM (SELECT arrayJoin({codes:Array(UInt32)}) AS c)",
                              {"codes": codes}).column("name").to_pylist()
    assert dict(zip(codes, names)) == CORRUPTION_ERRORS


def test_a_compressed_block_claiming_a_huge_size_starts_a_check(store, monkeypatch):
    # what scrambled bytes gave on a CI run: TOO_LARGE_SIZE_COMPRESSED, not a checksum error
    health = StoreHealth(store)
    started = []
    monkeypatch.setattr(health, "start", lambda: started.append(1) or True)
    health.on_error_code(39)
    assert started == [1]
