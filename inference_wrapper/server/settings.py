"""Service settings, read once into a frozen object (units in the names)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inference_wrapper.defaults import DATA_HOME


@dataclass(frozen=True)
class Settings:
    database_url: str = f"sqlite:///{DATA_HOME / 'ledger.db'}"
    log_key_path: Path = DATA_HOME / "log.key"
    origin: str = "audit-ledger.local/log"
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch: int = 32
    max_wait_ms: float = 5.0
    # One bound on outstanding work: requests waiting, generating, being recorded and
    # queued for the ledger, together. Beyond it: 503 with Retry-After.
    queue_limit: int = 256
    request_timeout_s: float = 120.0
    # API keys are kept in memory and reloaded this often: a key revoked (or created) by
    # another process takes effect within this many seconds.
    api_key_cache_ttl_s: float = 5.0
    # Idempotency-Key answers (with their salts) are kept this long, then purged.
    idempotency_ttl_s: float = 24 * 3600.0
    idempotency_purge_interval_s: float = 300.0
    # Log lines wait in a queue of this many; beyond it they are dropped (and counted),
    # so a stalled stdout never stalls requests.
    log_queue_capacity: int = 10_000
    max_body_bytes: int = 64 * 1024
    checkpoint_interval_s: float = 1.0
    otel_exporter: str = "none"  # "none" or "console"
    anchor_interval_s: float = 1.0
    anchor_lag_slo_s: float = 10.0
    anchor_slo_policy: str = "keep-serving"  # or "fail-closed"
    # Fabric anchoring: on when an endpoint is set (local anchoring otherwise).
    fabric_gateway_endpoint: str = ""
    fabric_mspid: str = ""
    fabric_cert_path: str = ""
    fabric_key_path: str = ""
    fabric_tls_ca_path: str = ""
    fabric_channel: str = "auditchannel"
    fabric_chaincode: str = "anchor"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """``AUDIT_LEDGER_<FIELD>`` environment variables, then explicit overrides."""
        values: dict[str, object] = {}
        for name, field in cls.__dataclass_fields__.items():
            raw = os.environ.get(f"AUDIT_LEDGER_{name.upper()}")
            if raw is not None:
                kind = field.type if isinstance(field.type, type) else str(field.type)
                caster = {"int": int, "float": float, "Path": Path}.get(
                    kind if isinstance(kind, str) else kind.__name__, str)
                values[name] = caster(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
