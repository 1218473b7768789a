"""Node faults seen through the real server: every one a clear `isError` (or, for node_status, a result that
reports it) naming the node's url and what to do; never a hang past the node timeout, never a crash; and the
same server recovers when the node does.

The probes: node_status (a result even when the node is down), list_applications (a fixed tool), a generated
method tool (kv_store_len, with an app_handle) and `call`.
"""
from __future__ import annotations

import json
import time

import pytest

NODE_TIMEOUT = 2.0                # CALIMERO_MCP_TIMEOUT for the slow-node case
LONG = 60.0                      # "did not hang" bound for a call that waits on the node timeout


def text_of(result):
    return result["content"][-1]["text"]


def assert_fault(result, url, *wanted):
    """An isError result whose text names the node url and every wanted fragment."""
    assert result.get("isError") is True, result
    text = text_of(result)
    assert text.startswith("Error: "), text
    assert url in text, "the error does not name the node url %s: %s" % (url, text)
    for fragment in wanted:
        assert fragment in text, "%r missing from: %s" % (fragment, text)
    return text


def status_of(server):
    result = server.call_tool("node_status")
    assert not result.get("isError"), "node_status reports a node failure as a result: %r" % result
    return result["structuredContent"]


@pytest.fixture
def session(server, double):
    """A server with the catalog loaded and an app_handle for the kv-store's demo context."""
    deadline = time.monotonic() + 20
    while "kv_store_len" not in server.tool_names():
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.1)
    selected = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})
    return server, selected["structuredContent"]["app_handle"]


def probe_calls(handle):
    return [("list_applications", {}), ("kv_store_len", {"app_handle": handle}),
            ("call", {"app_handle": handle, "method": "len"}),
            ("call", {"app": "kv-store", "context": "demo", "method": "len"})]


def assert_all_work(server, handle):
    for name, arguments in probe_calls(handle):
        result = server.call_tool(name, arguments)
        assert not result.get("isError"), (name, result)
    assert status_of(server)["health"] == {"status": "alive"}


# ── faults the node answers with ──────────────────────────────────────────────────────────────────

RETRY_LOG = "retry, and check its log"
FAULTS = {
    "500 without body": ({"status": 500, "body": ""},
                         ["HTTP 500 Internal Server Error from", "the node returned no message", RETRY_LOG]),
    "500 with body": ({"status": 500, "body": "boom: disk full"},
                      ["HTTP 500 Internal Server Error from", "the node said: boom: disk full", RETRY_LOG]),
    "503 not yet": ({"status": 503}, ["cannot be resolved", "not ready for this yet (HTTP 503)",
                                      "retry in a few seconds"]),
    "503 without body": ({"status": 503, "body": ""},
                         ["HTTP 503 Service Unavailable", "retry in a few seconds"]),
    "garbage body": ({"garbage": True}, ["Unreadable response from", "not valid JSON", "Retry",
                                         "is a Calimero node"]),
    "truncated body": ({"truncated": True}, ["Unreadable response from", "the connection closed mid-response",
                                             "Retry"]),
    "connection reset": ({"reset": True}, ["Cannot reach the node at", "the connection was reset",
                                           "Start the node at"]),
    "closed without answer": ({"down": True}, ["Cannot reach the node at", "closed the connection without "
                                               "answering", "Start the node at"]),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_node_fault_on_every_route(session, double, name):
    server, handle = session
    fault, wanted = FAULTS[name]
    double.faults.update(fault)
    status = status_of(server)
    assert status["url"] == double.url
    assert status["health"]["status"] in ("error", "unreachable"), status
    assert wanted[1] in status["health"]["error"] or wanted[0] in status["health"]["error"], status
    for tool, arguments in probe_calls(handle):
        assert_fault(server.call_tool(tool, arguments), double.url, *wanted)
    double.faults.clear()
    assert_all_work(server, handle)                # the same process recovers with the node


@pytest.mark.parametrize("name", ["500 without body", "503 not yet", "garbage body", "truncated body",
                                  "connection reset"])
def test_node_fault_while_executing(session, double, name):
    """Admission passes, then the method call itself (POST /jsonrpc) fails: same clarity, nothing half-done."""
    server, handle = session
    fault, wanted = FAULTS[name]
    double.faults.update(dict(fault, paths=["/jsonrpc"]))
    for tool, arguments in probe_calls(handle)[1:]:
        text = assert_fault(server.call_tool(tool, arguments), double.url, *wanted)
        if text.startswith(("Error: Unreadable", "Error: HTTP")):
            assert "/jsonrpc" in text, text
    many = server.call_tool("call_many", {"calls": [{"app_handle": handle, "method": "len"}] * 3})
    items = json.loads(text_of(many))
    assert not many.get("isError") and [item["ok"] for item in items] == [False] * 3, many
    assert all(double.url in item["error"] for item in items if "authority" not in item["error"]), items
    double.faults.clear()
    assert_all_work(server, handle)


def test_the_nodes_own_words_stay_verbatim(session, double):
    """A 500 whose JSON body carries the node's message shows that message alone (reference §6)."""
    server, handle = session
    double.faults.update({"status": 500, "json": {"error": "store exploded"}})
    result = server.call_tool("list_applications")
    assert result == {"content": [{"type": "text", "text": "Error: store exploded"}], "isError": True}
    double.faults.clear()
    assert_all_work(server, handle)


def test_a_fault_that_heals_by_itself(session, double):
    server, handle = session
    double.faults.update({"reset": True, "times": 1})
    assert_fault(server.call_tool("list_applications"), double.url, "the connection was reset")
    assert_all_work(server, handle)


# ── the node goes away ────────────────────────────────────────────────────────────────────────────

def test_node_down_at_start_then_started_on_the_same_port(start_server, server_env, double):
    double.stop()                                  # the port is known, nothing listens on it
    server = start_server(server_env)
    deadline = time.monotonic() + 20
    while "app list unavailable at connect" not in server.stderr:
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.05)
    status = status_of(server)
    assert status["url"] == double.url and status["health"]["status"] == "unreachable"
    assert "connection refused" in status["health"]["error"] and double.url in status["health"]["error"]
    assert_fault(server.call_tool("list_applications"), double.url, "connection refused", "Start the node at")
    assert_fault(server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"}),
                 double.url, "connection refused")
    assert_fault(server.call_tool("select_app", {"app": "kv-store"}), double.url, "connection refused")
    names = server.tool_names()
    assert "node_status" in names and not any(n.startswith("kv_store_") for n in names)

    double.start()                                 # same object, same port
    assert status_of(server)["health"] == {"status": "alive"}
    apps = server.tool_json("list_applications")["apps"]
    assert [a["package"] for a in apps] == ["com.calimero.kv-store", "com.example.counter"]
    assert server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"}) \
        == {"content": [{"type": "text", "text": "0"}]}
    # The catalog recovers: the first app tool to meet the app reads it again and announces the change.
    selected = server.call_tool("select_app", {"app": "kv-store"})
    assert not selected.get("isError"), selected
    handle = selected["structuredContent"]["app_handle"]
    assert "kv_store_len" in selected["structuredContent"]["tools"]
    deadline = time.monotonic() + 10
    while not any(n.get("method") == "notifications/tools/list_changed" for n in server.notifications):
        assert time.monotonic() < deadline, "no tools/list_changed after the catalog recovered"
        server.request("ping")
    assert {"kv_store_len", "counter_value"} <= set(server.tool_names())
    assert server.call_tool("kv_store_len", {"app_handle": handle})["structuredContent"] == {"result": 0}


def test_node_killed_mid_session_and_restarted(session, double):
    server, handle = session
    assert not server.call_tool("kv_store_set", {"app_handle": handle, "key": "k", "value": "v"}).get("isError")
    double.stop()
    status = status_of(server)
    assert status["health"]["status"] == "unreachable" and double.url in status["health"]["error"]
    for tool, arguments in probe_calls(handle):
        assert_fault(server.call_tool(tool, arguments), double.url, "Cannot reach the node at", "Start the node at")
    assert_fault(server.call_tool("kv_store_set", {"app_handle": handle, "key": "k", "value": "w"}), double.url)
    assert "kv_store_get" in server.tool_names()   # the catalog keeps what it knew
    double.start()
    assert_all_work(server, handle)
    got = server.call_tool("kv_store_get", {"app_handle": handle, "key": "k"})   # the old handle still works
    assert got["structuredContent"] == {"result": "v"}, got
    context_id = server.tool_json("lookup_alias", {"name": "demo"})["contextId"]
    assert double.kv_state(context_id) == {"k": "v"}      # the write tried while the node was down never landed
    assert server.proc.poll() is None


def test_node_slower_than_the_timeout(start_server, server_env, double):
    """CALIMERO_MCP_TIMEOUT bounds every node request: the call fails then, and the server goes on."""
    server = start_server(dict(server_env, CALIMERO_MCP_TIMEOUT=str(NODE_TIMEOUT)))
    deadline = time.monotonic() + 20
    while "kv_store_len" not in server.tool_names():
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.1)
    handle = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})["structuredContent"]["app_handle"]
    double.faults.update({"delay": NODE_TIMEOUT + 1.5, "paths": ["/admin-api/applications"], "times": 1})
    server.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                 "params": {"name": "list_applications", "arguments": {}}})
    deadline = time.monotonic() + 5
    while not double.requests_to("GET", "/admin-api/applications"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.send({"jsonrpc": "2.0", "id": "alive", "method": "ping"})
    first = server.read(LONG)
    assert first == {"jsonrpc": "2.0", "id": "alive", "result": {}}, "ping waited behind the slow call"
    reply = server.wait_for("slow", LONG)
    text = assert_fault(reply["result"], double.url, "Cannot reach the node at", "timed out after 2 s",
                        "did not answer in time", "retry")
    assert "Start the node" not in text             # it is running: starting it is not the advice
    assert_all_work(server, handle)


# ── an output too deep to decode ─────────────────────────────────────────────────────────────────

DEEP = 100000                    # far past Python's JSON decoder (its recursion limit, 1000 by default)


@pytest.mark.parametrize("name,arguments", [
    ("kv_store_entries", {}), ("call", {"method": "entries"})])
def test_output_nested_deeper_than_the_decoder_allows_is_an_error_naming_the_method(session, double, name,
                                                                                   arguments):
    server, handle = session
    double.faults.update({"paths": ["/jsonrpc"], "times": 1, "raw": '{"jsonrpc":"2.0","id":1,"result":'
                          '{"output":%s%s}}' % ("[" * DEEP, "]" * DEEP)})
    result = server.call_tool(name, dict(arguments, app_handle=handle))
    assert result.get("isError") is True, result
    assert text_of(result) == ("Error: entries ran, but its output is nested too deeply to decode (more levels "
                               "than Python's JSON decoder allows)")
    assert "Traceback" not in server.stderr
    assert_all_work(server, handle)


def test_a_too_deep_output_fails_only_its_call_many_item(session, double):
    server, handle = session
    double.faults.update({"paths": ["/jsonrpc"], "times": 1, "raw": '{"jsonrpc":"2.0","id":1,"result":'
                          '{"output":%s%s}}' % ("[" * DEEP, "]" * DEEP)})
    items = json.loads(text_of(server.call_tool("call_many", {"calls": [{"app_handle": handle, "method": "entries"}]})))
    assert items == [{"ok": False, "error": "Error: entries ran, but its output is nested too deeply to decode "
                                            "(more levels than Python's JSON decoder allows)"}]
