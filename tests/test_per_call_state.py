"""One call, one state: what a call reads or decides is its own, a cancelled call sends no change it
had not sent when the cancel came, and destructive tools act on exactly what was named.

Every test drives the real server over stdio against the node double; a slow route (`NodeDouble.slow`) holds a
call where a user would press Esc.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

import mero_node_errors
import mero_node_http
import node
from mcp_client import responses_to, wait_until
from node_double import sample_double

LONG = 30.0
KV = "com.calimero.kv-store"


def text_of(result):
    return result["content"][-1]["text"]


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
    assert responses_to(server, "slow") == []
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
    assert responses_to(server, "slow") == []


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
    assert responses_to(server, "old") == []


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
    assert responses_to(server, "del") == []


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
        assert len(responses_to(server, request_id)) == 1, request_id
        assert "error" not in responses_to(server, request_id)[0]
    assert [r for r in cancelled if responses_to(server, r)] == []
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
        assert isinstance(outcome["write"], mero_node_errors.CancelledBeforeSent)
        assert "DELETE /admin-api/contexts/%s was not sent" % kv.demo in str(outcome["write"])
        assert kv.demo in kv._contexts and [e for e in kv.log if e["method"] == "DELETE"] == []
        assert client.current_scope() == mero_node_http.Scope()
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
        monkeypatch.setattr(mero_node_http._deadlines, "stop", kept.append)
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


# ---- 3. names as given ----

def governance(serve, double):
    return serve(double, CALIMERO_MCP_TOOLSETS="core,governance")


def test_a_name_is_compared_as_given(serve, kv):
    team = kv.add_namespace(kv.kv_id, name="team")
    server = governance(serve, kv)
    spaced = server.call_tool("delete_namespace", {"namespace": " team"})
    assert spaced.get("isError") and 'named " team"' in text_of(spaced), spaced
    blank = server.call_tool("delete_namespace", {"namespace": "  "})
    assert blank.get("isError") and "namespace must name a namespace" in text_of(blank)
    assert team in kv._groups and [e for e in kv.log if e["method"] == "DELETE"] == []


@pytest.mark.parametrize("tool, extra", [("delete_namespace", {}), ("leave_namespace", {})])
def test_destructive_namespace_tools_refuse_a_case_only_match(serve, kv, tool, extra):
    prod = kv.add_namespace(kv.kv_id, name="Prod")
    server = governance(serve, kv)
    refused = server.call_tool(tool, dict(extra, namespace="prod"))
    assert refused.get("isError") and 'no namespace is named exactly "prod"' in text_of(refused), refused
    assert '%s ("Prod")' % prod in text_of(refused)
    assert [e for e in kv.log if e["method"] in ("DELETE", "POST")] == []
    # Spelled as it is, the same name acts, and the answer names what it acted on.
    if tool == "delete_namespace":
        done = server.tool_json(tool, {"namespace": "Prod"})
        assert done == {"isDeleted": True, "namespaceId": prod, "name": "Prod"}
    else:
        done = server.call_tool(tool, {"namespace": prod})
        assert text_of(done).startswith('Left namespace %s ("Prod"). This node was its only admin' % prod)


def test_group_tools_refuse_a_case_only_match_and_name_what_they_removed(serve, kv):
    namespace = kv._contexts[kv.demo]["groupId"]
    ops = kv.add_group(namespace=namespace, name="Ops")
    account = "AB" * 32
    kv.set_role(ops, "Member", account.lower())
    server = governance(serve, kv)
    for tool, args in (("delete_group", {"group": "ops"}), ("remove_group_members", {"group": "ops",
                                                                                   "members": [account]})):
        refused = server.call_tool(tool, args)
        assert refused.get("isError") and 'named exactly "ops"' in text_of(refused), (tool, refused)
    assert ops in kv._groups and account.lower() in kv._groups[ops]["members"]
    done = server.call_tool("remove_group_members", {"group": "Ops", "members": [account, account.lower()]})
    assert text_of(done) == ('Removed %s from subgroup %s ("Ops", in namespace %s). Given more than once, removed '
                             "once: %s." % (account.lower(), ops, namespace, account.lower())), done
    sent = [e["json"] for e in kv.log if e["path"].endswith("/members/remove")]
    assert sent == [{"members": [account.lower()]}]
    assert account.lower() not in kv._groups[ops]["members"]


def test_creating_a_namesake_says_so_and_an_id_shaped_name_is_refused(serve, kv):
    server = governance(serve, kv)
    first = server.tool_json("create_namespace", {"application": KV, "name": "alpha"})
    assert "note" not in first
    second = server.tool_json("create_namespace", {"application": KV, "name": "alpha"})
    assert second["namespaceId"] != first["namespaceId"]
    assert 'The name "alpha" is also carried by namespace %s ("alpha")' % first["namespaceId"] in second["note"]
    group = server.tool_json("create_group", {"namespace": first["namespaceId"], "name": "alpha"})
    assert first["namespaceId"] in group["note"] and second["namespaceId"] in group["note"]
    for tool, args in (("create_namespace", {"application": KV}), ("create_group", {"namespace": "demo-team"})):
        refused = server.call_tool(tool, dict(args, name="ab" * 32))
        assert refused.get("isError") and "reads as a 64-hex id" in text_of(refused), refused
    assert len([g for g in kv._groups.values() if g["name"] == "ab" * 32]) == 0


# ---- 4. delete_group answers from what happened ----

def test_delete_group_lists_what_went_even_in_groups_this_node_cannot_list(serve, kv):
    namespace = kv._contexts[kv.demo]["groupId"]
    team = kv.add_group(namespace=namespace, name="team", visibility="open")
    hidden = kv.add_group(parent=team, name="hidden", visibility="restricted", member=False)
    seen_one = kv.add_context(kv.kv_id, group_id=team, name="seen")
    hidden_one = kv.add_context(kv.kv_id, group_id=hidden, name="unseen")
    server = governance(serve, kv)
    answer = server.tool_json("delete_group", {"group": "team"})
    assert answer["groupId"] == team and answer["name"] == "team" and answer["isDeleted"] is True
    assert sorted(answer["deletedContexts"]) == sorted([seen_one, hidden_one])
    assert answer["deletedSubgroups"] == []                  # the hidden one was never listed
    assert answer["unlistedGroups"] == [hidden] and "cannot list" in answer["note"]
    assert kv.demo in kv._contexts


def test_delete_group_whose_read_back_fails_says_it_was_deleted(serve, kv):
    namespace = kv._contexts[kv.demo]["groupId"]
    team = kv.add_group(namespace=namespace, name="team", visibility="open")
    kv.add_context(kv.kv_id, group_id=team, name="seen")
    server = governance(serve, kv)
    kv.after_delete = {"status": 503, "paths": ["/admin-api/contexts"]}
    answer = server.tool_json("delete_group", {"group": team})
    assert team not in kv._groups
    assert answer["isDeleted"] is True and answer["groupId"] == team
    assert answer["note"].startswith('subgroup %s ("team", in namespace %s) was deleted' % (team, namespace))
    assert "could not be confirmed" in answer["note"] and "retry" not in json.dumps(answer).lower()


# ---- 5. guards that belong to the tools ----

def test_upgrade_group_refuses_another_package_and_both_risky_tools_say_they_destroy(serve, kv):
    namespace = kv._contexts[kv.demo]["groupId"]
    server = governance(serve, kv)
    refused = server.call_tool("upgrade_group", {"group": namespace, "application": "com.example.counter"})
    assert refused.get("isError") and "com.example.counter is another package" in text_of(refused), refused
    assert [e for e in kv.log if e["path"].endswith("/upgrade")] == []
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    assert tools["upgrade_group"]["annotations"]["destructiveHint"] is True
    assert tools["sync_context"]["annotations"]["destructiveHint"] is True


# ---- 7. a blob read page by page moves once ----

def test_a_blob_read_page_by_page_is_downloaded_once(serve, kv):
    server = serve(kv)
    text = "".join("line %05d of the blob\n" % i for i in range(9000))         # ~200 kB: several pages
    blob = server.tool_json("upload_blob", {"text": text})["blobId"]
    path = "/admin-api/blobs/" + blob
    pages, offset = [], 0
    while offset is not None:
        page = server.tool_json("get_blob", {"blob": blob, "offset": offset})
        pages.append(page["content"])
        offset = page["nextOffset"]
    assert len(pages) >= 3 and "".join(pages) == text
    assert len(seen(kv, "GET", path)) == 1
    # Reading it again from its start reads the node again; a deleted blob is never served from the copy.
    server.tool_json("get_blob", {"blob": blob})
    assert len(seen(kv, "GET", path)) == 2
    assert not server.call_tool("delete_blob", {"blob": blob}).get("isError")
    asked = len(seen(kv, "HEAD", path))
    gone = server.call_tool("get_blob", {"blob": blob, "offset": 60000})
    assert gone.get("isError") and len(seen(kv, "HEAD", path)) == asked + 1, gone


def test_a_batch_decides_on_its_own_reads_not_an_earlier_calls(serve, kv):
    """Nothing carries from one call to the next: after a batch ran on `demo`, its group moves to the counter, and
    the next batch reads the context again, refuses each item naming both apps, and executes nothing."""
    server = serve(kv)
    items = [{"app": KV, "context": "demo", "method": "len"}, {"app": KV, "context": kv.demo, "method": "entries"}]
    first = json.loads(server.call_tool("call_many", {"calls": items})["content"][-1]["text"])
    assert [item["ok"] for item in first] == [True, True], first
    kv.move_group(kv._contexts[kv.demo]["groupId"], "com.example.counter")
    start = len(kv.log)
    again = json.loads(server.call_tool("call_many", {"calls": items})["content"][-1]["text"])
    counter = kv._app_key("com.example.counter")
    assert [item["ok"] for item in again] == [False, False], again
    for item in again:
        assert 'runs com.example.counter (application %s), not "%s"' % (counter, KV) in item["error"], item
    assert seen(kv, "GET", "/admin-api/contexts/" + kv.demo)[-1] in kv.log[start:]      # read again, by this call
    assert [e for e in kv.log[start:] if e["path"] == "/jsonrpc"] == []
