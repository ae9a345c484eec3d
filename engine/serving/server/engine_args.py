"""Command-line options for every EngineConfig field, derived from the dataclass.

One option per field (`block_size` -> `--block-size`), so `serve`, the fleet's
TOML files and `EngineConfig` can never drift apart: a field added to the
config is an option here the moment it exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

from engine.core.config import EngineConfig
from engine.core.config_values import value_kind, wrong_type

# fields the serve command sets from its own options (or positional model; serve_options: its other flags)
_OWN = {"model", "serve_options"}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}


def parse_size(text: str | int) -> int:
    """'64MiB' -> 67108864, '1G' -> 10**9, '4096' -> 4096."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 64MiB, 1GB)")
    unit = (m.group(2) or "").upper().rstrip("B")
    return int(float(m.group(1)) * _UNITS[unit])


def _str_list(text: str) -> list[str]:
    return [s for s in (p.strip() for p in text.split(",")) if s]


def _int_or_auto(text: str) -> int | None:
    """'auto' -> None (the field's default: decided by the engine), else an int."""
    return None if text.strip().lower() == "auto" else int(text)


def _converter(f: dataclasses.Field):
    """argparse type for a field, from its (string) annotation; a field marked `auto` (metadata) also takes
    "auto", its None default."""
    t = str(f.type)
    if f.metadata.get("auto"):
        return _int_or_auto
    if f.name.endswith("_bytes"):
        return parse_size
    if t.startswith("list"):
        return _str_list
    if "bool" in t:
        return bool
    if "int" in t:
        return int
    if "float" in t:
        return float
    return str


def engine_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineConfig) if f.name not in _OWN]


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine", "EngineConfig fields (defaults as in engine/core/config.py)")
    for f in engine_fields():
        flag = "--" + f.name.replace("_", "-")
        conv = _converter(f)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        help_text = f"default: {default}"
        if conv is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            metavar = "A,B,..." if conv is _str_list else f.name.split("_")[-1].upper()
            if conv is _int_or_auto:
                metavar, help_text = f"auto|{metavar}", "default: auto"
            group.add_argument(flag, dest=f.name, type=conv, default=None, metavar=metavar, help=help_text)


def engine_overrides(args: argparse.Namespace) -> dict:
    """The EngineConfig fields given on the command line (None = not given)."""
    return {f.name: getattr(args, f.name) for f in engine_fields() if getattr(args, f.name, None) is not None}


# serve flags that say where a replica is or where its telemetry goes, not how it serves (placement has
# columns of its own; "command": the subcommand's name, from the top-level parser): left out of serve_options
NOT_SERVING = frozenset({"command", "model", "host", "port", "store", "spool_dir", "spool_max_bytes", "store_text",
                         "tracing", "otlp_endpoint", "cpus", "numa_node", "log_level", "stats_interval", "access_log"})
_SECRET_WORDS = ("key", "token", "secret", "password")


def serve_options(args: argparse.Namespace) -> dict:
    """The server's own flags and limits (everything `serve` takes that is not an EngineConfig field nor in
    NOT_SERVING), for the replica's identity; a secret is recorded only as whether it was given."""
    engine = {f.name for f in dataclasses.fields(EngineConfig)}
    out = {}
    for name, value in sorted(vars(args).items()):
        if name in engine or name in NOT_SERVING or callable(value):
            continue
        if any(w in name for w in _SECRET_WORDS):
            out[f"{name}_given"] = value is not None and value != ""
        else:
            out[name] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    return out


def engine_config_from_args(model: str, args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(model=model, **engine_overrides(args))


def check_engine_option(key: str, value) -> None:
    """A configuration file's value for an EngineConfig field has the field's type, else a ValueError that
    names the option, the type it takes and what it got (TOML gives typed values: "8" is not 8)."""
    fields = {f.name: f for f in engine_fields()}
    name = key.replace("-", "_")
    if name not in fields:
        raise ValueError(f"unknown engine option {key!r}; valid: {', '.join(sorted(fields))}")
    conv = _converter(fields[name])
    if conv is parse_size:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"engine option {key!r} must be a size (4096, \"64MiB\"), got {value!r} "
                             f"({value_kind(value)})")
        try:
            parse_size(value)
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"engine option {key!r}: {e}") from None
        return
    if conv is _int_or_auto and value == "auto":
        return
    kinds = {_str_list: (list, str), float: float, int: int, _int_or_auto: int, bool: bool}.get(conv, str)
    problem = wrong_type(f"engine option {key!r}", value, kinds)
    if problem:
        raise ValueError(problem)


def engine_cli_args(options: dict) -> list[str]:
    """Inverse of the parser: {'block_size': 8, 'enable_prefix_caching': False} -> CLI args.

    Used by the fleet to turn a TOML table into `infersight serve` options.
    Unknown keys and values of the wrong type raise ValueError naming the key (`check_engine_option`).
    """
    fields = {f.name: f for f in engine_fields()}
    out: list[str] = []
    for key, value in options.items():
        check_engine_option(key, value)
        name = key.replace("-", "_")
        flag = "--" + name.replace("_", "-")
        if _converter(fields[name]) is bool:
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out
