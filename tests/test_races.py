"""Concurrency: what call_many's 32 items do at the same instant, through the real server over stdio.

The interleavings are forced, never waited for: a slowed step holds every item inside it together, and what is
asserted is what came out (requests the node saw, keys on disk, lines on stderr), never how long it took.
"""
from __future__ import annotations

import json

import pytest

from mcp_client import HANDSHAKE_VERSION, MODERN_META, McpServer, tuned_server
from node_double import counter_spec

ITEMS = 32
LONG = 60.0


def items_by_context(app, context, method="increment", args=None):
    return [{"app": app, "context": context, "method": method, "args": args or {"by": 1}} for _ in range(ITEMS)]


def call_many(server, calls):
    results = server.tool_json("call_many", {"calls": calls}, timeout=LONG)
    assert [r for r in results if not r["ok"]] == [], results
    return results


def test_items_asking_for_the_handle_key_together_make_one_key_that_survives_a_restart(server_env, double):
    """A fresh state dir and call_many as the first call: every item asks for the handle key at once. With a slow
    disk (os.link held 0.5 s, so all 32 are inside the create together) they shared one tmp file; all but one
    failed, said the key could not be kept and used a random key, which then signed the handles."""
    slow_disk = ("import os, time\n"
                 "_link = os.link\n"
                 "def slow_link(*args, **kwargs):\n"
                 "    time.sleep(0.5)\n"
                 "    return _link(*args, **kwargs)\n"
                 "os.link = slow_link")
    server = tuned_server(server_env, slow_disk)
    try:
        server.initialize()
        call_many(server, items_by_context("counter", double.add_context(double._app_key("com.example.counter"))))
        selected = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})
        handle = selected["structuredContent"]["app_handle"]
    finally:
        server.close()
    assert "cannot keep a handle key" not in server.stderr, server.stderr
    again = McpServer(server_env)
    try:
        again.initialize()
        listed = again.call_tool("call", {"app_handle": handle, "method": "len"})
        assert not listed.get("isError"), listed
    finally:
        again.close()


def test_items_missing_from_the_catalog_together_read_it_once(server, double):
    """An app installed beside this server (so not in its catalog yet), called by all 32 items of one call_many:
    each item's catalog miss read the whole catalog again, one after another (33 app list reads for one batch).
    The new app's ABI read is held 0.5 s, so every item has seen the miss before the first read brings it."""
    server.tool_names()                                  # the catalog, read without the new app
    app = double.add_app(dict(counter_spec(), package="com.example.tally", version="0.3.0"))
    context = double.add_context(app)
    double.faults = {"delay": 0.5, "paths": ["/admin-api/applications/%s/abi" % app]}
    before = len(double.log)
    results = call_many(server, items_by_context("tally", context))
    assert sorted(r["result"] for r in results) == list(range(1, ITEMS + 1))
    lists = [e for e in double.log[before:] if e["method"] == "GET" and e["path"] == "/admin-api/applications"]
    assert len(lists) == 2, "%d app list reads: the batch's own and one catalog read expected" % len(lists)


def test_a_client_that_stops_reading_ends_the_server_quietly(server_env, double):
    """The host closed our stdout (it quit) while stdin is still open: a ping answered by the stdin thread and
    call_many's progress from its items hit the closed pipe. Each was a BrokenPipeError traceback on stderr (the
    stdin thread died, the call became an 'internal error', the main loop crashed with exit code 1)."""
    import subprocess
    import sys
    from mcp_client import SERVER, ROOT
    double.exec_delay = 0.2
    proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=server_env, cwd=str(ROOT))

    def send(message):
        proc.stdin.write(json.dumps(dict(message, jsonrpc="2.0")).encode("utf-8") + b"\n")
        proc.stdin.flush()
    send({"id": 1, "method": "initialize", "params": {"protocolVersion": HANDSHAKE_VERSION, "capabilities": {},
                                                      "clientInfo": {"name": "tests", "version": "0"}}})
    assert b'"id":1' in proc.stdout.readline()
    proc.stdout.close()                                  # the host stops reading; stdin stays open
    send({"id": 2, "method": "tools/call", "params": {
        "name": "call_many", "_meta": {"progressToken": "p"},
        "arguments": {"calls": items_by_context("kv-store", "demo", "set", {"key": "k", "value": "v"})}}})
    send({"id": 3, "method": "ping"})
    try:
        code = proc.wait(LONG)
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read().decode("utf-8", "replace")
        proc.stdin.close()
    assert "Traceback" not in stderr and code == 0, (code, stderr)


def test_a_cancelled_initialize_is_answered_all_the_same(start_server, server_env, double):
    """initialize is never cancelled (cancellation.mdx): one the client cancelled while it waited behind a slow
    call was skipped unanswered, so the session never opened. The call before it is held 3 s at the node."""
    server = start_server(server_env, initialize=None)
    double.faults = {"delay": 3.0, "paths": ["/jsonrpc"], "times": 1}
    modern = MODERN_META
    server.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call", "params": {
        "_meta": modern, "name": "call", "arguments": {"app": "kv-store", "context": "demo", "method": "len"}}})
    server.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": {"name": "tests", "version": "0"}}})
    server.notify("notifications/cancelled", {"requestId": "init"})
    assert server.result("ping") == {}                   # the cancel was read (pings come after it, at once)
    assert "result" in server.wait_for("slow", LONG)
    assert server.wait_for("init", LONG)["result"]["protocolVersion"] == HANDSHAKE_VERSION


@pytest.mark.parametrize("how", ["closed by the host", "closed at spawn"])
def test_a_closed_stderr_leaves_the_protocol_working(server_env, how):
    """A host that closed its end of our stderr, or spawned the server with stderr closed (`2>&-`, sys.stderr is
    None): no log line, from the first ('ready on stdio') on, is a BrokenPipeError or AttributeError that kills
    the server or ends the call writing it."""
    import os
    import subprocess
    import sys
    from mcp_client import SERVER, ROOT
    env = dict(server_env, CALIMERO_MCP_APPS="no-such-app")
    if how == "closed at spawn":
        proc = subprocess.Popen(["sh", "-c", 'exec "$0" "$1" 2>&-', sys.executable, str(SERVER)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=str(ROOT))
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)
        proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=write_end, env=env, cwd=str(ROOT))
        os.close(write_end)
    requests = [{"id": 1, "method": "initialize", "params": {"protocolVersion": HANDSHAKE_VERSION, "capabilities": {},
                                                             "clientInfo": {"name": "tests", "version": "0"}}},
                {"id": 2, "method": "tools/list"},           # the catalog logs the unmatched CALIMERO_MCP_APPS name
                {"id": 3, "method": "tools/call", "params": {"name": "call", "arguments": {
                    "app": "kv-store", "context": "demo", "method": "len"}}}]
    import threading
    watchdog = threading.Timer(LONG, proc.kill)              # a hung server fails the test instead of hanging it
    watchdog.start()
    try:
        answers = {}
        for request in requests:                             # stdin stays open while the answers come
            proc.stdin.write(json.dumps(dict(request, jsonrpc="2.0")).encode("utf-8") + b"\n")
            proc.stdin.flush()
            while request["id"] not in answers:
                line = proc.stdout.readline()
                assert line, "the server exited before answering %r" % request["id"]
                frame = json.loads(line)
                answers[frame.get("id")] = frame
        assert all("result" in answers[i] for i in (1, 2, 3)), answers
        proc.stdin.close()
        assert proc.wait(LONG) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
