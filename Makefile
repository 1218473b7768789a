# make test · make demo · make run · make lint · make bench
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
# The checkout on sys.path by a plain .pth line: setuptools' default editable finder is imported by every Python
# this venv starts (pathlib, importlib.metadata: ~14 ms of each spawn) and no user's install has it.
EDITABLE := --config-settings editable_mode=compat -e
# The runtime packages only (requests, jsonschema): enough for demo and run. The test stack builds on it.
RUNTIME := $(VENV)/.installed-runtime
STAMP   := $(VENV)/.installed-test

.PHONY: test demo run lint bench clean

$(RUNTIME): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(EDITABLE) .
	touch $@

$(STAMP): $(RUNTIME)
	$(PIP) $(EDITABLE) '.[test]'
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(RUNTIME)
	$(PY) tests/demo.py

run: $(RUNTIME)
	$(PY) mero_mcp.py

lint: $(STAMP)
	$(PIP) $(EDITABLE) '.[lint]'
	$(VENV)/bin/vermin -q -t=3.9- --violations --no-tips --eval-annotations mero_mcp.py abi.py node.py
	$(PY) -m pyflakes mero_mcp.py abi.py node.py tests bench
	@echo "lint: clean (pyflakes; mero_mcp.py, abi.py, node.py run on Python 3.9)"

bench: $(STAMP)
	$(PIP) $(EDITABLE) '.[bench]'
	$(PY) bench/run.py
	$(PY) bench/bench_abi.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
