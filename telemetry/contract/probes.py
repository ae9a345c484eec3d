"""How a probe request is named, so the prober that sends it and the diagnostics that read it agree.

A probe is a greedy request from the shipped probe suite (engine/traffic/probe/suite.py) sent to every
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


# --- rescore requests (cross-scoring: engine/traffic/probe/rescore.py, diagnostics/rescore.py) ---------
# A request replica R served, sent teacher-forced (prompt + output as the prompt, prompt_logprobs 0,
# max_tokens 1) to a scorer replica S (R itself included: the self-rescoring control). Its row
# carries workload "rescore" and the request id
#
#     rescore.<round_id>.<scorer_replica>.<original_request_id>
#
# (round_id as a probe round's; the scorer is also the row's replica_id, so the SQL strips the
# known prefix and dots in replica ids or request ids are fine).
RESCORE_WORKLOAD = "rescore"
# workloads the fleet sends itself: no client traffic, excluded from every traffic statistic
ACTIVE_WORKLOADS = (PROBE_WORKLOAD, RESCORE_WORKLOAD)
# the same as a SQL tuple literal: `workload NOT IN {ACTIVE_WORKLOADS_SQL}`
ACTIVE_WORKLOADS_SQL = "(" + ", ".join(f"'{w}'" for w in ACTIVE_WORKLOADS) + ")"


@dataclass(frozen=True)
class RescoreRequestId:
    round_id: str
    scorer_replica: str
    original_request_id: str

    def __str__(self) -> str:
        return f"rescore.{self.round_id}.{self.scorer_replica}.{self.original_request_id}"


def rescore_request_id(round_: str, scorer_replica: str, original_request_id: str) -> str:
    if not re.match(r"^p\d+$", round_):
        raise ValueError(f"round id {round_!r}: 'p' and epoch milliseconds (telemetry.contract.probes.round_id)")
    if not scorer_replica or not original_request_id:
        raise ValueError("a rescore request id needs the scorer replica and the original request id")
    return str(RescoreRequestId(round_, scorer_replica, original_request_id))


def parse_rescore_request_id(request_id: str, scorer_replica: str) -> RescoreRequestId | None:
    """The parts of a rescore request's id, given its row's replica_id (the scorer); None for any other."""
    m = re.match(r"^rescore\.(p\d+)\.", request_id)
    if not m:
        return None
    rest = request_id[m.end():]
    if not rest.startswith(scorer_replica + ".") or len(rest) == len(scorer_replica) + 1:
        return None
    return RescoreRequestId(m.group(1), scorer_replica, rest[len(scorer_replica) + 1:])


# the same in SQL over a requests row (its request_id and replica_id columns): the round, '' elsewhere
RESCORE_ROUND_SQL = "extract(request_id, '^rescore\\\\.(p\\\\d+)\\\\.')"
# the original request id, '' for any other row
RESCORE_ORIGINAL_SQL = (f"if(startsWith(request_id, concat('rescore.', {RESCORE_ROUND_SQL}, '.', replica_id, '.')) "
                        f"AND {RESCORE_ROUND_SQL} != '', substring(request_id, "
                        f"length(concat('rescore.', {RESCORE_ROUND_SQL}, '.', replica_id, '.')) + 1), '')")
