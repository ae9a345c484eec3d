"""The plain vLLM (no plugin loaded) on the reference model that the modules here share: a cold vLLM
start costs minutes on a 2-core machine, and the API comparison and the recording proxy only talk to it.
It serves the reference model as `target` with a chat template of its own (the API comparison gives
infersight's server the same file); it starts with the first module that asks for it and stops after
the last one."""

from __future__ import annotations

SERVED = "target"
# not the model directory's template: both servers of the API comparison are given it (vLLM a file,
# infersight the same file); the proxy's chat rows only need one that vLLM renders
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
FIXTURE = "plain_vllm"


def last_module_using(items, fixture: str = FIXTURE):
    """The module of the last collected test that uses `fixture` (None when none does)."""
    users = [item for item in items if fixture in getattr(item, "fixturenames", ())]
    return users[-1].module if users else None
