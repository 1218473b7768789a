"""notifications/cancelled and ping while a call runs (mcp-protocol.md §5; cancellation.mdx, ping.mdx).

stdin is read on its own thread: a cancellation reaches the running call, and a ping is answered at once,
while every other request still waits its turn (one request handled at a time).
"""
from __future__ import annotations

import time

import pytest

from mcp_client import MODERN_META, responses_to, tuned_server, wait_until
from node_double import sample_double

ITEMS = 32
WORKERS = 4
LONG = 60.0                      # "did not hang" bound
HELD = 2 * LONG                  # a node call held this long is still running when the test looks (it releases it)


@pytest.fixture
def slow_double():
    node = sample_double(exec_delay=0.3).start()
    yield node
    node.stop()


@pytest.fixture
def slow_env(server_env, slow_double):
    return dict(server_env, CALIMERO_NODE_URL=slow_double.url)


def few_workers(env):
    """The real server with a small call_many pool, so most of 32 items are still waiting when the cancel
    arrives (with the default pool every item of one call_many starts at once)."""
    return tuned_server(env, "from concurrent.futures import ThreadPoolExecutor\n"
                             "pool = ThreadPoolExecutor(max_workers=%d, thread_name_prefix='call')\n"
                             "import mero_tools\n"
                             "mero_tools._call_pool[:] = [pool]" % WORKERS,
                        check="hasattr(__import__('mero_tools'), '_call_pool')")


@pytest.fixture
def handle_of():
    def select(server):
        deadline = time.monotonic() + 20
        while "kv_store_len" not in server.tool_names():
            assert time.monotonic() < deadline, server.stderr
            time.sleep(0.1)
        selected = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})
        return selected["structuredContent"]["app_handle"]
    return select


def assert_no_late_answer(server, double, request_id):
    """Once the node has answered every call it was sent (the cancelled one's too) and a ping has gone round
    after that, a cancelled request's answer would have been written: there is none."""
    wait_until(lambda: double.unanswered("POST", "/jsonrpc") == [], "the node to answer every call")
    assert server.result("ping") == {}
    assert responses_to(server, request_id) == [], "a cancelled request must get no response"


def test_cancelled_call_many_stops_what_has_not_started(slow_env, slow_double, handle_of):
    server = few_workers(slow_env)
    try:
        server.initialize()
        handle = handle_of(server)
        before = len(slow_double.executions)
        server.send({"jsonrpc": "2.0", "id": "many", "method": "tools/call",
                     "params": {"name": "call_many", "_meta": {"progressToken": "p"},
                                "arguments": {"calls": [{"app_handle": handle, "method": "len"}] * ITEMS}}})
        wait_until(lambda: len(slow_double.executions) > before, "the first item to reach the node")
        server.notify("notifications/cancelled", {"requestId": "many", "reason": "user pressed stop"})
        # A request sent after the cancel is answered once call_many has returned: nothing is left running.
        after = server.request("tools/list", timeout=LONG)
        assert "result" in after
        ran = len(slow_double.executions) - before
        assert 0 < ran < ITEMS, "cancel stopped nothing: %d of %d items ran" % (ran, ITEMS)
        assert ran <= ITEMS // 2, "%d items ran although the cancel came while %d were running" % (ran, WORKERS)
        assert responses_to(server, "many") == [], "a cancelled request must get no response"
        progress = [n for n in server.notifications if n.get("method") == "notifications/progress"]
        assert len(progress) <= ran and all(n["params"]["progressToken"] == "p" for n in progress)
        assert server.result("ping") == {}
        assert_no_late_answer(server, slow_double, "many")
    finally:
        server.close()
    server.assert_stdout_pure()


def test_cancelled_call_gets_no_response(start_server, slow_env, slow_double, handle_of):
    server = start_server(slow_env)
    handle = handle_of(server)
    slow_double.exec_delay = 1.0
    before = len(slow_double.executions)
    server.send({"jsonrpc": "2.0", "id": 41, "method": "tools/call",
                 "params": {"name": "kv_store_len", "arguments": {"app_handle": handle}}})
    wait_until(lambda: len(slow_double.executions) > before, "the call to reach the node")
    server.notify("notifications/cancelled", {"requestId": 41})
    assert server.request("tools/list", request_id=42, timeout=LONG)["id"] == 42
    assert responses_to(server, 41) == []
    # The same id type, a different value, is not affected; and the id may be reused for a new request.
    assert server.request("ping", request_id=41)["result"] == {}


def test_ping_is_answered_while_a_slow_call_runs(start_server, slow_env, slow_double, handle_of):
    server = start_server(slow_env)
    handle = handle_of(server)
    slow_double.exec_delay = HELD                   # until both pings are answered (release() below)
    before = len(slow_double.executions)
    server.send({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                 "params": {"name": "call", "arguments": {"app_handle": handle, "method": "len"}}})
    wait_until(lambda: len(slow_double.executions) > before, "the slow call to reach the node")
    server.send({"jsonrpc": "2.0", "id": "queued", "method": "tools/list"})
    server.send({"jsonrpc": "2.0", "id": 0, "method": "ping"})
    server.send({"jsonrpc": "2.0", "id": "modern-ping", "method": "ping",
                 "params": {"_meta": MODERN_META}})
    order = []
    while len(order) < 4:
        if len(order) == 2:
            slow_double.exec_delay = 0.0
            slow_double.release()
        frame = server.read(LONG)
        assert frame is not None, server.stderr
        if "id" in frame:
            order.append(frame)
    ids = [frame["id"] for frame in order]
    # Pings overtake the running call; everything else keeps its turn.
    assert ids[:2] == [0, "modern-ping"] and ids[2:] == ["slow", "queued"], ids
    assert order[0]["result"] == {}
    assert order[1]["error"]["code"] == -32601          # ping is gone in the modern era, answered as such
    assert order[2]["result"]["content"][0]["text"] == "0"


@pytest.mark.parametrize("request_id", ["never-sent", 12345, 0, -1, None, 1.5, True, [1], {"id": 1}])
def test_cancelling_an_unknown_id_is_ignored(start_server, server_env, request_id):
    server = start_server(server_env)
    server.notify("notifications/cancelled", {"requestId": request_id})
    server.notify("notifications/cancelled", {"requestId": request_id, "reason": 5})
    server.notify("notifications/cancelled", {})
    server.notify("notifications/cancelled", [request_id])
    assert server.request("ping", request_id="after") == {"jsonrpc": "2.0", "id": "after", "result": {}}
    assert server.tool_json("node_status")["health"] == {"status": "alive"}


def test_cancelling_a_finished_request_is_ignored(start_server, server_env):
    server = start_server(server_env)
    first = server.request("tools/call", {"name": "node_status", "arguments": {}}, request_id=7)
    assert "result" in first
    server.notify("notifications/cancelled", {"requestId": 7})
    again = server.request("tools/call", {"name": "list_applications", "arguments": {}}, request_id=8)
    assert not again["result"].get("isError")
    assert len(responses_to(server, 7)) == 1 and len(responses_to(server, 8)) == 1


def test_cancel_sent_as_a_request_is_answered(start_server, server_env):
    """With an id it is a request, not the notification: method not found, and nothing is cancelled."""
    server = start_server(server_env)
    reply = server.request("notifications/cancelled", {"requestId": 1})
    assert reply["error"]["code"] == -32601


def slow_call(server, handle, request_id="slow"):
    """A call that keeps the main loop busy (the double sleeps exec_delay), so what follows waits its turn."""
    server.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                 "params": {"name": "call", "arguments": {"app_handle": handle, "method": "len"}}})


def busy_with_a_slow_call(server, double, handle_of):
    """Select the app, then keep the main loop in a call the node holds until let_the_slow_call_end: (handle,
    executions before it)."""
    handle = handle_of(server)
    double.exec_delay = HELD
    before = len(double.executions)
    slow_call(server, handle)
    wait_until(lambda: len(double.executions) > before, "the slow call to reach the node")
    return handle, before


def let_the_slow_call_end(server, double):
    """Once the server has read all that was sent so far (a ping sent after it is answered while the slow call
    still runs), the node answers the slow call, and every call after it at once."""
    assert server.result("ping") == {}
    assert len(double.unanswered("POST", "/jsonrpc")) == 1, "the slow call ended before all was sent"
    double.exec_delay = 0.0
    double.release()


def set_request(request_id, handle, key):
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "call", "arguments": {"app_handle": handle, "method": "set",
                                                     "args": {"key": key, "value": "written"}}}}


def test_a_request_cancelled_while_it_waits_never_runs(start_server, slow_env, slow_double, handle_of):
    """Cancelled behind a slow call: it never reaches the node and is never answered; a later request reusing
    its id is a request of its own, answered once, and does not bring the cancelled one back."""
    server = start_server(slow_env)
    handle, before = busy_with_a_slow_call(server, slow_double, handle_of)
    server.send(set_request("queued", handle, "cancelled-key"))
    server.notify("notifications/cancelled", {"requestId": "queued", "reason": "changed my mind"})
    server.send({"jsonrpc": "2.0", "id": "queued", "method": "tools/call",
                 "params": {"name": "call", "arguments": {"app_handle": handle, "method": "len"}}})
    let_the_slow_call_end(server, slow_double)
    reused = server.wait_for("queued", LONG)
    assert reused["result"]["content"][0]["text"] == "0", reused     # the len's answer; no set ran before it
    assert "result" in server.wait_for("slow", LONG)
    assert server.call_tool("call", {"app_handle": handle, "method": "get",
                                     "args": {"key": "cancelled-key"}})["content"][0]["text"] == "null"
    methods = [e["method"] for e in slow_double.executions[before:]]
    assert methods == ["len", "len", "get"], methods
    assert len(responses_to(server, "queued")) == 1


def test_a_request_cancelled_while_it_waits_stays_cancelled_when_its_id_returns(
        start_server, slow_env, slow_double, handle_of):
    """The id comes back while the cancelled request still waits: only the new one runs."""
    server = start_server(slow_env)
    handle, before = busy_with_a_slow_call(server, slow_double, handle_of)
    server.send(set_request(9, handle, "first"))
    server.notify("notifications/cancelled", {"requestId": 9})
    server.send(set_request(9, handle, "second"))
    let_the_slow_call_end(server, slow_double)
    answer = server.wait_for(9, LONG)
    assert not answer["result"].get("isError"), answer
    assert server.result("ping") == {}
    writes = [e["argsJson"]["key"] for e in slow_double.executions[before:] if e["method"] == "set"]
    assert writes == ["second"]
    assert len(responses_to(server, 9)) == 1


def test_a_batch_item_cancelled_while_it_waits_never_runs(start_server, slow_env, slow_double, handle_of):
    server = start_server(slow_env, initialize="2025-03-26")
    handle, before = busy_with_a_slow_call(server, slow_double, handle_of)
    server.send([set_request("a", handle, "kept"), set_request("b", handle, "dropped")])
    server.notify("notifications/cancelled", {"requestId": "b"})
    let_the_slow_call_end(server, slow_double)
    assert "result" in server.wait_for("a", LONG)
    assert server.result("ping") == {}
    writes = [e["argsJson"]["key"] for e in slow_double.executions[before:] if e["method"] == "set"]
    assert writes == ["kept"]
    assert responses_to(server, "b") == []



@pytest.mark.parametrize("tool", ["kv_store_len", "call"])
def test_cancelling_a_running_call_frees_the_server_at_once(start_server, slow_env, slow_double, handle_of, tool):
    """The next request does not wait for the cancelled call's node request (up to 65 s for a join): it is
    answered while that node request still runs; the cancelled call finishes in the background, its answer
    dropped."""
    server = start_server(slow_env)
    handle = handle_of(server)
    slow_double.exec_delay = HELD
    before = len(slow_double.executions)
    arguments = {"app_handle": handle} if tool != "call" else {"app_handle": handle, "method": "len"}
    server.send({"jsonrpc": "2.0", "id": "stuck", "method": "tools/call",
                 "params": {"name": tool, "arguments": arguments}})
    server.send(set_request("queued", handle, "after-the-cancel"))        # waits its turn behind it
    wait_until(lambda: len(slow_double.executions) > before, "the call to reach the node")
    slow_double.exec_delay = 0.0
    server.notify("notifications/cancelled", {"requestId": "stuck", "reason": "taking too long"})
    queued = server.wait_for("queued", LONG)
    assert not queued["result"].get("isError"), queued
    fresh = server.call_tool("kv_store_len", {"app_handle": handle})
    assert fresh["structuredContent"] == {"result": 1}
    # the double marks a request answered once its bytes are out, a moment after the server may have read them
    wait_until(lambda: len(slow_double.unanswered("POST", "/jsonrpc")) == 1, "the queue not to wait for the "
               "cancelled call", timeout=5)
    slow_double.release()                          # the cancelled node request ends now: its answer is dropped
    assert_no_late_answer(server, slow_double, "stuck")
    assert len(responses_to(server, "queued")) == 1


def test_each_cancel_of_a_running_call_hands_the_server_on(start_server, slow_env, slow_double, handle_of):
    """A cancel frees the server by handing its loop to a new thread: cancelled again there, and again, it is
    freed each time, the next request answered at once, and stdin's end still ends the process."""
    server = start_server(slow_env)
    handle = handle_of(server)
    for n in range(3):
        slow_double.exec_delay = HELD
        before = len(slow_double.executions)
        slow_call(server, handle, "stuck-%d" % n)
        wait_until(lambda: len(slow_double.executions) > before, "call %d to reach the node" % n)
        slow_double.exec_delay = 0.0
        server.notify("notifications/cancelled", {"requestId": "stuck-%d" % n})
        assert server.result("ping") == {}
        assert "tools" in server.result("tools/list", timeout=LONG)
        # answered while every cancelled call so far is still held at the node: the cancel freed the server
        assert len(slow_double.unanswered("POST", "/jsonrpc")) == n + 1, "cancel %d did not free the server" % n
    slow_double.release()                          # the cancelled node requests end now: their answers dropped
    assert server.call_tool("kv_store_len", {"app_handle": handle})["structuredContent"] == {"result": 0}
    for n in range(3):
        assert_no_late_answer(server, slow_double, "stuck-%d" % n)
    assert server.close() == 0
