"""Waiting for a request's row: the recorder flushes in the background, so tests poll with a deadline."""

from __future__ import annotations

import time


def stored_request(store, request_id: str, timeout: float = 20.0):
    """The `requests` rows of `request_id` (a DataFrame), once there or when `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        df = store.query_df("SELECT * FROM requests WHERE request_id = {id:String}", {"id": request_id})
        if len(df) or time.monotonic() > deadline:
            return df
        time.sleep(0.2)
