"""schemathesis over /openapi.json, in-process: no 5xx, and every response conforms to the schema.

The app is built around a real (small-context) engine in this process. Generated bodies get max_tokens
capped at 4 so each example costs a few engine steps; everything else is left as generated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")  # a test extra; without it this module skips
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def app_schema() -> Iterator[Any]:
    from tokenmill.config import EngineConfig
    from tokenmill.engine.async_engine import AsyncEngine
    from tokenmill.engine.llm_engine import LLMEngine
    from tokenmill.entrypoints.openai.api_server import build_app

    engine = LLMEngine(EngineConfig(max_model_len=256, kv_cache_memory=32 * 2**20, max_num_batched_tokens=256),
                       progress=False)
    async_engine = AsyncEngine(engine)
    app = build_app(async_engine, log_requests=False)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    assert not async_engine.is_dead, async_engine.dead_reason
    async_engine.shutdown()


def _cap(path: str, body: Any) -> None:
    """Keep generation short: a missing or large max_tokens becomes MAX_TOKENS (other values stay)."""
    if not isinstance(body, dict) or not path.startswith("/v1/"):
        return
    keys = ["max_tokens"] + (["max_completion_tokens"] if "chat" in path else [])
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if all(body.get(k) is None for k in keys):
        body["max_tokens"] = MAX_TOKENS


def test_openapi_conformance(app_schema: Any) -> None:
    # schemathesis' pytest plugin (from_fixture) does not work with this pytest, so each operation's
    # strategy is run with hypothesis directly
    operations = [result.ok() for result in app_schema.get_all_operations()]
    assert len(operations) == 8
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            _cap(case.path, case.body)
            case.call_and_validate(checks=CHECKS)

        check()
