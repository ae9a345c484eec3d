"""`infersight bench <name>`: the benchmarks, each a module with `add_arguments(parser)` and `run(args)`."""

from __future__ import annotations

import importlib

# name -> (module, one-line help); a module is imported only when its benchmark runs
BENCHMARKS: dict[str, tuple[str, str]] = {
    "throughput": ("engine.benchmarks.throughput",
                   "offline throughput: the engine vs transformers' generate on the same model and prompts"),
    "spec-decode": ("engine.benchmarks.spec_decode",
                    "speculative decoding: tokens/s without and with each proposer, acceptance, speedup"),
    "quantization": ("engine.benchmarks.quantization",
                     "weight-only int8 / int4: logit fidelity, weight bytes and tokens/s against float32"),
    "telemetry-overhead": ("telemetry.benchmarks.engine_overhead",
                           "full telemetry (recorder -> sidecar, metrics, spans) on vs off, interleaved: tokens/s loss"),
}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module_name, help_text) in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module_name).add_arguments(p)


def run(args) -> int:
    module = importlib.import_module(BENCHMARKS[args.benchmark][0])
    return int(module.run(args) or 0)
