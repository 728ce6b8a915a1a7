"""Anchoring lag: seal -> covered by a committed Fabric anchor, at a steady request rate.

    .venv/bin/python bench/bench_anchor.py [--seconds 30] [--rate 100] [--compare-polling]

Records are appended at a steady ``--rate`` per second (one writer thread, paced by the
clock); the integrator seals a checkpoint every second; the anchoring worker anchors the
newest checkpoint through the Fabric Gateway client. For every sealed checkpoint the lag is
the time from its seal to the moment an anchor of at least its size was committed on the
channel and recorded in the anchor store. Prints p50 / p90 / p99 / max.

Against the PEER DOUBLE by default (tests/fabric/peer_double.py, running the real chaincode,
its orderer modelled by a 250 ms batch timeout like deploy/fabric/configtx.yaml); against a
real network when FABRIC_GATEWAY_ENDPOINT, FABRIC_MSPID, FABRIC_CERT, FABRIC_KEY (and
FABRIC_TLS_CA, FABRIC_CHANNEL, FABRIC_CHAINCODE) are set, e.g. after
`deploy/fabric/native.sh up` by `. .fabric-native/env`. The first line says which.

``--compare-polling`` runs the same load a second time with the worker NOT woken by the
integrator (it polls every second, as before) and prints the two side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ledger.anchor.fabric import FabricAnchor, FabricGateway, Identity  # noqa: E402
from ledger.anchor.worker import AnchorWorker  # noqa: E402
from ledger.record import build_record  # noqa: E402
from ledger.store.anchors import SqlAnchorStore  # noqa: E402
from ledger.store.integrator import Integrator  # noqa: E402
from ledger.store.keys import load_or_create_signer  # noqa: E402
from ledger.store.log_api import AnchoredCheckpoint, StoredCheckpoint  # noqa: E402
from ledger.store.migrate import upgrade  # noqa: E402
from ledger.store.sql import SqlLedger  # noqa: E402

NEEDED = ("FABRIC_GATEWAY_ENDPOINT", "FABRIC_MSPID", "FABRIC_CERT", "FABRIC_KEY")


class TimedStore(SqlAnchorStore):
    """The SQL store, noting when each anchor was recorded (monotonic clock)."""

    def __init__(self, ledger: SqlLedger) -> None:
        super().__init__(ledger)
        self.recorded: list[tuple[int, float]] = []

    def record(self, size: int, note: bytes, kind: str, ref: str) -> AnchoredCheckpoint:
        stored = super().record(size, note, kind, ref)
        self.recorded.append((size, time.monotonic()))
        return stored


def real_gateway(stack: ExitStack) -> tuple[FabricGateway, str]:
    env = os.environ
    gateway = FabricGateway(
        env["FABRIC_GATEWAY_ENDPOINT"],
        Identity.from_files(env["FABRIC_MSPID"], Path(env["FABRIC_CERT"]),
                            Path(env["FABRIC_KEY"])),
        env.get("FABRIC_CHANNEL", "auditchannel"), env.get("FABRIC_CHAINCODE", "anchor"),
        tls_ca=Path(env["FABRIC_TLS_CA"]) if env.get("FABRIC_TLS_CA") else None)
    stack.callback(gateway.close)
    return gateway, f"a REAL Fabric network at {env['FABRIC_GATEWAY_ENDPOINT']}"


def double_gateway(stack: ExitStack, directory: Path, batch_timeout_s: float
                   ) -> tuple[FabricGateway, str]:
    from tests.fabric.conftest import CHAINCODE, CHANNEL, make_identity, new_double

    double = new_double(directory, batch_timeout_s=batch_timeout_s).start()
    stack.callback(double.stop)
    client = make_identity(directory, "client")
    gateway = FabricGateway(double.endpoint, client, CHANNEL, CHAINCODE)
    stack.callback(gateway.close)
    return gateway, (f"the PEER DOUBLE (not a real network), orderer batch timeout "
                     f"{batch_timeout_s * 1000:.0f} ms")


def run(gateway: FabricGateway, directory: Path, seconds: float, rate: float,
        wake: bool, tag: str) -> list[float]:
    url = f"sqlite:///{directory / f'bench-{tag}.db'}"
    upgrade(url)
    origin = f"bench-anchor-{tag}-{os.getpid()}.audit-ledger/log"
    signer = load_or_create_signer(directory / f"{tag}.key", origin)
    sealed: list[tuple[int, float]] = []
    with SqlLedger(url) as ledger:
        store = TimedStore(ledger)
        anchor = FabricAnchor(ledger, gateway, signer.verifier(), origin, store)
        worker = AnchorWorker(ledger, anchor, interval_s=1.0, store=store)
        integrator = Integrator(ledger, signer, origin, interval_s=1.0)

        def on_seal(checkpoint: StoredCheckpoint) -> None:
            sealed.append((checkpoint.size, time.monotonic()))

        integrator.subscribe(on_seal)
        if wake:
            integrator.subscribe(worker.wake)
        worker.run_once()  # registers the log (InitLog) before the clock starts
        worker.start()
        integrator.start()
        stop = threading.Event()

        def writer() -> None:
            start, sent = time.monotonic(), 0
            while not stop.is_set():
                due = start + sent / rate
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                ledger.append(build_record(
                    tenant="bench", model={"name": "m", "digest": "sha256:" + "a" * 64},
                    hardware={"accelerator": "none"}, software={"service": {"git_revision": "x"}},
                    data={"input_commitment": f"sha256:{sent:064x}", "pad": "p" * 600},
                    timings_ms={"forward": 1.0}))
                sent += 1

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        time.sleep(seconds)  # the load runs for this long (a bench, not a test)
        stop.set()
        thread.join()
        integrator.stop()
        last = max(size for size, _ in sealed) if sealed else 0
        deadline = time.monotonic() + 60
        while (not store.recorded or store.recorded[-1][0] < last) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.stop()
        recorded = list(store.recorded)
    lags = []
    for size, at in sealed:
        covered = [t for s, t in recorded if s >= size]
        if covered:
            lags.append(min(covered) - at)
    return lags


def summary(lags: list[float]) -> dict[str, float]:
    ordered = sorted(lags)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]

    return {"n": len(ordered), "p50": statistics.median(ordered), "p90": pct(0.90),
            "p99": pct(0.99), "max": ordered[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0, help="appends per second")
    parser.add_argument("--batch-timeout-ms", type=float, default=250.0,
                        help="the double's orderer batch timeout")
    parser.add_argument("--compare-polling", action="store_true")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if all(os.environ.get(name) for name in NEEDED):
            gateway, target = real_gateway(stack)
        else:
            gateway, target = double_gateway(stack, directory, args.batch_timeout_ms / 1000)
        print(f"target: {target}; load {args.rate:.0f} appends/s for {args.seconds:.0f} s, "
              "a checkpoint sealed every 1 s")
        modes: list[tuple[str, bool]] = [("woken by each seal", True)]
        if args.compare_polling:
            modes.append(("polling every 1 s", False))
        results: dict[str, dict[str, float]] = {}
        for name, wake in modes:
            lags = run(gateway, directory, args.seconds, args.rate, wake,
                       "wake" if wake else "poll")
            results[name] = summary(lags)
        print(f"{'seal -> committed anchor':28} {'n':>5} {'p50 s':>7} {'p90 s':>7} "
              f"{'p99 s':>7} {'max s':>7}")
        for name, row in results.items():
            print(f"{name:28} {row['n']:5.0f} {row['p50']:7.3f} {row['p90']:7.3f} "
                  f"{row['p99']:7.3f} {row['max']:7.3f}")
        if len(results) == 2:
            woken, polled = results.values()
            print(f"polling / woken: p50 x{polled['p50'] / woken['p50']:.2f}, "
                  f"p99 x{polled['p99'] / woken['p99']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
