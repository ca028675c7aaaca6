"""The HTTP server, protocol-neutral: app factory, frozen config, lifecycle, middleware, admission, errors.

Front ends (the OpenAI routes today; Ollama and a web page next) are routers that `build_app` mounts.
"""
