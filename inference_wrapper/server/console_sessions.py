"""Console sessions valid on every replica, the sign-in throttle, and who the client is
behind a TLS terminator (docs/decisions/0041).

A session is a signed, stateless cookie: the key id, its scope, a CSRF token and an
expiry, with an HMAC-SHA256 under a secret every replica of one log derives alike. No
table, no stickiness: any replica opens any session. Revocation still works because
every request checks that the session's API key is not revoked.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

SESSION_LABEL = b"audit-ledger console-session/v1\n"
HSTS = "max-age=31536000"


@dataclass(frozen=True)
class Session:
    key_id: str
    tenant: str
    role: str
    scope: str | None  # the one tenant this session may read; None: every tenant
    csrf: str
    expires_at: float  # time.time() seconds


def session_secret(configured: str, sign: Callable[[bytes], bytes]) -> bytes:
    """The configured secret, else one derived from the log's signing key: Ed25519 is
    deterministic, so every replica holding that key (file or KMS) derives the same one.
    The signed label is not a checkpoint (one line), so it can never pass as one."""
    if configured:
        return hashlib.sha256(configured.encode()).digest()
    return hashlib.sha256(b"console session secret\n" + sign(SESSION_LABEL)).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionCodec:
    """Issues and opens session cookies; pure apart from the clock."""

    def __init__(self, secret: bytes, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.ttl_s, self._secret, self._clock = ttl_s, secret, clock

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()

    def issue(self, key_id: str, tenant: str, role: str,
              scope: str | None) -> tuple[str, Session]:
        session = Session(key_id, tenant, role, scope, secrets.token_urlsafe(24),
                          self._clock() + self.ttl_s)
        payload = json.dumps([session.key_id, session.tenant, session.role, session.scope,
                              session.csrf, session.expires_at]).encode()
        return f"{_b64(payload)}.{_b64(self._mac(payload))}", session

    def open(self, token: str) -> Session | None:
        """The session of a genuine, unexpired cookie; None for anything else."""
        payload_text, _, mac_text = token.partition(".")
        try:
            payload, mac = _unb64(payload_text), _unb64(mac_text)
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        key_id, tenant, role, scope, csrf, expires_at = json.loads(payload)
        if expires_at <= self._clock():
            return None
        return Session(key_id, tenant, role, scope, csrf, float(expires_at))


class SignInThrottle:
    """At most ``attempts`` failed sign-ins per client address in ``window_s`` seconds
    (per replica; a balancer spreading one client over n replicas allows n times that)."""

    def __init__(self, attempts: int = 10, window_s: float = 60.0, max_addresses: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.attempts, self.window_s, self.max_addresses = attempts, window_s, max_addresses
        self._failures: dict[str, deque[float]] = {}
        self._clock = clock

    def retry_after(self, address: str) -> float:
        """Seconds until this address may try again (0: now)."""
        failures = self._failures.get(address)
        if failures is None:
            return 0.0
        now = self._clock()
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if len(failures) < self.attempts:
            return 0.0
        return failures[0] + self.window_s - now

    def failed(self, address: str) -> None:
        if address not in self._failures and len(self._failures) >= self.max_addresses:
            self._failures.pop(next(iter(self._failures)))  # the oldest address goes
        self._failures.setdefault(address, deque()).append(self._clock())


def parse_proxies(text: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``AUDIT_LEDGER_TRUSTED_PROXIES``: addresses or networks, comma-separated."""
    return [ipaddress.ip_network(part.strip(), strict=False)
            for part in text.split(",") if part.strip()]


@dataclass(frozen=True)
class ClientView:
    address: str
    https: bool


def client_view(remote: str | None, secure: bool, headers: dict[str, str],
                proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> ClientView:
    """The client's address and whether it came over HTTPS. ``X-Forwarded-For`` and
    ``X-Forwarded-Proto`` count only when the peer is a configured proxy; then the last
    address of ``X-Forwarded-For`` (the one that proxy appended) is the client."""
    address = remote or "unknown"
    try:
        trusted = any(ipaddress.ip_address(address) in net for net in proxies)
    except ValueError:
        trusted = False
    if not trusted:
        return ClientView(address, secure)
    forwarded = [a.strip() for a in headers.get("X-Forwarded-For", "").split(",") if a.strip()]
    proto = headers.get("X-Forwarded-Proto", "").split(",")[-1].strip().lower()
    return ClientView(forwarded[-1] if forwarded else address, secure or proto == "https")
