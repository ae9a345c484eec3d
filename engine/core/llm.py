"""The offline API: `LLM(model_dir).generate(prompts, params)` with a progress bar.

    llm = LLM("path/to/model", max_num_seqs=32)
    outs = llm.generate(["Hello", [0, 17, 42]], SamplingParams(temperature=0.0, max_tokens=32))
    outs = llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(max_tokens=16))
    logprobs = llm.score(prompt_ids, continuation_ids)  # teacher-forced, one per continuation token
"""

from __future__ import annotations

import itertools
from pathlib import Path

from engine.core.config import EngineConfig
from engine.core.engine import LLMEngine
from engine.core.outputs import RequestOutput
from engine.core.prompt import Prompt
from engine.core.sampling_params import SamplingParams
from telemetry.contract.hooks import EngineObserver

PromptInput = str | list[int] | Prompt


def _is_token_ids(x) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, int) for t in x)


class LLM:
    def __init__(self, model: str | Path | EngineConfig, observer: EngineObserver | None = None,
                 **config_overrides):
        self.engine = LLMEngine(model, observer, **config_overrides)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: PromptInput | list[PromptInput], sampling_params: SamplingParams | list | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Outputs in the order of `prompts` (a single prompt is a list of one)."""
        if isinstance(prompts, (str, Prompt)) or _is_token_ids(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
            params = list(sampling_params)
        else:
            # none given: the model's generation defaults, as vLLM's LLM.generate takes them
            params = [sampling_params or SamplingParams(**self.engine.generation_defaults.values)] * len(prompts)

        engine = self.engine
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        try:
            for i, (rid, prompt, p) in enumerate(zip(ids, prompts, params)):
                try:
                    engine.add_request(rid, prompt, p, stream=False)
                except ValueError as e:
                    raise ValueError(f"prompt {i}: {e}") from e
            return self._run(ids, use_tqdm)
        finally:  # an error or Ctrl-C must not leave requests behind in the engine
            for rid in ids:
                engine.abort(rid)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        from tqdm.auto import tqdm

        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        out_tokens = 0
        try:
            while len(results) < len(ids):
                if not self.engine.has_unfinished():
                    raise RuntimeError("the engine went idle with requests unanswered")  # never expected
                for out in self.engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        out_tokens += len(out.token_ids)
                        bar.update(1)
                        if use_tqdm:
                            bar.set_postfix_str(f"out {out_tokens / max(bar.format_dict['elapsed'], 1e-9):.0f} tok/s",
                                                refresh=False)
        finally:
            bar.close()
        return [results[rid] for rid in ids]

    def chat(self, conversations: list[dict] | list[list[dict]], sampling_params: SamplingParams | list | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True, **template_kwargs) -> list[RequestOutput]:
        """Apply the chat template to each conversation (a list of {"role", "content"}) and generate
        (each request keeps what it came as: the hash of its messages, its rendered text)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = [self.engine.chat_prompt(c, add_generation_prompt=add_generation_prompt, **template_kwargs)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def score(self, prompt_ids: list[int] | list[list[int]], continuation_ids: list[int] | list[list[int]],
              use_tqdm: bool = False) -> list[float] | list[list[float]]:
        """Teacher-forced logprob of each continuation token given the prompt and the tokens before it.

        One pair gives a list of floats; lists of pairs give a list of lists.
        """
        single = _is_token_ids(prompt_ids)
        pairs = [(prompt_ids, continuation_ids)] if single else list(zip(prompt_ids, continuation_ids, strict=True))
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        for prompt, cont in pairs:
            if not _is_token_ids(prompt) or not _is_token_ids(cont):
                raise ValueError("score needs a non-empty prompt and continuation of token ids")
        outs = self.generate([list(p) + list(c) for p, c in pairs], params, use_tqdm=use_tqdm)
        scores = [[lp.logprob for lp in out.prompt_logprobs[len(p):]] for out, (p, _) in zip(outs, pairs)]
        return scores[0] if single else scores
