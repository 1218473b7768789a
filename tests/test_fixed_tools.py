"""The fixed tools over stdio against the node double: what reached the node, and what came back
(tools.md; reference-behaviour.md §3.2-§3.4 for the literal texts)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time

import pytest

from mcp_client import APP_TOOLS, ROOT, fixed_names
from node_double import (NODE_ACCOUNT, NODE_PUBLIC_KEY, NodeDouble, counter_spec, error_reply, hex_id, kv_store_spec,
                         sample_double)

# Each toolset's own tools (core is always on; the application tools are in every toolset), from the snapshot
# of the fixed tools (tests/snapshots/fixed_tools.json, `make snapshot`).
CORE = [name for name in fixed_names(["core"]) if name not in APP_TOOLS]
BLOBS = [name for name in fixed_names(["blobs"]) if name not in APP_TOOLS and name not in CORE]
GOVERNANCE = [name for name in fixed_names(["governance"]) if name not in APP_TOOLS and name not in CORE]
FIXED = CORE + BLOBS + GOVERNANCE
READ_ONLY = {"node_status", "list_nodes", "list_applications", "list_namespaces", "list_contexts", "lookup_alias",
             "list_blobs", "list_group_members", "get_blob", "describe_group", "list_registry"}
DESTRUCTIVE = {"delete_context", "uninstall_application", "delete_blob", "delete_namespace", "leave_namespace",
               "remove_group_members", "delete_group", "upgrade_group"}
IDEMPOTENT_WRITES = set()
IDEMPOTENT = {"delete_alias", "sync_context"}     # sync_context's force overwrites local state
KV = "com.calimero.kv-store"
MISSING = hex_id("no such thing")
# install_application's note, as written here (neither tools.md, reference-behaviour.md nor the README gives its
# words): a copy of the server's constant would pass whatever it said.
INSTALLED_NOTE = ("A host that does not reload its tool list (Claude Code does not) shows no tools for it until "
                  "restarted: call and describe_app reach its methods now.")

# An app whose init takes arguments, for create_context's init check.
WORLD_MANIFEST = {
    "schema_version": "wasm-abi/1", "types": {},
    "methods": [
        {"name": "init", "doc": "Creates the world.", "intent": "mutating", "returns": {"kind": "unit"},
         "params": [{"name": "name", "type": {"kind": "string"}, "doc": "What to call it."},
                    {"name": "seed", "type": {"kind": "u64"}},
                    {"name": "motto", "type": {"kind": "string"}, "nullable": True}]},
        {"name": "name", "params": [], "returns": {"kind": "string"}, "intent": "read_only"},
    ],
}
NO_INIT_MANIFEST = {"schema_version": "wasm-abi/1", "types": {},
                    "methods": [{"name": "ping", "params": [], "returns": {"kind": "unit"}}]}


def world_spec(**extra):
    return dict({"package": "com.example.world", "version": "1.0.0", "signer_id": "signer-w",
                 "metadata": {"name": "World"}, "abi": WORLD_MANIFEST}, **extra)


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()      # the double's blob id


def text_of(result):
    return result["content"][-1]["text"]


def error_text(result):
    assert result.get("isError") is True, result
    return text_of(result)


def namespace_of(double, package=KV):
    app_id = double._app_key(package)
    return next(g["id"] for g in double._groups.values() if g["parent"] is None and g["applicationId"] == app_id)


def context_of(double, package=KV):
    app_id = double._app_key(package)
    return next(c["id"] for c in double._contexts.values() if c["applicationId"] == app_id)


def every_row(server, tool, arguments, rows_key):
    """A list the server answers in pages (over 60,000 characters), followed to its last page; and the number of
    pages."""
    rows, cursor, answers = [], None, 0
    while True:
        page = server.call_tool(tool, dict(arguments, cursor=cursor) if cursor else arguments)["structuredContent"]
        rows, answers = rows + page[rows_key], answers + 1
        cursor = page.get("nextCursor")
        if cursor is None:
            return rows, answers


def bodies(double, method, path):
    return [entry["json"] for entry in double.requests_to(method, path)]



# ── the tool table: names, toolsets, annotations, schemas ─────────────────────────────────────────

@pytest.mark.parametrize("setting,expected", [
    (None, FIXED), ("all", FIXED), ("core", CORE), ("core,blobs", CORE + BLOBS), ("governance", CORE + GOVERNANCE),
    ("bogus", CORE)])
def test_toolsets_select_the_fixed_tools(serve, setting, expected):
    env = {"CALIMERO_MCP_TOOLSETS": setting} if setting is not None else {}
    server = serve(sample_double(), **env)
    names = [name for name in server.tool_names() if name in FIXED]
    assert names == expected


def test_an_unknown_toolset_is_reported_once_on_stderr(serve):
    server = serve(sample_double(), CALIMERO_MCP_TOOLSETS="core,bogus")
    server.tool_names()
    server.call_tool("node_status")
    server.close()
    warnings = [line for line in server.stderr.splitlines() if "bogus" in line]
    assert len(warnings) == 1
    assert "CALIMERO_MCP_TOOLSETS names unknown toolsets bogus" in warnings[0]


def test_annotations_follow_tools_md(server):
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    for name in FIXED:
        annotations = tools[name].get("annotations", {})
        if name in READ_ONLY:
            assert annotations == {"readOnlyHint": True}, name
        elif name in DESTRUCTIVE:
            assert annotations == {"readOnlyHint": False, "destructiveHint": True}, name
        elif name in IDEMPOTENT:
            assert annotations == {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True}, name
        elif name in IDEMPOTENT_WRITES:
            assert annotations == {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True}, name
        else:                       # MCP would read a bare write as destructive: say it is not
            assert annotations == {"readOnlyHint": False, "destructiveHint": False}, name


# Properties whose name says what they take: a description would only repeat it. How apps and
# contexts are named is said once, in the server's instructions.
SELF_EXPLAINING = {"application", "app", "group", "namespace", "name", "service", "context", "contextId", "blob", "package",
                   "method", "visibility", "members", "alias", "force", "offset", "cascade", "role",
                   "after", "kind", "wait", "watch"}      # events: its description says after, wait and watch


def fixed_definitions(server):
    return [t for t in server.result("tools/list")["tools"] if "_meta" not in t]


def test_every_property_is_described_unless_its_name_says_it(server):
    for tool in fixed_definitions(server):
        schema = tool["inputSchema"]
        assert schema["type"] == "object", tool["name"]
        for prop, definition in (schema.get("properties") or {}).items():
            assert definition.get("description") or prop in SELF_EXPLAINING, (tool["name"], prop)


def test_a_no_argument_tool_says_so(server):
    tools = {t["name"]: t for t in fixed_definitions(server)}
    assert tools["node_status"]["inputSchema"] == {"type": "object", "additionalProperties": False}
    assert list(tools["list_nodes"]["inputSchema"]["properties"]) == ["cursor"], "its only argument pages it"
    refused = server.call_tool("node_status", {"verbose": True})
    assert refused.get("isError") is True and "Unknown argument verbose" in text_of(refused)


@pytest.mark.parametrize("tool, arguments, problem", [
    ("list_applications", {"verbose": "x" * 100000}, '- verbose: expected boolean, got "%s...' % ("x" * 56)),
    ("describe_app", {"app": None}, "- app: expected string, got null"),       # required: null is no absence
    ("create_context", {"application": "kv-store", "name": {"a": True}}, '- name: expected string, got {"a": true}'),
    ("create_context", {"name": "n"}, "- application: missing required parameter"),
])
def test_a_wrong_argument_is_said_in_json_with_what_was_expected(server, tool, arguments, problem):
    """A long wrong value is shown short, so the answer keeps what was expected (a 100,000-character string was
    echoed whole, and the bound cut off "is not of type 'boolean'"); values read as JSON (null, true), not Python."""
    refused = server.call_tool(tool, arguments)
    assert refused.get("isError") is True
    assert text_of(refused) == "Error: Invalid arguments for %s:\n%s" % (tool, problem)


def test_first_sentences_tell_the_tools_apart(server):
    """A host's tool search matches names and descriptions: each fixed tool's first sentence says what it does, and
    no two say the same; no description passes Claude Code's 2,048-character cut."""
    tools = fixed_definitions(server)
    firsts = {t["name"]: t["description"].split(". ")[0].rstrip(".") for t in tools}
    assert all(len(first.split()) >= 3 for first in firsts.values()), firsts
    assert len(set(firsts.values())) == len(firsts), firsts
    assert all(len(t["description"]) <= 2048 for t in tools)


def test_the_invitation_is_declared_opaque(server):
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    schema = tools["join_namespace"]["inputSchema"]
    assert schema["properties"]["invitation"] == {
        "type": "object",
        "description": "From invite_to_namespace, unchanged."}
    assert schema["required"] == ["namespace", "invitation"]


# ── core ──────────────────────────────────────────────────────────────────────────────────────────

def test_node_status_reports_the_double(server, double):
    status = server.tool_json("node_status")
    assert status == {"health": {"status": "alive"}, "url": double.url, "nodeName": None,
                      "discoverySource": "env", "authMode": "none", "peers": 0, "registry": None,
                      "registryNote": "No registry address is known: this server found no node directory with a "
                      "config.toml for the node in use, so set CALIMERO_REGISTRY_URL to the registry's base URL (the "
                      "base_url the node fetches from).",
                      "identity": NODE_ACCOUNT, "publicKey": NODE_PUBLIC_KEY, "readOnly": False}


def test_list_nodes_merges_configured_nodes_and_marks_the_active_one(serve, tmp_path):
    double = sample_double().start()
    node_dir = tmp_path / "nodes" / "mine"
    node_dir.mkdir(parents=True)
    (node_dir / "config.toml").write_text('[server]\nlisten = ["/ip4/127.0.0.1/tcp/%d"]\n' % double.port)
    server = serve(double)
    nodes = server.tool_json("list_nodes")["nodes"]
    assert nodes[0] == {"url": "http://localhost:%d" % double.port, "name": "mine", "active": True}
    assert all(entry["active"] is False for entry in nodes[1:])
    # CALIMERO_NODE_URL spells it 127.0.0.1; the directory that matches it for list_nodes names it here too.
    assert double.url.startswith("http://127.0.0.1:")
    assert server.tool_json("node_status")["nodeName"] == "mine"


def write_node_dir(home, name, port):
    (home / name).mkdir(parents=True)
    (home / name / "config.toml").write_text('[server]\nlisten = ["/ip4/127.0.0.1/tcp/%d"]\n' % port)


def test_node_status_names_the_node_only_when_one_directory_matches(start_server, server_env, double, tmp_path):
    home = tmp_path / "nodes"
    write_node_dir(home, "elsewhere", double.port % 65535 + 1)
    assert start_server(server_env).tool_json("node_status")["nodeName"] is None, "no directory gives its port"
    write_node_dir(home, "a", double.port)
    write_node_dir(home, "b", double.port)
    single = dict(server_env, CALIMERO_MCP_MULTI_NODE="off")     # several homes are multi-node mode (issue 33)
    assert start_server(single).tool_json("node_status")["nodeName"] is None, "two directories claim it"
    (home / "b" / "config.toml").unlink()
    assert start_server(single).tool_json("node_status")["nodeName"] == "a"


def test_list_applications_compact_rows(server):
    apps = server.tool_json("list_applications")["apps"]
    kv, counter = apps if apps[0]["package"] == KV else apps[::-1]
    assert kv == {"id": hex_id(KV + "\0" + kv_store_spec()["signer_id"]), "package": KV, "name": "KV Store",
                  "version": "1.0.0", "description": "A replicated key-value store.", "services": [],
                  "hasGuide": True, "procedures": ["Store a value", "List everything", "Remove a value"]}
    assert counter["hasGuide"] is False and counter["procedures"] == []


def test_list_applications_cuts_descriptions_at_200_characters(serve):
    spec = counter_spec()
    spec["metadata"] = {"name": "Counter", "description": "x" * 199 + "yz" + "w" * 50}
    server = serve(NodeDouble(apps=[spec]))
    row = server.tool_json("list_applications")["apps"][0]
    assert row["description"] == "x" * 199 + "y"


def test_list_applications_verbose_returns_full_records_without_the_guide(server):
    apps = server.tool_json("list_applications", {"verbose": True})["apps"]
    kv = next(a for a in apps if a["package"] == KV)
    assert kv["appVersion"] == "1.0.0"
    assert kv["signer_id"] == kv_store_spec()["signer_id"]
    assert set(kv["blob"]) == {"bytecode", "compiled"}
    assert kv["metadata"]["icon"].startswith("data:image/png;base64,")
    assert kv["metadata"]["name"] == "KV Store"
    assert "guide" not in kv["metadata"] and "guide" not in kv
    assert kv["procedures"] == ["Store a value", "List everything", "Remove a value"]


def test_list_namespaces_is_the_node_list(server, double):
    namespaces = server.tool_json("list_namespaces")["namespaces"]      # wrapped, as list_contexts is
    assert [n["namespaceId"] for n in namespaces] == [namespace_of(double)]
    assert namespaces[0]["name"] == "demo-team"
    group = double._groups[namespace_of(double)]
    assert namespaces[0]["createdAt"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(group["createdAt"]))
    assert namespaces[0]["founder"] == double.account and "founding" not in namespaces[0]   # the salt is no one's
    asked = [r["query"] for r in double.requests_to("GET", "/admin-api/namespaces") if r["path"] == "/admin-api/namespaces"]
    assert asked == [{"offset": "0", "limit": "1000"}]      # a full page at a time: the node's default is 100
    created, group["createdAt"] = group["createdAt"], 1 << 60    # not a time datetime can write: shown as sent
    try:
        assert server.tool_json("list_namespaces")["namespaces"][0]["createdAt"] == 1 << 60
    finally:
        group["createdAt"] = created


def test_list_contexts_leaves_out_state_unless_verbose(server, double):
    context_id = context_of(double)
    plain = server.tool_json("list_contexts")["contexts"]
    assert [c["id"] for c in plain] == [context_id]
    assert plain[0]["namespaceName"] == "demo-team"          # its namespace by name, beside groupId
    assert "contextStateHash" not in plain[0] and "dagHeads" not in plain[0]
    verbose = server.tool_json("list_contexts", {"verbose": True})["contexts"][0]
    heads = double._contexts[context_id]["heads"]
    assert verbose["dagHeads"] == heads                      # byte arrays on the wire, hex for the agent
    assert len(verbose["contextStateHash"]) == 64


def test_list_contexts_reads_every_page(server, double):
    """The node pages contexts (default 100, at most 1000): a node with 1,205 contexts lists them all."""
    kv_id = double._app_key(KV)
    for index in range(1204):
        double.add_context(kv_id, context_id=hex_id("page-%d" % index))
    listed, answers = every_row(server, "list_contexts", {}, "contexts")
    assert len(listed) == 1205 and len({c["id"] for c in listed}) == 1205
    pages = [(r["query"].get("offset"), r["query"].get("limit"))
             for r in double.requests_to("GET", "/admin-api/contexts") if r["path"] == "/admin-api/contexts"]
    assert pages == [("0", "1000"), ("1000", "1000")] * answers         # every tool page reads the whole list


def test_list_contexts_reads_every_context_once_when_stored_ids_resolve_to_none(server, double):
    """Core's offset counts stored ids, a dangling one too, while its limit counts contexts: the second page then
    starts with the last context of the first, which is listed once."""
    kv_id = double._app_key(KV)
    for index in range(1204):
        double.add_context(kv_id, context_id=hex_id("page-%d" % index))
    double.dangling_context_ids.add("0" * 64)            # sorts first: every later page starts one id early
    listed, _ = every_row(server, "list_contexts", {}, "contexts")
    assert len(listed) == 1205 and len({c["id"] for c in listed}) == 1205
    assert sorted(c["id"] for c in listed) == sorted(double._contexts)


def test_list_contexts_filters_by_any_app_name(server, double):
    kv_id = double._app_key(KV)
    contexts = server.tool_json("list_contexts", {"application": "kv store"})["contexts"]
    assert [c["id"] for c in contexts] == [context_of(double)]
    assert double.requests_to("GET", "/admin-api/contexts/for-application/" + kv_id)
    assert server.tool_json("list_contexts", {"application": "counter"}) == {"contexts": []}
    missing = error_text(server.call_tool("list_contexts", {"application": "nope"}))
    assert missing == ('Error: Application "nope" not found. Installed: com.calimero.kv-store, '
                       'com.example.counter')


def test_create_context_sends_the_init_bytes(server, double):
    namespace = namespace_of(double)
    created = server.tool_json("create_context", {"application": "kv-store", "group": namespace, "name": "two"})
    assert created["contextId"] in double._contexts and created["name"] == "two"     # the label, said back
    body = bodies(double, "POST", "/admin-api/contexts")[-1]
    assert body == {"applicationId": double._app_key(KV), "groupId": namespace, "name": "two",
                    "initializationParams": list(b"{}")}


def test_create_context_takes_namespace_as_an_older_name_for_group(server, double):
    namespace = namespace_of(double)
    server.tool_json("create_context", {"application": KV, "namespace": namespace})
    server.tool_json("create_context", {"application": KV, "namespace": namespace, "group": namespace})
    assert [b["groupId"] for b in bodies(double, "POST", "/admin-api/contexts")] == [namespace, namespace]
    both = error_text(server.call_tool("create_context", {"application": KV, "namespace": namespace,
                                                          "group": MISSING}))
    assert both == 'Error: Pass group or namespace, not both: they differ ("%s" and "%s").' % (MISSING, namespace)
    # neither: the app's only namespace, the same one
    server.tool_json("create_context", {"application": KV})
    assert [b["groupId"] for b in bodies(double, "POST", "/admin-api/contexts")] == [namespace] * 3


WORLD_INIT = ("Its init: Creates the world.\n\n[mut] init(name: string, seed: u64, motto?: string) -> unit\n"
              "  name: What to call it.\nPass these as create_context's args, keyed by parameter name.")


@pytest.mark.parametrize("args,problems", [
    (None, "missing name, seed"),
    ({"seed": 7}, "missing name"),
    ({"name": "w", "seed": "seven"}, 'invalid seed (expected integer, got "seven")'),
    ({"name": "w", "seed": 7, "colour": "red"}, "undeclared colour"),
    ({"seed": -1, "extra": 1}, "missing name; invalid seed (expected an integer >= 0, got -1); undeclared extra"),
])
def test_create_context_checks_init_args_before_creating(serve, args, problems):
    double = NodeDouble(apps=[world_spec()])
    namespace = double.add_namespace(double._app_key("com.example.world"))
    server = serve(double)
    request = {"application": "world", "group": namespace}
    if args is not None:
        request["args"] = args
    text = error_text(server.call_tool("create_context", request))
    assert text == 'Error: Application "world" cannot be initialized with these args: %s.\n%s' % (problems,
                                                                                                  WORLD_INIT)
    assert double.requests_to("POST", "/admin-api/contexts") == []


def test_create_context_encodes_validated_init_args_as_compact_utf8_json(serve):
    double = NodeDouble(apps=[world_spec()])
    namespace = double.add_namespace(double._app_key("com.example.world"))
    server = serve(double)
    server.tool_json("create_context", {"application": "World", "group": namespace,
                                        "args": {"seed": 7, "name": "Wörld"}})
    sent = bodies(double, "POST", "/admin-api/contexts")[-1]["initializationParams"]
    assert bytes(sent) == '{"name":"Wörld","seed":7}'.encode("utf-8")


def test_create_context_refuses_args_for_an_app_without_init(serve):
    double = NodeDouble(apps=[world_spec(abi=NO_INIT_MANIFEST)])
    namespace = double.add_namespace(double._app_key("com.example.world"))
    server = serve(double)
    text = error_text(server.call_tool("create_context", {"application": "world", "group": namespace,
                                                          "args": {"a": 1}}))
    assert text == 'Error: Application "world" declares no init method, so it takes no init args.'
    server.tool_json("create_context", {"application": "world", "group": namespace})
    assert [b["initializationParams"] for b in bodies(double, "POST", "/admin-api/contexts")] == [[]]


def test_create_context_without_a_readable_abi(serve):
    double = NodeDouble(apps=[world_spec(abi_error="application has no usable embedded ABI")])
    namespace = double.add_namespace(double._app_key("com.example.world"))
    server = serve(double)
    refused = error_text(server.call_tool("create_context", {"application": "world", "group": namespace,
                                                             "args": {"name": "w", "seed": 1}}))
    assert refused == ('Error: Application "world" cannot check these init args: its ABI could not be read '
                       '(application has no usable embedded ABI).')
    assert double.requests_to("POST", "/admin-api/contexts") == []
    # No args and no ABI: created with no init input, and the node's own init failure is what the agent reads.
    unchecked = error_text(server.call_tool("create_context", {"application": "world", "group": namespace}))
    assert unchecked.startswith("Error: application initialization failed: guest panicked: init: failed to "
                                "deserialize arguments")
    assert bodies(double, "POST", "/admin-api/contexts")[-1]["initializationParams"] == []


def test_create_context_for_a_multi_service_app(serve):
    spec = world_spec(abi=None, services={"api": WORLD_MANIFEST, "admin": NO_INIT_MANIFEST})
    double = NodeDouble(apps=[spec])
    namespace = double.add_namespace(double._app_key("com.example.world"))
    server = serve(double)
    text = error_text(server.call_tool("create_context", {"application": "world", "group": namespace}))
    assert text == "Error: Application com.example.world bundles several services; pass service with one of: admin, api"
    server.tool_json("create_context", {"application": "world", "group": namespace, "service": "admin"})
    body = bodies(double, "POST", "/admin-api/contexts")[-1]
    assert body["serviceName"] == "admin" and body["initializationParams"] == []


def test_join_context_by_id_and_by_alias(server, double):
    context_id = context_of(double)
    joined = server.tool_json("join_context", {"context": "demo"})
    assert joined == {"contextId": context_id, "memberPublicKey": hex_id("member:" + context_id)}
    server.tool_json("join_context", {"context": context_id})
    assert [e["path"] for e in double.requests_to("POST", "/admin-api/contexts/")] == [
        "/admin-api/contexts/%s/join" % context_id] * 2


def test_delete_context_resolves_an_alias_first(server, double):
    context_id = context_of(double)
    assert server.tool_json("delete_context", {"context": "demo"}) == {"isDeleted": True, "contextId": context_id,
                                                                       "aliasesDeleted": ["demo"]}
    assert [e["path"] for e in double.requests_to("DELETE")] == ["/admin-api/contexts/" + context_id]
    missing = error_text(server.call_tool("delete_context", {"context": "gone"}))
    assert missing == 'Error: Context "gone" is neither a context id nor an alias on this node.'
    assert len(double.requests_to("DELETE")) == 1


def test_create_and_look_up_an_alias(server, double):
    context_id = context_of(double)
    created = server.call_tool("create_alias", {"alias": "prod", "contextId": context_id})
    assert text_of(created) == 'Alias "prod" now resolves to context %s.' % context_id
    assert bodies(double, "POST", "/admin-api/alias/create/context") == [{"alias": "prod", "contextId": context_id}]
    assert server.tool_json("lookup_alias", {"name": "prod"}) == {"alias": "prod", "contextId": context_id}
    duplicate = text_of(server.call_tool("create_alias", {"alias": "prod", "contextId": context_id}))
    assert duplicate == 'Alias "prod" already names context %s; nothing changed.' % context_id


@pytest.mark.parametrize("name", ["nobody", "not an alias!"])
def test_a_lookup_miss_is_a_result_not_an_error(server, name):
    result = server.call_tool("lookup_alias", {"name": name})
    assert not result.get("isError")
    assert text_of(result) == 'No alias named "%s" on this node.' % name


# ── blobs ─────────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("coords", ["a@b@c", "@1.0.0", "com.x@", "com.x @1.0.0", "com.x@1.0.0\n", ""])
def test_install_refuses_malformed_coordinates(server, double, coords):
    text = error_text(server.call_tool("install_application", {"coords": coords}))
    assert text == 'Error: Expected package@version (or a package alone, for its newest version), got "%s".' % coords
    assert double.requests_to("POST", "/admin-api/install-application") == []


def test_install_by_coordinates_then_reads_the_list_again(serve):
    double = NodeDouble(registry={"com.example.counter@0.1.0": counter_spec()})
    server = serve(double)
    server.tool_names()                                    # the first catalog read is done
    before = len(double.requests_to("GET", "/admin-api/applications"))
    installed = server.tool_json("install_application", {"coords": "com.example.counter@0.1.0"})
    assert installed == {"applicationId": double._app_key("com.example.counter"), "package": "com.example.counter",
                         "version": "0.1.0", "name": "Counter", "hasGuide": False, "tools": 2,
                         "methods": ["increment", "value"], "change": "new application", "note": INSTALLED_NOTE}
    assert bodies(double, "POST", "/admin-api/install-application") == [
        {"package": "com.example.counter", "version": "0.1.0"}]
    assert len(double.requests_to("GET", "/admin-api/applications")) > before
    failed = error_text(server.call_tool("install_application", {"coords": "com.example.none@1.0.0"}))
    assert "has no application published at" in failed


def test_install_succeeds_when_only_the_refresh_fails(serve):
    double = NodeDouble(registry={"com.example.counter@0.1.0": counter_spec()})
    server = serve(double)
    server.tool_names()
    double.faults = {"status": 500, "json": {"error": "list broke"}, "paths": ["/admin-api/applications"]}
    installed = server.tool_json("install_application", {"coords": "com.example.counter@0.1.0"})
    assert installed == {"applicationId": double._app_key("com.example.counter"), "package": "com.example.counter",
                         "version": "0.1.0", "name": None, "hasGuide": None, "tools": 0, "methods": None,
                         "note": INSTALLED_NOTE}     # the catalog could not be read
    server.close()
    assert "app list refresh failed: list broke" in server.stderr


def test_an_uninstall_as_a_sessions_first_call_counts_the_tools_that_leave(serve):
    double = sample_double()
    # the catalog's first read is still out (its ABI reads) as the call comes
    double.slow = {"/admin-api/applications/%s/abi" % double._app_key(app): 1.0 for app in (KV, "com.example.counter")}
    server = serve(double)
    answer = server.tool_json("uninstall_application", {"application": "counter"})
    assert answer["note"].startswith("Its 2 tools leave the tool list."), answer


def test_uninstall_resolves_the_name_before_removing(server, double):
    kv_id, namespace = double._app_key(KV), namespace_of(double)
    assert server.tool_json("uninstall_application", {"application": "KV Store"}) == {
        "applicationId": kv_id, "package": "com.calimero.kv-store", "version": "1.0.0", "uninstalled": True,
        "stillReferring": [{"namespaceId": namespace, "name": "demo-team", "contextCount": 1,
                            "removeWith": "delete_context for each of its contexts, then delete_namespace"}],
        "note": "Its 9 tools leave the tool list. A host that does not reload its tool list (Claude Code does not) "
                "shows them until restarted; they answer an error now."}
    assert [e["path"] for e in double.requests_to("DELETE")] == ["/admin-api/applications/" + kv_id]
    assert KV not in [r["package"] for r in double._apps.values()]
    missing = error_text(server.call_tool("uninstall_application", {"application": KV}))
    assert missing == 'Error: Application "com.calimero.kv-store" not found. Installed: com.example.counter'
    assert len(double.requests_to("DELETE")) == 1


def test_uninstall_refuses_an_ambiguous_name(serve):
    other = dict(counter_spec(), package="org.other.counter")
    double = NodeDouble(apps=[counter_spec(), other])
    server = serve(double)
    text = error_text(server.call_tool("uninstall_application", {"application": "counter"}))
    assert text == ('Error: Application "counter" is ambiguous: com.example.counter, org.other.counter. '
                    'Pass the full package name or the application id.')
    assert double.requests_to("DELETE") == []


def test_upload_blob_puts_the_decoded_bytes(server, double):
    data = bytes(range(256))
    context_id = context_of(double)
    expected_id = sha256_hex(data)
    uploaded = server.tool_json("upload_blob", {"data": base64.b64encode(data).decode(), "hash": expected_id,
                                                "context": "demo"})
    assert uploaded == {"blobId": expected_id, "size": 256, "announcedTo": {"contextId": context_id, "alias": "demo"}}
    put = double.requests_to("PUT", "/admin-api/blobs")[-1]
    assert put["body"] == data
    assert put["query"] == {"hash": expected_id, "context_id": context_id}
    assert put["headers"]["content-type"] == "application/octet-stream"


@pytest.mark.parametrize("data", ["aGVsbG8*", "aGVsbG8", "not base64 at all!"])
def test_upload_blob_refuses_invalid_base64(server, double, data):
    text = error_text(server.call_tool("upload_blob", {"data": data}))
    assert text.startswith("Error: data is not valid base64 (")
    assert text.endswith("). Encode the blob bytes with standard base64.")
    assert double.requests_to("PUT") == []


def test_upload_blob_accepts_wrapped_base64(server, double):
    uploaded = server.tool_json("upload_blob", {"data": "aGVs\nbG8="})
    assert uploaded == {"blobId": sha256_hex(b"hello"), "size": 5, "announcedTo": None}


def test_the_largest_blob_stated_uploads_and_a_line_over_the_limit_is_refused(server, double):
    """The README's line limit and upload_blob's stated blob size, held to the real server at the boundary."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    line_limit = int(re.search(r"of at most 16 MiB \(([\d,]+) bytes\)", readme).group(1).replace(",", ""))
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    largest = int(re.search(r"at most (\d+) bytes a request\.", tools["upload_blob"]["description"]).group(1))
    assert "blobs of up to %s bytes" % format(largest, ",") in readme, "the README states the same size"

    blob = os.urandom(largest)
    arguments = {"data": base64.b64encode(blob).decode(), "hash": sha256_hex(blob), "context": "demo"}
    text = json.dumps({"jsonrpc": "2.0", "id": "big", "method": "tools/call",
                       "params": {"name": "upload_blob", "arguments": arguments}})
    assert len(text) <= line_limit
    server.send_raw((text + " " * (line_limit - len(text))).encode())       # exactly the limit, then the newline
    uploaded = server.wait_for("big", timeout=120)["result"]
    assert uploaded["structuredContent"] == {"blobId": sha256_hex(blob), "size": largest, "announcedTo": {
        "contextId": context_of(double), "alias": "demo"}}, uploaded
    assert double.requests_to("PUT", "/admin-api/blobs")[-1]["body"] == blob

    server.send_raw((text + " " * (line_limit - len(text) + 1)).encode())   # one byte more
    refused = server.wait_for(None, timeout=120)
    assert refused["error"] == {"code": -32700, "message": "Parse error: message longer than %d bytes" % line_limit}
    assert server.result("ping") == {}
    assert len(double.requests_to("PUT", "/admin-api/blobs")) == 1


def test_list_and_delete_blobs_speak_camel_case(server, double):
    server.tool_json("upload_blob", {"data": base64.b64encode(b"hello").decode()})
    blob_id = sha256_hex(b"hello")
    blobs = server.tool_json("list_blobs")["blobs"]
    assert {"blobId": blob_id, "size": 5} in blobs
    assert all(set(b) == {"blobId", "size"} for b in blobs)
    assert server.tool_json("delete_blob", {"blob": blob_id}) == {"blobId": blob_id, "deleted": True}
    assert double.requests_to("DELETE", "/admin-api/blobs/" + blob_id)
    in_use = next(b["blobId"] for b in blobs if b["blobId"] != blob_id)
    refused = error_text(server.call_tool("delete_blob", {"blob": in_use}))
    # node.py appends auth advice to every 403; the node's own words come first.
    assert refused.startswith("Error: Blob is referenced by an installed application and cannot be deleted")


# ── governance ────────────────────────────────────────────────────────────────────────────────────

def test_create_and_delete_a_namespace(server, double):
    created = server.tool_json("create_namespace", {"application": "counter", "name": "team"})
    assert created["namespaceId"] in double._groups
    assert bodies(double, "POST", "/admin-api/namespaces") == [
        {"applicationId": double._app_key("com.example.counter"), "name": "team"}]
    deleted = server.tool_json("delete_namespace", {"namespace": created["namespaceId"]})
    assert deleted == {"isDeleted": True, "namespaceId": created["namespaceId"], "name": "team"}
    request = double.requests_to("DELETE", "/admin-api/namespaces/")[-1]
    assert request["body"] == b"{}" and request["headers"]["content-type"] == "application/json"


def test_invitation_round_trip_is_byte_identical(server, double):
    namespace = namespace_of(double)
    invited = server.call_tool("invite_to_namespace", {"namespace": namespace})
    returned_text = text_of(invited)
    answer = json.loads(returned_text)
    assert invited["structuredContent"] == answer
    joined = server.tool_json("join_namespace", {"namespace": namespace, "invitation": answer})
    assert joined["identity"] == NODE_ACCOUNT and "memberAccount" not in joined
    sent = double.requests_to("POST", "/admin-api/namespaces/%s/join" % namespace)[-1]["body"]
    signed = answer["invitation"]
    # The signed object left as it arrived: same keys, same order, same values, snake_case kept.
    assert json.dumps(signed).encode() in sent
    assert pairs(sent)["invitation"] == pairs(returned_text.encode())["invitation"]
    assert json.loads(sent) == {"invitation": signed, "groupName": "demo-team"}


def pairs(raw):
    """JSON with every object as its (key, value) list, so key order takes part in comparisons."""
    return dict(json.loads(raw, object_pairs_hook=list))


def test_join_forwards_unknown_fields_and_key_order(server, double):
    namespace = namespace_of(double)
    signed = server.tool_json("invite_to_namespace", {"namespace": namespace})["invitation"]
    reshuffled = {"zz_future_field": {"b": 2, "a": 1}, "inviter_signature": signed["inviter_signature"]}
    reshuffled.update((k, v) for k, v in signed.items() if k != "inviter_signature")
    server.tool_json("join_namespace", {"namespace": namespace, "invitation": reshuffled, "groupName": "ours"})
    sent = double.requests_to("POST", "/admin-api/namespaces/%s/join" % namespace)[-1]["body"]
    assert sent == json.dumps({"invitation": reshuffled, "groupName": "ours"}).encode()


def test_a_tampered_invitation_is_refused_by_the_node(server, double):
    namespace = namespace_of(double)
    signed = server.tool_json("invite_to_namespace", {"namespace": namespace})["invitation"]
    signed["invitation"]["invited_role"] = 0                   # tampered: the node must see it and refuse
    text = error_text(server.call_tool("join_namespace", {"namespace": namespace, "invitation": signed}))
    assert text.startswith("Error: invitation is invalid: its signature does not verify")


def test_leave_namespace(server, double):
    namespace = namespace_of(double)
    assert text_of(server.call_tool("leave_namespace", {"namespace": namespace})) == (
        'Left namespace %s ("demo-team"). This node was its only admin and only member: no one is left who can '
        "invite to it, add members or upgrade it. This node still holds 1 of its contexts (%s (demo)): leaving does "
        "not delete them, but as a non-member it takes no part in them; delete_context removes each."
        % (namespace, next(c["id"] for c in double._contexts.values() if c["name"] == "demo")))
    assert double.requests_to("POST", "/admin-api/namespaces/%s/leave" % namespace)
    assert NODE_ACCOUNT not in double._groups[namespace]["members"]


def test_group_members_list_and_add(server, double):
    namespace = namespace_of(double)
    assert server.tool_json("list_group_members", {"group": namespace}) == {
        "members": [{"identity": NODE_ACCOUNT, "role": "Admin"}]}
    alice, bob = hex_id("alice"), hex_id("bob")
    members = [{"identity": alice, "role": "Member"}, {"identity": bob, "role": "ReadOnly"}]
    added = server.call_tool("add_group_members", {"group": namespace, "members": members})
    assert text_of(added) == "Added %s (Member), %s (ReadOnly) to group %s." % (alice, bob, namespace)
    assert bodies(double, "POST", "/admin-api/groups/%s/members" % namespace) == [{"members": members}]
    assert double._groups[namespace]["members"][bob] == "ReadOnly"


def test_a_key_a_member_item_does_not_take_is_refused_naming_where(server, double):
    namespace = namespace_of(double)
    members = [{"identity": hex_id("alice"), "role": "Member"},
               {"identity": hex_id("bob"), "role": "Member", "rol": "Admin"}]
    refused = server.call_tool("add_group_members", {"group": namespace, "members": members})
    assert error_text(refused) == ("Error: Unknown argument rol in members.1. Each members item takes: identity, "
                                   "role.")
    assert double.requests_to("POST", "/admin-api/groups/%s/members" % namespace) == []
    assert hex_id("alice") not in double._groups[namespace]["members"]


def made_by(double, call):
    """The one group the double holds after `call()` that it did not before, and what `call()` returned."""
    before = set(double._groups)
    answer = call()
    made = set(double._groups) - before
    assert len(made) == 1, made
    return made.pop(), answer


def test_create_group_in_a_namespace_defaults_to_open(server, double):
    namespace = namespace_of(double)
    made, answer = made_by(double, lambda: server.tool_json("create_group", {"namespace": namespace, "name": "ops"}))
    assert answer == {"groupId": made, "parentId": namespace, "namespaceId": namespace, "visibility": "open",
                      "name": "ops"}
    assert double._groups[made]["parent"] == namespace and double._groups[made]["name"] == "ops"
    assert double._groups[made]["visibility"] == "open"
    server.tool_json("create_group", {"namespace": namespace, "visibility": "restricted"})
    assert bodies(double, "POST", "/admin-api/namespaces/%s/groups" % namespace) == [
        {"groupName": "ops", "visibility": "open"}, {"visibility": "restricted"}]


def test_create_nested_group_takes_the_parents_application(server, double):
    namespace = namespace_of(double)
    parent = double.add_group(namespace=namespace, name="parent")
    group_id, answer = made_by(double, lambda: server.tool_json("create_group", {
        "namespace": namespace, "parent": parent, "name": "kid", "visibility": "open"}))
    assert answer == {"groupId": group_id, "parentId": parent, "namespaceId": namespace, "visibility": "open",
                      "name": "kid"}
    assert double.requests_to("GET", "/admin-api/groups/" + parent)
    assert bodies(double, "POST", "/admin-api/groups") == [
        {"applicationId": double._app_key(KV), "name": "kid", "parentGroupId": parent}]
    assert bodies(double, "PUT", "/admin-api/groups/%s/settings" % group_id) == [{"subgroupVisibility": "open"}]
    assert double._groups[group_id]["parent"] == parent and double._groups[group_id]["visibility"] == "open"
    restricted = server.tool_json("create_group", {"namespace": namespace, "parent": parent})["groupId"]
    assert double._groups[restricted]["visibility"] == "restricted"
    assert len(double.requests_to("PUT")) == 1                # born restricted: no second step


class VisibilityRefused(NodeDouble):
    """A node that creates nested groups but refuses to change their visibility."""

    def _h_set_visibility(self, request):
        raise error_reply(500, "boom")


def test_create_nested_group_names_the_group_when_visibility_fails(serve):
    double = VisibilityRefused(apps=[kv_store_spec()])
    namespace = double.add_namespace(double._app_key(KV))
    parent = double.add_group(namespace=namespace)
    server = serve(double)
    text = error_text(server.call_tool("create_group", {"namespace": namespace, "parent": parent,
                                                        "visibility": "open"}))
    created = next(g for g in double._groups.values() if g["parent"] == parent and g["id"] != parent)["id"]
    assert text == ("Error: Group %s was created under %s but its visibility was not set; retry "
                    "set_group_visibility. boom" % (created, parent))


def test_set_group_visibility(server, double):
    group = double.add_group(namespace=namespace_of(double))
    assert text_of(server.call_tool("set_group_visibility", {"group": group, "visibility": "open"})) == (
        "Group %s is now open (was restricted): namespace members can join it (join_open_group)." % group)
    assert double._groups[group]["visibility"] == "open"
    refused = server.call_tool("set_group_visibility", {"group": group, "visibility": "public"})
    assert text_of(refused) == ('Error: Invalid arguments for set_group_visibility:\n- visibility: expected one of '
                                '"open", "restricted", got "public"')
    assert len(double.requests_to("PUT")) == 1


def test_set_group_metadata_replaces_data_and_keeps_the_name(server, double):
    group = double.add_group(namespace=namespace_of(double),
                             metadata={"name": "Ops", "data": {"old": "1"}, "updatedAt": 1, "updatedBy": "x"})
    result = server.call_tool("set_group_metadata", {"group": group, "data": {"team": "blue"}})
    assert result["structuredContent"] == {"groupId": group, "name": "Ops", "data": {"team": "blue"}}
    server.call_tool("set_group_metadata", {"group": group, "name": "Ops 2"})
    assert bodies(double, "PUT", "/admin-api/groups/%s/metadata" % group) == [
        {"name": "Ops", "data": {"team": "blue"}}, {"name": "Ops 2", "data": {"team": "blue"}}]
    assert double._groups[group]["metadata"]["name"] == "Ops 2"


def test_set_group_metadata_on_a_group_without_any(server, double):
    group = double.add_group(namespace=namespace_of(double))
    server.call_tool("set_group_metadata", {"group": group, "data": {"k": "v"}})
    assert bodies(double, "PUT", "/admin-api/groups/%s/metadata" % group) == [{"data": {"k": "v"}}]


def test_join_open_group(server, double):
    group = double.add_group(namespace=namespace_of(double), visibility="open", member=False)
    joined = server.tool_json("join_open_group", {"group": group})
    assert joined["groupId"] == group and joined["wasInherited"] is True
    assert double.requests_to("POST", "/admin-api/groups/%s/join-via-inheritance" % group)
    closed = double.add_group(namespace=namespace_of(double), member=False)
    refused = error_text(server.call_tool("join_open_group", {"group": closed}))
    assert refused == ("Error: identity not eligible for inheritance-based join. join_open_group joins only an open "
                       "group inside a namespace or group this node belongs to: ask an admin of that group to add "
                       "this node (add_group_members) instead.")     # core's JoinSubgroupInheritanceError, verbatim


def test_node_failures_are_error_results(server, double):
    double.faults = {"status": 500, "json": {"error": "store exploded"}, "paths": ["/admin-api/namespaces"]}
    result = server.call_tool("list_namespaces")
    assert result == {"content": [{"type": "text", "text": "Error: store exploded"}], "isError": True}


def test_every_fixed_tool_has_a_title_and_a_description(server):
    tools = {t["name"]: t for t in server.result("tools/list")["tools"] if "_meta" not in t}
    assert list(tools) == fixed_names()
    assert tools["node_status"]["title"] == "Node status"
    assert tools["list_group_members"]["title"] == "List group members"
    assert all(t["title"] and len(t["description"]) > 20 for t in tools.values()), [
        name for name, t in tools.items() if len(t["description"]) <= 20]


def test_join_namespace_waits_longer_than_other_calls(start_server, server_env, double):
    """A join waits on peer discovery: it keeps 65 s where every other request has CALIMERO_MCP_TIMEOUT."""
    server = start_server(dict(server_env, CALIMERO_MCP_TIMEOUT="1"))
    namespace = namespace_of(double)
    signed = server.tool_json("invite_to_namespace", {"namespace": namespace})["invitation"]
    double.faults.update({"delay": 1.6, "paths": ["/admin-api/namespaces/"]})
    joined = server.call_tool("join_namespace", {"namespace": namespace, "invitation": signed})
    assert not joined.get("isError"), joined
    left = error_text(server.call_tool("leave_namespace", {"namespace": namespace}))
    assert "no answer within 1 s" in left and "may have carried it out" in left     # a write: it may have run


def test_an_older_node_that_requires_an_upgrade_policy_gets_one(start_server, server_env):
    """Current core refuses unknown fields; some older releases required upgradePolicy: ask, then add it."""
    from node_double import sample_double
    old = sample_double(legacy_upgrade_policy=True).start()
    try:
        server = start_server(dict(server_env, CALIMERO_NODE_URL=old.url))
        created = server.tool_json("create_namespace", {"application": "counter"})
        assert created["namespaceId"] in old._groups
        assert bodies(old, "POST", "/admin-api/namespaces") == [
            {"applicationId": old._app_key("com.example.counter")},
            {"upgradePolicy": "LazyOnAccess", "applicationId": old._app_key("com.example.counter")}]
    finally:
        old.stop()


def test_list_group_members_reads_every_page(server, double):
    namespace = namespace_of(double)
    for index in range(1100):
        double._groups[namespace]["members"][hex_id("member-%d" % index)] = "Member"
    listed, answers = every_row(server, "list_group_members", {"group": namespace}, "members")
    assert len(listed) == 1101 and len({m["identity"] for m in listed}) == 1101
    asked = [r["query"] for r in double.requests_to("GET", "/admin-api/groups/%s/members" % namespace)]
    assert asked == [{"offset": "0", "limit": "1000"}, {"offset": "1000", "limit": "1000"}] * answers


def test_an_optional_argument_given_as_null_is_absent_for_every_tool(server, double):
    """Hosts in strict function-calling mode send null for omitted optionals: every tool takes it as absent, as
    generated tools and call do; a required argument stays required."""
    for name, arguments in [("list_applications", {"verbose": None, "cursor": None}),
                            ("list_contexts", {"application": None, "verbose": None}),
                            ("select_app", {"app": "kv-store", "service": None, "context": None}),
                            ("describe_app", {"app": "kv-store", "service": None}),
                            ("list_blobs", {"cursor": None}),
                            ("call", {"app": "kv-store", "context": "demo", "method": "len", "args": None})]:
        result = server.call_tool(name, arguments)
        assert not result.get("isError"), (name, result)
    assert server.call_tool("list_applications", {"verbose": None}) == server.call_tool("list_applications")
    refused = server.call_tool("select_app", {"app": None})                  # a required one stays required
    assert refused["isError"] is True and "app" in refused["content"][-1]["text"], refused
    unknown = server.call_tool("list_nodes", {"verbose": None})              # one it does not take stays unknown
    assert unknown["isError"] is True and "Unknown argument verbose" in unknown["content"][-1]["text"], unknown
