"""Security: the API key on every route but /health and /metrics, nothing unpickled or evaluated, prompt text
never a template and never in the log, localhost by default, and a GGUF whose chat template tries to leave
the sandbox."""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from app_server import AppServer
from conftest import API_KEY
from server_process import ServerProcess

import tokenmill

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
PACKAGE = Path(tokenmill.__file__).parent


def assert_openai_error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status, err
    assert message in err["message"], err["message"]


# -- the source ------------------------------------------------------------------------------------------
UNSAFE = {
    "pickle": re.compile(r"\b(c?pickle|dill|joblib|shelve|marshal)\b"),
    "torch.load": re.compile(r"\btorch\.load\b|\btorch\.jit\.load\b"),
    "eval(": re.compile(r"(?<![\w.])eval\("),  # the builtin, not `model.eval()`
    "exec(": re.compile(r"(?<![\w.])exec\("),
    "allow_pickle=True": re.compile(r"allow_pickle\s*=\s*True"),
    "yaml.load": re.compile(r"\byaml\.(unsafe_)?load\("),
}


def test_source_loads_nothing_unsafe() -> None:
    """No pickle, torch.load or eval anywhere in the package: weights come from safetensors and GGUF only."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for num, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]  # comments and docstrings may name what is refused...
            if code.strip().startswith(('"', "'")):
                continue  # ...and so may a message string
            for name, pattern in UNSAFE.items():
                if pattern.search(code):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{num}: {name}: {line.strip()}")
    assert not found, "\n".join(found)
    server_source = (PACKAGE / "entrypoints/server/middleware.py").read_text()
    assert "hmac.compare_digest(" in server_source  # the API key is compared in constant time


def test_scanner_catches_what_it_looks_for() -> None:
    bad = ["import pickle", "x = torch.load(f)", "y = eval(s)", "np.load(f, allow_pickle=True)"]
    good = ["model.eval()", "evaluate(x)", "self.preexec(x)"]
    assert all(any(p.search(line) for p in UNSAFE.values()) for line in bad)
    assert not any(p.search(line) for line in good for p in UNSAFE.values())


def test_binds_localhost_by_default() -> None:
    from tokenmill.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1"
    assert args.metrics_require_key is False and args.log_prompts is False and args.request_timeout is None


# -- the API key -----------------------------------------------------------------------------------------
def test_api_key_required_on_every_route_but_health_ping_and_metrics(server: ServerProcess) -> None:
    schema = httpx.get(f"{server.url}/openapi.json", headers=HEADERS).json()
    routes = [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]
    routes += [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/no-such-route"), ("GET", "/ping"),
               ("POST", "/ping")]
    assert len(routes) >= 11
    wrong_same_length = "x" * len(API_KEY)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for method, path in routes:
            body = {"prompt": "hi", "max_tokens": 1} if method == "POST" else None
            for headers in ({}, {"Authorization": f"Bearer {wrong_same_length}"}, {"Authorization": API_KEY},
                            {"Authorization": f"Bearer {API_KEY.upper()}"}, {"X-Api-Key": API_KEY}):
                r = client.request(method, path, json=body, headers=headers)
                if path in ("/health", "/ping", "/metrics"):
                    assert r.status_code == 200, (path, r.status_code)
                elif path.startswith("/v1/messages"):  # Anthropic's routes: its x-api-key header too, its shape
                    if headers == {"X-Api-Key": API_KEY}:
                        assert r.status_code == 400, (path, r.text)  # past the key: the body is not a Messages one
                    else:
                        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
                elif method == "HEAD":  # no body
                    assert r.status_code == 401, (path, r.status_code)
                elif path.startswith("/api/"):  # Ollama's routes answer in its shape
                    assert r.status_code == 401 and set(r.json()) == {"error"}, (path, r.text)
                    assert r.json()["error"].startswith("missing or wrong API key"), r.text
                else:
                    assert_openai_error(r, 401, "missing or wrong API key")
        assert client.get("/v1/models", headers=HEADERS).status_code == 200


# -- prompts are data ------------------------------------------------------------------------------------
def test_prompt_text_is_never_rendered_as_a_template(server: ServerProcess) -> None:
    hostile = "{{ 7*7 }} {% for x in range(3) %}{{ x }}{% endfor %} {{ messages }} {{ cycler.__init__ }}"
    with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as client:
        ids = client.post("/tokenize", json={"messages": [{"role": "user", "content": hostile}]}).json()["tokens"]
        rendered = client.post("/detokenize", json={"tokens": ids}).json()["prompt"]
        assert hostile in rendered and "49" not in rendered
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": hostile}],
                                                      "max_tokens": 1})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(ids)
        ids = client.post("/tokenize", json={"prompt": hostile}).json()["tokens"]
        assert client.post("/detokenize", json={"tokens": ids}).json()["prompt"] == hostile


def test_logs_never_contain_prompt_text(server: ServerProcess) -> None:
    marker = f"zebra-{uuid.uuid4().hex}"
    with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as client:
        for body in ({"prompt": marker, "max_tokens": 2}, {"prompt": [marker, marker], "max_tokens": 1},
                     {"prompt": marker, "max_tokens": 2, "stream": True}, {"prompt": marker, "n": 99},
                     {"prompt": marker, "max_tokens": 1, "stop": [marker]}):
            client.post("/v1/completions", json=body)
        chat = {"messages": [{"role": "system", "content": marker}, {"role": "user", "content": marker}],
                "max_tokens": 2}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        client.post("/v1/chat/completions", json={**chat, "stream": True})
        client.post("/v1/chat/completions", json={**chat, "temperature": -5})
        client.post("/tokenize", json={"prompt": marker})
        client.post("/v1/completions", content=f'{{"prompt": "{marker}", '.encode(),
                    headers={"content-type": "application/json"})  # invalid JSON
    log = server.output()
    assert "tokenmill.requests" in log  # requests were logged, without their text
    assert marker not in log


# -- a hostile chat template in a GGUF -------------------------------------------------------------------
def write_gguf_with_template(src: Path, dst: Path, template: str) -> None:
    """Copy `src` with `tokenizer.chat_template` replaced. The new template is padded with a Jinja comment
    to the old one's byte length, so every later offset in the file stays valid."""
    data = bytearray(src.read_bytes())
    key = b"tokenizer.chat_template"
    head = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8)  # key, then value type 8 (string)
    at = data.find(head)
    assert at > 0 and data.find(head, at + 1) == -1
    at += len(head)
    (old_len,) = struct.unpack_from("<Q", data, at)
    new = template.encode()
    assert len(new) + 5 <= old_len, "the hostile template must fit in the old one's space"
    new += b"{#" + b"-" * (old_len - len(new) - 4) + b"#}"
    data[at + 8: at + 8 + old_len] = new
    dst.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def hostile_template_server(tmp_path_factory: pytest.TempPathFactory,
                            default_model_path: str) -> Iterator[tuple[AppServer, Path]]:
    """In-process: what is under test is the app and the template sandbox, not the process."""
    from tokenmill.config import EngineConfig

    tmp = tmp_path_factory.mktemp("hostile-gguf")
    canary = tmp / "canary"
    template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                f"{{{{ cycler.__init__.__globals__.os.popen('touch {canary}').read() }}}}")
    gguf = tmp / "hostile.gguf"
    write_gguf_with_template(Path(default_model_path), gguf, template)
    srv = AppServer(EngineConfig(model=str(gguf), max_model_len=256, kv_cache_memory=32 * 2**20, dtype="float32"))
    yield srv, canary
    srv.stop()


def test_gguf_with_hostile_chat_template(hostile_template_server: tuple[AppServer, Path]) -> None:
    srv, canary = hostile_template_server
    assert "chat template was refused" in srv.output()  # reported at start
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for body in (chat, {**chat, "stream": True}):
            r = client.post("/v1/chat/completions", json=body)
            assert_openai_error(r, 500, "chat template was refused")
            assert "sandbox" in r.json()["error"]["message"]
        r = client.post("/tokenize", json={"messages": chat["messages"]})
        assert r.status_code == 500 and "refused" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert client.get("/health").status_code == 200
    assert not canary.exists(), "the template ran a command"
