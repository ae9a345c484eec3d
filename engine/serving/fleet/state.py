"""The fleet's state file: what runs where, so `status` and `down` can find it.

`<run_dir>/state.json`, replaced atomically (write + rename) on every change,
so a reader never sees half a file even while a supervisor restarts replicas.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.serving.processes import ProcessRef

STATE_FILE = "state.json"


@dataclass
class ProcessState:
    name: str  # "sidecar" or the replica id
    pid: int
    start_ticks: int
    url: str
    port: int
    cmd: list[str]
    log: str
    restart: bool = False
    restarts: int = 0
    env: dict = field(default_factory=dict)
    cpus: str | None = None
    numa_node: int | None = None
    model: str = ""
    stopped: bool = False  # given up on (too many restarts) or stopped on purpose
    engine: str = "infersight"  # what serves: "infersight", "vllm" (its upstream server), "proxy" (in front of it)

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_ticks)


@dataclass
class FleetState:
    name: str
    run_dir: str
    created: float
    store_url: str  # where replicas write telemetry (the sidecar or an external store)
    sidecar: ProcessState | None = None  # None when an external store is used
    replicas: list[ProcessState] = field(default_factory=list)
    supervisor: ProcessState | None = None
    # engine servers behind a replica's recording proxy (a vLLM replica's `vllm serve`): the replica's
    # endpoint is its proxy, in `replicas`
    upstreams: list[ProcessState] = field(default_factory=list)
    prober: ProcessState | None = None  # the scheduled prober (a [probe] table): `infersight probe --every`
    stop_timeout: float = 15.0
    max_restarts: int = 5
    events: list[str] = field(default_factory=list)  # deaths and restarts, newest last

    def note(self, message: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {message}")
        del self.events[:-50]

    def save(self) -> Path:
        path = Path(self.run_dir) / STATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, run_dir: str | Path) -> FleetState:
        path = Path(run_dir) / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"no fleet state in {run_dir} (is a fleet up there? see `infersight fleet up`)") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: unreadable fleet state ({e})") from None
        proc = lambda d: ProcessState(**d) if d else None  # noqa: E731
        return cls(**{**data, "sidecar": proc(data.get("sidecar")), "supervisor": proc(data.get("supervisor")),
                      "prober": proc(data.get("prober")),
                      "replicas": [ProcessState(**r) for r in data.get("replicas", [])],
                      "upstreams": [ProcessState(**r) for r in data.get("upstreams", [])]})

    @staticmethod
    def remove(run_dir: str | Path) -> None:
        (Path(run_dir) / STATE_FILE).unlink(missing_ok=True)
