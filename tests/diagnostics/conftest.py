"""`clean`: the module's migrated store (tests/conftest.py), emptied before each test that asks for it."""

from __future__ import annotations

import pytest

from telemetry.contract.records import RECORD_TYPES


@pytest.fixture
def clean(store):
    for table in RECORD_TYPES:
        store.command(f"TRUNCATE TABLE {table}")
    return store
