"""Seeded synthetic multi-task corpus whose answers can be scored exactly.

Each task is a function `rng -> Example` (a user prompt and the one right
answer). Train and held-out items never share a prompt: every prompt belongs
to exactly one partition by a hash of its text (1 in `HELDOUT_MODULUS` goes to
held-out), and the two sides are drawn from different seeds. So the held-out
suite measures generalisation, not memorisation, and regenerating either side
is deterministic.
"""

from __future__ import annotations

import hashlib
import random
import string
from dataclasses import dataclass
from typing import Callable, Iterator

HELDOUT_MODULUS = 10  # 10% of the prompt space is reserved for held-out items
TRAIN_SEED = 1234
HELDOUT_SEED = 987654


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    answer: str

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]


def _addition(rng: random.Random) -> Example:
    # digit counts drawn first so 1- and 2-digit operands are equally common
    a = rng.randrange(10 ** rng.randint(1, 2))
    b = rng.randrange(10 ** rng.randint(1, 2))
    return Example("addition", f"What is {a} + {b}?", str(a + b))


def _reverse(rng: random.Random) -> Example:
    letters = [rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6))]
    return Example("reverse", "Reverse the letters: " + " ".join(letters), " ".join(reversed(letters)))


def _sort(rng: random.Random) -> Example:
    nums = [rng.randrange(100) for _ in range(rng.randint(3, 5))]
    return Example("sort", "Sort ascending: " + " ".join(map(str, nums)), " ".join(map(str, sorted(nums))))


_KEYS = ["cat", "dog", "sun", "car", "box", "pen", "cup", "hat", "map", "bus",
         "egg", "fox", "jar", "owl", "pig", "ant", "bee", "cow", "elk", "yak"]


def _kv_recall(rng: random.Random) -> Example:
    # "cat7": the key's token is directly followed by its value's, so the lookup is one attention hop
    # (with "cat = 7" a tiny model must compose two hops, and in our runs it stayed at chance)
    keys = rng.sample(_KEYS, rng.randint(3, 6))
    values = [rng.randrange(10) for _ in keys]
    query = rng.randrange(len(keys))
    context = ", ".join(f"{k}{v}" for k, v in zip(keys, values))
    return Example("kv_recall", f"Remember {context}. What number follows {keys[query]}?", str(values[query]))


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += 1 if c == "(" else -1
        if depth < 0:
            return False
    return depth == 0


def _brackets(rng: random.Random) -> Example:
    n = rng.randint(2, 8)
    # a random balanced string of n pairs: open while allowed, close when forced or by coin flip
    s, opened, closed = [], 0, 0
    while closed < n:
        if opened < n and (opened == closed or rng.random() < 0.5):
            s.append("(")
            opened += 1
        else:
            s.append(")")
            closed += 1
    if rng.random() < 0.5:  # corrupt it: half keep the counts equal (needs the depth to tell)
        i = rng.randrange(len(s))
        if rng.random() < 0.5:
            s[i] = "(" if s[i] == ")" else ")"
        else:
            j = rng.randrange(len(s))
            s[i], s[j] = s[j], s[i]
    text = "".join(s)
    return Example("brackets", f"Are these brackets balanced? {text}", "yes" if _balanced(text) else "no")


_NAMES = ["Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena"]
_ITEMS = ["apples", "books", "coins", "pens", "shells", "stamps", "cards", "marbles", "cups", "keys"]


def _word_problem(rng: random.Random) -> Example:
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        prompt = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        answer = a + b
    elif kind == 1:
        a = rng.randint(2, 40)
        b = rng.randint(1, a)
        prompt = f"{name} had {a} {item} and gave {b} to {other}. How many {item} does {name} have left?"
        answer = a - b
    else:
        a, b = rng.sample(range(100), 2)
        prompt = f"{name} has {a} {item} and {other} has {b} {item}. Who has more {item}?"
        return Example("word_problem", prompt, name if a > b else other)
    return Example("word_problem", prompt, str(answer))


TASKS: dict[str, Callable[[random.Random], Example]] = {
    "addition": _addition,
    "reverse": _reverse,
    "sort": _sort,
    "kv_recall": _kv_recall,
    "brackets": _brackets,
    "word_problem": _word_problem,
}
# share of the training stream: the tasks that take longest to learn get more
TRAIN_WEIGHTS = {"addition": 2, "reverse": 1, "sort": 3, "kv_recall": 3, "brackets": 3, "word_problem": 3}


# yes/no tasks: the held-out items are half yes, half no, so "always no" scores 50%
BALANCED_TASKS = {"brackets"}


def is_heldout(prompt: str) -> bool:
    digest = hashlib.sha256(prompt.encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0


def stream(seed: int = TRAIN_SEED, heldout: bool = False, weights: dict[str, int] | None = None) -> Iterator[Example]:
    """An endless, deterministic stream of examples from one partition."""
    rng = random.Random(seed)
    weights = weights or TRAIN_WEIGHTS
    names = list(TASKS)
    w = [weights.get(n, 1) for n in names]
    while True:
        ex = TASKS[rng.choices(names, w)[0]](rng)
        if is_heldout(ex.prompt) == heldout:
            yield ex


def heldout_items(per_task: int, seed: int = HELDOUT_SEED) -> list[Example]:
    """`per_task` distinct held-out examples of every task, in task order."""
    rng = random.Random(seed)
    out: list[Example] = []
    for name, make in TASKS.items():
        seen: set[str] = set()
        answers: dict[str, int] = {}
        for _ in range(1000 * per_task):  # bounded: a task with too small a prompt space fails loudly
            if len(seen) == per_task:
                break
            ex = make(rng)
            if name in BALANCED_TASKS and answers.get(ex.answer, 0) >= (per_task + 1) // 2:
                continue
            if is_heldout(ex.prompt) and ex.prompt not in seen:
                seen.add(ex.prompt)
                answers[ex.answer] = answers.get(ex.answer, 0) + 1
                out.append(ex)
        if len(seen) < per_task:
            raise ValueError(f"task {name}: only {len(seen)} distinct held-out prompts found, {per_task} asked")
    return out
