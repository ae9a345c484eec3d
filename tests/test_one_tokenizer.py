"""One tokenizer wrapper: the engine, the diagnostics and the dashboard render the same IDs alike.

The engine serves with `engine.core.tokenization.Tokenizer`; the diagnostics' token evidence and the
dashboard's token tables must show the strings that tokenizer gives, for byte-level pieces of
multi-byte characters, special tokens and IDs the tokenizer does not know. Red when any of them
decodes with a wrapper of its own (or when a second `first_divergence` appears).
"""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path

import pytest

from dashboards import settings, widgets
from dashboards.tokendiff import diff_html
from dashboards.tokens import token_frame, visible
from diagnostics.replica_tokenizers import TokenizerSource
from diagnostics.token_evidence import divergence, tokens
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.tokenization import Tokenizer
from engine.core.model_refs import REFERENCE_MODEL as REFERENCE

ROOT = Path(__file__).resolve().parents[1]
# leading blanks, a tab and a newline, multi-byte characters split over byte-level tokens, and
# special-token markers written as text (encoded as special tokens)
TEXT = "<|user|>  Café 🚀 日本語\n\tx² ≤ 10<|assistant|> ok"


@pytest.fixture(params=["tiny_llama", "reference"])
def model_dir(request):
    if request.param == "reference":
        if not (REFERENCE / "tokenizer.json").is_file():
            pytest.skip("the reference model is not in this checkout")
        return REFERENCE
    return request.getfixturevalue("tiny_llama")


def test_dashboard_diagnostics_and_engine_render_the_same_ids_alike(model_dir, monkeypatch):
    engine_tok = Tokenizer(model_dir)  # as the engine loads it for serving
    unknown = engine_tok.vocab_size + 1  # a padding row of the embedding: no text in the tokenizer
    ids = engine_tok.encode(TEXT) + engine_tok.special_ids + [unknown]
    assert any("\ufffd" in engine_tok.decode([i], skip_special_tokens=False) for i in ids), "no byte-level piece"

    # the dashboard's tokenizer, as a page gets it for a model
    monkeypatch.setenv(settings.TOKENIZERS_ENV, json.dumps({"*": str(model_dir)}))
    dash_tok = widgets.decoder_for("any-model")
    # the diagnostics' tokenizer, as the checks get it for a replica that recorded this tokenizer
    source = TokenizerSource()
    diag_tok = source.for_replica({"replica_id": "r0", "config_json": json.dumps({"model": str(model_dir)}),
                                   "tokenizer_hash": engine_tok.tokenizer_hash})
    assert diag_tok is not None, source.problems
    for tok in (dash_tok, diag_tok):
        assert type(tok) is Tokenizer  # the engine's class itself, not a wrapper or a subclass

    expected = [engine_tok.decode([i], skip_special_tokens=False) if i != unknown else f"<out of vocabulary: {i}>"
                for i in ids]
    assert [t["text"] for t in tokens(ids, diag_tok)] == expected
    assert list(token_frame(ids, dash_tok)["token"]) == [visible(e) for e in expected]
    spans = re.findall(r'<span title="id \d+" style="[^"]*">([^<]*)</span>', diff_html(ids, ids, dash_tok))
    assert spans == [html.escape(visible(e)) for e in expected]
    for special in engine_tok.special_ids:
        assert expected[ids.index(special)] == engine_tok.hf.convert_ids_to_tokens(special)

    # whole sequences: the diagnostics' evidence text and the dashboard's code block are the
    # engine's decode with special tokens shown; without them, the text the engine served
    changed = ids[:3] + [ids[3] + 1] + ids[4:]
    evidence = divergence(ids, changed, diag_tok, diag_tok, "a", "b")
    full = engine_tok.decode(ids, skip_special_tokens=False)
    assert evidence["a_text"] == dash_tok.decode(ids, skip_special_tokens=False) == full
    assert "<|user|>" in full and "Café 🚀 日本語" in full
    served = IncrementalDetokenizer(engine_tok.decode)  # the engine's streamed output text
    for i in ids:
        served.add_tokens([i])
    served.finish()
    assert diag_tok.decode(ids) == dash_tok.decode(ids) == served.text
    assert [t["text"] for t in evidence["a_tokens_at_divergence"]] == expected[:8]


def _modules(*packages: str):
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            yield path, ast.parse(path.read_text(), str(path))


def test_no_tokenizer_library_outside_the_engine():
    """The diagnostics and the dashboard decode only through engine.core.tokenization.Tokenizer."""
    direct = []
    for path, tree in _modules("diagnostics", "dashboards"):
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            direct += [f"{path.relative_to(ROOT)} imports {n}" for n in names
                       if n.split(".")[0] in ("tokenizers", "transformers", "sentencepiece", "tiktoken")]
    assert not direct, "\n".join(direct)


def test_one_first_divergence():
    defined = [str(path.relative_to(ROOT)) for path, tree in _modules("engine", "evals", "diagnostics", "dashboards")
               for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "first_divergence"]
    assert defined == ["evals/stats/agreement.py"]
