"""A small MCP stdio client for the tests: runs the real server as a subprocess, the way a host does."""
from __future__ import annotations

import itertools
import json
import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "mero_mcp.py"
# The server the tests start: the checkout's mero_mcp.py on this Python, or the command MERO_MCP_TEST_SERVER gives, the
# last word being the server file (`make test-pyz`: "python3 -I -S dist/mero-mcp-<version>.pyz").
SERVER_COMMAND = shlex.split(os.environ.get("MERO_MCP_TEST_SERVER") or "") or [sys.executable, str(SERVER)]
DEFAULT_TIMEOUT = 15.0

# The protocol versions as a client sends them (mcp-protocol.md): the one place the tests name them.
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")     # newest first
HANDSHAKE_VERSION = HANDSHAKE_VERSIONS[0]
MODERN_VERSION = "2026-07-28"
# What every request of the modern (per-request) era carries.
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
               "io.modelcontextprotocol/clientCapabilities": {}}

# What a model reads of a fixed tool (name + description + inputSchema, compact UTF-8 JSON), on average over all of
# them, at most: a budget per tool, so a new tool of the usual size fits and a wordy one does not. The tests and
# `make bench` read it from here.
FIXED_TOOL_BYTES = 305

# The fixed tools' definitions as tools/list serves them, per toolset and in read-only mode: `make snapshot`
# writes it from the live server; tests read counts and texts from it instead of repeating them.
SNAPSHOT = ROOT / "tests" / "snapshots" / "fixed_tools.json"
# The same in multi-node mode (two named nodes: `node` on the node tools, wait_for_sync, join_namespace's from).
MULTI_SNAPSHOT = ROOT / "tests" / "snapshots" / "fixed_tools_multi.json"
TOOLSETS = ("core", "blobs", "governance")
# tools.md's application tools: in every toolset, beside core's own.
APP_TOOLS = frozenset({"describe_app", "select_app", "call", "call_many", "events"})
# The block after an app call's value saying where it ran (mero_mcp.what_ran).
# The blocks an answer may carry after its JSON: where it ran, what a write emitted, which node it ran on.
TRAILER = re.compile(r"\S+ ran in context [0-9a-f]{64}|(Items? [\d, ]+\. )?Events in context |Ran on nodes? ")


class ServerTimeout(AssertionError):
    """The server did not answer in time: the test fails instead of hanging."""


def our_variables():
    """Every CALIMERO_* variable the server's code reads: each such name written as a string in our modules (a
    reader names its variable as a string: `setting(env, "CALIMERO_NODE_URL")`, `NODES_VARIABLE = "CALIMERO_NODES"`)."""
    import mero_runtime
    names = set()
    for module in mero_runtime.OUR_MODULES:
        text = (ROOT / (module + ".py")).read_text(encoding="utf-8")
        names.update(re.findall(r"""["'](CALIMERO_[A-Z0-9_]+)["']""", text))
    return sorted(names)


def minimal_env(home, extra=None):
    """What hosts pass a stdio server: HOME, PATH and little else (no LANG, no PYTHONPATH)."""
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for key, value in (extra or {}).items():
        if value is not None:
            env[key] = str(value)
    return env


def run_check(env, timeout=60, cwd=ROOT):
    """`mero-mcp --check` as a user runs it: the finished process, after checking it printed no traceback."""
    done = subprocess.run(SERVER_COMMAND + ["--check"], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd))
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def tuned_server(env, setup, python=None, check="hasattr(mero_mcp, 'main')"):
    """The real server with module constants changed before main() runs (a shorter poll or wait, a smaller
    pool): `setup` is Python run against the imported `mero_mcp`; `check` says the knob is still there, so a
    renamed constant fails the test loudly instead of testing nothing. Under MERO_MCP_TEST_SERVER (and no `python`
    given) the modules come from the server file it names (a pyz: imported from the zip)."""
    prefix, where = ([str(python or sys.executable)], str(ROOT)) if python or SERVER_COMMAND[-1] == str(SERVER) \
        else (SERVER_COMMAND[:-1], SERVER_COMMAND[-1])
    script = ("import sys; sys.path.insert(0, %r); import mero_mcp\n"
              "if not (%s):\n"
              "    raise SystemExit('a tuned constant moved: %s')\n"
              "%s\n"
              "sys.exit(mero_mcp.main([]))" % (where, check, check.replace("'", ""), setup))
    return McpServer(env, command=prefix + ["-c", script])


def responses_to(server, request_id):
    """Every response `server` has sent for `request_id` so far (in a batch answer too)."""
    found = []
    for line in server.raw_lines:
        frame = json.loads(line)
        for item in frame if isinstance(frame, list) else [frame]:
            if item.get("id") == request_id and ("result" in item or "error" in item):
                found.append(item)
    return found


def wait_until(predicate, what, timeout=60.0):
    """Poll `predicate` until it holds; fail naming `what` after `timeout` seconds (a "did not hang" bound)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.01)


class McpServer:
    def __init__(self, env, args=(), command=None):
        self.proc = subprocess.Popen(
            command or SERVER_COMMAND + list(args),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(ROOT))
        self.frames = queue.Queue()
        self.raw_lines = []              # every stdout line, for the purity check
        self.stderr_lines = []
        self.notifications = []
        self.pending = {}                # responses read while waiting for another id
        self.ids = itertools.count(1)
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for reader in self._readers:
            reader.start()

    # ---- plumbing ----
    def _read_stdout(self):
        for line in self.proc.stdout:
            self.raw_lines.append(line)
            try:
                self.frames.put(json.loads(line))
            except ValueError:
                self.frames.put(("INVALID", line))
        self.frames.put(None)

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.decode("utf-8", "replace"))

    @property
    def stderr(self):
        return "".join(self.stderr_lines)

    def send_raw(self, data):
        self.proc.stdin.write(data if data.endswith(b"\n") else data + b"\n")
        self.proc.stdin.flush()

    def send(self, message):
        self.send_raw(json.dumps(message).encode("utf-8"))

    def read(self, timeout=DEFAULT_TIMEOUT):
        """The next stdout frame (a dict or list); None at EOF."""
        try:
            frame = self.frames.get(timeout=timeout)
        except queue.Empty:
            raise ServerTimeout("no frame from the server within %ss; stderr:\n%s" % (timeout, self.stderr))
        if isinstance(frame, tuple):
            raise AssertionError("stdout carried a non-JSON line: %r" % (frame[1],))
        return frame

    def wait_for(self, request_id, timeout=DEFAULT_TIMEOUT):
        deadline = time.monotonic() + timeout
        while request_id not in self.pending:
            frame = self.read(max(0.01, deadline - time.monotonic()))
            if frame is None:
                raise AssertionError("server exited before answering %r; stderr:\n%s" % (request_id, self.stderr))
            self._file(frame)
        return self.pending.pop(request_id)

    def wait_notification(self, matches, timeout=DEFAULT_TIMEOUT):
        """The first notification (already read or still to come) for which matches(notification) is true."""
        deadline = time.monotonic() + timeout
        while True:
            found = [n for n in self.notifications if matches(n)]
            if found:
                return found[0]
            frame = self.read(max(0.01, deadline - time.monotonic()))
            if frame is None:
                raise AssertionError("server exited before the notification; stderr:\n%s" % self.stderr)
            self._file(frame)

    def _file(self, frame):
        frames = frame if isinstance(frame, list) else [frame]
        for item in frames:
            if "id" in item and ("result" in item or "error" in item):
                self.pending[item["id"]] = item
            else:
                self.notifications.append(item)

    # ---- requests ----
    def request(self, method, params=None, request_id=None, timeout=DEFAULT_TIMEOUT):
        request_id = next(self.ids) if request_id is None else request_id
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self.wait_for(request_id, timeout)

    def result(self, method, params=None, timeout=DEFAULT_TIMEOUT):
        reply = self.request(method, params, timeout=timeout)
        assert "result" in reply, "expected a result for %s, got %r" % (method, reply)
        return reply["result"]

    def notify(self, method, params=None):
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def initialize(self, version=HANDSHAKE_VERSION):
        result = self.result("initialize", {"protocolVersion": version, "capabilities": {},
                                            "clientInfo": {"name": "tests", "version": "0"}})
        self.notify("notifications/initialized")
        return result

    def call_tool(self, name, arguments=None, timeout=DEFAULT_TIMEOUT, meta=None):
        params = {"name": name, "arguments": arguments or {}}
        if meta:
            params["_meta"] = meta
        return self.result("tools/call", params, timeout=timeout)

    def tool_json(self, name, arguments=None, **kw):
        """Call a tool that must succeed and return its JSON text parsed (an app call's: the value, before the
        block saying where it ran)."""
        result = self.call_tool(name, arguments, **kw)
        assert not result.get("isError"), result
        blocks = result["content"]
        while len(blocks) > 1 and TRAILER.match(blocks[-1].get("text", "")):
            blocks = blocks[:-1]
        return json.loads(blocks[-1]["text"])

    def tool_names(self):
        return [t["name"] for t in self.result("tools/list")["tools"]]

    # ---- shutdown ----
    def close(self, timeout=5.0):
        """Close stdin (what hosts do) and return the exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("server did not exit within %ss of stdin closing" % timeout)
        return self.proc.returncode

    def wait_output(self, timeout=5.0):
        """After the process ended: wait until all it wrote to stdout and stderr has been read."""
        for reader in self._readers:
            reader.join(timeout)
            assert not reader.is_alive(), "the server's output did not end within %ss" % timeout

    def assert_stdout_pure(self):
        for line in self.raw_lines:
            frame = json.loads(line)          # raises on anything that is not JSON
            assert isinstance(frame, (dict, list)), line
            assert line.endswith(b"\n") and line.count(b"\n") == 1


# ---- the fixed tools' snapshot ----

def fixed_tools_listed(home, extra=None, multi=False):
    """The fixed tools' definitions tools/list serves, from the real server over stdio, against a node double
    with no apps (so every listed tool is fixed), in both eras; they must agree (fixed tools declare no output).
    `multi`: the double is the default of two named nodes (the other never answers: tools/list never asks it)."""
    from node_double import NodeDouble
    double = NodeDouble().start()
    try:
        env = minimal_env(home, dict({"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_STATE_DIR": Path(home) / "state",
                                      "CALIMERO_NODE_HOME": Path(home) / "nodes"}, **(extra or {})))
        if multi:
            env["CALIMERO_NODES"] = "node1=%s,node2=http://127.0.0.1:9" % double.url
        server = McpServer(env)
        try:
            server.initialize()
            handshake = server.result("tools/list")["tools"]
            modern = server.result("tools/list", {"_meta": MODERN_META})["tools"]
        finally:
            server.close()
    finally:
        double.stop()
    assert handshake == modern, "the fixed tools differ between the eras"
    return handshake


def live_snapshot(home):
    """What SNAPSHOT holds: every fixed definition in tools/list order, and the names each toolset alone and
    read-only mode list."""
    from concurrent.futures import ThreadPoolExecutor
    settings = dict({"all": {}, "read-only": {"CALIMERO_MCP_READ_ONLY": "1"}},
                    **{toolset: {"CALIMERO_MCP_TOOLSETS": toolset} for toolset in TOOLSETS})
    with ThreadPoolExecutor(len(settings)) as pool:          # one server each, side by side
        listed = dict(zip(settings, pool.map(lambda name: fixed_tools_listed(Path(home) / name, settings[name]),
                                             settings)))
    names = {name: [t["name"] for t in tools] for name, tools in listed.items()}
    return {"tools": listed["all"], "toolsets": {toolset: names[toolset] for toolset in TOOLSETS},
            "read_only": names["read-only"]}


def snapshot_text(snapshot):
    return json.dumps(snapshot, indent=2, ensure_ascii=False) + "\n"


def fixed_snapshot():
    """The committed snapshot (make snapshot writes it)."""
    return json.loads(SNAPSHOT.read_text(encoding="utf-8"))


def fixed_names(toolsets=TOOLSETS, read_only=False):
    """The fixed tools tools/list carries with `toolsets` enabled (and in read-only mode), in its order."""
    snapshot = fixed_snapshot()
    enabled = {name for toolset in toolsets for name in snapshot["toolsets"][toolset]}
    if read_only:
        enabled &= set(snapshot["read_only"])
    return [t["name"] for t in snapshot["tools"] if t["name"] in enabled]


def fixed_definitions():
    return fixed_snapshot()["tools"]


def live_multi_snapshot(home):
    """What MULTI_SNAPSHOT holds: every fixed definition multi-node mode lists, in tools/list order."""
    return {"tools": fixed_tools_listed(Path(home) / "multi", multi=True)}


def write_snapshot():
    import tempfile
    with tempfile.TemporaryDirectory(prefix="mero-snapshot-") as home:
        text = snapshot_text(live_snapshot(home))
        multi = snapshot_text(live_multi_snapshot(home))
    MULTI_SNAPSHOT.parent.mkdir(exist_ok=True)
    MULTI_SNAPSHOT.write_text(multi, encoding="utf-8")
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(text, encoding="utf-8")
    snapshot = json.loads(text)
    sys.stdout.write("wrote %s: %d fixed tools (%s)\n" % (SNAPSHOT.relative_to(ROOT), len(snapshot["tools"]), ", ".join(
        "%s %d" % (name, len(names)) for name, names in snapshot["toolsets"].items())))


if __name__ == "__main__":
    if sys.argv[1:] != ["snapshot"]:
        sys.exit("usage: python3 tests/mcp_client.py snapshot   (rewrites %s; `make snapshot` runs it)"
                 % SNAPSHOT.relative_to(ROOT))
    write_snapshot()
