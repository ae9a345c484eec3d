"""How a probe request is named, so the prober that sends it and the diagnostics that read it agree.

A probe is a greedy request from the shipped probe suite (engine/probe/suite.py) sent to every
replica by `infersight probe` or the fleet's scheduled prober. Its row in `requests` carries
workload "probe" and a request id that says which round, which probe and how it was sent:

    probe.<round_id>.<probe_id>.<mode>.<replica_id>

- round_id: "p" + the round's start in epoch milliseconds (one round = the suite once on every replica);
- probe_id: the probe's name in the suite ([a-z0-9_]+);
- mode: "solo" (sent alone: batch size 1 on an idle replica) or "batched" (sent inside a burst of
  filler requests: a batch-invariant replica answers both identically);
- replica_id: the replica it was sent to (request ids are unique per replica start, and the prober
  sends the same probe to every replica).
Stdlib only, like the rest of telemetry.contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROBE_WORKLOAD = "probe"
MODES = ("solo", "batched")
# the requests that keep a replica busy while a "batched" probe runs carry probe ids starting with
# this (filler_0, filler_1 ...): recorded like probes, compared by no diagnostic
FILLER_PREFIX = "filler_"
_NAME = re.compile(r"^[a-z0-9_]+$")
_ID = re.compile(r"^probe\.(p\d+)\.([a-z0-9_]+)\.(solo|batched)\.(.+)$")


@dataclass(frozen=True)
class ProbeRequestId:
    round_id: str
    probe_id: str
    mode: str
    replica_id: str

    def __str__(self) -> str:
        return f"probe.{self.round_id}.{self.probe_id}.{self.mode}.{self.replica_id}"


def round_id(start_time: float) -> str:
    """The id of a round that starts at `start_time` (epoch seconds)."""
    return f"p{int(start_time * 1000)}"


def probe_request_id(round_: str, probe_id: str, mode: str, replica_id: str) -> str:
    if not _NAME.match(probe_id):
        raise ValueError(f"probe id {probe_id!r}: use lowercase letters, digits and _")
    if mode not in MODES:
        raise ValueError(f"probe mode {mode!r}: one of {', '.join(MODES)}")
    if not re.match(r"^p\d+$", round_):
        raise ValueError(f"round id {round_!r}: 'p' and epoch milliseconds (telemetry.contract.probes.round_id)")
    return str(ProbeRequestId(round_, probe_id, mode, replica_id))


def parse_probe_request_id(request_id: str) -> ProbeRequestId | None:
    """The parts of a probe's request id; None for any other request."""
    m = _ID.match(request_id)
    return ProbeRequestId(*m.groups()) if m else None


# the same parse in SQL, for diagnostics that group probes in the store (extractGroups on request_id)
PROBE_ID_REGEX_SQL = r"'^probe\\.(p\\d+)\\.([a-z0-9_]+)\\.(solo|batched)\\.(.+)$'"
