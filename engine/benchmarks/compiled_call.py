"""The compiled decode call: its graph called directly (engine/core/compiled_replay.py) against the same graph
called as the replay first did, and through dynamo, side by side in one process, and what one call costs.

    python -m engine.benchmarks.compiled_call [--model DIR] [--batch 1] [--tokens 128] [--rounds 6] [--threads 2]

Two engines on the default path (compile_decode, multi-step auto), built and warm before anything is timed:
one as the runner makes it, one whose replays go through torch.compile's wrappers with the sizes as Python
ints and whose dynamo guards are all kept (no `module_tensor_guards_only`), as the replay was first written.
Each round generates `--batch` greedy sequences of `--tokens` tokens 5 times with each side: the default
engine replayed; the first-replay engine; the default engine through dynamo (`ReplayedFunction.dynamo`, what
every call was before any replay). The order alternates by round, so that the machine's load falls on all
alike; prints the median tokens/s of each, the ratios, and whether the tokens were the same. Then, on one
captured multi-step sub-step of the default engine, the parts of one call in microseconds: through dynamo,
replayed, the guard check, the graph as replayed (its inputs fetched), the fetch alone, and the graph called
through torch.compile's wrappers as dynamo calls it.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: the shipped reference model)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from engine.core import compiled_replay
    from engine.core.llm import LLM
    from engine.core.model_refs import REFERENCE_MODEL
    from engine.core.sampling_params import SamplingParams

    from engine.core import model_runner

    model = args.model or str(REFERENCE_MODEL)
    llm = LLM(model)
    runner = llm.engine.runner
    if not runner.wait_compiled():
        raise SystemExit("the compiled decode steps did not build: nothing to compare")
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    prompts = [[(7 * i + j) % 100 + 1 for j in range(32)] for i in range(args.batch)]
    first_replay = _first_replay_engine(LLM, model, model_runner, compiled_replay, prompts, params)
    replayed = compiled_replay.ReplayedFunction.__call__

    def through_dynamo(self, *call_args):
        return self.dynamo(*call_args)

    sides = {"replayed": (llm, replayed), "first replay": (first_replay, replayed), "dynamo": (llm, through_dynamo)}
    rates: dict[str, list[float]] = {side: [] for side in sides}
    tokens: dict[str, list] = {}
    try:
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else reversed(list(sides)):
                engine, call = sides[side]
                compiled_replay.ReplayedFunction.__call__ = call
                engine.generate(prompts, params, use_tqdm=False)  # this side's entries learned, caches warm
                start = time.perf_counter()
                for _ in range(5):
                    outputs = engine.generate(prompts, params, use_tqdm=False)
                rates[side].append(5 * args.batch * args.tokens / (time.perf_counter() - start))
                tokens[side] = [out.token_ids for out in outputs]
    finally:
        compiled_replay.ReplayedFunction.__call__ = replayed
    for side, values in rates.items():
        print(f"{side:12s} median {statistics.median(values):8.1f} tok/s   rounds: "
              + " ".join(f"{v:.0f}" for v in values))
    median = {side: statistics.median(values) for side, values in rates.items()}
    print(f"replayed / first replay: {median['replayed'] / median['first replay']:.2f}x   "
          f"replayed / dynamo: {median['replayed'] / median['dynamo']:.2f}x   "
          f"same tokens: {tokens['replayed'] == tokens['first replay'] == tokens['dynamo']}")
    _one_call(llm, runner, params, prompts, torch)


def _first_replay_engine(LLM, model, model_runner, compiled_replay, prompts, params):
    """An engine whose replays call the graph through torch.compile's wrappers, under all of dynamo's guards
    (its graphs for these prompts learned while that replay is in place)."""
    def through_wrappers(graph, frame_locals, result):
        return lambda frame_locals: graph.compiled(*graph.fetch(frame_locals))

    saved = model_runner.module_tensor_guards_only, compiled_replay.ReplayedFunction._replay
    model_runner.module_tensor_guards_only = None
    compiled_replay.ReplayedFunction._replay = staticmethod(through_wrappers)
    try:
        llm = LLM(model)
        if not llm.engine.runner.wait_compiled():
            raise SystemExit("the compiled decode steps did not build: nothing to compare")
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        model_runner.module_tensor_guards_only, replay = saved
        compiled_replay.ReplayedFunction._replay = staticmethod(replay)
    return llm


def _one_call(llm, runner, params, prompts, torch) -> None:
    """The parts of one call on a captured sub-step (its KV slot is written again with the same values)."""
    fn = runner._compiled_argmax if runner._compiled_argmax is not None else None
    if fn is None:
        print("no multi-step graph on this engine (K = 1): no per-call split")
        return
    captured = []
    forward_steps = runner.forward_steps

    def capture(steps):
        captured.append(steps)
        return forward_steps(steps)

    runner.forward_steps = capture
    try:
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        runner.forward_steps = forward_steps
    steps = max(captured, key=len, default=[])
    if len(steps) < 2:
        print("no multi-step batch was taken: no per-call split")
        return
    step = steps[1]
    call_args = (step.input_ids, step.positions, step.metadata, runner.kv_caches, runner._step_backend)
    frame_locals = fn._locals(call_args)
    with torch.inference_mode():
        runner.backend.activate(step.metadata)
        learned = [(e, g) for e, g in fn.learned if e.guard_manager.check(frame_locals)]
        if not learned:
            print("the captured sub-step matches no learned graph: no per-call split")
            return
        entry, graph = learned[0]
        fetched = graph.fetch(frame_locals)
        parts = {
            "through dynamo": lambda: fn.dynamo(*call_args),
            "replayed": lambda: fn(*call_args),
            "  guard check": lambda: entry.guard_manager.check(frame_locals),
            "  graph, as replayed (fetch included)": lambda: graph.replay(frame_locals),
            "  input fetch": lambda: graph.fetch(frame_locals),
            "  graph through torch.compile's wrappers": lambda: graph.compiled(*fetched),
        }
        print(f"one sub-step call, batch {len(prompts)}:")
        for name, call in parts.items():
            print(f"  {name:42s} {_per_call_us(call):8.1f} us")


if __name__ == "__main__":
    main()
