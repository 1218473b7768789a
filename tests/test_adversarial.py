"""Adversarial stdin: over 10,000 seeded frames through two real server processes (mcp-protocol.md §3-§5).

A seeded generator builds every kind of bad (and some good) input: invalid JSON and UTF-8, huge lines, deep
nesting, wrong types for every protocol field, ids of every type, notifications, stray responses, batches in
every era, unknown methods, and tool calls with wrong arguments for fixed and generated tools. For each frame a
small model of the protocol rules (JSON-RPC 2.0 plus the MCP checklist) says what the server owes it: nothing
(notifications, stray responses), one error with a given code, a result, or a tool result with or without
`isError`. The frames are pipelined in chunks and every answer is matched against the model.

Rerun a failure with the seed it prints: MERO_MCP_FUZZ_SEED=<seed> pytest tests/test_adversarial.py
"""
from __future__ import annotations

import itertools
import json
import os
import random
import time
from collections import Counter

from mcp_client import HANDSHAKE_VERSIONS, MODERN_META, MODERN_VERSION

SEED = int(os.environ.get("MERO_MCP_FUZZ_SEED") or 20261129)
MAIN_FRAMES = 8800
BATCH_FRAMES = 1500
CHUNK = 200
CHUNK_TIMEOUT = 120.0                 # a hang fails the test; generous for a loaded 2-core machine

VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
BATCH_VERSION = "2025-03-26"
COMMON_METHODS = {"tools/list", "tools/call", "resources/list", "resources/read", "resources/templates/list",
                  "server/discover"}
HANDSHAKE_METHODS = COMMON_METHODS | {"initialize", "ping"}
LIST_METHODS = ("tools/list", "resources/list", "resources/templates/list")

PARSE, INVALID_REQUEST, NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
RESOURCE_NOT_FOUND, UNSUPPORTED_VERSION = -32002, -32022
OK, IS_ERROR = "ok", "isError"

INVALID_IDS = [None, 1.5, -0.0, 2.0, 1e300, True, False, [1], {"a": 1}, [], {}, [[["deep"]]]]
WRONG_PARAMS = [[], [1, 2], "x", "", 5, 0, True, False, 1.5]
ODD_SCALARS = [None, 0, -1, 2 ** 64, 1.5, True, False, "", "x", "✓", "\ud800", [], {}, [1], {"k": "v"}]


class Seeded(AssertionError):
    pass


def fail(message):
    raise Seeded("%s\n(seed %d: rerun with MERO_MCP_FUZZ_SEED=%d)" % (message, SEED, SEED))


def strict_loads(data):
    """RFC 8259 JSON (no NaN/Infinity), strict UTF-8: the reference for what counts as a parse error."""
    def constant(name):
        raise ValueError("%s is not JSON" % name)
    return json.loads(data.decode("utf-8"), parse_constant=constant)


def valid_id(value):
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def json_type_ok(value, kind):
    return {"string": isinstance(value, str),
            "boolean": isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "array": isinstance(value, list),
            "object": isinstance(value, dict),
            "null": value is None}.get(kind, True)


def deep(depth, leaf="x", kind=None):
    value = leaf
    for level in range(depth):
        value = [value] if (kind or ("list" if level % 2 else "dict")) == "list" else {"d": value}
    return value


# ── the model: what the server owes one frame ─────────────────────────────────────────────────────

class State:
    """What the server negotiated so far: batches depend on it (2025-03-26 only)."""

    def __init__(self, version, tools, guide_uri):
        self.version = version
        self.tools = set(tools)
        self.guide_uri = guide_uri


def expect_message(message, annotation, state, in_batch):
    """None (no answer is due) or (id, outcome); outcome is ("error", code), ("result",) or ("tool", ok|isError)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        request_id = message.get("id") if isinstance(message, dict) else None
        return (request_id if valid_id(request_id) else None), ("error", INVALID_REQUEST)
    if "method" not in message:
        if "id" in message and ("result" in message or "error" in message):
            return None                              # a response to a request of ours: ignored
        request_id = message.get("id")
        return (request_id if valid_id(request_id) else None), ("error", INVALID_REQUEST)
    if "id" not in message:
        return None                                  # a notification is never answered
    request_id = message["id"]
    if not valid_id(request_id):
        return None, ("error", INVALID_REQUEST)
    return request_id, expect_request(message, annotation, state, in_batch)


def expect_request(message, annotation, state, in_batch):
    method = message["method"]
    if not isinstance(method, str):
        return "error", INVALID_REQUEST
    params = message.get("params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        return "error", INVALID_PARAMS
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    version = meta.get(VERSION_KEY)
    if version is None:
        modern = method == "server/discover"
    elif isinstance(version, str) and version == MODERN_VERSION:
        modern = True
    else:
        return "error", UNSUPPORTED_VERSION
    if method not in (COMMON_METHODS if modern else HANDSHAKE_METHODS):
        return "error", NOT_FOUND
    if method == "initialize":
        if in_batch:
            return "error", INVALID_REQUEST
        requested = params.get("protocolVersion")
        state.version = requested if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS \
            else HANDSHAKE_VERSIONS[0]
        return ("result",)
    if method in LIST_METHODS:
        return ("error", INVALID_PARAMS) if params.get("cursor") is not None else ("result",)
    if method == "resources/read":
        uri = params.get("uri")
        if not isinstance(uri, str):
            return "error", INVALID_PARAMS
        if uri == state.guide_uri:
            return ("result",)
        return "error", (INVALID_PARAMS if modern else RESOURCE_NOT_FOUND)
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
            return "error", INVALID_PARAMS
        if name not in state.tools:
            return "error", INVALID_PARAMS
        if annotation is None:
            raise AssertionError("generator bug: a call to %s without an expected outcome" % name)
        return "tool", annotation
    return ("result",)                               # ping, server/discover


def expect_frame(raw, parsed, state):
    """Every answer one stdin line is owed, as (id, outcome) pairs, and whether they come as one batch answer.
    `parsed` is (object, annotation) as generated, or None to parse `raw` the way RFC 8259 says."""
    if not raw.strip(b" \t\r\n"):
        return [], False                             # a line of JSON whitespace alone carries no message
    if parsed is None:
        try:
            obj = deep_loads(raw)
        except (ValueError, RecursionError):
            return [(None, ("error", PARSE))], False
        parsed = (obj, None)
    obj, annotation = parsed
    if nesting(obj) > MAX_NESTING:
        due = expect_too_deep(obj)
        return ([due] if due is not None else []), False
    if isinstance(obj, list):
        if state.version != BATCH_VERSION or not obj:
            return [(None, ("error", INVALID_REQUEST))], False
        annotations = annotation or [None] * len(obj)
        due = [expect_message(item, note, state, True) for item, note in zip(obj, annotations)]
        return [d for d in due if d is not None], True
    due = expect_message(obj, annotation, state, False)
    return ([due] if due is not None else []), False


MAX_NESTING = 100                     # levels of JSON the server reads in one message


def deep_loads(raw):
    """strict_loads, reading valid JSON nested past Python's default recursion limit too (the server answers such
    a frame by its id; a text that is no JSON stays a parse error)."""
    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 8000))
    try:
        return strict_loads(raw)
    finally:
        sys.setrecursionlimit(limit)


def nesting(value):
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [child for item in level for child in (item.values() if isinstance(item, dict) else
                                                       item if isinstance(item, list) else ())
                 if isinstance(child, (dict, list))]
    return depth


def expect_too_deep(obj):
    """A frame past the nesting limit, answered by its top-level fields alone."""
    if not isinstance(obj, dict):
        return None, ("error", INVALID_REQUEST)
    request_id = obj.get("id")
    shown = request_id if valid_id(request_id) else None
    if obj.get("jsonrpc") != "2.0":
        return shown, ("error", INVALID_REQUEST)
    if "method" not in obj:
        if "id" in obj and ("result" in obj or "error" in obj):
            return None
        return shown, ("error", INVALID_REQUEST)
    if "id" not in obj:
        return None
    if shown is not None and obj["method"] == "tools/call":
        return shown, ("tool", IS_ERROR)
    return shown, ("error", INVALID_REQUEST)


# ── the generator ─────────────────────────────────────────────────────────────────────────────────

class Generator:
    def __init__(self, rng, state, fixed_schemas, handle, allow_initialize=True):
        self.rng = rng
        self.state = state
        self.fixed = fixed_schemas                   # name -> inputSchema of every fixed tool
        self.handle = handle
        self.allow_initialize = allow_initialize
        self.serial = itertools.count(1)
        self.specials = [0, "", "0", -1, 2 ** 63 - 1, "x" * 3000]   # each used once

    # ---- ids ----
    def fresh_id(self):
        if self.specials and self.rng.random() < 0.01:
            return self.specials.pop()
        n = next(self.serial)
        return self.rng.choice([
            lambda: 1000000 + n, lambda: -(1000000 + n), lambda: 2 ** 63 + n, lambda: 10 ** 30 + n,
            lambda: "r%d" % n, lambda: "é✓雪-%d" % n, lambda: "\ud83d-%d" % n, lambda: " %d " % n,
            lambda: json.dumps({"nested": n}),
        ])()

    def cancel_target(self):
        """A requestId no request of ours ever uses (cancelling a live request would rightly silence it)."""
        n = next(self.serial)
        return self.rng.choice(["c%d" % n, 5 * 10 ** 15 + n, None, 1.5, True, [n], {"id": n}, deep(30)])

    # ---- messages ----
    def envelope(self, method, params, annotation=None, absent_params=False):
        """A request around method/params, sometimes with a bad id, no id, or a bad jsonrpc member."""
        rng = self.rng
        message = {"jsonrpc": "2.0", "method": method}
        roll = rng.random()
        if roll < 0.05:
            message["id"] = rng.choice(INVALID_IDS + [deep(rng.choice((5, 60)))])
        elif roll < 0.08:
            pass                                     # a notification: never answered, never run
        else:
            message["id"] = self.fresh_id()
        if not absent_params:
            message["params"] = params
        roll = rng.random()
        if roll < 0.03:
            message["jsonrpc"] = rng.choice(["1.0", 2.0, None, ["2.0"], "2.0 ", "", {"v": "2.0"}])
        elif roll < 0.04:
            del message["jsonrpc"]
        elif roll < 0.06:
            message[rng.choice(["result", "error"])] = rng.choice(ODD_SCALARS)   # still a request: it has a method
        return message, annotation

    def meta(self, params):
        """Sometimes a _meta of the wrong type, an unsupported version, the modern era, or odd hints."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.05:
            params["_meta"] = rng.choice([5, "x", [], None, True, [MODERN_META]])
        elif roll < 0.10:
            params["_meta"] = dict(MODERN_META)
        elif roll < 0.14:
            params["_meta"] = {VERSION_KEY: rng.choice(["2025-11-25", "2030-01-01", "", 5, True, [], {},
                                                        ["2026-07-28"], deep(40), 2026.0728])}
        elif roll < 0.18:
            params["_meta"] = {VERSION_KEY: None, "progressToken": rng.choice(ODD_SCALARS),
                               "traceparent": rng.choice(ODD_SCALARS + ["00-" + "0" * 32 + "-" + "0" * 16 + "-01"])}
        return params

    def params_for(self, method):
        rng = self.rng
        if method in LIST_METHODS:
            params = {}
            if rng.random() < 0.5:
                params["cursor"] = rng.choice(ODD_SCALARS + ["abc", deep(20)])
            return params
        if method == "resources/read":
            return {"uri": rng.choice(ODD_SCALARS + [self.state.guide_uri, self.state.guide_uri, "calimero://apps/x/1/guide",
                                                     "file:///etc/passwd", "calimero://apps/" + "0" * 64 + "/1.0.0/guide",
                                                     deep(25)])} if rng.random() < 0.9 else {}
        if method == "initialize":
            params = {"capabilities": rng.choice([{}, None, 5, {"extensions": {"x": {}}}]),
                      "clientInfo": rng.choice([{"name": "fuzz", "version": "0"}, None, "x", []])}
            if rng.random() < 0.9:
                params["protocolVersion"] = rng.choice(list(HANDSHAKE_VERSIONS) * 2 + [
                    MODERN_VERSION, "1999-01-01", "", None, 5, 2025.0326, True, ["2025-03-26"],
                    {"v": "2025-03-26"}, deep(30), "2025-03-26 "])
            return params
        if method == "ping":
            return rng.choice([{}, {"x": 1}, {"nested": deep(rng.choice((3, 80)))}, {"progressToken": 5}])
        return rng.choice([{}, {"x": rng.choice(ODD_SCALARS)}])

    def request(self):
        rng = self.rng
        roll = rng.random()
        if roll < 0.45:
            return self.tool_call()
        methods = ["ping"] * 6 + list(LIST_METHODS) + ["resources/read"] * 3 + ["server/discover"]
        if self.allow_initialize:
            methods += ["initialize"]
        unknown = ["prompts/list", "", "PING", "Ping", "tools/List", "tools/list ", "notifications/cancelled",
                   "notifications/initialized", "resources/subscribe", "logging/setLevel", "completion/complete",
                   "sampling/createMessage", "rpc.discover", "x" * 500, "方法", "\ud800", "tools/call/extra"]
        if roll < 0.55:
            method, params = rng.choice(unknown), {}
        elif roll < 0.58:
            method, params = rng.choice([5, None, True, [], {}, ["ping"], 1.5]), {}
        else:
            method = rng.choice(methods)
            params = self.params_for(method)
        params = self.meta(params)
        roll = rng.random()
        if roll < 0.07:
            return self.envelope(method, rng.choice(WRONG_PARAMS))
        if roll < 0.10:
            return self.envelope(method, None)
        if roll < 0.13:
            return self.envelope(method, None, absent_params=True)
        return self.envelope(method, params)

    # ---- tools/call ----
    def tool_call(self):
        rng = self.rng
        roll = rng.random()
        if roll < 0.06:
            params = {"name": rng.choice([5, None, True, [], {}, ["node_status"], 1.5])}
            return self.envelope("tools/call", self.meta(params))
        if roll < 0.12:
            params = {"name": rng.choice(["node_status", "kv_store_get", "call"]),
                      "arguments": rng.choice([[], [1], "x", "", 5, 0, True, 1.5, deep(40, kind="list")])}
            return self.envelope("tools/call", self.meta(params))
        if roll < 0.18:
            name = rng.choice(["nope", "", "KV_STORE_GET", "kv_store_get ", " node_status", "mcp__mero-mcp__node_status",
                               "\ud800", "outil_été_✓", "x" * 5000, "kv_store_init", "counter_init", "kv_store_"])
            return self.envelope("tools/call", self.meta({"name": name, "arguments": {}}))
        if roll < 0.45:
            name, arguments, outcome = self.fixed_call()
        elif roll < 0.80:
            name, arguments, outcome = self.generated_call()
        else:
            name, arguments, outcome = self.app_tool_call()
        params = {"name": name}
        if arguments is None and rng.random() < 0.5:
            pass                                     # no arguments member at all: same as {}
        else:
            params["arguments"] = arguments
        return self.envelope("tools/call", self.meta(params), outcome)

    def wrong_value(self, schema, required=True):
        kind = schema.get("type")
        pool = [5, -1, 1.5, True, False, "s", "", [], [1, 2], {}, {"a": 1}, deep(self.rng.choice((3, 300)))]
        pool += [None] if required else []
        return self.rng.choice([value for value in pool if not json_type_ok(value, kind)])

    def fixed_call(self):
        """A fixed tool with arguments its declared schema refuses: isError, and the handler never runs.
        (call and call_many check their own arguments, after the handle: app_tool_call covers them.)"""
        rng = self.rng
        while True:
            name = rng.choice(sorted(set(self.fixed) - {"call", "call_many"}))
            schema = self.fixed[name]
            properties = schema.get("properties") or {}
            typed = [p for p, s in properties.items() if isinstance(s, dict) and s.get("type")]
            options = []
            if typed:
                options.append("wrong-type")
            if schema.get("required"):
                options.append("missing")
            if schema.get("additionalProperties") is False:
                options.append("extra")
            if options:
                break
        how = rng.choice(options)
        if how == "wrong-type":
            prop = rng.choice(typed)
            # An optional argument given as null is absent: null is wrong only where required.
            arguments = {prop: self.wrong_value(properties[prop], prop in (schema.get("required") or ()))}
            for other in rng.sample(typed, min(len(typed), 2)):
                if other != prop and rng.random() < 0.5:
                    arguments[other] = self.wrong_value(properties[other])
        elif how == "missing":
            arguments = {"unrelated": rng.choice(ODD_SCALARS)} if rng.random() < 0.5 else None
        else:
            arguments = {rng.choice(["x", "", "verbose", "_meta", "app_handle"]): rng.choice(ODD_SCALARS)}
        return name, arguments, IS_ERROR

    def generated_call(self):
        """A generated method tool with arguments of a wrong shape (a few right ones, read-only)."""
        rng = self.rng
        handle = self.handle
        bad_handles = [5, None, True, [], {}, "", "x", "a.b", "a.b.c", handle + "x", "x" + handle,
                       handle.replace(".", ".A", 1), handle.split(".")[0], deep(20)]
        name = rng.choice(["kv_store_get", "kv_store_set", "kv_store_remove", "kv_store_len", "kv_store_entries",
                           "kv_store_get_or_insert", "kv_store_update_if_exists", "kv_store_get_result",
                           "kv_store_clear", "counter_value", "counter_increment"])
        keyed = name in ("kv_store_get", "kv_store_set", "kv_store_remove", "kv_store_get_or_insert",
                         "kv_store_update_if_exists", "kv_store_get_result")
        roll = rng.random()
        if roll < 0.15:
            return name, rng.choice([None, {}, {"key": "k", "value": "v"}]), IS_ERROR      # no handle: refused
        if roll < 0.35:
            arguments = {"app_handle": rng.choice(bad_handles), "key": "k", "value": "v", "by": 1}
            return name, arguments, IS_ERROR                                            # forged handle
        if roll < 0.45:
            arguments = {rng.choice(["context", "_context"]): rng.choice([5, True, [], {}, "", "nope", deep(10)]),
                         "key": "k", "value": "v", "by": 1}
            return name, arguments, IS_ERROR                                            # bad context
        if name.startswith("counter_"):
            # the kv-store handle or context is another app's: refused either way
            arguments = rng.choice([{"app_handle": handle}, {"context": "demo"}, {"app_handle": handle, "by": 1}])
            return name, arguments, IS_ERROR
        if keyed and roll < 0.85:
            arguments = {"app_handle": handle} if rng.random() < 0.7 else {"context": "demo"}
            wrong = rng.choice([5, -1, 1.5, True, None, [], ["k"], {}, {"k": "v"}, deep(rng.choice((4, 300)))])
            if rng.random() < 0.8:
                arguments["key"] = wrong
            if name in ("kv_store_set", "kv_store_get_or_insert", "kv_store_update_if_exists"):
                arguments["value"] = rng.choice([5, None, [], {}])
            return name, arguments, IS_ERROR                                            # ABI says no
        # right arguments, read-only methods only: must succeed
        name = rng.choice(["kv_store_get", "kv_store_len", "kv_store_entries"])
        arguments = {"app_handle": handle} if rng.random() < 0.6 else {"context": "demo"}
        if name == "kv_store_get":
            arguments["key"] = rng.choice(["k", "", "✓", "x" * 200])
        return name, arguments, OK

    def app_tool_call(self):
        """call, call_many, describe_app, select_app and a few read-only fixed tools, right and wrong."""
        rng = self.rng
        handle = self.handle
        good = [
            ("node_status", {}), ("node_status", None), ("list_applications", {"verbose": True}),
            ("list_applications", {}), ("list_namespaces", {}), ("list_contexts", {"verbose": False}),
            ("lookup_alias", {"name": "demo"}), ("lookup_alias", {"name": "no-such-alias"}), ("list_blobs", {}),
            ("describe_app", {"app": "kv-store"}), ("select_app", {"app": "com.calimero.kv-store"}),
            ("select_app", {"app": "Counter"}), ("call", {"app_handle": handle, "method": "len"}),
            ("call", {"app": "kv-store", "context": "demo", "method": "get", "args": {"key": "k"}}),
            ("call_many", {"calls": [{"app_handle": handle, "method": "len"}] * rng.randint(1, 4)}),
            ("call_many", {"calls": [{"method": "len"}, {"app_handle": "x", "method": "get"}]}),   # items fail
            ("call_many", {"calls": [{"app_handle": handle, "method": "get", "args": {"key": 5}}]}),
            ("call_many", {"calls": [5, None, "x"]}),          # a bad item fails alone, not the batch
            ("call_many", {"calls": [{"args": {}}, {"app_handle": handle}]}),
        ]
        bad = [
            ("describe_app", {"app": "nope"}), ("describe_app", {"app": "  "}), ("select_app", {"app": "nope"}),
            ("select_app", {"app": "kv-store", "context": "nope"}),
            ("call", {"app_handle": handle, "method": "init"}), ("call", {"app_handle": handle, "method": "nope"}),
            ("call", {"app_handle": handle, "method": ""}), ("call", {"method": "len"}),
            ("call", {"app_handle": "x", "method": "len"}), ("call", {"app": "nope", "context": "demo", "method": "len"}),
            ("call", {"app": "kv-store", "method": "len"}), ("call", {"app": "counter", "context": "demo", "method": "len"}),
            ("call", {"app_handle": handle, "method": "get", "args": {"key": 5}}),
            ("call", {"app_handle": handle, "method": "get", "args": {}}),
            ("call_many", {"calls": []}), ("call_many", {"calls": [{"method": "len"}] * 33}),
            ("call_many", {"calls": "x"}), ("call_many", {"calls": {"0": {"method": "len"}}}),
            ("call_many", {}), ("call_many", None), ("lookup_alias", {}),
            ("call", {"app": 5, "context": "demo", "method": "len"}), ("call", {"app_handle": 5, "method": "len"}),
            ("call", {"app_handle": handle, "method": 5}), ("call", {"app_handle": handle, "method": "len", "args": 5}),
            ("call", {}), ("call", None),
        ]
        if rng.random() < 0.35:
            name, arguments = rng.choice(good)
            return name, arguments, OK
        name, arguments = rng.choice(bad)
        return name, arguments, IS_ERROR

    # ---- everything else on the wire ----
    def notification(self):
        rng = self.rng
        method = rng.choice(["notifications/cancelled"] * 4 + [
            "notifications/initialized", "notifications/progress", "notifications/roots/list_changed",
            "notifications/message", "notifications/unknown", "ping", "tools/call", "initialize", 5, None, []])
        message = {"jsonrpc": "2.0", "method": method}
        roll = rng.random()
        if method == "notifications/cancelled" and roll < 0.7:
            message["params"] = {"requestId": self.cancel_target(), "reason": rng.choice(ODD_SCALARS)}
        elif roll < 0.9:
            message["params"] = rng.choice(WRONG_PARAMS + [None, {}, {"requestId": self.cancel_target()},
                                                           {"name": "delete_context", "arguments": {"context": "demo"}},
                                                           deep(rng.choice((5, 200)))])
        return message, None

    def stray_response(self):
        rng = self.rng
        message = {"jsonrpc": "2.0", "id": rng.choice([self.fresh_id(), None] + INVALID_IDS)}
        if rng.random() < 0.5:
            message["result"] = rng.choice([{}, None, 5, {"content": []}])
        else:
            message["error"] = rng.choice([{"code": -32000, "message": "x"}, None, "x"])
        return message, None

    def no_method(self):
        rng = self.rng
        message = rng.choice([{"jsonrpc": "2.0", "id": self.fresh_id()}, {"jsonrpc": "2.0"},
                              {"jsonrpc": "2.0", "id": rng.choice(INVALID_IDS)}, {"jsonrpc": "2.0", "params": {}},
                              {"id": self.fresh_id(), "params": {}}, {}])
        return message, None

    def non_object(self):
        return self.rng.choice([5, -1, 1.5, "ping", "", None, True, False, "{}", '{"jsonrpc":"2.0"}']), None

    def batch(self, size=None):
        rng = self.rng
        size = rng.choice([0, 1, 1, 2, 3, 5, 8, 12]) if size is None else size
        pairs = []
        for _ in range(size):
            roll = rng.random()
            if roll < 0.07:
                pairs.append((rng.choice([5, None, "x", [], [1], [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]]), None))
            elif roll < 0.14:
                pairs.append(self.notification())
            elif roll < 0.18:
                pairs.append(self.stray_response())
            elif roll < 0.22:
                params = {"protocolVersion": BATCH_VERSION}
                pairs.append(({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "initialize", "params": params},
                              None))
            else:
                pairs.append(self.request())
        return [m for m, _ in pairs], [a for _, a in pairs]

    # ---- raw lines ----
    def garbage(self):
        rng = self.rng
        fixed = [b"{", b"}", b"[", b"]", b"{]", b'{"a":}', b"nul", b"tru", b"'x'", b"NaN", b"Infinity", b"-Infinity",
                 b'{"jsonrpc":"2.0","id":1,"method":"ping",}', b'{"jsonrpc":"2.0" "id":1}', b"// comment",
                 b'{"a":1}{"b":2}', b'{"a":1} x', b"01", b"1.", b".5", b'"unterminated', b'"\\x"', b"",
                 b"   ", b"\t", b"\r", b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}',
                 b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"' + VERSION_KEY.encode()
                 + b'":Infinity}}}', b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":-Infinity}}',
                 b'\xef\xbb\xbf{"jsonrpc":"2.0","id":3,"method":"ping"}', b"\x00", b'{"jsonrpc":"2.0"\x00}',
                 b'{"method":"notifications/cancelled","params":{"requestId":' + b"[" * 50000,
                 b'{"jsonrpc":"2.0","id":4,"method":"ping","params":' + b'{"a":' * 20000,
                 b"[" * 100000, b"{\"a\":" * 3000 + b"1" + b"}" * 3000]
        if rng.random() < 0.4:
            return rng.choice(fixed)
        message, _ = self.request()
        raw = serialize(message, rng)
        roll = rng.random()
        if roll < 0.5 and len(raw) > 2:
            raw = raw[:rng.randrange(1, len(raw) - 1)]                # cut short
        else:
            at = rng.randrange(len(raw))
            raw = raw[:at] + rng.choice([b"{", b"}", b"]", b"\"", b",", b":", b"'", b"\\"]) + raw[at:]
        try:
            strict_loads(raw)
        except (ValueError, RecursionError):
            return raw
        return rng.choice(fixed)                     # the damage happened to leave valid JSON: use a known bad line

    def bad_utf8(self):
        rng = self.rng
        message, _ = self.request()
        raw = serialize(message, rng, ascii_only=False)
        bad = rng.choice([b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82",
                          b"\xf4\x90\x80\x80", b"\xc3"])
        at = rng.randrange(len(raw) + 1)
        return raw[:at] + bad + raw[at:]

    def deep_frame(self):
        rng = self.rng
        depth = rng.choice((100, 300, 400))
        options = [
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "ping", "params": {"x": deep(depth)}}, None),
            ({"jsonrpc": "2.0", "id": deep(depth), "method": "ping"}, None),
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "tools/call",
              "params": {"name": "kv_store_get", "arguments": {"app_handle": self.handle, "key": deep(depth)}}}, IS_ERROR),
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "tools/call",
              "params": {"name": "list_contexts", "arguments": {"application": deep(depth)}}}, IS_ERROR),
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "tools/call",
              "params": {"name": "call", "arguments": {"app_handle": self.handle, "method": "get",
                                                      "args": {"key": deep(depth)}}}}, IS_ERROR),
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "tools/call",
              "params": {"name": "node_status", "arguments": deep(depth, kind="list")}}, None),
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "tools/list",
              "params": {"_meta": {VERSION_KEY: deep(depth)}}}, None),
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "tools/list", "params": {"cursor": deep(depth)}}, None),
            ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": deep(depth)}}, None),
            ({"jsonrpc": "2.0", "id": self.fresh_id(), "method": "resources/read", "params": {"uri": deep(depth)}},
             None),
        ]
        return rng.choice(options)


def serialize(message, rng, ascii_only=None):
    ascii_only = rng.random() < 0.5 if ascii_only is None else ascii_only
    separators = rng.choice([(",", ":"), (", ", ": "), (",", ": ")])
    try:
        raw = json.dumps(message, ensure_ascii=ascii_only, separators=separators).encode("utf-8")
    except UnicodeEncodeError:                       # a lone surrogate: only its \\u escape is JSON
        raw = json.dumps(message, separators=separators).encode("ascii")
    if rng.random() < 0.05:
        raw = rng.choice([b" ", b"\t", b"  "]) + raw + rng.choice([b" ", b"\r", b"\t"])
    return raw


def huge_frames(gen):
    """A few lines of 1-2.5 MB: they must be read whole and answered like any other."""
    rng = gen.rng
    return [
        ({"jsonrpc": "2.0", "id": gen.fresh_id(), "method": "ping", "params": {"blob": "a" * 2000000}}, None),
        ({"jsonrpc": "2.0", "id": gen.fresh_id(), "method": "tools/call",
          "params": {"name": "x" * 1500000, "arguments": {}}}, None),
        ({"jsonrpc": "2.0", "id": "i" * 1000000, "method": "tools/list"}, None),
        ({"jsonrpc": "2.0", "id": gen.fresh_id(), "method": "tools/call",
          "params": {"name": "kv_store_get", "arguments": {"app_handle": gen.handle, "key": [1] * 400000}}},
         IS_ERROR),
        b"[" + b"1," * rng.randint(900000, 1200000),
    ]


def generate(gen, count, batch_share):
    """(raw line, [(id, outcome)]) for `count` frames; the model's state advances in wire order."""
    rng = gen.rng
    frames = []
    huge = huge_frames(gen) if batch_share < 0.5 else []
    huge_at = sorted(rng.sample(range(count), len(huge)))
    kinds = [("request", 55), ("notification", 8), ("stray", 3), ("no_method", 3), ("non_object", 2),
             ("garbage", 8), ("bad_utf8", 3), ("deep", 2), ("batch", 6)]
    if batch_share >= 0.5:
        kinds = [("batch", 85), ("request", 10), ("notification", 3), ("garbage", 2)]
    names, weights = zip(*kinds)
    for index in range(count):
        if huge and index == huge_at[0]:
            huge_at.pop(0)
            item = huge.pop(0)
            kind = "huge"
        else:
            kind = rng.choices(names, weights)[0]
            item = {"request": gen.request, "notification": gen.notification, "stray": gen.stray_response,
                    "no_method": gen.no_method, "non_object": gen.non_object, "garbage": gen.garbage,
                    "bad_utf8": gen.bad_utf8, "deep": gen.deep_frame, "batch": gen.batch}[kind]()
        if isinstance(item, bytes):
            raw, parsed = item, None
        else:
            raw, parsed = serialize(item[0], rng), item
        raw = raw.replace(b"\n", b"")                # one frame is one line
        due, batch = expect_frame(raw, parsed, gen.state)
        frames.append((raw, due, kind, batch))
    return frames


# ── the driver ────────────────────────────────────────────────────────────────────────────────────

class Ledger:
    """Every answer owed, matched against every answer read; an extra or missing one fails the test."""

    def __init__(self):
        self.owed = {}                               # id key -> (outcome, frame index, group)
        self.answered = set()
        self.nulls_owed = Counter()
        self.nulls_seen = Counter()
        self.frames = []

    def owe(self, frames):
        for raw, due, kind, batch in frames:
            index = len(self.frames)
            self.frames.append((raw, kind))
            group = index if batch else None
            for request_id, outcome in due:
                if request_id is None:
                    self.nulls_owed[outcome[1]] += 1
                    continue
                key = json.dumps(request_id)
                if key in self.owed:
                    fail("generator bug: id %s used twice" % key[:80])
                self.owed[key] = (outcome, index, group)

    def describe(self, index):
        raw, kind = self.frames[index]
        return "%s frame #%d: %r" % (kind, index, raw[:300])

    def take(self, frame):
        if isinstance(frame, list):
            if not frame:
                fail("an empty batch answer")
            groups = set()
            for item in frame:
                groups.add(self.take_one(item, in_batch=True))
            groups.discard("null")
            if len(groups) > 1 or None in groups:
                fail("one batch answer mixes frames: %r" % (json.dumps(frame)[:500],))
        else:
            self.take_one(frame, in_batch=False)

    def take_one(self, reply, in_batch):
        if not isinstance(reply, dict) or reply.get("jsonrpc") != "2.0":
            fail("not a JSON-RPC message on stdout: %r" % (json.dumps(reply)[:300],))
        if "id" not in reply:
            if not isinstance(reply.get("method"), str) or in_batch:
                fail("a frame that is neither a response nor a notification: %r" % (json.dumps(reply)[:300],))
            return "notification"
        if ("result" in reply) == ("error" in reply):
            fail("a response needs exactly one of result and error: %r" % (json.dumps(reply)[:300],))
        if "error" in reply:
            error = reply["error"]
            if not isinstance(error, dict) or not isinstance(error.get("code"), int) \
                    or not isinstance(error.get("message"), str):
                fail("malformed error object: %r" % (json.dumps(reply)[:300],))
        if reply["id"] is None:
            if "error" not in reply:
                fail("a result with a null id: %r" % (json.dumps(reply)[:300],))
            code = reply["error"]["code"]
            self.nulls_seen[code] += 1
            if self.nulls_seen[code] > self.nulls_owed[code]:
                fail("more id-null errors %d than owed (%d owed, %d seen so far): %r"
                     % (code, self.nulls_owed[code], self.nulls_seen[code], json.dumps(reply)[:300]))
            return "null"
        key = json.dumps(reply["id"])
        if key not in self.owed:
            fail("an answer for id %s, which no request had (or of another type): %r"
                 % (key[:80], json.dumps(reply)[:300]))
        if key in self.answered:
            fail("a second answer for id %s: %r" % (key[:80], json.dumps(reply)[:300]))
        self.answered.add(key)
        outcome, index, group = self.owed[key]
        if in_batch != (group is not None):
            fail("%s answered %s a batch answer" % (self.describe(index), "inside" if in_batch else "outside"))
        check_outcome(reply, outcome, self.describe(index))
        return group

    def settled(self):
        return len(self.answered) == len(self.owed) and self.nulls_seen == self.nulls_owed

    def missing(self):
        unanswered = [k for k in self.owed if k not in self.answered][:5]
        return "unanswered: %s; id-null errors owed %s, seen %s" % (
            "; ".join(self.describe(self.owed[k][1]) for k in unanswered) or "none",
            dict(self.nulls_owed), dict(self.nulls_seen))


def check_outcome(reply, outcome, where):
    kind = outcome[0]
    if kind == "error":
        if reply.get("error", {}).get("code") != outcome[1]:
            fail("%s\nexpected error %d, got %r" % (where, outcome[1], json.dumps(reply)[:400]))
    elif "result" not in reply:
        fail("%s\nexpected a result, got %r" % (where, json.dumps(reply)[:400]))
    elif kind == "tool":
        result = reply["result"]
        if not isinstance(result, dict) or not isinstance(result.get("content"), list):
            fail("%s\nnot a CallToolResult: %r" % (where, json.dumps(reply)[:400]))
        if (result.get("isError") is True) != (outcome[1] == IS_ERROR):
            fail("%s\nexpected %s, got %r" % (where, outcome[1], json.dumps(reply)[:600]))


def pump(server, frames, ledger):
    """Send in chunks, pipelined; after each chunk read until everything owed so far has arrived."""
    for start in range(0, len(frames), CHUNK):
        chunk = frames[start:start + CHUNK]
        ledger.owe(chunk)
        server.proc.stdin.write(b"".join(frame[0] + b"\n" for frame in chunk))
        server.proc.stdin.flush()
        deadline = time.monotonic() + CHUNK_TIMEOUT
        while not ledger.settled():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                fail("the server stopped answering after frame %d; %s\nstderr:\n%s"
                     % (start + len(chunk), ledger.missing(), server.stderr[-3000:]))
            try:
                frame = server.read(min(remaining, 5.0))
            except AssertionError as error:
                if "no frame from the server" in str(error):
                    continue
                fail(str(error)[:2000])
            if frame is None:
                fail("the server exited (code %s); %s\nstderr:\n%s"
                     % (server.proc.poll(), ledger.missing(), server.stderr[-3000:]))
            ledger.take(frame)


def finish(server, ledger, barrier_id):
    """A last request answered in order proves nothing else is still on its way; then the checks."""
    server.send({"jsonrpc": "2.0", "id": barrier_id, "method": "tools/list"})
    deadline = time.monotonic() + CHUNK_TIMEOUT
    while True:
        frame = server.read(max(0.1, deadline - time.monotonic()))
        if frame is None:
            fail("the server exited at the end; stderr:\n%s" % server.stderr[-3000:])
        if isinstance(frame, dict) and frame.get("id") == barrier_id:
            break
        ledger.take(frame)
    if not ledger.settled():
        fail("after the last frame: %s" % ledger.missing())
    if server.proc.poll() is not None:
        fail("the server exited with %s" % server.proc.returncode)
    server.assert_stdout_pure()
    for line in server.raw_lines:
        try:
            strict_loads(line)
        except ValueError as error:
            fail("stdout carried a line that is not strict JSON (%s): %r" % (error, line[:300]))
    if "Traceback" in server.stderr:
        fail("a traceback on stderr:\n%s" % server.stderr[-4000:])


# ── the test ──────────────────────────────────────────────────────────────────────────────────────

def prepare(start_server, env, opening):
    """A server with the catalog loaded; the session's app_handle, guide uri and fixed tool schemas."""
    server = start_server(env, initialize=None)
    if opening == "discover":
        server.result("server/discover", {"_meta": MODERN_META})
    else:
        server.initialize(opening)
    deadline = time.monotonic() + 30
    while True:
        tools = server.result("tools/list", {"_meta": MODERN_META})["tools"]
        if any(t["name"] == "kv_store_get" for t in tools):
            break
        if time.monotonic() > deadline:
            fail("the catalog never loaded; stderr:\n%s" % server.stderr)
        time.sleep(0.2)
    selected = server.call_tool("select_app", {"app": "kv-store", "context": "demo"}, meta=MODERN_META)
    handle = selected["structuredContent"]["app_handle"]
    guide_uri = selected["structuredContent"]["guide"]
    generated_prefixes = ("kv_store_", "counter_")
    fixed = {t["name"]: t["inputSchema"] for t in tools if not t["name"].startswith(generated_prefixes)}
    return server, [t["name"] for t in tools], handle, guide_uri, fixed


def test_ten_thousand_adversarial_frames(start_server, server_env):
    rng = random.Random(SEED)
    started = time.monotonic()

    # One server opened with server/discover (so requests also arrive before any initialize), whose era then
    # follows whatever initialize frames the generator sends: batches are refused in every era but 2025-03-26.
    main, tools, handle, guide_uri, fixed = prepare(start_server, server_env, "discover")
    gen = Generator(rng, State(None, tools, guide_uri), fixed, handle)
    frames = generate(gen, MAIN_FRAMES, batch_share=0.0)
    ledger = Ledger()
    pump(main, frames, ledger)
    finish(main, ledger, "barrier-main")

    # A second server negotiated at 2025-03-26, fed mostly batches (no initialize outside them).
    batches, tools, handle, guide_uri, fixed = prepare(start_server, server_env, BATCH_VERSION)
    gen = Generator(rng, State(BATCH_VERSION, tools, guide_uri), fixed, handle, allow_initialize=False)
    batch_frames = generate(gen, BATCH_FRAMES, batch_share=0.9)
    batch_ledger = Ledger()
    pump(batches, batch_frames, batch_ledger)
    finish(batches, batch_ledger, "barrier-batches")

    total = len(frames) + len(batch_frames)
    assert total >= 10000, "seed %d: only %d frames" % (SEED, total)
    answered = len(ledger.answered) + len(batch_ledger.answered)
    nulls = sum(ledger.nulls_seen.values()) + sum(batch_ledger.nulls_seen.values())
    kinds = Counter(frame[2] for frame in frames + batch_frames)
    print("seed %d: %d frames (%s), %d answers by id, %d id-null errors, %.1f s"
          % (SEED, total, dict(kinds), answered, nulls, time.monotonic() - started))
    # The mix must really have exercised every kind of answer.
    outcomes = Counter(o for o, _, _ in ledger.owed.values()) + Counter(o for o, _, _ in batch_ledger.owed.values())
    for wanted in [("error", INVALID_REQUEST), ("error", NOT_FOUND), ("error", INVALID_PARAMS),
                   ("error", UNSUPPORTED_VERSION), ("error", RESOURCE_NOT_FOUND), ("result",), ("tool", OK),
                   ("tool", IS_ERROR)]:
        if wanted not in outcomes:
            fail("the generated mix never produced %r" % (wanted,))
    assert ledger.nulls_owed[PARSE] > 100, "seed %d: too few parse errors were generated" % SEED
