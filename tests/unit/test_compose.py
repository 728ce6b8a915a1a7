"""compose.yaml is consistent with itself and with the service's settings.

(The Compose specification's JSON schema is not available offline on these machines,
so this checks the file's own references instead: services, volumes, settings.)"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import yaml

from inference_wrapper.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def load() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "compose.yaml").read_text())  # type: ignore[no-any-return]


def test_the_production_services_are_there() -> None:
    services = load()["services"]
    assert {"postgres", "orderer", "peer0", "anchor-chaincode", "audit-ledger", "tools"} <= set(
        services)
    assert services["peer0"]["environment"]["CORE_PEER_GATEWAY_ENABLED"] == "true"
    assert services["orderer"]["environment"]["ORDERER_GENERAL_TLS_ENABLED"] == "true"


def test_references_resolve() -> None:
    compose = load()
    services, volumes = compose["services"], set(compose["volumes"])
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            if not source.startswith("."):
                assert source in volumes, f"{name} mounts undeclared volume {source}"
            else:
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


def test_service_environment_names_real_settings() -> None:
    env = load()["services"]["audit-ledger"]["environment"]
    known = {f"AUDIT_LEDGER_{f.name.upper()}" for f in fields(Settings)}
    assert set(env) <= known, set(env) - known
    assert env["AUDIT_LEDGER_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["AUDIT_LEDGER_FABRIC_GATEWAY_ENDPOINT"] == "peer0:7051"
