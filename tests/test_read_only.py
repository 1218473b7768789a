"""Read-only mode (CALIMERO_MCP_READ_ONLY): the one least-privilege switch an agent's admin credential can
have. Tool by tool, through the real server against the node double: every tool is either left out of tools/list
(and refused by name, nothing reaching the node) or proven harmless (called, the double's log shows only reads);
call and call_many refuse, per item, every method that is not [view]. Both protocol eras.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

import fixture_apps
from mcp_client import MODERN_META, SERVER, fixed_names, minimal_env
from node_double import NodeDouble, sample_double

MODERN = MODERN_META
ON = {"CALIMERO_MCP_READ_ONLY": "1"}
READ_ONLY_SAYS = "this server runs read-only (CALIMERO_MCP_READ_ONLY)"
HOW_TO_CHANGE = ("To allow changes, drop --read-only and unset CALIMERO_MCP_READ_ONLY in this server's entry of the "
                 "host configuration (its args and env), then restart the server.")
# The instruction says how writes come back, in the words the refusals use.
INSTRUCTION = ("This server runs read-only (CALIMERO_MCP_READ_ONLY): it offers only tools that cannot change the "
               "node, and call and call_many run [view] methods only. " + HOW_TO_CHANGE)
KV = "com.calimero.kv-store"
BLOB = hashlib.sha256(b"hello calimero").hexdigest()

# What read-only mode keeps on the sample node (python3 tests/node_double.py --sample), in tools/list order.
# The fixed tools read-only mode keeps come from the snapshot (tests/snapshots/fixed_tools.json, `make snapshot`).
KEPT_FIXED = fixed_names(read_only=True)
KEPT_GENERATED = ["kv_store_entries", "kv_store_get", "kv_store_get_result", "kv_store_len", "counter_value"]
DROPPED = set(fixed_names()) - set(KEPT_FIXED) | {"counter_increment", "kv_store_clear", "kv_store_get_or_insert",
                                                  "kv_store_remove", "kv_store_set", "kv_store_update_if_exists"}
GATED = {"call", "call_many"}            # offered: they refuse a method that is not [view] themselves


def sample_with_counter_context():
    double = sample_double()
    counter = double._app_key("com.example.counter")
    double.add_alias("tally", double.add_context(counter, group_id=double.add_namespace(counter, name="count")))
    next(c for c in double._contexts.values() if c["name"] == "demo")["kv"]["k"] = "v"     # get_result finds it
    double._blobs[BLOB] = b"hello calimero"                                                # get_blob reads it
    return double



def tools_of(server, modern=False):
    params = {"_meta": MODERN} if modern else None
    return {t["name"]: t for t in server.result("tools/list", params)["tools"]}


def call(server, name, arguments, modern=False):
    params = {"name": name, "arguments": arguments}
    if modern:
        params["_meta"] = MODERN
    return server.result("tools/call", params)


def harmless(entry, views):
    """A request that changes nothing: a read, an alias lookup (a POST query), or the execution of a [view]."""
    if entry["method"] in ("GET", "HEAD"):
        return True
    if entry["method"] == "POST" and entry["path"].startswith("/admin-api/alias/lookup/"):
        return True
    return entry["path"] == "/jsonrpc" and (entry["json"] or {}).get("params", {}).get("method") in views


def node_state(double):
    """Everything a write could change on the double."""
    with double._lock:
        return json.dumps([double._apps, double._contexts, double._groups, double._aliases,
                           sorted(double._blobs)], sort_keys=True, default=str)


# ── what tools/list carries ───────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("modern", [False, True], ids=["handshake", "2026-07-28"])
def test_read_only_keeps_the_harmless_tools_and_drops_the_rest(serve, modern):
    double = sample_double()
    everything = tools_of(serve(double), modern)
    kept = tools_of(serve(double, **ON), modern)
    assert list(kept) == KEPT_FIXED + KEPT_GENERATED
    assert set(everything) - set(kept) == DROPPED
    for name, definition in kept.items():
        assert definition["annotations"]["readOnlyHint"] is True, name
        if name in GATED:                                    # they cannot change the node either, now
            assert definition["annotations"] == {"readOnlyHint": True}
            assert everything[name]["annotations"]["destructiveHint"] is True
        else:
            assert definition == everything[name], name      # left as they are, only filtered
        if name in KEPT_GENERATED:
            assert definition["_meta"]["intent"] == "read_only" and "[view]" in definition["description"], name
    for name in DROPPED:
        assert everything[name]["annotations"]["readOnlyHint"] is False, name


def test_the_values_that_turn_it_on_and_a_bad_one(serve):
    """It fails safe: off only when unset, blank, 0, false, no or off; any other value turns it on. One that is
    not 1, true, yes or on (`y`, `enabled`, `ture`) gets one stderr line saying it was read as on."""
    double = sample_double()
    for value in ("1", "true", "TRUE", "Yes", " yes ", "on", "ON", "ture", "y", "enabled", "maybe"):
        server = serve(double, CALIMERO_MCP_READ_ONLY=value)
        assert "kv_store_set" not in server.tool_names(), value
        assert server.tool_json("node_status")["readOnly"] is True, value
        server.close()
        warnings = [line for line in server.stderr.splitlines() if "CALIMERO_MCP_READ_ONLY" in line]
        if value.strip().lower() in ("1", "true", "yes", "on"):
            assert warnings == [], value
        else:
            assert warnings == ['[mero-mcp] CALIMERO_MCP_READ_ONLY="%s" is none of 1, true, yes, on (on) or 0, false, '
                                'no, off (off), so it is read as on: read-only mode is on' % value.strip()], value
    for value in ("", "   ", "0", "false", "No", " OFF "):
        server = serve(double, CALIMERO_MCP_READ_ONLY=value)
        assert "kv_store_set" in server.tool_names() and "install_application" in server.tool_names(), value
        assert server.tool_json("node_status")["readOnly"] is False, value
        server.close()
        assert [line for line in server.stderr.splitlines() if "CALIMERO_MCP_READ_ONLY" in line] == [], value


def test_it_takes_precedence_over_toolsets_and_apps(serve):
    double = sample_double()
    names = serve(double, CALIMERO_MCP_TOOLSETS="all", **ON).tool_names()
    assert "list_group_members" in names and not DROPPED & set(names)
    names = serve(double, CALIMERO_MCP_TOOLSETS="core", **ON).tool_names()   # a toolset left off stays off
    assert "list_blobs" not in names and "list_group_members" not in names and "lookup_alias" in names
    names = serve(double, CALIMERO_MCP_APPS="counter", **ON).tool_names()
    assert [n for n in names if n not in KEPT_FIXED] == ["counter_value"]


def test_instructions_say_it_in_one_line_in_both_eras(serve):
    double = sample_double()
    plain = serve(double).initialize()["instructions"]
    assert "read-only" not in plain
    on = serve(double, **ON)
    assert on.initialize()["instructions"] == plain + "\n" + INSTRUCTION
    assert on.result("server/discover", {"_meta": MODERN})["instructions"] == plain + "\n" + INSTRUCTION
    assert serve(double, initialize=None).result("server/discover", {"_meta": MODERN})["instructions"] == plain


# ── every tool offered is harmless; every tool left out is refused ───────────────────────────────

def valid_arguments(double, tools):
    """Arguments that make each offered tool do its job on sample_with_counter_context(): a tool's required
    properties from what each name takes on that node, and more for the tools whose options lead elsewhere."""
    namespace = next(g["id"] for g in double._groups.values() if g["name"] == "demo-team")
    by_property = {"context": "demo", "app": "kv-store", "application": "kv-store", "group": namespace,
                   "blob": BLOB, "name": "demo"}
    on_kv = {"app": "kv-store", "context": "demo"}
    arguments = {
        "list_applications": {"verbose": True}, "list_contexts": {"application": "kv-store", "verbose": True},
        "select_app": {"app": "kv-store", "verbose": True},
        "call": dict(on_kv, method="get", args={"key": "k"}),
        "call_many": {"calls": [dict(on_kv, method="len"), dict(on_kv, method="entries"),
                                {"app": "counter", "context": "tally", "method": "value"}]},
        "kv_store_entries": {"context": "demo"}, "kv_store_get": {"context": "demo", "key": "k"},
        "kv_store_get_result": {"context": "demo", "key": "k"}, "kv_store_len": {"context": "demo"},
        "counter_value": {"context": "tally"},
    }
    for name, tool in tools.items():
        required = tool["inputSchema"].get("required", [])
        unknown = [p for p in required if p not in by_property]
        if name not in arguments:
            assert not unknown, "%s requires %s: valid_arguments does not know what to pass" % (name, unknown)
            arguments[name] = {p: by_property[p] for p in required}
    return arguments


@pytest.mark.parametrize("modern", [False, True], ids=["handshake", "2026-07-28"])
def test_every_tool_offered_changes_nothing_on_the_node(serve, modern):
    double = sample_with_counter_context().start()
    server = serve(double, CALIMERO_REGISTRY_URL=double.registry_url, **ON)
    offered = tools_of(server, modern)
    arguments = valid_arguments(double, offered)
    assert sorted(offered) == sorted(arguments)
    before = node_state(double)
    views = {"get", "len", "entries", "get_result", "value"}
    for name, args in arguments.items():
        start = len(double.log)
        result = call(server, name, args, modern)
        assert not result.get("isError"), (name, result)
        assert "not [view]" not in json.dumps(result), name
        requests = double.log[start:]
        assert requests or name == "list_nodes", name               # it reached the node, and only to read
        assert all(harmless(entry, views) for entry in requests), (name, [(e["method"], e["path"]) for e in requests])
    assert {e["method"] for e in double.executions} <= views
    assert {"get", "len", "entries", "get_result", "value"} == {e["method"] for e in double.executions}
    assert node_state(double) == before


@pytest.mark.parametrize("modern", [False, True], ids=["handshake", "2026-07-28"])
def test_every_tool_left_out_is_refused_by_name_before_the_node_hears_of_it(serve, modern):
    double = sample_with_counter_context()
    server = serve(double, **ON)
    server.tool_names()                                             # the catalog is read: app tools exist
    before, start = node_state(double), len(double.log)
    kv_context = next(c for c in double._contexts.values() if c["name"] == "demo")["id"]
    for name in sorted(DROPPED):
        args = {"context": "demo", "key": "k", "value": "v"} if name == "kv_store_set" else {}
        result = call(server, name, args, modern)
        assert result["isError"] is True, name
        text = result["content"][-1]["text"]
        assert text == "Error: %s is not available: %s, which offers only tools that cannot change the node. %s" % (
            name, READ_ONLY_SAYS, HOW_TO_CHANGE), text
    assert [e for e in double.log[start:] if e["method"] != "GET"] == []   # GETs only: the catalog poll, if due
    assert double.executions == [] and node_state(double) == before
    assert double.kv_state(kv_context) == {"k": "v"}


def test_a_tool_outside_the_toolsets_stays_unknown(serve):
    server = serve(sample_double(), CALIMERO_MCP_TOOLSETS="core", **ON)
    reply = server.request("tools/call", {"name": "list_blobs", "arguments": {}})
    assert reply["error"]["message"] == "Unknown tool: list_blobs"


# ── call and call_many run [view] methods only ───────────────────────────────────────────────────

UNSPECIFIED_ABI = {"schema_version": "wasm-abi/1", "types": {}, "methods": [
    {"name": "poke", "params": [], "returns": {"kind": "unit"}},                     # no intent: could write
    {"name": "peek", "params": [], "returns": {"kind": "u32"}, "intent": "read_only"}]}


VERSIONS = {KV: "1.0.0", "com.example.counter": "0.1.0", "com.example.odd": "1.0.0"}


def refused_method(method, package, listed_view=False, version=None):
    return ("Method %s of %s is not [view] in the installed build (version %s, intent %s%s): %s, so only [view] "
            "methods run." % (method, package, version or VERSIONS[package],
                              {"poke": "unspecified"}.get(method, "mutating"),
                              "; it was [view] when this tool was listed" if listed_view else "", READ_ONLY_SAYS))


@pytest.mark.parametrize("modern", [False, True], ids=["handshake", "2026-07-28"])
def test_call_and_call_many_refuse_every_method_that_is_not_view_per_item(serve, modern):
    double = sample_with_counter_context()
    odd = double.add_app({"package": "com.example.odd", "version": "1.0.0", "signer_id": "did:key:o",
                          "metadata": {}, "abi": UNSPECIFIED_ABI})
    double.add_alias("odd", double.add_context(odd))
    # CALIMERO_MCP_APPS leaves kv-store out of the catalog: call still reaches it, and read-only still holds
    server = serve(double, CALIMERO_MCP_APPS="counter", **ON)
    before = node_state(double)
    kv, counter, poke = ({"app": "kv-store", "context": "demo"}, {"app": "counter", "context": "tally"},
                         {"app": "odd", "context": "odd"})
    handle = call(server, "select_app", {"app": "kv-store"})["structuredContent"]["app_handle"]
    for args in (dict(kv, method="set", args={"key": "k", "value": "v"}), dict(counter, method="increment",
                 args={"by": 1}), dict(poke, method="poke"), {"app_handle": handle, "method": "clear"}):
        result = call(server, "call", args, modern)
        assert result["isError"] is True, args
        package = {"kv-store": KV, "counter": "com.example.counter", "odd": "com.example.odd"}.get(args.get("app"), KV)
        assert result["content"][-1]["text"] == "Error: %s %s" % (refused_method(args["method"], package),
                                                                   HOW_TO_CHANGE), result
    batch = [dict(kv, method="set", args={"key": "k", "value": "v"}), dict(kv, method="len"),
             dict(counter, method="increment", args={"by": 2}), dict(counter, method="value"),
             dict(poke, method="poke"), dict(poke, method="peek"), {"app_handle": handle, "method": "remove",
                                                                    "args": {"key": "k"}}]
    results = json.loads(call(server, "call_many", {"calls": batch}, modern)["content"][-1]["text"])
    assert [item["ok"] for item in results] == [False, True, False, True, False, True, False]
    for item, asked in zip(results, batch):
        if not item["ok"]:
            assert item["error"].startswith("Error: " + refused_method(asked["method"], {
                "counter": "com.example.counter", "odd": "com.example.odd"}.get(asked.get("app"), KV))), item
    assert sorted(e["method"] for e in double.executions) == ["len", "peek", "value"]
    assert not [e for e in double.log if e["path"] == "/jsonrpc" and e["json"]["params"]["method"] in
                ("set", "increment", "poke", "clear", "remove")]
    assert node_state(double) == before


def test_a_method_a_new_version_marks_mut_never_reaches_the_node(serve):
    """Listed [view], `peek` is [mut] in the version installed since: the generated tool, call and call_many
    (by alias and by handle) go by the installed build's ABI, each refused saying so; no execute is sent."""
    double = NodeDouble(apps=[{"package": "com.example.odd", "version": "1.0.0", "signer_id": "did:key:o",
                               "metadata": {}, "abi": UNSPECIFIED_ABI}])
    odd = double._app_key("com.example.odd")
    double.add_alias("odd", double.add_context(odd))
    server = serve(double, **ON)
    assert "odd_peek" in server.tool_names()
    handle = call(server, "select_app", {"app": "odd", "context": "odd"})["structuredContent"]["app_handle"]
    assert call(server, "odd_peek", {"context": "odd"}).get("isError") is not True        # it ran, [view]
    double.upgrade_with_intents(odd, "2.0.0", {"peek": "mutating"})
    start = len(double.log)
    refused = call(server, "odd_peek", {"context": "odd"})
    assert refused["isError"] is True and refused["content"][-1]["text"] == "Error: %s %s" % (
        refused_method("peek", "com.example.odd", True, "2.0.0"), HOW_TO_CHANGE), refused
    for args in ({"app": "odd", "context": "odd", "method": "peek"}, {"app": "com.example.odd", "context": "odd",
                                                                      "method": "peek"}):
        refused = call(server, "call", args)
        assert refused["isError"] is True and refused["content"][-1]["text"] == "Error: %s %s" % (
            refused_method("peek", "com.example.odd", version="2.0.0"), HOW_TO_CHANGE), refused
    fresh = call(server, "select_app", {"app": "odd", "context": "odd"})["structuredContent"]["app_handle"]
    items = json.loads(call(server, "call_many", {"calls": [{"app_handle": fresh, "method": "peek"},
                                                            {"app_handle": handle, "method": "peek"}]})
                       ["content"][-1]["text"])
    assert items[0]["error"].startswith("Error: " + refused_method("peek", "com.example.odd", version="2.0.0")), items
    assert "version 2.0.0 is installed now" in items[1]["error"], items      # the old handle: its app moved on
    assert [e for e in double.log[start:] if e["path"] == "/jsonrpc"] == []


def test_a_read_write_server_still_runs_every_method(serve):
    double = sample_double()
    server = serve(double)
    result = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "set",
                                       "args": {"key": "k", "value": "v"}})
    assert [e["method"] for e in double.executions] == ["set"]
    demo = double.executions[0]["contextId"]
    # set returns unit: the JSON null, then what ran where, then what it emitted (kv-store declares events)
    assert result["content"][:2] == [{"type": "text", "text": "null"}, {
        "type": "text", "text": 'set ran in context %s (alias "demo"); it returns nothing.' % demo}], result
    assert len(result["content"]) == 3 and result["content"][2]["text"].startswith("Events in context "), result


def test_select_app_names_only_the_tools_offered(serve):
    double = sample_double()
    picked = call(serve(double, **ON), "select_app", {"app": "kv-store"})["structuredContent"]
    assert picked["tools"] == ["kv_store_entries", "kv_store_get", "kv_store_get_result", "kv_store_len"]
    assert "kv_store_set" in call(serve(double), "select_app", {"app": "kv-store"})["structuredContent"]["tools"]


# ── every generated tool of the shared and our own ABIs ─────────────────────────────────────────

def fixture_abis():
    paths = fixture_apps.manifest_paths(fixture_apps.SHARED_ABIS)
    if not paths:
        pytest.skip("%s is absent: the shared fixtures live beside the checkout, not in it" % fixture_apps.SHARED_ABIS)
    return paths + fixture_apps.manifest_paths(fixture_apps.OWN_ABIS)


@pytest.mark.parametrize("modern", [False, True], ids=["handshake", "2026-07-28"])
def test_every_generated_tool_of_the_fixture_abis_is_left_out_or_a_view(serve, modern):
    paths = fixture_abis()
    double = NodeDouble()
    fixture_apps.install(double, paths)
    everything = tools_of(serve(double), modern)
    server = serve(double, **ON)
    kept = tools_of(server, modern)
    generated = {name: t for name, t in everything.items() if "_meta" in t and "intent" in t["_meta"]}
    assert len(generated) == fixture_apps.tool_count(paths)
    offered = [name for name in generated if name in kept]
    assert len(offered) == fixture_apps.tool_count(paths, read_only=True) > 0
    for name, definition in generated.items():
        is_view = definition["_meta"]["intent"] == "read_only"
        assert (name in kept) == is_view, name
        assert definition["annotations"]["readOnlyHint"] is is_view, name
        assert definition["description"].splitlines()[-1].startswith("[view]" if is_view else "[mut]"), name
    for name in sorted(set(generated) - set(kept)):              # each one left out, called by name anyway
        result = call(server, name, {}, modern)
        assert result["isError"] is True and READ_ONLY_SAYS in result["content"][-1]["text"], name
    assert double.executions == []


# ── --check says the mode ─────────────────────────────────────────────────────────────────────────

def run_check(double, tmp_path, **env):
    settings = minimal_env(tmp_path / "home", dict({"CALIMERO_NODE_URL": double.url,
                                                     "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                                                     "CALIMERO_NODE_HOME": tmp_path / "nodes"}, **env))
    done = subprocess.run([sys.executable, str(SERVER), "--check"], env=settings, capture_output=True, text=True,
                          timeout=60)
    return done.returncode, done.stdout.splitlines()


def test_check_prints_the_mode_and_counts_what_it_offers(tmp_path):
    with sample_double() as double:
        code, lines = run_check(double, tmp_path, **ON)
        assert code == 0
        assert lines[2] == ("Mode:      read-only (CALIMERO_MCP_READ_ONLY): only tools that cannot change the node "
                            "are offered; call and call_many run [view] methods only")
        assert "  - com.calimero.kv-store 1.0.0: 4 tools ([view] only; 9 in all)" in lines
        assert "  - com.example.counter 0.1.0: 1 tool ([view] only; 2 in all)" in lines
        code, lines = run_check(double, tmp_path)
        assert code == 0 and lines[2] == ("Mode:      read-write (CALIMERO_MCP_READ_ONLY=1 would offer only tools "
                                          "that cannot change the node)")
        assert "  - com.calimero.kv-store 1.0.0: 9 tools" in lines
        code, lines = run_check(double, tmp_path, CALIMERO_MCP_READ_ONLY="enabled")
        assert code == 0
        said = ('CALIMERO_MCP_READ_ONLY="enabled" is none of 1, true, yes, on (on) or 0, false, no, off (off), so it '
                'is read as on: read-only mode is on')
        assert lines[2] == ('Mode:      read-only (CALIMERO_MCP_READ_ONLY="enabled", read as on): only tools that '
                            'cannot change the node are offered; call and call_many run [view] methods only')
        assert "  - com.calimero.kv-store 1.0.0: 4 tools ([view] only; 9 in all)" in lines
        assert lines[lines.index("Problems:") + 1:lines.index("Problems:") + 3] == [
            "  - " + said, "    Fix: Set CALIMERO_MCP_READ_ONLY to 1 for read-only mode, or to 0 (or unset it) for "
            "read-write."]
        assert sum(said in line for line in lines) == 1          # said once, not once per reader
        code, lines = run_check(double, tmp_path, CALIMERO_MCP_READ_ONLY="off")
        assert code == 0 and lines[2].startswith("Mode:      read-write") and "Problems:" not in lines
