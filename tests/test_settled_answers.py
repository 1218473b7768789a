"""Every answer settles its question (issue 34): what a type holds, an upgrade that finishes in one call, what an
uninstall leaves behind, who is left to run a namespace, an alias moved in one call, a batch of equal successes
said once. Through the real server against the double."""
from __future__ import annotations

import json

from mcp_client import minimal_env, tuned_server
from node_double import NODE_ACCOUNT, NodeDouble, hex_id, kv_store_spec, sample_double

KV = "com.calimero.kv-store"
BOUND = 60000


def text_of(result):
    return result["content"][-1]["text"]


def error_text(result):
    assert result.get("isError") is True, result
    return text_of(result)


def demo_of(double):
    return next(c["id"] for c in double._contexts.values() if c["name"] == "demo")


# ── 2. the named types a method uses, shown where a model plans ──────────────────────────────────

TYPED_ABI = {"schema_version": "wasm-abi/1", "types": {
    "Board": {"kind": "record", "doc": "One player's board.", "fields": [
        {"name": "owner", "type": {"$ref": "PlayerId"}, "doc": "Who placed it."},
        {"name": "cells", "type": {"kind": "list", "items": {"$ref": "Cell"}}},
        {"name": "label", "type": {"kind": "string"}, "nullable": True}]},
    "Cell": {"kind": "variant", "variants": [{"name": "Empty"}, {"name": "Ship", "payload": {"kind": "u32"}},
                                              {"name": "Hit", "payload": {"$ref": "Shot"}}]},
    "Shot": {"kind": "record", "fields": [{"name": "x", "type": {"kind": "u32"}}, {"name": "y", "type": {"kind": "u32"}}]},
    "PlayerId": {"kind": "alias", "target": {"kind": "string"}},
    "Seed": {"kind": "bytes", "size": 32},
    "Unused": {"kind": "record", "fields": [{"name": "z", "type": {"kind": "bool"}}]}},
    "methods": [
        {"name": "init", "params": [], "returns": {"kind": "unit"}},
        {"name": "place", "params": [{"name": "board", "type": {"$ref": "Board"}}], "returns": {"$ref": "Seed"}},
        {"name": "board", "intent": "read_only", "params": [], "returns": {"$ref": "Board"}, "returns_nullable": True}],
    "events": []}

TYPES_SHOWN = [
    "One player's board.\n\ntype Board = { owner: PlayerId, cells: Cell[], label?: string }\n  owner: Who placed it.",
    "type PlayerId = string",
    "type Cell = Empty | Ship(u32) | Hit(Shot)",
    "type Shot = { x: u32, y: u32 }",
    "type Seed = bytes[32]"]


def typed_double():
    double = sample_double()
    app = double.add_app({"package": "com.example.fleet", "version": "1.0.0", "signer_id": "s", "metadata": {},
                          "abi": TYPED_ABI, "behaviour": "generic"})
    double.add_context(app)
    return double


def test_describe_app_and_select_app_verbose_show_every_named_type_the_methods_use(serve):
    server = serve(typed_double())
    described = server.call_tool("describe_app", {"app": "fleet"})["structuredContent"]
    # first met first, transitively (a field's, a case's payload), in signature notation; an unused type left out
    assert described["types"] == TYPES_SHOWN
    assert "[mut] place(board: Board) -> Seed" in described["methods"][-2]
    assert server.call_tool("select_app", {"app": "fleet", "verbose": True})["structuredContent"]["types"] == TYPES_SHOWN
    assert "types" not in server.call_tool("select_app", {"app": "fleet"})["structuredContent"]
    assert "types" not in server.call_tool("describe_app", {"app": "kv-store"})["structuredContent"], "none to show"


def many_typed_app(count):
    """An app of `count` methods, each using its own large documented record: far beyond one answer."""
    types = {"Record%04d" % i: {"kind": "record", "doc": "Record %d. " % i + "Holds a thing. " * 20, "fields": [
        {"name": "field_%d" % f, "type": {"kind": "string"}, "doc": "Field %d." % f} for f in range(6)]}
        for i in range(count)}
    methods = [{"name": "m%04d" % i, "doc": "Method %d." % i, "params": [{"name": "r", "type": {"$ref": "Record%04d" % i}}],
                "returns": {"kind": "string"}} for i in range(count)]
    return {"package": "com.example.typed", "version": "1.0.0", "signer_id": "t", "metadata": {"name": "Typed"},
            "abi": {"schema_version": "wasm-abi/1", "types": types, "methods": methods}}


def test_describe_app_pages_the_types_together_with_the_methods(serve):
    double = NodeDouble(apps=[kv_store_spec(), many_typed_app(300)])
    server = serve(double, CALIMERO_MCP_APPS="kv-store")
    methods, types, cursor, pages = [], [], None, 0
    while True:
        arguments = {"app": "typed"} if cursor is None else {"app": "typed", "cursor": cursor}
        result = server.call_tool("describe_app", arguments, timeout=60)
        assert not result.get("isError") and sum(len(b.get("text", "")) for b in result["content"]) <= BOUND, result
        page = result["structuredContent"]
        assert page.get("methodsFrom", 1) == len(methods) + 1
        assert page.get("typesFrom", 1) == len(types) + 1
        if page.get("types"):
            assert len(methods) + len(page["methods"]) == 300, "types come after every method"
        methods += page["methods"]
        types += page.get("types", [])
        pages += 1
        cursor = page.get("nextCursor")
        if cursor is None:
            break
        assert "of the 600 methods and types are left out" in page["omitted"]
        assert pages < 40
    assert pages > 2 and len(methods) == 300 and len(types) == 300
    assert [t.split("type ")[1].split(" =")[0] for t in types] == ["Record%04d" % i for i in range(300)]


# ── 4. an upgrade that finishes in one call ──────────────────────────────────────────────────────

def test_upgrade_group_waits_for_completion_with_progress_and_names_each_contexts_version(serve):
    double = sample_double()
    kv = double._app_key(KV)
    namespace = next(g for g in double._groups if double._groups[g]["name"] == "demo-team")
    squad = double.add_group(namespace=namespace, name="squad")
    inside = double.add_context(kv, group_id=squad, name="inside")
    double.upgrade_pending_reads = 2              # the node reports in_progress twice, then completed (§0.6)
    server = serve(double)
    double.upgrade_app(kv, "1.1.0")
    result = server.call_tool("upgrade_group", {"group": "demo-team", "cascade": True}, meta={"progressToken": "up"})
    answer = json.loads(text_of(result))
    assert (answer["status"], answer["fromVersion"], answer["version"]) == ("completed", "1.0.0", "1.1.0")
    assert sorted((c["name"], c["applicationVersion"], c["movesWhenNextCalled"]) for c in answer["contexts"]) == [
        ("demo", "1.0.0", True), ("inside", "1.0.0", True)]
    assert "each runs the new version from its next call" in answer["note"]
    progress = [n["params"] for n in server.notifications if n["method"] == "notifications/progress"]
    assert [p["progress"] for p in progress] == [1, 2, 3] and all(p["progressToken"] == "up" for p in progress)
    assert [p["message"] for p in progress] == ["upgrade in_progress", "upgrade in_progress", "upgrade completed"]
    server.call_tool("call", {"app": "kv-store", "context": inside, "method": "len"})
    rows = {r["name"]: r for r in server.call_tool("list_contexts", {})["structuredContent"]["contexts"]}
    assert (rows["inside"]["applicationVersion"], rows["inside"]["behind"]) == ("1.1.0", False)
    assert (rows["demo"]["applicationVersion"], rows["demo"]["behind"]) == ("1.0.0", True)


def test_an_upgrade_still_running_after_the_wait_says_so(start_server, tmp_path):
    double = sample_double().start()
    try:
        double.upgrade_pending_reads = 10 ** 6
        env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url,
                                              "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})
        server = tuned_server(env, "import mero_governance\nmero_governance.UPGRADE_WAIT_SECONDS = 0.3",
                              check="hasattr(__import__('mero_governance'), 'UPGRADE_WAIT_SECONDS')")
        try:
            server.initialize()
            double.upgrade_app(double._app_key(KV), "1.1.0")
            answer = server.tool_json("upgrade_group", {"group": "demo-team"})
            assert answer["status"] == "in_progress" and answer["toVersion"] == "1.1.0"
            assert answer["note"].startswith("Not completed after ")
            assert answer["note"].endswith("describe_group shows its progress until it is completed.")
        finally:
            server.close()
    finally:
        double.stop()


# ── 5. leftovers said ────────────────────────────────────────────────────────────────────────────

def test_uninstall_names_the_namespaces_still_targeting_the_app(serve):
    double = sample_double()
    namespace = next(g for g in double._groups if double._groups[g]["name"] == "demo-team")
    empty = double.add_namespace(double._app_key(KV), name="spare")
    server = serve(double)
    answer = server.tool_json("uninstall_application", {"application": "kv-store"})
    assert sorted(answer["stillReferring"], key=lambda r: r["name"]) == [
        {"namespaceId": namespace, "name": "demo-team", "contextCount": 1,
         "removeWith": "delete_context for each of its contexts, then delete_namespace"},
        {"namespaceId": empty, "name": "spare", "contextCount": 0, "removeWith": "delete_namespace"}]
    counter = server.tool_json("uninstall_application", {"application": "counter"})
    assert "stillReferring" not in counter


def test_leave_namespace_says_when_this_node_was_its_only_admin(serve):
    double = sample_double()
    other = double.add_namespace(double._app_key(KV), name="shared")
    double.set_role(other, "Admin", account=hex_id("carol"))
    server = serve(double)
    alone = text_of(server.call_tool("leave_namespace", {"namespace": "demo-team"}))
    assert ('("demo-team"). This node was its only admin and only member: no one is left who can invite to it, add '
            "members or upgrade it. This node still holds 1 of its contexts (%s (demo))" % demo_of(double)) in alone
    shared = text_of(server.call_tool("leave_namespace", {"namespace": "shared"}))
    assert shared == 'Left namespace %s ("shared"). This node had joined none of its contexts.' % other
    assert NODE_ACCOUNT not in double._groups[other]["members"]


# ── 6. an alias moved in one call ────────────────────────────────────────────────────────────────

def test_create_alias_with_replace_moves_the_alias_and_puts_it_back_when_the_create_fails(serve):
    double = sample_double()
    demo = demo_of(double)
    other = double.add_context(double._app_key(KV), name="other")
    server = serve(double)
    schema = next(t for t in server.result("tools/list")["tools"] if t["name"] == "create_alias")["inputSchema"]
    assert schema["properties"]["replace"]["description"] == "Move a taken alias here (else refused)."
    moved = server.tool_json("create_alias", {"alias": "demo", "context": other, "replace": True})
    assert moved == {"alias": "demo", "contextId": other, "replaced": demo,
                     "note": 'Alias "demo" now resolves to context %s (it named context %s).' % (other, demo)}
    assert double._aliases["context"]["demo"] == other
    double.faults.update({"status": 500, "json": {"error": "store busy"}, "paths": ["/admin-api/alias/create/context"],
                          "exact": True, "times": 1})
    failed = error_text(server.call_tool("create_alias", {"alias": "demo", "context": demo, "replace": True}))
    assert failed.startswith('Error: Alias "demo" could not be pointed at context %s (' % demo)
    assert failed.endswith("); it still names context %s." % other)
    assert double._aliases["context"]["demo"] == other, "the old target restored"


# ── 7. a run of equal successes said once ────────────────────────────────────────────────────────

def test_call_many_collapses_a_run_of_equal_successes_into_one_row(serve):
    double = sample_double()
    server = serve(double)
    write = {"app": "kv-store", "context": "demo", "method": "set", "args": {"key": "k", "value": "v"}}
    calls = [write] * 3 + [{"app": "kv-store", "context": "demo", "method": "get_result", "args": {"key": "no"}}] + \
        [dict(write, args={"key": "k%d" % i, "value": "v"}) for i in range(2)] + [
            {"app": "kv-store", "context": "demo", "method": "len"}]
    items = json.loads(server.call_tool("call_many", {"calls": calls})["content"][0]["text"])   # then what they emitted
    named = {"app": "kv-store", "context": "demo", "method": "set"}
    assert items[0] == dict(named, items="0-2", contextId=demo_of(double), ok=True, result=None)
    assert items[1]["index"] == 3 and items[1]["ok"] is False
    assert items[2] == dict(named, items="4-5", contextId=demo_of(double), ok=True, result=None)
    assert items[3]["index"] == 6 and items[3]["ok"] is True     # a len: another result, its own row
    assert len(items) == 4


# ── what a model playing the host stumbled on ────────────────────────────────────────────────────

def test_a_context_named_where_an_alias_goes_is_refused_pointing_at_its_id(serve):
    """list_contexts shows each context's name; a model passes it as a context. The refusal says which context
    has that name and that a name is no alias, for a fixed tool and an app tool alike."""
    double = sample_double()
    scratch = double.add_context(double._app_key(KV), name="scratch")
    server = serve(double)
    hint = ' Context %s is named "scratch": a name is a label, not an alias; pass the id (or create_alias).' % scratch
    refused = error_text(server.call_tool("create_alias", {"alias": "main", "context": "scratch"}))
    assert refused == 'Error: Context "scratch" is neither a context id nor an alias on this node.' + hint
    refused = error_text(server.call_tool("kv_store_len", {"context": "scratch"}))
    assert hint in refused and refused.startswith('Error: Context "scratch" not found')
    unknown = error_text(server.call_tool("create_alias", {"alias": "main", "context": "nowhere"}))
    assert unknown == 'Error: Context "nowhere" is neither a context id nor an alias on this node.'


def test_a_context_whose_app_was_uninstalled_says_its_next_call_fails(serve):
    double = sample_double()
    demo = demo_of(double)
    server = serve(double)
    server.tool_json("uninstall_application", {"application": "kv-store"})
    row = next(r for r in server.tool_json("list_contexts")["contexts"] if r["id"] == demo)
    assert row["nextCall"] == "fails: its application is not installed here (delete_context removes the context)"
    assert row["behind"] is None
    kept = server.tool_json("list_contexts", {"application": "counter"})
    assert kept["contexts"] == []
