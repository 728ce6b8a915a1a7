"""compose.yaml runs N replicas behind a load balancer, with the log key as a secret and a
PostgreSQL connection budget that the engines' pool sizes actually respect."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ledger.store.sql import make_engine

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "compose.yaml").read_text())  # type: ignore[no-any-return]


def _pool_budget(url: str) -> int:
    """Connections one replica may open: each pool's size plus overflow, plus the lease."""
    total = 1  # the lease session (unpooled, one at a time)
    for role in ("request", "writer"):
        pool = make_engine(url, role=role).pool
        total += pool.size() + pool._max_overflow  # type: ignore[attr-defined]
    return total


def test_replicas_behind_a_load_balancer_with_the_key_as_a_secret() -> None:
    compose = _compose()
    service = compose["services"]["audit-ledger"]
    assert service["deploy"]["replicas"] >= 2
    assert "ports" not in service  # replicas cannot share a host port: the balancer has it
    assert service["secrets"] == ["log_key"] and "log_key" in compose["secrets"]
    assert service["environment"]["AUDIT_LEDGER_LOG_KEY_PATH"] == "/run/secrets/log_key"
    lb = compose["services"]["lb"]
    assert lb["image"].startswith("haproxy:") and lb["ports"] == ["8080:8080"]
    config_path = lb["volumes"][0].split(":", 1)[0]
    config = (ROOT / config_path).read_text()
    port = service["environment"]["AUDIT_LEDGER_PORT"]
    assert re.search(rf"server-template \w+ 1-(\d+) audit-ledger:{port}", config)
    assert "option httpchk GET /readyz" in config and "http-check expect status 200" in config


def test_the_postgres_connection_budget_holds() -> None:
    compose = _compose()
    command = compose["services"]["postgres"]["command"]
    max_connections = int(next(c.split("=")[1] for c in command
                               if c.startswith("max_connections=")))
    url = compose["services"]["audit-ledger"]["environment"]["AUDIT_LEDGER_DATABASE_URL"]
    per_replica = _pool_budget(url)
    config = (ROOT / "deploy" / "haproxy" / "haproxy.cfg").read_text()
    slots = int(re.search(r"server-template \w+ 1-(\d+)", config).group(1))  # type: ignore[union-attr]
    assert per_replica == 20  # the figure compose.yaml and the README state
    # Every replica the balancer can address fits, with room for operators' tools.
    assert slots * per_replica + 10 <= max_connections
    assert compose["services"]["audit-ledger"]["deploy"]["replicas"] <= slots
