"""Two real ``serve`` replicas on one PostgreSQL log, under load; the lease holder is
frozen with SIGSTOP (a stalled VM, a long pause, a partition) and later resumed.

Shown: appends resume on the other replica (the frozen one's transaction is ended by the
server after ``pg_writer_idle_in_transaction_s`` when it froze between statements, or by
the new lease holder's fencing when it froze inside a pipelined insert), the lease moves
(its session ends after ``pg_lease_ttl_s``), nothing acknowledged is lost, the resumed
replica rejoins and writes nothing wrong (fsck OK), and only one replica anchors (no
anchors_pkey errors).
Times are measured and printed, never asserted tightly: the bounds are polled with a
generous overall timeout.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from ledger.anchor.local import LocalAnchor
from ledger.anchor.worker import AnchorWorker
from ledger.errors import BackendUnavailableError
from ledger.store.anchors import SqlAnchorStore
from ledger.store.fsck import fsck
from ledger.store.integrator import Integrator
from ledger.store.keys import bind_to_origin, decode_signer_key, load_or_create_signer
from ledger.store.migrate import upgrade
from ledger.store.sql import PgSessionSettings, SqlLedger
from tests.records import make_record
from tests.replica_cluster import ROOT, Replica, client_token, generate, launch, wait_ready

OVERALL_S = 120.0  # a generous ceiling for each awaited state on a loaded 2-core machine


@dataclass
class Ack:
    replica: str
    record_id: str
    leaf_index: int
    sent: float
    acked: float


@dataclass
class Load:
    acks: list[Ack] = field(default_factory=list)
    failures: list[tuple[str, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def drive(self, replica: Replica, token: str, worker: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            sent = time.monotonic()
            try:
                status, body = generate(replica.base_url, token,
                                        f"{replica.name} {worker} {n}", timeout=300)
            except OSError:
                status, body = 0, {}
            with self.lock:
                if status == 200:
                    self.acks.append(Ack(replica.name, str(body["record_id"]),
                                         int(body["leaf_index"]), sent, time.monotonic()))
                else:
                    self.failures.append((replica.name, status))
            if status != 200:
                time.sleep(0.05)  # the replica is refusing: do not spin

    def count(self, accept: Callable[[Ack], bool]) -> int:
        with self.lock:
            return sum(1 for ack in self.acks if accept(ack))

    def first(self, accept: Callable[[Ack], bool]) -> Ack | None:
        with self.lock:
            found = [ack for ack in self.acks if accept(ack)]
        return min(found, key=lambda a: a.acked) if found else None


def poll(what: str, check: Callable[[], bool], replicas: list[Replica]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < OVERALL_S:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    logs = "\n".join(f"--- {r.name}\n{r.output()[-2000:]}" for r in replicas)
    raise AssertionError(f"{what}: not within {OVERALL_S} s\n{logs}")


@pytest.mark.parametrize("fencing", ["on", "off"])
def test_sigstop_of_the_lease_holder_under_load(tmp_path: Path, tiny_model_dir: Path,  # type: ignore[no-untyped-def]
                                                make_pg_database, fencing: str) -> None:
    url = str(make_pg_database())
    upgrade(url)
    key = tmp_path / "log.key"
    env = {"AUDIT_LEDGER_LOG_KEY_PATH": str(key), "AUDIT_LEDGER_ANCHOR_INTERVAL_S": "0.2"}
    if fencing == "off":  # only the server's idle-in-transaction timer frees the row
        env["AUDIT_LEDGER_PG_FENCE_AFTER_S"] = "1000"
    first = launch("replica-a", tmp_path, tiny_model_dir, url, env)
    wait_ready(first)  # the first replica creates the log, its key and the API keys
    second = launch("replica-b", tmp_path, tiny_model_dir, url, env)
    wait_ready(second)
    replicas = [first, second]
    token = client_token(first)
    load = Load()
    threads = [threading.Thread(target=load.drive, args=(r, token, w), daemon=True)
               for r in replicas for w in range(3)]
    for thread in threads:
        thread.start()
    resumed_at: float | None = None
    try:
        poll("both replicas acknowledge appends",
             lambda: all(load.count(lambda a, r=r: a.replica == r.name) >= 10 for r in replicas),
             replicas)

        def holders() -> list[Replica]:
            states = {r.name: r.readyz() for r in replicas}
            return [r for r in replicas
                    if (states[r.name] or {}).get("replica", {}).get("holds_lease")]

        poll("exactly one replica holds the lease", lambda: len(holders()) == 1, replicas)
        frozen = holders()[0]
        survivor = next(r for r in replicas if r is not frozen)
        frozen.process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()

        # Appends resume on the survivor: a request sent after the freeze is acknowledged.
        def resumed(ack: Ack) -> bool:
            return ack.replica == survivor.name and ack.sent > stopped

        poll("appends resume on the survivor", lambda: load.count(resumed) >= 5, replicas)
        first_ack = load.first(resumed)
        assert first_ack is not None
        resume_s = first_ack.acked - stopped

        def survivor_leads() -> bool:
            body = survivor.readyz() or {}
            return bool(body.get("replica", {}).get("holds_lease")) and \
                body["replica"]["latest_sealed_by"] == survivor.name

        poll("the survivor takes the lease and seals", survivor_leads, replicas)
        lease_s = time.monotonic() - stopped  # an upper bound: includes polling
        print(f"\nSIGSTOP of the lease holder (fencing {fencing}): appends resumed on the "
              f"survivor after "
              f"{resume_s:.2f} s, the survivor sealed as lease holder after {lease_s:.2f} s")

        frozen.process.send_signal(signal.SIGCONT)
        resumed_at = time.monotonic()

        def rejoined(ack: Ack) -> bool:
            assert resumed_at is not None
            return ack.replica == frozen.name and ack.sent > resumed_at

        poll("the resumed replica appends again", lambda: load.count(rejoined) >= 5, replicas)
        body = frozen.readyz() or {}
        assert body.get("ready") is True and body["replica"]["holds_lease"] is False, body
    finally:
        load.stop.set()
        if resumed_at is None:
            for replica in replicas:
                replica.process.send_signal(signal.SIGCONT)
        for thread in threads:
            thread.join(timeout=OVERALL_S)
        codes = [replica.stop() for replica in replicas]
    assert codes == [0, 0], [r.output()[-2000:] for r in replicas]

    signer = decode_signer_key(key.read_text())
    with SqlLedger(url) as ledger:
        meta = ledger.log_meta()
        assert meta is not None
        size, _ = ledger.tree_head()
        stored = {row.record_id: row.leaf_index for row in ledger.iter_records()}
        # Nothing acknowledged is lost or moved; the tree has no gap and no duplicate.
        lost = [a for a in load.acks if stored.get(a.record_id) != a.leaf_index]
        assert not lost, lost[:5]
        assert sorted(stored.values()) == list(range(size))
        report = fsck(ledger, bind_to_origin(signer, meta.origin).verifier())
        assert report.ok, report.findings[:3]
        sealers = {c.sealed_by for c in ledger.iter_checkpoints()}
        assert survivor.name in sealers, sealers
        anchored = SqlAnchorStore(ledger.engine).latest()
        assert anchored is not None and anchored.size > 0  # anchoring ran, and...
    for replica in replicas:  # ...only one replica anchored at a time: no collisions
        output = replica.output()
        assert "anchors_pkey" not in output and "Traceback" not in output, output[-3000:]
    print(f"fencing {fencing}: {len(load.acks)} acknowledged appends, tree size {size}, "
          f"{len(load.failures)} refused requests ({sorted(set(load.failures))}), "
          f"checkpoints sealed by {sorted(s or '?' for s in sealers)}")


# A replica frozen inside a writer transaction, holding the tree_state row lock: what the
# issue saw stop every replica for as long as the process stayed frozen.
HOLD_TREE_STATE = """
import sys
from sqlalchemy import text
from ledger.store.sql import make_engine
engine = make_engine(sys.argv[1], role="writer")
with engine.connect() as conn:
    conn.execute(text("SELECT size FROM tree_state WHERE id = 1 FOR UPDATE"))
    print("locked", flush=True)
    sys.stdin.readline()  # frozen here; then try to finish the transaction
    try:
        conn.execute(text("UPDATE tree_state SET size = size + 1000 WHERE id = 1"))
        conn.commit()
        print("committed", flush=True)
    except Exception as exc:
        print("refused", type(exc).__name__, flush=True)
"""

# The same, frozen where the idle-in-transaction timeout cannot reach it: in the middle of
# a pipelined batch (what psycopg's executemany sends), before the batch's Sync. The server
# has run the statements so far and waits for the rest with the session "active" and no
# timeout armed: this is how the frozen replica kept the sequencer for the whole
# freeze. Only the lease holder's fencing (pg_terminate_backend) frees it.
HOLD_TREE_STATE_MID_PIPELINE = """
import sys
from ledger.store.sql import make_engine
pgconn = make_engine(sys.argv[1], role="writer").raw_connection().driver_connection.pgconn
pgconn.enter_pipeline_mode()
pgconn.send_query_params(b"BEGIN", None)
pgconn.send_query_params(b"SELECT size FROM tree_state WHERE id = 1 FOR UPDATE", None)
pgconn.send_flush_request()  # results now, but no Sync: the request is still open
while pgconn.flush():
    pass
results = []
while len(results) < 2:
    pgconn.consume_input()
    while not pgconn.is_busy():
        result = pgconn.get_result()
        if result is None:
            break
        results.append(result.status)
print("locked" if results == [1, 2] else f"unexpected {results}", flush=True)
sys.stdin.readline()
"""

# The case exactly: the frozen process holds the lease too, so nobody may fence it
# until its lease session has expired and another replica has taken the lease.
HOLD_LEASE_AND_TREE_STATE_MID_PIPELINE = HOLD_TREE_STATE_MID_PIPELINE.replace(
    "import sys\n", "import sys\nfrom ledger.store.lease import PostgresLease\n"
    "from ledger.store.sql import SqlLedger\n"
    "lease = PostgresLease(SqlLedger(sys.argv[1]))\n"
    "assert lease.try_acquire(), 'the helper must hold the lease'\n", 1)

HOLD_LEASE = """
import sys
from ledger.store.lease import PostgresLease
from ledger.store.sql import SqlLedger
lease = PostgresLease(SqlLedger(sys.argv[1]))
print("leader" if lease.try_acquire() else "follower", flush=True)
sys.stdin.readline()
print("leader" if lease.try_acquire() else "follower", flush=True)
"""


def _helper(script: str, url: str) -> subprocess.Popen[str]:
    # A session of its own: a signal meant for the suite's process group (the kernel's
    # SIGHUP and SIGCONT to an orphaned group with stopped members) must not resume a
    # helper a test froze on purpose.
    process = subprocess.Popen([sys.executable, "-c", script, url], cwd=ROOT, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    assert process.stdout is not None
    return process


def test_a_frozen_writer_holding_the_sequencer_stops_nobody(make_pg_database) -> None:  # type: ignore[no-untyped-def]
    url = str(make_pg_database())
    upgrade(url)
    holder = _helper(HOLD_TREE_STATE, url)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        holder.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        with SqlLedger(url) as ledger:
            receipt = ledger.append(make_record(0), timeout=OVERALL_S)
            waited = time.monotonic() - stopped
            assert receipt.leaf_index == 0
            bound = ledger.pg.writer_idle_in_transaction_s
        print(f"\nappend behind a frozen sequencer lock committed after {waited:.2f} s "
              f"(writer idle-in-transaction timeout {bound} s)")
        holder.send_signal(signal.SIGCONT)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        # The frozen transaction was ended by the server: waking up, it writes nothing.
        assert holder.stdout.readline().split()[:1] == ["refused"]
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    with SqlLedger(url) as ledger:
        assert ledger.tree_head()[0] == 1


def _session_alive(url: str, application_prefix: str) -> bool:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return bool(conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND starts_with(application_name, :p) AND pid <> pg_backend_pid()"),
                {"p": application_prefix}).scalar())
    finally:
        engine.dispose()


def test_a_writer_frozen_mid_pipeline_is_fenced_by_the_lease_holder(  # type: ignore[no-untyped-def]
        make_pg_database, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = str(make_pg_database())
    upgrade(url)
    holder = _helper(HOLD_TREE_STATE_MID_PIPELINE, url)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        holder.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        signer = load_or_create_signer(tmp_path / "log.key", "audit-ledger.test/log")
        with SqlLedger(url) as ledger, caplog.at_level(logging.WARNING):
            integrator = Integrator(ledger, signer, signer.name, replica_id="survivor")
            integrator.start()
            try:
                receipt = ledger.append(make_record(0), timeout=OVERALL_S)
                waited = time.monotonic() - stopped
            finally:
                integrator.stop()
            assert receipt.leaf_index == 0
            assert integrator.fenced_sessions == 1
            bound = ledger.pg.fence_after_s
        fenced = [r.getMessage() for r in caplog.records
                  if r.getMessage().startswith("ended a stuck writer session")]
        assert len(fenced) == 1 and "audit-ledger/writer/" in fenced[0], fenced
        print(f"\nappend behind a writer frozen mid-pipeline committed after {waited:.2f} s "
              f"(fence after {bound} s, integrator tick 1 s)")
        # The frozen session is gone (a terminated backend exits on its own time: poll).
        poll("the fenced session ends",
             lambda: not _session_alive(url, f"audit-ledger/writer/{holder.pid}-"), [])
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    with SqlLedger(url) as ledger:
        assert ledger.tree_head()[0] == 1


def test_without_fencing_a_writer_frozen_mid_request_holds_the_row(  # type: ignore[no-untyped-def]
        make_pg_database) -> None:
    """Why fencing stays: the server arms no timer while a request is half sent, so with
    no fencer an append waits out its whole lock timeout (which the server measures)."""
    from sqlalchemy.exc import OperationalError

    url = str(make_pg_database())
    upgrade(url)
    holder = _helper(HOLD_TREE_STATE_MID_PIPELINE, url)
    assert holder.stdout is not None
    pg = PgSessionSettings(fence_after_s=1000.0)
    try:
        assert holder.stdout.readline().strip() == "locked"
        holder.send_signal(signal.SIGSTOP)
        with SqlLedger(url, pg=replace(pg, lock_timeout_s=pg.writer_idle_in_transaction_s
                                       + 1.0)) as ledger:
            with pytest.raises(BackendUnavailableError) as refused:
                ledger.append(make_record(0), timeout=OVERALL_S)
        assert isinstance(refused.value.__cause__, OperationalError)
        assert getattr(refused.value.__cause__.orig, "sqlstate", None) == "55P03"
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def test_a_lease_holder_frozen_mid_pipeline_is_fenced_once_the_lease_moves(  # type: ignore[no-untyped-def]
        make_pg_database, tmp_path: Path) -> None:
    url = str(make_pg_database())
    upgrade(url)
    holder = _helper(HOLD_LEASE_AND_TREE_STATE_MID_PIPELINE, url)
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        holder.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        signer = load_or_create_signer(tmp_path / "log.key", "audit-ledger.test/log")
        with SqlLedger(url) as ledger:
            survivor = Integrator(ledger, signer, signer.name, replica_id="survivor")
            assert not survivor.is_leader  # the frozen helper holds the lease
            survivor.start()
            try:
                receipt = ledger.append(make_record(0), timeout=OVERALL_S)
                waited = time.monotonic() - stopped
                assert receipt.leaf_index == 0
                assert survivor.fenced_sessions == 1 and survivor.holds_lease
            finally:
                survivor.stop()
            bound = ledger.pg.lease_ttl_s + ledger.pg.lease_ttl_s / 3
        print(f"\nappend behind a lease holder frozen mid-pipeline committed after "
              f"{waited:.2f} s (lease TTL {ledger.pg.lease_ttl_s} s + one tick: {bound:.1f} s)")
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def test_fencing_ends_the_stuck_holder_only(make_pg_database) -> None:  # type: ignore[no-untyped-def]
    """Not a waiter queued behind it, not a young transaction, not the fencer's own."""
    from sqlalchemy import create_engine, select, text

    from ledger.store.schema import tree_state

    url = str(make_pg_database())
    upgrade(url)
    holder = _helper(HOLD_TREE_STATE_MID_PIPELINE, url)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    waiter = _helper(HOLD_TREE_STATE, url)  # only now: it must queue, not win the row
    observer = create_engine(url)
    try:
        assert waiter.stdout is not None

        def waiter_queued() -> bool:
            with observer.connect() as conn:
                return bool(conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'")).scalar())

        poll("the second writer queues behind the holder", waiter_queued, [])
        with SqlLedger(url) as ledger:
            assert ledger.fence_stuck_writers(3600.0) == []  # too young to be stuck
            ended = ledger.fence_stuck_writers(0.0)
            assert [application.split("/")[2].split("-")[0] for _, application, _ in ended] \
                == [str(holder.pid)], ended
            # The waiter got the row once the holder was gone.
            assert waiter.stdout.readline().strip() == "locked"
            waiter.kill()
            waiter.wait()
            # The fencer's own process is never fenced, however long it holds the row.
            with ledger._writer_engine.connect() as own:
                own.execute(select(tree_state.c.size).with_for_update())
                assert ledger.fence_stuck_writers(0.0) == []
                own.rollback()
    finally:
        for process in (holder, waiter):
            process.kill()
            process.wait()
        observer.dispose()


def _xact_age_s(url: str, pid: int) -> float:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            age = conn.execute(text(
                "SELECT EXTRACT(EPOCH FROM clock_timestamp() - xact_start)::float8"
                " FROM pg_stat_activity WHERE starts_with(application_name, :p)"),
                {"p": f"audit-ledger/writer/{pid}-"}).scalar()
        return float(age or 0.0)
    finally:
        engine.dispose()


def test_a_writer_that_queued_long_and_just_got_the_row_is_not_fenced(  # type: ignore[no-untyped-def]
        make_pg_database) -> None:
    """Fencing measures how long a session has waited on its client while holding the
    row, not how old its transaction is: queueing behind a slow peer is not being stuck."""
    import psycopg

    url = str(make_pg_database())
    upgrade(url)
    fence_after_s = 3.0
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    # A slow but healthy holder (not a writer session, so never a fencing candidate).
    with psycopg.connect(dsn, application_name="slow-peer") as slow:
        slow.execute("SELECT size FROM tree_state WHERE id = 1 FOR UPDATE").fetchall()
        queued = _helper(HOLD_TREE_STATE, url)
        assert queued.stdout is not None
        try:
            # The queued writer's transaction grows older than the fence bound...
            poll("the queued writer waits past the fence bound",
                 lambda: _xact_age_s(url, queued.pid) > fence_after_s + 0.5, [])
            slow.commit()  # ...then the slow holder lets go
            assert queued.stdout.readline().strip() == "locked"  # it has the row now
            with SqlLedger(url) as ledger:
                assert ledger.fence_stuck_writers(fence_after_s) == []
        finally:
            queued.kill()
            queued.wait()


def test_a_plain_read_of_the_sequencer_is_not_fenced(make_pg_database) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    url = str(make_pg_database())
    upgrade(url)
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    # Named like another process's writer, in a transaction that only read the row.
    with psycopg.connect(dsn, application_name="audit-ledger/writer/1-reader") as reader:
        reader.execute("SELECT size FROM tree_state WHERE id = 1").fetchall()
        with SqlLedger(url) as ledger:
            assert ledger.fence_stuck_writers(0.0) == []
        assert reader.execute("SELECT 1").fetchone() == (1,)  # still alive


def test_a_failing_fence_does_not_stop_sealing(make_pg_database, tmp_path: Path,  # type: ignore[no-untyped-def]
                                               monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    from sqlalchemy.exc import ProgrammingError

    url = str(make_pg_database())
    upgrade(url)
    signer = load_or_create_signer(tmp_path / "log.key", "audit-ledger.test/log")
    with SqlLedger(url) as ledger:
        def refused(older_than_s: float) -> list[tuple[int, str, float]]:
            raise ProgrammingError("SELECT pg_terminate_backend(...)", {},
                                   Exception("must be a superuser to terminate superuser "
                                             "process"))

        monkeypatch.setattr(ledger, "fence_stuck_writers", refused)
        integrator = Integrator(ledger, signer, signer.name, replica_id="holder")
        ledger.append(make_record(0))
        with caplog.at_level(logging.WARNING):
            sealed = integrator.seal_now()
        assert sealed is not None and sealed.size == 1
        assert any("fencing stuck writers failed" in r.getMessage() for r in caplog.records)
        integrator.lease.release()


def test_the_lease_moves_off_a_frozen_holder(make_pg_database, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = str(make_pg_database())
    upgrade(url)
    holder = _helper(HOLD_LEASE, url)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "leader"
        with SqlLedger(url) as ledger:
            signer = load_or_create_signer(tmp_path / "log.key", "audit-ledger.test/log")
            other = Integrator(ledger, signer, signer.name, replica_id="other")
            assert not other.is_leader
            holder.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            while not other.is_leader:  # the survivor's integrator tick, done by hand
                assert time.monotonic() - stopped < OVERALL_S, "the lease never moved"
                time.sleep(0.1)
            poll_s = time.monotonic() - stopped
            print(f"\nlease moved {poll_s:.2f} s after its holder froze "
                  f"(lease TTL {ledger.pg.lease_ttl_s} s)")
            ledger.append(make_record(0))
            sealed = other.seal_now()
            assert sealed is not None and sealed.sealed_by == "other"
            holder.send_signal(signal.SIGCONT)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            # Waking up, the old holder finds its session gone and does not lead.
            said = [holder.stdout.readline().strip() for _ in range(2)]
            assert said == ["lost the integrator lease: its database session ended",
                            "follower"], said
            assert other.is_leader
            other.lease.release()
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def _anchored_size(ledger: SqlLedger) -> int:
    latest = SqlAnchorStore(ledger.engine).latest()
    return latest.size if latest else -1


class CountingAnchor:
    """The real local anchor, counting who called it."""

    kind = "local"

    def __init__(self, anchor: LocalAnchor) -> None:
        self.inner, self.calls = anchor, 0

    def prepare(self) -> None:
        self.inner.prepare()

    def anchor(self, note: bytes) -> object:
        self.calls += 1
        return self.inner.anchor(note)


def test_only_the_lease_holder_anchors(make_pg_database, tmp_path: Path,  # type: ignore[no-untyped-def]
                                       caplog: pytest.LogCaptureFixture) -> None:
    url = str(make_pg_database())
    upgrade(url)
    signer = load_or_create_signer(tmp_path / "log.key", "audit-ledger.test/log")
    with SqlLedger(url) as a, SqlLedger(url) as b:
        integrators = [Integrator(ledger, signer, signer.name, replica_id=name)
                       for ledger, name in ((a, "a"), (b, "b"))]
        assert [i.is_leader for i in integrators] == [True, False]
        anchors = [CountingAnchor(LocalAnchor(ledger, signer.verifier(), signer.name))
                   for ledger in (a, b)]
        workers = [AnchorWorker(ledger, anchor, interval_s=0.02,
                                leader=integrator.lease.try_acquire)
                   for ledger, anchor, integrator in zip((a, b), anchors, integrators,
                                                         strict=True)]
        with caplog.at_level(logging.INFO):
            for worker in workers:
                worker.start()
            try:
                for n in range(5):  # five checkpoints, each anchored before the next
                    a.append(make_record(n))
                    sealed = integrators[0].seal_now()
                    assert sealed is not None
                    poll("the holder anchors",
                         lambda size=sealed.size: _anchored_size(a) == size, [])
            finally:
                for worker in workers:
                    worker.stop()
        assert anchors[0].calls == 5 and anchors[1].calls == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        for integrator in integrators:
            integrator.lease.release()


def test_every_postgres_session_has_bounded_waits(make_pg_database,  # type: ignore[no-untyped-def]
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import text

    from inference_wrapper.server.settings import Settings
    from ledger.store.sql import make_engine

    url = str(make_pg_database())
    monkeypatch.setenv("AUDIT_LEDGER_PG_LEASE_TTL_S", "7")
    monkeypatch.setenv("AUDIT_LEDGER_PG_LOCK_TIMEOUT_S", "9.5")
    pg = Settings.from_env().pg_session()
    names = ("lock_timeout", "idle_in_transaction_session_timeout", "statement_timeout",
             "idle_session_timeout", "tcp_keepalives_idle", "tcp_keepalives_count")
    seen = {}
    for role in ("request", "writer", "lease"):
        engine = make_engine(url, pg=pg, role=role)
        with engine.connect() as conn:
            seen[role] = {n: conn.execute(text(f"SHOW {n}")).scalar() for n in names}
        engine.dispose()
    assert seen["request"] == {"lock_timeout": "9500ms",
                               "idle_in_transaction_session_timeout": "30s",
                               "statement_timeout": "1min", "idle_session_timeout": "0",
                               "tcp_keepalives_idle": "5", "tcp_keepalives_count": "3"}
    assert seen["writer"]["idle_in_transaction_session_timeout"] == "2s"
    assert seen["writer"]["statement_timeout"] == "0"
    assert seen["writer"]["lock_timeout"] == "9500ms"
    assert seen["lease"]["idle_session_timeout"] == "7s"


# A real writer (SqlLedger's own append path) that stops itself with SIGSTOP right after
# its bulk insert of tree nodes and mirror rows, before it updates tree_state: the moment
# issue 27 found the server never ending (psycopg's executemany left a trailing Flush).
FREEZE_AFTER_BULK_INSERT = """
import asyncio, os, signal, sys
from ledger.store.sql import SqlLedger
from tests.records import make_record
ledger = SqlLedger(sys.argv[1])
insert_rows = ledger._insert_rows
for number in (signal.SIGCONT, signal.SIGHUP):  # said, should a test fail on a resume
    signal.signal(number, lambda n, _: print("got", signal.Signals(n).name, flush=True))

def insert_then_freeze(conn, node_rows, record_rows):
    insert_rows(conn, node_rows, record_rows)
    ledger._insert_rows = insert_rows  # once
    print("inserted", len(record_rows), flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)

ledger._insert_rows = insert_then_freeze
records = [make_record(n, tenant="frozen", padding=1000) for n in range(2000)]
outcomes = asyncio.run(ledger.append_many_async(records))  # one group
from ledger.errors import BackendError
print("refused" if all(isinstance(o, BackendError) for o in outcomes) else "committed",
      flush=True)
"""


def _rest_of_output(process: subprocess.Popen[str]) -> str:
    """What a helper said after its last read line, for a failure's message."""
    process.send_signal(signal.SIGCONT)
    try:
        output, _ = process.communicate(timeout=OVERALL_S)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    return f"the helper said afterwards: {output!r}"


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_writer_frozen_right_after_its_bulk_insert_frees_the_row_without_fencing(  # type: ignore[no-untyped-def]
        make_pg_database) -> None:
    """No integrator runs, so nobody fences: only the server's idle-in-transaction timer
    can free the row. The other writer's lock wait is bounded at that timer plus one
    second by the server itself (``lock_timeout``), so a row held longer fails the append
    with a lock timeout instead of committing; nothing here reads this machine's clock."""
    url = str(make_pg_database())
    upgrade(url)
    holder = _helper(FREEZE_AFTER_BULK_INSERT, url)
    assert holder.stdout is not None
    pg = PgSessionSettings(fence_after_s=1000.0)
    bound_s = pg.writer_idle_in_transaction_s + 1.0
    try:
        said = holder.stdout.readline().split()
        assert said == ["inserted", "2000"], said
        poll("the writer is frozen", lambda: _process_state(holder.pid) == "T", [])
        stopped = time.monotonic()
        with SqlLedger(url, pg=replace(pg, lock_timeout_s=bound_s)) as ledger:
            receipt = ledger.append(make_record(0, tenant="survivor"), timeout=OVERALL_S)
            waited = time.monotonic() - stopped
            # the frozen group's rows were rolled back
            assert receipt.leaf_index == 0, _rest_of_output(holder)
        print(f"\nappend behind a writer frozen right after its bulk insert committed after "
              f"{waited:.2f} s without fencing (idle-in-transaction timeout "
              f"{pg.writer_idle_in_transaction_s} s, lock wait bounded at {bound_s} s)")
        holder.send_signal(signal.SIGCONT)
        # Woken, the frozen writer's transaction is gone: none of its appends committed.
        said_after = holder.stdout.readline().strip()
        while said_after.startswith("got SIG"):  # its own report of this SIGCONT
            said_after = holder.stdout.readline().strip()
        assert said_after == "refused"
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    with SqlLedger(url) as ledger:
        assert ledger.tree_head()[0] == 1
        assert [row.tenant for row in ledger.iter_records()] == ["survivor"]
