"""Issue 43, the event stream: whatever the node or a peer sends, the stream's memory stays bounded, its threads
live on, its reconnects back off, an outage is one Gap, and frames are read as they arrive whatever the framing.

Driven through the real server against the double's /sse, whose odd behaviours are opt-in knobs (a stream that
ends after its connect frame, a connect id that is not Latin-1, no chunked framing, a huge or odd subscription
answer). Memory is the server's own RSS (/proc/<pid>/status); bounds are generous, the old code went far past them."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from node_double import sample_double
from test_events import env_for, events, live, tuned, until

MB = 1 << 20


@pytest.fixture
def node():
    double = sample_double().start()
    yield double
    double.stop()


def rss(server) -> int:
    """The server process's resident memory in bytes, as the kernel counts it."""
    with open("/proc/%d/status" % server.proc.pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for the server")


def sample_peak(server, peaks, done):
    """The server's RSS every 10 ms until `done`, into `peaks`."""
    while not done.is_set():
        peaks.append(rss(server))
        time.sleep(0.01)


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="RSS is read from /proc")


def gets(node):
    return [e for e in node.sse_log if e["path"] == "/sse" and e["method"] == "GET"]


# ---- memory ----

@needs_proc
def test_remembering_echoes_costs_digests_not_frames(start_server, tmp_path, node):
    """A peer's write within core's limits (100 events of 16 KiB each: a ~6 MB frame) is remembered for the echo
    check by a digest: sixteen of them (the echoes a context remembers) leave the server's memory where it was."""
    # glibc's mmap threshold held fixed: a freed frame's memory goes back at once, so RSS shows what is kept
    server = start_server(env_for(tmp_path, node, MALLOC_MMAP_THRESHOLD_="65536"))
    context = live(server)
    value = "v" * (16 << 10)
    for round_ in range(2):                          # what reading one such frame costs, before the count matters
        node.sse_mutation(context, [("Inserted", value)] * 100, new_root="big-%d" % round_)
    until(lambda: events(server, after=199)["entries"], "the first writes' events", 120)
    before = rss(server)
    for round_ in range(2, 16):
        node.sse_mutation(context, [("Inserted", value)] * 100, new_root="big-%d" % round_)
    last = until(lambda: events(server, after=1599)["entries"], "the last write's events", 120)[-1]["n"]
    grown = rss(server) - before
    assert grown < 40 * MB, "the server grew %d MB remembering echoes" % (grown // MB)
    # the digests still find the author's echo: the same frame again adds nothing
    node.sse_mutation(context, [("Inserted", value)] * 100, new_root="big-15")
    node.sse_mutation(context, [("Cleared", None)], new_root="after-echo")
    answer = until(lambda: events(server, after=last)["entries"], "the frame after the echo")
    assert [e["kind"] for e in answer] == ["Cleared"]


@needs_proc
def test_a_huge_subscription_answer_is_refused_unread_under_the_cap(tmp_path, node):
    """A 120 MB answer to a subscription POST (well-formed, naming the context) with a 1 MiB cap set: refused by
    its size, never read; the server's memory stays where it was, and a sane answer later subscribes."""
    demo = node._aliases["context"]["demo"]
    node.sse_subscription_body = (b'{"result":{"status":"subscribed","contexts":["%s"],"groups":[],"pad":"'
                                  % demo.encode() + b"x" * (120 * MB) + b'"}}')
    server = tuned(env_for(tmp_path, node, CALIMERO_MCP_MAX_RESPONSE_BYTES=str(MB)), "")
    try:
        assert server.call_tool("node_status")["content"]      # the node modules loaded: what follows is the stream's
        before, peaks, done = rss(server), [], threading.Event()
        sampler = threading.Thread(target=sample_peak, args=(server, peaks, done), daemon=True)
        sampler.start()                             # a big read's memory goes back at once: watch it as it happens
        events(server)                              # opens the stream; the subscription's answer is the huge one
        until(lambda: [e for e in node.sse_log if e["method"] == "POST"], "a subscription POST")
        time.sleep(3.0)                             # the old code read it whole (and subscribed) within this
        done.set()
        sampler.join()
        grown = max(peaks) - before
        assert grown < 40 * MB, "the server grew %d MB reading a subscription answer" % (grown // MB)
        assert events(server)["stream"] != "live"
        node.sse_subscription_body = None           # the node answers sanely again: the retry subscribes
        until(lambda: events(server)["stream"] == "live", "the context subscribed after the refusal", 60)
    finally:
        server.close()
    assert "Traceback" not in server.stderr


# ---- threads that die or spin ----

@pytest.mark.parametrize("body", [
    b'{"result":"subscribed"}',
    b'{"result":{"contexts":5}}',
    b'[1,2,3]',
    b"[" * 100000 + b"]" * 100000,
    b'{"result":{"contexts":[' + b'"x",' * 10 + b'{"a":1}]}}',
    b"not json at all",
], ids=["result-string", "contexts-number", "array", "nested-100000", "contexts-mixed", "not-json"])
def test_an_odd_subscription_answer_leaves_the_subscriber_alive(tmp_path, node, body):
    node.sse_subscription_body = body
    server = tuned(env_for(tmp_path, node), "")
    try:
        events(server)
        until(lambda: len([e for e in node.sse_log if e["method"] == "POST"]) >= 2, "a subscription POST retried")
        assert events(server)["stream"] != "live"
        node.sse_subscription_body = None
        until(lambda: events(server)["stream"] == "live", "a retry that subscribes", 60)
        assert server.call_tool("node_status")["content"]
    finally:
        server.close()
    assert "Traceback" not in server.stderr
    assert server.stderr.count("Events: thread events-subscribe met") == 1, server.stderr    # said once, not per try


def test_a_connect_id_that_is_not_latin_1_never_kills_the_reader(start_server, tmp_path, node):
    node.sse_connect_id = "7000001-\u00e9\u4e2d"     # UTF-8 on the wire; no HTTP header can carry it back
    server = start_server(env_for(tmp_path, node))
    context = live(server)
    node.sse_disconnect()                            # right after the connect frame: its id is the last one
    until(lambda: len(gets(node)) >= 2, "a reconnect")
    until(lambda: events(server)["stream"] == "live", "the stream back after the reconnect", 60)
    node.sse_mutation(context, [("Inserted", {"key": "after", "value": "1"})])
    until(lambda: events(server, kind="Inserted")["entries"], "events after the reconnect")
    assert all("\u4e2d" not in json.dumps(e["headers"]) for e in gets(node))
    assert "Traceback" not in server.stderr


def test_a_stream_closing_after_its_connect_frame_backs_off_and_writes_one_gap(tmp_path, node):
    server = tuned(env_for(tmp_path, node), "mero_node_events.SSE_STEADY_SECONDS = 1.0")
    try:
        live(server)
        node.sse_close_after_connect = True
        node.sse_disconnect()
        before = len(gets(node))
        time.sleep(8.0)
        reconnects = len(gets(node)) - before
        # 0.5 + 1 + 2 + 4 s of backoff: at most 5 in 8 s (the old code reconnected twice a second: ~16)
        assert 2 <= reconnects <= 6, reconnects
        gaps = events(server, kind="Gap")["entries"]
        assert len(gaps) == 1, gaps                  # one outage, one Gap (not one per attempt)
        node.sse_close_after_connect = False
        until(lambda: events(server)["stream"] == "live", "the stream back", 90)
        time.sleep(1.5)                              # up past SSE_STEADY_SECONDS: the outage is over
        node.sse_disconnect()                        # a new outage: a second Gap
        until(lambda: len(events(server, kind="Gap")["entries"]) == 2, "the next outage's Gap")
        until(lambda: events(server)["stream"] == "live", "the stream back again")
        assert len(events(server, kind="Gap")["entries"]) == 2
    finally:
        server.close()


def test_a_stream_without_chunked_framing_is_read_as_it_arrives(start_server, tmp_path, node):
    node.sse_chunked = False                         # Connection: close; the body runs until the stream ends
    server = start_server(env_for(tmp_path, node))
    answer = events(server)
    until(lambda: events(server)["stream"] == "live", "the connect frame read before the stream ends", 20)
    node.sse_mutation(answer["context"], [("Inserted", {"key": "k", "value": "v"})])
    entries = until(lambda: events(server, kind="Inserted")["entries"], "the event read as it came", 20)
    assert entries[0]["payload"] == {"key": "k", "value": "v"}
    assert len(gets(node)) == 1
