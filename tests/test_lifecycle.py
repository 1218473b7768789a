"""Every create has its undo: the lifecycle tools (sync_context, get_blob, describe_group,
remove_group_members, set_member_role, delete_group, upgrade_group), install from a path, describe_app's versions and
node_status's peers and identity, through the real server against the double: what reached the node (`double.log`)
and what came back, on the newest nodes and on the older forms node-api.md §0.6 names (`legacy_lifecycle`)."""
from __future__ import annotations

import base64
import hashlib
import json
import socket
import time

import pytest

from mcp_client import fixed_names
from mero_mcp import TEXT_BOUND
from node_double import (FRESH_IDENTITY, NODE_ACCOUNT, NODE_PUBLIC_KEY, NodeDouble, counter_spec, hex_id,
                         sample_double)
from test_fixed_tools import INSTALLED_NOTE, error_text, namespace_of, text_of
from test_read_only import ON, READ_ONLY_SAYS, run_check

KV = "com.calimero.kv-store"
STRANGER = hex_id("someone else")
ALICE = hex_id("alice")
# sync_context's note on a node with no peers, as written here (no spec text gives it): not the server's constant.
NO_PEERS = "This node has no peers right now: nothing arrives until one connects (node_status counts them)."




def demo_context(double):
    return next(c["id"] for c in double._contexts.values() if c["name"] == "demo")


def sent(double, start):
    """(method, path, json body) of the writes that reached the double since `start` (reads and alias lookups,
    which change nothing, left out)."""
    return [(e["method"], e["path"], e["json"]) for e in double.log[start:]
            if e["method"] not in ("GET", "HEAD") and not e["path"].startswith("/admin-api/alias/lookup/")]


def blob_requests(double, start):
    """(method, path, query) of the blob reads since `start` (the catalog's own reads left out)."""
    return [(e["method"], e["path"], e["query"]) for e in double.log[start:] if e["path"].startswith("/admin-api/blobs")]


# ── sync_context ──────────────────────────────────────────────────────────────────────────────────

def test_sync_context_asks_the_sync_route_and_force_the_resync_route(server, double):
    context = demo_context(double)
    start = len(double.log)
    synced = server.call_tool("sync_context", {"context": "demo"})
    assert text_of(synced) == "Context %s: sync from its peers requested. %s" % (context, NO_PEERS)
    assert sent(double, start) == [("POST", "/admin-api/contexts/sync/" + context, None)]
    start = len(double.log)
    resynced = server.tool_json("sync_context", {"context": context, "force": True})
    assert resynced == {"answer": {"contextId": context, "resyncStarted": True}, "note": NO_PEERS}
    assert sent(double, start) == [("POST", "/admin-api/contexts/%s/resync" % context, {"force": True})]
    double.peer_count = 3                      # with peers to ask, the node's answer as it is
    assert text_of(server.call_tool("sync_context", {"context": "demo"})) == (
        "Context %s: sync from its peers requested." % context)
    assert server.tool_json("sync_context", {"context": "demo", "force": True}) == {"contextId": context,
                                                                                   "resyncStarted": True}
    assert double.syncs == [{"context": context, "force": False}, {"context": context, "force": True}] * 2
    assert double.refusals == []


def test_sync_context_names_a_context_it_cannot_find_and_the_nodes_refusal(server, double):
    missing = error_text(server.call_tool("sync_context", {"context": "nowhere"}))
    assert missing == 'Error: Context "nowhere" is neither a context id nor an alias on this node.'
    loose = double.add_context(KV, group_id=None)
    double._contexts[loose]["groupId"] = None
    refused = error_text(server.call_tool("sync_context", {"context": loose, "force": True}))
    assert refused == "Error: context %s: it is in no group, so no peer can be asked" % loose
    assert double.syncs == []


# ── get_blob ──────────────────────────────────────────────────────────────────────────────────────

def blob_of(double, data):
    blob_id = hashlib.sha256(data).hexdigest()
    double._blobs[blob_id] = data
    return blob_id


def every_page(server, blob, **args):
    pages, offset = [], None
    while True:
        page = server.tool_json("get_blob", dict(args, blob=blob, **({"offset": offset} if offset else {})))
        pages.append(page)
        offset = page["nextOffset"]
        if offset is None:
            return pages


def test_get_blob_answers_text_as_text_after_a_head(server, double):
    blob = blob_of(double, "héllo calimero\n".encode("utf-8"))
    start = len(double.log)
    page = server.tool_json("get_blob", {"blob": blob})
    assert page == {"blobId": blob, "size": 16, "mimeType": "text/plain", "encoding": "utf-8", "offset": 0,
                    "nextOffset": None, "content": "héllo calimero\n"}
    assert blob_requests(double, start) == [("HEAD", "/admin-api/blobs/" + blob, {}),
                                            ("GET", "/admin-api/blobs/" + blob, {})]


def test_get_blob_answers_other_bytes_as_base64_and_asks_a_contexts_peers(server, double):
    data = bytes(range(256)) * 3
    blob = blob_of(double, data)
    start = len(double.log)
    page = server.tool_json("get_blob", {"blob": blob, "context": "demo"})
    assert (page["encoding"], base64.b64decode(page["content"]), page["mimeType"]) == (
        "base64", data, "application/octet-stream")
    asked = {"context_id": demo_context(double)}
    assert blob_requests(double, start) == [("HEAD", "/admin-api/blobs/" + blob, asked),
                                            ("GET", "/admin-api/blobs/" + blob, asked)]


def test_get_blob_pages_long_text_without_splitting_a_character(server, double):
    """Multi-byte characters and JSON escapes: each answer stays within the bound, pages join to the blob."""
    text = ("ünïcødé \"quoted\"\n€ " * 9000)
    data = text.encode("utf-8")
    blob = blob_of(double, data)
    pages = every_page(server, blob)
    assert len(pages) > 2 and {p["encoding"] for p in pages} == {"utf-8"}
    assert "".join(p["content"] for p in pages) == text
    assert [p["offset"] for p in pages[1:]] == [p["nextOffset"] for p in pages[:-1]]
    for page in pages:
        assert len(json.dumps(page, indent=2, ensure_ascii=False)) <= TEXT_BOUND


def test_get_blob_pages_binary_and_starts_mid_character_as_base64(server, double):
    data = bytes(range(256)) * 400
    blob = blob_of(double, data)
    pages = every_page(server, blob)
    assert len(pages) == 3 and b"".join(base64.b64decode(p["content"]) for p in pages) == data
    text_blob = blob_of(double, "€uro".encode("utf-8"))
    inside = server.tool_json("get_blob", {"blob": text_blob, "offset": 1})     # inside the € sequence
    assert (inside["encoding"], base64.b64decode(inside["content"])) == ("base64", "€uro".encode("utf-8")[1:])


def test_get_blob_follows_the_configured_answer_cap(serve):
    double = sample_double()
    blob = blob_of(double, b"x" * 2000)
    server = serve(double, CALIMERO_MCP_MAX_RESPONSE_BYTES="1000")
    start = len(double.log)
    refused = error_text(server.call_tool("get_blob", {"blob": blob}))
    assert refused.startswith("Error: Blob %s is 2000 bytes, more than the 1000 bytes this server takes" % blob)
    assert blob_requests(double, start) == [("HEAD", "/admin-api/blobs/" + blob, {})]


def test_get_blob_refuses_an_offset_past_the_end_and_a_blob_past_the_cap(server, double):
    blob = blob_of(double, b"four")
    past = error_text(server.call_tool("get_blob", {"blob": blob, "offset": 5}))
    assert past == "Error: offset 5 is past the end of blob %s, which is 4 bytes." % blob
    huge = hex_id("huge blob")
    double._blobs[huge] = b"\0" * (64 * 1024 * 1024 + 1)
    start = len(double.log)
    refused = error_text(server.call_tool("get_blob", {"blob": huge}))
    assert refused.startswith("Error: Blob %s is 67108865 bytes, more than the 67108864 bytes this server takes in "
                              "one answer (CALIMERO_MCP_MAX_RESPONSE_BYTES)" % huge)
    assert blob_requests(double, start) == [("HEAD", "/admin-api/blobs/" + huge, {})]      # never downloaded
    del double._blobs[huge]
    gone = error_text(server.call_tool("get_blob", {"blob": hex_id("none")}))
    assert gone == ("Error: Blob %s is not on this node. list_blobs shows the blobs this node holds; pass context "
                    "to have the node ask that context's peers." % hex_id("none"))
    malformed = error_text(server.call_tool("get_blob", {"blob": "nope"}))
    assert malformed == 'Error: "nope" is not a blob id. A blob id is 64 hex characters (list_blobs shows them).'


def test_get_blob_reads_an_older_nodes_headers(serve):
    double = sample_double()
    double.legacy_lifecycle = True
    server = serve(double)
    blob = blob_of(double, b"plain")
    assert server.tool_json("get_blob", {"blob": blob})["content"] == "plain"


# ── describe_group ────────────────────────────────────────────────────────────────────────────────

def nested_groups(double):
    namespace = namespace_of(double)
    team = double.add_group(namespace=namespace, name="team", visibility="open",
                            metadata={"name": "The team", "data": {"floor": "3"}, "updatedAt": 1, "updatedBy": "x"})
    squad = double.add_group(parent=team, name="squad")
    return namespace, team, squad


# what memberCount and contextCount count, said with them (issue 42)
OWN_COUNTS = ("memberCount and contextCount count this group's own: a namespace's members, a subgroup's only those "
              "added to it or that joined it; the contexts directly in it. Each subgroup's counts are its own.")


@pytest.mark.parametrize("legacy", [False, True], ids=["rc.83", "older group info"])
def test_describe_group_assembles_what_the_node_keeps_in_several_places(serve, legacy):
    double = sample_double()
    double.legacy_group_info = legacy          # no namespaceId: the namespaces are walked to find it
    namespace, team, squad = nested_groups(double)
    server = serve(double)
    kv_id = double._app_key(KV)
    described = server.tool_json("describe_group", {"group": squad})
    assert described == {"groupId": squad, "name": "squad", "kind": "subgroup", "namespace": namespace,
                         "parent": team, "application": {"id": kv_id, "package": KV, "version": "1.0.0"},
                         "visibility": "restricted",
                         "memberCount": 1, "contextCount": 0, "countsNote": OWN_COUNTS, "subgroups": [],
                         "metadata": None, "upgrade": None}
    middle = server.tool_json("describe_group", {"group": team})
    assert (middle["name"], middle["parent"], middle["visibility"], middle["metadata"], middle["subgroups"]) == (
        "The team", namespace, "open", {"floor": "3"},
        [{"groupId": squad, "name": "squad", "memberCount": 1, "contextCount": 0}])
    root = server.tool_json("describe_group", {"group": namespace})
    assert (root["kind"], root["name"], root["namespace"], root["parent"], root["contextCount"]) == (
        "namespace", "demo-team", namespace, None, 1)
    founded = double._groups[namespace]              # when and by whom: a namespace's row says, a subgroup's has none
    assert (root["createdAt"], root["founder"]) == (
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(founded["createdAt"])), double.account)
    assert "createdAt" not in described and "founder" not in described
    assert double.refusals == [] and all(e["method"] == "GET" for e in double.log)


def test_describe_group_says_the_nodes_refusal(server, double):
    missing = hex_id("no group")
    assert error_text(server.call_tool("describe_group", {"group": missing})) == (
        "Error: group '%s' not found" % missing)


# ── remove_group_members / set_member_role ────────────────────────────────────────────────────────

def test_remove_group_members_checks_they_are_members_then_removes_them(server, double):
    namespace = namespace_of(double)
    double.set_role(namespace, "Member", ALICE)
    start = len(double.log)
    stranger = error_text(server.call_tool("remove_group_members", {"group": namespace,
                                                                     "members": [ALICE, STRANGER]}))
    assert stranger == ("Error: Not members of namespace %s (\"demo-team\"): %s. Nothing was removed; "
                        "list_group_members shows its members." % (namespace, STRANGER))
    assert sent(double, start) == []
    removed = server.call_tool("remove_group_members", {"group": namespace, "members": [ALICE.upper()]})
    # Hex in any case, sent and said in the one form the node lists
    assert text_of(removed) == 'Removed %s from namespace %s ("demo-team").' % (ALICE.lower(), namespace)
    assert sent(double, start) == [("POST", "/admin-api/groups/%s/members/remove" % namespace,
                                    {"members": [ALICE.lower()]})]
    listed = server.tool_json("list_group_members", {"group": namespace})["members"]
    assert [m["identity"] for m in listed] == [NODE_ACCOUNT]
    last = error_text(server.call_tool("remove_group_members", {"group": namespace, "members": [NODE_ACCOUNT]}))
    assert last.startswith("Error: cannot remove the last admin of the group. Make another member Admin first")


def test_remove_group_members_on_an_older_node_that_answers_null(serve):
    double = sample_double()
    double.legacy_lifecycle = True
    namespace = namespace_of(double)
    double.set_role(namespace, "Member", ALICE)
    server = serve(double)
    removed = server.call_tool("remove_group_members", {"group": namespace, "members": [ALICE]})
    assert not removed.get("isError") and ALICE not in double._groups[namespace]["members"]


def test_set_member_role_changes_the_role_the_list_shows(server, double):
    namespace = namespace_of(double)
    double.set_role(namespace, "Member", ALICE)
    start = len(double.log)
    done = server.call_tool("set_member_role", {"group": namespace, "member": ALICE, "role": "ReadOnly"})
    assert text_of(done) == "Member %s of group %s now has role ReadOnly." % (ALICE, namespace)
    assert sent(double, start) == [("PUT", "/admin-api/groups/%s/members/%s/role" % (namespace, ALICE),
                                    {"role": "ReadOnly"})]
    listed = {m["identity"]: m["role"] for m in server.tool_json("list_group_members", {"group": namespace})["members"]}
    assert listed == {NODE_ACCOUNT: "Admin", ALICE: "ReadOnly"}
    tee = error_text(server.call_tool("set_member_role", {"group": namespace, "member": ALICE, "role": "ReadOnlyTee"}))
    assert tee == ('Error: Invalid arguments for set_member_role:\n- role: expected one of "Admin", "Member", '
                   '"ReadOnly", got "ReadOnlyTee"')
    stranger = error_text(server.call_tool("set_member_role", {"group": namespace, "member": STRANGER,
                                                                "role": "Admin"}))
    assert stranger == "Error: member %s not found in group %s" % (STRANGER, namespace)
    last = error_text(server.call_tool("set_member_role", {"group": namespace, "member": NODE_ACCOUNT,
                                                            "role": "Member"}))
    assert last.startswith("Error: cannot demote the last admin of the group.")
    assert double._groups[namespace]["members"][NODE_ACCOUNT] == "Admin" and double.refusals == []


# ── delete_group ──────────────────────────────────────────────────────────────────────────────────

def test_delete_group_cascades_on_the_newest_nodes_and_says_what_went(server, double):
    namespace, team, squad = nested_groups(double)
    in_team = double.add_context(KV, group_id=team)
    in_squad = double.add_context(KV, group_id=squad)
    start = len(double.log)
    deleted = server.tool_json("delete_group", {"group": team})
    assert deleted == {"isDeleted": True, "groupId": team, "name": "team", "deletedSubgroups": [squad],
                       "deletedContexts": sorted([in_team, in_squad])}
    assert sent(double, start) == [("DELETE", "/admin-api/groups/" + team, {})]
    assert team not in double._groups and squad not in double._groups
    assert demo_context(double) in double._contexts and in_team not in double._contexts
    assert double.refusals == []


def test_delete_group_refuses_a_namespace_before_the_node_hears_of_it(server, double):
    namespace = namespace_of(double)
    start = len(double.log)
    refused = error_text(server.call_tool("delete_group", {"group": namespace}))
    assert refused == ('Error: %s is a namespace ("demo-team"): delete_group deletes subgroups. Delete a namespace '
                       "with delete_namespace." % namespace)
    assert sent(double, start) == [] and namespace in double._groups


def test_delete_group_on_an_older_node_refuses_a_group_with_contexts(serve):
    double = sample_double()
    double.legacy_lifecycle = True
    namespace, team, squad = nested_groups(double)
    double.add_context(KV, group_id=team)
    server = serve(double)
    refused = error_text(server.call_tool("delete_group", {"group": team}))
    assert refused == ("Error: group '%s' has registered contexts; delete or detach them first. This node deletes "
                       "only an empty group: delete its contexts first (delete_context), then retry delete_group."
                       % team)
    assert server.tool_json("delete_group", {"group": squad})["deletedSubgroups"] == []
    assert team in double._groups and squad not in double._groups


# ── upgrade_group ─────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("legacy", [False, True], ids=["newest", "older answer"])
def test_upgrade_group_moves_to_the_installed_version_and_describe_group_follows(serve, legacy):
    double = sample_double()
    double.legacy_lifecycle = legacy
    server = serve(double)
    namespace, kv_id = namespace_of(double), double._app_key(KV)
    same = error_text(server.call_tool("upgrade_group", {"group": namespace}))
    assert same == ("Error: group %s is already targeting this application; install a new version of it to upgrade. "
                    "Nothing newer is installed: list_registry shows what the registry has; install_application "
                    "(coords or path; the app keeps its id), then retry upgrade_group." % namespace)
    double.upgrade_app(kv_id, "2.0.0")
    start = len(double.log)
    upgraded = server.tool_json("upgrade_group", {"group": namespace, "application": "kv-store", "cascade": True})
    # the node writes it completed at once (§0.7): one call answers the new version and each local context's
    demo = demo_context(double)
    assert upgraded == {"groupId": namespace, "status": "completed", "fromVersion": "1.0.0", "version": "2.0.0",
                        "contexts": [{"id": demo, "name": "demo", "applicationVersion": "1.0.0",
                                      "movesWhenNextCalled": True}],
                        "note": "The node upgrades a context lazily: each runs the new version from its next call; "
                                "until then its applicationVersion is the version it last ran."}
    assert sent(double, start) == [("POST", "/admin-api/groups/%s/upgrade" % namespace,
                                    {"targetApplicationId": kv_id, "cascade": True})]
    described = server.tool_json("describe_group", {"group": namespace})
    assert (described["upgrade"]["status"], described["upgrade"]["fromVersion"], described["upgrade"]["toVersion"],
            described["application"]["version"]) == ("completed", "1.0.0", "2.0.0", "2.0.0")
    assert double.refusals == []


def test_upgrade_group_defaults_to_the_groups_own_application_and_says_the_nodes_refusals(server, double):
    namespace, team, squad = nested_groups(double)
    double.upgrade_app(double._app_key(KV), "2.0.0")
    start = len(double.log)
    empty = error_text(server.call_tool("upgrade_group", {"group": squad}))
    assert empty.startswith("Error: group %s has no contexts to upgrade. Nothing runs in that group: pass cascade"
                            % squad)
    assert sent(double, start) == [("POST", "/admin-api/groups/%s/upgrade" % squad,
                                    {"targetApplicationId": double._app_key(KV)})]
    other = server.call_tool("upgrade_group", {"group": namespace, "application": "nothing-such"})
    assert error_text(other).startswith('Error: Application "nothing-such" not found. Installed: ')


# ── install_application from a path ───────────────────────────────────────────────────────────────

def test_install_from_a_path_sends_it_and_says_what_came_in(serve):
    double = NodeDouble(registry={"/srv/bundles/counter.mpk": counter_spec()})
    server = serve(double)
    server.tool_names()
    installed = server.tool_json("install_application", {"path": "/srv/bundles/counter.mpk"})
    assert installed == {"applicationId": double._app_key("com.example.counter"), "package": "com.example.counter",
                         "version": "0.1.0", "name": "Counter", "hasGuide": False, "tools": 2,
                         "methods": ["increment", "value"], "change": "new application", "note": INSTALLED_NOTE}
    assert [e["json"] for e in double.requests_to("POST", "/admin-api/install-dev-application")] == [
        {"path": "/srv/bundles/counter.mpk"}]
    assert "counter_increment" in server.tool_names() and double.refusals == []


def test_install_asks_for_exactly_one_absolute_path_before_sending(serve):
    double = NodeDouble()
    server = serve(double)
    for args, said in (({}, "one of them"), ({"coords": "a@1", "path": "/x.mpk"}, "not both")):
        assert error_text(server.call_tool("install_application", args)) == (
            "Error: Pass coords (package@version, from the node's registry) or path (a bundle file on the node's "
            "machine), %s." % said)
    relative = error_text(server.call_tool("install_application", {"path": "bundles/app.mpk"}))
    assert relative == ('Error: path "bundles/app.mpk" is not absolute. Pass the absolute path of the bundle (.mpk) '
                        "on the node's machine: the node reads it from its own filesystem.")
    assert double.requests_to("POST") == []


def test_install_expands_a_tilde_for_a_node_on_this_machine_only(serve, tmp_path):
    home = tmp_path / "home"
    double = NodeDouble(registry={str(home / "app.mpk"): counter_spec()})
    server = serve(double)
    assert server.tool_json("install_application", {"path": "~/app.mpk"})["package"] == "com.example.counter"
    assert [e["json"] for e in double.requests_to("POST")] == [{"path": str(home / "app.mpk")}]
    elsewhere = NodeDouble(host=own_address())          # reached by an address that is not loopback
    remote = serve(elsewhere)
    refused = error_text(remote.call_tool("install_application", {"path": "~/app.mpk"}))
    assert refused == ('Error: path "~/app.mpk" starts with ~, which only a node on this machine shares: the node at '
                       "%s expands nothing. Pass the bundle's absolute path on the node's machine." % elsewhere.url)
    assert elsewhere.requests_to("POST") == []


def own_address():
    """This machine's address on its network (no packet is sent), or a skip when it has none but loopback."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("203.0.113.1", 9))
        address = probe.getsockname()[0]
    except OSError as error:
        pytest.skip("no network address besides loopback: %s" % error)
    finally:
        probe.close()
    if address.startswith("127."):
        pytest.skip("no network address besides loopback")
    return address


def test_install_from_a_path_on_an_older_node_sends_metadata_when_asked(serve):
    double = NodeDouble(registry={"/b/counter.mpk": counter_spec()})
    double.legacy_lifecycle = True
    server = serve(double)
    assert server.tool_json("install_application", {"path": "/b/counter.mpk"})["version"] == "0.1.0"
    assert [e["json"] for e in double.requests_to("POST", "/admin-api/install-dev-application")] == [
        {"path": "/b/counter.mpk"}, {"path": "/b/counter.mpk", "metadata": []}]


def test_install_from_a_path_a_confined_node_refuses_says_what_to_do(serve):
    double = NodeDouble(registry={"/srv/app.mpk": counter_spec()})
    double.dev_install_root = "/opt/bundles"
    server = serve(double)
    refused = error_text(server.call_tool("install_application", {"path": "/srv/app.mpk"}))
    assert refused == ("Error: install path is not permitted. The node installs bundles only from under its "
                       "MEROD_DEV_INSTALL_ROOT: put the bundle there on the node's machine and pass that absolute "
                       "path.")


# ── describe_app versions, node_status peers and identity ─────────────────────────────────────────

def test_describe_app_lists_the_versions_the_node_keeps(server, double):
    double.upgrade_app(double._app_key(KV), "1.1.0")
    described = server.call_tool("describe_app", {"app": "kv-store"})["structuredContent"]
    assert described["versions"] == ["1.0.0", "1.1.0"]
    assert double.requests_to("GET", "/admin-api/applications/%s/versions" % double._app_key(KV))


def test_node_status_adds_peers_and_identity_and_survives_their_failure(server, double):
    double.peer_count = 3
    start = len(double.log)
    status = server.tool_json("node_status")
    assert (status["peers"], status["identity"], status["publicKey"]) == (3, NODE_ACCOUNT, NODE_PUBLIC_KEY)
    facts = ["/admin-api/health", "/admin-api/peers", "/admin-api/identity"]
    assert [e["path"] for e in double.log[start:] if e["path"] in facts] == facts      # the catalog reads aside
    double.fresh_identity = True
    double.faults = {"status": 500, "json": {"error": "peers broke"}, "paths": ["/admin-api/peers"]}
    status = server.tool_json("node_status")
    assert status["health"] == {"status": "alive"}
    assert (status["peers"], status["peersNote"]) == (None, "peers broke")
    assert (status["identity"], status["identityNote"]) == (None, FRESH_IDENTITY)


# ── read-only mode ────────────────────────────────────────────────────────────────────────────────

def test_read_only_mode_keeps_get_blob_and_describe_group_and_refuses_the_rest(serve):
    double = sample_double()
    namespace = namespace_of(double)
    blob = blob_of(double, b"kept")
    server = serve(double, **ON)
    listed = server.tool_names()
    kept = {"get_blob": {"blob": blob}, "describe_group": {"group": namespace}}
    refused = {"sync_context": {"context": "demo"}, "delete_group": {"group": namespace},
               "remove_group_members": {"group": namespace, "members": [NODE_ACCOUNT]},
               "set_member_role": {"group": namespace, "member": NODE_ACCOUNT, "role": "Member"},
               "upgrade_group": {"group": namespace}}
    assert [name for name in listed if name in kept or name in refused] == ["get_blob", "describe_group"]
    for name, args in kept.items():
        assert not server.call_tool(name, args).get("isError"), name
    start = len(double.log)
    for name, args in refused.items():
        assert READ_ONLY_SAYS in error_text(server.call_tool(name, args)), name
    assert [e for e in double.log[start:] if e["method"] != "GET"] == [] and double.syncs == []


def test_check_counts_the_lifecycle_tools_each_mode_offers(tmp_path):
    """--check's Tools line counts what tools/list gives: all fixed tools, or those read-only mode keeps."""
    with sample_double() as double:
        for env, fixed in (({}, len(fixed_names())), (ON, len(fixed_names(read_only=True)))):
            code, lines = run_check(double, tmp_path, **env)
            tools = next(line for line in lines if line.startswith("Tools:"))
            assert code == 0 and "(%d fixed, " % fixed in tools, (env, tools)


# ── what was asked before, finished (issue 32, item 7) ──────────────────────────────────────────────

def test_describe_group_of_a_namespace_says_when_subgroups_may_be_hidden(serve):
    double = sample_double()
    namespace, team, squad = nested_groups(double)
    server = serve(double)
    counted = server.tool_json("describe_group", {"group": namespace})
    assert [row["groupId"] for row in counted["subgroups"]] == [team, squad]
    assert "subgroupsNote" not in counted, "the node's count matches what it shows"
    double.subgroup_counts = False                                   # a node that gives no count to compare
    uncounted = server.tool_json("describe_group", {"group": namespace})
    assert uncounted["subgroupsNote"] == ("These are the subgroups this node can see; the node gives no count to "
                                          "compare, so restricted groups it is not a member of may be missing.")
    assert "subgroupsNote" not in server.tool_json("describe_group", {"group": team}), "a subgroup lists its own"


def test_an_upgrade_whose_counts_the_node_left_out_says_they_were_not_reported(serve):
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    double.upgrade_app(double._app_key(KV), "2.0.0")
    upgraded = server.tool_json("upgrade_group", {"group": namespace})
    # upgrade_group answers each context's version instead of counts; the record describe_group shows says them
    assert upgraded["status"] == "completed" and upgraded["version"] == "2.0.0" and "localContextsTotal" not in upgraded
    record = server.tool_json("describe_group", {"group": namespace})["upgrade"]
    assert record["status"] == "completed" and record["localContextsTotal"] is None
    assert record["countsNote"].startswith("The node did not report how many contexts moved (null counts)")


def test_a_well_formed_blob_id_the_node_refuses_with_400_is_not_called_no_blob_id(server, double):
    blob = hex_id("a refused blob")
    double.faults.update({"paths": ["/admin-api/blobs/" + blob], "status": 400,
                          "json": {"error": {"message": "blob is quarantined"}}})
    refused = error_text(server.call_tool("get_blob", {"blob": blob.upper()}))
    assert refused.startswith("Error: The node refused to read blob %s: HTTP 400" % blob), refused
    assert "is not a blob id" not in refused
