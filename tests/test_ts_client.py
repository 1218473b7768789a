"""Interoperability with the official TypeScript MCP SDK client (@modelcontextprotocol/sdk 1.32.2).

Node-based hosts (Claude Code, the MCP Inspector) drive stdio servers through this client. It sends
`initialize` 2025-11-25 with id 0, rejects the whole `tools/list` when one inputSchema lacks
`"type":"object"`, and checks every `structuredContent` against the tool's outputSchema with AJV, throwing
when it does not match (mcp-protocol.md §7, §13). tests/ts_client/client.mjs runs one session and prints
what it saw; this file installs the SDK once per test session into tests/ts_client/node_modules (skipping
when node or npm is missing or the install fails) and checks the report.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import TESTS, node_with
from mcp_client import ROOT, SERVER, minimal_env

CLIENT_DIR = TESTS / "ts_client"
SDK_VERSION = "1.32.2"
RUN_TIMEOUT = 45


@pytest.fixture(scope="session")
def node():
    """The node binary, with the pinned SDK installed beside client.mjs; a skip saying why when it cannot be."""
    return node_with(CLIENT_DIR, "@modelcontextprotocol/sdk", SDK_VERSION)


@pytest.fixture(scope="module")
def double():
    from node_double import sample_double
    node = sample_double().start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def report(node, double, tmp_path_factory):
    """One session of the TypeScript client against the real server, pointed at the sample double; the
    tests below read its report."""
    tmp_path = tmp_path_factory.mktemp("ts_client")
    env = minimal_env(tmp_path / "home", {
        "CALIMERO_NODE_URL": double.url,
        "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
        "CALIMERO_NODE_HOME": tmp_path / "nodes",
    })
    spec = {"command": sys.executable, "args": [str(SERVER)], "env": env, "cwd": str(ROOT)}
    try:
        done = subprocess.run([node, str(CLIENT_DIR / "client.mjs")], input=json.dumps(spec), cwd=str(CLIENT_DIR),
                              capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as error:
        pytest.fail("the TypeScript client did not finish within %ss; stderr:\n%s" % (RUN_TIMEOUT, error.stderr))
    assert done.stdout.strip(), "client.mjs printed nothing (exit %s); stderr:\n%s" % (done.returncode, done.stderr)
    seen = json.loads(done.stdout)
    failures = {name: call for name, call in seen["calls"].items() if "error" in call}
    assert done.returncode == 0 and not failures and not seen["errors"], (
        "the SDK threw (exit %s): %s\nclient errors: %s\nserver stderr tail:\n%s"
        % (done.returncode, json.dumps(failures, indent=1), seen["errors"], seen.get("serverStderrTail", "")))
    return seen


def text_of(call):
    return "\n".join(block.get("text", "") for block in call["content"] if block["type"] == "text")


def test_handshake_and_tool_list(report):
    assert report["wire"][:3] == [{"dir": "out", "id": 0, "method": "initialize"}, {"dir": "in", "id": 0},
                                  {"dir": "out", "method": "notifications/initialized"}]
    assert report["protocolVersion"] == "2025-11-25"
    assert report["serverInfo"]["name"] == "mero-mcp"
    assert {"tools", "resources"} <= set(report["capabilities"])
    # the SDK parsed the whole list (one bad inputSchema would have thrown) and compiled the output schemas
    tools = report["tools"]
    assert report["toolsNextCursor"] is None
    assert {"node_status", "select_app", "kv_store_len", "kv_store_entries", "kv_store_set"} <= set(tools)
    assert len(tools) == len(set(tools)) > 30
    assert {"kv_store_len", "kv_store_entries"} <= set(report["toolsWithOutputSchema"])
    assert "kv_store_set" not in report["toolsWithOutputSchema"]


def test_tool_calls_pass_the_sdk_output_validation(report, double):
    calls = report["calls"]
    status = calls["node_status"]
    assert not status["isError"] and status["structuredContent"]["url"] == double.url
    selected = calls["select_app"]
    assert not selected["isError"] and selected["structuredContent"]["package"] == "com.calimero.kv-store"
    assert report["handle"], selected
    # non-unit returns by handle: structuredContent the SDK checked against the outputSchema itself
    assert calls["len_before"]["content"][0] == {"type": "text", "text": "0"} and not calls["len_before"]["isError"]
    assert calls["len_before"]["content"][1]["text"].startswith("len ran in context ")      # where it ran
    assert calls["len_before"]["structuredContent"] == {"result": 0}
    assert calls["entries_before"]["structuredContent"] == {"result": {}} and not calls["entries_before"]["isError"]
    # a unit return: no outputSchema, so no structuredContent
    assert not calls["set"]["isError"] and "structuredContent" not in calls["set"]
    assert calls["len_after"]["structuredContent"] == {"result": 1}
    assert calls["entries_after"]["structuredContent"] == {"result": {"greeting": "hello"}}
    assert [e["method"] for e in double.executions] == ["len", "entries", "set", "len", "entries"]


def test_refused_call_is_a_tool_error(report, double):
    """No handle: an isError result (the SDK skips output validation for it), not a protocol error."""
    refused = report["calls"]["refused"]
    assert refused["isError"] and "structuredContent" not in refused
    assert refused["content"][-1] == {"type": "text", "text": "Call select_app for com.calimero.kv-store and "
                                                              "retry with the returned app_handle."}
    assert len(double.executions) == 5          # nothing ran for the refusal
    assert not any("error" in entry for entry in report["wire"])


def test_guide_resource_reads_back_as_markdown(report):
    [listed] = [r for r in report["resources"] if r["uri"].endswith("/guide")]
    assert listed["mimeType"] == "text/markdown" and report["calls"]["select_app"]["structuredContent"]["guide"] == listed["uri"]
    [content] = report["guide"]
    assert content["uri"] == listed["uri"] and content["mimeType"] == "text/markdown"
    assert content["text"].startswith("# KV Store\n")


def test_server_exits_when_the_client_closes(report):
    """The SDK ends stdin, waits 2 s, then sends SIGTERM: a clean exit on EOF is code 0, no signal."""
    assert report["serverExit"] == {"code": 0, "signal": None}
    assert report["closeMs"] < 2000
