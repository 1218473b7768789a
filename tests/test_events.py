"""Issue 36: the node's event stream (node-api.md §0.9), seen through the real server against the double's /sse.

The double serves core's SSE contract (connect frame and headers, subscriptions that drop a context the caller
may not see, Last-Event-ID resume, keep-alives, 401/403/404) and pushes a StateMutation before it answers a [mut]
execute. Tests inject a peer's frame, a silent root change, an echo, a drip, a disconnect, a stall, a flood, a
large payload. No assertion is timed: deadlines only show nothing hangs."""
from __future__ import annotations

import datetime
import json
import threading
import time

import pytest

from mcp_client import minimal_env, responses_to, tuned_server
from node_double import sample_double

KV = "com.calimero.kv-store"


@pytest.fixture
def node():
    double = sample_double().start()
    yield double
    double.stop()


def until(produce, what, timeout=60.0):
    """produce() once it gives something true (a "did not hang" bound, never a speed check)."""
    deadline = time.monotonic() + timeout
    while True:
        value = produce()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.05)


def env_for(tmp_path, double, **extra):
    settings = {"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                "CALIMERO_NODE_HOME": tmp_path / "nodes"}
    settings.update(extra)
    return minimal_env(tmp_path / "home", settings)


def tuned(env, setup):
    server = tuned_server(env, "import node, mero_node_events\n" + setup, check="hasattr(__import__('node'), 'EventStream')")
    server.initialize()
    return server


@pytest.fixture
def served(start_server, tmp_path, node):
    return start_server(env_for(tmp_path, node))


def events(server, **arguments):
    arguments.setdefault("context", "demo")
    return server.tool_json("events", arguments, timeout=90)


def live(server, context="demo"):
    """Open the stream on `context` and wait until it is live and the context subscribed; its id."""
    answer = events(server, context=context)
    until(lambda: events(server, context=context)["stream"] == "live", "the stream to go live")
    return answer["context"]


def kv_set(server, key, value, context="demo"):
    return server.call_tool("call", {"app": KV, "context": context, "method": "set",
                                     "args": {"key": key, "value": value}})


def emitted(result):
    blocks = [b["text"] for b in result["content"] if b["text"].startswith("Events in context")]
    assert len(blocks) <= 1, result
    if not blocks:
        return None
    text = blocks[0]
    listed = text.split("data): ", 1)[1]
    if listed.startswith("not heard"):
        return "not heard"
    return [] if listed.startswith("none") else json.loads(listed)


# ---- 3. what my call emitted ----

def test_a_mut_call_in_a_followed_context_answers_its_events_as_one_text_block(served, node):
    context = live(served)
    result = kv_set(served, "a", "1")
    assert emitted(result) == [{"n": 1, "kind": "Inserted", "payload": {"key": "a", "value": "1"}}]
    assert "structuredContent" not in result
    assert context in result["content"][-1]["text"] and "others may have written too" in result["content"][-1]["text"]
    again = served.call_tool("kv_store_set", {"_context": "demo", "key": "a", "value": "2"})
    assert [e["kind"] for e in emitted(again)] == ["Updated"]
    assert "events" not in json.dumps(again.get("structuredContent"))
    many = served.call_tool("call_many", {"calls": [
        {"app": KV, "context": "demo", "method": "remove", "args": {"key": "a"}},
        {"app": KV, "context": "demo", "method": "get", "args": {"key": "a"}}]})
    blocks = [b["text"] for b in many["content"][1:]]
    assert len(blocks) == 1 and blocks[0].startswith("Item 0. Events in context") and '"Removed"' in blocks[0]
    assert "Events" not in many["content"][0]["text"]


def test_a_first_write_waits_for_its_context_to_be_followed_and_answers_its_events(tmp_path, node):
    server = tuned(env_for(tmp_path, node), "node.EVENT_FOLLOW_SECONDS = 60")     # a "did not hang" bound
    try:
        first = kv_set(server, "k", "v")            # the stream opens now: the call waits for the subscription
        assert emitted(first) == [{"n": 1, "kind": "Inserted", "payload": {"key": "k", "value": "v"}}]
        assert events(server)["entries"][0]["kind"] == "Inserted"
    finally:
        server.close()


@pytest.mark.parametrize("tool", ["kv_store_set", "call", "kv_store_get"])
def test_a_first_write_by_id_asks_for_the_stream_beside_admissions_reads(tmp_path, node, tool):
    """The subscription's round trips overlap the call's reads; a read opens nothing."""
    server = tuned(env_for(tmp_path, node), "node.EVENT_FOLLOW_SECONDS = 60")
    try:
        context = node._aliases["context"]["demo"]
        assert "kv_store_set" in server.tool_names()            # the catalog read first: only the call's reads follow
        node.slow = {"/admin-api/applications/": 0.5, "/admin-api/contexts/": 0.5}
        since = len(node.log)
        arguments = {"_context": context, "key": "k", "value": "v"} if tool == "kv_store_set" else (
            {"_context": context, "key": "k"} if tool == "kv_store_get" else
            {"app": KV, "context": context, "method": "set", "args": {"key": "k", "value": "v"}})
        result = server.call_tool(tool, arguments)
        assert not result.get("isError"), result
        if tool == "kv_store_get":
            assert node.sse_log == []
            return
        assert emitted(result) == [{"n": 1, "kind": "Inserted", "payload": {"key": "k", "value": "v"}}]
        reads = [e for e in node.log[since:] if e["path"].startswith(("/admin-api/applications/",
                                                                      "/admin-api/contexts/"))]
        assert reads and node.sse_log[0]["at"] < min(e["done_at"] for e in reads), "the stream waited for the reads"
    finally:
        server.close()


def test_a_write_sent_before_its_context_is_followed_says_its_events_were_not_heard(tmp_path, node):
    server = tuned(env_for(tmp_path, node), "node.EVENT_FOLLOW_SECONDS = 0")
    try:
        result = kv_set(server, "k", "v")
        assert emitted(result) == "not heard" and "lists what comes from now on" in result["content"][-1]["text"]
    finally:
        server.close()


def test_a_first_write_cancelled_while_its_context_is_being_followed_is_never_sent(tmp_path, node):
    server = tuned(env_for(tmp_path, node), "node.EVENT_FOLLOW_SECONDS = 60")
    try:
        node.slow["/sse/subscription"] = 3          # the subscription is slow to answer: the write waits
        server.send({"jsonrpc": "2.0", "id": "w", "method": "tools/call", "params": {"name": "call", "arguments": {
            "app": KV, "context": "demo", "method": "set", "args": {"key": "k", "value": "v"}}}})
        until(lambda: node.sse_log, "the stream to be opened")
        server.notify("notifications/cancelled", {"requestId": "w"})
        assert server.result("ping") == {}
        time.sleep(0.5)                             # the follow sees its ticket within 0.1 s
        assert node.requests_to("POST", "/jsonrpc") == [], "a cancelled call sent its execute"
        assert responses_to(server, "w") == []
    finally:
        server.close()


def test_reads_event_less_apps_and_unfollowed_contexts_answer_as_before(served, node):
    kv_set(served, "k", "v")
    live(served)
    where = {"type": "text", "text": 'get ran in context %s (alias "demo").' % node._aliases["context"]["demo"]}
    assert served.call_tool("call", {"app": KV, "context": "demo", "method": "get", "args": {"key": "k"}}) == {
        "content": [{"type": "text", "text": "\"v\""}, where]}
    assert served.call_tool("kv_store_get", {"_context": "demo", "key": "k"}) == {
        "content": [{"type": "text", "text": '"v"'}, where], "structuredContent": {"result": "v"}}
    counter = node._app_key("com.example.counter")
    context = node.add_context(counter)
    counted = served.call_tool("call", {"app": "counter", "context": context, "method": "increment", "args": {"by": 1}})
    assert counted == {"content": [{"type": "text", "text": "1"}, {
        "type": "text", "text": "increment ran in context %s." % context}]}         # where it ran, no events block


def test_a_mut_call_that_emits_nothing_says_none(served, node):
    live(served)
    kv_set(served, "same", "1")
    result = served.call_tool("call", {"app": KV, "context": "demo", "method": "get_or_insert",
                                       "args": {"key": "fresh", "value": "x"}})
    assert [e["kind"] for e in emitted(result)] == ["Inserted"]
    node.faults.clear()
    cleared = served.call_tool("call", {"app": KV, "context": "demo", "method": "update_if_exists",
                                        "args": {"key": "absent", "value": "x"}})
    assert emitted(cleared) == [] and "none heard before it answered" in cleared["content"][-1]["text"]  # no frame
    counter = node._app_key("com.example.counter")        # event-less: its StateMutation carries events: []
    assert node._apps[counter]["abi"].get("events") in (None, [])


def test_the_stream_can_be_turned_off(start_server, tmp_path, node):
    server = start_server(env_for(tmp_path, node, CALIMERO_MCP_EVENTS="off"))
    kv_set(server, "a", "1")
    assert emitted(kv_set(server, "a", "2")) is None
    answer = events(server)
    assert answer["stream"] == "polling" and "CALIMERO_MCP_EVENTS=off" in answer["why"]
    assert node.sse_log == []


# ---- 4. events ----

def test_events_lists_entries_oldest_first_and_after_pages_on(served, node):
    context = live(served)
    for key in ("a", "b", "c"):
        kv_set(served, key, "1")
    node.sse_mutation(context, [("Updated", {"key": "a", "value": "from a peer"})])
    answer = until(lambda: (lambda a: a if len(a["entries"]) == 4 else None)(events(served)), "4 entries")
    assert [e["kind"] for e in answer["entries"]] == ["Inserted"] * 3 + ["Updated"]
    assert [e["n"] for e in answer["entries"]] == [1, 2, 3, 4] and answer["next"] == 4
    assert answer["entries"][3]["payload"] == {"key": "a", "value": "from a peer"}
    assert "not instructions" in answer["note"]
    later = events(served, after=2)
    assert [e["n"] for e in later["entries"]] == [3, 4]
    assert events(served, after=4)["entries"] == []
    assert [e["n"] for e in events(served, kind="Updated")["entries"]] == [4]
    assert [e["n"] for e in events(served, kind="updated")["entries"]] == [4]      # one name differs in case only


def test_an_after_past_the_newest_entry_reads_from_the_newest(served, node):
    context = live(served)
    kv_set(served, "a", "1")
    answer = events(served, after=10)              # a next from an earlier run of the server
    assert answer["entries"] == [] and answer["next"] == 1
    assert answer["ahead"] == "after 10 is past the newest entry, 1: entries are numbered anew since knownSince"
    later = threading.Timer(0.5, lambda: node.sse_mutation(context, [("Removed", {"key": "a"})]))
    later.start()
    waited = events(served, after=10, wait=40)
    later.join()
    assert [(e["n"], e["kind"]) for e in waited["entries"]] == [(2, "Removed")]


def test_an_unknown_kind_is_refused_with_the_apps_events(served):
    result = served.call_tool("events", {"context": "demo", "kind": "Inserts"})
    assert result["isError"]
    text = result["content"][0]["text"]
    for said in ("Inserted(EntryWritten): A key received its first value.", "Cleared", "Changed", "Gap"):
        assert said in text


def test_a_wait_answers_at_the_first_match_of_a_drip(served, node):
    context = live(served)
    stop = threading.Event()

    def drip():
        for index in range(100):
            if stop.wait(0.1):
                return
            node.sse_mutation(context, [("Inserted", {"key": "drip-%d" % index, "value": "x"})],
                              new_root="root-%d" % index)
    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        answer = events(served, wait=40)
        assert 1 <= len(answer["entries"]) < 100, answer     # the first ones, long before the drip ends
        nxt = answer["next"]
        removed = threading.Timer(0.5, lambda: node.sse_mutation(context, [("Removed", {"key": "drip-0"})]))
        removed.start()
        only = events(served, after=nxt, kind="Removed", wait=40)
        assert [e["kind"] for e in only["entries"]] == ["Removed"]
    finally:
        stop.set()
        thread.join()


def test_a_wait_with_nothing_coming_says_how_long_it_waited(served):
    live(served)
    answer = events(served, wait=0.5)
    assert answer["entries"] == [] and answer["waited"] == "0.5 s; nothing came"
    kv_set(served, "a", "1")
    known = events(served, wait=40)                # no after: what is known answers at once, and says so
    assert [e["kind"] for e in known["entries"]] == ["Inserted"]
    assert known["waited"] == "no: these came before this call (to wait for newer ones, pass after: next)"
    assert "waited" not in events(served)
    over = served.call_tool("events", {"context": "demo", "wait": 51})
    assert over["isError"]


def test_a_wait_sends_progress_when_asked_and_a_cancel_ends_it(tmp_path, node):
    server = tuned(env_for(tmp_path, node), "mero_node_events.EVENT_PROGRESS_SECONDS = 0.2\nnode.EVENT_POLL_SECONDS = 0.1")
    try:
        context = live(server)
        server.send({"jsonrpc": "2.0", "id": "w", "method": "tools/call",
                     "params": {"name": "events", "arguments": {"context": "demo", "wait": 45},
                                "_meta": {"progressToken": "p"}}})
        note = server.wait_notification(lambda n: n.get("method") == "notifications/progress")
        assert note["params"]["progressToken"] == "p" and note["params"]["total"] == 45
        polls = lambda: len(node.requests_to("GET", "/admin-api/contexts/" + context))   # noqa: E731
        until(lambda: polls() >= 3, "the wait to read the state hash")
        server.notify("notifications/cancelled", {"requestId": "w"})
        assert server.result("ping") == {}
        time.sleep(0.5)                  # the wait sees its ticket within 0.1 s
        settled = polls()
        time.sleep(1.0)                  # a wait still running would read the hash ~10 times more
        assert polls() <= settled + 1
        assert responses_to(server, "w") == [], "a cancelled wait gets no answer"
    finally:
        server.close()


# ---- 2. bounded memory, gaps, Changed ----

def test_a_root_change_with_no_frame_is_a_changed_entry(served, node):
    context = live(served)
    node.silent_change(context)
    answer = events(served)
    assert [e["kind"] for e in answer["entries"]] == ["Changed"]
    assert events(served, after=answer["next"])["entries"] == []   # one move, said once


def test_a_first_empty_answer_says_the_past_is_unknown_not_nothing(served, node):
    first = events(served)
    assert first["entries"] == [] and "what happened before is unknown, not nothing" in first["note"], first
    assert "note" not in events(served)           # watched since: an empty answer now means nothing came


def test_an_answer_says_the_time_now_so_a_model_can_tell_how_recent_an_entry_is(served, node):
    context = live(served)
    node.silent_change(context)
    answer = events(served)
    now = datetime.datetime.strptime(answer["now"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - now).total_seconds()) < 5, answer
    assert answer["knownSince"] <= answer["entries"][0]["at"] <= answer["now"], answer


def test_a_frame_that_comes_after_a_poll_saw_its_root_adds_no_second_entry(served, node):
    """A local write's StateMutation may reach the stream after a poll read the moved hash (a busy machine): one
    write, one entry."""
    context = live(served)
    node.silent_change(context)
    first = events(served)
    assert [e["kind"] for e in first["entries"]] == ["Changed"]
    with node._lock:
        root = node._state_hash(node._contexts[context])
    node.sse_mutation(context, [], new_root=root)                     # the same write's frame, late
    node.sse_mutation(context, [("Cleared", None)], new_root="r-next")  # a later frame: proves the late one was read
    later = until(lambda: (lambda a: a if a["entries"] else None)(events(served, after=first["next"])), "Cleared")
    assert [e["kind"] for e in later["entries"]] == ["Cleared"], later


def test_the_authors_echo_is_kept_once(served, node):
    context = live(served)
    node.sse_mutation(context, [("Inserted", {"key": "x", "value": "1"})], new_root="r1", times=2)
    node.sse_mutation(context, [("Cleared", None)], new_root="r2")
    answer = until(lambda: (lambda a: a if a["entries"] and a["entries"][-1]["kind"] == "Cleared" else None)(
        events(served)), "the Cleared frame")
    assert [e["kind"] for e in answer["entries"]] == ["Inserted", "Cleared"]
    assert answer["entries"][1]["payload"] is None


def test_a_disconnect_is_a_gap_and_the_stream_resumes_its_session(served, node):
    context = live(served)
    node.sse_disconnect()
    answer = events(served, kind="Gap", wait=40)
    assert answer["entries"] and "lost" in answer["entries"][0]["note"]
    until(lambda: events(served)["stream"] == "live", "the stream to come back")
    gets = [e for e in node.sse_log if e["path"] == "/sse"]
    assert gets[-1]["headers"].get("last-event-id", "").startswith(next(iter(node.sse_sessions())) + "-")
    assert len(node.sse_sessions()) == 1, "a resume keeps its session"
    node.sse_mutation(context, [("Inserted", {"key": "after", "value": "1"})])
    until(lambda: events(served, kind="Inserted")["entries"], "events after the resume")


def test_a_stall_is_a_gap(tmp_path, node):
    server = tuned(env_for(tmp_path, node), "mero_node_events.SSE_READ_TIMEOUT = 1.0")
    try:
        live(server)
        node.sse_stall(3.0)
        answer = server.tool_json("events", {"context": "demo", "kind": "Gap", "wait": 40}, timeout=90)
        assert answer["entries"]
    finally:
        server.close()


def test_the_ring_keeps_100_entries_and_a_flood_never_delays_a_call(served, node):
    context = live(served)
    flood = threading.Thread(target=node.sse_flood, args=(context, 10000), daemon=True)
    flood.start()
    while flood.is_alive():
        assert served.call_tool("node_status")["content"]
        assert served.call_tool("kv_store_get", {"_context": "demo", "key": "nothing"})["content"]
    flood.join()
    # an `after` past the newest is read as the newest (ahead), so wait for entry 10000 itself
    until(lambda: [e for e in events(served, after=9999)["entries"] if e["n"] == 10000], "the flood's last frame")
    answer = events(served)
    assert len(answer["entries"]) == 50 and answer["more"] == "50 more after next"
    assert answer["entries"][0]["n"] == 9901 and answer["next"] == 9950      # the ring keeps the last 100
    assert [e["n"] for e in events(served, after=9950)["entries"]] == list(range(9951, 10001))
    assert events(served, after=1)["missed"] == "entries 2-9900 were pushed out (100 are kept)"


def test_a_large_payload_is_cut_and_a_huge_frame_is_a_gap(served, node):
    context = live(served)
    node.sse_mutation(context, [("Inserted", {"key": "big", "value": "v" * (1 << 20)})], new_root="big")
    answer = until(lambda: (lambda a: a if a["entries"] else None)(events(served)), "the large event")
    entry = answer["entries"][0]
    assert isinstance(entry["payload"], str) and len(entry["payload"]) == 2048 and entry["size"] > 1 << 20
    node.sse_mutation(context, [("Inserted", {"key": "huge", "value": "v" * (3 << 20)})], new_root="huge")
    gap = events(served, kind="Gap", wait=40)
    assert "skipped" in gap["entries"][0]["note"]


def test_at_most_32_contexts_are_followed(served, node):
    app = node._app_key(KV)
    contexts = [node.add_context(app) for _ in range(33)]
    live(served)
    for context in contexts:
        events(served, context=context)
    until(lambda: all(len(s) <= 32 for s in node.sse_sessions().values())
               and contexts[-1] in set().union(*node.sse_sessions().values()), "the last context subscribed")
    followed = set().union(*node.sse_sessions().values())
    assert len(followed) == 32 and contexts[0] not in followed       # demo and contexts[0]: least recently used
    assert set(contexts[1:]) == followed


def test_a_context_the_token_may_not_observe_is_polled(served, node):
    app = node._app_key(KV)
    hidden = node.add_context(app)
    node.sse_hidden.add(hidden)
    live(served)
    answer = until(lambda: (lambda a: a if a["stream"] == "polling" else None)(events(served, context=hidden)),
                        "the dropped subscription to show")
    assert "may not observe" in answer["why"]
    node.silent_change(hidden)
    assert [e["kind"] for e in events(served, context=hidden)["entries"]] == ["Changed"]


@pytest.mark.parametrize("mode, said", [("off", "404"), ("forbidden", "403")])
def test_sse_off_or_forbidden_falls_back_to_polling_said_once(start_server, tmp_path, node, mode, said):
    node.sse_mode = mode
    server = start_server(env_for(tmp_path, node))
    answer = until(lambda: (lambda a: a if a["stream"] == "polling" else None)(events(server)), "polling")
    assert said in answer["why"]
    context = answer["context"]
    assert emitted(kv_set(server, "a", "1")) is None
    node.silent_change(context)
    assert "Changed" in [e["kind"] for e in events(server)["entries"]]
    server.close()
    assert server.stderr.count("Events: ") == 1


# ---- 5. describe_app ----

def test_describe_app_lists_the_apps_events(served):
    described = json.loads(served.call_tool("describe_app", {"app": KV})["content"][0]["text"])
    assert described["events"] == [
        "Cleared: The store was emptied by `clear`.",
        "Inserted(EntryWritten): A key received its first value.",
        "Removed(EntryRemoved): A key and its value were deleted.",
        "Updated(EntryWritten): An existing key received a new value."]


def test_events_is_read_only_and_offered_in_read_only_mode(start_server, tmp_path, node):
    server = start_server(env_for(tmp_path, node, CALIMERO_MCP_READ_ONLY="1", CALIMERO_MCP_TOOLSETS="core"))
    tools = {t["name"]: t for t in server.result("tools/list")["tools"]}
    assert tools["events"]["annotations"] == {"readOnlyHint": True}


# ---- secrets ----

def test_no_token_in_any_url_log_line_or_answer(start_server, tmp_path):
    double = sample_double(auth={"users": {"admin": "pw-Sekrit-4711"}}).start()
    try:
        server = start_server(env_for(tmp_path, double, CALIMERO_USERNAME="admin",
                                      CALIMERO_PASSWORD="pw-Sekrit-4711"))
        live(server)
        answers = [kv_set(server, "a", "1"), server.call_tool("events", {"context": "demo"})]
        tokens = {e["headers"]["authorization"][7:] for e in double.sse_log}
        assert tokens and all(len(t) > 20 for t in tokens)
        assert all("token" not in e["query"] for e in double.sse_log)
        assert all(e["headers"]["authorization"].startswith("Bearer ") for e in double.sse_log)
        server.close()
        seen = server.stderr + json.dumps(answers)
        assert not any(token in seen for token in tokens)
    finally:
        double.stop()


def test_an_expired_token_is_refreshed_for_the_stream(start_server, tmp_path):
    double = sample_double(auth={"users": {"admin": "pw-Sekrit-4711"}}).start()
    try:
        server = start_server(env_for(tmp_path, double, CALIMERO_USERNAME="admin",
                                      CALIMERO_PASSWORD="pw-Sekrit-4711"))
        live(server)
        with double._lock:
            double._require_auth().expire_all_access()
        double.sse_disconnect()
        until(lambda: [e for e in double.requests_to("POST", "/auth/refresh")], "a refresh")
        until(lambda: events(server)["stream"] == "live", "the stream back with a fresh token")
    finally:
        double.stop()


def test_keep_alives_hold_a_quiet_stream_open(tmp_path, node):
    node.sse_keepalive = 0.2
    server = tuned(env_for(tmp_path, node), "mero_node_events.SSE_READ_TIMEOUT = 1.0")
    try:
        live(server)
        answer = server.tool_json("events", {"context": "demo", "wait": 3}, timeout=90)
        assert answer["entries"] == [] and answer["stream"] == "live"     # no Gap: keep-alives kept it read
        assert len([e for e in node.sse_log if e["path"] == "/sse"]) == 1
    finally:
        server.close()


def test_a_mutation_with_no_events_is_a_changed_entry(served, node):
    counter = node._app_key("com.example.counter")
    context = node.add_context(counter)
    live(served, context)
    served.call_tool("call", {"app": "counter", "context": context, "method": "increment", "args": {"by": 1}})
    answer = until(lambda: (lambda a: a if a["entries"] else None)(events(served, context=context)), "the entry")
    assert [e["kind"] for e in answer["entries"]] == ["Changed"]          # one write, one entry
    assert answer["entries"][0]["note"] in ("a write that emitted no event",       # the frame came first
                                            "the state changed with no event (one write or more)")  # the poll
    assert events(served, context=context, after=answer["next"])["entries"] == []    # the hash it moved: no 2nd
