"""Greedy outputs through HTTP equal the offline API's for the same prompts (same engine config)."""

from __future__ import annotations

import asyncio

import openai
from conftest import API_KEY
from server_process import ServerProcess

from tokenmill import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,",
           "1, 1, 2, 3, 5, 8,"]


def test_greedy_http_equals_offline(server: ServerProcess, llm) -> None:  # type: ignore[no-untyped-def]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    offline = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
    chat = [{"role": "user", "content": "Name three colors."}]
    offline_chat = llm.chat(chat, params)[0].outputs[0].text

    async def main() -> tuple[list[str], str]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        comps = await asyncio.gather(*(client.completions.create(model="SmolLM2-135M-Instruct", prompt=p,
                                                                 max_tokens=16, temperature=0) for p in PROMPTS))
        c = await client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=chat, max_tokens=16,
                                                 temperature=0)
        await client.close()
        return [r.choices[0].text for r in comps], c.choices[0].message.content or ""

    http, http_chat = asyncio.run(main())
    assert http == offline
    assert http_chat == offline_chat
