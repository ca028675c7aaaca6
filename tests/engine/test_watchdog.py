"""The watchdog: an engine thread that hangs while it has work is declared stalled, like a dead one.

The engine here is a stand-in whose step() blocks on an Event, so the hang is certain and the tests do not
depend on the machine's speed (torch-free, no model)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from tokenmill.engine.async_engine import AsyncEngine, EngineDeadError, EngineStalledError
from tokenmill.sampling_params import SamplingParams


class StandInEngine:
    """Takes requests and steps them; from step number `hang_at` on, step() blocks until `release` is set."""

    def __init__(self, hang_at: int | None = None, step_seconds: float = 0.0) -> None:
        self.hang_at = hang_at
        self.step_seconds = step_seconds
        self.release = threading.Event()
        self.pending: list[str] = []
        self.num_steps = 0

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams, stream: bool = False,
                    arrival_time: float | None = None) -> None:
        self.pending.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[Any]:
        self.num_steps += 1
        if self.hang_at is not None and self.num_steps >= self.hang_at:
            self.release.wait()
        time.sleep(self.step_seconds)
        return []

    def abort_request(self, request_id: str, *args: Any, **kwargs: Any) -> None:
        if request_id in self.pending:
            self.pending.remove(request_id)

    def stats(self) -> dict[str, float]:
        return {"num_running": len(self.pending)}


async def _first(async_engine: AsyncEngine, request_id: str) -> Any:
    async for out in async_engine.generate(request_id, [1, 2, 3], SamplingParams()):
        return out
    return None


def test_a_hung_step_fails_the_waiting_callers_and_marks_the_engine_dead(caplog: pytest.LogCaptureFixture) -> None:
    engine = StandInEngine(hang_at=3)
    deaths: list[BaseException] = []
    async_engine = AsyncEngine(lambda: engine, on_death=deaths.append, watchdog_timeout=0.2)  # type: ignore[arg-type,return-value]
    async_engine.wait_loaded()

    async def main() -> list[BaseException | Any]:
        return await asyncio.gather(_first(async_engine, "a"), _first(async_engine, "b"), return_exceptions=True)

    try:
        with caplog.at_level(logging.CRITICAL, logger="tokenmill.engine"):
            started = time.monotonic()
            results = asyncio.run(asyncio.wait_for(main(), 30))
            waited = time.monotonic() - started
        assert all(isinstance(r, EngineStalledError) for r in results), results
        assert isinstance(results[0], EngineDeadError)  # what callers already handle
        assert "made no progress for" in str(results[0]) and "0.2s" in str(results[0])
        assert waited >= 0.2
        assert async_engine.is_dead and isinstance(async_engine.dead_reason, EngineStalledError)
        assert len(deaths) == 1 and isinstance(deaths[0], EngineStalledError)
        assert "engine stalled" in caplog.text and "in step" in caplog.text  # the stack shows where it hangs
        with pytest.raises(EngineDeadError):  # nothing new is taken
            asyncio.run(_first(async_engine, "c"))
    finally:
        engine.release.set()
        async_engine.shutdown()
    assert not async_engine._thread.is_alive()  # it came back, saw it was given up on, and left its loop


def test_an_idle_engine_is_never_stalled() -> None:
    engine = StandInEngine(hang_at=1)  # would hang at its first step: but it has no work, so never steps
    async_engine = AsyncEngine(lambda: engine, watchdog_timeout=0.05)  # type: ignore[arg-type,return-value]
    try:
        async_engine.wait_loaded()
        time.sleep(0.6)  # the idle loop waits 0.5 s at a time, far past the timeout
        assert not async_engine.is_dead
    finally:
        engine.release.set()
        async_engine.shutdown()


def test_steps_that_keep_coming_are_progress() -> None:
    engine = StandInEngine(step_seconds=0.005)
    async_engine = AsyncEngine(lambda: engine, watchdog_timeout=5.0)  # type: ignore[arg-type,return-value]
    try:
        async_engine.wait_loaded()
        engine.add_request("busy", [1], SamplingParams())  # work that never finishes: steps forever
        async_engine._wake.set()
        deadline = time.monotonic() + 30
        while engine.num_steps < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.num_steps >= 50 and not async_engine.is_dead
    finally:
        async_engine.shutdown()


def test_the_watchdog_can_be_off_and_refuses_nonsense() -> None:
    engine = StandInEngine()
    async_engine = AsyncEngine(lambda: engine, watchdog_timeout=None)  # type: ignore[arg-type,return-value]
    async_engine.shutdown()
    with pytest.raises(ValueError, match="watchdog_timeout must be above 0"):
        AsyncEngine(lambda: engine, watchdog_timeout=0)  # type: ignore[arg-type,return-value]
