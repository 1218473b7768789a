"""One call, one state (issue 24): what a call reads or decides is its own, a cancelled call sends no change it
had not sent when the cancel came, and destructive tools act on exactly what was named.

Every test drives the real server over stdio against the node double; a slow route (`NodeDouble.slow`) holds a
call where a user would press Esc.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

import node
from node_double import sample_double

LONG = 30.0
KV = "com.calimero.kv-store"


def text_of(result):
    return result["content"][-1]["text"]


def answers_to(server, request_id):
    """Every response the server sent for `request_id` so far."""
    found = []
    for line in server.raw_lines:
        frame = json.loads(line)
        for item in frame if isinstance(frame, list) else [frame]:
            if item.get("id") == request_id and ("result" in item or "error" in item):
                found.append(item)
    return found


def wait_until(predicate, what, timeout=LONG):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.01)


def send_call(server, request_id, name, arguments):
    server.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                 "params": {"name": name, "arguments": arguments}})


def cancel(server, request_id):
    server.notify("notifications/cancelled", {"requestId": request_id, "reason": "user pressed Esc"})


def seen(double, method, path):
    return [entry for entry in double.log if entry["method"] == method and entry["path"] == path]


@pytest.fixture
def kv():
    double = sample_double()
    double.kv_id = double._app_key(KV)
    double.demo = double._aliases["context"]["demo"]
    return double


def executions(double, method):
    return [e for e in double.executions if e["method"] == method]


# ---- 1. per-call state ----

def test_after_a_cancelled_slow_call_a_new_alias_resolves(serve, kv):
    server = serve(kv)
    server.result("tools/list")
    kv.slow = {"/admin-api/contexts/" + kv.demo: 1.0}
    send_call(server, "slow", "call", {"app": KV, "context": "demo", "method": "len"})
    wait_until(lambda: seen(kv, "GET", "/admin-api/contexts/" + kv.demo), "the slow call's context read")
    cancel(server, "slow")
    kv.slow = {}
    other = kv.add_context(kv.kv_id, group_id=kv._contexts[kv.demo]["groupId"], name="later")
    kv.add_alias("later", other)
    done = server.call_tool("call", {"app": KV, "context": "later", "method": "set",
                                     "args": {"key": "k", "value": "v"}}, timeout=LONG)
    assert not done.get("isError"), done
    assert [e["contextId"] for e in executions(kv, "set")] == [other]
    time.sleep(1.2)                                 # the cancelled call's read comes back now
    assert answers_to(server, "slow") == []
    assert executions(kv, "len") == []              # an execute is a POST: cancelled before it left


def test_after_a_cancelled_slow_call_a_second_namespace_makes_the_name_ambiguous(serve, kv):
    server = serve(kv, CALIMERO_MCP_TOOLSETS="core,governance")
    first = kv.add_namespace(kv.kv_id, name="alpha")
    kv.slow = {"/admin-api/groups/" + first: 1.0}
    send_call(server, "slow", "describe_group", {"group": "alpha"})
    wait_until(lambda: seen(kv, "GET", "/admin-api/groups/" + first), "the slow call's group read")
    cancel(server, "slow")
    kv.slow = {}
    second = kv.add_namespace(kv.kv_id, name="alpha")
    refused = server.call_tool("delete_namespace", {"namespace": "alpha"}, timeout=LONG)
    assert refused.get("isError") and "2 namespaces are named \"alpha\"" in text_of(refused), refused
    assert first in text_of(refused) and second in text_of(refused)
    assert {first, second} <= set(kv._groups), "nothing may be deleted on an ambiguous name"
    assert [e for e in kv.log if e["method"] == "DELETE"] == []
    time.sleep(1.2)
    assert answers_to(server, "slow") == []


# ---- 2. a cancel stops node writes ----

def test_a_cancelled_write_is_never_sent_and_the_next_write_stands(serve, kv):
    server = serve(kv)
    server.result("tools/list")
    kv.slow = {"/admin-api/contexts/" + kv.demo: 1.0}
    send_call(server, "old", "call", {"app": KV, "context": kv.demo, "method": "set",
                                      "args": {"key": "k", "value": "old"}})
    wait_until(lambda: seen(kv, "GET", "/admin-api/contexts/" + kv.demo), "the pre-read of the write")
    cancel(server, "old")
    time.sleep(1.3)                                  # the pre-read has come back: the write would go now
    kv.slow = {}
    done = server.call_tool("call", {"app": KV, "context": kv.demo, "method": "set",
                                     "args": {"key": "k", "value": "new"}}, timeout=LONG)
    assert not done.get("isError"), done
    time.sleep(0.3)
    assert [e["argsJson"]["value"] for e in executions(kv, "set")] == ["new"]
    assert kv._contexts[kv.demo]["kv"]["k"] == "new"
    assert answers_to(server, "old") == []


def test_a_cancelled_delete_context_deletes_nothing(serve, kv):
    server = serve(kv)
    kv.slow = {"/admin-api/alias/list/context": 1.0}     # delete_context reads the aliases first
    send_call(server, "del", "delete_context", {"context": kv.demo})
    wait_until(lambda: seen(kv, "GET", "/admin-api/alias/list/context"), "the alias pre-read")
    cancel(server, "del")
    time.sleep(1.3)
    kv.slow = {}
    assert kv.demo in kv._contexts
    assert [e for e in kv.log if e["method"] == "DELETE"] == []
    assert server.result("ping") == {}
    assert answers_to(server, "del") == []


def test_200_requests_with_cancels_mixed_in(serve, kv):
    """Every third request writes to a context whose reads are slow and is cancelled, half of them while they wait
    their turn and half once their pre-read is at the node: none of those writes reaches the node, none is
    answered; every other request is answered exactly once and its write applied."""
    server = serve(kv)
    server.result("tools/list")
    slow_context = kv.add_context(kv.kv_id, group_id=kv._contexts[kv.demo]["groupId"], name="slow")
    kv.slow = {"/admin-api/contexts/" + slow_context: 0.5}
    kept, cancelled = [], []
    for index in range(200):
        request_id = "r%d" % index
        if index % 3 == 2:
            send_call(server, request_id, "call", {"app": KV, "context": slow_context, "method": "set",
                                                   "args": {"key": "c%d" % index, "value": "x"}})
            if index % 2:
                running = len(cancelled) // 2 + 1
                wait_until(lambda: len(seen(kv, "GET", "/admin-api/contexts/" + slow_context)) >= running,
                           "the pre-read of " + request_id)
            cancel(server, request_id)
            cancelled.append(request_id)
        elif index % 3 == 1:
            server.send({"jsonrpc": "2.0", "id": request_id, "method": "ping"})
            kept.append(request_id)
        else:
            send_call(server, request_id, "call", {"app": KV, "context": kv.demo, "method": "set",
                                                   "args": {"key": "k%d" % index, "value": "v"}})
            kept.append(request_id)
    for request_id in kept:
        server.wait_for(request_id, timeout=LONG)
    time.sleep(0.8)                                 # the slow reads of the cancelled calls have all come back
    for request_id in kept:
        assert len(answers_to(server, request_id)) == 1, request_id
        assert "error" not in answers_to(server, request_id)[0]
    assert [r for r in cancelled if answers_to(server, r)] == []
    assert [e for e in executions(kv, "set") if e["contextId"] == slow_context] == []
    assert kv._contexts[slow_context]["kv"] == {}
    written = sorted(kv._contexts[kv.demo]["kv"])
    assert written == sorted("k%d" % i for i in range(200) if i % 3 == 0)


def node_env(tmp_path, double):
    return {"HOME": str(tmp_path / "home"), "CALIMERO_MCP_STATE_DIR": str(tmp_path / "state"),
            "CALIMERO_NODE_HOME": str(tmp_path / "nodes"), "CALIMERO_NODE_URL": double.url}


def test_a_scope_carried_to_another_thread_refuses_its_writes_once_cancelled(tmp_path, kv):
    """node.py's per-call scope: a helper thread of the call enters `current_scope()` and is held to its ticket;
    reads still go (they change nothing)."""
    kv.start()
    try:
        client, ticket, outcome = node.Node(node_env(tmp_path, kv)), threading.Event(), {}

        def helper(scope):
            with client.scope(scope):
                outcome["scope"] = client.current_scope()
                outcome["read"] = client.context(kv.demo)["id"]
                try:
                    client.delete_context(kv.demo)
                except node.NodeError as error:
                    outcome["write"] = error
        with client.scope(ticket=ticket):
            scope = client.current_scope()
            ticket.set()
        worker = threading.Thread(target=helper, args=(scope,))
        worker.start()
        worker.join(LONG)
        assert outcome["scope"] is scope and outcome["read"] == kv.demo
        assert isinstance(outcome["write"], node.CancelledBeforeSent)
        assert "DELETE /admin-api/contexts/%s was not sent" % kv.demo in str(outcome["write"])
        assert kv.demo in kv._contexts and [e for e in kv.log if e["method"] == "DELETE"] == []
        assert client.current_scope() == node.Scope()
    finally:
        kv.stop()


# ---- 9. the deadline watcher ----

def test_a_late_deadline_never_cuts_a_connection_another_request_took(tmp_path, kv, monkeypatch):
    """A request's deadline may come due after its answer was read and its connection went back to the pool (the
    watcher thread runs when it can). Its watch is kept alive here past its deadline, which only a scheduler
    could otherwise arrange: the next request, slow, takes the same pooled connection and must get its answer."""
    kv.start()
    try:
        client = node.Node(node_env(tmp_path, kv))
        client.health()                              # connected; the pool holds one idle connection
        kept = []
        monkeypatch.setattr(node._deadlines, "stop", kept.append)
        client.get("/admin-api/applications", timeout=0.3)
        monkeypatch.undo()
        assert len(kept) == 1 and not kept[0].fired
        kv.slow = {"/admin-api/contexts": 1.0}
        assert client.context(kv.demo)["id"] == kv.demo     # on the same connection, past the old deadline
        assert kept[0].done and not kept[0].fired
    finally:
        kv.stop()


# ---- 6. bad input is a tool error ----

@pytest.mark.parametrize("offset", [1.0, "1", -1, 2 ** 64, True])
def test_get_blob_refuses_an_offset_that_is_no_byte_count(serve, kv, offset):
    server = serve(kv)
    blob = server.tool_json("upload_blob", {"text": "hello, blob"})["blobId"]
    result = server.call_tool("get_blob", {"blob": blob, "offset": offset})
    assert result.get("isError") is True, result
    assert "offset" in text_of(result)
    assert server.tool_json("get_blob", {"blob": blob, "offset": 1})["content"] == "ello, blob"


# ---- 8. the wire ----

def test_a_byte_order_mark_and_empty_lines_are_ignored(serve, kv):
    server = serve(kv, initialize=None)
    server.send_raw(b"\xef\xbb\xbf" + json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}).encode())
    assert server.wait_for(1)["result"]["protocolVersion"] == "2025-11-25"
    server.send_raw(b"\n")
    server.send_raw(b"\r\n")
    server.send_raw(b"   \n")
    server.send({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert server.wait_for(2)["result"] == {}
    time.sleep(0.2)
    assert [json.loads(line).get("id") for line in server.raw_lines] == [1, 2]
    # A mark after the first message is no JSON: it gets the parse error any other stray byte would.
    server.send_raw(b"\xef\xbb\xbf" + json.dumps({"jsonrpc": "2.0", "id": 3, "method": "ping"}).encode())
    assert server.read()["error"]["code"] == -32700
