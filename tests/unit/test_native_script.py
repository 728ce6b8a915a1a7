"""``deploy/fabric/native.sh`` control flow and the project's ccaas builder, run for real
with stand-in Fabric binaries (small Python programs that listen where the real ones
would, or fail where a test wants a failure): a busy port refused before anything
starts, a failed ``up`` leaving no process behind, the settings saved for ``start-peer``
and ``down``, logs appended."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "deploy" / "fabric" / "native.sh"
CCAAS = ROOT / "deploy" / "fabric" / "ccaas" / "bin"

# A stand-in daemon: listens on the port named by its environment, until killed.
LISTENER = f"""#!{sys.executable}
import os, signal, socket, sys, time
names = {{"orderer": "ORDERER_ADMIN_LISTENADDRESS", "peer": "CORE_PEER_LISTENADDRESS"}}
address = os.environ[names[os.path.basename(sys.argv[0])]]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((address.split(":")[0], int(address.split(":")[1])))
server.listen()
print("listening on", address, flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def fabric(tmp_path: Path) -> Iterator[dict[str, str]]:
    bin_dir, config = tmp_path / "bin", tmp_path / "config"
    bin_dir.mkdir()
    config.mkdir()
    (config / "core.yaml").write_text("")
    (config / "orderer.yaml").write_text("")
    for tool, body in (("cryptogen", "#!/bin/sh\nmkdir -p \"${3#--output=}\"\n"),
                       ("configtxgen", "#!/bin/sh\nexit 0\n"),
                       ("osnadmin", "#!/bin/sh\necho 'osnadmin: join refused' >&2\nexit 1\n"),
                       ("orderer", LISTENER), ("peer", LISTENER)):
        (bin_dir / tool).write_text(body)
        (bin_dir / tool).chmod(0o755)
    ports = {name: str(free_port()) for name in (
        "NATIVE_ORDERER_PORT", "NATIVE_ORDERER_ADMIN_PORT", "NATIVE_ORDERER_OPS_PORT",
        "NATIVE_PEER_PORT", "NATIVE_PEER_CC_PORT", "NATIVE_PEER_OPS_PORT", "NATIVE_CC_PORT")}
    env = dict(os.environ, FABRIC_BIN=str(bin_dir), FABRIC_CONFIG=str(config),
               FABRIC_NATIVE_DIR=str(tmp_path / "net"), **ports)
    yield env
    subprocess.run(["bash", str(NATIVE), "down"], env=env, capture_output=True, timeout=60)


def native(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(NATIVE), *args], env=env, capture_output=True,
                          text=True, timeout=120)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_port_in_use_is_refused_before_anything_starts(fabric: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", int(fabric["NATIVE_ORDERER_ADMIN_PORT"])))
        busy.listen()
        done = native(fabric, "up")
    assert done.returncode == 2, done.stderr
    assert (f"port {fabric['NATIVE_ORDERER_ADMIN_PORT']} is already in use (set "
            "NATIVE_ORDERER_ADMIN_PORT") in done.stderr
    assert not Path(fabric["FABRIC_NATIVE_DIR"]).exists()


def test_a_failed_up_stops_what_it_started_and_keeps_its_settings(
        fabric: dict[str, str]) -> None:
    work = Path(fabric["FABRIC_NATIVE_DIR"])
    done = native(fabric, "up")  # the orderer and peer start; the channel join fails
    assert done.returncode != 0
    assert "native.sh up failed; stopping what it started" in done.stderr
    assert "osnadmin: join refused" in (work / "logs" / "last-retry.log").read_text() \
        or "join refused" in done.stderr
    assert not list(work.glob("*.pid")), "a failed up left processes behind"
    assert "listening on" in (work / "logs" / "orderer.log").read_text()

    # start-peer and down need no variable again: they read what up saved.
    bare = {k: v for k, v in fabric.items()
            if not k.startswith(("FABRIC_BIN", "FABRIC_CONFIG", "NATIVE_"))}
    started = native(bare, "start-peer")
    assert started.returncode == 0, started.stderr
    pid = int((work / "peer.pid").read_text())
    assert alive(pid)
    log = (work / "logs" / "peer.log").read_text()
    assert log.count("starting peer") == 2  # appended, not overwritten
    stopped = native(bare, "down")
    assert stopped.returncode == 0, stopped.stderr
    assert not work.exists()
    for _ in range(100):
        if not alive(pid):
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert not alive(pid)


def _package(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    source, metadata = tmp_path / "src", tmp_path / "meta"
    source.mkdir()
    metadata.mkdir()
    (metadata / "metadata.json").write_text(f'{{ "type" : "{kind}", "label": "anchor_1.0" }}')
    (source / "connection.json").write_text('{"address":"127.0.0.1:9999"}')
    return source, metadata


def test_the_ccaas_builder_detects_builds_and_releases(tmp_path: Path) -> None:
    source, metadata = _package(tmp_path, "CCAAS")
    assert subprocess.run([CCAAS / "detect", source, metadata]).returncode == 0
    build, release = tmp_path / "build", tmp_path / "release"
    subprocess.run([CCAAS / "build", source, metadata, build], check=True)
    subprocess.run([CCAAS / "release", build, release], check=True)
    assert (release / "chaincode" / "server" / "connection.json").read_text() == \
        '{"address":"127.0.0.1:9999"}'


def test_the_ccaas_builder_leaves_other_packages_to_other_builders(tmp_path: Path) -> None:
    source, metadata = _package(tmp_path, "node")
    assert subprocess.run([CCAAS / "detect", source, metadata]).returncode != 0
    (source / "connection.json").unlink()
    failed = subprocess.run([CCAAS / "build", source, metadata, tmp_path / "b"],
                            capture_output=True, text=True)
    assert failed.returncode == 1 and "no connection.json" in failed.stderr
