"""The prober: a golden probe suite sent to every replica, alone and inside a busy batch.

suite.py (what is sent), budget.py (how much of it a round may send), measure.py (prompt
lengths, the near-context prompt), runner.py (one round), schedule.py (rounds on an interval),
pin.py (a round pinned as the baseline), cli.py (`infersight probe`). The request ids and the
pinned rows are the contract's: telemetry/contract/probes.py, ProbeBaselineRecord.
"""
