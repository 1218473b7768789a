"""What a model asks next is already answered (issue 26): the registry browsable, what ran where, renames that hold,
subgroups found, the invitation's hand-over, one version story, writes that name what they did, call_many items
named, instructions that agree, create_context finding its namespace. Through the real server against the double."""
from __future__ import annotations

import json

import pytest

from node_double import NodeDouble, counter_spec, kv_store_spec, sample_double


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
