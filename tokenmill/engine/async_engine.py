"""AsyncEngine: the LLMEngine on its own thread, fed and drained from an asyncio event loop.

The engine thread owns the LLMEngine: only it calls add_request / step / abort_request. Callers on the
event loop put commands on a queue and receive RequestOutputs on a per-request asyncio.Queue. A
cancelled caller (client disconnect) turns into an abort that the thread applies before its next step,
so the request's blocks are back in the pool within one step.

If the engine thread dies, every waiting caller gets an EngineDeadError, `is_dead` turns True and the
`on_death` callback runs (the server uses it to exit non-zero).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from tokenmill.engine.llm_engine import LLMEngine
from tokenmill.engine.request import RequestStatus
from tokenmill.outputs import RequestOutput
from tokenmill.sampling_params import SamplingParams

log = logging.getLogger("tokenmill.engine")


class EngineDeadError(RuntimeError):
    pass


class RequestFailedError(RuntimeError):
    pass


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    stream: bool
    sink: Callable[[RequestOutput | BaseException], None]
    arrival_time: float


@dataclass
class _Abort:
    request_id: str
    reason: str


class AsyncEngine:
    def __init__(self, engine: LLMEngine, on_death: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self.on_death = on_death
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._sinks: dict[str, Callable[[RequestOutput | BaseException], None]] = {}
        self._wake = threading.Event()
        self._stop = False
        self.dead_reason: BaseException | None = None
        self.num_aborted = 0
        self.step_hooks: list[Callable[[list[RequestOutput]], None]] = []  # metrics, tests
        self._thread = threading.Thread(target=self._run, name="tokenmill-engine", daemon=True)
        self._thread.start()

    # -- caller side (event loop) ----------------------------------------------------------------------
    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    @property
    def num_unfinished(self) -> int:
        return len(self._sinks)

    async def generate(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                       stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Yield this request's outputs until the finished one. Cancelling the iteration aborts it."""
        if self.is_dead:
            raise EngineDeadError(f"the engine has stopped: {self.dead_reason}")
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def sink(item: RequestOutput | BaseException) -> None:
            loop.call_soon_threadsafe(q.put_nowait, item)

        self._sinks[request_id] = sink
        self._commands.put(_Add(request_id, prompt, params, stream, sink, time.monotonic()))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id, "client went away")

    def abort(self, request_id: str, reason: str = "aborted") -> None:
        self._commands.put(_Abort(request_id, reason))
        self._wake.set()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop = True
        self._commands.put(None)
        self._wake.set()
        self._thread.join(timeout)

    # -- engine thread ---------------------------------------------------------------------------------
    def _drain_commands(self) -> None:
        eng = self.engine
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd is None:
                continue
            if isinstance(cmd, _Add):
                try:
                    eng.add_request(cmd.request_id, cmd.prompt, cmd.params, stream=cmd.stream,
                                    arrival_time=cmd.arrival_time)
                except Exception as e:  # bad input found late: fail this request alone
                    self._sinks.pop(cmd.request_id, None)
                    cmd.sink(e)
            else:
                out = eng.abort_request(cmd.request_id)
                sink = self._sinks.pop(cmd.request_id, None)
                if out is not None:
                    self.num_aborted += 1
                    for h in self.step_hooks:
                        h([out])
                    if sink is not None:
                        sink(out)

    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop:
                self._drain_commands()
                if not eng.has_unfinished_requests():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                outputs = eng.step()
                for h in self.step_hooks:
                    h(outputs)
                for out in outputs:
                    sink = self._sinks.get(out.request_id)
                    if out.finished:
                        self._sinks.pop(out.request_id, None)
                    if sink is not None:
                        sink(out)
        except BaseException as e:  # noqa: BLE001 - the engine is gone; tell everyone why
            self.dead_reason = e
            log.critical("engine loop died: %s\n%s", e, traceback.format_exc())
            err = EngineDeadError(f"the engine stopped: {type(e).__name__}: {e}")
            for sink in list(self._sinks.values()):
                sink(err)
            self._sinks.clear()
            if self.on_death is not None:
                self.on_death(e)
            return
        # orderly stop: abort what is left
        for rid in list(self._sinks):
            out = eng.abort_request(rid, RequestStatus.FINISHED_ABORTED, "server shutting down")
            sink = self._sinks.pop(rid)
            sink(out if out is not None else EngineDeadError("server shutting down"))

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()
