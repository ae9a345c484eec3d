"""infersight's vLLM stat-logger plugin: vLLM's per-iteration stats into infersight's store.

Registered in the infersight distribution under vLLM's `vllm.stat_logger_plugins` entry-point
group (pyproject.toml), so a vLLM that sees `pip install infersight` loads it; it records only when
switched on (settings.py: `INFERSIGHT_STORE` or `--additional-config '{"infersight": {...}}'`).

vLLM calls `record()` on its front-end event loop once per engine iteration: the plugin builds one
`steps` row and a `requests` row per finished request (stats_records.py; behind a recording proxy,
which writes the `requests` rows with token IDs, an `engine_request_timings` row the proxy's row
joins on instead) and hands them to
infersight's Recorder, which only appends them to a buffer; a background thread writes them with
clickhouse-connect, spools them to disk while the store is down and replays them with their dedup
tokens. The replica row (identity.py reads the weights to hash them) is built on a thread of its
own. Nothing here raises into vLLM: a failure is logged once and counted in `failures`.

vLLM's base class is mixed in only when vLLM loads the entry point (`InfersightStatLogger`, a
module attribute built on first access), so this module imports without vLLM installed.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time

from engine.serving.vllm_adapter.settings import PluginSettings, SettingsError, read_settings
from engine.serving.vllm_adapter.stats_records import engine_timing_record, request_record, step_record
from telemetry.contract.hooks import ObserverGuard, replay_request

log = logging.getLogger(__name__)


class InfersightStatLoggerCore:
    """The plugin's behaviour, on vLLM's StatLoggerBase interface: (vllm_config, engine_index),
    `record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)`, `log_engine_initialized()`."""

    def __init__(self, vllm_config, engine_index: int = 0):
        self.vllm_config, self.engine_index = vllm_config, engine_index
        self.enabled = False
        self.failures = 0
        self.recorder = None
        self.identity_thread: threading.Thread | None = None
        self._step_id = 0
        self._closed = False
        try:
            self.settings: PluginSettings = read_settings(getattr(vllm_config, "additional_config", None))
        except SettingsError as e:  # a wrong option switches the plugin off, never vLLM
            log.error("infersight: %s; the plugin stays off", e)
            return
        if not self.settings.enabled:
            return
        from engine.serving.vllm_adapter.identity import local_dir, model_name
        from telemetry.recorder import Recorder  # only when switched on: it pulls in pyarrow and the store client

        self.replica_id = self.settings.replica_for_engine(engine_index)
        self.request_rows = self.settings.request_rows
        mc = vllm_config.model_config
        served = mc.served_model_name[0] if isinstance(mc.served_model_name, (list, tuple)) else mc.served_model_name
        self.model_name = model_name(served, mc.model, local_dir(mc.model_weights or mc.model))
        self.recorder = Recorder(self.settings.store, self.replica_id, spool_dir=self.settings.spool_dir)
        self.observer = ObserverGuard(self.recorder)  # a hook that raises is counted, never reaches vLLM
        atexit.register(self.close)  # vLLM gives stat loggers no shutdown call: flush at interpreter exit
        self.enabled = True
        if not getattr(vllm_config.observability_config, "enable_logging_iteration_details", False):
            log.warning("infersight: vLLM runs without --enable-logging-iteration-details: step rows carry no "
                        "batch token counts or durations (only generated tokens, queues, KV and cache stats)")
        log.info("infersight: recording replica %s (model %s) to %s", self.replica_id, self.model_name,
                 self.settings.store.split("@")[-1])

    @property
    def kv_blocks_total(self) -> int:
        return int(getattr(self.vllm_config.cache_config, "num_gpu_blocks", 0) or 0)

    def log_engine_initialized(self) -> None:
        if not self.enabled:
            return
        self.identity_thread = threading.Thread(target=self._record_identity, daemon=True,
                                                name=f"infersight-identity-{self.replica_id}")
        self.identity_thread.start()

    def _record_identity(self) -> None:
        try:
            import vllm

            from engine.serving.vllm_adapter.identity import chat_template_argument, replica_record

            argument = chat_template_argument(sys.argv)
            record = replica_record(self.vllm_config, replica_id=self.replica_id,
                                    engine_version=f"vllm-{vllm.__version__}", chat_template=argument,
                                    chat_template_text=_load_chat_template(argument),
                                    labels=self.settings.labels)
            self.observer.on_replica_start(record)
        except Exception:  # noqa: BLE001 - identity is best effort; serving goes on
            self.failures += 1
            log.exception("infersight: cannot build the replica row for %s", self.replica_id)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if not self.enabled or (scheduler_stats is None and iteration_stats is None):
            return
        try:
            now = iteration_stats.iteration_timestamp if iteration_stats is not None else time.time()
            for finished in iteration_stats.finished_requests if iteration_stats is not None else ():
                record = request_record(finished, now, replica_id=self.replica_id, model_name=self.model_name)
                if self.request_rows:
                    replay_request(self.observer, record)
                else:  # a proxy in front writes the request's row; this is the engine's timing it joins
                    self.recorder.record("engine_request_timings", engine_timing_record(record))
            # a SchedulerStats is one engine-core step; without one (another front end got it), a step that generated
            if scheduler_stats is not None or iteration_stats.num_generation_tokens:
                self._step_id += 1
                self.observer.on_step(step_record(scheduler_stats, iteration_stats, replica_id=self.replica_id,
                                                  step_id=self._step_id, now=now,
                                                  kv_blocks_total=self.kv_blocks_total))
        except Exception:  # noqa: BLE001 - never into vLLM's output handler (it would fail every request)
            self.failures += 1
            if self.failures == 1:
                log.exception("infersight: cannot map vLLM's stats (further failures only counted)")

    def close(self) -> None:
        """Final flush (at exit); idempotent."""
        if self._closed or self.recorder is None:
            return
        self._closed = True
        self.recorder.close()


def _load_chat_template(argument: str | None) -> str | None:
    """The template vLLM's server loads from its `--chat-template` argument (a file, a literal, or a built-in name)."""
    if argument is None:
        return None
    from vllm.renderers.chat_utils import load_chat_template

    return load_chat_template(argument)


def _build_plugin_class():
    from vllm.v1.metrics.loggers import StatLoggerBase

    class InfersightStatLogger(InfersightStatLoggerCore, StatLoggerBase):
        """infersight's recorder as a vLLM stat logger (one per engine index)."""

    InfersightStatLogger.__module__, InfersightStatLogger.__qualname__ = __name__, "InfersightStatLogger"
    return InfersightStatLogger


def __getattr__(name: str):
    # the entry point's target: vLLM resolves it, and only then is vLLM imported
    if name == "InfersightStatLogger":
        cls = globals()[name] = _build_plugin_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
