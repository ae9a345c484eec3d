"""A vLLM replica of a fleet (`engine = "vllm"`): `vllm serve` behind its own recording proxy.

    [[replica]]
    id = "v0"
    engine = "vllm"
    cpus = "1"                                  # taskset + VLLM_CPU_OMP_THREADS_BIND (vLLM's CPU backend)
    threads = 1                                 # OMP_NUM_THREADS
    vllm = { max_model_len = 256 }              # vLLM server options: key -> --key-name value
    env = { VLLM_CPU_KVCACHE_SPACE = "1" }      # GiB of KV cache on the CPU backend
    # vllm_python = "/opt/vllm/bin/python"      # default: $INFERSIGHT_VLLM_PYTHON, <repo>/.venv-vllm/bin/python
    # plugin = true                             # infersight's stat-logger plugin in vLLM: steps + identity
    # logprobs = 0.25                           # the share of requests the proxy asks vLLM for the sampled
                                                # tokens' logprobs (true: 1, false: 0; the default below)

vLLM is started as engine/serving/vllm_adapter/launch.py starts it (`python -m vllm.entrypoints.openai.api_server`:
vllm-cpu ships no distribution metadata, which `vllm serve` asks for), float32 and eager unless the
`vllm` options say otherwise (`dtype`, `enforce_eager`), with `--chat-template` from `chat_template`.
Two processes: vLLM on a port of its own (an "upstream" of the fleet state) and `infersight proxy`
on the replica's port, which is the fleet's endpoint for the replica: every request reaches vLLM
through the proxy, which writes its `requests` rows (token IDs, hashes, workload, trace, per-token
times). With `plugin` (the default) vLLM's own process records steps and its replica row through
infersight's stat-logger plugin (engine/serving/vllm_adapter), which must be installed in vLLM's
environment (`pip install infersight` there); both write under the replica id, into the fleet's
store, each with its own spool directory. Without it the proxy writes the replica row.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from engine.serving.processes import infersight_command, spawn
from engine.util import free_port
from engine.serving.fleet.state import ProcessState
from engine.core.placement import format_cpulist, numa_topology, parse_cpulist
from engine.serving.proxy.extras import check_fraction
from engine.serving.vllm_adapter import launch

PLUGIN_GROUP = "vllm.stat_logger_plugins"
# fleet keys that mean something else for vLLM
_NOT_FOR_VLLM = {"otlp_endpoint": "pass vLLM's own otlp_traces_endpoint in `vllm` options"}
# `vllm` options the launch takes itself, with infersight's defaults (the same tokens on both engines)
_LAUNCH_OPTIONS = {"dtype": "float32", "enforce_eager": True, "chat_template": None, "served_model_name": None}
# The share of a vLLM replica's requests its proxy asks for the sampled tokens' logprobs (`logprobs = F`).
# Producing them is most of what the attachment costs vLLM: on the reference model here (4 concurrent x 32
# tokens, vLLM on one CPU) logprobs on every request made vLLM 1.159x [1.05, 1.22] slower; the whole
# attachment was 1.19-1.22x, and 1.063x [0.99, 1.14] without them (engine/benchmarks/proxy_asks.py,
# vllm_overhead.py). The quality rule (diagnostics/quality.py) compares a per-request mean, so a
# uniform share of requests serves it, at 1/F the traffic for the same evidence: the reference model with
# 50% weight noise, 300 requests per replica, was still named at F = 0.25 (68 measured, Holm p 6e-13) and
# 0.1 (23 measured, p 3e-9), not at 0.05 (13 measured: insufficient data); a clean pair stayed quiet at each.
# 0.25 keeps a margin over the rule's 20-per-side minimum at a few hundred requests. Measured at 0.25: the
# whole attachment 1.067x [1.020, 1.139] (vllm_overhead --proxy, 2 instances, 19% of its ids asked); through
# the proxy 1.156x [1.08, 1.22] against 1.262x at 1 and 1.080x at 0 (proxy_asks, one run): about 40% of the
# logprob cost is left, not 25%, as a batch pays part of it when any of its requests asks. Not within 3% here:
# the rest is the proxy's hop and the plugin on a CPU vLLM shares with its API server.
DEFAULT_LOGPROBS_FRACTION = 0.25


def vllm_cli_args(options: dict) -> list[str]:
    """{"max_model_len": 256, "enable_prefix_caching": false} -> ["--max-model-len", "256",
    "--no-enable-prefix-caching"]: a list gives the values one after the other, a dict JSON."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, tuple)):
            args += [flag, *map(str, value)]
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        elif isinstance(value, (int, float, str)):
            args += [flag, str(value)]
        else:
            raise ValueError(f"vllm option {key!r}: {value!r} is not a string, number, boolean, list or table")
    return args


def check_spec(spec) -> None:
    """Errors a vLLM replica's table can hold, found before anything starts."""
    for key, why in _NOT_FOR_VLLM.items():
        if getattr(spec, key, None) is not None:
            raise ValueError(f"{key} is not a vllm replica option ({why})")
    spec.logprobs = logprobs_fraction(spec.logprobs)
    reserved = {"port", "host", "model"} & {str(k).replace("-", "_") for k in spec.vllm}
    if reserved:
        raise ValueError(f"vllm options {sorted(reserved)}: the fleet sets these (model, host, port)")
    vllm_cli_args(spec.vllm)


def logprobs_fraction(value) -> float:
    """`logprobs = true | false | F`: the share of requests asked for logprobs (true 1, false 0)."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        try:
            return check_fraction(value)  # the proxy's own bound on the share
        except ValueError:
            pass
    raise ValueError(f"logprobs must be true, false or a share of requests between 0 and 1, got {value!r}")


def vllm_python(spec, base_dir: Path | None = None) -> Path:
    """The interpreter that runs a replica's vLLM: its `vllm_python`, else launch.vllm_python()
    ($INFERSIGHT_VLLM_PYTHON, the repo's .venv-vllm)."""
    if spec.vllm_python:
        path = Path(spec.vllm_python).expanduser()
        if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
            path = base_dir / path
        if not path.is_file():
            raise ValueError(f"replica {spec.id}: vllm_python {str(path)!r} is not a file")
        return path.absolute()
    found = launch.vllm_python()
    if found is None:
        raise ValueError(f"replica {spec.id}: {launch.vllm_missing()}")
    return found.absolute()


def check_plugin(python: Path) -> None:
    """vLLM's environment must hold infersight's stat-logger plugin, or its steps and identity are lost."""
    code = (f"import importlib.metadata as m; print(','.join(e.name for e in m.entry_points(group={PLUGIN_GROUP!r})))")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"cannot ask {python} for its vLLM plugins: {e}") from None
    if "infersight" not in out.strip().split(","):
        raise ValueError(f"infersight's vLLM stat-logger plugin is not installed beside {python} "
                         f"(`{python.parent / 'pip'} install infersight`); or set plugin = false: "
                         "then the proxy writes the replica row and no steps are recorded")


def replica_cpus(spec) -> str | None:
    """The CPUs a vLLM replica is pinned to (`cpus`, or those of `numa_node`), as a cpulist."""
    if spec.cpus is not None:
        return format_cpulist(parse_cpulist(spec.cpus))
    if spec.numa_node is not None:
        nodes = numa_topology()
        if spec.numa_node not in nodes:
            raise ValueError(f"replica {spec.id}: no NUMA node {spec.numa_node} (nodes: {sorted(nodes)})")
        return format_cpulist(nodes[spec.numa_node])
    return None


def launch_options(spec) -> tuple[dict, dict]:
    """(what launch.vllm_command takes itself, with infersight's defaults; the other vLLM options)."""
    named = {str(k).replace("-", "_"): v for k, v in spec.vllm.items()}
    own = {k: named.pop(k, default) for k, default in _LAUNCH_OPTIONS.items()}
    return own, named


def served_model_name(spec, model_dir: Path) -> str:
    """The name vLLM serves: infersight's default (the model directory's name), so that a vLLM replica
    and an infersight one of the same model are replicas of one model in every diagnostic."""
    return str(spec.vllm.get("served_model_name") or Path(model_dir).resolve().name)


def vllm_command(spec, python: Path, model_dir: Path, host: str, port: int) -> list[str]:
    own, options = launch_options(spec)
    extra = vllm_cli_args(options) + (["--api-key", spec.api_key] if spec.api_key else []) + list(spec.args)
    cmd = launch.vllm_command(python, model_dir, port, host=host, served_model_name=served_model_name(spec, model_dir),
                              dtype=str(own["dtype"]), enforce_eager=bool(own["enforce_eager"]),
                              chat_template=own["chat_template"], record=spec.plugin, extra_args=tuple(extra))
    cpus = replica_cpus(spec)
    taskset = shutil.which("taskset")
    return ([taskset, "-c", cpus] if cpus and taskset else []) + cmd


def vllm_env(spec, store_url: str | None, spool_dir: Path, deploy_time: float | None = None) -> dict:
    """The replica's env, plus the plugin's switch (INFERSIGHT_*) and vLLM's CPU pinning and threads."""
    cpus = replica_cpus(spec)
    env = {"VLLM_CPU_OMP_THREADS_BIND": cpus or "nobind", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    threads = spec.threads or (len(parse_cpulist(cpus)) if cpus else None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if spec.plugin and store_url:
        # the recording proxy in front writes the requests rows (with token IDs); the plugin writes steps and
        # the replica's identity, so each request is counted once
        env.update(INFERSIGHT_STORE=store_url, INFERSIGHT_REPLICA_ID=spec.id, INFERSIGHT_SPOOL_DIR=str(spool_dir),
                   INFERSIGHT_REQUEST_ROWS="0")
        deploy = {"role": spec.role or None, "deploy_time": deploy_time}  # the replica row's (vllm_adapter/identity)
        if any(v is not None for v in deploy.values()):
            env["INFERSIGHT_LABELS"] = json.dumps({k: v for k, v in deploy.items() if v is not None})
    return {**env, **spec.env}


def proxy_command(spec, model_dir: Path, host: str, port: int, upstream_url: str, store_url: str | None,
                  spool_dir: Path, log_level: str, deploy_time: float | None = None) -> list[str]:
    cmd = infersight_command("proxy", "--upstream", upstream_url, "--host", host, "--port", str(port),
                             "--replica-id", spec.id, "--model-dir", str(model_dir), "--unasked-fields", "null",
                             "--spool-dir", str(spool_dir), "--log-level", log_level,
                             "--drain-timeout", str(spec.drain_timeout))
    if store_url:
        cmd += ["--store", store_url]
    generation_config = {str(k).replace("-", "_"): v for k, v in spec.vllm.items()}.get("generation_config")
    if generation_config is not None:  # the defaults vLLM applies, so the rows record the values it served with
        cmd += ["--generation-config", str(generation_config)]
    if spec.plugin:
        cmd.append("--no-replica-row")  # vLLM's plugin writes the replica's identity
    else:
        cmd += (["--role", spec.role] if spec.role else []) + (
            ["--deploy-time", f"{deploy_time:.6f}"] if deploy_time is not None else [])
    cmd += ["--logprobs-fraction", f"{spec.logprobs:g}"]
    return cmd


def start_vllm_replica(spec, python: Path, model_dir: Path, host: str, port: int, store_url: str | None,
                       spool_dirs: tuple[Path, Path], logs: Path, log_level: str, deploy_time: float | None = None):
    """Spawn `vllm serve` (on a free port) and its proxy (on `port`), spooling in `spool_dirs` (the
    plugin's, the proxy's): (upstream, replica) ProcessStates."""
    vllm_port = free_port(host)
    cmd = vllm_command(spec, python, model_dir, host, vllm_port)
    env = vllm_env(spec, store_url, spool_dirs[0], deploy_time)
    log = logs / f"{spec.id}.vllm.log"
    ref = spawn(cmd, log, env)
    upstream = ProcessState(f"{spec.id}/vllm", ref.pid, ref.start_ticks, f"http://{host}:{vllm_port}", vllm_port, cmd,
                            str(log), restart=spec.restart, env=env, cpus=replica_cpus(spec),
                            numa_node=spec.numa_node, model=str(model_dir), engine="vllm")
    proxy_cmd = proxy_command(spec, model_dir, host, port, upstream.url, store_url, spool_dirs[1], log_level,
                              deploy_time)
    proxy_env = {"INFERSIGHT_UPSTREAM_API_KEY": spec.api_key} if spec.api_key else {}
    log = logs / f"{spec.id}.log"
    ref = spawn(proxy_cmd, log, proxy_env)
    replica = ProcessState(spec.id, ref.pid, ref.start_ticks, f"http://{host}:{port}", port, proxy_cmd, str(log),
                           restart=spec.restart, env=proxy_env, cpus=replica_cpus(spec), numa_node=spec.numa_node,
                           model=str(model_dir), engine="proxy")
    return upstream, replica
