"""`pip install .` gives a `mero-mcp` command (setup.cfg's console script) that serves MCP on stdio; the three
modules travel together."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv

import pytest

from mcp_client import ROOT, SERVER, McpServer, minimal_env

OFFLINE_SIGNS = ("NewConnectionError", "No matching distribution", "Could not find a version", "Temporary failure")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with this checkout installed (without requests/jsonschema: --no-deps)."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(home)
    pip = subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                          "--disable-pip-version-check", str(ROOT)],
                         capture_output=True, text=True, timeout=300)
    if pip.returncode != 0 and any(sign in pip.stdout + pip.stderr for sign in OFFLINE_SIGNS):
        pytest.skip("the package index is out of reach, so the build backend cannot be fetched")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return home / "bin" / "mero-mcp"


def test_the_command_exists_and_reports_its_version(installed):
    out = subprocess.run([str(installed), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("mero-mcp ")


def test_the_command_answers_initialize_without_requests_or_jsonschema(installed, tmp_path):
    """The venv holds neither runtime package: answering initialize must need neither (cold start)."""
    message = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
    out = subprocess.run([str(installed)], input=json.dumps(message) + "\n", capture_output=True, text=True,
                         timeout=30, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                                          "CALIMERO_NODE_URL": "http://127.0.0.1:9",
                                          "CALIMERO_MCP_STATE_DIR": str(tmp_path / "state")})
    answer = json.loads(out.stdout.splitlines()[0])
    assert answer["id"] == 0 and answer["result"]["protocolVersion"] == "2025-06-18"
    assert answer["result"]["serverInfo"]["name"] == "mero-mcp"


def test_the_modules_are_installed_flat(installed):
    python = installed.parent / "python"
    out = subprocess.run([str(python), "-c", "import mero_mcp, abi, node, sys; print(mero_mcp.__file__)"],
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "site-packages" in out.stdout


def test_mero_mcp_py_copied_alone_says_its_siblings_are_missing(tmp_path):
    """The three modules travel together; alone, the script answers initialize, then names what is missing.
    `-S` keeps site-packages (and this checkout's editable install, which would supply node.py) out of reach."""
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(str(SERVER), str(alone / "mero_mcp.py"))
    env = minimal_env(tmp_path, {"CALIMERO_NODE_URL": "http://127.0.0.1:9",
                                 "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})
    command = [sys.executable, "-S", str(alone / "mero_mcp.py")]
    check = subprocess.run(command + ["--check"], capture_output=True, text=True, timeout=30, env=env)
    missing = "node.py is missing from %s: mero_mcp.py, abi.py and node.py travel together." % alone
    assert check.returncode == 1 and missing in check.stderr and "Traceback" not in check.stderr
    server = McpServer(env, command=command)
    try:
        server.initialize()
        result = server.call_tool("node_status")
        assert result["isError"] is True
        assert result["content"][-1]["text"].startswith("Error: ") and ".py is missing from %s" % alone \
            in result["content"][-1]["text"]
        assert server.call_tool("list_applications")["isError"] is True
    finally:
        server.close()
    assert "Traceback" not in server.stderr
