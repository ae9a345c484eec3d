"""Strings that break tokenizers: each must survive decode(encode(x)) unchanged.

Normalizers (NFKC, lowercasing, accent stripping), lossy byte fallbacks, unknown-token
mappings and whitespace cleanup all fail some of these; a byte-level BPE passes them all.
"""

from __future__ import annotations

CORPUS: list[tuple[str, str]] = [
    # (what it probes, the string)
    ("ascii", "The quick brown fox jumps over the lazy dog."),
    ("uppercase", "LOUD TEXT and MiXeD CaSe"),
    ("latin accents (precomposed)", "café naïve résumé Ångström"),
    ("combining marks (decomposed)", "cafe\u0301 nai\u0308ve"),
    ("ligatures (NFKC folds them)", "ﬁnance ﬂow ﬀ"),
    ("full-width forms", "ＡＢＣ１２３！"),
    ("superscripts and fractions", "x² + y³ = ½ ⅓"),
    ("roman numeral and compatibility letters", "Ⅻ ℌ ℃ ㎏"),
    ("CJK", "日本語のテキスト、中文文本，한국어 텍스트"),
    ("right-to-left", "مرحبا بالعالم שלום עולם"),
    ("emoji", "🚀🔥👍🏽"),
    ("emoji ZWJ sequence", "👩\u200d💻 👨\u200d👩\u200d👧\u200d👦"),
    ("flags (regional indicators)", "🇯🇵🇺🇸"),
    ("variation selectors", "❤\ufe0f ✈\ufe0e"),
    ("zero-width characters", "zero\u200bwidth\u200cjoin\u200dner\ufeffbom"),
    ("non-breaking and odd spaces", "a\u00a0b\u2009c\u3000d\u202fe"),
    ("tabs and newlines", "col1\tcol2\r\nline2\n\n\nend"),
    ("leading and trailing spaces", "   padded   "),
    ("repeated spaces", "a     b"),
    ("control characters", "bell\x07 escape\x1b[0m null\x00"),
    ("math symbols", "∑ ∫ √ ∞ ≤ ≥ ≠ ∂"),
    ("Greek final sigma", "ΟΔΥΣΣΕΥΣ ὀδυσσεύς"),
    ("Turkish dotted i", "İstanbul ıi"),
    ("German sharp s", "Straße STRASSE ẞ"),
    ("surrogate-range emoji (astral plane)", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚"),
    ("code", "def f(x):\n    return x ** 2  # comment\n"),
    ("markup", "<b>bold</b> &amp; <script>alert('x')</script>"),
    ("special-token look-alikes", "<s> </s> <|endoftext|> [CLS] <unk>"),
    ("long number", "3.14159265358979323846264338327950288419716939937510"),
    ("private use", "\ue000\uf8ff"),
    ("replacement character", "\ufffd"),
    ("Devanagari", "नमस्ते दुनिया"),
    ("Thai (no spaces)", "สวัสดีชาวโลก"),
]


def corpus() -> list[tuple[str, str]]:
    return list(CORPUS)
