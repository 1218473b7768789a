"""The application tools end to end over stdio, against the node double with many apps installed at once.

Contract: tools.md "Application", "Generated method tools" and "Resources"; abi-mapping.md; the literal texts and
edge cases of reference-behaviour.md §3.5-§3.15. Read-only checks share one server (`shared`); anything that
changes the node or the session gets a world and a server of its own.
"""
from __future__ import annotations

import asyncio
import base64
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import stat
import sys
import time

import abi
import pytest
from conftest import shared_fixture
from mcp_client import MODERN_META, SERVER, McpServer, minimal_env
from node_double import SAMPLE_GUIDE, SAMPLE_SIGNER, NodeDouble, counter_spec, hex_id, kv_store_spec

RETRY = "Call select_app for %s and retry with the returned app_handle."
GENERIC_RETRY = "Call select_app for the application and retry with the returned app_handle."
OTHER_APP = "This app_handle is for %s, not %s. " + RETRY
NO_CONTEXT = ("This app_handle names no context. Call select_app for %s with a context and retry with the "
              "returned app_handle.")
INIT_REFUSAL = ("init runs once, when create_context creates the context; pass its arguments as create_context's "
                "args. It cannot be called on a context.")
GUIDE_LABEL = "App guide, provided by the app's author (package %s, signer %s):"
GUIDE_SHOWN = "This app's guide was shown earlier this session; read %s if it is not in your context."
NO_GUIDE = "This app ships no guide."
SERVICE_NOTE = ("Not discoverable: a node exposes no service list for an application, and this one has no context "
                "to read a service name from. Take it from the app's bundle or its docs when create_context asks "
                "for one.")
TOOLS_NOTE = ("These are the server-side tool names. An MCP client may expose them under a prefix of its own "
              "(commonly mcp__<server>__<tool>), so if a name does not resolve, look for the prefixed form.")
NO_ABI = "application has no usable embedded ABI (absent or malformed); rebuild it with `cargo mero build`"

KV = "com.calimero.kv-store"
DRIVE = "com.calimero.mero-drive"
COUNTER = "com.example.counter"
EMPTY = "com.example.empty"
GADGETS = "com.example.gadgets"
NOTES = "com.example.notes"
SIGNER_A, SIGNER_B = "did:key:signer-a", "did:key:signer-b"


# ── manifests and the world ──────────────────────────────────────────────────────────────────────

S, U32, U64, UNIT, BYTES = {"kind": "string"}, {"kind": "u32"}, {"kind": "u64"}, {"kind": "unit"}, {"kind": "bytes"}


def manifest(*methods, types=None):
    return {"schema_version": "wasm-abi/1", "types": types or {}, "methods": list(methods), "events": []}


def method(name, params=(), returns=UNIT, intent="mutating", **extra):
    """params: (name, type) or (name, type, nullable)."""
    entry = {"name": name, "params": [dict({"name": p[0], "type": p[1]}, **({"nullable": True} if p[2:] else {}))
                                      for p in params],
             "returns": returns, "intent": intent}
    entry.update(extra)
    return entry


DRIVE_SERVICES = {
    "docs": manifest(method("create_doc", [("title", S)], U64, doc="Creates a document."), method("init"),
                     method("list_docs", [], {"kind": "list", "items": S}, "read_only")),
    "registry": manifest(method("get_folder", [("id", U64)], {"$ref": "Folder"}, "read_only", returns_nullable=True),
                         method("init"), method("register_folder", [("path", S)]),
                         types={"Folder": {"kind": "record", "fields": [{"name": "path", "type": S}]}}),
}
LONG_METHOD = "reconcile_every_pending_settlement_before_closing"
GADGETS_ABI = manifest(
    method("put_blob", [("data", BYTES), ("tag", S, True)], doc="Stores a blob."),
    method("digest", [("n", U32)], {"kind": "bytes", "size": 4}, "read_only", returns_doc="The digest."),
    method("profile", [], {"$ref": "Profile"}, "read_only"),
    method("own_context", [("context", S)], S, "read_only"),
    method("with_handle", [("app_handle", S)]),
    method("destroy", destructive=True, idempotent=True),
    method(LONG_METHOD),
    method("init", [("owner", S)]),
    types={"Profile": {"kind": "record", "fields": [{"name": "name", "type": S}, {"name": "age", "type": U32}]}})
NOTES_ABI = manifest(method("add", [("text", S)], U32), method("list", [], {"kind": "list", "items": S}, "read_only"))
GADGETS_GUIDE = "# Gadgets\n\nOdds and ends.\n"


def app(package, abi=None, version="1.0.0", signer="did:key:x", name=None, guide=None, **extra):
    metadata = {}
    if name:
        metadata["name"] = name
    if guide:
        metadata["guide"] = guide
    spec = {"package": package, "version": version, "signer_id": signer, "metadata": metadata, "abi": abi}
    spec.update(extra)
    return spec


class World:
    """A double with every kind of app this file needs, and the ids of its apps and contexts."""

    def __init__(self, **kw):
        d = self.double = NodeDouble(**kw)
        self.kv = d.add_app(kv_store_spec())
        self.counter = d.add_app(counter_spec())
        self.drive = d.add_app(app(DRIVE, name="Mero Drive", guide="# Drive\n", services=DRIVE_SERVICES))
        self.notes_a = d.add_app(app(NOTES, NOTES_ABI, signer=SIGNER_A, name="Notes", guide="# Notes (A)\n"))
        self.notes_b = d.add_app(app(NOTES, NOTES_ABI, signer=SIGNER_B, name="Notes", guide="# Notes (B)\n"))
        self.gadgets = d.add_app(app(GADGETS, GADGETS_ABI, name="Gadgets", guide=GADGETS_GUIDE))
        self.empty = d.add_app(app(EMPTY, manifest(method("ping", intent="read_only")), name="Empty"))
        # names that clash: a display name equal to kv-store's segment, a fixed tool, a slug twin
        self.xkv = d.add_app(app("com.x.kv", manifest(method("store_get", [("key", S)], S, "read_only")),
                                 name="Kv-Store"))
        self.xnode = d.add_app(app("com.x.node", manifest(method("status", [], S, "read_only"))))
        self.twin = d.add_app(app("org.example.kv_store", manifest(method("ping", intent="read_only"))))
        self.solo = d.add_app(app("com.x.solo", services={"main": manifest(method("ping", [], S, "read_only"))}))
        self.bad = d.add_app(app("org.bad", None, abi_error=NO_ABI))
        namespace = d.add_namespace(self.kv, name="team")
        self.kv_ctx = d.add_context(self.kv, group_id=namespace, name="demo")
        d.add_alias("demo", self.kv_ctx)
        self.counter_ctx = [d.add_context(self.counter), d.add_context(self.counter)]
        self.docs_ctx = d.add_context(self.drive, service="docs")
        self.registry_ctx = d.add_context(self.drive, service="registry")
        self.notes_a_ctx = d.add_context(self.notes_a)
        self.notes_b_ctx = d.add_context(self.notes_b)
        self.gadgets_ctx = d.add_context(self.gadgets)
        d.add_alias("gadgets-main", self.gadgets_ctx)
        self.solo_ctx = d.add_context(self.solo)         # created without a service name

    def guide_uri(self, app_id, version="1.0.0"):
        return "calimero://apps/%s/%s/guide" % (app_id, version)

    def expected_tools(self):
        """Catalog order (package, id, service, method) and the naming rules of abi-mapping.md."""
        notes_first, notes_second = sorted([self.notes_a, self.notes_b])
        long_name = "gadgets_" + LONG_METHOD
        long_name = long_name[:42] + "_" + hashlib.sha256(long_name.encode()).hexdigest()[:6]
        return (["kv_store_" + m for m in ("clear", "entries", "get", "get_or_insert", "get_result", "len",
                                           "remove", "set", "update_if_exists")]
                + ["mero_drive_docs_create_doc", "mero_drive_docs_list_docs", "mero_drive_registry_get_folder",
                   "mero_drive_registry_register_folder", "counter_increment", "counter_value", "empty_ping"]
                + ["gadgets_destroy", "gadgets_digest", "gadgets_own_context", "gadgets_profile", "gadgets_put_blob",
                   long_name]
                + ["notes_add", "notes_list"]
                + ["notes_%s_add" % notes_second[:6], "notes_%s_list" % notes_second[:6]]
                + ["kv_%s_store_get" % self.xkv[:6], "node_%s_status" % self.xnode[:6], "solo_ping",
                   "kv_store_%s_ping" % self.twin[:6]])


def env_for(url, tmp):
    return minimal_env(tmp / "home", {"CALIMERO_NODE_URL": url, "CALIMERO_MCP_STATE_DIR": tmp / "state",
                                      "CALIMERO_NODE_HOME": tmp / "nodes"})


@pytest.fixture(scope="module")
def world():
    w = World()
    w.double.start()
    yield w
    w.double.stop()


@pytest.fixture(scope="module")
def shared(world, tmp_path_factory):
    """One server for the read-only assertions (its session has seen guides: do not test guide-once on it)."""
    server = McpServer(env_for(world.double.url, tmp_path_factory.mktemp("shared")))
    server.initialize()
    yield server
    server.close()
    server.assert_stdout_pure()


@pytest.fixture
def fresh():
    """A world of its own, for tests that change the node."""
    w = World()
    w.double.start()
    yield w
    w.double.stop()


@pytest.fixture
def own(fresh, start_server, tmp_path):
    """A server of its own on a world of its own."""
    return start_server(env_for(fresh.double.url, tmp_path))


# ── helpers ──────────────────────────────────────────────────────────────────────────────────────

def texts(result):
    return [block.get("text") for block in result["content"]]


def summary_of(result):
    assert not result.get("isError"), result
    return json.loads(result["content"][0]["text"])


def handle_of(server, name, **args):
    return summary_of(server.call_tool("select_app", dict(args, app=name)))["app_handle"]


def tools_by_name(server, meta=None):
    params = {"_meta": meta} if meta else None
    return {t["name"]: t for t in server.result("tools/list", params)["tools"]}


def generated_names(server):
    names = server.tool_names()
    return names[names.index("call_many") + 1:]


def wait_for_stderr(server, text, timeout=5.0):
    """stderr is read on its own thread, so a line may trail the stdout answer that followed it."""
    deadline = time.monotonic() + timeout
    while text not in server.stderr and time.monotonic() < deadline:
        time.sleep(0.02)
    assert text in server.stderr, server.stderr


def assert_guide_blocks(blocks, package, signer, guide, uri):
    assert blocks[0] == {"type": "text", "text": GUIDE_LABEL % (package, signer)}
    assert blocks[1] == {"type": "resource", "resource": {
        "uri": uri, "mimeType": "text/markdown", "text": guide,
        "_meta": {"package": package, "appVersion": "1.0.0", "signerId": signer}}}


def assert_refused(result, text, guide=None):
    """A refusal: isError, the app's guide blocks (when it has one), then the text; no `Error: ` prefix."""
    assert result.get("isError") is True, result
    assert result["content"][-1] == {"type": "text", "text": text}
    if guide is None:
        assert len(result["content"]) == 1, result
    else:
        assert len(result["content"]) == 3, result
        assert result["content"][1]["resource"]["text"] == guide


def assert_error(result, text):
    assert result.get("isError") is True, result
    assert result["content"][-1]["text"] == "Error: " + text


def kv_refusal(result, version_guide=SAMPLE_GUIDE, changed=""):
    """The kv store's refusal: its guide, then what changed (when something did) and the retry text."""
    assert_refused(result, changed + RETRY % KV, guide=version_guide)
    assert result["content"][0]["text"] == GUIDE_LABEL % (KV, SAMPLE_SIGNER)


def executions(world):
    return len(world.double.executions)


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def handle_payload(handle):
    body = handle.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def signed(payload, key):
    raw = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return b64url(raw) + "." + b64url(hmac.new(key, raw, hashlib.sha256).digest())


def counts(server, *methods):
    """How many of each notification arrived so far (after a ping flushes what was due before it)."""
    server.result("ping")
    return [sum(1 for n in server.notifications if n.get("method") == m) for m in methods]


LIST_CHANGED = ("notifications/tools/list_changed", "notifications/resources/list_changed")


# ── the catalog ──────────────────────────────────────────────────────────────────────────────────

def test_every_non_init_method_gets_a_tool_in_catalog_order(shared, world):
    names = shared.tool_names()
    assert names[names.index("describe_app"):names.index("call_many") + 1] == [
        "describe_app", "select_app", "call", "call_many"]
    assert generated_names(shared) == world.expected_tools()
    assert not [n for n in names if n.endswith("_init")]
    assert len(set(names)) == len(names)
    assert all(len(n) <= 49 for n in names)


def test_unreadable_abi_is_skipped_with_a_stderr_line(shared, world):
    wait_for_stderr(shared, "[mero-mcp] skipping org.bad: " + NO_ABI)
    assert not [n for n in shared.tool_names() if n.startswith("bad_")]
    assert summary_of(shared.call_tool("describe_app", {"app": KV}))["application"] == world.kv


def test_method_declaring_app_handle_gets_no_tool_but_call_reaches_it(shared, world):
    wait_for_stderr(shared, "[mero-mcp] no tool for %s 1.0.0 with_handle: its app_handle parameter would "
                            "collide; use call" % GADGETS)
    assert not [n for n in shared.tool_names() if "with_handle" in n]
    handle = handle_of(shared, GADGETS)
    before = executions(world)
    result = shared.call_tool("call", {"app_handle": handle, "method": "with_handle", "args": {"app_handle": "x"}})
    assert not result.get("isError"), result
    assert world.double.executions[before:] == [
        {"contextId": world.gadgets_ctx, "method": "with_handle", "argsJson": {"app_handle": "x"}}]


def test_node_down_at_connect_serves_fixed_tools_and_no_resources(start_server, tmp_path):
    port = free_port()
    server = start_server(env_for("http://127.0.0.1:%d" % port, tmp_path))
    assert generated_names(server) == []
    wait_for_stderr(server, "[mero-mcp] app list unavailable at connect:")
    assert server.result("resources/list") == {"resources": []}
    status = server.call_tool("node_status")
    assert not status.get("isError"), status


@pytest.mark.parametrize("tool", ["select_app", "describe_app", "call"])
def test_app_tools_come_up_once_the_node_is_back(start_server, tmp_path, tool):
    port = free_port()
    server = start_server(env_for("http://127.0.0.1:%d" % port, tmp_path))
    assert generated_names(server) == []
    world = World(port=port)
    world.double.start()
    try:
        args = {"app": KV}
        if tool == "call":
            args.update(context="demo", method="len")
        result = server.call_tool(tool, args)
        assert not result.get("isError"), result
        assert generated_names(server) == world.expected_tools()
        assert counts(server, *LIST_CHANGED) == [1, 1]
        assert {r["uri"] for r in server.result("resources/list")["resources"]} >= {world.guide_uri(world.kv)}
    finally:
        world.double.stop()


def test_install_and_uninstall_announce_once_and_select_announces_nothing(start_server, tmp_path):
    fresh_spec = app("com.example.fresh", manifest(method("hello", [], S, "read_only")), name="Fresh",
                     guide="# Fresh\n")
    double = NodeDouble(apps=[kv_store_spec()], registry={"com.example.fresh@2.0.0": fresh_spec}).start()
    try:
        server = start_server(env_for(double.url, tmp_path))
        assert "fresh_hello" not in server.tool_names()
        assert counts(server, *LIST_CHANGED) == [0, 0]
        installed = server.tool_json("install_application", {"coords": "com.example.fresh@2.0.0"})
        assert counts(server, *LIST_CHANGED) == [1, 1]
        assert "fresh_hello" in server.tool_names()
        uri = "calimero://apps/%s/2.0.0/guide" % installed["applicationId"]
        assert uri in [r["uri"] for r in server.result("resources/list")["resources"]]
        assert summary_of(server.call_tool("select_app", {"app": "fresh"}))["tools"] == ["fresh_hello"]
        summary_of(server.call_tool("describe_app", {"app": "fresh"}))
        assert counts(server, *LIST_CHANGED) == [1, 1]
        assert not server.call_tool("uninstall_application", {"application": "fresh"}).get("isError")
        assert counts(server, *LIST_CHANGED) == [2, 2]
        assert "fresh_hello" not in server.tool_names()
        assert uri not in [r["uri"] for r in server.result("resources/list")["resources"]]
    finally:
        double.stop()


# ── describe_app / select_app ────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name", ["id", KV, "KV Store", "kv store", "KV STORE"])
def test_resolution_by_id_package_and_display_name(shared, world, name):
    name = world.kv if name == "id" else name
    assert summary_of(shared.call_tool("describe_app", {"app": name}))["application"] == world.kv


@pytest.mark.parametrize("name", ["mero-drive", "MERO-DRIVE", "Mero Drive", "mero drive"])
def test_resolution_by_segment_and_display_name_is_case_insensitive(shared, world, name):
    assert summary_of(shared.call_tool("describe_app", {"app": name, "service": "docs"}))["application"] == world.drive


def test_a_segment_equal_to_another_apps_display_name_is_ambiguous(shared):
    for tool in ("describe_app", "select_app"):
        assert_error(shared.call_tool(tool, {"app": "kv-store"}),
                     'Application "kv-store" is ambiguous: com.calimero.kv-store, com.x.kv. Pass the full package '
                     'name or the application id.')


@pytest.mark.parametrize("name", [NOTES, "notes", "NOTES"])
def test_one_package_from_two_signers_lists_each_id(shared, world, name):
    first, second = sorted([(world.notes_a, SIGNER_A), (world.notes_b, SIGNER_B)])
    text = ('Application "%s" is published by several signers: %s (signer %s), %s (signer %s). Pass the '
            'application id.' % ((name,) + first + second))
    for tool in ("describe_app", "select_app"):
        assert_error(shared.call_tool(tool, {"app": name}), text)


def test_each_signer_has_its_own_tools_guide_and_handle(shared, world):
    first, second = sorted([world.notes_a, world.notes_b])
    a = summary_of(shared.call_tool("select_app", {"app": world.notes_a}))
    b = summary_of(shared.call_tool("select_app", {"app": world.notes_b}))
    assert (a["context"], b["context"]) == (world.notes_a_ctx, world.notes_b_ctx)
    assert a["guide"] == world.guide_uri(world.notes_a) and b["guide"] == world.guide_uri(world.notes_b)
    tools = {world.notes_a: a["tools"], world.notes_b: b["tools"]}
    assert tools[first] == ["notes_add", "notes_list"]
    assert tools[second] == ["notes_%s_add" % second[:6], "notes_%s_list" % second[:6]]
    before = executions(world)
    refused = shared.call_tool(tools[world.notes_b][1], {"app_handle": a["app_handle"]})
    assert_refused(refused, OTHER_APP % ("application " + world.notes_a, "application " + world.notes_b,
                                         world.notes_b))        # B's guide was shown by select_app above
    assert executions(world) == before
    assert not shared.call_tool(tools[world.notes_a][1], {"app_handle": a["app_handle"]}).get("isError")


def test_unknown_app_lists_what_is_installed(shared, world):
    installed = [row["package"] for row in shared.tool_json("list_applications")["apps"]]
    assert_error(shared.call_tool("describe_app", {"app": "nope"}),
                 'Application "nope" not found. Installed: ' + ", ".join(installed))
    assert_error(shared.call_tool("select_app", {"app": "mero"}),     # whole segments only
                 'Application "mero" not found. Installed: ' + ", ".join(installed))


def test_describe_app_carries_methods_guide_and_a_planning_handle(shared, world):
    result = shared.call_tool("describe_app", {"app": "KV Store"})
    summary = summary_of(result)
    assert list(summary) == ["application", "package", "appVersion", "service", "contextServices", "guide",
                             "app_handle", "name", "versions", "events", "methods"]
    assert summary["application"] == world.kv and summary["package"] == KV and summary["appVersion"] == "1.0.0"
    assert summary["name"] == "KV Store"
    assert summary["service"] is None and summary["contextServices"] == []
    assert summary["guide"] == world.guide_uri(world.kv)
    assert handle_payload(summary["app_handle"])["c"] is None
    assert summary["methods"][2] == ("Looks up the value stored under `key`.\n\n[view] get(key: string) -> string | "
                                     "null\n  key: Name of the entry to look up.")
    assert any(m.endswith("[mut] init() -> unit") for m in summary["methods"])
    assert len(result["content"]) == 3
    assert_guide_blocks(result["content"][1:], KV, SAMPLE_SIGNER, SAMPLE_GUIDE, world.guide_uri(world.kv))
    assert summary_of(result) == result["structuredContent"]


def test_describe_app_without_guide_says_so(shared, world):
    result = shared.call_tool("describe_app", {"app": "counter"})
    assert texts(result)[1:] == [NO_GUIDE]
    summary = summary_of(result)
    assert "guide" not in summary and summary["app_handle"]
    assert summary["methods"] == [
        "Adds `by` to the counter.\n\n[mut] increment(by: u32) -> u64\n  by: How much to add.",
        "[mut] init() -> unit", "Reads the counter.\n\n[view] value() -> u64"]


def test_multi_service_app_needs_a_service(shared, world):
    """select_app needs the service a handle will name; describe_app without one describes them all
    (test_names_and_rows.py)."""
    assert_error(shared.call_tool("select_app", {"app": DRIVE}),
                 "Application %s bundles several services; pass service with one of: docs, registry" % DRIVE)
    assert_error(shared.call_tool("describe_app", {"app": DRIVE, "service": "nope"}),
                 'Application "%s" has no service "nope". Services: docs, registry' % DRIVE)
    summary = summary_of(shared.call_tool("describe_app", {"app": DRIVE, "service": "registry"}))
    assert summary["service"] == "registry" and summary["contextServices"] == ["docs", "registry"]
    assert "serviceNote" not in summary
    assert [m.split("\n")[-1] for m in summary["methods"]] == [
        "[view] get_folder(id: u64) -> Folder | null", "[mut] init() -> unit",
        "[mut] register_folder(path: string) -> unit"]


@pytest.mark.parametrize("list_services", [True, False], ids=["listed", "from its record"])
def test_a_service_for_an_app_without_services_is_refused(serve, list_services):
    """The node listed no services for the app (on its list row, or on its own record): a service name is refused
    before the ABI is asked for it, by describe_app and by select_app with no context to decide it."""
    double = NodeDouble(list_services=list_services)
    double.add_app(counter_spec())
    server = serve(double)
    for tool in ("describe_app", "select_app"):
        assert_error(server.call_tool(tool, {"app": "counter", "service": "main"}),
                     'Application "com.example.counter" has no services, so no service "main": omit service.')
    assert [e for e in double.log if e["path"].endswith("/abi") and e.get("query")] == []
    assert summary_of(server.call_tool("select_app", {"app": "counter"}))["service"] is None


def test_a_chosen_context_decides_the_service_and_tools(shared, world):
    for context, service in ((world.docs_ctx, "docs"), (world.registry_ctx, "registry")):
        summary = summary_of(shared.call_tool("select_app", {"app": "mero drive", "context": context}))
        assert summary["service"] == service and summary["context"] == context
        assert summary["tools"] == sorted(n for n in world.expected_tools() if n.startswith("mero_drive_" + service))
        assert handle_payload(summary["app_handle"])["s"] == service


def test_one_service_bundle_binds_its_service(shared, world):
    summary = summary_of(shared.call_tool("select_app", {"app": "solo"}))
    assert (summary["service"], summary["context"], summary["tools"]) == ("main", world.solo_ctx, ["solo_ping"])
    assert handle_payload(summary["app_handle"])["s"] == "main"
    assert summary_of(shared.call_tool("describe_app", {"app": "solo"}))["service"] == "main"
    before = executions(world)
    for result in (shared.call_tool("solo_ping", {"app_handle": summary["app_handle"]}),
                   shared.call_tool("solo_ping", {"context": world.solo_ctx}),
                   shared.call_tool("call", {"app_handle": summary["app_handle"], "method": "ping"})):
        assert not result.get("isError"), result
    assert [e["contextId"] for e in world.double.executions[before:]] == [world.solo_ctx] * 3


def test_no_service_note_when_the_node_gave_the_service_list(shared, world):
    """empty has no contexts, and its own record lists no services (the node leaves an empty list out): the
    service is known to be none, so there is nothing to take from the bundle."""
    empty = summary_of(shared.call_tool("describe_app", {"app": "empty"}))
    assert "serviceNote" not in empty and empty["service"] is None and empty["contextServices"] == []
    selected = summary_of(shared.call_tool("select_app", {"app": "Empty"}))
    assert "serviceNote" not in selected and selected["service"] is None
    assert selected["context"] is None
    assert selected["note"] == ('Application "Empty" has no contexts on this node. Create one in the Calimero desktop '
                                'app, or use create_context.')
    assert selected["tools"] == ["empty_ping"] and selected["toolsNote"] == TOOLS_NOTE
    for name in (KV, "counter"):
        assert "serviceNote" not in summary_of(shared.call_tool("describe_app", {"app": name}))


def test_service_note_when_the_node_gave_no_service_list(own, fresh):
    """The list row has no `services` and the app's own record cannot be had (404 while listed): nothing says
    whether a service name is needed, and with no context to read one from the note says so."""
    assert "counter_value" in generated_names(own)              # the catalog read every record already
    late = fresh.double.add_app(app("com.example.late", NOTES_ABI, name="Late"))
    fresh.double.faults = {"paths": ["/admin-api/applications/" + late], "exact": True, "status": 404,
                           "json": {"error": "Application not found"}}
    for tool in ("describe_app", "select_app"):
        summary = summary_of(own.call_tool(tool, {"app": "com.example.late"}))
        assert summary["serviceNote"] == SERVICE_NOTE and summary["service"] is None, summary
    fresh.double.faults.clear()
    assert "serviceNote" not in summary_of(own.call_tool("describe_app", {"app": "com.example.late"}))


def test_select_app_output(shared, world):
    result = shared.call_tool("select_app", {"app": "KV Store"})
    summary = summary_of(result)
    assert list(summary) == ["application", "package", "appVersion", "service", "contextServices", "guide",
                             "app_handle", "tools", "toolsNote", "context", "contextName"]
    assert summary["context"] == world.kv_ctx
    assert summary["contextName"] == "demo"                  # the label list_contexts shows: which one was picked
    assert summary["tools"] == world.expected_tools()[:9]
    assert summary["toolsNote"] == TOOLS_NOTE
    assert handle_payload(summary["app_handle"]) == {
        "a": world.kv, "p": KV, "v": "1.0.0", "g": hashlib.sha256(SAMPLE_GUIDE.encode()).hexdigest()[:16],
        "c": world.kv_ctx, "s": None, "u": world.double.url}       # the node it runs on: its address


def test_several_contexts_and_none_chosen(shared, world):
    summary = summary_of(shared.call_tool("select_app", {"app": "Counter"}))
    assert summary["context"] is None
    assert summary["note"] == 'Application "Counter" has 2 contexts; pass context with one of: %s' % ", ".join(
        c["id"] for c in shared.tool_json("list_contexts", {"application": COUNTER})["contexts"])
    assert set(world.counter_ctx) <= set(summary["note"].split(": ")[1].split(", "))
    chosen = summary_of(shared.call_tool("select_app", {"app": "Counter", "context": world.counter_ctx[1]}))
    assert chosen["context"] == world.counter_ctx[1] and "note" not in chosen
    assert "contextName" not in chosen                       # created without a name: none is made up


def test_the_several_contexts_note_names_each_named_context(own, fresh):
    groceries = fresh.double.add_context(fresh.kv, name="Groceries")
    unnamed = fresh.double.add_context(fresh.kv)
    note = summary_of(own.call_tool("select_app", {"app": KV}))["note"]
    listed = note.split("one of: ", 1)[1].split(", ")
    assert sorted(listed) == sorted(["%s (demo)" % fresh.kv_ctx, "%s (Groceries)" % groceries, unnamed]), note


def test_select_app_refuses_another_apps_context(shared, world):
    for value in (world.kv_ctx, "demo"):
        assert_error(shared.call_tool("select_app", {"app": "counter", "context": value}),
                     'Context "%s" runs %s (application %s), not "counter". Contexts for "counter": %s'
                     % (value, KV, world.kv, ", ".join(listed_contexts(shared, COUNTER))))


def test_guide_is_shown_once_per_session_and_version(own, fresh):
    uri = fresh.guide_uri(fresh.kv)
    first = own.call_tool("select_app", {"app": KV})
    assert_guide_blocks(first["content"][1:], KV, SAMPLE_SIGNER, SAMPLE_GUIDE, uri)
    again = own.call_tool("select_app", {"app": KV})
    assert texts(again)[1:] == [GUIDE_SHOWN % uri]
    verbose = own.call_tool("select_app", {"app": KV, "verbose": True})
    assert len(verbose["content"]) == 3 and verbose["content"][2]["resource"]["uri"] == uri
    methods = summary_of(verbose)["methods"]
    assert methods == summary_of(own.call_tool("describe_app", {"app": KV}))["methods"]
    assert len(own.call_tool("describe_app", {"app": KV})["content"]) == 3      # describe_app always carries it
    assert "methods" not in summary_of(again)
    counter = own.call_tool("select_app", {"app": COUNTER, "context": fresh.counter_ctx[0]})
    assert len(counter["content"]) == 1                                        # no guide, no note
    # describe_app counts as a show
    own.call_tool("describe_app", {"app": GADGETS})
    assert texts(own.call_tool("select_app", {"app": GADGETS}))[1:] == [GUIDE_SHOWN % fresh.guide_uri(fresh.gadgets)]
    # a new version is a new uri: shown again
    fresh.double.upgrade_app(fresh.kv, "1.1.0")
    upgraded = own.call_tool("select_app", {"app": KV})
    assert upgraded["content"][2]["resource"]["uri"] == fresh.guide_uri(fresh.kv, "1.1.0")
    assert texts(own.call_tool("select_app", {"app": KV}))[1:] == [GUIDE_SHOWN % fresh.guide_uri(fresh.kv, "1.1.0")]


def test_select_app_sends_no_notifications(shared):
    before = counts(shared, *LIST_CHANGED)
    for _ in range(2):
        summary_of(shared.call_tool("select_app", {"app": KV}))
        summary_of(shared.call_tool("describe_app", {"app": KV}))
    assert counts(shared, *LIST_CHANGED) == before


# ── app_handle ───────────────────────────────────────────────────────────────────────────────────

def test_missing_handle_is_refused_with_the_guide_even_when_args_are_wrong(shared, world):
    before = executions(world)
    kv_refusal(shared.call_tool("kv_store_set", {"key": 5}))
    assert_refused(shared.call_tool("counter_value", {}), RETRY % COUNTER)
    assert_refused(shared.call_tool("call", {"method": "len"}), GENERIC_RETRY)
    kv_refusal(shared.call_tool("call", {"app": "KV Store", "method": "len"}))
    assert executions(world) == before


def test_edited_and_forged_handles_are_refused(shared, world):
    before = executions(world)
    good = handle_of(shared, COUNTER, context=world.counter_ctx[0])
    payload = handle_payload(good)
    payload["c"] = world.counter_ctx[1]
    edited = b64url(json.dumps(payload, separators=(",", ":")).encode()) + "." + good.split(".")[1]
    forged = signed(handle_payload(good), os.urandom(32))
    flipped = good[:-2] + ("A" if good[-2] != "A" else "B") + good[-1]
    for bad in (edited, forged, flipped, good + ".x", good.replace(".", ""), "", "nonsense"):
        assert_refused(shared.call_tool("counter_value", {"app_handle": bad}), RETRY % COUNTER)
        assert_refused(shared.call_tool("call", {"app_handle": bad, "method": "value", "app": "counter"}),
                       RETRY % COUNTER)
        assert_refused(shared.call_tool("call", {"app_handle": bad, "method": "value"}), GENERIC_RETRY)
    kv = handle_of(shared, KV)
    kv_forged = signed(handle_payload(kv), os.urandom(32))
    kv_refusal(shared.call_tool("kv_store_len", {"app_handle": kv_forged}))
    kv_refusal(shared.call_tool("call", {"app_handle": kv_forged, "app": "kv store", "method": "len"}))
    assert executions(world) == before
    assert not shared.call_tool("counter_value", {"app_handle": good}).get("isError")


def test_another_apps_handle_is_refused_naming_whose_it_is(own, fresh):
    """The refusal says which app the handle is for; the guide comes only while this session has not shown it."""
    counter = handle_of(own, COUNTER, context=fresh.counter_ctx[0])
    before = executions(fresh)
    text = OTHER_APP % (COUNTER, KV, KV)
    kv = own.call_tool("kv_store_len", {"app_handle": counter})
    assert_refused(kv, text, guide=SAMPLE_GUIDE)                                   # kv's guide, not yet shown
    assert kv["content"][0]["text"] == GUIDE_LABEL % (KV, SAMPLE_SIGNER)
    assert_refused(own.call_tool("kv_store_len", {"app_handle": counter}), text)  # shown once: the text alone
    assert_refused(own.call_tool("call", {"app_handle": counter, "app": "KV Store", "method": "len"}), text)
    kv_handle = handle_of(own, KV)
    assert_refused(own.call_tool("counter_value", {"app_handle": kv_handle}), OTHER_APP % (KV, COUNTER, COUNTER))
    # a registry handle on a docs tool: same app, other service
    registry = handle_of(own, DRIVE, context=fresh.registry_ctx)
    assert_refused(own.call_tool("mero_drive_docs_list_docs", {"app_handle": registry}),
                   "This app_handle is for service registry of %s, not service docs. %s" % (DRIVE, RETRY % DRIVE))
    assert executions(fresh) == before
    # an `app` that names nothing is ignored: the handle decides
    assert not own.call_tool("call", {"app_handle": counter, "app": "no-such-app", "method": "value"}).get("isError")


def test_a_missing_or_forged_handle_shows_the_guide_every_time(own, fresh):
    """The gate itself is unchanged: a call with no valid handle shows the guide every time."""
    for _ in range(2):
        kv_refusal(own.call_tool("kv_store_len", {}))
        kv_refusal(own.call_tool("kv_store_len", {"app_handle": "nonsense"}))


def test_planning_handle_names_no_context(shared, world):
    planning = summary_of(shared.call_tool("describe_app", {"app": KV}))["app_handle"]
    before = executions(world)
    for result in (shared.call_tool("kv_store_len", {"app_handle": planning}),
                   shared.call_tool("call", {"app_handle": planning, "method": "len"})):
        assert_refused(result, NO_CONTEXT % KV)
    counter = summary_of(shared.call_tool("select_app", {"app": COUNTER}))["app_handle"]   # several contexts: none
    assert_refused(shared.call_tool("counter_value", {"app_handle": counter}), NO_CONTEXT % COUNTER)
    assert executions(world) == before


def test_handle_goes_stale_on_upgrade(own, fresh):
    handle = handle_of(own, KV)
    assert not own.call_tool("kv_store_len", {"app_handle": handle}).get("isError")
    fresh.double.upgrade_app(fresh.kv, "1.1.0")
    before = executions(fresh)
    upgraded = "This app_handle is for version 1.0.0 of %s; version 1.1.0 is installed now. " % KV
    kv_refusal(own.call_tool("kv_store_len", {"app_handle": handle}), changed=upgraded)
    kv_refusal(own.call_tool("call", {"app_handle": handle, "method": "len"}), changed=upgraded)
    assert executions(fresh) == before                          # nothing runs before admission passes
    assert not own.call_tool("kv_store_len", {"app_handle": handle_of(own, KV)}).get("isError")


def test_handle_goes_stale_when_the_guide_changes(own, fresh):
    handle = handle_of(own, KV)
    metadata = dict(kv_store_spec()["metadata"], guide="# KV Store, rewritten\n")
    fresh.double.upgrade_app(fresh.kv, "1.0.0", metadata=metadata)
    before = executions(fresh)
    for result in (own.call_tool("kv_store_len", {"app_handle": handle}),
                   own.call_tool("call", {"app_handle": handle, "method": "len"})):
        kv_refusal(result, version_guide="# KV Store, rewritten\n",
                   changed="The guide of %s 1.0.0 has changed since this app_handle was made. " % KV)
    assert executions(fresh) == before
    assert not own.call_tool("kv_store_len", {"app_handle": handle_of(own, KV)}).get("isError")


def test_handle_goes_stale_when_its_context_is_deleted(own, fresh):
    handle = handle_of(own, GADGETS)
    assert not own.call_tool("delete_context", {"context": fresh.gadgets_ctx}).get("isError")
    before = executions(fresh)
    for result in (own.call_tool("gadgets_profile", {"app_handle": handle}),
                   own.call_tool("call", {"app_handle": handle, "method": "profile"})):
        assert_refused(result, "This app_handle's context %s is no longer on this node. %s"
                       % (fresh.gadgets_ctx, RETRY % GADGETS), guide=GADGETS_GUIDE)
    assert executions(fresh) == before


def test_handles_survive_a_restart(start_server, fresh, tmp_path):
    first = start_server(env_for(fresh.double.url, tmp_path))
    handle = handle_of(first, KV)
    first.close()
    key = tmp_path / "state" / "handle.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    second = start_server(env_for(fresh.double.url, tmp_path))
    result = second.call_tool("kv_store_len", {"app_handle": handle})
    assert not result.get("isError"), result
    other = start_server(env_for(fresh.double.url, tmp_path / "elsewhere"))
    kv_refusal(other.call_tool("kv_store_len", {"app_handle": handle}))


# ── call ─────────────────────────────────────────────────────────────────────────────────────────

def test_call_by_handle_and_by_context(own, fresh):
    handle = handle_of(own, KV)
    # a method returning unit: the JSON null, then what ran where (a handle names no alias), then what it emitted
    said = texts(own.call_tool("call", {"app_handle": handle, "method": "set", "args": {"key": "a", "value": "1"}}))
    assert said[:2] == ["null", 'set ran in context %s (named "demo"); it returns nothing.' % fresh.kv_ctx]
    assert len(said) == 3 and said[2].startswith("Events in context %s" % fresh.kv_ctx)
    result = own.call_tool("call", {"app": KV, "context": "demo", "method": "get", "args": {"key": "a"}})
    assert texts(result) == ['"1"', 'get ran in context %s (alias "demo").' % fresh.kv_ctx]   # strings quoted
    assert "structuredContent" not in result
    result = own.call_tool("call", {"app": "KV Store", "context": fresh.kv_ctx, "method": "entries"})
    assert texts(result) == [json.dumps({"a": "1"}, indent=2), 'entries ran in context %s (named "demo").'
                             % fresh.kv_ctx]
    assert [(e["contextId"], e["method"]) for e in fresh.double.executions] == [(fresh.kv_ctx, "set"),
                                                                              (fresh.kv_ctx, "get"),
                                                                              (fresh.kv_ctx, "entries")]


def test_call_follows_a_repointed_alias(own, fresh):
    other = fresh.double.add_context(fresh.kv)
    fresh.double.add_alias("moving", fresh.kv_ctx)
    own.call_tool("call", {"app": KV, "context": "moving", "method": "len"})
    own.call_tool("kv_store_len", {"context": "moving"})
    fresh.double.add_alias("moving", other)
    own.call_tool("call", {"app": KV, "context": "moving", "method": "len"})
    own.call_tool("kv_store_len", {"_context": "moving"})
    assert [e["contextId"] for e in fresh.double.executions] == [fresh.kv_ctx, fresh.kv_ctx, other, other]


def test_call_unknown_method_lists_the_abi(shared, world):
    handle = handle_of(shared, KV)
    assert_error(shared.call_tool("call", {"app_handle": handle, "method": "nope"}),
                 'Method "nope" not found on "%s". Available: clear, entries, get, get_or_insert, get_result, init, '
                 'len, remove, set, update_if_exists' % KV)


def test_call_refuses_init_after_the_handle_check(shared, world):
    before = executions(world)
    handle = handle_of(shared, KV)
    assert_refused(shared.call_tool("call", {"app_handle": handle, "method": "init"}), INIT_REFUSAL)
    assert_refused(shared.call_tool("call", {"app": KV, "context": "demo", "method": "init"}), INIT_REFUSAL)
    kv_refusal(shared.call_tool("call", {"app": KV, "method": "init"}))     # no handle: the handle refusal first
    assert executions(world) == before


def test_call_with_invalid_args_sends_nothing(shared, world):
    before = executions(world)
    handle = handle_of(shared, KV)
    result = shared.call_tool("call", {"app_handle": handle, "method": "set", "args": {"key": 5}})
    assert_error(result, "Invalid arguments for set:\n- key: expected string, got 5\n"
                         "- value: missing required parameter")
    result = shared.call_tool("kv_store_set", {"app_handle": handle, "key": "k", "value": ["x"]})
    assert result["isError"] and "- value: " in result["content"][-1]["text"]
    assert executions(world) == before


def test_contract_failure_carries_the_apps_message(shared, world):
    result = shared.call_tool("call", {"app": KV, "context": "demo", "method": "get_result",
                                       "args": {"key": "missing-key"}})
    assert_error(result, "key not found: missing-key")
    result = shared.call_tool("kv_store_get_result", {"context": "demo", "key": "missing-key"})
    assert_error(result, "key not found: missing-key")
    assert "structuredContent" not in result


def test_call_by_context_refuses_other_and_unknown_contexts(shared, world):
    before = executions(world)
    kv_ids = world.kv_ctx
    assert_error(shared.call_tool("call", {"app": "kv store", "context": world.gadgets_ctx, "method": "len"}),
                 'Context "%s" runs %s (application %s), not "kv store". Contexts for "kv store": %s'
                 % (world.gadgets_ctx, GADGETS, world.gadgets, kv_ids))
    assert_error(shared.call_tool("call", {"app": KV, "context": "gadgets-main", "method": "len"}),
                 'Context "gadgets-main" runs %s (application %s), not "%s". Contexts for "%s": %s'
                 % (GADGETS, world.gadgets, KV, KV, kv_ids))
    missing = hex_id("no such context")
    for value in ("no-such-alias", missing):
        assert_error(shared.call_tool("call", {"app": KV, "context": value, "method": "len"}),
                     'Context "%s" not found: it is neither a context id nor an alias on this node. Contexts for '
                     '"%s": %s' % (value, KV, kv_ids))
    assert_error(shared.call_tool("kv_store_len", {"context": missing}),
                 'Context "%s" not found: it is neither a context id nor an alias on this node. Contexts for '
                 '"%s": %s' % (missing, KV, kv_ids))
    # the rejected value is never offered back as a candidate
    rejected = shared.call_tool("call", {"app": COUNTER, "context": world.kv_ctx, "method": "value"})
    candidates = rejected["content"][-1]["text"].split('Contexts for "%s": ' % COUNTER)[1].split(", ")
    assert world.kv_ctx not in candidates and set(candidates) == set(world.counter_ctx)
    assert executions(world) == before


def test_handle_and_context_must_name_the_same_context(shared, world):
    handle = handle_of(shared, KV)
    before = executions(world)
    other = world.double.add_context(world.kv)
    try:
        for result in (shared.call_tool("call", {"app_handle": handle, "context": other, "method": "len"}),
                       shared.call_tool("kv_store_len", {"app_handle": handle, "context": other})):
            assert result["isError"] and "different contexts" in result["content"][-1]["text"]
        assert executions(world) == before
    finally:
        world.double._contexts.pop(other)
    for args in ({"context": "demo"}, {"context": world.kv_ctx}, {"_context": "demo"}):
        assert not shared.call_tool("kv_store_len", dict(args, app_handle=handle)).get("isError")
    assert not shared.call_tool("call", {"app_handle": handle, "context": "demo", "method": "len"}).get("isError")
    assert executions(world) == before + 4


def test_call_without_handle_for_a_multi_service_app_is_refused(shared, world):
    assert_refused(shared.call_tool("call", {"app": DRIVE, "method": "list_docs"}), RETRY % DRIVE, guide="# Drive\n")
    result = shared.call_tool("call", {"app": DRIVE, "context": world.registry_ctx, "method": "get_folder",
                                       "args": {"id": 3}})
    assert not result.get("isError"), result


# ── call_many ────────────────────────────────────────────────────────────────────────────────────

def test_call_many_runs_in_order_and_one_failure_does_not_fail_the_batch(own, fresh):
    handle = handle_of(own, KV)
    calls = [{"app_handle": handle, "method": "set", "args": {"key": "a", "value": "1"}},
             {"app": KV, "context": "demo", "method": "get_result", "args": {"key": "zz"}},
             {"app_handle": handle, "method": "nope"},
             {"method": "len"},
             {"app_handle": handle, "method": "set", "args": {"key": 1}},
             {"app": COUNTER, "context": fresh.counter_ctx[0], "method": "value"},
             {"app_handle": handle, "method": "init"}]
    result = own.call_tool("call_many", {"calls": calls})
    assert not result.get("isError")
    items = json.loads(result["content"][0]["text"])
    # each item names its place and the app, context and method it was given (a handle's context id came with it)
    assert items[0] == {"index": 0, "method": "set", "ok": True, "result": None}
    assert items[1] == {"index": 1, "app": KV, "context": "demo", "method": "get_result", "ok": False,
                        "error": "Error: key not found: zz"}
    assert items[2]["ok"] is False and items[2]["error"].startswith('Error: Method "nope" not found on')
    assert (items[2]["index"], items[2]["method"]) == (2, "nope")
    assert items[3] == {"index": 3, "method": "len", "ok": False, "error": GENERIC_RETRY}
    assert items[4] == {"index": 4, "method": "set", "ok": False,
                        "error": "Error: Invalid arguments for set:\n- key: expected string, got 1\n"
                                 "- value: missing required parameter"}
    assert items[5] == {"index": 5, "app": COUNTER, "context": fresh.counter_ctx[0], "method": "value", "ok": True,
                        "result": 0}                              # a fresh counter reads 0
    assert items[6] == {"index": 6, "method": "init", "ok": False, "error": INIT_REFUSAL}
    assert sorted(e["method"] for e in fresh.double.executions) == ["get_result", "set", "value"]


def test_call_many_items_say_the_context_an_alias_named(own, fresh):
    calls = [{"app": KV, "context": "demo", "method": "len"}, {"app": KV, "context": fresh.kv_ctx, "method": "len"}]
    items = json.loads(own.call_tool("call_many", {"calls": calls})["content"][0]["text"])
    assert items == [{"index": 0, "app": KV, "context": "demo", "method": "len", "contextId": fresh.kv_ctx,
                      "ok": True, "result": 0},
                     {"index": 1, "app": KV, "context": fresh.kv_ctx, "method": "len", "ok": True, "result": 0}]


def test_call_many_item_of_the_wrong_shape_fails_alone(own, fresh):
    """Only the batch size is checked up front (reference §3.13); each item fails on its own."""
    handle = handle_of(own, KV)
    result = own.call_tool("call_many", {"calls": [{"app_handle": handle}, {"app_handle": handle, "method": "len"},
                                                  {"app_handle": handle, "method": "len", "args": "nope"}, 7]})
    assert not result.get("isError"), result
    items = json.loads(result["content"][0]["text"])
    assert items[0]["ok"] is False and "method" in items[0]["error"] and items[0]["index"] == 0
    assert items[1] == {"index": 1, "method": "len", "ok": True, "result": 0}
    assert items[2] == {"index": 2, "method": "len", "ok": False,
                        "error": "Error: args must be an object keyed by parameter name, not a str."}
    # an item that is no object still carries its index, and nothing it did not give
    assert items[3]["ok"] is False and "object" in items[3]["error"] and set(items[3]) == {"index", "ok", "error"}
    assert [e["method"] for e in fresh.double.executions] == ["len"]


@pytest.mark.parametrize("arguments", [{}, {"calls": []}, {"calls": "x"}, "33"])
def test_call_many_refuses_bad_batches(shared, world, arguments):
    if arguments == "33":
        arguments = {"calls": [{"app": KV, "context": "demo", "method": "len"}] * 33}
    before = executions(world)
    result = shared.call_tool("call_many", arguments)
    assert result.get("isError") is True and "calls" in result["content"][-1]["text"]
    assert executions(world) == before


def test_call_many_runs_concurrently_and_reports_progress(start_server, tmp_path):
    double = NodeDouble(apps=[kv_store_spec()], exec_delay=0.1)
    context = double.add_context(KV)
    double.start()
    try:
        server = start_server(env_for(double.url, tmp_path))
        calls = [{"app": KV, "context": context, "method": "len"}] * 32
        result = server.call_tool("call_many", {"calls": calls}, meta={"progressToken": "batch-1"})
        # 32 successes that say the same: one row naming the items it covers
        assert json.loads(result["content"][0]["text"]) == [
            {"items": "0-31", "app": KV, "context": context, "method": "len", "ok": True, "result": 0}]
        assert len(double.executions) == 32 and double.max_inflight >= 8
        progress = [n["params"] for n in server.notifications if n["method"] == "notifications/progress"]
        assert [p["progress"] for p in progress] == list(range(1, 33))
        assert all(p["progressToken"] == "batch-1" and p["total"] == 32 for p in progress)
    finally:
        double.stop()


def test_call_many_advertises_its_limits(shared):
    schema = tools_by_name(shared)["call_many"]["inputSchema"]
    assert schema["required"] == ["calls"]
    assert (schema["properties"]["calls"]["minItems"], schema["properties"]["calls"]["maxItems"]) == (1, 32)


# ── generated tools ──────────────────────────────────────────────────────────────────────────────

def test_generated_tool_definition(shared, world):
    tools = tools_by_name(shared)
    get = tools["kv_store_get"]
    assert get["title"] == "Get (KV Store)"
    assert get["description"] == "Looks up the value stored under `key`.\n\n[view] get(key: string) -> string | null"
    assert get["annotations"] == {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True,
                                  "openWorldHint": False}
    assert get["_meta"] == {"package": KV, "appVersion": "1.0.0", "signerId": SAMPLE_SIGNER, "intent": "read_only"}
    schema = tools["kv_store_set"]["inputSchema"]
    assert schema["type"] == "object" and schema["required"] == ["key", "value"]
    assert list(schema["properties"])[-2:] == ["key", "value"]
    assert list(schema["properties"]) == ["app_handle", "_context", "key", "value"]    # context: accepted, unadvertised
    assert tools["kv_store_get_or_insert"]["title"] == "Get or insert (KV Store)"
    assert tools["kv_store_clear"]["annotations"] == {"readOnlyHint": False, "destructiveHint": True,
                                                      "idempotentHint": True, "openWorldHint": False}
    assert tools["gadgets_destroy"]["annotations"]["destructiveHint"] is True
    assert tools["gadgets_put_blob"]["annotations"] == {"readOnlyHint": False, "destructiveHint": False,
                                                        "idempotentHint": False, "openWorldHint": False}
    assert tools["gadgets_put_blob"]["description"] == (
        "Stores a blob.\n\n[mut] put_blob(data: bytes, tag?: string) -> unit")
    assert tools["counter_value"]["_meta"]["intent"] == "read_only"
    assert tools["empty_ping"]["title"] == "Ping (Empty)" and tools["node_%s_status" % world.xnode[:6]]["title"] == \
        "Status (com.x.node)"
    assert "icons" not in get
    for tool in tools.values():
        if tool["name"] in world.expected_tools():
            assert set(tool["annotations"]) == {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}


def test_output_schema_only_for_non_unit_returns_and_per_era(shared, world):
    old, new = tools_by_name(shared), tools_by_name(shared, MODERN_META)
    assert list(old) == list(new)
    for name in ("kv_store_set", "kv_store_clear", "gadgets_destroy", "empty_ping"):
        assert "outputSchema" not in old[name] and "outputSchema" not in new[name]
    raw = new["kv_store_len"]["outputSchema"]
    # Every root also admits the null a None rides as (abi.output_schema admit_null).
    assert raw == {"type": ["integer", "null"], "minimum": 0, "maximum": 4294967295,
                   "description": "How many keys hold a value; 0 for an empty store."}
    for name in ("kv_store_len", "kv_store_get", "kv_store_entries", "gadgets_profile"):
        # handshake-era structuredContent must be an object, null included: every root rides as {result}
        assert old[name]["outputSchema"] == {"type": "object", "properties": {"result": new[name]["outputSchema"]},
                                             "required": ["result"]}, name
    assert new["gadgets_profile"]["outputSchema"]["type"] == ["object", "null"]
    for name, tool in old.items():
        if "outputSchema" in tool:
            assert tool["outputSchema"]["type"] == "object", name


def test_structured_content_per_era_and_compact_text(own, fresh):
    tools_old, tools_new = tools_by_name(own), tools_by_name(own, MODERN_META)
    own.call_tool("kv_store_set", {"context": "demo", "key": "b", "value": "2"})
    set_result = own.call_tool("kv_store_set", {"context": "demo", "key": "a", "value": "1"})
    # its ABI says "kind": "unit"; a third block, the events it emitted, once the stream follows the context
    assert set_result["content"][:2] == [{"type": "text", "text": "null"}, {"type": "text", "text": (
        'set ran in context %s (alias "demo"); it returns nothing.' % fresh.kv_ctx)}]
    assert "structuredContent" not in set_result and len(set_result["content"]) <= 3
    by_id = own.call_tool("kv_store_set", {"context": fresh.kv_ctx, "key": "a", "value": "1"})
    assert by_id["content"][1]["text"] == 'set ran in context %s (named "demo"); it returns nothing.' % fresh.kv_ctx
    entries = own.call_tool("kv_store_entries", {"context": "demo"})
    assert entries["content"] == [{"type": "text", "text": '{"a":"1","b":"2"}'}, {"type": "text", "text": (
        'entries ran in context %s (alias "demo").' % fresh.kv_ctx)}]            # a value too says where it ran
    assert entries["structuredContent"] == {"result": {"a": "1", "b": "2"}}
    length = own.call_tool("kv_store_len", {"context": "demo"})
    assert length["content"][0]["text"] == "2" and length["structuredContent"] == {"result": 2}
    modern = own.result("tools/call", {"name": "kv_store_len", "arguments": {"context": "demo"},
                                       "_meta": MODERN_META})
    assert modern["structuredContent"] == 2 and modern["content"][0]["text"] == "2"
    modern = own.result("tools/call", {"name": "kv_store_entries", "arguments": {"context": "demo"},
                                       "_meta": MODERN_META})
    assert modern["structuredContent"] == {"a": "1", "b": "2"}
    missing = own.call_tool("kv_store_get", {"context": "demo", "key": "zz"})
    assert missing["content"][0] == {"type": "text", "text": "null"}        # a value: get returns an Option
    assert missing["content"][1]["text"] == 'get ran in context %s (alias "demo").' % fresh.kv_ctx
    assert missing["structuredContent"] == {"result": None}
    profile = own.call_tool("gadgets_profile", {"context": "gadgets-main"})
    assert profile["structuredContent"] == {"result": {"name": "sample", "age": 1}}
    assert profile["content"][0]["text"] == '{"name":"sample","age":1}'
    checks = [("kv_store_len", length, tools_old), ("kv_store_entries", entries, tools_old),
              ("kv_store_get", missing, tools_old), ("gadgets_profile", profile, tools_old),
              ("kv_store_len", {"structuredContent": 2}, tools_new)]
    for name, result, tools in checks:
        abi.compile_schema(tools[name]["outputSchema"]).validate(result["structuredContent"])


def test_after_a_switch_a_view_tools_answer_names_the_context_it_ran_in(own, fresh):
    """A [view] tool's bare value (`2`, `0`) says which context it came from: the alias the call named, else the
    context's name; structuredContent stays the app's value."""
    other = fresh.double.add_context(fresh.kv, name="scratch")
    fresh.double.add_alias("work", fresh.kv_ctx)
    own.call_tool("kv_store_set", {"context": "work", "key": "a", "value": "1"})
    first = own.call_tool("kv_store_len", {"context": "work"})
    assert texts(first) == ["1", 'len ran in context %s (alias "work").' % fresh.kv_ctx]
    switched = own.call_tool("kv_store_len", {"app_handle": handle_of(own, KV, context=other)})
    assert texts(switched) == ["0", 'len ran in context %s (named "scratch").' % other]
    assert switched["structuredContent"] == {"result": 0}
    fresh.double.add_alias("work", other)                  # the same alias, another context: the answer says so
    moved = own.call_tool("kv_store_len", {"context": "work"})
    assert texts(moved) == ["0", 'len ran in context %s (alias "work").' % other]
    by_call = own.call_tool("call", {"app": KV, "context": fresh.kv_ctx, "method": "len"})
    assert texts(by_call) == ["1", 'len ran in context %s (named "demo").' % fresh.kv_ctx]
    assert [e["contextId"] for e in fresh.double.executions if e["method"] == "len"] == [
        fresh.kv_ctx, other, other, fresh.kv_ctx]


def test_generated_tool_sends_exactly_the_declared_parameters(own, fresh):
    handle = handle_of(own, KV)
    result = own.call_tool("kv_store_set", {"app_handle": handle, "context": "demo", "_context": fresh.kv_ctx,
                                            "key": "k", "value": "v"})
    assert not result.get("isError"), result
    own.call_tool("gadgets_put_blob", {"_context": "gadgets-main", "data": "DEADbeef"})
    own.call_tool("gadgets_put_blob", {"context": fresh.gadgets_ctx, "data": [1, 2], "tag": None})
    own.call_tool("gadgets_own_context", {"_context": "gadgets-main", "context": "not-a-context"})
    own.call_tool("mero_drive_registry_register_folder", {"context": fresh.registry_ctx, "path": "/x"})
    assert fresh.double.executions == [
        {"contextId": fresh.kv_ctx, "method": "set", "argsJson": {"key": "k", "value": "v"}},
        {"contextId": fresh.gadgets_ctx, "method": "put_blob", "argsJson": {"data": [222, 173, 190, 239]}},
        {"contextId": fresh.gadgets_ctx, "method": "put_blob", "argsJson": {"data": [1, 2], "tag": None}},
        {"contextId": fresh.gadgets_ctx, "method": "own_context", "argsJson": {"context": "not-a-context"}},
        {"contextId": fresh.registry_ctx, "method": "register_folder", "argsJson": {"path": "/x"}}]


def test_a_declared_context_parameter_wins(own, fresh):
    schema = tools_by_name(own)["gadgets_own_context"]["inputSchema"]
    assert schema["properties"]["context"] == {"type": "string"} and schema["required"] == ["context"]
    assert "_context" in schema["properties"] and "app_handle" in schema["properties"]
    refused = own.call_tool("gadgets_own_context", {"context": fresh.gadgets_ctx})
    assert_refused(refused, RETRY % GADGETS, guide=GADGETS_GUIDE)
    handle = handle_of(own, GADGETS)
    result = own.call_tool("gadgets_own_context", {"app_handle": handle, "context": "mine"})
    assert not result.get("isError"), result
    assert fresh.double.executions == [{"contextId": fresh.gadgets_ctx, "method": "own_context",
                                        "argsJson": {"context": "mine"}}]


def test_generated_tools_by_context_check_app_and_service(shared, world):
    before = executions(world)
    assert_error(shared.call_tool("kv_store_len", {"context": world.gadgets_ctx}),
                 'Context "%s" runs %s (application %s), not "%s". Contexts for "%s": %s'
                 % (world.gadgets_ctx, GADGETS, world.gadgets, KV, KV, world.kv_ctx))
    refused = shared.call_tool("mero_drive_docs_list_docs", {"context": world.registry_ctx})
    assert refused["isError"] and refused["content"][-1]["text"] == (
        "Context %s runs service registry, not docs. %s" % (world.registry_ctx, RETRY % DRIVE))
    assert executions(world) == before
    assert not shared.call_tool("mero_drive_docs_list_docs", {"context": world.docs_ctx}).get("isError")


def test_upgraded_app_rechecks_against_the_new_abi(own, fresh):
    kv_abi = json.loads(json.dumps(kv_store_spec()["abi"]))
    for entry in kv_abi["methods"]:
        if entry["name"] == "get":
            entry["params"][0]["type"] = {"kind": "u32"}
    tools = own.tool_names()
    assert "kv_store_clear" in tools
    # 1. the old tool re-checks against the new ABI: a string key no longer passes, and nothing runs
    fresh.double.upgrade_app(fresh.kv, "1.1.0", abi=kv_abi)
    result = own.call_tool("kv_store_get", {"context": "demo", "key": "a"})
    assert result["isError"] and result["content"][-1]["text"].startswith("Error: Invalid arguments for get:\n- key:")
    assert fresh.double.executions == []
    assert counts(own, *LIST_CHANGED) == [1, 1]
    # 2. an old tool whose method still exists runs as the new version
    fresh.double.upgrade_app(fresh.kv, "1.2.0", abi=kv_abi)
    result = own.call_tool("kv_store_get", {"context": "demo", "key": 7})
    assert not result.get("isError"), result
    assert fresh.double.executions == [{"contextId": fresh.kv_ctx, "method": "get", "argsJson": {"key": 7}}]
    assert counts(own, *LIST_CHANGED) == [2, 2]
    # 3. a method the new version dropped refuses, and leaves the list
    kv_abi["methods"] = [m for m in kv_abi["methods"] if m["name"] != "clear"]
    fresh.double.upgrade_app(fresh.kv, "1.3.0", abi=kv_abi)
    kv_refusal(own.call_tool("kv_store_clear", {"context": "demo"}),
               changed='Method "clear" is not in %s 1.3.0, installed since this tool was listed. ' % KV)
    assert len(fresh.double.executions) == 1
    assert "kv_store_clear" not in own.tool_names() and "kv_store_len" in own.tool_names()
    assert counts(own, *LIST_CHANGED) == [3, 3]
    uris = [r["uri"] for r in own.result("resources/list")["resources"]]
    assert fresh.guide_uri(fresh.kv, "1.3.0") in uris and fresh.guide_uri(fresh.kv) not in uris


def test_uninstalled_app_refuses_and_leaves_the_list(own, fresh):
    handle = handle_of(own, KV)
    fresh.double.remove_app(fresh.kv)
    refused = own.call_tool("kv_store_len", {"context": "demo"})
    assert refused["content"][-1]["text"] == RETRY % KV
    # The guide still comes along, as text: its uri left resources/read with the app, so it is not handed out.
    assert refused["content"][1] == {"type": "text", "text": SAMPLE_GUIDE}, refused
    assert KV not in {t.get("_meta", {}).get("package") for t in tools_by_name(own).values()}
    assert_refused(own.call_tool("call", {"app_handle": handle, "method": "len"}), GENERIC_RETRY)
    assert fresh.double.executions == []


# ── guides as resources ──────────────────────────────────────────────────────────────────────────

def test_guides_are_resources(shared, world):
    listed = shared.result("resources/list")["resources"]
    expected = {world.guide_uri(world.kv): "KV Store guide", world.guide_uri(world.drive): "Mero Drive guide",
                world.guide_uri(world.notes_a): "Notes guide", world.guide_uri(world.notes_b): "Notes guide",
                world.guide_uri(world.gadgets): "Gadgets guide"}
    assert {r["uri"]: r["name"] for r in listed} == expected
    assert len(listed) == len(expected)
    assert all(r["mimeType"] == "text/markdown" for r in listed)
    templates = shared.result("resources/templates/list")["resourceTemplates"]
    assert [t["uriTemplate"] for t in templates] == ["calimero://apps/{applicationId}/{version}/guide"]
    assert templates[0]["mimeType"] == "text/markdown"
    read = shared.result("resources/read", {"uri": world.guide_uri(world.kv)})
    assert read == {"contents": [{"uri": world.guide_uri(world.kv), "mimeType": "text/markdown",
                                  "text": SAMPLE_GUIDE}]}
    read = shared.result("resources/read", {"uri": world.guide_uri(world.notes_b)})
    assert read["contents"][0]["text"] == "# Notes (B)\n"
    modern = shared.result("resources/read", {"uri": world.guide_uri(world.kv), "_meta": MODERN_META})
    assert modern["contents"][0]["text"] == SAMPLE_GUIDE and modern["ttlMs"] == 86400000


def test_unknown_guide_uri_is_a_protocol_error_per_era(shared, world):
    uri = world.guide_uri(world.counter)             # an app without a guide
    assert shared.request("resources/read", {"uri": uri})["error"]["code"] == -32002
    assert shared.request("resources/read", {"uri": uri, "_meta": MODERN_META})["error"]["code"] == -32602
    assert shared.request("resources/read", {"uri": "calimero://nope"})["error"]["code"] == -32002


# ── every guide uri handed out is one resources/read serves ─────────────────────────────────────

def handed_out(result):
    """Every guide uri a tool result carries: the summary's `guide` and each resource block."""
    uris = [b["resource"]["uri"] for b in result["content"] if b.get("type") == "resource"]
    guide = (result.get("structuredContent") or {}).get("guide")
    return uris + ([guide] if guide else [])


def assert_served(server, result, uri, guide):
    """The result hands out `uri` (and no other), which resources/list lists and resources/read serves."""
    assert set(handed_out(result)) == {uri}, result
    assert uri in [r["uri"] for r in server.result("resources/list")["resources"]]
    assert server.result("resources/read", {"uri": uri})["contents"][0]["text"] == guide


ALL_GUIDES = ("kv", "drive", "notes_a", "notes_b", "gadgets")


def test_guides_of_apps_left_out_by_the_budget_are_served(fresh, start_server, tmp_path):
    env = dict(env_for(fresh.double.url, tmp_path), CALIMERO_MCP_APPS="counter")
    server = start_server(env)
    assert generated_names(server) == ["counter_increment", "counter_value"]
    listed = [r["uri"] for r in server.result("resources/list")["resources"]]
    assert sorted(listed) == sorted(fresh.guide_uri(getattr(fresh, name)) for name in ALL_GUIDES)

    assert_served(server, server.call_tool("select_app", {"app": KV, "context": "demo"}),
                  fresh.guide_uri(fresh.kv), SAMPLE_GUIDE)
    assert_served(server, server.call_tool("describe_app", {"app": GADGETS}), fresh.guide_uri(fresh.gadgets),
                  GADGETS_GUIDE)
    assert_served(server, server.call_tool("call", {"app": DRIVE, "method": "list_docs"}),
                  fresh.guide_uri(fresh.drive), "# Drive\n")

    # Installed since the catalog was read, and left out too: select_app brings its guide into the list first.
    late = fresh.double.add_app(app("com.example.late", NOTES_ABI, name="Late", guide="# Late\n"))
    assert_served(server, server.call_tool("describe_app", {"app": "com.example.late"}), fresh.guide_uri(late),
                  "# Late\n")
    assert counts(server, *LIST_CHANGED) == [0, 1], "the guide list changed, the tool list did not"


def test_guides_of_apps_whose_abi_cannot_be_read_are_served(fresh, start_server, tmp_path):
    broken = fresh.double.add_app(app("org.broken", None, abi_error=NO_ABI, name="Broken", guide="# Broken\n"))
    fresh.double.faults = {"paths": ["/admin-api/applications/%s/abi" % fresh.kv], "status": 500}
    server = start_server(env_for(fresh.double.url, tmp_path))
    assert "counter_value" in generated_names(server)
    assert KV not in {t.get("_meta", {}).get("package") for t in tools_by_name(server).values()}
    listed = [r["uri"] for r in server.result("resources/list")["resources"]]
    assert fresh.guide_uri(fresh.kv) in listed and fresh.guide_uri(broken) in listed

    refused = server.call_tool("call", {"app": "org.broken", "method": "ping"})
    assert refused["content"][-1]["text"] == RETRY % "org.broken"
    assert_served(server, refused, fresh.guide_uri(broken), "# Broken\n")
    assert_served(server, server.call_tool("call", {"app": KV, "method": "len"}), fresh.guide_uri(fresh.kv),
                  SAMPLE_GUIDE)
    failed = server.call_tool("select_app", {"app": KV, "context": "demo"})
    assert failed.get("isError") is True and handed_out(failed) == [], failed

    fresh.double.faults.clear()                 # the node reads it again: select_app and describe_app work
    assert_served(server, server.call_tool("select_app", {"app": KV, "context": "demo"}),
                  fresh.guide_uri(fresh.kv), SAMPLE_GUIDE)
    assert_served(server, server.call_tool("describe_app", {"app": KV}), fresh.guide_uri(fresh.kv), SAMPLE_GUIDE)
    assert counts(server, *LIST_CHANGED) == [1, 0], "kv's tools arrived; its guide was listed all along"


# ── the real manifests, all at once ──────────────────────────────────────────────────────────────

def sample(schema):
    """A value the schema accepts (the first alternative of a union, every property of an object)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            members = [m for m in schema[key] if m.get("type") != "null"] or schema[key]
            return sample(members[0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = [k for k in kind if k != "null"][0]
    if kind == "string":
        pattern = schema.get("pattern")
        if pattern:
            size = re.search(r"\]\{(\d+)\}\$", pattern)
            return "ab" * (int(size.group(1)) // 2) if size else "beef"
        return "sample"
    if kind == "integer":
        return max(schema.get("minimum", 0), min(schema.get("maximum", 7), 7))
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        if "prefixItems" in schema:
            return [sample(item) for item in schema["prefixItems"]]
        count = max(schema.get("minItems", 1), 1)
        return [sample(schema.get("items", {})) for _ in range(min(count, schema.get("maxItems", count)))]
    if kind == "object":
        value = {name: sample(sub) for name, sub in schema.get("properties", {}).items()}
        if not value and isinstance(schema.get("additionalProperties"), dict):
            value = {"k": sample(schema["additionalProperties"])}
        return value
    return "anything"


def same_on_wire(sent, wire):
    """Hex strings go out as byte lists; everything else unchanged."""
    if isinstance(sent, str) and isinstance(wire, list):
        return bytes.fromhex(sent) == bytes(wire)
    if isinstance(sent, dict) and isinstance(wire, dict):
        return sent.keys() == wire.keys() and all(same_on_wire(sent[k], wire[k]) for k in sent)
    if isinstance(sent, list) and isinstance(wire, list):
        return len(sent) == len(wire) and all(same_on_wire(a, b) for a, b in zip(sent, wire))
    return sent == wire


def test_shared_manifests_installed_together(start_server, tmp_path):
    shared_fixture("abi")
    paths = [p for p in sorted(glob.glob(str(shared_fixture("abi") / "*.json")))
             if "methods" in json.load(open(p, encoding="utf-8"))]
    assert len(paths) >= 5
    double = NodeDouble()
    packages = {}
    for path in paths:
        stem = os.path.basename(path)[:-len(".json")].replace(".", "-")
        package = "com.fixtures." + stem
        raw = json.load(open(path, encoding="utf-8"))
        # generic: the double answers a sample of each declared return type (the real kv-store ABI's `get`
        # omits returns_nullable, so the kv behaviour's null for a missing key would not match its schema)
        app_id = double.add_app({"package": package, "version": "1.0.0", "signer_id": "did:key:fixtures",
                                 "metadata": {}, "abi": raw, "behaviour": "generic"})
        double.add_context(app_id)
        packages[package] = (app_id, raw)
    double.start()
    try:
        server = start_server(env_for(double.url, tmp_path), initialize=None)
        started = time.monotonic()
        server.initialize()
        tools = server.result("tools/list")["tools"]
        load_seconds = time.monotonic() - started       # reported, never asserted: it depends on the machine
        sys.stderr.write("catalog of %d shared manifests (%d tools) listed %.3fs after initialize\n"
                         % (len(paths), sum(1 for t in tools if "_meta" in t), load_seconds))
        by_package = {}
        for tool in tools:
            if tool.get("_meta", {}).get("package") in packages:
                name = re.search(r"^\[(?:view|mut)\] (\w+)\(", tool["description"].split("\n")[-1]).group(1)
                by_package.setdefault(tool["_meta"]["package"], {})[name] = tool
        assert "[mero-mcp] skipping" not in server.stderr
        total = 0
        for package, (app_id, raw) in packages.items():
            eligible = {m["name"]: m for m in raw["methods"] if m["name"] != "init"
                        and "app_handle" not in [p["name"] for p in m.get("params") or []]}
            assert set(by_package.get(package, {})) == set(eligible), package
            if not eligible:
                continue
            handle = handle_of(server, app_id)
            for name, tool in sorted(by_package[package].items()):
                declared = [p["name"] for p in eligible[name].get("params") or []]
                args = {p: sample(tool["inputSchema"]["properties"][p]) for p in declared}
                abi.compile_schema(tool["inputSchema"]).validate(dict(args, app_handle=handle))
                before = len(double.executions)
                result = server.call_tool(tool["name"], dict(args, app_handle=handle))
                text = result["content"][-1]["text"]
                assert "failed to deserialize" not in text and "Invalid arguments" not in text, (tool["name"], text)
                sent = double.executions[before:]
                assert len(sent) == 1 and sent[0]["method"] == name, (tool["name"], result)
                assert set(sent[0]["argsJson"]) == set(declared), tool["name"]
                assert same_on_wire(args, sent[0]["argsJson"]), (tool["name"], args, sent[0]["argsJson"])
                if not result.get("isError") and "outputSchema" in tool:
                    abi.compile_schema(tool["outputSchema"]).validate(result["structuredContent"])
                elif not result.get("isError"):
                    assert "structuredContent" not in result, tool["name"]
                total += 1
        assert total >= 100
    finally:
        double.stop()


# ── the official MCP Python SDK as the client ────────────────────────────────────────────────────

@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_official_sdk_client_interoperates(tmp_path, mode):
    mcp = pytest.importorskip("mcp")
    from mcp.client.stdio import StdioServerParameters
    world = World()
    world.double.start()
    env = {k: str(v) for k, v in env_for(world.double.url, tmp_path).items() if k != "PATH"}
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], env=env, cwd=str(SERVER.parent))

    async def session():
        started = time.monotonic()
        async with mcp.Client(params, mode=mode) as client:     # call_tool validates structuredContent itself
            connect_seconds = time.monotonic() - started
            listed = await client.list_tools()
            status = await client.call_tool("node_status", {})
            length = await client.call_tool("kv_store_len", {"context": "demo"})
            entries = await client.call_tool("kv_store_entries", {"context": world.kv_ctx})
            unit = await client.call_tool("kv_store_set", {"context": "demo", "key": "a", "value": "b"})
            return connect_seconds, listed, status, length, entries, unit

    try:
        connect_seconds, listed, status, length, entries, unit = asyncio.run(session())
    finally:
        world.double.stop()
    assert connect_seconds < 2.0          # connect is cheap: the one timing this test asserts
    names = [t.name for t in listed.tools]
    assert names[names.index("call_many") + 1:] == world.expected_tools()
    assert not status.is_error and status.structured_content["url"] == world.double.url
    assert not length.is_error and "structured_content" in length.model_fields_set
    assert length.structured_content == ({"result": 0} if mode == "legacy" else 0)
    assert not entries.is_error and entries.structured_content == ({"result": {}} if mode == "legacy" else {})
    assert not unit.is_error and unit.structured_content is None


# ── small helpers that need the world ────────────────────────────────────────────────────────────

def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listed_contexts(server, package):
    """The app's context ids in the node's order (the order candidate lists use)."""
    return [c["id"] for c in server.tool_json("list_contexts", {"application": package})["contexts"]]


def test_generated_names_do_not_depend_on_enabled_toolsets(start_server, tmp_path):
    """`com.x.list` + `group_members` would be `list_group_members`, a governance tool's name: it keeps its
    id suffix even when governance is trimmed, so one app always names its tools the same way."""
    app = {"package": "com.x.list", "version": "1.0.0", "signer_id": "did:key:list", "metadata": {},
           "abi": manifest(method("group_members", returns={"kind": "u32"}, intent="read_only"))}
    double = NodeDouble(apps=[app])
    app_id = double._app_key("com.x.list")
    double.start()
    try:
        names = []
        for toolsets in ("all", "core"):
            env = dict(env_for(double.url, tmp_path / toolsets), CALIMERO_MCP_TOOLSETS=toolsets)
            names.append([n for n in start_server(env).tool_names() if n.endswith("group_members")
                          and not n.startswith(("add_", "remove_"))])
        tail = "".join(c for c in app_id.lower() if c.isalnum())[:6]
        expected = "list_%s_group_members" % tail
        assert names[0] == ["list_group_members", expected] and names[1] == [expected]
    finally:
        double.stop()


def test_context_and_underscore_context_must_name_one_context(start_server, tmp_path):
    """Without a handle, `context` and `_context` may both be given only when they name the same context."""
    double = NodeDouble(apps=[kv_store_spec()])
    first, second = double.add_context(KV), double.add_context(KV)
    double.add_alias("first", first)
    double.start()
    try:
        server = start_server(env_for(double.url, tmp_path))
        same = server.call_tool("kv_store_len", {"context": "first", "_context": first})
        assert not same.get("isError") and same["structuredContent"] == {"result": 0}
        clash = server.call_tool("kv_store_len", {"context": first, "_context": second})
        assert clash["isError"] and "different contexts" in clash["content"][-1]["text"]
        assert [e["contextId"] for e in double.executions] == [first]
    finally:
        double.stop()


def test_a_modern_client_that_never_discovers_still_gets_app_tools(start_server, server_env):
    """ts-sdk v2 probes server/discover on a throwaway process: the real one may first see tools/list."""
    server = start_server(server_env, initialize=None)
    meta = MODERN_META
    names = [t["name"] for t in server.result("tools/list", {"_meta": meta})["tools"]]
    assert "kv_store_len" in names
    called = server.result("tools/call", {"name": "kv_store_len", "arguments": {"context": "demo"}, "_meta": meta})
    assert called["structuredContent"] == 0 and called["resultType"] == "complete"


def test_a_node_whose_app_list_omits_services_serves_the_same_tools(start_server, tmp_path):
    """rc.25 lists apps without `services` (node-api.md §0): the app records fill them in, once per version."""
    older = World(list_services=False)
    older.double.start()
    try:
        server = start_server(env_for(older.double.url, tmp_path))
        names = server.tool_names()
        assert names[names.index("call_many") + 1:] == older.expected_tools()
        assert "mero_drive_docs_create_doc" in names and "solo_ping" in names
        created = server.call_tool("mero_drive_docs_create_doc", {"context": older.docs_ctx, "title": "t"})
        assert not created.get("isError"), created
        records = lambda: len([r for r in older.double.requests_to("GET", "/admin-api/applications/")
                               if r["path"].count("/") == 3])
        before = records()
        for _ in range(3):
            server.call_tool("call", {"app": "mero-drive", "context": older.registry_ctx, "method": "get_folder",
                                      "args": {"id": 1}})
        # each call reads the live list; services of an app version already seen are not asked for again
        assert records() - before <= 3
    finally:
        older.double.stop()


def test_an_abi_type_whose_kind_is_no_string_is_passed_through_unchecked(serve):
    """`"kind": ["list"]` or `{"x": 1}`: the arguments go out as given, no TypeError in the wire conversion (-32603)."""
    from node_double import NodeDouble
    manifest = {"schema_version": "wasm-abi/1", "types": {}, "events": [], "methods": [
        {"name": "odd", "params": [{"name": "value", "type": {"kind": ["list"]}},
                                   {"name": "other", "type": {"kind": {"x": 1}}}],
         "returns": {"kind": "unit"}, "intent": "mutating"}]}
    spec = {"package": "com.example.odd", "version": "1.0.0", "signer_id": "signer-odd", "abi": manifest}
    double = NodeDouble(apps=[spec], contexts=[{"app": "com.example.odd"}])
    server = serve(double)
    context_id = next(iter(double._contexts))
    for name, arguments in [("call", {"app": "odd", "context": context_id, "method": "odd",
                                      "args": {"value": [1, "a"], "other": {"y": 2}}}),
                            ("odd_odd", {"_context": context_id, "value": [1, "a"], "other": {"y": 2}})]:
        result = server.call_tool(name, arguments)
        assert not result.get("isError"), result
    sent = [e["argsJson"] for e in double.executions]
    assert sent == [{"value": [1, "a"], "other": {"y": 2}}] * 2
