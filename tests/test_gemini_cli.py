"""Interoperability with Gemini CLI's own MCP code (@google/gemini-cli-core 0.61.0), with every shared ABI installed.

Gemini CLI spawns a stdio server through its McpClient (stripping inherited variables named like TOKEN, KEY, AUTH or
PASSWORD from the server's environment: credentials go in the server's own `env` block), registers the tools in
its ToolRegistry and sends the model function declarations named `mcp_<server>_<tool>`, sanitised to
`^[a-zA-Z_][a-zA-Z0-9_.:-]*$` and cut in the middle past 63 characters. A tool whose declaration it cannot build is
dropped (with a diagnostic), and of two names that sanitise alike only the last is kept. tests/gemini_client/client.mjs
runs that discovery; this file installs the package once per session into a cache outside the checkout (skipping
when node or npm is missing or the install fails) and checks that every tool of ours arrives, under its own name.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import fixture_apps
from conftest import TESTS, node_with, npm_cache
from mcp_client import ROOT, SERVER, McpServer, minimal_env
from node_double import NodeDouble

GEMINI_CORE_VERSION = "0.61.0"
CLIENT_SOURCE = TESTS / "gemini_client"            # client.mjs and the pinned package.json; installed in a cache

RUN_TIMEOUT = 120
GEMINI_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}$")
SERVER_NAMES = ("mero-mcp", "calimero")      # README: keep the registered name at most 8 characters


@pytest.fixture(scope="module")
def gemini():
    """The command running client.mjs beside the pinned package (about 380 MB, so installed in a cache outside the
    checkout); a skip saying why when it cannot be."""
    folder = npm_cache(CLIENT_SOURCE, "gemini-cli-core-" + GEMINI_CORE_VERSION)
    return [node_with(folder, "@google/gemini-cli-core", GEMINI_CORE_VERSION, min_major=20), str(folder / "client.mjs")]


@pytest.fixture(scope="module")
def double():
    paths = fixture_apps.manifest_paths(fixture_apps.SHARED_ABIS)
    if not paths:
        pytest.skip("%s is absent: the shared fixtures live beside the checkout, not in it" % fixture_apps.SHARED_ABIS)
    made = NodeDouble()
    fixture_apps.install(made, paths)
    made.start()
    yield made
    made.stop()


@pytest.fixture(scope="module")
def our_tools(double, tmp_path_factory):
    """The tools our server lists for this node, as any client reads them."""
    home = tmp_path_factory.mktemp("ours")
    server = McpServer(server_env(double, home))
    try:
        server.initialize()
        return server.result("tools/list")["tools"]
    finally:
        server.close()


def server_env(double, home):
    return minimal_env(home / "home", {"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_STATE_DIR": home / "state"})


def discover(gemini, double, home, server_name, block=None, inherited=None):
    """One discovery by Gemini CLI's code, the server's `env` block holding the node url (and `block`), the CLI's own
    environment `inherited`; its report."""
    home.mkdir(parents=True, exist_ok=True)
    report = home / "report.json"
    env = dict(server_env(double, home), **(block or {}))
    spec = {"serverName": server_name, "command": sys.executable, "args": [str(SERVER)], "cwd": str(ROOT),
            "env": {key: value for key, value in env.items() if key.startswith("CALIMERO_")}, "report": str(report)}
    spec_file = home / "spec.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    try:
        done = subprocess.run(gemini + [str(spec_file)], cwd=os.path.dirname(gemini[1]),
                              env=minimal_env(home / "home", inherited), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail("Gemini CLI's discovery did not finish within %ss; output:\n%s" % (RUN_TIMEOUT, error.stdout))
    assert report.exists(), "client.mjs wrote no report (exit %s):\n%s\n%s" % (done.returncode, done.stdout,
                                                                               done.stderr)
    return json.loads(report.read_text(encoding="utf-8"))


@pytest.mark.parametrize("server_name", SERVER_NAMES)
def test_gemini_cli_accepts_every_tool_under_its_own_name(gemini, double, our_tools, tmp_path, server_name):
    seen = discover(gemini, double, tmp_path, server_name)
    assert seen["errors"] == [], "\n".join(seen["errors"])
    assert [d for d in seen["diagnostics"] if d["severity"] == "error"] == []
    names = [declaration["name"] for declaration in seen["declarations"]]
    generated = [tool for tool in our_tools if "_meta" in tool]
    assert len(generated) == fixture_apps.tool_count(fixture_apps.manifest_paths(fixture_apps.SHARED_ABIS))
    assert len(names) == len(set(names)) == len(our_tools), "Gemini CLI kept every tool"
    # its name is ours behind its prefix: nothing sanitised away, nothing cut, within Gemini's 64
    assert sorted(names) == sorted("mcp_%s_%s" % (server_name, tool["name"]) for tool in our_tools)
    assert all(GEMINI_NAME.match(name) and len(name) <= 64 for name in names), [n for n in names if len(n) > 64]
    assert all(declaration["hasSchema"] for declaration in seen["declarations"])
    assert seen["instructions"] and "app_handle" in seen["instructions"]


def test_credentials_reach_the_server_only_through_its_env_block(gemini, tmp_path):
    """README: Gemini CLI strips an inherited CALIMERO_PASSWORD, so the login fails and no app tool appears;
    the same password in the server's env block logs in."""
    locked = NodeDouble(auth={"users": {"admin": "s3cret"}})
    fixture_apps.install(locked, fixture_apps.manifest_paths(fixture_apps.OWN_ABIS))
    locked.start()
    try:
        user = {"CALIMERO_USERNAME": "admin"}
        stripped = discover(gemini, locked, tmp_path / "inherited", "mero-mcp", user, {"CALIMERO_PASSWORD": "s3cret"})
        passed = discover(gemini, locked, tmp_path / "block", "mero-mcp", dict(user, CALIMERO_PASSWORD="s3cret"))
    finally:
        locked.stop()
    generated = fixture_apps.tool_count(fixture_apps.manifest_paths(fixture_apps.OWN_ABIS))
    fixed = len(stripped["declarations"])
    assert not any(d["name"].startswith("mcp_mero-mcp_kv_store_") for d in stripped["declarations"])
    assert len(passed["declarations"]) == fixed + generated
