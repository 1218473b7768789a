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

.PHONY: test test-oldest demo run lint bench clean

# On stderr: `make run` is a server command whose stdout is the protocol, even on the run that builds the venv.
$(RUNTIME): setup.cfg pyproject.toml Makefile
	@echo "installing requests and jsonschema into $(VENV)" >&2
	@{ test -x $(PY) || $(PYTHON) -m venv $(VENV); } >&2
	@$(PIP) $(EDITABLE) . >&2
	@touch $@

$(STAMP): $(RUNTIME)
	$(PIP) $(EDITABLE) '.[test]'
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q
	@$(MAKE) --no-print-directory test-oldest

# The oldest releases the server supports, as Ubuntu 22.04 and Debian 11 ship them: Python 3.9 with exactly
# requests 2.25.1 and jsonschema 3.2.0 (no 2020-12 validator there: abi.compile_schema checks with Draft 7).
# Only the tests those two packages decide run here, about 2.5 min on 2 cores beside the suite's 6: test_abi (every
# schema and its problem texts), test_fixed_tools and test_app_tools (the tools through the real server), test_node
# (all node I/O through requests), test_adversarial (bad input), test_names_and_rows and test_lifecycle (the
# tools added since, through the same checks) and test_faults (the total deadline watches urllib3's connections,
# and 2.25.1 brings urllib3 1.26). No Python 3.9 here: one line, and no failure.
OLDEST_VENV  := .venv-oldest
OLDEST_PINS  := requests==2.25.1 jsonschema==3.2.0 pytest
OLDEST_TESTS := tests/test_abi.py tests/test_fixed_tools.py tests/test_app_tools.py tests/test_node.py \
                tests/test_adversarial.py tests/test_names_and_rows.py tests/test_lifecycle.py \
                tests/test_faults.py
# 3.2 has no 2020-12 validator: test_abi compares its Draft 7 verdicts with those of the suite's venv, when it has one
OLDEST_MODERN = $(if $(wildcard $(PY)),MERO_MCP_TEST_MODERN_PYTHON=$(abspath $(PY)))
PYTHON39 = $(firstword $(foreach p,$(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.9.*/bin/python3.9) \
                   $(shell command -v python3.9),$(shell $(p) -c 'import sys; print("$(p)" if sys.version_info[:2] \
                   == (3, 9) else "")' 2>/dev/null)))

test-oldest:
	@if [ -z "$(PYTHON39)" ]; then echo "test-oldest: skipped, no Python 3.9 here (python3.9 on PATH or under pyenv)"; \
	else test -f $(OLDEST_VENV)/.installed || { rm -rf $(OLDEST_VENV) && $(PYTHON39) -m venv $(OLDEST_VENV) && \
	  $(OLDEST_VENV)/bin/python -m pip install -q --disable-pip-version-check $(OLDEST_PINS) && \
	  touch $(OLDEST_VENV)/.installed; } && \
	echo "test-oldest: $(PYTHON39) with $(OLDEST_PINS)" && \
	$(OLDEST_MODERN) $(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider $(OLDEST_TESTS); fi

demo: $(RUNTIME)
	$(PY) tests/demo.py

run: $(RUNTIME)
	@$(PY) mero_mcp.py

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
	rm -rf $(VENV) $(OLDEST_VENV) build *.egg-info .pytest_cache
