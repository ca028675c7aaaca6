"""schemathesis over the whole /openapi.json, in-process: no 5xx, every response conforms to the schema, and
every 4xx is in OpenAI's error shape.

The app is built around a real (small-context) engine in this process, the session's `small_llm`. Each
operation is fuzzed with valid inputs (positive mode) and, where it takes a body, invalid ones (negative
mode). Generated bodies get max_tokens capped at 4 so each example costs a few engine steps; everything else
is left as generated.
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

MAX_TOKENS = 4


@schemathesis.check
def openai_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx body is `{"error": {"message": str, "type": str, "param": str | null, "code": <status>}}`."""
    if not 400 <= response.status_code < 500:
        return None
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] == response.status_code, err
    return True


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          openai_error_shape]


@pytest.fixture(scope="module")
def app_schema(small_llm: Any) -> Iterator[Any]:
    from tokenmill.engine.async_engine import AsyncEngine
    from tokenmill.entrypoints.openai.api_server import build_app

    async_engine = AsyncEngine(small_llm.engine)  # the session's small engine: max_model_len 256
    app = build_app(async_engine, log_requests=False)
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    assert not async_engine.is_dead, async_engine.dead_reason
    async_engine.shutdown()


def _cap(path: str, body: Any) -> None:
    """Keep generation short: a missing or large max_tokens becomes MAX_TOKENS (other values stay)."""
    if not isinstance(body, dict) or not path.startswith("/v1/"):
        return
    keys = (["max_output_tokens"] if path.endswith("/responses") else
            ["max_tokens"] + (["max_completion_tokens"] if "chat" in path else []))
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if all(body.get(k) is None for k in keys):
        body[keys[0]] = MAX_TOKENS


def test_openapi_conformance(app_schema: Any) -> None:
    # schemathesis' pytest plugin (from_fixture) does not work with this pytest, so each operation's
    # strategy is run with hypothesis directly
    operations = [result.ok() for result in app_schema.get_all_operations()]
    assert len(operations) == 10
    num_4xx = 0
    for operation in operations:
        modes = [(schemathesis.GenerationMode.POSITIVE, 40)]
        if operation.body:  # only a body can be made invalid here
            modes.append((schemathesis.GenerationMode.NEGATIVE, 25))
        for mode, num_examples in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=num_examples, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None)
            def check(case: schemathesis.Case) -> None:
                nonlocal num_4xx
                _cap(case.path, case.body)
                response = case.call_and_validate(checks=CHECKS)
                num_4xx += 400 <= response.status_code < 500

            check()
    assert num_4xx >= 20  # the negative examples did reach the validators
