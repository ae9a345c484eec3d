"""Where an eval's generations come from: an in-process engine, or a deployed replica over HTTP.

Both take suite items and return `Generation`s with the exact token ids (the
prompt as the model saw it, the output as it produced it), the text and the
logprob of each output token, so a run can later be teacher-forced under
another configuration and compared token by token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from evals.suite import SuiteItem


@dataclass
class Generation:
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    latency_seconds: float = 0.0
    error: str = ""  # the item could not be run (e.g. prompt too long): scored 0, kept in the run
    spec_proposed: int = 0  # speculative decoding: draft tokens proposed / accepted for this item
    spec_accepted: int = 0


@dataclass
class Identity:
    """What the run records about the configuration it measured."""

    config_json: str
    config_hash: str
    model_name: str
    weights_hash: str = ""
    quantization: str = "none"
    speculative_mode: str = "none"
    endpoint: str = ""


def _progress(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="item", dynamic_ncols=True)


def _token_progress(total_tokens: int, enabled: bool, items: int):
    from tqdm import tqdm

    return tqdm(total=total_tokens, disable=not enabled, desc=f"eval ({items} items)", unit="tok",
                dynamic_ncols=True)


class EngineBackend:
    """Greedy generation with an in-process `LLMEngine` built from an EngineConfig."""

    def __init__(self, config, observer=None):
        from engine.core.engine import LLMEngine

        self.config = config
        self.engine = LLMEngine(config, observer)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def identity(self) -> Identity:
        r = self.engine.replica_record
        return Identity(config_json=self.config.to_json(), config_hash=r.config_hash, model_name=r.model_name,
                        weights_hash=r.weights_hash, quantization=r.quantization,
                        speculative_mode=r.speculative_mode)

    def prompt(self, item: SuiteItem):
        """The item as the engine's `Prompt` (chat items keep their messages' hashes, as served requests do)."""
        if item.messages is not None:
            return self.engine.chat_prompt(item.messages)
        return self.engine.prepare_prompt(item.prompt)

    def generate(self, items: list[SuiteItem], max_tokens: int, progress: bool = True) -> list[Generation]:
        from engine.core.sampling_params import SamplingParams

        eng = self.engine
        results: dict[str, Generation] = {}
        started: dict[str, float] = {}
        for i, item in enumerate(items):
            rid = f"eval-{i}"
            params = SamplingParams(temperature=0.0, max_tokens=item.max_tokens or max_tokens, logprobs=0)
            try:
                prompt = self.prompt(item)
                started[rid] = time.perf_counter()
                eng.add_request(rid, prompt, params, stream=False)
            except ValueError as e:  # admission error: recorded on the item, the run goes on
                results[rid] = Generation([], [], "", error=str(e))
        # the engine batches every item, so items all finish near the end: the bar counts output tokens
        # (each item's budget; an item that stops early fills the rest of its budget), moving every step
        budgets = {f"eval-{i}": item.max_tokens or max_tokens for i, item in enumerate(items)}
        finished_budget = sum(budgets[rid] for rid in results)
        with _token_progress(sum(budgets.values()), progress, len(items)) as bar:
            while eng.has_unfinished():
                for out in eng.step():
                    if not out.finished:
                        continue
                    finished_budget += budgets[out.request_id]
                    m = out.metrics
                    results[out.request_id] = Generation(
                        list(out.prompt_token_ids), list(out.token_ids), out.text,
                        [lp.logprob for lp in (out.logprobs or [])], out.finish_reason or "",
                        time.perf_counter() - started[out.request_id], out.error or "",
                        m.spec_proposed if m else 0, m.spec_accepted if m else 0)
                running = sum(min(seq.num_output_tokens, budgets[rid]) for rid, seq in eng.requests.items()
                              if rid in budgets)
                bar.update(finished_budget + running - bar.n)
                bar.set_postfix_str(f"{len(results)}/{len(items)} items", refresh=False)
        return [results[f"eval-{i}"] for i in range(len(items))]

    def close(self) -> None:
        self.engine.close()


class HttpBackend:
    """Greedy generation against an OpenAI-compatible replica (`infersight serve`).

    Chat items go to /v1/chat/completions, text prompts to /v1/completions, one
    request at a time with `return_token_ids` so the run keeps the token ids the
    replica really used.
    """

    def __init__(self, url: str, model: str | None = None, timeout: float = 120.0, api_key: str | None = None):
        import httpx

        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)
        self.model = model or self._served_model()

    def _served_model(self) -> str:
        r = self.client.get("/v1/models")
        r.raise_for_status()
        data = r.json().get("data") or []
        if not data:
            raise ValueError(f"{self.url}/v1/models lists no model")
        return data[0]["id"]

    def identity(self) -> Identity:
        import hashlib

        cfg = json.dumps({"endpoint": self.url, "model": self.model}, sort_keys=True)
        return Identity(config_json=cfg, config_hash=hashlib.sha256(cfg.encode()).hexdigest()[:16],
                        model_name=self.model, endpoint=self.url)

    def _request(self, item: SuiteItem, max_tokens: int) -> tuple[str, dict]:
        common = {"model": self.model, "max_tokens": item.max_tokens or max_tokens, "temperature": 0.0,
                  "return_token_ids": True}
        if item.messages is not None:
            return "/v1/chat/completions", {**common, "messages": item.messages, "logprobs": True}
        return "/v1/completions", {**common, "prompt": item.prompt, "logprobs": 0}

    @staticmethod
    def parse(body: dict) -> Generation:
        """A Generation from an OpenAI-shaped completion or chat completion response body."""
        choice = body["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice.get("text", "")
        lp = choice.get("logprobs") or {}
        if "content" in lp:  # chat shape
            logprobs = [t["logprob"] for t in lp.get("content") or []]
        else:  # completions shape
            logprobs = [x for x in lp.get("token_logprobs") or [] if x is not None]
        return Generation(list(body.get("prompt_token_ids") or []), list(choice.get("token_ids") or []),
                          text or "", logprobs, choice.get("finish_reason") or "")

    def generate(self, items: list[SuiteItem], max_tokens: int, progress: bool = True) -> list[Generation]:
        import httpx

        out = []
        with _progress(len(items), progress, "eval") as bar:
            for item in items:
                path, payload = self._request(item, max_tokens)
                t0 = time.perf_counter()
                try:
                    r = self.client.post(path, json=payload)
                except httpx.HTTPError as e:
                    raise ConnectionError(f"{self.url}{path}: {type(e).__name__}: {e}") from e
                if r.status_code == 400:  # the replica refused this item: recorded, the run goes on
                    out.append(Generation([], [], "", error=_error_message(r)))
                elif r.status_code != 200:
                    raise ConnectionError(f"{self.url}{path}: HTTP {r.status_code}: {_error_message(r)}")
                else:
                    gen = self.parse(r.json())
                    gen.latency_seconds = time.perf_counter() - t0
                    out.append(gen)
                bar.update(1)
        return out

    def close(self) -> None:
        self.client.close()


def _error_message(response) -> str:
    try:
        return response.json()["error"]["message"]
    except Exception:  # noqa: BLE001 - not the OpenAI error shape: show the raw text
        return response.text[:500]
