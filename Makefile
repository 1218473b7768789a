# make test · make demo · make run · make lint · make bench
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test

.PHONY: test demo run lint bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) tests/demo.py

run: $(STAMP)
	$(PY) mero_mcp.py

lint: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[lint]'
	$(VENV)/bin/vermin -q -t=3.9- --violations --no-tips --eval-annotations mero_mcp.py abi.py node.py
	$(PY) -m pyflakes mero_mcp.py abi.py node.py tests bench

bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
