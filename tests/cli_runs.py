"""The CLI run in-process for tests, its output captured: as parsed JSON (``--json``
added) or as the raw stdout and stderr."""

from __future__ import annotations

import json
from typing import Any

import pytest

from audit_cli.main import main


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    """Exit code and the JSON answer (the raw text when it is not JSON)."""
    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    try:
        return code, json.loads(out)
    except ValueError:
        return code, out


def cli_text(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
