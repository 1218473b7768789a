"""What one app call sends the node, and in what order: round trips count when the node is across a network.
Counts and order come from the double's request log (each entry's arrival and answer); how long a call waits is
bench/'s to measure.

Contract: node-api.md §0.7 (what a call needs); tools.md (handles, aliases read live); reference-behaviour.md §3.8,
§3.14 (the refusals). Nothing executes before this very call has read, live, the context's record and its
application's record; the reads that need no other's answer go together. A remote call by context id or handle
waits 2 round trips (the reads, then the execute), by alias 3 (the lookup first: execute takes only a context id).
"""
from __future__ import annotations

import json
import re
import threading
import time

import pytest
from node_double import NodeDouble, counter_spec, kv_store_manifest, kv_store_spec

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
    """A generated tool's JSON text, or call's (which gives a string as it is); an app call's second block says
    where it ran."""
    assert not result.get("isError"), result
    blocks = result["content"]
    # after the value: where it ran, then, for a write to an app with events, what it emitted (per call_many item)
    assert all(re.match(r"(\w+ ran in context [0-9a-f]{64}|(Items? [\d, ]+\. )?Events in context )", b["text"])
               for b in blocks[1:]), result
    try:
        return json.loads(blocks[0]["text"])
    except ValueError:
        return blocks[0]["text"]


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

HOLD = 0.5          # each admission request is held this long, so requests sent together are seen together
READ_HOLD = 0.05    # the reads alone held this long: an execute that did not wait for them arrives first


def answered_before(other, entry):
    """Whether `other`'s answer had begun before `entry` arrived: taken before its first byte (answering_at), so a
    request sent in reply to it is never read as sent beside it (done_at, after its last byte, may be logged after
    the reply to it arrived on a busy machine)."""
    return other.get("answering_at") is not None and other["answering_at"] <= entry["at"]


def round_trips(entries):
    """The longest chain of requests each sent only after the one before it was answered: the round trips a
    call waits when every request costs one."""
    depth = []
    for index, entry in enumerate(entries):
        before = [depth[i] for i, other in enumerate(entries[:index]) if answered_before(other, entry)]
        depth.append(1 + max(before, default=0))
    return max(depth, default=0)


@pytest.mark.parametrize("context, expected, trips", [
    ("id", ["app", "context", "execute"], 2),
    ("alias", ["alias", "app", "context", "execute"], 3),
])
@pytest.mark.parametrize("tool, args", [("kv_store_get", {"key": "greeting"}),
                                        ("kv_store_set", {"key": "k", "value": "v"})])
def test_a_call_sends_each_request_once_in_its_round_trips(server, world, context, expected, trips, tool, args):
    """A [view] and a [mut] call alike: the reads together (the alias first), then the execute."""
    named = world.first if context == "id" else "moving"
    for _ in range(2):                                  # the first call, then the steady state
        since = world.mark()
        answer(server.call_tool(tool, dict(args, context=named)))
        sent = kinds(world.requests(since))
        assert sorted(sent) == sorted(expected) and sent[-1] == "execute", sent
    world.double.slow = {path: HOLD for path in ADMISSION_PATHS}
    since = world.mark()
    answer(server.call_tool(tool, dict(args, context=named)))
    entries = [e for e in world.double.log[since:] if e["path"].startswith(ADMISSION_PATHS)]
    assert round_trips(entries) == trips, kinds(world.requests(since))


def test_a_context_that_cannot_be_read_is_refused_before_anything_executes(server, world):
    # Its read fails once (a 404): admission refuses, and nothing executed meanwhile.
    answer(server.call_tool("kv_store_get", {"context": world.second, "key": "greeting"}))
    executed = len(world.double.executions)
    world.double.faults = {"status": 404, "paths": ["/admin-api/contexts/"], "times": 1}
    refused = server.call_tool("kv_store_get", {"context": world.second, "key": "greeting"})
    assert refused["isError"] and "not found" in text_of(refused), refused
    assert len(world.double.executions) == executed
    since = world.mark()
    assert answer(server.call_tool("kv_store_get", {"context": world.second, "key": "greeting"})) == "from the second"
    sent = kinds(world.requests(since))
    assert sent.index("execute") > sent.index("context") and sent.index("execute") > sent.index("app"), sent


def test_call_many_reads_the_app_and_the_context_once(server, world):
    item = {"app": KV, "context": world.first, "method": "get", "args": {"key": "greeting"}}
    for _ in range(2):
        since = world.mark()
        items = answer(server.call_tool("call_many", {"calls": [item] * 32}))
        assert items == [{"items": "0-31", "app": KV, "context": world.first, "method": "get", "ok": True,
                          "result": "from the first"}]          # 32 equal answers, one row
        sent = kinds(world.requests(since))
        assert sorted(sent) == ["GET /admin-api/applications", "context"] + ["execute"] * 32, sent


# ── no execute before this call's own reads ───────────────────────────────────────────────────────

def executes_before_their_reads(entries, double):
    """Each execute whose context's record, or whose application's record (its own, or the list a name resolves
    in), this call had not read (an answer come back) when it arrived."""
    late = []
    for index, entry in enumerate(entries):
        if entry["path"] != "/jsonrpc":
            continue
        context_id = entry["json"]["params"]["contextId"]
        app_id = double._contexts[context_id]["applicationId"]
        answered = [e for e in entries[:index] if e["method"] == "GET" and answered_before(e, entry)]
        context_read = any(e["path"] == "/admin-api/contexts/" + context_id for e in answered)
        app_read = any(e["path"] in ("/admin-api/applications/" + app_id, "/admin-api/applications") for e in answered)
        if not (context_read and app_read):
            late.append((context_id, entry["json"]["params"]["method"], context_read, app_read))
    return late


def test_no_execute_precedes_the_same_calls_context_read(server, world):
    """Generated tools, call and call_many's items, by context id, alias and handle, [view] and [mut], each call
    twice (the second on contexts this server has read before): in the double's log every execute comes after
    this very call read its context's record and its application's."""
    handle = handle_of(server, KV, world.second)
    get, put = {"key": "greeting"}, {"key": "k", "value": "v"}
    # the reads held a little: an execute sent with them, not after, arrives well before their answers
    world.double.slow = {path: READ_HOLD for path in ADMISSION_PATHS if path != "/jsonrpc"}
    calls = []
    for named in ({"context": world.first}, {"context": "moving"}, {"app_handle": handle}):
        calls += [("kv_store_get", dict(get, **named)), ("kv_store_set", dict(put, **named))]
        by_app = dict(named) if "app_handle" in named else dict(named, app=KV)
        calls += [("call", dict(by_app, method="get", args=get)), ("call", dict(by_app, method="set", args=put))]
    items = [args for tool, args in calls if tool == "call"]
    calls.append(("call_many", {"calls": items}))
    for _ in range(2):
        for tool, args in calls:
            since = world.mark()
            answer(server.call_tool(tool, args))
            entries = world.double.log[since:]
            assert any(e["path"] == "/jsonrpc" for e in entries), (tool, args)
            assert executes_before_their_reads(entries, world.double) == [], (tool, args,
                                                                               kinds(world.requests(since)))


# ── freshness ─────────────────────────────────────────────────────────────────────────────────────

UPGRADED = "This app_handle is for version 1.0.0 of %s; version 1.1.0 is installed now. " % KV


@pytest.mark.parametrize("via", ["generated", "call"])
def test_a_handle_is_refused_right_after_an_upgrade(server, world, via):
    handle = handle_of(server, KV, world.first)
    tool, args = (("kv_store_get", {"app_handle": handle, "key": "greeting"}) if via == "generated" else
                  ("call", {"app_handle": handle, "method": "get", "args": {"key": "greeting"}}))
    assert answer(server.call_tool(tool, args)) == "from the first"
    world.double.upgrade_app(world.kv, "1.1.0")
    executed = len(world.double.executions)
    refused = server.call_tool(tool, args)
    assert refused["isError"] and text_of(refused) == UPGRADED + RETRY % KV     # what changed, then what to do
    assert len(world.double.executions) == executed
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


def moved_text(value, first, now_id):
    return 'Error: Context "%s" runs %s (application %s), not "%s".' % (value, COPY, now_id, first)


@pytest.mark.parametrize("tool, args", [
    ("kv_store_get", {"key": "greeting"}),
    ("call", {"app": KV, "method": "get", "args": {"key": "greeting"}}),
])
def test_a_context_moved_to_another_app_is_refused_before_anything_runs(server, world, tool, args):
    assert answer(server.call_tool(tool, dict(args, context=world.first))) == "from the first"
    world.move(world.first, world.copy)
    # Held, the context's read comes back last: nothing may go out before it.
    world.double.slow["/admin-api/contexts/" + world.first] = HOLD
    since = world.mark()
    refused = server.call_tool(tool, dict(args, context=world.first))
    assert refused["isError"] and text_of(refused).startswith(moved_text(world.first, KV, world.copy)), refused
    assert "/jsonrpc" not in [e["path"] for e in world.double.log[since:]]


def test_a_handle_whose_context_moved_is_refused_naming_both_apps(server, world):
    handle = handle_of(server, KV, world.first)
    assert answer(server.call_tool("kv_store_get", {"app_handle": handle, "key": "greeting"})) == "from the first"
    world.move(world.first, world.copy)
    since = world.mark()
    refused = server.call_tool("kv_store_get", {"app_handle": handle, "key": "greeting"})
    assert refused["isError"] and text_of(refused) == (
        'This app_handle\'s context %s now runs %s (application %s), not "%s". %s'
        % (world.first, COPY, world.copy, KV, RETRY % KV))
    assert "/jsonrpc" not in [e["path"] for e in world.double.log[since:]]


VIEWER = "com.example.kv-viewer"


def viewer_world():
    """Two apps with a method `clear`: [view] in the viewer (a build that only reports), [mut] in the kv store.
    The viewer's context sits in its namespace, aliased `shared`, holding a key."""
    manifest = kv_store_manifest()
    for method in manifest["methods"]:
        if method["name"] == "clear":
            method["intent"] = "read_only"
    double = NodeDouble(apps=[kv_store_spec(), {"package": VIEWER, "version": "1.0.0", "signer_id": "did:key:v",
                                                "metadata": {"name": "Viewer"}, "abi": manifest}])
    viewer, kv = double._app_key(VIEWER), double._app_key(KV)
    namespace = double.add_namespace(viewer, name="viewers")
    context = double.add_context(viewer, group_id=namespace, state={"keep": "me"})
    double.add_alias("shared", context)
    return double, viewer, kv, namespace, context


@pytest.mark.parametrize("env", [{}, {"CALIMERO_MCP_READ_ONLY": "1"}], ids=["read-write", "read-only"])
def test_a_view_method_on_a_context_whose_group_moved_runs_nothing(serve, env):
    """The group is moved to the kv store, whose `clear` writes: the viewer's [view] clear, called on the context
    by id, alias, handle or through call, is refused naming both apps, and no execute reaches the node."""
    double, viewer, kv, namespace, context = viewer_world()
    server = serve(double, **env)
    tool = next(name for name in server.tool_names() if name.endswith("_clear") and name != "kv_store_clear")
    handle = handle_of(server, VIEWER, context)
    assert server.call_tool(tool, {"context": context})["content"][1]["text"].startswith(
        "clear ran in context %s" % context)                                                        # before
    double.move_group(namespace, kv)
    since = len(double.log)
    moved = 'runs %s (application %s), not "%s"' % (KV, kv, VIEWER)
    for name, args in [(tool, {"context": context}), (tool, {"context": "shared"}), (tool, {"app_handle": handle}),
                       ("call", {"app": VIEWER, "context": "shared", "method": "clear"}),
                       ("call", {"app_handle": handle, "method": "clear"})]:
        refused = server.call_tool(name, args)
        assert refused["isError"] and moved in text_of(refused), (name, args, refused)
    items = answer(server.call_tool("call_many", {"calls": [{"app": VIEWER, "context": context, "method": "clear"}]}))
    assert items[0]["ok"] is False and moved in items[0]["error"], items
    assert [e for e in double.log[since:] if e["path"] == "/jsonrpc"] == []
    assert double.kv_state(context) == {"keep": "me"}


def test_two_contexts_named_are_refused_and_nothing_executes(server, world):
    """The handle names one context and the context argument another: admission refuses, and nothing was sent to
    either."""
    handle = handle_of(server, KV, world.first)
    assert answer(server.call_tool("kv_store_get", {"context": world.second, "key": "greeting"})) == "from the second"
    executed = len(world.double.executions)
    refused = server.call_tool("kv_store_get", {"app_handle": handle, "context": world.second, "key": "greeting"})
    assert refused["isError"] and "different contexts" in text_of(refused)
    assert len(world.double.executions) == executed


def test_wrong_arguments_send_no_execute(server, world):
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


@pytest.mark.parametrize("services, trips", [
    ({}, 2),                                               # a plain app: the list, then its record and ABI at once
    ({"api": kv_store_manifest()}, 2),                     # one service: the ABI without a name is that service's
    ({"api": kv_store_manifest(), "admin": kv_store_manifest()}, 3),    # several: each service's ABI by name after
])
def test_the_catalog_reads_an_apps_record_and_its_abi_together(serve, services, trips):
    """The list leaves a plain app's services out, so its record is read; the ABI it will need goes beside it."""
    spec = dict(kv_store_spec(), services=services) if services else kv_store_spec()
    double = NodeDouble(apps=[spec], list_services=False)
    double.slow = {"/admin-api/applications": HOLD}
    server = serve(double)
    names = server.tool_names()
    assert sum(name.startswith("kv_store_") and name.endswith("_get") for name in names) == max(1, len(services))
    entries = [e for e in double.log if e["path"].startswith("/admin-api/applications")]
    assert round_trips(entries) == trips, [(e["path"], e.get("query")) for e in entries]
    asked = [e.get("query", {}).get("service_name") for e in entries if e["path"].endswith("/abi")]
    assert sorted(asked, key=str) == sorted([None] + (sorted(services) if len(services) > 1 else []), key=str)
