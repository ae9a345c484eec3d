"""What full telemetry costs the engine: offline throughput with it off and on, interleaved in one run.

    infersight bench telemetry-overhead                  # 8 OFF/ON pairs of 16 prompts, random 4-layer Llama
    python -m engine.benchmarks.telemetry_overhead --rounds 12 --flush-interval 5 --json out.json
    python -m engine.benchmarks.telemetry_overhead --rounds 16 --round-seconds 6   # longer rounds, busy host

One LLM instance; its observer is swapped between rounds, so both sides run the same model,
KV pool and prompts. OFF: no observer (the engine builds no records at all). ON: everything
`build_observer` wires for a replica: the Recorder writing requests (with their token IDs),
steps and the replica row over clickhouse-connect to a real sidecar, the Prometheus
MetricsObserver, and the TracingObserver with spans really built and handed to a
BatchSpanProcessor (the exporter only counts them). The sidecar starts as `infersight fleet`
starts one, in a session of its own; `--sidecar-session shared` starts it with `start_sidecar`,
a child in this session (see DetachedSidecar for why that matters on a busy machine).

Rounds go in ABBA order (off on, on off, off on ...) so that a steady drift of the shared machine
hits both sides alike. After an ON round the benchmark waits, untimed, until its rows are in the
store and its spans exported, so that none of its work lands in the next OFF round; the loss is
also printed with that wait timed (a pessimistic bound: in a server it overlaps the next steps).
The primary figure is CPU-based: the whole process's CPU time per output token (the engine
thread's, plus its other threads': recorder flushes, span building, the span exporter), the ON
round's drain included, against its ABBA pair's OFF round: the pairwise median loss with a
bootstrap 95% interval. On a shared 2-core host wall time swings by tens of percent between
OFF rounds while CPU per token moves by a few, and on a saturated host the CPU the telemetry
takes is what it takes from the engine. Wall-clock throughput is reported beside it, and the
CPU of the engine thread alone and of the sidecar process.

The workload (vLLM's benchmark_throughput in spirit): random token-id prompts of 16-256 tokens,
16-128 output tokens, greedy, ignore EOS. Reported: tokens/s of every round, the medians, the loss,
and the noise (the spread between OFF rounds, the range of the pairwise losses). Goal: loss <= 1%.
`--round-seconds` draws more prompts (the same seed: the first ones are the same) until an OFF
round lasts about that long, measured on a probe round after the warm-up (new prompts rather than
repeats: a repeat would be a prefix-cache hit).
After the run the store is checked: every ON request is in `requests` with its token IDs.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from engine.benchmarks.intervals import bootstrap_median_ci
from engine.util import free_port
from telemetry.recorder import DEFAULT_FLUSH_INTERVAL

GOAL_LOSS = 0.01
PARTS = ("recorder", "metrics", "tracing")
SIDECAR_SESSIONS = ("own", "shared")


class CountingSpanExporter(SpanExporter):
    """Receives the built spans and only counts them (a stand-in for the network, not for the work)."""

    def __init__(self):
        self.spans = 0

    def export(self, spans) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@dataclass
class Round:
    mode: str  # "off" | "on"
    seconds: float  # wall time of generate()
    output_tokens: int
    drain_seconds: float = 0.0  # ON: waiting for the round's telemetry to be stored / exported
    engine_cpu_seconds: float = 0.0  # CPU time of the engine thread during generate()
    process_cpu_seconds: float = 0.0  # CPU time of the whole process (recorder, span worker ...), drain included
    sidecar_cpu_seconds: float = 0.0  # CPU time of the sidecar process, drain included
    token_ids: dict[str, list[int]] = field(default_factory=dict)  # ON rounds: request id -> output ids

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_per_s_with_drain(self) -> float:
        return self.output_tokens / (self.seconds + self.drain_seconds)

    def as_dict(self) -> dict:
        return dict(mode=self.mode, seconds=self.seconds, output_tokens=self.output_tokens,
                    tokens_per_s=self.tokens_per_s, drain_seconds=self.drain_seconds,
                    engine_cpu_seconds=self.engine_cpu_seconds, process_cpu_seconds=self.process_cpu_seconds,
                    sidecar_cpu_seconds=self.sidecar_cpu_seconds)


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of another process (Linux /proc; 0.0 where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class DetachedSidecar:
    """A sidecar started as `infersight fleet` starts one: in a session of its own (engine.serving.processes).

    On Linux the scheduler's autogroups share the CPU between sessions first: a sidecar in the
    benchmark's session takes its CPU out of the engine's share on a busy machine, as a separate
    service (the fleet's, or one on another host) does not. `start_sidecar` starts it that way.
    """

    def __init__(self, data_dir: Path, timeout: float = 90):
        from engine.serving import processes

        self._processes = processes
        port = free_port()
        self.url = self.store_url = f"http://127.0.0.1:{port}"
        self._log = Path(data_dir).parent / f"{Path(data_dir).name}.sidecar.log"
        self._ref = processes.spawn(processes.infersight_command(
            "sidecar", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"), self._log)
        try:
            processes.wait_healthy(self.url, self._ref, timeout, self._log, health_path="/ping")
        except RuntimeError:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self._ref.pid

    def stop(self) -> None:
        self._processes.stop([self._ref])


@dataclass
class Telemetry:
    """The ON side: a sidecar, and the replica's observer stack writing to it."""

    sidecar: object
    observer: object
    parts: object
    exporter: CountingSpanExporter
    started: bool = False

    @classmethod
    def start(cls, data_dir: Path, replica_id: str, model_name: str, flush_interval: float,
              parts: tuple[str, ...] = PARTS, sidecar_session: str = "own") -> "Telemetry":
        """`parts`: which of recorder, metrics, tracing are on (all of them: "fully on").
        `sidecar_session`: "own" (as the fleet runs it) or "shared" (`start_sidecar`: a child in
        this process's session, sharing the engine's CPU share on a busy machine)."""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from telemetry.replica_wiring import build_observer
        from telemetry.sidecar.process import start_sidecar

        unknown = set(parts) - set(PARTS)
        if unknown:
            raise ValueError(f"unknown telemetry parts {sorted(unknown)}; choose from {PARTS}")
        if sidecar_session not in SIDECAR_SESSIONS:
            raise ValueError(f"sidecar_session must be one of {SIDECAR_SESSIONS}, got {sidecar_session!r}")
        sidecar = DetachedSidecar(data_dir) if sidecar_session == "own" else start_sidecar(data_dir)
        exporter = CountingSpanExporter()
        provider = None
        if "tracing" in parts:
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(exporter))
        try:
            observer, built = build_observer(replica_id, model_name,
                                             store_target=sidecar.store_url if "recorder" in parts else None,
                                             metrics="metrics" in parts, tracer_provider=provider,
                                             # the request journal, as `infersight serve` runs it
                                             recorder_kwargs=dict(flush_interval=flush_interval, journal=True))
        except BaseException:
            sidecar.stop()  # a sidecar in its own session would outlive us
            raise
        return cls(sidecar, observer, built, exporter)

    def drain(self) -> None:
        """Everything handed over so far: rows in the store, spans at the exporter."""
        if self.parts.recorder is not None:
            self.parts.recorder.flush()
        if self.parts.tracing is not None:
            self.parts.tracing.flush()

    def close(self) -> None:
        self.parts.close()  # idempotent: the recorder's final flush happens once
        self.sidecar.stop()


def attach(engine, observer) -> None:
    """Swap the engine's observer between rounds (as LLMEngine.__init__ wires it)."""
    from telemetry.contract.hooks import guarded

    engine.observer = guarded(observer)
    engine.tokenizer.observer = engine.observer


def round_order(pairs: int, a: str = "off", b: str = "on") -> list[str]:
    """ABBA: a b, b a, a b ... (a linear drift hits both sides alike)."""
    return [m for i in range(pairs) for m in ((a, b) if i % 2 == 0 else (b, a))]


def run_round(llm, workload, params, mode: str, telemetry: Telemetry) -> Round:
    if mode == "on":
        attach(llm.engine, telemetry.observer)
        if not telemetry.started:  # the replica row, as a replica start would report it
            llm.engine.observer.on_replica_start(llm.engine.replica_record)
            telemetry.started = True
    else:
        attach(llm.engine, None)
    llm.engine.kv_cache.reset_prefix_cache()  # every round starts from the same cache state
    sidecar_cpu, process_cpu = process_cpu_seconds(telemetry.sidecar.pid), time.process_time()
    engine_cpu, start = time.thread_time(), time.perf_counter()
    outs = llm.generate(workload.prompts, params, use_tqdm=False)
    generated, engine_cpu = time.perf_counter(), time.thread_time() - engine_cpu
    attach(llm.engine, None)
    # not timed: the round's telemetry reaches the store before the next round, so that none of
    # its work lands in an OFF round (it would overlap the engine's next steps in a real server)
    telemetry.drain()
    drained = time.perf_counter()
    tokens = sum(len(o.token_ids) for o in outs)
    if tokens != workload.output_tokens:
        raise RuntimeError(f"{mode} round produced {tokens} tokens, expected {workload.output_tokens}")
    return Round(mode, generated - start, tokens, drained - generated if mode == "on" else 0.0, engine_cpu,
                 time.process_time() - process_cpu, process_cpu_seconds(telemetry.sidecar.pid) - sidecar_cpu,
                 {o.request_id: list(o.token_ids) for o in outs} if mode == "on" else {})


def compare(rounds: list[Round], value) -> dict:
    """OFF vs ON for `value(round)` (higher is better): medians, loss, and the noise around them."""
    off = [value(r) for r in rounds if r.mode == "off"]
    on = [value(r) for r in rounds if r.mode == "on"]
    med_off, med_on = statistics.median(off), statistics.median(on)
    pairs = [(a, b) if a.mode == "off" else (b, a) for a, b in zip(rounds[::2], rounds[1::2])]
    pair_losses = [1 - value(b) / value(a) for a, b in pairs]  # each ON round against its pair's OFF round
    return dict(off=off, on=on, median_off=med_off, median_on=med_on, loss=1 - med_on / med_off,
                off_spread=(max(off) - min(off)) / med_off,  # the noise floor: OFF against OFF
                off_stdev=statistics.stdev(off) / med_off if len(off) > 1 else 0.0,
                pair_losses=pair_losses, median_pair_loss=statistics.median(pair_losses),
                median_pair_loss_ci95=bootstrap_median_ci(pair_losses))


def summarize(rounds: list[Round]) -> dict:
    by_mode = {mode: [r for r in rounds if r.mode == mode] for mode in ("off", "on")}

    def us_per_token(attr: str, mode: str) -> float:
        return statistics.median(getattr(r, attr) / r.output_tokens * 1e6 for r in by_mode[mode])

    return dict(
        # primary: output tokens per CPU second of the whole process (every thread; the ON drain included)
        process_cpu=compare(rounds, lambda r: r.output_tokens / r.process_cpu_seconds),
        wall=compare(rounds, lambda r: r.tokens_per_s),
        wall_with_drain=compare(rounds, lambda r: r.tokens_per_s_with_drain),
        engine_thread_cpu=compare(rounds, lambda r: r.output_tokens / r.engine_cpu_seconds),
        drain_seconds=[r.drain_seconds for r in by_mode["on"]],
        # what telemetry costs per second of running, whatever the engine's speed (ON minus OFF)
        cpu_ms_per_second={
            f"{part}_{mode}": statistics.median(value(r) / (r.seconds + r.drain_seconds) * 1000 for r in by_mode[mode])
            for part, value in (("background", lambda r: r.process_cpu_seconds - r.engine_cpu_seconds),
                                ("sidecar", lambda r: r.sidecar_cpu_seconds))
            for mode in ("off", "on")},
        cpu_us_per_token={f"{attr.replace('_cpu_seconds', '')}_{mode}": us_per_token(attr, mode)
                          for attr in ("engine_cpu_seconds", "process_cpu_seconds", "sidecar_cpu_seconds")
                          for mode in ("off", "on")},
    )


def check_store(telemetry: Telemetry, replica_id: str, expected: dict[str, list[int]]) -> dict:
    """Every ON request is in `requests` once, with the token IDs the engine returned."""
    from telemetry.store import open_store

    with open_store(telemetry.sidecar.store_url) as store:
        df = store.query_df("SELECT request_id, output_token_ids FROM requests WHERE replica_id = {r:String}",
                            parameters={"r": replica_id})
        step_sums = store.query_df("SELECT count() AS n, sum(telemetry_seconds) AS telemetry, "
                                   "sum(duration_seconds) AS steps FROM steps WHERE replica_id = {r:String}",
                                   parameters={"r": replica_id})
        replicas = int(store.query_df("SELECT count() AS n FROM replicas WHERE replica_id = {r:String}",
                                      parameters={"r": replica_id})["n"][0])
    stored = {rid: list(ids) for rid, ids in zip(df["request_id"], df["output_token_ids"])}
    matching = sum(1 for rid, ids in expected.items() if stored.get(rid) == ids)
    telemetry_s, steps_s = float(step_sums["telemetry"][0]), float(step_sums["steps"][0])
    return dict(expected_requests=len(expected), stored_requests=len(df), matching_token_ids=matching,
                step_rows=int(step_sums["n"][0]),
                # the engine's own clock: time in observer hooks and record building, as a share of the
                # engine thread's time in ON rounds (steps + hooks); low-noise, unlike throughput
                engine_hook_share=telemetry_s / (telemetry_s + steps_s) if steps_s else 0.0,
                replica_rows=replicas, spans=telemetry.exporter.spans,
                recorder_stats=telemetry.parts.recorder.stats() if telemetry.parts.recorder else {},
                observer_failures=telemetry.parts.failures())


def measure(model: str | Path, *, pairs: int, num_prompts: int, prompt_lens=(16, 256), output_lens=(16, 128),
            seed: int = 0, threads: int = 1, max_num_seqs: int = 64, round_seconds: float | None = None,
            flush_interval: float = DEFAULT_FLUSH_INTERVAL,
            replica_id: str = "overhead-bench", data_dir: str | Path | None = None, sidecar_session: str = "own",
            progress=print) -> dict:
    """The whole benchmark; returns the rounds, the summary and the store check."""
    import torch

    from engine.benchmarks.throughput import make_workload
    from engine.core.llm import LLM
    from engine.core.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(str(model), max_num_seqs=max_num_seqs, replica_id=replica_id)
    llm.engine.runner.wait_compiled()  # rounds on the decode path the engine keeps (built in the background)
    workload = make_workload(num_prompts, llm.engine.vocab_size, seed, prompt_lens, output_lens)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="overhead-bench-store-"))
    telemetry = Telemetry.start(data_dir, replica_id, llm.engine.model_name, flush_interval,
                                sidecar_session=sidecar_session)
    try:
        expected: dict[str, list[int]] = {}  # request id -> output token ids, of every ON request
        warm = workload.head(min(4, num_prompts))
        for mode in ("off", "on"):  # warm-up: kernels, the HTTP connection, the span worker
            expected.update(run_round(llm, warm, params[:len(warm.prompts)], mode, telemetry).token_ids)
        # as `infersight serve` does after loading: what is loaded lives until exit, so no collection
        # walks it while serving (else each collection provoked by telemetry's allocations walks the model)
        gc.collect()
        gc.freeze()
        if round_seconds:  # more prompts, until a round lasts about round_seconds
            probe = run_round(llm, workload, params, "off", telemetry)
            repeats = max(1, math.ceil(round_seconds / probe.seconds))
            if repeats > 1:
                workload = make_workload(num_prompts * repeats, llm.engine.vocab_size, seed, prompt_lens,
                                         output_lens)
                params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
                          for n in workload.output_lens]
            progress(f"probe round: {probe.seconds:.2f} s; {len(workload.prompts)} prompts a round")
        rounds: list[Round] = []
        for i, mode in enumerate(round_order(pairs)):
            r = run_round(llm, workload, params, mode, telemetry)
            rounds.append(r)
            expected.update(r.token_ids)
            progress(f"round {i + 1:2d} {mode:3s}: {r.tokens_per_s:8.1f} tok/s  ({r.output_tokens} tokens in "
                     f"{r.seconds:.2f} s; engine thread CPU {r.engine_cpu_seconds:.2f} s"
                     + (f"; drain {r.drain_seconds * 1000:.0f} ms)" if mode == "on" else ")"))
        telemetry.parts.close()  # the final flush: after it every row is written or counted as dropped
        store = check_store(telemetry, replica_id, expected)
    finally:
        gc.unfreeze()  # measure() may run inside a longer process (the tests)
        telemetry.close()
    return dict(data_dir=str(data_dir), rounds=[r.as_dict() for r in rounds],
                summary=summarize(rounds), store=store,
                workload=dict(num_prompts=len(workload.prompts), prompt_tokens=workload.prompt_tokens,
                              output_tokens=workload.output_tokens, prompt_lens=list(prompt_lens),
                              output_lens=list(output_lens), max_num_seqs=max_num_seqs, threads=threads,
                              flush_interval=flush_interval, sidecar_session=sidecar_session))


def report(result: dict) -> str:
    s, st = result["summary"], result["store"]

    def line(name: str, c: dict, unit: str) -> str:
        lo, hi = c["median_pair_loss_ci95"]
        return (f"{name:<26} median OFF {c['median_off']:8.1f} {unit}  ON {c['median_on']:8.1f} {unit}  "
                f"loss {c['loss'] * 100:+6.2f}%  (pairwise median {c['median_pair_loss'] * 100:+6.2f}%, "
                f"95% CI {lo * 100:+.2f}% .. {hi * 100:+.2f}%, "
                f"range {min(c['pair_losses']) * 100:+.2f}% .. {max(c['pair_losses']) * 100:+.2f}%; "
                f"OFF-vs-OFF spread {c['off_spread'] * 100:.2f}%, stdev {c['off_stdev'] * 100:.2f}%)")

    cpu = s["cpu_us_per_token"]

    def share(on: float, off: float) -> float:
        return (on - off) / cpu["engine_off"] * 100

    background = share(cpu["process_on"] - cpu["engine_on"], cpu["process_off"] - cpu["engine_off"])
    sidecar = share(cpu["sidecar_on"], cpu["sidecar_off"])
    return "\n".join([
        line("CPU, whole process", s["process_cpu"], "tok/cpu-s") + f"   goal: loss <= {GOAL_LOSS * 100:.0f}%",
        line("throughput (wall)", s["wall"], "tok/s"),
        line("throughput, drain timed", s["wall_with_drain"], "tok/s"),
        line("engine thread CPU", s["engine_thread_cpu"], "tok/s"),
        f"CPU us per output token, OFF -> ON: engine thread {cpu['engine_off']:.0f} -> {cpu['engine_on']:.0f}, "
        f"whole process {cpu['process_off']:.0f} -> {cpu['process_on']:.0f}, "
        f"sidecar {cpu['sidecar_off']:.0f} -> {cpu['sidecar_on']:.0f}",
        f"extra CPU per token with telemetry ON, as a share of the engine thread's: recorder/tracing threads "
        f"{background:+.1f}%, sidecar {sidecar:+.1f}%, engine thread itself "
        f"{share(cpu['engine_on'], cpu['engine_off']):+.1f}% (on a saturated machine these compete with the engine)",
        "CPU per second of a round, OFF -> ON: recorder/tracing threads {background_off:.1f} -> {background_on:.1f} "
        "ms/s, sidecar {sidecar_off:.1f} -> {sidecar_on:.1f} ms/s".format(**s["cpu_ms_per_second"]),
        f"accounted cost, measured directly (low-noise): the engine thread in telemetry hooks "
        f"{st['engine_hook_share'] * 100:.2f}% of its ON time (the engine's own clock, StepRecord.telemetry_seconds)"
        f" + the recorder/tracing threads' CPU {background:+.2f}% of the engine thread's (their GIL time, at most "
        f"what they take from it) = {st['engine_hook_share'] * 100 + background:.2f}%",
        f"drain after an ON round (not timed): median {statistics.median(s['drain_seconds']) * 1000:.0f} ms",
        f"store: {st['stored_requests']}/{st['expected_requests']} ON requests stored, "
        f"{st['matching_token_ids']} with the engine's token IDs; {st['step_rows']} step rows, "
        f"{st['replica_rows']} replica row(s); {st['spans']} spans exported; "
        f"observer failures {st['observer_failures']}; the store: {result['data_dir']}",
    ])


# --- the command ---------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--model", help="model directory (default: the throughput benchmark's random "
                                        "4-layer Llama, hidden 256, built once)")
    parser.add_argument("--rounds", type=int, default=8, help="OFF/ON pairs (each pair is two rounds)")
    parser.add_argument("--num-prompts", type=int, default=16,
                        help="prompts per round, the same every round (short rounds follow the machine's drift)")
    parser.add_argument("--round-seconds", type=float, default=None,
                        help="draw more prompts until an OFF round lasts about this long (a probe round after "
                             "the warm-up measures it): on a busy machine ~1 s rounds are mostly noise")
    parser.add_argument("--min-prompt-len", type=int, default=16)
    parser.add_argument("--max-prompt-len", type=int, default=256)
    parser.add_argument("--min-output-len", type=int, default=16)
    parser.add_argument("--max-output-len", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 leaves a core to the recorder thread and the sidecar)")
    parser.add_argument("--flush-interval", type=float, default=DEFAULT_FLUSH_INTERVAL,
                        help="the recorder's flush interval, seconds")
    parser.add_argument("--sidecar-session", choices=SIDECAR_SESSIONS, default="own",
                        help="own: the sidecar in a session of its own, as `infersight fleet` runs it (default); "
                             "shared: a child in this session (start_sidecar), where on a busy machine it takes "
                             "its CPU out of the engine's share")
    parser.add_argument("--json", help="also write the rounds, summary and store check here")


def run(args) -> int:
    from engine.benchmarks.throughput import default_model

    model = args.model or default_model()
    print(f"telemetry overhead: {args.rounds} OFF/ON pairs (ABBA), {args.num_prompts} prompts of "
          f"{args.min_prompt_len}-{args.max_prompt_len} tokens -> {args.min_output_len}-{args.max_output_len} "
          f"output tokens, greedy, ignore EOS; model {model}; torch threads {args.threads}", flush=True)
    result = measure(model, pairs=args.rounds, num_prompts=args.num_prompts,
                     prompt_lens=(args.min_prompt_len, args.max_prompt_len),
                     output_lens=(args.min_output_len, args.max_output_len), seed=args.seed,
                     threads=args.threads, max_num_seqs=args.max_num_seqs, round_seconds=args.round_seconds,
                     flush_interval=args.flush_interval,
                     sidecar_session=args.sidecar_session, progress=lambda line: print(line, flush=True))
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    st = result["store"]
    complete = st["stored_requests"] == st["matching_token_ids"] == st["expected_requests"]
    return 0 if complete else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
