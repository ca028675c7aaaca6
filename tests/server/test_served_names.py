"""vLLM's `--served-model-name a b ...`: requests may name the model by any of the names (or by the model's own),
answers and /v1/models carry the first, and any other name is vLLM's 404 naming the served one."""

from __future__ import annotations

from asgi_app import call, in_process_app

from tokenmill.entrypoints.server.config import ServerConfig

CHAT = [{"role": "user", "content": "Hi"}]


def test_served_model_name_aliases() -> None:
    config = ServerConfig(log_requests=False, served_model_name="primary", served_model_aliases=("gpt-4o",))
    for app in in_process_app(config, max_model_len=256, kv_cache_memory=16 * 2**20):
        for name in ("primary", "gpt-4o", "SmolLM2-135M-Instruct"):  # the model's own name stays accepted too
            r = call(app, "POST", "/v1/chat/completions", {"model": name, "messages": CHAT, "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == "primary", (name, r.text)
        r = call(app, "POST", "/v1/chat/completions", {"model": "gpt-5", "messages": CHAT, "max_tokens": 2})
        assert r.status_code == 404 and "`primary`" in r.json()["error"]["message"]
        assert [m["id"] for m in call(app, "GET", "/v1/models").json()["data"]] == ["primary"]
