"""Property-based HTTP fuzzing of every documented route: no input gives a 5xx.

The service runs in its own process (the tiny model, a SQLite ledger) and schemathesis
generates requests from /openapi.json, valid and invalid, with a client key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from inference_wrapper.server.routes import openapi_document
from tests.live_service import start_service


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
                 ) -> Iterator[tuple[str, str]]:
    service = start_service(tmp_path_factory.mktemp("svc"), tiny_model_dir)
    yield service.base_url, service.client_token
    service.stop()


def test_no_input_gives_a_server_error(live_service: tuple[str, str]) -> None:
    # Driven by hand: schemathesis' pytest plugin does not run under pytest 9.
    base, token = live_service
    schema = schemathesis.openapi.from_dict(openapi_document())
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def exercise(case: Any) -> None:
            response = case.call(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                 timeout=60)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path}: "
                                f"{response.status_code} {case.body!r:.300}")
            elif response.status_code >= 400 and case.path != "/metrics":
                raw = {k.lower(): v for k, v in response.headers.items()}.get("content-type", "")
                kind = raw[0] if isinstance(raw, list) else raw
                if not kind.startswith("application/problem+json"):
                    failures.append(f"{case.method} {case.path}: {response.status_code} "
                                    f"with {kind}")

        exercise()
    documented = sum(len(methods) for methods in openapi_document()["paths"].values())
    assert operations == documented
    assert failures == []
