"""What the engine tells its observer: lifecycle hooks, a finished request's record, one StepRecord per forward.

Only used while an observer listens (the engine checks `observer.enabled` first, so with nobody listening no
record is built). The observer's own time is measured here and carried by the next step record as its
`telemetry_seconds`: a step record cannot contain its own cost, so that goes to the one after it.
"""

from __future__ import annotations

import logging
import time

from engine.core.engine_records import build_request_record, build_step_record
from engine.core.phase_timer import PhaseTimer
from engine.core.sequence import Sequence
from engine.core.step_result import StepResult
from telemetry.contract.hooks import EngineObserver

log = logging.getLogger(__name__)
perf_counter = time.perf_counter


class EngineTelemetry:
    def __init__(self, observer: EngineObserver, replica_id: str, model_name: str, kv_cache, scheduler):
        self.observer = observer
        self.replica_id = replica_id
        self.model_name = model_name
        self.kv_cache = kv_cache
        self.scheduler = scheduler
        self.seconds = 0.0  # observer time since the last step record
        self._last_evictions = 0

    def notify(self, hook: str, *args) -> None:
        t = perf_counter()
        getattr(self.observer, hook)(*args)
        self.seconds += perf_counter() - t

    def request_finished(self, seq: Sequence, text: str) -> None:
        t = perf_counter()
        self._report_finished(seq, text)
        self.seconds += perf_counter() - t

    def _report_finished(self, seq: Sequence, text: str) -> None:
        try:  # one request's record that cannot be built must not end the step of the others
            record = build_request_record(seq, replica_id=self.replica_id, model_name=self.model_name,
                                          output_text=text)
        except Exception:  # noqa: BLE001
            log.exception("the record of request %s could not be built", seq.request_id)
            return
        self.observer.on_request_finished(record)

    def steps(self, step_id: int, batch, timer: PhaseTimer, result: StepResult, finished: list,
              context_lens: list[int], spec_fields: dict) -> None:
        """One StepRecord per forward, numbered from `step_id`: a multi-step batch's sub-steps
        (engine/core/multi_step.py) each have their own, sub-step j counting the sequences that kept a j-th
        token and reading one more position; the step's finished requests are reported before the last."""
        splits = timer.splits(result.forward_seconds)
        start, last = timer.start_wall, len(splits) - 1
        kv = self.kv_cache
        for j, split in enumerate(splits):
            t = perf_counter()
            telemetry_seconds, self.seconds = self.seconds, 0.0
            for seq, out in finished if j == last else ():
                self._report_finished(seq, out.text)
            generated = sum(1 for n in result.kept if n > j) if last else sum(result.kept)
            record = build_step_record(
                self.replica_id, step_id + j, batch, start, split, generated, telemetry_seconds, kv,
                kv.evictions - self._last_evictions, self.scheduler, spec_fields, [n + j for n in context_lens])
            self._last_evictions = kv.evictions
            self.observer.on_step(record)
            start += sum(split)
            self.seconds += perf_counter() - t
