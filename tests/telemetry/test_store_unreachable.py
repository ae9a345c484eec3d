"""A store that cannot be reached is said plainly: which URL (password hidden) and why (refused, timed out),
without urllib3's retry text, and the CLI says it in one line."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading

import pytest

from engine.serving.processes import infersight_command
from engine.util import free_port
from telemetry.store import StoreUnavailableError
from telemetry.store.remote import RemoteStore

URLLIB3_NOISE = ("HTTPConnectionPool", "Max retries", "query_id", "Retry(", "NewConnectionError", "Caused by")


def _assert_plain(message: str) -> None:
    assert not [n for n in URLLIB3_NOISE if n in message], message


def test_refused_names_the_url_and_the_reason():
    port = free_port()  # nothing listens there
    with pytest.raises(StoreUnavailableError) as e:
        RemoteStore(f"http://writer:s3cret@127.0.0.1:{port}/infersight")
    message = str(e.value)
    assert message == f"store http://writer:***@127.0.0.1:{port}/infersight unreachable: connection refused " \
                      "(is the store running, on that port?)"
    _assert_plain(message)


def test_a_store_that_never_answers_times_out_plainly():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        held: list[socket.socket] = []
        threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
        port = server.getsockname()[1]
        with pytest.raises(StoreUnavailableError) as e:
            RemoteStore(f"http://127.0.0.1:{port}/infersight", connect_timeout=1, send_receive_timeout=1)
        for conn in held:
            conn.close()
    assert str(e.value) == f"store http://127.0.0.1:{port}/infersight unreachable: timed out waiting for an answer"


def test_the_cli_says_it_in_one_line(tmp_path):
    port = free_port()
    r = subprocess.run(infersight_command("diagnose", "all", "--store", f"http://127.0.0.1:{port}/infersight"),
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unreachable: connection refused" in lines[0], r.stderr
    _assert_plain(r.stderr)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make a certificate")
def test_an_unverified_certificate_is_named(tmp_path):
    """HTTPS to a server whose (self-signed) certificate this client does not trust: the TLS reason, plainly."""
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with socket.socket() as raw:
        raw.bind(("127.0.0.1", 0))
        raw.listen()
        port = raw.getsockname()[1]

        def serve():  # every attempt the client makes (it retries once)
            while True:
                try:
                    conn, _ = raw.accept()
                except OSError:
                    return  # the test closed the socket
                try:
                    with context.wrap_socket(conn, server_side=True):
                        pass
                except OSError:
                    pass  # the client hangs up mid-handshake: expected

        threading.Thread(target=serve, daemon=True).start()
        with pytest.raises(StoreUnavailableError) as e:
            RemoteStore(f"https://127.0.0.1:{port}/infersight", connect_timeout=5, send_receive_timeout=5)
    assert str(e.value).startswith(f"store https://127.0.0.1:{port}/infersight unreachable: TLS failed (")
    assert "certificate" in str(e.value), str(e.value)
    _assert_plain(str(e.value))
