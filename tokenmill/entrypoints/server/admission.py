"""ServerState (the lifecycle flags the routes share) and Admission (may a new request come in?)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.engine.async_engine import AsyncEngine
from tokenmill.entrypoints.server.errors import APIError


@dataclass
class ServerState:
    """Mutable server lifecycle state shared by the routes (one per app, never module-global)."""

    is_ready: bool = False  # the engine is loaded and the app is serving
    is_draining: bool = False  # shutting down: admit nothing new
    in_flight: set[str] = field(default_factory=set)  # engine request ids being served


class Admission:
    """The one admission rule for every front end: 503 while draining, after engine death (or a stall),
    or when `max_waiting_requests` requests already wait."""

    def __init__(self, async_engine: AsyncEngine, state: ServerState, max_waiting_requests: int | None) -> None:
        self.async_engine = async_engine
        self.state = state
        self.max_waiting_requests = max_waiting_requests

    def check(self) -> None:
        """Raise a 503 APIError unless a new request may be admitted now."""
        if self.state.is_draining:
            raise APIError(503, "the server is shutting down and admits no new requests")
        if self.async_engine.is_dead:
            raise APIError(503, f"the engine has stopped: {self.async_engine.dead_reason}")
        if self.max_waiting_requests is not None:
            # requests the engine holds but is not running yet (n > 1 counts once per request)
            num_waiting = self.async_engine.num_unfinished - self.async_engine.engine.stats()["num_running"]
            if num_waiting >= self.max_waiting_requests:
                raise APIError(503, f"too many requests are waiting ({num_waiting}); retry shortly",
                               headers={"Retry-After": "1"})
