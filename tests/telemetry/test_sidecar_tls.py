"""The remote store over TLS: the sidecar serving HTTPS, clickhouse-connect verifying its certificate."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from telemetry import synthetic
from telemetry.sidecar.process import start_sidecar
from telemetry.store import StoreUnavailableError, open_store


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make a certificate")
def test_remote_store_over_https_with_a_verified_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    sidecar = start_sidecar(tmp_path / "store", user="admin", password="pw", tls_cert=cert, tls_key=key)
    try:
        assert sidecar.url.startswith("https://")
        with open_store(f"{sidecar.store_url}/default?ca_cert={cert}") as store:
            store.insert_records("steps", synthetic.records("steps", 3, replica_id="tls"))
            assert store.query_df("SELECT count() AS n FROM steps")["n"][0] == 3
        with pytest.raises(StoreUnavailableError):  # an unverified certificate is refused
            open_store(sidecar.store_url)
    finally:
        sidecar.stop()
