"""compose.yaml follows the Compose specification and agrees with the service's settings.

The specification's JSON schema is read from the docker-compose 1.29.2 wheel that the
set-up downloads (never installed); it is the 2021 schema, which predates the top-level
``name`` key, so compose.yaml does not use it."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import yaml

from inference_wrapper.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def load() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((ROOT / "compose.yaml").read_text())  # type: ignore[no-any-return]


def compose_schema() -> dict:  # type: ignore[type-arg]
    import os
    import zipfile

    home = Path(os.environ.get("AUDIT_LEDGER_HOME", Path.home() / ".cache" / "audit-ledger"))
    wheels = sorted((home / "downloads").glob("docker_compose-1.29.2-*.whl"))
    assert wheels, "run scripts/setup.sh (it downloads the schema's carrier wheel)"
    with zipfile.ZipFile(wheels[0]) as archive:
        return json.loads(archive.read("compose/config/compose_spec.json"))  # type: ignore[no-any-return]


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    import jsonschema

    errors = [f"{list(e.path)}: {e.message}"
              for e in jsonschema.Draft7Validator(compose_schema()).iter_errors(load())]
    assert errors == []


def test_a_broken_compose_file_is_caught_by_the_schema() -> None:
    import jsonschema

    broken = load()
    broken["services"]["peer0"]["ports"] = {"7051": 7051}  # ports is a list
    assert list(jsonschema.Draft7Validator(compose_schema()).iter_errors(broken))


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
