"""An auditor's install: the wheel built from this repository, installed (not editable)
into a fresh virtual environment without torch, verifies a bundle and runs the auditor
commands; the migrations and pinned manifests travel inside the wheel.

Installing the wheel's few dependencies uses the package index (pip's cache makes it
quick after the first run), pinned by requirements.lock.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from ledger.anchor.local import LocalAnchor
from ledger.store.keys import load_or_create_signer
from ledger.store.sql import SqlLedger
from tests.records import make_record

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("ledger", "inference_wrapper", "audit_cli", "migrations", "pyproject.toml",
           "setup.py", "MANIFEST.in", "README.md", "LICENSE")
ORIGIN = "audit-ledger.local/log"  # the service's default origin: the key file names it
MODEL_STACK = ("torch", "transformers", "tokenizers", "safetensors", "aiohttp", "grpc")


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _build_wheel(work: Path) -> Path:
    # Built from a copy so the build leaves no build/ or egg-info in the checkout.
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    out = work / "dist"
    done = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                 "--disable-pip-version-check", str(source), "-w", str(out)], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("audit_ledger-*.whl")
    return wheel


@pytest.fixture(scope="module")
def auditor_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    work = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(work)
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    done = _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                 "--disable-pip-version-check", "-c", str(ROOT / "requirements.lock"),
                 str(wheel)], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["AUDIT_LEDGER_HOME"] = str(work / "home")
    return wheel, env_dir, env


def test_wheel_carries_migrations_and_manifests_and_no_model_stack(
    auditor_env: tuple[Path, Path, dict[str, str]],
) -> None:
    wheel, _, _ = auditor_env
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(archive.read(n).decode() for n in names
                        if n.endswith(".dist-info/METADATA"))
    for needed in ("ledger/store/migrations/env.py", "ledger/store/migrations/script.py.mako",
                   "ledger/store/migrations/versions/0001_initial.py",
                   "inference_wrapper/pinned/smollm2-135m-instruct.manifest.json"):
        assert needed in names
    base = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert base and not [d for d in base if d.split("=")[0].split("[")[0]
                         in ("torch", "transformers", "aiohttp", "grpcio", "gitpython")]
    assert any(line.startswith("Requires-Dist: torch==") and 'extra == "serve"' in line
               for line in metadata.splitlines())


def test_fresh_auditor_install_verifies_a_bundle_without_torch(
    auditor_env: tuple[Path, Path, dict[str, str]], tmp_path: Path,
) -> None:
    _, env_dir, env = auditor_env
    python, cli = str(env_dir / "bin" / "python"), str(env_dir / "bin" / "audit-ledger")
    for module in MODEL_STACK:
        done = _run([python, "-c", f"import {module}"], cwd=tmp_path, env=env)
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, module

    # The schema comes from the migrations inside the installed package.
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    done = _run([python, "-c", "import sys, ledger.store.migrate as m; "
                 "m.upgrade(sys.argv[1]); print(m.MIGRATIONS_DIR)", url], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "site-packages" in done.stdout and str(ROOT) not in done.stdout

    signer = load_or_create_signer(tmp_path / "log.key", ORIGIN)
    with SqlLedger(url) as ledger:
        for i in range(5):
            ledger.append(make_record(i))
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None
        LocalAnchor(ledger, signer.verifier(), ORIGIN).anchor(sealed.note)
    key = signer.verifier().encode()
    bundle = tmp_path / "evidence.json"

    def audit_ledger(*argv: str) -> subprocess.CompletedProcess[str]:
        return _run([cli, *argv], cwd=tmp_path, env=env)

    done = audit_ledger("export", "--db", url, "--bundle", str(bundle))
    assert done.returncode == 0, done.stderr[-3000:]
    # Only the local anchor here: the verifier refuses to call that verified unless told.
    done = audit_ledger("verify", "--bundle", str(bundle), "--log-key", key)
    assert done.returncode == 1 and "SelfAnchoredError" in done.stdout, done.stdout[-3000:]
    done = audit_ledger("verify", "--bundle", str(bundle), "--log-key", key,
                        "--accept-self-anchored")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "5 of 5 records verified" in done.stdout
    done = audit_ledger("audit", "--db", url, "--from", "2026-01-01", "--to", "2027-01-01",
                        "--log-key", key)
    assert done.returncode == 0 and "COMPLETE: 5 records" in done.stdout, done.stderr[-3000:]
    done = audit_ledger("log", "--db", url, "--log-key", key, "fsck")
    assert done.returncode == 0 and done.stdout.rstrip().endswith("OK"), done.stderr[-3000:]
    done = audit_ledger("query", "--db", url, "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["tenant"] for row in json.loads(done.stdout)] == ["bank-a"] * 5

    for command in ("verify", "export", "query", "audit", "log", "serve"):
        done = audit_ledger(command, "--help")
        assert done.returncode == 0 and "usage: audit-ledger" in done.stdout, (
            command, done.stderr[-3000:])
    # Serving needs the model stack: a usage error that says how to get it.
    done = audit_ledger("serve")
    assert done.returncode == 2
    assert "pip install 'audit-ledger[serve]'" in done.stderr + done.stdout
