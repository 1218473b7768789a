"""What a model asks next is already answered: the registry browsable, what ran where, renames that hold,
subgroups found, the invitation's hand-over, one version story, writes that name what they did, call_many items
named, instructions that agree, create_context finding its namespace. Through the real server against the double."""
from __future__ import annotations

import json
import time

import pytest

from node_double import counter_spec, kv_store_spec, sample_double


def text_of(result):
    return result["content"][-1]["text"]


def error_text(result):
    assert result.get("isError") is True, result
    return text_of(result)


def issue_tracker(version, description="Track issues together."):
    spec = counter_spec()
    spec["metadata"] = {"name": "Issue Tracker", "description": description}
    return dict(spec, package="com.calimero.issues", version=version)


REGISTRY = {"com.calimero.issues@1.0.0": issue_tracker("1.0.0"), "com.calimero.issues@1.1.0": issue_tracker("1.1.0"),
            "com.calimero.kv-store@1.0.0": kv_store_spec(), "com.example.chat@0.3.0": dict(
                counter_spec(), package="com.example.chat", version="0.3.0",
                metadata={"name": "Chat", "description": "Rooms and messages."})}


def registry_double():
    double = sample_double()
    double.registry.update(REGISTRY)
    return double


def node_dir(tmp_path, double, registry_lines):
    """A node directory whose config.toml names the double's address and the given [registry] lines."""
    folder = tmp_path / "nodes" / "node1"
    folder.mkdir(parents=True)
    port = double.url.rsplit(":", 1)[1]
    (folder / "config.toml").write_text('[server]\nlisten = ["/ip4/127.0.0.1/tcp/%s"]\n\n[registry]\n%s\n'
                                        % (port, registry_lines))


# ── 1. the registry, browsable ───────────────────────────────────────────────────────────────────

def test_registry_lists_every_package_from_the_nodes_config(serve, tmp_path):
    double = registry_double().start()
    node_dir(tmp_path, double, 'mode = "http"\nbase_url = "%s"' % double.registry_url)
    server = serve(double)
    listed = server.call_tool("list_registry", {})
    assert not listed.get("isError"), listed
    rows = listed["structuredContent"]["packages"]
    assert [row["package"] for row in rows] == ["com.calimero.issues", "com.calimero.kv-store", "com.example.chat"]
    issues = rows[0]
    assert issues == {"package": "com.calimero.issues", "version": "1.1.0", "name": "Issue Tracker",
                      "description": "Track issues together.", "installed": None}
    assert rows[1]["installed"] == "1.0.0"          # the sample node runs kv-store 1.0.0
    assert listed["structuredContent"]["registry"] == double.registry_url
    assert [r["query"] for r in double.log if r["path"] == "/registry/api/v2/bundles"] == [{}]


def test_registry_lists_one_packages_versions_then_install_takes_them(serve, tmp_path):
    double = registry_double()
    server = serve(double, CALIMERO_REGISTRY_URL=double.start().registry_url)
    versions = server.call_tool("list_registry", {"package": "com.calimero.issues"})["structuredContent"]
    assert versions["versions"] == [{"version": "1.0.0"}, {"version": "1.1.0"}]
    assert versions["name"] == "Issue Tracker"
    installed = server.call_tool("install_application", {"coords": "com.calimero.issues@1.1.0"})
    assert not installed.get("isError"), installed
    assert installed["structuredContent"]["version"] == "1.1.0"


@pytest.mark.parametrize("lines, said", [
    ("", "has no [registry] base_url"),
    ('mode = "dht"', 'mode = "dht"'),
])
def test_registry_without_an_address_says_what_to_set(serve, tmp_path, lines, said):
    double = registry_double().start()
    node_dir(tmp_path, double, lines)
    text = error_text(serve(double).call_tool("list_registry", {}))
    assert said in text and "CALIMERO_REGISTRY_URL" in text


def test_registry_that_does_not_answer_is_said(serve, tmp_path):
    double = registry_double()
    text = error_text(serve(double, CALIMERO_REGISTRY_URL="http://127.0.0.1:9").call_tool("list_registry", {}))
    assert text.startswith("Error: Cannot reach the registry at http://127.0.0.1:9 (CALIMERO_REGISTRY_URL)"), text


def test_registry_miss_names_the_versions_or_the_closest_packages(serve):
    double = registry_double()
    server = serve(double, CALIMERO_REGISTRY_URL=double.start().registry_url)
    wrong_version = error_text(server.call_tool("install_application", {"coords": "com.calimero.issues@2.0"}))
    assert "The registry has com.calimero.issues in versions 1.0.0, 1.1.0." in wrong_version
    wrong_name = error_text(server.call_tool("install_application", {"coords": "com.calimero.issue@1.0.0"}))
    assert "The registry has no package com.calimero.issue; closest: com.calimero.issues" in wrong_name


# ── 3. renames that hold ─────────────────────────────────────────────────────────────────────────

def test_a_rename_keeps_the_data_resolves_at_once_and_the_old_name_no_longer_does(serve):
    double = sample_double()
    namespace = next(g["id"] for g in double._groups.values() if g["name"] == "demo-team")
    group = double.add_group(namespace=namespace, name="ops", visibility="open")
    server = serve(double)
    first = server.call_tool("set_group_metadata", {"group": "ops", "data": {"team": "blue"}})
    assert first["structuredContent"] == {"groupId": group, "name": "ops", "data": {"team": "blue"}}
    renamed = server.call_tool("set_group_metadata", {"group": "ops", "name": "platform"})
    assert renamed["structuredContent"] == {"groupId": group, "name": "platform", "data": {"team": "blue"},
                                            "renamedFrom": "ops"}
    assert double._groups[group]["metadata"]["data"] == {"team": "blue"}, "a rename sends the current data"
    described = server.call_tool("describe_group", {"group": "platform"})["structuredContent"]
    assert described["groupId"] == group and described["name"] == "platform"
    gone = error_text(server.call_tool("describe_group", {"group": "ops"}))
    assert 'no namespace or group on this node is named "ops"' in gone
    listed = server.call_tool("describe_group", {"group": namespace})["structuredContent"]["subgroups"]
    assert {"groupId": group, "name": "platform", "parentId": namespace, "memberCount": 1, "contextCount": 0} in listed


# ── 4. subgroups found ───────────────────────────────────────────────────────────────────────────

def test_describe_group_of_a_namespace_lists_every_subgroup_it_knows(serve):
    double = sample_double()
    namespace = next(g["id"] for g in double._groups.values() if g["name"] == "demo-team")
    ops = double.add_group(namespace=namespace, name="ops", visibility="open")
    nested = double.add_group(parent=ops, name="oncall")
    server = serve(double)
    shown = server.call_tool("describe_group", {"group": "demo-team"})["structuredContent"]
    assert [(row["groupId"], row["name"], row["parentId"]) for row in shown["subgroups"]] == [
        (ops, "ops", namespace), (nested, "oncall", ops)]
    assert "subgroupsNote" not in shown


# ── 5. the hand-over ─────────────────────────────────────────────────────────────────────────────

def test_an_invitation_says_what_to_hand_over_and_what_the_other_node_runs(server, double):
    namespace = next(g["id"] for g in double._groups.values() if g["name"] == "demo-team")
    invited = server.call_tool("invite_to_namespace", {"namespace": "demo-team"})
    assert not invited.get("isError"), invited
    note = invited["content"][0]["text"]
    signed = invited["structuredContent"]["invitation"]["invitation"]
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(signed["expiration_timestamp"]))
    assert note == ("Hand over the JSON below whole and unchanged (join_namespace's arguments besides namespace) and "
                    "namespace id %s. It expires %s and makes the joiner Member. The other node then runs: "
                    "install_application com.calimero.kv-store@1.0.0 if it lacks it; join_namespace with both; "
                    "join_context for each context (list_contexts there shows them)." % (namespace, date))
    assert json.loads(invited["content"][-1]["text"]) == invited["structuredContent"]
    assert set(invited["structuredContent"]) == {"invitation", "groupName"}    # join_namespace's arguments
    assert "\n" not in invited["content"][-1]["text"], "the byte arrays are not a line per byte"


# ── 6. one version story ─────────────────────────────────────────────────────────────────────────

def test_contexts_say_the_version_they_run_and_whether_they_are_behind(serve):
    """behind: older than the newest installed version of the context's app; what moves it is said (a newer
    install alone: upgrade_group; an upgraded group: the next call, as the node upgrades lazily, §0.7)."""
    double = sample_double()
    kv = double._app_key("com.calimero.kv-store")
    server = serve(double)
    listed = server.call_tool("list_contexts", {})["structuredContent"]
    assert "behind: older than that, than its own group's version or than its app's newest installed one" in \
        listed["versions"], "the versions are defined where they are shown"
    row = listed["contexts"][0]
    assert (row["applicationVersion"], row["namespaceVersion"], row["behind"]) == ("1.0.0", "1.0.0", False)
    assert "nextCall" not in row
    double.upgrade_app(kv, "1.1.0")                       # installed, its namespace not upgraded yet
    row = server.call_tool("list_contexts", {})["structuredContent"]["contexts"][0]
    assert (row["applicationVersion"], row["namespaceVersion"], row["behind"]) == ("1.0.0", "1.0.0", True)
    assert row["nextCall"] == "runs 1.0.0 still: upgrade_group its group to move it to 1.1.0"
    upgraded = server.call_tool("upgrade_group", {"group": "demo-team"})
    assert not upgraded.get("isError"), upgraded
    row = server.call_tool("list_contexts", {})["structuredContent"]["contexts"][0]
    assert (row["applicationVersion"], row["namespaceVersion"], row["behind"]) == ("1.0.0", "1.1.0", True)
    assert row["nextCall"] == "runs 1.1.0, its group's version (the node moves a context when next called)"
    group = server.call_tool("describe_group", {"group": "demo-team"})["structuredContent"]
    assert group["application"]["version"] == "1.1.0"
    assert group["upgrade"]["status"] == "completed" and group["upgrade"]["localContextsTotal"] is None
    assert "did not report how many contexts moved" in group["upgrade"]["countsNote"]
    server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"})
    row = server.call_tool("list_contexts", {})["structuredContent"]["contexts"][0]
    assert (row["applicationVersion"], row["behind"]) == ("1.1.0", False), "a call moves the context on"
    assert "nextCall" not in row


# ── 7. writes name what they did ─────────────────────────────────────────────────────────────────

def test_uninstall_names_what_went(server):
    answer = server.call_tool("uninstall_application", {"application": "counter"})["structuredContent"]
    assert {k: answer[k] for k in ("package", "version", "uninstalled")} == {
        "package": "com.example.counter", "version": "0.1.0", "uninstalled": True}
    assert answer["note"].startswith("Its 2 tools leave the tool list. "), answer
    assert "counter_value" not in server.tool_names()


def test_uninstalling_an_app_with_no_tools_listed_says_nothing_of_tools(serve):
    """An app CALIMERO_MCP_APPS leaves out has no tools to leave the list."""
    server = serve(sample_double(), CALIMERO_MCP_APPS="kv-store")
    answer = server.call_tool("uninstall_application", {"application": "counter"})["structuredContent"]
    assert answer["uninstalled"] is True and "note" not in answer, answer


def test_install_says_new_new_version_or_the_same_bundle_and_what_changed(serve):
    double = registry_double()
    newer = issue_tracker("1.1.0")
    newer["abi"] = json.loads(json.dumps(newer["abi"]))
    newer["abi"]["methods"].append({"name": "reset", "params": [], "returns": None})
    double.registry["com.calimero.issues@1.1.0"] = newer
    server = serve(double, CALIMERO_REGISTRY_URL=double.start().registry_url)
    first = server.call_tool("install_application", {"coords": "com.calimero.issues@1.0.0"})["structuredContent"]
    assert first["change"] == "new application"
    again = server.call_tool("install_application", {"coords": "com.calimero.issues@1.0.0"})["structuredContent"]
    assert again["change"] == "same bundle again: nothing changed"
    server.call_tool("describe_app", {"app": "com.calimero.issues"})        # this session reads its methods
    moved = server.call_tool("install_application", {"coords": "com.calimero.issues@1.1.0"})["structuredContent"]
    assert moved["change"] == ("new version (was 1.0.0): its namespaces and groups keep the version they run until "
                               "upgrade_group moves them")
    assert (moved["methodsAdded"], moved["methodsRemoved"]) == (["reset"], [])


def test_visibility_says_what_it_was_and_what_it_means(serve):
    double = sample_double()
    namespace = next(g["id"] for g in double._groups.values() if g["name"] == "demo-team")
    group = double.add_group(namespace=namespace, name="ops", visibility="restricted")
    server = serve(double)
    said = text_of(server.call_tool("set_group_visibility", {"group": "ops", "visibility": "open"}))
    assert said == ("Group %s is now open (was restricted): namespace members can join it (join_open_group)."
                    % group)


def test_create_alias_takes_an_alias_and_says_where_a_taken_name_points(server, double):
    demo = next(c["id"] for c in double._contexts.values() if c["name"] == "demo")
    made = text_of(server.call_tool("create_alias", {"alias": "main", "context": "demo"}))
    assert made == 'Alias "main" now resolves to context %s.' % demo
    assert server.tool_json("lookup_alias", {"name": "main"})["contextId"] == demo
    other = double.add_context(double._app_key("com.calimero.kv-store"), name="other")
    taken = error_text(server.call_tool("create_alias", {"alias": "main", "contextId": other}))
    assert taken == ('Error: Alias "main" already names context %s. Pass replace: true to point it at context %s '
                     'instead; nothing changed.' % (demo, other))
    assert server.tool_json("lookup_alias", {"name": "main"})["contextId"] == demo


# ── 2. what ran, where; 8. call_many items named ─────────────────────────────────────────────────

def test_a_unit_method_answers_null_and_says_what_ran_where(server, double):
    demo = next(c["id"] for c in double._contexts.values() if c["name"] == "demo")
    result = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "set",
                                       "args": {"key": "k", "value": "v"}})
    said = [block["text"] for block in result["content"]]
    assert said[:2] == ["null", 'set ran in context %s (alias "demo"); it returns nothing.' % demo]
    assert len(said) == 3 and said[2].startswith("Events in context %s" % demo)      # what it emitted


def test_a_null_a_method_returns_is_its_value_not_nothing(server, double):
    """get of a key with no value answers null, its Option's None: no line saying the method returns nothing."""
    demo = next(c["id"] for c in double._contexts.values() if c["name"] == "demo")
    ran = {"type": "text", "text": 'get ran in context %s (alias "demo").' % demo}
    result = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "get", "args": {"key": "zz"}})
    assert result == {"content": [{"type": "text", "text": "null"}, ran]}
    generated = server.call_tool("kv_store_get", {"context": "demo", "key": "zz"})
    assert generated["content"] == [{"type": "text", "text": "null"}, ran]


def test_call_many_items_name_their_call(server):
    answer = server.tool_json("call_many", {"calls": [
        {"app": "kv-store", "context": "demo", "method": "len"}, {"app": "kv-store", "context": "nowhere",
                                                                   "method": "len"}]})
    assert [{k: item[k] for k in ("index", "app", "context", "method", "ok")} for item in answer] == [
        {"index": 0, "app": "kv-store", "context": "demo", "method": "len", "ok": True},
        {"index": 1, "app": "kv-store", "context": "nowhere", "method": "len", "ok": False}]


def test_call_many_keeps_its_whole_answer_within_the_bound(server):
    big = "x" * 20000
    calls = [{"app": "kv-store", "context": "demo", "method": "set", "args": {"key": "k%d" % i, "value": big + str(i)}}
             for i in range(4)]
    server.tool_json("call_many", {"calls": calls})
    gets = [{"app": "kv-store", "context": "demo", "method": "get", "args": {"key": "k%d" % i}} for i in range(4)]
    result = server.call_tool("call_many", {"calls": gets})
    assert len(result["content"][-1]["text"]) <= 60000
    items = json.loads(result["content"][-1]["text"])
    assert all(item["ok"] for item in items)
    assert sum(1 for item in items if "result" in item) >= 2
    cut = [item for item in items if "result" not in item]
    assert cut and "It ran, but its result is too large to show" in cut[0]["note"]


# ── 9. instructions; 10. create_context finds its namespace ──────────────────────────────────────

def test_read_only_instructions_say_how_writes_come_back(start_server, server_env):
    server = start_server(dict(server_env, CALIMERO_MCP_READ_ONLY="1"), initialize=None)
    instructions = server.result("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                "clientInfo": {"name": "t", "version": "1"}})["instructions"]
    assert "unset CALIMERO_MCP_READ_ONLY" in instructions and "restart the server" in instructions
    # the flow (reference-behaviour.md's exact line) and the routing line agree: a handle, else _context
    assert "either is enough" not in instructions
    assert "app_handle on every app tool call, or _context (the context to act in) instead of one." in instructions


def test_create_context_uses_the_apps_only_namespace_or_says_what_comes_first(server, double):
    namespace = next(g["id"] for g in double._groups.values() if g["name"] == "demo-team")
    created = server.call_tool("create_context", {"application": "kv-store"})
    assert not created.get("isError"), created
    new = created["structuredContent"]["contextId"]
    assert double._contexts[new]["groupId"] == namespace
    none = error_text(server.call_tool("create_context", {"application": "counter"}))
    assert none == ('Error: Application "counter" has no namespace on this node: create_namespace first, then '
                    "create_context in it.")
    double.add_namespace(double._app_key("com.calimero.kv-store"), name="second")
    several = error_text(server.call_tool("create_context", {"application": "kv-store"}))
    assert "has 2 namespaces; pass group with one of:" in several and "demo-team" in several


# ── the registry, read like the node (issue 32, item 4) ──────────────────────────────────────────

class StandIn:
    """A registry that answers every GET of /api/v2/bundles with `rows` (JSON text, or a value), ignoring any
    filter (?package=); it sets a cookie, and records each request's path, query and headers."""

    def __init__(self, rows):
        import http.server
        import threading
        self.rows, self.requests, self.status = rows, [], 200
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                stand_in.requests.append((self.path, dict(self.headers)))
                body = stand_in.rows if isinstance(stand_in.rows, bytes) else json.dumps(stand_in.rows).encode()
                self.send_response(stand_in.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Set-Cookie", "registry-session=from-the-registry; Path=/")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def bundle(package, version, **extra):
    return dict({"package": package, "appVersion": version, "metadata": {"name": package, "description": ""}},
                **extra)


@pytest.fixture
def stand_in():
    made = []

    def make(rows):
        made.append(StandIn(rows))
        return made[-1]
    yield make
    for registry in made:
        registry.stop()


def test_a_registry_ignoring_the_package_filter_gives_only_that_packages_versions(serve, stand_in):
    registry = stand_in([bundle("com.other.app", "9.9.9"), bundle("com.calimero.issues", "1.0.0"),
                         bundle("com.calimero.issues", "1.1.0"), bundle("com.calimero.issues", "1.1.0")])
    server = serve(sample_double(), CALIMERO_REGISTRY_URL=registry.url)
    versions = server.call_tool("list_registry", {"package": "com.calimero.issues"})["structuredContent"]
    assert [v["version"] for v in versions["versions"]] == ["1.0.0", "1.1.0"], "another package's, or twice"
    assert "package=com.calimero.issues" in registry.requests[-1][0]
    registry.rows = [bundle("com.other.app", "9.9.9")]
    none_left = error_text(server.call_tool("list_registry", {"package": "com.calimero.issues"}))
    assert ("The registry at %s (CALIMERO_REGISTRY_URL) answered the versions of com.calimero.issues with 1 bundles "
            "of other packages and none of com.calimero.issues (it ignores ?package=)" % registry.url) in none_left
    assert "9.9.9" not in none_left


def test_a_package_listed_twice_in_the_latest_list_is_an_error_naming_the_registry(serve, stand_in):
    registry = stand_in([bundle("com.a", "1.0.0"), bundle("com.b", "1.0.0"), bundle("com.a", "2.0.0")])
    server = serve(sample_double(), CALIMERO_REGISTRY_URL=registry.url)
    text = error_text(server.call_tool("list_registry", {}))
    assert text.startswith("Error: The registry at %s (CALIMERO_REGISTRY_URL) listed com.a more than once"
                           % registry.url), text


@pytest.mark.parametrize("rows,said", [
    ([bundle("com.a", "1.0.0", metadata="not an object")], 'row 0 is not as expected (expected "metadata" an object'),
    ([bundle("com.a", "1.0.0"), "a string"], "row 1 is not as expected (expected an object)"),
    ([{"appVersion": "1.0.0"}], 'row 0 is not as expected (expected a "package" string)'),
    (b"[" * 100000 + b"]" * 100000, "answered with JSON nested too deeply to read"),
    (b"[" * 300 + b"]" * 300, "answered with JSON nested more than 200 levels deep"),
    (b"\xff not json", "answered with a body that is not JSON"),
    ({"bundles": []}, "answered with no list of bundles"),
], ids=["metadata", "row", "package", "too deep to read", "deep", "unreadable", "not a list"])
def test_a_registry_answer_of_the_wrong_shape_is_an_error_naming_the_registry(serve, stand_in, rows, said):
    registry = stand_in(rows)
    server = serve(sample_double(), CALIMERO_REGISTRY_URL=registry.url)
    for arguments in ({}, {"package": "com.a"}):
        result = server.call_tool("list_registry", arguments)
        text = error_text(result)                       # an isError, never JSON-RPC -32603
        assert text.startswith("Error: The registry at %s (CALIMERO_REGISTRY_URL) " % registry.url), text
        assert said in text, text
    assert "Traceback" not in server.stderr


def test_a_registry_url_is_shown_without_its_credentials_and_shares_no_cookie_with_the_node(serve, stand_in):
    registry = stand_in([bundle("com.a", "1.0.0")])
    secret = "reg-pass-%s" % "x7Qz9"
    base = registry.url.replace("http://", "http://reader:%s@" % secret)
    double = sample_double()
    server = serve(double, CALIMERO_REGISTRY_URL=base)
    listed = server.call_tool("list_registry", {})
    assert listed["structuredContent"]["registry"] == registry.url
    assert registry.requests[-1][1].get("Authorization", "").startswith("Basic "), "the userinfo is sent"
    registry.status, registry.rows = 500, b"oops, you sent reader:%s" % secret.encode()    # it echoes the request
    echoed = error_text(server.call_tool("list_registry", {}))
    assert echoed.startswith("Error: The registry at %s (CALIMERO_REGISTRY_URL) answered HTTP 500: oops, you sent "
                             "[redacted]" % registry.url), echoed
    assert secret not in server.stderr + json.dumps(listed) + echoed


def test_the_registrys_cookies_never_reach_the_node(serve, stand_in):
    registry = stand_in([bundle("com.a", "1.0.0")])
    double = sample_double()
    server = serve(double, CALIMERO_REGISTRY_URL=registry.url)        # one host, two ports: one cookie domain
    assert not server.call_tool("list_registry", {}).get("isError")
    start = len(double.log)
    assert not server.call_tool("list_namespaces").get("isError")
    assert len(double.log) > start
    assert all("cookie" not in {key.lower() for key in entry["headers"]} for entry in double.log), \
        "the registry's cookie reached the node"
