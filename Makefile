# Two entry points: `make serve` and `make test`. Both create the environment first.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= $(shell command -v python3.11 || command -v python3.12)
TORCH  := torch==2.13.0
PORT   ?= 8000

.PHONY: install serve test bench clean

install: $(STAMP)

# tractor 0.1.0a5 names pdbpp by git URL, which pip refuses: uv installs it with the
# override in overrides.txt. torch comes first, from pip: with no GPU it must be the CPU
# build (an unpinned torch pulls a multi-GB CUDA build). If pip's own configuration points
# at a local CPU wheel, `--no-index --no-deps` takes just that file and the second pip call
# adds its dependencies; otherwise PyTorch's CPU index serves it.
$(STAMP): pyproject.toml overrides.txt
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
	$(VENV)/bin/uv pip install --quiet --python $(PY) --override overrides.txt -e '.[test]'
	touch $(STAMP)

serve: install
	$(VENV)/bin/greenroom serve --port $(PORT)

test: install
	$(PY) -m pytest -q -p no:cacheprovider

bench: install
	$(PY) bench/stream_overhead.py

clean:
	rm -rf $(VENV)
