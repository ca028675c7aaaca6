"""One shared `tokenmill serve` process (with an API key) for the server tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from server_process import ServerProcess

API_KEY = "test-key"


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--api-key", API_KEY).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.output()
