"""Reading migration files: version, name, checksum and the statements they hold."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")
_STATEMENT_END = re.compile(r";[ \t]*(?:\n|$)")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    checksum: str  # sha256 of the file: an applied migration must never change
    statements: tuple[str, ...]


def split_statements(text: str) -> list[str]:
    """Statements of a SQL file: comment lines dropped, split at ';' that ends a line."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    parts = _STATEMENT_END.split("\n".join(lines) + "\n")
    return [p.strip() for p in parts if p.strip()]


def load_migrations(directory: str | Path | None = None) -> list[Migration]:
    directory = Path(directory) if directory else MIGRATIONS_DIR
    migrations = []
    for path in sorted(directory.iterdir()):
        match = _FILE_NAME.match(path.name)
        if not match:
            continue
        text = path.read_text()
        migrations.append(Migration(
            version=int(match.group(1)),
            name=match.group(2),
            checksum=hashlib.sha256(text.encode()).hexdigest(),
            statements=tuple(split_statements(text)),
        ))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise ValueError(f"duplicate migration versions in {directory}: {versions}")
    return migrations
