"""Which side of a comparison is the baseline: the rule that breaks the two-replica tie.

With one baseline and one canary (the most common deploy) a 1-to-1 disagreement cannot say by
itself which side drifted. Every diagnostic that compares replicas of one model takes its
baseline from here, in this order, and says which rule it used:

1. `pinned`: a golden probe round pinned for the model (`infersight probe --pin`, table
   probe_baselines): replicas whose identity equals the pin's are the baseline, and the pinned
   token IDs are the reference outputs;
2. `requested`: the request's baseline scope (`--baseline replica=r0`, `version=0.1.0` ...):
   the replicas in it;
3. `role`: the role recorded in the replicas' rows (`serve --role`, the fleet TOML's `role`, the
   proxy's `--role`): the identity of the replicas with role "baseline"; with candidates named
   and no baseline, the one identity the others share;
4. `first_served`: the identity deployed first, only where the deploys are clearly apart: a
   canary deployed beside a baseline that was already serving, not a fleet whose replicas were
   started together and merely finished loading in some order. Apart means, per later identity:
   - where both sides recorded a deploy time (the instant before the model loaded: `fleet up`
     stamps one instant on every replica it starts, `serve` alone its own launch), the later
     side was deployed at or after the earlier side started serving (its start row) and at least
     DEPLOY_STEP_SECONDS after the earlier deploy: it could not have been part of that start-up;
   - otherwise (rows without a deploy time: older rows, engines that do not say), the start rows
     are at least STARTS_APART_SECONDS apart. Replicas started together load in parallel, so
     their start rows spread by at most the slowest start-up: seconds for the reference model,
     a minute or two for a large checkpoint's weights and CUDA-graph capture; 5 minutes is above
     that, and below a canary's usual step after its baseline;
5. `none`: no rule decides (two identities started together, no pin, no role): the callers
   report one symmetric finding on the pair, naming both sides and asking for a `role`, and
   never blame one side.

With three or more replicas the callers' majority decides before this rule is asked.

An identity is what can change the answers: weights, tokenizer, chat template, config, engine
version (telemetry.contract.records.ReplicaRecord). Replicas that share it are one side.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from diagnostics.request import DiagnosticRequest

STARTS_APART_SECONDS = 300.0  # start rows this far apart are separate deploys (no deploy time recorded)
DEPLOY_STEP_SECONDS = 1.0  # deploy times closer than this are one deploy (a script starting both)
NO_BASELINE_HINT = "name one with `role` (serve --role baseline, or the fleet TOML's role) or pin a probe round"
IDENTITY_FIELDS = ("weights_hash", "tokenizer_hash", "chat_template_hash", "config_hash", "engine_version")

_PINS = """
SELECT model_name, probe_id, argMax(tuple(pinned_time, round_id, replica_id, api, weights_hash, tokenizer_hash,
                                          chat_template_hash, config_hash, engine_version, prompt_text_hash,
                                          rendered_prompt_hash, sampling_params_json, prompt_token_ids,
                                          output_token_ids, finish_reason, note), pinned_time) AS pin
FROM probe_baselines
WHERE model_name = {model:String}
GROUP BY model_name, probe_id
ORDER BY probe_id
"""
_PIN_FIELDS = ("pinned_time", "round_id", "replica_id", "api", "weights_hash", "tokenizer_hash", "chat_template_hash",
               "config_hash", "engine_version", "prompt_text_hash", "rendered_prompt_hash", "sampling_params_json",
               "prompt_token_ids", "output_token_ids", "finish_reason", "note")


def identity_key(replica: dict) -> tuple:
    """The fields of a replica row (diagnostics.scope.replicas_in, or a pin) that can change its answers."""
    return tuple(str(replica.get(f, "")) for f in IDENTITY_FIELDS)


@dataclass(frozen=True)
class Baseline:
    model_name: str
    identity: tuple  # identity_key of the baseline side
    replicas: tuple[str, ...]  # the replicas in the window that have that identity
    rule: str  # "pinned" | "requested" | "role" | "first_served" | "none" (no side decides)
    reason: str  # one sentence a person reads: which side and why
    pins: dict | None = None  # probe_id -> pinned row, under the "pinned" rule

    @property
    def decided(self) -> bool:
        return self.rule != "none"

    def is_baseline(self, replica: dict) -> bool:
        return self.decided and identity_key(replica) == self.identity

    def label(self) -> str:
        """`r0, first served` / `r0, requested` / `pin of round p1 from r0`: how summaries name it."""
        if self.rule == "pinned":
            latest = max(self.pins.values(), key=lambda p: p["pinned_time"])
            return f"pin of round {latest['round_id']} from {latest['replica_id']}"
        if not self.decided:
            return f"none ({self.reason})"
        return f"{', '.join(self.replicas) or 'none in the window'}, {self.rule.replace('_', ' ')}"

    def describe(self) -> dict:
        return {"rule": self.rule, "reason": self.reason, "replicas": list(self.replicas),
                "identity": dict(zip(IDENTITY_FIELDS, self.identity))}


def pinned_probes(store, model: str) -> dict[str, dict]:
    """probe_id -> the latest pin of that probe for `model` ({} when none is pinned)."""
    rows = store.query_arrow(_PINS, {"model": model}).to_pylist()
    out = {}
    for r in rows:
        pin = r["pin"]
        values = list(pin.values()) if isinstance(pin, dict) else list(pin)
        out[r["probe_id"]] = {"model_name": model, "probe_id": r["probe_id"], **dict(zip(_PIN_FIELDS, values))}
    return out


def choose_baseline(store, model: str, replicas: list[dict], request: DiagnosticRequest | None = None,
                    pins: dict[str, dict] | None = None) -> Baseline | None:
    """The baseline among `replicas` (rows of diagnostics.scope.replicas_in, all serving `model`);
    None when there are none. `pins` defaults to the store's pins for the model."""
    if not replicas:
        return None
    pins = pinned_probes(store, model) if pins is None else pins
    if pins:
        latest = max(pins.values(), key=lambda p: p["pinned_time"])
        key = identity_key(latest)
        members = tuple(sorted(r["replica_id"] for r in replicas if identity_key(r) == key))
        return Baseline(model, key, members, "pinned",
                        f"the probe round {latest['round_id']} pinned from {latest['replica_id']} "
                        f"is the baseline of {model}"
                        + ("" if members else " (no replica in the window has its identity)"), pins)
    if request is not None and request.baseline is not None:
        wanted = set(request.baseline.replicas)
        versions, configs = set(request.baseline.versions), set(request.baseline.config_hashes)
        chosen = [r for r in replicas
                  if (not wanted or r["replica_id"] in wanted) and (not versions or r["engine_version"] in versions)
                  and (not configs or r["config_hash"] in configs)]
        if chosen:
            first = min(chosen, key=lambda r: (r["started"], r["replica_id"]))
            key = identity_key(first)
            members = tuple(sorted(r["replica_id"] for r in replicas if identity_key(r) == key))
            return Baseline(model, key, members, "requested",
                            f"the baseline was named ({request.baseline.label()}): {', '.join(members)}")
    return by_role(model, replicas) or first_served(model, replicas)


def _side(model: str, replicas: list[dict], key: tuple, rule: str, reason: str) -> Baseline:
    members = tuple(sorted(r["replica_id"] for r in replicas if identity_key(r) == key))
    return Baseline(model, key, members, rule, reason)


def by_role(model: str, replicas: list[dict]) -> Baseline | None:
    """The identity of the replicas recorded as "baseline"; with only candidates named, the one identity
    the others share; None where no role decides."""
    roles = {r["replica_id"]: str(r.get("role") or "") for r in replicas}
    named = [r for r in replicas if roles[r["replica_id"]] == "baseline"]
    if named:
        keys = Counter(identity_key(r) for r in named).most_common()
        if len(keys) > 1 and keys[0][1] == keys[1][1]:
            return None  # baselines of several identities, none the most: no role decides
        ids = ", ".join(sorted(r["replica_id"] for r in named))
        return _side(model, replicas, keys[0][0], "role", f"{ids} recorded role baseline")
    candidates = sorted(rid for rid, role in roles.items() if role == "candidate")
    rest = {identity_key(r) for r in replicas if roles[r["replica_id"]] != "candidate"}
    if candidates and len(rest) == 1:
        return _side(model, replicas, rest.pop(), "role", f"{', '.join(candidates)} recorded role candidate")
    return None


def _seconds(t) -> float:
    return t.timestamp() if hasattr(t, "timestamp") else float(t or 0.0)


def _deployed(r: dict) -> float | None:
    t = _seconds(r.get("deploy_time"))
    return t if t > 0 else None


def apart(first: list[dict], later: list[dict]) -> tuple[bool, str]:
    """Were `later` (one identity's replicas) deployed clearly after `first` started (the module's rule)?"""
    first_deploy = [_deployed(r) for r in first]
    later_deploy = [_deployed(r) for r in later]
    serving = min(_seconds(r["started"]) for r in first)
    if all(first_deploy) and all(later_deploy):
        d0, d1 = min(first_deploy), min(later_deploy)
        ok = d1 >= serving and d1 - d0 >= DEPLOY_STEP_SECONDS
        return ok, (f"deployed {d1 - d0:.0f} s after them, " + ("once they served" if ok else "while they started"))
    gap = min(_seconds(r["started"]) for r in later) - serving
    return gap >= STARTS_APART_SECONDS, f"started {gap:.0f} s after them (apart from {STARTS_APART_SECONDS:.0f} s)"


def first_served(model: str, replicas: list[dict]) -> Baseline:
    """The identity deployed first where the later ones came clearly after it; else no baseline (`none`)."""
    def when(r):
        return (_deployed(r) or _seconds(r["started"]), _seconds(r["started"]), r["replica_id"])

    first = min(replicas, key=when)
    key = identity_key(first)
    groups: dict[tuple, list[dict]] = {}
    for r in replicas:
        groups.setdefault(identity_key(r), []).append(r)
    mine = groups.pop(key)
    ids = ", ".join(sorted(r["replica_id"] for r in mine))
    verdicts = {k: apart(mine, g) for k, g in groups.items()}
    together = [g for k, g in groups.items() if not verdicts[k][0]]
    if together:
        others = ", ".join(sorted(r["replica_id"] for g in together for r in g))
        how = "; ".join(verdicts[identity_key(g[0])][1] for g in together)
        return Baseline(model, (), (), "none",
                        f"{ids} and {others} were started together ({others} {how}), and no role or pin says "
                        f"which is the baseline: {NO_BASELINE_HINT}")
    newer = sorted(r["replica_id"] for g in groups.values() for r in g)
    return _side(model, replicas, key, "first_served",
                 f"{first['replica_id']}'s identity served {model} first (started {_clock(first['started'])})"
                 + (f"; {', '.join(newer)} deployed later with another identity ("
                    + "; ".join(v[1] for v in verdicts.values()) + ")" if newer else ""))


def baselines_by_model(store, replicas: list[dict], request: DiagnosticRequest | None = None,
                       models=None) -> dict[str, Baseline | None]:
    """model -> its Baseline among `replicas` (rows of diagnostics.scope.replicas_in), for every
    model in `models` (default: every model the rows serve; a model without rows maps to None)."""
    by_model: dict[str, list[dict]] = {}
    for r in replicas:
        by_model.setdefault(r["model_name"], []).append(r)
    wanted = sorted(by_model) if models is None else sorted(set(models))
    return {m: choose_baseline(store, m, by_model.get(m, []), request) for m in wanted}


def _clock(started) -> str:
    return started.strftime("%Y-%m-%d %H:%M:%S UTC") if hasattr(started, "strftime") else str(started)
