"""What one app call sends the node, and the freshness rules its overlapped requests keep: round trips count
when the node is across a network. Counts come from the double's request log; how long a call waits is bench/'s
to measure.

Contract: node-api.md §0.7 (what a call needs); tools.md (handles, aliases read live); reference-behaviour.md §3.8,
§3.14 (the refusals). A [view] method's execute may go out beside the admission reads, for a context this server
has already seen running the tool's app, and its answer is shown only once admission passes.
"""
from __future__ import annotations

import json
import threading
import time

import pytest
from node_double import NodeDouble, counter_spec, kv_store_spec

KV = "com.calimero.kv-store"
COPY = "com.example.kv-copy"
RETRY = "Call select_app for %s and retry with the returned app_handle."
ADMISSION_PATHS = ("/admin-api/applications", "/admin-api/contexts", "/admin-api/alias", "/jsonrpc")


class World:
    """The kv store with two contexts (one aliased `moving`), a copy of it under another package, the counter."""

    def __init__(self):
        self.double = NodeDouble(apps=[kv_store_spec(), dict(kv_store_spec(), package=COPY), counter_spec()])
        self.kv = self.double._app_key(KV)
        self.copy = self.double._app_key(COPY)
        self.first = self.double.add_context(self.kv, state={"greeting": "from the first"})
        self.second = self.double.add_context(self.kv, state={"greeting": "from the second"})
        self.double.add_alias("moving", self.first)

    def requests(self, since):
        """(method, path) of every admission-path request since log index `since`."""
        return [(e["method"], e["path"]) for e in self.double.log[since:] if e["path"].startswith(ADMISSION_PATHS)]

    def mark(self):
        return len(self.double.log)

    def move(self, context_id, app_id):
        """The context now runs another app (as a group upgrade to another application would leave it)."""
        with self.double._lock:
            self.double._contexts[context_id]["applicationId"] = app_id


@pytest.fixture
def world():
    return World()


@pytest.fixture
def server(serve, world):
    server = serve(world.double)
    assert "kv_store_get" in server.tool_names()
    return server


def text_of(result):
    return result["content"][-1]["text"]


def answer(result):
    """A generated tool's JSON text, or call's (which gives a string as it is)."""
    assert not result.get("isError"), result
    try:
        return json.loads(text_of(result))
    except ValueError:
        return text_of(result)


def handle_of(server, app, context):
    result = server.call_tool("select_app", {"app": app, "context": context})
    assert not result.get("isError"), result
    return json.loads(result["content"][0]["text"])["app_handle"]


def kinds(requests):
    """The requests as kinds, in the order the double saw them."""
    def kind(method, path):
        if path == "/jsonrpc":
            return "execute"
        if path.startswith("/admin-api/alias/lookup"):
            return "alias"
        if path.startswith("/admin-api/contexts/"):
            return "context"
        if path.startswith("/admin-api/applications/"):
            return "app"
        return "%s %s" % (method, path)
    return [kind(*r) for r in requests]


# ── what a call sends ─────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("context, expected", [
    ("id", ["app", "context", "execute"]),
    ("alias", ["alias", "app", "context", "execute"]),
])
@pytest.mark.parametrize("tool, args", [("kv_store_get", {"key": "greeting"}),
                                        ("kv_store_set", {"key": "k", "value": "v"})])
def test_a_call_sends_each_request_once(server, world, context, expected, tool, args):
    named = world.first if context == "id" else "moving"
    for _ in range(3):                                  # the first call, then the steady state
        since = world.mark()
        answer(server.call_tool(tool, dict(args, context=named)))
        assert sorted(kinds(world.requests(since))) == sorted(expected)


def test_a_first_seen_context_is_admitted_before_anything_executes(server, world):
    # Its read fails once (a 404): admission refuses, and nothing executed meanwhile.
    world.double.faults = {"status": 404, "paths": ["/admin-api/contexts/"], "times": 1}
    refused = server.call_tool("kv_store_get", {"context": world.second, "key": "greeting"})
    assert refused["isError"] and "not found" in text_of(refused), refused
    assert world.double.executions == []
    since = world.mark()
    assert answer(server.call_tool("kv_store_get", {"context": world.second, "key": "greeting"})) == "from the second"
    sent = kinds(world.requests(since))
    assert sent.index("execute") > sent.index("context") and sent.index("execute") > sent.index("app"), sent


def test_a_write_waits_for_admission(server, world):
    for _ in range(2):                                  # seen or not, a [mut] method runs only once admitted
        since = world.mark()
        answer(server.call_tool("kv_store_set", {"context": world.first, "key": "k", "value": "v"}))
        sent = kinds(world.requests(since))
        assert sent[-1] == "execute" and sorted(sent[:-1]) == ["app", "context"], sent


def test_call_many_reads_the_app_and_the_context_once(server, world):
    item = {"app": KV, "context": world.first, "method": "get", "args": {"key": "greeting"}}
    for _ in range(2):
        since = world.mark()
        items = answer(server.call_tool("call_many", {"calls": [item] * 32}))
        assert [i["result"] for i in items] == ["from the first"] * 32
        sent = kinds(world.requests(since))
        assert sorted(sent) == ["GET /admin-api/applications", "context"] + ["execute"] * 32, sent


# ── freshness ─────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("via", ["generated", "call"])
def test_a_handle_is_refused_right_after_an_upgrade(server, world, via):
    handle = handle_of(server, KV, world.first)
    tool, args = (("kv_store_get", {"app_handle": handle, "key": "greeting"}) if via == "generated" else
                  ("call", {"app_handle": handle, "method": "get", "args": {"key": "greeting"}}))
    assert answer(server.call_tool(tool, args)) == "from the first"
    world.double.upgrade_app(world.kv, "1.1.0")
    refused = server.call_tool(tool, args)
    assert refused["isError"] and text_of(refused) == RETRY % KV
    assert "from the first" not in json.dumps(refused)
    fresh = dict(args, app_handle=handle_of(server, KV, world.first))
    assert answer(server.call_tool(tool, fresh)) == "from the first"


@pytest.mark.parametrize("tool, args", [("kv_store_get", {"key": "greeting"}),
                                        ("call", {"app": KV, "method": "get", "args": {"key": "greeting"}})])
def test_an_alias_repointed_between_two_calls_is_followed(server, world, tool, args):
    assert answer(server.call_tool(tool, dict(args, context="moving"))) == "from the first"
    assert answer(server.call_tool(tool, dict(args, context="moving"))) == "from the first"
    world.double.add_alias("moving", world.second)
    since = world.mark()
    assert answer(server.call_tool(tool, dict(args, context="moving"))) == "from the second"
    assert kinds(world.requests(since)).count("alias") == 1


@pytest.mark.parametrize("tool, args", [
    ("kv_store_get", {"key": "greeting"}),
    ("call", {"app": KV, "method": "get", "args": {"key": "greeting"}}),
])
def test_a_context_moved_to_another_app_is_refused_without_its_answer(server, world, tool, args):
    assert answer(server.call_tool(tool, dict(args, context=world.first))) == "from the first"
    world.move(world.first, world.copy)
    # The context's read is held, so the early execute decides on what the last read showed (the kv store):
    # overlapped, the read could otherwise land first and nothing would go out early.
    world.double.slow["/admin-api/contexts/" + world.first] = 0.5
    executed = len(world.double.executions)
    refused = server.call_tool(tool, dict(args, context=world.first))
    assert refused["isError"] and text_of(refused).startswith(
        'Error: Context "%s" does not belong to "%s".' % (world.first, KV)), refused
    # The early execute went out (the context was seen running the kv store) and ran the other app's method: its
    # answer is nowhere in the refusal.
    assert [e["method"] for e in world.double.executions[executed:]] == ["get"]
    assert "from the first" not in json.dumps(refused)
    # Its read now shows the other app: nothing runs before admission any more.
    again = server.call_tool(tool, dict(args, context=world.first))
    assert again["isError"] and len(world.double.executions) == executed + 1


def test_a_handle_whose_context_moved_is_refused_without_its_answer(server, world):
    handle = handle_of(server, KV, world.first)
    assert answer(server.call_tool("kv_store_get", {"app_handle": handle, "key": "greeting"})) == "from the first"
    world.move(world.first, world.copy)
    refused = server.call_tool("kv_store_get", {"app_handle": handle, "key": "greeting"})
    assert refused["isError"] and text_of(refused) == RETRY % KV
    assert "from the first" not in json.dumps(refused)


def test_an_early_answer_counts_only_for_the_request_admission_makes(server, world):
    """The handle names one context and the context argument another: admission refuses, and nothing was sent
    early to either (the call names two contexts)."""
    handle = handle_of(server, KV, world.first)
    assert answer(server.call_tool("kv_store_get", {"context": world.second, "key": "greeting"})) == "from the second"
    executed = len(world.double.executions)
    refused = server.call_tool("kv_store_get", {"app_handle": handle, "context": world.second, "key": "greeting"})
    assert refused["isError"] and "different contexts" in text_of(refused)
    assert len(world.double.executions) == executed


def test_wrong_arguments_send_no_early_execute(server, world):
    answer(server.call_tool("kv_store_get", {"context": world.first, "key": "greeting"}))
    executed = len(world.double.executions)
    result = server.call_tool("kv_store_get", {"context": world.first, "key": 5})
    assert result["isError"] and "Invalid arguments for get" in text_of(result)
    assert len(world.double.executions) == executed


class CountingDouble(NodeDouble):
    """Holds each app record read a moment and counts how many are at the node at once."""

    HOLD = 0.5

    def __init__(self, **kw):
        super().__init__(**kw)
        self.at_once = self.most_at_once = 0
        self.counting = threading.Lock()

    def _wait_if_slow(self, path):
        if not path.startswith("/admin-api/applications/") or path.count("/") != 3:
            return super()._wait_if_slow(path)
        with self.counting:
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
        time.sleep(self.HOLD)
        with self.counting:
            self.at_once -= 1


def test_the_first_catalog_read_reads_every_app_at_once(serve):
    """A remote node's round trips are paid once for all of a node's apps (up to 16), not once per few: every app's
    record is at the node together."""
    apps = [dict(kv_store_spec(), package="com.example.kv-%d" % index) for index in range(12)]
    double = CountingDouble(apps=apps)
    server = serve(double)
    names = server.tool_names()
    assert sum(name.startswith("kv_") and name.endswith("_get") for name in names) == len(apps), names
    assert double.most_at_once == len(apps), "%d of %d app records read at once" % (double.most_at_once, len(apps))
