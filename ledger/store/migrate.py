"""Run the Alembic migrations programmatically (the only way the schema is created)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config


def _migrations_dir() -> Path:
    # An installed wheel carries them beside this module (setup.py copies them there);
    # a source checkout (editable install, tests) has them at the repository root.
    packaged = Path(__file__).resolve().with_name("migrations")
    if (packaged / "env.py").is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"


MIGRATIONS_DIR = _migrations_dir()


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)
