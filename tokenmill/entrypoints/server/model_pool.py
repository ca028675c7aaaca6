"""ModelPool: the models one server serves, each with its own engine, loaded on first use and unloaded
after its keep-alive.

    served   name -> ServedModel (how to load it, its memory from the plan)        fixed at start
    loaded   name -> LoadedModel (its AsyncEngine, the front ends' serving objects, requests in use, expiry)

    lease = await pool.acquire(requested, keep_alive)   the model, loaded first if it is not (the request
                                                       waits; every other model keeps serving)
    return lease.hold(response)                         released when the answer (or its stream) ends
                                                       (loaded_model.py: LoadedModel, Lease)

Rules, each kept in one place here:
- One load per model: concurrent first requests wait on that model's lock and share the load. The engine
  is built on its own engine thread (AsyncEngine), awaited from a worker thread: the event loop never blocks.
- Memory: the loaded and loading models' `memory_bytes` stay within `budget_bytes`. For a model that does
  not fit, idle models (no request running or waiting) are unloaded, least recently used first; if that
  cannot make room, ModelMemoryError says the numbers. A model in use is never unloaded.
- Keep-alive: when a model's last request ends, the keep-alive of that request (else the server's) starts:
  0 unloads it at once, None never, else a timer that the next request cancels.
- Unload: the engine thread stops, every reference goes, gc runs and glibc's malloc_trim(0) hands the freed
  heap back to the system, so the process's RSS falls by about the model's size. If something outside the
  pool still holds the engine then (a request's last frame), the pool looks again, with growing pauses for
  about two minutes, and trims once it is gone; either way it trims again a few times in the next seconds
  (memory freed later, by another thread, and never trimmed would stay in the heap).

Everything here runs on the event loop (no await between a check and what it decides), except the engine
builds and stops, which run on worker threads.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from tokenmill.config import EngineConfig, format_size
from tokenmill.engine.async_engine import AsyncEngine
from tokenmill.entrypoints.server.errors import APIError
from tokenmill.entrypoints.server.loaded_model import Lease, LoadedModel
from tokenmill.entrypoints.server.served_model import ServedModel
from tokenmill.memory_plan import RUNTIME_BYTES
from tokenmill.heap import trim

log = logging.getLogger("tokenmill.server")
EngineFactory = Callable[[EngineConfig], AsyncEngine]  # a new (loading) engine for a config


class ServerKeepAlive:
    """The type of SERVER_KEEP_ALIVE: a request that gives no keep-alive gets the server's."""


SERVER_KEEP_ALIVE = ServerKeepAlive()


class UnknownModelError(LookupError):
    """No served model has that name; each front end answers it in its own words (a 404)."""

    def __init__(self, requested: str, served: list[str]) -> None:
        super().__init__(f"model {requested!r} is not served (served: {', '.join(served)})")
        self.requested = requested
        self.served = served


class ModelMemoryError(RuntimeError):
    """A model does not fit in the models' memory budget and nothing idle can be unloaded to make room."""


class ModelLoadError(RuntimeError):
    """Loading a model failed (a bad file, settings the memory plan refuses, ...)."""


class ModelPool:
    def __init__(self, served: Iterable[ServedModel], *, default: str | None = None, budget_bytes: int | None,
                 keep_alive: float | None, make_engine: EngineFactory | None = None,
                 served_lazily: dict[str, Callable[[], ServedModel]] | None = None,
                 aliases: set[str] | None = None) -> None:
        """`served`: the models, the first the default unless `default` names another; `budget_bytes`: what
        the loaded models may take together (None: no limit); `keep_alive`: seconds an idle model stays (None: never) unless
        a request says otherwise; `make_engine`: a new engine for a config (default: a plain AsyncEngine
        that builds its LLMEngine on its own thread)."""
        # a model handed in already loaded (of_engine) is described from its engine when first asked
        self._served: dict[str, ServedModel | Callable[[], ServedModel]] = {}
        self._aliases: dict[str, str] = {}  # every accepted name -> the served name
        for s in served:
            self._served[s.name] = s
            for alias in s.aliases:
                self._aliases.setdefault(alias, s.name)
        for name, describe in (served_lazily or {}).items():  # (of_engine's one model)
            self._served[name] = describe
            self._aliases.update(dict.fromkeys(aliases or {name}, name))
        if not self._served:
            raise ValueError("a server needs at least one model")
        self.default_name = default if default is not None else next(iter(self._served))
        if self.default_name not in self._served:
            raise ValueError(f"--default-model {default!r} is not one of the served models "
                             f"({', '.join(self._served)})")
        self.budget_bytes = budget_bytes
        self.keep_alive = keep_alive
        self._make_engine = make_engine or _plain_engine
        self._loaded: dict[str, LoadedModel] = {}
        self._locks = {name: asyncio.Lock() for name in self._served}
        self._placing = asyncio.Lock()  # one memory decision (and its unloads) at a time
        self._reserved: dict[str, int] = {}  # models being loaded -> their bytes
        self._on_load: list[Callable[[LoadedModel], None]] = []
        self._late_releases: set[asyncio.Task[None]] = set()  # unloads still looking, or trimming again

    @classmethod
    def of_engine(cls, async_engine: AsyncEngine, name: str, keep_alive: float | None = None,
                  make_engine: EngineFactory | None = None, extra_names: Iterable[str] = ()) -> ModelPool:
        """A pool of the one model `async_engine` runs, loaded already (kept unless a request says otherwise;
        no budget: it is the only one). `make_engine` builds it again after an unload; `extra_names`: more
        names requests may use for it."""
        engine = async_engine.engine
        pool = cls([], budget_bytes=None, keep_alive=keep_alive, default=name, make_engine=make_engine,
                   served_lazily={name: lambda: ServedModel.of_engine(name, engine)},
                   aliases={name, engine.model_name, *extra_names})
        pool.adopt(name, async_engine)
        return pool

    # -- what is served ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._served)

    def served(self, name: str) -> ServedModel:
        entry = self._served[name]
        if not isinstance(entry, ServedModel):
            entry = self._served[name] = entry()
        return entry

    def resolve(self, requested: str | None) -> str:
        """The served name a request's `model` means: none or "" is the default; a name with or without
        Ollama's `:latest` tag. Raises UnknownModelError."""
        if not requested:
            return self.default_name
        for candidate in (requested, requested.removesuffix(":latest"), f"{requested}:latest"):
            if candidate in self._aliases:
                return self._aliases[candidate]
        raise UnknownModelError(requested, self.names)

    @property
    def loaded(self) -> list[LoadedModel]:
        """The loaded models (not those being unloaded)."""
        return [m for m in self._loaded.values() if not m.is_unloading]

    def loaded_model(self, name: str) -> LoadedModel | None:
        model = self._loaded.get(name)
        return model if model is not None and not model.is_unloading else None

    def on_load(self, callback: Callable[[LoadedModel], None]) -> None:
        """Run `callback` for every model loaded now and every model loaded later (metrics hooks, ...)."""
        self._on_load.append(callback)
        for model in self._loaded.values():
            callback(model)

    # -- requests ------------------------------------------------------------------------------------
    async def acquire(self, requested: str | None,
                      keep_alive: float | None | ServerKeepAlive = SERVER_KEEP_ALIVE) -> Lease:
        """The model `requested` names, loaded, held for one request. `keep_alive`: seconds it stays once
        idle, None never (default: the server's). Raises UnknownModelError, ModelMemoryError, ModelLoadError."""
        name = self.resolve(requested)
        ka = self.keep_alive if isinstance(keep_alive, ServerKeepAlive) else keep_alive
        model = self.loaded_model(name)
        waited = 0.0
        if model is None:  # not loaded, or being unloaded (which holds the lock until it is gone)
            started = time.monotonic()
            async with self._locks[name]:
                model = self.loaded_model(name)
                if model is None:
                    model = await self._load(name)
            waited = time.monotonic() - started
        model.num_active += 1  # no await since the lookup: it cannot have been unloaded in between
        model.keep_alive = ka
        if model._timer is not None:
            model._timer.cancel()
            model._timer = None
        return Lease(model, ka, waited, self._release)

    async def lease(self, requested: str | None, not_found: Callable[[UnknownModelError], APIError],
                    keep_alive: float | None | ServerKeepAlive = SERVER_KEEP_ALIVE) -> Lease:
        """`acquire` for a route: an unknown model is the front end's `not_found` error, no room a 503 with
        the numbers, a failed load a 500 saying why (each in the path's error shape)."""
        try:
            return await self.acquire(requested, keep_alive)
        except UnknownModelError as e:
            raise not_found(e) from None
        except ModelMemoryError as e:
            raise APIError(503, str(e), "model", headers={"Retry-After": "5"}) from None
        except ModelLoadError as e:
            raise APIError(500, str(e), "model") from None

    def accepts(self, name: str) -> Callable[[str], bool]:
        """Whether a requested name means served model `name` (for a front end's own name checks)."""
        def check(requested: str) -> bool:
            try:
                return self.resolve(requested) == name
            except UnknownModelError:
                return False
        return check

    def _release(self, model: LoadedModel, keep_alive: float | None) -> None:
        model.num_active -= 1
        model.last_used = time.monotonic()
        model.keep_alive = keep_alive
        if model.num_active == 0 and self.loaded_model(model.name) is model:
            self._start_keep_alive(model)

    def _start_keep_alive(self, model: LoadedModel) -> None:
        """`model` is idle from now: unload it after its keep-alive (at once for 0; never for None)."""
        model.idle_since_wall = time.time()
        if model.keep_alive is None:
            return
        loop = asyncio.get_running_loop()
        model._timer = loop.call_later(model.keep_alive, lambda: loop.create_task(self._expire(model)))

    async def _expire(self, model: LoadedModel) -> None:
        if model.num_active == 0 and model._timer is not None:
            model._timer = None
            await self.unload(model, "its keep-alive ended")

    # -- loading and unloading -----------------------------------------------------------------------
    def adopt(self, name: str, async_engine: AsyncEngine, load_seconds: float = 0.0,
              memory_bytes: int | None = None) -> LoadedModel:
        """Take `async_engine` (built already) as the loaded engine of served model `name`; `memory_bytes`:
        what its engine's plan says it takes (None: the served model's estimate)."""
        model = LoadedModel(name, async_engine, load_seconds, memory_bytes, keep_alive=self.keep_alive)
        self._loaded[name] = model
        for callback in self._on_load:
            callback(model)
        if model.keep_alive is None:
            model.idle_since_wall = time.time()
        else:  # a timer needs the event loop: a pool that unloads is used from one
            self._start_keep_alive(model)
        return model

    async def _load(self, name: str) -> LoadedModel:
        served = self.served(name)
        async with self._placing:
            while True:  # each unload awaits: what is idle and what fits are decided again after it
                victim = self._first_victim(served)
                if victim is None:
                    break
                if victim.is_unloading:  # on its way out already: wait until its memory is free
                    async with self._locks[victim.name]:
                        pass
                else:
                    await self.unload(victim, f"{name} needs its memory")
            self._reserved[name] = served.memory_bytes
        started = time.monotonic()
        try:
            async_engine = await asyncio.to_thread(self._start, served)
        finally:
            del self._reserved[name]
        plan = async_engine.engine.plan  # the engine's own arithmetic, now that it has run it
        model = self.adopt(name, async_engine, time.monotonic() - started, plan.total_bytes - RUNTIME_BYTES)
        log.info("model %s loaded in %.1fs (%s; %s in use by %d models, budget %s)", name, model.load_seconds,
                 format_size(served.memory_bytes), format_size(self._bytes_in_use()), len(self._loaded),
                 "none" if self.budget_bytes is None else format_size(self.budget_bytes))
        return model

    def _start(self, served: ServedModel) -> AsyncEngine:
        """Build the engine (worker thread): returns once it is loaded; a failure is a ModelLoadError."""
        async_engine = self._make_engine(served.engine_config)
        try:
            async_engine.wait_loaded()
        except Exception as e:  # noqa: BLE001 - say which model and why
            async_engine.shutdown(timeout=1.0)
            raise ModelLoadError(f"model {served.name!r} could not be loaded: {type(e).__name__}: {e}") from e
        return async_engine

    def _memory_of(self, model: LoadedModel) -> int:
        return model.memory_bytes if model.memory_bytes is not None else self.served(model.name).memory_bytes

    def _bytes_in_use(self) -> int:
        return sum(self._memory_of(m) for m in self._loaded.values()) + sum(self._reserved.values())

    def _first_victim(self, served: ServedModel) -> LoadedModel | None:
        """The idle model to unload first so that `served` fits (one being unloaded already, else the least
        recently used); None when it fits already. Raises ModelMemoryError when unloading every idle model
        would not be enough."""
        need, used = served.memory_bytes, self._bytes_in_use()
        if self.budget_bytes is None or used + need <= self.budget_bytes:
            return None
        idle = sorted((m for m in self._loaded.values() if m.num_active == 0),
                      key=lambda m: (not m.is_unloading, m.last_used))
        freeable = sum(self._memory_of(m) for m in idle)
        if used - freeable + need > self.budget_bytes:
            raise ModelMemoryError(self._no_room_message(served))
        return idle[0]

    def _no_room_message(self, served: ServedModel) -> str:
        assert self.budget_bytes is not None
        held = [f"{m.name} {format_size(self._memory_of(m))} "
                + ("unloading" if m.is_unloading else f"busy ({_requests(m.num_active)})" if m.num_active else "idle")
                for m in self._loaded.values()]
        held += [f"{n} {format_size(b)} loading" for n, b in self._reserved.items()]
        if served.memory_bytes > self.budget_bytes:
            why = "it can never fit: raise --models-memory, or lower its --kv-cache-memory"
        else:
            why = "the models in use cannot be unloaded while they serve requests: retry when they finish"
        return (f"model {served.name!r} needs {format_size(served.memory_bytes)} (weights and KV cache, by the memory "
                f"plan) but the models' budget is {format_size(self.budget_bytes)} (--models-memory) with "
                f"{format_size(self._bytes_in_use())} in use: {'; '.join(held) or 'nothing loaded'}. {why}")

    async def unload(self, model: LoadedModel, reason: str) -> bool:
        """Unload an idle model (False, nothing done, if it is in use or not loaded). Its memory counts as
        in use until it is freed; a request for it meanwhile waits, then loads it again."""
        if self.loaded_model(model.name) is not model or model.num_active:
            return False
        self.served(model.name)  # described while its engine is there (of_engine's model), to load it again
        model.is_unloading = True
        if model._timer is not None:
            model._timer.cancel()
            model._timer = None
        async with self._locks[model.name]:
            async_engine = model.async_engine
            held = _Held(async_engine)
            model.servings.clear()
            del model.async_engine  # nothing of the engine stays reachable from the pool
            await asyncio.to_thread(_stop_engine, async_engine)
            del async_engine
            await asyncio.to_thread(_release_memory)
            del self._loaded[model.name]
        log.info("model %s unloaded: %s", model.name, reason)
        # if something outside the pool (a request's last frame, say) still holds the engine, its memory is
        # freed when that goes, and given back to the system then, not left in the heap; and even once the
        # engine is gone, other threads may free what it held a moment later: trimmed again (_LATE_TRIMS_S)
        task = asyncio.get_running_loop().create_task(_release_when_gone(model.name, held))
        self._late_releases.add(task)
        task.add_done_callback(self._late_releases.discard)
        return True

    # -- the process ---------------------------------------------------------------------------------
    def abort(self, request_id: str, reason: str) -> None:
        """Abort `request_id` in whichever loaded engine runs it (the others ignore an unknown id)."""
        for model in self.loaded:
            model.async_engine.abort(request_id, reason)

    def dead_engine(self) -> AsyncEngine | None:
        """A loaded engine that has died or stalled, if any."""
        return next((m.async_engine for m in self.loaded if m.async_engine.is_dead), None)

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop every loaded engine (the process is ending); True if every thread ended within `timeout`. Called
        on the event loop: the unloads' late looks and trims still pending are cancelled."""
        for task in list(self._late_releases):
            task.cancel()
        is_clean = True
        for model in self.loaded:
            is_clean = model.async_engine.shutdown(timeout=timeout) and is_clean
        return is_clean


def _requests(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


def _plain_engine(config: EngineConfig) -> AsyncEngine:
    from tokenmill.engine.llm_engine import LLMEngine

    return AsyncEngine(lambda: LLMEngine(config, False))


def _stop_engine(async_engine: AsyncEngine) -> None:
    if not async_engine.shutdown(timeout=30.0):
        log.warning("an unloaded model's engine thread is still inside a step; its memory is freed when it ends")


class _Held:
    """Weak references to an engine and to its model (what holds the weights): alive while either is."""

    def __init__(self, async_engine: AsyncEngine) -> None:
        engine = getattr(async_engine, "engine", None)  # None: it never built one
        model = getattr(getattr(getattr(engine, "executor", None), "worker", None), "model", None)
        self.refs = [weakref.ref(o) for o in (engine, model) if o is not None]

    def alive(self) -> list[Any]:
        return [o for o in (r() for r in self.refs) if o is not None]


# how long after an unload the pool looks again for an engine that something else still held (seconds
# between looks, ~2 minutes in all): each look collects garbage and trims the heap once the engine is gone
_LATE_LOOKS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# and after that, trims again (seconds between): with the engine and its model gone at the unload's trim,
# the weights of a `tokenmill serve` at fp32 were still in the heap in 2 of 16 unloads, freed a moment after
# by another thread, and given back only by a trim 0.5 s later (AMX Xeon, 2026-12-06); untrimmed, they stayed
_LATE_TRIMS_S = (0.25, 1.0, 4.0)


async def _release_when_gone(name: str, held: _Held) -> None:
    """Give an unloaded model's memory back once its engine and model are gone (at once, or once whatever
    held them past the unload lets go), then trim again a few times for memory other threads free late."""
    start = time.monotonic()
    was_held = bool(held.alive())
    for delay in _LATE_LOOKS_S:
        await asyncio.sleep(delay)
        if held.alive():
            await asyncio.to_thread(gc.collect)  # a reference cycle may be all that holds them
        if not held.alive():  # what they held may still wait for gc (the modules form cycles): release
            await asyncio.to_thread(_release_memory)
            if was_held:
                log.info("model %s: its engine, held %.1f s past its unload, is gone; memory released", name,
                         time.monotonic() - start)
            break
    else:
        alive = held.alive()
        if alive:
            held_by = sorted({type(r).__name__ for r in gc.get_referrers(*alive)} - {"list"})
            log.warning("model %s: its engine or model is still referenced %.0f s after its unload (by %s); its "
                        "memory is freed when that reference goes", name, time.monotonic() - start,
                        ", ".join(held_by))
            return
        await asyncio.to_thread(_release_memory)  # gone since the last look
    for delay in _LATE_TRIMS_S:
        await asyncio.sleep(delay)
        await asyncio.to_thread(_release_memory)


def _release_memory() -> None:
    """Collect the unloaded engine's objects, then give the freed heap back to the system (glibc)."""
    gc.collect()
    trim()
