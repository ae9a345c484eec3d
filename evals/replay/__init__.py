"""Replay stored production requests against a candidate deployment (`infersight replay`).

| file | what it holds |
|---|---|
| `window.py` | `--window`: a duration back from now, or START..END |
| `stored.py` | the replayable rows of the store's `requests` table, and why the others are left out |
| `client.py` | greedy token-ID completions to a deployment, bounded concurrency, failures as answers |
| `runner.py` | what is compared with what (production's answers, or a baseline's greedy ones) |
| `record.py` | the replay as an eval run (`eval_runs` / `eval_items`, suite `replay:<window>[:<workload>]`) |
| `summary.py` | identical share with its Wilson interval, first divergences: from the run alone |
| `evidence.py` | a replay run for `infersight eval gate --replay` |
| `cli.py` | `infersight replay` |
"""
