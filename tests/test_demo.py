"""`make demo` from a fresh copy of the checkout: it installs the runtime packages only, then shows its session;
where no package index answers, it runs on the interpreter's own packages or says in one line what it needs, and
leaves no .venv either way."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv

import pytest

from mcp_client import ROOT
from test_packaging import OFFLINE_SIGNS

LEFT_BEHIND = shutil.ignore_patterns(".venv", ".venv-oldest", "__pycache__", "node_modules", "*.egg-info",
                                     ".pytest_cache", "build", ".git")
OWN_PACKAGES = "make: no package index answers, so %s's own requests and jsonschema run this (no .venv)"


def fresh_clone(tmp_path_factory):
    if shutil.which("make") is None:
        pytest.skip("make is not on PATH")
    clone = tmp_path_factory.mktemp("clone") / "mero-mcp"
    shutil.copytree(str(ROOT), str(clone), ignore=LEFT_BEHIND)
    return clone


def no_index_env():
    """This environment with pip pointed at a closed port and every other source of packages removed: a machine
    that reaches no package index."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("PIP_") and key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/", PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1")
    return env


def make(clone, *args, env=None):
    return subprocess.run(["make"] + list(args), cwd=str(clone), capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL, env=env)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A copy of the checkout as a fresh clone has it (no .venv), and what `make demo` printed there."""
    clone = fresh_clone(tmp_path_factory)
    done = make(clone, "demo", "PYTHON=" + sys.executable)
    if "no package index answers" in done.stderr or (
            done.returncode != 0 and any(sign in done.stdout + done.stderr for sign in OFFLINE_SIGNS)):
        pytest.skip("the package index is out of reach, so the runtime packages cannot be installed")
    assert done.returncode == 0, done.stdout + done.stderr
    return clone, done.stdout


def importable(clone, module):
    return subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", "import " + module],
                          capture_output=True, timeout=60).returncode == 0


def test_the_demo_venv_holds_the_runtime_packages_only(demo):
    clone, _ = demo
    assert importable(clone, "requests") and importable(clone, "jsonschema")
    assert not importable(clone, "pytest") and not importable(clone, "mcp")
    assert (clone / ".venv" / ".installed-runtime").exists()
    assert not (clone / ".venv" / ".installed-test").exists()


def test_the_demo_shows_and_explains_its_session(demo):
    _, printed = demo
    assert "server: .venv/bin/python mero_mcp.py, with CALIMERO_NODE_URL=http://127.0.0.1:" in printed
    for heading in ("initialize", "tools/list (", "node_status", "select_app kv-store",
                    "kv_store_set {key: greeting, value: hello}", "kv_store_get {key: greeting}",
                    "kv_store_set with a wrong type (refused locally, nothing sent)"):
        assert "\n── " + heading in printed, heading
    assert "negotiated protocol 2025-11-25 with mero-mcp" in printed
    assert "null\n   (null: set returns nothing, its ABI return type is unit" in printed
    assert '"structuredContent": {\n    "result": "hello"\n  }' in printed and "one value in two forms" in printed
    assert re.search(r'"then": "get ran in context [0-9a-f]{64} \(named \\"demo\\"\)\."', printed), printed
    assert "- value: expected string, got 42" in printed
    assert "python3 tests/node_double.py --sample --port 2530" in printed
    assert "claude mcp add -s user mero-mcp --env CALIMERO_NODE_URL=http://127.0.0.1:2530 -- " in printed


# ── No package index (pip pointed at a closed port) ────────────────────────────────────────────────────

DEMO_HEADINGS = ("\n── initialize", "\n── kv_store_get {key: greeting}", "- value: expected string, got 42")


def test_without_an_index_make_demo_runs_on_the_interpreters_own_packages(tmp_path_factory):
    clone = fresh_clone(tmp_path_factory)
    done = make(clone, "demo", "PYTHON=" + sys.executable, env=no_index_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.splitlines() == [OWN_PACKAGES % sys.executable], done.stderr
    assert done.stdout.startswith("%s tests/demo.py\n" % sys.executable), done.stdout
    assert all(heading in done.stdout for heading in DEMO_HEADINGS), done.stdout
    assert not (clone / ".venv").exists()


def test_without_an_index_or_the_packages_make_demo_says_what_it_needs(tmp_path_factory):
    """One line of ours naming the distribution's packages (make adds its own `***` line), and no .venv."""
    clone = fresh_clone(tmp_path_factory)
    bare = tmp_path_factory.mktemp("bare")
    venv.EnvBuilder(with_pip=False).create(str(bare))
    python = bare / "bin" / "python"
    done = make(clone, "demo", "PYTHON=%s" % python, env=no_index_env())
    assert done.returncode != 0 and done.stdout == "", done.stdout + done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("make: ") and "***" not in line]
    assert ours == ["make: .venv cannot be built (ERROR: No matching distribution found for setuptools>=61), and %s "
                    "lacks some of requests and jsonschema: sudo apt install python3-requests python3-jsonschema "
                    "(Debian, Ubuntu), or reach a package index, then run make again" % python], done.stderr
    assert not (clone / ".venv").exists()


def test_without_an_index_make_test_runs_the_suite_on_the_interpreters_own_pytest(tmp_path_factory):
    """`make test` there: the files TESTS names (one quick file here) and only those, on this interpreter's requests,
    jsonschema and pytest (side by side when it has pytest-xdist); `make test-oldest` says its one line (no index:
    its pins cannot be had); and neither venv left."""
    clone = fresh_clone(tmp_path_factory)
    done = make(clone, "test", "PYTHON=" + sys.executable, "TESTS=tests/test_tool_lint.py", env=no_index_env())
    assert done.returncode == 0, done.stdout + done.stderr
    with_pytest = OWN_PACKAGES.replace("requests and jsonschema", "requests, jsonschema and pytest")
    assert done.stderr.splitlines() == [with_pytest % sys.executable], done.stderr
    printed = done.stdout.splitlines()
    assert re.fullmatch(r"%s -m pytest -q( -n \d+ --dist loadgroup)? tests/test_tool_lint\.py" % re.escape(sys.executable),
                        printed[0]), printed
    assert " passed" in printed[-1] and not [line for line in printed if "test-oldest" in line], printed
    oldest = make(clone, "test-oldest", "PYTHON=" + sys.executable, env=no_index_env())
    assert oldest.returncode == 0, oldest.stdout + oldest.stderr
    assert oldest.stdout.splitlines()[-1].startswith(("test-oldest: skipped, no package index answers for "
                                                      "requests==2.25.1", "test-oldest: skipped, no Python 3.9 here")), \
        oldest.stdout
    assert not (clone / ".venv").exists() and not (clone / ".venv-oldest").exists()
