"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis): never a 5xx.

Schema-valid and schema-violating requests alike, a bounded number per route so the module stays
well under a minute. The cluster runs with small limits (8 completion tokens, 1 s image fetches)
so that valid requests are quick to answer.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from tests.e2e.cluster import start_cluster

EXAMPLES = 100


@pytest.fixture(scope="module")
def cluster(e2e_dirs):
    env = {"EPD_MAX_TOKENS_LIMIT": "8", "EPD_IMAGE_FETCH_TIMEOUT_S": "1"}
    running = start_cluster(e2e_dirs["kimi_k25"], env=env)
    yield running
    assert running.stop() == 0


def _operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


# schemathesis's pytest plugin does not run under pytest 9 yet; its strategies run under plain hypothesis.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_request_gets_a_server_error(cluster, mode):
    operations = _operations(cluster.url)
    assert any(op.path == "/v1/chat/completions" for op in operations)
    if mode == GenerationMode.NEGATIVE:  # a GET without parameters has no invalid form
        operations = [op for op in operations if op.method.upper() == "POST"]
    seen: dict[str, int] = {}
    for operation in operations:
        @given(operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def call(case):
            response = case.call(timeout=60)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (f"{case.method} {case.path} {case.body!r:.300} -> "
                                                f"{response.status_code}: {response.text[:300]}")

        call()
    assert seen.get(400 if mode == GenerationMode.NEGATIVE else 200, 0) > 10, seen  # it reached the handlers


def test_the_server_is_still_ready_after(cluster):
    assert httpx.get(f"{cluster.url}/ready", timeout=10).status_code == 200
