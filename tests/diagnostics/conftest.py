"""A migrated embedded store per test module, emptied before each test that asks for `clean`."""

from __future__ import annotations

import pytest

from telemetry.contract.records import RECORD_TYPES
from telemetry.schema import migrate
from telemetry.store import open_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("diag_store"))
    migrate(s)
    yield s
    s.close()


@pytest.fixture
def clean(store):
    for table in RECORD_TYPES:
        store.command(f"TRUNCATE TABLE {table}")
    return store
