"""The session hears when the catalog changes: subscriptions/listen in 2026-07-28 (basic/patterns/subscriptions,
server/tools "List Changed Notification"), and a slow first catalog read announced in both eras."""
from __future__ import annotations


import pytest

from mcp_client import MODERN_META, McpServer, minimal_env, tuned_server
from node_double import NodeDouble, counter_spec, kv_store_spec, sample_double

MODERN = MODERN_META
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
TOOLS_CHANGED, RESOURCES_CHANGED = "notifications/tools/list_changed", "notifications/resources/list_changed"
LONG = 60.0

FRESH_ABI = {"schema_version": "wasm-abi/1", "types": {}, "events": [],
             "methods": [{"name": "hello", "params": [], "returns": {"kind": "string"}, "intent": "read_only"}]}


def spec(package, guide=None):
    metadata = {"name": package.rsplit(".", 1)[-1].title()}
    if guide:
        metadata["guide"] = guide
    return {"package": package, "version": "2.0.0", "signer_id": "did:key:x", "metadata": metadata,
            "abi": FRESH_ABI}


@pytest.fixture
def registry_double():
    """kv-store installed; two apps in the registry: one with a guide, one without."""
    node = NodeDouble(apps=[kv_store_spec()], registry={
        "com.example.fresh@2.0.0": spec("com.example.fresh", guide="# Fresh\n"),
        "com.example.plain@2.0.0": spec("com.example.plain")}).start()
    yield node
    node.stop()


def env_for(url, tmp_path):
    return minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": url, "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                                           "CALIMERO_NODE_HOME": tmp_path / "nodes"})


def modern(params=None):
    return dict(params or {}, _meta=MODERN)


def listen(server, request_id, notifications):
    """Open a listen; returns its acknowledgement (the listen itself gets no response while it is open)."""
    server.send({"jsonrpc": "2.0", "id": request_id, "method": "subscriptions/listen",
                 "params": modern({"notifications": notifications})})
    return server.wait_notification(lambda n: n.get("method") == ACKNOWLEDGED
                                    and n["params"]["_meta"].get(SUBSCRIPTION_ID) == request_id)


def heard(server):
    """(method, subscription id) of every list_changed notification so far; None where no id rode along."""
    return [(n["method"], n.get("params", {}).get("_meta", {}).get(SUBSCRIPTION_ID, None))
            for n in server.notifications if n.get("method") in (TOOLS_CHANGED, RESOURCES_CHANGED)]


def modern_tool(server, name, arguments):
    result = server.result("tools/call", modern({"name": name, "arguments": arguments}), timeout=LONG)
    assert not result.get("isError"), result
    return result


def answers_for(server, request_id):
    return [f for f in server.pending.values() if f.get("id") == request_id]


def drain(server):
    """After the server exited: file every frame it wrote."""
    while True:
        frame = server.read()
        if frame is None:
            return
        server._file(frame)


# ── subscriptions/listen ─────────────────────────────────────────────────────────────────────────

def test_two_listens_each_hear_what_they_asked_for(start_server, registry_double, tmp_path):
    server = start_server(env_for(registry_double.url, tmp_path), initialize=None)
    tools_ack = listen(server, "tools", {"toolsListChanged": True, "resourcesListChanged": False})
    guides_ack = listen(server, 7, {"resourcesListChanged": True, "promptsListChanged": True,
                                    "resourceSubscriptions": ["calimero://apps/x/1.0.0/guide"]})
    # Acknowledged with exactly what is honoured: no prompts here, and a guide uri never changes in place.
    assert tools_ack["params"] == {"_meta": {SUBSCRIPTION_ID: "tools"}, "notifications": {"toolsListChanged": True}}
    assert guides_ack["params"] == {"_meta": {SUBSCRIPTION_ID: 7}, "notifications": {"resourcesListChanged": True}}
    # The open listens do not hold the loop: requests are answered meanwhile.
    assert "kv_store_get" in [t["name"] for t in server.result("tools/list", modern())["tools"]]
    assert heard(server) == []

    modern_tool(server, "install_application", {"coords": "com.example.fresh@2.0.0"})
    assert heard(server) == [(TOOLS_CHANGED, "tools"), (RESOURCES_CHANGED, 7)]
    assert "fresh_hello" in [t["name"] for t in server.result("tools/list", modern())["tools"]]

    modern_tool(server, "install_application", {"coords": "com.example.plain@2.0.0"})   # new tools, no guide
    assert heard(server)[2:] == [(TOOLS_CHANGED, "tools")]
    assert answers_for(server, "tools") == answers_for(server, 7) == []


def test_a_cancelled_listen_hears_nothing_more_and_stdin_close_ends_the_rest(registry_double, tmp_path):
    server = McpServer(env_for(registry_double.url, tmp_path))
    try:
        listen(server, "a", {"toolsListChanged": True})
        listen(server, "b", {"toolsListChanged": True, "resourcesListChanged": True})
        server.notify("notifications/cancelled", {"requestId": "a", "reason": "done listening"})
        modern_tool(server, "install_application", {"coords": "com.example.fresh@2.0.0"})
        assert heard(server) == [(TOOLS_CHANGED, "b"), (RESOURCES_CHANGED, "b")]
    finally:
        assert server.close(timeout=10) == 0          # open listens do not keep the process alive
    # The server ended "b" itself, so it answers it (graceful closure); "a" was cancelled: never answered.
    drain(server)
    closed = server.wait_for("b")
    assert closed["result"]["resultType"] == "complete"
    assert closed["result"]["_meta"][SUBSCRIPTION_ID] == "b"
    assert answers_for(server, "a") == []
    server.assert_stdout_pure()


def test_a_listen_cancelled_before_its_turn_never_opens(tmp_path):
    slow = sample_double(exec_delay=2.0).start()
    server = McpServer(env_for(slow.url, tmp_path))
    try:
        handle = modern_tool(server, "select_app", {"app": "kv-store", "context": "demo"}
                             )["structuredContent"]["app_handle"]
        server.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                     "params": modern({"name": "call", "arguments": {"app_handle": handle, "method": "len"}})})
        server.send({"jsonrpc": "2.0", "id": "late", "method": "subscriptions/listen",
                     "params": modern({"notifications": {"toolsListChanged": True}})})
        server.notify("notifications/cancelled", {"requestId": "late"})
        assert "result" in server.wait_for("slow", LONG)
        slow.exec_delay = 0.0
        assert server.result("tools/list", modern())["tools"]
        assert not [n for n in server.notifications if n.get("method") == ACKNOWLEDGED]
    finally:
        assert server.close(timeout=10) == 0
        slow.stop()
    drain(server)
    assert answers_for(server, "late") == []          # not even the completion result at stdin close


@pytest.mark.parametrize("notifications,problem", [
    (None, "params.notifications"), ([True], "params.notifications"), ({"toolsListChanged": "yes"}, "toolsListChanged"),
    ({"resourcesListChanged": 1}, "resourcesListChanged"), ({"resourceSubscriptions": "calimero://x"},
                                                            "resourceSubscriptions")])
def test_a_malformed_listen_is_refused(start_server, registry_double, tmp_path, notifications, problem):
    server = start_server(env_for(registry_double.url, tmp_path), initialize=None)
    params = {} if notifications is None else {"notifications": notifications}
    reply = server.request("subscriptions/listen", modern(params))
    assert reply["error"]["code"] == -32602 and problem in reply["error"]["message"], reply
    assert not [n for n in server.notifications if n.get("method") == ACKNOWLEDGED]


def test_a_listen_asking_for_nothing_we_send_is_acknowledged_empty(start_server, registry_double, tmp_path):
    server = start_server(env_for(registry_double.url, tmp_path), initialize=None)
    assert listen(server, "x", {"promptsListChanged": True})["params"]["notifications"] == {}
    modern_tool(server, "install_application", {"coords": "com.example.fresh@2.0.0"})
    assert heard(server) == []


def test_the_handshake_era_has_no_listen_and_hears_on_the_session(start_server, registry_double, tmp_path):
    server = start_server(env_for(registry_double.url, tmp_path))
    assert server.request("subscriptions/listen", {"notifications": {"toolsListChanged": True}}
                          )["error"]["code"] == -32601
    server.tool_json("install_application", {"coords": "com.example.plain@2.0.0"})
    assert heard(server) == [(TOOLS_CHANGED, None)]        # no guide came with it: the resources did not change
    server.tool_json("install_application", {"coords": "com.example.fresh@2.0.0"})
    assert heard(server)[1:] == [(TOOLS_CHANGED, None), (RESOURCES_CHANGED, None)]


# ── a slow first catalog read ────────────────────────────────────────────────────────────────────

def impatient_server(env, seconds=0.5):
    """The real server, with tools/list waiting `seconds` (not 5 s) for the first catalog read."""
    return tuned_server(env, "import mero_apps\nmero_apps.FIRST_LOAD_WAIT = %r" % seconds,
                        check="hasattr(__import__('mero_apps'), 'FIRST_LOAD_WAIT')")


@pytest.fixture
def slow_catalog(tmp_path):
    """A node whose application list takes 3 s to answer the first time."""
    node = NodeDouble(apps=[kv_store_spec(), counter_spec()]).start()
    node.faults.update({"delay": 3, "paths": ["/admin-api/applications"], "times": 1})
    yield node
    node.stop()


def test_a_slow_first_read_is_announced_to_the_session(slow_catalog, tmp_path):
    server = impatient_server(env_for(slow_catalog.url, tmp_path))
    try:
        server.initialize()
        assert "kv_store_get" not in server.tool_names()     # answered with what there is, not after 3 s
        server.wait_notification(lambda n: n.get("method") == TOOLS_CHANGED, LONG)
        server.wait_notification(lambda n: n.get("method") == RESOURCES_CHANGED, LONG)   # kv-store has a guide
        assert "kv_store_get" in server.tool_names()
        assert heard(server) == [(TOOLS_CHANGED, None), (RESOURCES_CHANGED, None)]
    finally:
        server.close()
    server.assert_stdout_pure()


def test_a_slow_first_read_is_announced_to_listens(slow_catalog, tmp_path):
    server = impatient_server(env_for(slow_catalog.url, tmp_path))
    try:
        listen(server, 1, {"toolsListChanged": True})
        assert "kv_store_get" not in [t["name"] for t in server.result("tools/list", modern())["tools"]]
        server.wait_notification(lambda n: n.get("method") == TOOLS_CHANGED, LONG)
        assert "kv_store_get" in [t["name"] for t in server.result("tools/list", modern())["tools"]]
        assert heard(server) == [(TOOLS_CHANGED, 1)]
    finally:
        server.close()
    server.assert_stdout_pure()


def test_a_first_read_nobody_waited_for_is_not_announced(start_server, registry_double, tmp_path):
    server = start_server(env_for(registry_double.url, tmp_path))
    assert "kv_store_get" in server.tool_names()
    assert server.result("ping") == {}
    assert heard(server) == []
