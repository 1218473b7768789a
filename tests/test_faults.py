"""Node faults seen through the real server: every one a clear `isError` (or, for node_status, a result that
reports it) naming the node's url and what to do; never a hang past the node timeout, never a crash; and the
same server recovers when the node does.

The probes: node_status (a result even when the node is down), list_applications (a fixed tool), a generated
method tool (kv_store_len, with an app_handle) and `call`.
"""
from __future__ import annotations

import json
import time

import pytest

NODE_TIMEOUT = 2.0                # CALIMERO_MCP_TIMEOUT for the slow-node case
LONG = 60.0                      # "did not hang" bound for a call that waits on the node timeout


def text_of(result):
    return result["content"][-1]["text"]


def assert_fault(result, url, *wanted):
    """An isError result whose text names the node url and every wanted fragment."""
    assert result.get("isError") is True, result
    text = text_of(result)
    assert text.startswith("Error: "), text
    assert url in text, "the error does not name the node url %s: %s" % (url, text)
    for fragment in wanted:
        assert fragment in text, "%r missing from: %s" % (fragment, text)
    return text


def status_of(server):
    result = server.call_tool("node_status")
    assert not result.get("isError"), "node_status reports a node failure as a result: %r" % result
    return result["structuredContent"]


def catalog_loaded(server):
    deadline = time.monotonic() + 20
    while "kv_store_len" not in server.tool_names():
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.1)


@pytest.fixture
def session(server, double):
    """A server with the catalog loaded and an app_handle for the kv-store's demo context."""
    catalog_loaded(server)
    selected = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})
    return server, selected["structuredContent"]["app_handle"]


def probe_calls(handle):
    return [("list_applications", {}), ("kv_store_len", {"app_handle": handle}),
            ("call", {"app_handle": handle, "method": "len"}),
            ("call", {"app": "kv-store", "context": "demo", "method": "len"})]


def assert_all_work(server, handle):
    for name, arguments in probe_calls(handle):
        result = server.call_tool(name, arguments)
        assert not result.get("isError"), (name, result)
    assert status_of(server)["health"] == {"status": "alive"}


# ── faults the node answers with ──────────────────────────────────────────────────────────────────

RETRY_LOG = "retry, and check its log"
FAULTS = {
    "500 without body": ({"status": 500, "body": ""},
                         ["HTTP 500 Internal Server Error from", "the node returned no message", RETRY_LOG]),
    "500 with body": ({"status": 500, "body": "boom: disk full"},
                      ["HTTP 500 Internal Server Error from", "the node said: boom: disk full", RETRY_LOG]),
    "503 not yet": ({"status": 503}, ["cannot be resolved", "not ready for this yet (HTTP 503)",
                                      "retry in a few seconds"]),
    "503 without body": ({"status": 503, "body": ""},
                         ["HTTP 503 Service Unavailable", "retry in a few seconds"]),
    "garbage body": ({"garbage": True}, ["Unreadable response from", "not valid JSON", "Retry",
                                         "is a Calimero node"]),
    "truncated body": ({"truncated": True}, ["Unreadable response from", "the connection closed mid-response",
                                             "Retry"]),
    "connection reset": ({"reset": True}, ["Cannot reach the node at", "the connection was reset",
                                           "Start the node at"]),
    "closed without answer": ({"down": True}, ["Cannot reach the node at", "closed the connection without "
                                               "answering", "Start the node at"]),
}

# node_status's health.status per fault: "error" when the node answered with an HTTP status (a 5xx), "unreachable"
# when no status came back: the connection failed, or what came was no answer that can be read (a 200 whose body is
# not JSON, a body cut off): NodeError.status is None for those.
HEALTH = {"500 without body": "error", "500 with body": "error", "503 not yet": "error", "503 without body": "error",
          "garbage body": "unreachable", "truncated body": "unreachable", "connection reset": "unreachable",
          "closed without answer": "unreachable"}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_node_fault_on_every_route(session, double, name):
    server, handle = session
    fault, wanted = FAULTS[name]
    double.faults.update(fault)
    status = status_of(server)
    assert status["url"] == double.url
    assert status["health"]["status"] == HEALTH[name], status
    assert wanted[1] in status["health"]["error"] or wanted[0] in status["health"]["error"], status
    for tool, arguments in probe_calls(handle):
        assert_fault(server.call_tool(tool, arguments), double.url, *wanted)
    double.faults.clear()
    assert_all_work(server, handle)                # the same process recovers with the node


@pytest.mark.parametrize("name", ["500 without body", "503 not yet", "garbage body", "truncated body",
                                  "connection reset"])
def test_node_fault_while_executing(session, double, name):
    """Admission passes, then the method call itself (POST /jsonrpc) fails: same clarity, nothing half-done."""
    server, handle = session
    fault, wanted = FAULTS[name]
    if name in ("truncated body", "connection reset"):     # sent, then no (whole) answer: it may have run
        wanted = [wanted[1], "The node may have carried it out: check before repeating it"]
    double.faults.update(dict(fault, paths=["/jsonrpc"]))
    for tool, arguments in probe_calls(handle)[1:]:
        text = assert_fault(server.call_tool(tool, arguments), double.url, *wanted)
        if text.startswith(("Error: Unreadable", "Error: HTTP")):
            assert "/jsonrpc" in text, text
    many = server.call_tool("call_many", {"calls": [{"app_handle": handle, "method": "len"}] * 3})
    items = json.loads(text_of(many))
    assert not many.get("isError") and [item["ok"] for item in items] == [False] * 3, many
    assert all(double.url in item["error"] for item in items if "authority" not in item["error"]), items
    double.faults.clear()
    assert_all_work(server, handle)


def test_the_nodes_own_words_stay_verbatim(session, double):
    """A 500 whose JSON body carries the node's message shows that message alone (reference §6)."""
    server, handle = session
    double.faults.update({"status": 500, "json": {"error": "store exploded"}})
    result = server.call_tool("list_applications")
    assert result == {"content": [{"type": "text", "text": "Error: store exploded"}], "isError": True}
    double.faults.clear()
    assert_all_work(server, handle)


def test_a_fault_that_heals_by_itself(session, double):
    server, handle = session
    double.faults.update({"reset": True, "times": 1})
    assert_fault(server.call_tool("list_applications"), double.url, "the connection was reset")
    assert_all_work(server, handle)


# ── the node goes away ────────────────────────────────────────────────────────────────────────────

def test_node_down_at_start_then_started_on_the_same_port(start_server, server_env, double):
    double.stop()                                  # the port is known, nothing listens on it
    server = start_server(server_env)
    deadline = time.monotonic() + 20
    while "app list unavailable at connect" not in server.stderr:
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.05)
    status = status_of(server)
    assert status["url"] == double.url and status["health"]["status"] == "unreachable"
    assert "connection refused" in status["health"]["error"] and double.url in status["health"]["error"]
    assert_fault(server.call_tool("list_applications"), double.url, "connection refused", "Start the node at")
    assert_fault(server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"}),
                 double.url, "connection refused")
    assert_fault(server.call_tool("select_app", {"app": "kv-store"}), double.url, "connection refused")
    names = server.tool_names()
    assert "node_status" in names and not any(n.startswith("kv_store_") for n in names)

    double.start()                                 # same object, same port
    assert status_of(server)["health"] == {"status": "alive"}
    apps = server.tool_json("list_applications")["apps"]
    assert [a["package"] for a in apps] == ["com.calimero.kv-store", "com.example.counter"]
    assert server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"})["content"][0] \
        == {"type": "text", "text": "0"}
    # The catalog recovers: the first app tool to meet the app reads it again and announces the change.
    selected = server.call_tool("select_app", {"app": "kv-store"})
    assert not selected.get("isError"), selected
    handle = selected["structuredContent"]["app_handle"]
    assert "kv_store_len" in selected["structuredContent"]["tools"]
    deadline = time.monotonic() + 10
    while not any(n.get("method") == "notifications/tools/list_changed" for n in server.notifications):
        assert time.monotonic() < deadline, "no tools/list_changed after the catalog recovered"
        server.request("ping")
    assert {"kv_store_len", "counter_value"} <= set(server.tool_names())
    assert server.call_tool("kv_store_len", {"app_handle": handle})["structuredContent"] == {"result": 0}


def test_node_killed_mid_session_and_restarted(session, double):
    server, handle = session
    assert not server.call_tool("kv_store_set", {"app_handle": handle, "key": "k", "value": "v"}).get("isError")
    double.stop()
    status = status_of(server)
    assert status["health"]["status"] == "unreachable" and double.url in status["health"]["error"]
    for tool, arguments in probe_calls(handle):
        assert_fault(server.call_tool(tool, arguments), double.url, "Cannot reach the node at", "Start the node at")
    assert_fault(server.call_tool("kv_store_set", {"app_handle": handle, "key": "k", "value": "w"}), double.url)
    assert "kv_store_get" in server.tool_names()   # the catalog keeps what it knew
    double.start()
    assert_all_work(server, handle)
    got = server.call_tool("kv_store_get", {"app_handle": handle, "key": "k"})   # the old handle still works
    assert got["structuredContent"] == {"result": "v"}, got
    context_id = server.tool_json("lookup_alias", {"name": "demo"})["contextId"]
    assert double.kv_state(context_id) == {"k": "v"}      # the write tried while the node was down never landed
    assert server.proc.poll() is None


def test_node_slower_than_the_timeout(start_server, server_env, double):
    """CALIMERO_MCP_TIMEOUT bounds every node request: the call fails then, and the server goes on."""
    server = start_server(dict(server_env, CALIMERO_MCP_TIMEOUT=str(NODE_TIMEOUT)))
    catalog_loaded(server)
    handle = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})["structuredContent"]["app_handle"]
    double.faults.update({"delay": NODE_TIMEOUT + 1.5, "paths": ["/admin-api/applications"], "times": 1})
    server.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                 "params": {"name": "list_applications", "arguments": {}}})
    deadline = time.monotonic() + 5
    while not double.requests_to("GET", "/admin-api/applications"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.send({"jsonrpc": "2.0", "id": "alive", "method": "ping"})
    first = server.read(LONG)
    assert first == {"jsonrpc": "2.0", "id": "alive", "result": {}}, "ping waited behind the slow call"
    reply = server.wait_for("slow", LONG)
    text = assert_fault(reply["result"], double.url, "Cannot reach the node at", "timed out after 2 s",
                        "did not answer in time", "retry")
    assert "Start the node" not in text             # it is running: starting it is not the advice
    assert_all_work(server, handle)


# ── an output too deep to decode ─────────────────────────────────────────────────────────────────

DEEP = 100000                    # far past Python's JSON decoder (its recursion limit, 1000 by default)


@pytest.mark.parametrize("name,arguments", [
    ("kv_store_entries", {}), ("call", {"method": "entries"})])
def test_output_nested_deeper_than_the_decoder_allows_is_an_error_naming_the_method(session, double, name,
                                                                                   arguments):
    server, handle = session
    double.faults.update({"paths": ["/jsonrpc"], "times": 1, "raw": '{"jsonrpc":"2.0","id":1,"result":'
                          '{"output":%s%s}}' % ("[" * DEEP, "]" * DEEP)})
    result = server.call_tool(name, dict(arguments, app_handle=handle))
    assert result.get("isError") is True, result
    assert text_of(result) == ("Error: entries ran, but its output is nested too deeply to decode (more levels "
                               "than Python's JSON decoder allows)")
    assert "Traceback" not in server.stderr
    assert_all_work(server, handle)


def test_a_too_deep_output_fails_only_its_call_many_item(session, double):
    server, handle = session
    double.faults.update({"paths": ["/jsonrpc"], "times": 1, "raw": '{"jsonrpc":"2.0","id":1,"result":'
                          '{"output":%s%s}}' % ("[" * DEEP, "]" * DEEP)})
    items = json.loads(text_of(server.call_tool("call_many", {"calls": [{"app_handle": handle, "method": "entries"}]})))
    assert items == [{"index": 0, "method": "entries", "ok": False,     # named as given
                      "error": "Error: entries ran, but its output is nested too deeply to decode (more levels "
                               "than Python's JSON decoder allows)"}]
# ── answers of the wrong shape: an error naming the request, never an empty or made-up result ─────

SURPRISE = {"json": {"data": "surprise"}}


def unexpected(request_line, expected, body='{"data":"surprise"}'):
    return "Error: The node answered %s with an unexpected body (expected %s): %s" % (request_line, expected, body)


def ids_of(double):
    kv = double._app_key("com.calimero.kv-store")
    namespace = next(g for g in double._groups.values() if g["parent"] is None)["id"]
    context = next(iter(double._contexts))
    return {"kv": kv, "ns": namespace, "ctx": context}


WRONG_READS = [   # (tool, arguments, the request that gets the surprise, what its answer should have been)
    ("list_applications", {}, "GET /admin-api/applications", 'an object with an "apps" list'),
    ("list_namespaces", {}, "GET /admin-api/namespaces", "a list"),
    ("list_contexts", {}, "GET /admin-api/contexts", 'an object with a "contexts" list'),
    ("list_contexts", {"application": "kv-store"}, "GET /admin-api/contexts/for-application/{kv}",
     'an object with a "contexts" list'),
    ("list_blobs", {}, "GET /admin-api/blobs", 'an object with a "blobs" list'),
    ("list_group_members", {"group": "{ns}"}, "GET /admin-api/groups/{ns}/members", 'an object with a "members" list'),
    ("lookup_alias", {"name": "demo"}, "POST /admin-api/alias/lookup/context/demo",
     'an object with a "value" string or null'),
    ("select_app", {"app": "kv-store"}, "GET /admin-api/contexts/for-application/{kv}",
     'an object with a "contexts" list'),
    ("describe_app", {"app": "kv-store"}, "GET /admin-api/contexts/for-application/{kv}",
     'an object with a "contexts" list'),
    ("list_contexts", {}, "GET /admin-api/alias/list/context",
     'an object mapping each alias to its context id, or a list of {"alias", "value"} rows'),
    ("list_group_members", {"group": "some-name"}, "GET /admin-api/namespaces/{ns}/groups", "a list"),
]


@pytest.mark.parametrize("tool, arguments, request_line, expected", WRONG_READS,
                         ids=["%s %s" % (w[0], sorted(w[1])) for w in WRONG_READS])
def test_a_wrong_shaped_answer_is_an_error_not_an_empty_result(session, double, tool, arguments, request_line,
                                                               expected):
    server, handle = session
    ids = ids_of(double)
    request_line = request_line.format(**ids)
    arguments = {key: value.format(**ids) for key, value in arguments.items()}
    double.faults.update(dict(SURPRISE, paths=[request_line.split(" ", 1)[1]]))
    result = server.call_tool(tool, arguments)
    assert result.get("isError") is True, result
    text = text_of(result)
    assert text.startswith(unexpected(request_line, expected)), text
    assert "check that %s is a Calimero node" % double.url in text
    double.faults.clear()
    assert_all_work(server, handle)


@pytest.mark.parametrize("tool, arguments, path, answer, request_line, expected", [
    ("upload_blob", {"data": "aGVsbG8="}, "/admin-api/blobs", {"data": {"blob_id": None, "size": 5}},
     "PUT /admin-api/blobs", 'an object with a "blob_id" string'),
    ("delete_blob", {"blob": "ab" * 32}, "/admin-api/blobs/", {"blob_id": None, "deleted": True},
     "DELETE /admin-api/blobs/" + "ab" * 32, 'an object with a "blob_id" string'),
    ("create_group", {"namespace": "{ns}"}, "/admin-api/namespaces/{ns}/groups", {"data": {"groupId": None}},
     "POST /admin-api/namespaces/{ns}/groups", 'an object with a "groupId" string'),
])
def test_a_null_id_is_never_reported_as_success(session, double, tool, arguments, path, answer, request_line,
                                                expected):
    server, handle = session
    ids = ids_of(double)
    arguments = {key: value.format(**ids) for key, value in arguments.items()}
    double.faults.update({"json": answer, "paths": [path.format(**ids)]})
    result = server.call_tool(tool, arguments)
    assert result.get("isError") is True, result
    text = text_of(result)
    assert text.startswith(unexpected(request_line.format(**ids), expected, json.dumps(answer, separators=(",", ":"))))
    assert "The node may have carried it out anyway: check before repeating it." in text


def test_an_app_record_answered_as_null_reads_as_absent(start_server, server_env, double):
    """core's GET /applications/:id carries `application: Option<Application>`: older releases answered an id
    they had just dropped with `{"application": null}` (200), not a 404. That app is then one without a record,
    not a failure of every list."""
    double.list_services = False                                 # so the server asks each app's own record
    kv = ids_of(double)["kv"]
    double.faults.update({"json": {"data": {"application": None}}, "paths": ["/admin-api/applications/" + kv],
                          "exact": True})
    server = start_server(server_env)
    result = server.call_tool("list_applications")
    assert not result.get("isError"), result
    assert kv in [row["id"] for row in result["structuredContent"]["apps"]]
    assert double.requests_to("GET", "/admin-api/applications/" + kv)


def test_create_group_with_parent_says_what_came_back_when_the_id_is_missing(session, double):
    """The group exists, but the node's answer lacks its id: an isError the agent can act on, not -32603."""
    server, _ = session
    parent = ids_of(double)["ns"]
    create = double._h_create_group

    def created_without_an_id(request):
        create(request)
        return {"data": {"created": True}}
    double._h_create_group = created_without_an_id
    before = len(double._groups)
    result = server.call_tool("create_group", {"namespace": parent, "parent": parent, "visibility": "open"})
    assert result.get("isError") is True, result
    assert text_of(result).startswith(unexpected("POST /admin-api/groups", 'an object with a "groupId" string',
                                                 '{"data":{"created":true}}'))
    assert "may have carried it out anyway" in text_of(result)
    assert len(double._groups) == before + 1
    assert double.requests_to("PUT") == []                     # no visibility call for a group of unknown id


def test_select_app_with_a_context_lacking_its_id(session, double):
    server, handle = session
    kv = ids_of(double)["kv"]
    answer = {"data": {"contexts": [{"applicationId": kv, "name": "no id"}]}}
    double.faults.update({"json": answer, "paths": ["/admin-api/contexts/for-application/"]})
    result = server.call_tool("select_app", {"app": "kv-store"})
    assert result.get("isError") is True, result
    assert text_of(result).startswith(unexpected(
        "GET /admin-api/contexts/for-application/" + kv,
        'an object with a "contexts" list of objects, each with an "id" string', json.dumps(answer, separators=(",", ":"))))
    double.faults.clear()
    assert_all_work(server, handle)


@pytest.mark.parametrize("read", ["context", "application"])
def test_app_calls_report_a_wrong_shaped_read_instead_of_sending_the_agent_to_select_app(session, double, read):
    """Admission reads the context and the app record live: a wrong shape is the node's fault, and a refusal
    ("call select_app and retry") would loop the agent back to select_app for ever."""
    server, handle = session
    ids = ids_of(double)
    path = "/admin-api/contexts/%s" % ids["ctx"] if read == "context" else "/admin-api/applications/%s" % ids["kv"]
    double.faults.update(dict(SURPRISE, paths=[path]))
    calls = [("kv_store_len", {"app_handle": handle}), ("call", {"app_handle": handle, "method": "len"})]
    if read == "context":
        calls.append(("call", {"app": "kv-store", "context": ids["ctx"], "method": "len"}))
    for tool, arguments in calls:
        result = server.call_tool(tool, arguments)
        assert result.get("isError") is True, (tool, result)
        assert text_of(result).startswith("Error: The node answered GET %s with an unexpected body" % path), result
        assert "select_app" not in text_of(result)
    double.faults.clear()
    assert_all_work(server, handle)


def test_set_group_metadata_never_erases_the_name_it_could_not_read(session, double):
    server, _ = session
    group = double.add_group(namespace=ids_of(double)["ns"], metadata={"name": "keep me", "data": {"a": "1"}})
    path = "/admin-api/groups/%s/metadata" % group
    double.faults.update(dict(SURPRISE, paths=[path], times=1))         # only the read: the write would succeed
    result = server.call_tool("set_group_metadata", {"group": group, "data": {"b": "2"}})
    assert result.get("isError") is True, result
    assert text_of(result).startswith(unexpected("GET " + path, "an object or null"))
    assert double.requests_to("PUT", path) == [] and double._groups[group]["metadata"]["name"] == "keep me"
    done = server.call_tool("set_group_metadata", {"group": group, "data": {"b": "2"}})
    assert not done.get("isError") and double._groups[group]["metadata"]["name"] == "keep me"
    assert double._groups[group]["metadata"]["data"] == {"b": "2"}


# ── fields the server relies on, of the wrong type: the node's error, never -32603 or a wrong refusal ─

def with_field(record, dotted, value):
    """A copy of a node record with one (dotted) field replaced."""
    import copy
    record = copy.deepcopy(record)
    *parents, last = dotted.split(".")
    inner = record
    for key in parents:
        inner = inner[key]
    inner[last] = value
    return record


def assert_unexpected(result, request_line, expected):
    assert result.get("isError") is True, result
    assert text_of(result).startswith("Error: The node answered %s with an unexpected body (expected %s): "
                                      % (request_line, expected)), text_of(result)


APP_FIELDS = [("package", 42, '"package" a string where given'), ("version", True, '"version" a string where given'),
              ("signer_id", ["x"], '"signer_id" a string where given'), ("blob", "b", '"blob" an object where given'),
              ("blob.bytecode", {"x": 1}, '"blob.bytecode" a string where given'),
              ("services", ["api"], '"services" an object where given')]


@pytest.mark.parametrize("field, value, said", APP_FIELDS, ids=[f[0] for f in APP_FIELDS])
def test_an_app_record_with_a_wrong_typed_field_is_the_nodes_error(session, double, field, value, said):
    server, handle = session
    kv = ids_of(double)["kv"]
    listed = double._h_list_applications(None)["data"]["apps"]
    answer = {"data": {"apps": [with_field(listed[0], field, value)] + listed[1:]}}
    double.faults.update({"json": answer, "paths": ["/admin-api/applications"], "exact": True})
    for tool, arguments in [("list_applications", {}), ("select_app", {"app": "kv-store"}),
                            ("describe_app", {"app": "kv-store"}), ("call", {"app": "kv-store", "context": "demo",
                                                                             "method": "len"})]:
        assert_unexpected(server.call_tool(tool, arguments), "GET /admin-api/applications",
                          'an object with an "apps" list of objects, each with an "id" string and ' + said)
    record = double._h_get_application(type("Request", (), {"params": {"application_id": kv}}))
    path = "/admin-api/applications/" + kv
    double.faults.update({"json": {"data": {"application": with_field(record["data"]["application"], field, value)}},
                          "paths": [path], "exact": True})
    assert_unexpected(server.call_tool("kv_store_len", {"app_handle": handle}), "GET " + path,
                      'an object whose "application" is an object with an "id" string and ' + said)
    assert "Traceback" not in server.stderr
    double.faults.clear()
    assert_all_work(server, handle)


def test_a_context_record_with_a_wrong_typed_field_is_the_nodes_error(session, double):
    """A service name that is no string crashed describe_app and select_app; an application id that is no string
    told the agent its context "does not belong" to its own app."""
    server, handle = session
    ids = ids_of(double)
    path = "/admin-api/contexts/for-application/" + ids["kv"]
    double.faults.update({"json": {"data": {"contexts": [{"id": ids["ctx"], "applicationId": ids["kv"],
                                                          "serviceName": ["api"]}]}}, "paths": [path]})
    for tool in ("describe_app", "select_app"):
        assert_unexpected(server.call_tool(tool, {"app": "kv-store"}), "GET " + path,
                          'an object with a "contexts" list of objects, each with an "id" string and "serviceName" a '
                          'string where given')
    path = "/admin-api/contexts/" + ids["ctx"]
    double.faults.update({"json": {"data": {"id": ids["ctx"], "applicationId": 5}}, "paths": [path], "exact": True})
    for tool, arguments in [("call", {"app": "kv-store", "context": ids["ctx"], "method": "len"}),
                            ("kv_store_len", {"app_handle": handle})]:
        result = server.call_tool(tool, arguments)
        assert_unexpected(result, "GET " + path, 'an object with an "id" string and an "applicationId" string')
        assert "does not belong" not in text_of(result) and "select_app" not in text_of(result)
    assert "Traceback" not in server.stderr
    double.faults.clear()
    assert_all_work(server, handle)


def test_dag_heads_of_another_shape_are_listed_as_the_node_sent_them(session, double):
    server, handle = session
    ids = ids_of(double)
    row = {"id": ids["ctx"], "applicationId": ids["kv"], "contextStateHash": "ab" * 32, "dagHeads": 5}
    double.faults.update({"json": {"data": {"contexts": [row]}}, "paths": ["/admin-api/contexts"], "exact": True})
    listed = server.call_tool("list_contexts", {"verbose": True})
    assert not listed.get("isError"), listed
    assert listed["structuredContent"]["contexts"] == [
        # the order: application after its id; a row naming no group and no version has no version story to
        # tell (namespaceVersion and behind, null: not known)
        dict(row, application="com.calimero.kv-store", aliases=["demo"], namespaceVersion=None, behind=None)]
    assert list(listed["structuredContent"]["contexts"][0])[:3] == ["id", "applicationId", "application"]
    assert "Traceback" not in server.stderr


def test_a_group_whose_namespace_id_is_no_string_is_the_nodes_error(session, double):
    """Not "the group is not in that namespace": the node's answer says nothing either way."""
    server, _ = session
    namespace = ids_of(double)["ns"]
    info = double._h_group_info(type("Request", (), {"params": {"group_id": namespace}}))["data"]
    path = "/admin-api/groups/" + namespace
    double.faults.update({"json": {"data": dict(info, namespaceId=7)}, "paths": [path], "exact": True})
    before = len(double._groups)
    result = server.call_tool("create_group", {"namespace": namespace, "parent": namespace})
    assert_unexpected(result, "GET " + path, 'an object with a "targetApplicationId" string and "namespaceId" a string '
                                             'where given')
    assert "is not in namespace" not in text_of(result) and len(double._groups) == before


NO_OUTPUT = {"an empty result": {"jsonrpc": "2.0", "id": 1, "result": {}},
             "a null result": {"jsonrpc": "2.0", "id": 1, "result": None},
             "a string result": {"jsonrpc": "2.0", "id": 1, "result": "done"},
             "neither result nor error": {"jsonrpc": "2.0", "id": 1}}


@pytest.mark.parametrize("name", sorted(NO_OUTPUT))
def test_a_reply_without_an_output_is_an_error_not_a_result(session, double, name):
    server, handle = session
    answer = NO_OUTPUT[name]
    double.faults.update({"json": answer, "paths": ["/jsonrpc"]})
    wanted = ('Error: The node answered POST /jsonrpc with an unexpected body (expected a JSON-RPC reply: a "result" '
              'object with the "output", or an "error"): %s' % json.dumps(answer, separators=(",", ":")))
    for tool, arguments in probe_calls(handle)[1:]:
        text = text_of(server.call_tool(tool, arguments))
        assert text.startswith(wanted) and "may have carried it out anyway" in text, text
    items = json.loads(text_of(server.call_tool("call_many", {"calls": [{"app_handle": handle, "method": "len"}]})))
    assert items[0]["ok"] is False and items[0]["error"].startswith(wanted), items
    double.faults.clear()
    assert_all_work(server, handle)


@pytest.mark.parametrize("answer", [{"data": {}}, {"data": {"invitation": None, "groupName": "demo-team"}},
                                    {"data": {"groupName": "demo-team"}}])
def test_an_invitation_without_its_signature_is_an_error_not_a_result(session, double, answer):
    server, _ = session
    namespace = ids_of(double)["ns"]
    path = "/admin-api/namespaces/%s/invite" % namespace
    double.faults.update({"json": answer, "paths": [path]})
    assert_unexpected(server.call_tool("invite_to_namespace", {"namespace": namespace}), "POST " + path,
                      'a signed invitation: an object with "inviter_signature", bare or as its "invitation"')
    double.faults.clear()
    invited = server.tool_json("invite_to_namespace", {"namespace": namespace})
    assert "inviter_signature" in invited["invitation"]


@pytest.mark.parametrize("answer", [{}, {"data": {}}, {"data": {"memberIdentity": "x"}}])
def test_a_join_answered_without_its_namespace_is_an_error_not_a_result(session, double, answer):
    server, _ = session
    namespace = ids_of(double)["ns"]
    invitation = server.tool_json("invite_to_namespace", {"namespace": namespace})
    path = "/admin-api/namespaces/%s/join" % namespace
    double.faults.update({"json": answer, "paths": [path], "times": 1})
    result = server.call_tool("join_namespace", {"namespace": namespace, "invitation": invitation})
    assert_unexpected(result, "POST " + path, 'an object with a "namespaceId" string')
    assert "may have carried it out anyway" in text_of(result)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_number_json_has_not_is_an_unreadable_answer_not_a_null(session, double, constant):
    """Python's decoder reads NaN; passed on, it came out as null in structuredContent and as NaN in the text."""
    server, handle = session
    double.faults.update({"paths": ["/jsonrpc"], "raw": '{"jsonrpc":"2.0","id":1,"result":{"output":[1,%s]}}'
                          % constant})
    for tool, arguments in probe_calls(handle)[1:]:
        assert_fault(server.call_tool(tool, arguments), double.url, "Unreadable response from", "not valid JSON")
    double.faults.update({"paths": ["/admin-api/namespaces"], "raw": '{"data":[{"namespaceId":"%s","memberCount":%s}]}'
                          % (ids_of(double)["ns"], constant)})
    assert_fault(server.call_tool("list_namespaces"), double.url, "Unreadable response from", "not valid JSON")
    double.faults.clear()
    assert_all_work(server, handle)


def strict_json(line):
    """A stdout line parsed as JSON is written: NaN and Infinity refused (Python's json reads them)."""
    def refuse(constant):
        raise AssertionError("%s on stdout: %r" % (constant, line))
    return json.loads(line, parse_constant=refuse)


def test_a_number_past_a_float_is_written_as_null_on_the_wire(session, double):
    """1e400 is a JSON number the decoder turns into inf (no NaN or Infinity to refuse): the frame that carries it
    still is JSON, the number written null (mero_mcp.finite)."""
    server, handle = session
    double.faults.update({"paths": ["/jsonrpc"], "raw": '{"jsonrpc":"2.0","id":1,"result":{"output":[1,1e400]}}'})
    seen = len(server.raw_lines)
    result = server.call_tool("kv_store_len", {"app_handle": handle})
    assert result["structuredContent"] == {"result": [1, None]}, result
    frames = [strict_json(line) for line in server.raw_lines[seen:]]
    assert [frame["result"]["structuredContent"] for frame in frames] == [{"result": [1, None]}]
    double.faults.clear()
    assert_all_work(server, handle)


# ── a failed catalog re-read keeps the catalog ────────────────────────────────────────────────────

def app_tools(server):
    return sorted(name for name in server.tool_names() if name.startswith(("kv_store_", "counter_", "bell_")))


def list_changes(server):
    server.request("ping")                       # every notification sent before the answer has been read
    return [n for n in server.notifications if n.get("method", "").endswith("/list_changed")]


def refresh_failures(server):
    return [line for line in server.stderr_lines if "app list refresh failed" in line]


REFRESH_FAILED = ('app list refresh failed: The node answered GET /admin-api/applications with an unexpected body '
                  '(expected an object with an "apps" list): {"data":"surprise"} (the current app tools stay)\n')


def test_a_failed_catalog_reread_keeps_the_tools_and_announces_nothing(start_server, server_env, double):
    """After install_application and on a catalog miss; the next good read goes on as usual. (The 30 s poll:
    the next test.)"""
    from node_double import counter_spec
    bell = dict(counter_spec(), package="com.example.bell", version="1.0.0")
    double.registry["com.example.bell@1.0.0"] = bell
    server = start_server(server_env)
    catalog_loaded(server)
    tools, changes = app_tools(server), len(list_changes(server))

    # 1. install_application: the install succeeds, the re-read after it does not
    double.faults.update(dict(SURPRISE, paths=["/admin-api/applications"]))
    installed = server.tool_json("install_application", {"coords": "com.example.bell@1.0.0"})
    assert (installed["applicationId"], installed["tools"]) == (double._app_key("com.example.bell"), 0)
    assert app_tools(server) == tools and len(list_changes(server)) == changes
    assert refresh_failures(server) == ["[mero-mcp] " + REFRESH_FAILED]

    # 2. a catalog miss (describe_app meets the new app): the list reads well, then the re-read does not
    double.faults.clear()
    read_abi = double._h_get_abi

    def then_break_the_list(request):
        double.faults.update(dict(SURPRISE, paths=["/admin-api/applications"]))
        return read_abi(request)
    double._h_get_abi = then_break_the_list
    described = server.call_tool("describe_app", {"app": "com.example.bell"})
    assert not described.get("isError"), described
    double._h_get_abi = read_abi
    assert app_tools(server) == tools and len(list_changes(server)) == changes
    assert refresh_failures(server) == ["[mero-mcp] " + REFRESH_FAILED] * 2
    assert "Traceback" not in server.stderr

    # 3. the next good read proceeds as usual: the new app's tools arrive, announced once
    double.faults.clear()
    assert not server.call_tool("describe_app", {"app": "com.example.bell"}).get("isError")
    assert len(list_changes(server)) == changes + 1               # tools only: bell brings no guide
    assert set(app_tools(server)) > set(tools) and any(n.startswith("bell_") for n in app_tools(server))


POLL = 0.3                       # the catalog poll's interval here (30 s in the server: POLL_SECONDS)


def test_the_catalog_poll_meeting_a_bad_answer_keeps_the_tools(server_env, double):
    """The poll (every POLL_SECONDS) meets an answer without the apps list: the tools stay and nothing is announced;
    once the node answers well, the poll brings an app installed meanwhile, announced once."""
    from mcp_client import tuned_server
    from node_double import counter_spec
    server = tuned_server(server_env, "import mero_apps\nmero_apps.POLL_SECONDS = %r" % POLL,
                          check="hasattr(__import__('mero_apps'), 'POLL_SECONDS')")
    try:
        server.initialize()
        catalog_loaded(server)
        tools, changes = app_tools(server), len(list_changes(server))
        double.faults.update(dict(SURPRISE, paths=["/admin-api/applications"]))
        deadline = time.monotonic() + 20
        while len(refresh_failures(server)) < 2:                  # two polls, each failing
            assert time.monotonic() < deadline, "no poll within 20 s: %s" % server.stderr
            time.sleep(0.05)
        assert set(refresh_failures(server)) == {"[mero-mcp] " + REFRESH_FAILED}
        assert app_tools(server) == tools and len(list_changes(server)) == changes
        double.add_app(dict(counter_spec(), package="com.example.bell", version="1.0.0"))
        double.faults.clear()
        server.wait_notification(lambda n: n.get("method") == "notifications/tools/list_changed", timeout=20)
        assert any(n.startswith("bell_") for n in app_tools(server)) and set(app_tools(server)) > set(tools)
        assert len(list_changes(server)) == changes + 1              # tools only: bell brings no guide
        assert "Traceback" not in server.stderr
    finally:
        server.close()
    server.assert_stdout_pure()


# ── --check: a Calimero node, or something else answering HTTP ────────────────────────────────────

def run_check(server_env):
    from mcp_client import SERVER
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(SERVER), "--check"], env=server_env, capture_output=True, text=True,
                          timeout=LONG)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


NOT_A_NODE = {
    "html page": {"garbage": True},
    "a list": {"json": [1, 2, 3]},
    "json of another service": {"json": {"data": {"status": "alive", "service": "something else"}}},
    "apps holding non-objects": {"json": {"data": {"apps": [1, "two", None]}}, "paths": ["/admin-api/applications"]},
    "apps holding records without ids": {"json": {"data": {"apps": [{"name": "x"}]}},
                                         "paths": ["/admin-api/applications"]},
    "404 everywhere": {"status": 404, "body": "<html><h1>Not Found</h1></html>"},
    "plain text": {"status": 200, "body": "hello from nginx"},
}


@pytest.mark.parametrize("name", sorted(NOT_A_NODE))
def test_check_tells_a_calimero_node_from_another_http_server(server_env, double, name):
    double.faults.update(NOT_A_NODE[name])
    done = run_check(server_env)
    assert done.returncode == 1, done.stdout
    assert "  - %s answers HTTP but is not a Calimero node: " % double.url in done.stdout, done.stdout
    assert "Fix: Point CALIMERO_NODE_URL at a Calimero node (merod)" in done.stdout
    assert "OK, the server can work" not in done.stdout


def test_check_against_a_static_web_server(server_env, tmp_path):
    import functools
    import http.server
    import threading
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<h1>hi</h1>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    handler.log_message = lambda *args: None
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d" % web.server_address[1]
        done = run_check(dict(server_env, CALIMERO_NODE_URL=url))
    finally:
        web.shutdown()
        web.server_close()
    assert done.returncode == 1 and "%s answers HTTP but is not a Calimero node" % url in done.stdout, done.stdout


def test_check_still_passes_a_healthy_node(server_env, double):
    done = run_check(server_env)
    assert done.returncode == 0 and "Result:    OK, the server can work with this node." in done.stdout, done.stdout


# ── a node that drips, a node that floods, a write that went out and got no answer ────────────────────────

DRIP = 0.3                       # seconds between bytes: far inside any idle timeout, far too slow for an answer


def peak_memory_kb(server):
    """The server process's high-water resident memory (Linux)."""
    with open("/proc/%d/status" % server.proc.pid, encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def test_a_node_dripping_its_answer_is_cut_off_at_the_deadline(start_server, server_env, double):
    """CALIMERO_MCP_TIMEOUT is the whole request, connect to last byte: a byte every 0.3 s never trips an idle
    timeout of 1.5 s, and held the call (and every later one) until the node finished (minutes)."""
    server = start_server(dict(server_env, CALIMERO_MCP_TIMEOUT="1.5"))
    assert not server.call_tool("list_applications").get("isError")
    double.faults.update({"drip": DRIP, "paths": ["/admin-api/applications"], "times": 1})
    started = time.monotonic()
    result = server.call_tool("list_applications", timeout=LONG)
    took = time.monotonic() - started
    assert_fault(result, double.url, "Cannot reach the node at", "timed out after 1.5 s", "retry")
    assert took < 1.5 + 2, took          # a deadline: 1.5 s, 2 s margin (the drip alone would take minutes)
    assert not server.call_tool("list_applications").get("isError")     # later requests are answered


def test_check_ends_against_a_dripping_node(double, tmp_path):
    from mcp_client import minimal_env, run_check
    double.faults.update({"drip": DRIP})
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_TIMEOUT": "1",
                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})
    started = time.monotonic()
    done = run_check(env, timeout=30)
    assert time.monotonic() - started < 15    # a deadline: 1 s each request; 14 s margin
    assert "timed out after 1 s" in done.stdout, done.stdout


HUGE = 200 * 1024 * 1024


def faulted_read_cut(double, before):
    """Whether the server stopped reading the faulted answer: the one request since `before` the double could not
    write whole (the server may read the apps again meanwhile, so the last request need not be the faulted one)."""
    since = double.requests_to("GET", "/admin-api/applications")[before:]
    return any(entry.get("cut") for entry in since)


def wait_until_answered(double):
    """Until the double has written (or given up writing) every answer."""
    deadline = time.monotonic() + LONG
    while double.unanswered():
        assert time.monotonic() < deadline, double.unanswered()
        time.sleep(0.02)


def test_an_answer_declared_past_the_size_cap_is_refused_unread(start_server, server_env, double):
    """A 200 MB answer took the server to 1.24 GB: one past the cap (64 MiB) is refused by its Content-Length."""
    server = start_server(server_env)
    assert not server.call_tool("list_applications").get("isError")
    before = len(double.requests_to("GET", "/admin-api/applications"))
    double.faults.update({"huge": HUGE, "paths": ["/admin-api/applications"], "times": 1})
    assert_fault(server.call_tool("list_applications", timeout=LONG), double.url,
                 "is %d bytes (its Content-Length), more than this server reads (%d bytes, "
                 "CALIMERO_MCP_MAX_RESPONSE_BYTES): refused, the rest unread" % (HUGE, 64 << 20),
                 "Ask for less", "raise CALIMERO_MCP_MAX_RESPONSE_BYTES")
    wait_until_answered(double)
    assert faulted_read_cut(double, before), "the server read it all"
    assert peak_memory_kb(server) < 150 * 1024
    assert not server.call_tool("list_applications").get("isError")
    wait_until_answered(double)
    assert "cut" not in double.requests_to("GET", "/admin-api/applications")[-1]     # a whole answer is read


def test_an_undeclared_answer_is_cut_at_the_configured_cap(start_server, server_env, double):
    server = start_server(dict(server_env, CALIMERO_MCP_MAX_RESPONSE_BYTES="1048576"))
    assert not server.call_tool("list_applications").get("isError")
    before = len(double.requests_to("GET", "/admin-api/applications"))
    double.faults.update({"huge": HUGE, "declared": False, "paths": ["/admin-api/applications"], "times": 1})
    assert_fault(server.call_tool("list_applications", timeout=LONG), double.url,
                 "passed 1048576 bytes before it ended, more than this server reads (1048576 bytes")
    wait_until_answered(double)
    assert faulted_read_cut(double, before), "the server read it all"
    assert peak_memory_kb(server) < 150 * 1024
    assert not server.call_tool("list_applications").get("isError")


def test_a_bad_size_cap_is_said_and_the_default_used(start_server, server_env, double):
    server = start_server(dict(server_env, CALIMERO_MCP_MAX_RESPONSE_BYTES="lots"))
    assert not server.call_tool("list_applications").get("isError")
    said = 'CALIMERO_MCP_MAX_RESPONSE_BYTES="lots" is not a positive number of bytes; using 67108864'
    assert said in server.stderr
    from mcp_client import run_check
    assert said in run_check(dict(server_env, CALIMERO_MCP_MAX_RESPONSE_BYTES="lots")).stdout


@pytest.fixture
def counter(double):
    namespace = next(iter(double._groups))
    context_id = double.add_context(double._app_key("com.example.counter"), group_id=namespace)
    return context_id


def counter_value(server, context_id):
    result = server.call_tool("call", {"app": "counter", "context": context_id, "method": "value"})
    assert result["content"][1]["text"] == "value ran in context %s." % context_id, result
    return json.loads(result["content"][0]["text"])


def test_a_write_sent_and_unanswered_says_it_may_have_run(start_server, server_env, double, counter):
    """The node applied the increment and its answer never came: "Cannot reach the node … retry" applied it
    twice. A request that went out says it may have been carried out, and to check before repeating it."""
    server = start_server(dict(server_env, CALIMERO_MCP_TIMEOUT="1"))
    assert counter_value(server, counter) == 0
    double.faults.update({"drip": DRIP, "paths": ["/jsonrpc"], "times": 1})
    result = server.call_tool("call", {"app": "counter", "context": counter, "method": "increment",
                                       "args": {"by": 1}}, timeout=LONG)
    text = assert_fault(result, double.url, "was sent, but no answer came (no answer within 1 s)",
                        "The node may have carried it out: check before repeating it")
    assert "Cannot reach" not in text and "retry" not in text.lower()
    assert counter_value(server, counter) == 1              # it had run: the advice was true


def test_a_write_that_never_left_says_cannot_reach(start_server, server_env, double, counter):
    server = start_server(server_env)
    assert counter_value(server, counter) == 0
    double.stop()
    result = server.call_tool("create_namespace", {"application": "counter"})
    assert_fault(result, double.url, "Cannot reach the node at", "connection refused", "Start the node at")
