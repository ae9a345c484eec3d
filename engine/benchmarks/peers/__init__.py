"""`infersight bench peers`: the same token-ID workloads through infersight and each installed peer.

Peers: transformers `generate`, vLLM (CPU build), CTranslate2 and llama.cpp (llama-cpp-python), each
optional. Every side runs in a subprocess of its own interpreter (its own venv), gets the workloads as
JSON token IDs, and answers with JSON; the driver files (`drive_*.py`) import only the stdlib, the
peer's library and `_driver_io` (so that other interpreters can run them), except infersight's and
transformers', which run in infersight's venv. See `cli.py` for the command and `runner.py` for the
protocol.
"""
