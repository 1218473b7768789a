"""Every tool definition, in both protocol eras, against the rules the real hosts apply (portable schemas),
with every manifest of tests/manifests/ and of ../shared/fixtures/abi/ (skipped when absent) installed in the double:

- a name matches ^[A-Za-z_][A-Za-z0-9_-]*$ and fits 64 behind a 15-character `mcp__<server>__` prefix (Gemini's rules
  on names; Claude Code never shortens the prefixed name);
- a description of at most 2,048 characters (Claude Code cuts longer ones silently) that does not start blank (a
  host's tool search matches its first sentence); a title on one line;
- every schema passes the JSON Schema 2020-12 meta-schema (Claude Code skips a tool whose schema does not), has no
  $ref/$defs, property keys within ^[a-zA-Z0-9_.-]{1,64}$, and a `type` on every node (older Gemini CLI releases
  dropped a tool with an untyped node); the root of every inputSchema, and of a handshake-era outputSchema, is an
  object. The one node that states no type is an enum with no variants (`not: {}`: no value, so no type, fits).
"""
from __future__ import annotations

import json
import re
import unicodedata

import pytest
from jsonschema import Draft202012Validator

import fixture_apps
from mcp_client import MODERN_META, McpServer, minimal_env
from node_double import NodeDouble

TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
PROPERTY_KEY = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
HOST_PREFIX = len("mcp__calimero__")          # 15: the desktop app registers the server as `calimero`
DESCRIPTION_LIMIT = 2048
SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
SUBSCHEMAS = ("items", "additionalProperties", "contains", "if", "then", "else")


def schema_problems(schema, at="#"):
    """Every rule a schema node breaks, with a JSON pointer to it."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return ["%s: not a schema" % at]
    problems = ["%s: %s" % (at, key) for key in ("$ref", "$defs", "definitions") if key in schema]
    if "type" not in schema and schema.get("not") != {}:
        problems.append("%s: no type" % at)
    for key, sub in (schema.get("properties") or {}).items():
        if not PROPERTY_KEY.match(key):
            problems.append("%s: property key %r" % (at, key))
        problems += schema_problems(sub, "%s/properties/%s" % (at, key))
    for key in SUBSCHEMAS:
        if key in schema:
            problems += schema_problems(schema[key], "%s/%s" % (at, key))
    for key in SUBSCHEMA_LISTS:
        for index, sub in enumerate(schema.get(key) or []):
            problems += schema_problems(sub, "%s/%s/%d" % (at, key, index))
    return problems


def lint(tool, wrapped):
    """Every rule one tools/list entry breaks."""
    name = tool.get("name")
    problems = []
    if not isinstance(name, str) or not TOOL_NAME.match(name) or HOST_PREFIX + len(name) > 64:
        problems.append("name %r" % (name,))
    description = tool.get("description")
    if not isinstance(description, str) or not description or len(description) > DESCRIPTION_LIMIT:
        problems.append("description of %s characters" % (len(description) if isinstance(description, str) else None))
    elif description[:1].isspace():
        problems.append("description starts blank: its first sentence is what a host's tool search matches")
    title = tool.get("title", "")
    if any(unicodedata.category(c) in ("Cc", "Cf") for c in title):
        problems.append("title %r is not one clean line" % title)
    for field in ("inputSchema", "outputSchema"):
        schema = tool.get(field)
        if schema is None:
            continue
        try:
            Draft202012Validator.check_schema(schema)
        except Exception as error:           # jsonschema.SchemaError: its message says which keyword
            problems.append("%s fails the 2020-12 meta-schema: %s" % (field, str(error).splitlines()[0]))
        problems += ["%s %s" % (field, problem) for problem in schema_problems(schema)]
    if tool.get("inputSchema", {}).get("type") != "object":
        problems.append("inputSchema root is not an object")
    if wrapped and "outputSchema" in tool and tool["outputSchema"].get("type") != "object":
        problems.append("handshake-era outputSchema root is not an object")
    return problems


@pytest.fixture(scope="module", params=["own", "shared"])
def listed(request, tmp_path_factory):
    """Both eras' tools/list from one server with one set of manifests installed: tests/manifests or the shared."""
    folder = fixture_apps.OWN_ABIS if request.param == "own" else fixture_apps.SHARED_ABIS
    paths = fixture_apps.manifest_paths(folder)
    if not paths:
        pytest.skip("%s is absent: the shared fixtures live beside the checkout, not in it" % folder)
    double = NodeDouble()
    fixture_apps.install(double, paths)
    double.start()
    home = tmp_path_factory.mktemp("lint")
    server = McpServer(minimal_env(home / "home", {"CALIMERO_NODE_URL": double.url,
                                                   "CALIMERO_MCP_STATE_DIR": home / "state"}))
    try:
        server.initialize()
        handshake = server.result("tools/list")["tools"]
        modern = server.result("tools/list", {"_meta": MODERN_META})["tools"]
        assert "skipping" not in server.stderr, server.stderr
    finally:
        server.close()
        double.stop()
    return {"handshake": handshake, "modern": modern, "expected": fixture_apps.tool_count(paths)}


@pytest.mark.parametrize("era", ["handshake", "modern"])
def test_every_tool_definition_passes_the_host_rules(listed, era):
    tools = listed[era]
    generated = [t for t in tools if "_meta" in t]
    assert len(generated) == listed["expected"], "every eligible method of every manifest has its tool"
    names = [t["name"] for t in tools]
    assert len(names) == len(set(names))
    failures = {t["name"]: problems for t in tools for problems in [lint(t, era == "handshake")] if problems}
    assert failures == {}, json.dumps(failures, indent=1)


def test_the_lint_catches_what_it_is_for():
    """Each rule fires on a definition that breaks it (so a pass above means something)."""
    good = {"name": "kv_get", "title": "Get (KV)", "description": "[view] get() -> string",
            "inputSchema": {"type": "object", "properties": {"k": {"type": ["string", "null"]}}}}
    assert lint(good, True) == []
    broken = [
        dict(good, name="3d_get"), dict(good, name="x" * 50), dict(good, name="kv.get"),
        dict(good, description="d" * 2049), dict(good, description="\n\n[view] get() -> string"),
        dict(good, title="Get (Evil\nApp)"),
        dict(good, inputSchema={"type": "object", "properties": {"k": {"anyOf": [{"type": "string"}]}}}),
        dict(good, inputSchema={"type": "object", "properties": {"k": {"$ref": "#/$defs/K"}}, "$defs": {}}),
        dict(good, inputSchema={"type": "object", "properties": {"user name": {"type": "string"}}}),
        dict(good, inputSchema={"type": "object", "properties": {"k": {"type": "strng"}}}),
        dict(good, inputSchema={"type": "array"}),
        dict(good, outputSchema={"type": ["object", "null"]}),
    ]
    for tool in broken:
        assert lint(tool, True), tool
