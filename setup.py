"""Packaging glue that pyproject.toml cannot express: ship the Alembic migrations.

The migrations live at the repository root (``migrations/``), where Alembic's tooling and
the team's workflow expect them; an installed (non-editable) package has no repository
root, so the build copies them into ``ledger/store/migrations`` inside the wheel, where
``ledger.store.migrate`` looks first. Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithMigrations(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads migrations/ in place
            return
        target = Path(self.build_lib) / "ledger" / "store" / "migrations"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(HERE / "migrations", target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithMigrations})
