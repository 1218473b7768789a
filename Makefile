# make test · make demo · make run · make lint · make bench · make snapshot · make pyz · make mcpb · make test-pyz
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

.PHONY: test test-oldest oldest-venv demo run lint bench snapshot clean pyz mcpb test-pyz

# Without a package index: demo, run and test use $(PYTHON) itself when it has what they need (Debian, Ubuntu:
# python3-requests python3-jsonschema, and python3-pytest for test), and say so in one line; without those they
# say in one line what to install. Either way no half-built .venv is left. An index is asked first (pip download,
# no retries) only when $(PYTHON) has them, so that case costs no failed venv build (~18 s on a busy 2-core machine).
# $(call venv_or_own,<pip install args>,<modules>,<Debian packages>,<stamp>,<what pip installs, in words>,<`:` to
# leave the using-own line to the test stack's, which follows>)
define venv_or_own
tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT; \
own() { $(PYTHON) -c 'import $(subst $(space),$(comma),$(2))' >/dev/null 2>&1; }; \
say() { echo "make: $$1" >&2; }; \
if own; then \
  $(PYTHON) -m pip download -q --disable-pip-version-check --no-deps --retries 0 --timeout 5 -d "$$tmp/probe" \
    'setuptools>=61' >"$$tmp/probe.log" 2>&1 || grep -q 'No module named pip' "$$tmp/probe.log" || { \
    $(6)say "no package index answers, so $(PYTHON)'s own $(call listed,$(2)) run this (no .venv)"; exit 0; }; \
fi; \
echo "installing $(5) into $(VENV)" >&2; \
fresh=; test -x $(PY) || { fresh=1; $(PYTHON) -m venv $(VENV); } >"$$tmp/pip.log" 2>&1; \
test -x $(PY) && $(PIP) $(1) >>"$$tmp/pip.log" 2>&1 && touch $(4) && exit 0; \
why=$$({ grep -E '^ *ERROR:' "$$tmp/pip.log" || grep -E '^ *[Ee]rror:' "$$tmp/pip.log"; } | tail -n 1 | sed 's/^ *//'); \
test -z "$$fresh" || rm -rf $(VENV); \
if own; then $(6)say "$(VENV) cannot be built ($${why:-see pip}), so $(PYTHON)'s own $(call listed,$(2)) run this"; exit 0; fi; \
say "$(VENV) cannot be built ($${why:-pip failed}), and $(PYTHON) lacks some of $(call listed,$(2)): sudo apt install $(3) (Debian, Ubuntu), or reach a package index, then run make again"; \
exit 1
endef
comma := ,
space := $(subst ,, )
# a b c -> a, b and c
listed = $(if $(word 2,$(1)),$(subst $(space),$(comma)$(space),$(wordlist 2,$(words $(1)),x $(1))) and $(lastword $(1)),$(1))
# The Python a target runs: the venv's once its stamp is there, else $(PYTHON) (the offline case above).
python_of = $$(test -f $(1) && echo $(PY) || echo $(PYTHON))

# On stderr: `make run` is a server command whose stdout is the protocol, even on the run that builds the venv.
$(RUNTIME): setup.cfg pyproject.toml Makefile
	@$(call venv_or_own,$(EDITABLE) .,requests jsonschema,python3-requests python3-jsonschema,$@,requests and jsonschema,$(if $(filter test,$(MAKECMDGOALS)),: ))

$(STAMP): $(RUNTIME)
	@$(call venv_or_own,$(EDITABLE) '.[test]',requests jsonschema pytest,python3-requests python3-jsonschema python3-pytest,$@,the test stack (pytest$(comma) the MCP SDK))

# TESTS: the files (or pytest arguments) the suite's run takes, and only those; without TESTS, all of tests/ and then
# test-oldest (which keeps its own list), as CI runs it.
TESTS ?=
# Tests run side by side in TEST_WORKERS processes (pytest-xdist) when the Python running them has pytest-xdist, else
# one at a time. Most tests wait on a server subprocess and a node double over loopback, so more workers than cores
# pay. TEST_WORKERS=0: one process (pytest's --pdb, -s).
TEST_WORKERS ?= 4
workers_of = $$($(1) -c 'import xdist' >/dev/null 2>&1 && echo ' -n $(TEST_WORKERS) --dist loadgroup')
test: $(STAMP)
	@py=$(call python_of,$(STAMP)); run="$$py -m pytest -q$(call workers_of,$$py)"; echo "$$run $(TESTS)"; \
	$$run $(TESTS)
ifeq ($(strip $(TESTS)),)
	@$(MAKE) --no-print-directory test-oldest
endif

# The oldest releases the server supports, as Ubuntu 22.04 and Debian 11 ship them: Python 3.9 with exactly
# requests 2.25.1 and jsonschema 3.2.0 (no 2020-12 validator there: abi.compile_schema checks with Draft 7).
# Only the tests those two packages decide run here, about 1 min 15 s after the suite's 5 on 2 cores: test_abi (every
# schema and its problem texts), test_fixed_tools and test_app_tools (the tools through the real server), test_node
# (all node I/O through requests), test_adversarial (bad input), test_names_and_rows and test_lifecycle (the
# tools added since, through the same checks), test_faults and test_stream_bounds (deadlines and the stream watch
# and read urllib3's connections, and 2.25.1 brings urllib3 1.26). No Python 3.9 here: one line, and no failure.
OLDEST_VENV  := .venv-oldest
OLDEST_PINS  := requests==2.25.1 jsonschema==3.2.0 pytest pytest-xdist==3.8.0
OLDEST_TESTS := tests/test_abi.py tests/test_fixed_tools.py tests/test_app_tools.py tests/test_node.py \
                tests/test_adversarial.py tests/test_names_and_rows.py tests/test_lifecycle.py \
                tests/test_faults.py tests/test_events.py tests/test_stream_bounds.py
# 3.2 has no 2020-12 validator: test_abi compares its Draft 7 verdicts with those of the suite's venv, when it has one
OLDEST_MODERN = $(if $(wildcard $(PY)),MERO_MCP_TEST_MODERN_PYTHON=$(abspath $(PY)))
PYTHON39 = $(firstword $(foreach p,$(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.9.*/bin/python3.9) \
                   $(shell command -v python3.9),$(shell $(p) -c 'import sys; print("$(p)" if sys.version_info[:2] \
                   == (3, 9) else "")' 2>/dev/null)))

# Its stamp names the pins it was built with: a venv built with other pins is built again.
oldest_built = grep -qxF '$(OLDEST_PINS)' $(OLDEST_VENV)/.installed 2>/dev/null

test-oldest:
	@if [ -z "$(PYTHON39)" ]; then echo "test-oldest: skipped, no Python 3.9 here (python3.9 on PATH or under pyenv)"; \
	elif ! $(oldest_built) && ! $(MAKE) --no-print-directory oldest-venv; then exit 1; \
	elif ! $(oldest_built); then :; \
	else echo "test-oldest: $(PYTHON39) with $(OLDEST_PINS)" && \
	$(OLDEST_MODERN) $(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider$(call workers_of,$(OLDEST_VENV)/bin/python) \
	  $(OLDEST_TESTS); fi

# Built whole or not at all: where no package index answers, one line and a skip (the pins come from nowhere else).
OFFLINE_SIGNS := NewConnectionError|No matching distribution|Could not find a version|Temporary failure|Network is unreachable
oldest-venv:
	@rm -rf $(OLDEST_VENV); log=$$(mktemp); \
	if $(PYTHON39) -m venv $(OLDEST_VENV) >$$log 2>&1 && $(OLDEST_VENV)/bin/python -m pip install -q \
	    --disable-pip-version-check $(OLDEST_PINS) >>$$log 2>&1; then echo '$(OLDEST_PINS)' >$(OLDEST_VENV)/.installed; \
	  rm -f $$log; \
	else rm -rf $(OLDEST_VENV); why=$$(grep -E '^ *(ERROR|Error|error):' $$log | tail -n 1 | sed 's/^ *//'); \
	  if grep -qE '$(OFFLINE_SIGNS)' $$log; then rm -f $$log; \
	    echo "test-oldest: skipped, no package index answers for $(OLDEST_PINS) ($$why)"; \
	  else cat $$log; rm -f $$log; exit 1; fi; fi

demo: $(RUNTIME)
	@py=$(call python_of,$(RUNTIME)); echo "$$py tests/demo.py"; $$py tests/demo.py

run: $(RUNTIME)
	@$(call python_of,$(RUNTIME)) mero_mcp.py

# lint and bench install their own tools: they need the package index, and say so in one line without it.
needs_venv = @test -f $(STAMP) || { echo "make $@: needs $(VENV), which needs a package index" >&2; exit 1; }

# Our modules: the entry, its mero_*.py siblings, node.py and abi.py (setup.cfg's py_modules names the same).
MODULES := mero_mcp.py $(filter-out mero_mcp.py,$(wildcard mero_*.py)) node.py abi.py

lint: $(STAMP)
	$(needs_venv)
	$(PIP) $(EDITABLE) '.[lint]'
	$(VENV)/bin/vermin -q -t=3.9- --violations --no-tips --eval-annotations $(MODULES) packaging
	$(PY) -m pyflakes $(MODULES) tests bench packaging
	@echo "lint: clean (pyflakes; every module runs on Python 3.9: $(MODULES))"

bench: $(STAMP) pyz
	$(needs_venv)
	$(PIP) $(EDITABLE) '.[bench]'
	$(PY) bench/run.py
	$(PY) bench/bench_abi.py

# tests/snapshots/fixed_tools.json from the live server (tests/test_tool_snapshot.py compares it): run it after a
# fixed tool is added, renamed or reworded, and commit the file with the change.
snapshot: $(RUNTIME)
	@py=$(call python_of,$(RUNTIME)); echo "$$py tests/mcp_client.py snapshot"; $$py tests/mcp_client.py snapshot

# One file to carry (README: One file): dist/mero-mcp-<version>.pyz, and the Claude Desktop bundle wrapping it. The
# wheels packaging/requirements.txt pins by hash are downloaded at build time into build/wheels (pip, of the venv's
# Python when there is one); without a package index, one line and no file (packaging/build.py exits 3 for it).
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' mero_mcp.py)
PYZ     := dist/mero-mcp-$(VERSION).pyz
build_py = py=$$(test -x $(PY) && echo $(PY) || echo $(PYTHON)); $$py packaging/build.py $(1) || test $$? = 3

pyz:
	@$(call build_py,pyz)

mcpb:
	@$(call build_py,mcpb)

# Whole test files against the pyz, run by $(PYTHON) -I -S (no package of any Python's own): every server these
# tests start is the pyz (tests/mcp_client.py reads MERO_MCP_TEST_SERVER).
PYZ_TESTS := tests/test_fixed_tools.py tests/test_app_tools.py tests/test_protocol.py tests/test_adversarial.py \
             tests/test_round_trips.py tests/test_read_only.py tests/test_pyz.py
test-pyz: $(STAMP) pyz
	@if [ ! -f $(PYZ) ]; then echo "test-pyz: skipped, $(PYZ) was not built"; else \
	py=$(call python_of,$(STAMP)); echo "MERO_MCP_TEST_SERVER='$(PYTHON) -I -S $(abspath $(PYZ))' $$py -m pytest -q"; \
	MERO_MCP_TEST_SERVER="$(PYTHON) -I -S $(abspath $(PYZ))" $$py -m pytest -q $(PYZ_TESTS); fi

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build dist *.egg-info .pytest_cache
