"""Suite loading and validation, and the scorers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.scorers import parse_number, score
from evals.suite import SuiteError, load_suite, parse_suite

SUITES = Path(__file__).resolve().parents[2] / "evals" / "suites"


@pytest.mark.parametrize("scorer,output,reference,expected", [
    ("exact", " 42\n", "42", 1.0),
    ("exact", "42.", "42", 0.0),
    ("normalized", "The  Answer, is: Paris!", "answer is paris", 1.0),
    ("normalized", "Paris, France", "paris", 0.0),
    ("numeric", "So she has 1,234 apples.\n#### 1234", "1234", 1.0),
    ("numeric", "The total is $12.50", "12.5", 1.0),
    ("numeric", "It is -3", "3", 0.0),
    ("numeric", "no number here", "3", 0.0),
    ("numeric", "first 12 then 13", "12", 0.0),  # the last number is the answer
    ("regex", "yes", r"(?i)yes|y", 1.0),
    ("regex", "yes indeed", r"yes", 0.0),  # must match the whole output
    ("contains", "I think the answer is Blue whale.", "blue whale", 1.0),
    ("contains", "a whale", "blue whale", 0.0),
])
def test_scorers(scorer, output, reference, expected):
    assert score(scorer, output, reference) == expected


def test_parse_number_and_unknown_scorer():
    assert parse_number("x = 1,000,000.5 units") == 1000000.5
    assert parse_number("-.5") == -0.5
    assert parse_number("none") is None
    with pytest.raises(ValueError, match="unknown scorer"):
        score("fuzzy", "a", "a")


def test_shipped_suites_load():
    ref = load_suite(SUITES / "reference_heldout.jsonl")
    assert len(ref.items) >= 300
    assert ref.tasks() == ["addition", "brackets", "kv_recall", "reverse", "sort", "word_problem"]
    assert all(i.messages and i.scorer == "exact" for i in ref.items)
    gsm = load_suite(SUITES / "gsm8k_style_example.jsonl")
    assert {i.scorer for i in gsm.items} == {"numeric"}
    assert ref.subset(per_task=2).tasks() == ref.tasks() and len(ref.subset(per_task=2).items) == 12
    assert len(ref.subset(max_items=5).items) == 5


def test_reference_suite_is_held_out_from_training():
    from evals.reference.corpus import is_heldout

    ref = load_suite(SUITES / "reference_heldout.jsonl")
    assert all(is_heldout(i.messages[0]["content"]) for i in ref.items)


def _line(**kw):
    return json.dumps(kw)


def test_validation_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        _line(id="ok", prompt="2+2=", reference="4", scorer="numeric"),
        "{not json",
        _line(id="ok", prompt="again", reference="x"),  # duplicate id
        _line(id="both", prompt="p", messages=[{"role": "user", "content": "m"}], reference="x"),
        _line(id="role", messages=[{"role": "robot", "content": "m"}], reference="x"),
        _line(id="sc", prompt="p", reference="x", scorer="fuzzy"),
        _line(id="re", prompt="p", reference="(unclosed", scorer="regex"),
        _line(id="num", prompt="p", reference="many", scorer="numeric"),
        _line(id="typo", prompt="p", reference="x", refrence="y"),
        _line(prompt="p", reference="x"),
        _line(id="mt", prompt="p", reference="x", max_tokens=0),
    ]) + "\n")
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    msg = str(e.value)
    for lineno, words in [(2, "not valid JSON"), (3, "duplicate id 'ok' (first on line 1)"), (4, "exactly one of"),
                          (5, "messages[0]"), (6, "unknown scorer 'fuzzy'"), (7, "regular expression"),
                          (8, "needs a number"), (9, "unknown field(s) ['refrence']"), (10, "'id'"),
                          (11, "max_tokens")]:
        assert f"{path}:{lineno}: " in msg and words in msg, (lineno, words)
    assert f"{path}:1:" not in msg


def test_valid_suite_round_trip_and_defaults(tmp_path):
    suite = parse_suite(_line(id="a", prompt="2+2=", reference=4) + "\n\n" +
                        _line(id="b", messages=[{"role": "user", "content": "hi"}], reference="hello",
                              scorer="contains", task="greet", max_tokens=5), "x.jsonl")
    a, b = suite.items
    assert (a.reference, a.scorer, a.task) == ("4", "exact", "")  # numbers become strings; exact by default
    assert (b.scorer, b.task, b.max_tokens) == ("contains", "greet", 5)
    assert suite.name == "x"
    with pytest.raises(SuiteError, match="no items"):
        parse_suite("\n\n", "empty.jsonl")
    with pytest.raises(SuiteError, match="not found"):
        load_suite(tmp_path / "missing.jsonl")
