"""The server against the newest node releases (node-api.md §0.5), through stdio against the node double:
every body it sends passes the node's closed sets, and each typed refusal reaches the agent in the node's own
words plus what to do about it."""
from __future__ import annotations

import base64
import hashlib
import time

import pytest

from node_double import NODE_ACCOUNT, counter_spec, hex_id, sample_double

KV = "com.calimero.kv-store"
USERS = {"users": {"admin": "dev-password"}}
CLOSED_ROUTES = [("POST", "/admin-api/contexts"), ("POST", "/admin-api/install-application"),
                 ("POST", "/admin-api/namespaces"), ("DELETE", "/admin-api/namespaces/"), ("POST", "/admin-api/groups"),
                 ("POST", "/admin-api/groups/"), ("PUT", "/admin-api/groups/"), ("POST", "/auth/token"),
                 ("POST", "/auth/refresh"), ("POST", "/jsonrpc")]



def ok(server, name, arguments=None):
    result = server.call_tool(name, arguments or {})
    assert not result.get("isError"), (name, result)
    return result.get("structuredContent")


def error_text(result):
    assert result.get("isError") is True, result
    return result["content"][-1]["text"]


def namespace_of(double, package=KV):
    app_id = double._app_key(package)
    return next(g["id"] for g in double._groups.values() if g["parent"] is None and g["applicationId"] == app_id)


def context_of(double, package=KV):
    return next(c["id"] for c in double._contexts.values() if c["applicationId"] == double._app_key(package))


def wait_for_tool(server, name):
    deadline = time.monotonic() + 20
    while name not in server.tool_names():
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.1)


# ── every request body the server sends is one the node's closed sets accept (§0.5.1) ──────────────

def test_every_body_the_server_sends_passes_the_closed_sets(serve):
    extra = dict(counter_spec(), package="com.example.extra")
    double = sample_double(auth=USERS, registry={"com.example.extra@1.0.0": extra})
    server = serve(double, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD="dev-password")
    wait_for_tool(server, "kv_store_set")
    kv_namespace = namespace_of(double)
    for name in ("node_status", "list_nodes", "list_namespaces", "list_blobs"):
        ok(server, name)
    ok(server, "list_applications", {"verbose": True})
    ok(server, "list_contexts", {"application": "kv-store", "verbose": True})
    created = ok(server, "create_context", {"application": "kv-store", "group": kv_namespace, "name": "second"})
    ok(server, "join_context", {"context": "demo"})
    ok(server, "create_alias", {"alias": "second", "contextId": created["contextId"]})
    ok(server, "lookup_alias", {"name": "second"})
    ok(server, "install_application", {"coords": "com.example.extra@1.0.0"})
    ok(server, "uninstall_application", {"application": "com.example.extra"})
    blob = ok(server, "upload_blob", {"data": base64.b64encode(b"bytes").decode(), "context": "demo"})
    ok(server, "delete_blob", {"blob": blob["blobId"]})
    namespace = ok(server, "create_namespace", {"application": "counter", "name": "team"})["namespaceId"]
    invitation = ok(server, "invite_to_namespace", {"namespace": namespace})
    ok(server, "join_namespace", {"namespace": namespace, "invitation": invitation, "groupName": "ours"})
    ok(server, "list_group_members", {"group": namespace})
    ok(server, "add_group_members", {"group": namespace, "members": [{"identity": hex_id("b"), "role": "Admin"}]})
    group = ok(server, "create_group", {"namespace": namespace, "name": "ops", "visibility": "open"})["groupId"]
    nested = ok(server, "create_group", {"namespace": namespace, "parent": group, "visibility": "open"})["groupId"]
    ok(server, "set_group_visibility", {"group": nested, "visibility": "restricted"})
    ok(server, "set_group_metadata", {"group": group, "name": "Ops", "data": {"a": "1"}})
    ok(server, "set_group_metadata", {"group": group, "data": {}})
    ok(server, "join_open_group", {"group": group})
    ok(server, "delete_namespace", {"namespace": namespace})
    ok(server, "leave_namespace", {"namespace": ok(server, "create_namespace", {"application": "kv-store"})[
        "namespaceId"]})
    ok(server, "describe_app", {"app": "kv-store"})
    handle = ok(server, "select_app", {"app": "kv-store", "context": "demo"})["app_handle"]
    ok(server, "kv_store_set", {"app_handle": handle, "key": "k", "value": "v"})
    ok(server, "call", {"app": "kv-store", "context": "demo", "method": "get", "args": {"key": "k"}})
    ok(server, "call_many", {"calls": [{"app_handle": handle, "method": "len"}]})
    double.expire_access_tokens()                       # the refresh body too
    ok(server, "delete_context", {"context": "second"})
    assert double.refresh_count == 1
    for method, path in CLOSED_ROUTES:                  # each closed request type was exercised...
        assert double.requests_to(method, path), (method, path)
    assert double.refusals == []                        # ...and none was refused for an unknown field


# ── typed refusals: the node's words, then what the agent can do ─────────────────────────────────────

def test_a_join_no_member_answered_says_to_retry_when_one_is_online(serve):
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    invitation = ok(server, "invite_to_namespace", {"namespace": namespace})
    double.join_outcome = "no_peer"
    text = error_text(server.call_tool("join_namespace", {"namespace": namespace, "invitation": invitation}))
    assert text == ("Error: could not reach any member of this namespace to complete the join; make sure the "
                    "inviting node is online and retry. No member of the namespace answered the join: retry "
                    "join_namespace with the same invitation once the inviting node (or another member) is online.")
    double.join_outcome = "key_pending"
    text = error_text(server.call_tool("join_namespace", {"namespace": namespace, "invitation": invitation}))
    assert "the join went out and the key is on its way" in text and "check list_namespaces" in text
    double.join_outcome = None                           # the retry the advice asks for works
    assert ok(server, "join_namespace", {"namespace": namespace, "invitation": invitation})["identity"] \
        == NODE_ACCOUNT


def test_a_consumed_or_expired_invitation_asks_for_a_new_one(serve):
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    invitation = ok(server, "invite_to_namespace", {"namespace": namespace})
    ok(server, "join_namespace", {"namespace": namespace, "invitation": invitation})
    again = error_text(server.call_tool("join_namespace", {"namespace": namespace, "invitation": invitation}))
    assert again == ("Error: invitation already consumed or expired. This invitation cannot be used (again): ask a "
                     "member of the namespace for a new one (invite_to_namespace on their node) and join with that.")
    fresh = ok(server, "invite_to_namespace", {"namespace": namespace})
    double.expire_invitations()
    expired = error_text(server.call_tool("join_namespace", {"namespace": namespace, "invitation": fresh}))
    assert expired == again



def test_the_invitation_advice_stays_on_the_invitation_routes(serve):
    """A 409 naming an invitation elsewhere (here an alias of that name) is not about a namespace invitation."""
    double = sample_double()
    server = serve(double)
    context = next(iter(double._contexts))
    double.faults.update({"status": 409, "json": {"error": "alias 'invitation-bob' already exists"},
                          "paths": ["/admin-api/alias/create/context"]})
    text = error_text(server.call_tool("create_alias", {"alias": "invitation-bob", "contextId": context}))
    assert "alias 'invitation-bob' already exists" in text, text
    assert "invite_to_namespace" not in text and "cannot be used (again)" not in text, text

def test_a_reshaped_invitation_says_to_pass_it_unchanged(serve):
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    invitation = ok(server, "invite_to_namespace", {"namespace": namespace})
    invitation["invitation"]["invitation"]["invited_role"] = 0
    text = error_text(server.call_tool("join_namespace", {"namespace": namespace, "invitation": invitation}))
    assert text == ("Error: invitation is invalid: its signature does not verify. Pass the invitation object exactly "
                    "as invite_to_namespace returned it, to the namespace it was made for.")


def test_a_403_says_which_membership_or_role_is_missing(serve):
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    foreign = double.add_group(namespace=namespace, name="foreign", member=False)
    listing = error_text(server.call_tool("list_group_members", {"group": foreign}))
    assert listing == ("Error: node is not a member of group '%s'. This node is not a member of group %s: join it "
                       "first (join_namespace with an invitation, or join_open_group for an open subgroup)."
                       % (foreign, foreign))
    double.set_role(namespace, "Member")
    adding = error_text(server.call_tool("add_group_members", {
        "group": namespace, "members": [{"identity": hex_id("z"), "role": "Member"}]}))
    assert adding == ("Error: node is not an admin of group '%s'. This needs the Admin role in group %s (or a group "
                      "above it), which this node lacks: ask an admin there to give it that role (add_group_members "
                      "with role Admin)." % (namespace, namespace))
    subgroup = error_text(server.call_tool("create_group", {"namespace": namespace, "name": "x"}))
    assert subgroup.startswith("Error: creating a subgroup needs admin of namespace '%s'. This needs the Admin role "
                               "in namespace %s" % (namespace, namespace))


def test_a_refusal_naming_its_group_unquoted_still_names_it_in_the_advice(serve):
    """core's governance store words membership refusals "identity <key> is not an admin of group <hex>"."""
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    said = "identity %s is not an admin of group %s" % (hex_id("key"), namespace)
    double.faults.update({"status": 403, "json": {"error": said}, "paths": ["/admin-api/groups/%s/members" % namespace]})
    text = error_text(server.call_tool("add_group_members", {
        "group": namespace, "members": [{"identity": hex_id("z"), "role": "Member"}]}))
    assert text == ("Error: %s. This needs the Admin role in group %s (or a group above it), which this node lacks: "
                    "ask an admin there to give it that role (add_group_members with role Admin)." % (said, namespace))


def test_a_group_this_node_is_not_in_is_refused_at_its_info(serve):
    """core answers group info to members only: create_context's check of the group's application meets the 403."""
    double = sample_double()
    foreign = double.add_namespace(double._app_key(KV), name="foreign", member=False)
    server = serve(double)
    text = error_text(server.call_tool("create_context", {"application": "kv-store", "group": foreign}))
    assert text == ("Error: node is not a member of group '%s'. This node is not a member of group %s: join it first "
                    "(join_namespace with an invitation, or join_open_group for an open subgroup)." % (foreign, foreign))
    assert double.requests_to("GET", "/admin-api/groups/" + foreign) and not double.requests_to("POST",
                                                                                                "/admin-api/contexts")


def test_leaving_as_the_last_admin_says_to_promote_someone(serve):
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    double.set_role(namespace, "Member", account=hex_id("carol"))
    text = error_text(server.call_tool("leave_namespace", {"namespace": namespace}))
    assert text == ("Error: node is the last admin of group '%s'; make another member admin first. Make another "
                    "member Admin first (add_group_members with role Admin, or set_member_role), then retry." % namespace)


def test_not_found_is_the_nodes_own_text(serve):
    double = sample_double()
    server = serve(double)
    unknown = hex_id("no such namespace")
    assert error_text(server.call_tool("invite_to_namespace", {"namespace": unknown})) == \
        "Error: namespace '%s' not found" % unknown


def test_bodies_the_node_validates_are_refused_in_its_words(serve):
    """Past serde, each request type's Validate impl decides (install coordinates' lengths, metadata limits, a
    ReadOnlyTee member, a base58 identity current nodes no longer read): the agent reads the node's own text."""
    double = sample_double()
    server = serve(double)
    namespace = namespace_of(double)
    install = error_text(server.call_tool("install_application", {"coords": "p" * 129 + "@1.0.0"}))
    assert install == "Error: Field 'package' exceeds maximum length of 128 characters (got 129)"
    metadata = error_text(server.call_tool("set_group_metadata", {"group": namespace, "name": "Ops",
                                                                  "data": {"k": "v" * 4097}}))
    assert metadata == ("Error: Field 'metadata' has invalid format: metadata data value too long: 4097 bytes "
                        "(max 4096)")
    tee = error_text(server.call_tool("add_group_members", {
        "group": namespace, "members": [{"identity": hex_id("t"), "role": "ReadOnlyTee"}]}))
    assert tee == ("Error: Field 'members[].role' has invalid format: ReadOnlyTee role can only be assigned via TEE "
                   "attestation")
    base58 = error_text(server.call_tool("add_group_members", {
        "group": namespace, "members": [{"identity": "1" * 32, "role": "Member"}]}))
    assert base58.startswith("Error: Invalid JSON data: ") and "expected 64 hex characters" in base58
    assert double._groups[namespace]["metadata"] is None and list(double._groups[namespace]["members"]) == [
        NODE_ACCOUNT]
    assert double.refusals == []


def test_a_blob_whose_bytes_miss_the_expected_hash_is_refused(serve):
    """core stores the bytes, then compares their hash with `hash`: a mismatch is a 500 and no blob."""
    double = sample_double()
    server = serve(double)
    data = base64.b64encode(b"bytes").decode()
    text = error_text(server.call_tool("upload_blob", {"data": data, "hash": "ab" * 32}))
    assert text == "Error: Failed to store blob: fatal: blob hash mismatch"
    assert double._blobs == {}
    stored = ok(server, "upload_blob", {"data": data, "hash": hashlib.sha256(b"bytes").hexdigest()})
    assert stored["blobId"] in double._blobs


@pytest.mark.parametrize("mode, text", [
    ("http", "Error: The registry this node installs from does not publish com.x@9.9.9 (the node: \"the configured "
             "Http source has no application published at com.x@9.9.9\"). Check the package and version: the node's "
             "registry has no such release (list_registry lists what it publishes)."),
    ("dht", "Error: HTTP 502 Bad Gateway from {url}/admin-api/install-application - the node said: this node is in "
            "dht registry mode, which cannot install by package@version; install from a local .mpk bundle or via "
            "governance instead. This node cannot install by package@version: put the application's .mpk bundle on "
            "the node's machine and pass its absolute path to install_application as path."),
])
def test_install_502_texts_pass_through_with_advice(serve, mode, text):
    double = sample_double()
    double.registry_mode = mode
    server = serve(double)
    assert error_text(server.call_tool("install_application", {"coords": "com.x@9.9.9"})) == \
        text.format(url=double.url)


def test_a_raw_wasm_app_says_to_reinstall_it_as_a_bundle(serve):
    double = sample_double()
    double.add_app(dict(counter_spec(), package="com.example.raw", raw_wasm=True))
    server = serve(double)
    text = error_text(server.call_tool("describe_app", {"app": "com.example.raw"}))
    assert text == "Error: application is raw wasm, which never runs; reinstall it as a signed bundle"


def test_a_write_on_a_read_only_node_says_this_node_only_reads_that_context(serve):
    double = sample_double()
    server = serve(double)
    wait_for_tool(server, "kv_store_set")
    context = context_of(double)
    double.set_role(namespace_of(double), "ReadOnly")
    handle = ok(server, "select_app", {"app": "kv-store", "context": "demo"})["app_handle"]
    text = error_text(server.call_tool("kv_store_set", {"app_handle": handle, "key": "k", "value": "v"}))
    assert text == ("Error: This node only reads context %s: its role there cannot write, so set was refused and "
                    "nothing changed (ReadOnlyWriteRefused). Reads work here; run the write on a node whose role in "
                    "the context's group writes (Member or Admin), or ask a group admin to give this node such a "
                    "role." % context)
    assert double.kv_state(context) == {}
    assert not server.call_tool("kv_store_len", {"app_handle": handle}).get("isError")


def test_a_token_without_the_execute_grant_says_which_call_it_lacks(serve):
    """A client key scoped to reading the app list and calling `get` in one context (§0.5.5)."""
    double = sample_double(auth=USERS).start()
    context = context_of(double)
    access, refresh = double.issue_tokens(permissions=["application:list", "context:list", "context:alias",
                                                       "context:execute[%s,,get]" % context])
    server = serve(double, CALIMERO_AUTH_TOKEN=access, CALIMERO_REFRESH_TOKEN=refresh)
    ok(server, "call", {"app": "kv-store", "context": "demo", "method": "get", "args": {"key": "k"}})
    text = error_text(server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"}))
    assert text == ("Error: this caller's token does not grant context:execute for this call. The token this server "
                    "uses may not call len in context %s: sign in with one whose permissions include "
                    "context:execute for it (an admin login's do)." % context)
    assert [e["method"] for e in double.executions] == ["get"]


# ── auth: tokens an upgrade voided, refresh of mixed tokens, the login throttle (§0.5.6) ────────────

def test_a_token_voided_by_a_node_upgrade_says_to_sign_in_again(serve):
    double = sample_double(auth=dict(USERS, legacy_tokens=True)).start()
    access, refresh = double.issue_tokens()
    server = serve(double, CALIMERO_AUTH_TOKEN=access, CALIMERO_REFRESH_TOKEN=refresh)
    ok(server, "list_namespaces")
    double.upgrade_node()
    text = error_text(server.call_tool("list_namespaces"))
    assert text == ("Error: The node at %s does not accept this session's access token (HTTP 401, no reason given): "
                    "it carries no key_id claim, so an older node release minted it and the node was upgraded since. "
                    "Sign in again: set a fresh CALIMERO_AUTH_TOKEN (and CALIMERO_REFRESH_TOKEN)." % double.url)


def test_credentials_sign_in_again_by_themselves_after_a_node_upgrade(serve):
    double = sample_double(auth=dict(USERS, legacy_tokens=True))
    server = serve(double, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD="dev-password")
    ok(server, "list_namespaces")
    logins = len(double.requests_to("POST", "/auth/token"))
    double.upgrade_node()
    assert ok(server, "list_contexts")["contexts"]
    assert len(double.requests_to("POST", "/auth/token")) == logins + 1
    assert "logging in again as admin" in server.stderr


def test_tokens_of_two_logins_cannot_refresh_and_say_so(serve):
    double = sample_double(auth=USERS).start()
    access, _ = double.issue_tokens()
    _, other_refresh = double.issue_tokens("someone else")
    server = serve(double, CALIMERO_AUTH_TOKEN=access, CALIMERO_REFRESH_TOKEN=other_refresh)
    double.expire_access_tokens()
    text = error_text(server.call_tool("list_namespaces"))
    assert text == ("Error: The access token expired and could not be refreshed: Access and refresh tokens do not "
                    "belong to the same key. CALIMERO_AUTH_TOKEN and CALIMERO_REFRESH_TOKEN come from different "
                    "logins: set both from the same fresh login.")


def test_a_throttled_login_says_how_long_to_wait(serve):
    double = sample_double(auth=dict(USERS, login_attempts=1))
    server = serve(double, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD="wrong")
    first = error_text(server.call_tool("list_namespaces"))     # the catalog's own login may have come first
    throttled = error_text(server.call_tool("list_namespaces"))
    assert first.startswith("Error: Authentication failed: ")
    assert len(double.requests_to("POST", "/auth/token")) >= 2 and double._auth.failed_logins
    assert throttled == ("Error: Authentication failed: Too many failed login attempts; please try again later. The "
                         "node refuses logins for 60 s after repeated failures: wait, then retry (and check "
                         "CALIMERO_PASSWORD if it keeps failing).")
