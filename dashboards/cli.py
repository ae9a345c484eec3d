"""`infersight dashboard`: the Streamlit debugging dashboard over a store (read-only).

    infersight dashboard --store http://readonly:PASS@127.0.0.1:8123   # a sidecar or a ClickHouse
    infersight dashboard --store .infersight/store --model path/to/model

With a URL the dashboard connects over the ClickHouse HTTP protocol (give it the sidecar's
read-only user). With a data directory, chdb allows one process per directory: if no one
holds it, this command starts a sidecar on it with a one-off read-only user and the
dashboard connects to that (or, with --direct, opens the directory itself); if a sidecar
already holds it, pass that sidecar's URL instead.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from dashboards import settings

APP = Path(__file__).resolve().parent / "app.py"
READONLY_USER = "dashboard"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="http(s)://user:pass@host:port/db, or a chdb data directory")
    parser.add_argument("--port", type=int, default=8501, help="dashboard port (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--model", default=None,
                        help="model (or tokenizer) directory used to decode every token ID (default: each replica's "
                             "own, from the model directory and tokenizer hash its replicas row recorded)")
    parser.add_argument("--tokenizer", action="append", default=[], metavar="MODEL=DIR",
                        help="tokenizer directory for one model name (repeatable; overrides --model for it)")
    parser.add_argument("--sidecar-port", type=int, default=0, metavar="PORT",
                        help="with a data directory: the port of the read-only sidecar started on it "
                             "(default 0: a free one, printed)")
    parser.add_argument("--direct", action="store_true",
                        help="with a data directory: open it in the dashboard process instead of via a sidecar")


def tokenizers(model: str | None, pairs: list[str]) -> dict[str, str]:
    """--model / --tokenizer MODEL=DIR -> {model name or "*": directory}, each checked."""
    out = {}
    if model:
        out["*"] = model
    for pair in pairs:
        name, sep, directory = pair.partition("=")
        if not sep or not name or not directory:
            raise ValueError(f"--tokenizer expects MODEL=DIR, got {pair!r}")
        out[name] = directory
    for name, directory in out.items():
        if not (Path(directory) / "tokenizer.json").is_file() and not Path(directory).is_file():
            raise ValueError(f"no tokenizer.json in {directory} (for {'every model' if name == '*' else name})")
    return {name: str(Path(d).resolve()) for name, d in out.items()}


def directory_holder(path: Path) -> str | None:
    """Who holds the chdb data directory (e.g. 'pid 1234'), None when it is free."""
    from telemetry.store import StoreLockedError, dir_lock

    real = os.path.realpath(path)
    try:
        dir_lock.acquire(real)
    except StoreLockedError:
        lock = Path(real) / dir_lock.LOCK_NAME
        return lock.read_text().strip() if lock.exists() else "another process"
    dir_lock.release(real)
    return None


def streamlit_command(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
            "--server.address", host, "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--global.developmentMode", "false"]


def run(args: argparse.Namespace) -> int:
    try:
        tokenizer_dirs = tokenizers(args.model, args.tokenizer)
    except ValueError as e:
        print(f"infersight dashboard: {e}", file=sys.stderr)
        return 2
    target, sidecar = args.store, None
    if not target.startswith(("http://", "https://")):
        path = Path(target)
        if not path.is_dir():
            print(f"infersight dashboard: no store at {path} (a data directory or an http(s) URL)", file=sys.stderr)
            return 2
        holder = directory_holder(path)
        if holder is not None:
            print(f"infersight dashboard: {path} is in use by {holder}. chdb allows one process per data "
                  "directory: pass the URL of the sidecar that holds it, e.g. "
                  "--store http://READONLY_USER:PASSWORD@127.0.0.1:8123", file=sys.stderr)
            return 2
        if not args.direct:
            from telemetry.sidecar.process import start_sidecar

            password = secrets.token_urlsafe(16)
            print(f"infersight dashboard: starting a sidecar on {path} ...", flush=True)
            sidecar = start_sidecar(path, port=args.sidecar_port,  # local: only this dashboard reads it
                                    readonly_user=READONLY_USER, readonly_password=password)
            target = f"{sidecar.url.split('://')[0]}://{READONLY_USER}:{password}@{sidecar.url.split('://')[1]}"
            print(f"infersight dashboard: sidecar at {sidecar.url} (read-only user {READONLY_USER!r})", flush=True)
        else:
            target = str(path.resolve())
    env = {**os.environ, **settings.to_env(settings.Settings(store=target, tokenizers=tokenizer_dirs))}
    print(f"infersight dashboard: http://{args.host}:{args.port}", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: the sidecar must not be orphaned
    process = None
    try:
        process = subprocess.Popen(streamlit_command(args.host, args.port), env=env, preexec_fn=_die_with_parent)
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        if sidecar is not None:
            sidecar.stop()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _die_with_parent() -> None:
    """In the Streamlit child: get SIGTERM when this command dies, even by SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
