"""Windows, tiles and restore at 1,000,000 records.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_window.py [--records 1000000]

Builds a SQLite log of v1 audit records (one every 50 ms, three tenants, commitments that
are SHA-256 digests as the service writes them), or with ``--format v2`` the records the
service writes now (the tiny model's ``environment/v1`` leaf, then ``audit-record/v2``
leaves sealed by the serving code in batches of 32 and appended by the real writer, at
the build's own times, then the engine's environment leaf again six minutes later, which
closes the window of all the records' times), seals one
checkpoint and has a witness cosign it, publishes it as tiles to a directory, serves that
directory with a static HTTP server (a child process), then measures, each with the
product's own commands:

1. tiles served from the directory publisher: every entry bundle read over HTTP with 8
   threads (the readers' client, ``HttpTiles``), entries per second (target >= 100,000/s);
2. a proved window query over all records (`audit-ledger query --prove --tiles URL`,
   time only, and again with a tenant filter) (target <= 30 s);
3. `audit-ledger restore` of the whole log into an empty database, then `serve` on it
   until it answers `/readyz` and `/tlog/checkpoint` (target <= 3 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.serialization import (  # noqa: E402
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from ledger import merkle, tiles  # noqa: E402
from ledger.checkpoint import Checkpoint, NoteSigner  # noqa: E402
from ledger.client.tiles import HttpTiles  # noqa: E402
from ledger.cosignature import Cosigner, add_cosignatures  # noqa: E402
from ledger.publish.directory import DirectorySink  # noqa: E402
from ledger.publish.publisher import publish  # noqa: E402
from ledger.store.keys import encode_signer_key  # noqa: E402
from ledger.store.migrate import upgrade  # noqa: E402
from ledger.store.sql import SqlLedger  # noqa: E402
from tests.records import make_record  # noqa: E402

ORIGIN = "bench.audit-ledger/window"
BASE = datetime(2026, 11, 3, 0, 0, 0)
STEP = timedelta(milliseconds=50)


STATIC_SERVER = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static("/", sys.argv[1])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None, access_log=None)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def record_maker() -> tuple[bytes, list[bytes]]:
    """A canonical v1 record with its varying values cut out: filling same-length values
    keeps it canonical (keys and shape unchanged), at a fraction of build_record's cost."""
    marks = {"created_at": "2026-11-03T00:00:00.000Z", "tenant": "bank-7",
             "input": "sha256:" + "1" * 64, "output": "sha256:" + "2" * 64}
    record = make_record(0, tenant=marks["tenant"], padding=0, created_at=marks["created_at"])
    body = record.canonical
    body = body.replace(record.record_id.encode(), b"%(record_id)s")
    body = body.replace(b'"sha256:' + b"0" * 64 + b'"', b'"%(input)s"')
    body = body.replace(b'"sha256:' + b"0" * 63 + b'1"', b'"%(output)s"')
    body = body.replace(marks["created_at"].encode(), b"%(created_at)s")
    body = body.replace(b'"bank-7"', b'"%(tenant)s"')
    return body, [record.record_id.encode()]


def _digest(kind: bytes, i: int) -> bytes:
    """A commitment as the service writes one: a SHA-256 of its own, random-looking hex.
    (Counting hex, ``sha256:000…01``, would put a run of 16 digits after a ``:`` in every
    record, which canonical re-encoding takes for a possible long integer and checks
    the slow way: a cost no log the service writes has.)"""
    return b"sha256:" + hashlib.sha256(kind + i.to_bytes(8, "big")).hexdigest().encode()


def build(url: str, count: int, signer: NoteSigner, witness: Cosigner) -> bytes:
    """The log's tables filled directly (one transaction), one checkpoint, cosigned."""
    template, _ = record_maker()
    path = url[len("sqlite:///"):]
    compact = merkle.CompactRange()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    nodes: list[tuple[int, int, bytes]] = []
    rows: list[tuple[object, ...]] = []
    for i in range(count):
        moment = BASE + STEP * i
        stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
        record_id = f"01900000-0000-7000-8000-{i:012d}"
        entry = template % {b"record_id": record_id.encode(), b"created_at": stamp.encode(),
                            b"tenant": f"bank-{i % 3}".encode(),
                            b"input": _digest(b"input", i),
                            b"output": _digest(b"output", i)}
        nodes.extend((lv, ix, h) for (lv, ix), h in compact.append(merkle.hash_leaf(entry)))
        rows.append((i, record_id, moment.strftime("%Y-%m-%d %H:%M:%S.%f"),
                     f"bank-{i % 3}", entry))
        if len(rows) == 50_000 or i == count - 1:
            conn.executemany("INSERT INTO tree_nodes (level, idx, hash) VALUES (?, ?, ?)",
                             nodes)
            conn.executemany("INSERT INTO records (leaf_index, record_id, created_at, tenant, "
                             "canonical) VALUES (?, ?, ?, ?, ?)", rows)
            nodes, rows = [], []
    root = compact.root()
    note = signer.sign_checkpoint(Checkpoint(ORIGIN, count, root))
    conn.execute("UPDATE tree_state SET size = ?, root = ? WHERE id = 1", (count, root))
    conn.execute("INSERT INTO checkpoints (size, root, note, sealed_at) VALUES (?, ?, ?, ?)",
                 (count, root, note, "2026-11-04 00:00:00.000000"))
    conn.commit()
    conn.close()
    return add_cosignatures(note, [witness.cosign(Checkpoint.peek(note).body(),
                                                  1_790_000_000)])


def build_v2(url: str, count: int, signer: NoteSigner, witness: Cosigner) -> bytes:
    """The log as the service writes it: one environment leaf, then sealed v2 records
    (8 generated batches of 32, sealed again and again with fresh ids), appended in
    groups of 4096 by ``SqlLedger``, and last the environment leaf of the engine started
    again six minutes after the last record: beyond the lag bound, it closes every
    window of the records' own times (``ledger.window``). One checkpoint, cosigned."""
    import asyncio

    import torch

    from inference_wrapper.audit.generator import AuditedGenerator, AuditedOutput, LogBinding
    from inference_wrapper.engine.model import load_model
    from inference_wrapper.engine.params import GenerationParams
    from inference_wrapper.engine.tiny import build_tiny_model
    from ledger.leaves.envelope import Leaf
    from ledger.leaves.environment import build_environment
    from ledger.leaves.record_v2 import EnvironmentRef
    from ledger.record import AuditRecord

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp, \
            SqlLedger(url, sqlite_synchronous="NORMAL") as ledger:
        manifest = build_tiny_model(Path(tmp) / "tiny")
        generator = AuditedGenerator(load_model(Path(tmp) / "tiny", manifest=manifest))
        params = GenerationParams(max_new_tokens=16)
        results = [generator.run_batch([
            generator.prepare(f"Summarise exposure {b}.{i}", params, f"bank-{i % 3}")
            for i in range(32)]) for b in range(8)]
        ledger.create_log_meta(ORIGIN, signer.verifier().encode())
        environment = generator.environment_leaf()
        receipt = ledger.append(environment)
        log = LogBinding(ORIGIN)
        log.bind(generator.environment(),
                 EnvironmentRef(receipt.leaf_index, environment.leaf_hash))

        async def fill() -> None:
            written, turn = 1, 0
            while written < count - 1:
                leaves: list[AuditRecord | Leaf] = []
                while len(leaves) < min(4096, count - 1 - written):
                    sealed = generator.seal(results[turn % 8], log)
                    assert all(isinstance(o, AuditedOutput) for o in sealed)
                    leaves.extend(o.record for o in sealed if isinstance(o, AuditedOutput))
                    turn += 1
                outcomes = await ledger.append_many_async(leaves[:count - 1 - written])
                assert not [o for o in outcomes if isinstance(o, BaseException)]
                written += len(outcomes)

        asyncio.run(fill())
        _, last = v2_times(url)
        restarted = dict(generator.environment(), created_at=(
            last + timedelta(minutes=6)).isoformat(timespec="milliseconds") + "Z")
        ledger.append(build_environment(
            **{name: restarted[name] for name in (
                "engine", "model", "hardware", "software", "tokenization_contract",
                "generation_config_digest", "created_at")}))
        sealed = ledger.seal_checkpoint(signer, ORIGIN)
        assert sealed is not None and sealed.size == count
        note = sealed.note
    return add_cosignatures(note, [witness.cosign(Checkpoint.peek(note).body(),
                                                  1_790_000_000)])


def v2_times(url: str) -> tuple[datetime, datetime]:
    """The first and last time of the v2 records (leaf 0 is the engine's environment;
    the records are those of the tenants)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        first, last = conn.execute("SELECT min(created_at), max(created_at) FROM records "
                                   "WHERE tenant LIKE 'bank-%'").fetchone()
    return datetime.fromisoformat(first), datetime.fromisoformat(last)


def read_all_bundles(prefix: str, size: int) -> tuple[int, float]:
    """Every entry bundle over HTTP with 8 threads, through the readers' client
    (``HttpTiles``: a kept-alive connection per thread): (entries, seconds)."""
    refs = [tiles.tile_for(0, n, size, entries=True)
            for n in range((size + tiles.TILE_WIDTH - 1) // tiles.TILE_WIDTH)]
    source = HttpTiles(prefix, timeout_s=60)

    def fetch(ref: tiles.TileRef | None) -> int:
        assert ref is not None
        data = source.get(ref.path)
        assert data is not None, ref.path
        return len(tiles.decode_bundle(data, ref.width))

    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(fetch, refs))
    return total, time.perf_counter() - started


def run_cli(args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
            ) -> tuple[float, str]:
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "audit_cli.main", *args], env=env,
                               stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
    elapsed = time.perf_counter() - started
    text = log.read_text()
    if code != 0:
        raise SystemExit(f"audit-ledger {args[0]} failed ({code}):\n{text[-2000:]}")
    return elapsed, text


def serve_until_answering(tmp: Path, url: str, env: dict[str, str]) -> tuple[float, str]:
    from inference_wrapper.engine.tiny import build_tiny_model

    model_dir = tmp / "tiny"
    if not model_dir.exists():
        build_tiny_model(model_dir)
    port = free_port()
    started = time.perf_counter()
    log = open(tmp / "serve.log", "w")  # noqa: SIM115 (closed below; never an unread pipe)
    proc = subprocess.Popen(
        [sys.executable, "-m", "audit_cli.main", "serve", "--port", str(port), "--db", url,
         "--model-dir", str(model_dir), "--model-manifest", str(tmp / "tiny.manifest.json")],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        token = ""
        while True:
            if proc.poll() is not None:
                raise SystemExit("serve exited:\n" + (tmp / "serve.log").read_text()[-2000:])
            match = re.search(r"auditor \(all tenants\):\s+(\S+)",
                              (tmp / "serve.log").read_text())
            token = match.group(1) if match else token
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                    pass
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/tlog/checkpoint",
                    headers={"Authorization": f"Bearer {token}"})
                with urllib.request.urlopen(request, timeout=5) as answer:
                    checkpoint = answer.read().decode()
                return time.perf_counter() - started, checkpoint
            except OSError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def compare_restores(other: Path, rounds: int, tmp: Path, trust: list[str],
                     env: dict[str, str]) -> None:
    """``audit-ledger restore`` of the log with OTHER's code and this tree's, alternately
    (the order flips each round), each a fresh process: wall and CPU (user + system)."""
    import resource

    trees = {"other": other.resolve(), "this": Path(__file__).resolve().parents[1]}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for turn in range(rounds):
        for name in (("other", "this") if turn % 2 == 0 else ("this", "other")):
            target = tmp / f"compare-{name}.db"
            target.unlink(missing_ok=True)
            load = os.getloadavg()[0]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall, _ = run_cli(["restore", "--from", str(tmp / "tlog"), "--db",
                               f"sqlite:///{target}", *trust],
                              dict(env, PYTHONPATH=str(trees[name])), tmp / "restore.log",
                              cwd=trees[name])
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            runs[name].append((wall, cpu))
            target.unlink(missing_ok=True)
            print(f"   {name} round {turn + 1}: wall {wall:.1f} s, CPU {cpu:.1f} s "
                  f"(load {load:.1f})")
    (old_wall, old_cpu), (new_wall, new_cpu) = (
        (statistics.median(w for w, _ in runs[n]), statistics.median(c for _, c in runs[n]))
        for n in ("other", "this"))
    print(f"3. restore, medians of {rounds}: other wall {old_wall:.1f} s CPU {old_cpu:.1f} s; "
          f"this wall {new_wall:.1f} s CPU {new_cpu:.1f} s; other/this wall "
          f"{old_wall / new_wall:.2f}, CPU {old_cpu / new_cpu:.2f}; "
          f"load now {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, help="work here instead of a temporary folder")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it: a log "
                        "and tiles built there by an earlier run are reused (same --records)")
    parser.add_argument("--format", choices=("v1", "v2"), default="v1",
                        help="the records built: v1, or v2 as the service writes them now")
    parser.add_argument("--against", type=Path, metavar="OTHER_CHECKOUT",
                        help="restore only: run this tree's and OTHER_CHECKOUT's restore "
                        "alternately on the same log (--rounds each) and print medians")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", default="tiles,query,restore",
                        help="which measurements to run (comma-separated)")
    args = parser.parse_args()
    steps = set(args.steps.split(","))
    count = args.records
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp = args.keep
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        keys = tmp / "keys.pem"
        if not keys.exists():
            keys.write_bytes(b"".join(k.private_bytes(
                Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) for k in
                (Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate())))
        pems = keys.read_bytes().split(b"-----END PRIVATE KEY-----\n")
        key, witness_key = (load_pem_private_key(p + b"-----END PRIVATE KEY-----\n", None)
                            for p in pems[:2])
        assert isinstance(key, Ed25519PrivateKey) and isinstance(witness_key,
                                                                 Ed25519PrivateKey)
        signer = NoteSigner(ORIGIN, key)
        witness = Cosigner("witness.bench", witness_key)
        home = tmp / "home"
        home.mkdir(exist_ok=True)
        (home / "log.key").write_text(encode_signer_key(ORIGIN, key) + "\n")
        (home / "log.key").chmod(0o600)
        env = dict(os.environ, AUDIT_LEDGER_HOME=str(home), PYTHONUNBUFFERED="1",
                   AUDIT_LEDGER_ORIGIN=ORIGIN, PYTHONPATH=str(Path(__file__).parents[1]))
        trust = ["--log-key", signer.verifier().encode(), "--witness",
                 witness.witness_key.encode()]

        url = f"sqlite:///{tmp / 'log.db'}"
        if (tmp / "tlog" / "checkpoint").exists():
            note = (tmp / "tlog" / "checkpoint").read_bytes()
            if Checkpoint.peek(note).size != count:
                raise SystemExit(f"{tmp} holds a log of another size; use another --keep")
            print(f"reusing the log and tiles of {count:,} records in {tmp}")
        else:
            (tmp / "log.db").unlink(missing_ok=True)
            upgrade(url)
            started = time.perf_counter()
            note = (build_v2 if args.format == "v2" else build)(url, count, signer, witness)
            print(f"built a log of {count:,} {args.format} records in "
                  f"{time.perf_counter() - started:.1f} s (setup, not measured against a target)")

            ledger = SqlLedger(url)
            started = time.perf_counter()
            published = publish(ledger.tiles, note, DirectorySink(tmp / "tlog"))
            ledger.engine.dispose()
            print(f"published {published.files:,} tiles and bundles to a directory in "
                  f"{time.perf_counter() - started:.1f} s")

        port = free_port()
        with open(tmp / "http.log", "w") as http_log:
            server = subprocess.Popen(  # a static file server (sendfile), as any host is
                [sys.executable, "-c", STATIC_SERVER, str(tmp / "tlog"), str(port)],
                stdout=http_log, stderr=subprocess.STDOUT)
            try:
                prefix = f"http://127.0.0.1:{port}/"
                while True:  # until it answers (a loaded machine starts it slowly)
                    if server.poll() is not None:
                        raise SystemExit("the static server exited:\n"
                                         + (tmp / "http.log").read_text()[-2000:])
                    try:
                        urllib.request.urlopen(prefix + "checkpoint", timeout=1).close()
                        break
                    except OSError:
                        time.sleep(0.05)
                if "tiles" in steps:
                    entries, seconds = read_all_bundles(prefix, count)
                    print(f"1. tiles served from the directory publisher (aiohttp static "
                          f"files): {entries:,} entries in {seconds:.1f} s = "
                          f"{entries / seconds:,.0f} entries/s (target >= 100,000/s)")

                if args.format == "v2":  # every record: the last leaf closes the window
                    first, last = v2_times(url)
                    since, until = first.isoformat(), (last + STEP).isoformat()
                else:
                    last = BASE + STEP * (count - 1)
                    since = BASE.isoformat()
                    until = (last - timedelta(minutes=5, seconds=1)).isoformat()
                for extra, what in (([], "time only"), (["--tenant", "bank-1"],
                                                        "tenant filter")
                                    ) if "query" in steps else ():
                    seconds, out = run_cli(["query", "--prove", "--limit", "10", "--tiles",
                                            prefix, "--since", since, "--until", until,
                                            *extra, *trust], env, tmp / "query.log")
                    print(f"2. proved window query over all records ({what}): {seconds:.1f} s "
                          f"(target <= 30 s)\n   {out.strip().splitlines()[-1]}")
            finally:
                server.terminate()
                server.wait(30)

        if "restore" not in steps:
            return
        if args.against:
            compare_restores(args.against, args.rounds, tmp, trust, env)
            return
        (tmp / "restored.db").unlink(missing_ok=True)
        restored = f"sqlite:///{tmp / 'restored.db'}"
        restore_s, out = run_cli(["restore", "--from", str(tmp / "tlog"), "--db", restored,
                                  *trust], env, tmp / "restore.log")
        print(f"3. restore of {count:,} records: {restore_s:.1f} s\n   "
              f"{out.strip().splitlines()[-1]}")
        serve_s, checkpoint = serve_until_answering(tmp, restored, env)
        print(f"   serve on it answering /readyz and /tlog/checkpoint: {serve_s:.1f} s "
              f"(tree size {checkpoint.splitlines()[1]})")
        print(f"   restore + serve answering: {restore_s + serve_s:.1f} s "
              "(target <= 180 s)")
        print(f"load average after: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
