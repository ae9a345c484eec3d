"""Faults a person can deploy by ordinary configuration, applied to a model directory in place.

In place on purpose: the usual incident is a new checkpoint or tokenizer pushed to the path a
replica already serves from, so the canary starts from the same path with the same options and
only what the files hold differs. Each function changes one thing, the way it goes wrong in the
field:

- lowercase_normalizer / nfkc_normalizer: a normalizer added to tokenizer.json;
- template_newline: the chat template gains a newline after each role marker;
- double_bos: the tokenizer's post-processor adds a second BOS (the template already has one, or
  add_bos_token switched on in a tokenizer that already prepends it);
- noisy_weights: every weight matrix with relative Gaussian noise (a different checkpoint);
- eos_ids: generation_config.json names another eos id (answers stop elsewhere, or never);
- rope_theta: config.json's RoPE base multiplied (a config from another context-length variant).
Engine-option faults (int4, prefix caching, budgets) need no file: they are replica options.
"""

from __future__ import annotations

import json
from pathlib import Path


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1))


def lowercase_normalizer(model: Path) -> None:
    _edit_json(model / "tokenizer.json", lambda t: t.__setitem__("normalizer", {"type": "Lowercase"}))


def nfkc_normalizer(model: Path) -> None:
    _edit_json(model / "tokenizer.json", lambda t: t.__setitem__("normalizer", {"type": "NFKC"}))


def template_newline(model: Path) -> None:
    """'<|user|>' + content becomes '<|user|>\\n' + content (and the generation prompt too)."""
    path = model / "chat_template.jinja"
    text = path.read_text()
    changed = text.replace("'|>' + message['content']", "'|>\\n' + message['content']").replace(
        "'<|assistant|>'", "'<|assistant|>\\n'")
    if changed == text:
        raise ValueError(f"{path}: no role marker to change (not the reference template)")
    path.write_text(changed)


def double_bos(model: Path) -> None:
    def change(t: dict) -> None:
        post = t.get("post_processor") or {}
        single = post.get("single") or []
        bos = [p for p in single if "SpecialToken" in p]
        if not bos:
            raise ValueError(f"{model}: the tokenizer adds no BOS to double")
        post["single"] = [bos[0]] + single

    _edit_json(model / "tokenizer.json", change)


def noisy_weights(model: Path, relative: float = 0.05, seed: int = 0) -> None:
    """Each floating tensor of rank >= 2 plus N(0, (relative * its std)^2): same shapes, same
    options, other answers on some prompts."""
    import torch
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(seed)
    for path in sorted(model.glob("*.safetensors")):
        tensors = load_file(path)
        for name, t in tensors.items():
            if t.is_floating_point() and t.dim() >= 2:
                noise = torch.randn(t.shape, generator=generator, dtype=torch.float32)
                tensors[name] = (t.float() + noise * relative * t.float().std()).to(t.dtype).contiguous()
        save_file(tensors, path, metadata={"format": "pt"})


def eos_ids(model: Path, eos: int | list[int] | None = None) -> None:
    """generation_config.json's eos_token_id replaced (default: an ordinary token id, 3 above the
    current first one, so answers stop where the baseline's do not)."""
    def change(g: dict) -> None:
        current = g.get("eos_token_id")
        first = current[0] if isinstance(current, list) else current
        g["eos_token_id"] = eos if eos is not None else [int(first or 0) + 3]

    _edit_json(model / "generation_config.json", change)


def rope_theta(model: Path, factor: float = 10.0) -> None:
    """config.json's rope_theta times `factor`, wherever the file keeps it (top level, or rope_parameters)."""
    def change(c: dict) -> None:
        holder = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else c
        if "rope_theta" not in holder:
            raise ValueError(f"{model}: config.json has no rope_theta")
        holder["rope_theta"] = float(holder["rope_theta"]) * factor

    _edit_json(model / "config.json", change)


FILE_FAULTS = {
    "lowercase_normalizer": lowercase_normalizer,
    "nfkc_normalizer": nfkc_normalizer,
    "template_newline": template_newline,
    "double_bos": double_bos,
    "noisy_weights": noisy_weights,
    "eos_ids": eos_ids,
    "rope_theta": rope_theta,
}

