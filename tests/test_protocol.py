"""The MCP protocol core over stdio: framing, JSON-RPC rules, both eras (mcp-protocol.md §1-§10)."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time

import pytest

from mcp_client import MODERN_META, ROOT, SERVER, McpServer, minimal_env
from node_double import NodeDouble

MODERN = MODERN_META
# reference-behaviour.md's instructions, with what stands in for a handle said where the flow says "every app tool
# call" (issue 42): the critical part, so it comes first.
FLOW = ("Calimero apps describe themselves. Do not read app source. To use an app: list_applications, then "
        "describe_app to plan or select_app to act, then pass the returned app_handle on every app tool call, or "
        "_context (the context to act in) instead of one.")
INSTRUCTIONS_LIMIT = 2048        # Claude Code cuts longer instructions, silently


@pytest.fixture
def offline_env(tmp_path):
    """A server whose node is nowhere: the protocol must not care."""
    return minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": "http://127.0.0.1:9",
                                           "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})


@pytest.fixture
def bare(start_server, offline_env):
    return start_server(offline_env, initialize=None)


# ── handshake era ─────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("requested,expected", [
    ("2024-11-05", "2024-11-05"), ("2025-03-26", "2025-03-26"), ("2025-06-18", "2025-06-18"),
    ("2025-11-25", "2025-11-25"), ("1999-01-01", "2025-11-25"), (None, "2025-11-25")])
def test_initialize_negotiates_version(bare, requested, expected):
    result = bare.result("initialize", {"protocolVersion": requested, "capabilities": {"extensions": {"x": {}}}})
    assert result["protocolVersion"] == expected
    assert result["serverInfo"]["name"] == "mero-mcp"
    assert isinstance(result["serverInfo"]["version"], str) and result["serverInfo"]["version"]
    assert result["capabilities"] == {"tools": {"listChanged": True}, "resources": {"listChanged": True}}
    assert result["instructions"].startswith(FLOW + "\n")


def test_instructions_carry_the_session(bare):
    """What Claude Code loads before any tool: the flow first, then that call/call_many reach every method when no
    tool shows, how app_handle and _context route, and how apps and contexts are named; within 2,048 characters."""
    text = bare.result("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})["instructions"]
    assert len(text) <= INSTRUCTIONS_LIMIT, len(text)
    lines = text.split("\n")
    assert lines[0] == FLOW
    reach = next(line for line in lines if "call_many" in line)
    assert reach.startswith("call runs any method of any installed app by name")
    assert "even when no tool for it is listed" in reach
    assert "an app installed during this session" in reach and "caps or defers tools" in reach
    # what stands in for a handle is said once, in the flow's own line, so the instructions agree with themselves
    assert [line for line in lines if "_context " in line] == [FLOW]
    assert "A handle's tool runs in the context the handle names; call takes app and context." in lines
    assert any("Name an app by its id, package, last package segment or display name" in line for line in lines)
    assert any("a namespace or group by its id or name" in line for line in lines)
    # the flow's tools are named before anything else
    assert text.index("list_applications") < text.index("select_app") < text.index("call_many")


def test_request_before_initialize_is_answered(bare):
    reply = bare.request("tools/list", timeout=5)
    assert [t["name"] for t in reply["result"]["tools"]][0] == "node_status"


def test_ping_and_initialized_notification(bare):
    bare.initialize()
    assert bare.result("ping") == {}


@pytest.mark.parametrize("request_id", [0, 7, 2 ** 62, "", "abc", "héllo ✓ 雪"])
def test_ids_are_echoed_with_their_type(bare, request_id):
    reply = bare.request("ping", request_id=request_id)
    assert reply["id"] == request_id and type(reply["id"]) is type(request_id)
    assert reply["result"] == {}


@pytest.mark.parametrize("bad_id", [None, 1.5, True, [1], {"a": 1}])
def test_invalid_ids_are_invalid_requests(bare, bad_id):
    bare.send({"jsonrpc": "2.0", "id": bad_id, "method": "ping"})
    reply = bare.read()
    assert reply["id"] is None and reply["error"]["code"] == -32600


def test_notifications_are_never_answered(bare):
    bare.initialize()
    for message in [{"jsonrpc": "2.0", "method": "notifications/unknown"},
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "nonsense"},
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}},
                    {"jsonrpc": "2.0", "method": "tools/call", "params": 5},
                    {"jsonrpc": "2.0", "method": "initialize"}]:
        bare.send(message)
    bare.send({"jsonrpc": "2.0", "id": "after", "method": "ping"})
    assert bare.read() == {"jsonrpc": "2.0", "id": "after", "result": {}}


def test_stray_responses_are_ignored(bare):
    bare.send({"jsonrpc": "2.0", "id": 5, "result": {}})
    bare.send({"jsonrpc": "2.0", "id": "after", "method": "ping"})
    assert bare.read()["id"] == "after"


@pytest.mark.parametrize("raw", [b"not json", b"{\"jsonrpc\": \"2.0\", \"id\": 1,", b"\xff\xfe{}", b"[" * 100000])
def test_parse_errors_have_null_id(bare, raw):
    bare.send_raw(raw)
    reply = bare.read()
    assert reply["id"] is None and reply["error"]["code"] == -32700


@pytest.mark.parametrize("message", [5, "ping", {"id": 1, "method": "ping"}, {"jsonrpc": "1.0", "id": 1},
                                     {"jsonrpc": "2.0", "id": 1}, {"jsonrpc": "2.0", "id": 1, "method": 5}])
def test_non_requests_are_invalid(bare, message):
    bare.send(message)
    reply = bare.read()
    assert reply["error"]["code"] == -32600
    expected_id = message.get("id") if isinstance(message, dict) else None
    assert reply["id"] == expected_id


def test_unknown_method(bare):
    bare.initialize()
    reply = bare.request("prompts/list")
    assert reply["error"]["code"] == -32601 and "prompts/list" in reply["error"]["message"]


@pytest.mark.parametrize("method,params", [
    ("tools/list", [1, 2]), ("tools/call", {"arguments": {}}), ("tools/call", {"name": 5}),
    ("tools/call", {"name": "node_status", "arguments": [1]}), ("tools/call", {"name": "no_such_tool"}),
    ("resources/read", {}), ("tools/list", {"cursor": "abc"})])
def test_invalid_params(bare, method, params):
    bare.initialize()
    reply = bare.request(method, params)
    assert reply["error"]["code"] == -32602, reply


def test_unknown_tool_names_the_tool(bare):
    bare.initialize()
    reply = bare.request("tools/call", {"name": "nope_✓", "arguments": {}})
    assert reply["error"] == {"code": -32602, "message": "Unknown tool: nope_✓"}


def test_internal_error_keeps_traceback_on_stderr(start_server, offline_env):
    boom = ("import sys; sys.path.insert(0, %r); import mero_mcp\n"
            "def boom(*a): raise KeyError('secret detail')\n"
            "mero_mcp.HANDSHAKE_METHODS['ping'] = boom\nsys.exit(mero_mcp.main())" % str(ROOT))
    server = McpServer(offline_env, command=[sys.executable, "-c", boom])
    try:
        reply = server.request("ping")
        assert reply["error"] == {"code": -32603, "message": "Internal error"}
        assert "secret detail" not in json.dumps(reply)
        server.request("tools/list")           # still serving
    finally:
        server.close()
    assert "Traceback" in server.stderr and "secret detail" in server.stderr


# ── batches (2025-03-26 only) ─────────────────────────────────────────────────────────────────────

def test_batches_served_when_2025_03_26_negotiated(bare):
    bare.initialize("2025-03-26")
    bare.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"},
               {"jsonrpc": "2.0", "method": "notifications/initialized"},
               {"jsonrpc": "2.0", "id": "b", "method": "nope"},
               {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {}}])
    replies = bare.read()
    assert isinstance(replies, list) and [r["id"] for r in replies] == [1, "b", 3]
    assert replies[0]["result"] == {}
    assert replies[1]["error"]["code"] == -32601
    assert replies[2]["error"]["code"] == -32600


def test_batch_of_notifications_gets_no_answer(bare):
    bare.initialize("2025-03-26")
    bare.send([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    bare.send({"jsonrpc": "2.0", "id": "after", "method": "ping"})
    assert bare.read()["id"] == "after"


@pytest.mark.parametrize("version", ["2024-11-05", "2025-06-18", "2025-11-25", None])
def test_batches_refused_in_other_versions(bare, version):
    if version:
        bare.initialize(version)
    bare.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    reply = bare.read()
    assert isinstance(reply, dict) and reply["error"]["code"] == -32600 and reply["id"] is None


def test_empty_batch_is_invalid(bare):
    bare.initialize("2025-03-26")
    bare.send([])
    assert bare.read()["error"]["code"] == -32600


# ── modern era (2026-07-28) ───────────────────────────────────────────────────────────────────────

def test_server_discover(bare):
    result = bare.result("server/discover", {"_meta": MODERN})
    assert result["resultType"] == "complete"
    assert result["supportedVersions"][0] == "2026-07-28" and "2025-11-25" in result["supportedVersions"]
    assert result["capabilities"] == {"tools": {"listChanged": True}, "resources": {"listChanged": True}}
    assert result["instructions"].startswith(FLOW + "\n") and len(result["instructions"]) <= INSTRUCTIONS_LIMIT
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mero-mcp"
    # "private" as every list's: the instructions and capabilities describe this user's node, which no shared
    # cache may hand to another (caching.mdx); the ttl is the lists' own, the catalog poll's 30 s.
    assert result["ttlMs"] == 30000 and result["cacheScope"] == "private"


def test_modern_requests_are_stateless_with_cache_hints(bare):
    for method in ("tools/list", "resources/list", "resources/templates/list"):
        result = bare.result(method, {"_meta": MODERN})
        assert result["resultType"] == "complete"
        assert result["ttlMs"] == 30000 and result["cacheScope"] == "private"
    call = bare.result("tools/call", {"name": "node_status", "arguments": {}, "_meta": MODERN})
    assert call["resultType"] == "complete" and "ttlMs" not in call


def test_unsupported_modern_version(bare):
    reply = bare.request("tools/list", {"_meta": dict(MODERN, **{"io.modelcontextprotocol/protocolVersion":
                                                                 "2030-01-01"})})
    assert reply["error"]["code"] == -32022
    assert reply["error"]["data"]["requested"] == "2030-01-01"
    assert "2026-07-28" in reply["error"]["data"]["supported"]


@pytest.mark.parametrize("requested", ["2030-01-01", "2025-11-25", "2024-11-05"])
def test_unsupported_version_lists_only_what_is_served(bare, requested):
    served = bare.result("server/discover", {"_meta": MODERN})["supportedVersions"]
    reply = bare.request("tools/list", {"_meta": dict(MODERN, **{"io.modelcontextprotocol/protocolVersion":
                                                                 requested})})
    error = reply["error"]
    assert error["code"] == -32022 and error["data"]["requested"] == requested
    assert requested not in error["data"]["supported"]
    # only what a per-request call accepts: a handshake version listed there would be refused in turn.
    assert error["data"]["supported"] == ["2026-07-28"] and "2026-07-28" in served
    if requested in served:                  # a handshake version: the message says how to get it
        assert error["message"] == ("Unsupported protocol version: %s is negotiated with initialize, not per "
                                    "request" % requested)
    else:
        assert error["message"] == "Unsupported protocol version"


def test_ping_is_gone_in_the_modern_era(bare):
    assert bare.request("ping", {"_meta": MODERN})["error"]["code"] == -32601


def test_resource_not_found_code_depends_on_era(bare):
    uri = "calimero://apps/%s/1.0.0/guide" % ("0" * 64)
    modern = bare.request("resources/read", {"uri": uri, "_meta": MODERN})
    assert modern["error"]["code"] == -32602
    bare.initialize()
    handshake = bare.request("resources/read", {"uri": uri})
    assert handshake["error"]["code"] == -32002


def test_templates_list_names_the_guide_template(bare):
    bare.initialize()
    templates = bare.result("resources/templates/list")["resourceTemplates"]
    assert templates == [dict(templates[0], uriTemplate="calimero://apps/{applicationId}/{version}/guide",
                              name="app-guide", mimeType="text/markdown")]


# ── process lifecycle and framing ─────────────────────────────────────────────────────────────────

def test_exits_promptly_when_stdin_closes(offline_env):
    server = McpServer(offline_env)
    server.initialize()
    started = time.monotonic()
    assert server.close(timeout=5) == 0
    assert time.monotonic() - started < 1.5   # a deadline: "within a second", 0.5 s margin


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_exit_quietly(offline_env, sig):
    server = McpServer(offline_env)
    server.initialize()
    server.proc.send_signal(sig)
    server.proc.wait(5)
    server.wait_output()                  # stderr read to its end: a traceback would be in it now
    assert "Traceback" not in server.stderr
    assert server.proc.returncode == 0


def test_version_and_help():
    out = subprocess.run([sys.executable, str(SERVER), "--version"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and out.stdout.startswith("mero-mcp ")
    out = subprocess.run([sys.executable, str(SERVER), "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and "--check" in out.stdout
    out = subprocess.run([sys.executable, str(SERVER), "--bogus"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 2 and "--bogus" in out.stderr


def test_utf8_without_locale(bare):
    """Hosts start us with no LANG: non-ASCII must still travel as UTF-8 both ways."""
    bare.initialize()
    reply = bare.request("tools/call", {"name": "outil_été_✓", "arguments": {}})
    assert reply["error"]["message"] == "Unknown tool: outil_été_✓"
    assert any("été".encode("utf-8") in line for line in bare.raw_lines)


def test_logs_go_to_stderr_with_prefix(bare):
    bare.initialize()
    bare.close()
    assert bare.stderr.strip(), "the server says it is ready on stderr"
    assert all(line.startswith("[mero-mcp] ") or line.startswith(" ") or not line.strip()
               for line in bare.stderr_lines)


def test_huge_line_is_refused_and_server_goes_on(bare):
    bare.initialize()
    bare.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * (17 * 1024 * 1024) + b'"}}')
    assert bare.read(30)["error"]["code"] == -32700
    assert bare.result("ping") == {}


def test_one_lock_guards_stdout():
    """Concurrent senders never interleave bytes within a line."""
    sys.path.insert(0, str(ROOT))
    import threading
    import mero_mcp
    sink = io.BytesIO()
    channel = mero_mcp.Channel(sink)
    payload = {"text": "x" * 5000}
    threads = [threading.Thread(target=lambda: [channel.send(payload) for _ in range(50)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = sink.getvalue().split(b"\n")[:-1]
    assert len(lines) == 400 and all(json.loads(line) == payload for line in lines)


def test_initialize_does_not_import_http_or_schema_libraries(tmp_path):
    """Cold start: requests and jsonschema are imported only when first needed (off the answer path)."""
    probe = ("import sys, io; sys.path.insert(0, %r); import mero_mcp\n"
             "server = mero_mcp.Server(mero_mcp.Channel(io.BytesIO()), {})\n"
             "server.handle_message({'jsonrpc': '2.0', 'id': 0, 'method': 'initialize', 'params': {}})\n"
             "print(sorted(m for m in ('requests', 'jsonschema', 'urllib3') if m in sys.modules))" % str(ROOT))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ── node_status, for real against the double ──────────────────────────────────────────────────────

def test_node_status_against_the_double(server, double):
    status = server.tool_json("node_status")
    assert status["url"] == double.url
    assert status["discoverySource"] == "env"
    assert status["authMode"] == "none"
    assert status["nodeName"] is None
    assert "alive" in json.dumps(status["health"])
    assert any(entry["path"] == "/admin-api/health" for entry in double.log)


def test_node_status_reports_an_unreachable_node(bare):
    bare.initialize()
    result = bare.call_tool("node_status")
    assert not result.get("isError")
    status = json.loads(result["content"][0]["text"])
    assert "127.0.0.1:9" in json.dumps(status)


@pytest.mark.parametrize("url, said", [
    ("http://localhost:99999", "has port 99999, which is out of range (1-65535)"),
    ("http://localhost:0", "has port 0, which is out of range (1-65535)"),
    ("http://[::1]:70000/", "has port 70000, which is out of range (1-65535)"),
    ("http://localhost:abc", "has an invalid port (abc)"),
    ("ftp://localhost:2528", "is not an http(s) URL"),
])
def test_a_node_url_with_a_bad_port_is_named_for_it(start_server, offline_env, url, said):
    env = dict(offline_env, CALIMERO_NODE_URL=url)
    server = start_server(env)
    expected = "CALIMERO_NODE_URL (%s) %s" % (url, said)
    status = server.tool_json("node_status")
    assert status["url"] is None and status["health"]["error"].startswith(expected), status
    failed = server.call_tool("list_applications")
    assert failed.get("isError") is True and failed["content"][-1]["text"].startswith("Error: " + expected), failed
    check = subprocess.run([sys.executable, str(SERVER), "--check"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 1, check.stdout
    assert "  - %s\n    Fix: Set CALIMERO_NODE_URL to the node's address, e.g. http://localhost:2528.\n" % expected \
        in check.stdout, check.stdout


def test_lone_surrogate_in_an_id_is_echoed_as_valid_json(bare):
    """JSON may carry a lone surrogate escape; UTF-8 cannot, so the answer escapes it instead of crashing."""
    bare.send_raw(b'{"jsonrpc":"2.0","id":"a\\ud800b","method":"ping"}')
    reply = bare.read()
    assert reply == {"jsonrpc": "2.0", "id": "a\ud800b", "result": {}}
    assert b"\\ud800" in bare.raw_lines[-1]


SURROGATE_CALLS = [   # (tool, raw JSON arguments: a lone surrogate in a URL segment, a body, a key, a nested value;
    #                     where the error says it is; the route it must never reach)
    ("lookup_alias", '{"name":"a\\ud800"}', "name", "/admin-api/alias/lookup"),
    ("join_context", '{"context":"\\udfff"}', "context", "/admin-api/contexts/"),
    ("create_namespace", '{"application":"kv-store","name":"x\\ud800"}', "name", "/admin-api/namespaces"),
    ("set_group_metadata", '{"group":"%s","data":{"k\\udc00":"v"}}' % ("ab" * 32), "data.k\\udc00 (a key)",
     "/admin-api/groups/"),
    ("call", '{"app":"kv-store","context":"demo","method":"set","args":{"key":"\\ud800","value":"v"}}', "args.key",
     "/jsonrpc"),
    ("call_many", '{"calls":[{"app":"kv-store","context":"demo","method":"get","args":{"key":"\\ud800"}}]}',
     "calls.0.args.key", "/jsonrpc"),
]


@pytest.mark.parametrize("tool, arguments, where, route", SURROGATE_CALLS, ids=[c[0] for c in SURROGATE_CALLS])
def test_a_lone_surrogate_in_an_argument_is_refused_naming_it(server, double, tool, arguments, where, route):
    """Half a character can be spelt in JSON but sent in no UTF-8 request: an isError naming the argument, never
    -32603, a traceback, or a request the node would refuse."""
    server.send_raw(('{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"%s","arguments":%s}}'
                     % (tool, arguments)).encode("utf-8"))
    reply = server.wait_for("s")
    assert reply["result"]["isError"] is True, reply
    text = reply["result"]["content"][-1]["text"]
    assert text.startswith("Error: Invalid arguments for %s:\n- %s: holds a lone surrogate (\\u" % (tool, where)), text
    assert "send the character itself" in text
    assert "Traceback" not in server.stderr
    assert double.requests_to(path_prefix=route) == [] and double.handler_errors == []
    assert server.call_tool("lookup_alias", {"name": "demo"}).get("isError") is None


INFINITE_CALLS = [   # (tool, raw JSON arguments holding a number past a 64-bit float, where, the route never reached)
    ("set_group_metadata", '{"group":"%s","data":{"k":[1,-1e400]}}' % ("ab" * 32), "data.k.1", "/admin-api/groups/"),
    ("call_many", '{"calls":[{"app":"kv-store","context":"demo","method":"set","args":{"key":"k","value":1e999}}]}',
     "calls.0.args.value", "/jsonrpc"),
]


@pytest.mark.parametrize("tool, arguments, where, route", INFINITE_CALLS, ids=[c[0] for c in INFINITE_CALLS])
def test_a_number_past_a_64_bit_float_is_refused_naming_it(server, double, tool, arguments, where, route):
    """1e400 is valid JSON but decodes as infinity, which no JSON body can carry: an isError naming where, never a
    request the node would refuse, nor the value sent on as null or Infinity."""
    server.send_raw(('{"jsonrpc":"2.0","id":"f","method":"tools/call","params":{"name":"%s","arguments":%s}}'
                     % (tool, arguments)).encode("utf-8"))
    reply = server.wait_for("f")
    assert reply["result"]["isError"] is True, reply
    assert reply["result"]["content"][-1]["text"] == (
        "Error: Invalid arguments for %s:\n- %s: a number too large for a 64-bit float (at most about 1.8e308), "
        "which the node cannot read" % (tool, where))
    assert double.requests_to(path_prefix=route) == [] and double.handler_errors == []
    assert "Traceback" not in server.stderr


@pytest.mark.parametrize("request_id, ascii_only", [("long", False), ("long\ud800", True)])
def test_a_long_tools_list_is_one_compact_json_line(start_server, server_env, double, request_id, ascii_only):
    """A long list is encoded an item at a time (encode_message, for memory): the line is still the compact JSON of
    the whole answer, in UTF-8; a lone surrogate (here in the id it echoes) still turns the whole line into ASCII."""
    doc = 'Reads one \u2026 "quoted"'
    methods = [{"name": "read_%03d" % i, "doc": doc, "params": [], "returns": {"kind": "string"}, "intent": "read_only"}
               for i in range(120)]
    double.add_app({"package": "com.example.wide", "version": "1.0.0",
                    "abi": {"schema_version": "wasm-abi/1", "types": {}, "methods": methods}})
    server = start_server(server_env)
    deadline = time.monotonic() + 20
    while len([n for n in server.tool_names() if n.startswith("wide_read_")]) < 120:
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.1)
    reply = server.request("tools/list", request_id=request_id)
    line = next(raw for raw in reversed(server.raw_lines) if raw.startswith(b'{"jsonrpc":"2.0","id":"long'))
    assert line == json.dumps(reply, ensure_ascii=ascii_only, separators=(",", ":")).encode("utf-8") + b"\n"
    assert [t["description"] for t in reply["result"]["tools"] if t["name"] == "wide_read_007"] == [
        doc + "\n\n[view] read_007() -> string"]


def test_modern_request_without_client_capabilities_is_invalid(bare):
    reply = bare.request("tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}})
    assert reply["error"]["code"] == -32602 and "clientCapabilities" in reply["error"]["message"]


def test_exits_within_a_second_of_eof_while_a_call_waits_on_the_node(offline_env, double):
    """The client is gone: a call still waiting on a slow node must not keep the process alive."""
    double.faults.update({"delay": 8})
    server = McpServer(dict(offline_env, CALIMERO_NODE_URL=double.url))
    server.initialize()
    server.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                 "params": {"name": "list_namespaces", "arguments": {}}})
    deadline = time.monotonic() + 10
    while not double.requests_to("GET", "/admin-api/namespaces"):      # the call waits on the node now
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.02)
    started = time.monotonic()
    assert server.close(timeout=5) == 0
    assert time.monotonic() - started < 1.5   # a deadline: "within a second" (the node takes 8 s), 0.5 s margin
    server.assert_stdout_pure()


# ── one nesting limit where a line is parsed ──────────────────────────────────────────────────────

def nested_lists(depth):
    value = "x"
    for _ in range(depth):
        value = [value]
    return value


def deep_text(depth):
    """JSON of `depth` nested lists, written out (json.dumps itself gives up past its recursion limit)."""
    return "[" * depth + '"x"' + "]" * depth


@pytest.mark.parametrize("depth", [150, 985, 5000])
def test_a_tools_call_nested_past_the_limit_is_an_error_result_with_its_id(server, depth):
    """~985 levels of arguments answered -32603, and from ~990 a valid frame got -32700 with id null: its client
    waited for an answer that never came."""
    line = ('{"jsonrpc": "2.0", "id": "deep-%d", "method": "tools/call", "params": {"name": "call", "arguments": '
            '{"app": "kv-store", "context": "demo", "method": "set", "args": {"key": "k", "value": %s}}}}'
            % (depth, deep_text(depth)))
    server.send_raw(line.encode())
    reply = server.wait_for("deep-%d" % depth)
    assert reply["result"]["isError"] is True, reply
    assert reply["result"]["content"] == [{"type": "text", "text": (
        "Error: The arguments are nested more than 100 levels deep (the message's own levels included), more "
        "than this server reads. Pass them flatter (at most 100 levels in all).")}]
    assert server.result("ping") == {}
    assert "Traceback" not in server.stderr and "internal error" not in server.stderr


@pytest.mark.parametrize("depth", [120, 3000])
def test_other_frames_nested_past_the_limit_are_answered_by_their_id(server, depth):
    server.send_raw(('{"jsonrpc": "2.0", "method": "tools/list", "id": 77, "params": {"x": %s}}'
                     % deep_text(depth)).encode())
    reply = server.wait_for(77)
    assert reply["error"]["code"] == -32600 and "nested more than 100 levels deep" in reply["error"]["message"]
    server.send_raw(('{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": %s}}'
                     % deep_text(depth)).encode())               # a notification: never answered
    server.send_raw(('{"jsonrpc": "2.0", "id": 78, "result": %s}' % deep_text(depth)).encode())   # a stray answer
    assert server.request("ping", request_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}


def deep_app(depth):
    """An app whose one method takes `rows`, lists nested `depth` deep around a string."""
    rows = {"kind": "string"}
    for _ in range(depth):
        rows = {"kind": "list", "items": rows}
    keep = {"name": "keep", "params": [{"name": "rows", "type": rows}], "returns": {"kind": "unit"},
            "intent": "mutating"}
    return {"package": "com.example.deep", "version": "1.0.0", "signer_id": "did:key:deep", "metadata": {},
            "abi": {"schema_version": "wasm-abi/1", "types": {}, "methods": [keep]}}


def test_a_shallow_frame_is_unchanged(serve):
    """A frame 94 levels deep (the frame, params, arguments, args, then 90 lists) is within the limit of 100: the
    call goes through and the node receives the value as sent."""
    double = NodeDouble(apps=[deep_app(90)])
    app_id = double._app_key("com.example.deep")
    context = double.add_context(app_id, group_id=double.add_namespace(app_id, name="deep"), name="deep")
    server, rows = serve(double), nested_lists(90)
    result = server.call_tool("call", {"app": "com.example.deep", "context": context, "method": "keep",
                                       "args": {"rows": rows}})
    assert not result.get("isError"), result
    assert double.executions == [{"contextId": context, "method": "keep", "argsJson": {"rows": rows}}]

def test_a_forged_cursor_is_refused_naming_it(server):
    import base64
    forged = base64.urlsafe_b64encode(b"[" * 5000).decode()
    for tool in ("list_contexts", "list_blobs", "list_applications"):
        result = server.call_tool(tool, {"cursor": forged})
        assert result["isError"] is True
        assert result["content"][-1]["text"].startswith('Error: Invalid cursor "%s..."' % forged[:200]), result
    shallow = base64.urlsafe_b64encode(b"[" * 700 + b"]" * 700).decode()
    assert server.call_tool("list_contexts", {"cursor": shallow})["isError"] is True


@pytest.mark.parametrize("brackets_in_strings", [False, True])
def test_the_nesting_limit_is_exact_whatever_the_brackets_in_strings(brackets_in_strings):
    """parse_line walks a frame only when its text holds more brackets than the limit: the limit itself is exact
    at 100 levels, and brackets inside strings (counted, never levels) change nothing."""
    sys.path.insert(0, str(ROOT))
    import mero_mcp
    padding = '"' + "[{" * 100 + '"' if brackets_in_strings else '"x"'

    def frame(levels):         # the frame's own object is one level, params another
        return ('{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": %s%s%s}}'
                % ("[" * (levels - 2), padding, "]" * (levels - 2))).encode()
    assert mero_mcp.parse_line(frame(100))["id"] == 1
    with pytest.raises(mero_mcp.TooDeep):
        mero_mcp.parse_line(frame(101))
    assert mero_mcp.parse_line(frame(2) if not brackets_in_strings else b'{"a": "' + b"[" * 500 + b'"}')
