"""Issue 42 (items 1, 2, 5 and part of 6) and one secret of issue 43: two nodes as a model meets them. The real server
over stdio against a Network of node doubles, each with its own registry (config.toml's [registry] base_url in the
node's home), as a fresh node2 joins node1's namespace."""
import json

from node_double import kv_store_spec, NodeDouble, sample_double

KV = "com.calimero.kv-store"


def texts(result):
    return [block["text"] for block in result.get("content", []) if block.get("type") == "text"]


def answer(result):
    assert not result.get("isError"), result
    return json.loads(texts(result)[0])


def refusal(result):
    assert result.get("isError"), result
    return texts(result)[0]


def with_registry(tmp_path, name, double):
    """Node `name`'s home, whose config.toml names the registry `double` serves (its `registry` entries)."""
    folder = tmp_path / "nodes" / name
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text('[registry]\nmode = "http"\nbase_url = "%s"\n' % double.registry_url)


def team(server):
    """node1's namespace "team" with context "kv-main" aliased doomed there: (namespace id, context id)."""
    namespace = answer(server.call_tool("create_namespace", {"application": KV, "name": "team", "node": "node1"}))[
        "namespaceId"]
    context = answer(server.call_tool("create_context", {"application": KV, "namespace": namespace,
                                                         "name": "kv-main", "alias": "doomed", "node": "node1"}))
    return namespace, context["contextId"]


def sent(double, method, suffix):
    return [e for e in double.log if e["method"] == method and e["path"].endswith(suffix)]


def fresh_pair(network, tmp_path, published=None):
    """node1 runs kv-store 1.0.0; node2 has no app, and its registry publishes `published` versions of kv-store
    (None: node2's registry is unknown to the server)."""
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2")
    if published is not None:
        node2.registry.update({"%s@%s" % (KV, v): kv_store_spec(v) for v in published})
        with_registry(tmp_path, "node2", node2)
    return node1, node2


# ---- item 1: the join brings the app ----

def test_join_from_installs_the_exact_build_from_the_joiners_registry_then_joins_in_one_call(network, several,
                                                                                            tmp_path):
    node1, node2 = fresh_pair(network, tmp_path, published=["0.9.0", "1.0.0", "1.2.0"])
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace, context = team(server)
    joined = answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    target = node1._app_key(KV)
    assert joined["namespaceId"] == namespace and joined["invitedBy"] == "node1"
    assert joined["installed"]["applicationId"] == target and joined["installed"]["version"] == "1.0.0"
    assert "node2's registry" in joined["installed"]["from"]
    assert [e["json"] for e in sent(node2, "POST", "/install-application")] == [{"package": KV, "version": "1.0.0"}]
    assert node2._app_key(KV) == target and node2.account in node2._groups[namespace]["members"]
    assert joined["joined"]["identity"] == node2.account and "memberAccount" not in joined["joined"]


def test_join_from_refuses_when_the_joiners_registry_lacks_that_build_naming_what_it_publishes(network, several,
                                                                                              tmp_path):
    node1, node2 = fresh_pair(network, tmp_path, published=["0.9.0", "1.2.0"])
    server = several(("node1", node1.url), ("node2", node2.url))
    team(server)
    text = refusal(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert "%s@1.0.0" % KV in text and "versions 0.9.0, 1.2.0" in text and "Nothing was sent" in text
    assert "install_application with its path" in text and "never another version" in text
    assert sent(node2, "POST", "/install-application") == [] and sent(node2, "POST", "/join") == []
    assert sent(node1, "POST", "/invite") == []


def test_join_from_refuses_when_the_joiners_registry_does_not_publish_the_package(network, several, tmp_path):
    node1, node2 = fresh_pair(network, tmp_path, published=[])
    server = several(("node1", node1.url), ("node2", node2.url))
    team(server)
    text = refusal(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert "does not publish %s at all" % KV in text and sent(node2, "POST", "/install-application") == []


def test_join_from_with_the_joiners_registry_unknown_sends_nothing_and_names_both_ways_in(network, several,
                                                                                         tmp_path):
    node1, node2 = fresh_pair(network, tmp_path, published=None)
    server = several(("node1", node1.url), ("node2", node2.url))
    team(server)
    text = refusal(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert "registry is unknown" in text and "CALIMERO_REGISTRY_URL" in text
    assert 'install_application with coords "%s@1.0.0" and node "node2"' % KV in text and "path" in text
    assert sent(node2, "POST", "/install-application") == [] and sent(node1, "POST", "/invite") == []


def test_a_registry_miss_is_said_as_not_published_never_as_a_bad_gateway(serve):
    double = sample_double()
    server = serve(double)
    text = refusal(server.call_tool("install_application", {"coords": "com.x@9.9.9"}))
    assert "does not publish com.x@9.9.9" in text
    assert "502" not in text and "Bad Gateway" not in text


# ---- item 2: the next step's names, join_context with from, another node's alias ----

def test_the_next_step_names_each_context_and_join_context_takes_node1s_alias_with_from(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", apps=[kv_store_spec()])
    server = several(("node1", node1.url), ("node2", node2.url))
    _, context = team(server)
    joined = answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert '%s ("kv-main"; doomed on node1)' % context in joined["next"] and 'from "node1"' in joined["next"]
    assert "installed" not in joined
    before = len(sent(node1, "POST", "/alias/lookup/context/doomed"))
    joins = answer(server.call_tool("join_context", {"context": "doomed", "from": "node1", "node": "node2"}))
    assert joins and [e["path"] for e in sent(node2, "POST", "/join")][-1].endswith("%s/join" % context)
    assert len(sent(node1, "POST", "/alias/lookup/context/doomed")) == before + 1
    by_name = server.call_tool("join_context", {"context": "kv-main", "from": "node1", "node": "node2"})
    assert not by_name.get("isError"), by_name
    missing = refusal(server.call_tool("join_context", {"context": "nope", "from": "node1", "node": "node2"}))
    assert 'On node "node1" (from)' in missing and "Nothing was sent" in missing
    again = answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert again["alreadyMember"] and 'Node "node2" has joined its one context.' in again["note"]


def test_join_context_before_the_namespace_join_says_to_join_the_namespace_first(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", apps=[kv_store_spec()])
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace, context = team(server)
    text = refusal(server.call_tool("join_context", {"context": "doomed", "from": "node1", "node": "node2"}))
    assert text.startswith('Error: Context %s: node "node2" has not joined namespace %s, which holds it: call '
                           'join_namespace with node "node2" and from "node1" first' % (context, namespace)), text
    # the alias named on node2 itself says the same: the namespace first, not a join_context that would fail
    aliased = refusal(server.call_tool("sync_context", {"context": "doomed", "node": "node2"}))
    assert ('node "node2" has not joined it, nor namespace %s, which holds it: call join_namespace with node "node2" '
            'and from "node1" first' % namespace) in aliased, aliased
    refused = refusal(server.call_tool("create_context", {"application": KV, "namespace": "team", "node": "node2"}))
    assert ('"team" is namespace %s on node "node1"; node "node2" has not joined it (join_namespace with node "node2"'
            ' and from "node1" joins it).' % namespace) in refused, refused
    answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert answer(server.call_tool("join_context", {"context": "doomed", "from": "node1", "node": "node2"}))


def test_an_app_call_on_a_node_outside_the_namespace_says_join_not_install(network, several):
    """node2 has neither the app nor the context: installing alone would leave it outside (a model's play)."""
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2")
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace, context = team(server)
    for named in (context, "doomed"):
        text = refusal(server.call_tool("kv_store_get", {"_context": named, "key": "k", "node": "node2"}))
        assert "namespace %s, which holds it: call join_namespace with node \"node2\" and from " \
               "\"node1\" first (it brings the app)" % namespace in text and "install_application" not in text, text
    assert not [e for e in node2.log if e["path"].endswith(("/install-application", "/join", "/jsonrpc"))]


def test_an_alias_of_another_node_is_refused_naming_that_node_and_the_id(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", apps=[kv_store_spec()])
    server = several(("node1", node1.url), ("node2", node2.url))
    _, context = team(server)
    answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    text = refusal(server.call_tool("join_context", {"context": "doomed", "node": "node2"}))
    assert '"doomed" is node1\'s alias for context %s; node "node2" has not joined it' % context in text
    assert sent(node2, "POST", "/join") and not any(context in e["path"] for e in sent(node2, "POST", "/join"))
    answer(server.call_tool("join_context", {"context": context, "node": "node2"}))
    text = refusal(server.call_tool("delete_context", {"context": "doomed", "node": "node2"}))
    assert "node1's alias for context %s" % context in text and "has it too" in text
    assert not [e for e in node2.log if e["method"] == "DELETE"]
    # The other nodes are asked on a miss only: an id, or an alias the node has, asks node1 nothing.
    asked = len(node1.log)
    server.call_tool("create_alias", {"alias": "mine", "context": context, "node": "node2"})
    server.call_tool("sync_context", {"context": "mine", "node": "node2"})
    server.call_tool("sync_context", {"context": context, "node": "node2"})
    assert len(node1.log) == asked


# ---- item 5: members tied to nodes ----

def test_members_are_marked_with_their_node(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", apps=[kv_store_spec()])
    server = several(("node1", node1.url), ("node2", node2.url))
    namespace, _ = team(server)
    answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    network.settle()
    members = answer(server.call_tool("list_group_members", {"group": namespace, "node": "node1"}))["members"]
    marked = {m["identity"]: m.get("node") for m in members}
    assert marked == {node1.account: "node1", node2.account: "node2"}


# ---- item 6 (part): install answers ----

def test_install_names_the_app_says_whether_it_has_a_guide_and_takes_a_package_alone(serve):
    double = NodeDouble(registry={"%s@%s" % (KV, v): kv_store_spec(v) for v in ("1.0.0", "1.10.0", "1.9.0")})
    server = serve(double.start(), CALIMERO_REGISTRY_URL=double.registry_url)
    installed = answer(server.call_tool("install_application", {"coords": KV}))
    assert installed["version"] == "1.10.0" and installed["name"] == "KV Store" and installed["hasGuide"] is True
    assert "newest its registry publishes" in installed["note"]
    assert [e["json"] for e in sent(double, "POST", "/install-application")] == [{"package": KV, "version": "1.10.0"}]


def test_a_package_alone_with_no_registry_known_is_refused_before_anything_is_sent(serve):
    double = sample_double()
    server = serve(double)
    text = refusal(server.call_tool("install_application", {"coords": KV}))
    assert "names no version" in text and sent(double, "POST", "/install-application") == []


# ---- issue 43: the minted invitation's secrets ----

def test_a_joiner_quoting_the_minted_invitation_back_shows_neither_its_signature_nor_its_salt(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", apps=[kv_store_spec()])
    node2.join_outcome = "quote_invitation"
    server = several(("node1", node1.url), ("node2", node2.url))
    team(server)
    result = server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"})
    text = refusal(result)
    assert "invitation rejected" in text and "[redacted]" in text and "Pass the invitation" not in text
    quoted = json.loads(json.dumps(node2.log[-1]["json"]))["invitation"]
    salt, signature = quoted["invitation"]["secret_salt"], quoted["inviter_signature"]
    shown = json.dumps(result) + server.stderr
    for form in (signature, bytes(salt).hex(), json.dumps(salt), json.dumps(salt, separators=(",", ":"))):
        assert form not in shown


def test_join_from_brings_the_version_the_namespace_runs_not_the_member_nodes_newest(network, several, tmp_path):
    node1, node2 = fresh_pair(network, tmp_path, published=["1.0.0", "1.1.0"])
    server = several(("node1", node1.url), ("node2", node2.url))
    team(server)
    node1.upgrade_app(node1._app_key(KV), "1.1.0")          # installed, but the namespace still runs 1.0.0
    joined = answer(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert joined["installed"]["version"] == "1.0.0"
    assert [e["json"]["version"] for e in sent(node2, "POST", "/install-application")] == ["1.0.0"]


def test_join_from_refuses_another_signers_build_of_that_version_and_mints_nothing(network, several, tmp_path):
    node1, node2 = fresh_pair(network, tmp_path, published=[])
    node2.registry["%s@1.0.0" % KV] = dict(kv_store_spec(), signer_id="did:key:someone-else")
    server = several(("node1", node1.url), ("node2", node2.url))
    team(server)
    text = refusal(server.call_tool("join_namespace", {"namespace": "team", "from": "node1", "node": "node2"}))
    assert "another signer's build" in text and "Nothing was minted" in text
    assert sent(node1, "POST", "/invite") == [] and sent(node2, "POST", "/join") == []


def test_lookup_and_delete_of_another_nodes_alias_say_whose_it_is(network, several):
    node1 = network.add("node1", apps=[kv_store_spec()])
    node2 = network.add("node2", apps=[kv_store_spec()])
    server = several(("node1", node1.url), ("node2", node2.url))
    _, context = team(server)
    looked = texts(server.call_tool("lookup_alias", {"name": "doomed", "node": "node2"}))[0]
    assert looked.startswith('No alias named "doomed" on this node.') and "node1's alias for context %s" % context \
        in looked
    deleted = texts(server.call_tool("delete_alias", {"alias": "doomed", "node": "node2"}))[0]
    assert "node1's alias" in deleted and sent(node2, "POST", "/alias/delete/context/doomed") == []
    assert sent(node1, "POST", "/alias/delete/context/doomed") == []
    called = refusal(server.call_tool("call", {"app": KV, "context": "doomed", "node": "node2", "method": "get",
                                               "args": {"key": "k"}}))
    assert "node1's alias for context %s" % context in called and not node2.executions
