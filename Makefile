# The two commands: `make demo` (set up, run a real distributed job end to end) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= train,postgres,data,plot,gpu,dev,k8s

.PHONY: install demo test test-unit lint clean serve-engine

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	@touch $(STAMP)

install: $(STAMP)

# llama.cpp for `tyard serve` (the `serve` extra): PyPI has no CPU wheel, so build one once
# (several minutes on 2 cores) into the wheel cache, and install from there afterwards.
LLAMA_CPP_VERSION ?= 0.3.36
WHEELS ?= $(HOME)/.cache/tensoryard/wheels
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=OFF \
	-DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF

serve-engine: install
	@ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || { \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) (once; minutes) into $(WHEELS)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip wheel --no-deps \
	    llama-cpp-python==$(LLAMA_CPP_VERSION) -w $(WHEELS); }
	$(BIN)/python -m pip install -q -c constraints.txt --find-links $(WHEELS) \
	  --only-binary llama-cpp-python 'llama-cpp-python[server]==$(LLAMA_CPP_VERSION)'

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
