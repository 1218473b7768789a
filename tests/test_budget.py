"""CALIMERO_MCP_APPS, the tool budget: which installed apps get generated method tools.

Comma-separated application names — id, package, trailing package segment or display name, as every tool
that names an app resolves them; unset means every app. A name that matches nothing is reported once on
stderr. Apps left out keep working through describe_app, select_app and call.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

import fixture_apps
from mcp_client import ROOT, SERVER, fixed_names, minimal_env
from node_double import NodeDouble

KV_TOOLS = {"kv_store_clear", "kv_store_entries", "kv_store_get", "kv_store_get_or_insert", "kv_store_get_result",
            "kv_store_len", "kv_store_remove", "kv_store_set", "kv_store_update_if_exists"}
COUNTER_TOOLS = {"counter_increment", "counter_value"}


def generated(server, expect_some=True):
    """The generated tool names, once the first catalog read is done (it runs off the answer path)."""
    deadline = time.monotonic() + 20
    while True:
        names = {n for n in server.tool_names() if n.startswith(("kv_store_", "counter_"))}
        if names or not expect_some:
            return names
        assert time.monotonic() < deadline, "no generated tools appeared; stderr:\n" + server.stderr
        time.sleep(0.1)


def budget_env(server_env, value):
    env = dict(server_env)
    if value is not None:
        env["CALIMERO_MCP_APPS"] = value
    return env


@pytest.mark.parametrize("value, expected", [
    (None, KV_TOOLS | COUNTER_TOOLS),
    ("", KV_TOOLS | COUNTER_TOOLS),
    (" , ", KV_TOOLS | COUNTER_TOOLS),
    ("com.calimero.kv-store", KV_TOOLS),               # package
    ("counter", COUNTER_TOOLS),                        # trailing segment
    ("KV Store", KV_TOOLS),                            # display name
    ("kv store", KV_TOOLS),                            # display names compare without case
    ("Counter , com.calimero.kv-store", KV_TOOLS | COUNTER_TOOLS),
])
def test_budget_by_name(start_server, server_env, value, expected):
    server = start_server(budget_env(server_env, value))
    assert generated(server) == expected
    assert "CALIMERO_MCP_APPS" not in server.stderr
    fixed = [n for n in server.tool_names() if not n.startswith(("kv_store_", "counter_"))]
    assert fixed == fixed_names(), "the budget limits generated tools only"


def test_budget_by_id(start_server, server_env, double):
    kv_id = double._app_key("com.calimero.kv-store")
    server = start_server(budget_env(server_env, kv_id))
    assert generated(server) == KV_TOOLS


def test_unknown_name_is_reported_once(start_server, server_env, double):
    server = start_server(budget_env(server_env, "nope, counter, kv-stor"))
    assert generated(server) == COUNTER_TOOLS
    # Another catalog read (an upgrade met by select_app) must not repeat the warnings.
    double.upgrade_app(double._app_key("com.example.counter"), "0.2.0")
    selected = server.call_tool("select_app", {"app": "counter"})
    assert not selected.get("isError"), selected
    assert selected["structuredContent"]["appVersion"] == "0.2.0"
    listed = {t["name"]: t for t in server.result("tools/list")["tools"]}
    assert listed["counter_value"]["_meta"]["appVersion"] == "0.2.0", "the catalog was not read again"
    lines = [line for line in server.stderr_lines if "CALIMERO_MCP_APPS" in line]
    assert len(lines) == 2, lines
    assert any('"nope"' in line for line in lines) and any('"kv-stor"' in line for line in lines)
    assert all("com.calimero.kv-store" in line and "com.example.counter" in line for line in lines), lines
    assert not any('"counter"' in line for line in lines)


def test_no_name_matching_leaves_only_fixed_tools(start_server, server_env):
    server = start_server(budget_env(server_env, "nothing-here"))
    deadline = time.monotonic() + 20
    while "nothing-here" not in server.stderr:
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.05)
    assert generated(server, expect_some=False) == set()
    assert server.tool_json("list_applications")["apps"], "the apps are still installed and listed"


def test_left_out_apps_stay_reachable(start_server, server_env, double):
    server = start_server(budget_env(server_env, "counter"))
    assert generated(server) == COUNTER_TOOLS

    described = server.call_tool("describe_app", {"app": "kv-store"})
    assert not described.get("isError"), described
    assert any("set(key: string, value: string)" in m for m in described["structuredContent"]["methods"])

    selected = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})
    assert not selected.get("isError"), selected
    summary = selected["structuredContent"]
    assert summary["tools"] == [], "no generated tools for an app outside the budget"
    handle = summary["app_handle"]

    ran = server.call_tool("call", {"app_handle": handle, "method": "set", "args": {"key": "a", "value": "1"}})
    demo = double.executions[-1]["contextId"]
    assert ran["content"][:2] == [{"type": "text", "text": "null"},     # unit: null, then what ran where (a handle
                                  {"type": "text", "text": 'set ran in context %s (named "demo"); it returns '  # names
                                                           'nothing.' % demo}]                   # no alias)
    assert len(ran["content"]) == 3 and ran["content"][2]["text"].startswith("Events in context ")  # what it emitted
    assert "structuredContent" not in ran
    got = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "get", "args": {"key": "a"}})
    assert got == {"content": [{"type": "text", "text": '"1"'},
                               {"type": "text", "text": 'get ran in context %s (alias "demo").' % demo}]}
    refused = server.call_tool("call", {"app_handle": handle, "method": "get", "args": {"key": 5}})
    assert refused.get("isError") is True and "key: expected string" in refused["content"][-1]["text"]
    many = server.call_tool("call_many", {"calls": [{"app_handle": handle, "method": "len"}] * 2})
    rows = json.loads(many["content"][0]["text"])
    assert [(row["ok"], row.get("items")) for row in rows] == [(True, "0-1")]     # two equal successes, one row

    # Using the app did not pull it into the catalog: its tools stay out, and by name they are unknown.
    assert generated(server) == COUNTER_TOOLS
    reply = server.request("tools/call", {"name": "kv_store_get", "arguments": {"app_handle": handle, "key": "a"}})
    assert reply["error"] == {"code": -32602, "message": "Unknown tool: kv_store_get"}
    assert not any(n.get("method") == "notifications/tools/list_changed" for n in server.notifications)
    assert len(double.requests_to("POST", "/jsonrpc")) == 4


# ── --check tells the tool budget up front ───────────────────────────────────────────────────────

TOOLS_LINE = re.compile(r"^Tools: +(\d+) advertised \((\d+) fixed, (\d+) for apps\)(.*)$", re.M)


def run_check(env):
    done = subprocess.run([sys.executable, str(SERVER), "--check"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.returncode == 0, done.stdout
    return done.stdout


def check_count(output):
    """(advertised, fixed, for apps, the rest of the line) of --check's Tools line."""
    found = TOOLS_LINE.search(output)
    assert found, output
    return int(found.group(1)), int(found.group(2)), int(found.group(3)), found.group(4)


def listed_count(start_server, env):
    """len(tools/list) of a fresh session: the first list waits for the first catalog read."""
    server = start_server(env)
    tools = server.result("tools/list")["tools"]
    return len(tools), sum(1 for t in tools if "_meta" not in t)


@pytest.mark.parametrize("extra", [
    {}, {"CALIMERO_MCP_TOOLSETS": "core"}, {"CALIMERO_MCP_TOOLSETS": "blobs"}, {"CALIMERO_MCP_APPS": "counter"},
    {"CALIMERO_MCP_APPS": "KV Store, nope"}, {"CALIMERO_MCP_APPS": "nothing-here", "CALIMERO_MCP_TOOLSETS": "core"},
])
def test_check_counts_what_tools_list_advertises(start_server, server_env, extra):
    env = dict(server_env, **extra)
    advertised, fixed, for_apps, _ = check_count(run_check(env))
    assert (advertised, fixed) == listed_count(start_server, env)
    assert advertised == fixed + for_apps


def test_check_says_how_to_trim_past_a_host_limit(server_env):
    output = run_check(server_env)               # the fixed tools + kv-store 9 + counter 2
    fixed, core = len(fixed_names()), len(fixed_names(["core"]))
    assert "Tools:     %d advertised (%d fixed, 11 for apps); over the limit of Cursor (40)\n" % (fixed + 11, fixed) \
        in output
    assert ("  To trim: CALIMERO_MCP_TOOLSETS=core keeps %d of the %d fixed tools; CALIMERO_MCP_APPS=<app>,<app> "
            "gives tools only to the apps named (call reaches every app).\n" % (core, fixed)) in output
    within = run_check(dict(server_env, CALIMERO_MCP_TOOLSETS="core"))
    assert "Tools:     %d advertised (%d fixed, 11 for apps)\n" % (core + 11, core) in within
    assert "To trim" not in within


def test_check_honours_calimero_mcp_apps_and_names_a_typo(server_env):
    output = run_check(dict(server_env, CALIMERO_MCP_APPS="counter, kv-stor"))
    assert "  - com.calimero.kv-store 1.0.0: 9 tools (left out by CALIMERO_MCP_APPS: call still reaches its methods)\n" \
        in output
    assert "  - com.example.counter 0.1.0: 2 tools\n" in output
    assert check_count(output)[:3] == (len(fixed_names()) + 2, len(fixed_names()), 2)
    assert ('  - CALIMERO_MCP_APPS names "kv-stor", which matches no installed application\n    Fix: Name an app by its '
            "id, package, last package segment or display name; installed: com.calimero.kv-store, "
            "com.example.counter.\n") in output
    assert '"counter"' not in output
    assert output.rstrip().endswith("OK, the server can work with this node."), "a typo is not fatal"


def test_check_names_an_unknown_toolset_with_the_known_ones(server_env):
    output = run_check(dict(server_env, CALIMERO_MCP_TOOLSETS="core,blobz,all-of-them"))
    assert ("  - CALIMERO_MCP_TOOLSETS names unknown toolsets all-of-them, blobz\n    Fix: Name toolsets among core, "
            "blobs, governance (core is always on; all, or leaving it unset, gives every one).\n") in output
    assert check_count(output)[1] == len(fixed_names(["core"]))     # core alone: the unknown names are left out
    assert output.rstrip().endswith("OK, the server can work with this node."), "a typo is not fatal"
    assert "unknown toolsets" not in run_check(dict(server_env, CALIMERO_MCP_TOOLSETS="all"))


@pytest.mark.parametrize("extra", [{}, {"CALIMERO_MCP_TOOLSETS": "core,governance"},
                                   {"CALIMERO_MCP_APPS": "apps-kv-store,core-abi_conformance"}])
def test_check_counts_the_shared_fixture_apps(start_server, tmp_path, extra):
    paths = fixture_apps.manifest_paths(fixture_apps.SHARED_ABIS)
    if not paths:
        pytest.skip("%s is absent: the shared fixtures live beside the checkout, not in it" % fixture_apps.SHARED_ABIS)
    double = NodeDouble()
    fixture_apps.install(double, paths)
    with double:
        env = minimal_env(tmp_path / "home", dict(extra, CALIMERO_NODE_URL=double.url,
                                                  CALIMERO_MCP_STATE_DIR=tmp_path / "state"))
        output = run_check(env)
        advertised, fixed, for_apps, rest = check_count(output)
        assert (advertised, fixed) == listed_count(start_server, env)
    if not extra:
        assert for_apps == fixture_apps.tool_count(paths)
        assert rest == "; over the limits of Cursor (40) and VS Code (128)", output


def test_node_py_does_not_import_the_server():
    """--check's count comes from mero_mcp.py through a parameter: node.py stays importable on its own."""
    done = subprocess.run([sys.executable, "-c", "import sys, node; assert 'mero_mcp' not in sys.modules"],
                          cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
