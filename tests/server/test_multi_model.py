"""Several models from one server: the ModelPool behind the OpenAI and Ollama routes, in this process (the
app served by uvicorn on a thread, so streams and hang-ups are real), and `tokenmill serve --models-dir`.

The models are tiny random GGUFs (benchmarks/random_gguf.py, ~30 MB each: they load in well under a second)
and, where the memory must show, the default model in fp32 (~540 MB of weights). Every engine in this module
sleeps TOKENMILL_TEST_STEP_DELAY_S after each step, so a stream stays open for as long as a test needs it to
(a state, not a speed: nothing here is timed).
"""

from __future__ import annotations

import json
import os
import re
import time
import weakref
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from app_server import UvicornThread
from server_process import ServerProcess, wait_for

from tokenmill.config import EngineConfig

ollama = pytest.importorskip("ollama")

STEP_DELAY_S = "0.05"
TINY = {"kv_cache_memory": 32 * 2**20, "max_model_len": 512}
PROMPT = "The capital of France is"


@pytest.fixture(scope="module", autouse=True)
def slow_steps() -> Iterator[None]:
    old = os.environ.get("TOKENMILL_TEST_STEP_DELAY_S")
    os.environ["TOKENMILL_TEST_STEP_DELAY_S"] = STEP_DELAY_S  # read by each engine thread as it starts
    yield
    if old is None:
        del os.environ["TOKENMILL_TEST_STEP_DELAY_S"]
    else:
        os.environ["TOKENMILL_TEST_STEP_DELAY_S"] = old


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three tiny random GGUFs that differ in their weights (so in their greedy tokens)."""
    from tokenmill.benchmarks.random_gguf import Shape, write_random_gguf

    d = tmp_path_factory.mktemp("models")
    return {name: write_random_gguf(d / f"{name}.gguf", Shape(), "q8_0", seed=seed, name=name)
            for seed, name in enumerate(("alpha", "beta", "gamma"), start=1)}


class PoolServer:
    """A ModelPool of `models` (nothing loaded until asked) behind the OpenAI and Ollama routers."""

    def __init__(self, models: list[tuple[str, EngineConfig]], budget_bytes: int | None) -> None:
        from tokenmill.entrypoints.ollama import router as ollama_router
        from tokenmill.entrypoints.openai import router as openai_router
        from tokenmill.entrypoints.server.app import build_app
        from tokenmill.entrypoints.server.config import ServerConfig
        from tokenmill.entrypoints.server.model_pool import ModelPool
        from tokenmill.entrypoints.server.served_model import DEFAULT_KEEP_ALIVE, ServedModel

        self.pool = ModelPool([ServedModel.plan(n, c) for n, c in models], budget_bytes=budget_bytes,
                              keep_alive=DEFAULT_KEEP_ALIVE)
        app = build_app(self.pool, ServerConfig(log_requests=False),
                        routers=[openai_router.build_router, ollama_router.build_router])
        self.uvicorn = UvicornThread(app)
        self.url = self.uvicorn.url
        self.client = ollama.Client(host=self.url)

    def ps(self) -> set[str]:
        return {m.model for m in self.client.ps().models}

    def generate(self, model: str, **fields: Any) -> Any:
        return self.client.generate(model=model, prompt=PROMPT, raw=True, **fields)

    def stop(self) -> None:
        self.uvicorn.stop()
        assert self.pool.shutdown()


def tiny(path: Path) -> EngineConfig:
    return EngineConfig(model=str(path), **TINY)


def stream_lines(stack: ExitStack, srv: PoolServer, model: str, num_predict: int) -> Iterator[dict[str, Any]]:
    """An open /api/generate stream's objects, one by one (closed with `stack`: a client hang-up)."""
    client = stack.enter_context(httpx.Client(timeout=60))
    r = stack.enter_context(client.stream("POST", f"{srv.url}/api/generate", json={
        "model": model, "prompt": PROMPT, "raw": True, "options": {"temperature": 0, "num_predict": num_predict}}))
    assert r.status_code == 200
    return (json.loads(line) for line in r.iter_lines() if line)


def test_two_models_answer_in_parallel_each_its_own(ggufs: dict[str, Path]) -> None:
    srv = PoolServer([("alpha", tiny(ggufs["alpha"])), ("beta", tiny(ggufs["beta"]))], budget_bytes=None)
    try:
        assert srv.ps() == set()  # nothing loads before it is asked for
        alone = {name: srv.generate(name, options={"temperature": 0, "num_predict": 12}).context
                 for name in ("alpha", "beta")}
        assert alone["alpha"] != alone["beta"]  # two models, two answers
        with ExitStack() as stack:
            a, b = stream_lines(stack, srv, "alpha", 12), stream_lines(stack, srv, "beta", 12)
            first_a, first_b = next(a), next(b)
            assert not first_a["done"] and not first_b["done"]
            # both requests are in flight at once, on two engines
            assert [srv.pool.loaded_model(n).num_active for n in ("alpha", "beta")] == [1, 1]  # type: ignore[union-attr]
            assert srv.ps() == {"alpha:latest", "beta:latest"}
            last_a, last_b = [line for line in a][-1], [line for line in b][-1]
        assert last_a["done"] and last_b["done"]
        assert (last_a["context"], last_b["context"]) == (alone["alpha"], alone["beta"])  # each by its own model
    finally:
        srv.stop()


def test_keep_alive_0_unloads_and_the_engine_goes(ggufs: dict[str, Path]) -> None:
    srv = PoolServer([("alpha", tiny(ggufs["alpha"])), ("beta", tiny(ggufs["beta"]))], budget_bytes=None)
    try:
        srv.generate("beta", options={"num_predict": 2}, keep_alive="5m")
        running = {m.model: m for m in srv.client.ps().models}
        assert set(running) == {"beta:latest"}
        expires = running["beta:latest"].expires_at.timestamp()
        assert 4 * 60 < expires - time.time() <= 5 * 60 + 1  # its keep-alive, from when it went idle
        engine = weakref.ref(srv.pool.loaded_model("beta").async_engine.engine)  # type: ignore[union-attr]
        r = srv.generate("beta", options={"num_predict": 2}, keep_alive=0)
        assert r.done and r.eval_count == 2
        assert wait_for(lambda: srv.ps() == set(), 30)
        # nothing holds the engine (so its weights) any more: the memory check is in a fresh process, below
        assert wait_for(lambda: engine() is None, 30)
        # Ollama's way to stop a model: an empty request with keep_alive 0 answers "unload"
        srv.generate("alpha", options={"num_predict": 1})
        assert srv.ps() == {"alpha:latest"}
        assert srv.client.generate(model="alpha", prompt="", keep_alive=0).done_reason == "unload"
        assert wait_for(lambda: srv.ps() == set(), 30)
        # ... and for a model that is not loaded, it loads nothing
        assert srv.client.chat(model="alpha", messages=[], keep_alive=0).done_reason == "unload"
        assert srv.ps() == set()
    finally:
        srv.stop()


def test_an_unloaded_models_memory_leaves_the_server_process(ggufs: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """RSS of a `tokenmill serve` process: the default model in fp32 (~540 MB of weights) loads, unloads
    with keep_alive 0, and the process gives the memory back (its engine gone, glibc's heap trimmed). A fresh
    process: a pytest worker that has run dozens of engines keeps a fragmented heap whose RSS says little."""
    from tokenmill.loader.model_source import default_model_path

    (tmp_path / "alpha.gguf").symlink_to(ggufs["alpha"])
    (tmp_path / "smollm.gguf").symlink_to(default_model_path())
    srv = ServerProcess("--models-dir", str(tmp_path), "--keep-alive", "5m", "--kv-cache-memory", "32MiB",
                        "--max-model-len", "512", env={"TOKENMILL_TEST_STEP_DELAY_S": "0"}).wait_ready()
    try:
        client = ollama.Client(host=srv.url)
        assert [m.model for m in client.ps().models] == ["alpha:latest"]  # the first, loaded at start
        before = srv.rss_bytes()
        assert client.generate(model="smollm2:135m", prompt=PROMPT, options={"num_predict": 2}).eval_count == 2
        loaded = srv.rss_bytes()
        assert loaded - before > 450 * 2**20, f"RSS rose by {(loaded - before) / 2**20:.0f} MiB"  # fp32 weights
        r = client.generate(model="smollm2:135m", prompt=PROMPT, options={"num_predict": 2}, keep_alive=0)
        assert r.done and r.eval_count == 2
        assert wait_for(lambda: [m.model for m in client.ps().models] == ["alpha:latest"], 30)
        assert wait_for(lambda: loaded - srv.rss_bytes() > 400 * 2**20, 30), \
            f"RSS fell by {(loaded - srv.rss_bytes()) / 2**20:.0f} MiB only\n{srv.output()[-3000:]}"
    finally:
        assert srv.stop() == 0, srv.output()


def test_the_startup_models_memory_leaves_too() -> None:
    """The model loaded at start (one model, served as `tokenmill serve` is usually run) unloads with
    keep_alive 0 and gives its memory back as a model loaded later does: nothing the server's start kept
    (the start-up log's engine) holds it; a request then loads it again, once."""
    srv = ServerProcess("--kv-cache-memory", "32MiB", "--max-model-len", "512",
                        env={"TOKENMILL_TEST_STEP_DELAY_S": "0"}).wait_ready()
    try:
        client = ollama.Client(host=srv.url)
        (name,) = [m.model for m in client.ps().models]
        loaded = srv.rss_bytes()
        assert client.generate(model=name, prompt=PROMPT, options={"num_predict": 2}, keep_alive=0).done
        assert wait_for(lambda: not client.ps().models, 30)
        assert wait_for(lambda: loaded - srv.rss_bytes() > 400 * 2**20, 30), \
            f"RSS fell by {(loaded - srv.rss_bytes()) / 2**20:.0f} MiB only\n{srv.output()[-3000:]}"
        assert client.generate(model=name, prompt=PROMPT, options={"num_predict": 2}).eval_count == 2
        assert srv.rss_bytes() < loaded + 200 * 2**20  # one copy again, not two
    finally:
        assert srv.stop() == 0, srv.output()


def test_an_idle_model_is_evicted_a_busy_one_never(ggufs: dict[str, Path]) -> None:
    from tokenmill.entrypoints.server.served_model import ServedModel

    size = ServedModel.plan("alpha", tiny(ggufs["alpha"])).memory_bytes
    names = ("alpha", "beta", "gamma")
    srv = PoolServer([(n, tiny(ggufs[n])) for n in names], budget_bytes=int(2.5 * size))  # two fit, not three
    try:
        for n in ("alpha", "beta"):
            srv.generate(n, options={"num_predict": 1})
        assert srv.ps() == {"alpha:latest", "beta:latest"}
        srv.generate("gamma", options={"num_predict": 1})
        assert srv.ps() == {"beta:latest", "gamma:latest"}  # alpha, the least recently used, made room

        with ExitStack() as beta_stack, ExitStack() as gamma_stack:  # both busy: nothing may go for alpha
            streams = [stream_lines(st, srv, n, 400) for st, n in ((beta_stack, "beta"), (gamma_stack, "gamma"))]
            assert not any(next(lines)["done"] for lines in streams)  # (kept: dropping a stream hangs it up)
            r = httpx.post(f"{srv.url}/v1/completions", json={"model": "alpha", "prompt": PROMPT, "max_tokens": 1})
            assert r.status_code == 503 and r.headers["retry-after"]
            err = r.json()["error"]
            assert (err["type"], err["code"], err["param"]) == ("ServiceUnavailableError", 503, "model")
            for words in ("'alpha' needs", "budget is", "in use", "beta", "gamma", "busy (1 request)"):
                assert words in err["message"], err["message"]
            with pytest.raises(ollama.ResponseError) as e:
                srv.generate("alpha")
            assert e.value.status_code == 503 and e.value.error == err["message"]  # the same words, Ollama's shape
            assert srv.ps() == {"beta:latest", "gamma:latest"}
            for stack, n in ((gamma_stack, "gamma"), (beta_stack, "beta")):  # hang up: gamma first, then beta
                stack.close()
                assert wait_for(lambda: srv.pool.loaded_model(n).num_active == 0, 30)  # type: ignore[union-attr]
        # both idle now, gamma the least recently used: it makes room
        assert srv.generate("alpha", options={"num_predict": 1}).done
        assert srv.ps() == {"alpha:latest", "beta:latest"}
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def served(ggufs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`tokenmill serve --models-dir` over alpha and (a link to) the default model, named by its metadata."""
    from tokenmill.loader.model_source import default_model_path

    d = tmp_path_factory.mktemp("models_dir")
    (d / "alpha.gguf").symlink_to(ggufs["alpha"])
    (d / "smollm.gguf").symlink_to(default_model_path())
    srv = ServerProcess("--models-dir", str(d), "--keep-alive", "1m", "--quantization", "auto",
                        env={"TOKENMILL_TEST_STEP_DELAY_S": "0"}).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.output()


def test_models_dir_lists_names_and_labels(served: ServerProcess) -> None:
    import openai

    client = ollama.Client(host=served.url)
    assert [m.model for m in client.list().models] == ["alpha:latest", "smollm2:135m"]  # loaded or not
    assert [m.model for m in client.ps().models] == ["alpha:latest"]  # the default (the first), loaded at start
    r = client.chat(model="smollm2:135m", messages=[{"role": "user", "content": "Hi"}],
                    options={"temperature": 0, "num_predict": 4})
    assert r.eval_count == 4 and r.load_duration > 0  # it waited for its model to load
    running = {m.model: m for m in client.ps().models}
    assert set(running) == {"alpha:latest", "smollm2:135m"}
    assert running["smollm2:135m"].size > running["alpha:latest"].size

    oa = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
    assert [m.id for m in oa.models.list().data] == ["alpha", "smollm2:135m"]
    out = oa.completions.create(model="alpha", prompt=PROMPT, max_tokens=3, temperature=0)
    assert out.model == "alpha" and out.usage.completion_tokens == 3

    # unknown models: OpenAI's 404 on /v1 (vLLM's words), Ollama's on /api
    with pytest.raises(openai.NotFoundError) as oe:
        oa.completions.create(model="nope", prompt="Hi", max_tokens=1)
    body: Any = oe.value.body
    assert body["message"].startswith("The model `nope` does not exist.") and body["code"] == 404
    assert body["type"] == "NotFoundError" and body["param"] == "model"
    assert "`alpha`, `smollm2:135m`" in body["message"]
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="nope", prompt="Hi")
    assert e.value.status_code == 404 and e.value.error == "model 'nope' not found"

    # one valid exposition: each family once, a model_name sample per loaded model
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{served.url}/metrics").text
    families = [f.name for f in text_string_to_metric_families(text)]
    assert len(families) == len(set(families))
    assert len(re.findall(r"^# TYPE tokenmill:num_requests_running ", text, re.M)) == 1
    for name in ("alpha", "smollm2:135m"):
        assert f'tokenmill:num_requests_running{{model_name="{name}"}}' in text
        assert re.search(rf'^tokenmill:generation_tokens_total{{model_name="{re.escape(name)}"}} [1-9]', text, re.M)


@pytest.mark.parametrize("draft", [False, True])
def test_the_estimate_before_loading_is_the_engines_own_plan(ggufs: dict[str, Path], draft: bool) -> None:
    """What the pool counts for a model before it loads is what its engine's memory plan says once loaded
    (a draft model for speculative decoding included)."""
    from tokenmill.config import SpeculativeConfig
    from tokenmill.engine.llm_engine import LLMEngine
    from tokenmill.entrypoints.server.served_model import ServedModel
    from tokenmill.memory_plan import RUNTIME_BYTES

    spec = SpeculativeConfig(method="draft_model", model=str(ggufs["beta"])) if draft else None
    config = EngineConfig(model=str(ggufs["alpha"]), speculative_config=spec, **TINY)
    engine = LLMEngine(config, progress=False)
    assert ServedModel.plan("alpha", config).memory_bytes == engine.plan.total_bytes - RUNTIME_BYTES
    assert (engine.plan.draft_weight_bytes > 0) is draft
