"""Bounded answers: no fixed tool answers more than 60,000 characters of text; the list tools page with a cursor.
Through the real server, against a double holding thousands of rows."""
from __future__ import annotations

import base64
import json

import pytest

from mcp_client import minimal_env
from node_double import NodeDouble, counter_spec, hex_id, kv_store_spec, sample_double

BOUND = 60000
KV = "com.calimero.kv-store"
ROWS = 3000
NAMESPACES = 600            # a namespace row is large, and the double counts each one's contexts


def text_length(result):
    return sum(len(block["text"]) for block in result["content"] if block.get("type") == "text")


def error_text(result):
    assert result.get("isError") is True, result
    return result["content"][-1]["text"]



def crowded_double():
    """The sample node plus 3,000 of everything the list tools list (apps aside: each app is a catalog read)."""
    double = sample_double()
    kv_id = double._app_key(KV)
    namespace = next(iter(double._groups))
    for index in range(ROWS):
        double.add_context(kv_id, context_id=hex_id("context-%d" % index), group_id=namespace)
        double._blobs[hex_id("blob-%d" % index)] = b"x" * (index % 7 + 1)
        double._groups[namespace]["members"][hex_id("member-%d" % index)] = "Member"
    for index in range(NAMESPACES):
        double.add_namespace(kv_id, name="team %d" % index)
    return double, namespace


def listed_ids(double, rows_key, namespace):
    """What the node holds, by the ids the tool lists."""
    if rows_key == "contexts":
        return {c["id"] for c in double._contexts.values()}
    if rows_key == "blobs":
        return set(double._blobs) | set(double._app_blob_ids())
    if rows_key == "namespaces":
        return {g["id"] for g in double._groups.values() if g["parent"] is None}
    return set(double._groups[namespace]["members"])


LISTS = [  # tool, extra arguments, rows key, id key
    ("list_contexts", {}, "contexts", "id"),
    ("list_contexts", {"application": "kv-store", "verbose": True}, "contexts", "id"),
    ("list_blobs", {}, "blobs", "blobId"),
    ("list_namespaces", {}, "namespaces", "namespaceId"),
    ("list_group_members", {"group": None}, "members", "identity"),
]


def pages(server, tool, arguments):
    """Every page of a list, following nextCursor; each result checked against the bound on the way."""
    results, cursor = [], None
    while True:
        result = server.call_tool(tool, dict(arguments, cursor=cursor) if cursor else arguments, timeout=60)
        assert not result.get("isError"), result
        assert text_length(result) <= BOUND
        results.append(result)
        cursor = result["structuredContent"].get("nextCursor")
        if cursor is None:
            return results
        assert len(results) < 100, "paging does not end"


@pytest.fixture(scope="module")
def crowded():
    double, namespace = crowded_double()
    double.start()
    yield double, namespace
    double.stop()


@pytest.mark.parametrize("tool,extra,rows_key,id_key", LISTS, ids=[t[0] + str(len(t[1])) for t in LISTS])
def test_a_long_list_comes_in_pages_holding_every_row_once(start_server, tmp_path, crowded, tool, extra, rows_key,
                                                           id_key):
    double, namespace = crowded
    server = start_server(minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url,
                                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state"}))
    arguments = {key: (namespace if value is None else value) for key, value in extra.items()}
    results = pages(server, tool, arguments)
    assert len(results) > 2
    seen = []
    for number, result in enumerate(results):
        page = result["structuredContent"]
        assert json.loads(result["content"][0]["text"]) == page     # the text block and structuredContent agree
        seen += [row[id_key] for row in page[rows_key]]
        last = number == len(results) - 1
        assert ("nextCursor" in page) is not last
        if not last:
            line = result["content"][1]["text"]
            assert len(result["content"]) == 2 and "\n" not in line
            assert line.startswith("%s %d-%d of " % (rows_key.capitalize(), len(seen) - len(page[rows_key]) + 1,
                                                     len(seen)))
            assert ('call %s again with the same arguments and cursor "%s"' % (tool, page["nextCursor"])) in line
        else:
            assert len(result["content"]) == 1
    assert len(seen) == len(set(seen)) and set(seen) == listed_ids(double, rows_key, namespace)
    assert len(seen) >= NAMESPACES


def test_a_page_is_filled_close_to_the_bound(start_server, tmp_path, crowded):
    double, _ = crowded
    server = start_server(minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url,
                                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state"}))
    first = server.call_tool("list_contexts", {"verbose": True}, timeout=60)
    rows = first["structuredContent"]["contexts"]
    assert BOUND - 2000 < text_length(first) <= BOUND, text_length(first)   # one more row would not fit
    assert len(rows) > 20


def test_small_answers_are_unchanged(server, double):
    for tool, arguments, rows_key in [("list_contexts", {}, "contexts"), ("list_blobs", {}, "blobs"),
                                      ("list_namespaces", {}, "namespaces"), ("list_applications", {}, "apps")]:
        result = server.call_tool(tool, arguments)
        assert len(result["content"]) == 1 and not result.get("isError")
        # list_contexts says what its versions mean beside its rows, list_namespaces what memberCount counts
        said = {"list_contexts": {"versions"}, "list_namespaces": {"countsNote"}}.get(tool, set())
        assert set(result["structuredContent"]) == {rows_key} | said
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
        assert result["content"][0]["text"] == json.dumps(result["structuredContent"], indent=2, ensure_ascii=False)


def test_the_cursor_is_advertised_briefly(server):
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    for name in ("list_applications", "list_contexts", "list_namespaces", "list_blobs", "list_group_members"):
        cursor = tools[name]["inputSchema"]["properties"]["cursor"]
        assert cursor["type"] == "string" and len(cursor["description"]) <= 40
        assert "cursor" not in tools[name]["inputSchema"].get("required", [])


def cursor_of(server, tool, arguments):
    result = server.call_tool(tool, arguments, timeout=60)
    return result["structuredContent"]["nextCursor"]


def test_bad_cursors_are_refused_naming_them(start_server, tmp_path, crowded):
    double, _ = crowded
    server = start_server(minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url,
                                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state"}))
    plain = cursor_of(server, "list_contexts", {})
    forged = base64.urlsafe_b64encode(b'{"offset": 3}').decode().rstrip("=")
    for cursor in ("not a cursor!", forged, "", "e30"):
        text = error_text(server.call_tool("list_contexts", {"cursor": cursor}))
        assert text == ('Error: Invalid cursor "%s": it is no nextCursor of list_contexts. Omit cursor for the '
                        'first page.' % cursor)
    other = 'Error: Invalid cursor "%s": it continues a %s call with other arguments.'
    for tool, arguments in [("list_contexts", {"verbose": True}), ("list_contexts", {"application": "kv-store"}),
                            ("list_blobs", {}), ("list_namespaces", {})]:
        text = error_text(server.call_tool(tool, dict(arguments, cursor=plain)))
        assert text.startswith(other % (plain, tool)), text
    long = "A" * 500
    text = error_text(server.call_tool("list_blobs", {"cursor": long}))
    assert ('"%s..."' % long[:200]) in text and long not in text          # quoted, but not whole
    assert not error_text(server.call_tool("list_blobs", {"cursor": 7})).startswith("Error: Invalid cursor")


def test_a_cursor_resumes_after_its_last_row_when_rows_come_and_go(serve):
    double = NodeDouble(apps=[kv_store_spec()])
    for index in range(ROWS):
        double._blobs[hex_id("blob-%d" % index)] = b"y"
    server = serve(double)
    first = server.call_tool("list_blobs", timeout=60)["structuredContent"]
    shown = [b["blobId"] for b in first["blobs"]]
    with double._lock:                   # before the cursor: one row leaves, another arrives
        del double._blobs[shown[0]]
        del double._blobs[shown[1]]
        double._blobs[hex_id("late arrival")] = b"z"
    rest = [b["blobId"] for result in pages(server, "list_blobs", {"cursor": first["nextCursor"]})
            for b in result["structuredContent"]["blobs"]]
    assert not set(rest) & set(shown)
    listed_now = [b["blobId"] for result in pages(server, "list_blobs", {})
                  for b in result["structuredContent"]["blobs"]]
    assert rest == listed_now[listed_now.index(shown[-1]) + 1:]            # nothing after the cursor missed


def big_icon_app(index, icon_size):
    return {"package": "com.example.big%d" % index, "version": "1.0.0", "signer_id": "signer-big",
            "metadata": {"name": "Big %d" % index, "icon": "data:image/png;base64," + "A" * icon_size},
            "abi": counter_spec()["abi"]}


def test_verbose_applications_page_and_an_oversized_row_is_cut_saying_so(serve):
    double = NodeDouble(apps=[kv_store_spec()] + [big_icon_app(i, 9000) for i in range(12)]
                        + [big_icon_app(99, 200000)])
    server = serve(double)
    compact = server.call_tool("list_applications")
    assert len(compact["content"]) == 1 and len(compact["structuredContent"]["apps"]) == 14
    results = pages(server, "list_applications", {"verbose": True})
    rows = [row for result in results for row in result["structuredContent"]["apps"]]
    assert len(results) > 1 and len(rows) == 14 and len({row["id"] for row in rows}) == 14
    huge = next(row for row in rows if row["package"] == "com.example.big99")
    icon = huge["metadata"]["icon"]
    assert icon.endswith("... [cut: %d characters in all, too long for one answer]" % (200000 + 22))
    assert len(icon) < 1000
    whole = next(row for row in rows if row["package"] == "com.example.big3")["metadata"]["icon"]
    assert len(whole) == 9000 + 22                                         # rows that fit are never cut


# ── The other fixed tools stay within the bound too ────────────────────────────────────────────────

def huge_app(methods, guide_size, name_length=12):
    """An app whose ABI and guide are each far beyond one answer."""
    manifest = {"schema_version": "wasm-abi/1", "types": {}, "methods": [
        {"name": "m%04d_%s" % (index, "x" * name_length), "doc": "Method %d. " % index + "Does a thing. " * 8,
         "params": [{"name": "value", "type": {"kind": "string"}, "doc": "The value."}],
         "returns": {"kind": "string"}} for index in range(methods)]}
    guide = "# Huge\n\n## Procedure: start\n" + "A line of the guide.\n" * (guide_size // 21)
    return {"package": "com.example.huge", "version": "1.0.0", "signer_id": "signer-h",
            "metadata": {"name": "Huge", "guide": guide}, "abi": manifest}


def huge_env(tmp_path, double):
    """The server's environment beside a huge app: only kv-store gets generated tools (the huge one would be
    1,500), so describe_app and select_app are what reach it."""
    return minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_APPS": "kv-store",
                                           "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})


def summary_of(result):
    return json.loads(result["content"][0]["text"])


def test_describe_app_of_a_huge_abi_and_guide_fits(start_server, tmp_path):
    double = NodeDouble(apps=[kv_store_spec(), huge_app(1500, 100000)]).start()
    try:
        server = start_server(huge_env(tmp_path, double))
        for tool, arguments in [("describe_app", {"app": "huge"}), ("select_app", {"app": "huge", "verbose": True})]:
            result = server.call_tool(tool, arguments, timeout=60)
            assert not result.get("isError") and text_length(result) <= BOUND, (tool, text_length(result))
            summary = summary_of(result)
            assert summary == result["structuredContent"] and summary["app_handle"]
            kept = summary["methods"]
            assert 100 < len(kept) < 1500 and kept[0].startswith("Method 0.")
            if tool == "select_app":
                assert summary["omitted"] == ("%d of the 1500 methods are left out: one answer carries at most "
                                              "60000 characters. call reaches every method by name."
                                              % (1500 - len(kept)))
            else:                                   # describe_app pages them
                assert summary["omitted"] == (
                    '%d of the 1500 methods are left out: one answer carries at most 60000 characters. For the next '
                    'ones, call describe_app again with the same arguments and cursor "%s"; call reaches every '
                    'method by name.' % (1500 - len(kept), summary["nextCursor"]))
            guide = result["content"][-1]["text"]
            assert guide.startswith("The guide is 10") and "resources/read calimero://apps/" in guide
    finally:
        double.stop()


def test_select_app_names_a_few_of_thousands_of_contexts(start_server, tmp_path, crowded):
    double, _ = crowded
    server = start_server(minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url,
                                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state"}))
    kv_contexts = [c["id"] for c in double._contexts.values()]      # every context there is the kv store's
    result = server.call_tool("select_app", {"app": "kv-store"}, timeout=60)
    assert text_length(result) <= BOUND
    note = result["structuredContent"]["note"]
    assert note.startswith('Application "kv-store" has %d contexts; pass context with one of: ' % len(kv_contexts))
    assert note.endswith(' and %d more (list_contexts with application "kv-store" lists them)'
                         % (len(kv_contexts) - 20))
    assert len(note.split(": ")[1].split(" and ")[0].split(", ")) == 20
    refused = server.call_tool("select_app", {"app": "kv-store", "context": "nope"}, timeout=60)
    assert text_length(refused) <= 3000 and error_text(refused).endswith(
        'and %d more (list_contexts with application "kv-store" lists them)' % (len(kv_contexts) - 20))


def test_a_refusal_carrying_a_huge_guide_fits(serve):
    double = NodeDouble(apps=[huge_app(3, 200000)])
    double.add_context("com.example.huge")
    server = serve(double)
    tool = next(name for name in server.tool_names() if name.startswith("huge_"))
    refused = server.call_tool(tool, {"app_handle": "forged", "value": "v"})
    assert refused.get("isError") is True and text_length(refused) <= BOUND
    assert any("resources/read calimero://apps/" in block.get("text", "") for block in refused["content"])


def test_list_nodes_with_hundreds_of_node_folders_pages_them(serve, tmp_path):
    double = sample_double()
    for index in range(400):
        folder = tmp_path / "nodes" / ("node-%03d-" % index + "n" * 200)
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text('[server]\nlisten = ["/ip4/127.0.0.1/tcp/%d"]\n' % (20000 + index))
    server = serve(double)
    urls, cursor, pages = [], None, 0
    while True:
        result = server.call_tool("list_nodes", {"cursor": cursor} if cursor else {}, timeout=60)
        assert not result.get("isError") and text_length(result) <= BOUND
        page = result["structuredContent"]                  # whole JSON, never cut (issue 43)
        assert json.loads(result["content"][0]["text"]) == page
        urls += [row["url"] for row in page["nodes"]]
        pages += 1
        cursor = page.get("nextCursor")
        if not cursor:
            break
        assert 'call list_nodes again with the same arguments and cursor "%s"' % cursor in result["content"][1]["text"]
    assert pages > 1 and len(urls) == len(set(urls)) >= 400
    assert {"http://localhost:%d" % (20000 + index) for index in range(400)} <= set(urls)


def test_select_app_of_an_app_with_thousands_of_tools_names_those_that_fit(serve):
    double = NodeDouble(apps=[huge_app(2500, 1000, name_length=40)])
    double.add_context("com.example.huge")
    server = serve(double)
    result = server.call_tool("select_app", {"app": "huge"}, timeout=60)
    assert not result.get("isError") and text_length(result) <= BOUND
    summary = result["structuredContent"]
    listed = {name for name in server.tool_names() if name.startswith("huge_")}
    assert 500 < len(summary["tools"]) < 2500 and set(summary["tools"]) <= listed and summary["context"]
    assert summary["omitted"].startswith("%d of the 2500 tools are left out" % (2500 - len(summary["tools"])))


WALKED = {  # rows key: how the double drops one row of that list (as deleting it through the node would)
    "contexts": lambda double, namespace, row_id: double._contexts.pop(row_id),
    "blobs": lambda double, namespace, row_id: double._blobs.pop(row_id, None),
    "namespaces": lambda double, namespace, row_id: double._groups.pop(row_id),
    "members": lambda double, namespace, row_id: double._groups[namespace]["members"].pop(row_id),
}


@pytest.mark.parametrize("tool,extra,rows_key,id_key", [t for t in LISTS if not t[1].get("verbose")],
                         ids=[t[0] for t in LISTS if not t[1].get("verbose")])
def test_a_walk_deleting_each_page_as_it_goes_lists_every_row_once(serve, tool, extra, rows_key, id_key):
    """An agent deleting each page's rows before it asks for the next still sees every row once: the next page
    starts where the deleted rows left off, not as many rows late."""
    double, namespace = crowded_double()
    server = serve(double)
    arguments = {key: (namespace if value is None else value) for key, value in extra.items()}
    with double._lock:
        at_start = listed_ids(double, rows_key, namespace) - {namespace}
    kept = {namespace} | (at_start - {hex_id("member-%d" % index) for index in range(ROWS)}
                          if rows_key == "members" else set())      # the node's own membership stays
    seen, cursor = [], None
    while True:
        result = server.call_tool(tool, dict(arguments, cursor=cursor) if cursor else arguments, timeout=60)
        assert not result.get("isError"), result
        page = result["structuredContent"]
        seen += [row[id_key] for row in page[rows_key]]
        with double._lock:
            for row in page[rows_key]:
                if row[id_key] in at_start - kept:
                    WALKED[rows_key](double, namespace, row[id_key])
        cursor = page.get("nextCursor")
        if cursor is None:
            break
        assert len(seen) < 3 * len(at_start), "paging does not end"
    assert len(seen) == len(set(seen))
    assert at_start <= set(seen), "%d rows never listed" % len(at_start - set(seen))


# ── every answer bounded: an app's result, call_many's errors; "" visible ───────────────────────────────────

def kv_call(method, **args):
    return {"app": "kv-store", "context": "demo", "method": method, "args": args}


def test_an_app_result_past_the_bound_is_an_error_carrying_its_start_and_size(serve):
    double = sample_double()
    server = serve(double)
    big = "".join("%06d" % index for index in range(12000))            # 72,000 characters
    assert not server.call_tool("call", kv_call("set", key="big", value=big)).get("isError")
    assert not server.call_tool("call", kv_call("set", key="small", value="fine")).get("isError")
    handle = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})["structuredContent"]["app_handle"]
    for name, arguments, size in [("call", kv_call("get", key="big"), len(big) + 2),       # both quote strings
                                  ("kv_store_get", {"app_handle": handle, "key": "big"}, len(big) + 2)]:
        result = server.call_tool(name, arguments)
        text = error_text(result)
        assert text.startswith("Error: The result of get is %d characters, more than one answer carries (60000, "
                               "CALIMERO_MCP_MAX_RESULT_CHARS): call a narrower method or pass arguments that "
                               "select less. Its first part:\n" % size), text[:300]
        assert big[:20000] in text and text_length(result) <= BOUND and "structuredContent" not in result
    many = server.call_tool("call_many", {"calls": [kv_call("get", key="big"), kv_call("get", key="small")]})
    items = json.loads(many["content"][0]["text"])
    assert items[0]["ok"] is False and items[0]["error"].startswith("Error: The result of get is 72002 characters")
    demo = double._aliases["context"]["demo"]
    assert items[1] == {"index": 1, "app": "kv-store", "context": "demo", "method": "get", "contextId": demo,
                        "ok": True, "result": "fine"}              # named as given, and where it ran
    assert text_length(many) <= BOUND


def test_an_app_result_is_whole_with_its_line_or_refused_never_cut(serve):
    """The line saying where a call ran counts against the bound: a value that fits only without it is refused,
    never cut by the last guard (which would also drop structuredContent); one that fits with it comes whole."""
    double = sample_double()
    server = serve(double)
    demo = double._aliases["context"]["demo"]
    line = 'get ran in context %s (alias "demo").' % demo
    for size, whole in [(BOUND - len(line) - 2, True), (BOUND - len(line) - 1, False)]:     # 2: a string's quotes
        value = "v" * size
        assert not server.call_tool("call", kv_call("set", key="k", value=value)).get("isError")
        result = server.call_tool("call", kv_call("get", key="k"))
        if whole:
            assert result == {"content": [{"type": "text", "text": '"%s"' % value}, {"type": "text", "text": line}]}
        else:
            assert error_text(result).startswith("Error: The result of get is %d characters" % (size + 2))


def test_the_result_bound_is_configurable_and_0_lifts_it(serve):
    double = sample_double()
    server = serve(double, CALIMERO_MCP_MAX_RESULT_CHARS="0")
    big = "y" * 70000
    server.call_tool("call", kv_call("set", key="big", value=big))
    ran = {"type": "text", "text": 'get ran in context %s (alias "demo").' % double._aliases["context"]["demo"]}
    assert server.call_tool("call", kv_call("get", key="big")) == {"content": [{"type": "text", "text": '"%s"' % big},
                                                                             ran]}
    server = serve(double, CALIMERO_MCP_MAX_RESULT_CHARS="100")
    assert error_text(server.call_tool("call", kv_call("get", key="big"))).startswith(
        "Error: The result of get is 70002 characters, more than one answer carries (100, ")      # quoted
    assert server.call_tool("list_contexts")["structuredContent"]["contexts"]       # list pages keep their own
    server = serve(double, CALIMERO_MCP_MAX_RESULT_CHARS="lots")
    assert not server.call_tool("call", kv_call("get", key="missing")).get("isError")
    assert ('CALIMERO_MCP_MAX_RESULT_CHARS="lots" is not a number of characters (0 for no bound); using 60000'
            in server.stderr)


def test_call_many_of_long_errors_stays_within_the_bound(serve):
    """call_many of 32 items with long errors stays within the bound: each error is cut to its share."""
    double = sample_double()
    server = serve(double)
    long_error = "the app refused: " + "z" * 20000
    double.faults.update({"paths": ["/jsonrpc"], "json": {"jsonrpc": "2.0", "id": 1,
                                                          "error": {"code": -32000, "message": long_error}}})
    many = server.call_tool("call_many", {"calls": [kv_call("len")] * 32}, timeout=60)
    assert text_length(many) <= BOUND, text_length(many)
    items = json.loads(many["content"][0]["text"])
    assert len(items) == 32 and all(not item["ok"] for item in items)
    for item in items:
        assert item["error"].startswith("Error: JSON-RPC error -32000: the app refused: zzz")
        assert item["error"].endswith("... [cut: %d characters in all]" % len("Error: JSON-RPC error -32000: "
                                                                                 + long_error))


def test_an_empty_string_result_is_shown_as_two_quotes(serve):
    """A method returning "" shows as a visible empty string, not as no text: in call, call_many and its tool."""
    double = sample_double()
    server = serve(double)
    assert not server.call_tool("call", kv_call("set", key="blank", value="")).get("isError")
    assert not server.call_tool("call", kv_call("set", key="word", value="raw text")).get("isError")
    ran = {"type": "text", "text": 'get ran in context %s (alias "demo").' % double._aliases["context"]["demo"]}
    assert server.call_tool("call", kv_call("get", key="blank")) == {"content": [{"type": "text", "text": '""'}, ran]}
    assert server.call_tool("call", kv_call("get", key="word")) == {"content": [{"type": "text", "text": '"raw text"'},
                                                                                ran]}
    many = server.call_tool("call_many", {"calls": [kv_call("get", key="blank"), kv_call("get", key="word")]})
    assert '"result": ""' in many["content"][0]["text"]
    named = {"app": "kv-store", "context": "demo", "method": "get", "contextId": double._aliases["context"]["demo"]}
    assert json.loads(many["content"][0]["text"]) == [dict(named, index=0, ok=True, result=""),
                                                      dict(named, index=1, ok=True, result="raw text")]
    handle = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})["structuredContent"]["app_handle"]
    generated = server.call_tool("kv_store_get", {"app_handle": handle, "key": "blank"})
    assert generated["content"] == [{"type": "text", "text": '""'}, {"type": "text", "text": (
        'get ran in context %s (named "demo").' % double._aliases["context"]["demo"])}]  # a handle names no alias


def test_a_cursor_continues_with_arguments_equal_to_their_defaults(start_server, tmp_path, crowded):
    """Page 2 with verbose: false, or an optional as null, continues page 1 without it; verbose: true does not."""
    double, _ = crowded
    server = start_server(minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url,
                                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state"}))
    cursor = cursor_of(server, "list_contexts", {})
    for extra in ({"verbose": False}, {"verbose": None}, {"application": None}):
        result = server.call_tool("list_contexts", dict(extra, cursor=cursor), timeout=60)
        assert not result.get("isError"), (extra, result)
    assert error_text(server.call_tool("list_contexts", {"verbose": True, "cursor": cursor})).startswith(
        'Error: Invalid cursor "%s": it continues a list_contexts call with other arguments.' % cursor)


def test_describe_app_pages_the_methods_of_a_huge_abi(start_server, tmp_path):
    """An app with hundreds of documented methods: describe_app pages them, and its cursor reaches every one."""
    double = NodeDouble(apps=[kv_store_spec(), huge_app(1500, 1000)]).start()
    try:
        server = start_server(huge_env(tmp_path, double))
        seen, cursor, pages_ = [], None, 0
        while True:
            arguments = {"app": "huge"} if cursor is None else {"app": "huge", "cursor": cursor}
            result = server.call_tool("describe_app", arguments, timeout=60)
            assert not result.get("isError") and text_length(result) <= BOUND, result
            summary = result["structuredContent"]
            assert summary.get("methodsFrom", 1) == len(seen) + 1
            seen += summary["methods"]
            pages_ += 1
            cursor = summary.get("nextCursor")
            if cursor is None:
                break
            assert pages_ < 20
        assert pages_ > 1 and len(seen) == 1500 and seen[0].startswith("Method 0.") and seen[-1].startswith(
            "Method 1499.")
        refused = server.call_tool("describe_app", {"app": "kv-store", "cursor": cursor or "e30"})
        assert error_text(refused).startswith('Error: Invalid cursor "e30": it is no nextCursor of describe_app')
    finally:
        double.stop()


def test_select_app_verbose_on_a_huge_abi_keeps_both_notes(serve):
    """The methods' note and the tools' note both stand: neither overwrites the other."""
    double = NodeDouble(apps=[huge_app(2500, 1000, name_length=40)])
    double.add_context("com.example.huge")
    server = serve(double)
    result = server.call_tool("select_app", {"app": "huge", "verbose": True}, timeout=60)
    assert not result.get("isError") and text_length(result) <= BOUND
    omitted = result["structuredContent"]["omitted"]
    assert "of the 2500 methods are left out" in omitted and "of the 2500 tools are left out" in omitted, omitted


# ── every answer bounded by construction (issue 32, item 5) ───────────────────────────────────────

def test_call_many_echoing_long_item_names_stays_within_the_bound(serve):
    server = serve(sample_double())
    long_method = "m" * 100000
    many = server.call_tool("call_many", {"calls": [dict(kv_call("len"), method=long_method)] * 32}, timeout=60)
    assert text_length(many) <= BOUND, text_length(many)
    items = json.loads(many["content"][0]["text"])
    assert len(items) == 32 and all(not item["ok"] for item in items)
    assert all(item["method"].startswith("mmm") and item["method"].endswith("[cut: 100000 characters in all]")
               for item in items)


def test_errors_quoting_a_huge_tool_name_or_uri_stay_short(serve):
    server = serve(sample_double())
    huge = "t" * 1000000
    unknown = server.request("tools/call", {"name": huge, "arguments": {}}, timeout=60)
    assert unknown["error"]["message"].startswith("Unknown tool: ttt") and len(json.dumps(unknown)) < 5000
    missing = server.request("resources/read", {"uri": "calimero://" + huge}, timeout=60)
    assert missing["error"]["message"].startswith("Resource not found: calimero://ttt")
    assert len(json.dumps(missing)) < 10000, len(json.dumps(missing))


def test_a_blobs_huge_mime_header_leaves_the_answer_whole_and_bounded(serve):
    double = sample_double()
    blob = hex_id("a blob with a huge mime type")
    double._blobs[blob] = b"hello"
    double.blob_mime = "text/" + "x" * 60000
    server = serve(double)
    result = server.call_tool("get_blob", {"blob": blob})
    assert not result.get("isError") and text_length(result) <= BOUND, text_length(result)
    page = result["structuredContent"]
    assert (page["content"], page["mimeType"], page["nextOffset"]) == ("hello", None, None)


def test_describe_app_pages_methods_whose_doc_alone_fills_a_page(start_server, tmp_path):
    """Every page holds at least one method (its reference cut in the middle, saying so): the walk ends."""
    app = huge_app(3, 100)
    for method in app["abi"]["methods"]:
        method["doc"] = method["doc"] + "Long. " * 15000
    double = NodeDouble(apps=[kv_store_spec(), app]).start()
    try:
        server = start_server(huge_env(tmp_path, double))
        seen, cursor = [], None
        for _ in range(5):
            arguments = {"app": "huge"} if cursor is None else {"app": "huge", "cursor": cursor}
            result = server.call_tool("describe_app", arguments, timeout=60)
            assert not result.get("isError") and text_length(result) <= BOUND, text_length(result)
            summary = result["structuredContent"]
            assert len(summary["methods"]) == 1, "a page moves on by one method at least"
            seen += summary["methods"]
            cursor = summary.get("nextCursor")
            if cursor is None:
                break
        assert [m.split(".")[0] for m in seen] == ["Method 0", "Method 1", "Method 2"]
        assert all("characters of this method's reference cut: it alone fills a page" in m
                   and m.rstrip().endswith("value: The value.") for m in seen), seen[0][-300:]
    finally:
        double.stop()


def test_describe_group_pages_its_subgroups_with_a_cursor(serve):
    double = sample_double()
    namespace = next(g["id"] for g in double._groups.values() if g["name"] == "demo-team")
    made = {double.add_group(namespace=namespace, name="subgroup %d %s" % (index, "n" * 200), visibility="open")
            for index in range(400)}
    server = serve(double)
    seen, cursor = [], None
    for _ in range(20):
        arguments = {"group": "demo-team"} if cursor is None else {"group": "demo-team", "cursor": cursor}
        result = server.call_tool("describe_group", arguments, timeout=60)
        assert not result.get("isError") and text_length(result) <= BOUND, text_length(result)
        page = result["structuredContent"]
        assert page["groupId"] == namespace and page["kind"] == "namespace"
        seen += [row["groupId"] for row in page["subgroups"]]
        cursor = page.get("nextCursor")
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 400 and set(seen) == made


@pytest.mark.parametrize("depth", [300, 100000], ids=["deeper than answers go", "deeper than the decoder"])
@pytest.mark.parametrize("tool,arguments,path", [
    ("list_blobs", {}, "/admin-api/blobs"), ("list_namespaces", {}, "/admin-api/namespaces"),
    ("list_contexts", {}, "/admin-api/contexts"), ("describe_group", {"group": "demo-team"}, "/admin-api/groups")])
def test_a_node_answering_deeply_nested_json_is_unreadable_never_an_internal_error(serve, depth, tool, arguments,
                                                                                   path):
    double = sample_double()
    server = serve(double)
    assert not server.call_tool("list_namespaces").get("isError")       # names read before the fault
    double.faults.update({"deep": depth, "paths": [path]})
    result = server.call_tool(tool, arguments)
    text = error_text(result)
    assert "Unreadable response from %s%s" % (double.url, path) in text, text
    assert "JSON nested more than 200 levels deep" in text, text
    assert "Traceback" not in server.stderr
