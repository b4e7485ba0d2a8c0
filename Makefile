# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test sweep fuzz bench clean

setup: $(STAMP)

# torch is installed first and pinned to the CPU build that lies on disk; the package itself
# only asks for torch>=2.0, so this order keeps pip from pulling a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: setup
	$(PY) -m nnschemaparser.demo --out out

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) bench/bench_interpreter.py

clean:
	rm -rf $(VENV) out .pytest_cache
