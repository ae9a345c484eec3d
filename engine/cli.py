"""`infersight`: one CLI, many subcommands.

Each subcommand lives in the module that owns it and exposes
`add_arguments(parser)` and `run(args) -> int`. Modules are imported only when
their command runs, so `infersight --help` stays fast and a broken optional
part cannot take the whole CLI down.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("engine.cli_generate", "offline generation from prompts (prints outputs and throughput)"),
    "bench": ("engine.benchmarks.cli", "benchmarks: engine vs transformers throughput, telemetry overhead ..."),
    "serve": ("engine.server.cli", "OpenAI-compatible server for one replica"),
    "sidecar": ("telemetry.sidecar.cli", "the sidecar: embedded ClickHouse over HTTP, findings on /metrics"),
    "migrate": ("telemetry.schema.cli", "apply (or render, e.g. for a cluster) the ClickHouse schema"),
    "fleet": ("engine.fleet.cli", "start, inspect and stop a local fleet of replicas and the sidecar"),
    "loadgen": ("engine.loadgen.cli", "drive replicas with chat / agent / batch workloads"),
    "calibrate": ("engine.loadgen.calibrate", "find one replica's capacity under a TTFT / ITL SLO"),
    "diagnose": ("diagnostics.cli", "run diagnostics over the store and record findings"),
    "profile": ("diagnostics.profile_cli", "py-spy a replica and store folded stacks"),
    "eval": ("evals.cli", "eval suites: run, drift, gate"),
    "dashboard": ("dashboards.cli", "the Streamlit debugging dashboard"),
    "demo": ("engine.demo", "sidecar + replicas + traffic + diagnostics + report, on the embedded defaults"),
}


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infersight", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == load:
            importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        build_parser().parse_args(argv or ["--help"])
        return 2
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as e:
        print(f"infersight {command}: not available in this build ({e})", file=sys.stderr)
        return 2
    args = build_parser(load=command).parse_args(argv)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
