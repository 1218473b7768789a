#!/usr/bin/env python3
"""mero-mcp benchmarks: `make bench` or `python3 bench/run.py` from the repo root.

Prints one table of medians and ratios measured in this run, each beside its target with PASS or MISS.
Nothing here asserts a time: the machines are shared and noisy, so the table is information, not a gate.
Every figure is a median, and competing variants are measured interleaved so that a noisy moment hits all alike.
"""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import requests  # noqa: E402
import node  # noqa: E402

import fixture_apps  # noqa: E402
from mcp_client import FIXED_TOOL_BYTES, minimal_env  # noqa: E402
import node_double  # noqa: E402
from node_double import NodeDouble, sample_double  # noqa: E402
from synthetic import APPS, METHODS_PER_APP, bench_app_specs  # noqa: E402

PYTHON = sys.executable               # one interpreter for every process we compare
SERVER = [PYTHON, str(ROOT / "mero_mcp.py")]
# What the `mero-mcp` console script does: import the module, so its cached bytecode is used (a script is compiled
# on every start).
INSTALLED_SERVER = [PYTHON, "-c", "import sys; sys.path.insert(0, %r); import mero_mcp; sys.exit(mero_mcp.main())"
                    % str(ROOT)]
# The one-file build (`make pyz`, which `make bench` runs first), by this Python with no site-packages: unpacked into
# the bench home's cache folder by the warm-up spawn, as a host's first start does.
PYZ = ROOT / "dist" / ("mero-mcp-%s.pyz" % node.__version__)
PYZ_SERVER = [PYTHON, "-I", "-S", str(PYZ)]
SDK_SERVER = [PYTHON, str(ROOT / "bench" / "sdk_server.py")]
ECHO_ONE_LINE = [PYTHON, "-c", "import sys; sys.stdout.write(sys.stdin.readline()); sys.stdout.flush()"]
# The design card's main use: a checkout run by the distribution's Python (Debian: python3-requests, -jsonschema).
SYSTEM_PYTHON = "/usr/bin/python3"
PROTOCOL_VERSION = "2025-11-25"
COLD_SPAWNS = 30
LIST_REPEATS = 60
CALL_REPEATS = 1000
CALL_BLOCKS = 10                      # per-call figures alternate server/direct in this many blocks
CALL_MANY_SIZE = 32
CALL_MANY_REPEATS = 7
EXEC_DELAY = 0.05
CATALOG_DEADLINE = 90.0
GREETING = {"key": "greeting"}
READY_SPAWNS = 15


# ── A lean synchronous stdio client: no reader thread, so a timing is write → the answer line ─────────

def request_line(request_id, method, params=None):
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return (json.dumps(message) + "\n").encode("utf-8")


INITIALIZE = request_line(1, "initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                            "clientInfo": {"name": "mero-mcp-bench", "version": "0"}})


class StdioSession:
    """One server process. `timed()` measures a request from the write to the full answer line."""

    def __init__(self, command, env, stderr):
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                     env=env, cwd=str(ROOT))
        self.next_id = 1

    def timed(self, method, params=None):
        self.next_id += 1
        request_id = self.next_id
        data = request_line(request_id, method, params)
        started = time.perf_counter()
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        line = self.answer_line(request_id)
        elapsed = time.perf_counter() - started
        return elapsed, json.loads(line)["result"]

    def request(self, method, params=None):
        return self.timed(method, params)[1]

    def notify(self, method):
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "method": method}) + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def answer_line(self, request_id):
        """Skip notifications (list_changed, progress) until our answer; ids are parsed from the line's head
        only, so a 1 MB tools/list answer is not decoded inside the timed region."""
        marker = re.compile(rb'"id"\s*:\s*%d\s*[,}]' % request_id)
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("server exited before answering request %d" % request_id)
            if marker.search(line, 0, 80):
                return line

    def call_tool(self, name, arguments):
        return self.timed("tools/call", {"name": name, "arguments": arguments})

    @property
    def pid(self):
        return self.proc.pid

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def open_session(env, stderr, command=SERVER):
    session = StdioSession(command, env, stderr)
    session.proc.stdin.write(INITIALIZE)
    session.proc.stdin.flush()
    session.answer_line(1)
    session.notify("notifications/initialized")
    return session


def server_env(home, node_url):
    """What a host passes a stdio server (HOME, PATH), pointed at the double; state kept out of the real home."""
    return minimal_env(home, {"CALIMERO_NODE_URL": node_url, "CALIMERO_MCP_STATE_DIR": Path(home) / "state"})


def tool_result_or_fail(result, what):
    """A failing call would time an error path: stop and say so (a functional failure, not a time check)."""
    if result.get("isError"):
        raise RuntimeError("%s failed: %s" % (what, result["content"][-1]["text"]))
    return result


# ── 1. Cold start → initialize answer ──────────────────────────────────────────────────────────────

def spawn_to_answer(command, env, stderr):
    """Seconds from spawn to the whole initialize answer line on stdout; a fresh process every time."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            env=env, cwd=str(ROOT))
    proc.stdin.write(INITIALIZE)
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    if not line.startswith(b"{"):
        raise RuntimeError("%s answered %r" % (command[-1], line[:200]))
    proc.stdin.close()               # hosts end a server by closing stdin; the exit is not timed
    proc.wait()
    proc.stdout.close()
    return elapsed


def sdk_installed():
    """The SDK needs Python >= 3.10; on 3.9 its rows say so instead of failing the run."""
    return importlib.util.find_spec("mcp") is not None


def tools_listed_at_start(env, stderr):
    session = open_session(env, stderr)
    try:
        return len(session.request("tools/list")["tools"])
    finally:
        session.close()


def median_spawn_times(variants, env, stderr):
    for command in variants.values():
        spawn_to_answer(command, env, stderr)          # warm the page cache and .pyc files first
    times = {name: [] for name in variants}
    for _ in range(COLD_SPAWNS):                       # round-robin: noise lands on every variant alike
        for name, command in variants.items():
            times[name].append(spawn_to_answer(command, env, stderr))
    return {name: statistics.median(values) for name, values in times.items()}


def bench_cold_start(home, stderr):
    with sample_double() as double:
        env = server_env(home, double.url)
        tool_count = tools_listed_at_start(env, stderr)
        variants = {"bare": ECHO_ONE_LINE, "ours": SERVER, "installed": INSTALLED_SERVER}
        if PYZ.is_file():
            variants["pyz"] = PYZ_SERVER
        if sdk_installed():
            variants["sdk"] = SDK_SERVER + [str(tool_count)]
        return tool_count, median_spawn_times(variants, env, stderr)


def system_python_problem():
    """Why /usr/bin/python3 cannot stand for the distribution's Python here, or None."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return "%s is absent" % SYSTEM_PYTHON
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import requests, jsonschema"], capture_output=True)
    if probe.returncode != 0:
        return "%s lacks requests or jsonschema (apt-get install python3-requests python3-jsonschema)" % SYSTEM_PYTHON
    return None


def bench_system_cold_start(home, stderr):
    """mero_mcp.py on /usr/bin/python3 against that interpreter's own bare echo: {name: seconds}, or why not."""
    problem = system_python_problem()
    if problem:
        return problem
    with sample_double() as double:
        variants = {"bare": [SYSTEM_PYTHON] + ECHO_ONE_LINE[1:], "ours": [SYSTEM_PYTHON] + SERVER[1:],
                    "installed": [SYSTEM_PYTHON] + INSTALLED_SERVER[1:]}
        return dict(median_spawn_times(variants, server_env(home, double.url), stderr),
                    version=platform_version(SYSTEM_PYTHON))


# ── 2–5. One server with the 1,000-tool catalog ────────────────────────────────────────────────────

def answer_without_nagle():
    """The double writes a reply's headers and body in two send()s; with Nagle on, the body then waits for the
    client's delayed ACK (40 ms on Linux) on every request. merod (hyper) sends a reply in one write, so this
    stall is the double's, not the node's: switch Nagle off in this process's double (the file is untouched)."""
    node_double._Handler.disable_nagle_algorithm = True


class BenchNode:
    """The double with APPS synthetic apps; app 00 is a kv store with one context holding `greeting`."""

    def __init__(self):
        self.double = NodeDouble()
        self.specs = bench_app_specs()
        app_ids = [self.double.add_app(spec) for spec in self.specs]
        self.kv_package = self.specs[0]["package"]
        self.context_id = self.double.add_context(app_ids[0], state={"greeting": "hello"})

    def __enter__(self):
        self.double.start()
        return self

    def __exit__(self, *exc_info):
        self.double.stop()


def wait_for_catalog(session, expected_generated):
    """tools/list answers after at most a few seconds even while ABIs load: poll until all are in."""
    deadline = time.monotonic() + CATALOG_DEADLINE
    while True:
        tools = session.request("tools/list")["tools"]
        generated = [t for t in tools if (t.get("_meta") or {}).get("package")]
        if len(generated) >= expected_generated or time.monotonic() > deadline:
            return tools, len(generated)
        time.sleep(0.2)


def kv_get_tool(tools, package):
    for t in tools:
        if (t.get("_meta") or {}).get("package") == package and t["name"].endswith("_get"):
            return t["name"]
    raise RuntimeError("no generated get tool for %s" % package)


def bench_tools_list(session):
    session.timed("tools/list")                        # the first one may still build definitions
    return statistics.median(session.timed("tools/list")[0] for _ in range(LIST_REPEATS))


def execute_body(node, method, args):
    """The same JSON-RPC execute node.py sends (node-api §4)."""
    return {"jsonrpc": "2.0", "id": 1, "method": "execute",
            "params": {"contextId": node.context_id, "method": method, "argsJson": args}}


def timed_direct_call(http, url, body):
    started = time.perf_counter()
    reply = http.post(url, json=body)
    elapsed = time.perf_counter() - started
    if reply.status_code != 200 or reply.json().get("error"):
        raise RuntimeError("direct execute failed: %s" % reply.text[:200])
    return elapsed


def timed_server_call(session, tool_name, arguments):
    elapsed, result = session.call_tool(tool_name, arguments)
    tool_result_or_fail(result, tool_name)
    return elapsed


def bench_call_cost(session, node, tool_name):
    """Server path vs the bare HTTP execute, alternating blocks so drift hits both."""
    url = node.double.url + "/jsonrpc"
    body = execute_body(node, "get", GREETING)
    arguments = dict(GREETING, context=node.context_id)
    server_times, direct_times = [], []
    with requests.Session() as http:
        http.trust_env = False                         # as node.py's session: no proxy lookup per request
        for _ in range(20):                            # warm: connections, validators, caches
            timed_server_call(session, tool_name, arguments)
            timed_direct_call(http, url, body)
        block = CALL_REPEATS // CALL_BLOCKS
        for _ in range(CALL_BLOCKS):
            server_times += [timed_server_call(session, tool_name, arguments) for _ in range(block)]
            direct_times += [timed_direct_call(http, url, body) for _ in range(block)]
    return statistics.median(server_times), statistics.median(direct_times)


def named_item(node):
    """A call that names its app and context: the server resolves the app by name on every call."""
    return {"app": node.kv_package, "context": node.context_id, "method": "get", "args": GREETING}


def handle_item(handle):
    """A call with the app_handle select_app returned: the path the server's instructions steer agents to."""
    return {"app_handle": handle, "method": "get", "args": GREETING}


def select_handle(session, node):
    _, result = session.call_tool("select_app", {"app": node.kv_package, "context": node.context_id})
    tool_result_or_fail(result, "select_app")
    summary = result.get("structuredContent") or json.loads(result["content"][-1]["text"])
    return summary["app_handle"]


def timed_call_many(session, item):
    elapsed, result = session.call_tool("call_many", {"calls": [item] * CALL_MANY_SIZE})
    items = json.loads(tool_result_or_fail(result, "call_many")["content"][-1]["text"])
    failed = [entry for entry in items if not entry.get("ok")]
    if failed:
        raise RuntimeError("call_many items failed: %s" % failed[0])
    return elapsed


def bench_call_many(session, node, item):
    """32 calls in one call_many against a slow node, over one call: concurrency keeps this near 1."""
    node.double.exec_delay = EXEC_DELAY
    try:
        single, batch = [], []
        for _ in range(CALL_MANY_REPEATS):
            single.append(timed_server_call(session, "call", item))
            batch.append(timed_call_many(session, item))
    finally:
        node.double.exec_delay = 0.0
    return statistics.median(batch), statistics.median(single)


def peak_rss_bytes(pid):
    """VmHWM is the kernel's high-water mark of resident memory; psutil's current RSS elsewhere."""
    try:
        with open("/proc/%d/status" % pid) as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil
    return psutil.Process(pid).memory_info().rss


def bench_catalog(home, stderr):
    with BenchNode() as node:
        session = open_session(server_env(home, node.double.url), stderr)
        try:
            tools, generated = wait_for_catalog(session, APPS * METHODS_PER_APP)
            figures = {"listed": len(tools), "generated": generated}
            figures["list"] = bench_tools_list(session)
            tool_name = kv_get_tool(tools, node.kv_package)
            figures["via_server"], figures["direct"] = bench_call_cost(session, node, tool_name)
            handle = select_handle(session, node)
            figures["many_handle"], figures["one_handle"] = bench_call_many(session, node, handle_item(handle))
            figures["many_named"], figures["one_named"] = bench_call_many(session, node, named_item(node))
            figures["rss"] = peak_rss_bytes(session.pid)
        finally:
            session.close()
    return figures


# ── 6. Where a call's time goes, in this process: the server's own work against the time inside requests ─

OWN_WORK_CALLS = 2000


class DiscardingChannel:
    """Stands in for stdout: every answer is encoded as the real Channel does, then dropped."""

    def __init__(self, encode):
        self.encode = encode
        self.last = None

    def send(self, message):
        self.encode(message)
        self.last = message


class HttpClock:
    """Time spent inside requests by the threads a call runs on (this one, the request threads the main loop hands
    calls to, the helper threads a call overlaps its node requests on): preparing a request (node.py prepares its
    own, then fetches it: sends it on the session and reads its body), the loopback round trip, the response.
    Requests in flight together count once: `seconds` is the time at least one was. `count` is the requests sent."""

    def __init__(self, thread):
        self.seconds, self.count, self.thread, self.local = 0.0, 0, thread, threading.local()
        self.lock, self.active, self.since = threading.Lock(), 0, 0.0

    def counted(self, current):
        return current is self.thread or current.name.startswith(("request", "helper"))

    def wrap(self, function, counts):
        def timed(*args, **kwargs):
            depth = getattr(self.local, "depth", 0)
            if depth or not self.counted(threading.current_thread()):
                return function(*args, **kwargs)           # the catalog poll; nested calls
            self.local.depth = depth + 1
            with self.lock:
                if not self.active:
                    self.since = time.perf_counter()
                self.active += 1
            try:
                return function(*args, **kwargs)
            finally:
                with self.lock:
                    self.active -= 1
                    if not self.active:
                        self.seconds += time.perf_counter() - self.since
                    self.count += counts
                self.local.depth = depth
        return timed


# The entry points into requests: Session.request (prepares and sends) and what node.py calls, Request.prepare then
# Session.send; each with whether it counts as one request.
REQUESTS_ENTRIES = ((requests.Session, "request", 1), (requests.Request, "prepare", 0), (node, "fetch", 1),
                    (requests.Session, "send", 1))


def in_process_answer(server, channel, request_id, method, params=None):
    scheduler = server.scheduler or __import__("mero_mcp").Scheduler(server)
    received = scheduler.receive(request_line(request_id, method, params))    # as the stdin thread does
    scheduler.handle_line(*received)
    answer = channel.last
    if not isinstance(answer, dict) or answer.get("id") != request_id or "result" not in answer:
        raise RuntimeError("%s answered %r" % (method, answer))
    return answer["result"]


@contextlib.contextmanager
def server_log_to(path):
    """The log lines of a server run in this process (mero_mcp.py's on sys.stderr, node.py's through its logging
    handler) go to a file, as a spawned server's stderr does: `make bench` prints only its progress and its table."""
    with open(path, "a", encoding="utf-8") as log_file, contextlib.redirect_stderr(log_file):
        handlers = [handler for handler in node.log.handlers if isinstance(handler, logging.StreamHandler)]
        streams = [handler.setStream(log_file) for handler in handlers]
        try:
            yield
        finally:
            for handler, stream in zip(handlers, streams):
                if stream is not None:
                    handler.setStream(stream)


def bench_own_work(home):
    """One generated-tool call handled in this process on the 1,000-tool catalog: the whole handling, minus what
    requests spends on the node reads (app record, context) and the execute; what is left is the server's own
    validation, admission, dispatch and encoding."""
    import mero_mcp
    clock = HttpClock(threading.current_thread())
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in REQUESTS_ENTRIES]
    for owner, name, counts in REQUESTS_ENTRIES:
        setattr(owner, name, clock.wrap(getattr(owner, name), counts))
    try:
        with BenchNode() as node:
            channel = DiscardingChannel(mero_mcp.encode_message)
            server = mero_mcp.Server(channel, server_env(home, node.double.url))
            in_process_answer(server, channel, 1, "initialize", json.loads(INITIALIZE)["params"])
            server.catalog.start()
            deadline = time.monotonic() + CATALOG_DEADLINE
            while len(server.catalog.snapshot.bindings) < APPS * METHODS_PER_APP and time.monotonic() < deadline:
                time.sleep(0.2)
            tool_name = kv_get_tool(in_process_answer(server, channel, 2, "tools/list")["tools"], node.kv_package)
            call = {"name": tool_name, "arguments": dict(GREETING, context=node.context_id)}
            for request_id in range(3, 23):                        # warm: connection, validator, caches
                tool_result_or_fail(in_process_answer(server, channel, request_id, "tools/call", call), tool_name)
            own, http_total, http_count = [], 0.0, 0
            for request_id in range(100, 100 + OWN_WORK_CALLS):
                before_seconds, before_count = clock.seconds, clock.count
                started = time.perf_counter()
                in_process_answer(server, channel, request_id, "tools/call", call)
                elapsed = time.perf_counter() - started
                spent = clock.seconds - before_seconds
                own.append(elapsed - spent)
                http_total, http_count = http_total + spent, http_count + clock.count - before_count
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    return {"own": statistics.median(own), "per_request": http_total / http_count,
            "requests_per_call": http_count / OWN_WORK_CALLS}


# ── 7. Start-up footprint: compiling the script, the heavy imports, a distribution's own Python ─────────

FOOTPRINT_SPAWNS = 7
COMPILE_REPEATS = 20
# The child reports its own import time and then its peak RSS; `imports` is the statement timed.
IMPORT_PROBE = ("import time; started = time.perf_counter(); {imports}; elapsed = time.perf_counter() - started\n"
                "print(elapsed, [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])")


def rss_after_initialize(command, env, stderr):
    """Peak RSS of a fresh server once it has answered initialize, read before its stdin closes."""
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                            cwd=str(ROOT))
    try:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        if not proc.stdout.readline().startswith(b"{"):
            raise RuntimeError("%s did not answer initialize" % command[-1])
        return peak_rss_bytes(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()


def import_cost(imports):
    """(seconds, peak RSS bytes) of a fresh interpreter that runs `imports`; medians of FOOTPRINT_SPAWNS."""
    samples = []
    for _ in range(FOOTPRINT_SPAWNS):
        out = subprocess.run([PYTHON, "-c", IMPORT_PROBE.format(imports=imports)], capture_output=True, text=True,
                             check=True, cwd="/").stdout.split()
        samples.append((float(out[0]), int(out[1]) * 1024))
    return statistics.median(s for s, _ in samples), statistics.median(r for _, r in samples)


def compile_seconds():
    """What `python3 mero_mcp.py` pays on every start and an import of cached bytecode does not."""
    path = ROOT / "mero_mcp.py"
    source = path.read_text(encoding="utf-8")
    return statistics.median(seconds_of(lambda: compile(source, str(path), "exec")) for _ in range(COMPILE_REPEATS))


def seconds_of(action):
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def bench_footprint(home, stderr):
    figures = {"compile": compile_seconds()}
    env = server_env(home, "http://127.0.0.1:9")                    # initialize never reaches the node
    for name, command in (("script", SERVER), ("installed", INSTALLED_SERVER)):
        figures["rss_" + name] = statistics.median(rss_after_initialize(command, env, stderr)
                                                   for _ in range(FOOTPRINT_SPAWNS))
    for name, imports in (("bare", "pass"), ("requests", "import requests"),
                          ("both", "import requests; import jsonschema"), ("protocol", "import json, threading, queue"),
                          ("node", "import json, threading, queue; import mero_node_config")):
        figures["import_" + name] = import_cost(imports)
    return figures


def platform_version(python):
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                          text=True).stdout.strip()


def installed_catalog_rss(home, stderr):
    """Peak RSS through the mero-mcp command (cached bytecode) with the 1,000-tool catalog, after the same kind of
    work as the main session: lists and calls."""
    with BenchNode() as node:
        session = open_session(server_env(home, node.double.url), stderr, INSTALLED_SERVER)
        try:
            tools, _ = wait_for_catalog(session, APPS * METHODS_PER_APP)
            for _ in range(10):
                session.request("tools/list")
            tool_name = kv_get_tool(tools, node.kv_package)
            for _ in range(100):
                timed_server_call(session, tool_name, dict(GREETING, context=node.context_id))
            return peak_rss_bytes(session.pid)
        finally:
            session.close()
# ── 8. The tool surface with the real ABIs: what a model reads, and how soon a host has all of it ───────────

def model_bytes(definition):
    """What a model reads of one tool: name, description and inputSchema, as compact UTF-8 JSON."""
    part = {key: definition[key] for key in ("name", "description", "inputSchema") if key in definition}
    return len(json.dumps(part, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def entry_bytes(definition):
    return len(json.dumps(definition, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def spawn_to_tools(env, stderr, expected):
    """Seconds from spawn to a tools/list answer holding every generated tool (initialize, initialized and
    tools/list written at once, as hosts do; re-listed until complete), and that list."""
    started = time.perf_counter()
    session = StdioSession(SERVER, env, stderr)
    try:
        session.proc.stdin.write(INITIALIZE + (json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
                                               + "\n").encode("utf-8"))
        while True:
            tools = session.request("tools/list")["tools"]
            if sum(1 for t in tools if (t.get("_meta") or {}).get("package")) >= expected:
                return time.perf_counter() - started, tools
            if time.perf_counter() - started > CATALOG_DEADLINE:
                raise RuntimeError("the catalog never held all %d generated tools" % expected)
    finally:
        session.close()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def bench_tool_surface(home, stderr):
    """None when ../shared/fixtures/abi is absent (a plain clone): the figures are about the real ABIs."""
    paths = fixture_apps.manifest_paths(fixture_apps.SHARED_ABIS)
    if not paths:
        return None
    expected = fixture_apps.tool_count(paths)
    double = NodeDouble()
    fixture_apps.install(double, paths)
    with double:
        env = server_env(home, double.url)
        _, tools = spawn_to_tools(env, stderr, expected)          # warm: page cache, .pyc files
        ready = [spawn_to_tools(env, stderr, expected)[0] for _ in range(READY_SPAWNS)]
    generated = [t for t in tools if (t.get("_meta") or {}).get("package")]
    fixed = [t for t in tools if t not in generated]
    sizes = [model_bytes(t) for t in generated]
    return {"apps": len(paths), "generated": len(generated), "fixed": len(fixed), "ready": statistics.median(ready),
            "median": statistics.median(sizes), "p90": percentile(sizes, 0.9),
            "entry_median": statistics.median(entry_bytes(t) for t in generated),
            "fixed_total": sum(model_bytes(t) for t in fixed), "fixed_entries": sum(entry_bytes(t) for t in fixed)}


def tool_surface_rows(f):
    if f is None:
        return [row("tool surface (real ABIs)", "n/a: %s is absent" % fixture_apps.SHARED_ABIS, "", None)]
    return [
        row("tools ready: spawn -> tools/list with %d apps (%d tools)" % (f["apps"], f["generated"] + f["fixed"]),
            ms(f["ready"]), "<= 200 ms", f["ready"] <= 0.200),
        row("generated tool, name+description+inputSchema", "%d B" % f["median"], "<= 300 B", f["median"] <= 300),
        row("  p90", "%d B" % f["p90"], "", None),
        row("  whole tools/list entry", "%d B" % f["entry_median"], "", None),
        row("fixed tools (%d), name+description+inputSchema, mean" % f["fixed"], "%d B (%d B together)" % (
            f["fixed_total"] / f["fixed"], f["fixed_total"]), "<= %d B" % FIXED_TOOL_BYTES,
            f["fixed_total"] <= FIXED_TOOL_BYTES * f["fixed"]),
        row("  whole tools/list entries", "%d B" % f["fixed_entries"], "", None),
    ]


# ── 9. A node across a network: a delay proxy in front of the double ─────────────────────────────────

LINK_RTT = 0.040                      # a simulated round trip: another machine on a continent's network
LINK_CALLS = 15                       # per row, alternating link and loopback
LINK_SPAWNS = 5
LINK_CONNECTIONS = 512                # the proxy refuses more: a bug would otherwise open without end
LINK_LIFETIME = 600.0                 # and it stops accepting after this long
# (row, key, round trips by design, goal): the reads together, then the execute (an alias's lookup first).
LINK_GOALS = (("[view] call by context id (kv_store_get)", "view_id", 2, 2.3),
              ("[view] call by alias", "view_alias", 3, 3.3),
              ("[mut] call by context id (kv_store_set)", "mut_id", 2, 2.3),
              ("[mut] call by alias", "mut_alias", 3, 3.3),
              # issue 36: the kv store declares events; the stream follows the context, so this answer carries
              # the events block, and waits for no round trip more than any [mut] call
              ("[mut] call answering its events (call)", "mut_events", 2, 2.3),
              ("call_many of 32 gets (app + context id)", "many", 2, 3.3))


class DelayLink:
    """A TCP relay on 127.0.0.1 in front of the double: every byte is held half a round trip in each direction,
    and a new connection's first bytes one round trip more (its TCP handshake). Standard library only, loopback
    only, bounded in connections and lifetime. `connections` counts those accepted."""

    def __init__(self, upstream_port, rtt=LINK_RTT):
        import socket
        self.socket, self.upstream_port, self.rtt = socket, upstream_port, rtt
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        self.connections, self.open_sockets, self.closing = 0, [], threading.Event()
        self.thread = threading.Thread(target=self.serve, name="delay-link", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.closing.set()
        self.thread.join(5)
        for sock in self.open_sockets:
            try:
                sock.close()
            except OSError:
                pass
        self.listener.close()

    def serve(self):
        stop_at = time.monotonic() + LINK_LIFETIME
        while not self.closing.is_set() and time.monotonic() < stop_at:
            try:
                client, _ = self.listener.accept()
            except OSError:                                  # the accept timeout: look at closing again
                continue
            if self.connections >= LINK_CONNECTIONS:
                client.close()
                continue
            self.connections += 1
            upstream = self.socket.create_connection(("127.0.0.1", self.upstream_port))
            for sock in (client, upstream):
                sock.setsockopt(self.socket.IPPROTO_TCP, self.socket.TCP_NODELAY, 1)
                self.open_sockets.append(sock)
            self.pipe(client, upstream, not_before=time.monotonic() + self.rtt)
            self.pipe(upstream, client)

    def pipe(self, source, target, not_before=0.0):
        """Carry source's bytes to target, each chunk half a round trip after it came (in order)."""
        import queue
        held = queue.Queue()

        def receive():
            due = not_before
            while True:
                try:
                    data = source.recv(65536)
                except OSError:
                    data = b""
                due = max(due, time.monotonic() + self.rtt / 2)
                held.put((due, data))
                if not data:
                    return

        def deliver():
            while True:
                due, data = held.get()
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    if not data:
                        target.shutdown(self.socket.SHUT_WR)
                        return
                    target.sendall(data)
                except OSError:
                    return
        for work in (receive, deliver):
            threading.Thread(target=work, name="delay-link-pipe", daemon=True).start()


VALUES = itertools.count()


class LinkNode:
    """The kv store with one context holding `greeting`, aliased `far`, and the counter."""

    def __init__(self):
        self.double = NodeDouble(apps=[node_double.kv_store_spec(), node_double.counter_spec()])
        kv = self.double._app_key("com.calimero.kv-store")
        self.context_id = self.double.add_context(kv, state={"greeting": "hello"})
        self.double.add_alias("far", self.context_id)

    def calls(self):
        """{row key: (tool, arguments)} for the rows of LINK_GOALS."""
        get, put = dict(GREETING), {"key": "k", "value": "v"}
        item = {"app": "com.calimero.kv-store", "context": self.context_id, "method": "get", "args": GREETING}
        return {"view_id": ("kv_store_get", dict(get, context=self.context_id)),
                "view_alias": ("kv_store_get", dict(get, context="far")),
                "mut_id": ("kv_store_set", dict(put, context=self.context_id)),
                "mut_alias": ("kv_store_set", dict(put, context="far")),
                "mut_events": ("call", {"app": "com.calimero.kv-store", "context": self.context_id,
                                        "method": "set", "args": put}),
                "many": ("call_many", {"calls": [item] * CALL_MANY_SIZE})}


def timed_link_call(session, tool_name, arguments):
    if tool_name == "call":                       # a new value each time: the set emits Updated
        arguments["args"]["value"] = "v%d" % next(VALUES)
    elapsed, result = session.call_tool(tool_name, arguments)
    tool_result_or_fail(result, tool_name)
    if tool_name == "call" and arguments.get("method") == "set" and not any(
            b.get("text", "").startswith("Events in context") for b in result["content"]):
        raise RuntimeError("a [mut] call to an app with events answered no events block: %s" % result)
    if tool_name == "call_many":
        failed = [i for i in json.loads(result["content"][-1]["text"]) if not i.get("ok")]
        if failed:
            raise RuntimeError("call_many items failed: %s" % failed[0])
    return elapsed


def bench_link_calls(home, stderr):
    """Each row's call over the link and on loopback, alternating, on two servers of the same code: the round
    trips a call waits are (link − loopback) / RTT; and the connections the link's server opened for all of it."""
    node = LinkNode()
    with node.double, DelayLink(node.double.port) as link:
        near = open_session(server_env(Path(home) / "near", node.double.url), stderr)
        far = open_session(server_env(Path(home) / "far", link.url), stderr)
        try:
            for session in (near, far):
                wait_for_catalog(session, 1)
            times = {}
            for key, (tool_name, arguments) in node.calls().items():
                for session in (near, far):                   # warm: connections, caches
                    for _ in range(3):
                        timed_link_call(session, tool_name, arguments)
                pairs = [(timed_link_call(near, tool_name, arguments), timed_link_call(far, tool_name, arguments))
                         for _ in range(LINK_CALLS)]
                times[key] = (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs))
            calls = LINK_CALLS * len(times) + 6 * len(times)
        finally:
            near.close()
            far.close()
        return {"times": times, "connections": link.connections, "calls": calls}


FIRST_WRITE_SESSIONS = 5


def bench_first_write(home, stderr):
    """A session's first [mut] call to a context of an app with events (it waits for the stream to follow the
    context, so its events are heard) against that session's later ones, over the link: medians, seconds."""
    firsts, laters = [], []
    for index in range(FIRST_WRITE_SESSIONS):
        node = LinkNode()
        with node.double, DelayLink(node.double.port) as link:
            session = open_session(server_env(Path(home) / ("first%d" % index), link.url), stderr)
            try:
                wait_for_catalog(session, 1)
                tool_name, arguments = node.calls()["mut_events"]
                firsts.append(timed_link_call(session, tool_name, arguments))
                laters.append(statistics.median(timed_link_call(session, tool_name, arguments) for _ in range(5)))
            finally:
                session.close()
    return statistics.median(firsts), statistics.median(laters)


def bench_link_spawn(home, stderr):
    """spawn → a tools/list holding every generated tool, over the link and on loopback, alternating."""
    paths = fixture_apps.manifest_paths(fixture_apps.SHARED_ABIS)
    double = NodeDouble()
    if paths:
        fixture_apps.install(double, paths)
        expected = fixture_apps.tool_count(paths)
    else:
        double = LinkNode().double
        expected = 1
    with double, DelayLink(double.port) as link:
        near_env, far_env = server_env(home, double.url), server_env(home, link.url)
        _, tools = spawn_to_tools(near_env, stderr, expected)          # warm: page cache, .pyc files
        pairs = [(spawn_to_tools(near_env, stderr, expected)[0], spawn_to_tools(far_env, stderr, expected)[0])
                 for _ in range(LINK_SPAWNS)]
    return {"near": statistics.median(p[0] for p in pairs), "far": statistics.median(p[1] for p in pairs),
            "tools": len(tools)}


def first_write_rows(first_write):
    first, later = first_write
    return [row("  first [mut] call of a session to a context with events: %s, later ones %s" % (ms(first), ms(later)),
                "+%.2f" % ((first - later) / LINK_RTT), "once a session", None)]


def link_rows(calls, spawn):
    rows = [row("over a %.0f ms round trip (delay proxy): round trips a call waits" % (LINK_RTT * 1000), "", "",
                None)]
    for label, key, designed, goal in LINK_GOALS:
        near, far = calls["times"][key]
        trips = (far - near) / LINK_RTT
        rows.append(row("  %s (%d by design): %s, loopback %s" % (label, designed, ms(far), ms(near)),
                        "%.2f" % trips, "<= %.1f" % goal, trips <= goal))
    trips = (spawn["far"] - spawn["near"]) / LINK_RTT
    rows.append(row("  spawn -> full tools/list (%d tools): %s, loopback %s" % (spawn["tools"], ms(spawn["far"]),
                                                                               ms(spawn["near"])),
                    "%.2f" % trips, "<= 6", trips <= 6))
    rows.append(row("  connections opened over the link for %d calls" % calls["calls"], "%d" % calls["connections"],
                    "", None))
    return rows


# ── The table ───────────────────────────────────────────────────────────────────────────────────────

def ms(seconds):
    return "%.2f ms" % (seconds * 1000)


def row(label, value, target, passed):
    return (label, value, target, "" if passed is None else ("PASS" if passed else "MISS"))


def cold_start_rows(tool_count, cold):
    rows = [
        row("cold start: bare python3 echo", ms(cold["bare"]), "", None),
        row("cold start: mero_mcp.py", ms(cold["ours"]), "", None),
        row("  ours / bare", "%.2fx" % (cold["ours"] / cold["bare"]), "<= 2x", cold["ours"] <= 2 * cold["bare"]),
        row("cold start: mero-mcp command (cached bytecode)", ms(cold["installed"]), "", None),
        row("  installed / bare", "%.2fx" % (cold["installed"] / cold["bare"]), "", None),
        row("cold start: %s (-I -S, unpacked)" % PYZ.name, ms(cold["pyz"]), "", None) if "pyz" in cold else
        row("cold start: the pyz", "n/a: %s not built (make pyz)" % PYZ.name, "<= mero_mcp.py", None),
    ]
    if "pyz" in cold:
        rows.append(row("  pyz / mero_mcp.py", "%.2fx" % (cold["pyz"] / cold["ours"]), "<= 1x",
                        cold["pyz"] <= cold["ours"]))
    if "sdk" not in cold:
        return rows + [row("  SDK / ours", "n/a: mcp not installed", ">= 9x", None)]
    return rows + [
        row("cold start: SDK MCPServer, %d tools (as ours)" % tool_count, ms(cold["sdk"]), "", None),
        row("  SDK / ours", "%.2fx" % (cold["sdk"] / cold["ours"]), ">= 9x", cold["sdk"] >= 9 * cold["ours"]),
    ]


def system_cold_start_rows(cold):
    if isinstance(cold, str):
        return [row("cold start on %s" % SYSTEM_PYTHON, "skipped: " + cold, "<= 2x", None)]
    return [
        row("cold start: %s %s bare echo" % (SYSTEM_PYTHON, cold["version"]), ms(cold["bare"]), "", None),
        row("cold start: mero_mcp.py on %s" % SYSTEM_PYTHON, ms(cold["ours"]), "", None),
        row("  cached bytecode (as the mero-mcp command)", ms(cold["installed"]), "", None),
        row("  ours / bare, %s" % SYSTEM_PYTHON, "%.2fx" % (cold["ours"] / cold["bare"]), "<= 2x",
            cold["ours"] <= 2 * cold["bare"]),
    ]


def call_many_rows(f, kind, label):
    one, many = f["one_" + kind], f["many_" + kind]
    return [
        row("call (1), %s" % label, ms(one), "", None),
        row("call_many (%d), %s" % (CALL_MANY_SIZE, label), ms(many), "", None),
        row("  call_many / call, %s" % label, "%.2fx" % (many / one), "<= 2x", many <= 2 * one),
    ]


def catalog_rows(f):
    added = f["via_server"] - f["direct"]
    return [
        row("tools/list, %d tools (%d generated)" % (f["listed"], f["generated"]), ms(f["list"]), "<= 30 ms",
            f["list"] <= 0.030),
        row("generated call via server", ms(f["via_server"]), "", None),
        row("same execute, direct HTTP", ms(f["direct"]), "", None),
        row("  server-added cost per call", ms(added), "<= 1 ms", added <= 0.001),
    ] + call_many_rows(f, "handle", "app_handle") + call_many_rows(f, "named", "app+context") + [
        row("peak RSS (VmHWM), 1,000 tools", "%.1f MB" % (f["rss"] / 2 ** 20), "<= 40 MB", f["rss"] <= 40 * 2 ** 20),
    ]


def mb(size):
    return "%.1f MB" % (size / 2 ** 20)


def own_work_rows(f):
    return [
        row("generated call, in process: the server's own work", ms(f["own"]), "", None),
        row("  requests, per node request (%.0f per call)" % f["requests_per_call"], ms(f["per_request"]), "",
            None),
    ]


def footprint_rows(f, installed_rss):
    bare_s, bare_rss = f["import_bare"]
    requests_s, requests_rss = f["import_requests"]
    both_s, both_rss = f["import_both"]
    rows = [
        row("peak RSS (VmHWM), 1,000 tools, mero-mcp command", mb(installed_rss), "", None),
        row("compiling mero_mcp.py (every start of the script)", ms(f["compile"]), "", None),
        row("RSS after initialize: mero_mcp.py", mb(f["rss_script"]), "", None),
        row("RSS after initialize: mero-mcp command", mb(f["rss_installed"]), "", None),
        row("interpreter alone: peak RSS", mb(bare_rss), "", None),
        row("import requests: time, RSS added", "%s, %s" % (ms(requests_s), mb(requests_rss - bare_rss)), "", None),
        row("import jsonschema after it: time, RSS added", "%s, %s" % (ms(both_s - requests_s),
                                                                         mb(both_rss - requests_rss)), "", None),
    ]
    return rows


def print_table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    header = ("measure", "median", "target", "")
    print()
    for r in [header] + rows:
        print("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(r, widths))).rstrip())
    print()
    print("Python %s (%s) on %s, %d cores; medians of %d spawns, %d lists, %d calls, %d call_many rounds; "
          "call_many at node exec_delay %.2f s" % (platform.python_version(), PYTHON, platform.machine(),
                                                   os.cpu_count() or 0, COLD_SPAWNS, LIST_REPEATS, CALL_REPEATS,
                                                   CALL_MANY_REPEATS, EXEC_DELAY))


def link_only():
    """`bench/run.py link`: the remote-link rows alone."""
    started = time.monotonic()
    answer_without_nagle()
    with tempfile.TemporaryDirectory(prefix="mero-bench-") as home:
        with open(Path(home) / "stderr.log", "wb") as stderr:
            print("a node across a network: %.0f ms round trips through a delay proxy …" % (LINK_RTT * 1000),
                  flush=True)
            print_table(link_rows(bench_link_calls(home, stderr), bench_link_spawn(home, stderr))
                        + first_write_rows(bench_first_write(home, stderr)))
    print("wall time %.0f s" % (time.monotonic() - started))
    return 0


# ── Several nodes (issue 33): multi-node mode's start-up beside single mode's, and list_nodes' probes ──────────

NODES_SPAWNS = 9


def spawn_to_tools_list(env, stderr):
    """Seconds from spawn to the whole tools/list answer (initialize first): what a host waits for at start."""
    started = time.perf_counter()
    session = open_session(env, stderr)
    try:
        session.request("tools/list")
        return time.perf_counter() - started
    finally:
        session.close()


class Blackhole:
    """A port that accepts connections and never answers: a node that is down behind a firewall, the case a probe
    deadline exists for (a refused connection fails at once and proves nothing)."""

    def __enter__(self):
        import socket
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.url = "http://127.0.0.1:%d" % self.socket.getsockname()[1]
        return self

    def __exit__(self, *exc_info):
        self.socket.close()


def bench_nodes(home, stderr):
    """Median spawn → tools/list in single mode and in multi-node mode (two nodes); list_nodes of 5 nodes, 2 down."""
    with node_double.Network() as network:
        node1 = network.add("node1", apps=[node_double.kv_store_spec()])
        node2 = network.add("node2", apps=[node_double.kv_store_spec()])
        single = server_env(Path(home) / "single", node1.url)
        multi = minimal_env(Path(home) / "multi", {"CALIMERO_NODES": "node1=%s,node2=%s" % (node1.url, node2.url),
                                                   "CALIMERO_MCP_STATE_DIR": Path(home) / "multi" / "state",
                                                   "CALIMERO_NODE_HOME": Path(home) / "multi" / "nodes"})
        times = {"single": [], "multi": []}
        for _ in range(NODES_SPAWNS):                    # round-robin: noise lands on both alike
            for name, env in (("single", single), ("multi", multi)):
                times[name].append(spawn_to_tools_list(env, stderr))
        node3 = network.add("node3")
        with Blackhole() as down1, Blackhole() as down2:
            nodes = [("node1", node1.url), ("node2", node2.url), ("node3", node3.url), ("down1", down1.url),
                     ("down2", down2.url)]
            env = minimal_env(Path(home) / "five", {"CALIMERO_NODES": ",".join("%s=%s" % n for n in nodes),
                                                    "CALIMERO_MCP_STATE_DIR": Path(home) / "five" / "state",
                                                    "CALIMERO_NODE_HOME": Path(home) / "five" / "nodes"})
            session = open_session(env, stderr)
            try:
                session.request("tools/list")
                listed = [session.call_tool("list_nodes", {})[0] for _ in range(3)]
            finally:
                session.close()
        calls = requests_of_calls(multi, node1, node2, stderr)
    import mero_tools
    return {name: statistics.median(values) for name, values in times.items()}, statistics.median(listed), \
        mero_tools.LIST_PROBE_SECONDS, calls


def requests_of_calls(env, node1, node2, stderr):
    """{(node, "first"|"later"): the requests one `call` of kv-store's get sent there}: the default node and
    node2, each on a context of its own; a first call to node2 reads its ABI once, a later one reads none."""
    contexts = {}
    for double in (node1, node2):
        kv = double._app_key(node_double.kv_store_spec()["package"])
        contexts[double] = double.add_context(kv, group_id=double.add_namespace(kv, name="bench"))
    session = open_session(env, stderr)
    counts = {}
    try:
        session.request("tools/list")
        for name, double in (("node1", node1), ("node2", node2)):
            for when in ("first", "later"):
                before = len(double.log)
                session.call_tool("call", {"app": node_double.kv_store_spec()["package"], "context": contexts[double],
                                           "method": "get", "args": {"key": "k"}, "node": name})
                counts[(name, when)] = [entry["path"] for entry in double.log[before:]]
    finally:
        session.close()
    return counts


def nodes_rows(spawns, listed, deadline, calls):
    ratio = spawns["multi"] / spawns["single"]
    later1, later2 = len(calls[("node1", "later")]), len(calls[("node2", "later")])
    return [("spawn → tools/list, one node", rms(spawns["single"]), "", ""),
            ("spawn → tools/list, two nodes", rms(spawns["multi"]), "within 10%",
             "x%.2f of one node%s" % (ratio, "" if ratio <= 1.10 else " (missed)")),
            ("list_nodes, 5 nodes, 2 down", rms(listed), "one probe deadline (%s)" % rms(deadline),
             "" if listed <= deadline * 1.5 else "(missed)"),
            ("requests of a call on node2 ÷ on the default node", "%d ÷ %d (first on node2: %d, its ABI once)" % (
                later2, later1, len(calls[("node2", "first")])), "1", "" if later2 == later1 else "(missed)")]


def nodes_only():
    """`bench/run.py nodes`: the several-nodes rows alone."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mero-bench-") as home:
        with open(Path(home) / "stderr.log", "wb") as stderr:
            print("several nodes: %d spawns each, one node and two; list_nodes of 5 with 2 down …" % NODES_SPAWNS,
                  flush=True)
            print_table(nodes_rows(*bench_nodes(home, stderr)))
    print("wall time %.0f s" % (time.monotonic() - started))
    return 0


# ── The README's "Speed and footprint" section, printed in its form: paste it whole, never retype a figure ─────

def sig(value):
    """Three significant figures, as the README writes them (1,640, 714, 60, 22.1, 1.89, 0.4)."""
    return "{:,.0f}".format(value) if value >= 1000 else "%.3g" % value


def rms(seconds):
    return sig(seconds * 1000) + " ms"


def target(text, met, why=False):
    """A README target cell: the target, and whether this run missed it (with a pointer to the reasons below)."""
    return text if met else "%s (missed%s)" % (text, ", see below" if why else "")


def readme_section(tool_count, cold, system_cold, f, own, footprint, installed_rss, surface, link, first_write,
                   nodes):
    """The lines between README's "## Speed and footprint" and "## Development", from this run's figures."""
    bare_s, bare_rss = footprint["import_bare"]
    _, requests_rss = footprint["import_requests"]
    _, both_rss = footprint["import_both"]
    ratio = cold["ours"] / cold["bare"]
    rows = [("start → `initialize` answer, `python3 mero_mcp.py`",
             "%s, %.2f× a bare `python3` echo (%s)" % (rms(cold["ours"]), ratio, rms(cold["bare"])),
             target("≤ 2×", ratio <= 2, why=True)),
            ("the same through the `mero-mcp` command (cached bytecode)",
             "%s, %.2f×" % (rms(cold["installed"]), cold["installed"] / cold["bare"]), "")]
    if "pyz" in cold:
        rows.append(("the same from `mero-mcp.pyz` (`python3 -I -S`, unpacked)", "%s, %.2f× `mero_mcp.py`" % (
            rms(cold["pyz"]), cold["pyz"] / cold["ours"]), target("≤ 1×", cold["pyz"] <= cold["ours"])))
    if isinstance(system_cold, str):
        rows.append(("the same on `%s`" % SYSTEM_PYTHON, "not measured: " + system_cold, "≤ 2×"))
    else:
        system_ratio = system_cold["ours"] / system_cold["bare"]
        rows.append(("the same on `%s` (%s, bare %s)" % (SYSTEM_PYTHON, system_cold["version"],
                                                         rms(system_cold["bare"])),
                     "%s, %.2f×; %s from cached bytecode" % (rms(system_cold["ours"]), system_ratio,
                                                              rms(system_cold["installed"])),
                     target("≤ 2×", system_ratio <= 2)))
    if "sdk" in cold:
        rows.append(("the same with the official SDK (`MCPServer`, same tool count)",
                     "%s, %.1f× ours" % (rms(cold["sdk"]), cold["sdk"] / cold["ours"]),
                     target("≥ 9×", cold["sdk"] >= 9 * cold["ours"])))
    else:
        rows.append(("the same with the official SDK (`MCPServer`, same tool count)", "not measured: mcp not "
                     "installed", "≥ 9×"))
    if surface is None:
        rows.append(("the tool surface of `../shared/fixtures/abi`", "not measured: the folder is absent", ""))
    else:
        rows += [("spawn → a complete `tools/list` with the %d apps of `../shared/fixtures/abi` (%d tools)"
                  % (surface["apps"], surface["generated"] + surface["fixed"]), rms(surface["ready"]),
                  target("≤ 200 ms", surface["ready"] <= 0.200)),
                 ("what a model reads of one generated tool (name + description + inputSchema), median",
                  "%d B (p90 %d B)" % (surface["median"], surface["p90"]),
                  target("≤ 300 B", surface["median"] <= 300, why=True)),
                 ("the same for a fixed tool, on average over all %d" % surface["fixed"], "{:,} B ({:,} B together)"
                  .format(surface["fixed_total"] // surface["fixed"], surface["fixed_total"]),
                  target("≤ %d B" % FIXED_TOOL_BYTES, surface["fixed_total"] <= FIXED_TOOL_BYTES * surface["fixed"]))]
    added = f["via_server"] - f["direct"]
    many = f["many_handle"] / f["one_handle"]
    rows += [("`tools/list` with {:,} tools".format(f["listed"]), rms(f["list"]),
              target("≤ 30 ms", f["list"] <= 0.030)),
             ("server-added cost of one generated-tool call", "%s (the server's own work: %s)"
              % (rms(added), rms(own["own"])), target("≤ 1 ms", added <= 0.001, why=True)),
             ("`call_many` of %d ÷ one call (node answering in %d ms), with an `app_handle`"
              % (CALL_MANY_SIZE, EXEC_DELAY * 1000), "%.2f×" % many, target("≤ 2×", many <= 2)),
             ("peak RSS with 1,000 tools", "%s (%s through `mero-mcp`)" % (mb(f["rss"]), mb(installed_rss)),
              target("≤ 40 MB", f["rss"] <= 40 * 2 ** 20, why=True))]
    near, far = link["times"]["mut_id"]
    first, later = first_write
    spawns, listed, deadline, calls = nodes
    multi = spawns["multi"] / spawns["single"]
    later1, later2 = len(calls[("node1", "later")]), len(calls[("node2", "later")])
    rows += [("round trips of a [mut] call by context id, node %d ms away (`bench/run.py link`)" % (LINK_RTT * 1000),
              "%.2f" % ((far - near) / LINK_RTT), target("2", (far - near) / LINK_RTT <= 2.3)),
             ("the same, a session's first write to a context whose app has events (its stream is followed first)",
              "+%.2f round trips, once" % ((first - later) / LINK_RTT), ""),
             ("spawn → `tools/list` with two named nodes ÷ one node (`bench/run.py nodes`)", "%.2f× (%s, %s)" % (
                 multi, rms(spawns["multi"]), rms(spawns["single"])), target("≤ 1.1×", multi <= 1.10)),
             ("`list_nodes` of 5 nodes, 2 of them down (ports that never answer)", rms(listed),
              target("one probe deadline (%s)" % rms(deadline), listed <= deadline * 1.5)),
             ("requests of a `call` with `node: node2` ÷ on the default node (its ABI read once per build)",
              "%d ÷ %d (the first on node2: %d)" % (later2, later1, len(calls[("node2", "first")])),
              target("1", later2 == later1))]
    lines = [
        "`make bench` measures, in one run, on a node double with %d apps × %d methods, and prints this section"
        % (APPS, METHODS_PER_APP),
        "(these figures from its run of %s on a %d-core machine at load average %.1f, Python %s; medians). It"
        % (time.strftime("%Y-%m-%d"), os.cpu_count() or 0, os.getloadavg()[0],
           ".".join(platform.python_version_tuple()[:2])),
        "then runs `bench/bench_abi.py`: how long mapping the shared ABIs takes and what one argument check costs",
        "(it needs `../shared`).",
        "",
        "| measure | figure | target |",
        "| --- | --- | --- |",
    ] + ["| %s | %s | %s |" % r for r in rows] + [
        "",
        "What limits the misses:",
        "- **Calls**: every app call checks the handle against the app *as installed now* and its live context — "
        "two node",
        "  reads before the call itself, each about %s of `requests` on loopback (as is the execute itself, every one"
        % rms(own["per_request"]),
        "  read whole against its deadline); the server's own validation, admission, dispatch and encoding is %s."
        % rms(own["own"]),
        "- **Memory**: importing `requests` adds %s and `jsonschema` %s to the interpreter's %s."
        % (mb(requests_rss - bare_rss), mb(both_rss - requests_rss), mb(bare_rss)),
        "- **Start-up**: `python3 mero_mcp.py` compiles the entry on every start (%s in this run, and %s against"
        % (rms(footprint["compile"]), mb(footprint["rss_script"])),
        "  %s once `initialize` is answered); the `mero-mcp` command installed by `pip install .` imports the cached"
        % mb(footprint["rss_installed"]),
        "  bytecode instead (the modules beside the entry load theirs either way, once written). What is left then is "
        "the",
        "  standard library the protocol needs: `json` (which imports `re` and `enum`), `threading` and `queue`,",
        "  about 2× a bare interpreter by itself; and `mero_node_config` (%s more), whose node directory (one node or"
        % rms(footprint["import_node"][0] - footprint["import_protocol"][0]),
        "  several) decides the instructions `initialize` answers.",
        "- **Tool size**: a generated tool carries its name, its signature (the description), the two routing "
        "properties",
        "  `app_handle` and `_context` with a few words each, and the method's parameters; the routing and the JSON",
        "  framing are most of a small tool.",
    ]
    return lines


def print_readme_section(*figures):
    print()
    print("README.md, section \"Speed and footprint\" (paste it whole):")
    print()
    for line in readme_section(*figures):
        print(line)


def start_only():
    """`bench/run.py start`: spawn → initialize answer for the checkout, the installed command and the pyz, each
    against a bare interpreter's echo, in one run (issue 40's figure); and, run from a venv, the checkout on the
    interpreter the venv was made from (its own site, as a user's python3 has it) against that one's echo."""
    with tempfile.TemporaryDirectory(prefix="mero-bench-") as home:
        with open(Path(home) / "stderr.log", "wb") as stderr:
            _, cold = bench_cold_start(home, stderr)
            base = base_python()
            if base:
                with sample_double() as double:
                    env = server_env(home, double.url)
                    base_cold = median_spawn_times({"base bare": [base] + ECHO_ONE_LINE[1:],
                                                    "base ours": [base] + SERVER[1:]}, env, stderr)
                cold.update(base_cold)
    for name in ("bare", "ours", "installed", "pyz", "sdk"):
        if name in cold:
            print("%-10s %7.1f ms  %5.2fx bare" % (name, cold[name] * 1000, cold[name] / cold["bare"]))
    if "base bare" in cold:
        print("%s: bare %.1f ms; mero_mcp.py %.1f ms, %.2fx" % (base, cold["base bare"] * 1000,
                                                                cold["base ours"] * 1000,
                                                                cold["base ours"] / cold["base bare"]))
    return 0


def base_python():
    """The interpreter this venv was made from, when the bench runs in a venv and it can be found; else None."""
    if sys.prefix == sys.base_prefix:
        return None
    found = Path(sys.base_prefix) / "bin" / ("python%d.%d" % sys.version_info[:2])
    return str(found) if found.is_file() else None


def main():
    if sys.argv[1:] == ["start"]:
        return start_only()
    if sys.argv[1:] == ["link"]:
        return link_only()
    if sys.argv[1:] == ["nodes"]:
        return nodes_only()
    started = time.monotonic()
    answer_without_nagle()
    with tempfile.TemporaryDirectory(prefix="mero-bench-") as home:
        with open(Path(home) / "stderr.log", "wb") as stderr:
            print("cold start: %d spawns each of bare python, mero_mcp.py, SDK server …" % COLD_SPAWNS, flush=True)
            tool_count, cold = bench_cold_start(home, stderr)
            print("cold start: %d spawns each of bare %s and mero_mcp.py on it …" % (COLD_SPAWNS, SYSTEM_PYTHON),
                  flush=True)
            system_cold = bench_system_cold_start(home, stderr)
            print("catalog: %d apps x %d methods …" % (APPS, METHODS_PER_APP), flush=True)
            figures = bench_catalog(home, stderr)
            print("where a call's time goes: %d calls in process …" % OWN_WORK_CALLS, flush=True)
            # to the end of the run: the in-process server's catalog poll outlives its node, and says so every 30 s
            with server_log_to(Path(home) / "in-process.log"):
                own_work = bench_own_work(home)
                print("start-up footprint and imports …", flush=True)
                footprint = bench_footprint(home, stderr)
                installed_rss = installed_catalog_rss(home, stderr)
                print("tool surface: the apps of %s …" % fixture_apps.SHARED_ABIS, flush=True)
                surface = bench_tool_surface(home, stderr)
                print("a node across a network: %.0f ms round trips through a delay proxy …" % (LINK_RTT * 1000),
                      flush=True)
                link_calls, link_spawn = bench_link_calls(home, stderr), bench_link_spawn(home, stderr)
                first_write = bench_first_write(home, stderr)
                print("several nodes: %d spawns each, one node and two; list_nodes of 5 with 2 down …"
                      % NODES_SPAWNS, flush=True)
                nodes = bench_nodes(home, stderr)
    print_table(cold_start_rows(tool_count, cold) + system_cold_start_rows(system_cold) + catalog_rows(figures)
                + own_work_rows(own_work) + footprint_rows(footprint, installed_rss) + tool_surface_rows(surface)
                + link_rows(link_calls, link_spawn) + first_write_rows(first_write))
    print_table(nodes_rows(*nodes))
    print_readme_section(tool_count, cold, system_cold, figures, own_work, footprint, installed_rss, surface,
                         link_calls, first_write, nodes)
    print("wall time %.0f s" % (time.monotonic() - started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
