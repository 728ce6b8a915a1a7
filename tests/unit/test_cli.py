"""The command line's contract: options anywhere, one error map, JSON errors, exit 4 for
bugs (never a bare traceback), and a quiet exit when stdout's reader has gone."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli import main as cli_main
from ledger.checkpoint import NoteSigner

ROOT = Path(__file__).resolve().parents[2]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


Inherited = tuple[tuple[int, argparse.Action], ...]


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = (),
            inherited: Inherited = ()
            ) -> list[tuple[tuple[str, ...], argparse.ArgumentParser, Inherited]]:
    """Every runnable (sub)command, with the options of the parsers above it and the depth
    of the parser that owns each (0: before the subcommand)."""
    children = _subparsers(parser)
    if not children:
        return [(path, parser, inherited)]
    own = tuple((len(path), a) for a in parser._actions
                if a.option_strings and not isinstance(a, argparse._HelpAction))
    found = []
    for name, child in children.items():
        found += _leaves(child, (*path, name), inherited + own)
    return found


def _value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    return ["7"]


def _required(parser: argparse.ArgumentParser) -> list[str]:
    argv: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if not action.option_strings and action.nargs != "?":
            argv += _value(action)
        elif action.option_strings and action.required:
            argv += [action.option_strings[0], *_value(action)]
    return argv


LEAVES = _leaves(cli_main.build_parser())


@pytest.mark.parametrize(("path", "inherited"), [pytest.param(p, i, id=" ".join(p))
                                                  for p, _, i in LEAVES])
def test_every_option_is_accepted_before_or_after_the_action(
        path: tuple[str, ...], inherited: Inherited) -> None:
    parser = cli_main.build_parser()
    leaf = {p: leaf for p, leaf, _ in _leaves(parser)}[path]
    required = _required(leaf)
    assert any(a.dest == "json" for _, a in inherited), "--json is everywhere"
    for depth, action in inherited:
        option = [action.option_strings[0], *_value(action)]
        before = parser.parse_args([*path[:depth], *option, *path[depth:], *required])
        after = parser.parse_args([*path, *required, *option])
        given = getattr(before, action.dest)
        assert getattr(after, action.dest) == given, (path, action.option_strings)
        assert given != action.default, (path, action.option_strings)


def test_options_after_the_action_named_in_the_issue() -> None:
    parser = cli_main.build_parser()
    assert parser.parse_args(["log", "fsck", "--db", "sqlite:///x.db"]).db == "sqlite:///x.db"
    args = parser.parse_args(["keys", "create", "--tenant", "t", "--role", "client", "--json"])
    assert args.json is True and args.tenant == "t"
    args = parser.parse_args(["verify", "--json", "some-id"])
    assert args.json is True and args.record_id == "some-id"
    assert parser.parse_args(["--json", "verify", "x"]).json is True
    assert parser.parse_args(["verify", "x"]).json is False


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_usage_error_is_exit_2_and_json_on_stdout_with_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "verify", "--json", "--no-such-option")
    assert code == 2
    error = json.loads(out)["error"]
    assert error["exit_code"] == 2 and error["field"] == "arguments"
    assert "--no-such-option" in error["message"]
    code, out, err = run_main(capsys, "verify", "--no-such-option")
    assert code == 2 and out == "" and "--no-such-option" in err


def test_missing_log_key_names_the_option_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "verify", "x", "--db", "sqlite://", "--json")
    assert code == 2 and json.loads(out)["error"]["field"] == "--log-key"


def _boom(args: argparse.Namespace) -> int:
    raise LookupError("tree nodes missing")


def test_unexpected_exception_is_exit_4_with_a_short_message_and_where_details_are(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setenv("AUDIT_LEDGER_HOME", str(tmp_path))
    monkeypatch.setattr("audit_cli.cmd_doctor.run", _boom)
    code, out, err = run_main(capsys, "doctor")
    assert code == 4
    assert "internal error (LookupError: tree nodes missing)" in err
    assert "Traceback" not in err and str(tmp_path / "logs" / "cli-errors.log") in err
    assert "LookupError: tree nodes missing" in (tmp_path / "logs" / "cli-errors.log").read_text()
    code, out, _ = run_main(capsys, "doctor", "--json")
    error: dict[str, Any] = json.loads(out)["error"]
    assert code == 4 and error["exit_code"] == 4 and error["type"] == "InternalError"
    code, _, err = run_main(capsys, "doctor", "--debug")
    assert code == 4 and "Traceback" in err and "printed above" in err


def test_closed_stdout_pipe_exits_quietly_with_the_commands_own_code(tmp_path: Path) -> None:
    key = NoteSigner("cli.example/log", Ed25519PrivateKey.generate()).verifier().encode()
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything
    try:
        done = subprocess.run(
            [sys.executable, "-m", "audit_cli.main", "log", "public-key", "--log-key", key,
             "--json"], cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, AUDIT_LEDGER_HOME=str(tmp_path)), timeout=300, check=False)
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
