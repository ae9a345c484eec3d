"""Scorers: how a model output is compared with an item's reference (1.0 right, 0.0 wrong).

- exact:      the stripped output equals the stripped reference
- normalized: equal after lower-casing, dropping punctuation and the articles
              a / an / the, and collapsing whitespace (SQuAD-style)
- numeric:    the last number in the output equals the reference number
              (commas, "$" and "####"-style markers are fine; relative tolerance 1e-6)
- regex:      the reference is a Python regular expression the stripped output fully matches
- contains:   the normalized reference occurs in the normalized output
"""

from __future__ import annotations

import math
import re
import string
from typing import Callable

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def parse_number(text: str) -> float | None:
    """The last number written in `text` ("1,234.5" -> 1234.5), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def exact(output: str, reference: str) -> float:
    return float(output.strip() == reference.strip())


def normalized(output: str, reference: str) -> float:
    return float(normalize(output) == normalize(reference))


def numeric(output: str, reference: str) -> float:
    want = parse_number(reference)
    if want is None:
        raise ValueError(f"numeric scorer: reference {reference!r} holds no number")
    got = parse_number(output)
    return float(got is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9))


def regex(output: str, reference: str) -> float:
    return float(re.fullmatch(reference, output.strip(), flags=re.DOTALL) is not None)


def contains(output: str, reference: str) -> float:
    return float(normalize(reference) in normalize(output))


SCORERS: dict[str, Callable[[str, str], float]] = {
    "exact": exact,
    "normalized": normalized,
    "numeric": numeric,
    "regex": regex,
    "contains": contains,
}


def check_reference(scorer: str, reference: str) -> None:
    """Raise ValueError when `reference` can never be scored by `scorer` (caught at suite load)."""
    if scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; choose from {', '.join(SCORERS)}")
    if scorer == "regex":
        try:
            re.compile(reference)
        except re.error as e:
            raise ValueError(f"reference is not a valid regular expression: {e}") from None
    if scorer == "numeric" and parse_number(reference) is None:
        raise ValueError(f"numeric scorer needs a number as reference, got {reference!r}")


def score(scorer: str, output: str, reference: str) -> float:
    if scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; choose from {', '.join(SCORERS)}")
    return SCORERS[scorer](output, reference)
