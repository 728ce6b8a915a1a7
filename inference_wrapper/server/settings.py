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
    queue_limit: int = 256
    request_timeout_s: float = 120.0
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
    witnesses: str = ""  # comma-separated URL=VKEY, or a file of them (README "Witnesses")
    # Retained content (issue 12): the policy of tenants without one, the shortest period
    # a tenant may choose, how often expired content is erased, where the KEKs live.
    retention_default_mode: str = "commitments"  # or "content"
    retention_default_days: int = 183
    retention_minimum_days: int = 183  # EU AI Act Art. 19: at least six months
    retention_expiry_interval_s: float = 3600.0
    keyring_path: Path = DATA_HOME / "vault.keyring"
    kek_provider: str = ""  # "package.module:factory" of a KMS-backed KeyEncryptionKeys

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
