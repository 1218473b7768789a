"""Issue 42 (items 3, 4, 6, 7) and issue 43's list_nodes paging: instructions in one voice, a down node's fix,
answers that settle their question, a watch in one call. Through the real server against the doubles."""
from __future__ import annotations

import json
import threading
import time

from mcp_client import minimal_env, tuned_server
from node_double import kv_store_spec, sample_double

KV = "com.calimero.kv-store"
CREDENTIALS = {"users": {"admin": "dev-password"}}
INSTRUCTIONS_LIMIT = 2048
HANDSHAKE = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}


def answer(result):
    """The JSON a successful result carries (its first block)."""
    assert not result.get("isError"), result
    return json.loads(result["content"][0]["text"])


def write_home(home, name, port):
    (home / name).mkdir(parents=True)
    (home / name / "config.toml").write_text('[server]\nlisten = ["/ip4/127.0.0.1/tcp/%d"]\n' % port)


def rows_by_name(result):
    return {row["name"]: row for row in answer(result)["nodes"]}


# ---- 3. instructions in one voice ----

def test_the_instructions_say_handle_or_context_once_and_fit_with_every_mode_line(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2")
    server = several(("node1", node1.url), ("node2", node2.url), initialize=False, CALIMERO_MCP_READ_ONLY="1")
    text = server.result("initialize", HANDSHAKE)["instructions"]
    assert len(text) <= INSTRUCTIONS_LIMIT, len(text)
    lines = text.split("\n")
    # the first line itself says what stands in for a handle: read literally, it no longer contradicts a later one
    assert lines[0].endswith("pass the returned app_handle on every app tool call, or _context (the context to act "
                             "in) instead of one.")
    assert text.count("_context ") == 1 and "Without a handle" not in text, "said once"
    several_nodes = [line for line in lines if line.startswith("Several nodes")]
    assert len(several_nodes) == 1 and "every tool but list_nodes takes node" in several_nodes[0]
    assert "default node, node1" in several_nodes[0] and "CALIMERO_MCP_READ_ONLY" in text


def test_app_tools_take_node_as_the_several_nodes_line_says(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node1.add_context(node1._app_key(KV), name="demo")
    node2 = network.add("node2")
    server = several(("node1", node1.url), ("node2", node2.url))
    tools = server.result("tools/list")["tools"]
    lacking = [t["name"] for t in tools if t["name"] != "list_nodes" and "node" not in t["inputSchema"]["properties"]]
    assert lacking == [] and any(t["name"].startswith("kv_store_") for t in tools)


# ---- 4. a down node's fix ----

def test_a_down_node_with_a_home_on_this_machine_gets_its_start_command(network, several, tmp_path):
    node1 = network.add("node1")
    node3 = network.add("node3")
    write_home(tmp_path / "nodes", "node3", node3.port)
    network.stop("node3")
    server = several(("node1", node1.url), ("node3", node3.url))
    command = "Start it: merod --home %s --node node3 run (its home: %s)." % (tmp_path / "nodes",
                                                                             tmp_path / "nodes" / "node3")
    status = answer(server.call_tool("node_status", {"node": "node3"}))
    assert status["health"]["status"] == "unreachable" and status["fix"] == command
    assert rows_by_name(server.call_tool("list_nodes"))["node3"]["fix"] == command
    assert "fix" not in rows_by_name(server.call_tool("list_nodes"))["node1"], "a node that works needs none"


def test_a_home_in_merods_default_place_needs_no_home_flag(start_server, tmp_path):
    double = sample_double().start()
    port = double.port
    double.stop()
    write_home(tmp_path / "home" / ".calimero", "solo", port)          # ~/.calimero: merod's default home
    server = start_server(minimal_env(tmp_path / "home", {"CALIMERO_MCP_STATE_DIR": tmp_path / "state"}))
    status = server.tool_json("node_status")
    assert status["health"]["status"] == "unreachable", status
    assert status["fix"].startswith("Start it: merod --node solo run (its home: "), status["fix"]


def test_a_down_node_known_only_by_url_says_check_it_and_the_setting(network, several, start_server, tmp_path):
    node1 = network.add("node1")
    node2 = network.add("node2")
    network.stop("node2")
    server = several(("node1", node1.url), ("node2", node2.url))
    said = ("Check that the node at %s runs (start it on its machine), and that CALIMERO_NODES names the right URL."
            % node2.url)
    assert answer(server.call_tool("node_status", {"node": "node2"}))["fix"] == said
    assert rows_by_name(server.call_tool("list_nodes"))["node2"]["fix"] == said
    # every answer that quotes node2's failure gives that fix, never the lone node's CALIMERO_NODE_URL
    item = {"app": "kv-store", "context": "c", "method": "get", "args": {"key": "k"}, "node": "node2"}
    row = json.loads(server.call_tool("call_many", {"calls": [item]})["content"][0]["text"])[0]
    assert row["error"].endswith(said) and "CALIMERO_NODE_URL" not in row["error"], row
    failed = server.call_tool("install_application", {"coords": "com.calimero.kv-store@1.0.0", "node": "node2"})
    assert failed.get("isError") and failed["content"][0]["text"].endswith(said + " The other nodes still work: "
                                                                           "list_nodes says which are up."), failed
    single = start_server(minimal_env(tmp_path / "alone", {"CALIMERO_NODE_URL": node2.url,
                                                            "CALIMERO_MCP_STATE_DIR": tmp_path / "state2"}))
    assert single.tool_json("node_status")["fix"].endswith("and that CALIMERO_NODE_URL names the right URL.")


def test_a_node_that_refuses_the_login_names_the_variables_that_sign_in_there(network, several, start_server,
                                                                              tmp_path):
    node1 = network.add("node1")
    node2 = network.add("node2", auth=CREDENTIALS)
    server = several(("node1", node1.url), ("node2", node2.url))       # no credentials at all
    status = answer(server.call_tool("node_status", {"node": "node2"}))
    assert status["fix"].startswith("Set CALIMERO_USERNAME and CALIMERO_PASSWORD (or CALIMERO_PASSWORD_FILE) to an "
                                    "admin account of node node2"), status
    row = rows_by_name(server.call_tool("list_nodes"))["node2"]
    assert row["auth"].startswith("cannot sign in") and row["fix"] == status["fix"]
    wrong = start_server(minimal_env(tmp_path / "h2", {"CALIMERO_NODE_URL": node2.url, "CALIMERO_USERNAME": "admin",
                                                       "CALIMERO_PASSWORD": "wrong",
                                                       "CALIMERO_MCP_STATE_DIR": tmp_path / "s2"}))
    assert wrong.tool_json("node_status")["fix"] == ("Check CALIMERO_USERNAME and CALIMERO_PASSWORD; the account "
                                                     "needs admin permission.")


# ---- 43: list_nodes pages ----

def test_list_nodes_pages_a_long_node_list_with_the_usual_cursor(network, several):
    node1 = network.add("node1")
    down = network.add("spare")
    network.stop("spare")
    names = ["n%03d" % index for index in range(350)]
    server = several(("node1", node1.url), *[(name, down.url.replace("127.0.0.1", "localhost") + "/p%d" % i)
                                             for i, name in enumerate(names)])
    seen, cursor, pages = [], None, 0
    while True:
        result = server.call_tool("list_nodes", {"cursor": cursor} if cursor else {}, timeout=60)
        page = answer(result)                       # whole JSON on every page, never cut mid-row
        assert page == result["structuredContent"] and len(page["nodes"]) <= 100
        seen += [row["name"] for row in page["nodes"]]
        pages += 1
        cursor = page.get("nextCursor")
        if cursor is None:
            break
        assert 'call list_nodes again with the same arguments and cursor "%s"' % cursor in result["content"][1]["text"]
    assert pages == 4 and sorted(seen) == sorted(names + ["node1"])
    refused = server.call_tool("list_nodes", {"cursor": "not-a-cursor"})
    assert refused["isError"] and "Invalid cursor" in refused["content"][0]["text"]


# ---- 6. answers that settle their question ----

def test_single_mode_list_nodes_names_the_node_by_host_and_port(serve):
    double = sample_double()
    server = serve(double)
    nodes = server.tool_json("list_nodes")["nodes"]
    active = [row for row in nodes if row["active"]]
    assert active == [{"url": double.url, "name": "127.0.0.1:%d" % double.port, "active": True}]


def test_node_status_says_whether_a_registry_is_known_and_where_from(serve, tmp_path):
    double = sample_double()
    status = serve(double).tool_json("node_status")
    assert status["registry"] is None and status["registryNote"].startswith("No registry address is known")
    named = serve(double, CALIMERO_REGISTRY_URL="https://registry.example.com/").tool_json("node_status")
    assert named["registry"] == {"url": "https://registry.example.com", "from": "CALIMERO_REGISTRY_URL"}
    assert "registryNote" not in named
    write_home(tmp_path / "nodes", "mine", double.port)
    config = tmp_path / "nodes" / "mine" / "config.toml"
    config.write_text(config.read_text() + '[registry]\nbase_url = "https://apps.example.org"\n')
    homed = serve(double).tool_json("node_status")
    assert homed["registry"] == {"url": "https://apps.example.org", "from": str(config)}


def test_describe_group_names_the_newer_build_installed(serve):
    double = sample_double()
    server = serve(double)
    assert "newestInstalled" not in server.tool_json("describe_group", {"group": "demo-team"})["application"]
    double.upgrade_app(double._app_key(KV), "1.1.0")
    described = server.tool_json("describe_group", {"group": "demo-team"})
    application = described["application"]
    assert (application["version"], application["newestInstalled"]) == ("1.0.0", "1.1.0")
    assert application["upgrade"] == "upgrade_group %s moves it to 1.1.0" % described["groupId"]
    assert described["countsNote"].startswith("memberCount and contextCount count this group's own: a namespace's "
                                              "members, a subgroup's only those added to it")


def test_upgrade_group_without_cascade_lists_the_subgroups_it_left(serve):
    double = sample_double()
    kv = double._app_key(KV)
    namespace = next(g["id"] for g in double._groups.values() if g["parent"] is None and g["applicationId"] == kv)
    team = double.add_group(namespace=namespace, name="team", visibility="open")
    squad = double.add_group(parent=team, name="squad")
    server = serve(double)
    double.upgrade_app(kv, "1.1.0")
    moved = server.tool_json("upgrade_group", {"group": namespace})
    assert moved["version"] == "1.1.0"
    assert sorted(moved["subgroupsNotMoved"], key=lambda row: row["name"]) == [
        {"groupId": squad, "name": "squad", "version": "1.0.0"}, {"groupId": team, "name": "team", "version": "1.0.0"}]
    assert "cascade: true moves them all" in moved["subgroupsNote"]


def test_upgrade_group_with_cascade_leaves_none_behind(serve):
    double = sample_double()
    kv = double._app_key(KV)
    namespace = next(g["id"] for g in double._groups.values() if g["parent"] is None and g["applicationId"] == kv)
    double.add_group(namespace=namespace, name="team", visibility="open")
    server = serve(double)
    double.upgrade_app(kv, "1.1.0")
    moved = server.tool_json("upgrade_group", {"group": namespace, "cascade": True})
    assert moved["version"] == "1.1.0" and "subgroupsNotMoved" not in moved


def test_leave_namespace_says_what_leaving_as_only_admin_costs_before_the_act(serve):
    server = serve(sample_double())
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    assert "only admin" in tools["leave_namespace"]["description"]


# ---- 7. a watch in one call ----

def live(server, context="demo"):
    deadline = time.monotonic() + 60
    while server.tool_json("events", {"context": context})["stream"] != "live":
        assert time.monotonic() < deadline, "the stream never went live"
        time.sleep(0.05)
    return server.tool_json("events", {"context": context})["context"]


def test_watch_collects_every_entry_of_its_window_from_now(serve):
    double = sample_double()
    server = serve(double)
    context = live(server)
    double.sse_mutation(context, [("Inserted", {"key": "before", "value": "x"})])      # before the watch: not its
    deadline = time.monotonic() + 30
    while not server.tool_json("events", {"context": "demo"})["entries"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    def drip():
        for index in range(3):
            time.sleep(0.4)
            double.sse_mutation(context, [("Inserted", {"key": "k%d" % index, "value": "v"})])
    thread = threading.Thread(target=drip, daemon=True)
    started = time.monotonic()
    thread.start()
    watched = server.tool_json("events", {"context": "demo", "watch": 2.5}, timeout=60)
    thread.join()
    assert time.monotonic() - started >= 2.5, "the whole window, not the first entry"
    assert [e["payload"]["key"] for e in watched["entries"]] == ["k0", "k1", "k2"]
    assert watched["watched"].startswith("2.5 s after entry ") and watched["watched"].endswith("; 3 came")
    quiet = server.tool_json("events", {"context": "demo", "watch": 0.3, "after": watched["next"]})
    assert quiet["entries"] == [] and quiet["watched"].endswith("nothing came")
    both = server.call_tool("events", {"context": "demo", "watch": 1, "wait": 1})
    assert both["isError"] and "not both" in both["content"][0]["text"]
    assert server.call_tool("events", {"context": "demo", "watch": 51})["isError"], "kept under the hosts' timeout"


def test_a_watch_sends_progress_while_entries_keep_coming(tmp_path):
    double = sample_double().start()
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_STATE_DIR": tmp_path / "s",
                                          "CALIMERO_NODE_HOME": tmp_path / "nodes"})
    server = tuned_server(env, "import mero_tools\nmero_tools.WATCH_PROGRESS_SECONDS = 0.3",
                          check="hasattr(__import__('mero_tools'), 'WATCH_PROGRESS_SECONDS')")
    try:
        server.initialize()
        context = live(server)
        stop = threading.Event()

        def drip():                                   # an entry every 0.1 s: each inner wait ends early
            index = 0
            while not stop.wait(0.1):
                index += 1
                double.sse_mutation(context, [("Inserted", {"key": "d%d" % index, "value": "v"})])
        thread = threading.Thread(target=drip, daemon=True)
        thread.start()
        server.send({"jsonrpc": "2.0", "id": "w", "method": "tools/call",
                     "params": {"name": "events", "arguments": {"context": "demo", "watch": 2},
                                "_meta": {"progressToken": "p"}}})
        note = server.wait_notification(lambda n: n.get("method") == "notifications/progress")
        assert note["params"]["progressToken"] == "p" and note["params"]["total"] == 2
        reply = server.wait_for("w", timeout=60)
        stop.set()
        thread.join()
        watched = json.loads(reply["result"]["content"][0]["text"])
        assert len(watched["entries"]) >= 5 and watched["watched"].startswith("2 s after entry ")
    finally:
        server.close()
        double.stop()


def test_list_namespaces_says_what_its_member_count_counts(serve):
    listed = serve(sample_double()).tool_json("list_namespaces")
    assert listed["namespaces"][0]["memberCount"] == 1
    assert listed["countsNote"].startswith("memberCount counts the namespace's members; a subgroup counts only those")
