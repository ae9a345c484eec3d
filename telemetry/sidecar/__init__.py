"""The sidecar: the embedded store (chdb) served over the ClickHouse HTTP protocol.

`infersight sidecar --data-dir D --port P` (see cli.py); `start_sidecar(...)` (process.py) runs
one as a subprocess for tests and the fleet.
"""
