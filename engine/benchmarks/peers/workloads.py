"""The four workloads, as token IDs, deterministic from a seed, fitted to the model's context.

    mixed    64 prompts of 16-512 random tokens, 16-256 outputs each (vLLM's benchmark_throughput shape)
    decode   16 short prompts (8-16 tokens), 256 outputs each: decode-bound
    batch1   one 128-token prompt, 128 outputs: latency-bound, the memory-bandwidth roofline case
    prefix   32 prompts = one shared 256-token prefix + 32 own tokens, 64 outputs each
    prefill  mixed's prompts, one output each: the prefill half of mixed, rated in prompt tokens/s (not run
             by default; `--workloads mixed,prefill` splits a mixed gap into prefill and the rest)

Greedy and EOS ignored everywhere, so every side produces exactly `output_lens`. A model whose context
(max_position_embeddings) is shorter than a workload's longest prompt + output gets every length of that
workload scaled down by the same factor (the reference model has 256 positions); the printed header says
what ran. Token IDs are drawn from [first_token_id, vocab) so that no special token (BOS/EOS/PAD, chat
markers) appears in a prompt.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

NAMES = ("mixed", "decode", "batch1", "prefix")  # the default run
OPTIONAL = ("prefill",)


@dataclass(frozen=True)
class Spec:
    name: str
    num_prompts: int
    prompt_lens: tuple[int, int]  # uniform range, inclusive (own tokens, after the shared prefix)
    output_lens: tuple[int, int]
    shared_prefix: int = 0
    prefill_of: str = ""  # this workload is that one's prompts, one output token each

    @property
    def longest(self) -> int:
        return self.shared_prefix + self.prompt_lens[1] + self.output_lens[1]

    def scaled(self, factor: float) -> "Spec":
        def s(n: int) -> int:
            return max(1, int(n * factor))
        return Spec(self.name, self.num_prompts, (s(self.prompt_lens[0]), s(self.prompt_lens[1])),
                    (s(self.output_lens[0]), s(self.output_lens[1])), s(self.shared_prefix) if self.shared_prefix else 0,
                    self.prefill_of)


FULL = {
    "mixed": Spec("mixed", 64, (16, 512), (16, 256)),
    "decode": Spec("decode", 16, (8, 16), (256, 256)),
    "batch1": Spec("batch1", 1, (128, 128), (128, 128)),
    "prefix": Spec("prefix", 32, (32, 32), (64, 64), shared_prefix=256),
}
FULL["prefill"] = Spec("prefill", 64, FULL["mixed"].prompt_lens, (1, 1), prefill_of="mixed")
QUICK = {  # a smoke run: seconds, not minutes
    "mixed": Spec("mixed", 8, (16, 64), (8, 32)),
    "decode": Spec("decode", 4, (8, 16), (32, 32)),
    "batch1": Spec("batch1", 1, (32, 32), (32, 32)),
    "prefix": Spec("prefix", 4, (8, 8), (16, 16), shared_prefix=64),
}
QUICK["prefill"] = Spec("prefill", 8, QUICK["mixed"].prompt_lens, (1, 1), prefill_of="mixed")


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    output_lens: list[int]
    spec: Spec

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def rated_tokens(self) -> int:
        """What its tokens/s counts: output tokens, or prompt tokens for a prefill workload."""
        return self.prompt_tokens if self.spec.prefill_of else self.output_tokens

    def to_json(self) -> dict:
        """What a driver gets: token IDs only."""
        return dict(name=self.name, prompts=self.prompts, output_lens=self.output_lens)

    def describe(self) -> str:
        s = self.spec
        pre = f"{s.shared_prefix} shared + " if s.shared_prefix else ""
        return (f"{self.name}: {len(self.prompts)} prompts of {pre}{s.prompt_lens[0]}-{s.prompt_lens[1]} tokens, "
                f"{s.output_lens[0]}-{s.output_lens[1]} out ({self.prompt_tokens} in, {self.output_tokens} out)")


def fit(spec: Spec, context: int, table: dict | None = None) -> Spec:
    if spec.prefill_of:  # scaled as its source is: the same prompts
        source = fit((table or FULL)[spec.prefill_of], context)
        return Spec(spec.name, source.num_prompts, source.prompt_lens, (1, 1), source.shared_prefix, spec.prefill_of)
    return spec if spec.longest <= context else spec.scaled(context / spec.longest)


def make(spec: Spec, vocab_size: int, seed: int = 0, first_token_id: int = 6) -> Workload:
    if spec.prefill_of:  # its source's prompts: `fit` gave it the source's lengths, and a prompt draws no output
        source = Spec(spec.prefill_of, spec.num_prompts, spec.prompt_lens, (1, 1), spec.shared_prefix)
        prompts = make(source, vocab_size, seed, first_token_id).prompts
        return Workload(spec.name, prompts, [1] * len(prompts), spec)
    # one generator per workload name: adding a workload never changes another's token IDs
    rng = random.Random(f"{seed}:{spec.name}")

    def tokens(n: int) -> list[int]:
        return [rng.randrange(first_token_id, vocab_size) for _ in range(n)]

    prefix = tokens(spec.shared_prefix)
    prompts = [prefix + tokens(rng.randint(*spec.prompt_lens)) for _ in range(spec.num_prompts)]
    return Workload(spec.name, prompts, [rng.randint(*spec.output_lens) for _ in range(spec.num_prompts)], spec)


def build(names: list[str], vocab_size: int, context: int, quick: bool = False, seed: int = 0) -> list[Workload]:
    table = QUICK if quick else FULL
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {list(NAMES + OPTIONAL)}")
    return [make(fit(table[n], context, table), vocab_size, seed) for n in names]


__all__ = ["FULL", "NAMES", "OPTIONAL", "QUICK", "Spec", "Workload", "asdict", "build", "fit", "make"]
