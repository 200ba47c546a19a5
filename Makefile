# The two commands: `make demo` (set up, run a real distributed job end to end) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= train,postgres,data,plot,gpu,dev,k8s

.PHONY: install demo test test-unit lint clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/tyard demo

test: install
	$(BIN)/python -m pytest

test-unit: install
	$(BIN)/python -m pytest tests/unit

lint: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
