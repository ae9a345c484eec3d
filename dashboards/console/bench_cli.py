"""`infersight bench <name>`: the benchmarks, each a module with `add_arguments(parser)` and `run(args)`.

The benchmarks live beside what they measure (the engine's in engine/benchmarks, speculative
decoding on the reference models in evals/benchmarks); this menu is the one place that lists them.
"""

from __future__ import annotations

from engine.benchmarks import quantization, telemetry_overhead, throughput
from engine.benchmarks.peers import cli as peers
from evals.benchmarks import spec_decode

# name -> (module, one-line help)
BENCHMARKS = {
    "throughput": (throughput, "offline throughput: the engine vs transformers' generate on the same model and prompts"),
    "peers": (peers, "infersight vs vLLM, CTranslate2, llama.cpp, transformers (each installed one) on the same "
                     "token-ID workloads, with this machine's roofline"),
    "spec-decode": (spec_decode, "speculative decoding: tokens/s without and with each proposer, acceptance, speedup"),
    "quantization": (quantization, "weight-only int8 / int4: logit fidelity, weight bytes and tokens/s against float32"),
    "telemetry-overhead": (telemetry_overhead,
                           "full telemetry (recorder -> sidecar, metrics, spans) on vs off, interleaved: tokens/s loss"),
}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))


def run(args) -> int:
    return int(BENCHMARKS[args.benchmark][0].run(args) or 0)
