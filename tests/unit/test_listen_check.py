"""`tokenmill serve` checks that it can listen before it loads a model (which takes seconds to minutes): a bad
port, a host that is not this machine's, a port another process listens on are one line and exit 2, not a
traceback after the load."""

from __future__ import annotations

import socket

import pytest

from tokenmill import cli


def test_listen_problems_are_named() -> None:
    assert cli.listen_problem("127.0.0.1", 0) is None
    assert "is not a port number" in (cli.listen_problem("127.0.0.1", -1) or "")
    assert "is not a port number" in (cli.listen_problem("127.0.0.1", 70000) or "")
    assert "--host '999.1.1.1' is not an address to listen on" in (cli.listen_problem("999.1.1.1", 8000) or "")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        problem = cli.listen_problem("127.0.0.1", port) or ""
        assert f"cannot listen on 127.0.0.1:{port}" in problem and "another process listens there" in problem


def test_serve_refuses_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "tokenmill serve: --port 70000 is not a port number (0-65535)"

