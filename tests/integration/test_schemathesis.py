"""Property-based HTTP fuzzing of every documented route: no input gives a 5xx, and every
answer conforms to the document (status, content type and body schema, 2xx included).

The service runs in its own process (the tiny model, a SQLite ledger) and schemathesis
generates requests, valid (positive) and invalid (negative), from the /openapi.json it
serves (which names the served model, so valid generate requests are among them) with a
client key.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.live_service import LiveService, start_service

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
GENERATE_PATHS = ("/v1/generate", "/v1/completions", "/v1/chat/completions")


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
                 ) -> Iterator[LiveService]:
    service = start_service(tmp_path_factory.mktemp("svc"), tiny_model_dir)
    yield service
    service.stop()


def test_every_answer_conforms_and_none_is_a_server_error(live_service: LiveService) -> None:
    # Driven by hand: schemathesis' pytest plugin does not run under pytest 9.
    base, token = live_service.base_url, live_service.client_token
    with urllib.request.urlopen(f"{base}/openapi.json", timeout=30) as response:
        document = json.load(response)
    schema = schemathesis.openapi.from_dict(document)
    failures: list[str] = []
    statuses: Counter[tuple[str, int]] = Counter()
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        definition = operation.definition.raw
        modes = [GenerationMode.POSITIVE]
        if "parameters" in definition or "requestBody" in definition:
            modes.append(GenerationMode.NEGATIVE)  # invalid input, by the document's rules
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=40, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def exercise(case: Any) -> None:
                response = case.call(base_url=base,
                                     headers={"Authorization": f"Bearer {token}"}, timeout=120)
                statuses[(case.path, response.status_code)] += 1
                try:
                    case.validate_response(response, checks=CHECKS)
                except FailureGroup as exc:  # one group of failures per case
                    failures.append(f"{case.method} {case.formatted_path} -> "
                                    f"{response.status_code}: {exc!s:.600} "
                                    f"body={case.body!r:.200}")

            exercise()
    documented = sum(len(methods) for methods in document["paths"].values())
    assert operations == documented == 23
    print("statuses per route:", sorted(statuses.items()))
    assert failures == [], "\n".join(failures[:10])
    assert not [k for k in statuses if k[1] >= 500], statuses
    for path in GENERATE_PATHS:  # valid generates were reached, not only refusals
        assert statuses[(path, 200)] > 0, sorted(statuses.items())
