"""Ollama's native API (`/api/...`) as a router beside the OpenAI one: the same engine, admission, metrics.

    router.py       the routes, answering errors in Ollama's shape `{"error": "..."}`
    serving.py      requests -> engine prompts -> NDJSON streams or whole answers, with Ollama's counts
    options.py      Ollama's `options` -> SamplingParams (and what is fixed at start)
    go_template.py  the part of Go's text/template that generate's `template` field needs
    model_card.py   how the served model is named and described (/api/tags, /api/show, /api/ps)
    protocol.py     the request and response models
"""
