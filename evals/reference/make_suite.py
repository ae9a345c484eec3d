"""Write the reference models' held-out suite (prompts the models never trained on).

    python -m evals.reference.make_suite --out evals/suites/reference_heldout.jsonl --per-task 60
"""

from __future__ import annotations

import argparse

from evals.reference.corpus import HELDOUT_SEED, heldout_items
from evals.suite import SuiteItem, write_suite


def heldout_suite_items(per_task: int, seed: int = HELDOUT_SEED) -> list[SuiteItem]:
    items, counters = [], {}
    for ex in heldout_items(per_task, seed):
        counters[ex.task] = counters.get(ex.task, 0) + 1
        items.append(SuiteItem(id=f"{ex.task}-{counters[ex.task]:03d}", reference=ex.answer, scorer="exact",
                               messages=ex.messages(), task=ex.task, max_tokens=24))
    return items


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--per-task", type=int, default=60)
    p.add_argument("--seed", type=int, default=HELDOUT_SEED)
    a = p.parse_args()
    items = heldout_suite_items(a.per_task, a.seed)
    write_suite(a.out, items)
    print(f"{len(items)} items -> {a.out}")


if __name__ == "__main__":
    main()
