"""CALIMERO_MCP_APPS, the tool budget: which installed apps get generated method tools.

Comma-separated application names — id, package, trailing package segment or display name, as every tool
that names an app resolves them; unset means every app. A name that matches nothing is reported once on
stderr. Apps left out keep working through describe_app, select_app and call.
"""
from __future__ import annotations

import json
import time

import pytest

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
    assert len(fixed) == 30, "the budget limits generated tools only"


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

    assert server.call_tool("call", {"app_handle": handle, "method": "set", "args": {"key": "a", "value": "1"}}) \
        == {"content": [{"type": "text", "text": "null"}]}
    got = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "get", "args": {"key": "a"}})
    assert got == {"content": [{"type": "text", "text": "1"}]}
    refused = server.call_tool("call", {"app_handle": handle, "method": "get", "args": {"key": 5}})
    assert refused.get("isError") is True and "key: expected string" in refused["content"][-1]["text"]
    many = server.call_tool("call_many", {"calls": [{"app_handle": handle, "method": "len"}] * 2})
    assert [item["ok"] for item in json.loads(many["content"][0]["text"])] == [True, True]

    # Using the app did not pull it into the catalog: its tools stay out, and by name they are unknown.
    assert generated(server) == COUNTER_TOOLS
    reply = server.request("tools/call", {"name": "kv_store_get", "arguments": {"app_handle": handle, "key": "a"}})
    assert reply["error"] == {"code": -32602, "message": "Unknown tool: kv_store_get"}
    assert not any(n.get("method") == "notifications/tools/list_changed" for n in server.notifications)
    assert len(double.requests_to("POST", "/jsonrpc")) == 4
