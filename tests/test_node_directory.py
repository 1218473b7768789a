"""Issue 33's configuration: CALIMERO_NODES, named node homes, multi-node mode and the default node.

The parsing is pure (mero_node_config.parse_nodes, node.node_directory over an env dict and a node home under tmp_path), so the
rules are tested directly, table by table; start-up and --check refusing a bad entry go through the real server.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mero_node_config
import node
from mcp_client import SERVER, minimal_env, run_check

LISTEN = '[server]\nlisten = ["/ip4/127.0.0.1/tcp/{}"]\n'


def home_with(tmp_path, homes):
    """A node home holding `homes` ({name: port}, or None for a config.toml that gives no address)."""
    root = tmp_path / "nodes"
    for name, port in homes.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.toml").write_text(LISTEN.format(port) if port else "[server]\n")
    root.mkdir(exist_ok=True)
    return str(root)


def directory(tmp_path, homes=(), **env):
    settings = {"CALIMERO_NODE_HOME": home_with(tmp_path, dict(homes))}
    settings.update(env)
    return node.node_directory(settings)


# ── CALIMERO_NODES entries ──────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("value, expected", [
    ("node1=http://127.0.0.1:2528", [("node1", "http://127.0.0.1:2528", False)]),
    ("node1=http://127.0.0.1:2528,prod=https://n.example.com (ro)",
     [("node1", "http://127.0.0.1:2528", False), ("prod", "https://n.example.com", True)]),
    (" a = http://localhost:1/ , b.c-d_e=https://h:2(ro),", [("a", "http://localhost:1", False),
                                                             ("b.c-d_e", "https://h:2", True)]),
    ("x=http://h (RO)", [("x", "http://h", True)]),
    ("", []),
    (" , ", []),
])
def test_entries_parse_in_order_with_their_read_only_mark(value, expected):
    parsed = mero_node_config.parse_nodes(value)
    assert [(n.name, n.url, n.read_only) for n in parsed] == expected
    assert all(n.source == "CALIMERO_NODES" and n.home is None for n in parsed)


@pytest.mark.parametrize("value, said", [
    ("http://127.0.0.1:2528", 'CALIMERO_NODES entry "http://127.0.0.1:2528" is not name=url'),
    ("node1", 'CALIMERO_NODES entry "node1" is not name=url'),
    ("node1=ftp://h", 'CALIMERO_NODES entry "node1" (ftp://h) is not an http(s) URL'),
    ("node1=127.0.0.1:2528", 'CALIMERO_NODES entry "node1" (127.0.0.1:2528) is not an http(s) URL'),
    ("node1=http://a:1,node1=http://b:2", 'CALIMERO_NODES names "node1" twice'),
    ("Node=http://a:1,node=http://b:2", 'CALIMERO_NODES names "Node" and "node", which differ only in case'),
    ("my node=http://a:1", 'CALIMERO_NODES entry "my node=http://a:1" has a name outside [A-Za-z0-9_.-]+'),
    ("=http://a:1", 'CALIMERO_NODES entry "=http://a:1" has a name outside [A-Za-z0-9_.-]+'),
    ("nöde=http://a:1", 'has a name outside [A-Za-z0-9_.-]+'),
    ("n=http://a:1 (rw)", 'CALIMERO_NODES entry "n" has a space in its URL'),
    ("n=http://a:1/admin-api", 'CALIMERO_NODES entry "n" (http://a:1/admin-api) reaches into the node\'s /admin-api'),
    ("n=http://a:99999", "port 99999, which is out of range"),
])
def test_a_bad_entry_is_one_line_naming_it(value, said):
    with pytest.raises(node.NodeError) as raised:
        mero_node_config.parse_nodes("ok=http://localhost:1," + value)
    text = str(raised.value)
    assert said in text and "\n" not in text
    assert node.nodes_setting_problem({"CALIMERO_NODES": value}) == text


def test_an_entry_with_credentials_is_refused_without_showing_them():
    problem = node.nodes_setting_problem({"CALIMERO_NODES": "prod=https://admin:s3cret@n.example.com"})
    assert problem.startswith('CALIMERO_NODES entry "prod" carries user:password@')
    assert "s3cret" not in problem
    assert "s3cret" not in node.nodes_setting_problem({"CALIMERO_NODES": "https://admin:s3cret@n.example.com"})


# ── Modes and the default node ──────────────────────────────────────────────────────────────────────

TWO_ENTRIES = "node1=http://127.0.0.1:2528,prod=https://n.example.com (ro)"


@pytest.mark.parametrize("homes, env, multi, default", [
    # nothing named, or one: single mode, and discovery decides as before (default None)
    ({}, {}, False, None),
    ({"node1": 2528}, {}, False, None),
    ({"node1": 2528, "broken": None}, {}, False, None),                 # a home without an address is no node
    # two named nodes: multi mode; the first home by name is the default
    ({"node2": 2529, "node1": 2528}, {}, True, "node1"),
    ({"node1": 2528, "node2": 2529}, {"CALIMERO_NODE_NAME": "node2"}, True, "node2"),
    ({"node1": 2528, "node2": 2529}, {"CALIMERO_NODE_URL": "http://localhost:2529/"}, True, "node2"),
    ({"node1": 2528, "node2": 2529}, {"CALIMERO_NODE_URL": "http://127.0.0.1:2529",
                                      "CALIMERO_NODE_NAME": "node1"}, True, "node1"),
    # CALIMERO_NODE_URL naming none of them keeps meaning exactly that node (single, discovery uses it)
    ({"node1": 2528, "node2": 2529}, {"CALIMERO_NODE_URL": "https://remote.example.com"}, False, None),
    ({}, {"CALIMERO_NODES": TWO_ENTRIES, "CALIMERO_NODE_URL": "http://localhost:9"}, False, None),
    # CALIMERO_MCP_MULTI_NODE=off forces single mode; several homes stay discovery's error there
    ({"node1": 2528, "node2": 2529}, {"CALIMERO_MCP_MULTI_NODE": "off"}, False, None),
    ({"node1": 2528, "node2": 2529}, {"CALIMERO_MCP_MULTI_NODE": "OFF"}, False, None),
    ({"node1": 2528, "node2": 2529}, {"CALIMERO_MCP_MULTI_NODE": "on"}, True, "node1"),
    # CALIMERO_NODES: its first entry is the default, before any home; with one entry it is single mode
    ({}, {"CALIMERO_NODES": TWO_ENTRIES}, True, "node1"),
    ({}, {"CALIMERO_NODES": "only=http://localhost:7"}, False, "only"),
    ({"a-home": 2530}, {"CALIMERO_NODES": "zeta=http://localhost:7"}, True, "zeta"),
    ({"a-home": 2530}, {"CALIMERO_NODES": TWO_ENTRIES, "CALIMERO_NODE_NAME": "a-home"}, True, "a-home"),
    ({}, {"CALIMERO_NODES": TWO_ENTRIES, "CALIMERO_NODE_URL": "https://n.example.com"}, True, "prod"),
    ({}, {"CALIMERO_NODES": TWO_ENTRIES, "CALIMERO_MCP_MULTI_NODE": "off"}, False, "node1"),
    ({}, {"CALIMERO_NODES": TWO_ENTRIES, "CALIMERO_MCP_MULTI_NODE": "0",
          "CALIMERO_NODE_NAME": "prod"}, False, "prod"),
])
def test_mode_and_default_node(tmp_path, homes, env, multi, default):
    found = directory(tmp_path, homes, **env)
    assert found.multi is multi
    assert (found.default.name if found.default else None) == default


def test_entries_come_first_then_homes_by_name_and_an_entry_wins_over_its_home(tmp_path):
    found = directory(tmp_path, {"b": 2531, "node1": 2528, "a": 2530}, CALIMERO_NODES=TWO_ENTRIES)
    assert [(n.name, n.source) for n in found.nodes] == [
        ("node1", "CALIMERO_NODES"), ("prod", "CALIMERO_NODES"), ("a", "home"), ("b", "home")]
    assert found.named("node1").url == "http://127.0.0.1:2528" and found.named("prod").read_only
    assert found.named("a").home == os.path.join(str(tmp_path / "nodes"), "a")
    assert found.named("a").url == "http://localhost:2530" and not found.named("a").read_only
    assert found.named("missing") is None


@pytest.mark.parametrize("env, said", [
    ({"CALIMERO_NODE_NAME": "nope"}, 'CALIMERO_NODE_NAME "nope" names no node; the named nodes are: node1, node2'),
    ({"CALIMERO_NODES": "bad"}, 'CALIMERO_NODES entry "bad" is not name=url'),
    ({"CALIMERO_NODE_URL": "ftp://x"}, "CALIMERO_NODE_URL (ftp://x) is not an http(s) URL"),
])
def test_directory_errors_are_one_line(tmp_path, env, said):
    with pytest.raises(node.NodeError) as raised:
        directory(tmp_path, {"node1": 2528, "node2": 2529}, **env)
    assert str(raised.value) == said or said in str(raised.value)


# ── Through the real server: start-up and --check refuse a bad entry with the one line ──────────────────

BAD = "node1=http://127.0.0.1:2528,node1=http://127.0.0.1:2529"
SAID = 'CALIMERO_NODES names "node1" twice'


def test_start_up_stops_on_a_bad_entry_with_one_line(tmp_path):
    env = minimal_env(tmp_path, {"CALIMERO_NODES": BAD, "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})
    done = subprocess.run([sys.executable, str(SERVER)], env=env, input="", capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "mero-mcp: %s\n" % SAID


def test_check_says_the_same_line(tmp_path):
    env = minimal_env(tmp_path, {"CALIMERO_NODES": BAD, "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})
    done = run_check(env)
    assert done.returncode == 1
    assert "  - %s\n" % SAID in done.stdout and "Node:      none: %s\n" % SAID in done.stdout


def test_a_good_entry_does_not_stop_start_up(tmp_path):
    env = minimal_env(tmp_path, {"CALIMERO_NODES": "node1=http://127.0.0.1:9 (ro)",
                                 "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})
    done = subprocess.run([sys.executable, str(SERVER)], env=env, input="", capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "CALIMERO_NODES" not in done.stderr
