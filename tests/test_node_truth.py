"""Issue 41: each node its own truth. The real server over stdio against a Network of node doubles where one app
has two builds (node1: kv-store 1.0.0; node2: 2.0.0, where `len` is [mut] and `count` is a [view] method only it
has) and another app (a counter) is installed on node2 only. Every call must be judged by the node it runs on:
nothing executes that the node's own build forbids, and every app record or ABI read of a call goes to its node."""
import copy
import json
import time

import pytest

import node_double
from mcp_client import minimal_env, wait_until
from node_double import COUNTER_MANIFEST, counter_spec, hex_id, kv_store_manifest, kv_store_spec
from test_node_double import call as http, invite_and_join, output_of
from test_several_nodes import answer, ran_on, texts

KV = "com.calimero.kv-store"
COUNTER = "com.example.counter"
APPS = "/admin-api/applications"


# ---- the fixture: two builds of one app on two nodes, and an app only on node2 ----

def kv_v2_manifest():
    """kv-store 2.0.0: `len` is mutating (read_only in 1.0.0), and `count`, a copy of `len`, is new and [view]."""
    manifest = kv_store_manifest()
    methods = manifest["methods"]
    length = next(m for m in methods if m["name"] == "len")
    count = dict(copy.deepcopy(length), name="count", doc="Counts the entries (2.0.0).")
    length["intent"] = "mutating"
    manifest["methods"] = sorted(methods + [count], key=lambda m: m["name"])
    return manifest


def counter_with_event():
    """The counter app, declaring one event of its own (so `events` with its `kind` needs its ABI)."""
    spec = counter_spec()
    spec["abi"] = dict(copy.deepcopy(COUNTER_MANIFEST), events=[{"name": "Incremented", "doc": "The counter moved."}])
    return spec


@pytest.fixture
def count_answers(monkeypatch):
    """The double runs kv methods by name; `count` (2.0.0 only) answers what `len` does, not a sample value."""
    monkeypatch.setitem(node_double.KV_METHODS, "count", node_double.KV_METHODS["len"])


class Skew:
    """node1 (kv 1.0.0), node2 (kv 2.0.0 + the counter), a kv context both hold with two keys, and a counter
    context on node2 only."""

    def __init__(self, network):
        self.network = network
        self.node1 = network.add("node1", apps=[kv_store_spec()])
        self.node2 = network.add("node2", apps=[kv_store_spec(), counter_with_event()])
        self.kv_id = self.node1._app_key(KV)
        self.node2.upgrade_app(self.kv_id, "2.0.0", abi=kv_v2_manifest())
        self.counter_id = self.node2._app_key(COUNTER)
        self.namespace = namespace = http(self.node1, "POST", "/admin-api/namespaces", {
            "applicationId": self.kv_id}).json()["data"]["namespaceId"]
        self.context = http(self.node1, "POST", "/admin-api/contexts", {
            "applicationId": self.kv_id, "initializationParams": [], "groupId": namespace}).json()["data"]["contextId"]
        assert invite_and_join(self.node1, self.node2, namespace).status == 200
        assert http(self.node2, "POST", "/admin-api/contexts/%s/join" % self.context).status == 200
        output_of(self.node1, self.context, "set", {"key": "a", "value": "1"})
        output_of(self.node1, self.context, "set", {"key": "b", "value": "2"})
        wait_until(lambda: self.node2.kv_state(self.context) == {"a": "1", "b": "2"}, "node2's replica")
        network.settle()
        self.counter_context = self.node2.add_context(self.counter_id, context_id=hex_id("counter-on-node2"))

    def serve(self, several, *more, ro2=False, **env):
        """A multi-mode server over node1 and node2 (and `more`), its tool list read: node1's catalog is loaded,
        so what the logs show after it is the calls'."""
        server = several(*self.urls(ro2), *more, **env)
        assert "kv_store_len" in server.tool_names()             # listed from node1, where len is [view]
        return server

    def urls(self, ro2=False):
        return ("node1", self.node1.url), ("node2", self.node2.url) + (("ro",) if ro2 else ())


@pytest.fixture
def skew(network, count_answers):
    return Skew(network)


def mark(*doubles):
    """Where each double's logs stand now: what follows is one call's."""
    return {d.name: (len(d.log), len(d.executions), len(d.sse_log)) for d in doubles}


def since(double, marks):
    return double.log[marks[double.name][0]:]


def executed_since(double, marks):
    return double.executions[marks[double.name][1]:]


def app_reads(entries, app_id=None):
    """The app record, list and ABI reads among log entries (of one app, when app_id is given)."""
    return [e for e in entries if e["method"] == "GET" and e["path"].startswith(APPS)
            and (app_id is None or app_id in e["path"])]


def executes(entries):
    return [e for e in entries if e["path"] == "/jsonrpc" and (e["json"] or {}).get("method") == "execute"]


def assert_read_before_execute(entries, app_id):
    """Within one call's log on its node: the app's record (or ABI) was read there, before any execute."""
    reads = [i for i, e in enumerate(entries) if e in app_reads(entries, app_id)]
    runs = [i for i, e in enumerate(entries) if e in executes(entries)]
    assert reads, "no read of app %s on the call's node: %s" % (app_id, [e["path"] for e in entries])
    assert not runs or reads[0] < runs[0], [e["path"] for e in entries]


def refused_json(result):
    """The JSON a refused wait_for_sync carries after "Error: "."""
    text = texts(result)[0]
    assert result.get("isError") and text.startswith("Error: {"), result
    return json.loads(text[len("Error: "):])


def kv_call(context, method, node, **extra):
    return dict({"app": KV, "context": context, "method": method, "node": node}, **extra)


# ---- 1. read-write mode: two builds, each node judges by its own ----

def test_generated_len_on_node2_is_refused_for_its_mut_intent_and_nothing_runs_there(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    refused = server.call_tool("kv_store_len", {"context": skew.context, "node": "node2"})
    text = " ".join(texts(refused))
    assert refused.get("isError"), refused
    assert "2.0.0" in text and "[mut]" in text and 'node "node2"' in text, text
    assert executed_since(skew.node2, at) == [] and executed_since(skew.node1, at) == []
    assert app_reads(since(skew.node2, at), skew.kv_id), "node2's own build was not read"
    assert not app_reads(since(skew.node1, at)), "node1 was asked about a call on node2"


def test_generated_len_on_node1_still_runs_as_listed(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    ran = server.call_tool("kv_store_len", {"context": skew.context, "node": "node1"})
    assert texts(ran)[0] == "2" and ran_on(ran) == "node1"
    assert [e["method"] for e in executed_since(skew.node1, at)] == ["len"] and not executed_since(skew.node2, at)


def test_call_len_on_node2_runs_as_node2_has_it(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    ran = server.call_tool("call", kv_call(skew.context, "len", "node2"))
    assert not ran.get("isError"), ran
    assert texts(ran)[0] == "2" and ran_on(ran) == "node2"
    assert [e["method"] for e in executed_since(skew.node2, at)] == ["len"]
    assert_read_before_execute(since(skew.node2, at), skew.kv_id)
    assert not app_reads(since(skew.node1, at)) and not executed_since(skew.node1, at)


def test_call_count_runs_on_node2_and_is_refused_on_node1_which_lacks_it(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    ran = server.call_tool("call", kv_call(skew.context, "count", "node2"))
    assert not ran.get("isError"), ran
    assert texts(ran)[0] == "2" and ran_on(ran) == "node2"
    assert_read_before_execute(since(skew.node2, at), skew.kv_id)
    at = mark(skew.node1, skew.node2)
    refused = server.call_tool("call", kv_call(skew.context, "count", "node1"))
    assert refused.get("isError") and 'Method "count" not found' in texts(refused)[0], refused
    assert not executed_since(skew.node1, at) and not executed_since(skew.node2, at)
    assert not app_reads(since(skew.node2, at)), "node2 was asked about a call on node1"


# ---- 2. read-only mode and a " (ro)" node judge intent by the node's own build ----

@pytest.mark.parametrize("how", ["read-only mode", "node2 (ro)"])
def test_len_on_node2_is_refused_read_only_and_runs_on_node1(skew, several, how):
    if how == "read-only mode":
        server = skew.serve(several, CALIMERO_MCP_READ_ONLY="1")
    else:
        server = skew.serve(several, ro2=True)
    at = mark(skew.node1, skew.node2)
    refused = server.call_tool("call", kv_call(skew.context, "len", "node2"))
    text = texts(refused)[0]
    assert refused.get("isError") and "read-only" in text and "len" in text and "not [view]" in text, refused
    assert not executed_since(skew.node2, at) and not executes(since(skew.node2, at))
    assert not app_reads(since(skew.node1, at)), "node1's build judged a call on node2"
    assert skew.node2.kv_state(skew.context) == {"a": "1", "b": "2"}
    ran = server.call_tool("call", kv_call(skew.context, "len", "node1"))
    assert texts(ran)[0] == "2" and ran_on(ran) == "node1" and not ran.get("isError")


@pytest.mark.parametrize("how", ["read-only mode", "node2 (ro)"])
def test_count_is_a_read_on_node2_even_read_only(skew, several, how):
    server = skew.serve(several, CALIMERO_MCP_READ_ONLY="1") if how == "read-only mode" \
        else skew.serve(several, ro2=True)
    ran = server.call_tool("call", kv_call(skew.context, "count", "node2"))
    assert not ran.get("isError") and texts(ran)[0] == "2", ran


# ---- 3. an app installed only on node2 works fully with node "node2" ----

def test_describe_and_select_an_app_only_on_node2(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    described = answer(server.call_tool("describe_app", {"app": COUNTER, "node": "node2"}))
    assert described["package"] == COUNTER and "value" in json.dumps(described)
    selected = server.call_tool("select_app", {"app": COUNTER, "context": skew.counter_context, "node": "node2"})
    assert answer(selected)["app_handle"] and ran_on(selected) == "node2"
    assert app_reads(since(skew.node2, at), skew.counter_id)
    assert not app_reads(since(skew.node1, at)), "node1 was asked for node2's app"


def test_call_an_app_only_on_node2_by_context_and_by_handle(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    grew = server.call_tool("call", {"app": COUNTER, "context": skew.counter_context, "node": "node2",
                                     "method": "increment", "args": {"by": 3}})
    assert not grew.get("isError") and texts(grew)[0] == "3" and ran_on(grew) == "node2", grew
    assert_read_before_execute(since(skew.node2, at), skew.counter_id)
    handle = answer(server.call_tool("select_app", {"app": COUNTER, "context": skew.counter_context,
                                                    "node": "node2"}))["app_handle"]
    read = server.call_tool("call", {"app_handle": handle, "method": "value"})
    assert not read.get("isError") and texts(read)[0] == "3" and ran_on(read) == "node2", read
    assert not app_reads(since(skew.node1, at)) and not since(skew.node1, at)


def test_events_with_a_kind_of_an_app_only_on_node2(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    got = server.call_tool("events", {"context": skew.counter_context, "kind": "Incremented", "node": "node2"})
    assert not got.get("isError"), got
    assert answer(got)["context"] == skew.counter_context and ran_on(got) == "node2"
    assert app_reads(since(skew.node2, at), skew.counter_id), "node2's ABI was not read for kind"
    assert not app_reads(since(skew.node1, at)) and len(skew.node1.sse_log) == at["node1"][2]


# ---- 4. call_many: each item judged by its node ----

def test_call_many_judges_each_item_by_its_node(skew, several):
    server = skew.serve(several, CALIMERO_MCP_READ_ONLY="1")
    at = mark(skew.node1, skew.node2)
    items = [kv_call(skew.context, "len", "node1"), kv_call(skew.context, "len", "node2"),
             kv_call(skew.context, "count", "node2"), kv_call(skew.context, "count", "node1"),
             {"app": COUNTER, "context": skew.counter_context, "method": "value", "node": "node2"}]
    rows = answer(server.call_tool("call_many", {"calls": items}))
    assert [(row["node"], row["ok"]) for row in rows] == [
        ("node1", True), ("node2", False), ("node2", True), ("node1", False), ("node2", True)], rows
    assert rows[0]["result"] == 2 and rows[2]["result"] == 2 and rows[4]["result"] == 0
    assert "read-only" in rows[1]["error"] and "count" in rows[3]["error"]
    assert sorted(e["method"] for e in executed_since(skew.node2, at)) == ["count", "value"]
    assert [e["method"] for e in executed_since(skew.node1, at)] == ["len"]
    assert not app_reads(since(skew.node1, at), skew.counter_id)


# ---- 5. wait_for_sync admits its method on each node ----

def test_wait_for_sync_with_the_skew_refuses_node2_and_is_not_in_sync(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    result = server.call_tool("wait_for_sync", {"context": skew.context, "method": "len", "timeout": 1})
    assert result.get("isError"), result
    said = refused_json(result)
    rows = {row["node"]: row for row in said["nodes"]}
    assert "refused" in rows["node2"] and "[view]" in rows["node2"]["refused"] and "value" not in rows["node2"]
    assert rows["node1"]["value"] == 2 and said["result"].startswith("not in sync") and "node2" not in said["provedOn"]
    assert not executed_since(skew.node2, at), "len ran on node2, where it writes"
    assert app_reads(since(skew.node2, at), skew.kv_id), "node2's own build was not read"


def test_wait_for_sync_with_count_reads_node2_only_where_it_exists(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    result = server.call_tool("wait_for_sync", {"context": skew.context, "method": "count", "timeout": 1})
    said = refused_json(result)
    rows = {row["node"]: row for row in said["nodes"]}
    assert result.get("isError") and "refused" in rows["node1"] and rows["node2"]["value"] == 2, said
    assert not executed_since(skew.node1, at)


def test_wait_for_sync_with_a_node_down_names_its_error_and_is_not_in_sync(skew, several):
    server = skew.serve(several)
    skew.network.stop("node2")
    result = server.call_tool("wait_for_sync", {"context": skew.context, "method": "get", "args": {"key": "a"},
                                                "timeout": 1})
    assert result.get("isError"), result
    said = refused_json(result)
    rows = {row["node"]: row for row in said["nodes"]}
    assert "node2" in rows and "error" in rows["node2"] and "node2" not in said.get("notCompared", [])
    assert said["result"].startswith("not in sync") and "node2" not in said["provedOn"]


@pytest.mark.parametrize("slow_reads, named", [(False, False), (True, False), (True, True)],
                         ids=["syncs-slow", "reads-slow-every-node", "reads-slow-nodes-named"])
def test_wait_for_sync_with_two_lagging_slow_nodes_answers_within_timeout_and_one_probe(skew, several, slow_reads,
                                                                                        named):
    node3 = skew.network.add("node3", apps=[kv_store_spec()])
    assert invite_and_join(skew.node1, node3, skew.namespace).status == 200
    assert http(node3, "POST", "/admin-api/contexts/%s/join" % skew.context).status == 200
    wait_until(lambda: node3.kv_state(skew.context) == {"a": "1", "b": "2"}, "node3's replica")
    skew.network.settle()
    skew.network.gossip_delay = 60                            # node2 and node3 lag behind the write below
    output_of(skew.node1, skew.context, "set", {"key": "c", "value": "3"})
    for lagging in (skew.node2, node3):
        lagging.slow = {"/admin-api/contexts/sync": 20}
        if slow_reads:
            lagging.slow["/admin-api/contexts/" + skew.context] = 20
    server = skew.serve(several, ("node3", node3.url))
    started = time.monotonic()
    asked = {"context": skew.context, "timeout": 1}
    if named:
        asked["nodes"] = ["node1", "node2", "node3"]
    result = server.call_tool("wait_for_sync", asked, timeout=30)
    took = time.monotonic() - started
    assert refused_json(result)["result"].startswith("not in sync"), result
    assert took < 1 + 2 + 2, "wait_for_sync took %.1fs with timeout 1" % took
    if not slow_reads:
        asked_sync = [d.requests_to("POST", "/admin-api/contexts/sync") for d in (skew.node2, node3)]
        assert all(asked_sync), "the laggards were never asked to sync"


# ---- 6. handles across a restart ----

def single(start_server, tmp_path, url):
    """A single-mode server on `url` with the multi servers' state dir (so their handle key), its tool list read."""
    server = start_server(minimal_env(tmp_path / "home", {
        "CALIMERO_NODE_URL": url, "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
        "CALIMERO_NODE_HOME": tmp_path / "nodes"}))
    assert "kv_store_len" in server.tool_names()
    return server


def test_a_node2_handle_is_refused_by_a_single_mode_server_on_node1(skew, several, start_server, tmp_path):
    multi = skew.serve(several)
    handle = answer(multi.call_tool("select_app", {"app": KV, "context": skew.context, "node": "node2"}))[
        "app_handle"]
    multi.close()
    server = single(start_server, tmp_path, skew.node1.url)
    at = mark(skew.node1, skew.node2)
    refused = server.call_tool("call", {"app_handle": handle, "method": "get", "args": {"key": "a"}})
    text = texts(refused)[0]
    assert refused.get("isError") and 'node "node2"' in text and skew.node2.url in text, refused
    assert not since(skew.node1, at), "something was sent to node1: %s" % [e["path"] for e in since(skew.node1, at)]


def test_a_single_mode_handle_is_refused_in_multi_mode_as_naming_no_node(skew, several, start_server, tmp_path):
    one = single(start_server, tmp_path, skew.node1.url)
    handle = answer_single(one.call_tool("select_app", {"app": KV, "context": skew.context}))["app_handle"]
    one.close()
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    refused = server.call_tool("call", {"app_handle": handle, "method": "get", "args": {"key": "a"}})
    assert refused.get("isError") and "names no node" in texts(refused)[0], refused
    assert not since(skew.node1, at) and not since(skew.node2, at), "a handle naming no node reached a node"


def test_a_node1_handle_works_again_after_a_restart_with_the_same_nodes(skew, several):
    first = skew.serve(several)
    handle = answer(first.call_tool("select_app", {"app": KV, "context": skew.context, "node": "node1"}))[
        "app_handle"]
    first.close()
    again = skew.serve(several)
    read = again.call_tool("call", {"app_handle": handle, "method": "get", "args": {"key": "a"}})
    assert not read.get("isError") and texts(read)[0] == '"1"' and ran_on(read) == "node1", read


def answer_single(result):
    assert not result.get("isError"), result
    return json.loads(texts(result)[0])


# ---- 7. events with node "node2" read node2's stream ----

def test_events_on_node2_read_node2s_stream_only(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    got = server.call_tool("events", {"context": skew.context, "node": "node2"})
    assert not got.get("isError") and ran_on(got) == "node2", got
    assert len(skew.node2.sse_log) > at["node2"][2], "node2's SSE route was never asked"
    assert len(skew.node1.sse_log) == at["node1"][2], "node1's stream was read for node2"


def test_events_kind_of_the_kv_app_on_node2_reads_node2s_abi(skew, several):
    server = skew.serve(several)
    at = mark(skew.node1, skew.node2)
    got = server.call_tool("events", {"context": skew.context, "kind": "Inserted", "node": "node2"})
    assert not got.get("isError") and ran_on(got) == "node2", got
    assert app_reads(since(skew.node2, at), skew.kv_id) and not app_reads(since(skew.node1, at))
