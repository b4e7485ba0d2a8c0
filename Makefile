# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo lab test sweep fuzz bench browser-deps js-deps widget widget-check test-browser clean

setup: $(STAMP)

# torch is installed first and pinned to the CPU build that lies on disk; the package itself
# only asks for torch>=2.0, so this order keeps pip from pulling a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]' torch==2.13.0  # torch stays the CPU build whatever a dependency asks
	touch $(STAMP)

demo: setup
	$(PY) -m nnschemaparser.examples.demo --out out

# JupyterLab on the quick start notebook (the other notebooks are beside it).
lab: setup
	$(PY) -m jupyter lab notebooks/quickstart.ipynb

# Chromium for the browser tests (Debian's package; Playwright drives it, it downloads nothing).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
		|| echo 'chromium could not be installed (needs root): the browser tests will be skipped'

# Node.js and npm for the front end build and its tests (Debian's packages), then js/node_modules
# from js/package-lock.json.
js-deps:
	@(command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) \
		|| echo 'nodejs and npm could not be installed (needs root): the front end tests will be skipped'
	@(test -f js/node_modules/.package-lock.json && test js/node_modules/.package-lock.json -nt js/package-lock.json) \
		|| ! command -v npm >/dev/null 2>&1 || npm ci --prefix js --silent --no-audit --no-fund \
		|| echo 'npm ci --prefix js failed: the front end tests need js/node_modules'

test: setup browser-deps js-deps
	$(PY) -m pytest -q

sweep: setup
	HF_HUB_OFFLINE=1 $(PY) -m nnschemaparser.validation.sweep --subset all --csv docs/sweep.csv --markdown docs/sweep-table.md

fuzz: setup
	$(PY) -m tests.fuzz.run_fuzz --programs 10000 --seed 0 --lowering 300

bench: setup
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/bench_interpreter.py
	$(PY) bench/bench_capture.py
	$(PY) bench/bench_dispatch.py
	$(PY) bench/bench_widget.py
	$(PY) bench/bench_schema_file.py
	$(PY) bench/bench_store.py

widget: setup js-deps
	$(PY) -m nnschemaparser.widget.build

widget-check: setup js-deps
	$(PY) -m nnschemaparser.widget.build --check

test-browser: setup browser-deps
	$(PY) -m pytest tests/browser -q

clean:
	rm -rf $(VENV) out .pytest_cache
