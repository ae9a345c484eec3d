"""Shed load instead of queueing without limit.

A replica runs at most `max_num_seqs` requests at once; the others wait in the
engine's queue, each holding a connection and its tokenized prompt. Without a
bound a flood grows that queue (and every waiting request's latency) until the
process runs out of memory. So the server counts the requests it holds (being
admitted, waiting or running) and, once `max_num_seqs + max_queue` are in, answers
a new one at once with 429 and `Retry-After`: the client or the balancer comes
back later or goes to another replica, and the requests already in keep their
latency. Each refusal is a `requests` row (error code queue_full, with the queue's state: rejections.py)
and is counted (`infersight_requests_shed_total`) when the metrics fold that row.
"""

from __future__ import annotations

from engine.serving.server.errors import APIError

QUEUE_PER_RUNNING_SEQ = 4  # default waiting room: four batches' worth of requests behind the running one
RETRY_AFTER_SECONDS = 1


def default_max_queue(max_num_seqs: int) -> int:
    return QUEUE_PER_RUNNING_SEQ * max_num_seqs


class LoadShedder:
    def __init__(self, max_running: int, max_queue: int):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_running, self.max_queue = max_running, max_queue
        self.limit = max_running + max_queue
        self.shed = 0

    def check(self, held: int) -> None:
        """429 when `held` requests (admitted and not yet answered) already fill the running batch and
        the queue."""
        if held < self.limit:
            return
        self.shed += 1
        raise APIError(f"the replica is at capacity: {held} requests in flight ({self.max_running} running + "
                       f"{self.max_queue} queued at most); retry after {RETRY_AFTER_SECONDS} s or use another "
                       "replica", status=429, type="rate_limit_error", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                       detail={"in_flight": held, "max_running": self.max_running, "max_queue": self.max_queue})

