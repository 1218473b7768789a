"""Issue 33: one session drives every node. The real server over stdio against a Network of node doubles (each its
own HTTP server, identity, auth and replicas)."""
import json
import time

import pytest

from mcp_client import fixed_definitions, minimal_env, run_check, wait_until
from node_double import JOIN_NO_PEER, Network, hex_id, kv_store_spec

KV = "com.calimero.kv-store"
CREDENTIALS = {"users": {"admin": "dev-password"}}


def texts(result):
    return [block["text"] for block in result.get("content", []) if block.get("type") == "text"]


def ran_on(result):
    """The node a multi-mode result says it ran on (its last block)."""
    last = texts(result)[-1]
    assert last.startswith('Ran on node "'), result
    return last[len('Ran on node "'):-2]


def answer(result):
    """The JSON a successful multi-mode result carries (its first block)."""
    assert not result.get("isError"), result
    return json.loads(texts(result)[0])


def pair(network, joiner_apps=True, **options):
    node1 = network.add("node1", apps=[kv_store_spec()], **options)
    node2 = network.add("node2", apps=[kv_store_spec()] if joiner_apps else [], **options)
    return node1, node2


def paths(double):
    return [entry["path"] for entry in double.log]


# ---- modes, the node argument, resolution ----

def test_multi_mode_adds_node_to_every_node_tool_names_the_default_and_stays_within_budget(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    tools = {t["name"]: t for t in server.result("tools/list")["tools"] if "_meta" not in t}
    single = {t["name"]: t for t in fixed_definitions()}
    assert set(tools) == set(single) | {"wait_for_sync"}
    for name, t in tools.items():
        has = "node" in t["inputSchema"].get("properties", {})
        assert has == (name != "list_nodes"), name
    item = tools["call_many"]["inputSchema"]["properties"]["calls"]["items"]["properties"]
    assert item["node"] == {"type": "string"}
    assert "from" in tools["join_namespace"]["inputSchema"]["properties"]
    grown = len(json.dumps(list(tools.values()))) - len(json.dumps(list(single.values())))
    assert 0 < grown <= 2000, grown
    instructions = server.initialize_result["instructions"] if hasattr(server, "initialize_result") else None
    if instructions is not None:
        assert "node1" in instructions


def test_instructions_name_the_default_node_in_multi_mode_only(network, several, server):
    node1, node2 = pair(network)
    multi = several(("node1", node1.url), ("node2", node2.url), initialize=False)
    said = multi.result("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "t", "version": "0"}})["instructions"]
    line = [text for text in said.split("\n") if "Several nodes" in text]
    assert len(line) == 1 and "default node, node1" in line[0]
    assert "Several nodes" not in server.result("initialize", {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})[
        "instructions"]


def test_a_call_runs_on_its_node_else_the_default_and_says_where(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    server.tool_names()                       # the default node's catalog is read: what follows is the calls'
    before1, before2 = len(node1.log), len(node2.log)
    on2 = server.call_tool("list_contexts", {"node": "node2"})
    assert ran_on(on2) == "node2" and len(node1.log) == before1 and len(node2.log) > before2
    before2 = len(node2.log)
    default = server.call_tool("list_contexts", {})
    assert ran_on(default) == "node1" and len(node2.log) == before2


def test_an_unknown_node_is_refused_listing_the_known_names_with_the_default_marked(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    server.tool_names()
    before = len(node1.log) + len(node2.log)
    refused = server.call_tool("list_contexts", {"node": "node3"})
    assert refused["isError"]
    assert 'no node "node3"' in texts(refused)[0] and "node1 (default), node2" in texts(refused)[0]
    assert len(node1.log) + len(node2.log) == before


def test_single_mode_takes_no_node_argument(server):
    refused = server.call_tool("list_contexts", {"node": "node1"})
    assert refused["isError"] and "node" in texts(refused)[0]
    assert "wait_for_sync" not in server.tool_names()


def test_generated_tools_take_node_in_multi_mode_and_nothing_else_changes(network, several, serve):
    """Issue 41: every tool but list_nodes takes node, generated ones too (a plain string, no description);
    single mode's generated tools are as they were."""
    node1, node2 = pair(network)
    multi = several(("node1", node1.url), ("node2", node2.url))
    generated = [t for t in multi.result("tools/list")["tools"] if "_meta" in t]
    single = [t for t in serve(node1).result("tools/list")["tools"] if "_meta" in t]
    assert generated and [t["name"] for t in generated] == [t["name"] for t in single]
    for multi_tool, single_tool in zip(generated, single):
        schema = dict(multi_tool["inputSchema"], properties=dict(multi_tool["inputSchema"]["properties"]))
        assert schema["properties"].pop("node") == {"type": "string"}
        assert dict(multi_tool, inputSchema=schema) == single_tool
        assert "node" not in single_tool["inputSchema"]["properties"]


def test_multi_node_off_keeps_one_node(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url), CALIMERO_MCP_MULTI_NODE="off")
    assert "wait_for_sync" not in server.tool_names()
    assert server.call_tool("list_contexts", {"node": "node2"})["isError"]
    status = server.call_tool("node_status")
    assert json.loads(texts(status)[-1])["url"] == node1.url          # the first entry: the default


def test_one_named_node_is_single_mode_bound_to_that_node(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    server = several(("node1", node1.url))
    status = server.call_tool("node_status")
    assert len(texts(status)) == 1 and json.loads(texts(status)[0])["url"] == node1.url


# ---- handles bind a node ----

def test_a_handle_binds_its_node_and_a_contradicting_node_is_refused(network, several):
    node1, node2 = pair(network)
    context1 = node1.add_context(node1._app_key(KV), context_id=hex_id("one"))
    context2 = node2.add_context(node2._app_key(KV), context_id=hex_id("two"))
    server = several(("node1", node1.url), ("node2", node2.url))
    selected = server.call_tool("select_app", {"app": KV, "context": context2, "node": "node2"})
    handle = answer(selected)["app_handle"]
    tool = next(name for name in server.tool_names() if name.endswith("_set"))
    executed = len(node1.executions)
    wrote = server.call_tool(tool, {"app_handle": handle, "key": "k", "value": "on two"})
    assert not wrote.get("isError"), wrote
    assert ran_on(wrote) == "node2" and len(node1.executions) == executed
    read = server.call_tool("call", {"app_handle": handle, "method": "get", "args": {"key": "k"}})
    assert texts(read)[0] == '"on two"' and ran_on(read) == "node2"
    refused = server.call_tool("call", {"app_handle": handle, "node": "node1", "method": "get", "args": {"key": "k"}})
    assert refused["isError"] and "contradicts" in texts(refused)[0]
    assert context1 not in json.dumps(paths(node2))


def test_a_handle_finds_its_node_when_the_state_dir_cannot_keep_a_key(network, several, tmp_path):
    """No handle.key on disk: the server's one random key still reads every node's handles (not a key per node)."""
    node1, node2 = pair(network)
    context2 = node2.add_context(node2._app_key(KV), context_id=hex_id("two"), state={"k": "on two"})
    (tmp_path / "state" / "handle.key").mkdir(parents=True)          # a key cannot be read or written there
    server = several(("node1", node1.url), ("node2", node2.url))
    selected = server.call_tool("select_app", {"app": KV, "context": context2, "node": "node2"})
    handle = answer(selected)["app_handle"]
    read = server.call_tool("call", {"app_handle": handle, "method": "get", "args": {"key": "k"}})
    assert texts(read)[0] == '"on two"' and ran_on(read) == "node2"


def test_call_many_items_each_run_on_their_node(network, several):
    node1, node2 = pair(network)
    ids = {}
    for double in (node1, node2):
        ids[double.name] = double.add_context(double._app_key(KV), context_id=hex_id(double.name),
                                              state={"k": double.name})
    server = several(("node1", node1.url), ("node2", node2.url))
    items = [{"app": KV, "context": ids[name], "method": "get", "args": {"key": "k"}, "node": name}
             for name in ("node1", "node2")]
    rows = answer(server.call_tool("call_many", {"calls": items}))
    assert [(row["node"], row["result"]) for row in rows] == [("node1", "node1"), ("node2", "node2")]


# ---- list_nodes ----

def test_list_nodes_is_the_directory_and_says_when_nodes_are_not_connected(several):
    with Network(connected=False) as network:
        node1, node2 = pair(network)
        server = several(("node1", node1.url), ("node2", node2.url, "ro"))
        listed = answer(server.call_tool("list_nodes"))
        rows = {row["name"]: row for row in listed["nodes"] if row["name"]}
        assert rows["node1"] == {"name": "node1", "url": node1.url, "default": True, "reachable": True,
                                 "readOnly": False, "auth": "none", "peers": 0}
        assert rows["node2"]["readOnly"] is True and rows["node2"]["default"] is False
        assert "--mdns" in listed["note"] and "--boot-nodes" in listed["note"]
        network.stop("node2")
        result = server.call_tool("list_nodes")
        rows = {row["name"]: row for row in answer(result)["nodes"] if row["name"]}
        assert rows["node2"]["reachable"] is False and "note" not in answer(result)
        assert len(texts(result)) == 1, "its rows name every node: no 'Ran on node' line under them"


def test_connected_nodes_get_no_note(network, several):
    node1, node2 = pair(network)
    listed = answer(several(("node1", node1.url), ("node2", node2.url)).call_tool("list_nodes"))
    assert "note" not in listed and all(row.get("peers") == 1 for row in listed["nodes"] if row["name"])


# ---- credentials per node ----

def test_a_token_of_the_environment_goes_to_the_default_node_only(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url), CALIMERO_AUTH_TOKEN="env-token-for-node1")
    server.call_tool("list_contexts", {"node": "node2"})
    server.call_tool("list_contexts", {})
    rows = {row["name"]: row for row in answer(server.call_tool("list_nodes"))["nodes"] if row["name"]}
    assert rows["node1"]["auth"] == "token" and rows["node2"]["auth"].startswith("none: CALIMERO_AUTH_TOKEN")
    assert "Bearer env-token-for-node1" in node1.authorizations()
    assert all(header is None for header in node2.authorizations())


def test_each_node_signs_in_itself_and_no_token_crosses(network, several):
    node1, node2 = pair(network, auth=CREDENTIALS)
    server = several(("node1", node1.url), ("node2", node2.url), CALIMERO_USERNAME="admin",
                     CALIMERO_PASSWORD="dev-password")
    for _ in range(2):
        for name in ("node1", "node2"):
            assert not server.call_tool("list_contexts", {"node": name}).get("isError")
    sent1 = {h for h in node1.authorizations() if h}
    sent2 = {h for h in node2.authorizations() if h}
    assert sent1 and sent2 and not sent1 & sent2


def test_the_password_never_travels_to_a_remote_node(several, tmp_path):
    from node_double import NodeDouble
    remote = NodeDouble(auth=CREDENTIALS, host="127.0.0.1").start()
    try:
        with Network() as network:
            node1 = network.add("node1", auth=CREDENTIALS)
            # The same double, addressed by a name that is not loopback: the login must not be sent to it.
            url = remote.url.replace("127.0.0.1", "localhost.invalid-remote.test")
            server = several(("node1", node1.url), ("far", url), CALIMERO_USERNAME="admin",
                             CALIMERO_PASSWORD="dev-password")
            refused = server.call_tool("list_contexts", {"node": "far"})
            assert refused["isError"] and 'Node "far"' in texts(refused)[0]
            assert not any("/auth/token" in p for p in paths(remote))
            assert not server.call_tool("list_contexts", {}).get("isError")
    finally:
        remote.stop()


# ---- a node down ----

def test_a_down_node_fails_only_the_calls_aimed_at_it(network, several):
    node1, node2 = pair(network)
    network.stop("node2")
    server = several(("node1", node1.url), ("node2", node2.url))
    assert server.tool_names()                           # start-up and tools/list never wait on node2
    refused = server.call_tool("list_contexts", {"node": "node2"})
    text = texts(refused)[0]
    assert refused["isError"] and 'Node "node2"' in text and node2.url in text
    assert not server.call_tool("list_contexts", {"node": "node1"}).get("isError")


def test_start_up_never_touches_a_node_that_is_not_the_default(network, several):
    import socket
    node1 = network.add("node1", apps=[kv_store_spec()])
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    silent.setblocking(False)
    try:
        server = several(("node1", node1.url), ("node2", "http://127.0.0.1:%d" % silent.getsockname()[1]))
        assert any(name.endswith("_set") for name in server.tool_names())
        with pytest.raises(BlockingIOError):
            silent.accept()                    # nobody connected: start-up and tools/list never asked node2
    finally:
        silent.close()


# ---- read-only ----

def test_a_read_only_node_refuses_writes_before_sending_and_others_still_write(network, several):
    node1, node2 = pair(network)
    context2 = node2.add_context(node2._app_key(KV), context_id=hex_id("two"))
    server = several(("node1", node1.url), ("node2", node2.url, "ro"))
    before = len(node2.log)
    refused = server.call_tool("create_namespace", {"application": KV, "node": "node2"})
    assert refused["isError"] and 'node "node2" is read-only' in texts(refused)[0] and len(node2.log) == before
    write = server.call_tool("call", {"app": KV, "context": context2, "node": "node2", "method": "set",
                                      "args": {"key": "k", "value": "v"}})
    assert write["isError"] and "read-only" in texts(write)[0]
    assert not any(e for e in node2.executions if e.get("method") == "set")
    assert not server.call_tool("list_contexts", {"node": "node2"}).get("isError")
    assert not server.call_tool("create_namespace", {"application": KV}).get("isError")


def test_read_only_mode_covers_every_node(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url), CALIMERO_MCP_READ_ONLY="1")
    refused = server.call_tool("create_namespace", {"application": KV, "node": "node2"})
    assert refused["isError"] and "read-only" in texts(refused)[0]


# ---- the hand-over ----

def namespace_on(server, node="node1"):
    created = answer(server.call_tool("create_namespace", {"application": KV, "node": node}))
    return created["namespaceId"]


def test_join_namespace_from_mints_and_joins_and_never_shows_the_invitation(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace = namespace_on(server)
    joined = server.call_tool("join_namespace", {"namespace": namespace, "from": "node1", "node": "node2"})
    body = answer(joined)
    assert body["invitedBy"] == "node1" and "join_context" in body["next"] and ran_on(joined) == "node2"
    invites = [e for e in node1.log if e["path"].endswith("/invite")]
    assert len(invites) == 1
    signature = json.dumps(network.invitations)
    for value in network.invitations:
        assert value not in json.dumps(joined) and value not in server.stderr
    assert signature
    again = answer(server.call_tool("join_namespace", {"namespace": namespace, "from": "node1", "node": "node2"}))
    assert again["alreadyMember"] is True
    assert len([e for e in node1.log if e["path"].endswith("/invite")]) == 1


def test_join_from_refuses_before_minting_when_the_joiner_lacks_the_app(network, several):
    node1, node2 = pair(network, joiner_apps=False)
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace = namespace_on(server)
    refused = server.call_tool("join_namespace", {"namespace": namespace, "from": "node1", "node": "node2"})
    text = texts(refused)[0]
    assert refused["isError"] and 'install_application with coords "%s@1.0.0" and node "node2"' % KV in text
    assert not any(e["path"].endswith("/invite") for e in node1.log)


def test_join_from_says_not_connected_in_words(several):
    with Network(connected=False) as network:
        node1, node2 = pair(network)
        server = several(("node1", node1.url), ("node2", node2.url))
        namespace = namespace_on(server)
        refused = server.call_tool("join_namespace", {"namespace": namespace, "from": "node1", "node": "node2"})
        text = texts(refused)[0]
        assert refused["isError"] and "not connected" in text and "--mdns" in text and JOIN_NO_PEER not in text


def test_join_from_a_key_on_its_way_says_join_context_will_wait(network, several):
    node1, node2 = pair(network)
    node2.join_outcome = "key_pending"
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace = namespace_on(server)
    refused = server.call_tool("join_namespace", {"namespace": namespace, "from": "node1", "node": "node2"})
    assert refused["isError"] and "join_context there will wait" in texts(refused)[0]


# ---- wait_for_sync and the whole flow ----

def whole_flow(server, node="node2"):
    namespace = namespace_on(server)
    context = answer(server.call_tool("create_context", {"application": KV, "namespace": namespace,
                                                         "node": "node1"}))["contextId"]
    answer(server.call_tool("join_namespace", {"namespace": namespace, "from": "node1", "node": node}))
    assert not server.call_tool("join_context", {"context": context, "node": node}).get("isError")
    return namespace, context


def test_the_whole_flow(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    _, context = whole_flow(server)
    wrote = server.call_tool("call", {"app": KV, "context": context, "node": "node1", "method": "set",
                                      "args": {"key": "greeting", "value": "hello"}})
    assert not wrote.get("isError"), wrote
    waited = server.call_tool("wait_for_sync", {"context": context, "method": "get", "args": {"key": "greeting"},
                                                "equals": '"hello"'}, meta={"progressToken": "w"})
    body = answer(waited)
    assert server.wait_notification(lambda n: n.get("method") == "notifications/progress"
                                    and n["params"]["progressToken"] == "w")["params"]["total"] == 2
    assert body["result"] == "in sync" and {row["node"] for row in body["nodes"]} == {"node1", "node2"}
    assert not any(text.startswith("Ran on") for text in texts(waited)), "its rows name each node"
    assert all(row["value"] == "hello" and row["stateHash"] for row in body["nodes"])
    read = server.call_tool("call", {"app": KV, "context": context, "node": "node2", "method": "get",
                                     "args": {"key": "greeting"}})
    assert texts(read)[0] == '"hello"' and ran_on(read) == "node2"


def test_wait_for_sync_compares_hashes_alone_when_no_method_and_refuses_a_mut_method(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    _, context = whole_flow(server)
    body = answer(server.call_tool("wait_for_sync", {"context": context}))
    assert "Only state hashes were compared" in body["note"]
    refused = server.call_tool("wait_for_sync", {"context": context, "method": "set", "args": {"key": "a",
                                                                                              "value": "b"}})
    assert refused["isError"] and "not [view]" in texts(refused)[0]


@pytest.mark.parametrize("nodes, said", [
    (["node1", "node1"], 'nodes names node "node1" twice: name each node once.'),
    (["node2"], 'nodes names only node "node2": name two or more nodes to compare'),
    ([], "nodes names no node: name two or more nodes to compare"),
])
def test_wait_for_sync_refuses_nodes_that_cannot_prove_anything_before_asking(network, several, nodes, said):
    """A node compared with itself proved "in sync"; one node or none waited out the whole timeout."""
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    _, context = whole_flow(server)
    asked = len(node1.log) + len(node2.log)
    started = time.monotonic()
    refused = server.call_tool("wait_for_sync", {"context": context, "nodes": nodes, "timeout": 5})
    assert refused.get("isError") and said in texts(refused)[0], refused
    assert time.monotonic() - started < 3 and len(node1.log) + len(node2.log) == asked


def test_wait_for_sync_in_read_only_mode_waits_without_asking_for_syncs(network, several):
    node1, node2 = pair(network)
    _, context = whole_flow(several(("node1", node1.url), ("node2", node2.url)))
    network.settle()        # the join's replica fill, still on its way, would carry the write below with it
    network.gossip_delay = 60
    from test_node_double import call as http, output_of
    output_of(node1, context, "set", {"key": "k", "value": "v"})
    server = several(("node1", node1.url), ("node2", node2.url), CALIMERO_MCP_READ_ONLY="1")
    syncs = len(node2.syncs)
    # both named: the default set leaves out a node it cannot read in time, as a loaded machine may make it
    refused = server.call_tool("wait_for_sync", {"context": context, "nodes": ["node1", "node2"], "timeout": 1})
    assert refused["isError"] and len(node2.syncs) == syncs
    assert http(node2, "POST", "/admin-api/contexts/sync/" + context).status == 200
    assert answer(server.call_tool("wait_for_sync", {"context": context}))["result"] == "in sync"


def test_wait_for_sync_says_which_named_nodes_it_did_not_compare(network, several):
    node1, node2 = pair(network)
    node3 = network.add("node3", apps=[kv_store_spec()])
    server = several(("node1", node1.url), ("node2", node2.url), ("node3", node3.url))
    _, context = whole_flow(server)
    assert answer(server.call_tool("wait_for_sync", {"context": context}))["notCompared"] == ["node3"]


def test_wait_for_sync_times_out_with_a_diagnosis_when_the_app_is_missing(network, several):
    node1, node2 = pair(network, joiner_apps=False)
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace = namespace_on(server)
    context = answer(server.call_tool("create_context", {"application": KV, "namespace": namespace}))["contextId"]
    node2.install_spec(kv_store_spec()) if hasattr(node2, "install_spec") else None
    from test_node_double import invite_and_join, call as http
    assert invite_and_join(node1, node2, namespace).status == 200
    assert http(node2, "POST", "/admin-api/contexts/{}/join".format(context)).status == 200
    answer(server.call_tool("call", {"app": KV, "context": context, "method": "set",
                                     "args": {"key": "k", "value": "v"}}))
    refused = server.call_tool("wait_for_sync", {"context": context, "method": "get", "args": {"key": "k"},
                                                 "timeout": 1, "nodes": ["node1", "node2"]})
    assert refused["isError"] and "missing on node2" in texts(refused)[0]


def test_wait_for_sync_says_hashes_agree_but_reads_differ(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    _, context = whole_flow(server)
    answer(server.call_tool("wait_for_sync", {"context": context}))     # node2's replica is initialized
    node2.reads_lag = 60
    answer(server.call_tool("call", {"app": KV, "context": context, "method": "set",
                                     "args": {"key": "k", "value": "v"}}))
    refused = server.call_tool("wait_for_sync", {"context": context, "method": "get", "args": {"key": "k"},
                                                 "equals": '"v"', "timeout": 1.5})
    assert refused["isError"] and "hashes agree but the reads differ" in texts(refused)[0]


def test_wait_for_sync_says_not_connected(several):
    with Network(connected=False, gossip_delay=0.05) as network:
        node1, node2 = pair(network)
        server = several(("node1", node1.url), ("node2", node2.url))
        _, context = whole_flow_connected_then_cut(network, server)
        answer(server.call_tool("call", {"app": KV, "context": context, "method": "set",
                                         "args": {"key": "k", "value": "v"}}))
        refused = server.call_tool("wait_for_sync", {"context": context, "timeout": 1})
        assert refused["isError"] and "not connected" in texts(refused)[0]


def whole_flow_connected_then_cut(network, server):
    network.connect("node1", "node2")
    done = whole_flow(server)
    wait_until(lambda: not server.call_tool("wait_for_sync", {"context": done[1], "timeout": 5}).get("isError"),
               "the pair in sync")
    network.disconnect("node1", "node2")
    return done


# ---- --check ----

def test_check_reports_each_named_node(network, tmp_path):
    node1, node2 = pair(network)
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODES": "node1=%s,node2=%s" % (node1.url, node2.url),
                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                                          "CALIMERO_NODE_HOME": tmp_path / "nodes"})
    network.stop("node2")
    done = run_check(env)
    assert "node1" in done.stdout and "node2" in done.stdout and node2.url in done.stdout


# ---- load: 200 calls over two nodes, one stopped halfway ----

def test_200_calls_over_two_nodes_with_one_stopped_halfway(network, several):
    node1, node2 = pair(network)
    ids = {d.name: d.add_context(d._app_key(KV), context_id=hex_id(d.name), state={"k": d.name})
           for d in (node1, node2)}
    server = several(("node1", node1.url), ("node2", node2.url))
    results = {}
    for half in (range(100), range(100, 200)):
        if half[0] == 100:
            network.stop("node2")
        for index in half:                   # all of a half in flight at once
            name = ("node1", "node2")[index % 2]
            server.send({"jsonrpc": "2.0", "id": 1000 + index, "method": "tools/call", "params": {
                "name": "call", "arguments": {"app": KV, "context": ids[name], "node": name, "method": "get",
                                              "args": {"key": "k"}}}})
        for index in half:
            results[index] = (("node1", "node2")[index % 2], server.wait_for(1000 + index, timeout=120)["result"])
    for index, (name, result) in results.items():
        assert ran_on(result) == name
        if result.get("isError"):
            assert name == "node2" and index >= 100 and 'Node "node2"' in texts(result)[0], result
        else:
            assert texts(result)[0] == json.dumps(name)
    assert all(not result.get("isError") for index, (name, result) in results.items() if name == "node1" or index < 100)
    assert ids["node2"] not in json.dumps([e["path"] for e in node1.log] + [e["json"] for e in node1.log])
    assert ids["node1"] not in json.dumps([e["path"] for e in node2.log] + [e["json"] for e in node2.log])


# ---- what misled a model playing the host (the cross-node flow, asked in a user's words) ----

def test_join_from_takes_the_namespace_by_name_and_names_the_context_ids_to_join(network, several):
    # The joiner knows no name yet: the name is read on `from`. Aliases are per node, so the next step gives ids.
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace = answer(server.call_tool("create_namespace", {"application": KV, "name": "team", "node": "node1"}))[
        "namespaceId"]
    context = answer(server.call_tool("create_context", {"application": KV, "group": "team", "alias": "kv",
                                                         "node": "node1"}))["contextId"]
    joined = answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert joined["namespaceId"] == namespace and context in joined["next"] and "per node" in joined["next"]
    assert not server.call_tool("join_context", {"context": context, "node": "node2"}).get("isError")
    minted = len([e for e in node1.log if e["path"].endswith("/invite")])
    unknown = server.call_tool("join_namespace", {"namespace": "nope", "from": "node1", "node": "node2"})
    assert unknown["isError"] and 'On node "node1" (from)' in texts(unknown)[0]
    assert len([e for e in node1.log if e["path"].endswith("/invite")]) == minted == 1


def test_multi_mode_points_from_invitations_to_the_hand_over(network, several):
    # A model follows invite_to_namespace's words: in multi mode they name the hand-over that keeps the bearer
    # invitation out of the conversation, as do the instructions and the from argument.
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url), initialize=False)
    said = server.result("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                        "clientInfo": {"name": "t", "version": "0"}})["instructions"]
    assert "join_namespace on the joiner with from" in said
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    assert "member node" in tools["join_namespace"]["inputSchema"]["properties"]["from"]["description"]
    namespace = namespace_on(server)
    invited = server.call_tool("invite_to_namespace", {"namespace": namespace, "node": "node1"})
    assert 'from "node1" does this itself' in texts(invited)[0]


def test_a_down_node_is_not_fixed_through_calimero_node_url(network, several):
    node1, node2 = pair(network)
    server = several(("node1", node1.url), ("node2", node2.url))
    server.tool_names()
    network.stop("node2")
    text = texts(server.call_tool("list_contexts", {"node": "node2"}))[0]
    assert "CALIMERO_NODE_URL" not in text and "CALIMERO_NODES" in text and "list_nodes" in text


def test_an_install_on_another_node_says_the_tool_list_stays_the_default_nodes(network, several):
    # The single-node note ("shows no tools for it until restarted") is wrong there: the list is node1's.
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", registry={KV + "@1.0.0": kv_store_spec()})
    server = several(("node1", node1.url), ("node2", node2.url))
    installed = server.call_tool("install_application", {"coords": KV + "@1.0.0", "node": "node2"})
    note = answer(installed)["note"]
    assert "default node, node1" in note and 'node "node2"' in note and "restarted" not in note
    assert ran_on(installed) == "node2"


def test_call_many_over_several_nodes_says_so_in_its_last_block(network, several):
    # 'Ran on node "node1"' under rows that ran on node2 too read as if every read came from node1.
    node1, node2 = pair(network)
    ids = {d.name: d.add_context(d._app_key(KV), context_id=hex_id("many" + d.name), state={"k": d.name})
           for d in (node1, node2)}
    server = several(("node1", node1.url), ("node2", node2.url))
    items = [{"app": KV, "context": ids[name], "method": "get", "args": {"key": "k"}, "node": name}
             for name in ("node1", "node2")]
    both = server.call_tool("call_many", {"calls": items})
    assert texts(both)[-1] == 'Ran on nodes "node1", "node2" (each row names its node).'
    alone = server.call_tool("call_many", {"calls": items[:1]})
    assert ran_on(alone) == "node1"


def test_an_argument_refused_does_not_read_as_the_node_failing(network, several):
    # 'Node "node1" (http://…): Error: equals is …' reads as node1 being in trouble; only node failures say so.
    node1, node2 = pair(network)
    context = node1.add_context(node1._app_key(KV), context_id=hex_id("refused"))
    server = several(("node1", node1.url), ("node2", node2.url))
    refused = server.call_tool("wait_for_sync", {"context": context, "method": "get", "args": {"key": "k"},
                                                 "equals": "hello", "timeout": 1})
    assert refused["isError"] and texts(refused)[0].startswith("Error: equals is the expected value as JSON text")
    assert node1.url not in texts(refused)[0] and not any(t.startswith("Ran on") for t in texts(refused))
    network.stop("node1")
    down = server.call_tool("list_contexts", {})
    assert texts(down)[0].startswith('Node "node1" (%s): ' % node1.url)
