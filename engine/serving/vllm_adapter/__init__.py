"""infersight beside vLLM: a stat-logger plugin that writes vLLM's steps, finished requests and
replica identity to infersight's store, and a launcher for real vLLM servers.

- `plugin.py`: the `vllm.stat_logger_plugins` entry point (`InfersightStatLogger`), switched on by
  `INFERSIGHT_STORE` (settings.py); it imports vLLM only when vLLM loads it.
- `stats_records.py`: SchedulerStats / IterationStats / FinishedRequestStats -> step and request rows.
- `identity.py`, `config_json.py`: the replica row (weights, tokenizer and chat-template hashes the
  engine's way, VllmConfig as JSON and its hash, placement).
- `request_ids.py`: the request id vLLM gives a request (the key the proxy's rows join on).
- `launch.py`: `start_vllm_server(model_dir, port, ...)` in the `.venv-vllm` environment.

An assembly package (tests/test_import_graph.py, ENGINE_ASSEMBLY): it wires the engine's hashing
and placement with telemetry's Recorder inside vLLM's process.
"""
