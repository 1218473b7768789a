"""`make demo` from a fresh copy of the checkout: it installs the runtime packages only, then shows its session."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from mcp_client import ROOT
from test_packaging import OFFLINE_SIGNS

LEFT_BEHIND = shutil.ignore_patterns(".venv", "__pycache__", "node_modules", "*.egg-info", ".pytest_cache", "build",
                                     ".git")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A copy of the checkout as a fresh clone has it (no .venv), and what `make demo` printed there."""
    if shutil.which("make") is None:
        pytest.skip("make is not on PATH")
    clone = tmp_path_factory.mktemp("clone") / "mero-mcp"
    shutil.copytree(str(ROOT), str(clone), ignore=LEFT_BEHIND)
    done = subprocess.run(["make", "demo", "PYTHON=" + sys.executable], cwd=str(clone), capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    if done.returncode != 0 and any(sign in done.stdout + done.stderr for sign in OFFLINE_SIGNS):
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
    assert "- value: expected string, got 42" in printed
    assert "python3 tests/node_double.py --sample --port 2530" in printed
    assert "claude mcp add -s user mero-mcp --env CALIMERO_NODE_URL=http://127.0.0.1:2530 -- " in printed
