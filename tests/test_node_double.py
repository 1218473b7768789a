"""Tests of the node double itself, over real HTTP, against node-api.md (§ numbers refer to it)."""
from __future__ import annotations

import base64
import copy
import hashlib
import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from node_double import (AUTHORITY_NOT_YET, FRESH_IDENTITY, NODE_ACCOUNT, NODE_PUBLIC_KEY, NodeDouble, TypeSystem,
                         counter_spec, hex_id, kv_store_manifest, kv_store_spec, sample_double)

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent.parent / "shared" / "fixtures"
SCHEMA = FIXTURES / "abi" / "wasm-abi.schema.json"
CREDENTIALS = {"users": {"admin": "dev-password"}}
KV_PACKAGE = "com.calimero.kv-store"


# ---------------------------------------------------------------------------------------------------------------
# HTTP helper: http.client, so tests control headers exactly and see low-level failures as they are
# ---------------------------------------------------------------------------------------------------------------

class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    @property
    def content_type(self):
        return self.headers.get("content-type", "")


def call(node, method, path, body=None, headers=None, raw=None, timeout=5):
    """body: JSON-encoded with a JSON content type; raw: bytes sent as they are."""
    headers = dict(headers or {})
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    connection = http.client.HTTPConnection("127.0.0.1", node.port, timeout=timeout)
    try:
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def execute(node, context_id, method, args=None, request_id=1, headers=None):
    params = {"contextId": context_id, "method": method}
    if args is not None:
        params["argsJson"] = args
    reply = call(node, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": request_id, "method": "execute",
                                            "params": params}, headers=headers)
    assert reply.status == 200
    return reply.json()


def output_of(node, context_id, method, args=None):
    envelope = execute(node, context_id, method, {} if args is None else args)
    assert "error" not in envelope, envelope
    return envelope["result"]["output"]


def decode_app_error(data):
    """Clients turn `the method call returned an error: [..]` back into JSON (§4.2)."""
    numbers = data.split("[", 1)[1].rstrip("]")
    return json.loads(bytes(int(n) for n in numbers.split(", ")))


@pytest.fixture
def node():
    with sample_double() as double:
        yield double


@pytest.fixture
def demo_context(node):
    return call(node, "POST", "/admin-api/alias/lookup/context/demo").json()["data"]["value"]


@pytest.fixture
def auth_node():
    with sample_double(auth=CREDENTIALS) as double:
        yield double


def kv_id():
    return hex_id("com.calimero.kv-store\0" + kv_store_spec()["signer_id"])


def login(node, password="dev-password"):
    return call(node, "POST", "/auth/token", {
        "auth_method": "user_password", "public_key": "admin", "client_name": "mero-mcp", "timestamp": 1727000000,
        "permissions": ["admin"], "provider_data": {"username": "admin", "password": password}})


def bearer(token):
    return {"Authorization": "Bearer " + token}


def multi_service_spec(**extra):
    spec = {"package": "com.calimero.drive", "version": "2.0.0", "signer_id": "did:key:z6MkDrive",
            "services": {"docs": kv_store_manifest(), "registry": counter_spec()["abi"]}}
    spec.update(extra)
    return spec


# ---------------------------------------------------------------------------------------------------------------
# Envelopes, routing, health (§1.2, §3.1)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, status", [("/admin-api/health", "alive"), ("/admin-api/ready", "ready"),
                                          ("/admin-api/is-authed", "alive")])
def test_health_routes_wrap_status_in_data(node, path, status):
    reply = call(node, "GET", path)
    assert (reply.status, reply.json(), reply.content_type) == (200, {"data": {"status": status}},
                                                                 "application/json")


def test_unknown_route_is_a_bodyless_404_and_wrong_method_a_bodyless_405(node):
    missing = call(node, "GET", "/admin-api/applications/" + kv_id() + "/nothing")
    wrong_method = call(node, "PATCH", "/admin-api/applications")
    assert (missing.status, missing.body) == (404, b"")
    assert (wrong_method.status, wrong_method.body) == (405, b"")


def test_every_request_is_logged_with_lowercased_headers_and_parsed_json(node):
    call(node, "POST", "/admin-api/contexts?x=1", {"applicationId": "zz"}, headers={"X-Trace": "t"})
    entry = node.requests_to("POST", "/admin-api/contexts")[-1]
    assert entry["query"] == {"x": "1"} and entry["headers"]["x-trace"] == "t"
    assert entry["json"] == {"applicationId": "zz"} and entry["body"] == b'{"applicationId": "zz"}'
    assert node.requests_to("GET") == []


def test_identity_ids_are_hex(node):
    data = call(node, "GET", "/admin-api/identity").json()["data"]
    assert data["accountId"] == NODE_ACCOUNT and len(data["publicKey"]) == 64


# ---------------------------------------------------------------------------------------------------------------
# Applications (§3.2)
# ---------------------------------------------------------------------------------------------------------------

def test_application_list_entries_follow_section_3_2(node):
    apps = call(node, "GET", "/admin-api/applications").json()["data"]["apps"]
    assert [a["id"] for a in apps] == sorted(a["id"] for a in apps)
    kv = next(a for a in apps if a["package"] == "com.calimero.kv-store")
    assert kv["id"] == kv_id() and kv["signer_id"].startswith("did:key:") and kv["version"] == "1.0.0"
    assert set(kv) == {"id", "blob", "size", "source", "metadata", "signer_id", "package", "version"}
    metadata = json.loads(bytes(kv["metadata"]))
    assert metadata["name"] == "KV Store" and "## Procedures\n\n### Store a value" in metadata["guide"]
    assert metadata["icon"].startswith("data:image/png;base64,")


@pytest.mark.parametrize("list_services, listed", [(True, True), (False, False)])
def test_services_on_the_list_depend_on_release(list_services, listed):
    with NodeDouble(apps=[multi_service_spec()], list_services=list_services) as double:
        app = call(double, "GET", "/admin-api/applications").json()["data"]["apps"][0]
        single = call(double, "GET", "/admin-api/applications/" + app["id"]).json()["data"]["application"]
    assert ("services" in app) is listed
    assert sorted(single["services"]) == ["docs", "registry"]
    assert set(single["services"]["docs"]) == {"bytecode", "compiled"}


def test_metadata_may_be_raw_bytes():
    with NodeDouble(apps=[dict(counter_spec(), metadata=b"")]) as double:
        app = call(double, "GET", "/admin-api/applications").json()["data"]["apps"][0]
    assert app["metadata"] == []


def test_get_application_errors(node):
    missing = call(node, "GET", "/admin-api/applications/" + hex_id("nothing"))
    malformed = call(node, "GET", "/admin-api/applications/not-an-id")
    assert (missing.status, missing.json()) == (404, {"error": "Application not found"})
    assert malformed.status == 400 and malformed.content_type.startswith("text/plain")
    assert malformed.body.startswith(b"Invalid URL: ")


def test_abi_of_single_service_app(node):
    reply = call(node, "GET", "/admin-api/applications/{}/abi".format(kv_id()))
    assert reply.json() == {"data": kv_store_manifest()}
    named = call(node, "GET", "/admin-api/applications/{}/abi?service_name=api".format(kv_id()))
    assert (named.status, named.json()) == (400, {"error": "application has no named services; omit service_name"})


def test_abi_service_selection_and_errors():
    one_service = dict(counter_spec(), package="com.example.solo", services={"api": counter_spec()["abi"]})
    broken = dict(counter_spec(), package="com.example.broken", abi_error="unsupported ABI schema version 2")
    with NodeDouble(apps=[multi_service_spec(), one_service, broken]) as double:
        ids = {a["package"]: a["id"] for a in call(double, "GET", "/admin-api/applications").json()["data"]["apps"]}
        base = "/admin-api/applications/{}/abi"
        drive = base.format(ids["com.calimero.drive"])
        unnamed = call(double, "GET", drive)
        unknown = call(double, "GET", drive + "?service_name=nope")
        registry = call(double, "GET", drive + "?service_name=registry")
        solo = call(double, "GET", base.format(ids["com.example.solo"]))
        failing = call(double, "GET", base.format(ids["com.example.broken"]))
    assert unnamed.json() == {"error": "application has multiple services; pass service_name (available: docs, registry)"}
    assert unknown.json() == {"error": 'service "nope" not found (available: docs, registry)'}
    assert registry.json()["data"] == counter_spec()["abi"]
    assert solo.json()["data"] == counter_spec()["abi"]
    assert (failing.status, failing.json()) == (400, {"error": "unsupported ABI schema version 2"})


def test_install_from_registry_upgrades_in_place():
    upgraded = dict(kv_store_spec("1.1.0"), metadata={"name": "KV Store 1.1"})
    with sample_double(registry={"com.calimero.kv-store@1.1.0": upgraded}) as double:
        before = call(double, "GET", "/admin-api/applications/" + kv_id()).json()["data"]["application"]
        reply = call(double, "POST", "/admin-api/install-application",
                     {"package": "com.calimero.kv-store", "version": "1.1.0"})
        after = call(double, "GET", "/admin-api/applications/" + kv_id()).json()["data"]["application"]
        versions = call(double, "GET", "/admin-api/applications/{}/versions".format(kv_id())).json()["data"]
    assert reply.json() == {"data": {"applicationId": kv_id()}}
    assert after["version"] == "1.1.0" and after["blob"]["bytecode"] != before["blob"]["bytecode"]
    assert [v["version"] for v in versions] == ["1.0.0", "1.1.0"]
    assert versions[1]["blobId"] == after["blob"]["bytecode"]


def test_install_failures_are_text_or_field_errors(node):
    """§0.5.3: a registry miss and a node in DHT registry mode are 502 text/plain; `url` is an unknown field."""
    unknown = call(node, "POST", "/admin-api/install-application", {"package": "com.x", "version": "9.9.9"})
    with_url = call(node, "POST", "/admin-api/install-application", {"url": "https://x/app.mpk"})
    assert unknown.status == 502 and unknown.content_type.startswith("text/plain")
    assert unknown.body.decode() == "the configured Http source has no application published at com.x@9.9.9"
    assert with_url.status == 400
    assert "unknown field `url`, expected `package` or `version`" in with_url.json()["error"]
    node.registry_mode = "dht"
    dht = call(node, "POST", "/admin-api/install-application", {"package": "com.x", "version": "9.9.9"})
    assert dht.status == 502 and dht.content_type.startswith("text/plain")
    assert dht.body.decode() == ("this node is in dht registry mode, which cannot install by package@version; "
                                 "install from a local .mpk bundle or via governance instead")


def test_uninstall_is_idempotent(node):
    unknown_id = hex_id("never-installed")
    for app_id in (kv_id(), kv_id(), unknown_id):
        reply = call(node, "DELETE", "/admin-api/applications/" + app_id)
        assert reply.json() == {"data": {"applicationId": app_id}}
    assert call(node, "GET", "/admin-api/applications/" + kv_id()).status == 404


# ---------------------------------------------------------------------------------------------------------------
# Contexts (§3.3)
# ---------------------------------------------------------------------------------------------------------------

def test_context_objects(node, demo_context):
    listed = call(node, "GET", "/admin-api/contexts").json()["data"]["contexts"][0]
    single = call(node, "GET", "/admin-api/contexts/" + demo_context).json()["data"]
    assert listed["id"] == demo_context and listed["applicationId"] == kv_id()
    assert len(listed["groupId"]) == 64 and "groupId" not in single
    assert len(listed["contextStateHash"]) == 64 and listed["name"] == "demo"
    assert all(len(head) == 32 and all(0 <= b <= 255 for b in head) for head in listed["dagHeads"])
    missing = call(node, "GET", "/admin-api/contexts/" + hex_id("nothing"))
    assert (missing.status, missing.json()) == (404, {"error": "Context not found"})


def test_contexts_are_listed_in_id_order_and_paginate():
    with NodeDouble(apps=[counter_spec()], namespaces=[{"app": "com.example.counter"}],
                    contexts=[{"app": "com.example.counter", "heads": 0}] * 5) as double:
        ids = [c["id"] for c in call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"]]
        page = call(double, "GET", "/admin-api/contexts?offset=1&limit=2").json()["data"]["contexts"]
    assert ids == sorted(ids) and len(ids) == 5
    assert [c["id"] for c in page] == ids[1:3]
    assert all("dagHeads" not in c for c in page)   # omitted when empty


def test_a_dangling_context_id_counts_toward_offset_but_not_limit():
    """get_context_ids.rs: `offset` skips stored ids, `limit` counts the contexts that resolve."""
    with NodeDouble(apps=[counter_spec()], namespaces=[{"app": "com.example.counter"}],
                    contexts=[{"app": "com.example.counter", "heads": 0}] * 4) as double:
        ids = sorted(double._contexts)
        double.dangling_context_ids.add(ids[0][:-1] + ("0" if ids[0][-1] != "0" else "1"))
        stream = sorted(set(ids) | double.dangling_context_ids)
        first = call(double, "GET", "/admin-api/contexts?offset=0&limit=2").json()["data"]["contexts"]
        second = call(double, "GET", "/admin-api/contexts?offset=2&limit=2").json()["data"]["contexts"]
    assert [c["id"] for c in first] == [i for i in stream if i in ids][:2]
    assert [c["id"] for c in second] == [i for i in stream[2:] if i in ids][:2]
    assert len(first) == 2 and len(second) == 2


def test_some_contexts_have_two_dag_heads():
    with NodeDouble(apps=[counter_spec()], contexts=[{"app": "com.example.counter"}] * 6) as double:
        contexts = call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"]
    assert {len(c["dagHeads"]) for c in contexts} == {1, 2}


def namespace_of(node):
    return call(node, "GET", "/admin-api/namespaces").json()["data"][0]["namespaceId"]


def test_create_context(node):
    namespace = namespace_of(node)
    reply = call(node, "POST", "/admin-api/contexts", {"applicationId": kv_id(), "groupId": namespace,
                                                       "name": "second", "initializationParams": []})
    data = reply.json()["data"]
    assert set(data) == {"contextId", "memberPublicKey", "groupId", "groupCreated"}
    assert data["groupId"] == namespace and data["groupCreated"] is False
    assert call(node, "GET", "/admin-api/contexts/" + data["contextId"]).json()["data"]["name"] == "second"


def test_create_context_takes_the_groups_application_over_the_requested_one(node):
    """§3.3: core overrides applicationId with the group's target application (its log warns, the answer is 200)."""
    counter = call(node, "GET", "/admin-api/applications").json()["data"]["apps"]
    counter_id = next(app["id"] for app in counter if app.get("package") == "com.example.counter")
    reply = call(node, "POST", "/admin-api/contexts", {"applicationId": counter_id, "groupId": namespace_of(node),
                                                       "initializationParams": []})
    created = call(node, "GET", "/admin-api/contexts/" + reply.json()["data"]["contextId"]).json()["data"]
    assert reply.status == 200 and created["applicationId"] == kv_id()


def test_group_info_names_its_namespace_since_rc83(node):
    namespace = namespace_of(node)
    child = node.add_group(namespace=namespace)
    grandchild = node.add_group(parent=child)
    info = call(node, "GET", "/admin-api/groups/" + grandchild).json()["data"]
    assert info["namespaceId"] == namespace and info["targetApplicationId"] == kv_id()
    node.legacy_group_info = True
    older = call(node, "GET", "/admin-api/groups/" + grandchild).json()["data"]
    assert "namespaceId" not in older and "ownerOpCounter" not in older and older["targetApplicationId"] == kv_id()


@pytest.mark.parametrize("group_id, status, message", [
    ("default-group", 400, "Invalid group_id: expected hex-encoded 32 bytes"),
    ("abcd", 400, "Invalid group_id: must be exactly 32 bytes"),
    (hex_id("unknown-group"), 404, "group '%s' not found" % hex_id("unknown-group")),   # typed (§0.5.2)
])
def test_create_context_group_errors(node, group_id, status, message):
    reply = call(node, "POST", "/admin-api/contexts", {"applicationId": kv_id(), "initializationParams": [],
                                                       "groupId": group_id})
    assert (reply.status, reply.json()) == (status, {"error": message})


def init_with_params_manifest():
    manifest = copy.deepcopy(kv_store_manifest())
    init = next(m for m in manifest["methods"] if m["name"] == "init")
    init["params"] = [{"name": "owner", "type": {"kind": "string"}},
                      {"name": "limit", "type": {"kind": "u32"}, "nullable": True}]
    return manifest


@pytest.mark.parametrize("init_args, fragment", [
    ({"owner": "me", "extra": 1}, "unknown field `extra`, expected `owner` or `limit`"),
    ({"limit": 3}, "missing field `owner`"),
    ({"owner": 7}, "invalid type: integer `7`, expected a string"),
    (None, "EOF while parsing a value"),
])
def test_create_context_runs_the_init_argument_check(init_args, fragment):
    spec = dict(kv_store_spec(), abi=init_with_params_manifest())
    with NodeDouble(apps=[spec], namespaces=[{"app": kv_id()}]) as double:
        params = [] if init_args is None else list(json.dumps(init_args).encode())
        reply = call(double, "POST", "/admin-api/contexts", {"applicationId": kv_id(), "groupId": namespace_of(double),
                                                             "initializationParams": params})
        contexts = call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"]
    message = reply.json()["error"]
    assert reply.status == 400 and contexts == []
    assert message.startswith("application initialization failed: guest panicked: init: failed to deserialize "
                              "arguments (expected { owner: String, limit: Option<u32> }): ")
    assert fragment in message


def test_create_context_needs_a_service_for_multi_service_apps():
    with NodeDouble(apps=[multi_service_spec()]) as double:
        app_id = call(double, "GET", "/admin-api/applications").json()["data"]["apps"][0]["id"]
        namespace = double.add_namespace(app_id)
        body = {"applicationId": app_id, "initializationParams": [], "groupId": namespace}
        refused = call(double, "POST", "/admin-api/contexts", body)
        created = call(double, "POST", "/admin-api/contexts", dict(body, serviceName="docs"))
        context = call(double, "GET", "/admin-api/contexts/" + created.json()["data"]["contextId"]).json()["data"]
    assert refused.status == 400 and "serviceName" in refused.json()["error"]
    assert context["serviceName"] == "docs"


def test_delete_and_join_context(node, demo_context):
    joined = call(node, "POST", "/admin-api/contexts/{}/join".format(demo_context), {})
    assert joined.json() == {"data": {"contextId": demo_context, "memberPublicKey": hex_id("member:" + demo_context)}}
    assert call(node, "DELETE", "/admin-api/contexts/" + demo_context).json() == {"data": {"isDeleted": True}}
    assert call(node, "DELETE", "/admin-api/contexts/" + demo_context).json() == {"data": {"isDeleted": False}}
    assert call(node, "DELETE", "/admin-api/contexts/nope").json() == {"error": "Invalid context id"}


# ---------------------------------------------------------------------------------------------------------------
# Aliases (§3.4) and blobs (§3.5)
# ---------------------------------------------------------------------------------------------------------------

def test_alias_lifecycle(node, demo_context):
    created = call(node, "POST", "/admin-api/alias/create/context", {"alias": "a.b-c_1", "contextId": demo_context})
    duplicate = call(node, "POST", "/admin-api/alias/create/context", {"alias": "demo", "contextId": demo_context})
    bad = call(node, "POST", "/admin-api/alias/create/context", {"alias": "no spaces", "contextId": demo_context})
    listed = call(node, "GET", "/admin-api/alias/list/context").json()
    miss = call(node, "POST", "/admin-api/alias/lookup/context/absent")
    assert created.json() == {"data": None}
    assert (duplicate.status, duplicate.json()) == (409, {"error": "alias already exists"})
    assert bad.status == 422 and bad.content_type.startswith("text/plain")
    assert list(listed["data"]) == ["a.b-c_1", "demo"]
    assert (miss.status, miss.json()) == (200, {"data": {"value": None}})
    assert call(node, "POST", "/admin-api/alias/delete/context/demo").json() == {"data": None}
    assert call(node, "POST", "/admin-api/alias/lookup/context/demo").json() == {"data": {"value": None}}


def test_blob_lifecycle(node):
    uploaded = call(node, "PUT", "/admin-api/blobs?context_id=" + hex_id("ctx"), raw=b"hello",
                    headers={"Content-Type": "application/octet-stream"}).json()["data"]
    blob_id = uploaded["blob_id"]
    listed = call(node, "GET", "/admin-api/blobs").json()["data"]["blobs"]
    app_blob = call(node, "GET", "/admin-api/applications/" + kv_id()).json()["data"]["application"]["blob"]
    assert uploaded == {"blob_id": blob_id, "size": 5} and len(blob_id) == 64
    assert {"blob_id": blob_id, "size": 5} in listed
    assert call(node, "GET", "/admin-api/blobs/" + blob_id).body == b"hello"
    assert call(node, "DELETE", "/admin-api/blobs/" + blob_id).json() == {"blob_id": blob_id, "deleted": True}
    gone = call(node, "DELETE", "/admin-api/blobs/" + blob_id)
    protected = call(node, "DELETE", "/admin-api/blobs/" + app_blob["bytecode"])
    assert (gone.status, gone.json()) == (404, {"error": "Blob not found"})
    assert protected.status == 403
    bad_hash = call(node, "PUT", "/admin-api/blobs?hash=xyz", raw=b"x")
    assert bad_hash.json() == {"error": "The provided hash is not a valid format"}
    other_hash = call(node, "PUT", "/admin-api/blobs?hash=" + "ab" * 32, raw=b"x")     # core's add_blob checks it
    assert (other_hash.status, other_hash.json()) == (500, {"error": "Failed to store blob: fatal: blob hash mismatch"})
    matching = call(node, "PUT", "/admin-api/blobs?hash=" + hashlib.sha256(b"x").hexdigest(), raw=b"x")
    assert matching.status == 200


# ---------------------------------------------------------------------------------------------------------------
# Namespaces (§3.6) and groups (§3.7)
# ---------------------------------------------------------------------------------------------------------------

def test_namespace_list_and_create(node):
    refused = call(node, "POST", "/admin-api/namespaces", {"applicationId": kv_id(), "upgradePolicy": "LazyOnAccess"})
    assert refused.status == 400 and "unknown field `upgradePolicy`" in refused.json()["error"]
    created = call(node, "POST", "/admin-api/namespaces", {"applicationId": kv_id(), "name": "team-b"}).json()
    listed = call(node, "GET", "/admin-api/namespaces").json()["data"]
    entry = next(n for n in listed if n["namespaceId"] == created["data"]["namespaceId"])
    assert entry["targetApplicationId"] == kv_id() and entry["name"] == "team-b"
    assert (entry["memberCount"], entry["contextCount"], entry["subgroupCount"]) == (1, 0, 0)
    assert [n["namespaceId"] for n in listed] == sorted(n["namespaceId"] for n in listed)


def test_namespace_delete_requires_a_json_body(node, demo_context):
    namespace = namespace_of(node)
    no_body = call(node, "DELETE", "/admin-api/namespaces/" + namespace)
    no_type = call(node, "DELETE", "/admin-api/namespaces/" + namespace, raw=b"{}")
    deleted = call(node, "DELETE", "/admin-api/namespaces/" + namespace, {})
    assert no_body.status == 400 and no_type.status == 400
    assert deleted.json() == {"data": {"isDeleted": True}}
    # its contexts outlive it and stay uncallable until deleted
    assert call(node, "GET", "/admin-api/contexts/" + demo_context).status == 200
    assert execute(node, demo_context, "len", {})["error"]["type"] == "InternalError"


def test_invitation_round_trip_is_byte_exact(node):
    namespace = namespace_of(node)
    data = call(node, "POST", "/admin-api/namespaces/{}/invite".format(namespace), {}).json()["data"]
    invitation = data["invitation"]
    assert data["groupName"] == "demo-team"
    assert invitation["invitation"]["group_id"] == list(bytes.fromhex(namespace))
    assert len(invitation["invitation"]["secret_salt"]) == 32 and invitation["inviter_account"] == NODE_ACCOUNT
    raw = json.dumps({"invitation": invitation}).encode()
    joined = call(node, "POST", "/admin-api/namespaces/{}/join".format(namespace), raw=raw,
                  headers={"Content-Type": "application/json"})
    assert set(joined.json()["data"]) == {"namespaceId", "memberIdentity", "memberAccount"}
    assert node.requests_to("POST", "/admin-api/namespaces/{}/join".format(namespace))[-1]["body"] == raw


def test_join_refuses_a_foreign_or_reshaped_invitation(node):
    namespace = namespace_of(node)
    invitation = call(node, "POST", "/admin-api/namespaces/{}/invite".format(namespace), {}).json()["data"]["invitation"]
    other = call(node, "POST", "/admin-api/namespaces/{}/join".format(hex_id("other")), {"invitation": invitation})
    reshaped = copy.deepcopy(invitation)
    reshaped["invitation"]["invited_role"] = 0
    tampered = call(node, "POST", "/admin-api/namespaces/{}/join".format(namespace), {"invitation": reshaped})
    assert (other.status, other.json()) == (400, {"error": "invitation group_id does not match namespace_id in path"})
    assert tampered.status == 400


def test_groups_in_a_namespace(node):
    namespace = namespace_of(node)
    created = call(node, "POST", "/admin-api/namespaces/{}/groups".format(namespace),
                   {"groupName": "ops", "visibility": "Open"}).json()["data"]["groupId"]
    nested = call(node, "POST", "/admin-api/groups", {"applicationId": kv_id(), "parentGroupId": created,
                                                      "name": "inner"}).json()["data"]["groupId"]
    listed = call(node, "GET", "/admin-api/namespaces/{}/groups".format(namespace)).json()["data"]
    info = call(node, "GET", "/admin-api/groups/" + nested).json()["data"]
    bad = call(node, "POST", "/admin-api/namespaces/{}/groups".format(namespace), {"visibility": "secret"})
    assert listed == [{"groupId": created, "name": "ops"}]
    assert info["targetApplicationId"] == kv_id() and info["subgroupVisibility"] == "restricted"
    assert call(node, "GET", "/admin-api/groups/" + created).json()["data"]["subgroupVisibility"] == "open"
    assert (bad.status, bad.json()) == (500, {"error": "Internal server error"})


def test_group_members_visibility_metadata_and_inheritance(node):
    namespace = namespace_of(node)
    group = call(node, "POST", "/admin-api/groups", {"applicationId": kv_id(), "parentGroupId": namespace}).json()
    group_id = group["data"]["groupId"]
    node._groups[group_id]["members"].clear()   # this node is not (yet) a member
    base = "/admin-api/groups/" + group_id
    refused = call(node, "POST", base + "/join-via-inheritance", {})
    bad_visibility = call(node, "PUT", base + "/settings/subgroup-visibility", {"subgroupVisibility": "public"})
    assert call(node, "PUT", base + "/settings/subgroup-visibility", {"subgroupVisibility": "open"}).json() == {}
    joined = call(node, "POST", base + "/join-via-inheritance", {}).json()
    added = call(node, "POST", base + "/members", {"members": [{"identity": hex_id("bob"), "role": "Member"}]})
    members = call(node, "GET", base + "/members").json()
    assert (refused.status, refused.json()) == (403, {"error": "identity not eligible for inheritance-based join"})
    assert (bad_visibility.status, bad_visibility.json()) == (400, {
        "error": "Field 'subgroup_visibility' has invalid format: must be 'open' or 'restricted'"})
    assert joined == {"data": {"groupId": group_id, "memberPublicKey": NODE_PUBLIC_KEY, "wasInherited": True}}
    assert node._groups[group_id]["members"][NODE_ACCOUNT] == "Member"      # the join landed
    assert added.json() == {}
    assert "data" not in members and {"identity": hex_id("bob"), "role": "Member"} in members["members"]
    call(node, "PUT", base + "/metadata", {"name": "Ops", "data": {"a": "1", "b": "2"}})
    call(node, "PUT", base + "/metadata", {"data": {"b": "3"}})
    metadata = call(node, "GET", base + "/metadata").json()["data"]
    assert (metadata["name"], metadata["data"]) == (None, {"b": "3"})   # PUT replaces the whole record
    assert call(node, "GET", base).json()["data"]["metadata"]["data"] == {"b": "3"}


def test_group_delete_requires_a_json_body(node):
    group_id = call(node, "POST", "/admin-api/groups", {"applicationId": kv_id(), "parentGroupId": namespace_of(node)})
    path = "/admin-api/groups/" + group_id.json()["data"]["groupId"]
    assert call(node, "DELETE", path).status == 400
    assert call(node, "DELETE", path, {}).json() == {"data": {"isDeleted": True}}
    assert call(node, "GET", path).status == 404


# ---------------------------------------------------------------------------------------------------------------
# JSON-RPC execute (§4)
# ---------------------------------------------------------------------------------------------------------------

def test_kv_behaviour(node, demo_context):
    def run(method, **args):
        return output_of(node, demo_context, method, args)

    assert run("set", key="a", value="1") is None
    assert run("get", key="a") == "1" and run("get", key="zz") is None
    assert run("get_or_insert", key="b", value="2") == "2" and run("get_or_insert", key="b", value="9") == "2"
    assert run("update_if_exists", key="a", value="3") is True and run("update_if_exists", key="q", value="x") is False
    assert run("entries") == {"a": "3", "b": "2"} and run("len") == 2
    assert run("remove", key="a") == "3" and run("remove", key="a") is None
    assert run("clear") is None and run("len") == 0
    assert node.kv_state(demo_context) == {}


def test_writes_move_the_state_hash_and_reads_do_not(node, demo_context):
    def context():
        return call(node, "GET", "/admin-api/contexts/" + demo_context).json()["data"]

    before = context()
    output_of(node, demo_context, "get", {"key": "a"})
    assert context() == before
    output_of(node, demo_context, "set", {"key": "a", "value": "1"})
    after = context()
    assert after["contextStateHash"] != before["contextStateHash"] and len(after["dagHeads"]) == 1


def test_app_error_is_a_debug_byte_list(node, demo_context):
    envelope = execute(node, demo_context, "get_result", {"key": "zz"}, request_id="req-7")
    assert envelope["id"] == "req-7" and envelope["error"]["type"] == "FunctionCallError"
    assert envelope["error"]["data"].startswith("the method call returned an error: [34, 107, 101, 121, ")
    assert decode_app_error(envelope["error"]["data"]) == "key not found: zz"


def test_get_unchecked_panics_on_an_absent_key():
    manifest = kv_store_manifest()
    get = next(m for m in manifest["methods"] if m["name"] == "get")
    manifest["methods"].append(dict(get, name="get_unchecked", returns_nullable=False))
    with NodeDouble(apps=[dict(kv_store_spec(), abi=manifest)], contexts=[{"app": kv_id()}]) as double:
        context_id = call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"][0]["id"]
        error = execute(double, context_id, "get_unchecked", {"key": "zz"})["error"]
    assert error["type"] == "FunctionCallError"
    assert error["data"].startswith("guest panicked: key not found at src/lib.rs:")


@pytest.mark.parametrize("args, fragment", [
    ({"key": "a", "value": "b", "extra": 1}, 'Error(\\"unknown field `extra`, expected `key` or `value`\\"'),
    ({"key": "a"}, "missing field `value`"),
    ({"key": "a", "value": 42}, "invalid type: integer `42`, expected a string"),
    ({"key": ["a"], "value": "b"}, "invalid type: sequence, expected a string"),
])
def test_bad_arguments_make_the_guest_panic(node, demo_context, args, fragment):
    error = execute(node, demo_context, "set", args)["error"]
    assert error["type"] == "FunctionCallError"
    assert error["data"].startswith("guest panicked: set: failed to deserialize arguments "
                                    "(expected { key: String, value: String }): Error(")
    assert fragment.replace('\\"', '"') in error["data"]
    assert node.kv_state(demo_context) == {}


def test_methods_without_parameters_refuse_named_arguments_only(node, demo_context):
    assert output_of(node, demo_context, "len", {}) == 0
    assert execute(node, demo_context, "len", None)["error"]["data"] == "missing field `argsJson`"
    error = execute(node, demo_context, "len", {"key": "a"})["error"]
    assert error["data"].startswith('guest panicked: len: failed to deserialize arguments (expected {}): '
                                    'Error("unknown field `key`, there are no fields"')


@pytest.mark.parametrize("params, error", [
    ({"contextId": hex_id("none"), "method": "get", "argsJson": {}}, {"type": "ContextNotFound"}),
    ({"method": "get", "argsJson": {}}, {"type": "ParseError", "data": "missing field `contextId`"}),
])
def test_execute_refusals(node, params, error):
    reply = call(node, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": 3, "method": "execute", "params": params})
    assert reply.status == 200 and reply.json() == {"jsonrpc": "2.0", "id": 3, "error": error}


def test_execute_errors_in_the_envelope(node, demo_context):
    assert execute(node, demo_context, "get")["error"] == {"type": "ParseError", "data": "missing field `argsJson`"}
    assert execute(node, demo_context, "nope", {})["error"] == {"type": "FunctionCallError",
                                                                "data": 'method "nope" not found'}
    unknown = call(node, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": None, "method": "query", "params": {}}).json()
    assert unknown["id"] is None and unknown["error"]["type"] == "ParseError"
    assert "unknown variant `query`" in unknown["error"]["data"]


def test_jsonrpc_framework_rejections_are_text(node):
    not_json = call(node, "POST", "/jsonrpc", raw=b"{", headers={"Content-Type": "application/json"})
    no_type = call(node, "POST", "/jsonrpc", raw=b"{}")
    assert not_json.status == 400 and not_json.body.startswith(b"Failed to parse the request body as JSON")
    assert no_type.status == 415
    version = call(node, "POST", "/jsonrpc", {"jsonrpc": "1.0", "id": 1, "method": "execute", "params": {}})
    assert (version.status, version.body) == (422, b"Failed to deserialize the JSON body into the target type: "
                                                   b"jsonrpc: Invalid JSON-RPC version")


def test_generic_apps_return_sample_values_and_record_executions():
    generic = dict(counter_spec(), behaviour="generic")
    with NodeDouble(apps=[generic], contexts=[{"app": "com.example.counter"}]) as double:
        context_id = call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"][0]["id"]
        assert output_of(double, context_id, "increment", {"by": 2}) == 1
        assert output_of(double, context_id, "init", {}) is None
        assert double.executions[0] == {"contextId": context_id, "method": "increment", "argsJson": {"by": 2}}


def test_the_sample_counter_counts_per_context():
    with NodeDouble(apps=[counter_spec()], contexts=[{"app": "com.example.counter"}] * 2) as double:
        first, second = [c["id"] for c in call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"]]
        assert output_of(double, first, "value") == 0
        assert output_of(double, first, "increment", {"by": 5}) == 5
        assert output_of(double, first, "increment", {"by": 2}) == 7
        assert output_of(double, first, "value") == 7 and output_of(double, second, "value") == 0
        assert output_of(double, second, "increment", {"by": 1}) == 1 and output_of(double, first, "value") == 7
        assert execute(double, first, "increment", {"by": "5"})["error"]["type"] == "FunctionCallError"
        assert output_of(double, first, "value") == 7
        assert output_of(double, first, "increment", {"by": 2 ** 32 - 1}) == 7 + 2 ** 32 - 1


def test_the_sample_counter_panics_on_overflow():
    with NodeDouble(apps=[counter_spec()], contexts=[{"app": "com.example.counter", "state": {"count": 2 ** 64 - 1}}]) \
            as double:
        context_id = call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"][0]["id"]
        error = execute(double, context_id, "increment", {"by": 1})["error"]
        assert error["type"] == "FunctionCallError" and "overflow" in error["data"]
        assert output_of(double, context_id, "value") == 2 ** 64 - 1


REAL_MANIFESTS = ["core-abi_conformance.json", "mero-mcp-rc83-abi_conformance.json", "apps-mero-issue-tracker.json",
                  "apps-battleships-lobby.json", "mero-mcp-rc83-kv-store.json"]


@pytest.mark.parametrize("name", REAL_MANIFESTS)
def test_every_method_of_a_real_manifest_executes(name):
    path = FIXTURES / "abi" / name
    if not path.exists():
        pytest.skip("shared fixture absent: " + str(path))
    manifest = json.loads(path.read_text())
    types = TypeSystem(manifest)
    spec = {"package": "com.example.real", "version": "1.0.0", "abi": manifest, "behaviour": "generic"}
    with NodeDouble(apps=[spec], contexts=[{"app": "com.example.real"}]) as double:
        context_id = call(double, "GET", "/admin-api/contexts").json()["data"]["contexts"][0]["id"]
        for method in manifest["methods"]:
            args = {p["name"]: None if p.get("nullable") else types.sample(p["type"]) for p in method["params"]}
            envelope = execute(double, context_id, method["name"], args)
            assert "result" in envelope, (method["name"], envelope)
            if method.get("returns_nullable") or method.get("returns", {"kind": "unit"}) == {"kind": "unit"}:
                assert envelope["result"]["output"] is None


def test_concurrent_executes_are_counted(node, demo_context):
    node.exec_delay = 0.2
    threads = [threading.Thread(target=output_of, args=(node, demo_context, "len")) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert node.max_inflight == 4 and len(node.executions) == 4


# ---------------------------------------------------------------------------------------------------------------
# Faults and restart
# ---------------------------------------------------------------------------------------------------------------

def test_fault_down_closes_without_an_answer(node):
    node.faults["down"] = True
    with pytest.raises(http.client.RemoteDisconnected):
        call(node, "GET", "/admin-api/health")


def test_fault_reset_aborts_the_connection(node):
    node.faults["reset"] = True
    with pytest.raises(ConnectionResetError):
        call(node, "GET", "/admin-api/health")


def test_fault_truncated_body(node):
    node.faults["truncated"] = True
    with pytest.raises(http.client.IncompleteRead):
        call(node, "GET", "/admin-api/health")


def test_fault_garbage_and_status_bodies(node):
    node.faults.update({"garbage": True})
    garbage = call(node, "GET", "/admin-api/health")
    node.faults.clear()
    node.faults.update({"status": 500, "body": "boom"})
    text = call(node, "GET", "/admin-api/health")
    node.faults.update({"status": 503, "body": None})
    del node.faults["body"]
    retry = call(node, "GET", "/admin-api/groups/" + hex_id("g"))
    assert garbage.status == 200 and not garbage.body.startswith(b"{")
    assert (text.status, text.body, text.content_type.startswith("text/plain")) == (500, b"boom", True)
    assert (retry.status, retry.json()) == (503, {"error": AUTHORITY_NOT_YET.format(hex_id("g"))})


def test_fault_path_filter_and_times(node):
    node.faults.update({"status": 502, "json": {"error": "bad gateway"}, "paths": ["/admin-api/applications"],
                        "times": 1})
    assert call(node, "GET", "/admin-api/health").status == 200
    assert call(node, "GET", "/admin-api/applications").json() == {"error": "bad gateway"}
    assert call(node, "GET", "/admin-api/applications").status == 200
    assert node.faults == {}


def test_fault_raw_sends_json_text_as_is(node):
    deep = '{"jsonrpc":"2.0","id":1,"result":{"output":%s%s}}' % ("[" * 5000, "]" * 5000)
    node.faults.update({"raw": deep, "paths": ["/jsonrpc"], "times": 1})
    answer = call(node, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": 1, "method": "execute", "params": {}})
    assert (answer.status, answer.body, answer.content_type) == (200, deep.encode("utf-8"), "application/json")
    assert node.faults == {}


def test_stop_and_restart_on_the_same_port(node, demo_context):
    port = node.port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/admin-api/health")
    connection.getresponse().read()   # a kept-alive connection must not outlive stop()
    node.stop()
    with pytest.raises(OSError):
        call(node, "GET", "/admin-api/health")
    with pytest.raises((OSError, http.client.HTTPException)):
        connection.request("GET", "/admin-api/health")
        connection.getresponse()
    node.start()
    assert node.port == port and call(node, "GET", "/admin-api/contexts/" + demo_context).status == 200


# ---------------------------------------------------------------------------------------------------------------
# Auth (§1.4–1.5, §2)
# ---------------------------------------------------------------------------------------------------------------

def test_proxy_mode_has_no_auth_routes(node):
    reply = login(node)
    assert (reply.status, reply.body) == (404, b"")
    assert call(node, "GET", "/admin-api/applications").status == 200


def jwt_claims(token):
    header, payload, signature = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "HS256", "typ": "JWT"} and signature
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_login_returns_a_jwt_pair(auth_node):
    reply = login(auth_node)
    body = reply.json()
    assert reply.status == 200 and body["error"] is None and body["data"]["error"] is None
    access = jwt_claims(body["data"]["access_token"])
    assert access["iss"] == "calimero-auth" and access["token_type"] == "access"
    assert access["permissions"] == ["admin"] and access["exp"] - access["iat"] == 3600
    assert jwt_claims(body["data"]["refresh_token"])["token_type"] == "refresh"
    second = login(auth_node).json()["data"]["access_token"]
    assert jwt_claims(second)["jti"] != access["jti"]


def test_login_failures(auth_node):
    bad = login(auth_node, password="wrong")
    assert bad.status == 401 and bad.json()["data"] is None
    assert bad.json()["error"].startswith("Authentication failed: ")
    no_timestamp = call(auth_node, "POST", "/auth/token", {"auth_method": "user_password", "public_key": "admin",
                                                           "client_name": "x", "provider_data": {}})
    assert no_timestamp.status == 400


def test_guard_answers(auth_node, demo_context):
    access, _ = auth_node.issue_tokens()
    assert call(auth_node, "GET", "/admin-api/health").status == 200
    none = call(auth_node, "GET", "/admin-api/applications")
    assert (none.status, none.body) == (401, b"")
    assert call(auth_node, "GET", "/admin-api/applications", headers=bearer(access)).status == 200
    assert call(auth_node, "GET", "/admin-api/applications?token=" + access).status == 200
    header_wins = call(auth_node, "GET", "/admin-api/applications?token=" + access, headers=bearer("junk"))
    assert (header_wins.status, header_wins.body) == (401, b"")
    rpc = call(auth_node, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": 1, "method": "execute",
                                               "params": {"contextId": demo_context, "method": "len", "argsJson": {}}})
    assert rpc.status == 401
    assert execute(auth_node, demo_context, "len", {}, headers=bearer(access))["result"]["output"] == 0


def test_expiry_refresh_and_replay(auth_node):
    access, refresh = auth_node.issue_tokens()
    early = call(auth_node, "POST", "/auth/refresh", {"access_token": access, "refresh_token": refresh})
    assert (early.status, early.json()) == (401, {"data": None, "error": "Access token still valid"})
    auth_node.expire_access_tokens()
    expired = call(auth_node, "GET", "/admin-api/applications", headers=bearer(access))
    assert (expired.status, expired.headers.get("x-auth-error"), expired.body) == (401, "token_expired", b"")
    renewed = call(auth_node, "POST", "/auth/refresh", {"access_token": access, "refresh_token": refresh}).json()
    new_access = renewed["data"]["access_token"]
    assert call(auth_node, "GET", "/admin-api/applications", headers=bearer(new_access)).status == 200
    replay = call(auth_node, "POST", "/auth/refresh", {"access_token": access, "refresh_token": refresh})
    assert (replay.status, replay.headers.get("x-auth-error")) == (401, "token_reuse")
    revoked = call(auth_node, "GET", "/admin-api/applications", headers=bearer(new_access))
    assert (revoked.status, revoked.headers.get("x-auth-error")) == (403, "token_revoked")
    assert auth_node.refresh_count == 3


def test_revoke_all_and_client_keys(auth_node):
    access, _ = auth_node.issue_tokens()
    minted = call(auth_node, "POST", "/admin/client-key", {"permissions": ["admin"]}, headers=bearer(access)).json()
    client_access = minted["data"]["access_token"]
    assert jwt_claims(client_access)["sub"] != jwt_claims(access)["sub"]
    assert call(auth_node, "GET", "/admin-api/contexts", headers=bearer(client_access)).status == 200
    assert call(auth_node, "POST", "/admin/client-key", {"permissions": ["admin"]}).status == 401
    auth_node.revoke_all()
    assert call(auth_node, "GET", "/admin-api/contexts", headers=bearer(client_access)).status == 403
    assert call(auth_node, "GET", "/admin-api/contexts",
                headers=bearer(login(auth_node).json()["data"]["access_token"])).status == 200


# ---------------------------------------------------------------------------------------------------------------
# Newer releases (§0.5): closed request bodies, typed errors, install and ABI texts, execute kinds, auth
# ---------------------------------------------------------------------------------------------------------------

def closed_bodies(node):
    """(method, path, a body the node accepts) for every closed request type the admin API has (§0.5.1)."""
    namespace = namespace_of(node)
    group = node.add_group(namespace=namespace, name="g")
    return [
        ("POST", "/admin-api/install-application", {"package": "p", "version": "1"}),
        ("POST", "/admin-api/contexts", {"applicationId": kv_id(), "initializationParams": [], "groupId": namespace}),
        ("POST", "/admin-api/namespaces", {"applicationId": kv_id()}),
        ("DELETE", "/admin-api/namespaces/" + namespace, {}),
        ("POST", "/admin-api/groups", {"applicationId": kv_id(), "parentGroupId": namespace}),
        ("DELETE", "/admin-api/groups/" + group, {}),
        ("POST", "/admin-api/groups/%s/members" % group, {"members": [{"identity": hex_id("b"), "role": "Member"}]}),
        ("PUT", "/admin-api/groups/%s/metadata" % group, {"data": {}}),
        ("PUT", "/admin-api/groups/%s/settings/subgroup-visibility" % group, {"subgroupVisibility": "open"}),
        ("POST", "/admin-api/namespaces/%s/invite" % namespace, {}),
        ("POST", "/admin-api/namespaces/%s/join" % namespace, {"invitation": {}}),
    ]


def test_every_closed_body_refuses_an_unknown_key_with_serdes_text(node):
    for method, path, body in closed_bodies(node):
        refused = call(node, method, path, dict(body, bogus=1))
        message = refused.json()["error"]
        assert refused.status == 400, (path, refused.status, message)
        assert message.startswith("Invalid JSON data: Failed to deserialize the JSON body into the target type: "
                                  "unknown field `bogus`, "), (path, message)
    assert [(r["path"], r["field"]) for r in node.refusals][:2] == [
        ("/admin-api/install-application", "bogus"), ("/admin-api/contexts", "bogus")]
    assert len(node.refusals) == len(closed_bodies(node))


def test_serde_names_the_known_fields_the_way_serde_does(node):
    namespace = namespace_of(node)
    one = call(node, "PUT", "/admin-api/groups/%s/settings/subgroup-visibility" % namespace, {"x": 1})
    empty = call(node, "DELETE", "/admin-api/namespaces/" + namespace, {"force": True})
    many = call(node, "POST", "/admin-api/namespaces/%s/invite" % namespace, {"expiry": 5})
    assert "unknown field `x`, expected `subgroupVisibility` at line 1 column 4" in one.json()["error"]
    assert "unknown field `force`, there are no fields" in empty.json()["error"]
    assert ("unknown field `expiry`, expected one of `expirationTimestamp`, `recursive`, `admitters`, "
            "`admitterAddrs`") in many.json()["error"]          # core's CreateGroupInvitationApiRequest, rc.83


def test_each_added_member_is_a_closed_set_too(node):
    namespace = namespace_of(node)
    members = [{"identity": hex_id("a"), "role": "Member"}, {"identity": hex_id("b"), "role": "Member", "name": "b"}]
    refused = call(node, "POST", "/admin-api/groups/%s/members" % namespace, {"members": members})
    assert refused.status == 400 and "unknown field `name`, expected `identity` or `role`" in refused.json()["error"]
    assert node.refusals[-1]["field"] == "members[1].name"
    assert hex_id("a") not in node._groups[namespace]["members"]        # nothing was applied


def test_open_bodies_still_ignore_extra_keys(node, demo_context):
    namespace = namespace_of(node)
    alias = call(node, "POST", "/admin-api/alias/create/context", {"alias": "x", "contextId": demo_context, "z": 1})
    subgroup = call(node, "POST", "/admin-api/namespaces/%s/groups" % namespace, {"groupName": "g", "z": 1})
    deleted = call(node, "DELETE", "/admin-api/contexts/" + demo_context, {"z": 1})
    assert (alias.status, subgroup.status, deleted.status) == (200, 200, 200) and node.refusals == []


def test_json_rpc_request_and_execute_params_are_closed(node, demo_context):
    params = {"contextId": demo_context, "method": "len", "argsJson": {}}
    stray_top = call(node, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": 1, "method": "execute", "params": params,
                                                "extra": True}).json()
    stray_param = call(node, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": 2, "method": "execute",
                                                  "params": dict(params, executorPublicKey="k")}).json()
    assert stray_top["error"] == {"type": "ParseError",
                                  "data": 'invalid value: string "extra", expected "method" or "params"'}
    assert stray_param["error"] == {"type": "ParseError", "data": "unknown field `executorPublicKey`, expected "
                                                                  "one of `contextId`, `method`, `argsJson`"}
    assert [r["field"] for r in node.refusals] == ["extra", "params.executorPublicKey"] and not node.executions


def test_auth_bodies_are_closed(auth_node):
    access, refresh = auth_node.issue_tokens()
    body = {"auth_method": "user_password", "public_key": "admin", "client_name": "c", "timestamp": 1,
            "provider_data": {"username": "admin", "password": "dev-password"}}
    for path, sent in (("/auth/token", dict(body, node_url="x")),
                       ("/auth/refresh", {"access_token": access, "refresh_token": refresh, "scope": "x"}),
                       ("/auth/logout", {"refresh_token": refresh, "all": True})):
        refused = call(auth_node, "POST", path, sent)
        assert refused.status == 400 and refused.json()["error"].startswith("Invalid JSON: unknown field `"), path
    assert len(auth_node.refusals) == 3 and login(auth_node).status == 200


def test_request_validation_speaks_cores_validation_texts(node):
    """What passes serde then meets the request type's Validate impl: ValidationError's texts, several joined."""
    namespace = namespace_of(node)
    install = "/admin-api/install-application"
    long_package = call(node, "POST", install, {"package": "p" * 129, "version": "1.0.0"})
    both = call(node, "POST", install, {"package": "", "version": "v" * 65})
    assert (long_package.status, long_package.json()) == (400, {
        "error": "Field 'package' exceeds maximum length of 128 characters (got 129)"})
    assert both.json() == {"error": "Validation errors: Field 'package' is required but was empty; Field 'version' "
                                    "exceeds maximum length of 64 characters (got 65)"}
    members = "/admin-api/groups/%s/members" % namespace
    empty = call(node, "POST", members, {"members": []})
    tee = call(node, "POST", members, {"members": [{"identity": hex_id("t"), "role": "ReadOnlyTee"}]})
    base58 = call(node, "POST", members, {"members": [{"identity": "1" * 32, "role": "Member"}]})
    assert (empty.status, empty.json()) == (400, {"error": "Field 'members' is required but was empty"})
    assert tee.json() == {"error": "Field 'members[].role' has invalid format: ReadOnlyTee role can only be "
                                   "assigned via TEE attestation"}
    assert base58.status == 400 and "expected 64 hex characters" in base58.json()["error"]   # hex only (§0.5.7)
    metadata = "/admin-api/groups/%s/metadata" % namespace
    many = {str(i): "" for i in range(65)}
    for body, reason in (({"name": ""}, "metadata name must not be the empty string — use null to clear it"),
                         ({"data": {"k": "v" * 4097}}, "metadata data value too long: 4097 bytes (max 4096)"),
                         ({"data": many}, "metadata data has too many entries: 65 (max 64)")):
        refused = call(node, "PUT", metadata, body)
        assert (refused.status, refused.json()) == (400, {"error": "Field 'metadata' has invalid format: " + reason})
    assert node._groups[namespace]["members"] == {NODE_ACCOUNT: "Admin"} and node._groups[namespace]["metadata"] is None
    create = {"applicationId": kv_id(), "groupId": namespace}
    missing = call(node, "POST", "/admin-api/contexts", create)
    too_large = call(node, "POST", "/admin-api/contexts", dict(create, initializationParams=[32] * (1024 * 1024 + 1)))
    assert "missing field `initializationParams`" in missing.json()["error"]            # a Vec without a default
    assert too_large.json() == {"error": "Field 'initialization_params' exceeds maximum size of 1048576 bytes "
                                         "(got 1048577)"}


def test_a_malformed_context_id_is_refused_the_way_each_route_parses_it(node):
    """GET /contexts/:id types its path (axum's text 400); delete, join and leave parse it by hand (JSON)."""
    read = call(node, "GET", "/admin-api/contexts/nope")
    assert (read.status, read.content_type.split(";")[0]) == (400, "text/plain")
    assert read.body.decode().startswith("Invalid URL: ")
    assert call(node, "DELETE", "/admin-api/contexts/nope").json() == {"error": "Invalid context id"}
    parsed = {"error": "Invalid context id format: expected base58 or hex-encoded 32 bytes"}
    assert call(node, "POST", "/admin-api/contexts/nope/join").json() == parsed
    assert call(node, "POST", "/admin-api/contexts/nope/leave").json() == parsed


def test_an_invitation_may_name_its_admitters(node):
    namespace = namespace_of(node)
    named = call(node, "POST", "/admin-api/namespaces/%s/invite" % namespace,
                 {"admitters": [NODE_ACCOUNT], "admitterAddrs": []})
    assert named.status == 200 and "invitation" in named.json()["data"] and node.refusals == []


def test_typed_not_found_answers_echo_the_id(node):
    unknown = hex_id("nothing here")
    assert call(node, "GET", "/admin-api/groups/" + unknown).json() == {"error": "group '%s' not found" % unknown}
    assert call(node, "POST", "/admin-api/namespaces/%s/invite" % unknown, {}).json() == {
        "error": "namespace '%s' not found" % unknown}
    joined = call(node, "POST", "/admin-api/contexts/%s/join" % unknown, {})
    assert (joined.status, joined.json()) == (404, {"error": "context '%s' not found" % unknown})
    created = call(node, "POST", "/admin-api/namespaces", {"applicationId": unknown})
    assert (created.status, created.json()) == (404, {"error": "application '%s' not found" % unknown})


def test_membership_and_role_refusals_are_403s_that_say_which(node):
    namespace = namespace_of(node)
    foreign = node.add_group(namespace=namespace, name="foreign", member=False)
    node.set_role(namespace, "Member")                     # no admin anywhere above `foreign` any more
    member = {"members": [{"identity": hex_id("z"), "role": "Member"}]}
    inherited = call(node, "POST", "/admin-api/groups/%s/members" % foreign, member)
    not_admin = call(node, "POST", "/admin-api/groups/%s/members" % namespace, member)
    subgroup = call(node, "POST", "/admin-api/namespaces/%s/groups" % namespace, {"groupName": "x"})
    listing = call(node, "GET", "/admin-api/groups/%s/members" % foreign)
    assert (inherited.status, inherited.json()["error"]) == (403, "node is not an admin of group '%s'" % foreign)
    assert (not_admin.status, not_admin.json()["error"]) == (403, "node is not an admin of group '%s'" % namespace)
    assert (subgroup.status, subgroup.json()["error"]) == (
        403, "creating a subgroup needs admin of namespace '%s'" % namespace)
    assert (listing.status, listing.json()["error"]) == (403, "node is not a member of group '%s'" % foreign)
    outsider = NodeDouble(apps=[kv_store_spec()], namespaces=[{"app": kv_id(), "member": False}])
    with outsider:
        ns = namespace_of(outsider)
        refused = call(outsider, "POST", "/admin-api/contexts", {"applicationId": kv_id(), "initializationParams": [],
                                                                 "groupId": ns})
        info = call(outsider, "GET", "/admin-api/groups/" + ns)          # core answers group info to members only
    assert (refused.status, refused.json()["error"]) == (403, "node is not a member of group '%s'" % ns)
    assert (info.status, info.json()["error"]) == (403, "node is not a member of group '%s'" % ns)


def test_joining_by_inheritance_without_the_namespace_is_core_typed_403(node):
    outsider = NodeDouble(apps=[kv_store_spec()], namespaces=[{"app": kv_id(), "member": False}])
    with outsider:
        group = outsider.add_group(namespace=namespace_of(outsider), visibility="open", member=False)
        refused = call(outsider, "POST", "/admin-api/groups/%s/join-via-inheritance" % group, {})
    assert (refused.status, refused.json()) == (403, {
        "error": "no namespace identity for this group; join the parent namespace first"})


def test_the_last_admin_cannot_leave_while_others_stay(node):
    namespace = namespace_of(node)
    node.set_role(namespace, "Member", account=hex_id("carol"))
    refused = call(node, "POST", "/admin-api/namespaces/%s/leave" % namespace)
    assert (refused.status, refused.json()["error"]) == (
        409, "node is the last admin of group '%s'; make another member admin first" % namespace)
    node.set_role(namespace, "Admin", account=hex_id("carol"))
    assert call(node, "POST", "/admin-api/namespaces/%s/leave" % namespace).status == 200
    group = node.add_group(namespace=namespace)
    assert call(node, "POST", "/admin-api/groups/%s/leave" % namespace).status == 400   # a namespace, not a group
    assert call(node, "POST", "/admin-api/groups/%s/leave" % group).status == 200


def test_current_shapes_of_namespaces_groups_and_roles(node):
    """§0.5.7: namespace rows carry `founding`, group info `namespaceId` and `ownerOpCounter`; RelayTee is a role
    only attestation grants; the certificate route is gone (a bodyless 404)."""
    namespace = namespace_of(node)
    row = call(node, "GET", "/admin-api/namespaces").json()["data"][0]
    group = node.add_group(namespace=namespace)
    info = call(node, "GET", "/admin-api/groups/" + group).json()["data"]
    relay = call(node, "POST", "/admin-api/groups/%s/members" % namespace,
                 {"members": [{"identity": hex_id("r"), "role": "RelayTee"}]})
    gone = call(node, "GET", "/admin-api/certificate")
    assert row["founding"]["founderAccountId"] == NODE_ACCOUNT and len(row["founding"]["salt"]) == 64
    assert (info["namespaceId"], info["ownerOpCounter"]) == (namespace, 0)
    assert (relay.status, relay.json()) == (400, {"error": "role RelayTee cannot be assigned directly"})
    assert (gone.status, gone.body) == (404, b"")


def test_group_conflicts_are_409s(node):
    namespace = namespace_of(node)
    group = node.add_group(namespace=namespace)
    taken = call(node, "POST", "/admin-api/groups", {"applicationId": kv_id(), "parentGroupId": namespace,
                                                     "groupId": group})
    assert (taken.status, taken.json()) == (409, {"error": "group '%s' already exists" % group})
    node.add_context(kv_id(), group_id=group)
    node.legacy_lifecycle = True             # older releases; the newest delete cascades (test_lifecycle routes)
    busy = call(node, "DELETE", "/admin-api/groups/" + group, {})
    assert (busy.status, busy.json()) == (409, {"error": "group '%s' has registered contexts; delete or detach "
                                                         "them first" % group})


def invitation_of(node, namespace, **body):
    return call(node, "POST", "/admin-api/namespaces/%s/invite" % namespace, body).json()["data"]["invitation"]


def test_an_invitation_is_spent_by_its_join_and_expires(node):
    namespace = namespace_of(node)
    invitation = invitation_of(node, namespace, expirationTimestamp=60)
    assert 55 <= invitation["invitation"]["expiration_timestamp"] - time.time() <= 61   # seconds of validity
    path = "/admin-api/namespaces/%s/join" % namespace
    assert call(node, "POST", path, {"invitation": invitation}).status == 200
    again = call(node, "POST", path, {"invitation": invitation})
    assert (again.status, again.json()) == (409, {"error": "invitation already consumed or expired"})
    fresh = invitation_of(node, namespace)
    node.expire_invitations()
    assert call(node, "POST", path, {"invitation": fresh}).status == 409
    tampered = copy.deepcopy(invitation_of(node, namespace))
    tampered["invitation"]["invited_role"] = 0
    assert call(node, "POST", path, {"invitation": tampered}).json() == {
        "error": "invitation is invalid: its signature does not verify"}


@pytest.mark.parametrize("outcome, status, fragment", [
    ("no_peer", 504, "could not reach any member of this namespace to complete the join; make sure the inviting "
                     "node is online and retry"),
    ("key_pending", 503, "the join went out and the key is on its way"),
    ("not_endorsed", 503, "has not endorsed the join"),
])
def test_join_outcomes_while_peers_are_away(node, outcome, status, fragment):
    namespace = namespace_of(node)
    invitation = invitation_of(node, namespace)
    node.join_outcome = outcome
    refused = call(node, "POST", "/admin-api/namespaces/%s/join" % namespace, {"invitation": invitation})
    assert refused.status == status and fragment in refused.json()["error"]
    node.join_outcome = None                                 # the invitation was not spent by the failed join
    assert call(node, "POST", "/admin-api/namespaces/%s/join" % namespace, {"invitation": invitation}).status == 200


def test_the_abi_of_a_raw_wasm_app_is_a_400():
    with NodeDouble(apps=[dict(kv_store_spec(), raw_wasm=True)]) as double:
        reply = call(double, "GET", "/admin-api/applications/%s/abi" % kv_id())
    assert (reply.status, reply.json()) == (400, {"error": "application is raw wasm, which never runs; reinstall it "
                                                           "as a signed bundle"})


def test_a_read_only_node_refuses_writes_and_serves_reads(node, demo_context):
    output_of(node, demo_context, "set", {"key": "k", "value": "v"})
    node.set_role(namespace_of(node), "ReadOnly")
    refused = execute(node, demo_context, "set", {"key": "k", "value": "w"})
    assert refused["error"] == {"type": "ReadOnlyWriteRefused", "data": {"context_id": demo_context}}
    assert node.kv_state(demo_context) == {"k": "v"} and output_of(node, demo_context, "get", {"key": "k"}) == "v"
    assert output_of(node, demo_context, "update_if_exists", {"key": "nope", "value": "x"}) is False  # wrote nothing


def test_a_token_without_an_execute_grant_for_the_call_is_refused(auth_node, demo_context):
    scoped, _ = auth_node.issue_tokens(permissions=["context:execute[%s,,get]" % demo_context])
    other, _ = auth_node.issue_tokens(permissions=["context:execute[%s]" % hex_id("another context")])
    assert execute(auth_node, demo_context, "get", {"key": "k"}, headers=bearer(scoped))["result"] == {"output": None}
    for token, method in ((scoped, "len"), (other, "get")):
        refused = execute(auth_node, demo_context, method, {} if method == "len" else {"key": "k"},
                          headers=bearer(token))
        assert refused["error"] == {"type": "FunctionCallError",
                                    "data": "this caller's token does not grant context:execute for this call"}
    admin_route = call(auth_node, "GET", "/admin-api/applications", headers=bearer(scoped))
    assert (admin_route.status, admin_route.headers.get("x-auth-error")) == (403, "permission_denied")


def test_refresh_with_tokens_of_two_logins_names_the_key(auth_node):
    access, _ = auth_node.issue_tokens("admin")
    _, other_refresh = auth_node.issue_tokens("someone else")
    auth_node.expire_access_tokens()
    mixed = call(auth_node, "POST", "/auth/refresh", {"access_token": access, "refresh_token": other_refresh})
    assert (mixed.status, mixed.json()) == (401, {"data": None,
                                                  "error": "Access and refresh tokens do not belong to the same key"})


def test_failed_logins_are_throttled_with_retry_after():
    with sample_double(auth=dict(CREDENTIALS, login_attempts=2)) as double:
        assert [login(double, "wrong").status for _ in range(2)] == [401, 401]
        throttled = login(double)                            # even the right password, while throttled
        other_user = call(double, "POST", "/auth/token", {
            "auth_method": "user_password", "public_key": "someone", "client_name": "c", "timestamp": 1,
            "provider_data": {"username": "someone", "password": "x"}})
    assert (throttled.status, throttled.json()) == (429, {
        "data": None, "error": "Too many failed login attempts; please try again later"})
    assert throttled.headers["retry-after"] == "60"
    assert other_user.status == 401                          # the limiter keys on (auth_method, public_key)


def test_logout_revokes_the_refresh_token(auth_node):
    access, refresh = auth_node.issue_tokens()
    out = call(auth_node, "POST", "/auth/logout", {"refresh_token": refresh})
    assert (out.status, out.json()) == (200, {"data": {"success": True}, "error": None})
    auth_node.expire_access_tokens()
    after = call(auth_node, "POST", "/auth/refresh", {"access_token": access, "refresh_token": refresh})
    assert after.status == 401 and after.headers.get("x-auth-error") == "token_revoked"
    assert call(auth_node, "POST", "/auth/logout", {"refresh_token": "junk"}).status == 401


def test_tokens_carry_a_key_id_and_an_upgrade_voids_older_ones():
    with sample_double(auth=dict(CREDENTIALS, legacy_tokens=True)) as double:
        old = login(double).json()["data"]["access_token"]
        assert "key_id" not in jwt_claims(old)
        assert call(double, "GET", "/admin-api/applications", headers=bearer(old)).status == 200
        double.upgrade_node()
        stale = call(double, "GET", "/admin-api/applications", headers=bearer(old))
        fresh = login(double).json()["data"]["access_token"]
        served = call(double, "GET", "/admin-api/applications", headers=bearer(fresh))
    assert (stale.status, stale.headers.get("x-auth-error"), stale.body) == (401, None, b"")   # a plain 401
    assert jwt_claims(fresh)["key_id"] == jwt_claims(fresh)["sub"] and served.status == 200


# ---------------------------------------------------------------------------------------------------------------
# The kv-store manifest and the command line
# ---------------------------------------------------------------------------------------------------------------

RC83_KEYS = ("doc", "returns_doc", "destructive", "idempotent")


def strip_rc83_keys(value):
    """The rc.25 JSON Schema predates doc/returns_doc/destructive/idempotent (§0); drop them to validate."""
    if isinstance(value, dict):
        return {k: strip_rc83_keys(v) for k, v in value.items() if k not in RC83_KEYS}
    if isinstance(value, list):
        return [strip_rc83_keys(v) for v in value]
    return value


def test_kv_store_manifest_is_valid_wasm_abi():
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.exists():
        pytest.skip("shared fixtures absent: " + str(SCHEMA))
    schema = json.loads(SCHEMA.read_text())
    # the upstream schema points at a `VariableBytesType` it never defines; read it as BytesType
    schema["definitions"].setdefault("VariableBytesType", schema["definitions"]["BytesType"])
    jsonschema.validate(strip_rc83_keys(kv_store_manifest()), schema)


def test_kv_store_manifest_contents():
    methods = {m["name"]: m for m in kv_store_manifest()["methods"]}
    assert list(methods) == sorted(methods) == ["clear", "entries", "get", "get_or_insert", "get_result", "init",
                                                "len", "remove", "set", "update_if_exists"]
    flags = {name: (m.get("intent"), bool(m.get("destructive")), bool(m.get("idempotent")))
             for name, m in methods.items()}
    assert flags["clear"] == ("mutating", True, True) and flags["set"] == ("mutating", True, False)
    assert flags["get_or_insert"] == ("mutating", False, True) and flags["init"] == (None, False, False)
    assert methods["get"]["returns_nullable"] and methods["remove"]["returns_nullable"]
    assert methods["len"]["returns"] == {"kind": "u32"} and methods["update_if_exists"]["returns"] == {"kind": "bool"}
    for method in methods.values():
        assert method["doc"] and all(p["doc"] for p in method["params"])
        assert method["returns"] == {"kind": "unit"} or method["returns_doc"]


def test_command_line_sample_prints_ready_and_stops_quietly():
    process = subprocess.Popen([sys.executable, str(HERE / "node_double.py"), "--sample", "--auth"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("READY http://127.0.0.1:")
        port = int(line.strip().rsplit(":", 1)[1])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/admin-api/applications")
        assert connection.getresponse().status == 401
        connection.close()
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    assert (process.returncode, out, err) == (0, "", "")


# ---------------------------------------------------------------------------------------------------------------
# The §0.6 lifecycle routes, newest and older forms (`legacy_lifecycle`)
# ---------------------------------------------------------------------------------------------------------------

def test_dev_install_takes_path_alone_and_an_older_node_requires_metadata(node):
    node.registry["/b/counter.mpk"] = counter_spec()
    extra = call(node, "POST", "/admin-api/install-dev-application", {"path": "/b/counter.mpk", "metadata": []})
    assert extra.status == 400 and "unknown field `metadata`, expected `path`" in extra.json()["error"]
    assert call(node, "POST", "/admin-api/install-dev-application", {"path": "/b/counter.mpk"}).json() == {
        "data": {"applicationId": hex_id("com.example.counter\0" + counter_spec()["signer_id"])}}
    node.legacy_lifecycle = True
    bare = call(node, "POST", "/admin-api/install-dev-application", {"path": "/b/counter.mpk"})
    assert bare.status == 400 and "missing field `metadata`" in bare.json()["error"]
    assert call(node, "POST", "/admin-api/install-dev-application", {"path": "/b/counter.mpk", "metadata": []}).status \
        == 200
    node.dev_install_root = "/opt/bundles"
    confined = call(node, "POST", "/admin-api/install-dev-application", {"path": "/b/counter.mpk", "metadata": []})
    assert (confined.status, confined.json()) == (403, {"error": "install path is not permitted"})


def test_versions_list_every_installed_version(node):
    node.upgrade_app(kv_id(), "1.1.0")
    versions = call(node, "GET", "/admin-api/applications/%s/versions" % kv_id()).json()["data"]
    assert [(v["version"], v["package"]) for v in versions] == [("1.0.0", KV_PACKAGE), ("1.1.0", KV_PACKAGE)]
    assert versions[0]["blobId"] != versions[1]["blobId"]


def test_peers_and_a_fresh_nodes_identity(node):
    node.peer_count = 2
    assert call(node, "GET", "/admin-api/peers").json() == {"count": 2}
    node.fresh_identity = True
    fresh = call(node, "GET", "/admin-api/identity")
    assert (fresh.status, fresh.json()["error"]) == (404, FRESH_IDENTITY)
    node.legacy_lifecycle = True
    assert "neither a device nor an account root yet" in call(node, "GET", "/admin-api/identity").json()["error"]


def test_sync_and_resync_are_logged_and_resync_needs_force_over_local_heads(node, demo_context):
    assert call(node, "POST", "/admin-api/contexts/sync/" + demo_context).json() == {"data": None}
    missing = call(node, "POST", "/admin-api/contexts/sync/" + hex_id("none"))
    assert missing.status == 404
    path = "/admin-api/contexts/%s/resync" % demo_context
    held = call(node, "POST", path, {})
    assert held.status == 409 and held.json()["error"].startswith("context %s: " % demo_context)
    assert call(node, "POST", path, {"force": True}).json() == {"contextId": demo_context, "resyncStarted": True}
    assert call(node, "POST", path, {"force": True, "bogus": 1}).status == 400
    assert call(node, "POST", path).status == 400                     # a JSON body is required
    assert node.syncs == [{"context": demo_context, "force": False}, {"context": demo_context, "force": True}]


def test_blob_head_and_get_headers_in_both_forms(node):
    data = b"hello blob"
    blob = hashlib.sha256(data).hexdigest()
    node._blobs[blob] = data
    head = call(node, "HEAD", "/admin-api/blobs/" + blob)
    got = call(node, "GET", "/admin-api/blobs/" + blob)
    assert (head.status, head.body, head.headers["content-length"]) == (200, b"", "10")
    assert (got.body, got.headers["x-blob-mime-type"], got.headers["x-blob-source"]) == (data, "text/plain", "local")
    assert call(node, "HEAD", "/admin-api/blobs/" + hex_id("none")).status == 404
    node.legacy_lifecycle = True
    old = call(node, "GET", "/admin-api/blobs/" + blob)
    assert "x-blob-source" not in old.headers and old.headers["cache-control"] == "public, max-age=3600"


def test_group_delete_cascades_and_refuses_a_namespace_root(node):
    namespace = namespace_of(node)
    group = node.add_group(namespace=namespace)
    inner = node.add_group(parent=group)
    context = node.add_context(kv_id(), group_id=inner)
    root = call(node, "DELETE", "/admin-api/groups/" + namespace, {})
    assert (root.status, root.json()) == (400, {"error": "cannot delete the namespace root %s; use delete_namespace "
                                                         "instead" % namespace})
    assert call(node, "DELETE", "/admin-api/groups/" + group, {"requester": NODE_ACCOUNT}).status == 400
    assert call(node, "DELETE", "/admin-api/groups/" + group, {}).json() == {"data": {"isDeleted": True}}
    assert group not in node._groups and inner not in node._groups and context not in node._contexts
    assert call(node, "GET", "/admin-api/groups/" + inner).status == 404


def test_members_remove_and_role_keep_an_admin(node):
    namespace, member = namespace_of(node), hex_id("member")
    node.set_role(namespace, "Member", member)
    role_path = "/admin-api/groups/%s/members/%s/role" % (namespace, member)
    assert call(node, "PUT", role_path, {"role": "ReadOnly"}).json() == {}
    assert node._groups[namespace]["members"][member] == "ReadOnly"
    for body, status in (({"role": "ReadOnlyTee"}, 400), ({"role": "Boss"}, 400), ({"role": "Admin", "x": 1}, 400)):
        assert call(node, "PUT", role_path, body).status == status, body
    bad = call(node, "PUT", "/admin-api/groups/%s/members/nope/role" % namespace, {"role": "Admin"})
    assert bad.json() == {"error": "Invalid account format: expected 64 hex characters (32 bytes)"}
    stranger = call(node, "PUT", "/admin-api/groups/%s/members/%s/role" % (namespace, hex_id("x")), {"role": "Admin"})
    assert stranger.status == 404
    demote = call(node, "PUT", "/admin-api/groups/%s/members/%s/role" % (namespace, NODE_ACCOUNT), {"role": "Member"})
    assert (demote.status, demote.json()) == (409, {"error": "cannot demote the last admin of the group"})
    remove = "/admin-api/groups/%s/members/remove" % namespace
    assert call(node, "POST", remove, {"members": []}).status == 400
    last = call(node, "POST", remove, {"members": [NODE_ACCOUNT]})
    assert (last.status, last.json()) == (409, {"error": "cannot remove the last admin of the group"})
    assert call(node, "POST", remove, {"members": [member]}).json() == {}
    assert member not in node._groups[namespace]["members"]
    node.legacy_lifecycle = True
    node.set_role(namespace, "Member", member)
    older = call(node, "POST", remove, {"members": [member], "requester": NODE_ACCOUNT})
    assert (older.status, older.body) == (200, b"null")


def test_upgrade_moves_the_group_and_its_record_is_completed_at_once(node):
    """§0.7: the group's (and namespace's) appKey move at once; the record is written completed with null counts
    and completedAt, and group info keeps it as activeUpgrade. With upgrade_pending_reads, the §0.6 handler's
    in_progress form for that many status reads."""
    namespace = namespace_of(node)
    upgrade, status = "/admin-api/groups/%s/upgrade" % namespace, "/admin-api/groups/%s/upgrade/status" % namespace
    assert call(node, "GET", status).json() == {"data": None}
    same = call(node, "POST", upgrade, {"targetApplicationId": kv_id()})
    assert (same.status, same.json()["error"]) == (409, "group %s is already targeting this application; install a "
                                                        "new version of it to upgrade" % namespace)
    node.upgrade_app(kv_id(), "2.0.0")
    row = call(node, "GET", "/admin-api/namespaces/" + namespace).json()["data"]
    assert row["appVersion"] == "1.0.0", "an install alone moves no namespace"
    started = call(node, "POST", upgrade, {"targetApplicationId": kv_id(), "cascade": False, "forceCodeOnly": False})
    assert started.json() == {"data": {"groupId": namespace, "status": "completed", "localContextsTotal": None,
                                       "localContextsSwapped": None, "localContextsFailed": None}}
    record = call(node, "GET", status).json()["data"]
    assert (record["status"], record["fromVersion"], record["toVersion"], record["completedAt"],
            record["localContextsTotal"]) == ("completed", "1.0.0", "2.0.0", None, None)
    info = call(node, "GET", "/admin-api/groups/" + namespace).json()["data"]
    assert info["activeUpgrade"] == record
    assert info["appKey"] == call(node, "GET", "/admin-api/applications/" + kv_id()).json()["data"][
        "application"]["blob"]["bytecode"]
    row = call(node, "GET", "/admin-api/namespaces/" + namespace).json()["data"]
    assert (row["appKey"], row["appVersion"]) == (info["appKey"], "2.0.0")
    node.upgrade_pending_reads = 1
    node.upgrade_app(kv_id(), "2.1.0")
    pending = call(node, "POST", upgrade, {"targetApplicationId": kv_id()})
    assert pending.json()["data"]["status"] == "in_progress"
    assert call(node, "POST", upgrade, {"targetApplicationId": kv_id()}).status == 409      # in progress
    first, second = call(node, "GET", status).json()["data"], call(node, "GET", status).json()["data"]
    assert (first["status"], first["localContextsTotal"]) == ("in_progress", 1)
    assert (second["status"], second["localContextsTotal"]) == ("completed", None) and second["completedAt"]
    node.upgrade_pending_reads = 0
    assert call(node, "POST", upgrade, {"targetApplicationId": hex_id("none")}).status == 404
    assert call(node, "POST", upgrade, {"targetApplicationId": kv_id(), "requester": NODE_ACCOUNT}).status == 400
    node.legacy_lifecycle = True
    node.upgrade_app(kv_id(), "3.0.0")
    older = call(node, "POST", upgrade, {"targetApplicationId": kv_id(), "requester": NODE_ACCOUNT})
    assert older.json() == {"data": {"groupId": namespace, "status": "completed", "total": None, "completed": None,
                                     "failed": None}}
    empty = node.add_group(namespace=namespace)
    node.upgrade_app(kv_id(), "4.0.0")
    nothing = call(node, "POST", "/admin-api/groups/%s/upgrade" % empty, {"targetApplicationId": kv_id()})
    assert (nothing.status, nothing.json()) == (409, {"error": "group %s has no contexts to upgrade" % empty})


# ---------------------------------------------------------------------------------------------------------------
# A network of doubles (§0.8): each node its own server, identity, auth and replicas; gossip between members
# ---------------------------------------------------------------------------------------------------------------

def eventually(check, timeout=5.0):
    """Poll until check() is truthy (gossip lands after its delay); the deadline only shows nothing hangs."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def two_nodes(network, joiner_apps=True):
    """node1 with the kv app, a namespace and a context; node2 with (or without) the app installed."""
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", apps=[kv_store_spec()] if joiner_apps else [])
    namespace = call(node1, "POST", "/admin-api/namespaces", {"applicationId": kv_id()}).json()["data"]["namespaceId"]
    created = call(node1, "POST", "/admin-api/contexts", {"applicationId": kv_id(), "initializationParams": [],
                                                            "groupId": namespace}).json()["data"]
    return node1, node2, namespace, created["contextId"]


def invite_and_join(inviter, joiner, namespace):
    invitation = call(inviter, "POST", "/admin-api/namespaces/{}/invite".format(namespace),
                      {"expirationTimestamp": 600}).json()["data"]["invitation"]
    return call(joiner, "POST", "/admin-api/namespaces/{}/join".format(namespace), {"invitation": invitation})


def context_hash(node, context_id):
    reply = call(node, "GET", "/admin-api/contexts/" + context_id)
    return reply.json()["data"]["contextStateHash"] if reply.status == 200 else None


def joined_pair(network, joiner_apps=True):
    node1, node2, namespace, context_id = two_nodes(network, joiner_apps)
    assert invite_and_join(node1, node2, namespace).status == 200
    assert call(node2, "POST", "/admin-api/contexts/{}/join".format(context_id)).status == 200
    return node1, node2, namespace, context_id


def test_network_nodes_have_their_own_identity_peer_id_and_peers():
    from node_double import Network
    with Network() as network:
        node1, node2 = network.add("node1"), network.add("node2")
        ids = [call(n, "GET", "/admin-api/identity").json()["data"]["accountId"] for n in (node1, node2)]
        peers = [call(n, "GET", "/admin-api/network/status").json()["localPeerId"] for n in (node1, node2)]
        assert ids[0] != ids[1] and NODE_ACCOUNT not in ids
        assert peers[0] != peers[1] and all(p.startswith("12D3KooW") for p in peers)
        assert call(node1, "GET", "/admin-api/peers").json() == {"count": 1}
        network.stop("node2")
        assert call(node1, "GET", "/admin-api/peers").json() == {"count": 0}


def test_a_token_minted_by_one_node_is_refused_by_another_and_every_authorization_is_recorded():
    from node_double import Network
    with Network() as network:
        node1, node2 = network.add("node1", auth=CREDENTIALS), network.add("node2", auth=CREDENTIALS)
        token = login(node1).json()["data"]["access_token"]
        assert call(node1, "GET", "/admin-api/applications", headers=bearer(token)).status == 200
        assert call(node2, "GET", "/admin-api/applications", headers=bearer(token)).status == 401
        assert node2.authorizations()[-1] == "Bearer " + token
        assert "Bearer " + token in node1.authorizations()


def test_the_whole_flow_invitation_join_replica_and_a_write_that_arrives():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, namespace, context_id = two_nodes(network)
        assert call(node2, "GET", "/admin-api/identity").status == 200
        joined = invite_and_join(node1, node2, namespace).json()["data"]
        assert joined["memberAccount"] == node2.account and joined["memberIdentity"] == node2.public_key
        members = lambda: call(node1, "GET", "/admin-api/groups/{}/members".format(namespace)).json()["members"]
        assert eventually(lambda: node2.account in json.dumps(members())), "membership gossiped back to node1"
        assert call(node2, "POST", "/admin-api/contexts/{}/join".format(context_id)).status == 200
        assert eventually(lambda: context_hash(node2, context_id) == context_hash(node1, context_id))
        output_of(node1, context_id, "set", {"key": "greeting", "value": "hi"})
        assert eventually(lambda: output_of(node2, context_id, "get", {"key": "greeting"}) == "hi")
        assert context_hash(node2, context_id) == context_hash(node1, context_id)
        status = execute(node2, context_id, "get", {"key": "greeting"})
        assert status["result"]["output"] == "hi"
        synced = call(node2, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": 1, "method": "sync_status",
                                                  "params": {"contextId": context_id}}).json()["result"]
        assert synced["isInitialized"] and synced["syncState"] == {"state": "idle"}


def test_a_spent_invitation_is_spent_on_every_node():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, namespace, _ = two_nodes(network)
        node3 = network.add("node3")
        invitation = call(node1, "POST", "/admin-api/namespaces/{}/invite".format(namespace),
                          {}).json()["data"]["invitation"]
        path = "/admin-api/namespaces/{}/join".format(namespace)
        assert call(node2, "POST", path, {"invitation": invitation}).status == 200
        assert call(node3, "POST", path, {"invitation": invitation}).status == 409


def test_sync_pulls_at_once_when_gossip_is_slow():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, _, context_id = joined_pair(network)
        assert eventually(lambda: context_hash(node2, context_id) == context_hash(node1, context_id))
        network.settle()
        network.gossip_delay = 60
        output_of(node1, context_id, "set", {"key": "k", "value": "v"})
        assert context_hash(node2, context_id) != context_hash(node1, context_id)
        assert call(node2, "POST", "/admin-api/contexts/sync/" + context_id).status == 200
        assert context_hash(node2, context_id) == context_hash(node1, context_id)
        assert output_of(node2, context_id, "get", {"key": "k"}) == "v"


def test_not_connected_nodes_have_no_peers_and_the_join_is_the_504():
    from node_double import JOIN_NO_PEER, Network
    with Network(connected=False) as network:
        node1, node2, namespace, context_id = two_nodes(network)
        assert call(node2, "GET", "/admin-api/peers").json() == {"count": 0}
        refused = invite_and_join(node1, node2, namespace)
        assert refused.status == 504 and refused.json()["error"] == JOIN_NO_PEER
        status = call(node1, "POST", "/jsonrpc", {"jsonrpc": "2.0", "id": 1, "method": "sync_status",
                                                  "params": {"contextId": context_id}}).json()["result"]
        assert status["syncState"] == {"state": "waitingForPeers"} and status["lastError"] == "No peers to sync with"
        network.connect("node1", "node2")
        assert invite_and_join(node1, node2, namespace).status == 200


def test_the_key_on_its_way_join_records_the_membership_and_answers_503():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, namespace, _ = two_nodes(network)
        node2.join_outcome = "key_pending"
        refused = invite_and_join(node1, node2, namespace)
        assert refused.status == 503 and "key is on its way" in refused.json()["error"]
        members = lambda: call(node1, "GET", "/admin-api/groups/{}/members".format(namespace)).json()["members"]
        assert eventually(lambda: node2.account in json.dumps(members()))


def test_a_joiner_without_the_app_converges_but_its_execute_finds_no_bytecode():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, _, context_id = joined_pair(network, joiner_apps=False)
        output_of(node1, context_id, "set", {"key": "k", "value": "v"})
        assert eventually(lambda: context_hash(node2, context_id) == context_hash(node1, context_id))
        error = execute(node2, context_id, "get", {"key": "k"})["error"]
        assert error["type"] == "InternalError"
        assert re.match(r"bytecode blob [0-9a-f]{64} not found in blobstore$", error["data"]["message"])


def test_a_node_whose_hash_runs_ahead_of_its_reads():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, _, context_id = joined_pair(network)
        assert eventually(lambda: context_hash(node2, context_id) == context_hash(node1, context_id))
        node2.reads_lag = 60
        output_of(node1, context_id, "set", {"key": "k", "value": "v"})
        assert eventually(lambda: context_hash(node2, context_id) == context_hash(node1, context_id))
        assert output_of(node2, context_id, "get", {"key": "k"}) is None, "the hash agreed before the read did"
        node2.release_reads()
        assert output_of(node2, context_id, "get", {"key": "k"}) == "v"


def test_a_node_down_misses_gossip_and_catches_up_when_it_starts():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, _, context_id = joined_pair(network)
        port = node2.port
        network.stop("node2")
        output_of(node1, context_id, "set", {"key": "k", "value": "v"})
        with pytest.raises(OSError):
            call(node2, "GET", "/admin-api/health", timeout=1)
        time.sleep(0.1)                       # past the gossip delay: it went nowhere
        assert node2.kv_state(context_id) == {}
        network.start("node2")
        assert node2.port == port
        assert output_of(node2, context_id, "get", {"key": "k"}) == "v"


def test_governance_metadata_replicates_and_a_context_joins_only_once_registered():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, namespace, _ = two_nodes(network)
        assert invite_and_join(node1, node2, namespace).status == 200
        assert call(node1, "PUT", "/admin-api/groups/{}/metadata".format(namespace),
                    {"name": "team", "data": {}}).status == 200
        metadata = lambda: call(node2, "GET", "/admin-api/groups/{}/metadata".format(namespace)).json()["data"]
        assert eventually(lambda: (metadata() or {}).get("name") == "team")
        network.gossip_delay = 0.3
        created = call(node1, "POST", "/admin-api/contexts", {"applicationId": kv_id(), "initializationParams": [],
                                                                "groupId": namespace}).json()["data"]
        joined = call(node2, "POST", "/admin-api/contexts/{}/join".format(created["contextId"]))
        assert joined.status == 200, "the join waited for the registration to arrive"
        assert call(node2, "POST", "/admin-api/contexts/{}/join".format(hex_id("nowhere"))).status == 404


def test_a_joiner_lists_the_namespace_contexts_governance_brought_before_joining_them():
    from node_double import Network
    with Network(gossip_delay=0.05) as network:
        node1, node2, namespace, context_id = two_nodes(network)
        assert invite_and_join(node1, node2, namespace).status == 200
        listed = call(node2, "GET", "/admin-api/groups/{}/contexts".format(namespace)).json()["data"]
        assert [row["contextId"] for row in listed] == [context_id]
        assert call(node2, "GET", "/admin-api/contexts/" + context_id).status == 404, "not joined yet"
        assert call(node2, "GET", "/admin-api/namespaces/" + namespace).json()["data"]["contextCount"] == 1


def test_the_real_server_carries_the_flow_across_two_networked_doubles(tmp_path):
    """One session per node (phase B's multi-node server will be one): what the doubles replicate is what the
    server reads, and each node only ever sees its own session's requests."""
    from mcp_client import McpServer, minimal_env
    from node_double import Network

    def session(node, name):
        server = McpServer(minimal_env(tmp_path / name, {"CALIMERO_NODE_URL": node.url,
                                                         "CALIMERO_MCP_STATE_DIR": tmp_path / name / "state",
                                                         "CALIMERO_NODE_HOME": tmp_path / "nodes"}))
        server.initialize()
        return server

    with Network(gossip_delay=0.05) as network:
        node1, node2 = network.add("node1", apps=[kv_store_spec()]), network.add("node2", apps=[kv_store_spec()])
        one, two = session(node1, "one"), session(node2, "two")
        try:
            namespace = one.tool_json("create_namespace", {"application": KV_PACKAGE})["namespaceId"]
            context_id = one.tool_json("create_context", {"application": KV_PACKAGE,
                                                          "group": namespace})["contextId"]
            invitation = one.tool_json("invite_to_namespace", {"namespace": namespace})
            joined = two.tool_json("join_namespace", {"namespace": namespace, "invitation": invitation})
            assert joined["identity"] == node2.account
            assert eventually(lambda: not two.call_tool("join_context", {"context": context_id}).get("isError"))
            one.call_tool("call", {"app": KV_PACKAGE, "context": context_id, "method": "set",
                                   "args": {"key": "k", "value": "v"}})
            read = lambda: two.call_tool("call", {"app": KV_PACKAGE, "context": context_id, "method": "get",
                                                  "args": {"key": "k"}})["content"][0]["text"]
            assert eventually(lambda: read() == '"v"')
        finally:
            one.close()
            two.close()
        assert not any("/jsonrpc" == e["path"] and e["json"]["params"].get("method") == "set" for e in node2.log)


def test_each_node_of_a_network_makes_ids_of_its_own():
    """Real nodes make random ids: two nodes creating a namespace and a context each never get the same ones (a
    per-node counter gave both node1's ids, so a test could pass an id to the wrong node and still be answered)."""
    from node_double import Network, kv_store_spec
    with Network() as network:
        made = []
        for name in ("node1", "node2"):
            node = network.add(name, apps=[kv_store_spec()])
            kv = node._app_key("com.calimero.kv-store")
            namespace = node.add_namespace(kv, name="team")
            made.append((namespace, node.add_context(kv, group_id=namespace)))
    assert made[0][0] != made[1][0] and made[0][1] != made[1][1], made


def test_a_node_joining_a_context_has_a_member_key_of_its_own():
    from node_double import Network
    with Network() as network:
        node1, node2, namespace, context_id = two_nodes(network)
        assert invite_and_join(node1, node2, namespace).status == 200
        joined = call(node2, "POST", "/admin-api/contexts/{}/join".format(context_id)).json()["data"]
        assert joined["contextId"] == context_id
        assert joined["memberPublicKey"] != node1._member_key(context_id)
