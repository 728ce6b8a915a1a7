"""Service settings, read once into a frozen object (units in the names)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from inference_wrapper.defaults import DATA_HOME

if TYPE_CHECKING:
    from ledger.store.sql import PgSessionSettings


@dataclass(frozen=True)
class Settings:
    database_url: str = f"sqlite:///{DATA_HOME / 'ledger.db'}"
    log_key_path: Path = DATA_HOME / "log.key"
    # The key itself (a PRIVATE+KEY line), e.g. from a secret; wins over log_key_path.
    log_signing_key: str = field(default="", repr=False)
    # Empty: the log's stored origin, or "<log_name>/<8 hex>" when the log is created.
    # Set: must equal the log's origin (a replica refuses to start otherwise).
    origin: str = ""
    log_name: str = "audit-ledger.local/log"
    # Names this replica in checkpoints.sealed_by, /readyz and /metrics (default host:pid).
    replica_id: str = ""
    # Bounded waits on PostgreSQL (see ledger.store.sql.PgSessionSettings); 0 turns off.
    pg_lock_timeout_s: float = 10.0
    pg_writer_idle_in_transaction_s: float = 2.0
    pg_idle_in_transaction_s: float = 30.0
    pg_statement_timeout_s: float = 60.0
    pg_lease_ttl_s: float = 3.0
    pg_fence_after_s: float = 2.0
    pg_keepalives_idle_s: int = 5
    pg_keepalives_interval_s: int = 2
    pg_keepalives_count: int = 3
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch: int = 32
    max_wait_ms: float = 5.0
    # One bound on outstanding work: requests waiting, generating, being recorded and
    # queued for the ledger, together. Beyond it: 503 with Retry-After.
    queue_limit: int = 256
    request_timeout_s: float = 120.0
    # A connection that has not sent a whole request head within this many seconds (also
    # an idle keep-alive connection) is closed; a body not received within
    # body_read_timeout_s is answered 408. Stalled uploads then hold nothing for long.
    header_read_timeout_s: float = 15.0
    body_read_timeout_s: float = 30.0
    # SIGTERM: requests in flight get this long to finish before the listener closes;
    # the queue drain, the last seal and the stores' close follow, each bounded too.
    shutdown_grace_s: float = 30.0
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
    # Console sessions: HMAC secret shared by every replica (empty: derived from the log's
    # signing key); proxies whose X-Forwarded-For/-Proto are believed (addresses or CIDRs).
    console_session_secret: str = field(default="", repr=False)
    trusted_proxies: str = ""
    anchor_interval_s: float = 1.0
    anchor_lag_slo_s: float = 10.0  # also the anchoring-lag SLO (README "SLOs")
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
    # SLOs (README "SLOs"): per route "ROUTE=P99_S:JITTER_S", comma-separated, where
    # jitter is p99 - p50; availability as unplanned downtime minutes per 30-day month
    # (43.2 = 99.9 %) and the longest single outage; the share of readiness samples
    # allowed over anchor_lag_slo_s; how often readiness and the SLO state are sampled.
    slo_latency: str = ("/v1/generate=2.5:2.0,/v1/completions=2.5:2.0,"
                        "/v1/chat/completions=2.5:2.0")
    slo_downtime_min_per_month: float = 43.2
    slo_max_outage_s: float = 300.0
    slo_anchor_lag_budget: float = 0.01
    slo_sample_interval_s: float = 5.0
    keyring_path: Path = DATA_HOME / "vault.keyring"
    # The log published as C2SP tlog-tiles after each seal: a directory or
    # s3://bucket/prefix (Object Lock, compliance mode, for tiles_retention_days); "" off.
    tiles_publish_to: str = ""
    # The lag rule: an append older than the newest leaf by more than this is refused
    # (ledger.window.MAX_LAG is what verifiers assume: keep it at or below that).
    max_created_lag_s: float = 300.0
    tiles_retention_days: int = 2557
    tiles_publish_interval_s: float = 5.0
    kek_provider: str = ""  # "package.module:factory" of a KMS-backed KeyEncryptionKeys

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """``AUDIT_LEDGER_<FIELD>`` environment variables, then explicit overrides."""
        values: dict[str, object] = {}
        for name, spec in cls.__dataclass_fields__.items():
            raw = os.environ.get(f"AUDIT_LEDGER_{name.upper()}")
            if raw is not None:
                kind = spec.type if isinstance(spec.type, type) else str(spec.type)
                caster = {"int": int, "float": float, "Path": Path}.get(
                    kind if isinstance(kind, str) else kind.__name__, str)
                values[name] = caster(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    def pg_session(self) -> PgSessionSettings:
        from ledger.store.sql import PgSessionSettings

        return PgSessionSettings(
            lock_timeout_s=self.pg_lock_timeout_s,
            writer_idle_in_transaction_s=self.pg_writer_idle_in_transaction_s,
            idle_in_transaction_s=self.pg_idle_in_transaction_s,
            statement_timeout_s=self.pg_statement_timeout_s,
            lease_ttl_s=self.pg_lease_ttl_s,
            fence_after_s=self.pg_fence_after_s,
            keepalives_idle_s=self.pg_keepalives_idle_s,
            keepalives_interval_s=self.pg_keepalives_interval_s,
            keepalives_count=self.pg_keepalives_count,
        )
