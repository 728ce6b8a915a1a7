"""Freeze the lease holder behind the shipped HAProxy configuration and watch the clients.

    .venv/bin/python bench/lb_failover.py [--freeze-s 15]

Needs ``haproxy`` on PATH (a check, not a test: the project does not depend on it). Runs
two ``serve`` replicas (tiny model) on a fresh PostgreSQL database, and HAProxy with
deploy/haproxy/haproxy.cfg, its Docker DNS discovery replaced by the two loopback ports.
Eight clients send requests through HAProxy; the lease holder is frozen with SIGSTOP for
``--freeze-s`` seconds, then resumed. Prints how long clients saw no acknowledgement,
how many requests were caught on the frozen replica, and checks that every acknowledged
record is in the log.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledger.store.sql import SqlLedger  # noqa: E402
from tests.replica_cluster import (  # noqa: E402
    client_token,
    free_port,
    generate,
    launch,
    wait_ready,
)

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"


def haproxy_config(ports: list[int], listen: int) -> str:
    config = (ROOT / "deploy" / "haproxy" / "haproxy.cfg").read_text()
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p}" for i, p in enumerate(ports))
    config = re.sub(r"^\s*server-template .*$", servers, config, flags=re.M)
    config = config.replace(" resolvers docker init-addr none", "")
    return config.replace("bind :8080", f"bind 127.0.0.1:{listen}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--freeze-s", type=float, default=15.0)
    args = parser.parse_args()
    if shutil.which("haproxy") is None:
        print("haproxy is not on PATH", file=sys.stderr)
        return 2
    from inference_wrapper.engine.tiny import build_tiny_model

    name = f"audit_lb_{uuid.uuid4().hex[:12]}"
    admin = create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"{PG}/{name}"
    acks: list[tuple[float, float, str, int]] = []  # sent, acked, record id, leaf index
    hung: list[float] = []  # durations of requests that took over 2 s
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "tiny" / "tiny-llama"
        build_tiny_model(model)
        env = {"AUDIT_LEDGER_LOG_KEY_PATH": str(work / "log.key")}
        replicas = []
        for i in range(2):
            replica = launch(f"r{i}", work, model, url, env)
            wait_ready(replica)
            replicas.append(replica)
        token = client_token(replicas[0])
        listen = free_port()
        (work / "haproxy.cfg").write_text(
            haproxy_config([int(r.base_url.rsplit(":", 1)[1]) for r in replicas], listen))
        with (work / "haproxy.log").open("wb") as out:
            lb = subprocess.Popen(["haproxy", "-f", str(work / "haproxy.cfg")], stdout=out,
                                  stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{listen}"

        def client(worker: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                sent = time.monotonic()
                try:
                    status, body = generate(base, token, f"lb {worker} {n}", timeout=300)
                except OSError:
                    status, body = 0, {}
                done = time.monotonic()
                if done - sent > 2:
                    hung.append(done - sent)
                if status == 200:
                    acks.append((sent, done, str(body["record_id"]), int(body["leaf_index"])))
                else:
                    time.sleep(0.05)

        try:
            threads = [threading.Thread(target=client, args=(w,), daemon=True)
                       for w in range(8)]
            for thread in threads:
                thread.start()
            time.sleep(5)
            holder = next(r for r in replicas
                          if (r.readyz() or {}).get("replica", {}).get("holds_lease"))
            holder.process.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            time.sleep(args.freeze_s)
            holder.process.send_signal(signal.SIGCONT)
            resumed_at = time.monotonic()
            time.sleep(10)
            stop.set()
            for thread in threads:
                thread.join(timeout=300)
        finally:
            stop.set()
            lb.terminate()  # first, so that stopping the replicas is not logged as DOWN
            lb.wait()
            for replica in replicas:
                replica.process.send_signal(signal.SIGCONT)
                replica.stop()
        after = sorted(done for sent, done, _, _ in acks if sent > frozen_at)
        during = [done for sent, done, _, _ in acks if frozen_at < done < resumed_at]
        first_after = (after[0] - frozen_at) if after else float("nan")
        with SqlLedger(url) as ledger:
            stored = {row.record_id: row.leaf_index for row in ledger.iter_records()}
        lost = [a for a in acks if stored.get(a[2]) != a[3]]
        log = (work / "haproxy.log").read_text()
        down = sorted(set(re.findall(r"Server replicas/(r\d) is DOWN", log)))
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
    print(f"froze the lease holder for {args.freeze_s:.0f} s behind HAProxy: first ack of a "
          f"request sent after the freeze {first_after:.2f} s later; {len(during)} requests "
          f"acknowledged while it was frozen; {len(hung)} requests took over 2 s "
          f"(longest {max(hung, default=0):.1f} s: caught on the frozen replica); "
          f"HAProxy marked down: {down}; {len(acks)} acknowledged, {len(lost)} lost")
    return 0 if not lost else 1


if __name__ == "__main__":
    sys.exit(main())
