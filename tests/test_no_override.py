"""No argument silently overridden: create_context's group of another application, create_group's
parent outside its namespace, select_app's service beside a context that runs another. Each refusal happens before
the node is asked to create anything, which the double's log shows."""
from __future__ import annotations

import pytest

from node_double import NodeDouble, counter_spec, hex_id, kv_store_manifest, kv_store_spec, sample_double

KV = "com.calimero.kv-store"
COUNTER = "com.example.counter"



def error_text(result):
    assert result.get("isError") is True, result
    return result["content"][-1]["text"]


def writes(double):
    """Every request that could have created something."""
    return [(r["method"], r["path"]) for r in double.log if r["method"] in ("POST", "PUT")
            and not r["path"].startswith("/admin-api/alias/lookup") and r["path"] != "/jsonrpc"]


def kv_namespace(double):
    kv_id = double._app_key(KV)
    return next(g["id"] for g in double._groups.values() if g["parent"] is None and g["applicationId"] == kv_id)


# ── create_context: the group's application is the one asked for ──────────────────────────────────

def test_create_context_refuses_a_group_of_another_application(serve):
    double = sample_double()
    namespace = kv_namespace(double)
    subgroup = double.add_group(namespace=namespace, name="inner")
    server = serve(double)
    before = set(double._contexts)
    for group in (namespace, subgroup):
        text = error_text(server.call_tool("create_context", {"application": "counter", "group": group}))
        assert text == ('Error: Group %s is for application %s, not "counter": the node would create a context of '
                        '%s there. Create the context in a namespace or group of "counter" (create_namespace makes '
                        'one).' % (group, KV, KV))
    assert set(double._contexts) == before and writes(double) == []
    own = server.tool_json("create_namespace", {"application": "counter"})["namespaceId"]
    created = server.tool_json("create_context", {"application": "counter", "group": own})
    assert double._contexts[created["contextId"]]["applicationId"] == double._app_key(COUNTER)


def test_create_context_names_an_uninstalled_target_by_its_id(serve):
    double = sample_double()
    namespace = kv_namespace(double)
    server = serve(double)
    server.tool_json("list_applications")
    orphan_id = hex_id("gone")
    with double._lock:                       # the namespace's application was uninstalled meanwhile
        double._groups[namespace]["applicationId"] = orphan_id
    text = error_text(server.call_tool("create_context", {"application": "kv-store", "group": namespace}))
    assert text.startswith('Error: Group %s is for application %s, not "kv-store": the node would create a context '
                           'of that application there.' % (namespace, orphan_id))
    assert writes(double) == []


def test_create_context_in_an_unknown_group_is_the_nodes_refusal(serve):
    double = sample_double()
    server = serve(double)
    missing = hex_id("no such group")
    text = error_text(server.call_tool("create_context", {"application": "kv-store", "group": missing}))
    assert missing in text and "not found" in text
    assert writes(double) == []


# ── create_group: the parent is in the namespace ──────────────────────────────────────────────────

@pytest.mark.parametrize("legacy", [False, True], ids=["rc83 group info", "older group info"])
def test_create_group_refuses_a_parent_outside_the_namespace(serve, legacy):
    double = sample_double()
    double.legacy_group_info = legacy
    kv_id = double._app_key(KV)
    ours, theirs = kv_namespace(double), double.add_namespace(kv_id, name="other team")
    parent = double.add_group(namespace=ours, name="team a")
    deep = double.add_group(parent=parent, name="team a1")
    foreign = double.add_group(namespace=theirs, name="team b")
    server = serve(double)
    groups_before = set(double._groups)
    for outside in (foreign, theirs):
        text = error_text(server.call_tool("create_group", {"namespace": ours, "parent": outside, "name": "x"}))
        assert text == ("Error: Group %s is not in namespace %s. Pass the namespace the parent is in, or a parent "
                        "inside namespace %s." % (outside, ours, ours))
    assert set(double._groups) == groups_before and writes(double) == []
    for inside in (deep, ours):
        made = server.tool_json("create_group", {"namespace": ours, "parent": inside, "name": "y"})["groupId"]
        assert double._groups[made]["parent"] == inside


# ── select_app: a service beside a context is the context's ─────────────────────────────────────────

def two_service_spec():
    return {"package": "com.example.duo", "version": "1.0.0", "signer_id": "signer-duo", "metadata": {"name": "Duo"},
            "services": {"api": kv_store_manifest(), "worker": counter_spec()["abi"]}}


def test_select_app_refuses_a_service_the_context_does_not_run(serve):
    double = NodeDouble(apps=[two_service_spec(), kv_store_spec()])
    api_context = double.add_context("com.example.duo", service="api")
    double.add_context("com.example.duo", service="worker")
    only_kv = double.add_context(KV)
    server = serve(double)
    text = error_text(server.call_tool("select_app", {"app": "duo", "context": api_context, "service": "worker"}))
    assert text == ('Error: Context %s runs service api, not "worker". Services of "duo": api, worker. Omit service, '
                    'or choose a context that runs it.' % api_context)
    text = error_text(server.call_tool("select_app", {"app": "duo", "context": api_context, "service": "nope"}))
    assert 'not "nope". Services of "duo": api, worker.' in text
    text = error_text(server.call_tool("select_app", {"app": "kv-store", "service": "api"}))   # the only context
    assert text == ('Error: Context %s runs no named service, not "api". Services of "kv-store": (none). Omit '
                    'service, or choose a context that runs it.' % only_kv)
    chosen = server.call_tool("select_app", {"app": "duo", "context": api_context, "service": "api"})
    assert not chosen.get("isError") and chosen["structuredContent"]["service"] == "api"
