"""`engine = "vllm"` replicas in a fleet config: what they start (vLLM behind a recording proxy, pinned
and switched on as configured) and every mistake named. No vLLM needed: nothing is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.serving.fleet.config import load_fleet, parse_fleet
from engine.serving.fleet.vllm_replica import (
    DEFAULT_LOGPROBS_FRACTION, proxy_command, served_model_name, vllm_cli_args, vllm_command, vllm_env,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "engine" / "serving" / "fleet" / "examples" / "vllm_and_infersight.toml"


def _fleet(**replica):
    return parse_fleet({"defaults": {"model": "m", "engine": {"max_num_seqs": 4}},
                        "replica": [{"id": "r0"}, {"id": "v0", "engine": "vllm", **replica}]})


def test_the_example_mixes_the_two_engines():
    config = load_fleet(EXAMPLE)
    kinds = {r.id: r.kind for r in config.replicas}
    assert kinds == {"r0": "infersight", "v0": "vllm"}
    v0 = config.replicas[1]
    assert v0.engine == {} and v0.vllm["max_model_len"] == 256 and v0.cpus == "1"
    assert config.replicas[0].engine["max_num_seqs"] == 16


def test_vllm_options_become_vllm_serve_flags():
    assert vllm_cli_args({"max_model_len": 256, "enable_prefix_caching": False, "enforce_eager": True,
                          "additional_config": {"a": 1}}) == [
        "--max-model-len", "256", "--no-enable-prefix-caching", "--enforce-eager", "--additional-config", '{"a": 1}']


def test_a_vllm_replica_is_pinned_switched_on_and_fronted_by_its_proxy(tmp_path):
    v0 = _fleet(cpus="1", vllm={"max_model_len": 256}, env={"VLLM_CPU_KVCACHE_SPACE": "1"}).replicas[1]
    model = tmp_path / "target"
    cmd = vllm_command(v0, Path("/opt/vllm/bin/python"), model, "127.0.0.1", 9001)
    start = cmd.index("/opt/vllm/bin/python")
    assert cmd[:start][-2:] == ["-c", "1"]  # taskset -c 1
    assert cmd[start:start + 5] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                                    str(model)]
    assert cmd[cmd.index("--served-model-name") + 1] == "target" == served_model_name(v0, model)
    assert cmd[cmd.index("--dtype") + 1] == "float32" and "--enforce-eager" in cmd  # infersight's defaults
    assert cmd[cmd.index("--port") + 1] == "9001" and cmd[cmd.index("--max-model-len") + 1] == "256"
    assert "--enable-logging-iteration-details" in cmd  # the plugin's steps need vLLM's batch shapes
    env = vllm_env(v0, "http://127.0.0.1:8123", tmp_path / "spool" / "v0")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert (env["INFERSIGHT_STORE"], env["INFERSIGHT_REPLICA_ID"]) == ("http://127.0.0.1:8123", "v0")
    proxy = proxy_command(v0, model, "127.0.0.1", 8132, "http://127.0.0.1:9001", "http://127.0.0.1:8123",
                          tmp_path / "spool" / "v0-proxy", "warning")
    assert proxy[proxy.index("proxy") + 1:proxy.index("proxy") + 3] == ["--upstream", "http://127.0.0.1:9001"]
    assert proxy[proxy.index("--replica-id") + 1] == "v0" and proxy[proxy.index("--port") + 1] == "8132"
    assert "--no-replica-row" in proxy  # the plugin writes vLLM's identity
    off = _fleet(plugin=False).replicas[1]
    assert "INFERSIGHT_STORE" not in vllm_env(off, "http://127.0.0.1:8123", tmp_path)
    assert "--no-replica-row" not in proxy_command(off, model, "127.0.0.1", 1, "http://u", "http://s", tmp_path, "info")
    # asked on a share by default: the sampled-traffic quality rule reads them, vLLM pays per request asked
    assert proxy[proxy.index("--logprobs-fraction") + 1] == f"{DEFAULT_LOGPROBS_FRACTION:g}"


@pytest.mark.parametrize("option", [None, "vllm", "/models/defaults"])
def test_the_proxy_records_the_generation_defaults_vllm_applies(tmp_path, option):
    # vLLM applies the model's generation_config.json to unset fields unless told otherwise: its proxy is
    # told the same, so each row records the values a request was served with
    v0 = _fleet(**({"vllm": {"generation-config": option}} if option else {})).replicas[1]
    served = vllm_command(v0, Path("/opt/vllm/bin/python"), tmp_path, "127.0.0.1", 1)
    proxy = proxy_command(v0, tmp_path, "127.0.0.1", 1, "http://u", "http://s", tmp_path, "info")
    if option is None:  # both on their default, auto
        assert "--generation-config" not in served and "--generation-config" not in proxy
    else:
        assert served[served.index("--generation-config") + 1] == option == proxy[proxy.index("--generation-config") + 1]


@pytest.mark.parametrize("value, passed", [(False, "0"), (True, "1"), (0.1, "0.1"), (0, "0"), (1, "1")])
def test_logprobs_is_the_share_of_requests_the_proxy_asks_for_them(tmp_path, value, passed):
    v0 = _fleet(logprobs=value).replicas[1]
    cmd = proxy_command(v0, tmp_path, "127.0.0.1", 1, "http://u", "http://s", tmp_path, "info")
    assert cmd[cmd.index("--logprobs-fraction") + 1] == passed and cmd.count("--logprobs-fraction") == 1


def test_the_default_share_is_a_real_share():
    assert 0 < DEFAULT_LOGPROBS_FRACTION < 1
    assert _fleet().replicas[1].logprobs == DEFAULT_LOGPROBS_FRACTION
    defaults = parse_fleet({"defaults": {"model": "m", "logprobs": 0.5}, "replica": [{"id": "v0", "engine": "vllm"}]})
    assert defaults.replicas[0].logprobs == 0.5


@pytest.mark.parametrize("replica, words", [
    ({"engine": "sglang"}, ["engine must be", "'vllm'"]),
    ({"otlp_endpoint": "http://c:4318"}, ["otlp_endpoint", "otlp_traces_endpoint"]),
    ({"vllm": {"port": 1}}, ["port", "the fleet sets"]),
    ({"vllm": {"served_model_name": "x", "model": "y"}}, ["model", "the fleet sets"]),
    ({"vllm_python": "/no/such/python"}, []),
    ({"logprobs": 1.5}, ["logprobs must be", "between 0 and 1", "1.5"]),
    ({"logprobs": -0.1}, ["logprobs must be"]),
    ({"logprobs": "half"}, ["logprobs must be", "'half'"]),
])
def test_mistakes_are_named(replica, words):
    if not words:  # found when the fleet comes up, before anything starts
        from engine.serving.fleet.vllm_replica import vllm_python

        with pytest.raises(ValueError, match="not a file"):
            vllm_python(_fleet(**replica).replicas[1])
        return
    with pytest.raises(ValueError) as e:
        _fleet(**replica)
    for word in words:
        assert word in str(e.value)


def test_vllm_options_on_an_infersight_replica_are_an_error():
    with pytest.raises(ValueError, match="only apply to engine"):
        parse_fleet({"defaults": {"model": "m"}, "replica": [{"id": "r0", "vllm": {"dtype": "float32"}}]})
    with pytest.raises(ValueError, match="logprobs only apply"):  # infersight's engine records them itself
        parse_fleet({"defaults": {"model": "m"}, "replica": [{"id": "r0", "logprobs": False}]})
