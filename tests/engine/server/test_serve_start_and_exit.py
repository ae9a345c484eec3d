"""`infersight serve`'s own start and end: a port in use is refused before the model loads (and by the sidecar
and the proxy before they set up), and a SIGTERM ends the process without the nanobind leak report triton's
bindings print at interpreter teardown."""

from __future__ import annotations

import signal
import socket
import subprocess

import pytest

from engine.serving.processes import infersight_command, process_ref, wait_healthy
from engine.util import free_port


def test_port_in_use_is_refused_before_the_model_loads(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        # a model directory that does not exist: were the model loaded first, its error would come instead
        r = subprocess.run(infersight_command("serve", "--model", str(tmp_path / "no-model"), "--port", str(port)),
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in r.stderr
    assert "no-model" not in r.stderr and "nanobind" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_sigterm_exit_is_quiet(tiny_llama):
    port = free_port()
    proc = subprocess.Popen(infersight_command("serve", "--model", str(tiny_llama), "--port", str(port),
                                               "--threads", "1", "--log-level", "warning"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", process_ref(proc.pid), 120)
    except RuntimeError:
        proc.kill()
        raise AssertionError(proc.communicate()[1][-3000:]) from None
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "nanobind" not in err and "leaked" not in err, err[-3000:]


@pytest.mark.parametrize("command", [
    ["sidecar", "--data-dir", "{tmp}/store"],
    ["proxy", "--upstream", "http://127.0.0.1:9", "--store", "{tmp}/store"],
])
def test_sidecar_and_proxy_refuse_a_port_in_use_first(tmp_path, command):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        args = [a.replace("{tmp}", str(tmp_path)) for a in command] + ["--port", str(port)]
        r = subprocess.run(infersight_command(*args), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"infersight {command[0]}: cannot listen on 127.0.0.1:{port}: address already in use "
                                "(another server there? choose another --port)")
    assert not (tmp_path / "store").exists()  # nothing opened or created before the check
