"""The log's witness client: submits each new checkpoint to every configured witness.

For each witness it sends ``add-checkpoint`` with ``old`` = the size that witness last
cosigned (from the ``cosignatures`` table, 0 at first) and a consistency proof from there.
A 409 with a ``text/x.tlog.size`` body tells the witness's real size: the client retries
once from it. Each returned line is verified against the witness's pinned key before it is
stored; lines of other keys are ignored, as the spec asks.

It runs in its own thread (``WitnessWorker``), woken after each anchoring and on a timer,
so a witness that is down or slow never blocks anchoring or serving; a failing witness is
retried with exponential backoff.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ledger.cosignature import WitnessKey, add_cosignatures, valid_cosigners
from ledger.errors import BackendError, BackendUnavailableError, CheckpointFormatError
from ledger.store.log_api import CosignedLog, StoredCheckpoint
from ledger.witness_policy import SIZE_CONTENT_TYPE, AddCheckpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WitnessEndpoint:
    """A witness as the log pins it: its submission prefix and its cosigner key."""

    url: str
    key: WitnessKey

    @classmethod
    def parse(cls, text: str) -> WitnessEndpoint:
        """``URL=VKEY``; a URL may hold '=' (a query), so the split is the first '=' after
        which a valid witness vkey follows."""
        text = text.strip()
        position = text.find("=")
        while position > 0:
            try:
                key = WitnessKey.decode(text[position + 1:])
            except ValueError:
                position = text.find("=", position + 1)
                continue
            url = text[:position].rstrip("/")
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"witness URL {url!r} is not http(s)")
            return cls(url, key)
        raise ValueError(f"witness {text[:60]!r} is not URL=VKEY with a cosigner vkey")


def parse_witnesses(setting: str) -> list[WitnessEndpoint]:
    """The ``witnesses`` setting: comma-separated ``URL=VKEY``, or the path of a file
    with one ``URL=VKEY`` per line (blank lines and ``#`` comments skipped)."""
    setting = setting.strip()
    if not setting:
        return []
    if "=" not in setting and Path(setting).is_file():
        items = [line for line in Path(setting).read_text().splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    else:
        items = [item for item in setting.split(",") if item.strip()]
    endpoints = [WitnessEndpoint.parse(item) for item in items]
    names = [e.key.name for e in endpoints]
    if len(set(names)) != len(names):
        raise ValueError("two configured witnesses share a name")
    return endpoints


class WitnessRejected(BackendError):
    """A witness answered add-checkpoint with a refusal (its status is kept)."""

    def __init__(self, witness: str, status: int, reason: str) -> None:
        super().__init__(f"witness {witness} refused with HTTP {status}: {reason}")
        self.witness = witness
        self.status = status


class _Connection:
    """One kept-alive HTTP connection to a witness (the spec asks clients to reuse them);
    a connection the witness closed meanwhile is reopened once."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(url)
        self.url = url
        self._https = parts.scheme == "https"
        self._netloc = parts.netloc
        self._path = parts.path.rstrip("/") + "/add-checkpoint"
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _open(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._netloc, timeout=self._timeout_s)
        return http.client.HTTPConnection(self._netloc, timeout=self._timeout_s)

    def post(self, body: bytes) -> tuple[int, str, bytes]:
        """(status, media type, body) of POST add-checkpoint."""
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = self._open()
            try:
                self._conn.request("POST", self._path, body=body,
                                   headers={"Content-Type": "text/plain"})
                response = self._conn.getresponse()
                answer = response.read(64 * 1024)
                if not response.isclosed():  # an oversized answer: do not reuse
                    self.close()
                media = (response.getheader("Content-Type") or "").split(";")[0]
                return response.status, media.strip().lower(), answer
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2:
                    raise BackendUnavailableError(
                        f"witness {self.url} unreachable: {exc}") from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class WitnessClient:
    """Gets the ledger's latest checkpoint cosigned by each configured witness."""

    def __init__(self, ledger: CosignedLog, witnesses: Sequence[WitnessEndpoint],
                 timeout_s: float = 10.0, max_backoff_s: float = 60.0) -> None:
        self.ledger = ledger
        self.witnesses = list(witnesses)
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self._failures: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        self._connections = {w.key.name: _Connection(w.url, timeout_s) for w in witnesses}

    def close(self) -> None:
        """Close the kept-alive connections."""
        for connection in self._connections.values():
            connection.close()

    def submit(self, witness: WitnessEndpoint, checkpoint: StoredCheckpoint) -> str | None:
        """Ask ``witness`` to cosign ``checkpoint``; store and return the verified line.

        None when the witness has already cosigned a larger checkpoint of this log (this
        one can no longer be cosigned; a later, larger one will be).
        """
        name = witness.key.name
        old = self.ledger.cosignatures.latest_size(name) or 0
        for _ in range(2):  # the second try starts from the size a 409 told us
            if old > checkpoint.size:
                log.warning("witness %s has cosigned size %d, beyond our checkpoint %d",
                            name, old, checkpoint.size)
                return None
            proof = self.ledger.consistency_proof(old, checkpoint.size) if old else []
            body = AddCheckpoint(old, tuple(proof), checkpoint.note).encode()
            connection = self._connections.get(name) or _Connection(witness.url,
                                                                    self.timeout_s)
            status, content_type, answer = connection.post(body)
            if status == 200:
                return self._keep(witness, checkpoint, answer)
            if status == 409 and content_type == SIZE_CONTENT_TYPE:
                text = answer.decode("ascii", "replace")
                if text.endswith("\n") and text[:-1].isdigit():
                    old = int(text[:-1])
                    continue
            raise WitnessRejected(name, status,
                                  answer[:200].decode("utf-8", "replace").strip())
        raise WitnessRejected(name, 409, "the witness's size kept changing")

    def _keep(self, witness: WitnessEndpoint, checkpoint: StoredCheckpoint,
              answer: bytes) -> str:
        """Store the first returned line that is a valid cosignature by the pinned key."""
        text = answer.decode("utf-8", "replace")
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                continue
            try:
                found = valid_cosigners(add_cosignatures(checkpoint.note, [line]),
                                        [witness.key])
            except (ValueError, CheckpointFormatError):  # malformed: ignored like a stranger's
                continue
            if witness.key.name in found:
                self.ledger.cosignatures.store(checkpoint.size, witness.key.name, line,
                                               found[witness.key.name])
                return line
        raise WitnessRejected(witness.key.name, 200,
                              "no line of the answer is a valid cosignature by its key")

    def run_once(self) -> int:
        """Submit the latest checkpoint to every witness that has not cosigned it and is
        not backing off; returns how many new cosignatures were stored."""
        latest = self.ledger.latest_checkpoint()
        if latest is None:
            return 0
        done = self.ledger.cosignatures.cosigners(latest.size)
        stored = 0
        for witness in self.witnesses:
            name = witness.key.name
            if name in done or time.monotonic() < self._next_try.get(name, 0.0):
                continue
            try:
                if self.submit(witness, latest) is not None:
                    stored += 1
                    self._failures.pop(name, None)
                    self._next_try.pop(name, None)
                    continue
                problem = f"witness {name} is ahead of our checkpoint {latest.size}"
            except BackendError as exc:
                problem = str(exc)
            # Down, refusing, or ahead of us (a restored database?): back off, keep serving.
            failures = self._failures.get(name, 0) + 1
            self._failures[name] = failures
            delay = min(self.max_backoff_s, 0.5 * 2 ** failures)
            self._next_try[name] = time.monotonic() + delay
            log.warning("%s; next try in %.1f s", problem, delay)
        return stored


class WitnessWorker:
    """A small thread running ``WitnessClient.run_once`` on a timer and when woken."""

    def __init__(self, client: WitnessClient, interval_s: float = 1.0) -> None:
        self.client = client
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Called after a checkpoint is anchored: witness it now, not at the next tick."""
        self._wake.set()

    def start(self) -> WitnessWorker:
        self._thread = threading.Thread(target=self._loop, name="witness-client",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self.client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.client.run_once()
            except Exception:  # a database hiccup: keep witnessing on the next tick
                log.exception("witnessing failed; retrying")
