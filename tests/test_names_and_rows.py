"""Names and rows a model can use on the first try: namespaces and groups by name wherever an id is asked,
list rows a model can read without matching hashes, results that show what happened (create_context's alias,
delete_context's alias cleanup, delete_alias, create_group's answer, describe_app for a multi-service app,
upload_blob's text), and the words that say so. Through the real server against the double."""
from __future__ import annotations

import json
import time

import pytest

from node_double import NodeDouble, counter_spec, hex_id, kv_store_spec
from test_fixed_tools import made_by

KV = "com.calimero.kv-store"
COUNTER = "com.example.counter"
WORLD = "com.example.world"
SERVICE_MANIFEST = {"schema_version": "wasm-abi/1", "types": {},
                    "methods": [{"name": "ping", "params": [], "returns": {"kind": "string"}, "intent": "read_only"}]}
ADMIN_MANIFEST = {"schema_version": "wasm-abi/1", "types": {},
                  "methods": [{"name": "reset", "params": [{"name": "hard", "type": {"kind": "bool"}}],
                               "returns": {"kind": "unit"}, "intent": "mutating"}]}


def world_spec():
    return {"package": WORLD, "version": "1.0.0", "signer_id": "signer-w", "metadata": {"name": "World"},
            "services": {"api": SERVICE_MANIFEST, "admin": ADMIN_MANIFEST}}


class Node:
    """kv-store in namespace "team" (subgroup "alpha", and "deep" below it), counter in namespace "lab" (subgroup
    "beta"), a two-service app; one kv-store context aliased twice, one without an alias."""

    def __init__(self, **kw):
        self.double = d = NodeDouble(apps=[kv_store_spec(), counter_spec(), world_spec()], **kw)
        self.kv, self.counter = d._app_key(KV), d._app_key(COUNTER)
        self.team = d.add_namespace(self.kv, name="team")
        self.alpha = d.add_group(namespace=self.team, name="alpha", visibility="open")
        self.deep = d.add_group(parent=self.alpha, name="deep")
        self.lab = d.add_namespace(self.counter, name="lab")
        self.beta = d.add_group(namespace=self.lab, name="beta")
        self.notes = d.add_context(self.kv, group_id=self.team, name="notes")
        self.plain = d.add_context(self.kv, group_id=self.alpha)
        d.add_alias("kv-main", self.notes)
        d.add_alias("notes-too", self.notes)


@pytest.fixture
def node():
    return Node()


def text_of(result):
    return result["content"][-1]["text"]


def error_text(result):
    assert result.get("isError") is True, result
    return text_of(result)


def writes(double):
    return [e for e in double.log if e["method"] != "GET" and "/alias/lookup/" not in e["path"]]


def tools_by_name(server):
    return {t["name"]: t for t in server.result("tools/list")["tools"]}


# ── 1. names wherever a namespace or group id is asked ──────────────────────────────────────────

# (tool, arguments with names, the request the node must see with the ids in it); {team} etc. are Node attributes.
BY_NAME = [
    ("create_group", {"namespace": "team", "name": "g"}, ("POST", "/admin-api/namespaces/{team}/groups")),
    ("create_group", {"namespace": "team", "parent": "deep"}, ("POST", "/admin-api/groups")),
    ("delete_namespace", {"namespace": "lab"}, ("DELETE", "/admin-api/namespaces/{lab}")),
    ("invite_to_namespace", {"namespace": "team"}, ("POST", "/admin-api/namespaces/{team}/invite")),
    ("leave_namespace", {"namespace": "lab"}, ("POST", "/admin-api/namespaces/{lab}/leave")),
    ("list_group_members", {"group": "beta"}, ("GET", "/admin-api/groups/{beta}/members")),
    ("add_group_members", {"group": "alpha", "members": [{"identity": "ab" * 32, "role": "Member"}]},
     ("POST", "/admin-api/groups/{alpha}/members")),
    ("set_group_visibility", {"group": "deep", "visibility": "open"},
     ("PUT", "/admin-api/groups/{deep}/settings/subgroup-visibility")),
    ("set_group_metadata", {"group": "team", "name": "t"}, ("PUT", "/admin-api/groups/{team}/metadata")),
    ("join_open_group", {"group": "alpha"}, ("POST", "/admin-api/groups/{alpha}/join-via-inheritance")),
    ("create_context", {"application": KV, "group": "alpha"}, ("POST", "/admin-api/contexts")),
    ("create_context", {"application": KV, "namespace": "team"}, ("POST", "/admin-api/contexts")),
    ("describe_group", {"group": "alpha"}, ("GET", "/admin-api/groups/{alpha}")),
    ("delete_group", {"group": "deep"}, ("DELETE", "/admin-api/groups/{deep}")),
]


@pytest.mark.parametrize("tool, arguments, request_seen", BY_NAME, ids=["%s-%s" % (t, "-".join(a)) for t, a, _ in BY_NAME])
def test_every_namespace_or_group_argument_takes_a_name(serve, node, tool, arguments, request_seen):
    server = serve(node.double)
    result = server.call_tool(tool, arguments)
    assert not result.get("isError"), result
    method, path = request_seen
    path = path.format(**vars(node))
    seen = node.double.requests_to(method, path)
    assert seen and any(entry["path"] == path for entry in seen), [e["path"] for e in node.double.log]
    if tool == "create_context":                 # the body carries the id, never the name
        assert seen[-1]["json"]["groupId"] == (node.alpha if "group" in arguments else node.team)
    if arguments.get("parent"):
        assert seen[-1]["json"]["parentGroupId"] == node.deep
    assert node.double.refusals == []


def test_delete_group_refuses_a_namespace_given_by_name(serve, node):
    server = serve(node.double)
    text = error_text(server.call_tool("delete_group", {"group": "lab"}))
    assert node.lab in text and "delete_namespace" in text, text
    assert not node.double.requests_to("DELETE", "/admin-api/groups/%s" % node.lab)


def test_an_id_is_used_as_given_without_reading_names(serve, node):
    server = serve(node.double)
    server.tool_json("list_group_members", {"group": node.beta})
    paths = [e["path"] for e in node.double.log if "/namespaces" in e["path"] or "/groups" in e["path"]]
    assert paths == ["/admin-api/groups/%s/members" % node.beta], paths
    upper = node.double.add_namespace(node.kv, name="upper")
    server.tool_json("invite_to_namespace", {"namespace": upper.upper()})     # any case: the node judges it
    assert not node.double.requests_to("GET", "/admin-api/namespaces")


def test_a_name_none_carries_is_refused_naming_the_argument_and_where_to_look(serve, node):
    server = serve(node.double)
    text = error_text(server.call_tool("create_group", {"namespace": "tema", "name": "x"}))
    assert text == ('Error: namespace: no namespace on this node is named "tema". Nothing was done; list_namespaces '
                    "lists the namespaces with their ids and names.")
    text = error_text(server.call_tool("create_context", {"application": KV, "group": "nowhere"}))
    assert text == ('Error: group: no namespace or group on this node is named "nowhere". Nothing was done; '
                    "list_namespaces lists the namespaces with their ids and names (describe_group of a namespace "
                    "shows its subgroups).")
    assert writes(node.double) == []


def test_two_carriers_of_a_name_are_listed_and_nothing_is_done(serve, node):
    other = node.double.add_group(namespace=node.lab, name="alpha")
    server = serve(node.double)
    text = error_text(server.call_tool("join_open_group", {"group": "alpha"}))
    assert text == ('Error: group: 2 namespaces and groups are named "alpha": subgroup %s ("alpha", in namespace %s), '
                    'subgroup %s ("alpha", in namespace %s). Nothing was done; pass the id of the one you mean.'
                    % (node.alpha, node.team, other, node.lab))
    twin = node.double.add_namespace(node.counter, name="lab")
    text = error_text(server.call_tool("delete_namespace", {"namespace": "lab"}))
    assert "2 namespaces are named \"lab\"" in text and node.lab in text and twin in text
    assert writes(node.double) == []


def test_a_namespace_argument_never_takes_a_subgroup_by_name(serve, node):
    server = serve(node.double)
    text = error_text(server.call_tool("invite_to_namespace", {"namespace": "beta"}))
    assert text == ('Error: namespace: "beta" is the name of subgroup %s ("beta", in namespace %s), not of a namespace. '
                    "Pass a namespace id or name; list_namespaces lists them." % (node.beta, node.lab))
    assert writes(node.double) == []
    # A namespace and a subgroup sharing a name: a namespace argument means the namespace, a group one is ambiguous.
    node.double.add_group(namespace=node.team, name="lab")
    server.tool_json("invite_to_namespace", {"namespace": "lab"})
    assert node.double.requests_to("POST", "/admin-api/namespaces/%s/invite" % node.lab)
    assert "2 namespaces and groups are named" in error_text(server.call_tool("list_group_members", {"group": "lab"}))


def test_a_name_is_taken_exactly_as_given_by_every_tool(serve, node):
    server = serve(node.double)
    refused = error_text(server.call_tool("list_group_members", {"group": "Beta"}))    # a read refuses it too
    assert refused == ('Error: group: no namespace or group is named exactly "Beta"; named in another case: '
                       'subgroup %s ("beta", in namespace %s). Nothing was done; pass the name as it is spelled, or '
                       'the id.' % (node.beta, node.lab))
    assert "Error: group: no namespace or group on this node is named \" beta\"" in error_text(
        server.call_tool("list_group_members", {"group": " beta"}))                     # a name is taken as given
    assert not node.double.requests_to("GET", "/admin-api/groups/%s/members" % node.beta)
    assert server.tool_json("list_group_members", {"group": "beta"})["members"]
    exact = node.double.add_group(namespace=node.team, name="Beta")
    server.tool_json("list_group_members", {"group": "Beta"})
    assert node.double.requests_to("GET", "/admin-api/groups/%s/members" % exact)


def test_a_subtree_the_node_will_not_show_is_left_out(serve, node):
    node.double.faults = {"status": 403, "json": {"error": "node is not a member of group '%s'" % node.alpha},
                          "paths": ["/admin-api/groups/%s/subgroups" % node.alpha]}
    server = serve(node.double)
    assert server.tool_json("list_group_members", {"group": "beta"})
    assert "no namespace or group" in error_text(server.call_tool("list_group_members", {"group": "deep"}))


def test_a_blank_name_is_refused(serve, node):
    server = serve(node.double)
    assert error_text(server.call_tool("leave_namespace", {"namespace": "  "})) == (
        "Error: namespace must name a namespace: its id or its name.")


def test_the_schemas_stay_plain_strings(serve, node):
    """The marker that makes an argument resolve never reaches tools/list; a name is said once, in the
    instructions."""
    server = serve(node.double)
    tools = tools_by_name(server)
    assert tools["delete_namespace"]["inputSchema"]["properties"]["namespace"] == {"type": "string"}
    assert tools["join_open_group"]["inputSchema"]["properties"]["group"] == {"type": "string"}
    assert '"names"' not in json.dumps([t["inputSchema"] for t in tools.values()])


# ── 2. rows a model can read ──────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("rows", [False, True], ids=["flat map", "alias rows"])
def test_context_rows_name_their_app_and_aliases(serve, rows):
    node = Node()
    node.double.alias_rows = rows
    server = serve(node.double)
    listed = {c["id"]: c for c in server.tool_json("list_contexts")["contexts"]}
    assert listed[node.notes]["application"] == KV and listed[node.notes]["aliases"] == ["kv-main", "notes-too"]
    assert listed[node.plain]["aliases"] == []
    assert list(listed[node.notes])[:3] == ["id", "applicationId", "application"]
    filtered = server.tool_json("list_contexts", {"application": "kv-store"})["contexts"]
    assert {c["id"]: c["aliases"] for c in filtered} == {node.notes: ["kv-main", "notes-too"], node.plain: []}


def test_a_context_of_an_app_no_longer_installed_names_its_app_by_id(serve, node):
    node.double.remove_app(node.counter)
    orphan = hex_id("orphan")
    with node.double._lock:
        node.double._contexts[orphan] = dict(node.double._contexts[node.plain], id=orphan, applicationId=node.counter)
    server = serve(node.double)
    rows = {c["id"]: c for c in server.tool_json("list_contexts")["contexts"]}
    assert rows[orphan]["application"] == node.counter


def test_application_rows_list_their_services(serve, node):
    server = serve(node.double)
    apps = {a["package"]: a for a in server.tool_json("list_applications")["apps"]}
    assert apps[WORLD]["services"] == ["admin", "api"] and apps[KV]["services"] == []


def test_namespace_rows_name_their_app(serve, node):
    server = serve(node.double)
    rows = {n["namespaceId"]: n for n in server.tool_json("list_namespaces")["namespaces"]}
    assert rows[node.team]["application"] == KV and rows[node.lab]["application"] == COUNTER
    assert list(rows[node.team]).index("application") == list(rows[node.team]).index("targetApplicationId") + 1


# ── 3. describe_app for a multi-service app ───────────────────────────────────────────────────────

def test_describe_app_without_a_service_shows_every_service(serve, node):
    server = serve(node.double)
    result = server.call_tool("describe_app", {"app": "world"})
    assert not result.get("isError"), result
    summary = result["structuredContent"]
    assert [s["service"] for s in summary["services"]] == ["admin", "api"]
    assert summary["services"][0]["methods"] == ["[mut] reset(hard: bool) -> unit"]
    assert summary["services"][1]["methods"] == ["[view] ping() -> string"]
    assert summary["note"] == ("A handle names one service: pass service (admin, api) to describe_app or select_app "
                               "for an app_handle.")
    assert "app_handle" not in summary and summary["service"] is None
    assert text_of(result) == "This app ships no guide."
    one = server.call_tool("describe_app", {"app": "world", "service": "api"})["structuredContent"]
    assert one["service"] == "api" and one["app_handle"]


# ── 4. create_context takes alias ─────────────────────────────────────────────────────────────────

def test_create_context_with_an_alias(serve, node):
    server = serve(node.double)
    created = server.tool_json("create_context", {"application": KV, "group": "team", "alias": "team-notes"})
    assert created["alias"] == "team-notes"
    assert server.tool_json("lookup_alias", {"name": "team-notes"})["contextId"] == created["contextId"]


@pytest.mark.parametrize("alias, said", [
    ("team notes", 'Error: alias "team notes" is not an alias the node takes (1-50 of A-Z a-z 0-9 . _ -). Nothing was '
                   "created."),
    ("kv-main", 'Error: Alias "kv-main" already names context {notes}. Choose another alias (or delete_alias it '
                "first); nothing was created."),
])
def test_an_alias_that_cannot_be_made_is_refused_before_the_context_is_created(serve, node, alias, said):
    server = serve(node.double)
    text = error_text(server.call_tool("create_context", {"application": KV, "group": "team", "alias": alias}))
    assert text == said.format(notes=node.notes)
    assert not node.double.requests_to("POST", "/admin-api/contexts")


def test_a_context_whose_alias_failed_stays_and_the_answer_names_it(serve, node):
    node.double.faults = {"status": 500, "json": {"error": "alias store exploded"},
                          "paths": ["/admin-api/alias/create/"]}
    server = serve(node.double)
    result = server.call_tool("create_context", {"application": KV, "group": "team", "alias": "fresh"})
    assert not result.get("isError"), result            # the context exists: a retry would make a second one
    created = result["structuredContent"]
    assert created["alias"] is None and created["contextId"] in node.double._contexts
    assert created["aliasNote"] == ('Context %s was created, but alias "fresh" was not: alias store exploded. Retry '
                                    "create_alias for context %s." % (created["contextId"], created["contextId"]))
    assert created["contextId"] in text_of(result)


def test_create_context_says_what_name_and_group_are(serve, node):
    properties = tools_by_name(serve(node.double))["create_context"]["inputSchema"]["properties"]
    assert properties["name"]["description"] == "A label list_contexts shows; not an alias."
    # group is optional in the schema, and the description says what it defaults to
    assert properties["group"]["description"] == "Namespace or subgroup. Default: the app's only namespace."
    assert "group" not in tools_by_name(serve(node.double))["create_context"]["inputSchema"].get("required", [])
    assert properties["alias"] == {"type": "string"}


# ── 5. delete_context leaves no dangling alias; delete_alias ──────────────────────────────────────

@pytest.mark.parametrize("rows", [False, True], ids=["flat map", "alias rows"])
def test_delete_context_deletes_the_aliases_naming_it(serve, rows):
    node = Node()
    node.double.alias_rows = rows
    node.double.add_alias("other", node.plain)
    server = serve(node.double)
    answer = server.tool_json("delete_context", {"context": "kv-main"})
    assert answer == {"isDeleted": True, "contextId": node.notes, "aliasesDeleted": ["kv-main", "notes-too"]}
    for gone in ("kv-main", "notes-too"):
        assert text_of(server.call_tool("lookup_alias", {"name": gone})) == 'No alias named "%s" on this node.' % gone
    assert server.tool_json("lookup_alias", {"name": "other"})["contextId"] == node.plain
    assert server.tool_json("delete_context", {"context": node.plain})["aliasesDeleted"] == ["other"]


def test_aliases_left_after_a_failed_cleanup_are_named(serve, node):
    node.double.faults = {"status": 500, "json": {"error": "alias store exploded"},
                          "paths": ["/admin-api/alias/delete/"]}
    server = serve(node.double)
    text = error_text(server.call_tool("delete_context", {"context": node.notes}))
    assert text == ("Error: Context %s was deleted, but not its aliases kv-main, notes-too: alias store exploded. "
                    "Retry delete_alias for each." % node.notes)
    assert node.notes not in node.double._contexts


def test_delete_alias(serve, node):
    server = serve(node.double)
    tool = tools_by_name(server)["delete_alias"]
    assert tool["annotations"] == {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True}
    said = text_of(server.call_tool("delete_alias", {"alias": "kv-main"}))
    assert said == 'Alias "kv-main" deleted; it named context %s.' % node.notes
    assert text_of(server.call_tool("lookup_alias", {"name": "kv-main"})) == 'No alias named "kv-main" on this node.'
    assert node.notes in node.double._contexts, "the context stays"
    missed = server.call_tool("delete_alias", {"alias": "kv-main"})
    assert not missed.get("isError") and text_of(missed) == 'No alias named "kv-main" on this node.'
    assert len(node.double.requests_to("POST", "/admin-api/alias/delete/")) == 1, "a miss deletes nothing"


# ── 6. create_group shows what it made ────────────────────────────────────────────────────────────

def test_create_group_answers_where_it_sits_and_who_may_join(serve, node):
    server, groups = serve(node.double), node.double._groups
    made, direct = made_by(node.double, lambda: server.tool_json("create_group", {"namespace": "team",
                                                                                  "name": "open-one"}))
    assert direct == {"groupId": made, "parentId": node.team, "namespaceId": node.team, "visibility": "open",
                      "name": "open-one"}
    assert groups[made]["parent"] == node.team and groups[made]["name"] == "open-one"
    made, restricted = made_by(node.double, lambda: server.tool_json("create_group", {"namespace": "team",
                                                                                      "visibility": "restricted"}))
    assert restricted["groupId"] == made and restricted["visibility"] == "restricted" == groups[made]["visibility"]
    made, nested = made_by(node.double, lambda: server.tool_json("create_group", {"namespace": "team",
                                                                                  "parent": "alpha"}))
    assert nested == {"groupId": made, "parentId": node.alpha, "namespaceId": node.team, "visibility": "restricted"}
    assert groups[made]["parent"] == node.alpha
    made, opened = made_by(node.double, lambda: server.tool_json("create_group", {
        "namespace": "team", "parent": "alpha", "visibility": "open"}))
    assert opened["groupId"] == made and opened["visibility"] == "open" == groups[made]["visibility"]


def test_create_group_says_what_open_and_restricted_mean(serve, node):
    visibility = tools_by_name(serve(node.double))["create_group"]["inputSchema"]["properties"]["visibility"]
    assert visibility["description"] == ("open: namespace members can join it; restricted: members must be added. "
                                         "Default open, restricted with parent.")


# ── 8. upload_blob takes text ─────────────────────────────────────────────────────────────────────

def test_upload_blob_takes_text(serve, node):
    server = serve(node.double)
    uploaded = server.tool_json("upload_blob", {"text": "hello calimero ✓"})
    assert node.double._blobs[uploaded["blobId"]] == "hello calimero ✓".encode("utf-8")


@pytest.mark.parametrize("arguments, said", [
    ({"text": "a", "data": "YQ=="}, "not both"),
    ({"hash": "ab" * 32}, "and neither was given"),
])
def test_upload_blob_takes_data_or_text_exactly(serve, node, arguments, said):
    server = serve(node.double)
    text = error_text(server.call_tool("upload_blob", arguments))
    assert text == ("Error: upload_blob takes data (base64) or text (UTF-8): exactly one of them, %s. Nothing was sent."
                    % said)
    assert not node.double.requests_to("PUT")


def test_upload_blob_says_what_hash_and_context_are_for(serve, node):
    properties = tools_by_name(serve(node.double))["upload_blob"]["inputSchema"]
    assert "required" not in properties
    assert properties["properties"]["hash"]["description"] == "Refused unless the bytes have it."
    assert properties["properties"]["context"]["description"] == "Announce it to its peers."


# ── 9. words ──────────────────────────────────────────────────────────────────────────────────────

def test_the_instructions_say_how_app_tools_route_and_how_groups_are_named(serve, node):
    server = serve(node.double, initialize=None)
    instructions = server.initialize()["instructions"]
    assert "app_handle on every app tool call, or _context (the context to act in) instead of one." in instructions
    assert "a namespace or group by its id or name" in instructions
    assert len(instructions) <= 2048


# ── one id form; the name rules everywhere (issue 32, items 2 and 6) ────────────────────────────────

def test_an_upper_case_namespace_id_meets_delete_groups_guard_on_an_older_node(serve, node):
    node.double.legacy_lifecycle = True             # an older node would delete the namespace itself
    server = serve(node.double)
    text = error_text(server.call_tool("delete_group", {"group": node.lab.upper()}))
    assert text.startswith('Error: %s is a namespace ("lab"): delete_group deletes subgroups.' % node.lab), text
    assert writes(node.double) == [] and node.lab in node.double._groups


def test_account_and_group_ids_reach_the_node_lower_case_whatever_case_they_were_given_in(serve, node):
    alice, bob = hex_id("alice"), hex_id("bob")
    server = serve(node.double)
    start = len(node.double.log)
    added = server.call_tool("add_group_members", {"group": node.alpha.upper(), "members": [
        {"identity": alice.upper(), "role": "Member"}, {"identity": bob.upper(), "role": "Member"}]})
    assert not added.get("isError"), added
    role = server.call_tool("set_member_role", {"group": node.alpha.upper(), "member": bob.upper(), "role": "Admin"})
    assert not role.get("isError"), role
    node.double.member_names[alice] = "Alice"
    removed = server.call_tool("remove_group_members", {"group": node.alpha.upper(),
                                                        "members": [alice.upper(), bob]})
    assert text_of(removed) == 'Removed %s ("Alice"), %s from subgroup %s ("alpha", in namespace %s).' % (
        alice, bob, node.alpha, node.team)
    sent = [(e["method"], e["path"], e["json"]) for e in writes(node.double)[-3:]]
    assert sent == [
        ("POST", "/admin-api/groups/%s/members" % node.alpha,
         {"members": [{"identity": alice, "role": "Member"}, {"identity": bob, "role": "Member"}]}),
        ("PUT", "/admin-api/groups/%s/members/%s/role" % (node.alpha, bob), {"role": "Admin"}),
        ("POST", "/admin-api/groups/%s/members/remove" % node.alpha, {"members": [alice, bob]})], sent
    assert all(entry["path"] == entry["path"].lower() for entry in node.double.log[start:])
    said = text_of(server.call_tool("describe_group", {"group": node.alpha.upper()}))
    assert node.alpha.upper() not in said and node.alpha in said


def test_a_context_id_in_upper_case_is_the_context(serve, node):
    server = serve(node.double)
    listed = server.call_tool("call", {"app": "kv-store", "context": node.notes.upper(), "method": "len"})
    assert not listed.get("isError"), listed
    many = json.loads(text_of(server.call_tool("call_many", {"calls": [
        {"app": KV, "context": node.notes.upper(), "method": "len"}]})))
    assert many[0]["ok"] is True, many


def test_a_rename_follows_creates_rules(serve, node):
    server = serve(node.double)
    start = len(writes(node.double))
    hexed = error_text(server.call_tool("set_group_metadata", {"group": "beta", "name": "ab" * 32}))
    assert hexed == ('Error: name "%s" reads as a 64-hex id, and a name of that form is taken as an id everywhere, '
                     "so it could never be named. Choose another name. Nothing was changed." % ("ab" * 32))
    assert len(writes(node.double)) == start, "nothing was sent"
    renamed = server.call_tool("set_group_metadata", {"group": "beta", "name": "alpha"})["structuredContent"]
    assert renamed["name"] == "alpha" and renamed["renamedFrom"] == "beta"
    assert renamed["note"] == ('The name "alpha" is also carried by subgroup %s ("alpha", in namespace %s): a name '
                               "names one thing only while it is unique, so pass ids to tell them apart."
                               % (node.alpha, node.team))
    kept = server.call_tool("set_group_metadata", {"group": node.beta, "name": "alpha"})["structuredContent"]
    assert "note" not in kept or node.beta not in kept["note"], "a group is no namesake of itself"


@pytest.mark.parametrize("given", [" kv-store", "kv-store ", "KV-Store", "com.calimero.KV-store"])
def test_uninstall_application_resolves_a_name_only_as_given(serve, node, given):
    server = serve(node.double)
    text = error_text(server.call_tool("uninstall_application", {"application": given}))
    assert text == ('Error: Application "%s" is not named exactly so; %s (id %s). Nothing was done: pass the name '
                    "as it is spelled, or the id." % (given, KV, node.kv)), text
    assert writes(node.double) == [] and node.kv in node.double._apps


def test_uninstall_application_takes_an_upper_case_id(serve, node):
    server = serve(node.double)
    done = server.call_tool("uninstall_application", {"application": node.counter.upper()})
    assert done["structuredContent"]["package"] == COUNTER, done


def test_upgrade_group_moves_only_to_a_newer_build_of_its_own_signer(serve, node):
    other_signer = node.double.add_app(dict(kv_store_spec(), signer_id="someone-else", version="9.0.0"))
    older = node.double.add_app(dict(kv_store_spec(), id=hex_id("older kv build"), version="0.9.0"))
    server = serve(node.double)
    signer = error_text(server.call_tool("upgrade_group", {"group": "team", "application": other_signer}))
    assert ("application %s is %s signed by someone-else, another publisher's build, and upgrade_group moves a "
            "group only to a build of its own signer. Nothing was sent." % (other_signer, KV)) in signer, signer
    old = error_text(server.call_tool("upgrade_group", {"group": "team", "application": older}))
    assert "application %s is version 0.9.0, not newer. Nothing was sent" % older in old, old
    assert writes(node.double) == []


def test_a_generated_tools_context_is_one_id_form_and_its_parameters_are_the_apps(serve, node):
    """Only the context option is an id of ours: a method's own parameters are app data, kept as given."""
    server = serve(node.double)
    value = "AB" * 32
    deadline = time.monotonic() + 20
    while "kv_store_set" not in server.tool_names():
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.1)
    stored = server.call_tool("kv_store_set", {"_context": node.notes.upper(), "key": "k", "value": value})
    assert not stored.get("isError"), stored
    assert stored["content"][1]["text"] == 'set ran in context %s (named "notes"); it returns nothing.' % node.notes
    got = server.call_tool("call", {"app": KV, "context": node.notes, "method": "get", "args": {"key": "k"}})
    assert got["content"][0]["text"] == json.dumps(value), got
