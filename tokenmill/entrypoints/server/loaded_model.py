"""LoadedModel (one model's engine and its place in the pool) and Lease (one request's hold on it).

A lease is taken by ModelPool.acquire and released exactly once: when the answer is made, or, for a
stream, when its body ends or its client leaves (the body's generator is closed then). While any lease on a
model is held, the pool never unloads it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.responses import StreamingResponse

from tokenmill.engine.async_engine import AsyncEngine

T = TypeVar("T")


@dataclass(eq=False)
class LoadedModel:
    """One loaded model: its engine, the front ends' objects over it, and its place in the pool."""

    name: str
    async_engine: AsyncEngine
    load_seconds: float
    memory_bytes: int | None = None  # its engine's own memory plan (weights + KV); None: the served estimate
    num_active: int = 0  # requests holding a lease: running, waiting in its engine, or about to be added
    last_used: float = field(default_factory=time.monotonic)  # when its last request ended (monotonic)
    keep_alive: float | None = None  # the latest request's keep-alive (seconds; None: never unloaded)
    idle_since_wall: float | None = None  # time.time() when it became idle: its expiry is this + keep_alive
    servings: dict[str, Any] = field(default_factory=dict)  # front end key -> its serving object
    is_unloading: bool = False  # its engine is stopping: no new request gets it, and it is not listed
    _timer: asyncio.TimerHandle | None = None

    def serving(self, key: str, make: Callable[[LoadedModel], T]) -> T:
        """The front end's object over this model (`key` names it), made on first use."""
        if key not in self.servings:
            self.servings[key] = make(self)
        return self.servings[key]  # type: ignore[no-any-return]

    @property
    def expires_at(self) -> float | None:
        """time.time() when it unloads if nothing uses it meanwhile; None: never. A busy model expires
        its keep-alive after now at the earliest."""
        if self.keep_alive is None:
            return None
        start = self.idle_since_wall if self.num_active == 0 and self.idle_since_wall is not None else time.time()
        return start + self.keep_alive


class Lease:
    """One request's hold on a loaded model: while held, the model is never unloaded."""

    def __init__(self, model: LoadedModel, keep_alive: float | None, waited: float,
                 on_release: Callable[[LoadedModel, float | None], None]) -> None:
        self.model = model
        self.keep_alive = keep_alive  # this request's keep-alive, applied when it ends
        self.load_seconds = waited  # how long the request waited for the model to load (0: it was loaded)
        self._on_release = on_release  # the pool's bookkeeping: (model, keep_alive)
        self._is_released = False

    def release(self) -> None:
        if not self._is_released:
            self._is_released = True
            self._on_release(self.model, self.keep_alive)

    async def answer(self, run: Callable[[LoadedModel], Awaitable[T]]) -> T:
        """`run(model)`'s answer, the lease held until it is done (`hold`); released at once if it raises."""
        try:
            response = await run(self.model)
        except BaseException:
            self.release()
            raise
        return self.hold(response)

    def hold(self, response: T) -> T:
        """Keep the lease until `response` is done: a stream's body has ended (or its client left), any
        other answer at once."""
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._until_done(response.body_iterator)
        else:
            self.release()
        return response

    async def _until_done(self, body: AsyncIterable[Any]) -> AsyncIterator[Any]:
        try:
            async for chunk in body:
                yield chunk
        finally:
            self.release()
