"""The tool surface as a host carries it, through the real server against the node double: no argument
silently ignored, structured results that validate even when a value is null, app-authored names made fit for
titles and rows, and a tool list that needs no validator library.
"""
from __future__ import annotations

import json
import sys
import unicodedata

import pytest
import abi

from mcp_client import MODERN_META, ROOT, McpServer, minimal_env
from node_double import NodeDouble, kv_store_spec

S = {"kind": "string"}
NULLS_ABI = {"schema_version": "wasm-abi/1", "types": {
    "Profile": {"kind": "record", "fields": [{"name": "name", "type": S}]}}, "methods": [
    # the kv behaviour answers null for a missing key, whatever these declare: a record, a map, a list
    {"name": "set", "params": [{"name": "key", "type": S}, {"name": "value", "type": S}]},
    {"name": "get", "params": [{"name": "key", "type": S}], "returns": {"$ref": "Profile"}, "intent": "read_only"},
    {"name": "remove", "params": [{"name": "key", "type": S}], "returns": {"kind": "map", "key": S, "value": S}}]}
LIST_ABI = {"schema_version": "wasm-abi/1", "types": {}, "methods": [
    {"name": "get", "params": [{"name": "key", "type": S}], "returns": {"kind": "list", "items": S}}]}
EVIL_NAME = "Evil\nApp\r\n\x1b[31m\u202e\tred\u2028" + "x" * 300
PING_ABI = {"schema_version": "wasm-abi/1", "types": {},
            "methods": [{"name": "ping", "params": [], "intent": "read_only"}]}
CREATE_CONTEXT_TAKES = "create_context takes: application, group, namespace, name, alias, service, args."
CALL_TAKES = "call takes: app_handle, context, method, args, app."


class World:
    def __init__(self):
        d = self.double = NodeDouble()
        self.kv = d.add_app(kv_store_spec())
        self.kv_ctx = d.add_context(self.kv)
        self.nulls = d.add_app({"package": "com.example.nulls", "version": "1.0.0", "signer_id": "did:key:n",
                                "metadata": {}, "abi": NULLS_ABI, "behaviour": "kv"})
        self.nulls_ctx = d.add_context(self.nulls)
        self.lists = d.add_app({"package": "com.example.lists", "version": "1.0.0", "signer_id": "did:key:n",
                                "metadata": {}, "abi": LIST_ABI, "behaviour": "kv"})
        self.lists_ctx = d.add_context(self.lists)
        self.evil = d.add_app({"package": "com.example.evil", "version": "1.0.0", "signer_id": "did:key:e",
                               "metadata": {"name": EVIL_NAME, "guide": "# Evil\n"}, "abi": PING_ABI})
        d.start()


@pytest.fixture(scope="module")
def world():
    made = World()
    yield made
    made.double.stop()


@pytest.fixture
def server(world, tmp_path):
    server = McpServer(env_for(world, tmp_path))
    server.initialize()
    yield server
    server.close()
    server.assert_stdout_pure()


def env_for(world, tmp_path):
    return minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": world.double.url,
                                           "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})


def error_text(result):
    assert result.get("isError") is True, result
    return result["content"][-1]["text"]


def handle_for(server, app):
    selected = server.call_tool("select_app", {"app": app})
    assert not selected.get("isError"), selected
    return selected["structuredContent"]["app_handle"]


class Quiet:
    """Asserts the double saw no request (or no execute) while the block ran."""

    def __init__(self, double, executes_only=False):
        self.double, self.executes_only = double, executes_only

    def seen(self):
        return self.double.requests_to("POST", "/jsonrpc") if self.executes_only else self.double.requests_to()

    def __enter__(self):
        self.before = len(self.seen())

    def __exit__(self, *exc_info):
        if exc_info[0] is None:
            assert self.seen()[self.before:] == [], "the refused call reached the node"


# ── No argument silently ignored ────────────────────────────────────────────────────────────────────

def test_a_fixed_tool_refuses_an_argument_it_does_not_take(server, world):
    server.tool_names()                    # the catalog is read: what follows would be the call's own requests
    with Quiet(world.double):
        assert error_text(server.call_tool("create_context", {"application": "kv-store", "group": "g",
                                                              "app": "kv-store"})) == \
            "Error: Unknown argument app. " + CREATE_CONTEXT_TAKES
        assert error_text(server.call_tool("list_contexts", {"aplication": "kv", "verbos": True})) == (
            "Error: Unknown arguments aplication, verbos. list_contexts takes: application, verbose, cursor.")
        assert error_text(server.call_tool("node_status", {"verbose": True})) == (
            "Error: Unknown argument verbose. node_status takes no arguments.")
        assert error_text(server.call_tool("call_many", {"calls": [], "parallel": False})).startswith(
            "Error: Unknown argument parallel. call_many takes: calls.")


def test_a_generated_tool_refuses_an_argument_its_method_does_not_declare(server, world):
    handle = handle_for(server, "kv-store")
    with Quiet(world.double):
        assert error_text(server.call_tool("kv_store_get", {"app_handle": handle, "kee": "a"})) == (
            "Error: Unknown argument kee. kv_store_get takes: app_handle, _context, key.")
        assert error_text(server.call_tool("kv_store_len", {"app_handle": handle, "key": "a"})) == (
            "Error: Unknown argument key. kv_store_len takes: app_handle, _context.")
    # the routing keys are the tool's own: context (unadvertised, _context's synonym) and _context both work
    for routing in ("context", "_context"):
        result = server.call_tool("kv_store_set", {routing: world.kv_ctx, "key": routing, "value": "v"})
        assert not result.get("isError"), result
    assert [e["argsJson"] for e in world.double.executions[-2:]] == [{"key": "context", "value": "v"},
                                                                     {"key": "_context", "value": "v"}]


def test_call_refuses_what_the_method_does_not_declare(server, world):
    handle = handle_for(server, "kv-store")
    with Quiet(world.double):
        assert error_text(server.call_tool("call", {"app_handle": handle, "method": "get", "argz": {}})) == (
            "Error: Unknown argument argz. " + CALL_TAKES)
    with Quiet(world.double, executes_only=True):
        assert error_text(server.call_tool("call", {"app_handle": handle, "method": "get",
                                                    "args": {"key": "a", "kee": "b"}})) == (
            "Error: Unknown argument kee in args. Method get takes: key.")
        # a routing key inside args routes nothing: it is refused too, not dropped
        assert error_text(server.call_tool("call", {"app_handle": handle, "method": "len",
                                                    "args": {"app_handle": handle}})) == (
            "Error: Unknown argument app_handle in args. Method len takes no arguments.")
        many = server.call_tool("call_many", {"calls": [
            {"app_handle": handle, "method": "len", "arg": {}},
            {"app_handle": handle, "method": "get", "args": {"kee": "a"}}]})
        assert [item["error"] for item in json.loads(many["content"][0]["text"])] == [
            "Error: Unknown argument arg. " + CALL_TAKES,
            "Error: Unknown argument kee in args. Method get takes: key."]
    # _context, the name generated tools advertise, is call's context too
    result = server.call_tool("call", {"app": "kv-store", "_context": world.kv_ctx, "method": "len"})
    assert not result.get("isError"), result
    assert world.double.executions[-1] == {"contextId": world.kv_ctx, "method": "len", "argsJson": {}}


# ── Structured results always valid ─────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("era", ["handshake", "modern"])
def test_a_null_record_map_or_list_validates_against_its_output_schema(server, world, era):
    """The node answers null for a None whatever the ABI declares (real ABIs drop Option from returns)."""
    meta = MODERN_META if era == "modern" else None
    tools = {t["name"]: t for t in server.result("tools/list", {"_meta": meta} if meta else None)["tools"]}
    for name, context, declared in (("nulls_get", world.nulls_ctx, "object"),
                                    ("nulls_remove", world.nulls_ctx, "object"),
                                    ("lists_get", world.lists_ctx, "array")):
        schema = tools[name]["outputSchema"]
        assert '"%s"' % declared in json.dumps(schema)
        result = server.call_tool(name, {"context": context, "key": "missing"}, meta=meta)
        assert not result.get("isError") and result["content"] == [
            {"type": "text", "text": "null"},
            {"type": "text", "text": "%s ran in context %s." % (name.rsplit("_", 1)[1], context)}], result
        abi.compile_schema(schema).validate(result["structuredContent"])
        assert result["structuredContent"] == ({"result": None} if era == "handshake" else None)


# ── App-authored names in titles and rows ───────────────────────────────────────────────────────────

def clean_line(text):
    return not any(unicodedata.category(c) in ("Cc", "Cf") for c in text)


def test_an_app_name_enters_titles_resources_and_rows_as_one_short_line(server, world):
    cut = "Evil App [31m red " + "x" * 45 + "\u2026"
    assert len(cut) == 64
    [ping] = [t for t in server.result("tools/list")["tools"] if t["name"] == "evil_ping"]
    assert ping["title"] == "Ping (%s)" % cut and clean_line(ping["title"])
    [guide] = [r for r in server.result("resources/list")["resources"] if world.evil in r["uri"]]
    assert guide["name"] == cut + " guide"
    [row] = [a for a in server.tool_json("list_applications")["apps"] if a["id"] == world.evil]
    assert row["name"] == cut
    # the full text stays where it is labelled as the app's
    [full] = [a for a in server.tool_json("list_applications", {"verbose": True})["apps"] if a["id"] == world.evil]
    assert full["metadata"]["name"] == EVIL_NAME
    assert server.call_tool("describe_app", {"app": "com.example.evil"})["structuredContent"]["name"] == EVIL_NAME


# ── The tool list needs no validator ────────────────────────────────────────────────────────────────

# The server as `mero-mcp` runs it, with a hook that notes in a file (written before the import goes on, so before
# the answer that caused it) when jsonschema is first imported.
WATCH_IMPORTS = r"""
import os, sys
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "jsonschema":
            with open(os.environ["WATCH_FILE"], "a") as note:
                note.write("jsonschema imported\n")
            sys.meta_path.remove(self)
        return None
sys.meta_path.insert(0, Watch())
sys.path.insert(0, %r)
import mero_mcp
sys.exit(mero_mcp.main())
""" % str(ROOT)


def test_tools_list_does_not_import_jsonschema_the_first_validating_call_does(world, tmp_path):
    watch = tmp_path / "imports"
    env = dict(env_for(world, tmp_path), WATCH_FILE=str(watch))
    server = McpServer(env, command=[sys.executable, "-c", WATCH_IMPORTS])
    try:
        server.initialize()
        names = server.tool_names()
        assert "kv_store_get" in names and "nulls_get" in names, "the catalog is complete"
        server.result("resources/list")
        server.result("tools/list", {"_meta": MODERN_META})
        assert not watch.exists(), "listing imported jsonschema"
        assert not server.call_tool("kv_store_len", {"context": world.kv_ctx}).get("isError")
        assert watch.read_text() == "jsonschema imported\n"
    finally:
        server.close()
