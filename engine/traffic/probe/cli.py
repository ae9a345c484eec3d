"""`infersight probe`: send the golden probe suite to every replica, once or on an interval.

    infersight probe --endpoints http://127.0.0.1:8101,http://127.0.0.1:8102
    infersight probe --fleet engine/serving/fleet/examples/canary.toml --pin --replica r0 --note "before the canary"
    infersight probe --fleet canary --every 60s --token-budget 20000

One round by default: a table per replica (probes ok / failed / skipped) and the round id; exit
status 1 when a probe failed or a replica did not answer. `--pin` pins the round's solo answers of
one replica (default: the first endpoint) as its model's baseline (table probe_baselines).
`--every` runs rounds until SIGTERM (the fleet's scheduled prober: a `[probe]` table in its config),
one log line per round. `--rescore N` adds a rescore round after each probe round (cross-scoring,
engine/traffic/probe/rescore.py). `--cross-score` cross-scores continuously (engine/traffic/probe/cross_scoring.py:
a share of each replica's requests scored by a peer, until SIGTERM), alone or beside `--every`; it is
what `fleet up` starts by default. `--fleet` takes the fleet's config file, run directory or name; the
replicas and the store are read from its state file before every round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from engine.serving.fleet.config import default_run_dir, load_fleet
from engine.serving.fleet.state import FleetState
from engine.traffic.probe.cross_scoring import (
    DEFAULT_INTERVAL, DEFAULT_SHARE, DEFAULT_TOKEN_SHARE, CrossScoreSettings, cross_score_every,
)
from engine.traffic.probe.cross_targets import CROSS_SCORE_FLAG, cross_score_urls
from engine.util import parse_interval
from engine.traffic.probe.pin import pin_round
from engine.traffic.probe.rescore import DEFAULT_TOKEN_BUDGET, rescore_round, run_rescore_round
from engine.traffic.probe.results import ProbeRound
from engine.traffic.probe.runner import run_probe_round
from engine.traffic.probe.schedule import probe_every
from telemetry.contract.probes import MODES
from telemetry.store import StoreError, open_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--endpoints", help="replica URLs, comma-separated")
    where.add_argument("--fleet", help="a fleet that is up: its TOML config, run directory or name")
    parser.add_argument("--store", help="the telemetry store (URL or directory) for --pin (default: the fleet's)")
    parser.add_argument("--pin", action="store_true", help="pin this round's solo answers as the model's baseline")
    parser.add_argument("--replica", help="with --pin: the replica whose answers are pinned (default: the first)")
    parser.add_argument("--note", default="", help="with --pin: why (stored with the pin)")
    parser.add_argument("--every", type=_interval, metavar="DURATION",
                        help="run a round every DURATION (60s, 5m, or seconds) until SIGTERM")
    parser.add_argument("--token-budget", type=_positive, default=None,
                        help="most prompt + output tokens per round, over all replicas (the rest is skipped)")
    parser.add_argument("--no-batched", dest="batched", action="store_false",
                        help="solo sends only (no probe inside a busy batch)")
    parser.add_argument("--batch-fillers", type=int, default=4, help="filler requests beside a batched probe")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--request-timeout", type=float, default=60.0)
    parser.add_argument("--pin-timeout", type=float, default=30.0,
                        help="seconds to wait for the round's rows to reach the store before pinning")
    parser.add_argument("--out", type=Path, default=None, help="write the round as JSON")
    parser.add_argument("--rescore", type=int, default=0, metavar="N",
                        help="after each probe round, a rescore round (cross-scoring): up to N recent requests of "
                             "each replica scored teacher-forced by every replica (needs the store; 0: off)")
    parser.add_argument("--rescore-budget", type=_positive, default=DEFAULT_TOKEN_BUDGET,
                        help="most tokens a rescore round sends, over all replicas")
    parser.add_argument(CROSS_SCORE_FLAG, dest="cross_score", action="store_true",
                        help="cross-score continuously until SIGTERM: a share of each replica's finished requests "
                             "scored teacher-forced by a peer and by itself (needs the store); with --every, "
                             "beside the probe rounds")
    parser.add_argument("--cross-share", type=float, default=DEFAULT_SHARE,
                        help=f"share of each replica's requests cross-scored (default {DEFAULT_SHARE:g})")
    parser.add_argument("--cross-token-share", type=float, default=DEFAULT_TOKEN_SHARE,
                        help="most rescore tokens per token the fleet served, over the scorer's life "
                             f"(default {DEFAULT_TOKEN_SHARE:g})")
    parser.add_argument("--cross-interval", type=_interval, default=DEFAULT_INTERVAL, metavar="DURATION",
                        help=f"between cross-scoring passes (default {DEFAULT_INTERVAL:g}s)")


def _interval(text: str) -> float:
    try:
        return parse_interval(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number of tokens")
    return int(text)


def fleet_run_dir(ref: str) -> Path:
    """A fleet's run directory from its config file, its run directory or its name."""
    path = Path(ref)
    if path.is_file():
        return Path(load_fleet(path).run_dir)
    return path if path.is_dir() else default_run_dir(ref)


def fleet_targets(ref: str) -> tuple[list[str], str]:
    """(replica URLs, store URL) of the fleet `ref`, from its state file (ValueError when it is not up)."""
    state = FleetState.load(fleet_run_dir(ref))
    return [r.url for r in state.replicas], state.store_url


def _targets(args) -> tuple[list[str], str | None]:
    if args.fleet:
        urls, store = fleet_targets(args.fleet)
        return urls, args.store or store or None
    urls = [u.strip() for u in args.endpoints.split(",") if u.strip()]
    if not urls:
        raise ValueError("--endpoints is empty")
    return urls, args.store


def _round_options(args) -> dict:
    return {"modes": MODES if args.batched else ("solo",), "token_budget": args.token_budget,
            "batch_fillers": args.batch_fillers, "api_key": args.api_key, "request_timeout": args.request_timeout}


def _pin(args, round_: ProbeRound, store_url: str) -> None:
    answered = ", ".join(r.replica for r in round_.replicas if r.replica and not r.error) or "none"
    if args.replica:
        chosen = round_.replica(args.replica)
        if chosen is None or chosen.error:
            raise ValueError(f"cannot pin {args.replica}: not among the replicas that answered this round ({answered})")
    else:
        chosen = round_.replicas[0]
        if chosen.error:
            raise ValueError(f"cannot pin the first endpoint {chosen.url}: it did not answer this round; name "
                             f"another with --replica (answered: {answered})")
    expect = chosen.solo_ok()
    if not expect:
        raise ValueError(f"replica {chosen.replica} answered no solo probe in round {round_.round_id}: nothing to pin")
    with open_store(store_url) as store:
        records = pin_round(store, round_.round_id, chosen.replica, args.note, expect=expect,
                            timeout=args.pin_timeout)
    print(f"pinned {len(records)} probes of {records[0].model_name} from replica {chosen.replica} "
          f"(round {round_.round_id}) into {store_url}")


def _one_round(args) -> int:
    urls, store_url = _targets(args)
    if args.pin and not store_url:  # before the round, not after it
        raise ValueError("--pin needs a store: --store URL (or --fleet, whose store it uses)")
    if args.rescore and not store_url:
        raise ValueError("--rescore reads the requests from the store: --store URL (or --fleet)")
    round_ = run_probe_round(urls, **_round_options(args))
    print(round_.format_table())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(round_.to_dict(), indent=1))
        print(f"round: {args.out}")
    if args.pin:
        _pin(args, round_, store_url)
    if args.rescore:
        rescored = run_rescore_round(urls, store_url, args.rescore, **_rescore_options(args))
        print(rescored.one_line())
    return 0 if round_.all_ok else 1


def _rescore_options(args) -> dict:
    return {"token_budget": args.rescore_budget, "api_key": args.api_key, "request_timeout": args.request_timeout}


async def _rescore_after(args) -> None:
    urls, store_url = _targets(args)
    print((await rescore_round(urls, store_url, args.rescore, **_rescore_options(args))).one_line(), flush=True)


def _scheduled(args) -> int:
    _, store_url = _targets(args)  # fail now, not inside the loop, when the fleet is not up
    if args.rescore and not store_url:
        raise ValueError("--rescore reads the requests from the store: --store URL (or --fleet)")
    print(f"probing every {args.every:g} s (SIGTERM stops)", flush=True)
    after = (lambda: _rescore_after(args)) if args.rescore else None
    rounds = asyncio.run(probe_every(args.every, lambda: _targets(args)[0],
                                     lambda r: print(r.one_line(), flush=True), after=after,
                                     **_round_options(args)))
    print(f"stopped after {rounds} round(s)", flush=True)
    return 0


def _cross_urls(args) -> list[str]:
    """The replicas to cross-score: a fleet's own and those of the fleets attached to its store."""
    return cross_score_urls(fleet_run_dir(args.fleet)) if args.fleet else _targets(args)[0]


def _continuous(args) -> int:
    """Cross-scoring until SIGTERM, beside scheduled probe rounds when --every is given."""
    _, store_url = _targets(args)
    if not store_url:
        raise ValueError(f"{CROSS_SCORE_FLAG} reads the requests from the store: --store URL (or --fleet)")
    settings = CrossScoreSettings(args.cross_share, args.cross_token_share, args.cross_interval)
    print(f"cross-scoring {settings.share:g} of each replica's requests every {settings.interval:g} s, at most "
          f"{settings.token_share:g} of the tokens served (SIGTERM stops)", flush=True)

    async def both() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        with open_store(store_url) as store:
            tasks = [cross_score_every(lambda: _cross_urls(args), store, settings, stop,
                                       report=lambda p: print(p.one_line(), flush=True),
                                       on_error=lambda e: print(f"cross-scoring pass failed: {e}", file=sys.stderr,
                                                                flush=True),
                                       api_key=args.api_key)]
            if args.every is not None:
                after = (lambda: _rescore_after(args)) if args.rescore else None
                tasks.append(probe_every(args.every, lambda: _targets(args)[0],
                                         lambda r: print(r.one_line(), flush=True), stop=stop, after=after,
                                         **_round_options(args)))
            await asyncio.gather(*tasks)

    asyncio.run(both())
    print("stopped", flush=True)
    return 0


def run(args) -> int:
    try:
        if args.cross_score:
            if args.pin:
                raise ValueError(f"--pin pins one round: run it without {CROSS_SCORE_FLAG}")
            return _continuous(args)
        if args.every is not None and args.pin:
            raise ValueError("--pin pins one round: run it without --every")
        if not args.pin and (args.replica or args.note):
            raise ValueError("--replica and --note go with --pin")
        if args.batch_fillers < 0:
            raise ValueError("--batch-fillers must be 0 or more")
        if args.rescore < 0:
            raise ValueError("--rescore must be 0 (off) or more")
        return _scheduled(args) if args.every is not None else _one_round(args)
    except (ValueError, RuntimeError, OSError, StoreError) as e:
        print(f"infersight probe: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
