"""What `--baseline` / `--candidate` name: eval runs, or an engine configuration.

A spec is one of
- `run.json`          an eval run file written by `infersight eval run --out`;
- `RUN_ID`            an eval run in the store (`--store`);
- `engine.toml`       an EngineConfig as TOML (the fields of engine/core/config.py, at the top
                      level or under [engine]);
- `MODEL_DIR`         a Hugging Face model directory (EngineConfig defaults).
A run also yields its configuration (the run records its EngineConfig as JSON) when
that configuration can be loaded here, so drift can be measured against it.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.config import EngineConfig
from engine.serving.server.engine_args import check_engine_option, engine_fields
from evals.results import EvalRun


@dataclass
class Side:
    name: str  # "baseline" | "candidate"
    runs: dict[str, EvalRun] = field(default_factory=dict)  # suite name -> run
    config: EngineConfig | None = None
    config_note: str = ""  # why there is no loadable configuration, when there is none

    def describe(self) -> str:
        if self.config is not None:
            c = self.config
            return (f"{Path(c.model).name} (dtype {c.dtype}, quantization {c.quantization}, "
                    f"speculative {c.speculative_mode})")
        run = next(iter(self.runs.values()), None)
        return f"runs of {run.run.model_name} ({run.run.endpoint or 'engine'})" if run else "?"


_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


def engine_config_from_dict(data: dict, where: str, base_dir: Path | None = None) -> EngineConfig:
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown EngineConfig field(s) {unknown}; known: {sorted(_FIELDS)}")
    if "model" not in data:
        raise ValueError(f"{where}: an engine configuration needs 'model' (a model directory)")
    if not isinstance(data["model"], str):
        raise ValueError(f"{where}: 'model' must be a string (a model directory), got {data['model']!r}")
    try:
        options = {f.name for f in engine_fields()}  # not model, nor serve's own flags (a recorded run's)
        for key, value in data.items():
            if key in options and value is not None:  # None (a recorded config's unset field): the default
                check_engine_option(key, value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    data = dict(data)
    model = Path(data["model"])
    if not model.is_absolute() and not model.exists() and base_dir is not None and (base_dir / model).exists():
        data["model"] = str(base_dir / model)
    try:
        return EngineConfig(**data)
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


def load_engine_config(path: str | Path, overrides: dict | None = None) -> EngineConfig:
    """An EngineConfig from a TOML file or a model directory, with `overrides` applied."""
    path = Path(path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path}: a directory given as a configuration must be a model directory (config.json)")
        data = {"model": str(path)}
    else:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML ({e})") from None
        data = data.get("engine", data)
    return engine_config_from_dict({**data, **(overrides or {})}, str(path), path.parent)


def parse_override(text: str) -> tuple[str, object]:
    """`quantization=int8` -> ("quantization", "int8"); values are TOML literals, else strings."""
    key, sep, value = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or key not in _FIELDS:
        raise ValueError(f"override {text!r} must be FIELD=VALUE with FIELD one of {sorted(_FIELDS)}")
    try:
        return key, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key, value


def config_of_run(run: EvalRun) -> tuple[EngineConfig | None, str]:
    """The EngineConfig a run was made with, if it can be loaded here (else None and why)."""
    if run.run.endpoint:
        return None, f"run {run.run_id} came from the endpoint {run.run.endpoint}"
    try:
        config = engine_config_from_dict(run.config(), f"run {run.run_id}")
    except (ValueError, json.JSONDecodeError) as e:
        return None, str(e)
    if not Path(config.model).is_dir():
        return None, f"run {run.run_id}: its model directory {config.model} is not here"
    return config, ""


def resolve_side(name: str, specs: list[str], store=None, overrides: dict | None = None) -> Side:
    side = Side(name)
    for spec in specs:
        p = Path(spec)
        if p.suffix == ".json" and p.is_file():
            run = EvalRun.load(p)
        elif p.suffix == ".toml" or p.is_dir():
            if side.config is not None:
                raise ValueError(f"{name}: more than one configuration given")
            side.config = load_engine_config(p, overrides)
            continue
        elif store is not None:
            run = EvalRun.from_store(store, spec)
        else:
            raise ValueError(f"{name}: {spec!r} is neither a run file (.json), an engine config (.toml), "
                             f"a model directory, nor (without --store) a run id")
        if run.run.suite in side.runs:
            raise ValueError(f"{name}: two runs of suite {run.run.suite!r}")
        side.runs[run.run.suite] = run
    if side.config is None and side.runs:
        configs = {r.run.config_hash for r in side.runs.values()}
        if len(configs) > 1:
            raise ValueError(f"{name}: the runs were made with different configurations ({sorted(configs)})")
        config, side.config_note = config_of_run(next(iter(side.runs.values())))
        if config is not None and overrides:
            config = dataclasses.replace(config, **overrides)
        side.config = config
    if not side.runs and side.config is None:
        raise ValueError(f"{name}: nothing given")
    return side
