"""Which probes a round sends: the suite in order, as far as the token budget and the context allow.

A probe costs its prompt tokens plus its max_tokens; sent "batched" it also costs its fillers
(each: the filler prompt plus the probe's max_tokens plus a few: the runner stops a filler once its probe
is answered, so that is what one decodes on a replica that admits the probe promptly). A round
sends the same plan to every replica (so every replica answers the same probes), so the plan's
cost is its cost on one replica times the replicas. Under `token_budget` the suite is taken in
order, first fit: a probe's solo send first, then its batched one (only if the solo one fits);
what does not fit is skipped and counted in the round's result, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.traffic.probe.suite import Probe

FILLER_EXTRA_TOKENS = 24  # what a filler decodes past its probe before the runner stops it (planned cost)
# A filler may decode this many tokens (or what the context leaves): it must still be decoding when its
# probe is admitted, one HTTP round trip and an admission after the filler's first token, which on a fast
# model and a loaded host is hundreds of steps. The runner stops it once the probe is answered.
FILLER_RUN_TOKENS = 512


@dataclass(frozen=True)
class Measured:
    """A probe ready to plan: its body and prompt length (None, with `why_not`, when it cannot be built)."""

    probe: Probe
    body: dict
    prompt_tokens: int | None
    why_not: str = ""


@dataclass(frozen=True)
class Planned:
    probe: Probe
    mode: str  # "solo" | "batched"
    body: dict  # the request body (without `model`)
    tokens: int  # prompt + output tokens on one replica, fillers included


@dataclass(frozen=True)
class Skipped:
    probe_id: str
    mode: str
    reason: str


@dataclass
class Plan:
    sends: list[Planned] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    tokens_per_replica: int = 0
    replicas: int = 1
    token_budget: int | None = None

    @property
    def tokens(self) -> int:
        return self.tokens_per_replica * self.replicas


def filler_max_tokens(probe: Probe) -> int:
    """A filler's planned length: its probe's, plus what it decodes before it is stopped."""
    return probe.max_tokens + FILLER_EXTRA_TOKENS


def filler_run_tokens(probe: Probe, filler_prompt_tokens: int, max_model_len: int) -> int:
    """The max_tokens a filler is sent with: FILLER_RUN_TOKENS, or what `max_model_len` (0: unknown)
    leaves after its prompt, but never less than its planned length."""
    room = max_model_len - filler_prompt_tokens if max_model_len else FILLER_RUN_TOKENS
    return max(filler_max_tokens(probe), min(FILLER_RUN_TOKENS, room))


def send_cost(probe: Probe, prompt_tokens: int, mode: str, batch_fillers: int, filler_prompt_tokens: int) -> int:
    cost = prompt_tokens + probe.max_tokens
    if mode == "batched":
        cost += batch_fillers * (filler_prompt_tokens + filler_max_tokens(probe))
    return cost


def plan_round(measured: list[Measured], *, replicas: int, modes=("solo", "batched"),
               token_budget: int | None = None, batch_fillers: int = 4, filler_prompt_tokens: int = 0,
               max_model_len: int = 0) -> Plan:
    """The sends of a round, from the `measured` suite (in suite order). `max_model_len`: the
    tightest context among the replicas (0: unknown, nothing is checked against it)."""
    plan = Plan(replicas=max(1, replicas), token_budget=token_budget)
    per_replica_budget = None if token_budget is None else token_budget // plan.replicas
    for m in measured:
        probe, prompt_tokens = m.probe, m.prompt_tokens
        solo_sent = False
        for mode in modes:
            why_not = ""
            if prompt_tokens is None:
                why_not = m.why_not or "could not be built"
            elif max_model_len and prompt_tokens + probe.max_tokens > max_model_len:
                why_not = (f"{prompt_tokens} prompt + {probe.max_tokens} output tokens exceed the "
                           f"{max_model_len}-token context")
            elif mode == "batched" and "solo" in modes and not solo_sent:
                why_not = "its solo send was skipped"
            else:
                cost = send_cost(probe, prompt_tokens, mode, batch_fillers, filler_prompt_tokens)
                if per_replica_budget is not None and plan.tokens_per_replica + cost > per_replica_budget:
                    why_not = (f"token budget ({cost} tokens x {plan.replicas} replica(s) do not fit in what "
                               f"is left of {token_budget})")
            if why_not:
                plan.skipped.append(Skipped(probe.probe_id, mode, why_not))
                continue
            plan.sends.append(Planned(probe, mode, m.body, cost))
            plan.tokens_per_replica += cost
            solo_sent = solo_sent or mode == "solo"
    return plan
