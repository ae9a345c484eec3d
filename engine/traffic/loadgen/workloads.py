"""The workload classes of the field, as seeded request generators.

- chat: short user turns behind one shared system prompt, streamed; what
  matters is time to first token and inter-token latency.
- agent: long prompts that grow turn by turn inside a few sessions (a long
  shared tool manual, then the session's history): heavy prefix reuse, longer
  outputs, streamed.
- batch: data processing; many documents under one instruction, not
  streamed, sent in bursts; what matters is throughput.
- mixed: a weighted draw among the three.

Prompts are plain text made from a fixed word list, so any tokenizer works and
a seed gives the same requests every time. `ignore_eos` keeps output lengths
what the workload asks for (random-weight models stop at arbitrary points).

Sampling: requests are sampled at `temperature` (0.8 by default: production-like
traffic); a `greedy_share` of them, drawn by a seeded generator of their own, go at
temperature 0 instead. Greedy production requests are what a replay can compare
token by token (evals/replay), and the draw never touches the prompt generator, so
the same seed gives the same prompts whatever the share.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_WORDS = (
    "the replica cache token latency engine queue batch model prompt request decode prefill block "
    "scheduler sample output memory kernel thread socket record metric trace span store table query "
    "value key alpha beta gamma delta report number list sort reverse answer question system user "
    "assistant tool result error retry window budget node cpu gpu page hash prefix suffix stream chunk"
).split()

_TOOLS = ("search", "read_file", "run_tests", "query_store", "list_replicas", "fetch_metrics")


DEFAULT_TEMPERATURE = 0.8
MAX_TEMPERATURE = 100.0  # the server's limit (engine/serving/server/protocol.py)


def check_share(value: float, name: str) -> None:
    """A share of requests: a number in [0, 1]."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a share of requests in [0, 1], got {value!r}")


def check_sampling_knobs(greedy_share: float, temperature: float) -> None:
    check_share(greedy_share, "greedy share")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) \
            or not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}] (0 is greedy), got {temperature!r}")


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n)))


@dataclass
class RequestSpec:
    """One request to send: which API, the JSON body (without `model`), streamed or not."""

    workload: str
    api: str  # "chat" | "completions"
    body: dict
    stream: bool
    session: str = ""  # agent session id ("" elsewhere)

    @property
    def greedy(self) -> bool:
        return self.body.get("temperature") == 0


@dataclass
class Workload:
    """A seeded stream of requests of one class.

    `scale` sizes everything for the model at hand: prompt lengths (words, tool lists, agent
    turns) linearly, output lengths by its square root (not below a tenth), so a small-context
    model gets the same shapes, smaller. `max_tokens` fixes every output length instead.
    """

    name: str
    seed: int = 0
    scale: float = 1.0
    max_tokens: int | None = None  # overrides the class's output lengths
    ignore_eos: bool = True
    greedy_share: float = 0.0  # share of requests sent at temperature 0
    temperature: float = DEFAULT_TEMPERATURE  # of the sampled ones
    rng: random.Random = field(init=False)
    greedy_rng: random.Random = field(init=False)

    def __post_init__(self):
        check_sampling_knobs(self.greedy_share, self.temperature)
        self.rng = random.Random(f"{self.name}:{self.seed}")
        # its own generator: the prompts of a seed stay the same whatever the greedy share
        self.greedy_rng = random.Random(f"{self.name}:{self.seed}:greedy")

    def knobs(self) -> dict:
        """Everything but the scale, to rebuild this workload at another scale (see `rescaled`)."""
        return {"max_tokens": self.max_tokens, "ignore_eos": self.ignore_eos, "greedy_share": self.greedy_share,
                "temperature": self.temperature}

    def rescaled(self, scale: float) -> "Workload":
        """A fresh workload of the same class, seed and knobs at another prompt scale."""
        return make_workload(self.name, self.seed, scale, **self.knobs())

    def n(self, words: int) -> int:
        return max(1, int(words * self.scale))

    def out(self, lo: int, hi: int) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        f = min(1.0, max(0.1, self.scale ** 0.5))
        return self.rng.randint(max(1, int(lo * f)), max(1, int(hi * f)))

    def sampling(self) -> dict:
        seed = self.rng.randrange(2**31)  # drawn either way: the prompt generator's sequence never changes
        if self.greedy_share and self.greedy_rng.random() < self.greedy_share:
            return {"temperature": 0.0, "ignore_eos": self.ignore_eos}
        return {"temperature": self.temperature, "top_p": 0.95, "seed": seed, "ignore_eos": self.ignore_eos}

    def next(self) -> RequestSpec:
        raise NotImplementedError


class Chat(Workload):
    def __init__(self, seed: int = 0, **kw):
        super().__init__("chat", seed, **kw)
        shared = random.Random(f"chat-system:{seed}")
        self.system = "You are a helpful assistant for inference engineers. " + _words(shared, self.n(40))

    def next(self) -> RequestSpec:
        question = f"question {self.rng.randrange(10**6)}: " + _words(self.rng, self.n(self.rng.randint(6, 20)))
        body = {"messages": [{"role": "system", "content": self.system}, {"role": "user", "content": question}],
                "max_tokens": self.out(16, 40), **self.sampling()}
        return RequestSpec("chat", "chat", body, stream=True)


class Agent(Workload):
    """A few sessions whose transcripts grow: each turn re-sends the whole history."""

    def __init__(self, seed: int = 0, sessions: int = 4, max_turns: int = 6, **kw):
        super().__init__("agent", seed, **kw)
        shared = random.Random(f"agent-manual:{seed}")
        self.tools = _TOOLS[:max(1, min(len(_TOOLS), round(len(_TOOLS) * self.scale)))]
        manual = [f"tool {t}: " + _words(shared, self.n(50)) for t in self.tools]
        self.system = "You are an agent that fixes slow replicas. Tools:\n" + "\n".join(manual)
        self.max_turns = max(1, min(max_turns, round(max_turns * self.scale * 2)))
        self.sessions: list[list[dict]] = [[] for _ in range(sessions)]

    def next(self) -> RequestSpec:
        i = self.rng.randrange(len(self.sessions))
        history = self.sessions[i]
        if len(history) >= 2 * self.max_turns:  # the task is done: a new one starts
            history.clear()
        if not history:
            history.append({"role": "user", "content": f"task {self.rng.randrange(10**6)}: "
                                                       + _words(self.rng, self.n(30))})
        else:  # the previous step's tool call and its observation
            tool = self.rng.choice(self.tools)
            history.append({"role": "assistant", "content": f"call {tool}(" + _words(self.rng, self.n(4)) + ")"})
            history.append({"role": "user", "content": f"observation from {tool}: " + _words(self.rng, self.n(40))})
        messages = [{"role": "system", "content": self.system}] + list(history)
        body = {"messages": messages, "max_tokens": self.out(48, 96), **self.sampling()}
        return RequestSpec("agent", "chat", body, stream=True, session=f"s{i}")


class Batch(Workload):
    def __init__(self, seed: int = 0, **kw):
        super().__init__("batch", seed, **kw)
        self.instruction = ("Extract the replica, the metric and the value from the record below, "
                            "then summarize it in one line.\n")

    def next(self) -> RequestSpec:
        record = f"record {self.rng.randrange(10**6)}: " + _words(self.rng, self.n(self.rng.randint(40, 90)))
        body = {"prompt": self.instruction + record + "\nSummary:", "max_tokens": self.out(16, 32),
                **self.sampling()}
        return RequestSpec("batch", "completions", body, stream=False)


class Mixed(Workload):
    WEIGHTS = {"chat": 0.5, "agent": 0.25, "batch": 0.25}

    def __init__(self, seed: int = 0, **kw):
        super().__init__("mixed", seed, **kw)
        self.parts = {"chat": Chat(seed, **kw), "agent": Agent(seed, **kw), "batch": Batch(seed, **kw)}

    def next(self) -> RequestSpec:
        name = self.rng.choices(list(self.WEIGHTS), weights=list(self.WEIGHTS.values()))[0]
        return self.parts[name].next()


WORKLOADS = {"chat": Chat, "agent": Agent, "batch": Batch, "mixed": Mixed}


def make_workload(name: str, seed: int = 0, scale: float = 1.0, max_tokens: int | None = None,
                  ignore_eos: bool = True, greedy_share: float = 0.0,
                  temperature: float = DEFAULT_TEMPERATURE) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return WORKLOADS[name](seed, scale=scale, max_tokens=max_tokens, ignore_eos=ignore_eos,
                           greedy_share=greedy_share, temperature=temperature)
