"""`infersight`: one CLI, many subcommands.

Each subcommand lives in the module that owns it and exposes `add_arguments(parser)` and
`run(args) -> int`. This is the top of the house: it may import every package. The imports are
plain statements inside one small function per command, so `infersight --help` does not load
torch, chdb and streamlit, and every dependency still shows in the source.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType


def _generate() -> ModuleType:
    from engine.core import cli_generate
    return cli_generate


def _bench() -> ModuleType:
    from dashboards.console import bench_cli
    return bench_cli


def _serve() -> ModuleType:
    from engine.serving.server import cli
    return cli


def _sidecar() -> ModuleType:
    from telemetry.sidecar import cli
    return cli


def _migrate() -> ModuleType:
    from telemetry.schema import cli
    return cli


def _fleet() -> ModuleType:
    from engine.serving.fleet import cli
    return cli


def _proxy() -> ModuleType:
    from engine.serving.proxy import cli
    return cli


def _loadgen() -> ModuleType:
    from engine.traffic.loadgen import cli
    return cli


def _probe() -> ModuleType:
    from engine.traffic.probe import cli
    return cli


def _calibrate() -> ModuleType:
    from engine.traffic import calibrate
    return calibrate


def _diagnose() -> ModuleType:
    from diagnostics import cli
    return cli


def _profile() -> ModuleType:
    from diagnostics import profile_cli
    return profile_cli


def _eval() -> ModuleType:
    from evals import cli
    return cli


def _replay() -> ModuleType:
    from evals.replay import cli
    return cli


def _dashboard() -> ModuleType:
    from dashboards import cli
    return cli


def _demo() -> ModuleType:
    from dashboards.console import demo
    return demo


# command -> (its module, one-line help)
COMMANDS = {
    "generate": (_generate, "offline generation from prompts (prints outputs and throughput)"),
    "bench": (_bench, "benchmarks: engine vs transformers throughput, telemetry overhead ..."),
    "serve": (_serve, "OpenAI-compatible server for one replica"),
    "sidecar": (_sidecar, "the sidecar: embedded ClickHouse over HTTP, findings on /metrics"),
    "migrate": (_migrate, "apply (or render, e.g. for a cluster) the ClickHouse schema"),
    "fleet": (_fleet, "start, inspect and stop a local fleet of replicas and the sidecar"),
    "proxy": (_proxy, "record what any OpenAI-compatible server (vLLM ...) answers, into the store"),
    "loadgen": (_loadgen, "drive replicas with chat / agent / batch workloads"),
    "probe": (_probe, "send the golden probe suite to every replica (once, on an interval, or pinned)"),
    "calibrate": (_calibrate, "find one replica's capacity under a TTFT / ITL SLO"),
    "diagnose": (_diagnose, "run diagnostics over the store and record findings"),
    "profile": (_profile, "py-spy a replica and store folded stacks"),
    "eval": (_eval, "eval suites: run, drift, gate"),
    "replay": (_replay, "replay stored production requests against a candidate, diffed token by token"),
    "dashboard": (_dashboard, "the Streamlit debugging dashboard"),
    "demo": (_demo, "sidecar + replicas + traffic + diagnostics + report, on the embedded defaults"),
}


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infersight", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_of, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == load:
            module_of().add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; output piped into a reader that stops early (`| head`) ends it quietly."""
    try:
        try:
            return _main(argv)
        finally:  # also on SystemExit (--help): the last buffered output fails here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of stdout closed its end: point stdout at /dev/null, so the exit's flush cannot raise again,
    and exit as a process killed by SIGPIPE would (128 + 13), which shells treat as a normal stop."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        build_parser().parse_args(argv or ["--help"])
        return 2
    module = COMMANDS[command][0]()
    args = build_parser(load=command).parse_args(argv)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
